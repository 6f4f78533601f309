"""Record-offset sidecars: ``FILE.index`` beside a TFRecord file gives random access to its records.

The sidecar is little-endian binary: a 40-byte header (``<8sIIQQI4x``: magic
``INFEEDIX``, version, flags, the data file's size, the record count, the CRC32C
of the payload), then the payload: one uint64 per record, the byte offset of its
header, and (version 2) one uint32 per record, its data CRC as the record's footer
holds it. Lengths follow from the offsets and the file size, since each record is
framed by 12 header and 4 footer bytes. A sidecar is untrusted input: every field
is checked on load, and one that does not describe the data file as it is now
raises :class:`~infeed.errors.IndexFileError`.

The data CRCs pin each record's content: a record read through the index whose data
CRC is not the one indexed (the file rewritten in place, an object replaced by
another of the same layout) is a :class:`~infeed.errors.SourceChangedError`, never
a record of another version mixed into a batch. Version-1 sidecars (no CRCs) are
still read; reads through them pin the file's size and modification time at open
and look the file up again after each batch's reads (:func:`check_versions`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import struct
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from infeed.errors import IndexFileError
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.names import path_str, split_query, with_suffix
from infeed.tfrecord.filesystems import filesystem_for
from infeed.tfrecord.reader import (_EXTENSIONS, _SNIFF_BYTES, _is_uri, _sniff, open_input, open_output,
                                    open_random_access, read_records)
from infeed.tfrecord.text_index import TEXT_INDEX_SUFFIXES, looks_like_text_index, parse_text_index, text_index_limit

__all__ = ["INDEX_SUFFIX", "MAX_JOINED_READ", "BatchRuns", "IndexedRun", "RecordIndex", "build_index",
           "check_versions", "compression_of",
           "index_path", "indexed_runs", "is_index_file", "load_index", "open_indexed", "read_indexed", "unframe_runs",
           "write_index"]

INDEX_SUFFIX = ".index"
MAGIC = b"INFEEDIX"
#: The version written; :func:`load_index` reads every one of READ_VERSIONS.
VERSION = 2
READ_VERSIONS = (1, 2)
_HEADER = struct.Struct("<8sIIQQI4x")
_FRAMING = 16                      # 8-byte length, its 4-byte CRC, and the data's 4-byte CRC
#: The most bytes :func:`read_indexed` reads with one call for records adjacent in a file.
MAX_JOINED_READ = 8 << 20

_log = logging.getLogger("infeed")


class RecordIndex(NamedTuple):
    """Where each record of one uncompressed TFRecord file starts, and the length of its data."""

    path: str                      #: the data file
    file_size: int                 #: its size in bytes when indexed
    offsets: np.ndarray            #: int64 [N]: byte offset of each record's header
    lengths: np.ndarray            #: int64 [N]: each record's data length (it spans 16 more bytes)
    #: uint32 [N]: each record's data CRC (masked, as its footer holds it) when indexed; None from a version-1
    #: sidecar, which pins only the file's size.
    data_crcs: np.ndarray | None = None

    @property
    def count(self) -> int:
        """The number of records."""
        return len(self.offsets)


def index_path(path) -> str:
    """The sidecar of the data file ``path`` (a local path or a URI: the suffix goes before its query).

    >>> index_path("gs://bucket/train-00000-of-00004?anonymous=true")
    'gs://bucket/train-00000-of-00004.index?anonymous=true'
    """
    return with_suffix(path, INDEX_SUFFIX)


def is_index_file(path) -> bool:
    """Whether ``path`` (a local path or a URI, its query aside) names an index rather than data: infeed's
    sidecar, or tfrecord2idx's ``.idx`` or ``.tfindex``."""
    return split_query(path_str(path))[0].endswith((INDEX_SUFFIX, *TEXT_INDEX_SUFFIXES))


def build_index(path) -> RecordIndex:
    """Indexes the records of the uncompressed TFRecord file ``path``, checking both CRCs of each.

    Damage raises :class:`~infeed.errors.CorruptRecordError`; a compressed file, ValueError.
    """
    path = path_str(path)
    _refuse_compressed(path)
    return _index_uncompressed(path)


def _index_uncompressed(path: str) -> RecordIndex:
    """:func:`build_index` for a file already known to be uncompressed (a compressed one is a
    ``CorruptRecordError`` at offset 0)."""
    offsets, lengths, crcs = [], [], []
    masked_crc32c = _tfrecord.masked_crc32c
    with read_records(path, compression=None) as reader:
        offset = reader.tell()
        for record in reader:
            offsets.append(offset)
            lengths.append(len(record))
            crcs.append(masked_crc32c(record))
            offset = reader.tell()
    return RecordIndex(path, offset, np.array(offsets, np.int64), np.array(lengths, np.int64),
                       np.array(crcs, np.uint32))


