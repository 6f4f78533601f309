"""Names of files as strings, local paths and URIs alike, with no I/O: a path as a str, a URI's query apart from
its location, and a name derived from another (a sidecar, a shard, a temporary name) with the query kept last."""

from __future__ import annotations

import os

__all__ = ["path_str", "split_query", "with_suffix"]


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
