"""estimator: TPUEstimator's train / evaluate / predict / export, on JAX compiled loops fed by the infeed.

>>> import estimator as est
>>> est.ModeKeys.TRAIN
'train'
"""

from estimator import metrics
from estimator.checkpoints import CheckpointSaveError, CorruptCheckpointError
from estimator.config import RunConfig
from estimator.estimator import Estimator, step_rng
from estimator.export import CorruptExportError, LoadedModel, TensorSpec, load_exported
from estimator.spec import EstimatorSpec, ModeKeys
from estimator.training import EvalSpec, TrainSpec, train_and_evaluate
from xla_runtime import host_call as outside_compilation

__all__ = ["CheckpointSaveError", "CorruptCheckpointError", "CorruptExportError", "Estimator", "EstimatorSpec",
           "EvalSpec", "LoadedModel", "ModeKeys", "RunConfig", "TensorSpec", "TrainSpec", "load_exported", "metrics",
           "outside_compilation", "step_rng", "train_and_evaluate"]
