"""Conformance: the reader and decoder agree with what TensorFlow wrote and decoded."""

import base64
import json
import shutil

import numpy as np
import pytest

import infeed


@pytest.fixture(scope="module")
def expected(fixtures_dir):
    return json.loads((fixtures_dir / "expected.json").read_text())


def _tf_floats(values):
    return np.array([float(v) for v in values], dtype=np.float32)


def _same_floats(a, b):
    """Equal as float32, NaN matching NaN and the sign of zero kept."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    same_bits = a.view(np.uint32) == b.view(np.uint32)
    return bool(np.all(both_nan | same_bits))


@pytest.mark.parametrize("name", ["varied.tfrecord", "varied.tfrecord.gz", "varied.zlib.tfrecord"])
def test_varied_records_decode_as_tensorflow_decoded_them(fixtures_dir, expected, name):
    want = expected["varied"]["records"]
    got = [infeed.decode_example(r) for r in infeed.read_records(fixtures_dir / name)]
    assert len(got) == len(want) == 300
    for i, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w), f"record {i}"
        for key, feature in w.items():
            kind, values = g[key]
            assert kind == feature["kind"], (i, key)
            if kind == "bytes":
                assert values == [base64.b64decode(v) for v in feature["values"]], (i, key)
            elif kind == "float":
                assert _same_floats(values, _tf_floats(feature["values"])), (i, key)
            else:
                assert values.dtype == np.int64 and values.tolist() == feature["values"], (i, key)


def test_varied_covers_the_edge_values_it_promises(fixtures_dir, expected):
    """A guard on the fixture itself: the extremes above were really compared."""
    ints = [v for r in expected["varied"]["records"] for f in r.values() if f["kind"] == "int64" for v in f["values"]]
    floats = [v for r in expected["varied"]["records"] for f in r.values() if f["kind"] == "float" for v in f["values"]]
    assert -(2**63) in ints and 2**63 - 1 in ints
    assert {"nan", "inf", "-inf"} <= {v for v in floats if isinstance(v, str)}


@pytest.mark.parametrize("name", ["varied.tfrecord.gz", "varied.zlib.tfrecord"])
def test_compression_is_detected_from_the_stream_when_the_name_does_not_say(fixtures_dir, tmp_path, name):
    plain = list(infeed.read_records(fixtures_dir / "varied.tfrecord"))
    renamed = tmp_path / "data.bin"
    shutil.copy(fixtures_dir / name, renamed)
    assert list(infeed.read_records(renamed)) == plain


def test_explicit_compression_matches_auto(fixtures_dir):
    plain = list(infeed.read_records(fixtures_dir / "varied.tfrecord", compression=None))
    assert list(infeed.read_records(fixtures_dir / "varied.tfrecord.gz", compression="GZIP")) == plain
    assert list(infeed.read_records(fixtures_dir / "varied.zlib.tfrecord", compression="ZLIB")) == plain


def test_dense_parse_matches_tensorflow_parse_example(fixtures_dir, expected):
    tf_out = expected["dense"]["parse_example_all_records"]
    records = list(infeed.read_records(fixtures_dir / "dense.tfrecord"))
    assert len(records) == 257
    max_tokens = len(tf_out["tokens"][0])
    spec = {
        "x": infeed.FixedLen((16,), "float32"),
        "label": infeed.FixedLen((), "int64"),
        "weight": infeed.FixedLen((), "float32", default=1.0),
        "tokens": infeed.VarLen("int64", max_len=max_tokens),
        "id": infeed.Bytes(max_bytes=16),
    }
    out = infeed.parse_examples(records, spec)
    assert out["x"].shape == (257, 16)
    assert _same_floats(out["x"], _tf_floats(np.ravel(tf_out["x"])).reshape(257, 16))
    assert out["label"].tolist() == tf_out["label"]
    assert _same_floats(out["weight"], _tf_floats(tf_out["weight"]))
    assert out["tokens"].values.tolist() == tf_out["tokens"]
    lengths = [sum(1 for _ in row) - next((k for k, v in enumerate(reversed(row)) if v != 0), len(row))
               for row in tf_out["tokens"]]
    assert (out["tokens"].lengths >= np.array(lengths)).all()
    ids = [bytes(v[:n]).decode() for v, n in zip(out["id"].values, out["id"].lengths)]
    assert ids == tf_out["id"]


def test_dense_parses_the_same_into_a_reused_output_in_batches(fixtures_dir):
    records = list(infeed.read_records(fixtures_dir / "dense.tfrecord"))
    spec = {"x": infeed.FixedLen((16,), "float32"), "tokens": infeed.VarLen("int64", max_len=12),
            "weight": infeed.FixedLen((), "float32", default=1.0)}
    whole = infeed.parse_examples(records, spec)
    parser = infeed.ExampleParser(spec)
    out = parser.allocate(64)
    for start in range(0, len(records), 64):
        chunk = records[start:start + 64]
        parser.parse(chunk, out=out, index_base=start)
        n = len(chunk)
        assert np.array_equal(out["x"][:n], whole["x"][start:start + n])
        assert np.array_equal(out["tokens"].values[:n], whole["tokens"].values[start:start + n])
        assert np.array_equal(out["tokens"].lengths[:n], whole["tokens"].lengths[start:start + n])
        assert np.array_equal(out["weight"][:n], whole["weight"][start:start + n])


# --- the errors TensorFlow raises when data does not meet the spec ---------------------------

DENSE_SPEC = {
    "x": infeed.FixedLen((16,), "float32"),
    "label": infeed.FixedLen((), "int64"),
    "id": infeed.Bytes(max_bytes=16),
}


@pytest.mark.parametrize("case, spec, feature, expected_part, found_part", [
    ("missing required FixedLen 'weight' (no default)",
     {**DENSE_SPEC, "weight": infeed.FixedLen((), "float32")}, "weight", "required", "no such feature"),
    ("FixedLen 'x' declared with shape [8], data has 16 values",
     {**DENSE_SPEC, "x": infeed.FixedLen((8,), "float32")}, "x", "8 float values", "16"),
    ("FixedLen 'label' declared as float32, data is int64_list",
     {**DENSE_SPEC, "label": infeed.FixedLen((), "float32")}, "label", "float", "int64"),
    ("FixedLen 'id' declared as int64, data is bytes_list",
     {**DENSE_SPEC, "id": infeed.FixedLen((), "int64")}, "id", "int64", "bytes"),
])
def test_spec_mismatches_name_feature_record_expected_and_found(fixtures_dir, expected, case, spec, feature,
                                                                 expected_part, found_part):
    assert case in [e["case"] for e in expected["parse_errors"]]
    records = list(infeed.read_records(fixtures_dir / "dense.tfrecord"))
    # 'weight' is missing from some records only: find the first, as TensorFlow reports it.
    with pytest.raises(infeed.DecodeError) as info:
        infeed.parse_examples(records, spec)
    err = info.value
    assert err.feature == feature
    assert expected_part in str(err.expected)
    assert found_part in str(err.found)
    assert f"record {err.record_index}" in str(err) and repr(feature) in str(err)
    if feature != "weight":
        assert err.record_index == 0
    else:
        assert "weight" not in infeed.decode_example(records[err.record_index])
        assert all("weight" in infeed.decode_example(r) for r in records[:err.record_index])


def test_record_that_is_not_a_protobuf_is_a_decode_error(expected):
    assert any(e["case"] == "record that is not a protobuf" for e in expected["parse_errors"])
    with pytest.raises(infeed.DecodeError) as info:
        infeed.parse_examples([b"\n\x7fnot a protobuf at all"], DENSE_SPEC)
    assert info.value.record_index == 0 and "invalid protobuf" in str(info.value)
    with pytest.raises(infeed.DecodeError):
        infeed.decode_example(b"\n\x7fnot a protobuf at all")


# --- valid encodings TensorFlow's serializer never writes ----------------------------------

def test_wire_variants_follow_the_protobuf_specification(fixtures_dir, expected):
    wv = expected["wire_variants"]
    records = list(infeed.read_records(fixtures_dir / wv["file"]))
    assert len(records) == len(wv["order"])
    tf_values = wv["tf_parse_single_example"]
    for name, record in zip(wv["order"], records):
        got = infeed.decode_example(record)
        want = dict(tf_values[name])
        if name == "packed_then_unpacked_same_list":
            # TensorFlow keeps only the packed run ([1.0]); the protobuf specification says a
            # parser concatenates packed and unpacked values of one list, and so do we.
            assert want["x"] == [1.0]
            want["x"] = [1.0, 2.0]
        for key, values in want.items():
            if not values:
                assert key not in got or len(got[key][1]) == 0, (name, key)
            else:
                assert list(got[key][1]) == values, (name, key)


def test_wire_variants_parse_with_a_spec_as_decoded(fixtures_dir, expected):
    records = list(infeed.read_records(fixtures_dir / "wire_variants.tfrecord"))
    out = infeed.parse_examples(records, {"x": infeed.VarLen("float32", max_len=4),
                                          "n": infeed.VarLen("int64", max_len=4)})
    assert out["x"].lengths.tolist() == [3, 2, 1, 2]
    assert out["x"].values[3, :2].tolist() == [1.0, 2.0]
    assert out["n"].values[0, :3].tolist() == [7, -1, 1099511627776]


# --- damaged files --------------------------------------------------------------------------

def test_every_damaged_fixture_raises_with_file_record_and_offset(fixtures_dir, expected):
    good = list(infeed.read_records(fixtures_dir / "dense.tfrecord"))
    for case in expected["corrupt"]:
        path = fixtures_dir / case["file"]
        reader = infeed.read_records(path)
        got = []
        with pytest.raises(infeed.CorruptRecordError) as info:
            for record in reader:
                got.append(record)
        err = info.value
        assert got == good[:case["records_before_error"]], case["file"]
        assert (err.record_index, err.offset) == (case["record_index"], case["record_offset"])
        assert err.path == str(path)
        assert str(path) in str(err) and f"record {case['record_index']}" in str(err)
        assert f"offset {case['record_offset']}" in str(err)
        # nothing after the damage is yielded, ever
        with pytest.raises(infeed.CorruptRecordError):
            next(reader)


def test_damage_kinds_name_what_was_found(fixtures_dir):
    kinds = {}
    for name in ["corrupt_length_crc", "corrupt_data_crc", "truncated_data", "truncated_header", "huge_length"]:
        with pytest.raises(infeed.CorruptRecordError) as info:
            list(infeed.read_records(fixtures_dir / f"{name}.tfrecord"))
        kinds[name] = info.value.kind
    assert kinds == {"corrupt_length_crc": "length_crc", "corrupt_data_crc": "data_crc",
                     "truncated_data": "truncated_data", "truncated_header": "truncated_header",
                     # the fixture's absurd length (2**40) was written without fixing its CRC
                     "huge_length": "length_crc"}


def test_truncated_header_is_reported_where_tensorflow_stops_silently(fixtures_dir, expected):
    case = next(c for c in expected["corrupt"] if c["file"] == "truncated_header.tfrecord")
    assert case["tf_error"] is None
    with pytest.raises(infeed.CorruptRecordError, match="ends inside a record header"):
        list(infeed.read_records(fixtures_dir / case["file"]))


def test_skip_corrupt_resumes_after_each_damaged_fixture_record(fixtures_dir):
    good = list(infeed.read_records(fixtures_dir / "dense.tfrecord"))
    for name in ["corrupt_length_crc", "corrupt_data_crc", "huge_length"]:
        reader = infeed.read_records(fixtures_dir / f"{name}.tfrecord", skip_corrupt=True)
        got = list(reader)
        # only record 5 is lost; TensorFlow's ignore_errors drops the rest of the file
        assert got == good[:5] + good[6:], name
        assert reader.skipped_regions == 1
        assert reader.skipped_bytes == len(good[5]) + 16
    for name in ["truncated_data", "truncated_header"]:
        reader = infeed.read_records(fixtures_dir / f"{name}.tfrecord", skip_corrupt=True)
        assert list(reader) == good[:5]
        assert reader.skipped_regions == 1
