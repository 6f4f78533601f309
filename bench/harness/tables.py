"""A suite's results as fixed-width text tables: figures, scaling with the workers, timings, ratios; what
``python -m bench`` prints after each suite."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from bench.harness.results import (NOISE_BOUND, OVER_W_NOTE, SHORT_SECONDS, Figure, Ratio, Refusal, SuiteResult,
                                   Timing)

__all__ = ["format_result", "format_table", "format_scaling", "scaling_rows", "format_timings", "format_ratios",
           "target_text"]


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
