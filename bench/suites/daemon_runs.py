"""A daemon's run as the suites time it: :class:`DaemonCase` (one run of ``infeed.Daemon`` over a dataset to its
end, keeping its steady state's time, its start-up and its stage shares) and :func:`steady_figure` (that steady
state as a figure). Shared by the suites that time the daemon: ``infeed``, ``images``, ``remote``, ``grain``."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import infeed
from bench.harness import Case, Measurement

__all__ = ["DaemonCase", "steady_figure", "framed_sizes", "SLOTS", "WARMUP"]

#: The ring's slots a daemon runs with unless told.
SLOTS = 8
#: Untimed runs of every case before the timed ones (a case's first runs, left out of its figures).
WARMUP = 1


class DaemonCase:
    """One daemon run over a dataset to its end, as a :class:`~bench.harness.Case`; keeps each run's inner times.

    The harness times the whole of ``run`` (workers started and stopped
    included); the figures come from the times kept here instead:

    - ``steady``: the time batches W..N-1 take once every worker has started
      (the file must have more than W batches: see
      :func:`~bench.harness.steady_refusal`). Batches go to whichever worker is
      free, so a worker that starts late takes none at first: from batch W
      (with ``work``, from the end of its work on batch W-1) the run takes
      batches until every worker has registered, and the time from then to the
      end is scaled to all of batches W..N-1. Where the others make every
      batch before a worker starts, it is the time from batch W;
    - ``after_made``: from ``Daemon(...)`` returning to the end (every batch);
    - ``first``, ``every``: from the ``Daemon(...)`` call to the first batch, and
      to the steady state's start (every worker started, or batch W); without
      ``work`` only;
    - ``cpu``: this process's CPU seconds over the steady wall time; without ``work`` only.
    """

    def __init__(self, name: str, dataset: infeed.Dataset, workers: int, work: Callable[[], None] | None = None,
                 slots: int = SLOTS, started: Callable[[infeed.Daemon], None] | None = None):
        self.name, self.dataset, self.workers, self.slots = name, dataset, workers, slots
        self.work = work                   # called after each batch taken: the consumer's work (infeed_suite.Work)
        self.started = started             # called with the daemon as soon as it is made (its workers started)
        self.steady: list[float] = []
        self.after_made: list[float] = []
        self.first: list[float] = []
        self.every: list[float] = []
        self.cpu: list[float] = []
        self.stages: list = []             # infeed.InputStats over each run's steady state
        self.spin = None

    def run(self) -> int:
        work = self.work
        called = time.perf_counter()
        with infeed.Daemon(self.dataset, num_workers=self.workers, slots=self.slots, lock_memory=False) as feed:
            if self.started is not None:
                self.started(feed)
            made = time.perf_counter()
            self.spin = getattr(feed, "spin", None)
            for k in range(self.workers):
                next(feed)
                if k == 0:
                    first = time.perf_counter()
                if work is not None:
                    work()
            # Batches go to whichever worker is free, so one that starts late takes none at first: the steady
            # state begins once every worker has started (the batches before are scaled out of its time), or
            # from batch W where the others made every batch before that.
            from_w = window = (feed.stats(), time.perf_counter(), time.process_time(), 0)
            steady_batches = 0
            for batch in feed:
                if work is not None:
                    work()
                steady_batches += 1
                if len(window[0].workers) < self.workers:
                    window = (feed.stats(), time.perf_counter(), time.process_time(), steady_batches)
            end, cpu1 = time.perf_counter(), time.process_time()
            if len(window[0].workers) < self.workers or window[3] == steady_batches:
                window = from_w
            before, start, cpu0, early = window
            self.stages.append(feed.stats().since(before))
            taken = feed.ring.consumer_counters()["taken"]
        self.steady.append((end - start) * steady_batches / max(steady_batches - early, 1))
        self.after_made.append(end - made)
        if work is None:
            self.first.append(first - called)
            self.every.append(start - called)
            self.cpu.append((cpu1 - cpu0) / (end - start))
        return taken * self.dataset.batch_size

    def case(self, records: int, nbytes: int) -> Case:
        return Case(self.name, self.run, records, nbytes)

    def median_stages(self):
        """The stage breakdown of the timed run whose steady state took the median time."""
        runs = sorted(zip(self.steady[WARMUP:], self.stages[WARMUP:]), key=lambda r: r[0])
        return runs[len(runs) // 2][1]


def framed_sizes(path: str) -> list[int]:
    """Each record's bytes in the file, TFRecord framing (16 bytes) included."""
    with infeed.read_records(path) as reader:
        return [len(r) + 16 for r in reader]




def steady_figure(c: DaemonCase, name: str, group: str, sizes: list[int], b: int, n_batches: int, suite: str):
    """The figure of a case's steady state, batches W..N-1, in ``suite``'s results."""
    w = c.workers
    case = Case(name, c.run, (n_batches - w) * b, sum(sizes[w * b:n_batches * b]))
    return dataclasses.replace(Measurement(case, c.steady[WARMUP:]).figure(suite, group), batches=n_batches - w,
                               steady=True)
