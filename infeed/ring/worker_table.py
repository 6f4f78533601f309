"""A ring's worker table: one entry per producer, where it registers (its lock, its pid), beats, counts its
work per stage, and records the units it has taken and not yet published (its claims: how units are dealt is
in :mod:`infeed.ring.ring`'s account of the protocol). A producer's liveness is its lock on the segment
(:mod:`infeed.ring.locks`), never its pid.
"""

from __future__ import annotations

import os
import time

import numpy as np

from infeed.errors import InfeedError, WorkerDied
from infeed.ring import locks
from infeed.ring.layout import HEADER_WORDS, MAX_CLAIMS, READER_FIELDS, WORKER, WORKER_FIELDS, WORKER_WORDS

__all__ = ["CLAIMING", "WorkerTable"]

_BEAT, _COUNTING, _BATCHES, _RECORDS, _BYTES, _SKIPPED, _DECODE, _WAIT, _READERS = (
    WORKER_FIELDS[f] for f in ("beat_ns", "counting", "batches", "records", "bytes", "skipped", "decode_ns",
                               "wait_ns", READER_FIELDS[0]))
#: A worker's claim while it takes the next unit (a death then leaves it, not a unit, unaccounted).
CLAIMING = -2
#: Reads of an entry before :meth:`WorkerTable.workers` takes it as it is: a live worker updates its counters
#: in microseconds, so only one that died doing so (``counting`` left odd) uses them all.
_CONSISTENT_READ_TRIES = 1000


