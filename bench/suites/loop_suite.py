"""The ``loop`` suite: steps/s of ``xla_runtime.compile_loop`` against a per-step Python loop and a hand-written scan.

Two models, trained with Adam (``optax.adam(1e-3)``) on random data that is
on the devices before anything is timed:

- ``mlp``: 784-512-512-10, ReLU, softmax cross-entropy, batch 128;
- ``tiny``: a linear model 16 -> 1, mean squared error, batch 32 (a step of a
  few microseconds: what a loop adds per step shows).

Per model and device count, every pipeline runs the same steps over the same
device-resident batches (``steps`` per run: a multiple of the largest K), its
state donated and carried from one run to the next (training goes on):

- ``per-step python loop``: ``jax.jit(step, donate_argnums=0)`` called once
  per step on per-step batches placed with ``NamedSharding(mesh, P("data"))``;
- ``hand-written scan K=100``: ``jax.jit(lambda s, b: lax.scan(step, s, b),
  donate_argnums=0)`` over ``[100, B, ...]`` stacks placed with
  ``NamedSharding(mesh, P(None, "data"))``;
- ``compile_loop K=k``: ``xla_runtime.compile_loop(step, iterations=k,
  mesh=mesh)`` over ``[k, B, ...]`` stacks placed as above (k = 1, 10, 100,
  and 1000 for ``tiny``; the mlp's 1000-step stack would be 400 MB and a run
  5 to 20 s for nothing new: at 3 ms or more per step what a call costs is
  already lost at K=10);
- ``compile_loop K=100 + host_call`` (``tiny``): the same loop whose step also
  calls ``xla_runtime.host_call(fn, loss)`` (``fn`` counts its calls); the
  timing ``host_call cost per step`` is the difference of the two, per run,
  in microseconds per step; and ``compile_loop K=100 + host_call after_loop``:
  the same call with ``after_loop=True`` (its argument carried out of the loop,
  ``fn`` run on a host thread after the program), each run timed until every
  call has run (``xla_runtime.wait_for_host_calls``), and its cost likewise
  (target: under :data:`HOST_AFTER_TARGET_US`);
- what else a compiled loop can gain on ``tiny`` (see ``VARIANTS``):
  ``compile_loop K=1000 unroll=4`` (``lax.scan``'s ``unroll`` through
  compile_loop), and the whole run's batches as one ``[steps, B, ...]`` slab
  in one call: through ``compile_loop(step, steps, unroll=4)``, through a
  hand-written ``lax.scan`` with ``unroll=4``, and through ``lax.fori_loop``
  reading step i's batch with ``lax.dynamic_index_in_dim`` (losses written
  into a ``[steps]`` array).

And the timing ``time to first step: compile_loop K=100``: a fresh
``compile_loop`` object's first call (tracing, compiling, placing, running
100 steps), as ``loop.time_to_first_step`` reports it; JAX's persistent
compilation cache is off in the measuring processes. And ``time to first
step: compile_loop K=100, persistent cache``: the same, in another process
per device count whose compiled programs go to JAX's persistent compilation
cache (``xla_runtime.enable_compilation_cache`` on an empty temporary
directory): the first fresh loop of each model compiles and writes the
cache (not counted), the next ones find their program there (what a
restarted or preempted job sees from its second start on).

XLA fixes the number of CPU devices when JAX starts, so each device count is
measured in its own process (``python -m bench.suites.loop_suite --child``, with
``XLA_FLAGS=--xla_force_host_platform_device_count=N`` and
``JAX_PLATFORMS=cpu``) that hands its seconds back as JSON; this process never
imports JAX. The batch is global: over 8 devices, 16 (mlp) or 4 (tiny)
examples per device.

Every pipeline keeps at most ``IN_FLIGHT`` (8) programs in flight: before
call i it waits for the outputs of call i - 8. On 8 host devices (2 cores),
XLA:CPU's in-process all-reduce deadlocks once some 25 to 30 programs are in
flight (jax 0.10.2: the rendezvous waits "for 8 threads", 7 arrive, and XLA
aborts after 40 s), which a per-step loop or a hand-written scan reaches in
a few milliseconds.

Before timing, every pipeline runs its first 10 steps from the same initial
state and the losses it returns must agree with the per-step loop's (same
data, same order, same model). The cases are then interleaved (A B C A B C,
see :func:`bench.harness.interleave`) with no further warm-up pass: every
program is compiled and has run by then.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence

from bench.harness import Case, Measurement, Ratio, SuiteResult, Timing, interleave, log
from bench.harness.children import child_main, run_child

__all__ = ["run", "default_steps", "figure_names", "timing_names", "ratio_targets", "group_name", "cl_name",
           "MODELS", "DEVICES", "BATCH", "KS", "SCAN_K", "IN_FLIGHT", "PY", "SCAN", "HOST", "HOST_AFTER", "TTFS",
           "HOST_COST", "HOST_AFTER_COST", "HOST_AFTER_TARGET_US", "VARIANTS", "TARGETS", "CHECK_STEPS"]

SUITE = "loop"
#: This module, as the suite's measuring process runs it (``python -m bench.suites.loop_suite --child JSON``).
MODULE = "bench.suites.loop_suite"
MODELS = ("mlp", "tiny")
DEVICES = (1, 8)
#: Global batch per step.
BATCH = {"mlp": 128, "tiny": 32}
#: The compile_loop step counts measured per model.
KS = {"mlp": (1, 10, 100), "tiny": (1, 10, 100, 1000)}
#: The hand-written scan's steps per call, and the K of the ratio targets, host-call and start-up timings.
SCAN_K = 100
#: The most programs a pipeline leaves in flight (see the module docstring).
IN_FLIGHT = 8
#: Steps every pipeline's losses are compared on before timing.
CHECK_STEPS = 10
#: Seconds a measuring process may take before it is killed.
CHILD_TIMEOUT = 1200

PY = "per-step python loop"
SCAN = f"hand-written scan K={SCAN_K}"
HOST = f"compile_loop K={SCAN_K} + host_call"
HOST_AFTER = f"compile_loop K={SCAN_K} + host_call after_loop"
TTFS = f"time to first step: compile_loop K={SCAN_K}"
TTFS_CACHED = f"{TTFS}, persistent cache"
HOST_COST = f"host_call cost per step (K={SCAN_K})"
HOST_AFTER_COST = f"host_call after_loop cost per step (K={SCAN_K})"
#: Microseconds a step may pay for a host call after the loop (issue 30: a host function that returns nothing
#: must not stall the device every step; the call during the loop costs 70-110 us here).
HOST_AFTER_TARGET_US = 20.0
#: Extra rows for the tiny model: what else gets a compiled loop further.
VARIANTS = ("compile_loop K=1000 unroll=4", "compile_loop, whole run in 1 call, unroll=4",
            "hand-written scan, whole run in 1 call, unroll=4", "hand-written fori_loop over slab, whole run in 1 call")


def cl_name(k: int) -> str:
    return f"compile_loop K={k}"


#: (numerator, denominator) -> {model: minimum ratio of the medians}.
TARGETS = {(cl_name(SCAN_K), SCAN): {"mlp": 0.97, "tiny": 0.97}, (cl_name(SCAN_K), PY): {"tiny": 1.7}}


def group_name(model: str, devices: int) -> str:
    return f"{model}, {devices} device{'s' if devices != 1 else ''}"


def default_steps(model: str, devices: int, quick: bool = False) -> int:
    """Steps per run: mlp 100 (3 to 20 ms a step here); tiny 1,000 on several devices (an all-reduce per
    step), else 10,000 (1,000 with ``quick``: the fewest the loop of K=1,000 allows)."""
    if model == "mlp":
        return 100
    return 1000 if devices > 1 or quick else 10000


def figure_names(model: str, variants: bool = True) -> list[str]:
    names = [PY, SCAN, *(cl_name(k) for k in KS[model])]
    if model == "tiny":
        names += [HOST, HOST_AFTER]
        if variants:
            names += list(VARIANTS)
    return names


def timing_names(model: str) -> list[str]:
    return [TTFS, TTFS_CACHED] + ([HOST_COST, HOST_AFTER_COST] if model == "tiny" else [])


def ratio_targets(model: str, variants: bool = True) -> dict[str, float | None]:
    """Ratio name -> its target (None: shown, no target) for one model's group."""
    out = {f"{num} / {den}": targets.get(model) for (num, den), targets in TARGETS.items()}
    out.setdefault(f"{cl_name(max(KS[model]))} / {SCAN}", None)
    if model == "tiny" and variants:
        out.update({f"{v} / {SCAN}": None for v in VARIANTS})
    return out


