"""Output dtypes narrower than the wire's: bfloat16 and float16 from float_list, 8- and 16-bit integers
from int64_list, converted in the decoder exactly as numpy's (and ml_dtypes') ``astype`` converts."""

import json
import random

import ml_dtypes
import numpy as np
import pytest

import infeed
from infeed import FixedLen, Padded, VarLen
from infeed.example.spec import NUMERIC_DTYPES, spec_from_json, spec_to_json

import reference as ref

FLOAT_DTYPES = ["bfloat16", "float16"]
SMALL_INT_DTYPES = ["uint8", "int8", "uint16", "int16"]

# float32 bit patterns where rounding matters: zeros, infinities, NaNs (quiet, signalling, with payloads),
# float32 subnormals, bfloat16 ties (1 + 2**-8 rounds down to even, 1 + 3 * 2**-8 up), float16's largest
# finite value and the ties around it (65520 rounds to inf), float16 subnormals and their ties
# (2**-25 rounds to zero, 3 * 2**-26 up), float32's largest finite value (inf in both).
EDGE_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
             0x7FA00000, 0x7FBFFFFF, 0x7FFFFFFF, 0x7F802000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00008000,
             0x00018000, 0x3F808000, 0x3F818000, 0x3F808001, 0xBF808000, 0x477FE000, 0x477FEFFF, 0x477FF000,
             0x477FF001, 0x47800000, 0xC77FF000, 0x33000000, 0x33000001, 0x33400000, 0x387FC000, 0x387FE000,
             0x387FFFFF, 0x38800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000, 0x3DCCCCCD]


def float_values(seed=0, n=20_000):
    """The edge patterns, then random bit patterns and random values around float16's range."""
    rng = np.random.default_rng(seed)
    bits = np.concatenate([np.array(EDGE_BITS, np.uint32), rng.integers(0, 2**32, n, dtype=np.uint32),
                           (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, n)).astype(np.float32)
                           .view(np.uint32)])
    return bits.view(np.float32)


def astype(values, dtype):
    with np.errstate(all="ignore"):      # float16 overflows to inf, NaNs cast: what the decoder must match
        return np.asarray(values).astype(dtype)


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    mismatch = np.flatnonzero(got.view(np.uint8).reshape(got.size, -1) != want.view(np.uint8).reshape(want.size, -1))
    assert not mismatch.size, f"{mismatch.size} values differ, first at {mismatch[0]}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_floats_round_like_astype_bit_for_bit(dtype):
    values = float_values()
    parser = infeed.ExampleParser({"x": FixedLen((values.size,), dtype), "v": VarLen(dtype, max_len=values.size)})
    got = parser.parse([infeed.encode_example({"x": values, "v": values})])
    same_bits(got["x"][0], astype(values, dtype))
    same_bits(got["v"].values[0], astype(values, dtype))
    assert got["v"].lengths.tolist() == [values.size]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_named_float_edges(dtype):
    parser = infeed.ExampleParser({"x": FixedLen((7,), dtype)})
    x = parser.parse([infeed.encode_example({"x": np.array(
        [1 + 2**-8, 1 + 3 * 2**-8, 65519.99, 65520.0, np.nan, -np.inf, 2**-130], np.float32)})])["x"][0]
    assert np.isnan(x[4]) and x[5] == -np.inf
    if dtype == "bfloat16":
        assert x[:2].tolist() == [1.0, 1 + 2**-6]                  # ties to even
        assert x[6] == np.float32(2**-130)                        # float32's subnormals are bfloat16's
    else:
        assert x[:4].tolist() == [1 + 2**-8, 1 + 3 * 2**-8, 65504.0, np.inf]
        assert x[6] == 0


def test_floats_written_unpacked_or_split_convert_alike():
    values = float_values(n=200)
    spec = {"x": FixedLen((values.size,), "bfloat16"), "h": VarLen("float16", max_len=values.size + 3)}
    example = {"x": ("float", values), "h": ("float", values)}
    want = infeed.parse_examples([ref.encode(example)], spec)
    for seed in range(20):
        got = infeed.parse_examples([ref.encode(example, random.Random(seed))], spec)
        same_bits(got["x"], want["x"])
        same_bits(got["h"].values, want["h"].values)
    same_bits(want["x"][0], astype(values, "bfloat16"))


