"""Summaries: what training and evaluation report, as TensorBoard event files and through the metric writers.

:mod:`estimator.summaries.data`: a histogram's buckets, images as uint8 and PNG (the same for every writer);
:mod:`estimator.summaries.event_files`: :class:`SummaryWriter` and :func:`read_scalars`, event files written and
read without TensorFlow; :mod:`estimator.summaries.writers`: where summaries go (``RunConfig(writers=[...])``,
public as :mod:`estimator.writers`).
"""

from estimator.summaries.event_files import SummaryWriter, read_scalars

__all__ = ["SummaryWriter", "read_scalars"]
