"""Timing, figures, tables and JSON for every suite of ``python -m bench``.

A suite builds :class:`Case` s (a function doing a known amount of work) and
hands them to :func:`interleave`, which runs a warm-up pass and then the
repeats in turn (A B C A B C ...), so that a noisy neighbour slows every case
alike instead of one.  Each case gives a :class:`Figure`: median, min and max
over its repeats, as records/s and MB/s (MB = 10**6 bytes), and batches/s
where the figure counts batches.  What is not a throughput (a start-up time,
a latency, a CPU share) is a :class:`Timing`: median, p90, min and max of its
samples, with an upper bound as its target.  A suite returns a
:class:`SuiteResult` (figures, timings, ratios against targets, notes), which
:func:`format_result` prints and :func:`write_json` saves with the facts of the
machine.

Every figure carries its spread (:func:`relative_spread`: the interquartile
range of its repeats over their median, the whole range below
:data:`QUARTILE_RUNS` repeats); one wider than the run's noise bound
(:data:`NOISE_BOUND`, ``--noise-bound``), or measured once, is flagged
``NOISY`` / ``1 run`` wherever it is printed or saved, and so is a ratio of
such a figure: a noisy machine shows as one. A daemon's steady state timed over
runs under :data:`SHORT_SECONDS` each (their median) is flagged ``SHORT``: over
a few milliseconds the workers' wake-ups and the scheduler decide too much of
it (a fast layout at a large W on a many-core host; ``--scale`` gives it longer
runs).

A daemon's figure is its steady state, after the W batches of its start (one
from each of W workers), over at least :data:`STEADY_BATCHES_PER_WORKER`
batches per worker: a suite sizes its data for the largest W asked
(:func:`daemon_batches`), and where a file is too short for a W anyway (a
small ``--scale``) that W's figures are refused (:func:`steady_refusal`,
:class:`Refusal`): the table prints the reason in place of the numbers, and
a ratio of a refused figure is refused too (:meth:`SuiteResult.add_ratio`).

>>> case = Case("sum", lambda: sum(range(1000)) and 1000, records=1000, nbytes=8000)
>>> [fig] = [m.figure("doc", "demo") for m in interleave([case], repeats=3)]
>>> fig.repeats
3
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field

__all__ = [
    "Case", "Measurement", "Figure", "Timing", "Ratio", "SuiteResult", "interleave", "pinned_to_one_cpu",
    "settle_allocator", "machine_facts", "jax_devices", "format_result", "format_table", "format_timings",
    "format_ratios",
    "write_json", "log", "NOISE_BOUND", "QUARTILE_RUNS", "SHORT_SECONDS", "noise_flag", "relative_spread", "Refusal",
    "Refused",
    "STEADY_BATCHES_PER_WORKER", "daemon_batches", "steady_refusal", "cpus_allowed", "format_scaling", "OVER_W",
    "OVER_W_NOTE",
    "scaling_rows",
]

#: The JSON layout's version; bump it when a field changes meaning.
JSON_VERSION = 1

#: The widest spread (see relative_spread) a figure may have without being flagged as noisy.
NOISE_BOUND = 0.10

#: From this many repeats on, a figure's spread is its interquartile range (one outlier does not flag it, and
#: more repeats do not widen it); below, the whole range.
QUARTILE_RUNS = 4


def relative_spread(values: Sequence[float]) -> float | None:
    """How widely ``values`` (the repeats of one measurement) spread, relative to their median: the
    interquartile range (inclusive quartiles) with :data:`QUARTILE_RUNS` values or more, else max - min;
    None for no values or a zero median.

    >>> relative_spread([1.0, 1.0, 1.1, 1.0, 5.0])      # one outlier in five runs
    0.1
    >>> relative_spread([0.9, 1.0, 1.1])                # three runs: the whole range
    0.2
    """
    if not values:
        return None
    median = statistics.median(values)
    if not median:
        return None
    if len(values) >= QUARTILE_RUNS:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
        return round((q3 - q1) / abs(median), 12)
    return round((max(values) - min(values)) / abs(median), 12)

#: The fewest batches per worker a daemon's steady-state figure is measured over (after the W batches of its start).
STEADY_BATCHES_PER_WORKER = 8


def daemon_batches(workers: int) -> int:
    """The batches a file needs for ``workers`` workers' steady-state figure: W to start, then
    :data:`STEADY_BATCHES_PER_WORKER` per worker."""
    return workers * (1 + STEADY_BATCHES_PER_WORKER)


def steady_refusal(workers: int, batches: int) -> str | None:
    """Why a daemon figure with ``workers`` workers over a file of ``batches`` batches is refused; None when the
    file has :func:`daemon_batches` of them.

    >>> steady_refusal(4, 18)
    'W=4 needs 36 batches (4 to start, then 8 per worker), the file has 18'
    """
    need = daemon_batches(workers)
    if batches >= need:
        return None
    return (f"W={workers} needs {need} batches ({workers} to start, then {STEADY_BATCHES_PER_WORKER} per worker), "
            f"the file has {batches}")


def cpus_allowed() -> int:
    """The CPUs this process may run on (its affinity; the CPU count where the OS has none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: Timings with at least this many samples are distributions (a latency's): their p90 shows their spread, and
#: the median of so many samples is not flagged.
DISTRIBUTION_SAMPLES = 10


#: A speed-up over W=1 above W times this is flagged ``(> W)`` in a scaling table: no W CPUs give it, so the
#: one-worker (or one-process) figure it divides ran slow, and the row is not to be quoted.
OVER_W = 1.02
#: The note under a scaling table that has such a row.
OVER_W_NOTE = ("(> W): above W times one, which W CPUs cannot give: the W=1 (or one-process) figure it divides "
               "ran slow; not to be quoted before a rerun")

#: A figure's runs (their median) shorter than this are too short to time: flagged ``SHORT``.
SHORT_SECONDS = 0.05


def noise_flag(spread: float | None, runs: int, bound: float, seconds: float | None = None) -> str:
    """``""`` for a figure within ``bound``; ``"1 run"`` when no spread was measured; ``"SHORT"`` for runs
    (``seconds``, their median) under :data:`SHORT_SECONDS`; ``"NOISY"`` past the bound."""
    if runs < 2:
        return "1 run"
    if seconds is not None and seconds < SHORT_SECONDS:
        return "SHORT"
    return "NOISY" if spread is not None and spread > bound else ""


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

    def figure(self, suite: str, group: str) -> "Figure":
        return Figure(suite=suite, group=group, name=self.case.name, records=self.case.records,
                      nbytes=self.case.nbytes, repeats=len(self.seconds),
                      seconds_median=statistics.median(self.seconds),
                      seconds_min=min(self.seconds), seconds_max=max(self.seconds), runs=tuple(self.seconds))


@dataclass(frozen=True)
class Figure:
    """One measured throughput: ``records`` and ``nbytes`` per run, over ``repeats`` runs."""

    suite: str
    group: str          # e.g. the dataset layout
    name: str           # e.g. the pipeline
    records: int
    nbytes: int
    repeats: int
    seconds_median: float
    seconds_min: float
    seconds_max: float
    batches: int | None = None      # batches per run, where the figure counts them
    runs: tuple[float, ...] = ()    # the seconds of each repeat, in the order they ran
    steady: bool = False            # a daemon's steady state: flagged SHORT when its runs are too short to time

    @property
    def records_per_s(self) -> float:
        """Median records per second."""
        return self.records / self.seconds_median

    @property
    def batches_per_s(self) -> float | None:
        """Median batches per second (None when the figure does not count batches)."""
        return None if self.batches is None else self.batches / self.seconds_median

    @property
    def mb_per_s(self) -> float:
        """Median MB (10**6 bytes) per second."""
        return self.nbytes / self.seconds_median / 1e6

    @property
    def spread(self) -> float:
        """:func:`relative_spread` of the repeats' seconds (from min and max when the runs are not kept)."""
        if self.runs:
            return relative_spread(self.runs)
        return (self.seconds_max - self.seconds_min) / self.seconds_median

    def noise(self, bound: float = NOISE_BOUND) -> str:
        """:func:`noise_flag` of this figure."""
        return noise_flag(self.spread, self.repeats, bound, self.seconds_median if self.steady else None)

    def to_json(self) -> dict:
        out = asdict(self)
        out.update(records_per_s=self.records_per_s, mb_per_s=self.mb_per_s, spread=self.spread,
                   records_per_s_min=self.records / self.seconds_max,
                   records_per_s_max=self.records / self.seconds_min)
        if self.batches is not None:
            out["batches_per_s"] = self.batches_per_s
        return out


def _nearest_rank(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 < q <= 1) of sorted values by the nearest-rank method (an observed value)."""
    return ordered[min(len(ordered), max(1, math.ceil(len(ordered) * q))) - 1]


@dataclass(frozen=True)
class Timing:
    """A measured duration or share, lower is better: a start-up time, a latency, a CPU share.

    ``unit`` is what the numbers are in (``"ms"``, ``"us"``, ``"%"``);
    ``samples`` how many values the median, p90 (nearest rank), min and max are
    of; ``target_max``: the bound the median should stay below (None: none).
    """

    suite: str
    group: str
    name: str
    unit: str
    median: float
    p90: float
    min: float
    max: float
    samples: int
    target_max: float | None = None
    spread_of_samples: float | None = None      # relative_spread of the samples

    @classmethod
    def of(cls, suite: str, group: str, name: str, unit: str, values: Sequence[float],
           target_max: float | None = None) -> "Timing":
        """The timing of ``values`` (already in ``unit``)."""
        if not values:
            raise ValueError(f"timing {name!r}: no samples")
        ordered = sorted(values)
        return cls(suite, group, name, unit, statistics.median(ordered), _nearest_rank(ordered, 0.9),
                   ordered[0], ordered[-1], len(ordered), target_max, relative_spread(ordered))

    @property
    def met(self) -> bool | None:
        return None if self.target_max is None else self.median < self.target_max

    @property
    def spread(self) -> float | None:
        """:func:`relative_spread` of the samples; None for a distribution (:data:`DISTRIBUTION_SAMPLES` or
        more samples: its p90 is its spread) or a zero median."""
        if self.samples >= DISTRIBUTION_SAMPLES or not self.median:
            return None
        if self.spread_of_samples is not None:
            return self.spread_of_samples
        return (self.max - self.min) / abs(self.median)

    def noise(self, bound: float = NOISE_BOUND) -> str:
        """:func:`noise_flag` of this timing (a distribution is never flagged)."""
        return "" if self.samples >= DISTRIBUTION_SAMPLES else noise_flag(self.spread, self.samples, bound)

    def to_json(self) -> dict:
        return {**asdict(self), "met": self.met, "spread": self.spread}


@dataclass(frozen=True)
class Ratio:
    """A ratio of two figures' medians (higher is better), with the target it should reach.

    ``strict``: the ratio must exceed the target, not merely reach it.
    """

    suite: str
    group: str
    name: str
    value: float
    target: float | None = None
    strict: bool = False

    @property
    def met(self) -> bool | None:
        if self.target is None:
            return None
        return self.value > self.target if self.strict else self.value >= self.target

    def to_json(self) -> dict:
        return {**asdict(self), "met": self.met}


@dataclass(frozen=True)
class Refusal:
    """A figure or ratio not given, and why: printed in its place, never as a number. ``kind``: ``"figure"``
    or ``"ratio"``."""

    suite: str
    group: str
    name: str
    reason: str
    kind: str = "figure"


class Refused(Exception):
    """Raised by :meth:`SuiteResult.rate` for a refused figure; ``refusal`` is its :class:`Refusal`."""

    def __init__(self, refusal: Refusal):
        super().__init__(f"{refusal.group}: {refusal.name}: {refusal.reason}")
        self.refusal = refusal


@dataclass
class SuiteResult:
    """What one suite measured: figures, timings, ratios, notes, and the parameters it ran with."""

    suite: str
    figures: list[Figure] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    group_label: str = "group"      # what the table's first column calls Figure.group
    name_label: str = "case"        # and its second, Figure.name
    timings: list[Timing] = field(default_factory=list)
    noise_bound: float = NOISE_BOUND    # see noise_flag
    #: Where a case's time went, per stage (see :func:`stage_breakdown`), beside its figure.
    stages: list[dict] = field(default_factory=list)
    #: Figures and ratios not given, with the reason (see :class:`Refusal`).
    refused: list[Refusal] = field(default_factory=list)
    #: How a daemon's figure scales with its workers (see :meth:`add_scaling`).
    scaling: list[dict] = field(default_factory=list)

    def figure(self, group: str, name: str) -> Figure:
        for f in self.figures:
            if (f.group, f.name) == (group, name):
                return f
        raise KeyError((group, name))

    def timing(self, group: str, name: str) -> Timing:
        for t in self.timings:
            if (t.group, t.name) == (group, name):
                return t
        raise KeyError((group, name))

    def refuse(self, group: str, names: Sequence[str], reason: str) -> None:
        """Refuses the figures ``names`` of ``group``, for ``reason``."""
        self.refused += [Refusal(self.suite, group, name, reason) for name in names]

    def rate(self, group: str, name: str) -> float:
        """A figure's median records/s; raises :class:`Refused` where the figure is refused."""
        for r in self.refused:
            if (r.group, r.name, r.kind) == (group, name, "figure"):
                raise Refused(r)
        return self.figure(group, name).records_per_s

    def add_ratio(self, group: str, name: str, value: Callable[[], float], target: float | None = None,
                  strict: bool = False) -> None:
        """Appends the ratio ``value()`` (computed with :meth:`rate`), or its refusal where a figure it
        divides is refused: never a ratio of a refused figure."""
        try:
            self.ratios.append(Ratio(self.suite, group, name, value(), target, strict))
        except Refused as e:
            self.refused.append(Refusal(self.suite, group, name, f"{e.refusal.name} is refused", "ratio"))

    def add_scaling(self, group: str, name: str, figures: Mapping[int, str],
                    bound: Mapping[int, str] | None = None) -> None:
        """Appends the scaling table of ``figures`` (W -> the daemon figure with W workers, its stage breakdown in
        :attr:`stages`), where two or more W were asked: a row per W with records/s, the speed-up over W=1 (None
        without a W=1 figure) and the efficiency (speed-up / W), the workers' stage shares and the consumer's
        wait share, and the workers' decoding time per record (which grows with W where each worker's own work
        slows: shared cores, memory bandwidth, clocks), and with two workers or more the slowest worker's decoding
        time per record over the fastest's (CPUs of unequal speed; batches go to whichever worker is free, so the
        slower workers make fewer); a refused W's row gives the reason instead. A W above :func:`cpus_allowed` is
        oversubscribed.

        ``bound`` (W -> the figure of W processes parsing at once, sharing nothing; 1 -> the one-process parse)
        adds what the machine gives W decoders: ``bound_speedup``, their rate over one's, and ``of_bound``, the
        daemon's speed-up over that (1.0: the workers scale as well as the machine lets any W decoders)."""
        if len(figures) < 2:
            return
        cpus, rows = cpus_allowed(), []
        try:
            one = self.rate(group, figures[1]) if 1 in figures else None
        except Refused:
            one = None
        for w, figure in sorted(figures.items()):
            row = {"workers": w, "oversubscribed": w > cpus}
            try:
                rate = self.rate(group, figure)
            except Refused as e:
                rows.append({**row, "refused": e.refusal.reason})
                continue
            speedup = None if one is None else rate / one
            [stages] = [s for s in self.stages if (s["group"], s["name"]) == (group, figure)]
            row.update(records_per_s=rate, speedup=speedup, efficiency=None if speedup is None else speedup / w,
                       worker_shares=stages["worker_shares"], consumer_wait=stages["trainer_wait"],
                       decode_us_per_record=stages["us_per_record"]["decode"])
            each = [x for x in stages.get("worker_decode_us_per_record", ()) if x > 0]
            if len(each) > 1:
                row["decode_slowest_over_fastest"] = max(each) / min(each)
            if bound and w in bound and 1 in bound:
                machine = self.rate(group, bound[w]) / self.rate(group, bound[1])
                row.update(bound_speedup=machine, of_bound=None if speedup is None else speedup / machine)
            over = [k for k in ("speedup", "bound_speedup") if (row.get(k) or 0) > w * OVER_W]
            if over:                # W CPUs cannot give more than W times one: its one-worker figure ran slow
                row["over_w"] = over
            rows.append(row)
        self.scaling.append({"group": group, "name": name, "cpus": cpus, "rows": rows})

    def ratio_noise(self, ratio: Ratio) -> str:
        """``"SHORT"`` when a figure the ratio divides (``"A / B"``, in its group) is, else ``"NOISY"`` when one is
        flagged at all, else ``""``."""
        names = ratio.name.split(" / ")
        flags = {f.noise(self.noise_bound) for f in self.figures if f.group == ratio.group and f.name in names}
        return "SHORT" if "SHORT" in flags else "NOISY" if flags - {""} else ""

    def noisy(self) -> list[str]:
        """What is flagged: ``"group: name (flag, spread)"`` for each figure and timing past the bound."""
        out = []
        for x in [*self.figures, *self.timings]:
            flag = x.noise(self.noise_bound)
            if flag:
                out.append(f"{x.group}: {x.name} ({flag}" + (f", spread {x.spread:.0%})" if flag == "NOISY" else ")"))
        return out

    def to_json(self) -> dict:
        b = self.noise_bound
        out = {"suite": self.suite, "params": self.params, "notes": self.notes, "noise_bound": b,
               "group_label": self.group_label, "name_label": self.name_label,
               "figures": [{**f.to_json(), "noise": f.noise(b)} for f in self.figures],
               "ratios": [{**r.to_json(), "noise": self.ratio_noise(r)} for r in self.ratios]}
        if self.timings:
            out["timings"] = [{**t.to_json(), "noise": t.noise(b)} for t in self.timings]
        if self.stages:
            out["stages"] = self.stages
        if self.refused:
            out["refused"] = [asdict(r) for r in self.refused]
        if self.scaling:
            out["scaling"] = self.scaling
        return out


def stage_breakdown(group: str, name: str, stats) -> dict:
    """A row of :attr:`SuiteResult.stages` from an ``infeed.InputStats`` (over one run's timed part)."""
    doc = stats.to_json()
    return {"group": group, "name": name, "trainer_wait": doc["trainer_wait"],
            "consumer_shares": doc["consumer_shares"], "worker_shares": doc["worker_shares"],
            "us_per_record": doc["us_per_record"], "workers": len(doc["workers"]), "bottleneck": doc["bottleneck"],
            "worker_decode_us_per_record": [w["us_per_record"]["decode"] for w in doc["workers"]]}


def interleave(cases: Sequence[Case], repeats: int, warmup: int = 1) -> list[Measurement]:
    """Runs ``warmup`` untimed passes, then ``repeats`` timed passes over all cases in turn.

    The garbage collector is off while a case runs (as in ``timeit``) and a
    collection runs between cases, so one case's garbage is not another's cost.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    out = [Measurement(c) for c in cases]
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


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "Model")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _versions(*packages: str) -> dict:
    """Installed versions, read from the package metadata (nothing is imported: this process stays free of
    JAX, whose devices the suites' own processes choose)."""
    from importlib import metadata

    out = {}
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def jax_devices(timeout: float = 120.0) -> dict:
    """JAX's default backend and devices as a fresh process sees them (``{"backend": ..., "devices": [...]}``),
    or ``{"backend": None, "error": ...}``. A separate process: importing JAX here would fix its devices for
    the suites that set their own."""
    import subprocess

    code = ("import json, jax; print(json.dumps({'backend': jax.default_backend(), "
            "'devices': sorted({f'{len(jax.devices())} x {d.device_kind}' for d in jax.devices()})}))")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        if done.returncode == 0:
            return json.loads(done.stdout.strip().splitlines()[-1])
        err = (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        err = str(e)
    return {"backend": None, "error": err[:300]}


def machine_facts(extra: dict | None = None) -> dict:
    """CPU model, cores, memory, load, OS and library versions: what a figure depends on."""
    import numpy as np

    facts = {
        "host": platform.node(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        **_versions("jax", "jaxlib", "optax", "orbax-checkpoint", "pyarrow"),
    }
    try:
        from infeed.tfrecord import _tfrecord

        facts["crc32c"] = _tfrecord.crc32c_implementation()
    except ImportError:
        pass
    facts.update(extra or {})
    return facts


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}"


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]], left: set[int]) -> str:
    """Aligned columns; a row shorter than ``head`` ends in a text printed as it is (a refusal's reason in place
    of the numbers)."""
    widths = [max(len(r[i]) for r in [head, *rows] if len(r) == len(head)) for i in range(len(head))]

    def line(r):
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))]
        if len(r) < len(head):
            cells[-1] = r[-1]
        return "  ".join(cells)

    return "\n".join([line(head), "  ".join("-" * w for w in widths), *map(line, rows)])


