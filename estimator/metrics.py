"""Evaluation metrics that accumulate inside the compiled loop (``est.metrics``).

Each constructor, called in ``model_fn`` on one batch, returns a :class:`Metric`:
a pytree of a few additive statistics (weighted sums, or a histogram for AUC)
whose kind is static. The estimator returns the metric from every step of a
loop (stacked along a leading step axis), sums the steps on the host
(:func:`sum_over_steps`), adds the loops (:func:`merge_all`) and turns the
totals into numbers at the end (:func:`results`). Because the states only add,
the result over any split of the input into batches, steps, loops and devices
is the result over one big batch.

Every metric but ``sum`` and AUC is a weighted mean, ``total / weight``;
precision is the mean of the labels over the predicted positives, recall the
mean of the predictions over the labelled positives. A metric with no weight
at all (no example, or no positive for precision or recall) is ``0 / 0`` and
its result is ``nan``, never an error.

Weights: ``weights`` (default 1) broadcast along the *leading* (batch) axes of
the values: ``[B]`` weights fit ``[B]``, ``[B, T]`` or ``[B, T, C]`` values,
each element of a row taking the row's weight. An element of weight 0 adds
exactly nothing, even where its value is ``nan`` or ``inf``.

Padding: exact evaluation pads the last batch. The estimator traces
``model_fn`` within ``with example_mask(real):``, ``real`` a ``[B]`` array (1 for a
real example, 0 for padding), and every constructor multiplies its weights by
it, so a 257-example input fed as three batches of 128 counts 257 examples.

>>> import jax, jax.numpy as jnp
>>> from estimator import metrics
>>> metrics.accuracy(jnp.array([1, 0, 1, 1]), jnp.array([1, 0, 0, 1])).result()
0.75
>>> def step(_, batch):                       # what the estimator's loop does with model_fn
...     x, real = batch
...     with metrics.example_mask(real):
...         return None, {"count": metrics.sum(jnp.ones_like(x)), "mean": metrics.mean(x)}
>>> x = jnp.array([[1., 2.], [3., 99.]])       # two steps of batch 2; the last row is padding
>>> _, stacked = jax.lax.scan(step, None, (x, jnp.array([[1, 1], [1, 0]])))
>>> metrics.results(metrics.sum_over_steps(stacked))
{'count': 3.0, 'mean': 2.0}
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from estimator.errors import ArgumentTypeError, InvalidArgumentError

__all__ = ["Metric", "accuracy", "auc", "current_mask", "example_mask", "mean", "mean_absolute_error",
           "mean_squared_error", "merge_all", "precision", "recall", "results", "sum", "sum_over_steps"]

_RATIOS = ("mean", "accuracy", "precision", "recall", "mean_squared_error", "mean_absolute_error")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric's additive statistics: ``kind`` is static (pytree metadata), ``stats`` the arrays.

    ``stats`` are float32 on device and float64 once summed on the host:
    ``{"total"}`` for ``sum``; ``{"total", "weight"}`` for the weighted means
    (mean, accuracy, precision, recall, mean squared and absolute error);
    ``{"positives", "negatives"}``, the weight of each label per score bucket, for
    ``auc_roc`` and ``auc_pr``.
    """

    kind: str = dataclasses.field(metadata={"static": True})
    stats: dict

    def merge(self, other: Metric) -> Metric:
        """The statistics of both added (on device or host); :class:`~estimator.errors.InvalidArgumentError`
        (a ``ValueError``) if kinds or shapes differ."""
        if not isinstance(other, Metric):
            raise ArgumentTypeError(f"cannot merge a Metric with {type(other).__name__}")
        if other.kind != self.kind:
            raise InvalidArgumentError(f"cannot merge metrics of different kinds: {self.kind!r} and {other.kind!r}")
        shapes, other_shapes = ({k: np.shape(v) for k, v in m.stats.items()} for m in (self, other))
        if shapes != other_shapes:
            raise InvalidArgumentError(f"cannot merge {self.kind!r} metrics of different shapes, {shapes} and "
                                       f"{other_shapes} (different num_buckets, or a stacked step axis not yet summed "
                                       "by sum_over_steps?)")
        return Metric(self.kind, {k: v + other.stats[k] for k, v in self.stats.items()})

    def result(self) -> float:
        """The metric's value, on the host, from the totals (``nan`` for ``0 / 0``)."""
        stats = {k: np.asarray(v, np.float64) for k, v in self.stats.items()}
        shapes = {k: v.shape for k, v in stats.items()}
        if any(len(shape) != (1 if self.kind.startswith("auc") else 0) for shape in shapes.values()):
            raise InvalidArgumentError(f"{self.kind!r} metric has statistics of shapes {shapes}: sum a stacked step "
                                       "axis with sum_over_steps before asking for its result")
        with np.errstate(divide="ignore", invalid="ignore"):
            if self.kind == "sum":
                return float(stats["total"])
            if self.kind in _RATIOS:
                return float(stats["total"] / stats["weight"])
            return float(_area(stats["positives"], stats["negatives"], self.kind))


