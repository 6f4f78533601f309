"""The ``train`` suite: steps/s of ``Estimator.train`` fed from TFRecords, against ``compile_loop`` alone.

The model is the loop suite's mlp as an Estimator ``model_fn``: 784-512-512-10,
ReLU, softmax cross-entropy, batch 128, ``optax.adam(1e-3)``; its input the
``mnist`` layout of :mod:`bench.datasets` (``image`` 784 float32, ``label``
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
the same daemon (the estimator's overhead within 5%), and at least 90% of the
in-memory loop's, both over whole ``train()`` calls.

As in the loop suite, each device count is measured in its own process
(``python -m bench.train_suite --child``; ``XLA_FLAGS`` sets the number of CPU
devices, no persistent compilation cache; see
:func:`bench.children.run_child`) and the batch is global (16 examples per
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
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Sequence

from bench import datasets
from bench.harness import Case, Measurement, Ratio, SuiteResult, Timing, interleave, log
from bench.children import child_main, run_child

__all__ = ["run", "default_steps", "figure_names", "timing_names", "ratio_targets", "group_name", "cl_name",
           "mem_name", "steady", "DEVICES", "BATCH", "ITERATIONS", "STEPS", "QUICK_STEPS", "WORKERS", "SLOTS", "EST",
           "PY", "KERAS", "STEADY", "OVERHEAD", "CHECKPOINT", "TARGET_VS_DAEMON_LOOP", "TARGET_VS_MEMORY", "LAYOUT"]

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


def default_steps(quick: bool = False, k: int | None = None) -> int:
    """Steps per run: :data:`STEPS` (:data:`QUICK_STEPS` with ``quick``) rounded up to whole loops of ``k``
    steps, at least two."""
    k = ITERATIONS if k is None else k
    return max(-(-(QUICK_STEPS if quick else STEPS) // k), 2) * k


def figure_names(k: int) -> list[str]:
    return [EST, steady(EST), cl_name(k), steady(cl_name(k)), mem_name(k), PY]


def timing_names(k: int) -> list[str]:
    return [_start_timing(EST), _start_timing(cl_name(k)), _end_timing(EST), _end_timing(cl_name(k)),
            OVERHEAD, CHECKPOINT]


def ratio_targets(k: int, keras: bool = False) -> dict[str, float | None]:
    """Ratio name -> its target (None: shown, no target); ``keras``: with the Keras row's ratios."""
    return {f"{EST} / {cl_name(k)}": TARGET_VS_DAEMON_LOOP, f"{EST} / {mem_name(k)}": TARGET_VS_MEMORY,
            f"{steady(EST)} / {steady(cl_name(k))}": None, f"{steady(EST)} / {mem_name(k)}": None,
            f"{steady(cl_name(k))} / {mem_name(k)}": None, f"{mem_name(k)} / {PY}": None,
            **({f"{EST} / {KERAS}": None, f"{mem_name(k)} / {KERAS}": None} if keras else {})}


# --- the measuring process (imports JAX) ------------------------------------------------------------

_T0 = time.perf_counter()


def _log(message: str) -> None:
    log(f"{message} [{time.perf_counter() - _T0:.1f} s]")


