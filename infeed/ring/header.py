"""A ring's header, written by its creator and checked by whoever attaches.

The creator writes the header, the layout, the meta bytes, the slot table and the semaphores into its new
segment (:func:`write_header`), and marks the header ``READY`` last, once its :class:`~infeed.ring.Ring`
reads them. An attacher opens the segment without following a link (:func:`open_segment`) and maps it only
once it passes every check (:func:`map_checked`); each failed check is an :class:`~infeed.AttachError`
naming it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from typing import Any, Mapping

import numpy as np

from infeed.errors import AttachError
from infeed.ring import _ring
from infeed.ring.layout import (HEADER, HEADER_SIZE, MAGIC, READY, SEM_STRIDE, SLOT, VERSION, SegmentPlan,
                                header_problem, layout_json, layout_of)
from infeed.ring.segments import SHM_DIR

__all__ = ["write_header", "open_segment", "map_checked"]


def write_header(mapping, plan: SegmentPlan, layout_bytes: bytes, meta: bytes, *, slots: int, slot_size: int,
                 steps_per_slot: int, max_workers: int) -> None:
    """Writes a new ring into ``mapping`` (a new segment laid out as ``plan``), all but its ``READY`` state:
    the header, the layout and meta bytes, the slot table, and the semaphores (each slot's free and filled,
    then the error record's claim)."""
    buf = np.frombuffer(mapping, np.uint8)
    h = np.frombuffer(mapping, HEADER, 1)[0]
    h["magic"], h["version"], h["layout_hash"] = MAGIC, VERSION, hashlib.sha256(layout_bytes).digest()
    h["slots"], h["max_workers"], h["slot_size"] = slots, max_workers, slot_size
    h["creator_pid"], h["creator_uid"], h["steps_per_slot"] = os.getpid(), os.getuid(), steps_per_slot
    h["created_unix_ns"], h["started_ns"] = time.time_ns(), time.monotonic_ns()
    h["data_offset"], h["total_size"] = plan.data, plan.total
    h["layout_offset"], h["layout_len"] = plan.layout, len(layout_bytes)
    h["sem_offset"], h["table_offset"] = plan.semaphores, plan.table
    h["workers_offset"], h["error_offset"] = plan.workers, plan.error
    buf[plan.layout:plan.layout + len(layout_bytes)] = np.frombuffer(layout_bytes, np.uint8)
    h["meta_offset"], h["meta_len"] = plan.meta, len(meta)
    buf[plan.meta:plan.meta + len(meta)] = np.frombuffer(meta, np.uint8)
    table = np.frombuffer(mapping, SLOT, slots, plan.table)
    table["seq"] = -1                    # no unit yet: unit i is the first of slot i (Ring.acquire_turn)
    for i in range(slots):
        mapping.sem_init(plan.semaphores + (2 * i) * SEM_STRIDE, 1)      # free
        mapping.sem_init(plan.semaphores + (2 * i + 1) * SEM_STRIDE, 0)  # filled
    mapping.sem_init(plan.semaphores + 2 * slots * SEM_STRIDE, 1)        # error-record claim


def open_segment(name: str) -> tuple[str, int]:
    """(path, fd) of the segment named ``name``, opened for reading and writing, never through a link."""
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise AttachError(name, "name", "a segment name without '/'", name)
    path = os.path.join(SHM_DIR, name)
    try:
        return path, os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AttachError(name, "exists", f"a segment in {SHM_DIR}", "none") from None
    except OSError as exc:
        raise AttachError(name, "exists", "a segment this user can open", exc.strerror) from None


def map_checked(name: str, fd: int, template: Mapping[str, Any] | None, steps_per_slot: int | None,
                populate: bool):
    """The mapping of segment ``fd`` (``name``), once it passes :meth:`Ring.attach <infeed.ring.Ring.attach>`'s
    checks: this user's, mode 0600, this version's magic and a consistent header, fully created, and (when
    ``template`` or ``steps_per_slot`` is given) laid out as they say."""
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
    return mapping