# --- the measuring process (imports JAX) ------------------------------------------------------------

def _models():
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    opt = optax.adam(1e-3)

    def mlp_init(key):
        sizes = (784, 512, 512, 10)
        keys = jax.random.split(key, len(sizes) - 1)
        params = {}
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            params[f"w{i}"] = jax.random.normal(keys[i], (a, b), jnp.float32) / np.sqrt(a)
            params[f"b{i}"] = jnp.zeros((b,), jnp.float32)
        return params

    def mlp_loss(p, batch):
        h = jax.nn.relu(batch["x"] @ p["w0"] + p["b0"])
        h = jax.nn.relu(h @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()

    def tiny_init(key):
        return {"w": jax.random.normal(key, (16, 1), jnp.float32) * 0.25, "b": jnp.zeros((1,), jnp.float32)}

    def tiny_loss(p, batch):
        return jnp.mean(((batch["x"] @ p["w"] + p["b"])[:, 0] - batch["y"]) ** 2)

    def make_step(loss_fn):
        def step(state, batch):
            params, opt_state = state
            loss, grads = jax.value_and_grad(loss_fn)(params, batch)
            updates, opt_state = opt.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss
        return step

    def init_state(init_fn):
        params = init_fn(jax.random.key(0))
        return jax.device_get((params, opt.init(params)))

    def mlp_data(rng, n, b):
        return {"x": rng.standard_normal((n, b, 784), np.float32),
                "y": rng.integers(0, 10, (n, b)).astype(np.int32)}

    def tiny_data(rng, n, b):
        x = rng.standard_normal((n, b, 16), np.float32)
        return {"x": x, "y": (x @ np.linspace(-1, 1, 16, dtype=np.float32) + 0.1
                              * rng.standard_normal((n, b), np.float32)).astype(np.float32)}

    return {"mlp": (make_step(mlp_loss), lambda: init_state(mlp_init), mlp_data),
            "tiny": (make_step(tiny_loss), lambda: init_state(tiny_init), tiny_data)}


class _Pipeline:
    """One way of running ``steps`` steps: ``fn(state, inputs[i]) -> (state, outputs)`` for each of its inputs.

    The state is donated and carried from one run to the next; at most
    :data:`IN_FLIGHT` calls are left in flight.
    """

    def __init__(self, name: str, fn, inputs: list, state, steps_per_call: int, examples: int, finish=None):
        self.name, self.fn, self.inputs, self.state = name, fn, inputs, state
        self.steps_per_call, self.examples = steps_per_call, examples
        self.finish = finish                   # what else a run waits for once its programs are done

    def calls(self, inputs, keep: bool = False) -> list:
        """Calls ``fn`` on each of ``inputs`` in turn; returns every call's outputs when ``keep``."""
        import jax

        state, window, outputs = self.state, collections.deque(), []
        for batch in inputs:
            state, out = self.fn(state, batch)
            window.append(out)
            if keep:
                outputs.append(out)
            if len(window) > IN_FLIGHT:
                jax.block_until_ready(window.popleft())
        jax.block_until_ready((state, list(window)))
        if self.finish is not None:
            self.finish()
        self.state = state
        return outputs

    def run(self) -> int:
        self.calls(self.inputs)
        return self.examples

    def first_losses(self, n: int):
        """Runs the first calls covering ``n`` steps (compiling the program); returns the losses of those steps."""
        import numpy as np

        calls = -(-n // self.steps_per_call)
        outs = self.calls(self.inputs[:calls], keep=True)
        return np.concatenate([np.atleast_1d(np.asarray(o)) for o in outs])[:n]


_T0 = time.perf_counter()


def _log(message: str) -> None:
    log(f"{message} [{time.perf_counter() - _T0:.1f} s]")


def _measure_model(model: str, steps: int, repeats: int, ttfs_samples: int, variants: bool) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import xla_runtime as xr

    step, init_state, make_data = _models()[model]
    mesh = xr.make_mesh({"data": -1})
    d, b = len(jax.devices()), BATCH[model]
    ks = KS[model]
    bad = [k for k in (*ks, SCAN_K) if steps % k]
    if bad:
        raise ValueError(f"{model}: {steps} steps per run do not divide into loops of {bad} steps")
    group = group_name(model, d)
    _log(f"loop: {group}: placing {steps} steps of batch {b} on the devices ...")
    host = make_data(np.random.default_rng(0), steps, b)
    nbytes = sum(a.nbytes for a in host.values())
    per_step_sh, stacked_sh, rep = (NamedSharding(mesh, P("data")), NamedSharding(mesh, P(None, "data")),
                                    NamedSharding(mesh, P()))
    state0 = init_state()

    def fresh():        # a copy: on CPU, device_put may alias numpy memory, and the state is donated
        return jax.device_put(jax.tree.map(np.copy, state0), rep)

    def stacks(k):
        return [jax.device_put({n: a[i:i + k] for n, a in host.items()}, stacked_sh) for i in range(0, steps, k)]

    examples = steps * b
    pipes = [_Pipeline(PY, jax.jit(step, donate_argnums=0),
                       [jax.device_put({n: a[i] for n, a in host.items()}, per_step_sh) for i in range(steps)],
                       fresh(), 1, examples)]
    stacked = {k: stacks(k) for k in sorted({*ks, SCAN_K})}
    pipes.append(_Pipeline(SCAN, jax.jit(lambda s, xs: lax.scan(step, s, xs), donate_argnums=0), stacked[SCAN_K],
                           fresh(), SCAN_K, examples))
    for k in ks:
        pipes.append(_Pipeline(cl_name(k), xr.compile_loop(step, k, mesh), stacked[k], fresh(), k, examples))
    host_calls = {HOST: 0, HOST_AFTER: 0}
    if model == "tiny":
        def counting(name: str, after_loop: bool):
            def count(loss):
                host_calls[name] += 1

            def step_with_call(state, batch):
                state, loss = step(state, batch)
                xr.host_call(count, loss, after_loop=after_loop)
                return state, loss
            return step_with_call

        pipes.append(_Pipeline(HOST, xr.compile_loop(counting(HOST, False), SCAN_K, mesh), stacked[SCAN_K], fresh(),
                               SCAN_K, examples))
        pipes.append(_Pipeline(HOST_AFTER, xr.compile_loop(counting(HOST_AFTER, True), SCAN_K, mesh),
                               stacked[SCAN_K], fresh(), SCAN_K, examples, finish=xr.wait_for_host_calls))
        if variants:
            k = max(ks)
            slab = [jax.device_put(host, stacked_sh)]
            pipes.append(_Pipeline(VARIANTS[0], xr.compile_loop(step, k, mesh, unroll=4), stacked[k], fresh(), k,
                                   examples))
            pipes.append(_Pipeline(VARIANTS[1], xr.compile_loop(step, steps, mesh, unroll=4), slab, fresh(), steps,
                                   examples))
            pipes.append(_Pipeline(VARIANTS[2], jax.jit(lambda s, xs: lax.scan(step, s, xs, unroll=4),
                                                        donate_argnums=0), slab, fresh(), steps, examples))

            def fori(state, xs):
                n = jax.tree.leaves(xs)[0].shape[0]

                def body(i, carry):
                    state, losses = carry
                    batch = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, i, 0, keepdims=False), xs)
                    state, loss = step(state, batch)
                    return state, losses.at[i].set(loss)
                return lax.fori_loop(0, n, body, (state, jnp.zeros((n,), jnp.float32)))

            pipes.append(_Pipeline(VARIANTS[3], jax.jit(fori, donate_argnums=0), slab, fresh(), steps, examples))

    # Compile everything and check that every pipeline computes the same first steps.
    _log(f"loop: {group}: compiling {len(pipes)} programs and checking their first {CHECK_STEPS} losses ...")
    began = time.perf_counter()
    want = pipes[0].first_losses(CHECK_STEPS)
    for p in pipes[1:]:
        got = p.first_losses(CHECK_STEPS)
        if not np.allclose(got, want, rtol=1e-4, atol=1e-6):
            raise RuntimeError(f"{group}: {p.name} gives the losses {got.tolist()} for the first {CHECK_STEPS} "
                               f"steps, the per-step loop {want.tolist()}")
    compile_s = time.perf_counter() - began
    calls_before = dict(host_calls)

    runs = f"{repeats} run{'s' if repeats != 1 else ''}"
    _log(f"loop: {group}: timing {len(pipes)} pipelines, {steps} steps each, {runs} ...")
    measured = interleave([Case(p.name, p.run, examples, nbytes) for p in pipes], repeats, warmup=0)
    for name, before in calls_before.items():
        if model == "tiny" and host_calls[name] - before != repeats * steps:
            raise RuntimeError(f"{group}: {name}: host_call ran {host_calls[name] - before} times for "
                               f"{repeats * steps} steps")
    seconds = {m.case.name: m.seconds for m in measured}

    _log(f"loop: {group}: time to first step, {ttfs_samples} fresh compile_loop(K={SCAN_K}) ...")
    ttfs = []
    for _ in range(ttfs_samples):
        loop = xr.compile_loop(step, SCAN_K, mesh)
        state = fresh()
        jax.block_until_ready(state)
        state, out = loop(state, stacked[SCAN_K][0])
        jax.block_until_ready(out)
        ttfs.append(loop.time_to_first_step * 1e3)
    timings = {TTFS: ("ms", ttfs)}
    if model == "tiny":
        for name, cost in ((HOST, HOST_COST), (HOST_AFTER, HOST_AFTER_COST)):
            timings[cost] = ("us", [(with_call - without) / steps * 1e6
                                    for with_call, without in zip(seconds[name], seconds[cl_name(SCAN_K)])])
    return {"group": group, "devices": d, "steps": steps, "batch": b, "nbytes": nbytes, "seconds": seconds,
            "timings": timings, "compile_and_check_s": compile_s}


