"""The ``train`` suite: steps/s of ``Estimator.train`` fed from TFRecords, against ``compile_loop`` alone.

The model is the loop suite's mlp as an Estimator ``model_fn``: 784-512-512-10,
ReLU, softmax cross-entropy, batch 128, ``optax.adam(1e-3)``; its input the
``mnist`` layout of :mod:`bench.data.datasets` (``image`` 784 float32, ``label``
int64; written by ``ensure_dataset``, so a shared ``--data-dir`` reuses it),
read in order, epoch after epoch (``num_epochs=None``). Per device count, in
one process, every pipeline runs ``steps`` steps per run (a multiple of K,
default 100 steps a loop), training going on from run to run:

- ``Estimator.train from TFRecords``: ``est.Estimator(model_fn, init_fn,
  optax.adam(1e-3), RunConfig(iterations_per_loop=K,
  save_checkpoints_steps=10**9), train_batch_size=128).train(input_fn,
  steps=steps)``, ``input_fn`` returning an ``infeed.Dataset`` of the file
  with ``labels="label"``. Everything else is the RunConfig's default (2
  decoding workers, 4 ring slots, logging and summaries every 100 steps, 5
  checkpoints kept) except that logging and summaries are set to every loop
  (K steps: the default at K=100). So no checkpoint is due during a run, but
  ``train`` saves one at its end (and waits for it): that cost is in every run
  (see the timings). The input stays open between calls (``train`` keeps an
  ``infeed.Dataset`` input's daemon and feeder for the next call of the same
  Dataset), so only the first call, before timing, starts a daemon.
- ``compile_loop K=k from TFRecords``: what the estimator does, by hand:
  ``infeed.Daemon`` of the same dataset (``steps_per_slot=K``, the same workers,
  slots and memory locking), ``xla_runtime.Feeder(daemon, mesh, P(None,
  "data"))`` and ``xla_runtime.compile_loop(step, K, mesh)`` over its device
  batches, one daemon and feeder for every run (as the estimator's), the state
  carried on the devices. ``step`` calls the same ``model_fn`` and takes an Adam step. The
  difference to the row above is the estimator's own work: its per-loop host
  round trip (the losses fetched, logged, written as summaries), the end
  checkpoint, the event file and logger.
- ``compile_loop K=k in device memory``: the same compiled loop (the same
  object) called ``steps / K`` times on one ``[K, B, ...]`` slab placed on the
  devices beforehand (the first K batches of the file).
- ``per-step python loop in device memory``: ``jax.jit(step,
  donate_argnums=0)`` once per step on per-step device batches (the slab's K
  batches, reused), for reference.
- ``Keras fit, JAX backend, in memory``: the peer a Keras user would reach
  for, where Keras 3 is installed (``pip install -e .[bench]``; skipped with
  a note otherwise): the same model as a ``keras.Sequential`` of three
  ``Dense`` layers with the same initial weights, ``keras.optimizers.Adam(1e-3,
  epsilon=1e-8)`` (optax's epsilon), sparse categorical cross-entropy from
  logits, ``compile(steps_per_execution=K, jit_compile=True)``, and per run
  ``fit(x, y, batch_size=128, epochs=steps / K, shuffle=False)`` over the
  slab's K batches as numpy arrays in host memory (one epoch = one execution
  of K steps), on the JAX backend (``KERAS_BACKEND=jax`` in the measuring
  process). Its first epoch's mean loss must agree with compile_loop's first
  K losses'.

The two TFRecord rows are also rated in their ``steady state``: from the end
of a run's first loop to the end of its last (loops 2..N: the first loop's
wait for the devices, the end checkpoint and the call's own start and end left
out). The estimator's loop ends are the times its step logger logs
them (a ``logging.Handler`` on the ``estimator`` logger); compile_loop's first
loop end is a ``block_until_ready`` of its outputs. The timings split a run
into that start, the steady loops and the end, and give the estimator's
overhead per ``train()`` call (its run's seconds less compile_loop's, per
interleaved pair) and a separate ``Checkpoints.save`` + ``wait`` of a train
state of the same shapes. compile_loop's consumer dispatches its loops as the
feeder hands it batches, ahead of the devices; the estimator waits for each
loop's losses before it takes the next batch, so its host work between loops
(fetching, logging, summaries, dispatch) is on the critical path: the steady
state ratio of the two shows what that costs.

The targets: ``Estimator.train`` at least 95% of compile_loop's steps/s from
the same daemon (the estimator's overhead within 5%), at least 90% of the
in-memory loop's, both over whole ``train()`` calls, and at least 95% of the
in-memory loop's times (1 - the input's CPU share): the input may cost the
training the CPU time it takes from the compiled loops on the same CPUs, and
little more. That share (a timing) is the daemon's workers' CPU seconds (read
from ``/proc``) plus the feeder's copies to the devices, over a run's wall time
times the CPUs allowed; the input's stages over the last run
(``Estimator.input_stats()``) are in the report beside the figures.

As in the loop suite, each device count is measured in its own process
(``python -m bench.suites.train_measure --child``; ``XLA_FLAGS`` sets the number of CPU
devices, no persistent compilation cache; see
:func:`bench.harness.children.run_child`) and the batch is global (16 examples per
device on 8). Before timing, the estimator's first ``train`` call (K steps:
compilation) runs, and every pipeline's first K losses must agree with the
others' (the estimator's logged loss at step K with compile_loop's; all
pipelines start from the same variables: ``init_fn`` ignores its key and
returns values made with numpy, which the estimator's ``jit`` of ``init_fn``
cannot round differently). Then the estimator trains K more steps and
compile_loop runs one more loop from the daemon: a second call may compile
again (at the time of writing compile_loop did, once its step index came from
its own last call instead of the host). The cases are then interleaved (A B C
D A B C D, see :func:`bench.harness.interleave`) with no further warm-up pass;
a program compiled while timing (JAX's backend-compile event) is reported in
the notes and in ``params["compiled_while_timing_s"]``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Sequence

from bench.data import datasets
from bench.harness import Case, Measurement, Ratio, SuiteResult, Timing, log
from bench.harness.children import run_child

__all__ = ["run", "default_steps", "figure_names", "timing_names", "ratio_targets", "group_name", "cl_name",
           "mem_name", "steady", "DEVICES", "BATCH", "ITERATIONS", "STEPS", "QUICK_STEPS", "WORKERS", "SLOTS", "EST",
           "PY", "KERAS", "STEADY", "OVERHEAD", "CHECKPOINT", "TARGET_VS_DAEMON_LOOP", "TARGET_VS_MEMORY", "LAYOUT",
           "TARGET_VS_MEMORY_LESS_INPUT", "INPUT_CPU", "less_input_name"]

SUITE = "train"
LAYOUT = "mnist"
DEVICES = (1,)
#: Global batch per step.
BATCH = 128
#: Steps per compiled loop (RunConfig.iterations_per_loop), unless run() is told otherwise.
ITERATIONS = 100
#: Steps per run: a full run, --quick.
STEPS, QUICK_STEPS = 1000, 300
#: The decoding daemon's workers and ring slots: RunConfig's defaults, for the estimator and compile_loop alike.
WORKERS, SLOTS = 2, 4
#: Seconds a measuring process may take before it is killed.
CHILD_TIMEOUT = 1800
#: Relative tolerance of the first losses' agreement (the estimator's loss is logged with 6 digits).
LOSS_RTOL = 1e-4

EST = "Estimator.train from TFRecords"
PY = "per-step python loop in device memory"
KERAS = "Keras fit, JAX backend, in memory"
#: What the notes say when Keras is not installed.
KERAS_MISSING = ("Keras comparison skipped: Keras 3 is not installed (`pip install -e .[bench]` adds it; it runs on "
                 "the JAX backend)")
STEADY = ", steady state"
OVERHEAD = "estimator overhead per train() call"
CHECKPOINT = "checkpoint: Checkpoints.save + wait of the train state"
#: The CPUs' share the estimator's input took in a run: its workers' CPU seconds and the feeder's copies to the
#: devices over the run's wall time times the CPUs allowed.
INPUT_CPU = "Estimator.train's input: share of the CPUs"


def cl_name(k: int) -> str:
    return f"compile_loop K={k} from TFRecords"


def mem_name(k: int) -> str:
    return f"compile_loop K={k} in device memory"


def steady(name: str) -> str:
    return name + STEADY


def group_name(devices: int) -> str:
    return f"mlp, {devices} device{'s' if devices != 1 else ''}"


def _start_timing(name: str) -> str:
    return f"{name}: start to end of loop 1"


def _end_timing(name: str) -> str:
    return f"{name}: end of last loop to return"


#: Minimum ratios of the medians, whole train() calls: Estimator.train / compile_loop from the same daemon, and
#: Estimator.train / compile_loop in device memory.
TARGET_VS_DAEMON_LOOP, TARGET_VS_MEMORY = 0.95, 0.90
#: Estimator.train / (compile_loop in device memory x (1 - the input's CPU share)): the input may cost the
#: training its CPU time (its workers and copies share the CPUs with the compiled loops), and nothing more.
TARGET_VS_MEMORY_LESS_INPUT = 0.95


def less_input_name(k: int) -> str:
    return f"{EST} / ({mem_name(k)} x (1 - input CPU share))"


def default_steps(quick: bool = False, k: int | None = None) -> int:
    """Steps per run: :data:`STEPS` (:data:`QUICK_STEPS` with ``quick``) rounded up to whole loops of ``k``
    steps, at least two."""
    k = ITERATIONS if k is None else k
    return max(-(-(QUICK_STEPS if quick else STEPS) // k), 2) * k


def figure_names(k: int) -> list[str]:
    return [EST, steady(EST), cl_name(k), steady(cl_name(k)), mem_name(k), PY]


def timing_names(k: int) -> list[str]:
    return [_start_timing(EST), _start_timing(cl_name(k)), _end_timing(EST), _end_timing(cl_name(k)),
            OVERHEAD, CHECKPOINT, INPUT_CPU]


def ratio_targets(k: int, keras: bool = False) -> dict[str, float | None]:
    """Ratio name -> its target (None: shown, no target); ``keras``: with the Keras row's ratios."""
    return {f"{EST} / {cl_name(k)}": TARGET_VS_DAEMON_LOOP, f"{EST} / {mem_name(k)}": TARGET_VS_MEMORY,
            f"{steady(EST)} / {steady(cl_name(k))}": None, f"{steady(EST)} / {mem_name(k)}": None,
            f"{steady(cl_name(k))} / {mem_name(k)}": None, f"{mem_name(k)} / {PY}": None,
            **({f"{EST} / {KERAS}": None, f"{mem_name(k)} / {KERAS}": None} if keras else {}),
            less_input_name(k): TARGET_VS_MEMORY_LESS_INPUT}


