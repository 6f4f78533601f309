"""Runs benchmark suites, prints their tables, and saves their figures with a Markdown report and plots.

Every run writes bench-results/<date>-<host>.json (the figures with their
spread and the machine's facts), a report <date>-<host>.md next to it and its
plots in <date>-<host>/ (--out DIR, --json PATH or --no-save change that).
A figure whose runs spread wider than --noise-bound is flagged NOISY. A daemon's
figure is its steady state over at least 8 batches per worker (the data is sized
for the largest of --workers); where a small --scale leaves too few, it is
refused, the reason printed in place of its numbers and of its ratios.

examples (from the repository root):
  python -m bench all                 # every suite, ~10 minutes on 2 cores
  python -m bench decode              # ~1 minute with TensorFlow installed
  python -m bench decode --quick      # ~20 seconds: fewer records and runs
  python -m bench infeed              # the decoding daemon: workers and ring slots, ~2 minutes on 2 cores
  python -m bench infeed --workers 1,2,4 --slots 2,8 --layouts mnist   # with a scaling table and plot
  python -m bench remote              # the daemon from an S3 server on loopback, directly and behind 25 ms a request,
                                      # against a local file (criteo, imagenet; W=1, 2): ~3 minutes
  python -m bench grain               # a Grain pipeline over infeed.grain's source and decoder against Grain's
                                      # own path (ArrayRecord + protobuf) and the daemon (W=1), ~3 minutes
  python -m bench images              # JPEGs to 224x224 into the ring (W=1, 2) against tf.data, ~4 minutes
  python -m bench images --quick
  python -m bench cpus                # each CPU's JPEG decoding alone and with the others busy: the bound of scaling
  python -m bench loop                # compiled loops: steps/s on 1 and 8 CPU devices, ~3 minutes on 2 cores
  python -m bench loop --quick --devices 1 --models tiny
  python -m bench train               # Estimator.train from TFRecords against compile_loop, 2-5 minutes on 2 cores
  python -m bench train --quick --devices 1,8 --steps 200
  python -m bench transfer            # on a GPU: host-to-device from a pinned ring slot (skipped on CPU)
  python -m bench startup             # imports, and Estimator(...) to the first step with and without the
                                      # persistent compilation cache, each in fresh processes: ~1 minute
  python -m bench compare bench-results/OLD.json bench-results/NEW.json
  python -m bench report bench-results/RUN.json     # draw a saved run's report again
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shlex
import sys
import tempfile
import time

from bench import harness
from bench.data import datasets
from bench.data.photos import PHOTO_SETS
from bench.report import compare, markdown
from bench.suites import (cpus_suite, decode_suite, grain_suite, images_suite, infeed_suite, loop_suite, remote_suite,
                          startup_suite, train_suite, transfer_suite)
from infeed.tfrecord.index_cache import INDEX_DIR_ENV

#: Suite name -> function(args) -> SuiteResult.  ``all`` runs them in this order.
SUITES = {
    "decode": lambda args: decode_suite.run(
        args.layouts or tuple(datasets.LAYOUTS), scale=args.scale, quick=args.quick, repeats=args.repeats,
        data_dir=args.data_dir, seed=args.seed, cpu=args.cpu, tensorflow=not args.no_tf),
    "infeed": lambda args: infeed_suite.run(
        args.layouts or tuple(datasets.LAYOUTS), workers=args.workers,
        slots=args.slots or infeed_suite.SLOT_SWEEP, scale=args.scale,
        quick=args.quick, repeats=args.repeats, data_dir=args.data_dir, seed=args.seed),
    "remote": lambda args: remote_suite.run(
        args.layouts or remote_suite.LAYOUTS, workers=args.workers or remote_suite.WORKERS, scale=args.scale,
        quick=args.quick, repeats=args.repeats, data_dir=args.data_dir, seed=args.seed),
    "grain": lambda args: grain_suite.run(
        args.layouts or grain_suite.LAYOUTS, scale=args.scale, quick=args.quick, repeats=args.repeats,
        data_dir=args.data_dir, seed=args.seed),
    "cpus": lambda args: cpus_suite.run(quick=args.quick, repeats=args.repeats, data_dir=args.data_dir,
                                       seed=args.seed),
    "images": lambda args: images_suite.run(
        args.sources or tuple(images_suite.SOURCES), workers=args.workers,
        slots=args.slots or (images_suite.SLOTS,), quick=args.quick, repeats=args.repeats, scale=args.scale,
        data_dir=args.data_dir, seed=args.seed, tensorflow=not args.no_tf, photo_set=args.photos),
    "loop": lambda args: loop_suite.run(
        list(args.devices or loop_suite.DEVICES), models=args.models or loop_suite.MODELS, quick=args.quick,
        repeats=args.repeats),
    "transfer": lambda args: transfer_suite.run(quick=args.quick, repeats=args.repeats,
                                               transfer_mb=args.transfer_mb),
    "train": lambda args: train_suite.run(
        list(args.devices or train_suite.DEVICES), quick=args.quick, repeats=args.repeats, steps=args.steps,
        data_dir=args.data_dir, seed=args.seed),
    "startup": lambda args: startup_suite.run(quick=args.quick, repeats=args.repeats, data_dir=args.data_dir,
                                              seed=args.seed),
}


def _counts(what: str):
    def parse(text: str) -> list[int]:
        try:
            out = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what} counts, got {text!r}") from None
        if not out or any(w < 1 for w in out):
            raise argparse.ArgumentTypeError(f"{what} counts must be positive, got {text!r}")
        return out
    return parse


_workers = _counts("worker")


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suites", nargs="+", choices=[*SUITES, "all"], metavar="SUITE",
                   help=f"one or more of: {', '.join(SUITES)}, all")
    p.add_argument("--quick", action="store_true",
                   help="fewer records and runs (~20 s a suite at the default --workers; the data of infeed, images "
                        "and remote grows with the largest W: minutes at W=4)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per case (default 7, --quick 3; loop, train: 5, --quick 1; startup: 3 runs of each "
                        "kind to the first step, --quick 1)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies every dataset's record count (default 1; 0.01 for a smoke run)")
    p.add_argument("--layouts", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated layouts (default: all of mnist,criteo,imagenet; grain: mnist,criteo)")
    p.add_argument("--workers", type=_workers, default=list(infeed_suite.WORKERS),
                   help="infeed, images, remote: comma-separated daemon worker counts (default: 1,2); the data is "
                        f"sized for the largest: {harness.STEADY_BATCHES_PER_WORKER} steady batches per worker. "
                        "Counts above this machine's CPUs are accepted, their rows marked oversubscribed; with two "
                        "or more, infeed and images print and save a scaling table (records/s, speed-up over W=1, "
                        "efficiency, the stage shares) and its plot")
    p.add_argument("--slots", type=_counts("slot"), default=None,
                   help="infeed: comma-separated ring sizes of the busy consumer's rows (default: 2,4,8,16); "
                        "images: of the daemon rows (default: 8); 8 is always among them")
    p.add_argument("--sources", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help=f"images: comma-separated photo sizes (default: all of {','.join(images_suite.SOURCES)})")
    p.add_argument("--devices", type=_counts("device"), default=None,
                   help="loop, train: comma-separated CPU device counts, one process each (default: loop 1,8; "
                        "train 1)")
    p.add_argument("--models", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="loop: comma-separated models (default: all of mlp,tiny)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"train: steps per train() call, and per run of every pipeline (default "
                        f"{train_suite.STEPS}, --quick {train_suite.QUICK_STEPS}; whole loops of "
                        f"{train_suite.ITERATIONS} steps, at least 2)")
    p.add_argument("--out", metavar="DIR", default="bench-results",
                   help="where the results file, its report and plots go (default bench-results); the files are "
                        "named <date>-<host>")
    p.add_argument("--transfer-mb", type=float, default=transfer_suite.TRANSFER_MB,
                   help=f"transfer: MB per host-device transfer (default {transfer_suite.TRANSFER_MB})")
    p.add_argument("--json", metavar="PATH",
                   help="the results file's path instead (its report and plots go next to it)")
    p.add_argument("--no-save", action="store_true", help="print the tables only: no results file, no report")
    p.add_argument("--noise-bound", type=float, default=harness.NOISE_BOUND,
                   help=f"flag a figure whose runs spread wider than this fraction of its median (default "
                        f"{harness.NOISE_BOUND:g})")
    p.add_argument("--data-dir", metavar="DIR",
                   help="write (and reuse) the datasets here instead of a temporary directory")
    p.add_argument("--photos", choices=list(PHOTO_SETS), default="sample",
                   help="images: the photo set (default sample: crops of scikit-learn's photos; textured: the same "
                        "with grain and a fine weave, more bits per pixel)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated datasets (default 0)")
    p.add_argument("--cpu", type=int, default=None,
                   help="decode: the CPU to pin to (default: the last allowed; infeed never pins)")
    p.add_argument("--no-tf", action="store_true", help="skip the tf.data comparison even if TensorFlow is installed")
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be positive, got {args.steps}")
    unknown = sorted(set(args.layouts or ()) - set(datasets.LAYOUTS))
    if unknown:
        p.error(f"unknown layouts {unknown}; known: {', '.join(datasets.LAYOUTS)}")
    unknown = sorted(set(args.sources or ()) - set(images_suite.SOURCES))
    if unknown:
        p.error(f"unknown sources {unknown}; known: {', '.join(images_suite.SOURCES)}")
    unknown = sorted(set(args.models or ()) - set(loop_suite.MODELS))
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(loop_suite.MODELS)}")
    if not args.scale > 0:
        p.error(f"--scale must be positive, got {args.scale}")
    if not args.transfer_mb > 0:
        p.error(f"--transfer-mb must be positive, got {args.transfer_mb}")
    if not args.noise_bound > 0:
        p.error(f"--noise-bound must be positive, got {args.noise_bound}")
    return args


def results_path(args) -> str | None:
    """Where the run's results file goes: ``--json``, else ``<--out>/<date>-<host>.json``; None with
    ``--no-save``."""
    if args.no_save:
        return None
    if args.json:
        return args.json
    host = "".join(c if c.isalnum() or c in "-_" else "-" for c in platform.node().split(".")[0]) or "host"
    return os.path.join(args.out, f"{time.strftime('%Y-%m-%d-%H%M%S')}-{host}.json")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return SUBCOMMANDS[argv[0]](argv[1:])
    args = parse_args(argv)
    names = list(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    command = shlex.join(["python", "-m", "bench", *argv])
    print(f"reproduce: {command}")
    machine = {**harness.machine_facts(), **harness.jax_devices()}
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)
    results = []
    started = time.perf_counter()
    with _indexes_of_its_own():
        for i, name in enumerate(names, 1):
            harness.log(f"[{i}/{len(names)}] {name}: starting ({_elapsed(started)} elapsed)")
            began = time.perf_counter()
            result = SUITES[name](args)
            result.noise_bound = args.noise_bound
            results.append(result)
            harness.log(f"[{i}/{len(names)}] {name}: done in {_elapsed(began)} ({len(result.figures)} figures, "
                        f"{len(result.noisy())} flagged)")
            print()
            print(harness.format_result(result), flush=True)
    path = results_path(args)
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tf_versions = {r.params.get("tensorflow") for r in results} - {None}
        harness.write_json(path, command, {**machine, "tensorflow": ", ".join(sorted(tf_versions)) or None},
                           results)
        md, plots = markdown.write_report(path)
        print(f"\nwrote {path}, the report {md}" + (f" and {len(plots)} plots" if plots else
                                                     " (no plots: pip install -e .[bench] adds matplotlib)"))
    return 0


@contextlib.contextmanager
def _indexes_of_its_own():
    """The indexes a daemon builds for the bench's data (``build_indexes="auto"``: local files from 2 workers on)
    go into a directory of the run's own, removed at its end, unless ``INFEED_INDEX_DIR`` names one: the data
    is the bench's (often in a temporary directory), and its entries would stay in the user's cache for good."""
    if os.environ.get(INDEX_DIR_ENV):
        yield
        return
    with tempfile.TemporaryDirectory(prefix="bench-indexes-") as kept:
        os.environ[INDEX_DIR_ENV] = kept
        try:
            yield
        finally:
            os.environ.pop(INDEX_DIR_ENV, None)


def _elapsed(since: float) -> str:
    s = int(time.perf_counter() - since)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


#: ``python -m bench compare OLD NEW`` and ``python -m bench report RESULTS``.
SUBCOMMANDS = {"compare": compare.main, "report": markdown.main}


if __name__ == "__main__":
    sys.exit(main())
