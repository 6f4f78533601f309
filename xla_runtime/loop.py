"""One compiled XLA program that runs many steps: ``jax.jit`` over ``lax.scan``, on a mesh.

>>> import jax.numpy as jnp, numpy as np
>>> def step(total, batch):
...     total = total + batch["x"].sum()
...     return total, {"mean": batch["x"].mean()}
>>> loop = compile_loop(step, iterations=4, mesh=make_mesh({"data": 1}, jax.devices()[:1]))
>>> total, out = loop(jnp.zeros(()), {"x": np.ones((4, 2, 3), np.float32)})
>>> float(total), out["mean"].shape
(24.0, (4,))

``step(state, batch) -> (state, outputs)`` is any pure JAX function of one
step's batch; the loop takes the batches of ``iterations`` steps stacked
``[K, B, ...]`` (an infeed ring slot with ``steps_per_slot=K`` is exactly that)
and returns the last state and every step's outputs stacked ``[K, ...]``, for
host functions to read after the loop (the cheap way to get metrics out;
:func:`xla_runtime.host_call` calls a host function for each step, during the
loop or, with ``after_loop=True``, on a host thread once the program has
ended, its arguments carried out as outputs). A host call that raised is
reported as :class:`~xla_runtime.HostCallError` by the next call of the loop
(by this one when it waits for its results anyway: its first call, or with
``check_finite``), or by :func:`xla_runtime.wait_for_host_calls`.

With several processes (``jax.distributed``), the mesh spans every process's
devices and each process passes its own part of the batches (what its
infeed daemon produced): they become global arrays through
``jax.make_array_from_process_local_data``.

Shardings are explicit: the state's (``state_sharding``: replicated by
default, or one PartitionSpec, a rule list, or a pytree of specs; see
:func:`xla_runtime.mesh.state_shardings`) and one step's batch's
(``batch_sharding``, default ``P("data")``: split the batch dimension over the
``data`` axis), to which the loop adds the unsplit step dimension. Outputs are
left to XLA's sharding propagation. The state is donated: its buffers are
reused for the new state, and the arrays passed in are deleted.

There is no cross-replica optimizer to wrap: under ``jit`` with the batch split
over ``data``, the gradient of a mean loss over the batch is already the
all-reduced mean over every shard, as TPUEstimator's CrossShardOptimizer
computed by hand. Steps that need explicit collectives run their body under
``jax.shard_map`` and use :func:`xla_runtime.cross_replica_mean`.

Compiled programs are cached by the shapes, dtypes and structure of state and
batches, and by the number of steps: a final partial loop (fewer steps left)
compiles once for its size and is reused, never once per call.
:func:`xla_runtime.enable_compilation_cache` adds JAX's persistent cache on disk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xla_runtime.compilation import keep_cache_off_where_it_hangs
from xla_runtime.context import in_loop, watching_step_reads
from xla_runtime.host_calls import carrying_out, raise_host_call_error, run_after_loop
from xla_runtime.mesh import check_divisible, make_mesh, named, replicated, state_shardings

__all__ = ["compile_loop", "CompiledLoop"]

_log = logging.getLogger("xla_runtime")


def _signature(tree) -> tuple:
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((tuple(np.shape(x)), np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype).str)
                          for x in leaves)


def _describe_change(kind: str, before, after) -> str:
    """Names the first leaf whose shape or dtype changed, or says the structure changed."""
    (tree0, leaves0), (tree1, leaves1) = before, after
    if tree0 != tree1:
        return f"the {kind}'s structure changed between calls: was {tree0}, now {tree1}"
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(
        jax.tree_util.tree_unflatten(tree1, [0] * len(leaves1)))[0]]
    for path, a, b in zip(paths, leaves0, leaves1):
        if a != b:
            return (f"{kind} leaf {path or '(root)'} changed between calls: shape {a[0]} dtype {a[1]} "
                    f"became shape {b[0]} dtype {b[1]}")
    return f"the {kind} changed between calls"


class CompiledLoop:
    """A step function compiled into loops of ``iterations`` steps (see the module docstring).

    A call costs one ``jax.jit`` dispatch (its C++ path: the compiled program
    is found by the arguments' shapes and shardings) plus a few microseconds:
    the checks that give clear errors (structure, shapes, divisibility) run
    when a program is traced, and the next loop's first step index stays on
    the device from one call to the next.
    """

    def __init__(self, step: Callable, iterations: int, mesh: Mesh, state_sharding=None,
                 batch_sharding=P("data"), donate_state: bool = True, check_finite: bool = False, unroll: int = 1):
        if not callable(step):
            raise TypeError(f"step must be a function (state, batch) -> (state, outputs), got {step!r}")
        if isinstance(iterations, bool) or not isinstance(iterations, int) or iterations < 1:
            raise ValueError(f"iterations must be a positive int, got {iterations!r}")
        self.step_fn, self.iterations, self.mesh = step, iterations, mesh
        self.donate_state, self.check_finite, self.unroll = donate_state, check_finite, unroll
        self._state_spec, self._batch_spec = state_sharding, batch_sharding
        self._jit = None                       # the jitted loop, made at the first call from its shardings
        self._shardings = None                 # (state shardings, batch shardings) of that call
        self._traced: dict = {}                # steps -> abstract (state, batches) of each traced program
        self._traces = 0                       # programs traced (a retrace for new placements counts too)
        self._after_loop: dict = {}            # steps -> the after-loop host calls its step makes (fn, with_step, n)
        self._reads_step: dict = {}            # steps -> whether its step reads current_step()
        self._unread_index = None              # the index passed to programs that do not read it
        self._executables: dict = {}           # steps -> Compiled, lowered again for inspection only
        self._last_steps = None
        self._next_step = None                 # the device scalar steps_run, returned by the last program
        self._single_process = jax.process_count() == 1
        self._state_signature = None
        #: Global index of the next step to run (host calls see it through ``current_step()``).
        self.steps_run = 0
        #: Seconds spent tracing and compiling, per compiled program.
        self.compile_seconds: list[float] = []
        #: Seconds from the first call to its results being ready (compilation included), once known.
        self.time_to_first_step: float | None = None

    # --- the program ------------------------------------------------------------------------
    def _run(self, state, batches, first_step):
        """The traced program (this Python body runs once per compiled program, not per call)."""
        steps = _stacked_steps(batches, self.iterations)
        self._check_state(state)
        if self._single_process:
            self._check_divisible(state, batches)
        self._traces += 1
        self._traced[steps] = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), (state, batches))
        step = self.step_fn
        after_loop: list = []                  # the step's after-loop host calls: (fn, with_step, n)

        def body(carry, batch):
            state, i = carry
            with in_loop(first_step + i), carrying_out() as calls:
                state, outputs = step(state, batch)
            after_loop[:] = [call[:3] for call in calls]
            return (state, i + 1), (outputs, [call[3] for call in calls])

        with watching_step_reads() as reads:
            (state, _), (outputs, carried) = jax.lax.scan(body, (state, jnp.int32(0)), batches, unroll=self.unroll)
        self._after_loop[steps] = after_loop
        # The next loop's first step comes back only where the step reads it: an output costs every call (~3.6 us
        # of 20 on this CPU's tiny loops), an unread argument nothing (jit leaves it out of the program).
        self._reads_step[steps] = bool(reads)
        finite = None
        if self.check_finite:
            finite = jax.tree.map(
                lambda x: jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim))) if jnp.issubdtype(x.dtype, jnp.inexact)
                else jnp.ones(x.shape[:1], bool), outputs)
        return state, outputs, finite, (first_step + steps) if reads else None, carried

    def _batch_shardings(self, batches):
        spec = self._batch_spec

        def stacked(s):
            s = named(self.mesh, s).spec
            return NamedSharding(self.mesh, P(None, *s))
        if spec is None or isinstance(spec, (P, NamedSharding)):
            sharding = stacked(spec)
            return jax.tree.map(lambda _: sharding, batches)
        return jax.tree.map(lambda s, leaf: jax.tree.map(lambda _: stacked(s), leaf), spec, batches,
                            is_leaf=lambda x: x is None or isinstance(x, (P, NamedSharding)))

    def _check_state(self, state) -> None:
        """The state keeps the structure, shapes and dtypes of the first call's (donation and the
        step function's contract depend on it)."""
        signature = _signature(state)
        if self._state_signature is None:
            self._state_signature = signature
        elif signature != self._state_signature:
            raise ValueError(_describe_change("state", self._state_signature, signature))

    def _check_divisible(self, state, batches) -> None:
        state_sh, batch_sh = self._shardings
        for kind, tree, shardings in (("batch", batches, batch_sh), ("state", state, state_sh)):
            for (path, leaf), sharding in zip(jax.tree_util.tree_flatten_with_path(tree)[0], jax.tree.leaves(shardings)):
                check_divisible(f"{kind} leaf {jax.tree_util.keystr(path) or '(root)'}", np.shape(leaf), sharding)

    # --- calling ----------------------------------------------------------------------------
    def __call__(self, state, batches, *, first_step: int | None = None):
        """Runs one loop: ``batches`` stacked ``[K, B, ...]`` with K <= ``iterations`` (a shorter,
        final loop compiles once for its size). Returns ``(state, outputs stacked [K, ...])``."""
        raise_host_call_error()             # a host call of an earlier loop failed
        start = self.steps_run if first_step is None else int(first_step)
        if self._jit is not None and self._single_process:
            leaves = jax.tree.leaves(batches)
            shape = getattr(leaves[0], "shape", ()) if leaves else ()    # arrays: no np.shape call per loop
            if shape:
                if not self._reads_step.get(int(shape[0]), True):
                    step_index = self._unread_index
                elif start == self.steps_run and self._next_step is not None:
                    step_index = self._next_step
                else:
                    step_index = self._step_index(start)
                try:
                    return self._dispatch(state, batches, step_index, start, int(shape[0]))
                except (TypeError, ValueError):
                    pass                    # another structure or placement: the checked path explains or places
        return self._checked_call(state, batches, start)

    def _checked_call(self, state, batches, start: int):
        """The first call, and any call the fast path refused: every check, then placement and dispatch."""
        steps = _stacked_steps(batches, self.iterations)
        self._check_state(state)
        if self._jit is None:
            if not self._single_process:
                keep_cache_off_where_it_hangs()
            self._shardings = (state_shardings(state, self.mesh, self._state_spec), self._batch_shardings(batches))
            state_sh, batch_sh = self._shardings
            rep = replicated(self.mesh)
            # the after-loop host calls' arguments replicated: whole on every process, for the one that runs them
            self._jit = jax.jit(self._run, in_shardings=(state_sh, batch_sh, rep),
                                out_shardings=(state_sh, None, rep, rep, rep),
                                donate_argnums=(0,) if self.donate_state else ())
        elif _signature(batches)[0] != jax.tree.structure(self._shardings[1]):
            raise ValueError(_describe_change("batch", (jax.tree.structure(self._shardings[1]), ()),
                                              _signature(batches)))
        if self._single_process:
            self._check_divisible(state, batches)
        state_sh, batch_sh = self._shardings
        state = jax.tree.map(lambda x, s: _placed(x, s, local=False), state, state_sh)
        batches = jax.tree.map(lambda x, s: _placed(x, s, local=True), batches, batch_sh)
        return self._dispatch(state, batches, self._step_index(start), start, steps)

    def _step_index(self, start: int):
        """``start`` as the program's step-index argument: a replicated device scalar, placed as the
        programs return it, so a loop that starts at a given step is not traced a second time."""
        return _placed(np.int32(start), replicated(self.mesh), local=False)

    def _dispatch(self, state, batches, step_index, start: int, steps: int):
        first_call = self.time_to_first_step is None
        traces = self._traces
        began = time.perf_counter()
        state, outputs, finite, self._next_step, carried = self._jit(state, batches, step_index)
        if self._unread_index is None:
            self._unread_index = step_index
        if self._after_loop.get(steps):
            run_after_loop(self._after_loop[steps], start, steps, carried)
        if self._traces != traces:
            self.compile_seconds.append(time.perf_counter() - began)
            _log.info("compiled a loop of %d steps in %.2f s", steps, self.compile_seconds[-1])
        self.steps_run, self._last_steps = start + steps, steps
        if first_call:
            jax.block_until_ready(state)
            self.time_to_first_step = time.perf_counter() - began
            _log.info("first loop of %d steps done %.2f s after the call", steps, self.time_to_first_step)
        if finite is not None:
            _raise_if_not_finite(finite, outputs, start)
        if first_call or finite is not None:     # results are ready: host calls of this loop have run
            raise_host_call_error()
        return state, outputs

    # --- inspection -------------------------------------------------------------------------
    @property
    def compilations(self) -> int:
        """How many programs this loop has compiled (one per distinct shapes and step count)."""
        return len(self.compile_seconds)

    def _executable(self):
        if self._last_steps is None:
            raise RuntimeError("the loop has not been compiled yet: call it once first")
        steps = self._last_steps
        if steps not in self._executables:      # lowered again from the traced shapes (the persistent cache helps)
            state, batches = self._traced[steps]
            self._executables[steps] = self._jit.lower(state, batches, jax.ShapeDtypeStruct((), jnp.int32)).compile()
        return self._executables[steps]

    def cost_analysis(self):
        """XLA's cost analysis (flops, bytes accessed) of the last program run."""
        return self._executable().cost_analysis()

    def memory_analysis(self):
        """XLA's memory analysis (argument, output, temporary bytes) of the last program run."""
        return self._executable().memory_analysis()

    def as_text(self) -> str:
        """The optimised HLO of the last program run."""
        return self._executable().as_text()


def _stacked_steps(batches, iterations: int) -> int:
    """The steps ``batches`` stack (the same leading dimension on every leaf, 1 to ``iterations``)."""
    leaves = jax.tree.leaves(batches)
    if not leaves:
        raise ValueError("batches is empty: the loop needs at least one array")
    steps = int(np.shape(leaves[0])[0]) if np.ndim(leaves[0]) else 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(batches)[0]:
        if np.ndim(leaf) == 0 or np.shape(leaf)[0] != steps:
            raise ValueError(f"batch leaf {jax.tree_util.keystr(path)} has shape {np.shape(leaf)}: every leaf "
                             f"must stack the same number of steps first (the first leaf has {steps})")
    if not 1 <= steps <= iterations:
        raise ValueError(f"batches stack {steps} steps; this loop runs 1 to {iterations}")
    return steps


def _placed(x, sharding: NamedSharding, local: bool):
    """``x`` on ``sharding``: untouched when it already is, else transferred (numpy) or resharded.

    A host batch (``local``) of a single process is left to ``jit`` to transfer,
    as the fast path of later calls does: the placement of the arguments is
    part of the key of a traced program, and the same placement on every call
    keeps it to one program per shape. With several processes, a host array is
    this process's part of the global array when ``local`` (a batch from this
    host's input), else the whole array, the same on every process (an initial
    state).
    """
    if isinstance(x, jax.Array):
        return x if x.sharding == sharding else jax.device_put(x, sharding)
    if local and jax.process_count() == 1:
        return x
    if jax.process_count() > 1:
        x = np.asarray(x)
        if local:
            return jax.make_array_from_process_local_data(sharding, x)
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    return jax.device_put(x, sharding)


def _raise_if_not_finite(finite, outputs, start: int) -> None:
    flags = jax.device_get(finite)
    for (path, ok), leaf in zip(jax.tree_util.tree_flatten_with_path(flags)[0], jax.tree.leaves(outputs)):
        bad = np.flatnonzero(~np.asarray(ok))
        if bad.size:
            raise FloatingPointError(f"output {jax.tree_util.keystr(path) or '(root)'} (shape {leaf.shape[1:]} per "
                                     f"step) is not finite at step {start + int(bad[0])} "
                                     f"({bad.size} of {len(ok)} steps of this loop)")


def compile_loop(step: Callable, iterations: int, mesh: Mesh | None = None, *, state_sharding=None,
                 batch_sharding=P("data"), donate_state: bool = True, check_finite: bool = False,
                 unroll: int = 1) -> CompiledLoop:
    """``step`` compiled into loops of ``iterations`` steps over ``mesh`` (default: every device
    on a ``data`` axis). See the module docstring; ``unroll`` is ``lax.scan``'s."""
    return CompiledLoop(step, iterations, make_mesh({"data": -1}) if mesh is None else mesh, state_sharding,
                        batch_sharding, donate_state, check_finite, unroll)
