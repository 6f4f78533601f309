"""Where everything lives in a ring's segment, and how a batch's arrays are laid out in a slot::

    [header | layout (JSON) | meta | semaphores | slot table | worker table | error record | slot 0 | slot 1 | ...]

The header, slot table, worker table and error record are numpy structured types
(:data:`HEADER`, :data:`SLOT`, :data:`WORKER`, :data:`ERROR`) so that every
process that maps the segment reads the same bytes the same way. Every array in
a slot starts on a 64-byte boundary.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, NamedTuple

import numpy as np

from infeed.example.spec import Padded, numpy_dtype
from infeed.ring import _ring
from infeed.tfrecord._tfrecord import STAGE_TOTALS

__all__ = ["MAGIC", "VERSION", "MAX_CLAIMS", "READY", "ALIGN", "HEADER_SIZE", "ERROR_PAYLOAD", "HEADER", "SLOT", "WORKER", "ERROR",
           "SEM_STRIDE", "SLOT_WORDS", "WORKER_WORDS", "WORKER_FIELDS", "READER_FIELDS", "HEADER_WORDS", "HEADER_STOP",
           "SegmentPlan", "align", "layout_of", "layout_json", "layout_from_json", "slot_plan", "segment_plan",
           "header_problem"]

MAGIC = b"INFEEDRB"
#: 3: the creator and the workers hold locks (:mod:`infeed.ring.locks`); liveness no longer reads pids.
#: 4: per-stage counters in the worker table (:data:`WORKER`), the ring's start time in the header.
#: 5: ``skipped`` in the worker table: records made padding rows (``skip_corrupt``).
#: 6: units dealt to whichever worker is free: ``next_unit`` in the header, ``claim`` and ``next_claim`` in the
#:    worker table; slots' ``seq`` start at -1.
#: 7: ``counting`` in the worker table: odd while a worker updates its counters, so that a reader takes them
#:    whole (:meth:`~infeed.ring.worker_table.WorkerTable.workers`).
#: 8: ``claims`` (up to :data:`MAX_CLAIMS` units a worker) in place of ``claim`` and ``next_claim``: a worker
#:    reading from a store takes as many units ahead as its reads in flight need; ``last_taker`` in the header
#:    (the worker that took units last, plus one), so that takes ahead interleave.
VERSION = 8
#: The units a worker may have taken and not yet published, at most: the one it makes and those it reads ahead.
MAX_CLAIMS = 256
#: The header's ``state`` once the creator has written everything: attachers refuse a ring before that.
READY = 1
ALIGN = 64
#: Bytes reserved for the header at the start of the segment.
HEADER_SIZE = 256
#: Bytes for the error record's payload.
ERROR_PAYLOAD = 4032

HEADER = np.dtype([
    ("magic", "S8"), ("version", "<u4"), ("state", "<u4"), ("layout_hash", "S32"),
    ("slots", "<u4"), ("max_workers", "<u4"), ("slot_size", "<u8"),
    ("creator_pid", "<i8"), ("creator_uid", "<u4"), ("steps_per_slot", "<u4"),
    ("data_offset", "<u8"), ("total_size", "<u8"), ("layout_offset", "<u8"), ("layout_len", "<u8"),
    ("sem_offset", "<u8"), ("table_offset", "<u8"), ("workers_offset", "<u8"), ("error_offset", "<u8"),
    ("created_unix_ns", "<i8"), ("stop", "<u4"), ("_pad", "<u4"),
    ("taken", "<i8"), ("stall_ns", "<i8"), ("cursor", "<i8", (2,)),
    ("meta_offset", "<u8"), ("meta_len", "<u8"), ("started_ns", "<i8"), ("startup_ns", "<i8"),
    ("next_unit", "<i8"), ("last_taker", "<i8"),
])
SLOT = np.dtype([("state", "<u4"), ("flags", "<u4"), ("seq", "<i8"), ("pid", "<i8"), ("steps", "<i8"),
                 ("cursor", "<i8", (2,))])
#: A worker's entry: its pid (a hint for messages), when it registered and last beat (``time.monotonic_ns``),
#: what it delivered (``bytes``: of the records decoded; ``skipped``: records made padding rows, which ``records``
#: does not count), the units it has taken and not yet published (``claims``, in any order: -1 for none,
#: -2 while it takes one), and its time per stage since it registered:
#: ``read_ns`` (opening and reading files, ``inflate_ns`` within it), ``crc_ns``, ``decode_ns`` (into the
#: slot) and ``wait_ns`` (for a free slot); ``read_bytes`` came out of its streams (inflated),
#: ``compressed_bytes`` went into inflating. Its other time is planning and moving past others' records.
#: ``counting`` is odd while the worker updates the beat and the counters (a sequence lock: readers retry).
WORKER = np.dtype([("pid", "<i8"), ("started_ns", "<i8"), ("beat_ns", "<i8"), ("counting", "<i8"),
                   ("batches", "<i8"), ("records", "<i8"), ("bytes", "<i8"), ("skipped", "<i8"),
                   ("claims", "<i8", (MAX_CLAIMS,)), ("decode_ns", "<i8"), ("wait_ns", "<i8"), ("read_ns", "<i8"), ("inflate_ns", "<i8"), ("crc_ns", "<i8"),
                   ("read_bytes", "<i8"), ("compressed_bytes", "<i8")])
#: The fields a worker's record readers count (``STAGE_TOTALS``, stored as they come), last.
READER_FIELDS = WORKER.names[-len(STAGE_TOTALS):]
assert READER_FIELDS == STAGE_TOTALS
#: The error record: the first failure (``Ring.set_error``) and the unit its producer was at (-1: none). ``unit``
#: was padding before: a writer that leaves it zero says unit 0, the start, which counts as none.
ERROR = np.dtype([("set", "<u4"), ("signal", "<i4"), ("pid", "<i8"), ("len", "<u8"), ("unit", "<i8"),
                  ("payload", "u1", (ERROR_PAYLOAD,))])
#: Bytes between two semaphores (each on its own cache line).
SEM_STRIDE = ALIGN
#: int64 words of a slot-table and a worker-table entry.
SLOT_WORDS, WORKER_WORDS = SLOT.itemsize // 8, WORKER.itemsize // 8
#: int64 word index of the header's consumer fields, and uint32 index of its stop flag.
HEADER_WORDS = {name: HEADER.fields[name][1] // 8 for name in ("taken", "stall_ns", "cursor", "started_ns",
                                                                     "startup_ns", "next_unit", "last_taker")}
#: int64 word index of each field within a worker-table entry.
WORKER_FIELDS = {name: WORKER.fields[name][1] // 8 for name in WORKER.names}
HEADER_STOP = HEADER.fields["stop"][1] // 4
assert all(HEADER.fields[n][1] % 8 == 0 for n in HEADER_WORDS) and HEADER.fields["stop"][1] % 4 == 0
assert SLOT.itemsize % 8 == 0 and WORKER.itemsize % 8 == 0
assert _ring.SEM_SIZE <= SEM_STRIDE and HEADER.itemsize <= HEADER_SIZE


def align(n: int, to: int = ALIGN) -> int:
    """``n`` rounded up to a multiple of ``to``."""
    return -(-n // to) * to


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


def layout_of(template: Mapping[str, Any]) -> dict:
    """``{name: (shape, dtype)}`` (``Padded`` of two such pairs for padded fields) from a template.

    The template is what ``ExampleParser.allocate(batch_size)`` returns, or the
    same structure with ``(shape, dtype)`` pairs in place of arrays.
    """
    if not isinstance(template, Mapping) or not template:
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


def _dtype_str(dtype: np.dtype) -> str:
    """``dtype`` as the layout stores it: its ``str`` (byte order and size), bfloat16 by name (its ``str``, ``<V2``,
    would read back as raw bytes)."""
    return "bfloat16" if dtype.kind == "V" and dtype.name == "bfloat16" else dtype.str


def layout_json(layout: dict, steps_per_slot: int) -> bytes:
    """The layout as the segment stores it (and hashes it, to check attachers' templates)."""
    fields = []
    for name, f in layout.items():
        parts = [f.values, f.lengths] if isinstance(f, Padded) else [f]
        fields.append([name, isinstance(f, Padded), [[list(s), _dtype_str(d)] for s, d in parts]])
    return json.dumps({"steps_per_slot": steps_per_slot, "fields": fields}, separators=(",", ":")).encode()


def layout_from_json(data: bytes) -> tuple[dict, int]:
    """(layout, steps_per_slot) from :func:`layout_json`'s bytes."""
    doc = json.loads(data)
    layout = {}
    for name, padded, parts in doc["fields"]:
        parts = [(tuple(s), numpy_dtype(d)) for s, d in parts]
        layout[name] = Padded(*parts) if padded else parts[0]
    return layout, int(doc["steps_per_slot"])


def slot_plan(layout: dict, steps_per_slot: int) -> tuple[list, int]:
    """[(name, padded, [(offset, shape, dtype), ...])] within a slot, and the slot's size."""
    plan, offset = [], 0
    lead = (steps_per_slot,) if steps_per_slot > 1 else ()
    for name, f in layout.items():
        parts = []
        for shape, dtype in ([f.values, f.lengths] if isinstance(f, Padded) else [f]):
            full = lead + shape
            parts.append((offset, full, dtype))
            offset = align(offset + int(np.prod(full, dtype=np.int64)) * dtype.itemsize)
        plan.append((name, isinstance(f, Padded), parts))
    return plan, max(offset, ALIGN)


class SegmentPlan(NamedTuple):
    """Byte offsets of a segment's parts, and its total size (a multiple of the page size)."""

    layout: int
    meta: int
    semaphores: int
    table: int
    workers: int
    error: int
    data: int
    total: int


def segment_plan(layout_bytes: int, meta_bytes: int, slots: int, slot_size: int, max_workers: int) -> SegmentPlan:
    """Where each part of a segment for ``slots`` slots of ``slot_size`` bytes goes: two semaphores a slot
    (free, filled) and one that claims the error record; the slots start on a page boundary."""
    meta = align(HEADER_SIZE + layout_bytes)
    semaphores = align(meta + meta_bytes)
    table = align(semaphores + (2 * slots + 1) * SEM_STRIDE)
    workers = align(table + slots * SLOT.itemsize)
    error = align(workers + max_workers * WORKER.itemsize)
    page = os.sysconf("SC_PAGE_SIZE")
    data = align(error + ERROR.itemsize, page)
    total = align(data + slots * slot_size, page)
    return SegmentPlan(HEADER_SIZE, meta, semaphores, table, workers, error, data, total)


def header_problem(h, size: int) -> str:
    """What is wrong with header ``h`` (a :data:`HEADER` record) of a segment of ``size`` bytes, or "".

    A damaged or hostile header must fail with a message, not as numpy's out-of-range errors later.
    """
    slots, workers, slot_size = int(h["slots"]), int(h["max_workers"]), int(h["slot_size"])
    if slots < 1 or workers < 1 or int(h["steps_per_slot"]) < 1:
        return f"slots={slots}, max_workers={workers}, steps_per_slot={int(h['steps_per_slot'])}"
    parts = {"layout": (int(h["layout_offset"]), int(h["layout_len"])),
             "meta": (int(h["meta_offset"]), int(h["meta_len"])),
             "semaphores": (int(h["sem_offset"]), (2 * slots + 1) * SEM_STRIDE),
             "slot table": (int(h["table_offset"]), slots * SLOT.itemsize),
             "worker table": (int(h["workers_offset"]), workers * WORKER.itemsize),
             "error record": (int(h["error_offset"]), ERROR.itemsize),
             "slots": (int(h["data_offset"]), slots * slot_size)}
    for part, (offset, length) in parts.items():
        if offset < HEADER_SIZE or offset + length > size or (part != "layout" and part != "meta" and offset % 8):
            return f"its {part} ({length} bytes at offset {offset}) do not fit a {size}-byte segment"
    return ""
