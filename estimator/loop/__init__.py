"""The loops' parts, in the order a ``train``, ``evaluate`` or ``predict`` call uses them.

:mod:`estimator.loop.inputs`: what ``input_fn`` returns as device batches ``[K, B, ...]`` (padding, per-process
shards), with :mod:`estimator.loop.resumable`, an iterator input's position in checkpoints;
:mod:`estimator.loop.steps`: the train / eval / predict step functions traced from ``model_fn``;
:mod:`estimator.loop.bookkeeping`: training's host work between loops (outputs, ``host_call``, log lines,
summaries, checkpoint cadence); :mod:`estimator.loop.eval_totals`: evaluation's outputs added up;
:mod:`estimator.loop.progress`: log lines and progress bars. The :class:`~estimator.Estimator` runs them.
"""

from estimator.loop.bookkeeping import TrainBookkeeping
from estimator.loop.eval_totals import EvalTotals
from estimator.loop.inputs import Input
from estimator.loop.progress import StepLogger
from estimator.loop.steps import ModelSteps, step_rng

__all__ = ["EvalTotals", "Input", "ModelSteps", "StepLogger", "TrainBookkeeping", "step_rng"]
