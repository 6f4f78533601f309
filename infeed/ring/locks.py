"""Who holds a ring, told by locks the kernel keeps, not by process ids.

The creator of a ring and each of its workers hold an open-file-description
lock (``F_OFD_SETLK``) on one byte of the segment's file for as long as they
live: byte :data:`CREATOR` for the creator, ``worker_byte(k)`` for worker k.
The kernel drops the lock when the process's last descriptor of it closes, on
exit or on ``SIGKILL``, and any process that can open the file sees whether it
is held (``F_OFD_GETLK``), whatever PID namespace either side runs in: two
containers sharing ``/dev/shm`` see each other's PIDs as dead or as someone
else's, but the same locks. The bytes are past the segment's end: the locks say
nothing of its contents.

A lock lives with the open file description, so it is held by a forked child
that inherited the descriptor too; the daemon's workers are started with
``exec`` and ``close_fds``.
"""

from __future__ import annotations

import fcntl
import os
import struct

__all__ = ["CREATOR", "worker_byte", "hold", "is_held"]

#: ``struct flock``: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padding.
_FLOCK = struct.Struct("hhqqi4x")
#: Far past any segment's end, so that no one mistakes a lock for a claim on the data.
_BASE = 1 << 48
#: The creator's byte.
CREATOR = _BASE


def worker_byte(index: int) -> int:
    """The byte worker ``index`` holds."""
    return _BASE + 1 + index


def hold(fd: int, byte: int) -> None:
    """Takes the lock on ``byte`` of the file open as ``fd`` (writable) for as long as ``fd`` stays open.

    Raises ``BlockingIOError`` when another open file description holds it.
    """
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))


def is_held(fd: int, byte: int) -> bool:
    """Whether an open file description other than ``fd``'s holds the lock on ``byte``."""
    got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0))
    return _FLOCK.unpack(got)[0] != fcntl.F_UNLCK
