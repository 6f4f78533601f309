"""The host side of training between its compiled loops: each loop's losses checked
(``RunConfig.stop_on_nan``), ``host_call`` run for each of its steps, log lines and summaries (to
``RunConfig.writers``, with what ``host_call`` functions return), and
checkpoints on the RunConfig's cadence (a state holding NaN or Inf never saved, each process's input
position saved with it); where the input resumes from the latest checkpoint. Each part is a named
``jax.profiler`` event (``estimator/fetch_outputs``, ``estimator/host_call``, ``estimator/summaries``,
``estimator/checkpoint``) in a profile (``RunConfig.profile_steps``).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.profiler import TraceAnnotation

from estimator.checkpoints import Checkpoints
from estimator.config import RunConfig
from estimator.errors import CheckpointMismatchError, NonFiniteError
from estimator.inputs import fetch, gather_json
from estimator.progress import StepLogger
from estimator.writers.run_writers import RunWriters

__all__ = ["TrainBookkeeping", "checkpointed_input"]


@jax.jit
def _all_finite(leaves):
    """Whether each array of ``leaves`` is free of NaN and Inf, as one bool array."""
    return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


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
            self.logger = StepLogger(total_steps=target, every_steps=config.log_step_count_steps,
                                     examples_per_step=examples_per_step, initial_step=start, desc="train")
        except BaseException:
            self.writers.close(quiet=True)
            raise
        self._saved_step, self._saved_time = start, time.monotonic()

    def after_loop(self, first: int, n: int, outputs: dict, host_call_fn, input_wait_s: float | None = None) -> None:
        """Checks the loss, runs the host_call, logs, and writes summaries (every save_summary_steps and at the end);
        ``input_wait_s``: the seconds the loops have waited for their input so far."""
        with TraceAnnotation("estimator/fetch_outputs"):       # waits for the loop to end
            outputs = fetch(outputs)
        losses = np.asarray(outputs["loss"])
        if self.config.stop_on_nan and not np.all(np.isfinite(losses)):
            bad = int(np.flatnonzero(~np.isfinite(losses))[0])
            raise NonFiniteError(
                f"the loss is {losses[bad]} at step {first + bad + 1} (in the loop of steps {first + 1}..{first + n}); "
                f"training stopped and this loop's state was not saved: the last checkpoint is "
                f"{self._last_checkpoint()} (RunConfig(stop_on_nan=False) trains on)")
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
            rates = self.logger.update(step, loss=float(losses[-1]), input_wait_s=input_wait_s)
            every = self.config.save_summary_steps
            if step // every > first // every or rates or step >= self.target:
                scalars = {"loss": float(losses[-1]), **rates}
                if "learning_rate" in outputs:
                    scalars["learning_rate"] = float(np.asarray(outputs["learning_rate"])[-1])
                self.writers.write_scalars(step, scalars)

    def checkpoint_if_due(self, step: int, state, input_state: dict | None) -> None:
        """Saves ``state`` as checkpoint ``step``, with each process's input position, when the cadence
        says so or at ``target``; a state holding NaN or Inf is refused first (``stop_on_nan``)."""
        if self._due(step - self._saved_step, time.monotonic() - self._saved_time) or step >= self.target:
            with TraceAnnotation("estimator/checkpoint"):
                if self.config.stop_on_nan:
                    self._check_finite(state, step)
                inputs = gather_json(input_state)       # each process's own input position
                self.checkpoints.save(step, state, {"input": inputs if len(inputs) > 1 else input_state,
                                                    "global_step": step})
            self._saved_step, self._saved_time = step, time.monotonic()

    def close(self, failed: bool = False) -> None:
        """Closes the log's progress bar and the metric writers (``failed``: the call is failing already, so a
        writer's error on closing is logged, not raised)."""
        try:
            self.logger.close()
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

    def _check_finite(self, state, step: int) -> None:
        """Raises NonFiniteError if a float leaf of the train state about to be checkpointed holds
        a NaN or Inf (the loss, computed before each update, cannot show the last step's update)."""
        leaves = [(path, x) for path, x in jax.tree_util.tree_flatten_with_path(state)[0]
                  if jnp.issubdtype(x.dtype, jnp.inexact)]
        finite = fetch(_all_finite([x for _, x in leaves])) if leaves else np.ones(0, bool)
        if finite.all():
            return
        raise NonFiniteError(
            f"the train state's {jax.tree_util.keystr(leaves[int(np.flatnonzero(~finite)[0])][0])} holds NaN or Inf "
            f"after step {step} (the loss was finite up to it); training stopped and this state was not saved: the "
            f"last checkpoint is {self._last_checkpoint()} (RunConfig(stop_on_nan=False) trains on)")

    def _last_checkpoint(self) -> str:
        """``step N`` of the latest checkpoint once the saves in flight are done, or ``none``."""
        self.checkpoints.wait()
        latest = self.checkpoints.latest_step()
        return "none" if latest is None else f"step {latest}"
