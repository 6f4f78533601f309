"""``infeed gc``: removes this user's rings whose creator is gone, and aliases of rings that are gone.

A ring's creator removes it on every exit it lives through, and its workers
remove it when they see the creator gone; what is left (workers killed at the
same moment, a machine that froze) this command removes. Only segments of the
current user with this version's header are touched; a ring still being
created is left alone for a minute.
"""

from __future__ import annotations

import os
import stat
import time

import numpy as np

from infeed.ring import _HEADER, MAGIC, SHM_DIR, _start_time

HELP = "remove shared-memory rings whose creator is gone"
USAGE_ERRORS = ()

__all__ = ["orphans", "collect"]

#: A ring younger than this whose header is not complete may still be in creation.
CREATION_GRACE = 60.0


def _read_own(path: str, size: int) -> tuple[os.stat_result, bytes] | None:
    """(stat, first ``size`` bytes) of ``path`` when it is a regular file of this user, else None.

    Never follows a symbolic link: ``/dev/shm`` is world-writable, and a link
    another user planted under our prefix says nothing about what it points to.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:                     # gone, a link (ELOOP), or not ours to open
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        return st, os.pread(fd, size, 0)
    finally:
        os.close(fd)


def _ring_is_orphan(path: str) -> bool:
    found = _read_own(path, _HEADER.itemsize)
    if found is None:
        return False
    st, raw = found
    young = time.time() - st.st_mtime <= CREATION_GRACE
    if len(raw) < _HEADER.itemsize or raw[:8] != MAGIC:
        return not young
    h = np.frombuffer(raw, _HEADER, 1)[0]
    pid, started = int(h["creator_pid"]), int(h["creator_start"])
    if pid <= 0:        # the creator writes the magic before its pid: a ring in creation, or one it never finished
        return not young
    now = _start_time(pid)
    if now is None:
        return True
    return bool(started) and now != started           # the pid now belongs to another process


def orphans() -> list[str]:
    """Paths in ``/dev/shm`` of this user's rings and aliases that nothing uses any more."""
    prefix = f"infeed-{os.getuid()}-"
    found = []
    names = sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    for name in names:
        path = os.path.join(SHM_DIR, name)
        if "-name-" in name:
            alias = _read_own(path, 200)
            if alias is None:
                continue
            target = alias[1].decode(errors="replace").strip()
            if not target.startswith(prefix) or not os.path.exists(os.path.join(SHM_DIR, target)) \
                    or _ring_is_orphan(os.path.join(SHM_DIR, target)):
                found.append(path)
        elif _ring_is_orphan(path):
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


def add_arguments(parser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")


def run(args) -> int:
    removed = collect(args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for path, size in removed:
        print(f"{verb} {path} ({size / 1e6:.1f} MB)")
    print(f"{verb} {len(removed)} segment(s), {sum(s for _, s in removed) / 1e6:.1f} MB")
    return 0
