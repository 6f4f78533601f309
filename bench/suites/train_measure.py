"""The train suite's measuring process (``python -m bench.suites.train_measure --child JSON``, started by
:func:`bench.suites.train_suite.run` on each device count): the pipelines of :mod:`bench.suites.train_suite` built and
timed, with JAX imported here only."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sys
import tempfile
import time

from bench.data import datasets
from bench.harness import Case, interleave, log, stage_breakdown
from bench.harness.children import child_main
from bench.suites.train_suite import (BATCH, CHECKPOINT, EST, KERAS, LAYOUT, LOSS_RTOL, OVERHEAD, PY, SLOTS, SUITE,
                                     WORKERS, _end_timing, _start_timing, cl_name, group_name, mem_name, steady)

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


def _cpu_seconds(pids) -> float:
    """User and system CPU seconds the processes ``pids`` have used (0 for one that is gone)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])          # utime, stime (fields 14 and 15 of stat(5))
    return total / os.sysconf("SC_CLK_TCK")


class _EstimatorCase:
    """``Estimator.train(input_fn, steps)`` per run; keeps each run's phases (start, steady loops, end), and the
    share of the CPUs its input took: its workers' CPU seconds (from /proc) and the feeder's copies to the
    devices, over the run's wall time and the CPUs allowed; and the input's stages over the last run."""

    def __init__(self, estimator, input_fn, steps: int, k: int, ends: _LoopEnds):
        self.e, self.input_fn, self.steps, self.k, self.ends = estimator, input_fn, steps, k, ends
        self.start: list[float] = []
        self.steady: list[float] = []
        self.end: list[float] = []
        self.input_cpu_share: list[float] = []
        self.stages = None

    def train(self, steps: int) -> list:
        """Trains ``steps`` more steps; returns the loop ends logged, checked to be one per loop."""
        first = self.e.global_step()
        del self.ends.ends[:]
        began = time.perf_counter()
        self.e.train(self.input_fn, steps=steps)
        done = time.perf_counter()
        # The first step's own line (TPUEstimator's first LoggingTensorHook line) comes with the first loop's end.
        ends = [end for end in self.ends.ends if end[1] != first + 1 or self.k == 1]
        want = list(range(first + self.k, first + steps + 1, self.k))
        if [s for _, s, _ in ends] != want:
            raise RuntimeError(f"{EST}: expected the estimator to log the ends of the loops at steps {want}, "
                               f"it logged {[s for _, s, _ in ends]}")
        self.start.append(ends[0][0] - began)
        self.steady.append(ends[-1][0] - ends[0][0])
        self.end.append(done - ends[-1][0])
        return ends

    def run(self) -> int:
        before = self.e.input_stats()
        pids = [w.pid for w in before.workers]
        cpu0, began = _cpu_seconds(pids), time.perf_counter()
        self.train(self.steps)
        wall = time.perf_counter() - began
        self.stages = self.e.input_stats().since(before)
        used = _cpu_seconds(pids) - cpu0 + self.stages.consumer["host_to_device"]
        self.input_cpu_share.append(used / (wall * len(os.sched_getaffinity(0))))
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
    from bench.suites.loop_suite import _Pipeline
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
        with xr.CompileWatch() as compiled:
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
            "compiled_while_timing": compiled.compilations, "input_cpu_share": est_case.input_cpu_share,
            "input_stages": stage_breakdown(group, EST, est_case.stages),
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


def main(argv=None) -> int:
    return child_main("bench.suites.train_measure", SUITE, _child, argv)


if __name__ == "__main__":
    sys.exit(main())
