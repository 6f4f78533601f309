"""A ring's error record: the first failure of any producer, claimed through a semaphore of its own so that
one failure is kept whole, and read back by the consumer as a :class:`~infeed.ring.failures.ProducerFailure`
(the record's encoding, JSON and never a pickle, is :mod:`infeed.ring.failures`')."""

from __future__ import annotations

import os
import time

import numpy as np

from infeed.ring.failures import ProducerFailure, decode_failure, encode_failure
from infeed.ring.layout import ERROR_PAYLOAD, SEM_STRIDE
from infeed.ring.slots import CHECK_INTERVAL

__all__ = ["ErrorRecord"]


class ErrorRecord:
    """The error record's methods of :class:`~infeed.ring.Ring`, which mixes them in. They use the ring's
    ``_error`` (the record, an :data:`~infeed.ring.layout.ERROR` record) and its claim, the semaphore after
    the slots' (``_map``, ``_sems``, ``slots``)."""

    def set_error(self, error: BaseException | str, pid: int | None = None, signal: int | None = None,
                  unit: int | None = None) -> bool:
        """Records the first failure (an exception or a message); False if one was there.

        ``unit``: the unit (batch) the producer was at when it failed, where it failed at one (None: before
        any, such as while it started).

        Exceptions travel as JSON (type, constructor arguments, traceback text), never
        as pickles: the reader rebuilds infeed's own errors and built-in exception
        types, and keeps the message for anything else. When another process claimed
        the record first, this returns once that one is readable (or after
        :data:`~infeed.ring.slots.CHECK_INTERVAL` s, should that process have died while writing it), so a
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
