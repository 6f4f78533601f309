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
from estimator.hooks import HookRunner, checked_hooks

__all__ = ["TrainSpec", "EvalSpec", "train_and_evaluate"]

_log = logging.getLogger("estimator")


@dataclass(frozen=True)
class TrainSpec:
    """input_fn: the training input (see :meth:`Estimator.train`). max_steps: the global step to stop at.
    hooks: :class:`estimator.hooks.Hook` objects of the run (see :func:`train_and_evaluate`)."""

    input_fn: Callable
    max_steps: int
    hooks: tuple = ()

    def __post_init__(self):
        if not callable(self.input_fn):
            raise ArgumentTypeError("TrainSpec.input_fn must be a function of params")
        if isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int) or self.max_steps < 1:
            raise InvalidArgumentError(f"TrainSpec.max_steps must be a positive int, got {self.max_steps!r}")
        object.__setattr__(self, "hooks", checked_hooks(self.hooks, "TrainSpec.hooks"))


@dataclass(frozen=True)
class EvalSpec:
    """input_fn: the evaluation input. steps: batches per evaluation (None: the whole input, exactly).
    name: the evaluation's name (its TensorBoard folder is ``eval_<name>``).
    every_steps: training steps between evaluations (None: the RunConfig's checkpoint cadence,
    or 1,000 steps when checkpoints are timed); an evaluation always follows the last step.
    hooks: :class:`estimator.hooks.Hook` objects of the run, such as ``EarlyStopping`` and ``BestExporter``
    (TF's ``EvalSpec(exporters=...)``; see :func:`train_and_evaluate`)."""

    input_fn: Callable
    steps: int | None = None
    name: str | None = None
    every_steps: int | None = None
    hooks: tuple = ()

    def __post_init__(self):
        if not callable(self.input_fn):
            raise ArgumentTypeError("EvalSpec.input_fn must be a function of params")
        for field in ("steps", "every_steps"):
            value = getattr(self, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise InvalidArgumentError(f"EvalSpec.{field} must be a positive int or None, got {value!r}")
        object.__setattr__(self, "hooks", checked_hooks(self.hooks, "EvalSpec.hooks"))


def train_and_evaluate(estimator: Estimator, train_spec: TrainSpec, eval_spec: EvalSpec, hooks=()) -> list[dict]:
    """Trains to ``train_spec.max_steps``, evaluating every ``eval_spec.every_steps`` steps and at the end.

    Each leg resumes from the state (and input position) the previous one
    left, so the weights are those of one uninterrupted ``train``. Returns the
    evaluations' results in order (each has ``global_step``); a run already
    at ``max_steps`` is evaluated once.

    ``train_spec.hooks``, ``eval_spec.hooks`` and ``hooks`` are one run of
    :class:`estimator.hooks.Hook` objects: ``begin`` once, ``after_loop``
    after every training loop, ``after_evaluation`` after every evaluation,
    ``end`` once. A stop requested after a loop ends training there, and that
    step is evaluated; one requested after an evaluation returns at once.
    """
    every = eval_spec.every_steps or estimator.config.checkpoint_every_steps or 1000
    run = HookRunner([*train_spec.hooks, *eval_spec.hooks, *checked_hooks(hooks)], estimator)
    results, began, error = [], False, None
    try:
        began = run.begin()
        step = estimator.global_step()
        while True:
            target = min(train_spec.max_steps, (step // every + 1) * every)
            if step < target:
                estimator.train(train_spec.input_fn, max_steps=target, hooks=run)
                step = estimator.global_step()
            results.append(estimator.evaluate(eval_spec.input_fn, steps=eval_spec.steps, name=eval_spec.name))
            run.after_evaluation(results[-1], eval_spec.name)
            # a hook stopped the run, or it is done, or the training input ran out
            if run.stop_reason is not None or step >= train_spec.max_steps or step < target:
                return results
    except BaseException as e:
        error = e
        raise
    finally:
        run.end(began, error)
