"""A ring of fixed-layout batch slots in one POSIX shared-memory segment.

Producers (decoding workers) write batches straight into a slot's arrays; the
consumer (the trainer) reads them as numpy views, with no copies. One segment
in ``/dev/shm`` holds everything::

    [header | layout (JSON) | semaphores | slot table | worker table | error record | slot 0 | slot 1 | ...]

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

import builtins
import errno
import hashlib
import json
import os
import resource
import secrets
import signal
import stat
import threading
import time
import traceback
import warnings
import weakref
from typing import Any, Callable, Mapping as TypingMapping, NamedTuple

import numpy as np

from infeed._native import _ring
from infeed import errors as errors_module
from infeed.errors import AttachError, InfeedError, ShmSpaceError, Timeout, WorkerDied
from infeed.spec import Padded

__all__ = ["Ring", "RingError", "SlotInfo", "layout_of", "watch_processes", "process_state", "SHM_DIR",
           "FREE", "WRITING", "FILLED", "READING", "SLOT_ERROR", "SLOT_END"]

#: Where POSIX shared-memory segments live on Linux.
SHM_DIR = "/dev/shm"
MAGIC = b"INFEEDRB"
VERSION = 2
ALIGN = 64
#: How often a waiter wakes to check its peer is alive (it wakes at once on a post).
CHECK_INTERVAL = 0.1
#: Bytes for the error record's payload.
ERROR_PAYLOAD = 4032

#: Slot states, as the slot table records them (for stats and debugging).
FREE, WRITING, FILLED, READING = 0, 1, 2, 3
_STATE_NAMES = {FREE: "free", WRITING: "writing", FILLED: "filled", READING: "reading"}
_READY = 1

_HEADER = np.dtype([
    ("magic", "S8"), ("version", "<u4"), ("state", "<u4"), ("layout_hash", "S32"),
    ("slots", "<u4"), ("max_workers", "<u4"), ("slot_size", "<u8"),
    ("creator_pid", "<i8"), ("creator_uid", "<u4"), ("steps_per_slot", "<u4"),
    ("data_offset", "<u8"), ("total_size", "<u8"), ("layout_offset", "<u8"), ("layout_len", "<u8"),
    ("sem_offset", "<u8"), ("table_offset", "<u8"), ("workers_offset", "<u8"), ("error_offset", "<u8"),
    ("creator_start", "<i8"), ("created_unix_ns", "<i8"), ("stop", "<u4"), ("_pad", "<u4"),
    ("taken", "<i8"), ("stall_ns", "<i8"), ("cursor", "<i8", (2,)),
    ("meta_offset", "<u8"), ("meta_len", "<u8"),
])
_SLOT = np.dtype([("state", "<u4"), ("flags", "<u4"), ("seq", "<i8"), ("pid", "<i8"), ("steps", "<i8"),
                  ("cursor", "<i8", (2,))])
_WORKER = np.dtype([("pid", "<i8"), ("start_time", "<i8"), ("beat_ns", "<i8"), ("batches", "<i8"),
                    ("records", "<i8"), ("bytes", "<i8"), ("busy_ns", "<i8"), ("wait_ns", "<i8")])
_ERROR = np.dtype([("set", "<u4"), ("signal", "<i4"), ("pid", "<i8"), ("len", "<u8"), ("_pad", "<u8"),
                   ("payload", "u1", (ERROR_PAYLOAD,))])
_SEM_STRIDE = ALIGN
_SLOT_WORDS, _WORKER_WORDS = _SLOT.itemsize // 8, _WORKER.itemsize // 8
#: int64 word index of the header's consumer fields, and uint32 index of its stop flag.
_HEADER_WORDS = {name: _HEADER.fields[name][1] // 8 for name in ("taken", "stall_ns", "cursor")}
_HEADER_STOP = _HEADER.fields["stop"][1] // 4
assert all(_HEADER.fields[n][1] % 8 == 0 for n in _HEADER_WORDS) and _HEADER.fields["stop"][1] % 4 == 0
assert _SLOT.itemsize % 8 == 0 and _WORKER.itemsize % 8 == 0
assert _ring.SEM_SIZE <= _SEM_STRIDE and _HEADER.itemsize <= 256


def _align(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


# --- layout --------------------------------------------------------------------------------------

def _field(value, name: str) -> tuple[tuple[int, ...], np.dtype]:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        shape, dtype = value.shape, value.dtype
    else:
        try:
            shape, dtype = value
        except (TypeError, ValueError):
            raise ValueError(f"layout field {name!r}: expected an array or (shape, dtype), found {value!r}") from None
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    if dtype.hasobject or dtype.itemsize == 0:
        raise ValueError(f"layout field {name!r}: dtype {dtype} cannot live in shared memory")
    if any(d < 0 for d in shape):
        raise ValueError(f"layout field {name!r}: shape {shape} has a negative dimension")
    return shape, dtype


def layout_of(template: TypingMapping[str, Any]) -> dict:
    """``{name: (shape, dtype)}`` (``Padded`` of two such pairs for padded fields) from a template.

    The template is what ``ExampleParser.allocate(batch_size)`` returns, or the
    same structure with ``(shape, dtype)`` pairs in place of arrays.
    """
    if not isinstance(template, TypingMapping) or not template:
        raise ValueError(f"a ring layout is a non-empty dict of fields, found {type(template).__name__}")
    out = {}
    for name, value in template.items():
        if not isinstance(name, str):
            raise ValueError(f"layout field names are strings, found {name!r}")
        if isinstance(value, Padded):
            out[name] = Padded(_field(value.values, f"{name}.values"), _field(value.lengths, f"{name}.lengths"))
        else:
            out[name] = _field(value, name)
    return out


def _layout_json(layout: dict, steps_per_slot: int) -> bytes:
    fields = []
    for name, f in layout.items():
        parts = [f.values, f.lengths] if isinstance(f, Padded) else [f]
        fields.append([name, isinstance(f, Padded), [[list(s), d.str] for s, d in parts]])
    return json.dumps({"steps_per_slot": steps_per_slot, "fields": fields}, separators=(",", ":")).encode()


def _layout_from_json(data: bytes) -> tuple[dict, int]:
    doc = json.loads(data)
    layout = {}
    for name, padded, parts in doc["fields"]:
        parts = [(tuple(s), np.dtype(d)) for s, d in parts]
        layout[name] = Padded(*parts) if padded else parts[0]
    return layout, int(doc["steps_per_slot"])


def _slot_plan(layout: dict, steps_per_slot: int) -> tuple[list, int]:
    """[(name, padded, [(offset, shape, dtype), ...])] within a slot, and the slot's size."""
    plan, offset = [], 0
    lead = (steps_per_slot,) if steps_per_slot > 1 else ()
    for name, f in layout.items():
        parts = []
        for shape, dtype in ([f.values, f.lengths] if isinstance(f, Padded) else [f]):
            full = lead + shape
            parts.append((offset, full, dtype))
            offset = _align(offset + int(np.prod(full, dtype=np.int64)) * dtype.itemsize)
        plan.append((name, isinstance(f, Padded), parts))
    return plan, max(offset, ALIGN)


