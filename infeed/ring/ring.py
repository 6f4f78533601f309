"""A ring of fixed-layout batch slots in one POSIX shared-memory segment.

Producers (decoding workers) write batches straight into a slot's arrays; the
consumer (the trainer) reads them as numpy views, with no copies. One segment
in ``/dev/shm`` holds everything (:mod:`infeed.ring.layout` draws it).

* The segment is created ``O_CREAT | O_EXCL`` with mode 0600 and a name of
  128 random bits (``infeed-<uid>-<32 hex>``), its space reserved with
  ``posix_fallocate`` (so a full ``/dev/shm`` fails at creation with
  :class:`~infeed.ShmSpaceError`, never later with ``SIGBUS``) and its pages
  locked with ``mlock`` when ``RLIMIT_MEMLOCK`` allows (a warning otherwise).
  :meth:`Ring.pin` registers the slots with CUDA as pinned host memory in
  the consumer's process, where there is a CUDA GPU, so transfers to the
  device are direct DMA (the daemon's feed does so; never required).
* Each slot has two process-shared semaphores in the segment: *free* (starts
  at 1) and *filled* (starts at 0). A producer takes *free*, writes, and
  posts *filled*; the consumer takes *filled*, reads, and posts *free*. So
  producers block while the slot is full and the consumer while it is empty.
  Waits release the GIL, wake at once on a post, and every 0.1 s run a
  liveness check so that a waiter whose peer died raises
  :class:`~infeed.WorkerDied` instead of hanging; a deadline raises
  :class:`~infeed.Timeout`.
* Units (a slot's worth of batches) are dealt to whichever producer is free:
  :meth:`Ring.take_unit` hands out the next one from a counter in the header
  (an atomic fetch-add) and records it among the producer's claims in the
  worker table (:meth:`Ring.worker_claims`: at most two), so the consumer can
  name who owes a late unit. Unit ``u`` goes into slot ``u mod S``, so two
  producers may wait for one slot: :meth:`Ring.acquire_turn` lets ``u`` have
  it before ``u + S``.
* Every array in a slot starts on a 64-byte boundary. A slot holds one batch
  laid out as ``ExampleParser.allocate(batch_size)`` returns it (``Padded``
  fields as values and lengths), or with ``steps_per_slot=K > 1``, K batches
  stacked ``[K, B, ...]``.
* The creator unlinks the segment on :meth:`Ring.close`, on leaving a ``with``
  block (exception included), at interpreter exit, and on ``SIGTERM`` (when
  the process had the default ``SIGTERM`` action). Views handed out stay
  valid after close: the pages go when the last view does.

Example::

    >>> import numpy as np
    >>> from infeed.ring import Ring
    >>> with Ring.create({"x": ((4, 3), np.float32)}, slots=2, lock_memory=False) as ring:
    ...     ring.acquire_free(0, timeout=1)
    ...     ring.slot_arrays(0)["x"][:] = 1.0
    ...     ring.publish(0, seq=0)
    ...     seq = ring.acquire_filled(0, timeout=1)
    ...     total = float(ring.slot_arrays(0)["x"].sum())
    ...     ring.release(0)
    >>> seq, total
    (0, 12.0)
"""

from __future__ import annotations

import errno
import hashlib
import os
import resource
import stat
import time
import warnings
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from infeed.errors import AttachError, InfeedError, ShmSpaceError, Timeout, WorkerDied
from infeed.example.spec import Padded
from infeed.ring import _ring, locks
from infeed.ring.failures import ProducerFailure, decode_failure, encode_failure
from infeed.ring.layout import (ERROR, ERROR_PAYLOAD, HEADER, HEADER_SIZE, HEADER_STOP, HEADER_WORDS, MAGIC,
                                READER_FIELDS, READY, SEM_STRIDE, SLOT, SLOT_WORDS, VERSION, WORKER, WORKER_FIELDS,
                                WORKER_WORDS, header_problem, layout_from_json, layout_json, layout_of, segment_plan,
                                slot_plan)
