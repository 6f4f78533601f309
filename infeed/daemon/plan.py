"""The batch sequence of a :class:`~infeed.daemon.dataset.Dataset`, epoch by epoch, as every worker computes it.

Every worker walks the same sequence; it reads and decodes only the batches it
owns and moves past the others as cheaply as the order allows: without record
shuffling, by reading the framing alone (no copy, no data CRC: the owner checks
those); with a shuffle buffer, by reading the records (the buffer needs them)
without decoding; with an index for every file (``infeed index``; any
shuffle), not at all: a worker reads only its own batches' records, those that
follow each other in a file with one call. Without shuffling or an index, a
worker decodes its own records where they lie in the reader's buffer, straight
into the ring slot, with no bytes object in between.
"""

from __future__ import annotations

import collections
import functools
from typing import Callable, Iterator, NamedTuple

import numpy as np

from infeed.daemon.indexed_reads import IndexedFiles, OpenFiles
from infeed.daemon.read_ahead import ReadAhead

__all__ = ["PlannedBatch", "ShuffleBuffer", "EpochRecords", "epoch_paths", "epoch_order", "interleave_order",
           "epoch_batches", "exists", "record_offset"]

#: Random draws fetched at a time by a shuffle buffer.
_DRAW_BLOCK = 4096
#: Batches whose records an indexed epoch places at a time (their files, their numbers there, the runs of reads
#: that fetch them: a few numpy calls for all of them, rather than per batch).
_PLACE_BLOCK = 64


def _rng(seed: int, epoch: int, stream: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, stream])))


def epoch_paths(ds, epoch: int) -> list[str]:
    """This host's files in epoch ``epoch``'s order."""
    paths = list(ds.shard_paths())
    if ds.shuffle_files and len(paths) > 1:
        paths = [paths[i] for i in _rng(ds.seed, epoch, 0).permutation(len(paths))]
    return paths


class ShuffleBuffer:
    """A buffer of ``size`` items: each new item takes the place of a random one, which comes out.

    Deterministic for ``(seed, epoch)``, whatever the items are, so a worker
    that shuffles records and one that shuffles record numbers agree.
    """

    def __init__(self, size: int, seed: int, epoch: int):
        self.size = size
        self._items: list = []
        self._rng = _rng(seed, epoch, 1)
        self._draws = np.empty(0, np.int64)
        self._next = 0

    def push(self, item):
        """Adds ``item``; returns the item that leaves, or None while the buffer fills."""
        if len(self._items) < self.size:
            self._items.append(item)
            return None
        if self._next == len(self._draws):
            self._draws = self._rng.integers(0, self.size, _DRAW_BLOCK).tolist()
            self._next = 0
        j = self._draws[self._next]
        self._next += 1
        out, self._items[j] = self._items[j], item
        return out

    def drain(self) -> list:
        """The items left, in random order; the buffer is empty afterwards."""
        items, self._items = self._items, []
        return [items[i] for i in self._rng.permutation(len(items))]


class PlannedBatch(NamedTuple):
    """Batch ``index`` of an epoch.

    ``fill(parser, out) -> (records, bytes)`` decodes it into rows ``0..`` of
    ``out`` (None when this worker does not need the batch). ``count`` is its
    number of records, or None when the records are read as they are decoded:
    then ``fill`` tells, and 0 records, or a partial batch with
    ``final_batch="drop"``, means there is no such batch (the epoch ended).
    ``where(i)`` is (path, record index in the file, offset or None) of record i.
    """

    index: int
    count: int | None
    fill: Callable | None
    where: Callable[[int], tuple]


def _parse_records(records: list, ids: Callable[[], list] | None = None) -> Callable:
    """``fill`` of records in hand; ``ids()`` gives their ``(epoch, file, record)`` when the parser draws per record."""
    def fill(parser, out) -> tuple[int, int]:
        parser.parse(records, out=out, ids=ids() if ids is not None and parser.uses_record_ids else None)
        return len(records), sum(map(len, records))
    return fill


def _record_ids(ds, epoch: int, origins) -> Callable[[], list]:
    """``ids()``: the ``(epoch, file, record)`` of records from ``origins`` ((path, record, offset) each)."""
    return lambda: [(epoch, ds.file_number(path), record) for path, record, _ in origins]


