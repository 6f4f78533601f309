"""Compares two results files figure by figure: each one's change, and the regressions beyond the noise.

    python -m bench compare bench-results/OLD.json bench-results/NEW.json

A throughput (records/s) or a timing (lower is better) has regressed when it
is worse by more than ``--threshold`` (default 5%) *and* its two runs' ranges
do not overlap (the new run's best is worse than the old run's worst): a
change inside either run's own spread is noise, not a regression, and is
shown as ``~``. A ratio (two figures measured interleaved in one run, the
most robust of the figures) regresses when it falls by more than the
threshold, unless either run flagged it noisy. Improvements are flagged the same way. Figures in only one file
are listed. The exit status is 1 when something regressed, so a CI job can
run it; 2 for unreadable files.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from bench.harness.results import read_json

__all__ = ["Change", "compare", "format_changes", "main", "THRESHOLD"]

#: The smallest relative change called a regression or an improvement.
THRESHOLD = 0.05


@dataclass(frozen=True)
class Change:
    """One figure in both files. ``change``: new / old - 1 of the median, signed so that positive is better."""

    kind: str           # "figure", "timing" or "ratio"
    suite: str
    group: str
    name: str
    unit: str
    old: float
    new: float
    change: float
    verdict: str        # "regression", "improvement", "~" (within the noise) or "" (within the threshold)


def _index(doc: Mapping, kind: str) -> dict[tuple[str, str, str], Mapping]:
    return {(suite, x["group"], x["name"]): x for suite, s in doc["suites"].items() for x in s.get(kind, ())}


def _verdict(better: float, separated_worse: bool, separated_better: bool, threshold: float) -> str:
    if abs(better) <= threshold:
        return ""
    if better < 0:
        return "regression" if separated_worse else "~"
    return "improvement" if separated_better else "~"


def compare(old: Mapping, new: Mapping, threshold: float = THRESHOLD) -> tuple[list[Change], list[str]]:
    """Every figure, timing and ratio in both documents, and ``"only in OLD/NEW: ..."`` lines for the rest."""
    out: list[Change] = []
    only: list[str] = []
    for kind in ("figures", "timings", "ratios"):
        a, b = _index(old, kind), _index(new, kind)
        for key in [*a, *(k for k in b if k not in a)]:
            if key not in b or key not in a:
                only.append(f"only in {'OLD' if key in a else 'NEW'}: {kind[:-1]} {' / '.join(key[:2])}: {key[2]}")
                continue
            x, y = a[key], b[key]
            if kind == "figures":
                o, n = x["records_per_s"], y["records_per_s"]
                better = n / o - 1
                verdict = _verdict(better, y["records_per_s_max"] < x["records_per_s_min"],
                                   y["records_per_s_min"] > x["records_per_s_max"], threshold)
                unit = "records/s"
            elif kind == "timings":
                o, n = x["median"], y["median"]
                better = (o / n - 1) if n else 0.0       # lower is better: positive when it got shorter
                verdict = _verdict(better, y["min"] > x["max"], y["max"] < x["min"], threshold)
                unit = x["unit"]
            else:
                o, n = x["value"], y["value"]
                better = n / o - 1 if o else 0.0
                clean = not (x.get("noise") or y.get("noise"))     # a ratio of a noisy figure is noise too
                verdict = _verdict(better, clean, clean, threshold)
                unit = "x"
            out.append(Change(kind[:-1], *key, unit, o, n, better, verdict))
    return out, only


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.3g}"


def format_changes(changes: list[Change], only: list[str], threshold: float, everything: bool = False) -> str:
    """A line per change (with ``everything``; otherwise only what moved past the threshold), then a summary."""
    shown = changes if everything else [c for c in changes if c.verdict]
    lines = []
    if shown:
        w = max(len(f"{c.suite} | {c.group} | {c.name}") for c in shown)
        for c in shown:
            what = f"{c.suite} | {c.group} | {c.name}"
            lines.append(f"{what:<{w}}  {_num(c.old):>10} -> {_num(c.new):>10} {c.unit:<9} {c.change:+7.1%}  "
                         f"{c.verdict.upper() if c.verdict == 'regression' else c.verdict}")
    lines += only
    counts = {v: sum(c.verdict == v for c in changes) for v in ("regression", "improvement", "~")}
    lines.append(f"{len(changes)} figures compared: {counts['regression']} regressed, {counts['improvement']} "
                 f"improved beyond the noise and the {threshold:.0%} threshold, {counts['~']} moved more than "
                 f"{threshold:.0%} but within the runs' spread (~)" + (f", {len(only)} in one file only"
                                                                         if only else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench compare", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 2)[2],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", help="the results file to compare against")
    p.add_argument("new", help="the newer results file")
    p.add_argument("--threshold", type=float, default=THRESHOLD,
                   help=f"smallest relative change flagged (default {THRESHOLD:g})")
    p.add_argument("--all", action="store_true", help="print every figure, not only those that moved")
    args = p.parse_args(argv)
    if not args.threshold >= 0:
        p.error(f"--threshold must be non-negative, got {args.threshold}")
    try:
        old, new = read_json(args.old), read_json(args.new)
    except (OSError, ValueError) as e:
        print(f"python -m bench compare: {e}", file=sys.stderr)
        return 2
    print(f"OLD: {args.old} ({old.get('created', '?')}: {old.get('command', '?')})")
    print(f"NEW: {args.new} ({new.get('created', '?')}: {new.get('command', '?')})")
    for key in sorted(set(old.get("machine", {})) | set(new.get("machine", {}))):
        a, b = old.get("machine", {}).get(key), new.get("machine", {}).get(key)
        if a != b and key != "load_average":
            print(f"machine differs: {key}: {a} -> {b}")
    changes, only = compare(old, new, args.threshold)
    print(format_changes(changes, only, args.threshold, args.all))
    return 1 if any(c.verdict == "regression" for c in changes) else 0