# --- the suite (this process: no JAX) ---------------------------------------------------------------

def run(devices: Sequence[int] = DEVICES, *, quick: bool = False, repeats: int | None = None,
        steps: int | None = None, k: int | None = None, data_dir=None, seed: int = 0,
        timeout: float = CHILD_TIMEOUT) -> SuiteResult:
    """Measures the pipelines on every device count (one process each); returns figures, timings, ratios, notes.

    quick: a smoke run, not figures to quote: :data:`QUICK_STEPS` steps per run, one run per pipeline.
    repeats: timed runs per pipeline (default 5, 1 with ``quick``).
    steps: steps per run (default :func:`default_steps`): a multiple of ``k``, at least two loops.
    k: steps per compiled loop (default :data:`ITERATIONS`).
    data_dir: where the dataset goes and is reused from; default a temporary directory, removed after.
    """
    devices = list(dict.fromkeys(devices))
    if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in devices):
        raise ValueError(f"devices must be positive ints, got {devices!r}")
    bad = [d for d in devices if BATCH % d]
    if bad:
        raise ValueError(f"batch {BATCH} does not divide over {bad[0]} devices")
    k = ITERATIONS if k is None else k
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    steps = default_steps(quick, k) if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2 * k or steps % k:
        raise ValueError(f"steps per run must be a multiple of K={k}, at least two loops, got {steps!r}")
    repeats = repeats if repeats is not None else (1 if quick else 5)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    layout = datasets.LAYOUTS[LAYOUT]
    records = layout.quick_records if quick else layout.records
    result = SuiteResult(SUITE, group_label="model, devices", name_label="pipeline",
                         params={"devices": devices, "repeats": repeats, "warmup": 0, "batch": BATCH, "k": k,
                                 "steps": steps, "layout": LAYOUT, "records": records, "seed": seed,
                                 "infeed_workers": WORKERS, "infeed_slots": SLOTS, "save_checkpoints_steps": 10**9,
                                 "log_step_count_steps": k, "save_summary_steps": k})
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        [ds] = datasets.ensure_datasets(stack, data_dir, {LAYOUT: records}, seed, log, SUITE)
        data_note = datasets.data_note(ds, "read in order epoch after epoch (num_epochs=None), ")
        for d in devices:
            log(f"train: measuring on {d} CPU device{'s' if d > 1 else ''} in a new process ...")
            child = run_child({"devices": d, "k": k, "steps": steps, "repeats": repeats, "data": ds.path},
                              timeout, module="bench.suites.train_measure", suite=SUITE)
            result.params.update(jax=child["jax"], optax=child["optax"], platform=child["platform"],
                                 keras=(child["keras"] or {}).get("version"))
            for key in ("first_call_s", "compile_and_check_s"):
                result.params.setdefault(key, {})[child["group"]] = round(child[key], 2)
            result.params.setdefault("compiled_while_timing_s", {})[child["group"]] = [
                round(x, 3) for x in child["compiled_while_timing"]]
            _add_group(result, child)
    result.params["seconds"] = round(time.perf_counter() - started, 1)
    result.notes += [data_note, *_notes(result, devices, k)]
    return result


