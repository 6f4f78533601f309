"""The step functions that the compiled loops trace, built from ``model_fn``: a training step (the
loss's gradient, the optimizer's update, ``EstimatorSpec.updates`` merged), an evaluation step
(losses and metrics under the padding mask) and a prediction step; ``step_rng()`` inside them.

A step is ``step(state_or_variables, batch) -> (same, outputs)`` for :func:`xla_runtime.compile_loop`;
its outputs come back stacked per loop. The host functions that ``model_fn`` names (``host_call``'s,
``eval_metrics``' ``metric_fn``) are seen while a step is traced and kept for the host side.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

import xla_runtime as xr
from estimator import metrics as metrics_lib
from estimator.errors import ModelFnError, StepRngError
from estimator.loop.inputs import split_batch
from estimator.spec import EstimatorSpec, ModeKeys

_log = logging.getLogger("estimator")

if TYPE_CHECKING:
    import optax

__all__ = ["ModelSteps", "step_rng", "trainable"]

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


def trainable(variables):
    """(trainable part, rebuild(trainable, updates) -> variables): ``variables["params"]`` when a dict has it."""
    if isinstance(variables, dict) and "params" in variables:
        def rebuild(params, updates):
            out = dict(variables, params=params)
            if updates:
                out.update(updates)
            return out
        return variables["params"], rebuild
    return variables, lambda params, updates: params


def _training_loss(loss, real):
    """The mean of model_fn's ``loss`` (a scalar, or per-example losses ``[B, ...]``) over the real examples
    (``real``: the ``[B]`` float mask of a batch with padding rows, as ``skip_corrupt`` makes; or None): the
    padding rows drop out of per-example losses. A scalar is the model's own: it masks them with
    ``est.metrics.current_mask()``, which the step sets (warned of once, when the step is traced)."""
    if real is None or jnp.ndim(loss) == 0 or loss.shape[0] != real.shape[0]:
        if real is not None and jnp.ndim(loss) == 0:
            _log.warning("training on batches with padding rows (skip_corrupt): model_fn's loss is a scalar, so "
                         "it includes them unless model_fn masks them with est.metrics.current_mask(); return "
                         "per-example losses [B] and they drop out")
        return jnp.mean(loss)
    per_example = jnp.mean(loss.reshape(loss.shape[0], -1), axis=1)
    return jnp.sum(per_example * real) / jnp.maximum(jnp.sum(real), 1.0)


class ModelSteps:
    """The step functions of one Estimator. ``spec(variables, features, labels, mode)`` calls its
    ``model_fn`` and returns the checked ``EstimatorSpec``; ``mesh`` is where predictions are split.

    ``host_call_fn`` and ``metric_fn``: the functions of ``EstimatorSpec.host_call`` and of
    ``eval_metrics=(metric_fn, tensors)``, seen when the train or eval step was last traced.
    """

    def __init__(self, spec: Callable[..., EstimatorSpec], mesh):
        self._spec, self._mesh = spec, mesh
        self.host_call_fn = None           # host_call's function, seen when the train step is traced
        self.metric_fn = None              # eval_metrics' (metric_fn, tensors) function, likewise

    def _masked_loss(self, variables, features, labels, real):
        """model_fn's evaluation loss with ``real`` as the example mask (traced only, for :func:`_computed_from`)."""
        with metrics_lib.example_mask(real):
            return self._spec(variables, features, labels, ModeKeys.EVAL).loss

    def train(self, optimizer: optax.GradientTransformation, labels):
        """The training step of ``{"variables", "opt_state", "step", "rng"}``; outputs the loss, the
        learning rate (``optax.inject_hyperparams``) and ``host_call``'s tensors."""
        def step(state, batch):
            features, batch_labels, mask = split_batch(batch, labels)
            real = None if mask is None else 1.0 - mask.astype(jnp.float32)
            key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
            params, rebuild = trainable(state["variables"])

            def loss_fn(p):
                masked = contextlib.nullcontext() if real is None else metrics_lib.example_mask(real)
                with _rng_for(key), masked:
                    spec = self._spec(rebuild(p, None), features, batch_labels, ModeKeys.TRAIN)
                if spec.loss is None:
                    raise ModelFnError("model_fn must return a loss in TRAIN mode")
                loss = _training_loss(spec.loss, real)
                if spec.host_call is not None:
                    self.host_call_fn = spec.host_call[0]        # seen while tracing; called after each loop
                # the aux must be a pytree of arrays: an EstimatorSpec would carry tracers out of the trace
                return loss, (spec.updates, spec.host_call[1] if spec.host_call is not None else None)

            (loss, (spec_updates, host_tensors)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
            updates, opt_state = optimizer.update(grads, state["opt_state"], params)
            import optax  # here, not at import: the user's optimizer has imported it by now

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

    def eval(self, labels):
        """The evaluation step of the variables; outputs the real examples' count, the masked mean loss,
        the in-loop metrics or ``metric_fn``'s tensors with the padding mask."""
        def step(variables, batch):
            features, batch_labels, mask = split_batch(batch, labels)
            real = 1.0 - mask.astype(jnp.float32)
            with metrics_lib.example_mask(real):
                spec = self._spec(variables, features, batch_labels, ModeKeys.EVAL)
            outputs = {"examples": real.sum()}
            if spec.loss is not None:
                # per-example losses [B]: the padding rows drop out; a scalar stands for every row of its batch
                outputs["loss"] = metrics_lib.mean(jnp.broadcast_to(spec.loss, real.shape), weights=real)
                if jnp.ndim(spec.loss) == 0 and not _computed_from(
                        lambda m: self._masked_loss(variables, features, batch_labels, m), real):
                    outputs["padded_scalar_loss"] = mask.any()      # a scalar that ignores the mask: warned of
            if isinstance(spec.eval_metrics, tuple):
                self.metric_fn = spec.eval_metrics[0]        # seen while tracing; called after the loops
                outputs["host_tensors"] = spec.eval_metrics[1]
                outputs["mask"] = mask
            elif spec.eval_metrics:
                outputs["metrics"] = spec.eval_metrics
            return variables, outputs
        return step

    def predict(self, labels):
        """The prediction step of the variables; outputs the predictions and the padding mask, split by
        example over the mesh's ``data`` axis (each process reads its own rows)."""
        def step(variables, batch):
            features, _, mask = split_batch(batch, labels)
            spec = self._spec(variables, features, None, ModeKeys.PREDICT)
            if not isinstance(spec.predictions, dict):
                raise ModelFnError("model_fn must return predictions as a dict in PREDICT mode")
            by_example = jax.sharding.NamedSharding(self._mesh, xr.P("data"))    # each process reads its own rows
            return variables, jax.lax.with_sharding_constraint({"predictions": spec.predictions, "mask": mask},
                                                               by_example)
        return step


def _computed_from(fn: Callable, x) -> bool:
    """Whether ``fn(x)`` is computed from ``x``: ``x`` flows into its result in ``fn``'s jaxpr (traced once per
    compilation; nothing runs). Conservative: a call that takes ``x`` counts for all it returns."""
    jaxpr = jax.make_jaxpr(fn)(x).jaxpr
    reached = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(not isinstance(v, Literal) and v in reached for v in eqn.invars):
            reached.update(eqn.outvars)
    return any(not isinstance(v, Literal) and v in reached for v in jaxpr.outvars)