def _spread(x, bound: float) -> str:
    flag = x.noise(bound)
    shown = "" if x.spread is None or flag == "1 run" else f"{x.spread:.0%}"
    return " ".join(filter(None, [shown, flag]))


def format_table(figures: Sequence[Figure], group_label: str = "group", name_label: str = "case",
                 noise_bound: float = NOISE_BOUND, refused: Sequence[Refusal] = ()) -> str:
    """A fixed-width table: one row per figure, medians first, then the range, the spread (flagged past
    ``noise_bound``) and the repeat count; a refused figure's row (after its group's figures) gives the reason
    instead.

    A batches/s column appears when some figure counts batches.
    """
    with_batches = any(f.batches is not None for f in figures)
    head = (group_label, name_label, "records/s", "MB/s", *(["batches/s"] if with_batches else []),
            "records/s min..max", "spread", "runs", "records")
    rows = [(f.group, f.name, _rate(f.records_per_s), _rate(f.mb_per_s),
             *([] if not with_batches else ["" if f.batches is None else _rate(f.batches_per_s)]),
             f"{_rate(f.records / f.seconds_max)}..{_rate(f.records / f.seconds_min)}",
             _spread(f, noise_bound), str(f.repeats), f"{f.records:,}") for f in figures]
    rows += [(r.group, r.name, f"refused: {r.reason}") for r in refused]
    groups = list(dict.fromkeys(r[0] for r in rows))
    return _columns(head, sorted(rows, key=lambda r: groups.index(r[0])), {0, 1})


