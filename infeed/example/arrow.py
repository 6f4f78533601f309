"""Arrow record batches to serialized ``tf.train.Example`` records, a column at a time.

Each column becomes one feature, chosen from its Arrow type once per table
(:func:`plan_columns`):

============================================  ==============================
Arrow type                                    feature
============================================  ==============================
bool, int8..int64, uint8..uint64              int64_list
float16, float32, float64                     float_list (as float32)
string, binary, their large/view/fixed forms  bytes_list (str as UTF-8)
list / large_list / fixed_size_list of those  the same kind, several values
dictionary of any of those                    as its value type
null (a value or a whole list)                feature omitted in that row
timestamp, date, time, duration               int64 in the type's unit, with
                                              ``temporal_as_int64=True``
decimal, struct, map, nested lists, ...       :class:`ColumnError`
============================================  ==============================

Records come out byte for byte as :func:`infeed.encode_example` (and
TensorFlow) writes them, with one difference: an empty list keeps its column's
kind (``encode_example`` writes every empty list as a float_list).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from infeed.errors import ColumnError
from infeed.example import _example
from infeed.example.codec import varint

__all__ = ["ColumnPlan", "plan_columns", "plan_column", "encode_batch"]

#: Field number (as a tag byte) of each kind in the ``Feature`` message.
_KIND_TAG = {"bytes": b"\x0a", "float": b"\x12", "int64": b"\x1a"}

_INT64_MAX = np.iinfo(np.int64).max


@dataclass(frozen=True)
class ColumnPlan:
    """How one column is written: its feature's kind, and whether a cell holds a list.

    name: the column's (and the feature's) name.
    arrow_type: the column's Arrow type.
    kind: ``"int64"``, ``"float"`` or ``"bytes"``; None for a column of Arrow
        type null, whose feature is never written.
    is_list: True for list columns (a cell may hold any number of values).
    """

    name: str
    arrow_type: pa.DataType
    kind: str | None
    is_list: bool


def plan_columns(schema: pa.Schema, temporal_as_int64: bool = False) -> list[ColumnPlan]:
    """A :class:`ColumnPlan` per field of ``schema``; raises :class:`ColumnError` for the first unsupported one.

    >>> [(p.name, p.kind, p.is_list) for p in plan_columns(pa.schema({"x": pa.list_(pa.int8())}))]
    [('x', 'int64', True)]
    """
    names = [field.name for field in schema]
    for name in names:
        if names.count(name) > 1:
            raise ColumnError(name, schema.field(names.index(name)).type,
                              "the name appears more than once; features need unique names")
    return [plan_column(field.name, field.type, temporal_as_int64) for field in schema]


def plan_column(name: str, arrow_type: pa.DataType, temporal_as_int64: bool = False) -> ColumnPlan:
    """The :class:`ColumnPlan` for one column, or a :class:`ColumnError` saying what to cast it to."""
    value_type, is_list = _undictionary(arrow_type), False
    if _is_list(value_type):
        value_type, is_list = _undictionary(value_type.value_type), True
        if _is_list(value_type):
            raise ColumnError(name, arrow_type, "a tf.train.Example cannot hold nested lists; "
                                                "flatten the column (pyarrow.compute.list_flatten) first")
    return ColumnPlan(name, arrow_type, _scalar_kind(name, arrow_type, value_type, temporal_as_int64), is_list)


def encode_batch(batch: pa.RecordBatch, plans: list[ColumnPlan], first_row: int = 0) -> list[bytes]:
    """One serialized Example per row of ``batch``, whose columns are those of ``plans``, in order.

    ``first_row`` is the index of the batch's first row in its input, for
    the row numbers in :class:`ColumnError` (a null inside a list, an unsigned
    integer above the int64 range).
    """
    if batch.num_columns != len(plans):
        raise ValueError(f"batch has {batch.num_columns} columns, plans {len(plans)}")
    if not plans:
        return [b""] * batch.num_rows
    columns = [_encode_column(plan, batch.column(i), first_row) for i, plan in enumerate(plans)]
    return [b"\x0a" + varint(len(body)) + body if body else b""
            for body in map(b"".join, zip(*columns))]


# ---------------------------------------------------------------------------
# Types


def _undictionary(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _is_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
            or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def _is_bytes(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t))


def _scalar_kind(name, arrow_type, t, temporal_as_int64):
    if pa.types.is_null(t):
        return None
    if pa.types.is_boolean(t) or pa.types.is_integer(t):
        return "int64"
    if pa.types.is_floating(t):
        return "float"
    if _is_bytes(t):
        return "bytes"
    if pa.types.is_temporal(t) and not pa.types.is_interval(t):
        if temporal_as_int64:
            return "int64"
        unit = "days" if pa.types.is_date32(t) else getattr(t, "unit", "ms")
        advice = (f"pass --temporal-as-int64 (temporal_as_int64=True) to write it as int64 {unit}"
                  f"{' since the epoch' if not (pa.types.is_time(t) or pa.types.is_duration(t)) else ''}, "
                  "or cast it to int64 or string before converting")
    elif pa.types.is_decimal(t):
        advice = "cast it to float64 (inexact) or to string before converting"
    elif pa.types.is_struct(t):
        advice = "flatten its fields into columns of their own (pyarrow.Table.flatten) before converting"
    elif pa.types.is_map(t):
        advice = "split it into a list column of keys and one of values before converting"
    else:
        advice = "cast it to a number, string or list type before converting"
    raise ColumnError(name, arrow_type, f"a tf.train.Example cannot hold this type; {advice}")


# ---------------------------------------------------------------------------
# Encoding

def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Bytes each int64 takes as a protobuf varint (negative values: 10)."""
    u = values.view(np.uint64)
    sizes = np.ones(len(u), np.int64)
    for k in range(1, 10):
        sizes += u >= np.uint64(1 << (7 * k))
    return sizes


