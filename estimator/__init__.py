"""estimator: TPUEstimator's train / evaluate / predict / export, on JAX compiled loops fed by the infeed.

>>> import estimator as est
>>> est.ModeKeys.TRAIN
'train'
"""

from estimator import metrics
from estimator.config import RunConfig
from estimator.estimator import Estimator, step_rng
from estimator.spec import EstimatorSpec, ModeKeys

__all__ = ["Estimator", "EstimatorSpec", "ModeKeys", "RunConfig", "metrics", "step_rng"]
