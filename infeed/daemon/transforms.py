"""User transforms in the workers: a dataset's ``outputs``, and the stage that runs its ``transform`` and
``batch_transform`` between the decoder and the ring slot.

::

    records --decode--> the worker's own arrays (the features' layout, [B, ...])
            --transform(example, rng), per record--> the slot's rows (the outputs' layout)
            --batch_transform(batch, rng), on the batch's real rows--> the slot

``outputs`` declares one example's arrays as the slot holds them: ``{name: (shape, dtype)}``, or
``infeed.Padded((shape, dtype), (shape, dtype))`` for a padded one. What a function returns is checked
against it for every record and batch: the same names, exactly the declared shapes, dtypes that numpy
casts to the declared ones with ``casting="same_kind"``; anything else is a
:class:`~infeed.errors.TransformError` naming the function, the output and the record.

>>> outputs_to_json(check_outputs({"x": ((2,), "float32"), "y": ((), int)}))
{'x': {'shape': [2], 'dtype': 'float32'}, 'y': {'shape': [], 'dtype': 'int64'}}
"""

from __future__ import annotations

import traceback
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from infeed.errors import TransformError
from infeed.example.randomness import STREAM_BATCH_TRANSFORM, STREAM_TRANSFORM, record_generator
from infeed.example.spec import Padded, numpy_dtype

__all__ = ["check_outputs", "outputs_to_json", "TransformStage"]


def _array_spec(name: str, value) -> tuple[tuple, np.dtype]:
    """``(shape, dtype)`` of ``value``: a ``(shape, dtype)`` pair or ``{"shape": ..., "dtype": ...}``."""
    try:
        shape, dtype = (value["shape"], value["dtype"]) if isinstance(value, Mapping) else value
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        dtype = numpy_dtype(dtype) if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype)
    except (TypeError, ValueError, KeyError):
        raise ValueError(f"outputs[{name!r}] must be a (shape, dtype) pair, got {value!r:.100}") from None
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ValueError(f"outputs[{name!r}]: the shape must be non-negative ints, got {shape!r:.100}")
    if dtype.kind not in "biuf" and dtype.name != "bfloat16":
        raise ValueError(f"outputs[{name!r}]: the dtype must be a bool, integer or float type, got {dtype}")
    return tuple(int(d) for d in shape), dtype


def check_outputs(outputs: Mapping) -> dict:
    """``outputs`` checked: ``{name: (shape, dtype)}`` or padded ones, as Python values or as
    :func:`outputs_to_json` writes them; shapes as tuples of ints, dtypes as numpy dtypes."""
    if not isinstance(outputs, Mapping) or not outputs:
        raise ValueError(f"outputs must be a non-empty dict of name -> (shape, dtype), got {outputs!r:.100}")
    out = {}
    for name, value in outputs.items():
        if not isinstance(name, str):
            raise ValueError(f"output names must be str, got {name!r}")
        if isinstance(value, Mapping) and "values" in value:
            value = Padded(value["values"], value.get("lengths"))
        if isinstance(value, Padded):
            out[name] = Padded(_array_spec(f"{name}.values", value.values),
                               _array_spec(f"{name}.lengths", value.lengths))
        else:
            out[name] = _array_spec(name, value)
    return out


def outputs_to_json(outputs: dict) -> dict:
    """Checked ``outputs`` as plain JSON data (:func:`check_outputs` reads it back)."""
    def part(spec):
        return {"shape": list(spec[0]), "dtype": spec[1].name}
    return {name: {"values": part(v.values), "lengths": part(v.lengths)} if isinstance(v, Padded) else part(v)
            for name, v in outputs.items()}


class _Leaf(NamedTuple):
    """One array of the outputs: ``name``'s own, or ``part`` (0: values, 1: lengths) of a padded one."""

    name: str
    part: int | None
    gathered: bool          # a scalar output: its values gathered for the batch, written in one copy

    @property
    def label(self) -> str:
        return repr(self.name) if self.part is None else f"{self.name!r}.{('values', 'lengths')[self.part]}"


def _leaves(outputs: dict) -> list[_Leaf]:
    out = []
    for name, spec in outputs.items():
        if isinstance(spec, Padded):
            out += [_Leaf(name, part, False) for part in (0, 1)]
        else:
            out.append(_Leaf(name, None, spec[0] == ()))
    return out