def compression_of(path) -> str | None:
    """``"GZIP"`` or ``"ZLIB"`` where the file ``path`` is compressed (told by its extension, else by its first
    bytes: one small read, a range request for a URI, not a stream that reads ahead), else None."""
    path = path_str(path)
    compression = _EXTENSIONS.get(os.path.splitext(split_query(path)[0].rstrip("/"))[1].lower())
    if compression is None:
        handle = open_random_access(path)
        try:
            compression = _sniff(handle.read_at(0, _SNIFF_BYTES))
        finally:
            handle.close()
    return compression


def _refuse_compressed(path: str) -> None:
    compression = compression_of(path)
    if compression is not None:
        raise ValueError(f"{path}: cannot index a {compression}-compressed file: offsets in a compressed "
                         "stream give no random access (index an uncompressed copy)")


def write_index(index: RecordIndex, dest=None) -> str:
    """Writes ``index`` atomically to ``dest`` (default: its sidecar path); returns where: version 2, or
    version 1 for an index without ``data_crcs``.

    Raises ValueError when the offsets, lengths, data CRCs and file size do not fit together.
    """
    if not isinstance(index, RecordIndex):
        raise TypeError(f"index must be a RecordIndex (from build_index or load_index), got {index!r:.80}")
    dest = index_path(index.path) if dest is None else path_str(dest, "dest")
    try:
        offsets = np.asarray(index.offsets, np.int64)
        lengths = _lengths(offsets, index.file_size)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{index.path}: refusing to write an inconsistent index: {e}") from None
    if not np.array_equal(lengths, index.lengths):
        raise ValueError(f"{index.path}: refusing to write an inconsistent index: "
                         "its lengths do not match the gaps between its offsets")
    payload, version = offsets.astype("<u8").tobytes(), 1
    if index.data_crcs is not None:
        crcs = np.asarray(index.data_crcs)
        if crcs.shape != offsets.shape or not np.array_equal(crcs.astype(np.uint32), crcs):
            raise ValueError(f"{index.path}: refusing to write an inconsistent index: its data CRCs are not one "
                             f"uint32 per record ({crcs.shape} for {len(offsets)} records)")
        payload, version = payload + crcs.astype("<u4").tobytes(), VERSION
    header = _HEADER.pack(MAGIC, version, 0, index.file_size, len(offsets), _tfrecord.crc32c(payload))
    _write_atomically(dest, header + payload)
    return dest


