"""Naming input files: paths, glob patterns and URIs (any ``pyarrow.fs`` scheme), alone or in lists."""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Sequence

from infeed.tfrecord.filesystems import filesystem_for
from infeed.tfrecord.names import split_query

__all__ = ["expand_files"]

_MAGIC = "*?["


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

    pattern, query = split_query(pattern)
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