def _slot_array(leaf: _Leaf, views: dict) -> np.ndarray:
    arr = views[leaf.name]
    return arr if leaf.part is None else arr[leaf.part]


def _put(leaf: _Leaf, target: np.ndarray, value) -> str | None:
    """Copies ``value`` into ``target`` when it has its shape and a dtype that casts to its own; else says why not."""
    if type(value) is not np.ndarray:
        try:
            value = np.asarray(value)
        except ValueError as e:
            return f"output {leaf.label}: declared shape {target.shape}, found a ragged {type(value).__name__} ({e})"
    if value.shape != target.shape:
        return (f"output {leaf.label}: declared shape {target.shape} {target.dtype}, "
                f"found shape {value.shape} {value.dtype}")
    try:
        np.copyto(target, value, casting="same_kind")
    except TypeError:
        return (f"output {leaf.label}: declared dtype {target.dtype}, found {value.dtype}, "
                f"which does not cast to it (casting='same_kind')")
    return None


def _head(arr, n: int):
    """The first ``n`` rows of an array or a Padded pair of arrays."""
    return Padded(arr.values[:n], arr.lengths[:n]) if isinstance(arr, Padded) else arr[:n]


def _example_rows(decoded: dict, batch_size: int) -> list[dict]:
    """Per row, ``{name: view of that row}`` (0-d views for scalars: the same arrays for every batch)."""
    def row(arr, i):
        if isinstance(arr, Padded):
            return Padded(arr.values[i], arr.lengths[i, ...])
        return arr[i, ...]
    return [{name: row(arr, i) for name, arr in decoded.items()} for i in range(batch_size)]


def _raised(function, error: Exception, epoch: int, batch: int, place: tuple = (None, None)) -> TransformError:
    """The TransformError of ``error``, raised by the user's ``function``; its traceback from the user's frame on."""
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__.tb_next))
    return TransformError(function.name, f"{type(error).__name__}: {error}", *place, epoch, batch,
                          type(error).__name__, text)


