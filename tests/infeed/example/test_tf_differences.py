"""Where infeed and tf.io.parse_example differ: infeed follows the protobuf specification.

One test per row of the table in docs/porting.md ("Where infeed and tf.io.parse_example differ").
Records are built by hand with the canonical encoder of reference.py; where a TensorFlow-written
fixture holds the case, the test compares with the value TensorFlow recorded for it.
"""

import json
import struct

import pytest
import reference as ref

import infeed
from infeed import FixedLen, VarLen

ENC = ref.Encoder()                    # canonical: tags and lengths as TensorFlow writes them


def _float(v: float) -> bytes:
    return struct.pack("<f", v)


def _record(name: str, feature: bytes) -> bytes:
    """An Example whose only entry maps ``name`` to the Feature message ``feature`` (its bytes)."""
    return ENC.ld(1, ENC.ld(1, ENC.ld(1, name.encode()) + ENC.ld(2, feature)))


def _float_list(body: bytes) -> bytes:
    return ENC.ld(2, body)             # Feature.float_list [2]


def _int64_list(body: bytes) -> bytes:
    return ENC.ld(3, body)             # Feature.int64_list [3]


def test_an_empty_feature_is_present_with_no_values_so_a_fixedlen_default_does_not_apply():
    record = _record("x", b"")                                           # Feature{}: no kind set
    assert infeed.decode_example(record) == {"x": (None, [])}
    with pytest.raises(infeed.DecodeError, match="expected 1 float value") as info:
        infeed.parse_examples([record], {"x": FixedLen((), "float32", default=7.0)})
    assert info.value.feature == "x" and info.value.found == 0
    assert infeed.parse_examples([record], {"x": VarLen("float32", max_len=2)})["x"].lengths.tolist() == [0]
    absent = infeed.encode_example({"other": 1})
    assert infeed.parse_examples([absent], {"x": FixedLen((), "float32", default=7.0)})["x"].tolist() == [7.0]


def test_packed_and_unpacked_runs_of_one_list_concatenate(fixtures_dir):
    packed_then_unpacked = _record("x", _float_list(ENC.ld(1, _float(1.0)) + ENC.tag(1, 5) + _float(2.0)))
    expected = json.loads((fixtures_dir / "expected.json").read_text())["wire_variants"]
    fixture = list(infeed.read_records(fixtures_dir / expected["file"]))
    position = expected["order"].index("packed_then_unpacked_same_list")
    assert fixture[position] == packed_then_unpacked                     # the very record TensorFlow decoded
    assert expected["tf_parse_single_example"]["packed_then_unpacked_same_list"]["x"] == [1.0]
    assert infeed.decode_example(packed_then_unpacked)["x"][1].tolist() == [1.0, 2.0]
    unpacked_then_packed = _record("x", _float_list(ENC.tag(1, 5) + _float(1.0) + ENC.ld(1, _float(2.0))))
    assert infeed.decode_example(unpacked_then_packed)["x"][1].tolist() == [1.0, 2.0]
    ints = _record("n", _int64_list(ENC.ld(1, ref.varint(5)) + ENC.tag(1, 0) + ref.varint(6)))
    assert infeed.parse_examples([ints], {"n": VarLen("int64", max_len=3)})["n"].values.tolist() == [[5, 6, 0]]


@pytest.mark.parametrize("where, record", [
    ("first in the Feature", _record("x", ENC.tag(9, 0) + ref.varint(5) + _float_list(ENC.ld(1, _float(1.5))))),
    ("first in the list", _record("x", _float_list(ENC.tag(9, 0) + ref.varint(5) + ENC.ld(1, _float(1.5))))),
    ("among unpacked values", _record("x", _float_list(ENC.tag(1, 5) + _float(1.5) + ENC.ld(7, b"??")))),
    ("in the map entry, before the key", ENC.ld(1, ENC.ld(1, ENC.ld(5, b"?") + ENC.ld(1, b"x")
                                                     + ENC.ld(2, _float_list(ENC.ld(1, _float(1.5))))))),
])
def test_unknown_fields_are_skipped_wherever_they_are(where, record):
    assert infeed.decode_example(record)["x"][1].tolist() == [1.5], where
    assert infeed.parse_examples([record], {"x": FixedLen((), "float32")})["x"].tolist() == [1.5], where


def test_a_list_field_with_a_wrong_wire_type_is_an_unknown_field_and_skipped():
    wrong = ENC.tag(1, 5) + b"\0\0\0\0"                                   # Int64List.value as fixed32
    record = _record("n", _int64_list(wrong + ENC.ld(1, ref.varint(4))))
    assert infeed.decode_example(record)["n"][1].tolist() == [4]
    assert infeed.parse_examples([record], {"n": FixedLen((), "int64")})["n"].tolist() == [4]


def test_field_number_zero_is_malformed_even_after_the_values_a_parser_needs():
    record = _record("x", _float_list(ENC.ld(1, _float(1.5))) + b"\x00\x01")   # tag 0 after the list
    with pytest.raises(infeed.DecodeError, match="invalid field tag") as info:
        infeed.parse_examples([record], {"x": VarLen("float32", max_len=2)})
    assert info.value.feature == "x"
    with pytest.raises(infeed.DecodeError, match="invalid field tag"):
        infeed.decode_example(record)


def test_an_int64_feature_given_an_empty_float_list_has_no_values():
    record = _record("n", _float_list(b""))                              # float_list {}: kind float, no value
    assert record == infeed.encode_example({"n": []})                    # what encode_example writes for []
    assert infeed.parse_examples([record], {"n": VarLen("int64", max_len=2)})["n"].lengths.tolist() == [0]
    assert infeed.parse_examples([record], {"n": FixedLen((0,), "int64")})["n"].shape == (1, 0)
    with pytest.raises(infeed.DecodeError, match="expected 1 int64 value"):
        infeed.parse_examples([record], {"n": FixedLen((), "int64")})
    non_empty = _record("n", _float_list(ENC.ld(1, _float(1.0))))
    with pytest.raises(infeed.DecodeError, match="expected int64 values, found float values"):
        infeed.parse_examples([non_empty], {"n": VarLen("int64", max_len=2)})
