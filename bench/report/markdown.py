"""The Markdown report of a results file: the machine, the headline targets (ratios, and timings with a bound), each
suite's tables, notes and plots.

    python -m bench report bench-results/2026-11-23-120501-myhost.json

writes ``<results>.md`` and its plots in ``<results>/`` (PNG, see
:mod:`bench.report.plots`) next to the results file; ``python -m bench`` does the
same after every run. It reads only the results file, so a report can be
drawn again, or on another machine, from a saved run. Without matplotlib
(``pip install -e .[bench]``) the report has every table and says how to get
the plots.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from bench.harness.results import OVER_W_NOTE, SHORT_SECONDS, read_json
from bench.harness.tables import scaling_rows

__all__ = ["write_report", "render", "main"]


def _num(x: float | None) -> str:
    if x is None:
        return ""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.2f}"


def _cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def _table(head: Sequence[str], rows: Sequence[Sequence]) -> list[str]:
    return ["| " + " | ".join(map(_cell, head)) + " |", "|" + "|".join("---" for _ in head) + "|",
            *("| " + " | ".join(map(_cell, r)) + " |" for r in rows)]


def _target(r: Mapping) -> str:
    if r.get("target") is None:
        return ""
    return f"{'>' if r.get('strict') else '>='} {r['target']:g}x: {'met' if r.get('met') else '**MISSED**'}"


def _spread(x: Mapping) -> str:
    flag = x.get("noise") or ""
    shown = "" if x.get("spread") is None or flag == "1 run" else f"{x['spread']:.0%}"
    return " ".join(filter(None, [shown, f"**{flag}**" if flag else ""]))


def _refused(suite: Mapping, kind: str) -> list[Mapping]:
    """The suite's refused figures or ratios (``kind``), each with its reason."""
    return [r for r in suite.get("refused", []) if r["kind"] == kind]


def _figures(suite: Mapping) -> list[str]:
    """One row per figure; a refused figure's row gives the reason in place of the numbers."""
    figs = suite.get("figures", [])
    batches = any(f.get("batches_per_s") is not None for f in figs)
    head = [suite.get("group_label", "group"), suite.get("name_label", "case"), "records/s", "MB/s",
            *(["batches/s"] if batches else []), "records/s min..max", "spread", "runs"]
    rows = [[f["group"], f["name"], _num(f["records_per_s"]), _num(f["mb_per_s"]),
             *([_num(f.get("batches_per_s"))] if batches else []),
             f"{_num(f['records_per_s_min'])}..{_num(f['records_per_s_max'])}", _spread(f), f["repeats"]]
            for f in figs]
    rows += [[r["group"], r["name"], f"refused: {r['reason']}", *[""] * (len(head) - 3)]
             for r in _refused(suite, "figure")]
    return _table(head, rows)


def _scaling(suite: Mapping) -> list[str]:
    """A row per daemon and W: records/s, speed-up over W=1, efficiency, the stage shares, and what W processes
    parsing alone gain; a refused W gives the reason; an oversubscribed W (more workers than CPUs) says so."""
    head, rows = scaling_rows(suite["scaling"], suite.get("group_label", "group"),
                              percent=lambda x: f"{100 * x:.0f} %")
    head = [h.replace("us/record", "µs/record").replace("consumer wait", "consumer waiting") for h in head]
    note = ["", OVER_W_NOTE] if any("over_w" in r for t in suite["scaling"] for r in t["rows"]) else []
    return _table(head, [r + [""] * (len(head) - len(r)) for r in rows]) + note


def _timings(suite: Mapping) -> list[str]:
    head = [suite.get("group_label", "group"), "timing (lower is better)", "median", "p90", "min..max", "spread",
            "samples", "target"]
    rows = [[t["group"], t["name"], f"{_num(t['median'])} {t['unit']}", _num(t["p90"]),
             f"{_num(t['min'])}..{_num(t['max'])}", _spread(t), t["samples"],
             "" if t.get("target_max") is None else
             f"< {t['target_max']:g} {t['unit']}: {'met' if t.get('met') else '**MISSED**'}"]
            for t in suite.get("timings", [])]
    return _table(head, rows)


def _stages(suite: Mapping) -> list[str]:
    """Where each measured case's time went: the consumer's wait and the workers' shares per stage."""
    rows = suite.get("stages", [])
    names = list(rows[0]["worker_shares"]) if rows else []
    head = [suite.get("group_label", "group"), suite.get("name_label", "case"), "consumer waiting",
            *(f"workers: {n}" for n in names), "verdict"]
    return _table(head, [[r["group"], r["name"], f"{100 * r['trainer_wait']:.0f} %",
                          *(f"{100 * r['worker_shares'][n]:.0f} %" for n in names),
                          r["bottleneck"].split(":")[0]] for r in rows])


def _bounded(timings: Sequence[Mapping]) -> list[str]:
    """The headline's timings that have a bound: median against the target."""
    head = ["suite", "group", "timing (lower is better)", "median", "target", "noise"]
    rows = [[t["suite"], t["group"], t["name"], f"{_num(t['median'])} {t['unit']}",
             f"< {t['target_max']:g} {t['unit']}: {'met' if t.get('met') else '**MISSED**'}", t.get("noise", "")]
            for t in timings]
    return _table(head, rows)