def _first_steps_from_cache(model: str, samples: int) -> list[float]:
    """Milliseconds to the first step of ``samples`` fresh compile_loop(K=100)s whose program is in JAX's
    persistent cache (a first loop, not counted, writes it there)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import xla_runtime as xr

    step, init_state, make_data = _models()[model]
    mesh = xr.make_mesh({"data": -1})
    group = group_name(model, len(jax.devices()))
    _log(f"loop: {group}: time to first step from the persistent cache, {samples} fresh compile_loop(K={SCAN_K}) "
         "after one that writes it ...")
    host = make_data(np.random.default_rng(0), SCAN_K, BATCH[model])
    slab = jax.device_put(host, NamedSharding(mesh, P(None, "data")))
    state0 = init_state()
    out = []
    for i in range(samples + 1):
        loop = xr.compile_loop(step, SCAN_K, mesh)
        state = jax.device_put(jax.tree.map(np.copy, state0), NamedSharding(mesh, P()))
        jax.block_until_ready(state)
        state, losses = loop(state, slab)
        jax.block_until_ready(losses)
        if i:
            out.append(loop.time_to_first_step * 1e3)
    return out


def _child(config: dict) -> None:
    import jax
    import optax

    if config.get("cache_dir"):            # before anything compiles: every program goes to the cache
        import xla_runtime as xr

        xr.enable_compilation_cache(config["cache_dir"])
    d = len(jax.devices())
    if d != config["devices"]:
        raise RuntimeError(f"expected {config['devices']} devices, JAX has {d} ({jax.devices()})")
    out = {"jax": jax.__version__, "optax": optax.__version__, "platform": jax.devices()[0].platform,
           "devices": d, "models": {}}
    if config.get("cache_dir"):
        out["cached_ttfs_ms"] = {m: _first_steps_from_cache(m, config["ttfs_samples"]) for m in config["models"]}
        cached = [name for _, _, names in os.walk(config["cache_dir"]) for name in names]
        if not cached:
            raise RuntimeError(f"JAX wrote nothing to the persistent cache {config['cache_dir']}")
        with open(config["out"], "w") as f:
            json.dump(out, f)
        return
    for model in config["models"]:
        out["models"][model] = _measure_model(model, config["steps"][model], config["repeats"],
                                              config["ttfs_samples"], config["variants"])
    with open(config["out"], "w") as f:
        json.dump(out, f)


# --- the suite (this process: no JAX) ---------------------------------------------------------------

def run(devices: Sequence[int] = DEVICES, *, models: Sequence[str] = MODELS, quick: bool = False,
        repeats: int | None = None, steps: Mapping[str, int] | None = None, ttfs_samples: int | None = None,
        variants: bool | None = None, timeout: float = CHILD_TIMEOUT) -> SuiteResult:
    """Measures every model on every device count (one process each); returns figures, timings, ratios, notes.

    quick: a smoke run, not figures to quote: one run per pipeline, fewer steps (tiny, 1 device), one
        time-to-first-step sample and no :data:`VARIANTS` rows, unless asked for.
    repeats: timed runs per pipeline (default 5, 1 with ``quick``).
    steps: per-model steps per run (default :func:`default_steps`); a multiple of every K measured.
    ttfs_samples: fresh loops timed to their first step (default 3, 1 with ``quick``).
    variants: also time the tiny model's extra rows (:data:`VARIANTS`; default: not with ``quick``).
    """
    devices = list(dict.fromkeys(devices))
    if not devices or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in devices):
        raise ValueError(f"devices must be positive ints, got {devices!r}")
    models = list(dict.fromkeys(models))
    unknown = [m for m in models if m not in MODELS]
    if unknown or not models:
        raise ValueError(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    repeats = repeats if repeats is not None else (1 if quick else 5)
    variants = (not quick) if variants is None else bool(variants)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    ttfs_samples = ttfs_samples if ttfs_samples is not None else (1 if quick else 3)
    plan = {}
    for d in devices:
        plan[d] = {m: int((steps or {}).get(m, default_steps(m, d, quick))) for m in models}
        for m, n in plan[d].items():
            if BATCH[m] % d:
                raise ValueError(f"batch {BATCH[m]} ({m}) does not divide over {d} devices")
            bad = [k for k in (*KS[m], SCAN_K) if n < 1 or n % k]
            if bad:
                raise ValueError(f"{m}: {n} steps per run do not divide into loops of {bad} steps")
    result = SuiteResult(SUITE, group_label="model, devices", name_label="pipeline",
                         params={"devices": devices, "models": models, "repeats": repeats, "warmup": 0,
                                 "batch": {m: BATCH[m] for m in models}, "ks": {m: list(KS[m]) for m in models},
                                 "scan_k": SCAN_K, "in_flight": IN_FLIGHT, "ttfs_samples": ttfs_samples,
                                 "steps": {}, "variants": variants})
    started = time.perf_counter()
    for d in devices:
        per_model = plan[d]
        result.params["steps"][str(d)] = per_model
        log(f"loop: measuring on {d} CPU device{'s' if d > 1 else ''} in a new process ...")
        child = run_child({"devices": d, "models": models, "steps": per_model, "repeats": repeats,
                           "ttfs_samples": ttfs_samples, "variants": variants}, timeout, MODULE, SUITE)
        result.params.update(jax=child["jax"], optax=child["optax"], platform=child["platform"])
        log(f"loop: time to first step from the persistent cache on {d} CPU device{'s' if d > 1 else ''}, in a "
            "new process ...")
        with tempfile.TemporaryDirectory(prefix="bench-loop-cache-") as cache_dir:
            cached = run_child({"devices": d, "models": models, "ttfs_samples": ttfs_samples,
                                "cache_dir": cache_dir}, timeout, MODULE, SUITE)["cached_ttfs_ms"]
        for m in models:
            child["models"][m]["timings"][TTFS_CACHED] = ("ms", cached[m])
        for m in models:
            _add_group(result, m, child["models"][m], variants)
            result.params.setdefault("compile_and_check_s", {})[child["models"][m]["group"]] = round(
                child["models"][m]["compile_and_check_s"], 2)
    result.params["seconds"] = round(time.perf_counter() - started, 1)
    result.notes += _notes(result, models, devices, variants)
    return result


def _add_group(result: SuiteResult, model: str, got: dict, variants: bool, suite: str = SUITE) -> None:
    group, steps, b = got["group"], got["steps"], got["batch"]
    for name in figure_names(model, variants):
        seconds = got["seconds"][name]
        case = Case(name, lambda: 0, steps * b, got["nbytes"])
        fig = Measurement(case, seconds).figure(suite, group)
        result.figures.append(dataclasses.replace(fig, batches=steps))
    for name in [n for n in timing_names(model) if n in got["timings"]]:     # the transfer suite has no cache's
        unit, values = got["timings"][name]
        target = HOST_AFTER_TARGET_US if name == HOST_AFTER_COST else None
        result.timings.append(Timing.of(suite, group, name, unit, values, target_max=target))
    for name, target in ratio_targets(model, variants).items():
        num, den = name.split(" / ")
        value = result.figure(group, num).records_per_s / result.figure(group, den).records_per_s
        result.ratios.append(Ratio(suite, group, name, value, target))


def _rate(result: SuiteResult, group: str, name: str) -> float:
    return result.figure(group, name).batches_per_s


def _notes(result: SuiteResult, models, devices, variants) -> list[str]:
    p = result.params
    out = [f"batches/s = steps/s (one batch per step); records/s = examples/s; MB/s = input bytes per second. "
           f"Each figure: the median of {p['repeats']} interleaved runs of the stated steps (state donated and "
           f"carried over; at most {IN_FLIGHT} programs in flight: on 8 host devices XLA:CPU's all-reduce "
           "deadlocks with some 25-30 in flight); every program compiled, run and checked (first "
           f"{CHECK_STEPS} losses equal to the per-step loop's) before timing. Steps per run: "
           + "; ".join(f"{d} device{'s' if int(d) > 1 else ''}: " + ", ".join(f"{m} {n:,}" for m, n in s.items())
                       for d, s in p["steps"].items())
           + f". CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=N), jax {p.get('jax')}, "
           f"optax {p.get('optax')} (Adam).",
           (f"time to first step: a fresh compile_loop(K={SCAN_K})'s first call, tracing and compiling included "
            f"(loop.time_to_first_step; {p['ttfs_samples']} samples; no persistent compilation cache); ', persistent "
            "cache': the same in a process with JAX's persistent compilation cache on, the program already in it "
            "(written by a first loop, not counted). host_call "
            f"cost: (run with host_call - run without) / steps, per interleaved pair of runs (tiny model only: on "
            "the mlp it is within the noise of a 3-20 ms step); after_loop: the same, each run timed until its "
            "host calls have all run on the host thread (xla_runtime.wait_for_host_calls).")]
    for d in devices:
        g = group_name("tiny", d)
        if "tiny" not in models:
            continue
        per_call = (1 / _rate(result, g, cl_name(1)) - 1 / _rate(result, g, cl_name(1000))) / (1 - 1 / 1000)
        per_step = 1 / _rate(result, g, PY)
        vs_scan = _rate(result, g, cl_name(SCAN_K)) / _rate(result, g, SCAN)
        line = (f"{g}: compile_loop costs about {per_call * 1e6:,.0f} us per call on top of its steps "
                f"(from K=1 against K=1000); the per-step python loop takes {per_step * 1e6:,.1f} us a step; "
                f"at K={SCAN_K}, compile_loop runs {vs_scan:.2f}x the hand-written scan")
        if variants:
            base = _rate(result, g, cl_name(1000))
            line += ("; beyond a plain scan: " + ", ".join(f"{v} {_rate(result, g, v) / base:.2f}x" for v in VARIANTS)
                     + " of compile_loop K=1000")
        out.append(line + ".")
    if variants and "tiny" in models:
        out.append("tried on the tiny model while writing this suite (1 device, a shared 2-core AMD EPYC, us per "
                   "step): hand-written lax.scan over a 10,000-step slab, unroll 1/2/4/8/16: 1.31/1.13/1.04/1.03/"
                   "1.10; compile_loop K=10,000 unroll 1/4/8: 1.47/1.04/1.13; compile_loop K=1000 unroll 1/2/4/8: "
                   "1.79/1.51/1.41/1.56 (the hand-written scan K=1000 unroll=4: 0.97); at K=100 unroll gains "
                   "nothing (3.4-5.2: compile_loop's per-call cost dominates); fori_loop + dynamic_index_in_dim "
                   "over the slab, unroll 1/4: 1.19/1.14 (no better than scan's xs). On 8 devices every variant is "
                   "within a few % of the others: one all-reduce of 8 device threads per step (~440 us on 2 cores) "
                   "is the step.")
    return out


def main(argv=None) -> int:
    return child_main(MODULE, SUITE, _child, argv)


if __name__ == "__main__":
    sys.exit(main())
