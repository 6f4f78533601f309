"""encode_example, decode_example and spec-driven parsing: behaviour and errors."""

import numpy as np
import pytest

import infeed
from infeed import Bytes, FixedLen, Padded, VarLen


def ex(**features):
    return infeed.encode_example(features)


def test_decode_example_gives_kind_and_values():
    got = infeed.decode_example(ex(b=[b"x", b"\0y"], f=[1.5, -0.0], i=[-1, 2**63 - 1], s="text"))
    assert got["b"] == ("bytes", [b"x", b"\0y"])
    assert got["f"][0] == "float" and got["f"][1].dtype == np.float32 and got["f"][1].tolist() == [1.5, -0.0]
    assert np.signbit(got["f"][1][1])
    assert got["i"][0] == "int64" and got["i"][1].tolist() == [-1, 2**63 - 1]
    assert got["s"] == ("bytes", [b"text"])


def test_encode_example_picks_kinds_from_types():
    got = infeed.decode_example(ex(a=np.arange(3, dtype=np.uint8), b=True, c=np.float64(2.5), d=[]))
    assert got["a"][0] == "int64" and got["b"][1].tolist() == [1]
    assert got["c"] == ("float", got["c"][1]) and got["c"][1].tolist() == [2.5]
    assert got["d"][0] == "float" and len(got["d"][1]) == 0
    empty = infeed.decode_example(ex(b=np.array([], dtype=object), s=np.array([], dtype="S1"),
                                     i=np.array([], dtype=np.int64)))
    assert empty == {"b": ("bytes", []), "s": ("bytes", []), "i": ("int64", empty["i"][1])}
    assert empty["i"][1].dtype == np.int64 and len(empty["i"][1]) == 0


def test_python_scalars_encode_as_their_numpy_equivalents():
    for value in (0, 1, -1, 127, 128, 2**63 - 1, -(2**63)):
        assert ex(x=value) == ex(x=np.array([value], np.int64))
    for value in (0.0, -0.0, 1.5, float("inf"), 3.4e38, float("nan")):
        assert ex(x=value) == ex(x=np.array([value], np.float32))
    with np.errstate(over="ignore"):
        assert ex(x=1e39) == ex(x=np.array([1e39], np.float32))     # rounds to inf, as numpy does


def test_encode_example_refuses_what_it_cannot_represent():
    with pytest.raises(TypeError, match="mixes"):
        ex(x=[b"a", 1])
    with pytest.raises(ValueError, match="int64"):
        ex(x=[2**64])
    with pytest.raises(ValueError, match="int64"):
        ex(x=2**63)


@pytest.mark.parametrize("features, error, message", [
    ({"f": None}, TypeError, "feature 'f': cannot encode None"),
    ({"f": object()}, TypeError, "feature 'f': cannot encode <object"),
    ({"f": 1j}, TypeError, "feature 'f': cannot encode 1j"),
    ({"f": [None]}, TypeError, "feature 'f': cannot encode \\[None\\]"),
    ({"f": [[1], [2, 3]]}, ValueError, "feature 'f': cannot encode"),
    ({"f": np.array([None], dtype=object)}, TypeError, "feature 'f': cannot encode"),
    ({"f": "\ud800"}, ValueError, "feature 'f': .* UTF-8"),
    ({"\ud800": [1]}, ValueError, "feature '\\\\ud800': .* UTF-8"),
    ({None: [1]}, TypeError, "feature names must be str or bytes, got None"),
    ({5: [1]}, TypeError, "feature names must be str or bytes, got 5"),
    ([("f", 1)], TypeError, "features must be a mapping"),
    (None, TypeError, "features must be a mapping"),
])
def test_encode_example_names_the_feature_it_cannot_encode(features, error, message):
    with pytest.raises(error, match=message):
        infeed.encode_example(features)


def _parser_x():
    return infeed.ExampleParser({"x": FixedLen()})