# --- processes -----------------------------------------------------------------------------------

def _start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = data[data.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


#: What the state letter of /proc/PID/stat says of a process, in words.
_PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "I": "idle",
                   "T": "stopped by a signal (SIGSTOP, SIGTSTP)", "t": "stopped by a debugger",
                   "Z": "dead, not yet reaped", "X": "dead"}


def process_state(pid: int) -> str:
    """What process ``pid`` is doing, in words (``running``, ``sleeping``, ``stopped by a signal ...``, ``gone``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    letter = data[data.rindex(b")") + 2:][:1].decode()
    return _PROCESS_STATES.get(letter, f"state {letter}")


def watch_processes(processes) -> Callable[[], None]:
    """A liveness check for child processes (``multiprocessing.Process`` or ``subprocess.Popen``).

    The check raises :class:`~infeed.WorkerDied` with the pid and the signal or
    exit status of the first one that has ended.
    """
    processes = list(processes)

    def check():
        for p in processes:
            code = p.exitcode if hasattr(p, "exitcode") else p.poll()
            if code is not None:
                raise WorkerDied(p.pid, signal=-code if code < 0 else None, exitcode=code if code >= 0 else None)
    return check


# --- cleanup -------------------------------------------------------------------------------------

#: path -> creating pid, for every segment this process created and has not yet unlinked.
_OWNED: dict[str, int] = {}
_OWNED_LOCK = threading.Lock()
_previous_sigterm = None


def _unlink(path: str, pid: int) -> None:
    """Removes ``path`` if this process created it (never from a forked child)."""
    if os.getpid() != pid:
        return
    with _OWNED_LOCK:
        _OWNED.pop(path, None)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _on_sigterm(signum, frame):
    for path, pid in list(_OWNED.items()):
        if pid == os.getpid():
            try:
                os.unlink(path)
            except OSError:
                pass
    # Die as SIGTERM would have killed us, so the parent sees the real cause.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_sigterm_cleanup() -> None:
    """Unlinks owned segments on SIGTERM, only where SIGTERM still has its default action."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def _mlock(mapping) -> int:
    return mapping.mlock()


