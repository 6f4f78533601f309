"""The ``infeed`` suite: the decoding daemon (``infeed.Daemon``) against decoding in the trainer's process.

Per layout (see :mod:`bench.data.datasets`; written by ``ensure_dataset`` as for
``bench decode``, so a shared ``--data-dir`` reuses them, but with at least 32
batches so that the ring of 8 slots turns over: imagenet has 4,096 records
here, 1,024 there; and with at least
:func:`~bench.harness.daemon_batches` of the largest W asked: W batches to
start, then :data:`~bench.harness.STEADY_BATCHES_PER_WORKER` (8) per worker),
it times, interleaved (A B C A B C ...):

- ``parse (1 process)``: ``read_batch(B)`` and ``ExampleParser.parse`` into
  one preallocated batch in this process (``bench decode``'s ``infeed read +
  parse`` case, reused): the single-process decode rate, the baseline.
- ``parse (W processes at once)``, for each W > 1: the same parse, by W
  processes at the same time, each over the whole file (started before
  timing: :mod:`bench.peers.parallel_parse`): what this machine gives W decoders
  that share nothing, the bound for W workers. W=2 is judged against it.
- ``daemon W=w``: ``infeed.Daemon(infeed.Dataset(file, spec, batch_size=B,
  num_epochs=1), num_workers=w, slots=8, lock_memory=False)`` and a consumer
  that only takes every batch (``for batch in feed: pass``). The rate is the
  steady state, once every worker runs: from the arrival of batch W (the
  last worker's first; the slots the others filled meanwhile count in it) to
  the end of the data, batches W+1..N: at least 8 per worker (a W whose
  file is shorter, a small ``--scale``, has every row refused, the reason
  printed in place of its numbers, and no ratio). ``daemon W=w incl. start-up`` times
  the same runs from just after ``Daemon(...)`` returns (every batch), and
  the timing ``start-up W=w`` is the time from the ``Daemon(...)`` call to the
  first batch (ring creation, the worker's interpreter start and imports, the
  first batch's decode); for W > 1 a second one runs to batch W, one from
  every worker (they start one after another and share the CPUs).
- ``daemon W=w, indexed``: the same through a hard link of the file with an
  ``infeed index`` sidecar, so that each worker reads only its own batches
  (a batch's records with one ``pread``), where without one it passes the
  other workers' batches by their framing.
- ``daemon W=w, as by default`` (W >= 2): the file with no sidecar, as most users' are, through a ``Dataset``
  left at its defaults (``build_indexes="auto"``): its first run (the untimed warm-up) builds the index into the
  run's own index directory, and the timed runs read through it. Against ``indexed`` it is the cost of having
  no index by hand: equal within the noise once built.
- ``daemon W=w, busy consumer``: the consumer works for a fixed time per batch
  (``B / parse rate``: the single-process decode time of one batch, measured
  by the ``parse`` rows first), so that with W=1 consumer and worker are about
  equally fast. The work is a sleep (a trainer waiting for its accelerator),
  shortened by the sleep's usual overshoot and finished by a short spin, a
  late wake-up paid back by the next batches' work (see :class:`Work`): it
  averages the set time without taking a CPU from the workers (spinning would
  leave W=2 one CPU on a 2-CPU machine). Rated as the steady state above,
  from the end of batch W's work, in batches/s. Timed for every worker count
  and every ring size of ``slots`` (default 2, 4, 8 and 16 slots; the rows of
  other sizes than 8 are ``daemon W=w, S slots, busy consumer``), all
  interleaved: what a deeper ring buys when the consumer's pace varies.

And the timings (lower is better):

- ``consumer CPU share W=w``: ``time.process_time()`` of this process over the
  wall time of a do-nothing ``daemon W=w`` run's steady state: what being fed
  costs the trainer (the workers are other processes).
- ``hand-off``: a daemon (W=1, 8 slots, ``batch_size=1``) is left to fill every
  slot, then ``next(feed)`` is timed for each batch already waiting (which
  also hands the previous slot back to the workers); repeated, in
  microseconds. The target is below 50 us.

With two or more W, a scaling table per layout (:meth:`~bench.harness.SuiteResult.add_scaling`): the
``daemon W=w`` rows' records/s, speed-up over W=1, efficiency (speed-up / W)
and stage shares at each W, what ``parse (W processes at once)`` gains over
``parse (1 process)`` and the daemon's share of that, a W above the CPUs marked
oversubscribed.

Before timing, the daemon's first two batches (W = the most workers asked
for) are checked against ``ExampleParser.parse`` of the same records. With
``--quick`` (32 batches of mnist and criteo, 9 W of imagenet for the largest
W) a steady state lasts milliseconds and the ring's first pass (its pages
touched for the first time) weighs in: a smoke run, not figures to quote.

The consumer keeps ``Feed``'s default polling (``Feed.spin``, which depends on
the CPUs and W); the notes give it for each W.

The consumer is not pinned to a CPU for the daemon rows (the workers inherit
its affinity, and need the other cores), and so that the comparison is fair
the ``parse`` baseline runs unpinned too: everything in this suite is
unpinned, unlike ``bench decode``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import statistics
import time
from collections.abc import Mapping, Sequence

import numpy as np

import infeed
from bench.data import datasets
from bench.harness import (STEADY_BATCHES_PER_WORKER, Case, Measurement, SuiteResult, Timing, cpus_allowed,
                           daemon_batches, interleave, log, settle_allocator, stage_breakdown, steady_refusal)
from bench.peers.parallel_parse import ParallelParse
from bench.suites import decode_suite
from bench.suites.daemon_runs import SLOTS, WARMUP, DaemonCase, framed_sizes, steady_figure

__all__ = ["run", "record_count", "daemon_name", "default_name", "startup_name", "busy_name", "startup_timing",
           "every_worker_timing", "cpu_timing", "Work", "sleep_overshoot", "check_same_batches",
           "handoff_samples", "BATCH_SIZE", "SLOTS", "SLOT_SWEEP", "WORKERS", "MIN_BATCHES", "SMALLEST",
           "PARSE", "HANDOFF", "HANDOFF_TARGET_US", "TARGETS", "target_of",
           "parallel_name", "scaling_name"]

SUITE = "infeed"
BATCH_SIZE = decode_suite.BATCH_SIZE
WORKERS = (1, 2)
#: Ring sizes the busy consumer's rows are timed with (SLOTS among them: the rows every other figure compares).
SLOT_SWEEP = (2, 4, 8, 16)
#: The fewest batches a layout's dataset has in a full run: enough for the 8-slot ring to turn over.
MIN_BATCHES = 32
#: Batches every dataset has at least: below ``SMALLEST * batch_size`` records (a tiny --scale) the batch shrinks.
SMALLEST = 4
#: Hand-off rounds per repeat (each round times up to ``SLOTS - 1`` batches).
HANDOFF_ROUNDS = 30
HANDOFF_TARGET_US = 50.0
#: Seconds to wait for the workers to fill the ring before a hand-off round gives up.
FILL_TIMEOUT = 30.0

PARSE = "parse (1 process)"
HANDOFF = "hand-off: next(feed), batch waiting (B=1)"

#: (numerator, denominator) -> (minimum ratio of the medians, whether it must be exceeded, the layouts it holds
#: for or None for all). W=2 against W=1, and that gain over what the machine gives two decoders that share
#: nothing (``parse (2 processes at once)`` over ``parse (1 process)``), are information here: these layouts'
#: batches take 60-150 us to decode, so on two CPUs a third process (the consumer, woken per batch) and each
#: worker passing the other's records cost as much as a fifth of the machine (docs/diagnostics.md). A second
#: worker is judged where decoding is the work, JPEG images (``bench images``: W=2 / W=1 >= 1.7x).
TARGETS = {("daemon W=1", PARSE): (0.95, False, None)}


def parallel_name(processes: int) -> str:
    return f"parse ({processes} processes at once)"


def scaling_name(workers: int) -> str:
    """The ratio of W workers' gain over one to what W independent decoders gain on this machine."""
    return f"{daemon_name(workers)} / {daemon_name(1)}, over {parallel_name(workers)} / {PARSE}"


