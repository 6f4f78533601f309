"""Rings whose creator is gone, and aliases of rings that are gone: found and removed.

A ring's creator removes it on every exit it lives through, and its workers
remove it when they see the creator gone; what is left (workers killed at the
same moment, a machine that froze) is collected here, by ``infeed gc`` and at
every daemon's start. Only segments of the current user with this version's
header are touched; a ring still being created is left alone for a minute.
"""

from __future__ import annotations

import os

from infeed.ring.layout import VERSION
from infeed.ring.names import alias_target, is_names_dir, private_dir_problem
from infeed.ring.segments import SHM_DIR, name_prefix, read_creator

__all__ = ["CREATION_GRACE", "ring_is_orphan", "orphans", "collect"]

#: A ring younger than this whose header is not complete may still be in creation.
CREATION_GRACE = 60.0


def ring_is_orphan(path: str) -> bool:
    """Whether the ring segment at ``path`` is this user's and its creator is gone (or never finished it).

    A creator holds its ring's lock (:mod:`infeed.ring.locks`) from the moment the file exists: a held
    lock means a live creator, in whatever PID namespace it runs. A ring of another layout version is
    never taken: its creator may judge liveness otherwise (before version 3, by a pid that another PID
    namespace cannot see), and the infeed that made it collects it.
    """
    creator = read_creator(path)
    if creator is None or creator.locked:
        return False
    if not creator.version or creator.pid <= 0:        # a file that is no ring (yet), or a ring in creation
        return creator.age > CREATION_GRACE
    return creator.version == VERSION


def orphans() -> list[str]:
    """Paths in ``/dev/shm`` of this user's rings that nothing holds any more, and of the names of rings that
    are gone (in the private names directory, and the alias files of versions before it)."""
    prefix = name_prefix()
    found = []
    for name in sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix)):
        path = os.path.join(SHM_DIR, name)
        if is_names_dir(name):
            if _is_private(path):                           # never walk a directory another user planted
                found += _stale_names(path)
        elif name.startswith(prefix + "name-"):        # an alias file of infeed before the names directory
            found += _stale_names(SHM_DIR, [name])
        elif ring_is_orphan(path):
            found.append(path)
    return found


def _is_private(path: str) -> bool:
    try:
        return not private_dir_problem(path)
    except OSError:
        return False


def _stale_names(directory: str, entries: list[str] | None = None) -> list[str]:
    """The aliases in ``directory`` (``entries`` of it, default all) whose ring is gone."""
    try:
        entries = sorted(os.listdir(directory)) if entries is None else entries
    except OSError:
        return []
    stale = []
    for entry in entries:
        path = os.path.join(directory, entry)
        target = alias_target(path)
        if target is None:
            continue
        ring = os.path.join(SHM_DIR, target)
        if not target.startswith(name_prefix()) or not os.path.exists(ring) or ring_is_orphan(ring):
            stale.append(path)
    return stale


def collect(dry_run: bool = False) -> list[tuple[str, int]]:
    """Removes the orphans (unless ``dry_run``); returns (path, size in bytes) of each."""
    removed = []
    for path in orphans():
        try:
            size = os.stat(path).st_size
            if not dry_run:
                os.unlink(path)
        except FileNotFoundError:
            continue
        removed.append((path, size))
    return removed