from infeed.ring.segments import SHM_DIR, create_private, free_bytes, install_sigterm_cleanup, unlink_owned
from infeed.ring.slots import FILLED, FREE, READING, STATE_NAMES, WRITING, SlotInfo

__all__ = ["Ring"]

_BEAT, _BATCHES, _RECORDS, _BYTES, _SKIPPED, _CLAIM, _NEXT_CLAIM, _DECODE, _WAIT, _READERS = (
    WORKER_FIELDS[f] for f in ("beat_ns", "batches", "records", "bytes", "skipped", "claim", "next_claim",
                               "decode_ns", "wait_ns", READER_FIELDS[0]))
#: A worker's claim while it takes the next unit (a death then leaves it, not a unit, unaccounted).
CLAIMING = -2
#: How long a producer that took a slot before its turn first sleeps before it tries again (seconds) ...
TURN_SLEEP = 50e-6
#: ... doubling each time up to this.
TURN_SLEEP_MAX = 1e-3

#: How often a waiter wakes to check its peer is alive (it wakes at once on a post).
CHECK_INTERVAL = 0.1


def _mlock(mapping) -> int:
    return mapping.mlock()


def _release(fd: int, path: str, owner_pid: int | None) -> None:
    """Closes a ring's descriptor (dropping the locks this process holds through it) and, in the process
    that created the ring, unlinks its segment."""
    os.close(fd)
    if owner_pid is not None:
        unlink_owned(path, owner_pid)