class EpochRecords:
    """The records of one epoch of this host's shard: file after file, every ``stride``-th one."""

    def __init__(self, ds, epoch: int):
        self._ds = ds
        self._epoch = epoch
        self._paths = epoch_paths(ds, epoch)
        self._file = -1
        self._reader = None
        self._stride = 1 if ds.shards_by_file else ds.num_shards
        self._gap = 0 if ds.shards_by_file else ds.shard_index   # raw records before the next kept one

    def _current(self):
        while self._reader is None:
            if self._file + 1 >= len(self._paths):
                return None
            self._file += 1
            self._reader = self._ds.open_records(self._paths[self._file])
        return self._reader

    def _next_file(self) -> None:
        self._reader.close()
        self._reader = None

    def _raw_skip(self, n: int) -> int:
        done = 0
        while done < n:
            reader = self._current()
            if reader is None:
                break
            got = reader.skip(n - done)
            done += got
            if done < n:
                self._next_file()
        return done

    def _raw_take(self, n: int, origins: list | None) -> list:
        out: list = []
        while len(out) < n:
            reader = self._current()
            if reader is None:
                break
            got = reader.read_batch(n - len(out))
            if origins is not None and got:
                origins.append((self._paths[self._file], reader.records_read - len(got), len(got)))
            out += got
            if len(out) < n:
                self._next_file()
        return out

    def take(self, n: int, origins: list | None = None) -> list:
        """Up to ``n`` records (fewer at the end); ``(path, first record index, count)`` of each
        run of consecutive records appended to ``origins``."""
        if self._stride == 1:
            return self._raw_take(n, origins)
        out: list = []
        while len(out) < n:
            if self._raw_skip(self._gap) < self._gap:
                break
            got = self._raw_take(1, origins)
            self._gap = 0
            if not got:
                break
            out += got
            self._gap = self._stride - 1
        return out

    def read_into(self, parser, n: int, out: dict, runs: list) -> tuple[int, int]:
        """Decodes up to ``n`` records straight from the readers' buffers into rows ``0..`` of ``out``;
        returns (records, bytes) and appends the runs of records it read to ``runs``."""
        if self._stride != 1:
            records = self.take(n, runs)
            return _parse_records(records, _record_ids(self._ds, self._epoch, _runs_origins(runs)))(parser, out)
        done = nbytes = 0
        while done < n:
            reader = self._current()
            if reader is None:
                break
            before = reader.records_read
            origin = (self._epoch, self._ds.file_number(self._paths[self._file]))
            try:
                got, size = parser.read_into(reader, n - done, out, start=done, index_base=done, origin=origin)
            finally:        # a DecodeError names its record by position: where() needs this run
                if reader.records_read > before:
                    runs.append((self._paths[self._file], before, reader.records_read - before))
            done, nbytes = done + got, nbytes + size
            if done < n:
                self._next_file()
        return done, nbytes

    def skip(self, n: int) -> int:
        """Moves past up to ``n`` records by their framing alone; returns how many."""
        if n <= 0:
            return 0
        if self._stride == 1:
            return self._raw_skip(n)
        want = self._gap + (n - 1) * self._stride + 1
        raw = self._raw_skip(want)
        kept = 0 if raw <= self._gap else 1 + (raw - self._gap - 1) // self._stride
        self._gap = self._stride - 1 if raw == want else 0
        return kept

    def close(self) -> None:
        if self._reader is not None:
            self._next_file()


def _origins_of(origins: list) -> Callable[[int], tuple]:
    return origins.__getitem__


def _runs_origins(runs: list) -> list:
    """``(path, record, None)`` of every record of runs of consecutive records ``(path, first index, count)``."""
    return [(path, first + i, None) for path, first, count in runs for i in range(count)]


def _runs_of(runs: list) -> Callable[[int], tuple]:
    """``where(i)`` over runs of consecutive records ``(path, first index, count)``."""
    def where(i: int) -> tuple:
        for path, first, count in runs:
            if i < count:
                return path, first + i, None
            i -= count
        raise IndexError(i)
    return where


def _no_origins(i: int) -> tuple:
    raise LookupError("this worker did not read the batch")


def epoch_batches(ds, epoch: int, first: int, owned: Callable[..., bool | None],
                  indexes: dict | None = None, sizes: list | None = None,
                  read_ahead: ReadAhead | None = None, opened: OpenFiles | None = None) -> Iterator[PlannedBatch]:
    """The batches of epoch ``epoch`` from batch ``first`` on; records only for ``owned(index)`` ones.

    Batches before ``first`` are passed over (read only as far as the order
    needs). ``indexes`` (path -> :class:`~infeed.tfrecord.index.RecordIndex` for every
    file) reads records by their offsets instead, in the same order, owned batches read ahead as far as
    ``read_ahead`` says (one kept from epoch to epoch keeps what it measured; by default, a new one), asking
    ``owned(index, True)`` about those ahead: None there means "not yet", to be asked again, through the files of
    ``opened`` (kept open from epoch to epoch; by default, the epoch's own). The
    epoch's number of batches is appended to ``sizes`` once it is known (at the end).
    """
    if indexes is not None:
        batches = yield from _indexed(ds, epoch, first, owned, indexes, read_ahead, opened)
    else:
        source = EpochRecords(ds, epoch)
        try:
            if ds.shuffle_buffer > 1:
                batches = yield from _buffered(ds, epoch, source, first, owned)
            else:
                batches = yield from _in_order(ds, source, first, owned)
        finally:
            source.close()
    if sizes is not None:
        sizes.append(batches)


