"""POSIX shared-memory segments in ``/dev/shm``: created private (mode 0600, 128 random bits in the
name, never an existing file) with their space reserved up front, removed by their creator on every
exit it lives through (close, interpreter exit, ``SIGTERM``), and inspected without trusting what
another user may have planted."""

from __future__ import annotations

import errno
import os
import secrets
import signal
import stat
import threading
import time
from typing import NamedTuple

import numpy as np

from infeed.errors import ShmSpaceError
from infeed.ring import _ring, locks
from infeed.ring.layout import HEADER, MAGIC

__all__ = ["SHM_DIR", "name_prefix", "create_private", "create_reserved", "unlink_owned", "install_sigterm_cleanup",
           "free_bytes", "read_own", "SegmentCreator", "read_creator"]

#: Where POSIX shared-memory segments live on Linux.
SHM_DIR = "/dev/shm"

#: path -> creating pid, for every segment this process created and has not yet unlinked.
_OWNED: dict[str, int] = {}
_OWNED_LOCK = threading.Lock()


def name_prefix() -> str:
    """The start of every name this user's rings (and their aliases) have in :data:`SHM_DIR`."""
    return f"infeed-{os.getuid()}-"


def create_private() -> tuple[str, str, int]:
    """(name, path, fd) of a new empty segment of this user, mode exactly 0600 whatever the umask.

    The name holds 128 random bits and an existing file is never reused. The
    segment is this process's: it holds the creator's lock (:mod:`infeed.ring.locks`)
    from the first moment, for as long as ``fd`` stays open, and :func:`unlink_owned`
    (and ``SIGTERM``, once :func:`install_sigterm_cleanup` ran) removes it.
    """
    while True:
        name = f"{name_prefix()}{secrets.token_hex(16)}"
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:  # 2**-128 odds; never reuse an existing name
            continue
        break
    with _OWNED_LOCK:
        _OWNED[path] = os.getpid()
    try:
        locks.hold(fd, locks.CREATOR)
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        unlink_owned(path, os.getpid())
        raise
    return name, path, fd


def create_reserved(size: int) -> tuple[str, str, int, "_ring.Mapping"]:
    """(name, path, fd, mapping) of a new private segment (:func:`create_private`) of ``size`` bytes, its space
    reserved with ``posix_fallocate`` and mapped: a full ``/dev/shm`` fails here with
    :class:`~infeed.ShmSpaceError`, never later with ``SIGBUS``. Removed again if anything fails."""
    free = free_bytes()
    if free < size:
        raise ShmSpaceError(SHM_DIR, size, free)
    name, path, fd = create_private()
    try:
        os.posix_fallocate(fd, 0, size)
        return name, path, fd, _ring.Mapping(fd, size)
    except BaseException as exc:
        os.close(fd)
        unlink_owned(path, os.getpid())
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM):
            raise ShmSpaceError(SHM_DIR, size, free_bytes()) from exc
        raise


def unlink_owned(path: str, pid: int) -> None:
    """Removes ``path`` if this process (``pid``) created it: never from a forked child."""
    if os.getpid() != pid:
        return
    with _OWNED_LOCK:
        _OWNED.pop(path, None)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _on_sigterm(signum, frame):
    for path, pid in list(_OWNED.items()):
        if pid == os.getpid():
            try:
                os.unlink(path)
            except OSError:
                pass
    # Die as SIGTERM would have killed us, so the parent sees the real cause.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_sigterm_cleanup() -> None:
    """Unlinks owned segments on SIGTERM, only where SIGTERM still has its default action."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def free_bytes() -> int:
    """Bytes free in :data:`SHM_DIR` for this user."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize


def _open_own(path: str) -> tuple[int, os.stat_result] | None:
    """(fd, stat) of ``path`` when it is a regular file of this user, else None. Never follows a symbolic
    link: ``/dev/shm`` is world-writable, and a link another user planted under our prefix says nothing
    about what it points to."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:                     # gone, a link (ELOOP), or not ours to open
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        return None
    return fd, st


def read_own(path: str, size: int) -> bytes | None:
    """The first ``size`` bytes of ``path`` when it is a regular file of this user (see :func:`_open_own`)."""
    found = _open_own(path)
    if found is None:
        return None
    try:
        return os.pread(found[0], size, 0)
    finally:
        os.close(found[0])


class SegmentCreator(NamedTuple):
    """Who created a ring's segment, as its header and its locks say."""

    #: The header's version; 0 when the segment does not start with a ring header (yet).
    version: int
    #: The creator's pid in its own PID namespace (a hint for messages); 0 while not written yet.
    pid: int
    #: Seconds since the segment was last modified.
    age: float
    #: Whether a live process holds the creator's lock (:mod:`infeed.ring.locks`), in any PID namespace.
    locked: bool


def read_creator(path: str) -> SegmentCreator | None:
    """The creator of the ring segment at ``path``; None unless it is a regular file of this user."""
    found = _open_own(path)
    if found is None:
        return None
    fd, st = found
    try:
        raw = os.pread(fd, HEADER.itemsize, 0)
        locked = locks.is_held(fd, locks.CREATOR)
    finally:
        os.close(fd)
    age = time.time() - st.st_mtime
    if len(raw) < HEADER.itemsize or raw[:8] != MAGIC:
        return SegmentCreator(0, 0, age, locked)
    h = np.frombuffer(raw, HEADER, 1)[0]
    return SegmentCreator(int(h["version"]), int(h["creator_pid"]), age, locked)
