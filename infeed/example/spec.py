"""Feature specs: what each feature of a tf.train.Example decodes to, with static shapes.

>>> spec = {"pixels": FixedLen((784,), "float32"), "label": FixedLen((), "int64"),
...         "tokens": VarLen("int32", max_len=16), "id": Bytes(max_bytes=32),
...         "image": Image(size=(224, 224), resize="random_resized_crop", flip=True)}
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import ml_dtypes  # noqa: F401  (registers "bfloat16" with numpy: np.dtype("bfloat16") works once imported)
import numpy as np

__all__ = ["FixedLen", "VarLen", "Bytes", "Image", "Padded", "Feature", "RESIZE_MODES", "IMAGE_DTYPES",
           "NUMERIC_DTYPES", "numpy_dtype", "spec_to_json", "spec_from_json"]

#: How an Image may be resized, and the dtypes it may be decoded to.
RESIZE_MODES = ("center_crop", "random_resized_crop", "pad", None)
IMAGE_DTYPES = ("uint8", "uint16", "int8", "int16", "float32", "float16", "bfloat16")
#: The Image dtypes that hold normalised values, ``(level - mean) / std``: floats and signed integers.
_NORMALISED_DTYPES = ("float32", "float16", "bfloat16", "int8", "int16")

#: Numeric dtypes a spec may ask for, and the Example kind each is read from. The decoder converts the
#: float32 values to bfloat16 and float16 (to nearest, ties to even, as numpy's ``astype``) and checks that
#: each int64 value fits the integer types narrower than int64.
NUMERIC_DTYPES = {"float32": "float", "bfloat16": "float", "float16": "float",
                  "int64": "int64", "int32": "int64", "int16": "int64", "uint16": "int64", "int8": "int64",
                  "uint8": "int64", "bool": "int64"}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a spec's dtype name (``bfloat16``: ml_dtypes', known by name since this module imports it)."""
    return np.dtype(name)


def _check_dtype(owner: str, dtype) -> str:
    try:
        name = np.dtype(dtype).name if dtype not in ("bytes", "string", object) else "bytes"
    except TypeError:
        name = None
    if name not in NUMERIC_DTYPES:
        raise ValueError(f"{owner}.dtype must be one of {sorted(NUMERIC_DTYPES)}, got {dtype!r}"
                         + ("; use infeed.Bytes(max_bytes) for bytes features" if name == "bytes" else ""))
    return name


def _in_dtype(value, dtype: str) -> np.ndarray:
    """``value`` as an array of ``dtype``; a ValueError unless it is representable there: integers
    exactly, floats without overflowing to inf (rounded to the nearest otherwise, as the decoder does)."""
    with np.errstate(all="ignore"):
        converted = np.asarray(value, dtype=dtype)
        if NUMERIC_DTYPES[dtype] == "int64":
            lost = not np.array_equal(converted, np.asarray(value))
        else:
            lost = bool(np.any(np.isinf(converted) & np.isfinite(np.asarray(value, dtype=np.float64))))
    if lost:
        raise ValueError(f"not representable in {dtype}")
    return converted


