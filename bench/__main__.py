"""Runs benchmark suites, prints their tables and, with --json, saves their figures.

examples (from the repository root):
  python -m bench decode              # ~1 minute with TensorFlow installed
  python -m bench decode --quick      # ~20 seconds: fewer records and runs
  python -m bench infeed              # the decoding daemon, ~1 minute on 2 cores
  python -m bench infeed --workers 1,2,4 --layouts mnist
  python -m bench loop                # compiled loops: steps/s on 1 and 8 CPU devices, ~3 minutes on 2 cores
  python -m bench loop --quick --devices 1 --models tiny
  python -m bench train               # Estimator.train from TFRecords against compile_loop, 2-5 minutes on 2 cores
  python -m bench train --quick --devices 1,8 --steps 200
  python -m bench all --json out.json
"""

from __future__ import annotations

import argparse
import shlex
import sys

from bench import decode, harness, infeed_suite, loop_suite, train_suite

#: Suite name -> function(args) -> SuiteResult.  ``all`` runs them in this order.
SUITES = {
    "decode": lambda args: decode.run(
        args.layouts or tuple(decode.datasets.LAYOUTS), scale=args.scale, quick=args.quick, repeats=args.repeats,
        data_dir=args.data_dir, seed=args.seed, cpu=args.cpu, tensorflow=not args.no_tf),
    "infeed": lambda args: infeed_suite.run(
        args.layouts or tuple(decode.datasets.LAYOUTS), workers=args.workers, scale=args.scale, quick=args.quick,
        repeats=args.repeats, data_dir=args.data_dir, seed=args.seed),
    "loop": lambda args: loop_suite.run(
        list(args.devices or loop_suite.DEVICES), models=args.models or loop_suite.MODELS, quick=args.quick,
        repeats=args.repeats),
    "train": lambda args: train_suite.run(
        list(args.devices or train_suite.DEVICES), quick=args.quick, repeats=args.repeats, steps=args.steps,
        data_dir=args.data_dir, seed=args.seed),
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
    p.add_argument("--quick", action="store_true", help="fewer records and runs (~20 s a suite)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed runs per case (default 7, --quick 3; loop, train: 5, --quick 1)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies every dataset's record count (default 1; 0.01 for a smoke run)")
    p.add_argument("--layouts", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="comma-separated layouts (default: all of mnist,criteo,imagenet)")
    p.add_argument("--workers", type=_workers, default=list(infeed_suite.WORKERS),
                   help="infeed: comma-separated daemon worker counts (default: 1,2)")
    p.add_argument("--devices", type=_counts("device"), default=None,
                   help="loop, train: comma-separated CPU device counts, one process each (default: loop 1,8; "
                        "train 1)")
    p.add_argument("--models", type=lambda s: [x for x in s.split(",") if x], default=None,
                   help="loop: comma-separated models (default: all of mlp,tiny)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"train: steps per train() call, and per run of every pipeline (default "
                        f"{train_suite.STEPS}, --quick {train_suite.QUICK_STEPS}; whole loops of "
                        f"{train_suite.ITERATIONS} steps, at least 2)")
    p.add_argument("--json", metavar="PATH", help="also write the figures and machine facts as JSON")
    p.add_argument("--data-dir", metavar="DIR",
                   help="write (and reuse) the datasets here instead of a temporary directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated datasets (default 0)")
    p.add_argument("--cpu", type=int, default=None,
                   help="decode: the CPU to pin to (default: the last allowed; infeed never pins)")
    p.add_argument("--no-tf", action="store_true", help="skip the tf.data comparison even if TensorFlow is installed")
    args = p.parse_args(argv)
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.steps is not None and args.steps < 1:
        p.error(f"--steps must be positive, got {args.steps}")
    unknown = sorted(set(args.layouts or ()) - set(decode.datasets.LAYOUTS))
    if unknown:
        p.error(f"unknown layouts {unknown}; known: {', '.join(decode.datasets.LAYOUTS)}")
    unknown = sorted(set(args.models or ()) - set(loop_suite.MODELS))
    if unknown:
        p.error(f"unknown models {unknown}; known: {', '.join(loop_suite.MODELS)}")
    if not args.scale > 0:
        p.error(f"--scale must be positive, got {args.scale}")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    names = list(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    command = shlex.join(["python", "-m", "bench", *argv])
    print(f"reproduce: {command}")
    machine = harness.machine_facts()
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine.items()), flush=True)
    results = []
    for name in names:
        result = SUITES[name](args)
        results.append(result)
        print()
        print(harness.format_result(result), flush=True)
    if args.json:
        tf_versions = {r.params.get("tensorflow") for r in results} - {None}
        harness.write_json(args.json, command, {**machine, "tensorflow": ", ".join(sorted(tf_versions)) or None},
                           results)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