@pytest.mark.parametrize("call, error, message", [
    (lambda: infeed.decode_example(None), TypeError, "record must be a bytes-like serialized Example, got NoneType"),
    (lambda: infeed.decode_example("text"), TypeError, "record must be a bytes-like .* got str"),
    (lambda: infeed.parse_examples([ex(x=1.0), None], {"x": FixedLen()}), TypeError,
     "records\\[1\\] must be a bytes-like serialized Example, got NoneType"),
    (lambda: infeed.parse_examples(None, {"x": FixedLen()}), TypeError, "records must be a sequence"),
    (lambda: infeed.parse_examples(ex(x=1.0), {"x": FixedLen()}), TypeError, "records must be a sequence"),
    (lambda: infeed.parse_examples([ex(x=1.0)], {"x": FixedLen()}, out=5), TypeError, "out must be a dict"),
    (lambda: infeed.ExampleParser({"x": FixedLen()}).allocate(-1), ValueError, "batch_size"),
    (lambda: infeed.ExampleParser({"x": FixedLen()}).allocate(None), ValueError, "batch_size"),
    (lambda: _parser_x().read_into(None, 1, _parser_x().allocate(1)), TypeError, "'reader'"),   # crashed before
])
def test_bad_arguments_to_the_decoder_name_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_empty_example_decodes_to_nothing():
    assert infeed.decode_example(b"") == {}
    assert infeed.decode_example(infeed.encode_example({})) == {}


def test_feature_without_a_kind_decodes_as_none():
    entry = b"\x0a\x01k" + b"\x12\x00"                          # key "k", empty Feature
    record = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    assert infeed.decode_example(record) == {"k": (None, [])}
    out = infeed.parse_examples([record], {"k": VarLen("int64", max_len=2)})
    assert out["k"].lengths.tolist() == [0]


def test_invalid_utf8_key_is_a_decode_error_for_inspection_only():
    entry = b"\x0a\x01\xff" + b"\x12\x04\x1a\x02\x0a\x00"
    record = b"\x0a" + bytes([len(entry) + 2]) + b"\x0a" + bytes([len(entry)]) + entry
    with pytest.raises(infeed.DecodeError, match="UTF-8"):
        infeed.decode_example(record)


# --- FixedLen ----------------------------------------------------------------------------------

def test_fixedlen_shapes_and_dtypes():
    recs = [ex(img=np.arange(6, dtype=np.float32), y=3, z=[1, 2]) for _ in range(4)]
    out = infeed.parse_examples(recs, {"img": FixedLen((2, 3), "float32"), "y": FixedLen((), "int64"),
                                       "z": FixedLen(2, "int32")})
    assert out["img"].shape == (4, 2, 3) and out["img"].dtype == np.float32
    assert out["img"][0].ravel().tolist() == list(range(6))
    assert out["y"].shape == (4,) and out["y"].dtype == np.int64 and out["y"].tolist() == [3] * 4
    assert out["z"].dtype == np.int32 and out["z"].tolist() == [[1, 2]] * 4


def test_fixedlen_default_fills_missing_features():
    recs = [ex(x=[1.0, 2.0]), ex(other=1)]
    out = infeed.parse_examples(recs, {"x": FixedLen((2,), "float32", default=[7.0, 8.0]),
                                       "w": FixedLen((), "float32", default=0.5)})
    assert out["x"].tolist() == [[1.0, 2.0], [7.0, 8.0]]
    assert out["w"].tolist() == [0.5, 0.5]


def test_missing_required_feature_names_it_and_the_record():
    recs = [ex(x=1.0), ex(x=1.0), ex(y=1.0)]
    with pytest.raises(infeed.DecodeError) as info:
        infeed.parse_examples(recs, {"x": FixedLen((), "float32")})
    assert (info.value.feature, info.value.record_index) == ("x", 2)
    assert isinstance(info.value, ValueError)


def test_index_base_offsets_record_indices_in_errors():
    parser = infeed.ExampleParser({"x": FixedLen((), "float32")})
    with pytest.raises(infeed.DecodeError) as info:
        parser.parse([ex(x=1.0), ex(x=[1.0, 2.0])], index_base=1000)
    assert info.value.record_index == 1001
    assert "record 1001" in str(info.value) and "expected 1 float value, found 2" in str(info.value)


