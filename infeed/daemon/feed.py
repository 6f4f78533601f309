"""The trainer's side of a ring: a :class:`Feed` iterates its batches in order, as zero-copy views, and
says where the input stands (:meth:`Feed.state`); :func:`attach` gives one for a ring that another
process serves (``infeed serve``).

>>> for batch in infeed.attach("train"):     # doctest: +SKIP
...     train_step(batch)                    # the slot goes back to the workers at the next batch
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import nullcontext
from typing import Callable, ContextManager

from infeed.daemon.dataset import Dataset
from infeed.daemon.input_stats import InputStats
from infeed.errors import InfeedError, Timeout, WorkerDied
from infeed.example.spec import Padded
from infeed.ring import Ring
from infeed.ring.names import resolve_name
from infeed.ring.processes import process_state
from infeed.ring.slots import SLOT_END, SLOT_ERROR

__all__ = ["Batch", "Feed", "attach", "start_of", "STATE_VERSION"]

#: Version of the dict :meth:`Feed.state` returns.
STATE_VERSION = 1
#: Seconds an attached consumer gives the server to report how a worker it saw die died.
SERVER_REPORT = 3.0
#: Seconds a consumer polls for its next batch before it sleeps (see :class:`Feed`).
SPIN = 0.0002
#: Seconds a consumer waits for one batch before it logs a warning naming the worker that owes
#: it and what that process is doing, and again every as many seconds while it waits (see :class:`Feed`).
STALL_WARNING = 60.0
#: The name of the event that ``Feed.annotate`` wraps around each wait for a filled slot.
WAIT_EVENT = "infeed/wait_for_slot"
#: How often the producers are checked between waits (ns): a worker ended owing no batch is seen then.
CHECK_NS = 100_000_000
#: ... and every this many batches (a poll of each worker: microseconds).
CHECK_BATCHES = 32

_NO_EVENT = nullcontext()

_log = logging.getLogger("infeed")


class Batch(dict):
    """One batch, or ``steps_per_slot`` batches stacked ``[K, B, ...]``: ``{name: numpy view}``.

    The arrays are views into a ring slot. The slot goes back to the workers
    when the next batch is taken, or at :meth:`release`; after that the
    arrays may be overwritten at any time: copy what must outlive the batch.
    ``seq`` is the batch's position since the daemon started (in slots).
    """

    __slots__ = ("seq", "_feed")

    def release(self) -> None:
        """Hands the slot back to the workers now (idempotent)."""
        feed, self._feed = self._feed, None
        if feed is not None:
            feed._release(self.seq)


class Feed:
    """The consumer of a ring of batches: iterate for :class:`Batch` es in order.

    ``check(seq)`` raises when the producer that owes batch ``seq`` is gone
    (called every 0.1 s while waiting). ``timeout`` (seconds) bounds each wait
    for a batch with :class:`~infeed.Timeout` naming the worker that owes it
    (index, pid, and whether the process runs, sleeps or is stopped). Without
    one, a wait longer than ``feed.stall_warning`` seconds (default
    :data:`STALL_WARNING`; None: never) logs a warning on the ``infeed`` logger
    naming that worker, and another each time as many seconds pass.
    When the machine has a core to spare beyond the ``workers`` decoding
    processes, a consumer whose batch is not there yet polls for up to
    :data:`SPIN` seconds (GIL released) before it sleeps: a worker then hands
    over a batch without the system call that wakes a sleeping process, which
    costs tens of microseconds per batch in a virtual machine. ``feed.spin``
    (seconds) changes it; 0 never polls.

    ``feed.annotate`` (None by default) is a function of a name that returns a
    context manager, such as ``jax.profiler.TraceAnnotation``: each wait for a
    filled slot then runs inside ``feed.annotate("infeed/wait_for_slot")``, a
    named event in a profile. infeed itself never imports a profiler; the
    Estimator sets it (see docs/profiling.md).
    """

    def __init__(self, ring: Ring, dataset: Dataset, check: Callable[[int], None], timeout: float | None = None,
                 workers: int = 1):
        self.ring = ring
        self.dataset = dataset
        self.timeout = timeout
        self.stall_warning: float | None = STALL_WARNING
        self.spin = SPIN if len(os.sched_getaffinity(0)) > workers else 0.0
        self._workers = workers
        self.annotate: Callable[[str], ContextManager] | None = None
        self._wait_began = 0
        self._warned = 0
        #: Whether the slots are registered with CUDA as pinned memory (a CUDA GPU is present).
        self.pinned = ring.pin()
        self._check_for = check
        self._checked_ns = time.perf_counter_ns()          # when the producers were last checked between waits
        self._next = self._first = ring.consumer_counters()["taken"]
        self._held: int | None = None
        self._ended = False
        self._views: list = [None] * ring.slots
        self._fingerprint = dataset.fingerprint()
        self._identity = dataset.identity()

    # --- iteration --------------------------------------------------------------------------
    def __iter__(self) -> "Feed":
        return self

    def __next__(self) -> Batch:
        if self._held is not None:
            self._release(self._held)
        if self._ended:
            raise StopIteration
        ring, seq = self.ring, self._next
        if ring.closed:
            raise InfeedError("the feed is closed")
        slot = seq % ring.slots
        began = self._wait_began = time.perf_counter_ns()
        if seq % CHECK_BATCHES == 0 or began - self._checked_ns > CHECK_NS:   # a producer dead owing nothing yet
            self._checked_ns = began
            self._check_for(seq)
        self._warned = 0
        try:
            with self.annotate(WAIT_EVENT) if self.annotate is not None else _NO_EVENT:
                ring.acquire_filled(slot, self.timeout, self._check_waiting, self.spin)
        except Timeout:
            k, pid = self._owner(seq)
            raise Timeout(self._owed(seq), self.timeout, k, pid) from None
        waited = time.perf_counter_ns() - began
        info = ring.slot_info(slot)
        if info.seq != seq:
            raise InfeedError(f"ring {ring.name}: slot {slot} holds batch {info.seq} where {seq} was due")
        if info.flags & SLOT_ERROR:
            ring.release(slot)
            self._ended = True
            error = ring.error()
            if error is None:
                raise InfeedError(f"ring {ring.name}: a worker failed at batch {seq} without saying why")
            error.raise_()
        if info.flags & SLOT_END:
            ring.count_taken(seq - 1, info.cursor, waited, first=seq == self._first)
            ring.release(slot)
            self._ended = True
            raise StopIteration
        views = self._views[slot]
        if views is None:
            views = self._views[slot] = ring.slot_arrays(slot)
        batch = Batch(views)
        if info.steps != ring.steps_per_slot:         # the last slot of the data, partly filled
            batch = Batch({name: Padded(v.values[:info.steps], v.lengths[:info.steps]) if isinstance(v, Padded)
                           else v[:info.steps] for name, v in views.items()})
        batch.seq, batch._feed = seq, self
        ring.count_taken(seq, info.cursor, waited, first=seq == self._first)
        self._held, self._next = seq, seq + 1
        return batch

    # --- waiting ----------------------------------------------------------------------------
    def _check_waiting(self) -> None:
        """Runs every 0.1 s while the next batch is awaited: its producer's check, then the stall warning."""
        self._checked_ns = time.perf_counter_ns()
        seq = self._next
        self._check_for(seq)
        every = self.stall_warning
        if every:
            waited = (time.perf_counter_ns() - self._wait_began) / 1e9
            if waited >= every * (self._warned + 1):
                self._warned = int(waited // every)
                _log.warning("infeed: waited %.1f s so far for %s", waited, self._owed(seq))

    def _owner(self, seq: int) -> tuple[int | None, int | None]:
        """(index, pid or None when not known yet) of the worker that batch ``seq`` waits for: one that holds its
        slot, taken before its turn (:meth:`_holder`), else the one that took it (units are dealt to whichever
        worker is free); (None, None) while no worker has taken it."""
        k = self._holder(seq)
        if k is None:
            k = self._claimant(seq)
        return (None, None) if k is None else (k, self._worker_pid(k))

    def _claimant(self, seq: int) -> int | None:
        """The worker that took batch ``seq`` and has not published it, by the claims of the registered workers
        (an entry never registered is zeros, not claims)."""
        for worker in self.ring.workers():
            k = worker["index"]
            if k < self._workers and seq in self.ring.worker_claims(k):
                return k
        return None

    def _holder(self, seq: int) -> int | None:
        """The worker that holds batch ``seq``'s slot for writing when it did not take ``seq``: it took the slot
        before its turn (``Ring.acquire_turn``) and has not handed it back, stopped or stalled there."""
        ring = self.ring
        slot = seq % ring.slots
        if ring.slot_state(slot)[0] != "writing":
            return None
        writer = ring.slot_writer(slot)
        for worker in ring.workers():
            k = worker["index"]
            if worker["pid"] == writer and k < self._workers and seq not in ring.worker_claims(k):
                return k
        return None

    def _worker_pid(self, k: int) -> int | None:
        for worker in self.ring.workers():
            if worker["index"] == k:
                return worker["pid"]
        return None

    def _who(self, k: int) -> str:
        pid = self._worker_pid(k)
        return f"worker {k} (not started yet)" if pid is None else f"worker {k} (pid {pid}, {process_state(pid)})"

    def _owed(self, seq: int) -> str:
        """Batch ``seq``, where it goes, and the worker that owes it, with what that process is doing (and the
        one that holds its slot out of turn, if any)."""
        ring = self.ring
        k, holder = self._claimant(seq), self._holder(seq)
        if k is None:
            states = ", ".join(f"{w['index']} (pid {w['pid']}, {process_state(w['pid'])})" for w in ring.workers())
            who = f"no worker yet (none has taken it; workers {states or 'not started yet'})"
        else:
            who = self._who(k)
        held = "" if holder is None else f", its slot held out of turn by {self._who(holder)}"
        return f"batch {seq} (slot {seq % ring.slots} of ring {ring.name}) from {who}{held}"

    def _release(self, seq: int) -> None:
        if self._held == seq:
            self._held = None
            if not self.ring.closed:
                self.ring.release(seq % self.ring.slots)

    # --- state ------------------------------------------------------------------------------
    def state(self) -> dict:
        """Where the input stands after the batches taken so far: small and JSON-serialisable.

        ``Daemon(dataset, state=state)`` resumes at exactly the next batch.
        """
        epoch, batch = self.ring.consumer_counters()["cursor"]
        return {"version": STATE_VERSION, "epoch": epoch, "batch": batch, "seed": self.dataset.seed,
                "fingerprint": self._fingerprint, "dataset": dict(self._identity)}

    def stats(self) -> InputStats:
        """Where the input's time went since the ring was made: per stage, for the consumer and each worker,
        and the bottleneck in a sentence (see :mod:`infeed.daemon.input_stats`). ``later.since(earlier)``
        covers the time between two calls."""
        return InputStats.read(self.ring)

    @property
    def batch_size(self) -> int:
        return self.dataset.batch_size

    def close(self) -> None:
        """Gives back the slot in use and detaches from the ring."""
        if self._held is not None:
            self._release(self._held)
        self.ring.close()

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_of(dataset: Dataset, state: dict | None) -> tuple[int, int]:
    """(epoch, batch) where a daemon with ``state`` starts.

    A state saved for another dataset is refused with a ValueError naming each
    setting that differs (``files``, ``features``, ``batch_size``, ``seed``, ...)
    with its saved and its present value. The number of workers is free.
    """
    if state is None:
        return 0, 0
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not an infeed state (version {STATE_VERSION}): {state!r:.200}")
    try:
        epoch, batch, seed, fingerprint = state["epoch"], state["batch"], state["seed"], state["fingerprint"]
    except KeyError as e:
        raise ValueError(f"infeed state lacks {e.args[0]!r}: {state!r:.200}") from None
    saved = state.get("dataset")
    if isinstance(saved, dict):                 # states of older versions carry the fingerprint alone
        now = dict(dataset.identity(), seed=dataset.seed)
        saved = dict(saved, seed=seed)
        differ = [name for name in now if name in saved and saved[name] != now[name]]
        if differ:
            verb = "differs" if len(differ) == 1 else "differ"
            raise ValueError(f"the state was saved for another dataset ({', '.join(differ)} {verb}): " + "; ".join(
                f"saved with {name} {saved[name]!r:.120}, this dataset has {name} {now[name]!r:.120}"
                for name in differ))
    if fingerprint != dataset.fingerprint():
        raise ValueError("the state was saved for another dataset (files, features, batch size, shuffling "
                         f"or sharding differ: fingerprint {fingerprint}, this dataset's {dataset.fingerprint()})")
    if seed != dataset.seed:
        raise ValueError(f"the state was saved with seed {seed}, this dataset has seed {dataset.seed}")
    if not all(isinstance(x, int) and x >= 0 for x in (epoch, batch)):
        raise ValueError(f"infeed state: epoch and batch must be non-negative ints, got {epoch!r}, {batch!r}")
    return epoch, batch


def attach(name: str, timeout: float | None = None) -> Feed:
    """The feed of a ring that another process serves (``infeed serve --name NAME``).

    ``name`` is the ring's segment name or a name ``infeed serve`` registered.
    Iteration starts at the first batch no consumer has taken yet.
    """
    ring = Ring.attach(resolve_name(name))
    try:
        doc = json.loads(ring.meta)
        dataset = Dataset.from_json(doc["dataset"], matched=True)
        workers = int(doc["workers"])
    except (ValueError, KeyError, TypeError) as e:
        ring.close()
        raise InfeedError(f"ring {ring.name} does not describe its dataset: {e}") from None

    def check(seq: int) -> None:
        error = ring.error()
        if error is not None and ring.slot_state(seq % ring.slots) != ("filled", seq):
            error.raise_()
        ring.check_owner()
        try:
            ring.check_workers()
        except WorkerDied:
            # The server, the workers' parent, records how one died (its signal), then exits: wait for the
            # record, reading it after each look at the server so that one written just before it left counts.
            deadline = time.monotonic() + SERVER_REPORT
            while True:
                server_gone = not ring.owner_alive()
                error = ring.error()
                if error is not None:
                    error.raise_()
                if server_gone or time.monotonic() >= deadline:
                    raise
                time.sleep(0.02)

    return Feed(ring, dataset, check, timeout, workers)
