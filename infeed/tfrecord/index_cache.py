"""Indexes kept apart from the data: a directory of record indexes, each keyed by its data file's URI and
identity, for files that have no sidecar and cannot get one (a read-only bucket or mount, a shared dataset).

An entry is ``<sha256 of the URI>-<size>-<mtime in ns>.index`` in the directory, in the sidecar's format
(:mod:`infeed.tfrecord.index`). The name binds it to one version of one file: a file rewritten since has
another identity, so its old entry is never found for it, and a same-size rewrite within the same
modification time is still caught at read time by the records' CRCs (``SourceChangedError``). An entry is
checked when loaded like a sidecar (magic, payload CRC, the data file's size): a damaged one is an
:class:`~infeed.errors.IndexFileError` naming it, never trusted. Entries are written atomically (a
temporary name, then a rename), so two processes or hosts writing the same entry at once both leave a
whole one.

The directory: the ``index_dir`` a :class:`~infeed.Dataset` or ``infeed index --output-dir`` is given, else
``$INFEED_INDEX_DIR``, else ``$XDG_CACHE_HOME/infeed/indexes`` (``~/.cache/infeed/indexes``). A sidecar beside
the data file comes first (:func:`find_index`). The directory may also hold tfrecord2idx's text indexes (DALI's,
the tfrecord package's: :mod:`infeed.tfrecord.text_index`) named after their data files, ``NAME.idx`` or
``NAME.tfindex``, as DALI's ``idx_files/`` folders do.

What it keeps: an entry's modification time is its last use (a load touches it, at most hourly). A file rewritten
leaves its old version's entry behind; once a newer version's entry is written, an older one nothing has read for
:data:`SUPERSEDED_UNUSED_S` (a day) is removed (:func:`remove_superseded`: a day, not at once, so that hosts
sharing the directory with copies of the same path that differ, as each host's local copy does, do not remove
each other's). ``infeed gc`` removes entries nothing has read for :data:`UNUSED_DAYS` (:func:`remove_unused`).
tfrecord2idx indexes are the user's and never removed.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable
from typing import NamedTuple

from infeed.errors import IndexFileError
from infeed.tfrecord.index import INDEX_SUFFIX, RecordIndex, index_path, load_index, write_index
from infeed.tfrecord.names import path_str, split_query
from infeed.tfrecord.text_index import TEXT_INDEX_SUFFIXES
from infeed.tfrecord.reader import _is_uri, remote_file_info

__all__ = ["INDEX_DIR_ENV", "SUPERSEDED_UNUSED_S", "UNUSED_DAYS", "CacheEntry", "cache_entries", "cached_index_path",
           "data_identity", "default_index_dir", "find_index", "load_cached_index", "locate_index",
           "remove_superseded", "remove_unused", "write_cached_index"]

#: The environment variable naming the directory of indexes kept apart from the data.
INDEX_DIR_ENV = "INFEED_INDEX_DIR"
#: An entry of another version of a file, unused this long (seconds), goes once a newer version's is written.
SUPERSEDED_UNUSED_S = 24 * 3600
#: ``infeed gc`` removes the entries unused this many days.
UNUSED_DAYS = 30
#: A load touches its entry (its last use) where its last use is older than this (seconds): a write an hour at most.
_TOUCH_AFTER_S = 3600
_ENTRY_NAME = re.compile(r"([0-9a-f]{40})-([0-9]+)-(-?[0-9]+)" + re.escape(INDEX_SUFFIX))


class CacheEntry(NamedTuple):
    """An entry of a directory of indexes: its path, the digest of its data file's URI, the data file's size and
    modification time (ns, -1 unknown) it was built for, its own bytes and its last use (epoch seconds)."""
    path: str
    digest: str
    size: int
    mtime_ns: int
    nbytes: int
    last_used: float


def default_index_dir() -> str:
    """``$INFEED_INDEX_DIR``, else ``$XDG_CACHE_HOME/infeed/indexes``, else ``~/.cache/infeed/indexes``."""
    named = os.environ.get(INDEX_DIR_ENV)
    if named:
        return os.path.abspath(os.path.expanduser(named))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(os.path.abspath(cache), "infeed", "indexes")


def data_identity(path) -> tuple[str, int, int]:
    """``(uri, size, mtime_ns)`` of the data file ``path`` as it is now: its absolute path or its URI (query
    included: it may name another endpoint), its size and its modification time in ns (-1 where the store
    gives none). Raises FileNotFoundError for a file that does not exist."""
    path = path_str(path)
    if not _is_uri(path):
        st = os.stat(path)
        return os.path.abspath(path), st.st_size, st.st_mtime_ns
    _, _, info = remote_file_info(path)
    return path, int(info.size), -1 if info.mtime_ns is None else int(info.mtime_ns)


def cached_index_path(index_dir, identity: tuple[str, int, int]) -> str:
    """The entry in ``index_dir`` for the data file of ``identity`` (:func:`data_identity`)."""
    uri, size, mtime_ns = identity
    digest = hashlib.sha256(uri.encode()).hexdigest()[:40]
    return os.path.join(os.fspath(index_dir), f"{digest}-{size}-{mtime_ns}{INDEX_SUFFIX}")


def load_cached_index(path, index_dir) -> RecordIndex | None:
    """The index of ``path`` from its entry in ``index_dir``, or None when there is none for the file as it is
    now (or no such file). Raises :class:`~infeed.errors.IndexFileError` naming a damaged entry."""
    located = _load_cached(path, index_dir)
    return None if located is None else located[0]


def _load_cached(path, index_dir) -> tuple[RecordIndex, str] | None:
    """:func:`load_cached_index`'s index and the entry it read it from."""
    if not os.path.isdir(index_dir):        # nothing kept: no look-up of the file (a round trip for a bucket's)
        return None
    try:
        identity = data_identity(path)
    except FileNotFoundError:               # gone: nothing to read it by (reading it names it, at its batch)
        return None
    entry = cached_index_path(index_dir, identity)
    try:
        last_used = os.stat(entry).st_mtime
    except OSError:                         # none (or a directory this user cannot search: none to read)
        return None
    index = load_index(path, index_file=entry, data_size=identity[1])
    if index is None:                       # removed since (infeed gc, or a newer version's build): none
        return None
    if time.time() - last_used > _TOUCH_AFTER_S:
        try:
            os.utime(entry)
        except OSError:                     # a read-only directory: its entries are never removed by their use
            pass
    return index, entry


