"""``train_and_evaluate``: training that stops to evaluate every so many steps, as tf.estimator's.

>>> import estimator as est
>>> est.EvalSpec(input_fn=lambda params: [], every_steps=500).every_steps
500
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from estimator.errors import ArgumentTypeError, InvalidArgumentError
from estimator.estimator import Estimator

__all__ = ["TrainSpec", "EvalSpec", "train_and_evaluate"]

_log = logging.getLogger("estimator")


@dataclass(frozen=True)
class TrainSpec:
    """input_fn: the training input (see :meth:`Estimator.train`). max_steps: the global step to stop at."""

    input_fn: Callable
    max_steps: int

    def __post_init__(self):
        if not callable(self.input_fn):
            raise ArgumentTypeError("TrainSpec.input_fn must be a function of params")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise InvalidArgumentError(f"TrainSpec.max_steps must be a positive int, got {self.max_steps!r}")


@dataclass(frozen=True)
class EvalSpec:
    """input_fn: the evaluation input. steps: batches per evaluation (None: the whole input, exactly).
    name: the evaluation's name (its TensorBoard folder is ``eval_<name>``).
    every_steps: training steps between evaluations (None: the RunConfig's checkpoint cadence,
    or 1,000 steps when checkpoints are timed); an evaluation always follows the last step."""

    input_fn: Callable
    steps: int | None = None
    name: str | None = None
    every_steps: int | None = None

    def __post_init__(self):
        if not callable(self.input_fn):
            raise ArgumentTypeError("EvalSpec.input_fn must be a function of params")
        for field in ("steps", "every_steps"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidArgumentError(f"EvalSpec.{field} must be a positive int or None, got {value!r}")


def train_and_evaluate(estimator: Estimator, train_spec: TrainSpec, eval_spec: EvalSpec) -> list[dict]:
    """Trains to ``train_spec.max_steps``, evaluating every ``eval_spec.every_steps`` steps and at the end.

    Each leg resumes from the state (and input position) the previous one
    left, so the weights are those of one uninterrupted ``train``. Returns the
    evaluations' results in order (each has ``global_step``); a run already
    at ``max_steps`` is evaluated once.
    """
    every = eval_spec.every_steps or estimator.config.checkpoint_every_steps or 1000
    results = []
    step = estimator.global_step()
    while True:
        target = min(train_spec.max_steps, (step // every + 1) * every)
        if step < target:
            estimator.train(train_spec.input_fn, max_steps=target)
            step = estimator.global_step()
        results.append(estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, name=eval_spec.name))
        if step >= train_spec.max_steps or step < target:     # done, or the training input ran out
            return results