def test_int32_values_out_of_range_are_refused():
    with pytest.raises(infeed.DecodeError, match="fit int32") as info:
        infeed.parse_examples([ex(n=[1, 2**31])], {"n": FixedLen((2,), "int32")})
    assert info.value.found == 2**31
    with pytest.raises(infeed.DecodeError, match="fit int32"):
        infeed.parse_examples([ex(n=[-(2**31) - 1])], {"n": VarLen("int32", max_len=2)})
    out = infeed.parse_examples([ex(n=[-(2**31), 2**31 - 1])], {"n": FixedLen((2,), "int32")})
    assert out["n"].tolist() == [[-(2**31), 2**31 - 1]]


# --- VarLen and Bytes --------------------------------------------------------------------------

def test_varlen_pads_and_reports_lengths():
    recs = [ex(t=[1, 2, 3]), ex(t=[]), ex(u=1), ex(t=[9])]
    out = infeed.parse_examples(recs, {"t": VarLen("int64", max_len=4, pad=-1)})
    assert isinstance(out["t"], Padded)
    assert out["t"].values.tolist() == [[1, 2, 3, -1], [-1] * 4, [-1] * 4, [9, -1, -1, -1]]
    assert out["t"].lengths.dtype == np.int32 and out["t"].lengths.tolist() == [3, 0, 0, 1]


def test_varlen_overflow_is_an_error_unless_truncate():
    recs = [ex(t=[1.0, 2.0, 3.0])]
    with pytest.raises(infeed.DecodeError, match="at most 2 values.*truncate=True") as info:
        infeed.parse_examples(recs, {"t": VarLen("float32", max_len=2)})
    assert info.value.found == 3
    out = infeed.parse_examples(recs, {"t": VarLen("float32", max_len=2, truncate=True)})
    assert out["t"].values.tolist() == [[1.0, 2.0]] and out["t"].lengths.tolist() == [2]


def test_bytes_pads_with_zeros_and_reports_lengths():
    recs = [ex(id=b"abc"), ex(id=b""), ex(id=b"\0\1")]
    out = infeed.parse_examples(recs, {"id": Bytes(max_bytes=4)})
    assert out["id"].values.dtype == np.uint8 and out["id"].values.shape == (3, 4)
    assert [bytes(v[:n]) for v, n in zip(out["id"].values, out["id"].lengths)] == [b"abc", b"", b"\0\1"]
    assert out["id"].values[0, 3] == 0


def test_bytes_errors_and_options():
    with pytest.raises(infeed.DecodeError, match="at most 2 bytes"):
        infeed.parse_examples([ex(id=b"abc")], {"id": Bytes(2)})
    out = infeed.parse_examples([ex(id=b"abc")], {"id": Bytes(2, truncate=True)})
    assert out["id"].values.tolist() == [[97, 98]] and out["id"].lengths.tolist() == [2]
    with pytest.raises(infeed.DecodeError, match="expected 1 bytes value, found 2"):
        infeed.parse_examples([ex(id=[b"a", b"b"])], {"id": Bytes(2)})
    with pytest.raises(infeed.DecodeError, match="no such feature"):
        infeed.parse_examples([ex(x=1)], {"id": Bytes(2)})
    out = infeed.parse_examples([ex(x=1)], {"id": Bytes(4, default=b"na")})
    assert out["id"].values.tolist() == [[110, 97, 0, 0]] and out["id"].lengths.tolist() == [2]


