"""estimator: TPUEstimator's train / evaluate / predict / export, on JAX compiled loops fed by the infeed.

>>> import estimator as est
>>> est.ModeKeys.TRAIN
'train'
"""

from estimator import hooks, metrics, writers
from estimator.config import RunConfig
from estimator.errors import (ArgumentTypeError, CheckpointMismatchError, CheckpointSaveError, CorruptCheckpointError,
                              CorruptExportError, CorruptSummaryError, EstimatorError, ExportExistsError,
                              ExportIntegrityError, InputError, InvalidArgumentError, MissingDependencyError,
                              ModelFnError, NoCheckpointError, NonFiniteError, NotAnExportError, StepRngError)
from estimator.estimator import Estimator
from estimator.export import LoadedModel, TensorSpec, export_digest, load_exported
from estimator.loop import step_rng
from estimator.spec import EstimatorSpec, ModeKeys
from estimator.training import EvalSpec, TrainSpec, train_and_evaluate

__all__ = ["ArgumentTypeError", "CheckpointMismatchError", "CheckpointSaveError", "CorruptCheckpointError",
           "CorruptExportError", "CorruptSummaryError", "Estimator", "EstimatorError", "EstimatorSpec", "EvalSpec",
           "ExportExistsError", "ExportIntegrityError", "InputError", "InvalidArgumentError", "LoadedModel",
           "MissingDependencyError", "ModeKeys", "ModelFnError", "NoCheckpointError", "NonFiniteError",
           "NotAnExportError", "RunConfig", "StepRngError", "TensorSpec", "TrainSpec", "export_digest", "hooks",
           "load_exported", "metrics", "step_rng", "train_and_evaluate", "writers"]
