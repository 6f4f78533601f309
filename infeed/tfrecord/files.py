"""Naming input files: paths, glob patterns and URIs (any ``pyarrow.fs`` scheme), alone or in lists."""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence

__all__ = ["expand_files", "split_query", "with_suffix"]

_MAGIC = "*?["


def path_str(path, what: str = "path") -> str:
    """``path`` (a str, bytes or os.PathLike path or URI) as a str; TypeError naming ``what`` otherwise."""
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise TypeError(f"{what} must be a str or os.PathLike path or URI, got {path!r:.80}") from None


def split_query(path: str) -> tuple[str, str]:
    """A URI's location and its query, the query with its ``?`` (``""`` when it has none); a local path is
    all location (a ``?`` in a file name is a character like any other).

    >>> split_query("s3://bucket/train.tfrecord?region=us-east-1")
    ('s3://bucket/train.tfrecord', '?region=us-east-1')
    >>> split_query("data/what?.tfrecord")
    ('data/what?.tfrecord', '')
    """
    if "://" not in path or "?" not in path:
        return path, ""
    location, query = path.split("?", 1)
    return location, "?" + query


def with_suffix(path, suffix: str) -> str:
    """``path`` (a local path or a URI) with ``suffix`` added to its file name: on a URI, to its location, the
    query kept last, so that a name derived from a file (its ``.index`` sidecar, a temporary name) reaches the
    same bucket with the same options.

    >>> with_suffix("data/train.tfrecord", ".index")
    'data/train.tfrecord.index'
    >>> with_suffix("s3://bucket/train.tfrecord?endpoint_override=127.0.0.1:9000&scheme=http", ".index")
    's3://bucket/train.tfrecord.index?endpoint_override=127.0.0.1:9000&scheme=http'
    """
    location, query = split_query(path_str(path))
    return location + suffix + query


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in _MAGIC)


def _expand_local(pattern: str) -> list[str]:
    if not _has_magic(pattern):
        if not os.path.isfile(pattern):
            raise FileNotFoundError(f"no such file: {pattern!r}")
        return [pattern]
    return sorted(p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


def _expand_uri(pattern: str) -> list[str]:
    """A URI's matches: ``*`` and ``[...]`` are patterns, ``?`` starts the query (``?region=...``),
    which every match keeps; ``**/`` matches zero or more folders, as in a local glob."""
    import pyarrow.fs as pafs

    from infeed.tfrecord.filesystems import filesystem_for      # it imports this module

    pattern, query = (pattern.split("?", 1) + [""])[:2]
    query = f"?{query}" if query else ""
    scheme, rest = pattern.split("://", 1)
    cut = min((rest.find(c) for c in "*[" if c in rest), default=-1)
    if cut < 0:
        fs, inner = filesystem_for(pattern + query)
        if fs.get_file_info(inner).type != pafs.FileType.File:
            raise FileNotFoundError(f"no such file: {pattern + query!r}")
        return [pattern + query]
    base_uri = f"{scheme}://{rest[:rest.rfind('/', 0, cut) + 1]}"
    fs, base = filesystem_for(base_uri + query)
    prefix = f"{scheme}://"
    inner_pattern = base.rstrip("/") + "/" + rest[rest.rfind("/", 0, cut) + 1:]
    infos = fs.get_file_info(pafs.FileSelector(base, recursive="**" in pattern, allow_not_found=True))
    patterns = {inner_pattern, inner_pattern.replace("**/", "")}
    return sorted(prefix + info.path + query for info in infos
                  if info.type == pafs.FileType.File and any(fnmatch.fnmatchcase(info.path, p) for p in patterns))


def expand_files(files: str | os.PathLike | Sequence) -> list[str]:
    """The files ``files`` names: each pattern's matches sorted, patterns in the given order, no duplicates.

    Raises FileNotFoundError naming a pattern that matches nothing, ValueError
    for an empty list or an element that is not a path.
    """
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    elif not isinstance(files, Sequence) or isinstance(files, bytes):
        raise ValueError(f"files must be a path, a pattern, a URI or a list of them, got {files!r:.200}")
    if not files:
        raise ValueError("files is an empty list")
    out: dict[str, None] = {}
    for item in files:
        if not isinstance(item, (str, os.PathLike)):
            raise ValueError(f"files must hold paths, patterns or URIs, got {item!r:.200}")
        pattern = os.fspath(item)
        matches = _expand_uri(pattern) if "://" in pattern else _expand_local(pattern)
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}")
        out.update(dict.fromkeys(matches))
    return list(out)
