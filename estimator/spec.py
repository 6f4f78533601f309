"""What ``model_fn`` is told (``ModeKeys``) and what it returns (``EstimatorSpec``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from estimator.errors import InvalidArgumentError

__all__ = ["ModeKeys", "EstimatorSpec"]


class ModeKeys:
    """The ``mode`` argument of ``model_fn``, as TPUEstimator's."""

    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


@dataclass(frozen=True)
class EstimatorSpec:
    """What ``model_fn(variables, features, labels, mode, params)`` returns, traced into the compiled loop.

    loss: a scalar, or the per-example losses ``[B]`` (TRAIN, EVAL): the estimator differentiates
        their mean with respect to ``variables["params"]`` when the variables are a dict with
        ``"params"``, else all of them. In evaluation, per-example losses leave the padding rows
        of the last batch out of the mean; a scalar counts for every row of its batch.
    predictions: a dict of ``[B, ...]`` arrays (PREDICT; also what ``export`` serves).
    eval_metrics: ``{name: est.metrics.*(...)}`` accumulated inside the loop, or
        TPUEstimator's ``(metric_fn, tensors)``: ``metric_fn(**tensors)`` (a dict) or
        ``metric_fn(*tensors)`` (a list) runs on the host over every evaluated example's
        tensors (padding removed) and returns ``{name: value}``.
    host_call: ``(fn, tensors)``: ``fn(step, **tensors)`` runs on the host for every
        training step, in order, after its loop (tensors stacked by the loop). When it returns
        ``{tag: value}``, each value is written at ``step`` to every ``RunConfig.writers`` writer:
        numbers as scalars, uint8 [H, W, C] / [N, H, W, C] as images, other arrays as histograms,
        strings as text (see ``estimator.summaries.writers.values``); None writes nothing.
    updates: the new values of the non-trainable collections (e.g.
        ``{"batch_stats": ...}``), merged into the variables after the step.
    export_outputs: unused by the estimator; kept for TPUEstimator code that sets it.
    """

    mode: str
    loss: Any = None
    predictions: Any = None
    eval_metrics: Any = None
    host_call: tuple[Callable, Any] | None = None
    updates: Any = None
    export_outputs: Any = None

    def __post_init__(self):
        if self.mode not in _MODES:
            raise InvalidArgumentError(f"EstimatorSpec.mode must be one of {_MODES}, got {self.mode!r}")
        if self.host_call is not None and (not isinstance(self.host_call, tuple) or len(self.host_call) != 2
                                           or not callable(self.host_call[0])):
            raise InvalidArgumentError("EstimatorSpec.host_call must be a (fn, tensors) pair")