def _write_atomically(dest: str, data: bytes) -> None:
    """Writes ``data`` to a temporary name beside ``dest``, then renames it to ``dest``."""
    tmp = with_suffix(dest, f".tmp-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open_output(tmp) as out:
            out.write(data)
        _rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(tmp)
        raise


def _rename(src: str, dest: str) -> None:
    if not _is_uri(dest):
        os.replace(src, dest)
        return
    fs, inner_src = filesystem_for(src)
    fs.move(inner_src, filesystem_for(dest)[1])


def _remove(path: str) -> None:
    if not _is_uri(path):
        os.unlink(path)
        return
    fs, inner = filesystem_for(path)
    fs.delete_file(inner)


def load_index(path, index_file=None, data_size: int | None = None) -> RecordIndex | None:
    """The index of the data file ``path`` read from its sidecar (or from ``index_file``, an index kept
    elsewhere: :mod:`infeed.tfrecord.index_cache`), or None when there is none. ``data_size``: the data
    file's size where the caller has just looked it up (else it is looked up here). Either file may be a
    tfrecord2idx text index (DALI's, the tfrecord package's: :mod:`infeed.tfrecord.text_index`), read as a
    version-1 sidecar (no record CRCs).

    Raises :class:`~infeed.errors.IndexFileError` when the index is damaged, does not fit
    together, or was built for a different size of the data file (stale).
    """
    path = path_str(path)
    sidecar = index_path(path) if index_file is None else path_str(index_file, "index_file")
    try:
        stream, _ = open_input(sidecar)
    except FileNotFoundError:
        return None
    with stream:
        raw = stream.read(_HEADER.size)
        if raw[:len(MAGIC)] != MAGIC and looks_like_text_index(raw):       # tfrecord2idx's (DALI, tfrecord)
            size = _data_size(path, data_size)
            text = raw + stream.read(text_index_limit(size) + 1 - len(raw))
            offsets, lengths = parse_text_index(text, size, sidecar)
            return RecordIndex(path, size, offsets, lengths)
        if len(raw) < _HEADER.size:
            raise IndexFileError(sidecar, f"truncated header: {len(raw)} of {_HEADER.size} bytes")
        magic, version, flags, file_size, count, crc = _HEADER.unpack(raw)
        if magic != MAGIC:
            raise IndexFileError(sidecar, f"bad magic {magic!r}, expected {MAGIC!r}")
        if version not in READ_VERSIONS:
            raise IndexFileError(sidecar, f"version {version}, this infeed reads versions {READ_VERSIONS}")
        if flags != 0:
            raise IndexFileError(sidecar, f"unknown flags {flags:#x}")
        payload = stream.read()
    per_record = 8 if version == 1 else 12
    if len(payload) != per_record * count:
        raise IndexFileError(sidecar, f"truncated or oversized: {_HEADER.size + len(payload)} bytes where "
                                      f"{count} records need {_HEADER.size + per_record * count}")
    computed = _tfrecord.crc32c(payload)
    if computed != crc:
        raise IndexFileError(sidecar, f"payload CRC32C mismatch: stored {crc:#010x}, computed {computed:#010x}")
    offsets = np.frombuffer(payload, "<u8", count)
    crcs = None if version == 1 else np.frombuffer(payload, "<u4", count, 8 * count).astype(np.uint32)
    try:
        lengths = _lengths(offsets, file_size)
    except ValueError as e:
        raise IndexFileError(sidecar, str(e)) from None
    size = _data_size(path, data_size)
    if size != file_size:
        raise IndexFileError(sidecar, f"stale: built for {file_size} bytes of {path}, which now has {size}")
    return RecordIndex(path, file_size, offsets.astype(np.int64), lengths, crcs)


def _data_size(path: str, known: int | None) -> int:
    if known is not None:
        return known
    stream, size = open_input(path)
    stream.close()
    return size


def _lengths(offsets: np.ndarray, file_size: int) -> np.ndarray:
    """Each record's data length, from where it and the next one start; ValueError naming the first
    inconsistency (a first offset other than 0, offsets not increasing, records that overlap or
    run past the end of the file)."""
    if not 0 <= file_size < 1 << 63:
        raise ValueError(f"file size {file_size} is out of range")
    if len(offsets) == 0:
        if file_size:
            raise ValueError(f"no records, but the file has {file_size} bytes")
        return np.zeros(0, np.int64)
    if offsets[0] != 0:
        raise ValueError(f"the first record starts at byte {offsets[0]}, not 0")
    outside = (offsets < 0) | (offsets > file_size - _FRAMING)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise ValueError(f"record {i} starts at byte {offsets[i]}, outside the file's {file_size} bytes")
    offsets = offsets.astype(np.int64)
    lengths = np.diff(offsets, append=np.int64(file_size)) - _FRAMING
    bad = np.flatnonzero(lengths < 0)
    if bad.size:
        i = int(bad[0])
        if offsets[i + 1] <= offsets[i]:
            raise ValueError(f"offsets not increasing: record {i} starts at byte {offsets[i]}, "
                             f"record {i + 1} at {offsets[i + 1]}")
        raise ValueError(f"records {i} and {i + 1} overlap: they start {offsets[i + 1] - offsets[i]} "
                         f"bytes apart, less than the {_FRAMING} bytes of framing")
    return lengths


class IndexedRun(NamedTuple):
    """One read of :func:`indexed_runs`: ``size`` bytes at ``base`` of file ``file``, holding its records
    ``first``, ``first + 1``, ... at ``offsets`` (``lengths`` long, framing aside; ``data_crcs`` their data CRCs
    as indexed, None from a version-1 index)."""
    file: int
    first: int
    base: int
    size: int
    offsets: np.ndarray
    lengths: np.ndarray
    data_crcs: np.ndarray | None = None


def indexed_runs(index_of: Callable[[int], RecordIndex], files, records,
                 max_joined: int = MAX_JOINED_READ) -> list[IndexedRun]:
    """The reads that fetch record ``records[i]`` of file ``files[i]``, in that order: records that follow each
    other in a file and in ``records`` share a read of up to ``max_joined`` bytes (one record at least)."""
    return BatchRuns(index_of, files, records, max(len(records), 1), max_joined)[0] if len(records) else []


class BatchRuns:
    """:func:`indexed_runs` of each batch of ``batch_size`` consecutive entries of ``files`` and ``records`` (the
    last batch may be shorter): where runs break found for all of them at once (a planner's few numpy calls for
    many batches), and batch ``j``'s runs built when asked (``runs[j]``: a few Python steps per run, for the
    batches a worker reads alone)."""

    def __init__(self, index_of: Callable[[int], RecordIndex], files, records, batch_size: int,
                 max_joined: int = MAX_JOINED_READ):
        files, records = np.asarray(files, np.int64), np.asarray(records, np.int64)
        n = len(records)
        self._index_of, self._max_joined = index_of, max_joined
        cut = np.ones(n, bool)
        if n:
            np.not_equal(files[1:], files[:-1], out=cut[1:])
            cut[1:] |= records[1:] != records[:-1] + 1
            cut[::batch_size] = True
        firsts = np.flatnonzero(cut)
        self._firsts = firsts.tolist()
        self._ends = [*self._firsts[1:], n]
        self._files, self._records = files[firsts].tolist(), records[firsts].tolist()
        self._bounds = np.searchsorted(firsts, np.arange(0, n + batch_size, batch_size)).tolist()
        self._batches = -(-n // batch_size)

    def __len__(self) -> int:
        return self._batches

    def __getitem__(self, j: int) -> list[IndexedRun]:
        if not 0 <= j < self._batches:
            raise IndexError(j)
        runs: list = []
        for r in range(self._bounds[j], self._bounds[j + 1]):
            f, k, count = self._files[r], self._records[r], self._ends[r] - self._firsts[r]
            index = self._index_of(f)
            offsets, lengths, crcs = index.offsets, index.lengths, index.data_crcs
            base, last = int(offsets[k]), k + count - 1
            size = int(offsets[last]) + int(lengths[last]) + _FRAMING - base
            if size <= self._max_joined or count == 1:
                runs.append(IndexedRun(f, k, base, size, offsets[k:k + count], lengths[k:k + count],
                                       None if crcs is None else crcs[k:k + count]))
                continue
            ends = offsets[k:k + count] + lengths[k:k + count] + _FRAMING
            first = 0
            while first < count:
                end = count if ends[-1] - offsets[k + first] <= self._max_joined else \
                    max(first + 1, int(np.searchsorted(ends, offsets[k + first] + self._max_joined, side="right")))
                base = int(offsets[k + first])
                runs.append(IndexedRun(f, k + first, base, int(ends[end - 1]) - base, offsets[k + first:k + end],
                                       lengths[k + first:k + end],
                                       None if crcs is None else crcs[k + first:k + end]))
                first = end
        return runs


def unframe_runs(runs: Sequence[IndexedRun], datas: Sequence, paths: Sequence[str], views: bool = False) -> list:
    """The records of ``runs`` from what their reads gave (``datas``, in the same order), each checked alone (its
    header against the index, both CRCs, and its data CRC against the one indexed where the index has them):
    damage is a :class:`~infeed.CorruptRecordError`, a record of another version of the file a
    :class:`~infeed.errors.SourceChangedError`, each naming the file, the record and its byte offset."""
    out: list = []
    for run, data in zip(runs, datas):
        out += _tfrecord.unframe_run(data, paths[run.file], run.first, run.base, run.offsets, run.lengths, views,
                                     run.data_crcs)
    return out


def open_indexed(path, index: RecordIndex):
    """``open_random_access(path)`` for reads through ``index``, pinned as the file is now (its size and
    modification time; ``check_unchanged``); :class:`~infeed.errors.IndexFileError` when its size is no longer
    the size indexed (stale), before anything is read."""
    handle = open_random_access(path)
    size = handle.version[0]
    if size is not None and size != index.file_size:
        handle.close()
        raise IndexFileError(index_path(path), f"stale: built for {index.file_size} bytes of {path}, "
                                               f"which now has {size}")
    if index.data_crcs is None:
        _log.warning("%s: its index has no record CRCs (a version-1 sidecar, or a tfrecord2idx text index): the "
                     "file is looked up again after each batch's reads to see it unchanged; `infeed index` writes "
                     "version 2, which checks each record instead", path)
    return handle


def check_versions(runs: Sequence[IndexedRun], handle_of: Callable) -> None:
    """After the reads of ``runs``: each file read through a version-1 index (no record CRCs) is looked up again,
    once, and :class:`~infeed.errors.SourceChangedError` raised where it is no longer the version opened."""
    seen = set()
    for run in runs:
        if run.data_crcs is None and run.file not in seen:
            seen.add(run.file)
            handle_of(run.file).check_unchanged(run.base)


def read_indexed(read_at: Callable[[int, int, int], bytes], paths: Sequence[str],
                 index_of: Callable[[int], RecordIndex], files, records,
                 max_joined: int = MAX_JOINED_READ, views: bool = False,
                 check: Callable[[list], None] | None = None) -> list:
    """The data of record ``records[i]`` of file ``files[i]`` (numbers into ``paths``), in that order: bytes,
    or with ``views`` memoryviews into the reads (no copy; they keep their read alive).

    Records that follow each other in a file and in ``records`` are read with
    one ``read_at(file, offset, size)`` (up to ``max_joined`` bytes), each still
    checked alone (its header against the index, both CRCs): damage is a
    :class:`~infeed.CorruptRecordError` naming the file, the record and its
    byte offset. ``check(runs)``, where given, is called once the reads are done and before any record is
    handed out (:func:`check_versions`).
    """
    runs = indexed_runs(index_of, files, records, max_joined)
    datas = [read_at(run.file, run.base, run.size) for run in runs]
    if check is not None:
        check(runs)
    return unframe_runs(runs, datas, paths, views)
