"""Files whose size is trusted (exports, checkpoint digests), opened only when they are regular files.

A symbolic link is never followed and a FIFO never blocks the open: a link to ``/dev/zero``, a FIFO or a
device would otherwise be read without end, or hang the reader. Callers turn :class:`NotARegularFile` into
their own error naming the file.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import BinaryIO

__all__ = ["NotARegularFile", "open_regular", "sha256_of"]

_KINDS = {stat.S_IFIFO: "FIFO", stat.S_IFCHR: "character device", stat.S_IFBLK: "block device",
          stat.S_IFSOCK: "socket", stat.S_IFDIR: "directory"}


class NotARegularFile(Exception):
    """``path`` is no regular file; ``reason`` says what it is (to be raised as the caller's own error)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path, self.reason = path, reason


def open_regular(path: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file; FileNotFoundError when it is missing,
    :class:`NotARegularFile` when it is a symbolic link, a FIFO, a device, a socket or a directory."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError:
        if os.path.islink(path):
            raise NotARegularFile(path, "a symbolic link, and such files are never followed") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotARegularFile(path, f"a {_KINDS.get(stat.S_IFMT(mode), 'special file')}, not a regular file")
    return os.fdopen(fd, "rb")


def sha256_of(f, limit: int | None = None) -> tuple[int, str]:
    """(bytes read, SHA-256 hex) of what is left to read of ``f``, a chunk at a time; with ``limit``, no
    more than ``limit + 1`` bytes are read (one past it tells a file longer than expected)."""
    sha, size = hashlib.sha256(), 0
    bound = float("inf") if limit is None else limit + 1
    while size < bound and (chunk := f.read(int(min(1 << 20, bound - size)))):
        sha.update(chunk)
        size += len(chunk)
    return size, sha.hexdigest()