def format_scaling(tables: Sequence[dict], group_label: str = "group") -> str:
    """The scaling tables (:meth:`SuiteResult.add_scaling`), one block of rows each: records/s, speed-up over
    W=1, efficiency and the stage shares per W, and where measured what W processes parsing alone gain and the
    daemon's share of that; a refused W gives the reason; an oversubscribed W says so."""
    head, rows = scaling_rows(tables, group_label, percent="{:.0%}".format)
    over = any("over_w" in r for t in tables for r in t["rows"])
    return _columns(head, rows, {0, 1, 2}) + (f"\n{OVER_W_NOTE}" if over else "")


def scaling_rows(tables: Sequence[dict], group_label: str, *, percent: Callable[[float], str]) -> tuple[list, list]:
    """The head and rows of the scaling tables as text, ``percent`` writing a share. A refused W's row is short:
    the reason in place of the records/s and nothing after it."""
    stages = next((list(r["worker_shares"]) for t in tables for r in t["rows"] if "worker_shares" in r), [])
    bounded = any("bound_speedup" in r for t in tables for r in t["rows"])
    head = [group_label, "daemon", "W", "records/s", "speed-up", "efficiency", *(f"workers: {s}" for s in stages),
            "consumer wait", "decode us/record", "slowest/fastest worker",
            *(("W processes alone", "of that") if bounded else ())]
    rows = []
    for t in tables:
        for r in t["rows"]:
            w = f"{r['workers']}" + (f" (oversubscribed: {t['cpus']} CPUs)" if r["oversubscribed"] else "")
            if "refused" in r:
                rows.append([t["group"], t["name"], w, f"refused: {r['refused']}"])       # short: the reason
                continue
            rows.append([t["group"], t["name"], w, _rate(r["records_per_s"]),
                         "" if r["speedup"] is None else f"{r['speedup']:.2f}x" + _over_w(r, "speedup"),
                         "" if r["efficiency"] is None else percent(r["efficiency"]),
                         *(percent(r["worker_shares"][s]) for s in stages),
                         percent(r["consumer_wait"]), _amount(r["decode_us_per_record"]),
                         f"{r['decode_slowest_over_fastest']:.2f}x" if "decode_slowest_over_fastest" in r else ""])
            if bounded:
                rows[-1] += ["" if "bound_speedup" not in r
                             else f"{r['bound_speedup']:.2f}x" + _over_w(r, "bound_speedup"),
                             "" if r.get("of_bound") is None else percent(r["of_bound"])]
    return head, rows


