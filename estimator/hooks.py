"""Hooks: host code between training's compiled loops and after evaluations (TF's ``SessionRunHook``).

A hook subclasses :class:`Hook` and overrides what it needs; every method is a no-op:

======================================  =====================================================================
``begin(estimator)``                    once, before the first loop of ``Estimator.train(hooks=...)`` (of the
                                        whole ``train_and_evaluate(hooks=...)``)
``after_loop(context)``                 after each compiled loop: :class:`LoopContext` (``global_step``,
                                        ``loss``, ``losses``, ``outputs``, ``seconds``, ``input_wait_s``, ...)
``before_checkpoint(context)``          before the train state is checkpointed: :class:`CheckpointContext`
                                        (``global_step``, ``state``); raising refuses the checkpoint
``after_evaluation(context)``           after each evaluation of ``train_and_evaluate``:
                                        :class:`EvaluationContext` (``global_step``, ``results``, ``name``)
``end(context)``                        once, however the run ended: :class:`EndContext` (``global_step``,
                                        ``stop_reason``, ``error``: None unless it failed)
======================================  =====================================================================

Hooks run on the host, in the order given, with numpy values fetched once per loop (the loop's
per-step outputs): they never add to the compiled program, so they never make a compilation. A
loop of ``iterations_per_loop`` steps runs between two ``after_loop`` calls (TF's hooks saw every
``session.run``, which was a loop too on a TPU).

**Stopping.** ``context.request_stop(reason)`` in ``after_loop`` ends ``train`` after that loop: the
step reached is checkpointed as at a normal end, and ``train`` returns. ``train_and_evaluate`` then
evaluates that step (every run ends with an evaluation) and returns; a stop requested in
``after_evaluation`` returns at once.

**Failures.** A hook's exception propagates as it is, with a note naming the hook, the method and the
step; ``train`` cleans up first, as after any failure (its input's daemon, workers and shared memory
closed; the next ``train`` resumes from the latest checkpoint), and calls ``end`` with the error.

Built in: :class:`StopOnNaN` (``RunConfig.stop_on_nan``, added first to every ``train``),
:class:`EarlyStopping`, :class:`BestExporter` (TF's ``BestExporter``) and :class:`StepTimeLogger`.

>>> class Recorder(Hook):
...     def __init__(self):
...         self.steps = []
...     def after_loop(self, context):
...         self.steps.append(context.global_step)
...         if context.loss < 0.1:
...             context.request_stop(f"loss {context.loss:.3f} < 0.1")
>>> context = LoopContext(None, global_step=200, first_step=100, outputs={"loss": np.array([0.2, 0.05])})
>>> hook = Recorder()
>>> hook.after_loop(context)
>>> hook.steps, context.stop_reason
([200], 'loss 0.050 < 0.1')
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from estimator.errors import ArgumentTypeError, InvalidArgumentError, NonFiniteError
from estimator.loop.inputs import fetch

__all__ = ["BestExporter", "CheckpointContext", "EarlyStopping", "EndContext", "EvaluationContext", "Hook",
           "LoopContext", "StepTimeLogger", "StopOnNaN"]

_log = logging.getLogger("estimator")


class HookedEstimator(Protocol):
    """What hooks use of the :class:`estimator.Estimator` that runs them (named here, so that this module and
    the estimator, which runs the hooks, do not import each other)."""

    config: Any
    checkpoints: Any

    def global_step(self) -> int: ...

    def export(self, export_dir, serving_features: dict, *, platforms=None, saved_model: bool = False) -> str: ...


# --- the protocol ----------------------------------------------------------------------------------

class _Stoppable:
    """``request_stop`` for the contexts of a loop and of an evaluation."""

    stop_reason: str | None

    def request_stop(self, reason: str = "a hook asked to stop") -> None:
        """Ends training after this loop (or evaluation); ``reason`` is logged. The first request's reason is kept."""
        if self.stop_reason is None:
            self.stop_reason = str(reason)

    @property
    def stop_requested(self) -> bool:
        return self.stop_reason is not None