class WorkerTable:
    """The worker table's methods of :class:`~infeed.ring.Ring`, which mixes them in. They read the ring's
    mapping as it lays it out: ``_q`` (the segment as int64 words), ``_worker0`` (the table's first word),
    ``_workers`` (its entries as :data:`~infeed.ring.layout.WORKER` records), ``_fd`` (whose locks say who
    lives) and ``_locked_workers`` (the entries this process registered)."""

    # the units a worker owes -------------------------------------------------------------------
    def take_unit(self, index: int, count: int = 1, ahead: bool = False) -> int | None:
        """Worker ``index`` takes the next ``count`` units nobody has taken (the ring's counter, atomically) and
        records them among its claims (:meth:`worker_claims`), beside those it still owes (at most
        :data:`~infeed.ring.layout.MAX_CLAIMS` in all); returns the first.

        ``ahead``: units to read ahead, not needed yet: None, nothing taken, where this worker took the units
        before them and others may take these (so that takes ahead interleave, and no worker holds a run of
        units the others wait behind: unit ``u``'s slot is free once unit ``u - slots`` is taken)."""
        q, last = self._q, HEADER_WORDS["last_taker"]
        if ahead and self.max_workers > 1 and q[last] == index + 1:
            return None
        claims = self._workers["claims"][index]         # a view of the entry: each store is one aligned word
        free = np.flatnonzero(claims == -1)
        if len(free) < count:
            raise RuntimeError(f"worker {index} takes {count} units while it owes {MAX_CLAIMS - len(free)}: "
                               f"{MAX_CLAIMS} at most")
        entries = free[:count].tolist()
        claims[entries[0]] = CLAIMING       # a death from here on is seen as owing the units being taken
        first = self._map.fetch_add(8 * HEADER_WORDS["next_unit"], count)
        q[last] = index + 1                 # after the take: a hint (two takers at once may both see the other)
        for entry, unit in zip(reversed(entries), reversed(range(first, first + count))):
            claims[entry] = unit            # the first entry last: CLAIMING until every unit is recorded
        return first

    def drop_claim(self, index: int, unit: int) -> None:
        """Worker ``index`` no longer owes ``unit`` (it published it)."""
        claims = self._workers["claims"][index]
        claims[claims == unit] = -1

    def worker_claims(self, index: int) -> tuple[int, ...]:
        """The units worker ``index`` has taken and not yet published, oldest first, then :data:`CLAIMING`
        while it takes one."""
        entries = self._workers["claims"][index].tolist()
        return tuple(sorted(u for u in entries if u >= 0)) + ((CLAIMING,) if CLAIMING in entries else ())

    # registration and liveness -----------------------------------------------------------------
    def register_worker(self, index: int) -> None:
        """Registers this process as worker ``index`` for :meth:`check_workers`: it takes the worker's lock
        (:mod:`infeed.ring.locks`) for as long as this ring stays open here, and records its pid (a hint
        for messages and ``infeed stats``)."""
        if not 0 <= index < self.max_workers:
            raise IndexError(f"worker {index} out of range for max_workers={self.max_workers}")
        self._check_open()
        try:
            locks.hold(self._fd, locks.worker_byte(index))
        except BlockingIOError:
            raise InfeedError(f"ring {self.name}: worker {index} is already registered by a live process") from None
        self._locked_workers.add(index)
        pid = os.getpid()
        w = self._workers[index]
        for name in WORKER.names:
            w[name] = 0
        w["claims"] = -1
        w["started_ns"] = w["beat_ns"] = time.monotonic_ns()
        w["pid"] = pid

    def workers(self) -> list[dict]:
        """The registered workers: index, pid, seconds from their registering to their last heartbeat
        (``elapsed_s``: the time their counters cover) and since that heartbeat, and their counters
        (:data:`~infeed.ring.layout.WORKER`; ``*_ns`` as ``*_s`` seconds)."""
        now = time.monotonic_ns()
        out = []
        for k in range(len(self._workers)):
            if self._workers[k]["pid"] <= 0:
                continue
            w = self._read_whole(k)
            entry = {"index": k, "pid": int(w["pid"]), "elapsed_s": (int(w["beat_ns"]) - int(w["started_ns"])) / 1e9,
                     "since_beat": (now - int(w["beat_ns"])) / 1e9}
            for name in WORKER.names[WORKER.names.index("batches"):]:
                if name == "claims":
                    continue                # worker_claims
                value = int(w[name])
                entry.update({name[:-3] + "_s": value / 1e9} if name.endswith("_ns") else {name: value})
            out.append(entry)
        return out

    def _read_whole(self, index: int):
        """A copy of worker ``index``'s entry taken between two of its updates (``counting`` even and the same
        before and after): a beat with the counters of the same moment. A torn copy (the beat before an update,
        the counters after) would give a stage more seconds than the beats cover, and shares above 1."""
        q, seq = self._q, self._worker0 + WORKER_WORDS * index + _COUNTING
        for _ in range(_CONSISTENT_READ_TRIES):
            before = int(q[seq])
            entry = self._workers[index].copy()
            if before % 2 == 0 and int(q[seq]) == before:
                return entry
            os.sched_yield()
        return entry

    def check_workers(self) -> None:
        """Raises :class:`~infeed.WorkerDied` when a registered worker no longer holds its lock: it has
        ended, however (judged by the kernel's locks, so across PID namespaces too)."""
        self._check_open()
        for k, w in enumerate(self._workers):
            pid = int(w["pid"])
            if pid > 0 and k not in self._locked_workers and not locks.is_held(self._fd, locks.worker_byte(k)):
                raise WorkerDied(pid, detail=f"worker {k} registered with ring {self.name}, no longer running")

    # counters ----------------------------------------------------------------------------------
    def count_work(self, index: int, batches: int = 0, records: int = 0, nbytes: int = 0, skipped: int = 0,
                   decode_ns: int = 0, wait_ns: int = 0, readers: tuple | None = None) -> None:
        """Adds to worker ``index``'s counters (what :meth:`workers` reports) and beats its heart.

        ``records``: the records delivered; ``skipped``: those made padding rows instead (``skip_corrupt``).

        ``readers``: the totals of the worker's record readers so far, stored as they are
        (``infeed.tfrecord._tfrecord.stage_totals()``: read, inflate and CRC ns, bytes read and inflated)."""
        w, q = self._worker0 + WORKER_WORDS * index, self._q
        q[w + _COUNTING] += 1                   # odd: readers retry until it is even again (see _read_whole)
        q[w + _BEAT] = time.monotonic_ns()
        if batches or records or skipped:
            q[w + _BATCHES] += batches
            q[w + _RECORDS] += records
            q[w + _BYTES] += nbytes
            q[w + _SKIPPED] += skipped
        q[w + _DECODE] += decode_ns
        q[w + _WAIT] += wait_ns
        if readers is not None:
            r = w + _READERS
            q[r], q[r + 1], q[r + 2], q[r + 3], q[r + 4] = readers
        q[w + _COUNTING] += 1