# --- the ring ------------------------------------------------------------------------------------

def _encode_error(error: BaseException | str) -> bytes:
    """JSON for the error record, cut to fit ERROR_PAYLOAD (the message first, args dropped)."""
    if isinstance(error, str):
        record = {"message": error}
    else:
        record = {"message": f"{type(error).__name__}: {error}", "type": type(error).__name__,
                  "module": type(error).__module__,
                  "traceback": "".join(traceback.format_exception(error))[-2048:]}
        reduced = error.__reduce__()
        args = reduced[1] if isinstance(reduced, tuple) and len(reduced) > 1 else error.args
        try:
            record["args"] = json.loads(json.dumps(list(args)))
        except (TypeError, ValueError):
            pass
    payload = json.dumps(record).encode()
    tb, cut = record.get("traceback", ""), 0
    while len(payload) > ERROR_PAYLOAD and cut < len(tb):         # keep the exception, cut its traceback
        cut += len(payload) - ERROR_PAYLOAD + 64
        record["traceback"] = "..." + tb[cut:]
        payload = json.dumps(record).encode()
    if len(payload) > ERROR_PAYLOAD:
        record = {"message": record["message"][: ERROR_PAYLOAD // 2]}
        payload = json.dumps(record).encode()[:ERROR_PAYLOAD]
    return payload


def _decode_error(payload: bytes) -> tuple[str, BaseException | None, str]:
    """(message, rebuilt exception or None, the producer's traceback or ""); only infeed's errors and
    built-in exceptions are rebuilt (with the traceback as a note)."""
    try:
        record = json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace"), None, ""
    if not isinstance(record, dict):
        return payload.decode(errors="replace"), None, ""
    message, tb = str(record.get("message", "")), str(record.get("traceback") or "")
    name, module, args = record.get("type"), record.get("module"), record.get("args")
    if module == "infeed.errors":
        cls = getattr(errors_module, name, None)
    elif module == "builtins":
        cls = getattr(builtins, name, None)
    else:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception) and isinstance(args, list)):
        return message, None, tb
    try:
        exc = cls(*args)
    except Exception:
        return message, None, tb
    if tb:
        exc.add_note(_PRODUCER_NOTE + tb)
    return message, exc, tb


_PRODUCER_NOTE = "Raised in the producer process:\n"


#: Slot flags: the producer failed at this slot (see :meth:`Ring.error`); the data ended before it.
SLOT_ERROR, SLOT_END = 1, 2


class SlotInfo(NamedTuple):
    """What a producer published with a slot (:meth:`Ring.publish`)."""

    seq: int
    flags: int
    steps: int
    cursor: tuple[int, int]


class RingError(NamedTuple):
    """The error record of a ring: who failed and with what (and where, in ``traceback``)."""

    pid: int
    signal: int | None
    exception: BaseException | None
    message: str
    traceback: str = ""

    def raise_(self):
        """Raises the producer's exception; one of a type not rebuilt is an InfeedError with its message,
        both with the producer's traceback as a note."""
        if self.exception is not None:
            raise self.exception
        error = InfeedError(f"process {self.pid} failed: {self.message}")
        if self.traceback:
            error.add_note(_PRODUCER_NOTE + self.traceback)
        raise error


