"""Rings whose creator is gone, and aliases of rings that are gone: found and removed.

A ring's creator removes it on every exit it lives through, and its workers
remove it when they see the creator gone; what is left (workers killed at the
same moment, a machine that froze) is collected here, by ``infeed gc`` and at
every daemon's start. Only segments of the current user with this version's
header are touched; a ring still being created is left alone for a minute.
"""

from __future__ import annotations

import os

from infeed.ring.names import alias_target, is_alias
from infeed.ring.processes import start_time
from infeed.ring.segments import SHM_DIR, name_prefix, read_creator

__all__ = ["CREATION_GRACE", "ring_is_orphan", "orphans", "collect"]

#: A ring younger than this whose header is not complete may still be in creation.
CREATION_GRACE = 60.0


def ring_is_orphan(path: str) -> bool:
    """Whether the ring segment at ``path`` is this user's and its creator is gone (or never finished it)."""
    creator = read_creator(path)
    if creator is None:
        return False
    young = creator.age <= CREATION_GRACE
    if not creator.has_header or creator.pid <= 0:   # the creator writes the magic before its pid
        return not young
    now = start_time(creator.pid)
    if now is None:
        return True
    return bool(creator.start_time) and now != creator.start_time   # the pid now belongs to another process


def orphans() -> list[str]:
    """Paths in ``/dev/shm`` of this user's rings and aliases that nothing uses any more."""
    prefix = name_prefix()
    found = []
    for name in sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix)):
        path = os.path.join(SHM_DIR, name)
        if is_alias(name):
            target = alias_target(path)
            if target is None:
                continue
            if not target.startswith(prefix) or not os.path.exists(os.path.join(SHM_DIR, target)) \
                    or ring_is_orphan(os.path.join(SHM_DIR, target)):
                found.append(path)
        elif ring_is_orphan(path):
            found.append(path)
    return found


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