@dataclass(eq=False)
class LoopContext(_Stoppable):
    """What ``after_loop`` is told of the compiled loop that ran steps ``first_step + 1 .. global_step``.

    outputs: the loop's per-step outputs as numpy, stacked ``[steps, ...]``: ``"loss"``, and
        ``"learning_rate"`` (``optax.inject_hyperparams``) and ``"host_call"`` when present.
    seconds: wall time since the previous loop's ``after_loop`` (since the input was ready, for the first
        loop of a ``train`` call: compilation included, see ``includes_startup``).
    input_wait_s: of those seconds, how long the loop waited for its input (None when unknown).
    examples_per_step: the global training batch.
    """

    estimator: HookedEstimator | None
    global_step: int
    first_step: int
    outputs: dict
    seconds: float = math.nan
    input_wait_s: float | None = None
    examples_per_step: int | None = None
    includes_startup: bool = False
    stop_reason: str | None = None

    @property
    def steps(self) -> int:
        """The steps this loop ran."""
        return self.global_step - self.first_step

    @property
    def losses(self) -> np.ndarray:
        """Each step's loss, ``[steps]``."""
        return np.asarray(self.outputs["loss"])

    @property
    def loss(self) -> float:
        """The loss of the loop's last step."""
        return float(self.losses[-1])


@dataclass(eq=False)
class CheckpointContext:
    """What ``before_checkpoint`` is told: the train state (on the devices) about to be saved as ``global_step``."""

    estimator: HookedEstimator | None
    global_step: int
    state: Any


@dataclass(eq=False)
class EvaluationContext(_Stoppable):
    """What ``after_evaluation`` is told: the evaluation's ``results`` (``{"loss", "global_step", metric names...}``,
    as ``Estimator.evaluate`` returns them) at ``global_step``, and the evaluation's ``name``."""

    estimator: HookedEstimator | None
    global_step: int
    results: dict
    name: str | None = None
    stop_reason: str | None = None


@dataclass(eq=False)
class EndContext:
    """What ``end`` is told: the global step reached, the reason of a requested stop (else None), and the
    exception that ended the run (None when it did not fail)."""

    estimator: HookedEstimator | None
    global_step: int
    stop_reason: str | None = None
    error: BaseException | None = None


class Hook:
    """The base of every hook: each method does nothing; override those you need (see the module docstring)."""

    def begin(self, estimator: HookedEstimator) -> None:
        """Before the first loop (once per ``train``, or per ``train_and_evaluate``)."""

    def after_loop(self, context: LoopContext) -> None:
        """After each compiled training loop; ``context.request_stop(reason)`` ends training there."""

    def before_checkpoint(self, context: CheckpointContext) -> None:
        """Before a checkpoint of ``context.state`` is saved; raising refuses it (and ends training)."""

    def after_evaluation(self, context: EvaluationContext) -> None:
        """After each evaluation of ``train_and_evaluate``; ``context.request_stop(reason)`` ends the run."""

    def end(self, context: EndContext) -> None:
        """Once, at the end of the run, whether it finished, was stopped or failed (``context.error``)."""


def checked_hooks(hooks, what: str = "hooks") -> tuple[Hook, ...]:
    """``hooks`` (None or an iterable of :class:`Hook`) as a tuple, or an ``ArgumentTypeError`` naming ``what``."""
    if hooks is None:
        return ()
    if isinstance(hooks, (Hook, str, bytes)) or not isinstance(hooks, Iterable):
        raise ArgumentTypeError(f"{what} must be a list of estimator.hooks.Hook, got {type(hooks).__name__}")
    hooks = tuple(hooks)
    for i, hook in enumerate(hooks):
        if not isinstance(hook, Hook):
            raise ArgumentTypeError(f"{what}[{i}] must be an estimator.hooks.Hook (subclass it), "
                                    f"got {type(hook).__name__}")
    return hooks


