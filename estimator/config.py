"""``RunConfig``: where and how an Estimator runs, every field checked when it is made."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from jax.sharding import PartitionSpec as P

from estimator.checkpoints.storage import check_checkpoint_storage
from estimator.errors import InvalidArgumentError
from estimator.summaries.writers.protocol import check_writer_entries
from estimator.summaries.writers.tensorboard import TensorBoardWriter

__all__ = ["RunConfig"]


def _positive(name, value, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgumentError(f"RunConfig.{name} must be a positive int{' or None' if allow_none else ''}, "
                                   f"got {value!r}")


def _directory(name, config, allow_none=False):
    """Checks that field ``name`` is a non-empty path (or None when allowed) and makes it a str."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise InvalidArgumentError(f"RunConfig.{name} must be a directory path{' or None' if allow_none else ''}, "
                                   f"got {value!r}")
    object.__setattr__(config, name, os.fspath(value))


def _profile_steps(steps) -> tuple[int, int] | None:
    """``steps`` as a ``(first, last)`` tuple, or an InvalidArgumentError naming the field."""
    if steps is None:
        return None
    if not (isinstance(steps, (tuple, list)) and len(steps) == 2
            and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)):
        raise InvalidArgumentError(f"RunConfig.profile_steps must be None or a pair of step indices (first, last), "
                                   f"got {steps!r}")
    first, last = steps
    if not 0 <= first <= last:
        raise InvalidArgumentError(f"RunConfig.profile_steps must have 0 <= first <= last, got {tuple(steps)!r}")
    return first, last


