"""The decoding daemon: starts the worker processes that decode a dataset into a ring, and is the
trainer's :class:`~infeed.daemon.feed.Feed` over it; stops them and removes the ring whatever happens.

>>> with Daemon(ds, num_workers=2, slots=8) as feed:            # doctest: +SKIP
...     for batch in feed:              # a dict of numpy views into a ring slot, no copies
...         train_step(batch)           # the slot goes back to the workers at the next batch
...     state = feed.state()            # Daemon(ds, state=state) resumes at the next batch
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infeed.daemon.dataset import Dataset
from infeed.daemon.feed import Feed, start_of
from infeed.daemon.launcher import LaunchedWorker, launch
from infeed.daemon.output import OutputTail
from infeed.errors import InfeedError, WorkerDied
from infeed.ring import Ring
from infeed.ring.orphans import collect as collect_orphans
from infeed.ring.slots import REPORTED_ERROR, SLOT_ERROR
from infeed.ring.worker_table import CLAIMING
from infeed.tfrecord.filesystems import registered_filesystems

__all__ = ["Daemon", "WORKER_PROCESSES", "WorkerProcess", "start_workers", "stop_workers"]

#: Seconds the workers get to stop on their own before they are killed.
STOP_GRACE = 5.0

_log = logging.getLogger("infeed")


#: The worker's settings of numpy's BLAS, where this process's environment has none: one thread. W workers
#: already run on W CPUs, and OpenBLAS starts a pool of a thread per CPU in each at import (about a third of a
#: worker's start-up CPU time on 2 cores; a transform's matrix products stay on the worker's own CPU).
WORKER_THREAD_DEFAULTS = {"OPENBLAS_NUM_THREADS": "1"}


def _worker_environment() -> dict:
    """The worker's environment: this one, with the directory infeed was imported from first on its path
    (the worker runs with ``-P``: never the current directory, where a folder named ``infeed`` may be), and
    :data:`WORKER_THREAD_DEFAULTS` where it sets none of them."""
    env = {**WORKER_THREAD_DEFAULTS, **os.environ}
    root = str(Path(__file__).resolve().parents[2])       # the folder that holds the infeed package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class WorkerProcess(subprocess.Popen):
    """``python -P -m infeed.daemon.worker``: the infeed this process imported, whatever the current directory
    holds; its stderr goes on to this process's, the end kept in :attr:`output`
    (:class:`~infeed.daemon.output.OutputTail`)."""

    def __init__(self, env: dict):
        read, write = os.pipe()
        try:
            super().__init__([sys.executable, "-P", "-m", "infeed.daemon.worker"], stdin=subprocess.PIPE,
                             stderr=write, env=env, close_fds=True)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.output = OutputTail(read)


#: The two kinds of worker process, each with its stderr's end kept in ``output``.
WORKER_PROCESSES = (WorkerProcess, LaunchedWorker)


def start_workers(ring: Ring, dataset: Dataset, workers: int, start: tuple[int, int],
                  index_files: dict | None = None) -> list:
    """Starts ``workers`` processes producing ``dataset`` into ``ring``: forked by this process's launcher
    (:mod:`infeed.daemon.launcher`), or fresh interpreters (:class:`WorkerProcess`) where it cannot; they
    import its transforms with this process's ``sys.path`` after their own, and read the indexes where
    ``index_files`` says (:meth:`Dataset.index_files`; None: they look for them)."""
    procs = []
    env = _worker_environment()
    try:
        for k in range(workers):
            proc = launch(env) or WorkerProcess(env)
            procs.append(proc)
            config = {"ring": ring.name, "worker": k, "start": list(start), "index_files": index_files,
                      "dataset": dataset.to_json(), "sys_path": sys.path, "filesystems": registered_filesystems()}
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
    for proc in procs:
        if isinstance(proc, WORKER_PROCESSES):
            proc.output.join(max(deadline - time.monotonic(), 0.1))     # its last words written on


class Daemon(Feed):
    """``num_workers`` processes decoding ``dataset`` into a ring of ``slots`` slots, and the feed over it.

    ``slots`` is raised to ``num_workers`` where it is fewer (a slot for each
    worker to fill; each batch goes to whichever worker is free). ``state``:
    from :meth:`state`, to resume at the next batch. ``timeout``: seconds any
    one batch may take (None: no limit; a dead worker is still detected within
    a second). The workers, the ring and its segment are gone after
    :meth:`close` or the ``with`` block, whatever happens.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 2, slots: int = 8, *, state: dict | None = None,
                 timeout: float | None = None, lock_memory: bool = True):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be a positive int, got {num_workers!r}")
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive int, got {slots!r}")
        start = start_of(dataset, state)
        # The indexes are found here, once: the workers read them, with no look-ups. Missing ones are built
        # first where that pays (each file read once, here, before the first epoch).
        index_files = dataset.index_files()
        if not index_files and dataset.build_missing_indexes(num_workers) is not None:
            index_files = dataset.index_files()
        if dataset.needs_indexes and not index_files:
            dataset.indexes()                   # raises, naming a file without a usable index
        slots = max(slots, num_workers)
        removed = collect_orphans()             # rings of this user's processes killed before they could
        if removed:
            _log.warning("infeed: removed %d shared-memory ring(s) left by processes that are gone (%.1f MB): %s",
                         len(removed), sum(size for _, size in removed) / 1e6, " ".join(p for p, _ in removed))
        meta = json.dumps({"dataset": dataset.to_json(), "workers": num_workers}).encode()
        ring = Ring.create(dataset.template(), slots, steps_per_slot=dataset.steps_per_slot,
                           max_workers=num_workers, lock_memory=lock_memory, meta=meta)
        ring.count_taken(-1, start, 0)
        self._procs: list = []
        #: Workers killed, crashed or failed owing no batch: the first batch each fails (see _check_workers).
        self._lost_at: dict[int, int] = {}
        try:
            self._procs = start_workers(ring, dataset, num_workers, start, index_files)
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
        """Raises when a worker that ended keeps batch ``seq`` from coming; returns while it may still come.

        By the claims in the ring (``Ring.worker_claims``: units are dealt to whichever worker is free), the
        worker to blame is one that ended owing ``seq``, or one that ended holding ``seq``'s slot, taken before
        its turn. A batch published in its slot is handed out whoever has died since, and a worker that ended
        owing only later batches fails none before them (the others deliver those). A worker killed, crashed
        or failed with its own error owing no batch (none taken, or it died taking one, or it never
        registered: its entry is zeros, not claims) fails the input at the first check at or past the first
        batch not yet published when its end was first seen, or, for an error it recorded at a later unit
        (reading through the others' batches), at that unit. Where every worker has ended, the first that did
        not end cleanly (or any) owes ``seq``. So a death surfaces after every good batch before it:
        :class:`~infeed.WorkerDied` with the signal or exit status for a process killed or crashed, the
        worker's own exception (with its traceback, and a note naming the worker) for one that failed and
        said why.
        """
        codes = [p.poll() for p in self._procs]
        if all(code is None for code in codes):
            return
        ring, slots = self.ring, self.ring.slots
        # The claims before the slots: a worker publishes a unit, then drops its claim.
        pids = {w["index"]: w["pid"] for w in ring.workers()}        # registered workers only
        claims = {k: [u for u in ring.worker_claims(k) if u >= seq or u == CLAIMING] for k in pids}
        state, last = ring.slot_state(seq % slots)
        filled = (state, last) == ("filled", seq)
        ended = [k for k, code in enumerate(codes) if code is not None]
        failed = [k for k in ended if codes[k] != 0]                # killed, crashed, or failed saying why
        crashed = [k for k in failed if codes[k] != REPORTED_ERROR]
        record = ring.error() if REPORTED_ERROR in (codes[k] for k in failed) else None

        def recorded(k: int) -> bool:       # worker k's own error is the ring's record
            return codes[k] == REPORTED_ERROR and record is not None and record.pid == self._procs[k].pid

        for k in failed:
            if k not in self._lost_at and (k not in pids or not claims[k] or CLAIMING in claims[k]):
                first = seq         # owing no batch: the first batch not published now is the first it fails
                while first < seq + slots and ring.slot_state(first % slots) == ("filled", first):
                    first += 1
                if recorded(k) and record.unit is not None:
                    first = max(first, record.unit)      # an error at a later unit: the batches before it come
                self._lost_at[k] = first
        due = [k for k, first in self._lost_at.items() if first <= seq]
        if due and filled and ring.slot_info(seq % slots).flags & SLOT_ERROR:
            return          # the batch carries a failure at its place: the feed raises it there
        if due:
            owner = next((k for k in due if recorded(k)), due[0])
            how = ("never registered" if owner not in pids else "died taking a batch" if CLAIMING in claims[owner]
                   else "failed owing no batch" if codes[owner] == REPORTED_ERROR else "owed no batch")
            detail = f"which {how}; the input stops at batch {seq}"
        elif filled:
            return
        else:
            owner = next((k for k in ended if seq in claims.get(k, ())), None)
            detail = f"which owed batch {seq}"
        if owner is None and state == "writing":
            writer = ring.slot_writer(seq % slots)
            owner = next((k for k in ended if pids.get(k) == writer), None)
            detail = f"which held batch {seq}'s slot {seq % slots} out of turn"
        if owner is None:
            if any(code is None for code in codes):
                return          # seq comes from a live worker: the dead owe later batches
            owner = crashed[0] if crashed else failed[0] if failed else 0
            detail = f"every worker has ended; batch {seq} is the first not delivered"
        proc, code = self._procs[owner], codes[owner]
        output = proc.output.text() if isinstance(proc, WORKER_PROCESSES) else ""
        if code not in (0, REPORTED_ERROR):
            raise WorkerDied(proc.pid, signal=-code if code < 0 else None, exitcode=code if code >= 0 else None,
                             detail=f"worker {owner}, {detail}", output=output)
        error = ring.error()
        if code == REPORTED_ERROR and owner in due and not recorded(owner):
            # Another process's failure took the record first: this worker's own is on its stderr alone.
            held = "" if error is None else f" (it holds process {error.pid}'s: {error.message:.200})"
            raise WorkerDied(proc.pid, exitcode=code, detail=f"worker {owner}, {detail}; its error is not in the "
                                                            f"ring's error record{held}", output=output)
        if error is not None:
            who = f"infeed worker {owner} (pid {proc.pid}), {detail}"
            by = next((k for k, p in enumerate(self._procs) if p.pid == error.pid), None)
            error.raise_(f"(raised in {who})" if by == owner else
                         f"(raised in {f'infeed worker {by}' if by is not None else 'process'} (pid {error.pid}); "
                         f"the input stops at {who})")
        raise InfeedError(f"worker {owner} (pid {proc.pid}) ended without batch {seq}")

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