class HookRunner:
    """One run of hooks, for one ``train`` call or one whole ``train_and_evaluate``: :class:`StopOnNaN` first
    when ``RunConfig.stop_on_nan`` (unless given), then ``hooks`` in order, each hook once.

    ``begin`` starts the run (its hooks' ``begin``) only the first time and says whether it did: the caller
    that started it calls ``end`` (``train`` given ``train_and_evaluate``'s runner leaves both to it).
    """

    def __init__(self, hooks, estimator: HookedEstimator):
        hooks = list({id(h): h for h in checked_hooks(hooks)}.values())          # each once, in order
        if estimator.config.stop_on_nan and not any(isinstance(h, StopOnNaN) for h in hooks):
            hooks.insert(0, StopOnNaN())
        self.hooks, self.estimator = hooks, estimator
        self.stop_reason: str | None = None
        self._begun: list[Hook] | None = None       # the hooks whose begin ran, while the run is on
        self._clock: tuple[float, float | None] | None = None      # (time, input wait) after the last loop
        self._first_loop = True

    @classmethod
    def of(cls, hooks, estimator: HookedEstimator) -> "HookRunner":
        """``hooks`` itself when it is a runner (``train_and_evaluate``'s), else a new run of them."""
        return hooks if isinstance(hooks, HookRunner) else cls(hooks, estimator)

    def begin(self, input_wait_s: float | None = None) -> bool:
        """Starts the loops' clock (``input_wait_s``: the input's wait so far) and, the first time, the run:
        each hook's ``begin``. True when this call started the run."""
        self._clock, self._first_loop = (time.monotonic(), input_wait_s), True
        if self._begun is not None:
            return False
        self._begun = []
        for hook in self.hooks:
            try:
                self._call(hook, "begin", self.estimator, None)
            except BaseException as e:
                self.end(True, e)                 # the hooks that began are told; the run never started
                raise
            self._begun.append(hook)
        return True

    def after_loop(self, first_step: int, steps: int, outputs: dict, input_wait_s: float | None = None) -> bool:
        """Each hook's ``after_loop`` with the loop's fetched ``outputs``; True when one requested a stop."""
        now = time.monotonic()
        since, wait_before = self._clock if self._clock is not None else (now, None)
        context = LoopContext(self.estimator, first_step + steps, first_step, outputs, now - since,
                              None if input_wait_s is None or wait_before is None else input_wait_s - wait_before,
                              self.estimator.batch_sizes.get("train"), self._first_loop)
        self._clock, self._first_loop = (now, input_wait_s), False
        for hook in self.hooks:
            self._call(hook, "after_loop", context, context.global_step)
        return self._stopped(context, "training")

    def before_checkpoint(self, step: int, state) -> None:
        """Each hook's ``before_checkpoint`` (``TrainBookkeeping.checkpoint_if_due``'s ``before_save``)."""
        context = CheckpointContext(self.estimator, step, state)
        for hook in self.hooks:
            self._call(hook, "before_checkpoint", context, step)

    def after_evaluation(self, results: dict, name: str | None = None) -> bool:
        """Each hook's ``after_evaluation``; True when one requested a stop."""
        context = EvaluationContext(self.estimator, int(results["global_step"]), results, name)
        for hook in self.hooks:
            self._call(hook, "after_evaluation", context, context.global_step)
        return self._stopped(context, "train_and_evaluate")

    def end(self, started: bool, error: BaseException | None = None) -> None:
        """Each begun hook's ``end``, when this caller ``started`` the run. Every hook's ``end`` runs; with no
        ``error`` in flight, the first one's exception is raised after them (with one, each is logged)."""
        if not started or self._begun is None:
            return
        begun, self._begun = self._begun, None
        try:
            step = self.estimator.global_step()
        except Exception:                     # the run failed reading its checkpoints: say what is known
            step = -1
        context, raised = EndContext(self.estimator, step, self.stop_reason, error), None
        for hook in begun:
            try:
                self._call(hook, "end", context, step)
            except Exception as e:
                if error is not None:
                    _log.error("%s.end failed after the run failed: %r", type(hook).__name__, e)
                elif raised is None:
                    raised = e
        if raised is not None:
            raise raised

    def _stopped(self, context: _Stoppable, what: str) -> bool:
        if context.stop_reason is None:
            return False
        if self.stop_reason is None:
            self.stop_reason = context.stop_reason
            _log.info("%s stops at step %d: %s", what, context.global_step, context.stop_reason)
        return True

    @staticmethod
    def _call(hook: Hook, method: str, argument, step: int | None) -> None:
        try:
            getattr(hook, method)(argument)
        except Exception as e:
            e.add_note(f"(raised by the hook {type(hook).__name__}.{method}"
                       f"{'' if step is None else f' at global step {step}'})")
            raise


# --- built-in hooks --------------------------------------------------------------------------------

