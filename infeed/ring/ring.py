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
  worker table (:meth:`Ring.worker_claims`: at most ``MAX_CLAIMS``), so the consumer can
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

import os
import resource
import time
import warnings
import weakref
from typing import Any, Callable, Mapping

import numpy as np

from infeed.errors import InfeedError, Timeout
from infeed.example.spec import Padded
from infeed.ring import locks
from infeed.ring.error_record import ErrorRecord
from infeed.ring.header import map_checked, open_segment, write_header
from infeed.ring.layout import (ERROR, HEADER, HEADER_STOP, HEADER_WORDS, READY, SEM_STRIDE, SLOT, SLOT_WORDS, WORKER,
                                layout_from_json, layout_json, layout_of, segment_plan, slot_plan)
from infeed.ring.segments import create_reserved, install_sigterm_cleanup, unlink_owned
from infeed.ring.slots import CHECK_INTERVAL, FILLED, FREE, READING, STATE_NAMES, WRITING, SlotInfo
from infeed.ring.worker_table import WorkerTable

__all__ = ["Ring"]

#: How long a producer that took a slot before its turn first sleeps before it tries again (seconds) ...
TURN_SLEEP = 50e-6
#: ... doubling each time up to this.
TURN_SLEEP_MAX = 1e-3


def _mlock(mapping) -> int:
    return mapping.mlock()


def _release(fd: int, path: str, owner_pid: int | None) -> None:
    """Closes a ring's descriptor (dropping the locks this process holds through it) and, in the process
    that created the ring, unlinks its segment."""
    os.close(fd)
    if owner_pid is not None:
        unlink_owned(path, owner_pid)


class Ring(WorkerTable, ErrorRecord):
    """A ring of batch slots in shared memory. Make one with :meth:`create` or :meth:`attach`.

    Its worker table (claims, registration, counters: :class:`~infeed.ring.worker_table.WorkerTable`) and its
    error record (:class:`~infeed.ring.error_record.ErrorRecord`) are mixed in."""

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
        name, path, fd, mapping = create_reserved(plan.total)
        try:
            write_header(mapping, plan, layout_bytes, meta, slots=slots, slot_size=slot_size,
                         steps_per_slot=steps_per_slot, max_workers=max_workers)
            ring = cls._new(name, path, mapping, fd, owner=True)
            ring._header["state"] = READY  # last: attachers refuse a half-written header
        except BaseException:
            os.close(fd)
            unlink_owned(path, os.getpid())
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
        path, fd = open_segment(name)
        try:
            mapping = map_checked(name, fd, template, steps_per_slot, populate)
        except BaseException:
            os.close(fd)
            raise
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