def exists(ds, count: int) -> bool:
    """Whether a batch of ``count`` records is one (not empty, and not a partial one dropped)."""
    return count > 0 and (count == ds.batch_size or ds.final_batch == "pad")


def _finish(ds, index: int, records, count: int, where, ids) -> PlannedBatch | None:
    if not exists(ds, count):
        return None
    return PlannedBatch(index, count, None if records is None else _parse_records(records, ids), where)


def _in_order(ds, source: EpochRecords, first: int, owned) -> Iterator[PlannedBatch]:
    size, index = ds.batch_size, 0
    while True:
        if index >= first and owned(index):
            runs: list = []
            filled: list = []

            def fill(parser, out, runs=runs, filled=filled):
                count, nbytes = source.read_into(parser, size, out, runs)
                filled.append(count)
                return count, nbytes
            yield PlannedBatch(index, None, fill, _runs_of(runs))
            if not filled:
                raise RuntimeError(f"batch {index} was planned to be read as it is decoded, and was not filled")
            count = filled[0]
        else:
            count = source.skip(size)
            if exists(ds, count) and index >= first:
                yield PlannedBatch(index, count, None, _no_origins)
        if count < size:
            return index + exists(ds, count)
        index += 1


def _through_buffer(source: EpochRecords, buffer: ShuffleBuffer, chunk: int = 256) -> Iterator[tuple]:
    """The epoch's (record, origin) pairs in the order they leave ``buffer``, the rest drained at the end."""
    while True:
        runs: list = []
        records = source.take(chunk, runs)
        for item in zip(records, _runs_origins(runs)):
            out = buffer.push(item)
            if out is not None:
                yield out
        if len(records) < chunk:
            break
    yield from buffer.drain()


def _buffered(ds, epoch: int, source: EpochRecords, first: int, owned) -> Iterator[PlannedBatch]:
    size, index = ds.batch_size, 0
    pending: list = []

    def batch(items):
        nonlocal index
        keep = index >= first and owned(index)
        origins = [o for _, o in items]
        planned = _finish(ds, index, [r for r, _ in items] if keep else None, len(items),
                          _origins_of(origins) if keep else _no_origins, _record_ids(ds, epoch, origins))
        index += planned is not None
        return planned if planned is not None and planned.index >= first else None

    for item in _through_buffer(source, ShuffleBuffer(ds.shuffle_buffer, ds.seed, epoch)):
        pending.append(item)
        if len(pending) == size:
            planned = batch(pending)
            pending = []
            if planned is not None:
                yield planned
    if pending:
        planned = batch(pending)
        if planned is not None:
            yield planned
    return index


def interleave_order(counts: list[int], cycle: int, block: int) -> np.ndarray:
    """Positions in the stream of files of ``counts`` records each (one after another) in the order tf.data's
    ``interleave(cycle_length=cycle, block_length=block)`` gives their records: ``cycle`` files open, taken in
    turn ``block`` records at a time; a file that ends gives its turn to the next and its place in the cycle to
    the next file not yet opened, when its turn comes again (TensorFlow's InterleaveDatasetOp)."""
    starts = np.cumsum([0] + list(counts))
    slots: list = [None] * cycle              # per place in the cycle: [file, its next record], or None
    pieces, opened, place, taken, next_file = [], 0, 0, 0, 0
    while next_file < len(counts) or opened:
        slot = slots[place]
        if slot is not None:
            f, k = slot
            if k < counts[f]:
                n = min(block - taken, counts[f] - k)
                pieces.append(np.arange(starts[f] + k, starts[f] + k + n, dtype=np.int64))
                slot[1] += n
                taken += n
                if taken == block:
                    place, taken = (place + 1) % cycle, 0
                continue
            slots[place], opened = None, opened - 1     # ended: the next place, whose turn it is
            place, taken = (place + 1) % cycle, 0
        elif next_file < len(counts):
            slots[place], next_file, opened = [next_file, 0], next_file + 1, opened + 1
        else:
            place, taken = (place + 1) % cycle, 0
    return np.concatenate(pieces) if pieces else np.zeros(0, np.int64)


def epoch_order(ds, epoch: int, counts: list[int]) -> np.ndarray:
    """Positions in the epoch's stream of records (files in epoch order, ``counts`` records
    each, this host's share) in the order batches take them."""
    n = sum(counts)
    stream = np.arange(n, dtype=np.int64) if ds.interleave is None else interleave_order(counts, *ds.interleave)
    if not ds.shards_by_file:
        stream = stream[ds.shard_index::ds.num_shards]
    if ds.shuffle == "global":
        return stream[_rng(ds.seed, epoch, 2).permutation(len(stream))]
    if ds.shuffle_buffer > 1:
        buffer, out = ShuffleBuffer(ds.shuffle_buffer, ds.seed, epoch), []
        for position in stream.tolist():
            left = buffer.push(position)
            if left is not None:
                out.append(left)
        return np.array(out + buffer.drain(), dtype=np.int64)
    return stream


