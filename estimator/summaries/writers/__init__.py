"""Metric writers: where training's and evaluation's summaries go (``RunConfig(writers=[...])``).

A writer is any object with the seven methods of :class:`MetricWriter` (CLU's names: ``write_scalars``,
``write_histograms``, ``write_images``, ``write_texts``, ``write_hparams``, ``flush``, ``close``).
:class:`TensorBoardWriter` (the default) and :class:`JsonLinesWriter` are made per run from a log
directory; a tracker's writer is passed as one object shared by every call (see
:mod:`estimator.summaries.writers.run_writers` and docs/porting.md). A ``host_call`` function's returned
``{tag: value}`` goes to every writer, each value as the kind :mod:`estimator.summaries.writers.values` says
(:class:`Image` and :class:`Histogram` mark an array's kind).
"""

from estimator.summaries.writers.jsonlines import JsonLinesWriter, read_metrics
from estimator.summaries.writers.protocol import MetricWriter
from estimator.summaries.writers.tensorboard import TensorBoardWriter
from estimator.summaries.writers.values import Histogram, Image

__all__ = ["Histogram", "Image", "JsonLinesWriter", "MetricWriter", "TensorBoardWriter", "read_metrics"]
