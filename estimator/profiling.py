"""``RunConfig.profile_steps``: a ``jax.profiler`` trace of the training loops that run those steps.

Steps run in compiled loops of ``iterations_per_loop``, so whole loops are
traced: the trace starts before the input of the loop that runs step
``first`` is awaited and stops after the host work (host calls, summaries,
checkpoint) of the loop that runs step ``last``. It goes to
``model_dir/profile`` (``model_dir/profile/process_<i>`` with several
processes), where ``jax.profiler`` writes ``plugins/profile/<run>/<host>.xplane.pb``
(TensorBoard's profile plug-in), ``<host>.trace.json.gz`` and
``perfetto_trace.json.gz`` (ui.perfetto.dev). The decoding workers are other
processes, outside the trace: with a Dataset input, the log line that says
where the trace went names the input's ring for ``infeed stats`` (each
worker's share of time decoding and waiting for a free slot). A trace never outlives the
``train`` call that started it, whatever ends the call; a call that never
reaches the steps traces nothing and says so. See docs/profiling.md.
"""

from __future__ import annotations

import logging
import os

import jax

from estimator.config import RunConfig

__all__ = ["ProfileWindow", "profile_dir"]

_log = logging.getLogger("estimator")


def profile_dir(config: RunConfig) -> str:
    """Where this process's traces go: TensorBoard's log directory for the profile plug-in."""
    base = os.path.join(config.model_dir, "profile")
    return base if jax.process_count() == 1 else os.path.join(base, f"process_{jax.process_index()}")


class ProfileWindow:
    """The trace of one ``train`` call, from step ``start`` to ``target``: :meth:`before_loop` and
    :meth:`after_loop` around each loop, :meth:`close` in a ``finally``. Does nothing without
    ``config.profile_steps``. A trace that cannot start or be written costs a warning, not the run."""

    def __init__(self, config: RunConfig, start: int, target: int):
        self.steps, self.dir = config.profile_steps, profile_dir(config)
        self.k, self.start, self.target = config.iterations_per_loop, start, target
        self.step = start               # steps done when the last loop's host work ended
        self._began: int | None = None  # the first step of the first traced loop, while tracing
        self._settled = self.steps is None    # traced already, or cannot be
        #: The input's ``stats()`` (``Input.stats``: None for an iterable): the log line names its ring for
        #: ``infeed stats``, and the decoding workers' stages over the traced loops are logged when the trace
        #: stops, since the trace cannot hold them.
        self.input_stats = None
        self._stats_before = None

    def before_loop(self, step: int) -> None:
        """Starts the trace when the loop from step ``step`` may run a profiled step."""
        if self._settled or self._began is not None:
            return
        first, last = self.steps
        if step <= last and min(step + self.k, self.target) > first:
            try:
                jax.profiler.start_trace(self.dir, create_perfetto_trace=True)
            except Exception as e:      # noqa: BLE001 -- another trace running, an unwritable directory...
                _log.warning("RunConfig.profile_steps=%s: no trace of steps %d..%d: %s", self.steps, first, last, e)
                self._settled = True
                return
            self._began = step
            self._stats_before = self._input_now()

    def after_loop(self, step: int) -> None:
        """Notes that ``step`` steps are done; stops the trace once the last profiled step ran."""
        self.step = step
        if self._began is not None and step > self.steps[1]:
            self._stop("")

    def close(self) -> None:
        """Stops a trace still running (the call ended first: its input, its target, or an error)."""
        if self._began is not None:
            self._stop(f" (the call ended after step {self.step - 1}, before step {self.steps[1]})")
        elif not self._settled:
            first, last = self.steps
            where = (f"this call trained steps {self.start}..{self.step - 1}" if self.step > self.start
                     else f"this call trained no step (from step {self.start})")
            _log.info("RunConfig.profile_steps=(%d, %d): no trace, %s", first, last, where)

    def _stop(self, why: str) -> None:
        began, self._began, self._settled = self._began, None, True
        before, self._stats_before = self._stats_before, None
        stats = self._input_now()
        try:
            jax.profiler.stop_trace()
        except Exception as e:          # noqa: BLE001 -- the trace is a diagnostic: training's result stands
            _log.warning("the profile of steps %d.. could not be written to %s: %s", began, self.dir, e)
            return
        run = _latest_run(self.dir)
        steps = f"the loops of steps {began}..{self.step - 1}" if self.step > began else f"step {began} on"
        ring = ("" if stats is None else f"; the decoding workers run outside it: `infeed stats {stats.ring}` "
                f"shows them while the ring lives")
        _log.info("profile of %s%s written to %s: open it with `tensorboard --logdir %s` (pip install "
                  "tensorboard-plugin-profile; the Profile tab), or %s at https://ui.perfetto.dev%s "
                  "(docs/profiling.md)", steps, why, run, self.dir, os.path.join(run, "perfetto_trace.json.gz"), ring)
        if stats is not None and before is not None:
            stats = stats.since(before)
            _log.info("the input over the profiled loops (docs/diagnostics.md): %s\n%s", stats.bottleneck(),
                      stats.table())

    def _input_now(self):
        """The input's stats now (an ``infeed.InputStats``), or None: an iterable, or an input that fails."""
        if self.input_stats is None:
            return None
        try:
            return self.input_stats()
        except Exception as e:          # noqa: BLE001 -- a diagnostic: the input may be failing already
            _log.warning("the input's stages could not be read: %s", e)
            return None


def _latest_run(logdir: str) -> str:
    """The run directory ``jax.profiler`` wrote last under ``logdir`` (named by the time it started)."""
    root = os.path.join(logdir, "plugins", "profile")
    try:
        runs = [os.path.join(root, name) for name in os.listdir(root)]
        return max(runs, key=os.path.getmtime)
    except (OSError, ValueError):
        return root
