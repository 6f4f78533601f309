"""The hand-off protocol between a ring's producers and its consumer: a slot's states, the flags a
producer publishes with it, how often a waiter checks its peer, and the exit status of a producer whose
failure is in the ring."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["FREE", "WRITING", "FILLED", "READING", "STATE_NAMES", "SLOT_ERROR", "SLOT_END", "CHECK_INTERVAL",
           "REPORTED_ERROR", "SlotInfo"]

#: Slot states, as the slot table records them (for stats and debugging).
FREE, WRITING, FILLED, READING = 0, 1, 2, 3
STATE_NAMES = {FREE: "free", WRITING: "writing", FILLED: "filled", READING: "reading"}

#: Slot flags: the producer failed at this slot (its failure is the ring's error record); the data ended before it.
SLOT_ERROR, SLOT_END = 1, 2

#: How often a waiter wakes to check its peer is alive (seconds; it wakes at once on a post).
CHECK_INTERVAL = 0.1

#: Exit status of a producer process that stopped after writing its failure into the ring.
REPORTED_ERROR = 3


class SlotInfo(NamedTuple):
    """What a producer published with a slot (:meth:`~infeed.ring.Ring.publish`)."""

    seq: int
    flags: int
    steps: int
    cursor: tuple[int, int]
