"""The host side of training between its compiled loops: each loop's outputs fetched, ``host_call`` run for
each of its steps, log lines and summaries (to ``RunConfig.writers``, with what ``host_call`` functions
return), and checkpoints on the RunConfig's cadence (each process's input position saved with it;
``before_save``, the hooks' ``before_checkpoint``, may refuse one: ``StopOnNaN`` refuses a state holding NaN
or Inf); where the input resumes from the latest checkpoint. Each part is a named
``jax.profiler`` event (``estimator/fetch_outputs``, ``estimator/host_call``, ``estimator/summaries``,
``estimator/checkpoint``) in a profile (``RunConfig.profile_steps``).
"""

from __future__ import annotations

import logging
import time

import jax
import numpy as np
from jax.profiler import TraceAnnotation

from estimator.checkpoints.manager import Checkpoints
from estimator.config import RunConfig
from estimator.errors import CheckpointMismatchError
from estimator.loop.inputs import fetch, gather_json
from estimator.loop.progress import StepLogger
from estimator.summaries.writers.run_writers import RunWriters

__all__ = ["TrainBookkeeping", "checkpointed_input"]

_log = logging.getLogger("estimator")


def checkpointed_input(checkpoints: Checkpoints) -> dict | None:
    """This process's input position in the latest checkpoint (a list of them when several processes wrote it)."""
    saved = checkpoints.extras().get("input")
    if not isinstance(saved, list):
        if jax.process_count() > 1 and saved is not None:
            raise CheckpointMismatchError(f"{checkpoints.latest_path()} was written by one process; this run "
                                          f"has {jax.process_count()}: the input cannot resume where it stood")
        return saved
    if len(saved) != jax.process_count():
        raise CheckpointMismatchError(f"{checkpoints.latest_path()} was written by {len(saved)} processes; "
                                      f"this run has {jax.process_count()}: the input cannot resume where it stood")
    return saved[jax.process_index()]


class TrainBookkeeping:
    """What one ``Estimator.train`` call does on the host after each loop, from step ``start`` to ``target``:
    :meth:`after_loop`, then :meth:`checkpoint_if_due`; :meth:`close` at the end. Summaries go to every
    writer of ``RunConfig.writers`` (``hparams`` first, when given)."""

    def __init__(self, config: RunConfig, checkpoints: Checkpoints, start: int, target: int,
                 examples_per_step: int, hparams: dict | None = None):
        self.config, self.checkpoints, self.target = config, checkpoints, target
        self.writers = RunWriters(config.writers, config.model_dir)
        try:
            self.writers.write_hparams(hparams or {})
            quiet = config.log_step_count_steps is None          # rates still measured, for the summaries
            self.logger = StepLogger(total_steps=target, examples_per_step=examples_per_step, initial_step=start,
                                     every_steps=config.log_step_count_steps or config.save_summary_steps,
                                     desc="train", bar=False if quiet else None, quiet=quiet)
        except BaseException:
            self.writers.close(quiet=True)
            raise
        self._saved_step, self._saved_time = start, time.monotonic()
        self.start = start
        self.final_loss: float | None = None      # the loss of the last step run

    @staticmethod
    def fetch(outputs: dict) -> dict:
        """A loop's outputs as numpy (waits for the loop to end)."""
        with TraceAnnotation("estimator/fetch_outputs"):
            return fetch(outputs)

    def after_loop(self, first: int, n: int, outputs: dict, host_call_fn, input_wait_s: float | None = None) -> None:
        """Runs the host_call, logs, and writes summaries (every save_summary_steps and at the end) of a loop's
        outputs (:meth:`fetch`'s); ``input_wait_s``: the seconds the loops have waited for their input so far."""
        losses = np.asarray(outputs["loss"])
        if "host_call" in outputs:
            with TraceAnnotation("estimator/host_call"):
                where = f"host_call's {getattr(host_call_fn, '__qualname__', 'function')}"
                for i in range(n):
                    args = jax.tree.map(lambda x: x[i], outputs["host_call"])
                    values = host_call_fn(first + i, **args) if isinstance(args, dict) else \
                        host_call_fn(first + i, *args)
                    self.writers.write_values(first + i, values, where)      # what it returned, if anything
        step = first + n
        with TraceAnnotation("estimator/summaries"):
            if first == self.start:
                self.logger.first_step(first + 1, losses[0])
            self.final_loss = float(losses[-1])
            rates = self.logger.update(step, loss=self.final_loss, input_wait_s=input_wait_s)
            every = self.config.save_summary_steps
            if step // every > first // every or rates or step >= self.target:
                scalars = {"loss": float(losses[-1]), **rates}
                if "learning_rate" in outputs:
                    scalars["learning_rate"] = float(np.asarray(outputs["learning_rate"])[-1])
                self.writers.write_scalars(step, scalars)

    def checkpoint_if_due(self, step: int, state, input_state: dict | None, before_save=None) -> None:
        """Saves ``state`` as checkpoint ``step``, with each process's input position, when the cadence
        says so or at ``target``; ``before_save(step, state)`` first (the hooks' ``before_checkpoint``)."""
        if self._due(step - self._saved_step, time.monotonic() - self._saved_time) or step >= self.target:
            with TraceAnnotation("estimator/checkpoint"):
                if before_save is not None:
                    before_save(step, state)
                inputs = gather_json(input_state)       # each process's own input position
                self.checkpoints.save(step, state, {"input": inputs if len(inputs) > 1 else input_state,
                                                    "global_step": step})
            self._saved_step, self._saved_time = step, time.monotonic()

    def close(self, failed: bool = False) -> None:
        """Closes the log's progress bar and the metric writers (``failed``: the call is failing already, so a
        writer's error on closing is logged, not raised); logs ``Loss for final step: X.`` (TPUEstimator's last
        line of ``train``) when the call ran a step and did not fail, unless the progress lines are off."""
        try:
            self.logger.close()
            if not failed and self.final_loss is not None and self.config.log_step_count_steps is not None:
                _log.info("Loss for final step: %g.", self.final_loss)
        finally:
            self.writers.close(quiet=failed)

    def _due(self, steps_since: int, seconds_since: float) -> bool:
        cfg = self.config
        if cfg.checkpoint_every_steps:
            return steps_since >= cfg.checkpoint_every_steps
        due = seconds_since >= cfg.save_checkpoints_secs
        if jax.process_count() > 1:           # clocks differ: process 0 decides for all
            from jax.experimental import multihost_utils
            due = bool(multihost_utils.broadcast_one_to_all(np.bool_(due)))
        return due