def _model():
    """(init_fn, model_fn) of the 784-512-512-10 mlp, as an Estimator takes them."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import estimator as est

    sizes = (784, 512, 512, 10)
    rng = np.random.default_rng(0)
    initial = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        initial[f"w{i}"] = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        initial[f"b{i}"] = np.zeros((b,), np.float32)

    def init_fn(rng, features):
        # Fixed values made on the host: every pipeline starts from the same variables, bit for bit, whether
        # init_fn runs eagerly or under jit (where XLA may round a computed initialisation differently).
        del rng, features
        return {"params": {name: jnp.asarray(value) for name, value in initial.items()}}

    def model_fn(variables, features, labels, mode, params):
        p = variables["params"]
        h = jax.nn.relu(features["image"] @ p["w0"] + p["b0"])
        h = jax.nn.relu(h @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return est.EstimatorSpec(mode, loss=loss)

    return init_fn, model_fn, initial


def _keras_case(initial: dict, host: dict, steps: int, k: int):
    """``(Case, first epoch's mean loss, keras version)`` of Keras's ``fit`` on the slab, or None without Keras."""
    os.environ["KERAS_BACKEND"] = "jax"            # read when Keras is first imported
    try:
        import keras
    except ImportError:
        return None
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"Keras runs on its {keras.backend.backend()} backend, not JAX (imported before "
                           "KERAS_BACKEND was set?)")
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                              keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    model.set_weights([initial[f"{kind}{i}"] for i in range(3) for kind in ("w", "b")])
    model.compile(optimizer=keras.optimizers.Adam(1e-3, epsilon=1e-8), steps_per_execution=k, jit_compile=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = host["image"].reshape(k * BATCH, -1)
    y = host["label"].reshape(k * BATCH)
    first = model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history["loss"][0]

    def run() -> int:
        model.fit(x, y, batch_size=BATCH, epochs=steps // k, shuffle=False, verbose=0)
        return steps * BATCH

    run()           # compiles whatever a longer fit adds (its epoch loop), before timing
    return run, float(first), keras.__version__


class _LoopEnds:
    """Records when the estimator's step logger logs a loop's end (``loss = ..., step = N``): ``(perf_counter,
    step, loss)``."""

    STEP, LOSS = re.compile(r"(?:^|[ ,])step = (\d+)"), re.compile(r"(?:^|[ ,])loss = ([^,\s]+)")

    def __init__(self):
        class Handler(logging.Handler):
            def emit(handler, record):
                message = record.getMessage()
                step, loss = self.STEP.search(message), self.LOSS.search(message)
                if step and loss:
                    self.ends.append((time.perf_counter(), int(step.group(1)), float(loss.group(1))))

        self.ends: list = []
        self.handler = Handler(logging.INFO)
        self.logger = logging.getLogger("estimator")

    def __enter__(self) -> "_LoopEnds":
        self.saved = (self.logger.level, self.logger.propagate)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False          # the estimator's log lines are timed, not printed
        self.logger.addHandler(self.handler)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.level, self.logger.propagate = self.saved


class _Compilations:
    """The seconds of every XLA compilation while inside (JAX's backend-compile event): none, when timing."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.seconds: list[float] = []

    def _listen(self, event: str, duration: float, **kwargs) -> None:
        if event == self.EVENT:
            self.seconds.append(duration)

    def __enter__(self) -> "_Compilations":
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listen)


class _EstimatorCase:
    """``Estimator.train(input_fn, steps)`` per run; keeps each run's phases (start, steady loops, end)."""

    def __init__(self, estimator, input_fn, steps: int, k: int, ends: _LoopEnds):
        self.e, self.input_fn, self.steps, self.k, self.ends = estimator, input_fn, steps, k, ends
        self.start: list[float] = []
        self.steady: list[float] = []
        self.end: list[float] = []

    def train(self, steps: int) -> list:
        """Trains ``steps`` more steps; returns the loop ends logged, checked to be one per loop."""
        first = self.e.global_step()
        del self.ends.ends[:]
        began = time.perf_counter()
        self.e.train(self.input_fn, steps=steps)
        done = time.perf_counter()
        ends = list(self.ends.ends)
        want = list(range(first + self.k, first + steps + 1, self.k))
        if [s for _, s, _ in ends] != want:
            raise RuntimeError(f"{EST}: expected the estimator to log the ends of the loops at steps {want}, "
                               f"it logged {[s for _, s, _ in ends]}")
        self.start.append(ends[0][0] - began)
        self.steady.append(ends[-1][0] - ends[0][0])
        self.end.append(done - ends[-1][0])
        return ends

    def run(self) -> int:
        self.train(self.steps)
        return self.steps * BATCH


class _DaemonLoopCase:
    """compile_loop from the daemon, by hand: one daemon and feeder for every run (as the estimator keeps its
    training input open between train() calls), the state carried over."""

    def __init__(self, loop, dataset, mesh, state, steps: int, k: int, lock_memory: bool):
        self.loop, self.dataset, self.mesh, self.state = loop, dataset, mesh, state
        self.steps, self.k, self.lock_memory = steps, k, lock_memory
        self.input_state = None
        self.start: list[float] = []
        self.steady: list[float] = []
        self.end: list[float] = []
        self._open = contextlib.ExitStack()
        self._feeder = None

    def train(self, steps: int, keep: bool = False) -> list:
        import jax
        from jax.sharding import PartitionSpec as P

        import infeed
        import xla_runtime as xr

        kept = []
        began = time.perf_counter()
        if self._feeder is None:
            daemon = self._open.enter_context(infeed.Daemon(self.dataset, num_workers=WORKERS, slots=SLOTS,
                                                            lock_memory=self.lock_memory))
            self._feeder = self._open.enter_context(xr.Feeder(daemon, self.mesh, P(None, "data")))
        state = self.state
        for i, batches in zip(range(steps // self.k), self._feeder):
            state, losses = self.loop(state, batches)
            if keep:
                kept.append(losses)
            if i == 0:
                jax.block_until_ready(losses)
                first = time.perf_counter()
        jax.block_until_ready((state, losses))
        last = time.perf_counter()
        self.state, self.input_state = state, self._feeder.state()
        done = time.perf_counter()
        self.start.append(first - began)
        self.steady.append(last - first)
        self.end.append(done - last)
        return kept

    def run(self) -> int:
        self.train(self.steps)
        return self.steps * BATCH

    def close(self) -> None:
        self._open.close()


def _measure(config: dict) -> dict:
    import jax
    import numpy as np
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import estimator as est
    import infeed
    import xla_runtime as xr
    from bench.loop_suite import _Pipeline
    from estimator.checkpoints import Checkpoints

    k, steps, repeats, b = config["k"], config["steps"], config["repeats"], BATCH
    d = len(jax.devices())
    group = group_name(d)
    init_fn, model_fn, initial = _model()
    opt = optax.adam(1e-3)
    mesh = xr.make_mesh({"data": -1})
    spec = datasets.LAYOUTS[LAYOUT].spec()
    path = config["data"]

    def input_fn(params):
        return infeed.Dataset(path, spec, batch_size=params["batch_size"], labels="label", num_epochs=None)

    dataset = input_fn({"batch_size": b}).replace(steps_per_slot=k)     # what the estimator's Input makes of it
    nbytes_step = sum(int(np.prod(shape)) * np.dtype(dtype).itemsize for shape, dtype in dataset.template().values())

    def step(state, batch):
        params, opt_state = state

        def loss_fn(p):
            return model_fn({"params": p}, {"image": batch["image"]}, batch["label"], est.ModeKeys.TRAIN, {}).loss

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), loss

    params0 = jax.device_get(init_fn(None, None)["params"])
    state0 = jax.device_get((params0, opt.init(params0)))
    rep = NamedSharding(mesh, P())

    def fresh():        # a copy: on CPU, device_put may alias numpy memory, and the state is donated
        return jax.device_put(jax.tree.map(np.copy, state0), rep)

    with contextlib.ExitStack() as stack:
        model_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-train-model-"))
        ends = stack.enter_context(_LoopEnds())
        run_config = est.RunConfig(model_dir=os.path.join(model_dir, "model"), iterations_per_loop=k,
                                   save_checkpoints_steps=10**9, log_step_count_steps=k, save_summary_steps=k)
        estimator = stack.enter_context(est.Estimator(model_fn, init_fn, opt, run_config, train_batch_size=b))
        est_case = _EstimatorCase(estimator, input_fn, steps, k, ends)
        _log(f"train: {group}: the estimator's first train() call ({k} steps: compiling) ...")
        began = time.perf_counter()
        est_loss = est_case.train(k)[-1][2]
        first_call_s = time.perf_counter() - began

        _log(f"train: {group}: the slab of the first {k} batches, compiling the other pipelines, checking their "
             f"first {k} losses ...")
        with infeed.Daemon(dataset, num_workers=1, slots=1, lock_memory=False) as feed:
            host = {name: np.array(a) for name, a in next(feed).items()}
        slab = jax.device_put(host, NamedSharding(mesh, P(None, "data")))
        per_step = [jax.device_put({n: a[i] for n, a in host.items()}, NamedSharding(mesh, P("data")))
                    for i in range(k)]
        loop = xr.compile_loop(step, k, mesh)
        cl_case = _DaemonLoopCase(loop, dataset, mesh, fresh(), steps, k, lock_memory=True)
        stack.callback(cl_case.close)
        mem = _Pipeline(mem_name(k), loop, [slab] * (steps // k), fresh(), k, steps * b)
        py = _Pipeline(PY, jax.jit(step, donate_argnums=0), per_step * (steps // k), fresh(), 1, steps * b)
        began = time.perf_counter()
        want = np.asarray(cl_case.train(k, keep=True)[0])
        for p in (mem, py):
            got = p.first_losses(k)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
                raise RuntimeError(f"{group}: {p.name} gives the losses {got.tolist()} for the first {k} steps, "
                                   f"{cl_name(k)} {want.tolist()}")
        if not np.isclose(est_loss, want[-1], rtol=LOSS_RTOL):
            raise RuntimeError(f"{group}: the estimator logs the loss {est_loss} at step {k}, {cl_name(k)} gives "
                               f"{float(want[-1])}")
        keras_case = _keras_case(initial, host, steps, k)
        if keras_case is not None and not np.isclose(keras_case[1], want.mean(), rtol=1e-3):
            raise RuntimeError(f"{group}: Keras's first epoch's mean loss is {keras_case[1]}, compile_loop's first "
                               f"{k} losses' mean {float(want.mean())}")
        # A second call of each: a loop may compile again when its state or step index comes from its own last
        # call rather than from the host (compile_loop did, at the time of writing); not while timing.
        est_case.train(k)
        cl_case.train(k)
        compile_s = time.perf_counter() - began
        for c in (est_case, cl_case):          # the check's phases are no figures
            for phases in (c.start, c.steady, c.end):
                phases.clear()

        runs = f"{repeats} run{'s' if repeats != 1 else ''}"
        cases = [Case(EST, est_case.run, steps * b, steps * nbytes_step),
                 Case(cl_name(k), cl_case.run, steps * b, steps * nbytes_step),
                 Case(mem.name, mem.run, steps * b, steps * nbytes_step),
                 Case(PY, py.run, steps * b, steps * nbytes_step)]
        if keras_case is not None:
            cases.append(Case(KERAS, keras_case[0], steps * b, steps * nbytes_step))
        _log(f"train: {group}: timing {len(cases)} pipelines, {steps} steps each, {runs} ...")
        with _Compilations() as compiled:
            measured = interleave(cases, repeats, warmup=0)
        seconds = {m.case.name: m.seconds for m in measured}
        seconds[steady(EST)] = est_case.steady
        seconds[steady(cl_name(k))] = cl_case.steady

        _log(f"train: {group}: {repeats} checkpoint{'s' if repeats != 1 else ''} of a train state ...")
        train_state = {"variables": {"params": cl_case.state[0]}, "opt_state": cl_case.state[1],
                       "step": jax.numpy.int32(0), "rng": jax.random.key_data(jax.random.key(0))}
        ckpt = []
        with Checkpoints(os.path.join(model_dir, "separate")) as checkpoints:
            for i in range(repeats):
                t = time.perf_counter()
                checkpoints.save(i + 1, train_state, {"input": cl_case.input_state, "global_step": i + 1})
                checkpoints.wait()
                ckpt.append((time.perf_counter() - t) * 1e3)
        global_step = estimator.global_step()

    ms = lambda xs: [x * 1e3 for x in xs]       # noqa: E731
    timings = {_start_timing(EST): ms(est_case.start), _start_timing(cl_name(k)): ms(cl_case.start),
               _end_timing(EST): ms(est_case.end), _end_timing(cl_name(k)): ms(cl_case.end),
               OVERHEAD: [(a - c) * 1e3 for a, c in zip(seconds[EST], seconds[cl_name(k)])], CHECKPOINT: ckpt}
    return {"group": group, "devices": d, "steps": steps, "k": k, "batch": b, "nbytes_step": nbytes_step,
            "seconds": seconds, "timings": timings, "first_call_s": first_call_s, "compile_and_check_s": compile_s,
            "global_step": global_step, "first_losses": [est_loss, float(want[-1])],
            "compiled_while_timing": compiled.seconds,
            "keras": None if keras_case is None else {"version": keras_case[2], "first_epoch_loss": keras_case[1]}}


def _child(config: dict) -> None:
    import jax
    import optax

    d = len(jax.devices())
    if d != config["devices"]:
        raise RuntimeError(f"expected {config['devices']} devices, JAX has {d} ({jax.devices()})")
    out = {"jax": jax.__version__, "optax": optax.__version__, "platform": jax.devices()[0].platform,
           **_measure(config)}
    with open(config["out"], "w") as f:
        json.dump(out, f)


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
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-train-data-"))
        else:
            os.makedirs(data_dir, exist_ok=True)
        log(f"train: writing {records:,} {LAYOUT} records to {data_dir} ...")
        ds = datasets.ensure_dataset(layout, data_dir, records, seed)
        how = "reused" if ds.write_seconds is None else f"written in {ds.write_seconds:.1f} s"
        data_note = (f"data: {LAYOUT}: {ds.records:,} records, {ds.nbytes / 1e6:,.1f} MB, read in order epoch after "
                     f"epoch (num_epochs=None), {how}: {ds.path}")
        for d in devices:
            log(f"train: measuring on {d} CPU device{'s' if d > 1 else ''} in a new process ...")
            child = run_child({"devices": d, "k": k, "steps": steps, "repeats": repeats, "data": ds.path},
                              timeout, module="bench.train_suite", suite=SUITE)
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
        result.timings.append(Timing.of(SUITE, group, name, "ms", got["timings"][name]))
    for name, target in ratio_targets(k, keras).items():
        num, den = name.split(" / ")
        value = result.figure(group, num).records_per_s / result.figure(group, den).records_per_s
        result.ratios.append(Ratio(SUITE, group, name, value, target))


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


def main(argv=None) -> int:
    return child_main("bench.train_suite", SUITE, _child, argv)


if __name__ == "__main__":
    sys.exit(main())