class Ring:
    """A ring of batch slots in shared memory. Make one with :meth:`create` or :meth:`attach`."""

    def __init__(self, *_, **__):
        raise TypeError("use Ring.create(...) or Ring.attach(name)")

    # construction -----------------------------------------------------------------------------
    @classmethod
    def _new(cls, name: str, path: str, mapping, owner: bool) -> "Ring":
        self = object.__new__(cls)
        self.name, self.path, self._map, self.is_owner = name, path, mapping, owner
        self._header = np.frombuffer(mapping, _HEADER, 1)[0]
        h = self._header
        self.slots = int(h["slots"])
        self.slot_size = int(h["slot_size"])
        self.steps_per_slot = int(h["steps_per_slot"])
        self.max_workers = int(h["max_workers"])
        self.size = int(h["total_size"])
        self.creator_pid = int(h["creator_pid"])
        self._creator_start = int(h["creator_start"])
        self._data = int(h["data_offset"])
        self._sems = int(h["sem_offset"])
        self._table = np.frombuffer(mapping, _SLOT, self.slots, int(h["table_offset"]))
        self._workers = np.frombuffer(mapping, _WORKER, self.max_workers, int(h["workers_offset"]))
        self._error = np.frombuffer(mapping, _ERROR, 1, int(h["error_offset"]))[0]
        # Hot fields go through int64 / uint32 memoryviews: ~10x cheaper than numpy record fields.
        self._q = memoryview(mapping).cast("q")
        self._u32 = memoryview(mapping).cast("I")
        self._slot0 = int(h["table_offset"]) // 8
        self._worker0 = int(h["workers_offset"]) // 8
        self._views: list = [None] * self.slots
        self._pinned = False
        self._finalizer = weakref.finalize(self, _unlink, path, os.getpid()) if owner else None
        return self

    @classmethod
    def create(cls, template: TypingMapping[str, Any], slots: int, *, steps_per_slot: int = 1,
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
        layout_bytes = _layout_json(layout, steps_per_slot)
        _, slot_size = _slot_plan(layout, steps_per_slot)

        layout_offset = 256
        meta = bytes(meta)
        meta_offset = _align(layout_offset + len(layout_bytes))
        sem_offset = _align(meta_offset + len(meta))
        table_offset = _align(sem_offset + (2 * slots + 1) * _SEM_STRIDE)
        workers_offset = _align(table_offset + slots * _SLOT.itemsize)
        error_offset = _align(workers_offset + max_workers * _WORKER.itemsize)
        page = os.sysconf("SC_PAGE_SIZE")
        data_offset = _align(error_offset + _ERROR.itemsize, page)
        total = _align(data_offset + slots * slot_size, page)

        free = _shm_free()
        if free < total:
            raise ShmSpaceError(SHM_DIR, total, free)
        uid = os.getuid()
        while True:
            name = f"infeed-{uid}-{secrets.token_hex(16)}"
            path = os.path.join(SHM_DIR, name)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            except FileExistsError:  # 2**-128 odds; never reuse an existing name
                continue
            break
        pid = os.getpid()
        with _OWNED_LOCK:
            _OWNED[path] = pid
        try:
            try:
                os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
                os.posix_fallocate(fd, 0, total)
                mapping = _ring.Mapping(fd, total)
            finally:
                os.close(fd)
        except BaseException as exc:
            _unlink(path, pid)
            if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM):
                raise ShmSpaceError(SHM_DIR, total, _shm_free()) from exc
            raise
        try:
            buf = np.frombuffer(mapping, np.uint8)
            h = np.frombuffer(mapping, _HEADER, 1)[0]
            h["magic"], h["version"], h["layout_hash"] = MAGIC, VERSION, hashlib.sha256(layout_bytes).digest()
            h["slots"], h["max_workers"], h["slot_size"] = slots, max_workers, slot_size
            h["creator_pid"], h["creator_uid"], h["steps_per_slot"] = pid, uid, steps_per_slot
            h["creator_start"], h["created_unix_ns"] = _start_time(pid) or 0, time.time_ns()
            h["data_offset"], h["total_size"] = data_offset, total
            h["layout_offset"], h["layout_len"] = layout_offset, len(layout_bytes)
            h["sem_offset"], h["table_offset"] = sem_offset, table_offset
            h["workers_offset"], h["error_offset"] = workers_offset, error_offset
            buf[layout_offset:layout_offset + len(layout_bytes)] = np.frombuffer(layout_bytes, np.uint8)
            h["meta_offset"], h["meta_len"] = meta_offset, len(meta)
            buf[meta_offset:meta_offset + len(meta)] = np.frombuffer(meta, np.uint8)
            for i in range(slots):
                mapping.sem_init(sem_offset + (2 * i) * _SEM_STRIDE, 1)      # free
                mapping.sem_init(sem_offset + (2 * i + 1) * _SEM_STRIDE, 0)  # filled
            mapping.sem_init(sem_offset + 2 * slots * _SEM_STRIDE, 1)        # error-record claim
            del buf, h
            ring = cls._new(name, path, mapping, owner=True)
            ring._header["state"] = _READY  # last: attachers refuse a half-written header
        except BaseException:
            _unlink(path, pid)
            raise
        _install_sigterm_cleanup()
        if lock_memory:
            ring._lock()
        return ring

    @classmethod
    def attach(cls, name: str, template: TypingMapping[str, Any] | None = None, *,
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
            st = os.fstat(fd)
            if st.st_uid != os.getuid():
                raise AttachError(name, "owner", f"uid {os.getuid()}", f"uid {st.st_uid}")
            mode = stat.S_IMODE(st.st_mode)
            if mode != 0o600:
                raise AttachError(name, "mode", "0o600", oct(mode))
            if st.st_size < 256:
                raise AttachError(name, "size", "at least 256 bytes", f"{st.st_size} bytes")
            mapping = _ring.Mapping(fd, st.st_size, populate)
        finally:
            os.close(fd)
        h = np.frombuffer(mapping, _HEADER, 1)[0]
        if bytes(h["magic"]) != MAGIC:
            raise AttachError(name, "magic", MAGIC, bytes(h["magic"]))
        if int(h["version"]) != VERSION:
            raise AttachError(name, "version", VERSION, int(h["version"]))
        if int(h["state"]) != _READY:
            raise AttachError(name, "state", "a fully created ring", "a ring still being created")
        if int(h["total_size"]) != st.st_size:
            raise AttachError(name, "size", f"{int(h['total_size'])} bytes", f"{st.st_size} bytes")
        if template is not None:
            want = _layout_json(layout_of(template),
                                steps_per_slot if steps_per_slot is not None else int(h["steps_per_slot"]))
            if hashlib.sha256(want).digest() != bytes(h["layout_hash"]).ljust(32, b"\0"):
                start, n = int(h["layout_offset"]), int(h["layout_len"])
                found = bytes(np.frombuffer(mapping, np.uint8, n, start))
                raise AttachError(name, "layout", want.decode(), found.decode(errors="replace"))
        elif steps_per_slot is not None and steps_per_slot != int(h["steps_per_slot"]):
            raise AttachError(name, "layout", f"steps_per_slot={steps_per_slot}",
                              f"steps_per_slot={int(h['steps_per_slot'])}")
        del h
        return cls._new(name, path, mapping, owner=False)

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
        return _layout_from_json(self._layout_bytes())[0]

    @property
    def meta(self) -> bytes:
        """The ``meta`` bytes given to :meth:`create`."""
        h = self._header
        return bytes(np.frombuffer(self._map, np.uint8, int(h["meta_len"]), int(h["meta_offset"])))

    def _layout_bytes(self) -> bytes:
        h = self._header
        return bytes(np.frombuffer(self._map, np.uint8, int(h["layout_len"]), int(h["layout_offset"])))

    def _check_slot(self, i: int) -> int:
        if self._map is None:
            raise ValueError(f"ring {self.name} is closed")
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
            plan, _ = _slot_plan(self.layout, self.steps_per_slot)
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
        if self._map is None:
            raise ValueError(f"ring {self.name} is closed")
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
        self._wait(self._sems + 2 * i * _SEM_STRIDE, f"slot {i} to be free", timeout,
                   self.check_owner if check is None else check)
        w = self._slot0 + _SLOT_WORDS * i
        self._u32[2 * w] = WRITING
        self._q[w + 2] = os.getpid()

    def publish(self, i: int, seq: int, *, flags: int = 0, steps: int | None = None,
                cursor: tuple[int, int] = (0, 0)) -> None:
        """Producer: marks slot ``i`` filled with batch number ``seq`` and wakes the consumer.

        ``flags`` (:data:`SLOT_ERROR`, :data:`SLOT_END`), ``steps`` (how many of the
        slot's ``steps_per_slot`` batches hold data; all by default) and ``cursor``
        (two integers the producer attaches, e.g. where the input resumes after this
        slot) travel with the slot: read them with :meth:`slot_info`.
        """
        i = self._check_slot(i)
        w, q = self._slot0 + _SLOT_WORDS * i, self._q
        self._u32[2 * w + 1] = flags
        q[w + 3] = self.steps_per_slot if steps is None else steps
        q[w + 4], q[w + 5] = cursor
        q[w + 1] = seq
        self._u32[2 * w] = FILLED
        self._map.sem_post(self._sems + (2 * i + 1) * _SEM_STRIDE)

    def acquire_filled(self, i: int, timeout: float | None = None,
                       check: Callable[[], None] | None = None, spin: float = 0.0) -> int:
        """Consumer: waits until slot ``i`` is filled and returns its batch number.

        ``check`` runs every 0.1 s while waiting and raises to abort (by default,
        :meth:`check_workers`); ``timeout`` raises :class:`~infeed.Timeout`;
        ``spin``: seconds to poll (GIL released) before sleeping, which spares
        the producer the cost of waking this process.
        """
        i = self._check_slot(i)
        self._wait(self._sems + (2 * i + 1) * _SEM_STRIDE, f"slot {i} to be filled", timeout,
                   self.check_workers if check is None else check, spin)
        w = self._slot0 + _SLOT_WORDS * i
        self._u32[2 * w] = READING
        return self._q[w + 1]

    def release(self, i: int) -> None:
        """Consumer: hands slot ``i`` back to the producers."""
        i = self._check_slot(i)
        self._u32[2 * (self._slot0 + _SLOT_WORDS * i)] = FREE
        self._map.sem_post(self._sems + 2 * i * _SEM_STRIDE)

    def slot_info(self, i: int) -> SlotInfo:
        """What the producer published with slot ``i``: seq, flags, steps and cursor."""
        w, q = self._slot0 + _SLOT_WORDS * self._check_slot(i), self._q
        return SlotInfo(q[w + 1], self._u32[2 * w + 1], q[w + 3], (q[w + 4], q[w + 5]))

    def slot_state(self, i: int) -> tuple[str, int]:
        """(``"free" | "writing" | "filled" | "reading"``, last batch number) of slot ``i``."""
        t = self._table[self._check_slot(i)]
        return _STATE_NAMES.get(int(t["state"]), str(int(t["state"]))), int(t["seq"])

    # liveness ---------------------------------------------------------------------------------
    def register_worker(self, index: int, pid: int | None = None) -> None:
        """Records worker ``index``'s pid (this process by default) for :meth:`check_workers`."""
        if not 0 <= index < self.max_workers:
            raise IndexError(f"worker {index} out of range for max_workers={self.max_workers}")
        pid = os.getpid() if pid is None else pid
        w = self._workers[index]
        w["start_time"], w["beat_ns"], w["batches"] = _start_time(pid) or 0, time.monotonic_ns(), 0
        w["pid"] = pid

    def workers(self) -> list[dict]:
        """The registered workers: index, pid, seconds since their last heartbeat, and their counters."""
        now = time.monotonic_ns()
        return [{"index": k, "pid": int(w["pid"]), "since_beat": (now - int(w["beat_ns"])) / 1e9,
                 "batches": int(w["batches"]), "records": int(w["records"]), "bytes": int(w["bytes"]),
                 "busy_s": int(w["busy_ns"]) / 1e9, "wait_s": int(w["wait_ns"]) / 1e9}
                for k, w in enumerate(self._workers) if w["pid"] > 0]

    def check_workers(self) -> None:
        """Raises :class:`~infeed.WorkerDied` when a registered worker is no longer running."""
        for w in self._workers:
            pid = int(w["pid"])
            if pid > 0:
                started = _start_time(pid)
                if started is None or (w["start_time"] and started != int(w["start_time"])):
                    raise WorkerDied(pid, detail=f"registered with ring {self.name}, no longer running")

    def count_work(self, index: int, batches: int = 0, records: int = 0, nbytes: int = 0,
                   busy_ns: int = 0, wait_ns: int = 0) -> None:
        """Adds to worker ``index``'s counters (what :meth:`workers` reports) and beats its heart."""
        w, q = self._worker0 + _WORKER_WORDS * index, self._q
        q[w + 2] = time.monotonic_ns()
        q[w + 3] += batches
        q[w + 4] += records
        q[w + 5] += nbytes
        q[w + 6] += busy_ns
        q[w + 7] += wait_ns

    def count_taken(self, seq: int, cursor: tuple[int, int], waited_ns: int) -> None:
        """The consumer took batch ``seq`` (``cursor``: where the input resumes after it)
        after waiting ``waited_ns`` for it."""
        h, q = _HEADER_WORDS, self._q
        q[h["taken"]] = seq + 1
        q[h["cursor"]], q[h["cursor"] + 1] = cursor
        q[h["stall_ns"]] += waited_ns

    def consumer_counters(self) -> dict:
        """The consumer's counters: batches taken, seconds spent waiting for them, and its cursor."""
        h, q = _HEADER_WORDS, self._q
        return {"taken": q[h["taken"]], "stall_s": q[h["stall_ns"]] / 1e9,
                "cursor": (q[h["cursor"]], q[h["cursor"] + 1])}

    def request_stop(self) -> None:
        """Asks the producers to stop, waking those that wait for a free slot."""
        self._header["stop"] = 1
        for i in range(self.slots):
            self._map.sem_post(self._sems + 2 * i * _SEM_STRIDE)

    @property
    def stop_requested(self) -> bool:
        return self._u32[_HEADER_STOP] != 0

    def owner_alive(self) -> bool:
        """Whether the process that created the ring is still running (a reused pid does not count)."""
        started = _start_time(self.creator_pid)
        return started is not None and (not self._creator_start or started == self._creator_start)

    def check_owner(self) -> None:
        """Raises :class:`~infeed.InfeedError` when the ring's creator is gone."""
        if not self.owner_alive():
            raise InfeedError(f"ring {self.name}: its creator, process {self.creator_pid}, is gone")

    # error record -----------------------------------------------------------------------------
    def set_error(self, error: BaseException | str, pid: int | None = None, signal: int | None = None) -> bool:
        """Records the first failure (an exception or a message); False if one was there.

        Exceptions travel as JSON (type, constructor arguments, traceback text), never
        as pickles: the reader rebuilds infeed's own errors and built-in exception
        types, and keeps the message for anything else.
        """
        if not self._map.sem_trywait(self._sems + 2 * self.slots * _SEM_STRIDE):
            return False
        payload = _encode_error(error)
        e = self._error
        e["pid"] = os.getpid() if pid is None else pid
        e["signal"] = -1 if signal is None else signal
        e["len"] = len(payload)
        e["payload"][:len(payload)] = np.frombuffer(payload, np.uint8)
        e["set"] = 1
        return True

    def error(self) -> RingError | None:
        """The recorded failure, or None."""
        e = self._error
        if not e["set"]:
            return None
        message, exc, tb = _decode_error(bytes(e["payload"][:int(e["len"])]))
        sig = int(e["signal"])
        return RingError(int(e["pid"]), None if sig < 0 else sig, exc, message, tb)

    # life cycle -------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._map is None

    def pin(self) -> bool:
        """Registers the slots with CUDA as pinned host memory in this process, where there is
        a CUDA GPU (see :mod:`infeed.pinning`); True when they are pinned. Undone by :meth:`close`."""
        if self._map is None:
            raise ValueError(f"ring {self.name} is closed")
        if not self._pinned:
            from infeed import pinning

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
            from infeed import pinning

            pinning.unregister(self._map.address + self._data)
            self._pinned = False
        self._map = self._header = self._table = self._workers = self._error = self._q = self._u32 = None
        self._views = [None] * self.slots
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.slots} slots of {self.slot_size} bytes"
        return f"<Ring {self.name} {state}{' (owner)' if self.is_owner else ''}>"


def _shm_free() -> int:
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize
