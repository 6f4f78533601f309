"""infeed as a Grain source: indexed TFRecord files read at random, decoded by infeed's ExampleParser.

Needs Grain (``pip install tpu-estimator-jax[grain]``); ``import infeed`` never imports it.

- :class:`TFRecordSource`: a Grain ``RandomAccessDataSource`` over uncompressed
  TFRecord files with ``infeed index`` sidecars. ``source[i]`` is record ``i``'s
  bytes (the files' records one after another, in the order given), read with
  one ``pread`` at the offset the sidecar gives and both CRCs checked: damage is
  a :class:`~infeed.CorruptRecordError` naming the file, the record's index in
  it and its byte offset. Reads share no file position, so threads may read at
  once; the source pickles as its paths (and record counts) and each process
  opens the files, and loads the sidecars, on its first read.
- :class:`ParseBatch`: a batch of serialized ``tf.train.Example`` s -> the
  fixed-shape numpy dict an ``infeed.Daemon`` batch holds (``Padded`` for
  ``VarLen`` and ``Bytes``), decoded by :class:`~infeed.ExampleParser`: use it as
  ``.batch(B, batch_fn=ParseBatch(spec))``, or ``.map`` it over batches that
  are lists of records.
- :class:`ParseExample`: one record -> one row of that dict (no batch axis), for
  ``.map`` before Grain's own ``.batch()``; slower per record (a decoder call
  each), the same values.

>>> import grain, infeed
>>> from infeed.grain import TFRecordSource, ParseBatch
>>> spec = {"x": infeed.FixedLen((2,), "float32"), "y": infeed.FixedLen((), "int64")}
>>> source = TFRecordSource("train-*.tfrecord")                 # doctest: +SKIP
>>> ds = (grain.MapDataset.source(source).shuffle(seed=0)       # doctest: +SKIP
...       .batch(256, drop_remainder=True, batch_fn=ParseBatch(spec)))
>>> ds[0]["x"].shape                                             # doctest: +SKIP
(256, 2)

Grain's own ``.batch()`` without ``batch_fn`` stacks bytes into a numpy ``S``
array, which drops each record's trailing NUL bytes (a serialized Example may
end in them): :class:`ParseBatch` refuses such an array and says to pass it as
``batch_fn``.
"""

from __future__ import annotations

import bisect
import hashlib
import operator
import os
import threading
from collections.abc import Mapping, Sequence

import numpy as np

try:
    import grain
except ImportError as e:                    # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError("infeed.grain needs Grain, which infeed does not install by itself: "
                      "pip install tpu-estimator-jax[grain]", name=e.name) from e

from infeed.daemon.dataset import PADDING_KEY
from infeed.errors import IndexFileError
from infeed.example.codec import ExampleParser
from infeed.example.spec import Padded
from infeed.tfrecord.files import expand_files
from infeed.tfrecord.index import (INDEX_SUFFIX, MAX_JOINED_READ, RecordIndex, build_index, check_versions, index_path,
                                   is_index_file, load_index, open_indexed, read_indexed, write_index)

__all__ = ["TFRecordSource", "ParseBatch", "ParseExample", "MISSING_INDEX"]

#: What :class:`TFRecordSource` does with a file whose sidecar is missing or unusable (damaged, stale).
MISSING_INDEX = {
    "error": "raise (ValueError for a missing sidecar, IndexFileError for an unusable one)",
    "build": "index the file in memory (reads every record once, checking both CRCs); the sidecar is untouched",
    "write": "index the file and write its sidecar (as `infeed index` does), for the next run",
}

_FRAMING = 16                  # a record's 12 header and 4 footer bytes


class TFRecordSource:
    """Records of indexed TFRecord files as a Grain ``RandomAccessDataSource`` (see the module's docstring).

    ``paths``: a path, glob or URI (any ``pyarrow.fs`` scheme), or a list of
    them, as :class:`~infeed.Dataset` takes them (``*.index`` sidecars that a
    glob matches are left out). Every file needs a sidecar (``infeed index
    FILES``) unless ``missing_index`` says otherwise (:data:`MISSING_INDEX`);
    compressed files cannot be indexed (no random access into a GZIP stream).

    ``len(source)`` is the records of all the files; ``source[i]`` the bytes of
    record ``i``; ``source._getitems(indices)`` (Grain's batched read, also
    ``__getitems__``) reads several, joining the reads of records that lie
    next to each other in a file. :meth:`locate` names the file, record and
    byte offset of an index.
    """

    def __init__(self, paths, *, missing_index: str = "error"):
        if missing_index not in MISSING_INDEX:
            raise ValueError(f"missing_index must be one of {sorted(MISSING_INDEX)}, got {missing_index!r:.80}")
        files = [p for p in expand_files(paths) if not is_index_file(p)]
        if not files:
            raise ValueError(f"{paths!r:.200} names only {INDEX_SUFFIX} sidecars, no data files")
        self.missing_index = missing_index
        self.paths: tuple[str, ...] = tuple(files)
        found = [_index_of(p, missing_index) for p in self.paths]
        indexes = [ix for ix, _ in found]
        #: Per file: its record count and its size in bytes when indexed (checked again by every process).
        self._counts = tuple(ix.count for ix in indexes)
        self._sizes = tuple(ix.file_size for ix in indexes)
        #: Offsets and data CRCs of the files indexed in memory (no sidecar to load again in another process).
        self._built = {ix.path: (ix.offsets, ix.data_crcs) for ix, built in found if built}
        self._starts = [0, *np.cumsum(self._counts).tolist()]
        self._len = self._starts[-1]
        self._reset(indexes)

    # -- the per-process part: open files and loaded indexes -------------------------------------------

    def _reset(self, indexes: list | None = None) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._files: list = [None] * len(self.paths)
        self._indexes: list = list(indexes) if indexes is not None else [None] * len(self.paths)

    def __getstate__(self) -> dict:
        return {"paths": self.paths, "missing_index": self.missing_index, "counts": self._counts,
                "sizes": self._sizes, "built": self._built}

    def __setstate__(self, state: dict) -> None:
        self.paths, self.missing_index = state["paths"], state["missing_index"]
        self._counts, self._sizes, self._built = state["counts"], state["sizes"], state["built"]
        self._starts = [0, *np.cumsum(self._counts).tolist()]
        self._len = self._starts[-1]
        self._reset()

    def _forked(self) -> None:
        """In a child forked after files were opened here: its own descriptors and lock (indexes are kept)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._files = [None] * len(self.paths)

    def _index(self, f: int) -> RecordIndex:
        ix = self._indexes[f]
        if ix is not None:
            return ix
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            if self._indexes[f] is None:
                self._indexes[f] = self._load(f)
            return self._indexes[f]

    def _load(self, f: int) -> RecordIndex:
        """File ``f``'s index in this process: from memory if it was built, else its sidecar, checked
        to describe the file as the source saw it when it was made."""
        path, count, size = self.paths[f], self._counts[f], self._sizes[f]
        built = self._built.get(path)
        if built is not None:
            offsets, crcs = built
            return RecordIndex(path, size, offsets, np.diff(offsets, append=np.int64(size)) - _FRAMING, crcs)
        ix = load_index(path)
        if ix is None:
            raise IndexFileError(index_path(path), "gone since the source was made (in another process)")
        if (ix.count, ix.file_size) != (count, size):
            raise IndexFileError(index_path(path), f"changed since the source was made: {ix.count} records of "
                                                   f"{ix.file_size} bytes, then {count} records of {size} bytes")
        return ix

    def _file(self, f: int):
        if self._pid != os.getpid():
            self._forked()
        handle = self._files[f]
        if handle is None:
            with self._lock:
                handle = self._files[f]
                if handle is None:
                    handle = self._files[f] = open_indexed(self.paths[f], self._index(f))
        return handle

    def close(self) -> None:
        """Closes the files this process opened (a later read opens them again)."""
        if self._pid != os.getpid():
            self._forked()                  # the parent's descriptors are the parent's to close
            return
        with self._lock:
            files, self._files = self._files, [None] * len(self.paths)
        for handle in files:
            if handle is not None:
                handle.close()

    # -- Grain's RandomAccessDataSource ----------------------------------------------------------------

    def __len__(self) -> int:
        return self._len

    def _where(self, index) -> tuple[int, int]:
        """(file number, record number in it) of ``index``; IndexError outside the source."""
        i = operator.index(index)
        n = self._len
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record index {index} out of range for {n} records")
        if len(self._counts) == 1:
            return 0, i
        f = bisect.bisect_right(self._starts, i) - 1
        return f, i - self._starts[f]

    def locate(self, index) -> tuple[str, int, int]:
        """``(path, record index in that file, byte offset of its header)`` of record ``index``."""
        f, k = self._where(index)
        return self.paths[f], k, int(self._index(f).offsets[k])

    def __getitem__(self, index) -> bytes:
        f, k = self._where(index)
        return read_indexed(self._read_at, self.paths, self._index, [f], [k], check=self._check)[0]

    def _getitems(self, indices: Sequence[int]) -> list[bytes]:
        """The records at ``indices``, in that order: records that follow each other in a file and in
        ``indices`` are read with one call (up to :data:`MAX_JOINED_READ` bytes), each still CRC-checked alone."""
        located = [self._where(index) for index in indices]
        return read_indexed(self._read_at, self.paths, self._index, [f for f, _ in located], [k for _, k in located],
                            MAX_JOINED_READ, check=self._check)

    __getitems__ = _getitems

    def _read_at(self, f: int, offset: int, size: int) -> bytes:
        return self._file(f).read_at(offset, size)

    def _check(self, runs) -> None:
        check_versions(runs, self._file)

    def __repr__(self) -> str:
        # Grain's DataLoader keeps this in its checkpoints to check a restore against: stable, and short.
        if len(self.paths) <= 3:
            files = ", ".join(map(repr, self.paths))
        else:
            digest = hashlib.sha256("\n".join(self.paths).encode()).hexdigest()[:12]
            files = f"{self.paths[0]!r} ... {self.paths[-1]!r}: {len(self.paths)} files, sha256 {digest}"
        return f"TFRecordSource([{files}], {self._len} records)"


def _index_of(path: str, missing_index: str) -> tuple[RecordIndex, bool]:
    """``path``'s index as ``missing_index`` says to find it, and whether it lives only in memory."""
    try:
        ix = load_index(path)
    except IndexFileError:
        if missing_index == "error":
            raise
        ix = None
    if ix is None:
        if missing_index == "error":
            raise ValueError(f"{path} has no record index ({index_path(path)}): run `infeed index` on the files "
                             "first (uncompressed files only), or pass missing_index='build' or 'write'")
        ix = build_index(path)
        if missing_index == "write":
            write_index(ix)
        return ix, missing_index == "build"
    return ix, False


# --- decoding -------------------------------------------------------------------------------------------

def _check_records(records, what: str):
    if isinstance(records, np.ndarray) and records.dtype.kind == "S":
        raise TypeError(f"{what} got a numpy bytes array ({records.dtype}): Grain's default batching stacks "
                        "records into one and drops their trailing NUL bytes, which an Example may end in. "
                        "Decode in the batch instead: .batch(B, batch_fn=ParseBatch(spec)) (or batch_fn=list, "
                        "then .map(ParseBatch(spec)))")
    return records


class _Decoding(grain.transforms.Map):
    """A spec's :class:`~infeed.ExampleParser`, one per thread (a parser binds its output arrays while it
    decodes, and Grain runs maps on several threads at once); pickled as its settings."""

    _settings: tuple = ("spec", "seed", "skip_corrupt")

    def __init__(self, spec: Mapping, seed: int = 0, skip_corrupt: bool = False):
        parser = ExampleParser(spec, seed, skip_corrupt)         # checks the spec now, in the caller's thread
        self.spec, self.seed, self.skip_corrupt = parser.spec, seed, skip_corrupt
        self._local = threading.local()
        self._local.parser = parser

    def _parser(self) -> ExampleParser:
        parser = getattr(self._local, "parser", None)
        if parser is None:
            parser = self._local.parser = ExampleParser(self.spec, self.seed, self.skip_corrupt)
        return parser

    def __getstate__(self) -> dict:
        return {name: getattr(self, name) for name in self._settings}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def map(self, element):
        return self(element)


