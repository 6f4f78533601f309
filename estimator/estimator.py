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

import contextlib
import contextvars
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax

import xla_runtime as xr
from estimator import metrics as metrics_lib
from estimator.checkpoints import Checkpoints
from estimator.config import RunConfig
from estimator.errors import (ArgumentTypeError, CheckpointMismatchError, InputError, InvalidArgumentError,
                              ModelFnError, NoCheckpointError, NonFiniteError, StepRngError)
from estimator.export import export_model
from estimator.inputs import Input, fetch, gather_json, local_part, split_batch
from estimator.progress import StepLogger, batch_bar
from estimator.spec import EstimatorSpec, ModeKeys
from estimator.summaries import SummaryWriter
from estimator.warm_start import warm_start

__all__ = ["Estimator", "step_rng"]

_log = logging.getLogger("estimator")
_rng: contextvars.ContextVar = contextvars.ContextVar("estimator_rng", default=None)


def step_rng() -> jax.Array:
    """A PRNG key for this training step (dropout and the like), inside ``model_fn`` in TRAIN mode."""
    key = _rng.get()
    if key is None:
        raise StepRngError("step_rng() is available inside model_fn while training")
    return key


@contextlib.contextmanager
def _rng_for(key):
    token = _rng.set(key)
    try:
        yield
    finally:
        _rng.reset(token)