def test_a_missing_feature_names_the_features_the_record_has_the_nearest_first(tmp_path):
    records = [ex(x=1, token=5), ex(tokens=[1, 2], token_ids=[3], label=0, **{f"f{i}": i for i in range(8)})]
    spec = {"x": FixedLen((), "int64", default=0), "token": FixedLen((), "int64")}
    message = (r"record 1: feature 'token': expected a int64 feature \(required: it has no default\), found no such "
               r"feature: the record has 'tokens', 'token_ids', .* and 3 more \(nearest first\)$")
    with pytest.raises(infeed.DecodeError, match=message) as info:
        infeed.parse_examples(records, spec)
    assert info.value.feature == "token" and info.value.record_index == 1
    path = tmp_path / "r.tfrecord"                   # decoded where it lies in the reader's buffer: the same words
    with infeed.TFRecordWriter(str(path)) as w:
        for record in records:
            w.write(record)
    parser = infeed.ExampleParser(spec)
    with infeed.read_records(str(path)) as reader, pytest.raises(infeed.DecodeError, match=message):
        parser.read_into(reader, 2, parser.allocate(2))
    with pytest.raises(infeed.DecodeError, match=r"found no such feature: the record has no features$"):
        infeed.parse_examples([b""], {"id": Bytes(2)})


def test_kind_mismatch_names_both_kinds():
    with pytest.raises(infeed.DecodeError) as info:
        infeed.parse_examples([ex(x=[1, 2])], {"x": VarLen("float32", max_len=2)})
    assert "expected float values, found int64 values" in str(info.value)


# --- outputs the caller owns ---------------------------------------------------------------

def test_parse_writes_only_the_rows_it_was_given():
    parser = infeed.ExampleParser({"x": FixedLen((2,), "float32"), "t": VarLen("int64", max_len=3)})
    out = parser.allocate(6)
    out["x"][:] = -5
    out["t"].values[:] = -5
    parser.parse([ex(x=[1.0, 2.0], t=[1]), ex(x=[3.0, 4.0], t=[])], out=out, start=2)
    assert out["x"][:, 0].tolist() == [-5, -5, 1, 3, -5, -5]
    assert out["t"].values[2].tolist() == [1, 0, 0] and out["t"].values[5].tolist() == [-5] * 3


def test_parse_rejects_outputs_that_do_not_fit():
    parser = infeed.ExampleParser({"x": FixedLen((2,), "float32")})
    recs = [ex(x=[1.0, 2.0])] * 3
    with pytest.raises(ValueError, match="do not fit"):
        parser.parse(recs, out={"x": np.zeros((2, 2), np.float32)})
    with pytest.raises(ValueError, match="float32 array of shape"):
        parser.parse(recs, out={"x": np.zeros((3, 2), np.float64)})
    with pytest.raises(ValueError, match="C-contiguous"):
        parser.parse(recs, out={"x": np.zeros((3, 4), np.float32)[:, :2]})
    with pytest.raises(ValueError, match="no array for feature 'x'"):
        parser.parse(recs, out={})
    frozen = np.zeros((3, 2), np.float32)
    frozen.setflags(write=False)
    with pytest.raises(ValueError, match="writable"):
        parser.parse(recs, out={"x": frozen})


def test_parse_accepts_memoryviews_and_bytearrays():
    rec = ex(x=[1.0, 2.0])
    out = infeed.parse_examples([memoryview(rec), bytearray(rec)], {"x": FixedLen((2,), "float32")})
    assert out["x"].tolist() == [[1.0, 2.0]] * 2


def test_zero_records_give_empty_batches():
    out = infeed.parse_examples([], {"x": FixedLen((2,), "float32"), "t": VarLen("int64", max_len=3)})
    assert out["x"].shape == (0, 2) and out["t"].values.shape == (0, 3)


def test_many_features_are_found_whatever_their_order():
    names = [f"C{i}" for i in range(40)]
    recs = [infeed.encode_example({n: i * 100 + k for k, n in enumerate(order)})
            for i, order in enumerate([names, names[::-1], names[7:] + names[:7]])]
    out = infeed.parse_examples(recs, {n: FixedLen((), "int64") for n in names})
    for i, order in enumerate([names, names[::-1], names[7:] + names[:7]]):
        for k, n in enumerate(order):
            assert out[n][i] == i * 100 + k