def _check_count(owner: str, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{owner}.{field} must be a non-negative int, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class FixedLen:
    """A feature with exactly ``prod(shape)`` values in every record.

    shape: the per-record shape, ``()`` for a scalar.
    dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"`` (float_list; the
        last two rounded to nearest even from float32, too large -> inf) or
        ``"int64"``, ``"int32"``, ``"int16"``, ``"uint16"``, ``"int8"``,
        ``"uint8"`` (int64_list; a value outside the type's range is a
        DecodeError), or ``"bool"`` (int64_list values 0 and 1, as TFDS stores
        bools; any other value is a DecodeError).  The narrow types halve or quarter what the ring holds and
        the device receives.
    default: used when a record lacks the feature; a scalar (broadcast) or an
        array of ``shape``, representable in ``dtype`` (integers exactly, floats
        without overflow).  Without one, a missing feature is a DecodeError.
    """

    shape: tuple = ()
    dtype: str = "float32"
    default: Any = None

    def __post_init__(self):
        if isinstance(self.shape, (int, np.integer)):
            shape = (self.shape,)
        elif isinstance(self.shape, Iterable) and not isinstance(self.shape, (str, bytes)):
            shape = tuple(self.shape)
        else:
            raise ValueError(f"FixedLen.shape must be an int or a tuple of non-negative ints, got {self.shape!r:.80}")
        object.__setattr__(self, "shape", tuple(_check_count("FixedLen", "shape", d) for d in shape))
        object.__setattr__(self, "dtype", _check_dtype("FixedLen", self.dtype))
        if self.default is not None:
            try:
                row = np.broadcast_to(_in_dtype(self.default, self.dtype), self.shape)
            except (ValueError, TypeError, OverflowError) as e:
                raise ValueError(f"FixedLen.default {self.default!r} does not fit shape {self.shape} "
                                 f"and dtype {self.dtype}: {e}") from None
            object.__setattr__(self, "default", np.array(row))
            self.default.setflags(write=False)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    def __eq__(self, other):
        return (isinstance(other, FixedLen) and (self.shape, self.dtype) == (other.shape, other.dtype)
                and _same_default(self.default, other.default))

    def __hash__(self):
        return hash((FixedLen, self.shape, self.dtype))


@dataclass(frozen=True)
class VarLen:
    """A feature with 0 to ``max_len`` values, padded to ``[max_len]`` plus a length.

    dtype: as FixedLen's.
    max_len: the static width; more values are a DecodeError unless ``truncate``.
    pad: the value of the padding positions, representable in ``dtype``.
    truncate: keep the first ``max_len`` values instead of failing.
    """

    dtype: str = "int64"
    max_len: int = 0
    pad: Any = 0
    truncate: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", _check_dtype("VarLen", self.dtype))
        object.__setattr__(self, "max_len", _check_count("VarLen", "max_len", self.max_len))
        try:
            if _in_dtype(self.pad, self.dtype).shape != ():
                raise ValueError("not a scalar")
        except (ValueError, TypeError, OverflowError) as e:
            raise ValueError(f"VarLen.pad {self.pad!r} is not a {self.dtype} scalar: {e}") from None
        object.__setattr__(self, "truncate", bool(self.truncate))


@dataclass(frozen=True)
class Bytes:
    """A feature holding one bytes value of at most ``max_bytes``, as ``[max_bytes]`` uint8 plus a length.

    default: bytes used when a record lacks the feature; without one a missing
        feature is a DecodeError.
    truncate: keep the first ``max_bytes`` bytes instead of failing.
    """

    max_bytes: int = 0
    default: bytes | None = None
    truncate: bool = False

    def __post_init__(self):
        object.__setattr__(self, "max_bytes", _check_count("Bytes", "max_bytes", self.max_bytes))
        if self.default is not None:
            if isinstance(self.default, str):
                try:
                    object.__setattr__(self, "default", self.default.encode())
                except UnicodeEncodeError as e:
                    raise ValueError(f"Bytes.default {self.default!r:.80} is not encodable as UTF-8: {e}") from None
            if not isinstance(self.default, bytes) or len(self.default) > self.max_bytes:
                raise ValueError(f"Bytes.default must be bytes of at most max_bytes={self.max_bytes}, "
                                 f"got {self.default!r:.80}")
        object.__setattr__(self, "truncate", bool(self.truncate))


def _pair(owner: str, field: str, value, *, positive: bool) -> tuple:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{owner}.{field} must be a (low, high) pair of numbers, got {value!r:.80}") from None
    if not (math.isfinite(low) and math.isfinite(high) and (low > 0 if positive else low >= 0) and low <= high):
        raise ValueError(f"{owner}.{field} must be a finite (low, high) pair with 0 < low <= high, got {value!r}")
    return low, high


def _per_channel(field: str, value, channels: int) -> tuple | None:
    if value is None:
        return None
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim > 1 or (arr.ndim == 1 and arr.size not in (1, channels)) or not np.all(np.isfinite(arr)):
        raise ValueError(f"Image.{field} must be a finite number or one per channel ({channels}), got {value!r:.80}")
    return tuple(np.broadcast_to(arr, (channels,)).tolist())


@dataclass(frozen=True)
class Image:
    """An encoded image (JPEG or PNG bytes) decoded to ``[H, W, channels]`` of ``dtype``.

    size: the output ``(height, width)``.
    channels: 1 (grayscale), 3 (RGB; a PNG's alpha is dropped) or 4 (RGBA; opaque where the image has no alpha).
    dtype: ``uint8``, ``uint16``, ``int8``, ``int16``, ``float32``, ``float16`` or ``bfloat16``. ``uint16`` holds
        levels 0-65535 (an 8-bit image's times 257), every other dtype levels on the 0-255 scale (a 16-bit PNG's
        divided by 257), then ``(level - mean) / std`` when those are given (floats and signed integers only);
        integers are rounded to nearest (halves up) and clamped. ``int8`` needs ``mean``: ``mean=128`` stores
        ``level - 128``, the input of int8-quantised models.
    resize: ``"center_crop"``: the central ``central_fraction`` of the largest window of the output's aspect
        ratio, resized (ResNet's evaluation crop); ``"random_resized_crop"``: a window of ``area`` of the image's
        area and ``aspect`` (width / height) drawn per record (10 attempts, then the central window of the
        closest aspect), resized; ``"pad"``: the whole image resized to fit, centred, zeros around it;
        ``None``: no resize, an image of another size is a DecodeError.
    flip: mirror left to right with probability 1/2, drawn per record.
    antialias: resample with a filter as wide as the shrink factor (as ``tf.image.resize(antialias=True)``);
        the default is bilinear (2 taps per axis, as ``tf.image.resize``'s default).
    fast_dct: libjpeg-turbo's fast integer IDCT (TensorFlow's default ``INTEGER_FAST``), else the accurate one.
    dct_scaling: decode a JPEG at the smallest DCT scale (1/2, 1/4, 1/8) that keeps the crop at least the
        output's size, a low-pass filter that is faster than decoding it whole; False: always at full size, as
        ``tf.io.decode_jpeg`` does, so that with ``fast_dct`` the pixels resized are TensorFlow's (where
        a scale applies, the default's differ from TensorFlow's resize of the full image by some levels).
    max_pixels: an image declaring more pixels is refused before anything is allocated for it.
    key: the Example's feature holding the encoded bytes (one value per record).
    """

    size: tuple = (224, 224)
    channels: int = 3
    dtype: str = "uint8"
    resize: str | None = "center_crop"
    flip: bool = False
    area: tuple = (0.08, 1.0)
    aspect: tuple = (3 / 4, 4 / 3)
    central_fraction: float = 0.875
    mean: Any = None
    std: Any = None
    antialias: bool = False
    fast_dct: bool = True
    dct_scaling: bool = True
    max_pixels: int = 1 << 26
    key: str = "image/encoded"

    def __post_init__(self):
        try:
            height, width = self.size
        except (TypeError, ValueError):
            height = width = None
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0 for v in (height, width)):
            raise ValueError(f"Image.size must be a (height, width) pair of positive ints, got {self.size!r:.80}")
        object.__setattr__(self, "size", (int(height), int(width)))
        if self.channels not in (1, 3, 4) or isinstance(self.channels, bool):
            raise ValueError(f"Image.channels must be 1, 3 or 4, got {self.channels!r}")
        try:
            dtype = np.dtype(self.dtype).name
        except TypeError:
            dtype = str(self.dtype)
        if dtype not in IMAGE_DTYPES:
            raise ValueError(f"Image.dtype must be one of {list(IMAGE_DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", dtype)
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"Image.resize must be one of {list(RESIZE_MODES)}, got {self.resize!r}")
        object.__setattr__(self, "area", _pair("Image", "area", self.area, positive=True))
        if self.area[1] > 1:
            raise ValueError(f"Image.area must lie within (0, 1], got {self.area}")
        object.__setattr__(self, "aspect", _pair("Image", "aspect", self.aspect, positive=True))
        fraction = self.central_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
            raise ValueError(f"Image.central_fraction must be a number in (0, 1], got {fraction!r}")
        object.__setattr__(self, "central_fraction", float(fraction))
        mean = _per_channel("mean", self.mean, self.channels)
        std = _per_channel("std", self.std, self.channels)
        if (mean is not None or std is not None) and dtype not in _NORMALISED_DTYPES:
            raise ValueError(f"Image.mean and std need a dtype that holds normalised values "
                             f"({', '.join(_NORMALISED_DTYPES)}), not {dtype}")
        if dtype == "int8" and mean is None:
            raise ValueError("Image.dtype int8 holds -128..127, where levels 0-255 do not fit: give mean "
                             "(mean=128 stores level - 128)")
        if std is not None and 0.0 in std:
            raise ValueError(f"Image.std must not be 0, got {self.std!r}")
        with np.errstate(over="ignore", divide="ignore"):
            affine = np.float32([1.0 / s for s in std or (1.0,)] + [m / s for m, s in zip(mean or (), std or ())])
        if not np.all(np.isfinite(affine)):
            raise ValueError(f"Image.mean / std and 1 / std must fit float32, got mean={self.mean!r}, "
                             f"std={self.std!r}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "std", std)
        object.__setattr__(self, "flip", bool(self.flip))
        object.__setattr__(self, "antialias", bool(self.antialias))
        object.__setattr__(self, "fast_dct", bool(self.fast_dct))
        object.__setattr__(self, "dct_scaling", bool(self.dct_scaling))
        if isinstance(self.max_pixels, bool) or not isinstance(self.max_pixels, (int, np.integer)) \
                or self.max_pixels < 1:
            raise ValueError(f"Image.max_pixels must be a positive int, got {self.max_pixels!r}")
        object.__setattr__(self, "max_pixels", int(self.max_pixels))
        if not isinstance(self.key, str) or not self.key:
            raise ValueError(f"Image.key must be the name of the Example's feature, got {self.key!r}")

    @property
    def shape(self) -> tuple:
        """One record's output shape, ``(height, width, channels)``."""
        return (*self.size, self.channels)

    @property
    def random(self) -> bool:
        """Whether decoding draws from the record's generator."""
        return self.flip or self.resize == "random_resized_crop"


Feature = FixedLen | VarLen | Bytes | Image


class Padded(NamedTuple):
    """Values padded to a static width, and how many of each row are real (a JAX pytree)."""

    values: Any
    lengths: Any


def _same_default(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


#: Image fields added after specs were first written (to states and configs), and their defaults: one at its
#: default is left out of the JSON, so that a spec's digest, and a resume from an older state, stay the same.
_LATER_IMAGE_FIELDS = {"dct_scaling": True}


def spec_to_json(spec) -> dict:
    """A spec as plain JSON data (for ``infeed serve --config`` and the worker processes).

    >>> spec_from_json(spec_to_json({"x": FixedLen((2,), "int64", default=7)}))["x"]
    FixedLen(shape=(2,), dtype='int64', default=array([7, 7]))
    """
    out = {}
    for name, f in spec.items():
        if isinstance(f, FixedLen):
            out[name] = {"kind": "FixedLen", "shape": list(f.shape), "dtype": f.dtype,
                         "default": None if f.default is None else f.default.tolist()}
        elif isinstance(f, VarLen):
            out[name] = {"kind": "VarLen", "dtype": f.dtype, "max_len": f.max_len,
                         "pad": np.asarray(f.pad).item(), "truncate": f.truncate}
        elif isinstance(f, Bytes):
            out[name] = {"kind": "Bytes", "max_bytes": f.max_bytes, "truncate": f.truncate,
                         "default": None if f.default is None else f.default.hex()}
        elif isinstance(f, Image):
            fields = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(f).items()}
            for later, default in _LATER_IMAGE_FIELDS.items():   # at its default: as written before it existed
                if fields[later] == default:
                    del fields[later]
            out[name] = {"kind": "Image", **fields}
        else:
            raise ValueError(f"spec[{name!r}] must be FixedLen, VarLen, Bytes or Image, got {f!r}")
    return out


def spec_from_json(doc) -> dict:
    """The spec :func:`spec_to_json` wrote; a clear ValueError for anything else."""
    if not isinstance(doc, dict) or not doc:
        raise ValueError(f"a feature spec is a non-empty JSON object, found {doc!r:.200}")
    out = {}
    for name, f in doc.items():
        fields = dict(f) if isinstance(f, dict) else {}
        kind = fields.pop("kind", None)
        try:
            if kind == "FixedLen":
                out[name] = FixedLen(tuple(fields.pop("shape", ())), **fields)
            elif kind == "VarLen":
                out[name] = VarLen(**fields)
            elif kind == "Bytes":
                default = fields.pop("default", None)
                out[name] = Bytes(default=None if default is None else bytes.fromhex(default), **fields)
            elif kind == "Image":
                out[name] = Image(**fields)
            else:
                raise ValueError("kind must be FixedLen, VarLen, Bytes or Image")
        except (TypeError, ValueError) as e:
            raise ValueError(f"feature {name!r}: {e} (found {f!r:.200})") from None
    return out
