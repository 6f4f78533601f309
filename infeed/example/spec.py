"""Feature specs: what each feature of a tf.train.Example decodes to, with static shapes.

>>> spec = {"image": FixedLen((784,), "float32"), "label": FixedLen((), "int64"),
...         "tokens": VarLen("int32", max_len=16), "id": Bytes(max_bytes=32)}
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = ["FixedLen", "VarLen", "Bytes", "Padded", "Feature", "NUMERIC_DTYPES", "spec_to_json", "spec_from_json"]

#: Numeric dtypes a spec may ask for, and the Example kind each is read from.
NUMERIC_DTYPES = {"float32": "float", "int64": "int64", "int32": "int64"}


def _check_dtype(owner: str, dtype) -> str:
    try:
        name = np.dtype(dtype).name if dtype not in ("bytes", "string", object) else "bytes"
    except TypeError:
        name = None
    if name not in NUMERIC_DTYPES:
        raise ValueError(f"{owner}.dtype must be one of {sorted(NUMERIC_DTYPES)}, got {dtype!r}"
                         + ("; use infeed.Bytes(max_bytes) for bytes features" if name == "bytes" else ""))
    return name


def _check_count(owner: str, field: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{owner}.{field} must be a non-negative int, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class FixedLen:
    """A feature with exactly ``prod(shape)`` values in every record.

    shape: the per-record shape, ``()`` for a scalar.
    dtype: ``"float32"`` (float_list), ``"int64"`` or ``"int32"`` (int64_list;
        int32 checks each value's range).
    default: used when a record lacks the feature; a scalar (broadcast) or an
        array of ``shape``.  Without one, a missing feature is a DecodeError.
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
                row = np.broadcast_to(np.asarray(self.default, dtype=self.dtype), self.shape)
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
    pad: the value of the padding positions.
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
            pad = np.asarray(self.pad, dtype=self.dtype)
            if pad.shape != () or (np.issubdtype(pad.dtype, np.integer) and pad != self.pad):
                raise ValueError("not a representable scalar")
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


Feature = FixedLen | VarLen | Bytes


class Padded(NamedTuple):
    """Values padded to a static width, and how many of each row are real (a JAX pytree)."""

    values: Any
    lengths: Any


def _same_default(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=True))


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
        else:
            raise ValueError(f"spec[{name!r}] must be FixedLen, VarLen or Bytes, got {f!r}")
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
            else:
                raise ValueError("kind must be FixedLen, VarLen or Bytes")
        except (TypeError, ValueError) as e:
            raise ValueError(f"feature {name!r}: {e} (found {f!r:.200})") from None
    return out
