"""The decoding daemon: worker processes filling a shared-memory ring, and the trainer's iterator over it.

>>> with Daemon(ds, num_workers=2, slots=8) as feed:            # doctest: +SKIP
...     for batch in feed:              # a dict of numpy views into a ring slot, no copies
...         train_step(batch)           # the slot goes back to the workers at the next batch
...     state = feed.state()            # Daemon(ds, state=state) resumes at the next batch

:class:`Feed` is the consumer side alone; :func:`attach` gives one for a ring
that another process serves (``infeed serve``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Callable

from infeed.dataset import Dataset
from infeed.errors import InfeedError, Timeout, WorkerDied
from infeed.gc import collect as collect_orphans
from infeed.ring import SLOT_END, SLOT_ERROR, Ring, process_state
from infeed.spec import Padded

__all__ = ["Batch", "Feed", "Daemon", "attach", "STATE_VERSION"]

#: Version of the dict :meth:`Feed.state` returns.
STATE_VERSION = 1
#: Exit status of a worker that stopped after writing its failure to the ring.
REPORTED_ERROR = 3
#: Seconds an attached consumer gives the server to report how a worker it saw die died.
SERVER_REPORT = 1.0
#: Seconds a consumer polls for its next batch before it sleeps (see :class:`Feed`).
SPIN = 0.0002
#: Seconds the workers get to stop on their own before they are killed.
STOP_GRACE = 5.0
#: Seconds a consumer waits for one batch before it logs a warning naming the worker that owes
#: it and what that process is doing, and again every as many seconds while it waits (see :class:`Feed`).
STALL_WARNING = 60.0

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
    """

    def __init__(self, ring: Ring, dataset: Dataset, check: Callable[[int], None], timeout: float | None = None,
                 workers: int = 1):
        self.ring = ring
        self.dataset = dataset
        self.timeout = timeout
        self.stall_warning: float | None = STALL_WARNING
        self.spin = SPIN if len(os.sched_getaffinity(0)) > workers else 0.0
        self._workers = workers
        self._wait_began = 0
        self._warned = 0
        #: Whether the slots are registered with CUDA as pinned memory (a CUDA GPU is present).
        self.pinned = ring.pin()
        self._check_for = check
        self._next = ring.consumer_counters()["taken"]
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
        self._warned = 0
        try:
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
            ring.count_taken(seq - 1, info.cursor, waited)
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
        ring.count_taken(seq, info.cursor, waited)
        self._held, self._next = seq, seq + 1
        return batch

    # --- waiting ----------------------------------------------------------------------------
    def _check_waiting(self) -> None:
        """Runs every 0.1 s while the next batch is awaited: its producer's check, then the stall warning."""
        seq = self._next
        self._check_for(seq)
        every = self.stall_warning
        if every:
            waited = (time.perf_counter_ns() - self._wait_began) / 1e9
            if waited >= every * (self._warned + 1):
                self._warned = int(waited // every)
                _log.warning("infeed: waited %.1f s so far for %s", waited, self._owed(seq))

    def _owner(self, seq: int) -> tuple[int, int | None]:
        """(index, pid or None when not known yet) of the worker that owes batch ``seq``."""
        k = seq % self._workers
        return k, self._worker_pid(k)

    def _worker_pid(self, k: int) -> int | None:
        for worker in self.ring.workers():
            if worker["index"] == k:
                return worker["pid"]
        return None

    def _owed(self, seq: int) -> str:
        """Batch ``seq``, where it goes, and the worker that owes it, with what that process is doing."""
        ring = self.ring
        k, pid = self._owner(seq)
        who = f"worker {k} (not started yet)" if pid is None else f"worker {k} (pid {pid}, {process_state(pid)})"
        return f"batch {seq} (slot {seq % ring.slots} of ring {ring.name}) from {who}"

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


def _worker_environment() -> dict:
    """The worker's environment: this one, with the directory infeed was imported from on its path."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_workers(ring: Ring, dataset: Dataset, workers: int, start: tuple[int, int]) -> list:
    """Starts ``workers`` processes (``python -m infeed.worker``) producing ``dataset`` into ``ring``."""
    procs = []
    env = _worker_environment()
    try:
        for k in range(workers):
            proc = subprocess.Popen([sys.executable, "-m", "infeed.worker"], stdin=subprocess.PIPE, env=env,
                                    close_fds=True)
            procs.append(proc)
            config = {"ring": ring.name, "worker": k, "workers": workers, "start": list(start),
                      "dataset": dataset.to_json()}
            proc.stdin.write(json.dumps(config).encode())
            proc.stdin.close()
    except BaseException:
        stop_workers(ring, procs)
        raise
    return procs


def stop_workers(ring: Ring, procs: list, grace: float = STOP_GRACE) -> None:
    """Asks the workers to stop, waits up to ``grace`` seconds, then kills those still running.

    A worker stopped by a signal (SIGSTOP, SIGTSTP) is continued first, so that it can stop.
    """
    if not ring.closed:
        ring.request_stop()
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Daemon(Feed):
    """``num_workers`` processes decoding ``dataset`` into a ring of ``slots`` slots, and the feed over it.

    ``slots`` is rounded up to a multiple of ``num_workers`` (each slot has one
    producer). ``state``: from :meth:`state`, to resume at the next batch.
    ``timeout``: seconds any one batch may take (None: no limit; a dead worker
    is still detected within a second). The workers, the ring and its
    segment are gone after :meth:`close` or the ``with`` block, whatever happens.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 2, slots: int = 8, *, state: dict | None = None,
                 timeout: float | None = None, lock_memory: bool = True):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        start = start_of(dataset, state)
        if dataset.shuffle == "global":
            dataset.indexes()                   # every file has a usable index, or a clear error now
        slots = -(-slots // num_workers) * num_workers
        removed = collect_orphans()             # rings of this user's processes killed before they could
        if removed:
            _log.warning("infeed: removed %d shared-memory ring(s) left by processes that are gone (%.1f MB): %s",
                         len(removed), sum(size for _, size in removed) / 1e6, " ".join(p for p, _ in removed))
        meta = json.dumps({"dataset": dataset.to_json(), "workers": num_workers}).encode()
        ring = Ring.create(dataset.template(), slots, steps_per_slot=dataset.steps_per_slot,
                           max_workers=num_workers, lock_memory=lock_memory, meta=meta)
        ring.count_taken(-1, start, 0)
        self._procs: list = []
        try:
            self._procs = start_workers(ring, dataset, num_workers, start)
        except BaseException:
            ring.close()
            raise
        super().__init__(ring, dataset, self._check_workers, timeout, num_workers)

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids, worker 0 first."""
        return [p.pid for p in self._procs]

    def _worker_pid(self, k: int) -> int:
        return self._procs[k].pid

    def _check_workers(self, seq: int) -> None:
        """Raises when the worker that owes batch ``seq`` ended without it.

        So a worker's death surfaces exactly at the first batch it did not deliver,
        whichever worker died and however (the batches it delivered before are good):
        :class:`~infeed.WorkerDied` with the signal or exit status for a process
        killed or crashed, the worker's own exception (with its traceback) for one
        that failed and said why.
        """
        k = seq % len(self._procs)
        owner = self._procs[k]
        code = owner.poll()
        if code is None or self.ring.slot_state(seq % self.ring.slots) == ("filled", seq):
            return
        if code not in (0, REPORTED_ERROR):
            raise WorkerDied(owner.pid, signal=-code if code < 0 else None, exitcode=code if code >= 0 else None,
                             detail=f"worker {k}, which owed batch {seq}")
        error = self.ring.error()
        if error is not None:
            error.raise_()
        raise InfeedError(f"worker {k} (pid {owner.pid}) ended without batch {seq}")

    def close(self) -> None:
        """Stops the workers and removes the ring (views already taken stay readable)."""
        if self.ring.closed:
            return
        self._held = None
        try:
            stop_workers(self.ring, self._procs)
        finally:
            self.ring.close()

    def __del__(self):
        ring = getattr(self, "ring", None)
        if ring is not None and not ring.closed:
            self.close()

    def __repr__(self) -> str:
        return f"<Daemon {len(self._procs)} workers, ring {self.ring.name}>"


def attach(name: str, timeout: float | None = None) -> Feed:
    """The feed of a ring that another process serves (``infeed serve --name NAME``).

    ``name`` is the ring's segment name or a name ``infeed serve`` registered.
    Iteration starts at the first batch no consumer has taken yet.
    """
    from infeed.serve import resolve_name

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
            # The server, the workers' parent, records how one died (its signal): wait for that.
            deadline = time.monotonic() + SERVER_REPORT
            while time.monotonic() < deadline and ring.owner_alive():
                error = ring.error()
                if error is not None:
                    error.raise_()
                time.sleep(0.02)
            raise

    return Feed(ring, dataset, check, timeout, workers)