def _over_w(row: Mapping, key: str) -> str:
    return " (> W)" if key in row.get("over_w", ()) else ""


def _amount(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"


def format_timings(timings: Sequence[Timing], group_label: str = "group", noise_bound: float = NOISE_BOUND) -> str:
    """A fixed-width table of timings: median, p90, range, spread, sample count and the target, if any."""
    head = (group_label, "timing", "unit", "median", "p90", "min..max", "spread", "samples", "target")
    rows = [(t.group, t.name, t.unit, _amount(t.median), _amount(t.p90), f"{_amount(t.min)}..{_amount(t.max)}",
             _spread(t, noise_bound), str(t.samples),
             "" if t.target_max is None else f"< {t.target_max:g} {t.unit}: {'met' if t.met else 'MISSED'}")
            for t in timings]
    return _columns(head, rows, {0, 1, 2, 8})


def target_text(r: Ratio) -> str:
    """``"target >= 0.9x: met"`` (``>`` for a strict target); ``""`` without a target."""
    op = ">" if r.strict else ">="
    return "" if r.target is None else f"target {op} {r.target:g}x: {'met' if r.met else 'MISSED'}"


def format_ratios(ratios: Sequence[Ratio], noise: Callable[[Ratio], str] = lambda r: "",
                  refused: Sequence[Refusal] = ()) -> str:
    """One line per ratio, aligned, with its target, whether it is met, and ``noise(ratio)``'s flag; then one
    per refused ratio, with the reason."""
    gw = max(len(r.group) for r in [*ratios, *refused])
    nw = max(len(r.name) for r in [*ratios, *refused])

    def line(r):
        tail = "  ".join(filter(None, [target_text(r), f"({noise(r)})" if noise(r) else ""]))
        return f"{r.group:<{gw}}  {r.name:<{nw}}  {r.value:6.2f}x" + (f"  {tail}" if tail else "")

    return "\n".join([*map(line, ratios), *(f"{r.group:<{gw}}  {r.name:<{nw}}  refused: {r.reason}" for r in refused)])


def format_result(result: SuiteResult) -> str:
    b = result.noise_bound
    parts = [f"== {result.suite} =="]
    refused = {kind: [r for r in result.refused if r.kind == kind] for kind in ("figure", "ratio")}
    if result.figures or refused["figure"]:
        parts.append(format_table(result.figures, result.group_label, result.name_label, b, refused["figure"]))
    if result.scaling:
        parts += ["", "scaling with the workers (steady state; efficiency = speed-up over W=1 / W; shares of "
                      "the workers' and the consumer's wall time):", format_scaling(result.scaling, result.group_label)]
    if result.timings:
        parts += ["", "timings (lower is better):", format_timings(result.timings, result.group_label, b)]
    if result.ratios or refused["ratio"]:
        parts += ["", "ratios of medians (higher is better):",
                  format_ratios(result.ratios, result.ratio_noise, refused["ratio"])]
    flagged = result.noisy()
    noisy = [x for x in flagged if "(NOISY" in x]
    short = [x for x in flagged if "(SHORT" in x]
    once = len(flagged) - len(noisy) - len(short)
    if flagged:
        parts += ["", f"flagged, not to be quoted before a rerun on a quieter machine or with more --repeats: "
                      f"{len(flagged)} of {len(result.figures) + len(result.timings)} figures"
                  + (f"; {once} measured once (1 run)" if once else "")
                  + (f"; {len(short)} timed over runs under {SHORT_SECONDS * 1e3:.0f} ms each (SHORT; a larger "
                     f"--scale times them longer): " + "; ".join(short) if short else "")
                  + (f"; {len(noisy)} spread wider than {b:.0%} of their median (NOISY): " + "; ".join(noisy)
                     if noisy else "")]
    if result.notes:
        parts += ["", *result.notes]
    return "\n".join(parts)


def write_json(path, command: str, machine: dict, results: Sequence[SuiteResult]) -> None:
    """Writes the figures of a run with the command and the machine facts (atomically)."""
    doc = {"version": JSON_VERSION, "command": command, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "machine": machine, "suites": {r.suite: r.to_json() for r in results}}
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