@pytest.mark.parametrize("dtype", SMALL_INT_DTYPES + ["int32"])
def test_integers_at_their_bounds_decode_and_one_past_is_a_decode_error(dtype):
    low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    values = [low, high, 0, 1, low + 1, high - 1]
    spec = {"x": FixedLen((len(values),), dtype), "v": VarLen(dtype, max_len=3)}
    got = infeed.parse_examples([infeed.encode_example({"x": values, "v": values[:2]})], spec)
    assert got["x"].dtype == dtype and got["x"][0].tolist() == values
    assert got["v"].values[0].tolist() == [low, high, 0] and got["v"].lengths.tolist() == [2]
    good = infeed.encode_example({"x": values, "v": []})
    for name in ("x", "v"):
        for outside in (low - 1, high + 1):
            bad = infeed.encode_example({"x": values[:-1] + [outside], "v": [outside]})
            with pytest.raises(infeed.DecodeError, match=f"values that fit {dtype}") as info:
                infeed.ExampleParser({name: spec[name]}).parse([good, good, bad], index_base=10)
            assert (info.value.feature, info.value.record_index) == (name, 12)
            assert str(outside) in str(info.value)


def test_bools_are_int64_values_zero_and_one_and_any_other_is_a_decode_error():
    spec = {"flag": FixedLen((), "bool"), "flags": VarLen("bool", max_len=3), "off": FixedLen((2,), "bool", default=0)}
    got = infeed.parse_examples([infeed.encode_example({"flag": [1], "flags": [0, 1]}),
                                 infeed.encode_example({"flag": [0], "flags": [1], "off": [1, 0]})], spec)
    assert got["flag"].dtype == np.bool_ and got["flag"].tolist() == [True, False]
    assert got["flags"].values.tolist() == [[False, True, False], [True, False, False]]
    assert got["flags"].lengths.tolist() == [2, 1] and got["off"].tolist() == [[False, False], [True, False]]
    for outside in (2, -1):
        with pytest.raises(infeed.DecodeError, match=f"feature 'flag': expected values that fit bool, found {outside}"):
            infeed.parse_examples([infeed.encode_example({"flag": [outside], "flags": []})], spec)
    with pytest.raises(ValueError, match="FixedLen.default 2 does not fit"):
        FixedLen((), "bool", default=2)


def test_values_past_a_varlen_width_are_cut_unchecked_when_truncating():
    got = infeed.parse_examples([infeed.encode_example({"v": [1, 2, 1000]})], {"v": VarLen("uint8", 2, truncate=True)})
    assert got["v"].values.tolist() == [[1, 2]] and got["v"].lengths.tolist() == [2]


@pytest.mark.parametrize("dtype, pad", [("bfloat16", np.nan), ("bfloat16", -1.5), ("float16", 65504.0),
                                        ("uint8", 255), ("int8", -128), ("uint16", 65535), ("int16", -1)])
def test_varlen_pads_with_its_pad_in_the_dtype(dtype, pad):
    parser = infeed.ExampleParser({"v": VarLen(dtype, max_len=4, pad=pad)})
    values = [3, 1] if NUMERIC_DTYPES[dtype] == "int64" else [0.1, 2.0]
    got = parser.parse([infeed.encode_example({"v": values}), infeed.encode_example({"other": [1]})])["v"]
    want = np.full((2, 4), pad, dtype)
    want[0, :2] = astype(np.array(values, np.float32 if NUMERIC_DTYPES[dtype] == "float" else np.int64), dtype)
    same_bits(got.values, want)
    assert got.lengths.tolist() == [2, 0]


@pytest.mark.parametrize("dtype, default", [("bfloat16", [0.1, -3.0]), ("float16", [np.inf, 1e-6]),
                                            ("uint8", [0, 255]), ("int8", -7), ("uint16", [65535, 1]),
                                            ("int16", [-32768, 32767])])
def test_fixedlen_default_fills_a_missing_feature_in_the_dtype(dtype, default):
    spec = {"x": FixedLen((2,), dtype, default=default)}
    assert spec["x"].default.dtype == dtype
    got = infeed.parse_examples([infeed.encode_example({"other": [1]})], spec)["x"]
    same_bits(got, np.broadcast_to(astype(default, dtype), (1, 2)))


@pytest.mark.parametrize("dtype", SMALL_INT_DTYPES + ["int32", "int64"])
def test_float_values_for_an_integer_dtype_are_a_kind_error(dtype):
    with pytest.raises(infeed.DecodeError, match="expected int64 values, found float values") as info:
        infeed.parse_examples([infeed.encode_example({"x": [1.0]})], {"x": FixedLen((), dtype)})
    assert (info.value.feature, info.value.record_index) == ("x", 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES + ["float32"])
def test_integer_values_for_a_float_dtype_are_a_kind_error(dtype):
    with pytest.raises(infeed.DecodeError, match="expected float values, found int64 values") as info:
        infeed.parse_examples([infeed.encode_example({"x": [1]})], {"x": VarLen(dtype, max_len=2)})
    assert (info.value.feature, info.value.record_index) == ("x", 0)