def target_of(num: str, den: str, layout: str) -> tuple[float | None, bool]:
    """(minimum ratio, strict) of ``num / den`` on ``layout``; (None, False) when none is set."""
    target, strict, layouts = TARGETS.get((num, den), (None, False, None))
    if target is None or (layouts is not None and layout not in layouts):
        return None, False
    return target, strict


def daemon_name(workers: int) -> str:
    return f"daemon W={workers}"


def indexed_name(workers: int) -> str:
    return f"daemon W={workers}, indexed"


def default_name(workers: int) -> str:
    return f"daemon W={workers}, as by default"


def _by_default(workers: list[int]) -> list[int]:
    """The worker counts whose ``as by default`` row is timed: where the default builds an index (else it is
    the streamed row itself)."""
    return [w for w in workers if w >= infeed.daemon.dataset.LOCAL_BUILD_WORKERS]


def startup_name(workers: int) -> str:
    return f"daemon W={workers} incl. start-up"


def busy_name(workers: int, slots: int = SLOTS) -> str:
    ring = "" if slots == SLOTS else f", {slots} slots"
    return f"daemon W={workers}{ring}, busy consumer"


def startup_timing(workers: int) -> str:
    return f"start-up W={workers}: Daemon() to 1st batch"


def every_worker_timing(workers: int) -> str:
    return f"start-up W={workers}: to every worker started"