@jax.jit
def _all_finite(leaves):
    """Whether each array of ``leaves`` is free of NaN and Inf, as one bool array."""
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def _last_checkpoint(estimator) -> str:
    """``step N`` of the latest checkpoint once the saves in flight are done, or ``none``."""
    estimator.checkpoints.wait()
    latest = estimator.checkpoints.latest_step()
    return "none" if latest is None else f"step {latest}"


class StopOnNaN(Hook):
    """Stops training with ``NonFiniteError`` (a ``FloatingPointError``) at a NaN or Inf loss, naming the step
    and its loop, before that loop's state is checkpointed; and, naming the variable, at a train state about
    to be checkpointed that holds NaN or Inf (the last update of a loop, which no loss has seen yet). The last
    checkpoint stays good. ``RunConfig(stop_on_nan=True)`` (the default) runs it first in every ``train``."""

    def after_loop(self, context: LoopContext) -> None:
        losses = context.losses
        if np.all(np.isfinite(losses)):
            return
        bad, first = int(np.flatnonzero(~np.isfinite(losses))[0]), context.first_step
        raise NonFiniteError(
            f"the loss is {losses[bad]} at step {first + bad + 1} (in the loop of steps {first + 1}.."
            f"{context.global_step}); training stopped and this loop's state was not saved: the last checkpoint is "
            f"{_last_checkpoint(context.estimator)} (RunConfig(stop_on_nan=False) trains on)")

    def before_checkpoint(self, context: CheckpointContext) -> None:
        leaves = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(context.state)[0]
                  if jnp.issubdtype(x.dtype, jnp.inexact)]
        finite = fetch(_all_finite([x for _, x in leaves])) if leaves else np.ones(0, bool)
        if finite.all():
            return
        raise NonFiniteError(
            f"the train state's {jax.tree_util.keystr(leaves[int(np.flatnonzero(~finite)[0])][0])} holds NaN or Inf "
            f"after step {context.global_step} (the loss was finite up to it); training stopped and this state was "
            f"not saved: the last checkpoint is {_last_checkpoint(context.estimator)} "
            f"(RunConfig(stop_on_nan=False) trains on)")


def _mode(owner: str, mode: str, min_delta) -> float:
    if mode not in ("min", "max"):
        raise InvalidArgumentError(f"{owner}.mode must be 'min' or 'max', got {mode!r}")
    if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)) or not min_delta >= 0:
        raise InvalidArgumentError(f"{owner}.min_delta must be a number >= 0, got {min_delta!r}")
    return float(min_delta)


def _metric(owner: str, results: dict, name: str) -> float:
    if name not in results:
        raise InvalidArgumentError(f"{owner}: the evaluation has no metric {name!r}; it has "
                                   f"{', '.join(sorted(results))}")
    return float(results[name])


def _improves(value: float, best: float | None, mode: str, min_delta: float) -> bool:
    """Whether ``value`` beats ``best`` by more than ``min_delta`` (a first finite value always does)."""
    if math.isnan(value):
        return False
    if best is None:
        return True
    return value < best - min_delta if mode == "min" else value > best + min_delta


