"""Indexes built for the user: the files of a dataset that have no index get one in the index directory
(:mod:`infeed.tfrecord.index_cache`) before the first epoch, so that workers read only their own batches.

Each file is read once, front to back (for a bucket, one streamed read of each object), on up to
``BUILD_THREADS`` threads at once: a remote file's reads wait on the store. On local files in the page cache
the build is bound by its Python work per record (a record object and a CRC call each): large records gain
from a second thread (110 KB records: 2.2 GB/s with one, 3.7 GB/s with two on 2 cores), small ones do not
(200 bytes: 1.5 M records/s with one, 0.9 M/s with two, contending for the GIL). Each index is written to
the directory as soon as it is built (atomically: a process or host building the same entry at once leaves one
whole entry), so a build cut short keeps the
files it finished. Where the directory cannot be written (read-only, full, not a directory) the build
stops at the first failure with one warning saying why, and the files without an index stream.

Memory: a build holds, per thread, one file's index while it is built (16 bytes a record, 8 more per record
in Python lists until it is done: about 30 MB for 1.28 M records) and the reader's buffer.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Sequence

from infeed.errors import IndexFileError, InfeedError
from infeed.tfrecord.index import _index_uncompressed, compression_of
from infeed.tfrecord.index_cache import data_identity, remove_superseded, write_cached_index

__all__ = ["BUILD_THREADS", "PROGRESS_EVERY_S", "BuildResult", "build_indexes", "compressed_files"]

#: The most files indexed at once.
BUILD_THREADS = 8
#: How often a long build logs how far it got.
PROGRESS_EVERY_S = 10.0

_log = logging.getLogger("infeed")


class BuildResult(NamedTuple):
    """What :func:`build_indexes` did: the files indexed and kept, their records and bytes, the seconds it took,
    and why it stopped early (None when every file was indexed)."""
    built: tuple[str, ...]
    records: int
    bytes: int
    seconds: float
    failure: str | None


def compressed_files(paths: Sequence[str], compression: str | None = "auto",
                     threads: int = BUILD_THREADS) -> list[str]:
    """Those of ``paths`` that are compressed: all or none where ``compression`` names it (``"GZIP"``, ``"ZLIB"``;
    None or ``""``: none), else each told by its extension or its first bytes (a small read each, up to
    ``threads`` at once: for a bucket's extensionless shards, a round trip each)."""
    if compression != "auto":
        return list(paths) if compression else []
    with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
        return [path for path, kind in zip(paths, pool.map(_compression_of, paths)) if kind is not None]


def _compression_of(path: str) -> str | None:
    """:func:`~infeed.tfrecord.index.compression_of`, None for a file gone (:func:`build_indexes` leaves it out,
    and reading it names it, at its batch)."""
    try:
        return compression_of(path)
    except FileNotFoundError:
        return None


def build_indexes(paths: Sequence[str], index_dir: str, threads: int = BUILD_THREADS) -> BuildResult:
    """Builds the index of each of ``paths`` (uncompressed TFRecord files: :func:`compressed_files` tells the
    others, which would be left to stream as damaged) and keeps it in ``index_dir``; logs one
    line at the end (files, records, bytes, time, rate), and how far it got every PROGRESS_EVERY_S. A file that
    cannot be read or indexed (damaged, gone, changed while it was read) is left out with a warning naming it and
    why: it streams, and a damaged one fails there as it would have; a directory that cannot be written ends the
    build with one warning, and the result says why (``failure``)."""
    paths = list(paths)
    began = time.monotonic()
    lock = threading.Lock()
    done: list[tuple[str, int, int]] = []
    failure: list[str] = []
    written: list[str] = []
    last_report = [began]

    def one(path: str) -> None:
        if failure:                                   # the directory cannot be written: no more reads for nothing
            return
        try:
            identity = data_identity(path)
            index = _index_uncompressed(path)
        except (InfeedError, OSError, ValueError) as e:     # damaged, unreadable: read as a stream, and fail there
            _log.warning("infeed: %s is not indexed, and streams: %s", path, e)
            return
        try:
            entry = write_cached_index(index, index_dir, identity)
        except IndexFileError as e:                          # changed while it was read
            _log.warning("infeed: %s is not indexed, and streams: %s", path, e)
            return
        except OSError as e:
            with lock:
                if not failure:
                    failure.append(f"{index_dir}: {e.strerror or e}")
            return
        with lock:
            done.append((path, index.count, index.file_size))
            written.append(entry)
            now = time.monotonic()
            if now - last_report[0] >= PROGRESS_EVERY_S:
                last_report[0] = now
                _log.info("infeed: indexing: %d of %d files, %.0f MB, %.0f s so far", len(done), len(paths),
                          sum(d[2] for d in done) / 1e6, now - began)

    with ThreadPoolExecutor(max(1, min(threads, len(paths)))) as pool:
        for future in [pool.submit(one, p) for p in paths]:
            future.result()
    seconds = time.monotonic() - began
    try:
        remove_superseded(index_dir, written)
    except OSError as e:                                      # kept all: a later build tries again
        _log.warning("infeed: could not remove the indexes of older versions of these files from %s: %s",
                     index_dir, e)
    records, nbytes = sum(d[1] for d in done), sum(d[2] for d in done)
    reason = failure[0] if failure else None
    if reason is not None:
        _log.warning("infeed: could not keep record indexes (%s): %d of %d files indexed; the others stream (each "
                     "worker reads every record); name a writable directory with Dataset(index_dir=...) or "
                     "INFEED_INDEX_DIR, or run `infeed index --output-dir DIR`", reason, len(done), len(paths))
    elif done:
        _log.info("infeed: indexed %d file%s (%d records, %.1f MB) in %.2f s (%.0f MB/s) into %s: the workers read "
                  "only their own batches (Dataset(build_indexes=False): stream instead)", len(done),
                  "" if len(done) == 1 else "s", records, nbytes / 1e6, seconds, nbytes / 1e6 / max(seconds, 1e-9),
                  index_dir)
    return BuildResult(tuple(d[0] for d in done), records, nbytes, seconds, reason)
