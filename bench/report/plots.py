"""The report's plots (matplotlib, PNG), drawn from a results file's suites as
:func:`bench.harness.results.write_json` wrote them.

One function per plot; each takes the saved suites (``doc["suites"]``) and
returns a matplotlib ``Figure``, or None when the suites it needs were not
run. Every bar and point is a median; the whiskers are the min..max of its
repeats. :data:`PLOTS` is what :mod:`bench.report.markdown` draws, in order.

matplotlib is the ``bench`` extra (``pip install -e .[bench]``); this module
imports it, :mod:`bench.report.markdown` does so only when it is installed.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping

import matplotlib

matplotlib.use("Agg")           # files only: no display, whatever the environment says
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

__all__ = ["PLOTS", "decode", "infeed_workers_slots", "loop_iterations", "train_pipelines", "time_to_first_step",
           "transfer", "scaling"]

_DAEMON = re.compile(r"^daemon W=(\d+)(?:, (\d+) slots)?(, busy consumer)?$")
_COMPILE_LOOP = re.compile(r"^compile_loop K=(\d+)$")
_SCAN = re.compile(r"^hand-written scan K=(\d+)$")
_THOUSANDS = ticker.FuncFormatter(lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1e4
                                   else f"{v:,.0f}" if v >= 10 else f"{v:g}")
#: Bar colours: the peers (other libraries) and the baselines stand out from ours.
_PEERS, _BASELINES = ("tf.data", "Keras"), ("page cache",)


def _colour(name: str) -> str:
    return ("tab:orange" if name.startswith(_PEERS) else "tab:gray" if name.startswith(_BASELINES)
            else "tab:blue")


def _groups(suite: Mapping, kind: str = "figures") -> dict[str, list[dict]]:
    out = defaultdict(list)
    for x in suite.get(kind, ()):
        out[x["group"]].append(x)
    return dict(out)


def _grid(n: int, width: float = 5.2, height: float = 3.6):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _whiskers(figures: list[dict], key: str) -> list[list[float]]:
    """The min..max of each figure's rate around its median, as matplotlib's ``xerr``/``yerr`` take them."""
    def scale(f):       # every rate of a figure is proportional to its records/s
        return f[key] / f["records_per_s"]

    lo = [f[key] - f["records_per_s_min"] * scale(f) for f in figures]
    hi = [f["records_per_s_max"] * scale(f) - f[key] for f in figures]
    return [[max(0.0, x) for x in lo], [max(0.0, x) for x in hi]]


def _bars(suite: Mapping | None, title: str, key: str, unit: str, keep: Callable[[dict], bool] = lambda f: True):
    """Horizontal bars, one subplot per group: each figure's median ``key``, its min..max as whiskers."""
    if not suite:
        return None
    groups = {g: [f for f in fs if keep(f) and f.get(key) is not None] for g, fs in _groups(suite).items()}
    groups = {g: fs for g, fs in groups.items() if fs}
    if not groups:
        return None
    fig, axes = _grid(len(groups), width=6.4, height=0.5 + 0.42 * max(len(fs) for fs in groups.values()))
    for ax, (group, figs) in zip(axes, groups.items()):
        y = range(len(figs))
        ax.barh(list(y), [f[key] for f in figs], xerr=_whiskers(figs, key), alpha=0.8,
                color=[_colour(f["name"]) for f in figs], error_kw={"elinewidth": 1, "capsize": 2})
        ax.set_yticks(list(y), [f["name"] + (" *" if f.get("noise") else "") for f in figs], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(group, fontsize=10)
        ax.set_xlabel(unit)
        ax.xaxis.set_major_formatter(_THOUSANDS)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(title + ("  (* flagged noisy or 1 run)" if any(f.get("noise") for fs in groups.values()
                                                                 for f in fs) else ""), fontsize=11)
    fig.tight_layout()
    return fig


def decode(suites: Mapping):
    """``bench decode``: records/s of each pipeline per layout (tf.data's rows where TensorFlow ran)."""
    return _bars(suites.get("decode"), "decode: records/s per layout (median, min..max)", "records_per_s",
                 "records/s")


def infeed_workers_slots(suites: Mapping):
    """``bench infeed``: the daemon's records/s against its worker count, a line per ring size (busy consumer)
    and for the idle consumer, with the single-process parse as a dashed line."""
    suite = suites.get("infeed")
    if not suite:
        return None
    groups = _groups(suite)
    fig, axes = _grid(len(groups))
    for ax, (group, figs) in zip(axes, groups.items()):
        lines = defaultdict(list)
        for f in figs:
            m = _DAEMON.match(f["name"])
            if m:
                workers, slots, busy = int(m.group(1)), m.group(2), bool(m.group(3))
                label = (f"busy consumer, {int(slots or suite['params'].get('slots', 0)):2d} slots" if busy
                         else "idle consumer")
                lines[label].append((workers, f))
            elif f["name"].startswith("parse"):
                ax.axhline(f["records_per_s"], color="grey", linestyle="--", label=f["name"])
        for label, points in sorted(lines.items()):
            points.sort(key=lambda p: p[0])
            xs, fs = [p[0] for p in points], [p[1] for p in points]
            ax.errorbar(xs, [f["records_per_s"] for f in fs], yerr=_whiskers(fs, "records_per_s"), marker="o",
                        capsize=2, label=label)
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("decoding workers (W)")
        ax.set_ylabel("records/s")
        ax.yaxis.set_major_formatter(_THOUSANDS)
        ax.set_ylim(bottom=0)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("infeed daemon: records/s against workers and ring slots (steady state)", fontsize=11)
    fig.tight_layout()
    return fig


def scaling(suites: Mapping, name: str):
    """The scaling tables of suite ``name`` (``bench infeed``, ``bench images``), a subplot each: records/s
    against W, beside W=1's rate times what W processes parsing alone gain where measured, and the efficiency
    (speed-up over W=1 / W) on a second axis; oversubscribed W shaded, refused W left out."""
    tables = (suites.get(name) or {}).get("scaling")
    if not tables:
        return None
    fig, axes = _grid(len(tables))
    for ax, table in zip(axes, tables):
        rows = [r for r in table["rows"] if "refused" not in r]
        ax.plot([r["workers"] for r in rows], [r["records_per_s"] for r in rows], marker="o", label="records/s")
        bounded = [r for r in rows if "bound_speedup" in r and r["speedup"]]
        if bounded:         # W=1's rate times what W processes parsing alone gain: the machine's own scaling
            one = bounded[0]["records_per_s"] / bounded[0]["speedup"]
            ax.plot([r["workers"] for r in bounded], [one * r["bound_speedup"] for r in bounded], marker=".",
                    linestyle=":", color="tab:grey", label="W processes alone (x W=1)")
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(_THOUSANDS)
        ax.set_ylabel("records/s")
        efficient = [r for r in rows if r["efficiency"] is not None]
        eff = ax.twinx()
        eff.plot([r["workers"] for r in efficient], [r["efficiency"] for r in efficient], marker="s",
                 linestyle="--", color="tab:green", label="efficiency")
        eff.set_ylim(0, max([1.1, *(r["efficiency"] * 1.1 for r in efficient)]))
        eff.yaxis.set_major_formatter(ticker.PercentFormatter(1.0))
        eff.set_ylabel("efficiency (speed-up / W)")
        top = max(r["workers"] for r in table["rows"])
        if top > table["cpus"]:
            ax.axvspan(table["cpus"] + 0.5, top + 0.5, color="grey", alpha=0.15, label="oversubscribed")
        ax.set_title(f"{table['group']}: {table['name']}", fontsize=10)
        ax.set_xlabel("decoding workers (W)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        lines = [*ax.get_legend_handles_labels(), *eff.get_legend_handles_labels()]
        ax.legend(lines[0] + lines[2], lines[1] + lines[3], fontsize=7)
    fig.suptitle(f"{name}: scaling with the workers (steady state)", fontsize=11)
    fig.tight_layout()
    return fig


def loop_iterations(suites: Mapping):
    """``bench loop``: steps/s against ``iterations_per_loop`` (K) for compile_loop, with a per-step loop and a
    hand-written scan as references, one subplot per model and device count."""
    suite = suites.get("loop")
    if not suite:
        return None
    groups = _groups(suite)
    fig, axes = _grid(len(groups))
    for ax, (group, figs) in zip(axes, groups.items()):
        points = sorted((int(m.group(1)), f) for f in figs if (m := _COMPILE_LOOP.match(f["name"])))
        if points:
            fs = [p[1] for p in points]
            ax.errorbar([p[0] for p in points], [f["batches_per_s"] for f in fs],
                        yerr=_whiskers(fs, "batches_per_s"), marker="o", capsize=2, label="compile_loop")
        for f in figs:
            if f["name"].startswith("per-step"):
                ax.axhline(f["batches_per_s"], color="tab:red", linestyle="--", label=f["name"])
            elif m := _SCAN.match(f["name"]):
                ax.plot([int(m.group(1))], [f["batches_per_s"]], marker="s", color="tab:green", linestyle="none",
                        label=f["name"])
        ax.set_xscale("log")
        rates = [f["batches_per_s"] for f in figs if f.get("batches_per_s")]
        if rates and max(rates) > 20 * min(rates):         # decades apart (the tiny model): a log scale
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.yaxis.set_major_formatter(_THOUSANDS)
        ax.set_title(group, fontsize=10)
        ax.set_xlabel("iterations_per_loop (K)")
        ax.set_ylabel("steps/s")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle("compiled loop: steps/s against iterations_per_loop", fontsize=11)
    fig.tight_layout()
    return fig


def train_pipelines(suites: Mapping):
    """``bench train``: steps/s of training from TFRecords (the Estimator, compile_loop from the daemon) against
    training from memory (compile_loop on a device slab, a per-step loop, Keras where it ran)."""
    return _bars(suites.get("train"), "training: steps/s from TFRecords against from memory (median, min..max)",
                 "batches_per_s", "steps/s")


def transfer(suites: Mapping):
    """``bench transfer`` (on an accelerator): MB/s of host-to-device copies from a pinned ring slot and from
    pageable memory, device-to-host, and the device's own copy."""
    return _bars(suites.get("transfer"), "host <-> device bandwidth (median, min..max)", "mb_per_s", "MB/s",
                 keep=_bandwidth)


def _bandwidth(figure: Mapping) -> bool:
    """A bandwidth row of the transfer suite: one that counts no batches (its other rows are the loop suite's, on the
    device, in steps)."""
    return figure.get("batches") is None


def time_to_first_step(suites: Mapping):
    """``bench loop``: a fresh compile_loop's time to its first step, cold and from JAX's persistent cache."""
    suite = suites.get("loop")
    timings = [t for t in (suite or {}).get("timings", ()) if t["name"].startswith("time to first step")]
    if not timings:
        return None
    groups = list(dict.fromkeys(t["group"] for t in timings))
    kinds = list(dict.fromkeys(t["name"] for t in timings))
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        ts = [next((t for t in timings if t["group"] == g and t["name"] == kind), None) for g in groups]
        xs = [j + i * width for j, t in enumerate(ts) if t]
        ts = [t for t in ts if t]
        ax.bar(xs, [t["median"] for t in ts], width,
               yerr=[[t["median"] - t["min"] for t in ts], [t["max"] - t["median"] for t in ts]],
               capsize=2, label=kind.removeprefix("time to first step: "))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], groups, fontsize=8)
    ax.set_ylabel("ms")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("time to first step: cold against JAX's persistent compilation cache", fontsize=11)
    fig.tight_layout()
    return fig


#: File stem -> (the suite whose section shows it, the plot function), in the report's order.
PLOTS: dict[str, tuple[str, Callable]] = {
    "decode": ("decode", decode),
    "infeed": ("infeed", infeed_workers_slots),
    "infeed-scaling": ("infeed", lambda suites: scaling(suites, "infeed")),
    "images-scaling": ("images", lambda suites: scaling(suites, "images")),
    "loop": ("loop", loop_iterations),
    "time-to-first-step": ("loop", time_to_first_step),
    "train": ("train", train_pipelines),
    "transfer": ("transfer", transfer),
}


def save(fig, path) -> None:
    """Writes ``fig`` as a PNG and frees it."""
    fig.savefig(path, dpi=110)
    plt.close(fig)
