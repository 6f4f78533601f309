"""What a ``host_call`` function's returned values are: scalars, histograms, images or texts.

A ``host_call`` function may return a mapping ``{tag: value}``; each value goes to every writer
as the kind :func:`sort_values` finds:

* a ``str``: text;
* a number, or an array holding one element (``[]``, ``[1]``, ``[1, 1]``...): a scalar;
* a uint8 array [H, W, C] or [N, H, W, C] with C from 1 to 4: an image (or N of them);
* any other array of real numbers (bool, int, float): a histogram of its values;
* :class:`Image` (``Image(x)``, for float images in [0, 1]) or :class:`Histogram` (``Histogram(x,
  num_buckets=50)``, for uint8 data shaped like an image, or other buckets): that kind, whatever
  the array.

>>> import numpy as np
>>> v = sort_values({"loss": np.float32(0.5), "w": np.zeros(10), "x": np.zeros((8, 8, 3), np.uint8),
...                  "y": Image(np.ones((8, 8, 1))), "note": "ok"})
>>> sorted(v.scalars), sorted(v.histograms), sorted(v.images), sorted(v.texts)
(['loss'], ['w'], ['x', 'y'], ['note'])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from estimator.errors import InvalidArgumentError

__all__ = ["Histogram", "Image", "SortedValues", "sort_values"]


@dataclass(frozen=True)
class Image:
    """Marks ``array`` ([H, W, C] or [N, H, W, C]; uint8, or floats in [0, 1]) as an image to write."""

    array: Any


@dataclass(frozen=True)
class Histogram:
    """Marks ``array`` as values to write as a histogram, in ``num_buckets`` buckets (None: the writer's default)."""

    array: Any
    num_buckets: int | None = None


@dataclass
class SortedValues:
    """A mapping of values sorted by kind, each kind a mapping by tag, ready for the writers' methods."""

    scalars: dict = field(default_factory=dict)
    histograms: dict = field(default_factory=dict)
    num_buckets: dict = field(default_factory=dict)
    images: dict = field(default_factory=dict)
    texts: dict = field(default_factory=dict)


def _looks_like_image(array: np.ndarray) -> bool:
    return array.dtype == np.uint8 and array.ndim in (3, 4) and 1 <= array.shape[-1] <= 4


def sort_values(values: Mapping[str, Any], where: str = "host_call") -> SortedValues:
    """``values`` sorted by kind (see the module's docstring); a value of no kind, or a tag that is not
    a non-empty str, is an ``InvalidArgumentError`` naming ``where`` and the tag."""
    if not isinstance(values, Mapping):
        raise InvalidArgumentError(f"{where} returned {type(values).__name__}: return None, or a mapping of "
                                   f"tag -> number, array, image or str to write")
    out = SortedValues()
    for tag, value in values.items():
        if not isinstance(tag, str) or not tag:
            raise InvalidArgumentError(f"{where} returned a value under {tag!r}: tags are non-empty strings")
        if isinstance(value, Image):
            out.images[tag] = value.array
            continue
        if isinstance(value, Histogram):
            out.histograms[tag] = value.array
            if value.num_buckets is not None:
                out.num_buckets[tag] = value.num_buckets
            continue
        if isinstance(value, str):
            out.texts[tag] = value
            continue
        try:
            array = np.asarray(value)
        except Exception as e:                      # noqa: BLE001 - anything numpy cannot read is no value
            raise InvalidArgumentError(f"{where} returned {type(value).__name__} under {tag!r}: {e}") from e
        if array.dtype.kind not in "biuf":
            raise InvalidArgumentError(f"{where} returned {type(value).__name__} ({array.dtype}) under {tag!r}: "
                                       f"write numbers, arrays of real numbers, images or strings")
        if array.size == 1:
            out.scalars[tag] = array.reshape(()).item()
        elif _looks_like_image(array):
            out.images[tag] = array
        else:
            out.histograms[tag] = array
    return out