@pytest.mark.parametrize("make, message", [
    (lambda: VarLen("uint8", max_len=2), None),
    (lambda: VarLen("uint8", max_len=2, pad=-1), "VarLen.pad -1 is not a uint8 scalar"),
    (lambda: VarLen("int8", max_len=2, pad=128), "VarLen.pad 128 is not a int8 scalar"),
    (lambda: VarLen("uint16", max_len=2, pad=np.int64(65536)), "VarLen.pad"),
    (lambda: VarLen("int16", max_len=2, pad=0.5), "VarLen.pad 0.5 is not a int16 scalar"),
    (lambda: VarLen("float16", max_len=2, pad=1e5), "VarLen.pad 100000.0 is not a float16 scalar"),
    (lambda: VarLen("bfloat16", max_len=2, pad=[1.0]), "VarLen.pad"),
    (lambda: FixedLen((2,), "bfloat16", default=[1.0, 1e39]), "FixedLen.default"),
    (lambda: FixedLen((2,), "float16", default=70000), "FixedLen.default"),
    (lambda: FixedLen((2,), "uint8", default=[1, 256]), "FixedLen.default"),
    (lambda: FixedLen((2,), "int8", default=np.array([1, -129])), "FixedLen.default"),
    (lambda: FixedLen((2,), "int16", default=np.nan), "FixedLen.default"),
    (lambda: FixedLen((2,), "float64"), "FixedLen.dtype must be one of .*bfloat16"),
])
def test_pads_and_defaults_must_be_representable_in_the_dtype(make, message):
    if message is None:
        assert make().pad == 0
        return
    with pytest.raises(ValueError, match=message) as info:
        make()
    assert type(info.value) is ValueError


def test_dtypes_may_be_given_as_numpy_and_ml_dtypes_types():
    assert FixedLen((), ml_dtypes.bfloat16).dtype == "bfloat16"
    assert VarLen(np.float16, max_len=1).dtype == "float16" and VarLen(np.uint8, max_len=1).dtype == "uint8"


def test_spec_json_keeps_dtype_pad_and_default():
    spec = {"b": FixedLen((2,), "bfloat16", default=[0.1, np.inf]), "h": VarLen("float16", max_len=3, pad=-0.5),
            "u": VarLen("uint8", max_len=2, pad=255, truncate=True), "i": FixedLen((), "int8", default=-128),
            "w": VarLen("uint16", max_len=1, pad=ml_dtypes.bfloat16(7)), "s": FixedLen((3,), "int16")}
    back = spec_from_json(json.loads(json.dumps(spec_to_json(spec))))
    assert back == spec
    for name, f in back.items():
        assert f.dtype == spec[name].dtype
        if isinstance(f, FixedLen) and f.default is not None:
            same_bits(f.default, spec[name].default)


def test_allocate_and_out_checks_use_the_dtype():
    parser = infeed.ExampleParser({"b": FixedLen((2,), "bfloat16"), "u": VarLen("uint8", max_len=3)})
    out = parser.allocate(4)
    assert out["b"].dtype == ml_dtypes.bfloat16 and out["u"].values.dtype == np.uint8
    parser.parse([infeed.encode_example({"b": [1.5, 2.5], "u": [7]})], out=out, start=3)
    assert out["b"][3].tolist() == [1.5, 2.5] and out["u"].values[3].tolist() == [7, 0, 0]
    wrong = dict(out, b=np.zeros((4, 2), np.float32))
    with pytest.raises(ValueError, match=r"out\['b'\] must be a bfloat16 array"):
        parser.parse([infeed.encode_example({"b": [1.5, 2.5], "u": [7]})], out=wrong)
    with pytest.raises(ValueError, match=r"out\['u'\] must be a uint8 array"):
        parser.parse([], out=dict(out, u=Padded(np.zeros((4, 3), np.int8), out["u"].lengths)))


def test_read_into_converts_as_parse_does(tmp_path):
    values = float_values(n=64)
    records = [infeed.encode_example({"x": values[i:i + 8], "n": [i, -i]}) for i in range(0, 64, 8)]
    path = str(tmp_path / "f.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    parser = infeed.ExampleParser({"x": FixedLen((8,), "float16"), "n": FixedLen((2,), "int16")})
    out = parser.allocate(len(records))
    with infeed.read_records(path) as reader:
        assert parser.read_into(reader, len(records), out)[0] == len(records)
    want = parser.parse(records)
    same_bits(out["x"], want["x"])
    same_bits(out["n"], want["n"])
