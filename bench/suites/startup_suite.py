"""The ``startup`` suite: what a training job waits for before its first step, each measured in fresh processes.

- ``import <package>``: the seconds ``import jax``, ``import infeed``, ``import
  xla_runtime`` and ``import estimator`` take in a fresh Python process (timed
  inside it, so the interpreter's own start is not counted; the packages' files
  in the page cache and their bytecode compiled, by an untimed first pass). The
  target: ``import estimator`` under :data:`IMPORT_TARGET_MS`.
- ``Estimator(...) to first step``: in a fresh process that has imported
  ``estimator``, from the call ``Estimator(...)`` to the first step's loss on the
  host: the Estimator made, ``train`` called, the decoding daemon started (2
  workers, 4 slots: RunConfig's defaults) and its first slot decoded from
  TFRecords, the variables made, the train loop traced, compiled and run. The
  first step's loss comes back with its loop's (``iterations_per_loop`` =
  :data:`K` steps of a small model, a few milliseconds together); its time is when
  ``EstimatorSpec.host_call``'s function first runs.
- ``compile``: the part of that spent compiling, from :mod:`jax.monitoring`'s
  events (:class:`xla_runtime.CompileWatch`): ``XLA compile`` (XLA's own
  compilations, or with a warm persistent cache reading their executables from
  it) and ``trace + lower`` (JAX tracing the Python functions and lowering them
  to StableHLO, paid with or without the cache), of every program compiled until
  the first step: the train loop, ``init_fn``'s, the initial train state's and
  JAX's small eager programs. ``excluding compile`` is the rest: imports made at
  first use (orbax, the workers' own start), the daemon, decoding, transfers,
  running.

Three kinds of run, interleaved: ``no cache`` (JAX's persistent compilation
cache off, as JAX's default); ``cache, first run``: ``RunConfig(
compilation_cache_dir=...)`` on an empty directory (every program compiled and
written there); ``cache, second run``: a new process on the directory the first
run filled (what a restarted job sees).

The model (``MODEL``): an MLP 784-64-10 with ReLU, softmax cross-entropy and
``optax.adam(1e-3)``, batch :data:`BATCH`, on the ``mnist`` layout of
:mod:`bench.data.datasets`; one CPU device (``JAX_PLATFORMS=cpu``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

from bench.data import datasets
from bench.harness import SuiteResult, Timing, log
from bench.harness.children import child_env, child_main, run_child

__all__ = ["run", "IMPORTS", "IMPORT_TARGET_MS", "RUNS", "TIMINGS", "K", "BATCH", "RECORDS", "import_name"]

SUITE = "startup"
MODULE = "bench.suites.startup_suite"
LAYOUT = "mnist"
#: The packages whose import is timed, in this order.
IMPORTS = ("jax", "infeed", "xla_runtime", "estimator")
#: ``import estimator`` should take less than this (milliseconds).
IMPORT_TARGET_MS = 1000
#: The kinds of run to the first step.
NO_CACHE, CACHE_FIRST, CACHE_SECOND = "no cache", "cache, first run", "cache, second run"
RUNS = (NO_CACHE, CACHE_FIRST, CACHE_SECOND)
FIRST_STEP = "Estimator(...) to first step"
EXCLUDING = f"{FIRST_STEP}, excluding compile"
XLA_COMPILE = "XLA compile"
TRACE_LOWER = "trace + lower"
#: The timings of each kind of run, in this order.
TIMINGS = (FIRST_STEP, EXCLUDING, XLA_COMPILE, TRACE_LOWER)
#: Steps per compiled loop, global batch, records in the data file.
K, BATCH, RECORDS = 10, 64, 2048
MODEL = "mlp 784-64-10, adam"
#: Seconds a measuring process may take before it is killed.
CHILD_TIMEOUT = 300


def import_name(package: str) -> str:
    return f"import {package}"


# --- the measuring process (imports JAX) ------------------------------------------------------------

def _child(config: dict) -> None:
    import jax
    import optax

    import estimator as est
    import infeed
    import xla_runtime as xr

    spec = datasets.LAYOUTS[LAYOUT].spec()
    first: list = []

    def init_fn(rng, features):
        k1, k2 = jax.random.split(rng)
        return {"w1": jax.random.normal(k1, (784, 64)) * 0.05, "b1": jax.numpy.zeros(64),
                "w2": jax.random.normal(k2, (64, 10)) * 0.1, "b2": jax.numpy.zeros(10)}

    def model_fn(v, features, labels, mode, params):
        logits = jax.nn.relu(features["image"] @ v["w1"] + v["b1"]) @ v["w2"] + v["b2"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return est.EstimatorSpec(mode, loss=loss, host_call=(on_host, {"loss": loss}))

    def on_host(step, loss):
        if not first:
            first.append((time.perf_counter(), watch.as_dict(), step, float(loss)))

    def input_fn(params):
        return infeed.Dataset(config["data"], spec, batch_size=params["batch_size"], labels="label", num_epochs=None)

    with tempfile.TemporaryDirectory(prefix="bench-startup-model-") as model_dir, xr.CompileWatch() as watch:
        start = time.perf_counter()
        run_config = est.RunConfig(model_dir=model_dir, iterations_per_loop=K, save_checkpoints_steps=10**9,
                                   compilation_cache_dir=config["cache_dir"])
        with est.Estimator(model_fn, init_fn, optax.adam(1e-3), run_config, train_batch_size=BATCH) as e:
            e.train(input_fn, steps=K)
    if not first or first[0][2] != 0:
        raise RuntimeError(f"the host_call did not see step 0 first: {first}")
    done, compiled, _, loss = first[0]
    with open(config["out"], "w") as f:
        json.dump({"jax": jax.__version__, "first_step_s": done - start, "compiled": compiled,
                   "loss": loss, "cache_files": sorted(os.listdir(config["cache_dir"])) if config["cache_dir"] else []},
                  f)


def _import_seconds(package: str, timeout: float) -> float:
    """Seconds ``import <package>`` takes in a fresh process on one CPU device (the interpreter's start not counted)."""
    code = f"import time; t = time.perf_counter(); import {package}; print(time.perf_counter() - t)"
    done = subprocess.run([sys.executable, "-c", code], env=child_env(1), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{SUITE}: `import {package}` failed in a fresh process: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.strip().splitlines()[-1])


# --- the suite (this process: no JAX) ---------------------------------------------------------------

def run(*, quick: bool = False, repeats: int | None = None, data_dir=None, seed: int = 0,
        timeout: float = CHILD_TIMEOUT) -> SuiteResult:
    """Times the imports and the three kinds of run to the first step, each sample a fresh process.

    quick: a smoke run, not figures to quote: 2 samples of each import and 1 run of each kind.
    repeats: runs of each kind to the first step (default 3, 1 with ``quick``); each import is timed
        ``2 * repeats + 1`` times (after an untimed pass).
    data_dir: where the data file goes and is reused from; default a temporary directory, removed after.
    """
    repeats = repeats if repeats is not None else (1 if quick else 3)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats!r}")
    import_samples = 2 if quick else 2 * repeats + 1
    result = SuiteResult(SUITE, group_label="what", name_label="case",
                         params={"repeats": repeats, "import_samples": import_samples, "k": K, "batch": BATCH,
                                 "model": MODEL, "layout": LAYOUT, "records": RECORDS, "seed": seed, "devices": 1})
    started = time.perf_counter()
    log(f"{SUITE}: timing {', '.join(map(import_name, IMPORTS))} in fresh processes, {import_samples} times each "
        "after an untimed pass ...")
    imports = {p: [] for p in IMPORTS}
    for sample in range(import_samples + 1):
        for package in IMPORTS:
            seconds = _import_seconds(package, timeout)
            if sample:
                imports[package].append(seconds * 1e3)
    for package in IMPORTS:
        result.timings.append(Timing.of(SUITE, "imports", import_name(package), "ms", imports[package],
                                        target_max=IMPORT_TARGET_MS if package == "estimator" else None))
    runs: dict = {kind: [] for kind in RUNS}
    with contextlib.ExitStack() as stack:
        [ds] = datasets.ensure_datasets(stack, data_dir, {LAYOUT: RECORDS}, seed, log, SUITE)
        for r in range(repeats):
            cache_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-startup-cache-"))
            for kind in RUNS:
                log(f"{SUITE}: run {r + 1}/{repeats} to the first step, {kind}, in a new process ...")
                runs[kind].append(run_child({"devices": 1, "data": ds.path,
                                             "cache_dir": None if kind == NO_CACHE else cache_dir},
                                            timeout, MODULE, SUITE))
    for kind in RUNS:
        _add_run(result, kind, runs[kind])
    result.params["jax"] = runs[NO_CACHE][0]["jax"]
    result.params["seconds"] = round(time.perf_counter() - started, 1)
    result.notes += _notes(result, runs, datasets.data_note(ds))
    return result


