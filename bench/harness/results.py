"""What a suite measured: figures, timings, ratios against targets, refusals, notes; and the results file
(:func:`write_json`, :func:`read_json`).

Each timed case gives a :class:`Figure`: median, min and max over its
repeats, as records/s and MB/s (MB = 10**6 bytes), and batches/s where the
figure counts batches.  What is not a throughput (a start-up time, a
latency, a CPU share) is a :class:`Timing`: median, p90, min and max of its
samples, with an upper bound as its target.  A suite returns a
:class:`SuiteResult` (figures, timings, ratios against targets, notes), which
:func:`bench.harness.tables.format_result` prints and :func:`write_json` saves
with the facts of the machine.

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
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from bench.harness.machine import cpus_allowed

__all__ = ["Figure", "Timing", "Ratio", "Refusal", "Refused", "SuiteResult", "stage_breakdown", "write_json",
           "read_json", "relative_spread", "noise_flag", "NOISE_BOUND", "QUARTILE_RUNS", "SHORT_SECONDS",
           "STEADY_BATCHES_PER_WORKER", "daemon_batches", "steady_refusal", "OVER_W", "OVER_W_NOTE"]

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


def read_json(path) -> dict:
    """A results file :func:`write_json` wrote (a clear error for anything else)."""
    with open(path) as f:
        try:
            doc = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not a results file (invalid JSON: {e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("suites"), dict) or "version" not in doc:
        raise ValueError(f"{path}: not a results file of python -m bench (no 'version' and 'suites')")
    return doc
