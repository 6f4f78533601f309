"""How an indexed worker reads ahead of the batch it decodes: how many owned batches, and how many units it
takes at a time.

Local files: one batch, one unit (the page cache answers in microseconds). Files behind a URI, records in
file order (no shuffle, or a ``shuffle_files`` one): the worker takes a run of consecutive units at a time
(:func:`units_per_take`, about a streamed read's range, :data:`~infeed.tfrecord.reader.READ_AHEAD_BYTES`,
and with several workers at most twice the ring's slots, so that all of them keep decoding), whose records
follow each other in the file: one request for the run. It reads ahead as many batches as cover one
request's time at the rate it uses batches (bandwidth x latency: a store's time to first byte plus the
transfer, over the worker's time per batch when it need not wait), measured as it goes, within
:data:`MAX_READ_AHEAD_BYTES` of reads in flight and :data:`~infeed.ring.layout.MAX_CLAIMS` units owed.
The depth grows by at most doubling per batch, so the workers' takes stay interleaved.
"""

from __future__ import annotations

import math
import time

from infeed.ring.layout import MAX_CLAIMS
from infeed.tfrecord.reader import READ_AHEAD_BYTES, READ_AHEAD_RANGES

__all__ = ["ReadAhead", "units_per_take", "MAX_READ_AHEAD_BYTES"]

#: The bytes of reads a worker has in flight at most (the batches it reads ahead): as a streamed remote file's.
MAX_READ_AHEAD_BYTES = READ_AHEAD_RANGES * READ_AHEAD_BYTES
#: The weight of the newest sample in the running means of a read's time and a batch's.
_SMOOTHING = 0.2


def units_per_take(ds, indexes: dict | None, slots: int, workers: int) -> int:
    """The units a worker of ``workers`` over a ring of ``slots`` takes at a time: 1, or for files behind a URI
    read in file order through ``indexes``, as many as hold about :data:`READ_AHEAD_BYTES` (one request),
    within twice ``slots`` where ``workers`` > 1, and a quarter of :data:`MAX_CLAIMS`."""
    if (indexes is None or not any("://" in path for path in indexes) or ds.needs_indexes
            or ds.shuffle_buffer > 1 or not ds.shards_by_file and ds.num_shards > 1):
        return 1
    records = sum(index.count for index in indexes.values())
    nbytes = sum(int(index.lengths.sum()) for index in indexes.values())
    unit_bytes = max(1, nbytes // max(1, records)) * ds.batch_size * ds.steps_per_slot
    # Several workers: a run's unit u waits for unit u - S to be taken, which the run before it makes, so the
    # workers' runs overlap as a pipeline, and a run much past S leaves one waiting for the other's turn; up to
    # 2 S a run, as larger requests cost a store less (python -m bench remote, docs/object_stores.md). One
    # worker: only the units it may owe bound it.
    most = 2 * slots if workers > 1 else MAX_CLAIMS // 4
    return max(1, min(-(-READ_AHEAD_BYTES // unit_bytes), most, MAX_CLAIMS // 4))


class ReadAhead:
    """The read-ahead depth of one worker (:meth:`batches`), from what it measured: each batch's read, from its
    start to its last byte (:meth:`read_done`), and the worker's time per batch outside
    the waits for reads (:meth:`handed_out`)."""

    def __init__(self, remote: bool, group: int = 1, per_slot: int = 1, max_bytes: int = MAX_READ_AHEAD_BYTES):
        self.remote = remote
        #: Owned batches whose reads start together (a take's: :func:`units_per_take` times ``per_slot``).
        self.group = group
        # The units owed stay within MAX_CLAIMS: those of the batches read ahead, the one decoded, a take more.
        self.max_batches = max(1, (MAX_CLAIMS - group // per_slot - 2) * per_slot)
        self.max_bytes = max_bytes
        self._read_ns: float | None = None      # running mean: a batch's read, start to last byte
        self._batch_ns: float | None = None     # running mean: the worker's time per batch, waits for reads aside
        self._batch_bytes: float | None = None  # running mean: a batch's bytes read
        self._depth = 1
        self._handed = None                     # monotonic_ns when the last batch was handed out

    @staticmethod
    def _mean(old: float | None, new: float) -> float:
        return new if old is None else old + _SMOOTHING * (new - old)

    def read_done(self, started: int, done_ns: int, nbytes: int, batches: int = 1) -> None:
        """The reads of ``batches`` batches, started at ``started``, had their last byte at ``done_ns``
        (``nbytes`` in all)."""
        self._read_ns = self._mean(self._read_ns, max(0, done_ns - started))
        self._batch_bytes = self._mean(self._batch_bytes, nbytes / max(1, batches))

    def handed_out(self, waited_ns: int) -> None:
        """A batch's records were handed to the decoder after waiting ``waited_ns`` for their reads."""
        now = time.monotonic_ns()
        if self._handed is not None:
            self._batch_ns = self._mean(self._batch_ns, max(1, now - self._handed - waited_ns))
        self._handed = now

    def batches(self) -> int:
        """The owned batches to have taken past the one decoded next (at least 1, and at least :attr:`group`):
        a group's reads start once it is whole, while as many batches as a read takes are still ahead."""
        if not self.remote or self._read_ns is None or self._batch_ns is None:
            return max(1, self.group)
        want = self.group + math.ceil(self._read_ns / self._batch_ns)
        if self._batch_bytes:            # a read's bytes: a group's
            want = min(want, int(self.max_bytes // self._batch_bytes))
        self._depth = max(1, self.group, min(want, 2 * self._depth, self.max_batches))
        return self._depth

    def memory_bytes(self) -> int:
        """The bytes of the reads in flight at the depth now (what the worker holds for them, about)."""
        return int(self._depth * (self._batch_bytes or 0))
