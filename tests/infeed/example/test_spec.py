"""Feature specs validate once, at construction, with messages naming field and value."""

import numpy as np
import pytest

from infeed import Bytes, ExampleParser, FixedLen, VarLen


def test_fixedlen_normalises_shape_and_dtype():
    f = FixedLen(3, np.float32)
    assert f.shape == (3,) and f.dtype == "float32" and f.count == 3
    assert FixedLen((), "int64").count == 1
    assert FixedLen((2, 3), "int32").count == 6


@pytest.mark.parametrize("make, message", [
    (lambda: FixedLen((-1,), "float32"), "FixedLen.shape"),
    (lambda: FixedLen((2,), "float64"), "FixedLen.dtype"),
    (lambda: FixedLen((2,), "bytes"), "infeed.Bytes"),
    (lambda: FixedLen((2,), "float32", default=[1.0, 2.0, 3.0]), "FixedLen.default"),
    (lambda: VarLen("int64", max_len=-3), "VarLen.max_len"),
    (lambda: VarLen("int64", max_len=2.5), "VarLen.max_len"),
    (lambda: VarLen("int32", max_len=2, pad=2**40), "VarLen.pad"),
    (lambda: VarLen("int64", max_len=2, pad=0.5), "VarLen.pad"),
    (lambda: Bytes(max_bytes=-1), "Bytes.max_bytes"),
    (lambda: Bytes(max_bytes=2, default=b"abc"), "Bytes.default"),
    (lambda: FixedLen(None, "float32"), "FixedLen.shape"),
    (lambda: FixedLen(2.5, "float32"), "FixedLen.shape"),
    (lambda: FixedLen((2,), "nope"), "FixedLen.dtype"),
    (lambda: FixedLen((2,), 5), "FixedLen.dtype"),
    (lambda: FixedLen((2,), ["a"]), "FixedLen.dtype"),
    (lambda: VarLen("no such dtype", max_len=2), "VarLen.dtype"),
    (lambda: VarLen("int64", max_len=None), "VarLen.max_len"),
    (lambda: VarLen("int64", max_len=2, pad=None), "VarLen.pad"),
    (lambda: Bytes(max_bytes=None), "Bytes.max_bytes"),
    (lambda: Bytes(max_bytes=4, default=5), "Bytes.default"),
    (lambda: Bytes(max_bytes=4, default="\ud800"), "Bytes.default"),
])
def test_invalid_specs_are_refused_with_the_field_named(make, message):
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert type(info.value) is ValueError                 # not a numpy or codec error passing through


def test_defaults_are_broadcast_and_frozen():
    f = FixedLen((2, 2), "float32", default=1.5)
    assert f.default.tolist() == [[1.5, 1.5], [1.5, 1.5]]
    with pytest.raises(ValueError):
        f.default[0, 0] = 2
    assert FixedLen((2,), "int64", default=[1, 2]) == FixedLen((2,), "int64", default=[1, 2])
    assert FixedLen((2,), "int64", default=[1, 2]) != FixedLen((2,), "int64", default=[1, 3])


def test_parser_refuses_a_spec_that_is_not_one():
    with pytest.raises(ValueError, match="non-empty dict"):
        ExampleParser({})
    with pytest.raises(ValueError, match="spec\\['x'\\]"):
        ExampleParser({"x": "float32"})
    with pytest.raises(ValueError, match="names must be str"):
        ExampleParser({1: FixedLen((), "int64")})