class TransformStage:
    """A worker's transforms for ``ds``: :meth:`run` takes the batch decoded into :attr:`decoded` to the slot."""

    def __init__(self, ds):
        self.ds = ds
        #: Where the worker decodes a batch to: its own arrays, in the features' layout.
        self.decoded = ds.parser.allocate(ds.batch_size)
        self._examples = _example_rows(self.decoded, ds.batch_size) if ds.transform is not None else None
        self._names = set(ds.outputs)
        self._leaves = _leaves(ds.outputs)
        self._rows: dict = {}               # id(slot views) -> (the views, each array leaf's row views)

    def run(self, views: dict, n: int, epoch: int, batch: int, where) -> None:
        """Writes rows ``0..n`` of the slot's ``views`` from the first ``n`` rows of :attr:`decoded`: batch
        ``batch`` of ``epoch``, whose row ``i`` is record ``where(i)`` (path, index in its file, offset)."""
        if self.ds.transform is not None:
            self._per_record(views, n, epoch, batch, where)
        if self.ds.batch_transform is not None:
            source = self.decoded if self.ds.transform is None else {name: views[name] for name in self.ds.outputs}
            self._per_batch({name: _head(arr, n) for name, arr in source.items()}, views, n, epoch, batch)

    # --- per record -----------------------------------------------------------------------------------
    def _per_record(self, views: dict, n: int, epoch: int, batch: int, where) -> None:
        function, ds, count = self.ds.transform, self.ds, len(self._names)
        gathered = [(leaf.name, [], leaf) for leaf in self._leaves if leaf.gathered]
        copied = [(leaf, rows) for leaf, rows in zip(self._leaves, self._row_views(views)) if not leaf.gathered]
        for i in range(n):
            example = dict(self._examples[i])
            try:
                if function.takes_rng:
                    path, index, _ = where(i)
                    out = function.fn(example, record_generator(ds.seed, (epoch, ds.file_number(path), index),
                                                                STREAM_TRANSFORM))
                else:
                    out = function.fn(example)
            except Exception as e:
                raise _raised(function, e, epoch, batch, where(i)[:2]) from None
            if type(out) is not dict or len(out) != count:
                self._check_names(out, epoch, batch, where, i)
            try:
                for name, values, _ in gathered:
                    values.append(out[name])
                for leaf, rows in copied:
                    value = out[leaf.name]
                    if leaf.part is not None:
                        value = self._part(leaf, value, epoch, batch, where, i)
                    self._write(leaf, rows[i], value, epoch, batch, where, i)
            except KeyError:                # as many outputs as declared, not the same ones
                self._check_names(out, epoch, batch, where, i)
                raise
        for name, values, leaf in gathered:
            self._write_gathered(leaf, views[name][:n], values, epoch, batch, where)

    def _row_views(self, views: dict) -> list:
        """Each leaf's row views of ``views`` (made once per slot; None for the gathered ones)."""
        found = self._rows.get(id(views))
        if found is None or found[0] is not views:
            arrays = [None if leaf.gathered else _slot_array(leaf, views) for leaf in self._leaves]
            rows = [None if arr is None else [arr[i, ...] for i in range(len(arr))] for arr in arrays]
            found = self._rows[id(views)] = (views, rows)
        return found[1]

    def _write_gathered(self, leaf: _Leaf, column: np.ndarray, values: list, epoch, batch, where) -> None:
        """One copy for the batch; value by value (naming the first that does not fit) if it does not go."""
        try:
            gathered = np.asarray(values)
            if gathered.shape == column.shape:
                np.copyto(column, gathered, casting="same_kind")
                return
        except (ValueError, TypeError):
            pass
        for i, value in enumerate(values):
            self._write(leaf, column[i, ...], value, epoch, batch, where, i)

    # --- per batch ------------------------------------------------------------------------------------
    def _per_batch(self, arrays: dict, views: dict, n: int, epoch: int, batch: int) -> None:
        function, ds = self.ds.batch_transform, self.ds
        try:
            if function.takes_rng:
                out = function.fn(arrays, record_generator(ds.seed, (epoch, ds.shard_index, batch),
                                                           STREAM_BATCH_TRANSFORM))
            else:
                out = function.fn(arrays)
        except Exception as e:
            raise _raised(function, e, epoch, batch) from None
        self._check_names(out, epoch, batch)
        for leaf in self._leaves:
            value = out[leaf.name]
            if leaf.part is not None:
                value = self._part(leaf, value, epoch, batch)
            self._write(leaf, _slot_array(leaf, views)[:n], value, epoch, batch)

    # --- checks ---------------------------------------------------------------------------------------
    def _mismatch(self, problem: str, epoch: int, batch: int, where=None, i: int | None = None) -> TransformError:
        function = self.ds.transform if where is not None else self.ds.batch_transform
        place = where(i)[:2] if where is not None else (None, None)
        return TransformError(function.name, problem, *place, epoch, batch)

    def _check_names(self, out, epoch: int, batch: int, where=None, i: int | None = None) -> None:
        if not isinstance(out, Mapping):
            raise self._mismatch(f"returned a {type(out).__name__}, not a dict of its outputs", epoch, batch, where, i)
        if out.keys() != self._names:
            missing, extra = sorted(self._names - out.keys()), sorted(map(repr, out.keys() - self._names))
            problem = "; ".join(([f"no {', '.join(map(repr, missing))} (declared in outputs)"] if missing else [])
                                + ([f"{', '.join(extra)}, which outputs does not declare"] if extra else []))
            raise self._mismatch(f"returned {problem}", epoch, batch, where, i)

    def _part(self, leaf: _Leaf, value, epoch: int, batch: int, where=None, i: int | None = None):
        """``leaf``'s part of a padded output's ``value``."""
        if isinstance(value, tuple) and len(value) == 2:
            return value[leaf.part]
        raise self._mismatch(f"output {leaf.name!r} must be an infeed.Padded (values, lengths) as declared, "
                             f"found a {type(value).__name__}", epoch, batch, where, i)

    def _write(self, leaf: _Leaf, target: np.ndarray, value, epoch: int, batch: int, where=None, i=None) -> None:
        problem = _put(leaf, target, value)
        if problem is not None:
            raise self._mismatch(problem, epoch, batch, where, i)