def cpu_timing(workers: int) -> str:
    return f"consumer CPU share W={workers}"


def record_count(layout: datasets.Layout, *, scale: float = 1.0, quick: bool = False,
                 batch_size: int = BATCH_SIZE, workers: int = 1) -> int:
    """Records of ``layout`` this suite reads: the decode suite's count, at least :data:`MIN_BATCHES` batches
    (not with --quick) and :func:`~bench.harness.daemon_batches` of ``workers`` (the largest W asked), times
    ``scale``; never fewer than :data:`SMALLEST`."""
    base = layout.quick_records if quick else max(layout.records, MIN_BATCHES * batch_size)
    return max(SMALLEST, round(max(base, daemon_batches(workers) * batch_size) * scale))


# --- the consumer's work ---------------------------------------------------------------------------

def sleep_overshoot(samples: int = 50) -> float:
    """The median seconds ``time.sleep`` oversleeps a short request by (timer slack, wake-up)."""
    request = 20e-6
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        time.sleep(request)
        out.append(time.perf_counter() - t - request)
    return max(statistics.median(out), 0.0)


class Work:
    """A consumer's work per batch: ``seconds`` on average, mostly asleep.

    Each call sleeps its budget less the sleep's expected overshoot (timer
    slack, wake-up latency; a moving average of what the sleeps take, from
    ``overshoot``) and spins to the deadline. A sleep that overshoots anyway
    (a wake-up delayed while the workers hold every CPU) is a debt that the
    next calls' budgets pay back, so the work averages ``seconds`` per batch;
    time spent waiting for a batch is never work. ``total / calls`` is what
    it lasted, ``slept / calls`` the part asleep.
    """

    #: Shortest sleep worth asking for; below it the work only spins.
    MIN_SLEEP = 10e-6

    def __init__(self, seconds: float, overshoot: float):
        self.seconds, self.overshoot = seconds, overshoot
        self.total, self.calls, self.slept, self.debt = 0.0, 0, 0.0, 0.0

    def __call__(self) -> None:
        start = time.perf_counter()
        budget = max(self.seconds - self.debt, 0.0)
        deadline = start + budget
        request = budget - self.overshoot
        if request >= self.MIN_SLEEP:
            time.sleep(request)
            slept = time.perf_counter() - start
            self.slept += slept
            self.overshoot += 0.05 * (min(slept - request, self.seconds) - self.overshoot)
        while (now := time.perf_counter()) < deadline:
            pass
        took = now - start
        self.debt += took - self.seconds
        self.total += took
        self.calls += 1


def _same(a, b) -> bool:
    if isinstance(a, infeed.Padded):
        return np.array_equal(a.lengths, b.lengths) and all(
            np.array_equal(x[:n], y[:n]) for x, y, n in zip(a.values, b.values, a.lengths))
    return np.array_equal(a, b)


def check_same_batches(ds: datasets.Dataset, dataset: infeed.Dataset, workers: int, batches: int = 2) -> None:
    """The daemon's first batches hold what parsing the file's first records gives, or its figures mean nothing."""
    spec, b = dataset.features, dataset.batch_size
    with infeed.read_records(ds.path) as reader:
        records = [bytes(r) for r in itertools.islice(reader, batches * b)]
    with infeed.Daemon(dataset, num_workers=workers, slots=SLOTS, lock_memory=False) as feed:
        for k, batch in zip(range(batches), feed):
            want = infeed.parse_examples(records[k * b:(k + 1) * b], spec)
            for name in spec:
                if not _same(want[name], batch[name]):
                    raise RuntimeError(f"{ds.layout.name}: the daemon (W={workers}) decodes {name!r} of batch {k} "
                                       "differently from ExampleParser.parse")


