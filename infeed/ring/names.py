"""Names a served ring is known by: the segment keeps its unguessable name, and ``infeed serve --name
NAME`` writes an alias, a small file ``/dev/shm/infeed-<uid>-name-<NAME>`` (mode 0600) holding it."""

from __future__ import annotations

import os
import re
import stat

from infeed.errors import AttachError
from infeed.ring.segments import SHM_DIR, name_prefix, read_own

__all__ = ["alias_path", "is_alias", "alias_target", "resolve_name", "write_alias"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_ALIAS = "name-"
#: Bytes an alias may hold: a segment name.
_MAX_TARGET = 200


def alias_path(name: str) -> str:
    """Where the alias ``name`` of a served ring lives."""
    if not _NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(f"a ring name is 1 to 64 letters, digits, '_', '-' or '.', got {name!r}")
    return os.path.join(SHM_DIR, f"{name_prefix()}{_ALIAS}{name}")


def is_alias(segment_name: str) -> bool:
    """Whether an entry of :data:`~infeed.ring.segments.SHM_DIR` named so is an alias, not a ring."""
    return segment_name.startswith(name_prefix() + _ALIAS)


def alias_target(path: str) -> str | None:
    """The segment name an alias file holds; None unless it is a regular file of this user."""
    found = read_own(path, _MAX_TARGET)
    return None if found is None else found[1].decode(errors="replace").strip()


def resolve_name(name: str) -> str:
    """The segment name behind ``name``: an alias ``infeed serve`` wrote, else ``name`` itself."""
    if name.startswith(name_prefix()) and not is_alias(name):
        return name
    path = alias_path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AttachError(name, "exists", f"a ring served as {name!r} (infeed serve --name {name})", "none") \
            from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600:
            raise AttachError(name, "owner", f"an alias of uid {os.getuid()} with mode 0o600",
                              f"uid {st.st_uid}, mode {oct(stat.S_IMODE(st.st_mode))}")
        target = f.read(_MAX_TARGET).decode(errors="replace").strip()
    return target


def write_alias(name: str, target: str) -> str:
    """Writes the alias ``name`` of segment ``target`` (replacing a stale one); returns its path.

    Raises ValueError when a live ring is already served as ``name``.
    """
    path = alias_path(name)
    if os.path.exists(path):
        try:
            if os.path.exists(os.path.join(SHM_DIR, resolve_name(name))):
                raise ValueError(f"a ring is already served as {name!r}")
        except AttachError:
            pass
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(target.encode())
    return path
