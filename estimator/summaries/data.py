"""Arrays made ready for summaries: a histogram's statistics and buckets, images as uint8 and as PNG files.

Shared by the TensorBoard event-file writer (``estimator.summaries.event_files``) and the JSON-lines writer
(``estimator.summaries.writers.jsonlines``), so both write the same buckets and the same pixels.

>>> h = histogram([0.0, 1.0, 1.0, 3.0], num_buckets=3)
>>> h.count, h.min, h.max, h.edges, h.counts
(4, 0.0, 3.0, (0.0, 1.0, 2.0, 3.0), (1, 2, 1))
>>> encode_png(np.zeros((2, 3, 1), np.uint8))[:8]
b'\\x89PNG\\r\\n\\x1a\\n'
"""

from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from estimator.errors import InvalidArgumentError

__all__ = ["DEFAULT_BUCKETS", "HistogramData", "as_image_batch", "encode_png", "histogram"]

#: Buckets of a histogram when none is asked for (TensorBoard's ``tf.summary.histogram`` default).
DEFAULT_BUCKETS = 30


# ---------------------------------------------------------------- histograms

@dataclass(frozen=True)
class HistogramData:
    """A histogram of an array's finite values: ``counts[i]`` values in ``[edges[i], edges[i + 1])``
    (the last bucket closed), equal-width buckets from ``min`` to ``max``. ``nonfinite``: the NaN and
    ±Inf values left out of everything else."""

    count: int
    min: float
    max: float
    sum: float
    sum_squares: float
    edges: tuple[float, ...]
    counts: tuple[int, ...]
    nonfinite: int = 0

    @property
    def mean(self) -> float:
        return self.sum / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        """The population standard deviation (NaN when there is no value)."""
        if not self.count:
            return math.nan
        return math.sqrt(max(self.sum_squares / self.count - self.mean ** 2, 0.0))


def _buckets(num_buckets) -> int:
    if num_buckets is None:
        return DEFAULT_BUCKETS
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, (int, np.integer)) or num_buckets < 1:
        raise InvalidArgumentError(f"num_buckets must be a positive int, got {num_buckets!r}")
    return int(num_buckets)


def histogram(values, num_buckets: int | None = None, *, tag: str = "histogram") -> HistogramData:
    """The :class:`HistogramData` of ``values`` (any shape, any real dtype; flattened) in ``num_buckets``
    equal-width buckets (default :data:`DEFAULT_BUCKETS`); one bucket when every value is the same."""
    n = _buckets(num_buckets)
    array = np.asarray(values)
    if array.dtype.kind not in "biuf":
        raise InvalidArgumentError(f"{tag}: a histogram needs real numbers, got an array of {array.dtype}")
    x = array.astype(np.float64).ravel()
    finite = x[np.isfinite(x)]
    nonfinite = int(x.size - finite.size)
    if not finite.size:
        return HistogramData(0, 0.0, 0.0, 0.0, 0.0, (0.0, 0.0), (0,), nonfinite)
    lo, hi = float(finite.min()), float(finite.max())
    stats = dict(count=int(finite.size), min=lo, max=hi, sum=float(finite.sum()),
                 sum_squares=float(np.dot(finite, finite)), nonfinite=nonfinite)
    if lo == hi:
        return HistogramData(edges=(lo, hi), counts=(int(finite.size),), **stats)
    counts, edges = np.histogram(finite, bins=n, range=(lo, hi))
    return HistogramData(edges=tuple(float(e) for e in edges), counts=tuple(int(c) for c in counts), **stats)


# ---------------------------------------------------------------- images

def as_image_batch(image, *, tag: str = "image") -> tuple[np.ndarray, bool]:
    """``image`` ([H, W, C] or [N, H, W, C], C from 1 to 4: grey, grey and alpha, RGB, RGBA) as uint8
    [N, H, W, C], and whether it was a batch. uint8 stays as it is; bool is 0 or 255; floats are read as
    intensities in [0, 1] (clipped, NaN as 0) and rounded to 0..255. Anything else is an
    ``InvalidArgumentError`` naming ``tag``."""
    array = np.asarray(image)
    if array.ndim not in (3, 4) or not 1 <= array.shape[-1] <= 4 or 0 in array.shape:
        raise InvalidArgumentError(f"{tag}: an image is [H, W, C] or [N, H, W, C] with 1 to 4 channels and no "
                                   f"empty side, got shape {array.shape}")
    if array.dtype == np.uint8:
        pass
    elif array.dtype == np.bool_:
        array = array.astype(np.uint8) * np.uint8(255)
    elif array.dtype.kind == "f":
        scaled = np.nan_to_num(np.clip(array.astype(np.float32), 0.0, 1.0), nan=0.0) * 255.0
        array = np.rint(scaled).astype(np.uint8)
    else:
        raise InvalidArgumentError(f"{tag}: image pixels are uint8, bool or floats in [0, 1], got {array.dtype}")
    batch = array.ndim == 4
    return np.ascontiguousarray(array if batch else array[None]), batch


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOUR_TYPES = {1: 0, 2: 4, 3: 2, 4: 6}          # channels -> grey, grey + alpha, RGB, RGBA


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(image: np.ndarray, *, level: int = 6) -> bytes:
    """A PNG file (8 bits per channel) of one uint8 [H, W, C] image, C from 1 to 4.

    Every row uses PNG's "Up" filter (its difference from the row above, computed at once with
    numpy), which compresses photographs and plots far better than none, and zlib at ``level``.
    """
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] not in _PNG_COLOUR_TYPES or 0 in image.shape:
        raise InvalidArgumentError(f"encode_png needs a uint8 [H, W, C] image with 1 to 4 channels, "
                                   f"got {image.dtype} {image.shape}")
    height, width, channels = image.shape
    rows = image.reshape(height, width * channels)
    filtered = np.empty((height, 1 + width * channels), np.uint8)
    filtered[:, 0] = 2                                                   # filter type: Up
    filtered[:, 1:] = np.diff(rows, axis=0, prepend=np.zeros((1, rows.shape[1]), np.uint8))   # wraps mod 256
    header = struct.pack(">IIBBBBB", width, height, 8, _PNG_COLOUR_TYPES[channels], 0, 0, 0)
    return (_PNG_SIGNATURE + _png_chunk(b"IHDR", header)
            + _png_chunk(b"IDAT", zlib.compress(filtered.tobytes(), level)) + _png_chunk(b"IEND", b""))