class EarlyStopping(Hook):
    """Stops ``train_and_evaluate`` once ``metric`` has not improved for ``patience`` evaluations in a row.

    mode: ``"min"`` (the default: a loss) or ``"max"`` (an accuracy); an improvement beats the best
    value so far by more than ``min_delta``. A NaN never improves. ``best`` and ``best_step`` say where
    the best evaluation was; the counts start again at each ``begin``.

    >>> hook = EarlyStopping("accuracy", patience=2, mode="max")
    >>> hook.begin(None)
    >>> for step, accuracy in [(100, 0.90), (200, 0.95), (300, 0.95), (400, 0.949)]:
    ...     context = EvaluationContext(None, step, {"accuracy": accuracy, "global_step": step})
    ...     hook.after_evaluation(context)
    >>> context.stop_reason
    'accuracy has not improved on 0.95 (step 200) for 2 evaluations'
    """

    def __init__(self, metric: str = "loss", patience: int = 5, mode: str = "min", min_delta: float = 0.0):
        if not isinstance(metric, str) or not metric:
            raise InvalidArgumentError(f"EarlyStopping.metric must be a metric's name, got {metric!r}")
        if isinstance(patience, bool) or not isinstance(patience, int) or patience < 1:
            raise InvalidArgumentError(f"EarlyStopping.patience must be a positive int (evaluations), got {patience!r}")
        self.metric, self.patience, self.mode = metric, patience, mode
        self.min_delta = _mode("EarlyStopping", mode, min_delta)
        self.begin(None)

    def begin(self, estimator) -> None:
        self.best: float | None = None
        self.best_step: int | None = None
        self.evaluations_without_improvement = 0

    def after_evaluation(self, context: EvaluationContext) -> None:
        value = _metric("EarlyStopping", context.results, self.metric)
        if _improves(value, self.best, self.mode, self.min_delta):
            self.best, self.best_step, self.evaluations_without_improvement = value, context.global_step, 0
            return
        self.evaluations_without_improvement += 1
        if self.evaluations_without_improvement >= self.patience:
            since = "no finite value yet" if self.best is None else f"{self.best:.6g} (step {self.best_step})"
            context.request_stop(f"{self.metric} has not improved on {since} for {self.patience} evaluations")


class BestExporter(Hook):
    """Exports the model (``Estimator.export(export_dir, serving_features)``) after each evaluation whose
    ``metric`` is the best so far, and keeps the ``keep`` newest of these exports (so the ``keep`` best):
    TF's ``BestExporter``, as a hook of ``train_and_evaluate`` (``EvalSpec(hooks=[...])``).

    export_dir: default ``model_dir/export/best``; each export is ``<export_dir>/<global_step>``.
    mode / min_delta: as :class:`EarlyStopping`'s (default: the lowest ``loss``).
    platforms: passed to ``Estimator.export``.

    The exports made and their values are recorded in ``<export_dir>/.best_exports.json``, so a restarted
    run compares with the best before it and goes on pruning. Only exports listed there are ever deleted
    (real directories holding a ``signature.json``, never through a link). ``exports`` lists them, oldest
    first. With several processes, process 0 exports.
    """

    RECORD = ".best_exports.json"

    def __init__(self, serving_features: dict, metric: str = "loss", mode: str = "min", keep: int | None = 5,
                 export_dir=None, *, min_delta: float = 0.0, platforms=None):
        if not isinstance(serving_features, dict) or not serving_features:
            raise ArgumentTypeError("BestExporter.serving_features must be a dict of feature name -> "
                                    "estimator.TensorSpec")
        if not isinstance(metric, str) or not metric:
            raise InvalidArgumentError(f"BestExporter.metric must be a metric's name, got {metric!r}")
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep < 1):
            raise InvalidArgumentError(f"BestExporter.keep must be a positive int or None (all), got {keep!r}")
        self.serving_features, self.metric, self.mode, self.keep = serving_features, metric, mode, keep
        self.min_delta = _mode("BestExporter", mode, min_delta)
        self.export_dir = None if export_dir is None else os.fspath(export_dir)
        self.platforms = platforms
        self.exports: list[dict] = []      # {"step", "value", "path"}: ours, oldest first
        self.best: float | None = None

    def begin(self, estimator: HookedEstimator) -> None:
        self._dir = self.export_dir or os.path.join(estimator.config.model_dir, "export", "best")
        self.exports, self.best = self._read_record(), None
        for entry in self.exports:
            if _improves(entry["value"], self.best, self.mode, 0.0):
                self.best = entry["value"]

    def after_evaluation(self, context: EvaluationContext) -> None:
        value = _metric("BestExporter", context.results, self.metric)
        if not _improves(value, self.best, self.mode, self.min_delta):
            return
        self.best = value
        if jax.process_index() != 0:
            return
        path = os.path.join(self._dir, str(context.global_step))
        if os.path.lexists(path):
            _log.warning("BestExporter: %s = %.6g is the best so far, but %s exists already: not exported again",
                         self.metric, value, path)
            return
        path = context.estimator.export(self._dir, self.serving_features, platforms=self.platforms)
        self.exports.append({"step": context.global_step, "value": value, "path": os.path.basename(path)})
        _log.info("BestExporter: %s = %.6g is the best so far: exported step %d", self.metric, value,
                  context.global_step)
        if self.keep is not None:
            for entry in self.exports[:-self.keep]:
                self._delete(os.path.join(self._dir, entry["path"]))
            self.exports = self.exports[-self.keep:]
        self._write_record()

    def _read_record(self) -> list[dict]:
        path = os.path.join(self._dir, self.RECORD)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            _log.warning("BestExporter: %s is unreadable (%s): starting a new record", path, e)
            return []
        if record.get("metric") != self.metric or record.get("mode") != self.mode:
            _log.warning("BestExporter: %s records the %s of %s, not the %s of %s: starting a new record",
                         path, record.get("mode"), record.get("metric"), self.mode, self.metric)
            return []
        return [e for e in record.get("exports", []) if isinstance(e, dict) and {"step", "value", "path"} <= set(e)
                and os.path.basename(str(e["path"])) == str(e["path"]) and str(e["path"]) not in ("", ".", "..")]

    def _write_record(self) -> None:
        path = os.path.join(self._dir, self.RECORD)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"metric": self.metric, "mode": self.mode, "exports": self.exports}, f, indent=1)
        os.replace(path + ".tmp", path)

    @staticmethod
    def _delete(path: str) -> None:
        """Deletes the export at ``path`` if it is one (a real directory with a signature), never through a link."""
        try:
            if not (stat.S_ISDIR(os.lstat(path).st_mode) and os.path.isfile(os.path.join(path, "signature.json"))):
                _log.warning("BestExporter: %s is not an export (no signature.json, or a link): not deleted", path)
                return
            shutil.rmtree(path)
            _log.info("BestExporter: deleted the older export %s", path)
        except FileNotFoundError:
            return
        except OSError as e:
            _log.warning("BestExporter: could not delete the older export %s: %s", path, e)


