"""Aligned host memory for the CPU backend's copies, reused only once nothing can still read it.

On CPU devices, ``jax.device_put`` of 64-byte aligned numpy memory returns
device arrays that alias it, and the CPU client keeps a reference to the numpy
array it aliases until the last device array on it, and every computation
reading it, is gone. :class:`HostBuffers` hands out each copy as a view of a
*lease*: a small object made for that one copy, over memory the pool keeps.
Every view of the copy (``copy[1:]``, ``.reshape``, ``np.asarray`` of it, the
client's reference) leads back to the lease through numpy's ``base``, so the
lease lives exactly as long as anything that can read the memory, and a
``weakref.finalize`` on it gives the memory back to the pool when it goes.

This rests on what Python guarantees (an object is finalized only once nothing
references it) and counts no references: an interpreter whose counts differ
(Python 3.14's borrowed references) cannot make memory in use look free.

>>> import numpy as np
>>> pool = HostBuffers(per_size=2)
>>> first = pool.copy(np.arange(4.0))
>>> view = first[1:]
>>> del first
>>> second = pool.copy(np.ones(4))        # ``view`` still reads the first copy's memory
>>> view.tolist(), pool.reused
([1.0, 2.0, 3.0], 0)
>>> del view
>>> third = pool.copy(np.zeros(4))        # the first memory is free again
>>> pool.reused, pool.allocated
(1, 2)
"""

from __future__ import annotations

import collections
import threading
import weakref

import numpy as np

__all__ = ["ALIGN", "HostBuffers"]

#: Byte alignment of host copies: XLA's CPU client uses such memory in place instead of copying it again.
ALIGN = 64


class _Lease:
    """One copy's hold on pool memory: numpy's ``base`` of every view of that copy."""

    __slots__ = ("__array_interface__", "memory", "__weakref__")

    def __init__(self, memory: np.ndarray, start: int, nbytes: int):
        self.memory = memory                     # keeps the memory alive whatever the pool does
        self.__array_interface__ = {"data": (memory.ctypes.data + start, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}


class HostBuffers:
    """Host memory aligned to :data:`ALIGN` bytes, reused once no view of an earlier copy in it is alive.

    Up to ``per_size`` buffers of each size are kept; beyond that a copy gets
    memory of its own, freed with it. Thread-safe: a lease may be finalized on
    whatever thread drops its last reference.
    """

    def __init__(self, per_size: int):
        if isinstance(per_size, bool) or not isinstance(per_size, int) or per_size < 0:
            raise ValueError(f"per_size must be an int >= 0, got {per_size!r}")
        self.per_size = per_size
        self._free: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._kept: collections.Counter = collections.Counter()
        self._lock = threading.Lock()
        #: Copies made into reused memory, and into new memory.
        self.reused = self.allocated = 0

    def copy(self, leaf: np.ndarray) -> np.ndarray:
        """A copy of ``leaf`` in aligned memory that no live array shares."""
        nbytes = leaf.nbytes
        try:
            memory, keep = self._free[nbytes].pop(), True    # deque.pop is atomic: no lock a finalizer could need
            self.reused += 1
        except IndexError:
            memory = np.empty(nbytes + ALIGN, np.uint8)
            with self._lock:
                keep = self._kept[nbytes] < self.per_size
                self._kept[nbytes] += keep
            self.allocated += 1
        lease = _Lease(memory, -memory.ctypes.data % ALIGN, nbytes)
        if keep:
            weakref.finalize(lease, self._free[nbytes].append, memory).atexit = False
        out = np.asarray(lease).view(leaf.dtype).reshape(leaf.shape)
        np.copyto(out, leaf)
        return out

    def free_count(self, nbytes: int) -> int:
        """How many kept buffers of ``nbytes`` no copy uses now."""
        return len(self._free.get(nbytes, ()))