def _add_group(result: SuiteResult, got: dict) -> None:
    group, steps, k, b, per_step = got["group"], got["steps"], got["k"], got["batch"], got["nbytes_step"]
    keras = KERAS in got["seconds"]
    for name in figure_names(k) + ([KERAS] if keras else []):
        n = steps - k if name.endswith(STEADY) else steps
        fig = Measurement(Case(name, lambda: 0, n * b, n * per_step), got["seconds"][name]).figure(SUITE, group)
        result.figures.append(dataclasses.replace(fig, batches=n))
    for name in timing_names(k):
        if name != INPUT_CPU:
            result.timings.append(Timing.of(SUITE, group, name, "ms", got["timings"][name]))
    for name, target in ratio_targets(k, keras).items():
        if name == less_input_name(k):
            continue
        num, den = name.split(" / ")
        value = result.figure(group, num).records_per_s / result.figure(group, den).records_per_s
        result.ratios.append(Ratio(SUITE, group, name, value, target))
    share = statistics.median(got["input_cpu_share"])
    vs_memory = result.figure(group, EST).records_per_s / result.figure(group, mem_name(k)).records_per_s
    result.ratios.append(Ratio(SUITE, group, less_input_name(k), vs_memory / (1 - share),
                               TARGET_VS_MEMORY_LESS_INPUT))
    result.timings.append(Timing.of(SUITE, group, INPUT_CPU, "%", [100 * x for x in got["input_cpu_share"]]))
    result.stages.append(got["input_stages"])


