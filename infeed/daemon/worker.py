"""A decoding worker: one process that fills whichever of a ring's slots it takes.

Started by the daemon as ``python -m infeed.daemon.worker`` with a JSON config on its
standard input (never a pickle): the ring's name, the worker's number, the dataset
and where to start. Unit ``u`` (``steps_per_slot`` consecutive batches) goes into
slot ``u mod S``, where the consumer looks for it. Units are dealt to whichever
worker is free: a worker takes the next unit nobody has (an atomic counter in the
ring, :meth:`~infeed.ring.Ring.take_unit`) as its planner reaches it, and through an
index as many ahead as its reads need (:mod:`infeed.daemon.read_ahead`: one locally;
from a store, runs of units whose records make one request, enough of them to cover
the round trip); so a worker slowed by a busy CPU or slower records makes fewer
batches instead of holding the others back. Every worker plans
the whole sequence (a streaming one reads past the records of units the others
took), so any worker can build any unit, and the batches are the same whoever builds
them. Two workers may wait for one slot (units ``u`` and ``u + S``):
:meth:`~infeed.ring.Ring.acquire_turn` gives it to ``u`` first.

With transforms, a batch is decoded into the worker's own arrays and the user's
functions write the slot (:mod:`infeed.daemon.transforms`); they are imported by
name, with the daemon's ``sys.path`` after the worker's own.

A failure (a corrupt record, a record that does not meet the spec) is written
to the ring's error record, with the unit the worker was at, and, by the worker
that took the batch where it happened, published in that batch's slot, so the
consumer raises it right there. One at no batch of the worker's own (it failed
setting up, or before taking a unit) is in the record alone: the daemon raises
it once the worker has ended (``Daemon._check_workers``). The worker stops when
the consumer asks, and when the ring's creator is gone, in which case it also
removes the segment.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
import time

from infeed.daemon.dataset import PADDING_KEY, Dataset
from infeed.daemon.indexed_reads import OpenFiles
from infeed.daemon.plan import epoch_batches, exists, record_offset
from infeed.daemon.read_ahead import ReadAhead, units_per_take
from infeed.daemon.transforms import TransformStage
from infeed.errors import DecodeError, InfeedError
from infeed.example.spec import Padded
from infeed.ring import Ring
from infeed.ring.slots import REPORTED_ERROR, SLOT_END, SLOT_ERROR
from infeed.tfrecord._tfrecord import stage_totals
from infeed.tfrecord.filesystems import restore_registered_filesystems

__all__ = ["Producer", "main"]


_log = logging.getLogger("infeed")

#: mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


class Stopped(Exception):
    """The consumer asked the producers to stop."""


class Producer:
    """Worker ``index`` filling ``ring`` with ``dataset``'s batches from ``start``: whichever it takes."""

    def __init__(self, dataset: Dataset, ring: Ring, index: int, start: tuple[int, int],
                 index_files: dict | None = None):
        self.ds, self.ring, self.index = dataset, ring, index
        self.start = start
        self._index_files = index_files           # where the daemon found the indexes (Dataset.index_files)
        self.parser = dataset.parser
        self._transforms = TransformStage(dataset) if dataset.outputs is not None else None
        self._views: dict = {}
        self._last_check = 0.0
        self._last_taken = -1                     # the last unit it took (those it owes: Ring.worker_claims)
        self._take = 1                            # units it takes at a time (read_ahead.units_per_take)
        self._claims: set = set()                 # the units it owes, as the ring records them
        self._opened = OpenFiles()                # files read through their indexes, kept open from epoch to epoch
        self._waiting_since: int | None = None    # monotonic_ns when the wait for a free slot began, while it lasts
        self._wait_ns = 0                         # waited for a free slot, not counted yet

    # --- the ring ---------------------------------------------------------------------------
    def _check(self) -> None:
        if self._waiting_since is not None:
            self._count_wait()
        else:
            self.ring.count_work(self.index, readers=stage_totals())
        if self.ring.stop_requested:
            raise Stopped()
        self.ring.check_owner()

    def _count_wait(self) -> None:
        """Counts the wait for a free slot so far, while it lasts (``infeed stats`` sees it grow)."""
        now = time.monotonic_ns()
        self.ring.count_work(self.index, wait_ns=now - self._waiting_since, readers=stage_totals())
        self._waiting_since = now

    def _mine(self, unit: int, ahead: bool = False) -> bool | None:
        """Whether ``unit`` is this worker's. Units are dealt to whichever worker is free: asked about a unit
        past the last it took, the worker takes the next units nobody has (the planner asks in order as it
        reaches each batch, and for the batches it reads ahead through an index, ``ahead``: then None where
        it took the units before and leaves these to the others for now, :meth:`~infeed.ring.Ring.take_unit`)."""
        if unit > self._last_taken:
            first = self.ring.take_unit(self.index, self._take, ahead)
            if first is None:
                return None
            self._claims.update(range(first, first + self._take))
            self._last_taken = first + self._take - 1
        return unit in self._claims

    def _owes(self, unit: int) -> bool:
        """Whether this worker took ``unit`` and has not published it."""
        return unit in self._claims

    def _publish(self, slot: int, unit: int, **kwargs) -> None:
        """Publishes ``unit`` in ``slot`` (:meth:`~infeed.ring.Ring.publish`'s arguments); it is owed no more."""
        self.ring.publish(slot, unit, **kwargs)
        self.ring.drop_claim(self.index, unit)
        self._claims.discard(unit)

    def _acquire(self, unit: int) -> int:
        """Waits for ``unit``'s slot to be free and its turn; the rest of the wait is counted with the next
        batch."""
        slot = unit % self.ring.slots
        self._waiting_since = time.monotonic_ns()
        try:
            self.ring.acquire_turn(unit, check=self._check)
        finally:
            self._wait_ns += time.monotonic_ns() - self._waiting_since
            self._waiting_since = None
        if self.ring.stop_requested:
            raise Stopped()
        return slot

    def _slot_views(self, slot: int, step: int) -> dict:
        views = self._views.get((slot, step))
        if views is None:
            views = self._views[(slot, step)] = self.ring.slot_arrays(slot, step)
        return views

    def _fill(self, slot: int, step: int, planned, epoch: int) -> tuple[int, int, int]:
        """Decodes ``planned`` (a batch of ``epoch``) into step ``step`` of ``slot`` (through the transforms,
        if any), zero rows after its records and in place of those skipped (``skip_corrupt``), and the padding
        mask; returns (records, bytes, skipped): the records read, their bytes, and how many became padding."""
        views = self._slot_views(slot, step)
        transforms = self._transforms
        try:
            n, nbytes = planned.fill(self.parser, views if transforms is None else transforms.decoded)
        except DecodeError as e:
            path, index, offset = planned.where(e.record_index)
            if offset is None:
                offset = record_offset(self.ds, path, index)
            raise DecodeError(e.feature, index, e.expected, e.found, path, offset) from None
        skipped = list(self.parser.last_skipped_rows)
        for error in self.parser.last_skipped:
            path, index, _ = planned.where(error.record_index)
            _log.warning("%s: record %d: feature %r: expected %s, found %s; skipped (skip_corrupt): its row is "
                         "zeros, flagged in %s", path, index, error.feature, error.expected, error.found,
                         PADDING_KEY)
        if transforms is not None and exists(self.ds, n):
            transforms.run(views, n, epoch, planned.index, planned.where)
        blank = [slice(n, None)] if n < self.ds.batch_size else []
        if transforms is not None:               # the parser zeroed the skipped rows; the transforms wrote them again
            blank += skipped
        for arr in views.values():
            for part in (arr if isinstance(arr, Padded) else (arr,)):
                for rows in blank:
                    part[rows] = 0
        if PADDING_KEY in views:
            mask = views[PADDING_KEY]
            mask[:n] = False
            mask[n:] = True
            mask[skipped] = True
        return n, nbytes, len(skipped)

    # --- the sequence -----------------------------------------------------------------------
    def run(self) -> None:
        ds, ring, k = self.ds, self.ring, self.index
        per_slot = ds.steps_per_slot
        epoch, first = self.start
        done = 0                  # batches of the sequence passed so far (mine or not)
        slot = None
        try:
            indexes = ds.indexes(self._index_files)
            self._take = units_per_take(ds, indexes, ring.slots, ring.max_workers)
            read_ahead = ReadAhead(indexes is not None and any("://" in path for path in indexes),
                                   group=self._take * per_slot, per_slot=per_slot)
            while ds.num_epochs is None or epoch < ds.num_epochs:
                base = done - first

                def owned(index, ahead=False, base=base):
                    return self._mine((base + index) // per_slot, ahead)

                sizes: list = []
                for planned in epoch_batches(ds, epoch, first, owned, indexes, sizes, read_ahead,
                                             self._opened):
                    unit, step = divmod(done, per_slot)
                    if self._owes(unit):
                        if slot is None:             # else still held for this unit (see below)
                            slot = self._acquire(unit)
                        before = stage_totals()
                        began = time.monotonic_ns()
                        count, nbytes, skipped = self._fill(slot, step, planned, epoch)
                        filled = time.monotonic_ns() - began
                        after = stage_totals()
                        # Decoding (transforms included) is the fill's time less the reads (inflating included)
                        # and CRCs within it.
                        decode_ns = filled - (after[0] - before[0]) - (after[2] - before[2])
                        waited, self._wait_ns = self._wait_ns, 0
                        if not exists(ds, count):    # read as decoded: the epoch ended before this batch
                            ring.count_work(k, decode_ns=decode_ns, wait_ns=waited, readers=after)
                            continue
                        last = step == per_slot - 1
                        # Counted before it is published: a consumer that took the batch sees it counted.
                        ring.count_work(k, batches=last, records=count - skipped, nbytes=nbytes, skipped=skipped,
                                        decode_ns=decode_ns, wait_ns=waited, readers=after)
                        if last:
                            self._publish(slot, unit, cursor=(epoch, planned.index + 1))
                            slot = None
                    done += 1
                    if time.monotonic() - self._last_check > 0.5:
                        self._last_check = time.monotonic()
                        self._check()
                if sizes[0] == 0:
                    raise InfeedError(f"epoch {epoch} has no batch: fewer than batch_size={ds.batch_size} "
                                      f"records in {len(ds.shard_paths())} files with final_batch='drop'")
                # A start past this epoch's end goes on into the next: (epoch, batch) counts batches from
                # the start of `epoch`, so a position n batches after any other is (epoch, batch + n).
                epoch, first = epoch + 1, max(first - sizes[0], 0)
            unit, step = divmod(done, per_slot)
            if step:
                if self._mine(unit):
                    ring.count_work(k, batches=1, wait_ns=self._wait_ns)
                    self._wait_ns = 0
                    self._publish(slot, unit, steps=step, cursor=(epoch, 0))
                    slot = None
                unit += 1
            if self._mine(unit):
                self._publish(self._acquire(unit) if slot is None else slot, unit, flags=SLOT_END, steps=0,
                              cursor=(epoch, 0))
        except (Stopped, KeyboardInterrupt):
            raise
        except Exception as error:
            self._report(error, done // per_slot, slot)
            raise
        finally:
            self._opened.close()

    def _report(self, error: Exception, unit: int, slot: int | None) -> None:
        """Records ``error`` (at ``unit``); the owner of ``unit`` also publishes it in that unit's slot."""
        self.ring.set_error(error, unit=unit)
        if not self._owes(unit):
            return
        try:
            if slot is None:
                slot = self._acquire(unit)
        except (Stopped, InfeedError):
            return
        self._publish(slot, unit, flags=SLOT_ERROR, steps=0)


def _keep_freed_memory() -> None:
    """Makes glibc keep freed memory for reuse instead of handing it back to the OS at once.

    A worker frees a batch of records (up to tens of MB) for every batch it
    builds. A fresh process returns the top of its heap to the OS on each free
    (until it first frees a large mmapped block), so the next batch faults the
    same pages back in: half the read rate for large records.
    """
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 64 << 20)
    except (OSError, AttributeError):      # not glibc
        pass


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the trainer's to handle
    _keep_freed_memory()
    config = json.load(sys.stdin)
    sys.path += [path for path in config.get("sys_path", ()) if path not in sys.path]    # for the transforms
    restore_registered_filesystems(config.get("filesystems", []))       # the trainer's register_filesystem calls
    ds = Dataset.from_json(config["dataset"], matched=True)
    ring = Ring.attach(config["ring"], ds.template(), steps_per_slot=ds.steps_per_slot, populate=True)
    index = int(config["worker"])
    ring.register_worker(index)
    producer = None
    try:
        producer = Producer(ds, ring, index, tuple(config["start"]), config.get("index_files"))
        producer.run()
        return 0
    except Stopped:
        return 0
    except Exception as error:
        if not ring.owner_alive():
            return 0
        if producer is None:        # failed setting up (its arrays, its transforms), at no unit; run() records its own
            ring.set_error(error)
        print(f"infeed worker {index} (pid {os.getpid()}): {type(error).__name__}: {error}", file=sys.stderr)
        return REPORTED_ERROR
    finally:
        ring.unlink_if_orphaned()
        ring.close()


if __name__ == "__main__":
    status = main()
    # Everything is released (the ring closed, files closed by their readers): skip the interpreter's
    # teardown of numpy and the rest, which takes tens of milliseconds the daemon's close waits for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
