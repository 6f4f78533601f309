"""estimator: TPUEstimator's train / evaluate / predict / export, on JAX compiled loops fed by the infeed.

>>> import estimator as est
>>> est.ModeKeys.TRAIN
'train'
"""

from estimator import metrics
from estimator.config import RunConfig
from estimator.estimator import Estimator, step_rng
from estimator.export import LoadedModel, TensorSpec, load_exported
from estimator.spec import EstimatorSpec, ModeKeys

__all__ = ["Estimator", "EstimatorSpec", "LoadedModel", "ModeKeys", "RunConfig", "TensorSpec", "load_exported", "metrics",
           "step_rng"]
