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
from infeed.errors import InfeedError, WorkerDied
from infeed.ring import Ring
from infeed.ring.orphans import collect as collect_orphans
from infeed.ring.ring import CLAIMING
from infeed.ring.slots import REPORTED_ERROR
from infeed.tfrecord.filesystems import registered_filesystems

__all__ = ["Daemon", "start_workers", "stop_workers"]

#: Seconds the workers get to stop on their own before they are killed.
STOP_GRACE = 5.0

_log = logging.getLogger("infeed")


def _worker_environment() -> dict:
    """The worker's environment: this one, with the directory infeed was imported from on its path."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])       # the folder that holds the infeed package
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def start_workers(ring: Ring, dataset: Dataset, workers: int, start: tuple[int, int]) -> list:
    """Starts ``workers`` processes (``python -m infeed.daemon.worker``) producing ``dataset`` into ``ring``;
    they import its transforms with this process's ``sys.path`` after their own."""
    procs = []
    env = _worker_environment()
    try:
        for k in range(workers):
            proc = subprocess.Popen([sys.executable, "-m", "infeed.daemon.worker"], stdin=subprocess.PIPE, env=env,
                                    close_fds=True)
            procs.append(proc)
            config = {"ring": ring.name, "worker": k, "start": list(start),
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
        if dataset.shuffle == "global":
            dataset.indexes()                   # every file has a usable index, or a clear error now
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

        Units are dealt to whichever worker is free (``Ring.take_unit``): the worker that owes ``seq`` is the
        one whose claim it is, or one that died while taking a unit; where every worker has ended, the first
        that did not end cleanly (or any) owes it. So a worker's death surfaces at the first batch it did not
        deliver (the batches delivered before are good): :class:`~infeed.WorkerDied` with the signal or exit
        status for a process killed or crashed, the worker's own exception (with its traceback) for one that
        failed and said why.
        """
        codes = [p.poll() for p in self._procs]
        crashed = [k for k, code in enumerate(codes) if code not in (None, 0, REPORTED_ERROR)]
        if not crashed and self.ring.slot_state(seq % self.ring.slots) == ("filled", seq):
            return
        owner = None
        for k, code in enumerate(codes):
            if code is not None and {seq, CLAIMING} & set(self.ring.worker_claims(k)):
                owner = k
                break
        if owner is None and crashed:      # killed or crashed owing no batch yet: the input has lost a worker
            owner = crashed[0]
        if owner is None:
            if any(code is None for code in codes):
                return
            failed = [k for k, code in enumerate(codes) if code != 0]
            owner = failed[0] if failed else 0
        proc, code = self._procs[owner], codes[owner]
        if code not in (0, REPORTED_ERROR):
            raise WorkerDied(proc.pid, signal=-code if code < 0 else None, exitcode=code if code >= 0 else None,
                             detail=f"worker {owner}, which owed batch {seq}")
        error = self.ring.error()
        if error is not None:
            error.raise_()
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
