"""The host side of evaluation: each loop's outputs added up over the real examples (the masked loss
and in-loop metrics merged, ``metric_fn``'s tensors kept with the padding rows removed), and the
result they make: ``{"global_step", "examples", "loss", metric names...}``.
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from estimator import metrics as metrics_lib
from estimator.errors import InputError

__all__ = ["EvalTotals"]

_log = logging.getLogger("estimator")


class EvalTotals:
    """The totals of one evaluation: :meth:`add` each loop's outputs (numpy, stacked per step, as the
    evaluation step makes them), then :meth:`result`."""

    def __init__(self):
        self._totals = None                 # {"examples", "loss", "metrics"}: merged over the loops
        self._tensors = []                  # per loop: metric_fn's tensors of the real examples
        self._padded_scalar_loss = False    # a scalar loss was averaged over a batch with padding

    def add(self, outputs: dict) -> None:
        summed = {key: metrics_lib.sum_over_steps(outputs[key]) for key in ("loss", "metrics") if key in outputs}
        summed["examples"] = float(np.sum(outputs["examples"]))
        self._padded_scalar_loss = self._padded_scalar_loss or bool(np.any(outputs.get("padded_scalar_loss", False)))
        totals = self._totals
        self._totals = summed if totals is None else {
            key: (totals[key] + value if key == "examples" else metrics_lib.merge_all(totals[key], value))
            for key, value in summed.items()}
        if "host_tensors" in outputs:
            keep = ~np.asarray(outputs["mask"]).reshape(-1)
            self._tensors.append(jax.tree.map(lambda x: np.asarray(x).reshape((-1,) + x.shape[2:])[keep],
                                              outputs["host_tensors"]))

    def result(self, global_step: int, metric_fn) -> dict:
        """The evaluation's result at ``global_step``; ``metric_fn`` (``eval_metrics=(metric_fn, tensors)``)
        runs here, once, over every real example's tensors."""
        totals = self._totals
        if totals is None:
            raise InputError("input_fn gave no batch to evaluate")
        result = {"global_step": global_step, "examples": int(round(totals["examples"]))}
        if "loss" in totals:
            result["loss"] = totals["loss"].result()
            if self._padded_scalar_loss:
                _log.warning("evaluation: model_fn's loss is a scalar, so the loss of a padded batch includes its "
                             "padding rows; return per-example losses [B] (or mask with est.metrics.current_mask()) "
                             "for the exact mean")
        if "metrics" in totals:
            result.update(metrics_lib.results(totals["metrics"]))
        if self._tensors:
            joined = jax.tree.map(lambda *xs: np.concatenate(xs), *self._tensors)
            values = metric_fn(**joined) if isinstance(joined, dict) else metric_fn(*joined)
            result.update({k: float(v) for k, v in values.items()})
        return result
