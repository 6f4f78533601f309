"""Random draws that belong to a record: the same for it whichever worker, host or resumed run decodes it.

A record is named by ``(epoch, file, record)``: the epoch, the file's number in
the dataset's list of files (before any shuffle or sharding) and the record's
number in that file. Its generator is a counter-based Philox stream keyed by
``(seed, stream)`` at counter ``(0, record, file, epoch)``: no state is carried
from one record to the next, so the draws do not depend on the order, the
worker count or where a run resumed. The lowest counter word is the one Philox
advances as it draws, so records never share a block of random bits.

>>> a = record_generator(seed=7, ids=(0, 3, 12)).random()
>>> a == record_generator(seed=7, ids=(0, 3, 12)).random() != record_generator(seed=7, ids=(1, 3, 12)).random()
True
"""

from __future__ import annotations

import numpy as np

__all__ = ["record_generator", "STREAM_IMAGE", "STREAM_TRANSFORM", "STREAM_BATCH_TRANSFORM"]

#: Streams of a record: one per image feature (``STREAM_IMAGE + its position in the spec``), the user's transforms.
STREAM_TRANSFORM = 1
#: The stream of a dataset's ``batch_transform``, whose ids are ``(epoch, shard_index, batch)``.
STREAM_BATCH_TRANSFORM = 2
STREAM_IMAGE = 1 << 16

_U64 = (1 << 64) - 1


def record_generator(seed: int, ids, stream: int = 0) -> np.random.Generator:
    """The ``numpy.random.Generator`` of the record ``ids = (epoch, file, record)`` for ``(seed, stream)``."""
    epoch, file, record = (int(v) for v in ids)
    if not (0 <= seed <= _U64 and 0 <= stream <= _U64 and min(epoch, file, record) >= 0):
        raise ValueError(f"seed, stream and ids must be non-negative 64-bit ints, got {seed}, {stream}, {ids}")
    counter = np.array([0, record, file, epoch], dtype=np.uint64)
    return np.random.Generator(np.random.Philox(key=seed | stream << 64, counter=counter))
