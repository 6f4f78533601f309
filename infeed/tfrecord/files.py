"""Naming input files: paths, glob patterns and URIs (any ``pyarrow.fs`` scheme), alone or in lists
(:func:`expand_files`), and the TFRecord files among them (:func:`record_files`: a folder, or a pattern that
takes in files of another kind, is refused naming what it holds)."""

from __future__ import annotations

import fnmatch
import glob
import os
import re
from collections.abc import Sequence

from infeed.tfrecord.filesystems import filesystem_for
from infeed.tfrecord.names import split_query

__all__ = ["expand_files", "folder_files", "looks_unlike_records", "record_files"]

_MAGIC = "*?["
#: ``NAME@N``: the N shards ``NAME-00000-of-0000N`` ... (TensorFlow's sharded file names, TFDS's shorthand).
_SHARD_SPEC = re.compile(r"(.+)@([0-9]+)")


def _has_magic(pattern: str) -> bool:
    return any(c in pattern for c in _MAGIC)


#: Names of files that are never TFRecords (metadata beside shards: TFDS's JSON, label lists, notes).
_NOT_RECORDS = (".json", ".txt", ".md", ".csv", ".yaml", ".yml", ".py", ".pbtxt", ".html")
#: The patterns a folder's message suggests at most.
_SUGGESTED = 4


def _expand_local(pattern: str) -> list[str]:
    if not _has_magic(pattern):
        if os.path.isdir(pattern):
            raise IsADirectoryError(_folder_message(pattern))
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


def folder_files(folder: str) -> tuple[list[str], int]:
    """The TFRecord files of a local folder, sorted (not :func:`looks_unlike_records`, no index), and how many
    other files it holds."""
    from infeed.tfrecord.index import is_index_file

    paths = [os.path.join(folder, n) for n in sorted(os.listdir(folder))]
    paths = [p for p in paths if os.path.isfile(p)]
    records = [p for p in paths if not is_index_file(p) and not looks_unlike_records(p)]
    return records, len(paths) - len(records)


def _folder_message(folder: str) -> str:
    """What a folder named as a file holds, and the patterns that would name its shards."""
    if os.path.isfile(os.path.join(folder, "dataset_info.json")):
        return (f"{folder!r} is a folder: a tensorflow-datasets build (dataset_info.json), which "
                f"infeed.Dataset.from_tfds({folder!r}, split, ...) reads by its metadata")
    shards, others = folder_files(folder)
    if not shards:
        return f"{folder!r} is a folder, and holds no TFRecord files ({others} other files): name its files"
    groups: dict[str, int] = {}
    for name in map(os.path.basename, shards):         # digit runs as wildcards: a split's shards share one
        key = re.sub(r"[0-9]+", "*", name)
        groups[key] = groups.get(key, 0) + 1
    shown = ", ".join(f"{os.path.join(folder, g)!r} ({n} file{'s' if n > 1 else ''})"
                      for g, n in sorted(groups.items(), key=lambda kv: -kv[1])[:_SUGGESTED])
    more = f" and {len(groups) - _SUGGESTED} more" if len(groups) > _SUGGESTED else ""
    return (f"{folder!r} is a folder: name its files, a split's shards alone (reading a folder whole would "
            f"mix its splits), with a pattern such as {shown}{more}")


def record_files(files: str | os.PathLike | Sequence) -> list[str]:
    """:func:`expand_files` for reading records. What a pattern matches besides the TFRecord files: an index
    (infeed's sidecar, tfrecord2idx's) is left out, and a file of another kind is a ValueError naming it, before
    any record is read: by its name (JSON, text, ...), and for a local file by its first bytes (neither a
    record's framing, GZIP nor ZLIB; an empty file is an empty TFRecord file). A file named alone is read as
    it is (damage there is a CorruptRecordError naming its offset)."""
    from infeed.tfrecord.index import is_index_file

    items = [files] if isinstance(files, (str, os.PathLike)) else files
    if not isinstance(items, Sequence) or isinstance(items, bytes) or not items:
        return expand_files(files)                     # its error: not a path, or an empty list
    paths, other = [], []
    for item in items:
        matched = expand_files(item)
        if _is_pattern(os.fspath(item)):          # what a pattern took in; a file named alone is read as named
            matched = [p for p in matched if not is_index_file(p)]
            other += [p for p in matched if looks_unlike_records(p)]
        paths += matched
    paths = list(dict.fromkeys(paths))
    if other:
        shown = ", ".join(other[:_SUGGESTED]) + (f" and {len(other) - _SUGGESTED} more" if len(other) > _SUGGESTED
                                                 else "")
        raise ValueError(f"{len(other)} of the {len(paths)} files matched are not TFRecord files (by their names, "
                         f"or their first bytes: no record's header, GZIP nor ZLIB; else damaged from their first "
                         f"byte): {shown}; name the TFRecord files alone (a pattern that matches only the shards, "
                         "such as 'DIR/*.tfrecord*')")
    return paths


def looks_unlike_records(path: str) -> bool:
    """Whether ``path`` is no TFRecord file: by its name (JSON, text, ...), and a local one by its first bytes
    (neither a record's header, GZIP nor ZLIB; an empty file, or one shorter than a header, is not judged)."""
    from infeed.tfrecord import _tfrecord
    from infeed.tfrecord.reader import _sniff

    if split_query(path)[0].endswith(_NOT_RECORDS):
        return True
    if "://" in path:
        return False                                   # a round trip each: a bucket's objects are read to learn it
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False                                   # reading it names the problem, at its batch
    # Shorter than a record's header: a truncated file, which reading it names (CorruptRecordError, its offset).
    return len(head) >= 12 and not _tfrecord.looks_like_tfrecord(head) and _sniff(head) is None


def _is_pattern(name: str) -> bool:
    """Whether ``name`` is a glob pattern (a URI's ``?`` starts its query, no pattern)."""
    return _has_magic(split_query(name)[0] if "://" in name else name)


def expand_files(files: str | os.PathLike | Sequence) -> list[str]:
    """The files ``files`` names: each pattern's matches sorted, patterns in the given order, no duplicates;
    ``NAME@N`` names the N shards ``NAME-00000-of-0000N`` to ``NAME-0000{N-1}-of-0000N`` in order.

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
        sharded = _SHARD_SPEC.fullmatch(split_query(pattern)[0] if "://" in pattern else pattern)
        # TensorFlow's and TFDS's NAME@N, its N shards in order (a local file of that very name is itself).
        if sharded and not _has_magic(pattern) and ("://" in pattern or not os.path.exists(pattern)):
            query = split_query(pattern)[1] if "://" in pattern else ""
            names = [f"{sharded[1]}-{i:05d}-of-{int(sharded[2]):05d}{query}" for i in range(int(sharded[2]))]
            out.update(dict.fromkeys(m for name in names for m in (_expand_uri(name) if "://" in name
                                                                    else _expand_local(name))))
            continue
        matches = _expand_uri(pattern) if "://" in pattern else _expand_local(pattern)
        if not matches:
            raise FileNotFoundError(f"no files match {pattern!r}")
        out.update(dict.fromkeys(matches))
    return list(out)