class StepTimeLogger(Hook):
    """Logs, at INFO on the ``estimator`` logger, the wall time per step of the loops, the steps and examples
    per second and the share of the time spent waiting for the input, after each loop, or at the first loop
    reaching each multiple of ``every_steps`` (covering the loops since the last line)::

        steps 201..300: 0.421 s, 4.21 ms/step, 237.5 steps/s, 30403 examples/s, input wait 2 %

    The first loop of each ``train`` call includes compilation and the input's start-up: it is logged apart
    (``(start-up included)``) and left out of the others. ``history``: ``(global_step, seconds per step)``
    of each line.
    """

    def __init__(self, every_steps: int | None = None, logger: logging.Logger | None = None):
        if every_steps is not None and (isinstance(every_steps, bool) or not isinstance(every_steps, int)
                                        or every_steps < 1):
            raise InvalidArgumentError(f"StepTimeLogger.every_steps must be a positive int or None, "
                                       f"got {every_steps!r}")
        self.every_steps, self.logger = every_steps, logger or _log
        self.history: list[tuple[int, float]] = []
        self._pending = None

    def begin(self, estimator) -> None:
        self._pending = None

    def after_loop(self, context: LoopContext) -> None:
        if context.includes_startup:
            self._pending = None
            self._line(context.first_step, context.global_step, context.seconds, context.input_wait_s,
                       context.examples_per_step, " (start-up included)")
            return
        first, seconds, wait = self._pending or (context.first_step, 0.0, 0.0)
        seconds += context.seconds
        wait = None if wait is None or context.input_wait_s is None else wait + context.input_wait_s
        every = self.every_steps
        if every is not None and context.global_step // every == context.first_step // every:
            self._pending = first, seconds, wait
            return
        self._pending = None
        self._line(first, context.global_step, seconds, wait, context.examples_per_step, "")

    def _line(self, first: int, last: int, seconds: float, wait: float | None, examples: int | None,
              note: str) -> None:
        steps = last - first
        per_step = seconds / steps
        self.history.append((last, per_step))
        parts = [f"steps {first + 1}..{last}: {seconds:.3f} s", f"{1000 * per_step:.3g} ms/step"]
        if seconds > 0:
            parts.append(f"{steps / seconds:.4g} steps/s")
            if examples:
                parts.append(f"{steps * examples / seconds:.0f} examples/s")
            if wait is not None:
                parts.append(f"input wait {100 * min(wait / seconds, 1):.0f} %")
        self.logger.info("%s%s", ", ".join(parts), note)