def handoff_samples(path: str, spec: Mapping, rounds: int, slots: int = SLOTS) -> list[float]:
    """Microseconds of ``next(feed)`` for batches already waiting in a full ring (B=1, W=1).

    Round 0 (the first ``slots`` batches) is a warm-up; each later round waits
    until the workers have refilled every slot but the one the consumer holds,
    then times ``slots - 1`` calls.
    """
    dataset = infeed.Dataset(path, spec, batch_size=1, num_epochs=1)
    samples: list[float] = []
    with infeed.Daemon(dataset, num_workers=1, slots=slots, lock_memory=False) as feed:
        ring = feed.ring
        for r in range(rounds + 1):
            want = ring.slots - (1 if r else 0)       # the slot the consumer holds is "reading"
            deadline = time.monotonic() + FILL_TIMEOUT
            while sum(ring.slot_state(i)[0] == "filled" for i in range(ring.slots)) < want:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"hand-off: the worker did not fill {want} slots in {FILL_TIMEOUT} s")
                time.sleep(0.0002)
            for _ in range(want):
                t0 = time.perf_counter_ns()
                next(feed)
                dt = time.perf_counter_ns() - t0
                if r:
                    samples.append(dt / 1e3)
    return samples


# --- the suite -------------------------------------------------------------------------------------