class Ring:
    """A ring of batch slots in shared memory. Make one with :meth:`create` or :meth:`attach`."""

    def __init__(self, *_, **__):
        raise TypeError("use Ring.create(...) or Ring.attach(name)")

    # construction -----------------------------------------------------------------------------
    @classmethod
    def _new(cls, name: str, path: str, mapping, fd: int, owner: bool) -> "Ring":
        self = object.__new__(cls)
        self.name, self.path, self._map, self._fd, self.is_owner = name, path, mapping, fd, owner
        self._header = np.frombuffer(mapping, HEADER, 1)[0]
        h = self._header
        self.slots = int(h["slots"])
        self.slot_size = int(h["slot_size"])
        self.steps_per_slot = int(h["steps_per_slot"])
        self.max_workers = int(h["max_workers"])
        self.size = int(h["total_size"])
        self.creator_pid = int(h["creator_pid"])
        self._data = int(h["data_offset"])
        self._sems = int(h["sem_offset"])
        self._table = np.frombuffer(mapping, SLOT, self.slots, int(h["table_offset"]))
        self._workers = np.frombuffer(mapping, WORKER, self.max_workers, int(h["workers_offset"]))
        self._error = np.frombuffer(mapping, ERROR, 1, int(h["error_offset"]))[0]
        # Hot fields go through int64 / uint32 memoryviews: ~10x cheaper than numpy record fields.
        self._q = memoryview(mapping).cast("q")
        self._u32 = memoryview(mapping).cast("I")
        self._slot0 = int(h["table_offset"]) // 8
        self._worker0 = int(h["workers_offset"]) // 8
        self._views: list = [None] * self.slots
        self._pinned = False
        self._locked_workers: set[int] = set()
        self._finalizer = weakref.finalize(self, _release, fd, path, os.getpid() if owner else None)
        return self

    @classmethod
    def create(cls, template: Mapping[str, Any], slots: int, *, steps_per_slot: int = 1,
               max_workers: int = 64, lock_memory: bool = True, meta: bytes = b"") -> "Ring":
        """Creates a new segment for ``slots`` slots laid out as ``template``.

        ``template``: ``ExampleParser.allocate(batch_size)``'s output, or
        ``{name: (shape, dtype)}`` (``Padded`` of two pairs for padded fields).
        ``steps_per_slot``: K > 1 stacks K batches ``[K, B, ...]`` per slot.
        ``max_workers``: entries in the worker heartbeat table.
        ``lock_memory``: ``mlock`` the pages (a warning when the limit forbids it).
        ``meta``: bytes stored with the ring for those who attach (:attr:`meta`), such
        as the description of what the producers put in it.
        """
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a positive int, found {slots!r}")
        if not isinstance(steps_per_slot, int) or steps_per_slot < 1:
            raise ValueError(f"steps_per_slot must be a positive int, found {steps_per_slot!r}")
        if not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive int, found {max_workers!r}")
        layout = layout_of(template)
        layout_bytes = layout_json(layout, steps_per_slot)
        _, slot_size = slot_plan(layout, steps_per_slot)

        meta = bytes(meta)
        plan = segment_plan(len(layout_bytes), len(meta), slots, slot_size, max_workers)
        free = free_bytes()
        if free < plan.total:
            raise ShmSpaceError(SHM_DIR, plan.total, free)
        name, path, fd = create_private()
        pid = os.getpid()
        try:
            os.posix_fallocate(fd, 0, plan.total)
            mapping = _ring.Mapping(fd, plan.total)
        except BaseException as exc:
            os.close(fd)
            unlink_owned(path, pid)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise ShmSpaceError(SHM_DIR, plan.total, free_bytes()) from exc
            raise
        try:
            buf = np.frombuffer(mapping, np.uint8)
            h = np.frombuffer(mapping, HEADER, 1)[0]
            h["magic"], h["version"], h["layout_hash"] = MAGIC, VERSION, hashlib.sha256(layout_bytes).digest()
            h["slots"], h["max_workers"], h["slot_size"] = slots, max_workers, slot_size
            h["creator_pid"], h["creator_uid"], h["steps_per_slot"] = pid, os.getuid(), steps_per_slot
            h["created_unix_ns"], h["started_ns"] = time.time_ns(), time.monotonic_ns()
            h["data_offset"], h["total_size"] = plan.data, plan.total
            h["layout_offset"], h["layout_len"] = plan.layout, len(layout_bytes)
            h["sem_offset"], h["table_offset"] = plan.semaphores, plan.table
            h["workers_offset"], h["error_offset"] = plan.workers, plan.error
            buf[plan.layout:plan.layout + len(layout_bytes)] = np.frombuffer(layout_bytes, np.uint8)
            h["meta_offset"], h["meta_len"] = plan.meta, len(meta)
            buf[plan.meta:plan.meta + len(meta)] = np.frombuffer(meta, np.uint8)
            table = np.frombuffer(mapping, SLOT, slots, plan.table)
            table["seq"] = -1                    # no unit yet: unit i is the first of slot i (acquire_turn)
            del table
            for i in range(slots):
                mapping.sem_init(plan.semaphores + (2 * i) * SEM_STRIDE, 1)      # free
                mapping.sem_init(plan.semaphores + (2 * i + 1) * SEM_STRIDE, 0)  # filled
            mapping.sem_init(plan.semaphores + 2 * slots * SEM_STRIDE, 1)        # error-record claim
            del buf, h
            ring = cls._new(name, path, mapping, fd, owner=True)
            ring._header["state"] = READY  # last: attachers refuse a half-written header
        except BaseException:
            os.close(fd)
            unlink_owned(path, pid)
            raise
        install_sigterm_cleanup()
        if lock_memory:
            ring._lock()
        return ring

    @classmethod
    def attach(cls, name: str, template: Mapping[str, Any] | None = None, *,
               steps_per_slot: int | None = None, populate: bool = False) -> "Ring":
        """Attaches an existing ring by name, checking it before use.

        ``populate``: map all its pages now (a producer that will write every slot).

        Raises :class:`~infeed.AttachError` naming the failed check: the segment
        must exist, belong to this user, have mode 0600, carry this version's
        magic and header, be fully created, and (when ``template`` is given)
        have the same layout and ``steps_per_slot``.
        """
        if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
            raise AttachError(name, "name", "a segment name without '/'", name)
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise AttachError(name, "exists", f"a segment in {SHM_DIR}", "none") from None
        except OSError as exc:
            raise AttachError(name, "exists", "a segment this user can open", exc.strerror) from None
        try:
            return cls._checked(name, path, fd, template, steps_per_slot, populate)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _checked(cls, name: str, path: str, fd: int, template, steps_per_slot: int | None, populate: bool) -> "Ring":
        """The ring of segment ``fd``, once it passes :meth:`attach`'s checks."""
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise AttachError(name, "owner", f"uid {os.getuid()}", f"uid {st.st_uid}")
        mode = stat.S_IMODE(st.st_mode)
        if mode != 0o600:
            raise AttachError(name, "mode", "0o600", oct(mode))
        if st.st_size < HEADER_SIZE:
            raise AttachError(name, "size", f"at least {HEADER_SIZE} bytes", f"{st.st_size} bytes")
        mapping = _ring.Mapping(fd, st.st_size, populate)
        h = np.frombuffer(mapping, HEADER, 1)[0]
        if bytes(h["magic"]) != MAGIC:
            raise AttachError(name, "magic", MAGIC, bytes(h["magic"]))
        if int(h["version"]) != VERSION:
            raise AttachError(name, "version", VERSION, int(h["version"]))
        if int(h["state"]) != READY:
            raise AttachError(name, "state", "a fully created ring", "a ring still being created")
        if int(h["total_size"]) != st.st_size:
            raise AttachError(name, "size", f"{int(h['total_size'])} bytes", f"{st.st_size} bytes")
        if template is not None:
            want = layout_json(layout_of(template),
                                steps_per_slot if steps_per_slot is not None else int(h["steps_per_slot"]))
            if hashlib.sha256(want).digest() != bytes(h["layout_hash"]).ljust(32, b"\0"):
                start, n = int(h["layout_offset"]), int(h["layout_len"])
                found = bytes(np.frombuffer(mapping, np.uint8, n, start))
                raise AttachError(name, "layout", want.decode(), found.decode(errors="replace"))
        elif steps_per_slot is not None and steps_per_slot != int(h["steps_per_slot"]):
            raise AttachError(name, "layout", f"steps_per_slot={steps_per_slot}",
                              f"steps_per_slot={int(h['steps_per_slot'])}")
        problem = header_problem(h, st.st_size)
        if problem:
            raise AttachError(name, "header", "a consistent ring header", problem)
        del h
        return cls._new(name, path, mapping, fd, owner=False)

    def _lock(self) -> None:
        err = _mlock(self._map)
        if err:
            soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
            limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
            warnings.warn(f"ring {self.name}: could not lock its {self.size} bytes in memory "
                          f"({os.strerror(err)}); RLIMIT_MEMLOCK is {limit} (raise it with `ulimit -l`). "
                          f"Batches may be paged out.", RuntimeWarning, stacklevel=3)

    # layout and views -------------------------------------------------------------------------
    @property
    def layout(self) -> dict:
        """``{name: (shape, dtype)}`` of one batch (``Padded`` for padded fields), without the K axis."""
        return layout_from_json(self._layout_bytes())[0]

    @property
    def meta(self) -> bytes:
        """The ``meta`` bytes given to :meth:`create`."""
        h = self._header
        return bytes(np.frombuffer(self._map, np.uint8, int(h["meta_len"]), int(h["meta_offset"])))

    def _layout_bytes(self) -> bytes:
        h = self._header
        return bytes(np.frombuffer(self._map, np.uint8, int(h["layout_len"]), int(h["layout_offset"])))

    def _check_open(self) -> None:
        if self._map is None:
            raise ValueError(f"ring {self.name} is closed")

    def _check_slot(self, i: int) -> int:
        self._check_open()
        if not isinstance(i, (int, np.integer)) or not 0 <= i < self.slots:
            raise IndexError(f"slot {i!r} out of range for a ring of {self.slots} slots")
        return int(i)

    def slot_arrays(self, i: int, step: int | None = None) -> dict:
        """Views (no copies) of slot ``i``'s arrays, structured like the template.

        With ``steps_per_slot=K > 1`` the arrays are ``[K, B, ...]``; ``step=k``
        gives batch k alone (``[B, ...]``), ready for ``ExampleParser.parse(out=...)``.
        """
        i = self._check_slot(i)
        views = self._views[i]
        if views is None:
            plan, _ = slot_plan(self.layout, self.steps_per_slot)
            base = self._data + i * self.slot_size
            views = {}
            for name, padded, parts in plan:
                arrs = [np.frombuffer(self._map, dtype, int(np.prod(shape, dtype=np.int64)), base + off).reshape(shape)
                        for off, shape, dtype in parts]
                views[name] = Padded(*arrs) if padded else arrs[0]
            self._views[i] = views
        if step is None:
            return dict(views)
        if self.steps_per_slot == 1:
            if step != 0:
                raise IndexError(f"step {step} out of range for steps_per_slot=1")
            return dict(views)
        if not 0 <= step < self.steps_per_slot:
            raise IndexError(f"step {step} out of range for steps_per_slot={self.steps_per_slot}")
        return {n: Padded(v.values[step], v.lengths[step]) if isinstance(v, Padded) else v[step]
                for n, v in views.items()}

    # hand-off ---------------------------------------------------------------------------------
    def _wait(self, sem: int, what: str, timeout: float | None, check: Callable[[], None] | None,
              spin: float = 0.0) -> None:
        self._check_open()
        if spin and self._map.sem_wait(sem, spin, spin):
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = CHECK_INTERVAL if deadline is None else min(CHECK_INTERVAL, deadline - time.monotonic())
            mapping = self._map
            if mapping is None:             # closed by another thread while this one waited
                raise InfeedError(f"ring {self.name} was closed while waiting for {what}")
            if mapping.sem_wait(sem, max(left, 0.0)):
                return
            if check is not None:
                check()
            if deadline is not None and time.monotonic() >= deadline:
                raise Timeout(f"{what} of ring {self.name}", timeout)

    def acquire_free(self, i: int, timeout: float | None = None, check: Callable[[], None] | None = None) -> None:
        """Producer: waits until slot ``i`` is free, then owns it for writing.

        ``check`` runs every 0.1 s while waiting and raises to abort (by default,
        it checks that the ring's creator is alive); ``timeout`` raises
        :class:`~infeed.Timeout`.
        """
        i = self._check_slot(i)
        self._wait(self._sems + 2 * i * SEM_STRIDE, f"slot {i} to be free", timeout,
                   self.check_owner if check is None else check)
        w = self._slot0 + SLOT_WORDS * i
        self._q[w + 2] = os.getpid()          # before the state: a "writing" slot names its holder
        self._u32[2 * w] = WRITING

    def acquire_turn(self, unit: int, timeout: float | None = None, check: Callable[[], None] | None = None) -> int:
        """Producer: waits until ``unit``'s slot (``unit mod slots``) is free and its turn, ``unit``'s: the unit
        a slot before it (``unit - slots``) was published there and released. With units dealt to whichever
        worker is free (:meth:`take_unit`), two producers may wait for one slot; the one that takes it out of
        turn hands it back and tries again after a pause that doubles up to :data:`TURN_SLEEP_MAX`. Returns
        the slot."""
        i = unit % self.slots
        w = self._slot0 + SLOT_WORDS * i
        pause = TURN_SLEEP
        while True:
            self.acquire_free(i, timeout, check)
            if self._q[w + 1] == (unit - self.slots if unit >= self.slots else -1):
                return i
            self._u32[2 * w] = FREE                     # not ours yet: back to its owner of the moment
            self._map.sem_post(self._sems + 2 * i * SEM_STRIDE)
            if self.stop_requested:
                return i
            time.sleep(pause)
            pause = min(2 * pause, TURN_SLEEP_MAX)

    def take_unit(self, index: int) -> int:
        """Worker ``index`` takes the next unit nobody has taken (the ring's counter, atomically) and records
        it among its claims (:meth:`worker_claims`), beside the one it still owes, if any."""
        q, w = self._q, self._worker0 + WORKER_WORDS * index
        field = _CLAIM if q[w + _CLAIM] == -1 else _NEXT_CLAIM
        if q[w + field] != -1:
            raise RuntimeError(f"worker {index} takes a third unit while it owes two")
        q[w + field] = CLAIMING             # a death from here on is seen as owing the unit being taken
        unit = self._map.fetch_add(8 * HEADER_WORDS["next_unit"], 1)
        q[w + field] = unit
        return unit

    def drop_claim(self, index: int, unit: int) -> None:
        """Worker ``index`` no longer owes ``unit`` (it published it): its next claim, if any, moves up."""
        q, w = self._q, self._worker0 + WORKER_WORDS * index
        if q[w + _CLAIM] == unit:
            q[w + _CLAIM] = q[w + _NEXT_CLAIM]
            q[w + _NEXT_CLAIM] = -1
        elif q[w + _NEXT_CLAIM] == unit:
            q[w + _NEXT_CLAIM] = -1

    def worker_claims(self, index: int) -> tuple[int, int]:
        """The units worker ``index`` has taken and not yet published, oldest first (-1: none;
        :data:`CLAIMING` while it takes one)."""
        w = self._worker0 + WORKER_WORDS * index
        return int(self._q[w + _CLAIM]), int(self._q[w + _NEXT_CLAIM])

    def publish(self, i: int, seq: int, *, flags: int = 0, steps: int | None = None,
                cursor: tuple[int, int] = (0, 0)) -> None:
        """Producer: marks slot ``i`` filled with batch number ``seq`` and wakes the consumer.

        ``flags`` (:data:`SLOT_ERROR`, :data:`SLOT_END`), ``steps`` (how many of the
        slot's ``steps_per_slot`` batches hold data; all by default) and ``cursor``
        (two integers the producer attaches, e.g. where the input resumes after this
        slot) travel with the slot: read them with :meth:`slot_info`.
        """
        i = self._check_slot(i)
        w, q = self._slot0 + SLOT_WORDS * i, self._q
        self._u32[2 * w + 1] = flags
        q[w + 3] = self.steps_per_slot if steps is None else steps
        q[w + 4], q[w + 5] = cursor
        q[w + 1] = seq
        self._u32[2 * w] = FILLED
        self._map.sem_post(self._sems + (2 * i + 1) * SEM_STRIDE)

    def acquire_filled(self, i: int, timeout: float | None = None,
                       check: Callable[[], None] | None = None, spin: float = 0.0) -> int:
        """Consumer: waits until slot ``i`` is filled and returns its batch number.

        ``check`` runs every 0.1 s while waiting and raises to abort (by default,
        :meth:`check_workers`); ``timeout`` raises :class:`~infeed.Timeout`;
        ``spin``: seconds to poll (GIL released) before sleeping, which spares
        the producer the cost of waking this process.
        """
        i = self._check_slot(i)
        self._wait(self._sems + (2 * i + 1) * SEM_STRIDE, f"slot {i} to be filled", timeout,
                   self.check_workers if check is None else check, spin)
        w = self._slot0 + SLOT_WORDS * i
        self._u32[2 * w] = READING
        return self._q[w + 1]

    def release(self, i: int) -> None:
        """Consumer: hands slot ``i`` back to the producers."""
        i = self._check_slot(i)
        self._u32[2 * (self._slot0 + SLOT_WORDS * i)] = FREE
        self._map.sem_post(self._sems + 2 * i * SEM_STRIDE)

    def slot_info(self, i: int) -> SlotInfo:
        """What the producer published with slot ``i``: seq, flags, steps and cursor."""
        w, q = self._slot0 + SLOT_WORDS * self._check_slot(i), self._q
        return SlotInfo(q[w + 1], self._u32[2 * w + 1], q[w + 3], (q[w + 4], q[w + 5]))

    def slot_state(self, i: int) -> tuple[str, int]:
        """(``"free" | "writing" | "filled" | "reading"``, last batch number) of slot ``i``."""
        t = self._table[self._check_slot(i)]
        return STATE_NAMES.get(int(t["state"]), str(int(t["state"]))), int(t["seq"])

    def slot_writer(self, i: int) -> int:
        """The pid (as the producer's own ``os.getpid()`` gave it) of the producer that last took slot ``i`` for
        writing; 0 before any. While the slot is ``"writing"``, the one that holds it: its claimant, or a
        producer that took it before its turn and has not yet handed it back (:meth:`acquire_turn`)."""
        return int(self._q[self._slot0 + SLOT_WORDS * self._check_slot(i) + 2])

    # liveness ---------------------------------------------------------------------------------
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
        w["claim"] = w["next_claim"] = -1
        w["started_ns"] = w["beat_ns"] = time.monotonic_ns()
        w["pid"] = pid

    def workers(self) -> list[dict]:
        """The registered workers: index, pid, seconds from their registering to their last heartbeat
        (``elapsed_s``: the time their counters cover) and since that heartbeat, and their counters
        (:data:`~infeed.ring.layout.WORKER`; ``*_ns`` as ``*_s`` seconds)."""
        now = time.monotonic_ns()
        out = []
        for k, w in enumerate(self._workers):
            if w["pid"] <= 0:
                continue
            entry = {"index": k, "pid": int(w["pid"]), "elapsed_s": (int(w["beat_ns"]) - int(w["started_ns"])) / 1e9,
                     "since_beat": (now - int(w["beat_ns"])) / 1e9}
            for name in WORKER.names[3:]:
                value = int(w[name])
                entry.update({name[:-3] + "_s": value / 1e9} if name.endswith("_ns") else {name: value})
            out.append(entry)
        return out

    def check_workers(self) -> None:
        """Raises :class:`~infeed.WorkerDied` when a registered worker no longer holds its lock: it has
        ended, however (judged by the kernel's locks, so across PID namespaces too)."""
        self._check_open()
        for k, w in enumerate(self._workers):
            pid = int(w["pid"])
            if pid > 0 and k not in self._locked_workers and not locks.is_held(self._fd, locks.worker_byte(k)):
                raise WorkerDied(pid, detail=f"worker {k} registered with ring {self.name}, no longer running")

    def count_work(self, index: int, batches: int = 0, records: int = 0, nbytes: int = 0, skipped: int = 0,
                   decode_ns: int = 0, wait_ns: int = 0, readers: tuple | None = None) -> None:
        """Adds to worker ``index``'s counters (what :meth:`workers` reports) and beats its heart.

        ``records``: the records delivered; ``skipped``: those made padding rows instead (``skip_corrupt``).

        ``readers``: the totals of the worker's record readers so far, stored as they are
        (``infeed.tfrecord._tfrecord.stage_totals()``: read, inflate and CRC ns, bytes read and inflated)."""
        w, q = self._worker0 + WORKER_WORDS * index, self._q
        q[w + _BEAT] = time.monotonic_ns()
        if batches or records or skipped:
            q[w + _BATCHES] += batches
            q[w + _RECORDS] += records
            q[w + _BYTES] += nbytes
            q[w + _SKIPPED] += skipped
        q[w + _DECODE] += decode_ns
        q[w + _WAIT] += wait_ns
        if readers is not None:
            w += _READERS
            q[w], q[w + 1], q[w + 2], q[w + 3], q[w + 4] = readers

    def count_taken(self, seq: int, cursor: tuple[int, int], waited_ns: int, first: bool = False) -> None:
        """The consumer took batch ``seq`` (``cursor``: where the input resumes after it)
        after waiting ``waited_ns`` for it; ``first``: its first batch (the wait is start-up)."""
        h, q = HEADER_WORDS, self._q
        q[h["taken"]] = seq + 1
        q[h["cursor"]], q[h["cursor"] + 1] = cursor
        q[h["startup_ns" if first else "stall_ns"]] += waited_ns

    def consumer_counters(self) -> dict:
        """The consumer's counters: batches taken, seconds spent waiting for them (the first apart:
        ``startup_s``), its cursor, and the seconds since the ring was made (``elapsed_s``)."""
        h, q = HEADER_WORDS, self._q
        return {"taken": q[h["taken"]], "stall_s": q[h["stall_ns"]] / 1e9, "startup_s": q[h["startup_ns"]] / 1e9,
                "cursor": (q[h["cursor"]], q[h["cursor"] + 1]),
                "elapsed_s": (time.monotonic_ns() - q[h["started_ns"]]) / 1e9}

    def request_stop(self) -> None:
        """Asks the producers to stop, waking those that wait for a free slot."""
        self._header["stop"] = 1
        for i in range(self.slots):
            self._map.sem_post(self._sems + 2 * i * SEM_STRIDE)

    @property
    def stop_requested(self) -> bool:
        return self._u32[HEADER_STOP] != 0

    def owner_alive(self) -> bool:
        """Whether the process that created the ring still holds it (its lock: whatever PID namespace
        it runs in, and a reused pid does not count)."""
        self._check_open()
        return self.is_owner or locks.is_held(self._fd, locks.CREATOR)

    def check_owner(self) -> None:
        """Raises :class:`~infeed.InfeedError` when the ring's creator is gone."""
        if not self.owner_alive():
            raise InfeedError(f"ring {self.name}: its creator (process {self.creator_pid} in its own PID "
                              "namespace) is gone")

    # error record -----------------------------------------------------------------------------
    def set_error(self, error: BaseException | str, pid: int | None = None, signal: int | None = None,
                  unit: int | None = None) -> bool:
        """Records the first failure (an exception or a message); False if one was there.

        ``unit``: the unit (batch) the producer was at when it failed, where it failed at one (None: before
        any, such as while it started).

        Exceptions travel as JSON (type, constructor arguments, traceback text), never
        as pickles: the reader rebuilds infeed's own errors and built-in exception
        types, and keeps the message for anything else. When another process claimed
        the record first, this returns once that one is readable (or after
        :data:`CHECK_INTERVAL` s, should that process have died while writing it), so a
        slot published after it never reaches the consumer before the failure it names.
        """
        if not self._map.sem_trywait(self._sems + 2 * self.slots * SEM_STRIDE):
            deadline = time.monotonic() + CHECK_INTERVAL
            while not self._error["set"] and time.monotonic() < deadline:
                time.sleep(0.0005)
            return False
        payload = encode_failure(error, ERROR_PAYLOAD)
        e = self._error
        e["pid"] = os.getpid() if pid is None else pid
        e["signal"] = -1 if signal is None else signal
        e["unit"] = -1 if unit is None else unit
        e["len"] = len(payload)
        e["payload"][:len(payload)] = np.frombuffer(payload, np.uint8)
        e["set"] = 1
        return True

    def error(self) -> ProducerFailure | None:
        """The recorded failure, or None."""
        e = self._error
        if not e["set"]:
            return None
        message, exc, tb = decode_failure(bytes(e["payload"][:int(e["len"])]))
        sig, unit = int(e["signal"]), int(e["unit"])
        return ProducerFailure(int(e["pid"]), None if sig < 0 else sig, exc, message, tb, None if unit < 0 else unit)

    # life cycle -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._map is None

    def pin(self) -> bool:
        """Registers the slots with CUDA as pinned host memory in this process, where there is
        a CUDA GPU (see :mod:`infeed.ring.pinning`); True when they are pinned. Undone by :meth:`close`."""
        self._check_open()
        if not self._pinned:
            from infeed.ring import pinning

            self._pinned = pinning.register(self._map.address + self._data, self.slots * self.slot_size)
        return self._pinned

    def unlink_if_orphaned(self) -> bool:
        """Removes the segment when its creator is gone (it can no longer do so); True if removed."""
        if self.owner_alive():
            return False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return True

    def close(self) -> None:
        """Detaches; the creator also unlinks the segment. Views already taken stay valid."""
        if self._map is None:
            return
        if self._pinned:
            from infeed.ring import pinning

            pinning.unregister(self._map.address + self._data)
            self._pinned = False
        self._map = self._header = self._table = self._workers = self._error = self._q = self._u32 = None
        self._views = [None] * self.slots
        self._finalizer()                   # closes the segment's descriptor (its locks go), and unlinks it if ours

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.slots} slots of {self.slot_size} bytes"
        return f"<Ring {self.name} {state}{' (owner)' if self.is_owner else ''}>"