def _encode_column(plan: ColumnPlan, column: pa.Array, first_row: int) -> list[bytes]:
    """The serialized ``features.feature`` map entry of each row (b"" where the value is null)."""
    if plan.kind is None:
        return [b""] * len(column)
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if plan.is_list:
        counts = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        values = pc.list_flatten(column)
        if values.null_count:
            at = int(np.searchsorted(np.cumsum(counts), pc.index(values.is_null(), True).as_py(), side="right"))
            raise ColumnError(plan.name, plan.arrow_type, "a list holds a null value, which a "
                              "tf.train.Example cannot hold; fill or drop nulls first", first_row + at)
    else:
        counts = valid.astype(np.int64)
        values = pc.drop_null(column)
    if pa.types.is_dictionary(values.type):
        values = values.dictionary_decode()
    payload, value_ends = _values_payload(plan, values, counts, first_row)
    row_ends = value_ends[np.cumsum(counts)]
    row_starts = np.concatenate(([0], row_ends[:-1])).tolist()
    tag = _KIND_TAG[plan.kind]
    key = b"\x0a" + varint(len(plan.name.encode())) + plan.name.encode() + b"\x12"
    packed = plan.kind != "bytes"
    out = []
    for ok, start, end in zip(valid.tolist(), row_starts, row_ends.tolist()):
        if not ok:
            out.append(b"")
            continue
        values_list = payload[start:end]
        if packed and values_list:
            values_list = b"\x0a" + varint(end - start) + values_list
        feature = tag + varint(len(values_list)) + values_list
        entry = key + varint(len(feature)) + feature
        out.append(b"\x0a" + varint(len(entry)) + entry)
    return out


def _values_payload(plan, values, counts, first_row):
    """All values of the column, encoded back to back, and where each value ends (a leading 0 first)."""
    t = values.type
    if plan.kind == "bytes":
        if not (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t)):
            values = values.cast(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())
        items = [b"\x0a" + varint(len(v)) + v for v in values.to_pylist()]
        ends = np.zeros(len(items) + 1, np.int64)
        np.cumsum([len(v) for v in items], out=ends[1:])
        return b"".join(items), ends
    if pa.types.is_temporal(t):                       # temporal_as_int64: the stored integers
        values = values.view(pa.int32() if t.bit_width == 32 else pa.int64())
    array = values.to_numpy(zero_copy_only=False)
    if plan.kind == "float":
        ends = np.arange(len(array) + 1, dtype=np.int64) * 4
        return array.astype("<f4", copy=False).tobytes(), ends
    if array.dtype == np.uint64 and len(array) and array.max() > _INT64_MAX:
        at = int(np.searchsorted(np.cumsum(counts), int(np.argmax(array > _INT64_MAX)), side="right"))
        raise ColumnError(plan.name, plan.arrow_type, f"value {array[array > _INT64_MAX][0]} is outside "
                          "the int64 range of a tf.train.Example int64_list", first_row + at)
    array = array.astype(np.int64)
    ends = np.zeros(len(array) + 1, np.int64)
    np.cumsum(_varint_sizes(array), out=ends[1:])
    return _example.encode_varints(array), ends