@dataclass(frozen=True)
class RunConfig:
    """As TPUEstimator's RunConfig + TPUConfig, for JAX.

    model_dir: checkpoints, TensorBoard events and the exported models go here.
    iterations_per_loop: training steps per compiled loop (one host round trip).
    mesh_shape: device mesh axes, e.g. ``{"data": -1}`` or ``{"data": -1, "model": 2}``.
    variable_sharding: how the variables (and the optimizer state that mirrors them) are split
        over the mesh: a rule list ``[(regex, PartitionSpec), ...]`` matched against each leaf's
        key path (``"['params']['w1']"``; first match wins, no match is replicated), or None
        (everything replicated: data parallelism alone).
    save_checkpoints_steps / save_checkpoints_secs: checkpoint cadence (at most one of
        them; neither: every 1,000 steps); checkpoints are taken at loop ends.
    keep_checkpoint_max: checkpoints kept (None: all).
    checkpoint_dir: where the checkpoints go, ``<checkpoint_dir>/<step>/`` (a local path or a URI orbax
        writes to, e.g. ``gs://...``); None (the default): ``model_dir/checkpoints``. For a training
        system with its own layout: the events, evaluations and profiles stay in ``model_dir``.
    save_summary_steps: summaries cadence (loss, steps and examples per second, learning rate).
    log_step_count_steps: the progress lines' cadence (``loss = ..., step = ...``, ``global_step/sec``,
        ``examples/sec``, ``input wait``: INFO on the ``estimator`` logger, which gets a handler on stderr
        when the application has configured no logging; see docs/porting.md). None: quiet (no progress
        line or bar, no handler; warnings still show).
    seed: the PRNG seed of initialisation and of the train state's key.
    infeed_workers / infeed_slots: the decoding daemon's processes and ring slots.
    stop_on_nan: stop training with ``NonFiniteError`` (a ``FloatingPointError``; naming the step and
        its loop) when the loss is NaN or Inf, before that loop's state is checkpointed, and (naming
        the variable) when a state about to be checkpointed holds NaN or Inf: the last checkpoint
        stays good (the hook ``estimator.hooks.StopOnNaN``, run first in every ``train``).
    profile_steps: ``(first, last)``: ``train`` records a ``jax.profiler`` trace of the compiled loops
        that run steps ``first`` to ``last`` (step indices from 0, as ``xla_runtime.current_step()`` and
        ``host_call`` functions see them), the infeed's stages among its named events, into
        ``model_dir/profile`` (``plugins/profile/<run>/<host>.xplane.pb``, as TensorBoard's profile
        plug-in reads it, and ``perfetto_trace.json.gz`` for ui.perfetto.dev; with several processes,
        ``model_dir/profile/process_<i>``). Whole loops are traced: from the loop holding ``first``
        (its input's wait included) to the end of the host work after the loop holding ``last``.
        None (the default): no trace. See docs/profiling.md.
    require_resumable_input: ``train`` raises ``InputError`` before any step when its input cannot save its
        position (an iterable whose iterator has no ``get_state()``/``set_state()``: a list, a generator);
        False (the default): a WARNING says that such an input reads again from its beginning on the next
        ``train`` and after a restore. See ``estimator.loop.resumable``.
    distributed: call ``jax.distributed.initialize()`` (multi-host): with ``coordinator_address``,
        ``num_processes`` and ``process_id`` when given, else as JAX finds them in the environment.
    compilation_cache_dir: a directory (or URI) where JAX's persistent compilation cache keeps every
        program compiled, however quick to compile: the next process that compiles the same program (a
        restarted job, the same model trained again) reads it from there instead of compiling it. Set by
        the Estimator when it is made, for the whole process (JAX has one such cache per process: an
        Estimator asking for another directory than the process's raises ``InvalidArgumentError``). None:
        the process's setting is left as it is (JAX's default: no cache).
    writers: where summaries go: training's (loss, rates, learning rate; what ``host_call`` functions
        return) and each evaluation's results go to every writer, on process 0. Each entry is a writer
        factory, a class or function made into a writer for each ``train`` / ``evaluate`` call from the
        run's log directory (``model_dir``; ``model_dir/eval``, ``model_dir/eval_<name>``) and closed when
        the call ends, or one ``estimator.writers.MetricWriter`` object shared by every call (flushed at
        the end of each, never closed by the estimator; evaluation's tags prefixed ``eval/``). Default:
        ``(TensorBoardWriter,)``, event files as TensorBoard reads them; add
        ``estimator.writers.JsonLinesWriter`` for ``metrics.jsonl`` files, or your tracker's writer. An
        entry that is neither raises ``InvalidArgumentError`` naming it and the methods it lacks. See
        ``estimator/summaries/writers/`` and docs/porting.md.
    """

    model_dir: str
    iterations_per_loop: int = 100
    mesh_shape: dict = field(default_factory=lambda: {"data": -1})
    variable_sharding: list | None = None
    save_checkpoints_steps: int | None = None
    save_checkpoints_secs: float | None = None
    keep_checkpoint_max: int | None = 5
    checkpoint_dir: str | None = None
    save_summary_steps: int = 100
    log_step_count_steps: int | None = 100
    seed: int = 0
    infeed_workers: int = 2
    infeed_slots: int = 4
    stop_on_nan: bool = True
    distributed: bool = False
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    compilation_cache_dir: str | None = None
    profile_steps: tuple[int, int] | None = None
    require_resumable_input: bool = False
    writers: tuple = (TensorBoardWriter,)

    def __post_init__(self):
        _directory("model_dir", self)
        _directory("compilation_cache_dir", self, allow_none=True)
        _directory("checkpoint_dir", self, allow_none=True)
        check_checkpoint_storage(self.checkpoint_directory, "RunConfig." + ("model_dir" if self.checkpoint_dir is None
                                                                            else "checkpoint_dir"))
        for name in ("iterations_per_loop", "save_summary_steps", "infeed_workers", "infeed_slots"):
            _positive(name, getattr(self, name))
        _positive("log_step_count_steps", self.log_step_count_steps, allow_none=True)
        _positive("save_checkpoints_steps", self.save_checkpoints_steps, allow_none=True)
        _positive("keep_checkpoint_max", self.keep_checkpoint_max, allow_none=True)
        if self.save_checkpoints_secs is not None and not self.save_checkpoints_secs > 0:
            raise InvalidArgumentError(f"RunConfig.save_checkpoints_secs must be positive, "
                                       f"got {self.save_checkpoints_secs!r}")
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise InvalidArgumentError("RunConfig: set save_checkpoints_steps or save_checkpoints_secs, not both")
        if not isinstance(self.mesh_shape, dict) or not self.mesh_shape:
            raise InvalidArgumentError(f"RunConfig.mesh_shape must be a dict of axis sizes, got {self.mesh_shape!r}")
        if "data" not in self.mesh_shape:
            raise InvalidArgumentError(f"RunConfig.mesh_shape needs a 'data' axis (batches are split over it), "
                                       f"got {self.mesh_shape!r}")
        _positive("num_processes", self.num_processes, allow_none=True)
        if self.process_id is not None and (isinstance(self.process_id, bool) or not isinstance(self.process_id, int)
                                            or self.process_id < 0):
            raise InvalidArgumentError(f"RunConfig.process_id must be an int >= 0 or None, got {self.process_id!r}")
        if not self.distributed and (self.coordinator_address or self.num_processes or self.process_id is not None):
            raise InvalidArgumentError("RunConfig: coordinator_address, num_processes and process_id need "
                                       "distributed=True")
        if self.variable_sharding is not None and not (
                isinstance(self.variable_sharding, list) and all(
                    isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str) and isinstance(r[1], P)
                    for r in self.variable_sharding)):
            raise InvalidArgumentError("RunConfig.variable_sharding must be a list of (regex, PartitionSpec) pairs, "
                                       f"got {self.variable_sharding!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InvalidArgumentError(f"RunConfig.seed must be an int, got {self.seed!r}")
        object.__setattr__(self, "profile_steps", _profile_steps(self.profile_steps))
        if not isinstance(self.require_resumable_input, bool):
            raise InvalidArgumentError(f"RunConfig.require_resumable_input must be a bool, "
                                       f"got {self.require_resumable_input!r}")
        object.__setattr__(self, "writers", check_writer_entries(self.writers))

    @property
    def checkpoint_directory(self) -> str:
        """Where the checkpoints go: ``checkpoint_dir``, or ``model_dir/checkpoints``."""
        return self.checkpoint_dir if self.checkpoint_dir is not None else os.path.join(self.model_dir, "checkpoints")

    @property
    def checkpoint_every_steps(self) -> int | None:
        """Steps between checkpoints (None when they are timed)."""
        if self.save_checkpoints_secs is not None:
            return None
        return self.save_checkpoints_steps or 1000