class ParseBatch(_Decoding):
    """Serialized ``tf.train.Example`` s -> ``{name: array [B, ...]}`` as an ``infeed.Daemon`` batch holds them.

    ``spec``: ``{name: FixedLen | VarLen | Bytes | Image}`` as :class:`~infeed.Dataset` takes it; each
    call decodes a batch with :class:`~infeed.ExampleParser` into fresh arrays (``infeed.Padded`` for
    ``VarLen`` and ``Bytes``) and raises :class:`~infeed.DecodeError` naming the feature and the
    record's position in the batch. Use it as Grain's batch function (``.batch(B, batch_fn=parse)``,
    ``grain.transforms.Batch(B, batch_fn=parse)``) or as a ``Map`` over lists of records.

    ``pad_to=B``: every batch has ``B`` rows, a shorter one (an epoch's last) zero rows after its
    records, and a bool ``is_padding`` array flags them, as ``Dataset(final_batch="pad")`` does.
    ``skip_corrupt=True``: a record whose image does not decode is a zero row, flagged in ``is_padding``
    too (which every batch then carries), as in a ``Dataset``.

    A spec whose ``Image`` features crop or flip at random draws per record: it needs a random
    generator per batch, ``ds.batch(B, batch_fn=list).random_map(parse)`` (Grain seeds it from the
    pipeline's seed and the batch's index); called without one, such a parser raises. ``seed`` and
    ``skip_corrupt`` are :class:`~infeed.ExampleParser`'s.
    """

    _settings = ("spec", "seed", "skip_corrupt", "pad_to")

    def __init__(self, spec: Mapping, *, pad_to: int | None = None, seed: int = 0, skip_corrupt: bool = False):
        if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 1):
            raise ValueError(f"pad_to must be a positive int or None, got {pad_to!r:.80}")
        super().__init__(spec, seed, skip_corrupt)
        if (pad_to is not None or skip_corrupt) and PADDING_KEY in self.spec:
            raise ValueError(f"a feature named {PADDING_KEY!r} clashes with the padding mask of "
                             f"{'pad_to' if pad_to is not None else 'skip_corrupt'}")
        self.pad_to = pad_to

    def __call__(self, records: Sequence, rng: np.random.Generator | None = None) -> dict:
        records = _check_records(records, "ParseBatch")
        n = len(records)
        rows = n if self.pad_to is None else self.pad_to
        if n > rows:
            raise ValueError(f"ParseBatch(pad_to={self.pad_to}) got a batch of {n} records")
        parser = self._parser()
        out = parser.allocate(rows)
        parser.parse(records, out, ids=_ids(parser, n, rng))
        if self.pad_to is not None or self.skip_corrupt:
            out[PADDING_KEY] = np.arange(rows) >= n
            out[PADDING_KEY][parser.last_skipped_rows] = True
        return out

    def __repr__(self) -> str:
        return f"ParseBatch({len(self.spec)} features: {', '.join(self.spec)[:120]}, pad_to={self.pad_to})"


class ParseExample(_Decoding):
    """One serialized ``tf.train.Example`` -> ``{name: row}``: a row of what :class:`ParseBatch` gives (no
    batch axis), for ``.map(ParseExample(spec))`` before Grain's ``.batch()``, whose stacking then gives
    :class:`ParseBatch`'s arrays. A decoder call per record: slower than decoding whole batches.
    ``rng`` as for :class:`ParseBatch` (``.random_map(ParseExample(spec))`` for random crops)."""

    def __init__(self, spec: Mapping, *, seed: int = 0):
        super().__init__(spec, seed)

    def __call__(self, record: bytes, rng: np.random.Generator | None = None) -> dict:
        if not isinstance(record, (bytes, bytearray, memoryview)):
            raise TypeError(f"ParseExample takes one serialized Example (bytes), got {type(record).__name__}")
        parser = self._parser()
        out = self._local.__dict__.get("row")
        if out is None:                 # one row decoded into, checked once, then copied out: cheaper than a
            out = self._local.row = parser.allocate(1)        # fresh (and freshly checked) array per feature
        parser.parse([record], out, ids=_ids(parser, 1, rng))
        return {name: Padded(v.values[0].copy(), v.lengths[0].copy()) if isinstance(v, Padded) else v[0].copy()
                for name, v in out.items()}

    def __repr__(self) -> str:
        return f"ParseExample({len(self.spec)} features: {', '.join(self.spec)[:120]})"


def _ids(parser: ExampleParser, n: int, rng: np.random.Generator | None) -> list | None:
    """Each record's ``(epoch, file, record)`` for its random draws: two words from Grain's generator of
    the batch and the record's position; None when the spec draws nothing."""
    if not parser.uses_record_ids:
        return None
    if rng is None:
        raise ValueError("this spec's Image features crop or flip at random, and each batch needs its own draws: "
                         "apply the parser with Grain's random_map (ds.batch(B, batch_fn=list).random_map(parse), "
                         "or .random_map(ParseExample(spec)) per record)")
    a, b = (int(x) for x in rng.integers(0, 1 << 63, 2))
    return [(a, b, i) for i in range(n)]
