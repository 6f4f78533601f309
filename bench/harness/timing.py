"""How a suite times its cases: interleaved, with the garbage collector off, the allocator settled, pinned to one
CPU where asked.

A suite builds :class:`Case` s (a function doing a known amount of work) and
hands them to :func:`interleave`, which runs a warm-up pass and then the
repeats in turn (A B C A B C ...), so that a noisy neighbour slows every case
alike instead of one. Each :class:`Measurement` gives a
:class:`~bench.harness.results.Figure`.

>>> case = Case("sum", lambda: sum(range(1000)) and 1000, records=1000, nbytes=8000)
>>> [fig] = [m.figure("doc", "demo") for m in interleave([case], repeats=3)]
>>> fig.repeats
3
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from bench.harness.results import Figure

__all__ = ["Case", "Measurement", "heap_frozen", "interleave", "settle_allocator", "pinned_to_one_cpu", "log"]


def log(message: str) -> None:
    """Progress for the person watching (stderr, so stdout stays the report)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Case:
    """One thing to time.

    name: what the table calls it.
    run: does the work once and returns how many records it handled, which
        must equal ``records`` (so a broken case fails instead of looking fast).
    records: records per run.
    nbytes: bytes per run, for MB/s (for file readers: the file's size).
    """

    name: str
    run: Callable[[], int]
    records: int
    nbytes: int


@dataclass
class Measurement:
    """The seconds each repeat of a case took."""

    case: Case
    seconds: list[float] = field(default_factory=list)

    def figure(self, suite: str, group: str) -> Figure:
        return Figure(suite=suite, group=group, name=self.case.name, records=self.case.records,
                      nbytes=self.case.nbytes, repeats=len(self.seconds),
                      seconds_median=statistics.median(self.seconds),
                      seconds_min=min(self.seconds), seconds_max=max(self.seconds), runs=tuple(self.seconds))


def interleave(cases: Sequence[Case], repeats: int, warmup: int = 1) -> list[Measurement]:
    """Runs ``warmup`` untimed passes, then ``repeats`` timed passes over all cases in turn.

    The garbage collector is off while a case runs (as in ``timeit``) and a
    collection runs between cases, so one case's garbage is not another's cost.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    out = [Measurement(c) for c in cases]
    with heap_frozen():
        for rep in range(warmup + repeats):
            for m in out:
                gc.collect()
                was_enabled = gc.isenabled()
                gc.disable()
                try:
                    t0 = time.perf_counter()
                    done = m.case.run()
                    dt = time.perf_counter() - t0
                finally:
                    if was_enabled:
                        gc.enable()
                if done != m.case.records:
                    raise RuntimeError(f"case {m.case.name!r} handled {done} records, expected {m.case.records}")
                if rep >= warmup:
                    m.seconds.append(dt)
    return out


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Collects once, then moves every object alive out of the collector's sight (``gc.freeze``) until the end,
    so that the collections between timed runs look only at what the runs made: over a large heap (a bench
    that loaded its data, or one run by the test suite's process, 34 ms each) a full collection costs more than
    many of the runs it separates."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def settle_allocator(nbytes: int = 24 << 20) -> None:
    """Allocates and frees one large block, so that malloc is in a long-running process's state.

    glibc raises its mmap and trim thresholds the first time a large mmapped
    block is freed (any process that has freed a big numpy array has done
    so).  Before that, memory freed at the top of the heap goes back to the OS
    at once, and a pipeline that holds a batch of large records (imagenet:
    128 x 110 KB) page-faults its next batch back in: about twice as slow.
    Settling first makes a figure independent of what ran before it in the
    process (for instance whether TensorFlow's rows ran).
    """
    import numpy as np

    block = np.ones(nbytes, np.uint8)
    del block


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def _set_affinity_all_threads(cpus) -> None:
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:          # a thread that ended meanwhile
            pass


@contextlib.contextmanager
def pinned_to_one_cpu(cpu: int | None = None) -> Iterator[int | None]:
    """Pins every thread of this process (and so every thread started inside) to one CPU.

    ``cpu`` defaults to the last CPU this process may use.  Yields the CPU, or
    None where the OS has no ``sched_setaffinity`` (the figures then say so).
    The previous affinity is restored on exit, for all threads.
    """
    if not hasattr(os, "sched_setaffinity"):
        yield None
        return
    before = os.sched_getaffinity(0)
    if cpu is None:
        cpu = max(before)
    elif cpu not in before:
        raise ValueError(f"cpu {cpu} is not one this process may use ({sorted(before)})")
    _set_affinity_all_threads({cpu})
    try:
        yield cpu
    finally:
        _set_affinity_all_threads(before)
