"""Metric writers, where training's and evaluation's summaries go (``RunConfig(writers=[...])``), under their
public name: they live in :mod:`estimator.summaries.writers`, which says what a writer is.

>>> from estimator.writers import JsonLinesWriter
>>> JsonLinesWriter.__module__
'estimator.summaries.writers.jsonlines'
"""

from estimator.summaries.writers import (Histogram, Image, JsonLinesWriter, MetricWriter, TensorBoardWriter,
                                         read_metrics)

__all__ = ["Histogram", "Image", "JsonLinesWriter", "MetricWriter", "TensorBoardWriter", "read_metrics"]