def _learning_rate(opt_state):
    """The learning rate an ``optax.inject_hyperparams`` optimizer keeps in its state, else None."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(opt_state)[0]:
        if getattr(path[-1], "key", None) == "learning_rate" and any(
                getattr(k, "name", None) == "hyperparams" for k in path):
            return leaf
    return None


@jax.jit
def _all_finite(leaves):
    """Whether each array of ``leaves`` is free of NaN and Inf, as one bool array."""
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def _trainable(variables):
    """(trainable part, rebuild(trainable, updates) -> variables): ``variables["params"]`` when a dict has it."""
    if isinstance(variables, dict) and "params" in variables:
        def rebuild(params, updates):
            out = dict(variables, params=params)
            if updates:
                out.update(updates)
            return out
        return variables["params"], rebuild
    return variables, lambda params, updates: params


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
        if config.distributed and not jax.distributed.is_initialized():
            jax.distributed.initialize(config.coordinator_address, config.num_processes, config.process_id)
        self.model_fn, self.init_fn, self.optimizer, self.config = model_fn, init_fn, optimizer, config
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
        os.makedirs(config.model_dir, exist_ok=True)
        self.checkpoints = Checkpoints(os.path.join(config.model_dir, "checkpoints"), keep=config.keep_checkpoint_max)
        self._state = None                 # the train state on the devices, once made or restored
        self._input_state = None           # where the training input resumes after it
        self._host_call_fn = None          # host_call's function, seen when the train step is traced
        self._metric_fn = None             # eval_metrics' (metric_fn, tensors) function, likewise
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

    def _take_kept_input(self) -> Input | None:
        """The training input the last train() call left open (now the caller's to keep or close)."""
        kept, self._kept_input = self._kept_input, None
        detached = kept.detach() if kept is not None else None
        return detached[2][0] if detached else None

    def _keep_input(self, source: Input) -> None:
        """Keeps ``source`` open for the next train() call; closed by :meth:`close`, when the
        Estimator is collected, or at exit."""
        self._kept_input = weakref.finalize(self, Input.close, source)

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
        params, _ = _trainable(variables)
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
    def _train_step(self, labels):
        optimizer = self.optimizer

        def step(state, batch):
            features, batch_labels, _ = split_batch(batch, labels)
            key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
            params, rebuild = _trainable(state["variables"])

            def loss_fn(p):
                with _rng_for(key):
                    spec = self._spec(rebuild(p, None), features, batch_labels, ModeKeys.TRAIN)
                if spec.loss is None:
                    raise ModelFnError("model_fn must return a loss in TRAIN mode")
                loss = jnp.mean(spec.loss)            # a scalar, or per-example losses [B]
                if spec.host_call is not None:
                    self._host_call_fn = spec.host_call[0]       # seen while tracing; called after each loop
                # the aux must be a pytree of arrays: an EstimatorSpec would carry tracers out of the trace
                return loss, (spec.updates, spec.host_call[1] if spec.host_call is not None else None)

            (loss, (spec_updates, host_tensors)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, state["opt_state"], params)
            variables = rebuild(optax.apply_updates(params, updates), spec_updates)
            outputs = {"loss": loss}
            learning_rate = _learning_rate(opt_state)
            if learning_rate is not None:
                outputs["learning_rate"] = learning_rate
            if host_tensors is not None:
                outputs["host_call"] = host_tensors
            new = {"variables": variables, "opt_state": opt_state, "step": state["step"] + 1, "rng": state["rng"]}
            return new, outputs
        return step

    def train(self, input_fn: Callable, steps: int | None = None, max_steps: int | None = None) -> "Estimator":
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
        """
        if (steps is None) == (max_steps is None):
            raise InvalidArgumentError("train needs exactly one of steps and max_steps")
        if self.optimizer is None:
            raise InvalidArgumentError("this Estimator has no optimizer: it cannot train")
        cfg, k = self.config, self.config.iterations_per_loop
        start = (self.checkpoints.latest_step() or 0) if self._state is None else int(self._state["step"])
        target = max_steps if max_steps is not None else start + steps
        if target <= start:
            _log.info("already at step %d >= %d: nothing to train", start, target)
            return self
        input_state = self._input_state if self._state is not None else (
            self._checkpointed_input() if start else None)
        writer = SummaryWriter(cfg.model_dir)
        logger = StepLogger(total_steps=target, every_steps=cfg.log_step_count_steps,
                            examples_per_step=self.batch_sizes[ModeKeys.TRAIN], initial_step=start, desc="train")
        last_ckpt_step, last_ckpt_time = start, time.monotonic()
        source, done = None, False
        try:
            source = self._input(input_fn, ModeKeys.TRAIN, k, input_state, reuse=self._take_kept_input())
            loop = None
            step = start
            before = source.state()
            for batches in source:
                if loop is None:
                    state = self._restore_or_init(batches, source.labels)
                    loop = self._loop(ModeKeys.TRAIN, source.labels, self._train_step)
                n = min(k, target - step, jax.tree.leaves(batches)[0].shape[0])
                if n < jax.tree.leaves(batches)[0].shape[0]:
                    batches = jax.tree.map(lambda x: x[:n], batches)
                state, outputs = loop(state, batches, first_step=step)
                after = source.state()
                input_state = after if n == k or after is None else dict(before, batch=before["batch"] + n)
                before = after
                step += n
                self._after_loop(step - n, n, outputs, logger, writer, last=step >= target)
                if self._checkpoint_due(step - last_ckpt_step, time.monotonic() - last_ckpt_time) or step >= target:
                    if cfg.stop_on_nan:
                        self._check_finite(state, step)
                    inputs = gather_json(input_state)       # each process's own input position
                    self.checkpoints.save(step, state, {"input": inputs if len(inputs) > 1 else input_state,
                                                        "global_step": step})
                    last_ckpt_step, last_ckpt_time = step, time.monotonic()
                if step >= target:
                    break
            if loop is None:
                raise InputError("input_fn gave no batch to train on")
            self._state, self._input_state = state, input_state
            if step < target:
                _log.warning("the input ended at step %d, before step %d", step, target)
            self.checkpoints.wait()
            done = True
        finally:
            if done and source.continues_at(input_state):
                self._keep_input(source)
            elif source is not None:
                source.close()
            if not done:
                # The state in memory went to a loop that did not finish (donated): go on from the checkpoint.
                self._state = self._input_state = None
                self.checkpoints.wait()
            logger.close()
            writer.close()
        return self

    def _check_finite(self, state, step: int) -> None:
        """Raises NonFiniteError if a float leaf of the train state about to be checkpointed holds
        a NaN or Inf (the loss, computed before each update, cannot show the last step's update)."""
        leaves = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
                  if jnp.issubdtype(x.dtype, jnp.inexact)]
        finite = fetch(_all_finite([x for _, x in leaves])) if leaves else np.ones(0, bool)
        if finite.all():
            return
        self.checkpoints.wait()
        latest = self.checkpoints.latest_step()
        raise NonFiniteError(
            f"the train state's {jax.tree_util.keystr(leaves[int(np.flatnonzero(~finite)[0])][0])} holds NaN or Inf "
            f"after step {step} (the loss was finite up to it); training stopped and this state was not saved: the "
            f"last checkpoint is {'step %d' % latest if latest is not None else 'none'} "
            f"(RunConfig(stop_on_nan=False) trains on)")

    def _checkpointed_input(self) -> dict | None:
        """This process's input position in the latest checkpoint (a list of them when several processes wrote it)."""
        saved = self.checkpoints.extras().get("input")
        if not isinstance(saved, list):
            if jax.process_count() > 1 and saved is not None:
                raise CheckpointMismatchError(f"{self.checkpoints.latest_path()} was written by one process; this run "
                                              f"has {jax.process_count()}: the input cannot resume where it stood")
            return saved
        if len(saved) != jax.process_count():
            raise CheckpointMismatchError(f"{self.checkpoints.latest_path()} was written by {len(saved)} processes; "
                                          f"this run has {jax.process_count()}: the input cannot resume where it stood")
        return saved[jax.process_index()]

    def _checkpoint_due(self, steps_since: int, seconds_since: float) -> bool:
        cfg = self.config
        if cfg.checkpoint_every_steps:
            return steps_since >= cfg.checkpoint_every_steps
        due = seconds_since >= cfg.save_checkpoints_secs
        if jax.process_count() > 1:           # clocks differ: process 0 decides for all
            from jax.experimental import multihost_utils
            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due

    def _after_loop(self, first: int, n: int, outputs: dict, logger: StepLogger, writer: SummaryWriter,
                    last: bool) -> None:
        """Checks the loss, runs the host_call, logs, and writes summaries (every save_summary_steps and at the end)."""
        outputs = fetch(outputs)
        losses = np.asarray(outputs["loss"])
        if self.config.stop_on_nan and not np.all(np.isfinite(losses)):
            bad = int(np.flatnonzero(~np.isfinite(losses))[0])
            self.checkpoints.wait()
            latest = self.checkpoints.latest_step()
            raise NonFiniteError(
                f"the loss is {losses[bad]} at step {first + bad + 1} (in the loop of steps {first + 1}..{first + n}); "
                f"training stopped and this loop's state was not saved: the last checkpoint is "
                f"{'step %d' % latest if latest is not None else 'none'} (RunConfig(stop_on_nan=False) trains on)")
        if "host_call" in outputs:
            fn = self._host_call_fn
            for i in range(n):
                args = jax.tree.map(lambda x: x[i], outputs["host_call"])
                fn(first + i, **args) if isinstance(args, dict) else fn(first + i, *args)
        step = first + n
        rates = logger.update(step, loss=float(losses[-1]))
        every = self.config.save_summary_steps
        if step // every > first // every or rates or last:
            scalars = {"loss": float(losses[-1]), **rates}
            if "learning_rate" in outputs:
                scalars["learning_rate"] = float(np.asarray(outputs["learning_rate"])[-1])
            writer.scalars(scalars, step)

    # --- evaluation and prediction ----------------------------------------------------------
    def _variables(self):
        if self._state is not None:
            return self._state["variables"]
        if self.checkpoints.latest_step() is None:
            raise NoCheckpointError(f"no checkpoint in {self.config.model_dir} and nothing trained: train first")
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

    def _eval_step(self, labels):
        def step(variables, batch):
            features, batch_labels, mask = split_batch(batch, labels)
            real = 1.0 - mask.astype(jnp.float32)
            with metrics_lib.example_mask(real):
                spec = self._spec(variables, features, batch_labels, ModeKeys.EVAL)
            outputs = {"examples": real.sum()}
            if spec.loss is not None:
                # per-example losses [B]: the padding rows drop out; a scalar stands for every row of its batch
                outputs["loss"] = metrics_lib.mean(jnp.broadcast_to(spec.loss, real.shape), weights=real)
                if jnp.ndim(spec.loss) == 0:
                    outputs["padded_scalar_loss"] = mask.any()
            if isinstance(spec.eval_metrics, tuple):
                self._metric_fn = spec.eval_metrics[0]       # seen while tracing; called after the loops
                outputs["host_tensors"] = spec.eval_metrics[1]
                outputs["mask"] = mask
            elif spec.eval_metrics:
                outputs["metrics"] = spec.eval_metrics
            return variables, outputs
        return step

    def evaluate(self, input_fn: Callable, steps: int | None = None, name: str | None = None) -> dict:
        """Metrics over the whole input, every example exactly once (``steps``: at most that many batches).

        The last partial batch is padded and its padding masked out of every
        ``est.metrics`` metric and of the loss; ``(metric_fn, tensors)`` sees the
        real examples only. Returns ``{"loss", "global_step", metric names...}``.
        """
        k = self.config.iterations_per_loop
        totals, tensors, done, padded_scalar_loss = None, [], 0, False
        with self._input(input_fn, ModeKeys.EVAL, k) as source, batch_bar("evaluate") as bar:
            variables = None
            loop = self._loop(ModeKeys.EVAL, source.labels, self._eval_step)
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
                outputs = fetch(outputs)
                summed = {key: metrics_lib.sum_over_steps(outputs[key]) for key in ("loss", "metrics") if key in outputs}
                summed["examples"] = float(np.sum(outputs["examples"]))
                padded_scalar_loss = padded_scalar_loss or bool(np.any(outputs.get("padded_scalar_loss", False)))
                totals = summed if totals is None else {
                    key: (totals[key] + value if key == "examples" else metrics_lib.merge_all(totals[key], value))
                    for key, value in summed.items()}
                if "host_tensors" in outputs:
                    keep = ~np.asarray(outputs["mask"]).reshape(-1)
                    tensors.append(jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:])[keep],
                                                outputs["host_tensors"]))
                if steps is not None and done >= steps:
                    break
        if totals is None:
            raise InputError("input_fn gave no batch to evaluate")
        result = {"global_step": self.global_step(), "examples": int(round(totals["examples"]))}
        if "loss" in totals:
            result["loss"] = totals["loss"].result()
            if padded_scalar_loss:
                _log.warning("evaluation: model_fn's loss is a scalar, so the loss of a padded batch includes its "
                             "padding rows; return per-example losses [B] (or mask with est.metrics.current_mask()) "
                             "for the exact mean")
        if "metrics" in totals:
            result.update(metrics_lib.results(totals["metrics"]))
        if tensors:
            joined = jax.tree.map(lambda *xs: np.concatenate(xs), *tensors)
            values = self._metric_fn(**joined) if isinstance(joined, dict) else self._metric_fn(*joined)
            result.update({k: float(v) for k, v in values.items()})
        with SummaryWriter(os.path.join(self.config.model_dir, f"eval_{name}" if name else "eval")) as writer:
            writer.scalars({k: v for k, v in result.items() if isinstance(v, float)}, result["global_step"])
        _log.info("evaluation at step %d: %s", result["global_step"],
                  ", ".join(f"{k} = {v:.6g}" if isinstance(v, float) else f"{k} = {v}" for k, v in result.items()))
        return result

    def _predict_step(self, labels):
        def step(variables, batch):
            features, _, mask = split_batch(batch, labels)
            spec = self._spec(variables, features, None, ModeKeys.PREDICT)
            if not isinstance(spec.predictions, dict):
                raise ModelFnError("model_fn must return predictions as a dict in PREDICT mode")
            by_example = jax.sharding.NamedSharding(self.mesh, xr.P("data"))    # each process reads its own rows
            return variables, jax.lax.with_sharding_constraint({"predictions": spec.predictions, "mask": mask},
                                                               by_example)
        return step

    def predict(self, input_fn: Callable, yield_single_examples: bool = True) -> Iterator[dict]:
        """Predictions, one dict of numpy values per example in input order, padding removed
        (``yield_single_examples=False``: one dict of arrays per batch). With several processes,
        each process gets the predictions of its own part of the input."""
        with self._input(input_fn, ModeKeys.PREDICT, self.config.iterations_per_loop) as source, \
                batch_bar("predict") as bar:
            loop = self._loop(ModeKeys.PREDICT, source.labels, self._predict_step)
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
        _log.info("exported step %d to %s", self.global_step(), path)
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
            raise NoCheckpointError(f"no checkpoint in {self.config.model_dir}")
        state, _ = self.checkpoints.restore_numpy()
        return state["variables"]