def _area(positives: np.ndarray, negatives: np.ndarray, kind: str) -> np.ndarray:
    """Area under the ROC curve, or average precision, from the bucket histograms.

    Threshold ``k`` calls positive every bucket from ``k`` up, for ``k = 0 .. num_buckets``.
    """
    tp = np.concatenate([np.cumsum(positives[::-1])[::-1], [0.0]])
    fp = np.concatenate([np.cumsum(negatives[::-1])[::-1], [0.0]])
    tpr, fpr = tp / tp[0], fp / fp[0]
    if kind == "auc_roc":
        return np.sum((fpr[:-1] - fpr[1:]) * (tpr[:-1] + tpr[1:]) / 2)
    gained = tpr[:-1] - tpr[1:]
    return np.sum(np.where(gained > 0, gained * tp[:-1] / (tp[:-1] + fp[:-1]), 0.0)) if tp[0] > 0 else np.nan


# --- the example mask -----------------------------------------------------------------------

_mask: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("estimator_example_mask", default=None)


def current_mask() -> jax.Array | None:
    """The ``[B]`` float32 mask of the enclosing :func:`example_mask` blocks, or ``None`` outside any."""
    return _mask.get()


@contextlib.contextmanager
def example_mask(mask) -> Iterator[None]:
    """Within the block, every metric constructor multiplies its weights by ``mask``.

    ``mask``: ``[B]``, bool or numbers, 1 (True) for a real example, 0 for padding.
    Blocks nest: an inner mask applies on top of (multiplies) the outer one.
    """
    mask = jnp.asarray(mask, jnp.float32)
    if mask.ndim != 1:
        raise InvalidArgumentError(f"example_mask takes a [batch] mask, got shape {mask.shape}")
    outer = _mask.get()
    token = _mask.set(mask if outer is None else outer * mask)
    try:
        yield
    finally:
        _mask.reset(token)


# --- constructors ---------------------------------------------------------------------------

def _leading(x: jax.Array, shape: tuple, what: str) -> jax.Array:
    """``x`` broadcast to ``shape`` along its leading axes."""
    if x.ndim > len(shape) or any(d not in (1, s) for d, s in zip(x.shape, shape)):
        raise InvalidArgumentError(f"{what} of shape {x.shape} does not fit values of shape {shape} "
                                   "(it must match their leading axes)")
    return jnp.broadcast_to(x.reshape(x.shape + (1,) * (len(shape) - x.ndim)), shape)


def _weights(weights, shape: tuple) -> jax.Array:
    """The float32 weight of every element of values of ``shape``: ``weights`` times the example mask."""
    w = _leading(jnp.asarray(1.0 if weights is None else weights, jnp.float32), shape, "weights")
    mask = current_mask()
    return w if mask is None else w * _leading(mask, shape, "the example mask")


def _weighted_sum(values: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(w != 0, values.astype(jnp.float32) * w, 0.0))


def _ratio(kind: str, values: jax.Array, w: jax.Array) -> Metric:
    """The weighted mean of ``values`` with element weights ``w`` (already masked)."""
    return Metric(kind, {"total": _weighted_sum(values, w), "weight": jnp.sum(w)})


def _pair(labels, predictions) -> tuple[jax.Array, jax.Array]:
    labels, predictions = jnp.asarray(labels), jnp.asarray(predictions)
    if labels.shape != predictions.shape:
        raise InvalidArgumentError(f"labels of shape {labels.shape} and predictions of shape {predictions.shape} "
                                   "differ")
    return labels, predictions


def sum(values, weights=None) -> Metric:
    """The weighted sum of ``values`` (e.g. ``sum(jnp.ones(B))`` counts the real examples)."""
    values = jnp.asarray(values)
    return Metric("sum", {"total": _weighted_sum(values, _weights(weights, values.shape))})


def mean(values, weights=None) -> Metric:
    """The weighted mean of every element of ``values``."""
    values = jnp.asarray(values)
    return _ratio("mean", values, _weights(weights, values.shape))