def _notes(result: SuiteResult, devices, k: int) -> list[str]:
    p = result.params
    out = [f"batches/s = steps/s (one batch of {BATCH} per step); records/s = examples/s; MB/s = decoded input "
           f"bytes per second. Each figure: the median of {p['repeats']} interleaved runs of {p['steps']:,} steps "
           f"(K={k} steps per compiled loop), training going on from run to run; '{STEADY[2:]}': loops 2..N of the "
           f"same runs ({p['steps'] - k:,} steps), without a run's start (its first loop, whose input the daemon "
           "decoded while nothing ran) and end (the estimator's end checkpoint). The input stays open from run to "
           "run (the estimator keeps its training input between train() calls; compile_loop's daemon and feeder "
           "are kept likewise). "
           f"Estimator: RunConfig(iterations_per_loop={k}, save_checkpoints_steps=10**9, log_step_count_steps={k}, "
           f"save_summary_steps={k}), otherwise defaults ({WORKERS} decoding workers, {SLOTS} ring slots of K "
           "batches, memory locked); a checkpoint is saved (and waited for) at the end of every train() call, in "
           f"every run. CPU devices (XLA_FLAGS), jax {p.get('jax')}, optax {p.get('optax')} (Adam 1e-3).",
           f"before timing: the estimator's first train() call of {k} steps (compiling; "
           + ", ".join(f"{g}: {s:.1f} s" for g, s in p.get("first_call_s", {}).items())
           + f"), then every pipeline's first {k} losses checked against compile_loop's (the estimator's logged "
           f"loss at step K included), and a second train() call of {k} steps and compile_loop run of 1 loop "
           "(whatever compiles on a second call does so before timing)."]
    out.append(KERAS_MISSING if not p.get("keras") else
               f"{KERAS}: Keras {p['keras']}, model.fit(x, y, batch_size={BATCH}, epochs=steps/{k}) with "
               f"steps_per_execution={k} over the first {k} batches as numpy arrays (one epoch = one execution), the "
               "same model, initial weights and Adam; its first epoch's mean loss checked against compile_loop's.")
    for g, seconds in p.get("compiled_while_timing_s", {}).items():
        if seconds:
            out.append(f"{g}: WARNING: {len(seconds)} program(s) compiled while timing ({sum(seconds):.1f} s in all): "
                       "the figures include them.")
    for d in devices:
        g = group_name(d)
        t = {x.name: x.median for x in result.timings if x.group == g}
        rate = lambda name: result.figure(g, name).batches_per_s        # noqa: E731
        out.append(
            f"{g}: per train() call the estimator spends {t[_start_timing(EST)]:,.0f} ms to the end of its first "
            f"loop (compile_loop from the daemon: {t[_start_timing(cl_name(k))]:,.0f} ms) and "
            f"{t[_end_timing(EST)]:,.0f} ms after its last ({t[_end_timing(cl_name(k))]:,.0f} ms; a checkpoint "
            f"alone: {t[CHECKPOINT]:,.0f} ms), {abs(t[OVERHEAD]):,.0f} ms "
            f"{'more' if t[OVERHEAD] >= 0 else 'less'} than compile_loop in all (median of the pairs). In steady "
            f"state it runs {rate(steady(EST)):,.1f} steps/s, compile_loop from the daemon "
            f"{rate(steady(cl_name(k))):,.1f} (dispatching ahead of the devices, where the estimator waits for each "
            f"loop's losses), in device memory {rate(mem_name(k)):,.1f}, a per-step python loop {rate(PY):,.1f}. "
            f"A run's fixed costs amortise over its steps: at {p['steps']:,} steps per train() call, "
            f"{(1 - rate(EST) / rate(steady(EST))) * 100:,.0f}% of the estimator's steady rate is lost to them.")
    return out