def _ratios(ratios: Sequence[Mapping], with_suite: bool = False, refused: Sequence[Mapping] = ()) -> list[str]:
    """One row per ratio, then one per refused ratio (``refused``) with the reason in place of its value."""
    head = [*(["suite"] if with_suite else []), "group", "ratio of medians (higher is better)", "value", "target",
            "noise"]
    rows = [[*([r["suite"]] if with_suite else []), r["group"], r["name"], f"{r['value']:.2f}x", _target(r),
             r.get("noise", "")] for r in ratios]
    rows += [[r["group"], r["name"], f"refused: {r['reason']}", "", ""] for r in refused]
    return _table(head, rows)


def render(doc: Mapping, plots: Mapping[str, tuple[str, str]], missing_plots: str | None = None) -> str:
    """The report's Markdown; ``plots``: plot stem -> (its suite, the PNG's path relative to the report)."""
    suites = doc["suites"]
    out = [f"# Benchmark report, {doc.get('created', '')}", "",
           f"Reproduce: `{doc.get('command', 'python -m bench all')}` (then `python -m bench compare OLD.json "
           "NEW.json` to compare two runs).", "",
           "Every figure is the median of its runs, after a warm-up, with cases interleaved (A B A B). A figure "
           "whose runs spread wider than the noise bound (their interquartile range over their median, the whole "
           "range below 4 runs) is flagged **NOISY**, one measured once **1 run**, a daemon's steady state timed "
           f"over runs under {SHORT_SECONDS * 1e3:.0f} ms each **SHORT** (a larger `--scale` times it longer), "
           "and so is a ratio of such a figure: rerun those on a quieter machine or with more `--repeats` before "
           "quoting them.", "",
           "## Machine", ""]
    out += _table(["fact", "value"], [[k, v] for k, v in doc.get("machine", {}).items()])
    headline = [r for s in suites.values() for r in s.get("ratios", []) if r.get("target") is not None]
    bounded = [t for s in suites.values() for t in s.get("timings", []) if t.get("target_max") is not None]
    if headline or bounded:
        met = sum(bool(x.get("met")) for x in [*headline, *bounded])
        out += ["", "## Headline: the targets", "", f"{met} of {len(headline) + len(bounded)} targets met.", ""]
        if headline:
            out += _ratios(headline, with_suite=True)
        if bounded:
            out += ([""] if headline else []) + _bounded(bounded)
    if missing_plots:
        out += ["", f"_No plots: {missing_plots}_"]
    for name, suite in suites.items():
        out += ["", f"## {name}", ""]
        for stem, (of, rel) in plots.items():
            if of == name:
                out += [f"![{stem}]({rel})", ""]
        out += _figures(suite)
        if suite.get("scaling"):
            out += ["", "Scaling with the workers (steady state; efficiency = speed-up over W=1 / W; shares of the "
                    "workers' and the consumer's wall time):", ""] + _scaling(suite)
        if suite.get("timings"):
            out += [""] + _timings(suite)
        if suite.get("ratios") or _refused(suite, "ratio"):
            out += [""] + _ratios(suite.get("ratios", []), refused=_refused(suite, "ratio"))
        if suite.get("stages"):
            out += ["", "Where the time went (`infeed.InputStats` over each case's median run; shares of wall time, "
                    "workers' shares averaged over the workers):", ""] + _stages(suite)
        bound = suite.get("noise_bound")
        flagged = [x for x in [*suite.get("figures", []), *suite.get("timings", [])] if x.get("noise")]
        if bound is not None:
            out += ["", f"Noise bound {bound:.0%}: {len(flagged)} figure(s) flagged."]
        if suite.get("notes"):
            out += [""] + [f"- {n}" for n in suite["notes"]]
    return "\n".join(out) + "\n"


def write_report(results_path) -> tuple[str, list[str]]:
    """Writes the report of ``results_path`` (``X.json`` -> ``X.md`` and ``X/*.png``); returns the report's
    path and the plots written."""
    doc = read_json(results_path)
    stem = os.path.splitext(os.fspath(results_path))[0]
    plot_dir = stem
    written: dict[str, tuple[str, str]] = {}
    missing = None
    try:
        from bench.report import plots
    except ImportError as e:
        missing = f"matplotlib is not installed ({e}); `pip install -e .[bench]` adds it."
    else:
        os.makedirs(plot_dir, exist_ok=True)
        for name, (suite, draw) in plots.PLOTS.items():
            fig = draw(doc["suites"])
            if fig is None:
                continue
            path = os.path.join(plot_dir, f"{name}.png")
            plots.save(fig, path)
            written[name] = (suite, os.path.relpath(path, os.path.dirname(stem) or "."))
    md = f"{stem}.md"
    tmp = f"{md}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(render(doc, written, missing))
    os.replace(tmp, md)
    return md, [os.path.join(os.path.dirname(stem), rel) for _, rel in written.values()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench report",
                                description="Writes the Markdown report (and plots) of saved results.")
    p.add_argument("results", nargs="+", help="results files written by python -m bench")
    args = p.parse_args(argv)
    for path in args.results:
        try:
            md, pngs = write_report(path)
        except (OSError, ValueError) as e:
            print(f"python -m bench report: {e}", file=sys.stderr)
            return 2
        print(f"wrote {md}" + (f" and {len(pngs)} plots in {os.path.dirname(pngs[0])}" if pngs else ""))
    return 0