def _add_run(result: SuiteResult, kind: str, got: list[dict]) -> None:
    values = {FIRST_STEP: [g["first_step_s"] for g in got],
              XLA_COMPILE: [g["compiled"]["compile_seconds"] for g in got],
              TRACE_LOWER: [g["compiled"]["trace_seconds"] + g["compiled"]["lower_seconds"] for g in got]}
    values[EXCLUDING] = [t - c - tl for t, c, tl in zip(values[FIRST_STEP], values[XLA_COMPILE], values[TRACE_LOWER])]
    for name in TIMINGS:
        result.timings.append(Timing.of(SUITE, kind, name, "ms", [s * 1e3 for s in values[name]]))
    result.params.setdefault("programs", {})[kind] = [g["compiled"]["programs"] for g in got]
    result.params.setdefault("cache_hits", {})[kind] = [g["compiled"]["cache_hits"] for g in got]
    result.params.setdefault("cache_writes", {})[kind] = [g["compiled"]["cache_writes"] for g in got]
    if kind == CACHE_SECOND and any(g["compiled"]["cache_hits"] == 0 for g in got):
        raise RuntimeError(f"{SUITE}: a second run found nothing in the persistent cache: {result.params}")


def _notes(result: SuiteResult, runs: dict, data_note: str) -> list[str]:
    p = result.params
    second = result.timing(CACHE_SECOND, FIRST_STEP).median
    cold = result.timing(NO_CACHE, FIRST_STEP).median
    return [f"imports: each timed inside a fresh process (`import time; t = time.perf_counter(); import X`), "
            f"{p['import_samples']} samples after an untimed pass (bytecode compiled, files in the page cache); the "
            f"interpreter's own start is not counted. A package's time includes what it imports (estimator: jax, "
            f"infeed, xla_runtime); orbax-checkpoint and optax are imported at first use, not by `import estimator`.",
            f"{FIRST_STEP}: from the call Estimator(...) to the first step's loss on the host "
            f"(EstimatorSpec.host_call's function, after the first loop of K={K} steps of the {MODEL}, "
            f"batch {BATCH}); in a fresh process per run ({p['repeats']} of each kind, interleaved), one CPU device, "
            f"RunConfig(iterations_per_loop={K}) and its defaults (2 decoding workers, 4 slots). XLA compile and "
            f"trace + lower: jax.monitoring's compile events (xla_runtime.CompileWatch) until then; with a warm "
            f"cache, 'XLA compile' is reading the executables from it. Programs compiled until then: "
            + "; ".join(f"{k} {v}" for k, v in p["programs"].items())
            + "; read from the cache: " + "; ".join(f"{k} {v}" for k, v in p["cache_hits"].items())
            + "; written to it: " + "; ".join(f"{k} {v}" for k, v in p["cache_writes"].items()) + ".",
            f"the persistent cache's second run reaches its first step in {second:,.0f} ms against {cold:,.0f} ms "
            f"without the cache ({cold / second:.2f}x sooner).",
            data_note]


def main(argv=None) -> int:
    return child_main(MODULE, SUITE, _child, argv)


if __name__ == "__main__":
    sys.exit(main())