def accuracy(labels, predictions, weights=None) -> Metric:
    """How often ``predictions == labels`` (same shapes, e.g. class ids), weighted."""
    labels, predictions = _pair(labels, predictions)
    return _ratio("accuracy", labels == predictions, _weights(weights, labels.shape))


def _binary(labels, predictions, threshold: float) -> tuple[jax.Array, jax.Array]:
    labels, predictions = _pair(labels, predictions)
    return labels.astype(bool), predictions > threshold


def precision(labels, predictions, weights=None, threshold: float = 0.5) -> Metric:
    """Weighted true positives over predicted positives, for binary labels (0/1 or bool, nonzero
    is positive). A prediction is positive above ``threshold``: 0/1 or bool predictions work
    as they are, and scores (probabilities) are thresholded at 0.5 unless told otherwise."""
    labels, positive = _binary(labels, predictions, threshold)
    return _ratio("precision", labels, _weights(weights, labels.shape) * positive)


def recall(labels, predictions, weights=None, threshold: float = 0.5) -> Metric:
    """Weighted true positives over labelled positives; labels and predictions as :func:`precision`'s."""
    labels, positive = _binary(labels, predictions, threshold)
    return _ratio("recall", positive, _weights(weights, labels.shape) * labels)


def auc(labels, scores, weights=None, num_buckets: int = 200, curve: str = "ROC") -> Metric:
    """Area under the ROC curve (``curve="ROC"``) or the precision-recall curve (``"PR"``).

    Binary labels (0/1 or bool, nonzero is positive); ``scores`` in ``[0, 1]`` (clipped),
    higher meaning positive. As ``tf.metrics.auc``, the scores fall into ``num_buckets``
    equal buckets, and the state is each bucket's weight of positive and of negative
    examples; the curve has a point at each bucket edge. Examples in the same bucket
    count as tied, so the result is exactly that of the scores rounded down to a bucket
    edge: for ROC, ``sklearn.metrics.roc_auc_score`` (the trapezoidal area, a tie worth
    half); for PR, ``sklearn.metrics.average_precision_score`` (the sum over thresholds of
    recall gained times precision). ``nan`` when no example is positive (or, for ROC, none
    is negative).
    """
    if curve not in ("ROC", "PR"):
        raise InvalidArgumentError(f"auc curve must be 'ROC' or 'PR', got {curve!r}")
    if num_buckets < 1:
        raise InvalidArgumentError(f"auc needs num_buckets >= 1, got {num_buckets}")
    labels, scores = _pair(labels, scores)
    w = _weights(weights, labels.shape).ravel()
    bucket = jnp.clip(jnp.floor(scores.astype(jnp.float32) * num_buckets).astype(jnp.int32), 0, num_buckets - 1)
    positive = labels.astype(bool).ravel()
    histogram = lambda v: jnp.zeros(num_buckets, jnp.float32).at[bucket.ravel()].add(v)
    return Metric(f"auc_{curve.lower()}", {"positives": histogram(jnp.where(positive, w, 0.0)),
                                           "negatives": histogram(jnp.where(positive, 0.0, w))})


def mean_squared_error(labels, predictions, weights=None) -> Metric:
    """The weighted mean of ``(labels - predictions) ** 2`` over every element."""
    labels, predictions = _pair(labels, predictions)
    return _ratio("mean_squared_error", jnp.square(labels - predictions), _weights(weights, labels.shape))


def mean_absolute_error(labels, predictions, weights=None) -> Metric:
    """The weighted mean of ``|labels - predictions|`` over every element."""
    labels, predictions = _pair(labels, predictions)
    return _ratio("mean_absolute_error", jnp.abs(labels - predictions), _weights(weights, labels.shape))


# --- host-side helpers for the estimator ----------------------------------------------------

def _is_metric(x) -> bool:
    return isinstance(x, Metric)


def sum_over_steps(metrics):
    """Any pytree of metrics (a dict, one :class:`Metric`) whose arrays carry a leading stacked
    step axis, as a loop returns them, summed over that axis on the host in float64."""
    return jax.tree.map(lambda x: np.asarray(x, np.float64).sum(0), metrics)


def merge_all(a, b):
    """Two pytrees of metrics of the same structure (dicts of :class:`Metric`) merged
    metric by metric; ``a`` may be ``None`` (nothing accumulated yet)."""
    if a is None:
        return b
    return jax.tree.map(Metric.merge, a, b, is_leaf=_is_metric)


def results(metrics: dict) -> dict[str, float]:
    """``{name: metric.result()}`` for a dict of accumulated metrics."""
    return {name: metric.result() for name, metric in metrics.items()}
