"""``Estimator``: train, evaluate, predict and export a JAX model on compiled loops fed by the infeed.

The ideas are TPUEstimator's; the mechanics are JAX's. ``init_fn(rng,
features)`` makes the variables; ``model_fn(variables, features, labels, mode,
params)`` is pure and is traced into one compiled loop of
``iterations_per_loop`` steps (:func:`xla_runtime.compile_loop`), whose
batches an infeed daemon decodes and a feeder moves to the devices while the
previous loop runs. The train state, one pytree ``{"variables",
"opt_state", "step", "rng"}``, is donated and replicated over the mesh (or
split by ``RunConfig.variable_sharding``); the batch is split over its
``data`` axis, so the gradient of the mean loss is already the all-reduced
mean (no CrossShardOptimizer).
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

import xla_runtime as xr
from xla_runtime.compilation import keep_cache_off_where_it_hangs
from estimator.checkpoints.manager import Checkpoints
from estimator.checkpoints.warm_start import warm_start
from estimator.config import RunConfig
from estimator.errors import ArgumentTypeError, InputError, InvalidArgumentError, ModelFnError, NoCheckpointError
from estimator.export.integrity import export_digest
from estimator.export.saving import export_model
from estimator.hooks import HookRunner
from estimator.loop.bookkeeping import TrainBookkeeping, checkpointed_input
from estimator.loop.eval_totals import EvalTotals
from estimator.loop.inputs import Input, fetch, local_part, split_batch
from estimator.loop.progress import batch_bar, default_log_handler
from estimator.loop.steps import ModelSteps, trainable
from estimator.profiling import ProfileWindow
from estimator.spec import EstimatorSpec, ModeKeys
from estimator.summaries.writers.run_writers import RunWriters, hparams_of

if TYPE_CHECKING:
    import optax

    import infeed

__all__ = ["Estimator"]

_log = logging.getLogger("estimator")


class Estimator:
    """See the module docstring. Batch sizes are global (over every host); ``params["batch_size"]``,
    which ``input_fn`` receives, is the per-host batch."""

    def __init__(self, model_fn: Callable, init_fn: Callable, optimizer: optax.GradientTransformation | None,
                 config: RunConfig, params: dict | None = None, *, train_batch_size: int | None = None,
                 eval_batch_size: int | None = None, predict_batch_size: int | None = None,
                 warm_start_from: str | None = None, warm_start_include: str | None = None):
        if not callable(model_fn) or not callable(init_fn):
            raise ArgumentTypeError("model_fn and init_fn must be functions")
        if not isinstance(config, RunConfig):
            raise ArgumentTypeError(f"config must be an estimator.RunConfig, got {type(config).__name__}")
        if optimizer is not None and not (callable(getattr(optimizer, "init", None))
                                          and callable(getattr(optimizer, "update", None))):
            raise ArgumentTypeError(f"optimizer must be an optax.GradientTransformation (init and update) or None, "
                                    f"got {type(optimizer).__name__}")
        if config.distributed and not jax.distributed.is_initialized():
            jax.distributed.initialize(config.coordinator_address, config.num_processes, config.process_id)
        self.model_fn, self.init_fn, self.optimizer, self.config = model_fn, init_fn, optimizer, config
        self._log_handler()                # before orbax's import, whose absl logging may configure the root logger
        self.params = dict(params or {})
        self.mesh = xr.make_mesh(config.mesh_shape)
        self.batch_sizes = {ModeKeys.TRAIN: train_batch_size, ModeKeys.EVAL: eval_batch_size or train_batch_size,
                            ModeKeys.PREDICT: predict_batch_size or eval_batch_size or train_batch_size}
        data = self.mesh.shape["data"]
        for mode, size in self.batch_sizes.items():
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1 or size % data
                                     or size % jax.process_count()):
                raise InvalidArgumentError(f"the {mode} batch size must be a positive multiple of the mesh's data axis "
                                           f"({data} devices) and of the number of hosts ({jax.process_count()}), "
                                           f"got {size!r}")
        self.warm_start_from, self.warm_start_include = warm_start_from, warm_start_include
        if config.compilation_cache_dir is not None:
            try:
                xr.enable_compilation_cache(config.compilation_cache_dir)
            except ValueError as e:
                raise InvalidArgumentError(f"RunConfig.compilation_cache_dir: {e}") from e
        keep_cache_off_where_it_hangs()    # before init_fn's programs too (the loops ask again before theirs)
        if "://" not in config.model_dir:             # a bucket has no directories to make
            os.makedirs(config.model_dir, exist_ok=True)
        self.checkpoints = Checkpoints(config.checkpoint_directory, keep=config.keep_checkpoint_max)
        self._state = None                 # the train state on the devices, once made or restored
        self._input_state = None           # where the training input resumes after it
        self._steps = ModelSteps(self._spec, self.mesh)      # the step functions, and the host functions they saw
        self._loops: dict = {}
        self._kept_input = None            # finalizer of the training Input kept open between train() calls

    # --- helpers ----------------------------------------------------------------------------
    def _host_batch(self, mode: str) -> int:
        size = self.batch_sizes[mode]
        if size is None:
            raise InvalidArgumentError(f"set {mode}_batch_size to {mode}" if mode != ModeKeys.PREDICT else
                                       "set predict_batch_size (or eval/train batch size) to predict")
        return size // jax.process_count()

    def _input(self, input_fn, mode: str, steps: int, state: dict | None = None, reuse: Input | None = None) -> Input:
        """``input_fn``'s input for ``mode``, resuming at ``state``: ``reuse`` when it continues
        exactly there (else ``reuse`` is closed), a new one otherwise."""
        batch = self._host_batch(mode)
        source = input_fn(dict(self.params, batch_size=batch))
        if reuse is not None:
            if reuse.continues(source, state):
                return reuse
            reuse.close()
        return Input(source, self.mesh, steps, batch, exact=mode != ModeKeys.TRAIN, state=state,
                     workers=self.config.infeed_workers, slots=self.config.infeed_slots)

    def _log_handler(self) -> None:
        """The ``estimator`` logger at INFO, with its own handler on stderr when the application has configured
        no logging; neither when the RunConfig is quiet (``log_step_count_steps=None``)."""
        default_log_handler(self.config.log_step_count_steps is not None)

    def _take_kept_input(self) -> Input | None:
        """The training input the last train() call left open (now the caller's to keep or close)."""
        kept, self._kept_input = self._kept_input, None
        detached = kept.detach() if kept is not None else None
        return detached[2][0] if detached else None

    def _keep_input(self, source: Input) -> None:
        """Keeps ``source`` open for the next train() call; closed by :meth:`close`, when the
        Estimator is collected, or at exit."""
        self._kept_input = weakref.finalize(self, Input.close, source)

    def input_stats(self) -> infeed.InputStats | None:
        """Where the time of the training input kept open by the last ``train`` call went, since its daemon
        started (``later.since(earlier)`` for an interval): each stage of its workers, its feeder's copies
        to the devices and the loops' wait for them, and the bottleneck in a sentence. None when no
        ``infeed.Dataset`` input is open."""
        kept = self._kept_input.peek() if self._kept_input is not None else None
        return kept[2][0].stats() if kept else None

    def close(self) -> None:
        """Stops the training input that ``train`` keeps open between calls (its feeder, the
        daemon's workers and ring). The Estimator stays usable; the next ``train`` starts a new
        input where training stands. ``with Estimator(...) as e:`` calls it at the end."""
        source = self._take_kept_input()
        if source is not None:
            source.close()

    def __enter__(self) -> "Estimator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _spec(self, variables, features, labels, mode) -> EstimatorSpec:
        spec = self.model_fn(variables, features, labels, mode, dict(self.params, batch_size=self._host_batch(mode)))
        if not isinstance(spec, EstimatorSpec):
            raise ModelFnError(f"model_fn must return an estimator.EstimatorSpec, got {type(spec).__name__}")
        return spec

    def _init_features(self, first_batch: dict, labels):
        """What ``init_fn`` sees: the first step's features (with several processes, zeros of their
        global shape, the same on every process, so that every process makes the same variables)."""
        if jax.process_count() == 1:
            one = jax.tree.map(lambda x: x[0], first_batch)
        else:
            one = jax.tree.map(lambda x: np.zeros(x.shape[1:], x.dtype), first_batch)
        return split_batch(one, labels)[0]

    def _initial_state(self, variables) -> dict:
        params, _ = trainable(variables)
        return {"variables": variables, "opt_state": self.optimizer.init(params), "step": jnp.int32(0),
                "rng": jax.random.key_data(jax.random.key(self.config.seed))}

    def _init_variables(self, features):
        """``init_fn``'s variables, compiled as one program (eager, each random draw compiles apart)."""
        key = jax.random.fold_in(jax.random.key(self.config.seed), 0)
        try:
            return jax.jit(self.init_fn)(key, features)
        except TypeError:                   # variables with non-array leaves (Equinox modules): made eagerly
            return self.init_fn(key, features)

    def _restore_or_init(self, first_batch: dict, labels) -> dict:
        """The train state: in memory, else the latest checkpoint's, else from ``init_fn`` (and warm start)."""
        if self._state is not None:
            return self._state
        features = self._init_features(first_batch, labels)
        if self.checkpoints.latest_step() is not None:
            abstract = jax.eval_shape(lambda f: self._initial_state(self._init_variables(f)), features)
            shardings = xr.state_shardings(abstract, self.mesh, self.config.variable_sharding)
            target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
            state, _ = self.checkpoints.restore(target)
            _log.info("restored step %d from %s", int(state["step"]), self.checkpoints.latest_path())
            return state
        variables = self._init_variables(features)
        if self.warm_start_from:
            source = self.warm_start_from
            if os.path.isdir(os.path.join(source, "checkpoints")):          # another run's model_dir
                source = os.path.join(source, "checkpoints")
            variables = warm_start(source, variables, self.warm_start_include, within=("variables",))
        state = jax.jit(self._initial_state)(variables)
        # several processes: host values, which the loop places on the global mesh alike on every process
        return jax.device_get(state) if jax.process_count() > 1 else state

    # --- training ---------------------------------------------------------------------------
    def train(self, input_fn: Callable, steps: int | None = None, max_steps: int | None = None,
              hooks=None) -> "Estimator":
        """Trains until ``max_steps`` (global step), or for ``steps`` more; both exact (a partial last loop).

        Starts from the latest checkpoint of ``model_dir`` (its variables, optimizer
        state and input position) or from ``init_fn``; checkpoints on the
        RunConfig's cadence and at the end.

        An ``infeed.Dataset`` input stays open when the call returns, its daemon
        decoding ahead: the next call whose ``input_fn`` gives the same Dataset
        goes on from it with no start-up (as from a new daemon resuming at the
        checkpoint's input position: the same batches). Another Dataset, a
        partial last loop, or :meth:`close` stops it. A call that fails stops
        it too, and the next call resumes from the latest checkpoint.

        An iterable input resumes exactly as well when its iterator has
        ``get_state()`` / ``set_state()`` (Grain's; see :mod:`estimator.loop.resumable`);
        one without is warned of, or refused (``RunConfig.require_resumable_input``).
        ``hooks``: :class:`estimator.hooks.Hook` objects, told of each loop on the host (after
        ``RunConfig.stop_on_nan``'s :class:`~estimator.hooks.StopOnNaN`); one may end training early
        (``context.request_stop()``: the step reached is checkpointed, as at a normal end).
        """
        if (steps is None) == (max_steps is None):
            raise InvalidArgumentError("train needs exactly one of steps and max_steps")
        if self.optimizer is None:
            raise InvalidArgumentError("this Estimator has no optimizer: it cannot train")
        run = HookRunner.of(hooks, self)
        self._log_handler()
        k = self.config.iterations_per_loop
        start = (self.checkpoints.latest_step() or 0) if self._state is None else int(self._state["step"])
        target = max_steps if max_steps is not None else start + steps
        if target <= start:
            _log.info("already at step %d >= %d: nothing to train", start, target)
            return self
        input_state = self._input_state if self._state is not None else (
            checkpointed_input(self.checkpoints) if start else None)
        batch_size = self.batch_sizes[ModeKeys.TRAIN]
        bookkeeping = TrainBookkeeping(self.config, self.checkpoints, start, target, batch_size,
                                       hparams=hparams_of(self.params, train_batch_size=batch_size))
        profile = ProfileWindow(self.config, start, target)
        source, done, began, error = None, False, False, None
        try:
            source = self._input(input_fn, ModeKeys.TRAIN, k, input_state, reuse=self._take_kept_input())
            source.warn_unless_resumable(self.config.require_resumable_input)
            began = run.begin(source.wait_s)
            input_before = source.stats()
            loop = None
            step = start
            profile.input_stats = source.stats
            loops = iter(source)
            while step < target:
                profile.before_loop(step)
                with jax.profiler.StepTraceAnnotation("train", step_num=step):     # a profile's step: one loop
                    batches = next(loops, None)
                    if batches is None:
                        break
                    if loop is None:
                        state = self._restore_or_init(batches, source.labels)
                        train_step = functools.partial(self._steps.train, self.optimizer)
                        loop = self._loop(ModeKeys.TRAIN, source.labels, train_step)
                    n = min(k, target - step, jax.tree.leaves(batches)[0].shape[0])
                    if n < jax.tree.leaves(batches)[0].shape[0]:
                        batches = jax.tree.map(lambda x: x[:n], batches)
                    state, outputs = loop(state, batches, first_step=step)
                    input_state = source.state(n)       # after the n-th batch of the loop: prefetched ones not counted
                    step += n
                    outputs = bookkeeping.fetch(outputs)
                    if run.after_loop(step - n, n, outputs, source.wait_s):      # a hook stops training here
                        target = bookkeeping.target = step
                    bookkeeping.after_loop(step - n, n, outputs, self._steps.host_call_fn, source.wait_s)
                    bookkeeping.checkpoint_if_due(step, state, input_state, run.before_checkpoint)
                profile.after_loop(step)
            if loop is None:
                raise InputError("input_fn gave no batch to train on")
            self._state, self._input_state = state, input_state
            if step < target:
                _log.warning("the input ended at step %d, before step %d", step, target)
            if input_before is not None:
                _log_input_stats(source.stats().since(input_before))
            xr.wait_for_host_calls()                # model_fn's xr.host_call(..., after_loop=True) calls: all run
            self.checkpoints.wait()
            done = True
        except BaseException as e:
            error = e
            raise
        finally:
            profile.close()
            if done and source.continues_at(input_state):
                self._keep_input(source)
            elif source is not None:
                source.close()
            if not done:
                # The state in memory went to a loop that did not finish (donated): go on from the checkpoint.
                self._state = self._input_state = None
                self.checkpoints.wait()
            bookkeeping.close(failed=not done)
            run.end(began, error)
        return self

    # --- evaluation and prediction ----------------------------------------------------------
    def _variables(self):
        if self._state is not None:
            return self._state["variables"]
        if self.checkpoints.latest_step() is None:
            raise NoCheckpointError(f"no checkpoint in {self.config.checkpoint_directory} and nothing trained: "
                                    f"train first")
        return None

    def _loop(self, mode: str, labels, make_step) -> xr.CompiledLoop:
        """The compiled loop of ``mode``, made once per model_fn and label names (its programs are
        then compiled once per shape, across train / evaluate / predict calls)."""
        key = (mode, labels, self.model_fn, self.config.iterations_per_loop)
        if key not in self._loops:
            self._loops[key] = xr.compile_loop(make_step(labels), self.config.iterations_per_loop, self.mesh,
                                               state_sharding=self.config.variable_sharding,
                                               donate_state=mode == ModeKeys.TRAIN)
        return self._loops[key]

    def evaluate(self, input_fn: Callable, steps: int | None = None, name: str | None = None) -> dict:
        """Metrics over the whole input, every example exactly once (``steps``: at most that many batches).

        The last partial batch is padded and its padding masked out of every
        ``est.metrics`` metric and of the loss; ``(metric_fn, tensors)`` sees the
        real examples only. Returns ``{"loss", "global_step", metric names...}``.
        """
        k = self.config.iterations_per_loop
        totals, done = EvalTotals(), 0
        self._log_handler()
        quiet = self.config.log_step_count_steps is None
        with self._input(input_fn, ModeKeys.EVAL, k) as source, batch_bar("evaluate", quiet) as bar:
            variables = None
            loop = self._loop(ModeKeys.EVAL, source.labels, self._steps.eval)
            for batches in source:
                if variables is None:
                    variables = self._variables()
                    if variables is None:
                        variables = self._restore_or_init(batches, source.labels)["variables"]
                n = jax.tree.leaves(batches)[0].shape[0]
                if steps is not None:
                    n = min(n, steps - done)
                    batches = jax.tree.map(lambda x: x[:n], batches)
                _, outputs = loop(variables, batches)
                done += n
                bar.update(n)
                totals.add(fetch(outputs))
                if steps is not None and done >= steps:
                    break
        result = totals.result(self.global_step(), self._steps.metric_fn)
        with RunWriters(self.config.writers, self.config.model_dir, f"eval_{name}" if name else "eval") as writers:
            writers.write_scalars(result["global_step"], {k: v for k, v in result.items() if isinstance(v, float)})
        _log.info("evaluation at step %d: %s", result["global_step"],
                  ", ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}" for k, v in result.items()))
        return result

    def predict(self, input_fn: Callable, yield_single_examples: bool = True) -> Iterator[dict]:
        """Predictions, one dict of numpy values per example in input order, padding removed
        (``yield_single_examples=False``: one dict of arrays per batch). With several processes,
        each process gets the predictions of its own part of the input."""
        with self._input(input_fn, ModeKeys.PREDICT, self.config.iterations_per_loop) as source, \
                batch_bar("predict", self.config.log_step_count_steps is None) as bar:
            loop = self._loop(ModeKeys.PREDICT, source.labels, self._steps.predict)
            variables = None
            for batches in source:
                if variables is None:
                    variables = self._variables()
                    if variables is None:
                        variables = self._restore_or_init(batches, source.labels)["variables"]
                _, outputs = loop(variables, batches)
                outputs = local_part(outputs, self.mesh)
                bar.update(len(outputs["mask"]))
                for s in range(len(outputs["mask"])):
                    keep = ~np.asarray(outputs["mask"][s])
                    batch = {name: np.asarray(v[s])[keep] for name, v in outputs["predictions"].items()}
                    if not yield_single_examples:
                        yield batch
                        continue
                    for i in range(int(keep.sum())):
                        yield {name: v[i] for name, v in batch.items()}

    # --- export -----------------------------------------------------------------------------
    def export(self, export_dir, serving_features: dict, *, platforms=None, saved_model: bool = False) -> str:
        """Exports the PREDICT-mode ``model_fn`` with the current variables for serving; returns its path.

        Writes ``<export_dir>/<global_step>`` (a :mod:`jax.export` artefact of
        ``features -> predictions`` with a symbolic batch dimension, the
        variables as ``variables.npz`` and ``signature.json``; see
        :mod:`estimator.export`), loadable with :func:`estimator.load_exported`
        without the model's code. ``serving_features``: ``{name: TensorSpec}``,
        ``None`` for the batch dimension. A step already exported is refused.
        The export's digest (:func:`estimator.export_digest`) is logged, to pin.
        """
        variables = self._variables()
        if variables is None:
            variables = self.get_variables()
        params = dict(self.params, batch_size=None)

        def predict_fn(variables, features):
            spec = self.model_fn(variables, features, None, ModeKeys.PREDICT, params)
            if not isinstance(spec, EstimatorSpec) or not isinstance(spec.predictions, dict):
                raise ModelFnError("model_fn must return an EstimatorSpec with a dict of predictions in PREDICT mode")
            return spec.predictions

        path = os.path.join(os.fspath(export_dir), str(self.global_step()))
        path = export_model(predict_fn, jax.device_get(variables), serving_features, path, platforms=platforms,
                            saved_model=saved_model)
        _log.info("exported step %d to %s (export_digest %s: pin it to load_exported(expected_digest=...))",
                  self.global_step(), path, export_digest(path))
        return path

    # --- state ------------------------------------------------------------------------------
    def global_step(self) -> int:
        """The step of the train state in memory, else of the latest checkpoint (0 when none)."""
        if self._state is not None:
            return int(self._state["step"])
        return self.checkpoints.latest_step() or 0

    def latest_checkpoint(self) -> str | None:
        """The directory of the latest checkpoint, or None."""
        return self.checkpoints.latest_path()

    def get_variables(self):
        """The latest checkpoint's variables, as a pytree of numpy arrays."""
        if self.checkpoints.latest_step() is None:
            raise NoCheckpointError(f"no checkpoint in {self.config.checkpoint_directory}")
        state, _ = self.checkpoints.restore_numpy()
        return state["variables"]


def _log_input_stats(stats) -> None:
    """The input's verdict over a train call at INFO (where its time went, per stage, at DEBUG)."""
    _log.info("input: %s", stats.bottleneck())
    _log.debug("input stages over this train call:\n%s", stats.table())