def write_cached_index(index: RecordIndex, index_dir, identity: tuple[str, int, int] | None = None) -> str:
    """Writes ``index`` as the entry of its data file in ``index_dir`` (made if missing), atomically; returns
    the entry's path. ``identity``: the data file's, taken before it was indexed (:func:`data_identity`); an
    index of a file that changed meanwhile is refused with :class:`~infeed.errors.IndexFileError`."""
    now = data_identity(index.path)
    if identity is not None and identity != now:
        raise IndexFileError(index.path, f"changed while it was indexed: {identity[1:]} then {now[1:]} (size, "
                                         f"mtime_ns); index it again")
    if now[1] != index.file_size:
        raise IndexFileError(index.path, f"the index covers {index.file_size} bytes, the file has {now[1]}")
    os.makedirs(index_dir, exist_ok=True)
    return write_index(index, cached_index_path(index_dir, now))


def cache_entries(index_dir) -> list[CacheEntry]:
    """The entries of ``index_dir`` (named as :func:`cached_index_path` names them; nothing else in it), oldest
    use first; none where it does not exist."""
    index_dir = os.fspath(index_dir)
    try:
        names = os.listdir(index_dir)
    except (FileNotFoundError, NotADirectoryError):
        return []
    entries = []
    for name in names:
        match = _ENTRY_NAME.fullmatch(name)
        if match is None:
            continue
        path = os.path.join(index_dir, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:                  # removed meanwhile, by another process
            continue
        entries.append(CacheEntry(path, match[1], int(match[2]), int(match[3]), st.st_size, st.st_mtime))
    return sorted(entries, key=lambda e: e.last_used)


def remove_superseded(index_dir, written: Iterable[str], unused_s: float = SUPERSEDED_UNUSED_S) -> list[CacheEntry]:
    """Removes the entries of ``index_dir`` for other versions of the files of the entries ``written`` (the same
    URI, another size or modification time) that nothing has used for ``unused_s`` seconds; returns them."""
    written = {os.path.basename(path) for path in written}
    digests = {name[:40] for name in written}
    if not digests:
        return []
    now = time.time()
    stale = [e for e in cache_entries(index_dir) if e.digest in digests and os.path.basename(e.path) not in written
             and now - e.last_used > unused_s]
    return _removed(stale)


def remove_unused(index_dir, days: float = UNUSED_DAYS, dry_run: bool = False) -> list[CacheEntry]:
    """Removes (or with ``dry_run`` only lists) the entries of ``index_dir`` that nothing has used for ``days``
    days; returns them."""
    old = [e for e in cache_entries(index_dir) if time.time() - e.last_used > days * 86400]
    return old if dry_run else _removed(old)


def _removed(entries: list[CacheEntry]) -> list[CacheEntry]:
    """Those of ``entries`` this process removed (one gone meanwhile was another's to remove)."""
    out = []
    for entry in entries:
        try:
            os.unlink(entry.path)
        except FileNotFoundError:
            continue
        out.append(entry)
    return out


def find_index(path, index_dir=None) -> RecordIndex | None:
    """The index of ``path``: its sidecar first (``FILE.index``; beside a local file, tfrecord2idx's ``FILE.idx``
    or ``FILE.tfindex`` next), else in ``index_dir`` (None: :func:`default_index_dir`; False: sidecars only) its
    entry, or a tfrecord2idx index named after the file (``NAME.idx``, ``NAME.tfindex``: DALI's ``idx_files/``
    layout), else None. A damaged or stale index raises :class:`~infeed.errors.IndexFileError`; one named after
    another file of the same name is stale (its records do not tile this file), or at worst a
    ``CorruptRecordError`` at the first record read through it, never another file's records."""
    located = locate_index(path, index_dir)
    return None if located is None else located[0]


def locate_index(path, index_dir=None) -> tuple[RecordIndex, str] | None:
    """:func:`find_index`'s index of ``path`` and the file it read it from (a sidecar, an entry of
    ``index_dir``, a tfrecord2idx index), or None: what a process that found it tells others, who then read that
    file alone (``load_index(path, index_file=..., data_size=index.file_size)``), with no look-up of the data."""
    path = path_str(path)
    sidecar = index_path(path)
    index = load_index(path)
    if index is None and not _is_uri(path):          # beside a bucket's objects: a round trip each, not looked for
        sidecar, index = _first_found(path, [path + suffix for suffix in TEXT_INDEX_SUFFIXES])
    if index is not None or index_dir is False:
        return None if index is None else (index, sidecar)
    index_dir = default_index_dir() if index_dir is None else os.fspath(index_dir)
    located = _load_cached(path, index_dir)
    if located is None:
        name = os.path.basename(split_query(path)[0].rstrip("/"))
        entry, index = _first_found(path, [os.path.join(index_dir, name + suffix) for suffix in TEXT_INDEX_SUFFIXES])
        located = None if index is None else (index, entry)
    return located


def _first_found(path: str, candidates) -> tuple[str | None, RecordIndex | None]:
    """The first of the local files ``candidates`` that exists, and the index of ``path`` read from it; (None, None)."""
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate, load_index(path, index_file=candidate)
    return None, None