def _indexed(ds, epoch: int, first: int, owned, indexes: dict, read_ahead: ReadAhead | None,
             opened: OpenFiles | None) -> Iterator[PlannedBatch]:
    paths = epoch_paths(ds, epoch)
    if read_ahead is None:
        read_ahead = ReadAhead(any("://" in path for path in paths))
    found = [indexes[p] for p in paths]
    counts = [ix.count for ix in found]
    order = epoch_order(ds, epoch, counts)
    starts = np.cumsum([0] + counts)
    size = ds.batch_size
    batches = len(order) // size + (ds.final_batch == "pad" and len(order) % size > 0)
    files = IndexedFiles(paths, found, read_ahead, opened)

    @functools.lru_cache(maxsize=2)           # the block being read, and the one before (a group may span two)
    def block(b: int) -> tuple:
        chunk = order[b * _PLACE_BLOCK * size:(b + 1) * _PLACE_BLOCK * size]
        file_of = np.searchsorted(starts, chunk, side="right") - 1
        within = chunk - starts[file_of]
        return file_of, within, files.runs(file_of, within, size)

    def records_of(index: int):
        """Batch ``index``'s records: their files, their numbers in them, and the runs of reads that fetch them."""
        file_of, within, runs = block(index // _PLACE_BLOCK)
        j = index % _PLACE_BLOCK
        return file_of[j * size:(j + 1) * size], within[j * size:(j + 1) * size], runs[j]

    ahead: dict = {}                          # owned batch -> (its group's reads, started; its place in them)
    known: collections.deque = collections.deque()    # owned batches from `index` on, found so far
    taken: list = []                          # owned batches ahead whose reads have not started
    scanned = first                           # the next batch to ask owned() about
    try:
        for index in range(first, batches):
            want = 1 + read_ahead.batches()
            while len(known) < want and scanned < batches:
                mine = owned(scanned, True) if known else owned(scanned)   # ahead: None, left for now
                if mine is None:
                    break
                if mine:
                    known.append(scanned)
                    taken.append(scanned)
                scanned += 1
            if not known or known[0] != index:
                yield PlannedBatch(index, len(order[index * size:(index + 1) * size]), None, _no_origins)
                continue
            known.popleft()
            # A group's reads start together once it is whole (a take's batches: one request where they follow
            # each other), or at once for the batch decoded next.
            if taken and (len(taken) >= read_ahead.group or taken[0] == index):
                places = [records_of(i) for i in taken]
                group = files.start([runs for _, _, runs in places])
                ahead.update((i, (group, j, place)) for j, (i, place) in enumerate(zip(taken, places)))
                taken = []
            group, j, (file_of, within, _) = ahead.pop(index)
            ids = (lambda file_of=file_of, within=within:
                   [(epoch, ds.file_number(paths[f]), k) for f, k in zip(file_of.tolist(), within.tolist())])
            yield PlannedBatch(index, len(within), _read_indexed(group, j, len(within), ids),
                               _indexed_where(paths, found, file_of, within))
    finally:
        for group in {id(group): group for group, _, _ in ahead.values()}.values():
            group.cancel()
        files.close()
    return batches


def _read_indexed(group, j: int, count: int, ids: Callable[[], list]) -> Callable:
    """``fill`` of batch ``j`` of a group of indexed reads (``count`` records): decoded where they lie in the
    reads (:meth:`~infeed.daemon.indexed_reads.ReadGroup.frames`), or, where the parser decodes images, through a
    memoryview per record."""
    def fill(parser, out) -> tuple[int, int]:
        if parser.reads_in_place:
            return parser.read_into(group.frames(j), count, out)
        return _parse_records(group.records(j), ids)(parser, out)
    return fill


def _indexed_where(paths: list, indexes: list, file_of: np.ndarray, within: np.ndarray) -> Callable[[int], tuple]:
    """``where(i)``: the path, record and byte offset of a batch's record ``i``, read through the indexes."""
    def where(i: int) -> tuple:
        f, k = int(file_of[i]), int(within[i])
        return paths[f], k, int(indexes[f].offsets[k])
    return where


def record_offset(ds, path: str, record_index: int) -> int:
    """The byte offset of record ``record_index`` of ``path``, found by its framing (for error messages)."""
    reader = ds.open_records(path)
    try:
        reader.skip(record_index)
        return reader.tell()
    finally:
        reader.close()
