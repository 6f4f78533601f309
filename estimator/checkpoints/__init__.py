"""Checkpoints of the train state: saved by orbax with a digest manifest, listed, restored checked, and read
for warm starts.

:mod:`estimator.checkpoints.manager`: :class:`Checkpoints` (atomic, asynchronous, the last K kept, JSON extras);
:mod:`estimator.checkpoints.manifest`: each file's size and SHA-256, written as orbax commits and checked
before a restore; :mod:`estimator.checkpoints.storage`: where checkpoints can be written (local paths, ``gs://``
with a client and credentials); :mod:`estimator.checkpoints.warm_start`: variables taken by name from a
checkpoint or an export. All log to the ``estimator.checkpoints`` logger.
"""

from estimator.checkpoints.manager import Checkpoints
from estimator.checkpoints.warm_start import warm_start

__all__ = ["Checkpoints", "warm_start"]
