"""The errors the estimator raises on purpose: one type per failure a user can act on, all ``EstimatorError``.

Each type is also the built-in error that the same failure raised before it had
a type of its own (``except ValueError`` still catches a bad ``RunConfig``).
A type raised both for a thing of the wrong type and for one of the wrong value
(what ``model_fn`` or ``input_fn`` gave) is both a ``TypeError`` and a
``ValueError``. Errors of the libraries underneath (JAX, orbax, numpy, infeed,
xla_runtime) pass through as they are.

>>> import estimator as est
>>> try:
...     est.RunConfig(model_dir="runs/x", iterations_per_loop=0)
... except est.InvalidArgumentError as e:
...     print(isinstance(e, ValueError), e)
True RunConfig.iterations_per_loop must be a positive int, got 0
"""

from __future__ import annotations

__all__ = ["EstimatorError", "InvalidArgumentError", "ArgumentTypeError", "ModelFnError", "InputError",
           "StepRngError", "NonFiniteError", "NoCheckpointError", "CheckpointMismatchError",
           "CorruptCheckpointError", "CheckpointSaveError", "ExportExistsError", "NotAnExportError",
           "CorruptExportError", "ExportIntegrityError", "MissingDependencyError", "CorruptSummaryError"]


class EstimatorError(Exception):
    """Base class of every error the estimator raises on purpose."""


class InvalidArgumentError(EstimatorError, ValueError):
    """A value given to the estimator is invalid: a field of ``RunConfig``, ``TrainSpec``, ``EvalSpec``,
    ``EstimatorSpec`` or ``TensorSpec``; an argument of ``Estimator`` (a batch size, no optimizer to
    train with), ``train``, ``Checkpoints``, ``export_model``, a metric, ``SummaryWriter`` or
    ``StepLogger``; or, as for Python's files, a ``SummaryWriter`` written after ``close``."""


class ArgumentTypeError(EstimatorError, TypeError):
    """An argument is not of the type wanted: ``model_fn``, ``init_fn`` or an ``input_fn`` that is not
    a function, a ``config`` that is not a ``RunConfig``, ``serving_features`` that are not
    ``TensorSpec``, a ``Metric`` merged with something else."""


class ModelFnError(EstimatorError, TypeError, ValueError):
    """``model_fn`` (or the ``predict_fn`` given to ``export_model``) returned what its mode cannot use:
    not an ``EstimatorSpec``, or not a flat dict of arrays (a ``TypeError``); no loss in TRAIN mode,
    or predictions that are not a dict (a ``ValueError``)."""


class InputError(EstimatorError, TypeError, ValueError):
    """The input cannot be fed: ``input_fn`` returned neither an ``infeed.Dataset`` nor an iterable of
    ``(features, labels)`` pairs (a ``TypeError``), or batches of another size than the mode's, or no
    batch at all (a ``ValueError``), or a training input that cannot save or take its position (one
    without ``get_state``/``set_state`` under ``RunConfig.require_resumable_input``, a state that is not
    JSON, a checkpointed position of another kind of input: :mod:`estimator.loop.resumable`); likewise the
    features given to an exported model
    (:class:`estimator.LoadedModel`): not a dict, or a feature of another dtype (a ``TypeError``),
    missing, unknown or of another shape (a ``ValueError``)."""


class StepRngError(EstimatorError, RuntimeError):
    """``step_rng()`` was called outside ``model_fn`` in TRAIN mode, where there is no step key."""


class NonFiniteError(EstimatorError, FloatingPointError):
    """Training met a NaN or Inf (``RunConfig.stop_on_nan``): in a step's loss (the message names the
    step and its loop) or in a train state about to be checkpointed (it names the variable). That
    state was not saved; the message names the last checkpoint."""


class NoCheckpointError(EstimatorError, FileNotFoundError, ValueError):
    """There is no checkpoint where one is needed: ``Checkpoints.restore`` / ``restore_numpy`` /
    ``extras`` of a step that is not there, a warm start from a path that does not exist, or
    ``evaluate`` / ``predict`` / ``export`` / ``get_variables`` before anything was trained or saved
    in ``model_dir``. A ``FileNotFoundError``, and a ``ValueError`` as the Estimator's methods raised."""


class CheckpointMismatchError(EstimatorError, ValueError):
    """A checkpoint does not fit what reads it: a restore target whose key paths or shapes differ
    (the message names each), a warm start that matched no variable, or an input position saved by
    another number of processes than this run has."""


class CorruptCheckpointError(EstimatorError, ValueError):
    """A checkpoint file differs from what was written: ``path`` (the file), ``checkpoint`` (its step's
    directory) and ``reason`` (what differs)."""

    def __init__(self, checkpoint: str, path: str, reason: str):
        super().__init__(f"checkpoint {checkpoint} is damaged: {path}: {reason}; nothing was restored (delete "
                         f"{checkpoint} to go on from an older checkpoint)")
        self.checkpoint, self.path, self.reason = checkpoint, path, reason


class CheckpointSaveError(EstimatorError, OSError):
    """Saving checkpoint ``step`` into ``path`` failed (the cause is chained); the checkpoints saved
    before it are intact."""

    def __init__(self, step: int, path: str, cause: BaseException):
        super().__init__(f"saving checkpoint {step} to {path} failed: {type(cause).__name__}: {cause}")
        self.step, self.path = step, path


class ExportExistsError(EstimatorError, FileExistsError):
    """``export_model`` was given a directory that exists and is not empty (``overwrite=True`` replaces
    it); ``Estimator.export`` of a step already exported."""


class NotAnExportError(EstimatorError, FileNotFoundError, ValueError):
    """A directory given as an export is none: it has no ``signature.json`` (a ``FileNotFoundError``),
    or one of another format or version (a ``ValueError``)."""


class CorruptExportError(EstimatorError, ValueError):
    """An export directory's file ``path`` is not what :func:`export_model` wrote (``reason``);
    nothing of it was loaded or run."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"refusing to load the export file {path}: {reason}")
        self.path, self.reason = path, reason


class ExportIntegrityError(CorruptExportError):
    """The export ``export`` cannot be shown to be what :func:`export_model` wrote: its ``signature.json``
    lists no file digests or an unparsable list, a file of the export is not listed, a listed file is
    absent (``path`` names it), or ``signature.json``'s SHA-256 is not the ``expected_digest`` given to
    ``load_exported``. Nothing of it was loaded or run."""

    def __init__(self, export: str, path: str, reason: str):
        super().__init__(path, reason)
        self.export = export


class MissingDependencyError(EstimatorError, ImportError):
    """An optional feature needs a package that is not installed (``saved_model=True``: TensorFlow)."""


class CorruptSummaryError(EstimatorError, ValueError):
    """An event file's record (its CRCs good) is not an ``Event`` message: a malformed varint, an
    unknown wire type, a field cut short."""
