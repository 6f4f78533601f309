"""Reading an epoch's records by their indexes' offsets, for the batches a worker owns (:mod:`infeed.daemon.plan`
decides which records make each batch; this module fetches and checks them): :class:`IndexedFiles` over an
epoch's files, :class:`ReadGroup` the reads of a few batches started together, one request for each span of
records adjacent in a file."""

from __future__ import annotations

import time

from infeed.daemon.read_ahead import ReadAhead
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.index import MAX_JOINED_READ, BatchRuns, check_versions, open_indexed, unframe_runs

__all__ = ["IndexedFiles", "OpenFiles", "ReadGroup"]

count_read = _tfrecord.count_read
IndexedFrames = _tfrecord.IndexedFrames


class OpenFiles:
    """The files a worker reads by their indexes' offsets, each opened once
    (:func:`~infeed.tfrecord.index.open_indexed`: pinned as it was then) and kept from epoch to epoch until
    :meth:`close`: an open costs a round trip for a bucket's object, and for a ``gs://`` one the start of a
    download of all of it (what the socket buffers take, 4 MB of a 40 MB object measured), which each epoch
    would pay again."""

    def __init__(self):
        self._open: dict = {}

    def get(self, path: str, index):
        handle = self._open.get(path)
        if handle is None:
            handle = self._open[path] = open_indexed(path, index)
        return handle

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._open.clear()


class IndexedFiles:
    """Reads records of an epoch's files by their indexes' offsets, checking both CRCs of each and its data CRC
    against the index's (a file rewritten since it was indexed is a :class:`~infeed.errors.SourceChangedError`;
    through a version-1 index, one that changed since it was opened, looked up after each batch's reads), one
    open file per path. Reads start for several batches at once (:meth:`start`) and give each batch's records
    alone (:meth:`ReadGroup.records`), so damage is raised at its own batch. Records adjacent in a file share a
    read (up to :data:`~infeed.tfrecord.index.MAX_JOINED_READ` bytes), across the group's batches too. Remote files
    (URIs) are read with a group's reads in flight at once, on the reader's pool of threads, each group's read
    timed for ``read_ahead`` (:class:`~infeed.daemon.read_ahead.ReadAhead`); the time the worker waits for them,
    and their bytes, count as the stage ``read``. Its files are its own, or a worker's kept from epoch to epoch
    (``opened``: :class:`OpenFiles`). A batch's records are given for the decoder to read where
    they lie (:meth:`ReadGroup.frames`), or as memoryviews (:meth:`ReadGroup.records`, for images)."""

    def __init__(self, paths: list, indexes: list, read_ahead: ReadAhead, opened: OpenFiles | None = None):
        self._paths, self._indexes = paths, indexes
        self._read_ahead = read_ahead
        self._owned = opened is None            # its own files, closed with it; else the caller's, kept open
        self._opened = OpenFiles() if opened is None else opened

    def runs(self, files, records, batch_size: int) -> BatchRuns:
        """The runs of reads (:class:`~infeed.tfrecord.index.BatchRuns`: ``runs[j]``, built when asked) of each
        batch of ``batch_size`` of records ``records[i]`` of file ``files[i]`` (positions in ``paths``)."""
        return BatchRuns(self._indexes.__getitem__, files, records, batch_size)

    def start(self, runs: list) -> "ReadGroup":
        """Starts reading the records of a few batches (``runs[j]``: batch ``j``'s, as :meth:`runs` gives them),
        where the files are remote."""
        return ReadGroup(self, runs, self._read_ahead.remote)

    def _handle(self, f: int):
        return self._opened.get(self._paths[f], self._indexes[f])

    def close(self) -> None:
        """Closes its files, unless they are the caller's (``opened``)."""
        if self._owned:
            self._opened.close()


class ReadGroup:
    """The reads of a few batches' records (:meth:`IndexedFiles.start`): one request for each span of adjacent
    runs (remote files: all in flight at once from the start), each batch's records given alone."""

    def __init__(self, files: IndexedFiles, runs: list, remote: bool):
        self._files, self._runs = files, runs
        self._spans, self._span_of = _spans(runs)
        self._datas = None
        self._futures = None
        if remote:
            from infeed.tfrecord.reader import read_ahead_pool

            pool = read_ahead_pool()
            self._began = time.monotonic_ns()
            self._futures = [pool.submit(_timed_read, files._handle(f), base, size) for f, base, size in self._spans]

    def records(self, j: int) -> list:
        """Batch ``j``'s records, in order, as memoryviews into the reads (the first call waits for them all)."""
        runs, datas = self._batch(j)
        return unframe_runs(runs, datas, self._files._paths, views=True)

    def frames(self, j: int) -> IndexedFrames:
        """Batch ``j``'s records for the decoder to read where they lie, each checked as it reads it (as
        :meth:`records` checks them), with no object per record (the first call waits for the reads)."""
        runs, datas = self._batch(j)
        return IndexedFrames(runs, datas, self._files._paths)

    def _batch(self, j: int) -> tuple[list, list]:
        """Batch ``j``'s runs and the bytes read for each, once every read of the group has come."""
        files = self._files
        if self._datas is None:
            began = time.monotonic_ns()
            if self._futures is None:
                datas = [files._handle(f).read_at(base, size) for f, base, size in self._spans]
            else:
                datas, done = zip(*(future.result() for future in self._futures))
            waited, nbytes = time.monotonic_ns() - began, sum(map(len, datas))
            count_read(waited, nbytes)
            if self._futures:
                files._read_ahead.read_done(self._began, max(done), nbytes, len(self._runs))
            files._read_ahead.handed_out(waited)
            self._datas = [memoryview(data) for data in datas]
        else:
            files._read_ahead.handed_out(0)
        runs = self._runs[j]
        check_versions(runs, files._handle)
        datas = [self._datas[span][run.base - self._spans[span][1]:][:run.size] for run, span in
                 zip(runs, self._span_of[j])]
        return runs, datas

    def cancel(self) -> None:
        for future in self._futures or ():
            future.cancel()


def _spans(runs: list) -> tuple[list, list]:
    """The requests for the runs of a few batches (``runs[j]``: batch ``j``'s): ``(file, base, size)`` spans,
    each joining runs that follow each other in a file up to :data:`~infeed.tfrecord.index.MAX_JOINED_READ`
    bytes, and for each batch the span of each of its runs."""
    spans: list = []
    span_of: list = []
    for batch in runs:
        mine = []
        for run in batch:
            if spans:
                f, base, size = spans[-1]
                if f == run.file and base + size == run.base and size + run.size <= MAX_JOINED_READ:
                    spans[-1] = (f, base, size + run.size)
                    mine.append(len(spans) - 1)
                    continue
            spans.append((run.file, run.base, run.size))
            mine.append(len(spans) - 1)
        span_of.append(mine)
    return spans, span_of


def _timed_read(handle, offset: int, n: int) -> tuple:
    """``handle.read_at(offset, n)`` and the time its last byte came (``time.monotonic_ns``)."""
    return handle.read_at(offset, n), time.monotonic_ns()
