"""Names a served ring is known by: the segment keeps its unguessable name, and ``infeed serve --name
NAME`` writes an alias, a file ``NAME`` (mode 0600) holding the segment's name, in a directory private
to the user: ``/dev/shm/infeed-<uid>-names`` (mode 0700, owner checked, never a link). Nothing another
user plants can block a name or stand in for one, and an alias whose ring's creator is gone is stale:
the next server of that name replaces it, and ``infeed gc`` removes it."""

from __future__ import annotations

import errno
import os
import re
import stat

from infeed.errors import AttachError
from infeed.ring.segments import SHM_DIR, name_prefix, read_creator, read_own

__all__ = ["names_dir", "is_names_dir", "private_dir_problem", "alias_path", "alias_target", "resolve_name",
           "write_alias", "is_served"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Bytes an alias may hold: a segment name.
_MAX_TARGET = 200


def names_dir() -> str:
    """The directory of this user's ring names."""
    return os.path.join(SHM_DIR, f"{name_prefix()}names")


def is_names_dir(entry: str) -> bool:
    """Whether the entry of :data:`~infeed.ring.segments.SHM_DIR` named so is the names directory."""
    return entry == os.path.basename(names_dir())


def private_dir_problem(path: str) -> str:
    """What keeps ``path`` from being this user's private names directory (a real directory of this
    user with mode 0700), or "" (FileNotFoundError when it is missing)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700:
        return ""
    kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "a file"
    return f"{kind} of uid {st.st_uid} with mode {oct(stat.S_IMODE(st.st_mode))}"


def _check_private(path: str, name: str) -> None:
    """Raises :class:`~infeed.AttachError` unless ``path`` is this user's private names directory."""
    try:
        problem = private_dir_problem(path)
    except FileNotFoundError:
        raise AttachError(name, "exists", f"a ring served as {name!r} (infeed serve --name {name})",
                          f"no {path}") from None
    if problem:
        raise AttachError(name, "names", f"{path}: a directory of uid {os.getuid()} with mode 0o700", problem)


def alias_path(name: str) -> str:
    """Where the alias ``name`` of a served ring lives."""
    if not _NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(f"a ring name is 1 to 64 letters, digits, '_', '-' or '.', got {name!r}")
    return os.path.join(names_dir(), name)


def alias_target(path: str) -> str | None:
    """The segment name an alias file holds; None unless it is a regular file of this user."""
    data = read_own(path, _MAX_TARGET)
    return None if data is None else data.decode(errors="replace").strip()


def is_served(segment: str) -> bool:
    """Whether the ring ``segment`` exists and its creator holds it."""
    creator = read_creator(os.path.join(SHM_DIR, segment))
    return creator is not None and creator.locked


def resolve_name(name: str) -> str:
    """The segment name behind ``name``: an alias ``infeed serve`` wrote, else ``name`` itself.

    Raises :class:`~infeed.AttachError` naming the path when the alias is missing, or is not a regular
    file of this user with mode 0600 in the private names directory.
    """
    if name.startswith(name_prefix()):
        return name
    path = alias_path(name)
    _check_private(os.path.dirname(path), name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AttachError(name, "exists", f"a ring served as {name!r} (infeed serve --name {name})",
                          f"no {path}") from None
    except OSError as e:
        found = "a symbolic link" if e.errno == errno.ELOOP else e.strerror
        raise AttachError(name, "alias", f"{path}: a regular file", found) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600:
            raise AttachError(name, "alias", f"{path}: a regular file of uid {os.getuid()} with mode 0o600",
                              f"uid {st.st_uid}, mode {oct(stat.S_IMODE(st.st_mode))}")
        return f.read(_MAX_TARGET).decode(errors="replace").strip()


def write_alias(name: str, target: str) -> str:
    """Writes the alias ``name`` of segment ``target``, replacing a stale one; returns its path.

    Raises ValueError when a live ring is already served as ``name``.
    """
    path = alias_path(name)
    try:
        os.mkdir(os.path.dirname(path), 0o700)
    except FileExistsError:
        pass
    _check_private(os.path.dirname(path), name)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            served = alias_target(path)
            if served and is_served(served):
                raise ValueError(f"a ring is already served as {name!r} ({served})") from None
            os.unlink(path)                             # stale: its server is gone
    else:
        raise ValueError(f"{path}: another server is taking the name {name!r} now")
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(target.encode())
    return path