def run(layouts: Sequence[str] = tuple(datasets.LAYOUTS), *, workers: Sequence[int] = WORKERS,
        slots: Sequence[int] = SLOT_SWEEP, records: Mapping[str, int] | None = None, scale: float = 1.0,
        quick: bool = False, repeats: int | None = None, data_dir=None, seed: int = 0,
        batch_size: int = BATCH_SIZE) -> SuiteResult:
    """Measures every layout; returns the figures, timings, ratios against TARGETS and notes.

    workers: the worker counts to run the daemon with (each a positive int).
    slots: the ring sizes the busy consumer's rows run with (:data:`SLOTS` is always among them).
    records: per-layout record counts; a layout not named gets :func:`record_count`'s.
    repeats: timed runs per case (default 7, 3 with ``quick``); one untimed warm-up run precedes them.
    data_dir: where the files go and are reused from; default a temporary directory, removed after.
    """
    unknown = [name for name in layouts if name not in datasets.LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {sorted(datasets.LAYOUTS)}")
    workers = list(dict.fromkeys(workers))
    if not workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in workers):
        raise ValueError(f"workers must be positive ints, got {workers!r}")
    slots = sorted({SLOTS, *slots})
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in slots):
        raise ValueError(f"slots must be positive ints, got {slots!r}")
    repeats = repeats if repeats is not None else (3 if quick else 7)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    counts = {name: int((records or {}).get(name, record_count(datasets.LAYOUTS[name], scale=scale, quick=quick,
                                                                batch_size=batch_size, workers=max(workers))))
              for name in layouts}
    sizes = {name: min(batch_size, max(1, counts[name] // SMALLEST)) for name in layouts}
    result = SuiteResult(SUITE, group_label="layout", name_label="pipeline",
                         params={"layouts": list(layouts), "records": counts, "batch_size": sizes,
                                 "workers": workers, "slots": SLOTS, "slot_sweep": slots, "repeats": repeats,
                                 "warmup": WARMUP, "seed": seed, "pinned": False, "cpus_allowed": cpus_allowed()})
    base = min(workers)
    overshoot = sleep_overshoot()
    result.params["sleep_overshoot_us"] = overshoot * 1e6
    with contextlib.ExitStack() as stack:
        written = datasets.ensure_datasets(stack, data_dir, counts, seed, log, SUITE)
        result.notes.extend(datasets.data_note(ds, f"batch {sizes[ds.layout.name]}, ") for ds in written)
        for ds in written:
            _measure_layout(result, ds, sizes[ds.layout.name], workers, slots, repeats, overshoot, base)
    spin = ", ".join(f"W={w} {'off' if not v else f'{v * 1e6:g} us'}"
                     for w, v in result.params.get("feed_spin_s", {}).items() if v is not None)
    pinning = ("every row unpinned (the daemon's workers need the other CPUs; the parse baseline runs unpinned "
               "too, to compare like with like); each figure is the median of the stated runs (one warm-up run "
               "first; cases interleaved; garbage collector off while timing; malloc settled first)")
    steady = (f"daemon W=w: steady state, batches W+1..N, at least {STEADY_BATCHES_PER_WORKER} per worker (from "
              "the arrival of the last worker's first batch to the end of the data; the slots the other workers "
              "filled meanwhile count in it; the data is sized for the largest W, and a W whose file is too short "
              "for it, a small --scale, is refused, it and its ratios); 'incl. start-up': from "
              "Daemon(...) returning to the end; start-up timings: from the Daemon(...) call to the first batch, "
              f"and to batch W (one from every worker). Ring: {SLOTS} slots, lock_memory=False"
              + (f"; a consumer waiting for a batch polls before it sleeps (Feed.spin): {spin}" if spin else ""))
    megabytes = ("MB/s: file bytes of the records counted (TFRecord framing included), MB = 10^6 bytes, "
                 "the file in the page cache")
    cpus = (f"{cpus_allowed()} CPUs allowed (the suite pins nothing; the workers inherit this process's affinity): "
            "the consumer and the W workers share them")
    result.notes += [pinning, steady, megabytes, cpus]
    return result


def _measure_layout(result: SuiteResult, ds: datasets.Dataset, b: int, workers: list[int], slots: list[int],
                    repeats: int, overshoot: float, base: int) -> None:
    name, spec = ds.layout.name, ds.layout.spec()
    with open(ds.path, "rb") as f:                       # into the page cache
        while f.read(8 << 20):
            pass
    sizes = framed_sizes(ds.path)
    n_batches = len(sizes) // b
    all_records, all_bytes = n_batches * b, sum(sizes[:n_batches * b])
    # The streamed daemon, as named: never indexed for it (build_indexes="auto" would from W=2), the indexed one apart.
    dataset = infeed.Dataset(ds.path, spec, batch_size=b, num_epochs=1, build_indexes=False)
    check_same_batches(ds, dataset, max(workers))
    refused = {w: why for w in workers if (why := steady_refusal(w, n_batches))}
    for w, why in refused.items():
        result.refuse(name, [daemon_name(w), indexed_name(w), *(default_name(w) for _ in _by_default([w])),
                             startup_name(w), *(busy_name(w, n) for n in slots)], why)
    timed = [w for w in workers if w not in refused]

    # Phase 1: the parse baseline and the do-nothing consumers.
    log(f"infeed: timing {name} ({repeats} runs per case) ...")
    parse = dataclasses.replace(decode_suite.parse_case(ds, b), name=PARSE)
    idle = {w: DaemonCase(daemon_name(w), dataset, w) for w in timed}
    indexed = infeed.Dataset(datasets.indexed_link(ds.path), spec, batch_size=b, num_epochs=1)
    through_index = {w: DaemonCase(indexed_name(w), indexed, w) for w in timed}
    # No sidecar, the defaults: the warm-up builds the index (into the run's own INFEED_INDEX_DIR), the runs read it.
    by_default = infeed.Dataset(ds.path, spec, batch_size=b, num_epochs=1)
    defaults = {w: DaemonCase(default_name(w), by_default, w) for w in _by_default(timed)}
    with contextlib.ExitStack() as stack:
        parallel = [Case(parallel_name(w), stack.enter_context(ParallelParse(ds.path, name, b, w)).run,
                         w * ds.records, w * ds.nbytes) for w in workers if w > 1]
        settle_allocator()
        measured = interleave([parse, *parallel, *(c.case(all_records, all_bytes)
                                                   for c in [*idle.values(), *through_index.values(),
                                                             *defaults.values()])],
                              repeats, WARMUP)
    parse_figure = dataclasses.replace(measured[0].figure(SUITE, name), batches=-(-len(sizes) // b))
    result.figures.append(parse_figure)
    result.figures += [dataclasses.replace(m.figure(SUITE, name), batches=parse_figure.batches * w)
                       for m, w in zip(measured[1:1 + len(parallel)], [w for w in workers if w > 1])]
    for w, c in idle.items():
        result.params.setdefault("feed_spin_s", {})[w] = c.spin
        result.figures.append(steady_figure(c, daemon_name(w), name, sizes, b, n_batches, SUITE))
    for c in [*through_index.values(), *defaults.values()]:
        result.figures.append(steady_figure(c, c.name, name, sizes, b, n_batches, SUITE))
    for w, c in idle.items():
        whole = Case(startup_name(w), c.run, all_records, all_bytes)
        result.figures.append(dataclasses.replace(Measurement(whole, c.after_made[WARMUP:]).figure(SUITE, name),
                                                  batches=n_batches))

    # Phase 2: a consumer that works B / (parse rate) per batch.
    per_batch = b / parse_figure.records_per_s
    log(f"infeed: timing {name} with a busy consumer ({per_batch * 1e6:,.0f} us per batch; slots "
        f"{', '.join(map(str, slots))}) ...")
    busy = {(w, n): DaemonCase(busy_name(w, n), dataset, w, Work(per_batch, overshoot), slots=n)
            for w in timed for n in slots}
    interleave([c.case(all_records, all_bytes) for c in busy.values()], repeats, WARMUP)
    for c in busy.values():
        result.figures.append(steady_figure(c, c.name, name, sizes, b, n_batches, SUITE))
    done = [c.work for c in busy.values()]
    calls = max(1, sum(x.calls for x in done))
    result.notes.append(f"busy consumer, {name}: work per batch set to {per_batch * 1e6:,.0f} us "
                        f"(batch {b} / the parse rate); as done {sum(x.total for x in done) / calls * 1e6:,.0f} us "
                        f"on average, {sum(x.slept for x in done) / calls * 1e6:,.0f} us of it asleep")

    # Timings: start-up, the consumer's CPU share, the hand-off.
    for w, c in idle.items():
        result.timings.append(Timing.of(SUITE, name, startup_timing(w), "ms", [s * 1e3 for s in c.first[WARMUP:]]))
        if w > 1:
            result.timings.append(Timing.of(SUITE, name, every_worker_timing(w), "ms",
                                            [s * 1e3 for s in c.every[WARMUP:]]))
    for w, c in idle.items():
        result.timings.append(Timing.of(SUITE, name, cpu_timing(w), "%", [s * 100 for s in c.cpu[WARMUP:]]))
    rounds = min(HANDOFF_ROUNDS * repeats, (len(sizes) - SLOTS - 1) // (SLOTS - 1))
    if rounds >= 1:
        log(f"infeed: timing {name} hand-off ({rounds} rounds) ...")
        samples = handoff_samples(ds.path, spec, rounds)
        result.timings.append(Timing.of(SUITE, name, HANDOFF, "us", samples, HANDOFF_TARGET_US))
    else:
        result.notes.append(f"hand-off, {name}: not measured ({len(sizes)} records are too few for a round)")

    for c in [*idle.values(), *through_index.values(), *defaults.values(), *busy.values()]:
        result.stages.append(stage_breakdown(name, c.name, c.median_stages()))
    result.add_scaling(name, "idle consumer", {w: daemon_name(w) for w in workers},
                       {1: PARSE, **{w: parallel_name(w) for w in workers if w > 1}})

    # Ratios.
    pairs = [(daemon_name(w), PARSE) for w in workers]
    pairs += [(make(w), make(base)) for make in (daemon_name, busy_name) for w in workers if w != base]
    pairs += [(parallel_name(w), PARSE) for w in workers if w > 1]
    pairs += [(indexed_name(w), daemon_name(w)) for w in workers]
    pairs += [(indexed_name(w), indexed_name(base)) for w in workers if w != base]
    pairs += [(default_name(w), indexed_name(w)) for w in _by_default(workers)]
    rate = lambda n: result.rate(name, n)        # noqa: E731
    for num, den in pairs:
        result.add_ratio(name, f"{num} / {den}", lambda: rate(num) / rate(den), *target_of(num, den, name))
    for w in workers:
        if w > 1 and base == 1:
            result.add_ratio(name, scaling_name(w), lambda: (rate(daemon_name(w)) / rate(daemon_name(1)))
                             / (rate(parallel_name(w)) / rate(PARSE)), *target_of(scaling_name(w), "", name))
