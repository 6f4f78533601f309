"""Property tests: the Cython decoder, spec parser, TFRecord framing and CRC32C against tests/infeed/example/reference.py.

Hypothesis runs a bounded number of examples by default (profile
``infeed-quick``); ``INFEED_HYPOTHESIS_PROFILE=infeed-long pytest
tests/infeed/example/test_properties.py`` runs many more.
"""

import io
import os
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infeed
from infeed import Bytes, FixedLen, Padded, VarLen
from infeed.example.spec import NUMERIC_DTYPES
from infeed.tfrecord import _tfrecord

import reference as ref

settings.register_profile("infeed-quick", max_examples=150, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("infeed-long", max_examples=3000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = settings.get_profile(os.environ.get("INFEED_HYPOTHESIS_PROFILE", "infeed-quick"))


# ---------------------------------------------------------------------------
# Strategies: logical Examples, {name: (kind, values)}

INT64_EDGES = [0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768, -32769, 65535, 65536,
               2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**32, 2**63 - 1, -(2**63)]
# The last six: a bfloat16 tie rounding down and one rounding up, float16's overflow to inf and the value
# below it, a float16 subnormal tie (2**-25, to zero) and float16's largest subnormal.
FLOAT_EDGE_BITS = [0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                   0x7F800001, 0x7FBFFFFF, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF,
                   0x3F808000, 0x3F818000, 0x477FF000, 0x477FEFFF, 0x33000000, 0x387FC000]

names = st.one_of(st.text(max_size=8), st.sampled_from(["", "a", "é", "\x00", "日本語", "𝄞", "a/b:c"]))
int64s = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(INT64_EDGES), st.integers(-200, 300))
float_bits = st.one_of(st.sampled_from(FLOAT_EDGE_BITS), st.integers(0, 2**32 - 1),
                       st.floats(width=32).map(lambda f: int(np.float32(f).view(np.uint32))))
blobs = st.one_of(st.binary(max_size=12), st.sampled_from([b"", b"\0", b"\0\0x\0", bytes(range(256))]))


def feature(kinds=("bytes", "float", "int64", None)):
    options = {
        "bytes": st.lists(blobs, max_size=64).map(lambda v: ("bytes", v)),
        "float": st.lists(float_bits, max_size=64).map(
            lambda v: ("float", np.array(v, np.uint32).view(np.float32))),
        "int64": st.lists(int64s, max_size=64).map(lambda v: ("int64", np.array(v, np.int64))),
        None: st.just((None, [])),
    }
    return st.one_of(*(options[k] for k in kinds))


def examples(kinds=("bytes", "float", "int64", None), max_size=6):
    return st.dictionaries(names, feature(kinds), max_size=max_size)


def same(got: dict, want: dict) -> bool:
    """Decoded examples equal kind for kind, float values bit for bit."""
    if got.keys() != want.keys():
        return False
    for name in want:
        (gk, gv), (wk, wv) = got[name], want[name]
        if gk != wk:
            return False
        if gk in ("bytes", None):
            if [bytes(v) for v in gv] != [bytes(v) for v in wv] or type(gv) is not list:
                return False
        else:
            dtype = np.float32 if gk == "float" else np.int64
            if gv.dtype != dtype or np.asarray(wv, dtype).tobytes() != gv.tobytes():
                return False
    return True


def show(d: dict) -> dict:
    return {k: (kind, v if kind != "float" else np.asarray(v).view(np.uint32).tolist()) for k, (kind, v) in d.items()}


# ---------------------------------------------------------------------------
# decode_example


@settings(PROFILE)
@given(examples(kinds=("bytes", "float", "int64")))
def test_encode_example_output_decodes_alike_in_infeed_and_reference(example):
    record = infeed.encode_example({n: (list(v) if k == "bytes" else v) for n, (k, v) in example.items()})
    # encode_example writes an empty list as an empty float_list, as TensorFlow does
    want = {n: (("float", np.zeros(0, np.float32)) if k == "bytes" and not len(v) else (k, v))
            for n, (k, v) in example.items()}
    got = infeed.decode_example(record)
    assert same(got, want), (show(got), show(want))
    assert same(ref.decode_example(record, strict=True), want)
    assert ref.encode(want) == record          # both encoders agree on the canonical form


@settings(PROFILE)
@given(examples(), st.randoms(use_true_random=False), st.sampled_from([0.1, 0.3, 0.6]))
def test_alternative_encodings_decode_to_the_same_example(example, rng, p):
    record = ref.encode(example, rng, p)
    assert same(ref.decode_example(record, strict=True), example)
    got = infeed.decode_example(record)
    assert same(got, example), (record, show(got), show(example))


@settings(PROFILE)
@given(examples(max_size=3), st.randoms(use_true_random=False))
def test_memoryview_and_bytearray_records_decode_like_bytes(example, rng):
    record = ref.encode(example, rng)
    padded = b"\xff" * 3 + record + b"\xff" * 3
    view = memoryview(padded)[3:3 + len(record)]
    assert same(infeed.decode_example(view), example)
    assert same(infeed.decode_example(bytearray(record)), example)


# ---------------------------------------------------------------------------
# ExampleParser.parse against the reference parser


def _shapes(count):
    shapes = [(count,)]
    if count == 1:
        shapes.append(())
    for a in range(2, count):
        if count % a == 0:
            shapes.append((a, count // a))
    return st.sampled_from(shapes)


@st.composite
def spec_entry(draw, kind, values):
    """A spec entry for a feature holding ``values`` of ``kind``: usually fitting, sometimes not."""
    numeric = {kind: draw(st.sampled_from([d for d, k in NUMERIC_DTYPES.items() if k == kind]))
               for kind in ("float", "int64")}
    if kind in numeric and draw(st.integers(0, 3)):
        dtype = numeric[kind]
    else:
        dtype = draw(st.sampled_from([*NUMERIC_DTYPES, "bytes"]))
    n = len(values)
    if dtype == "bytes" or (kind == "bytes" and draw(st.booleans())):
        first = len(values[0]) if kind == "bytes" and n else 3
        max_bytes = draw(st.integers(0, first + 2))
        default = draw(st.one_of(st.none(), st.binary(max_size=max_bytes)))
        return Bytes(max_bytes, default=default, truncate=draw(st.booleans()))
    pad_values = [0, 1] if dtype == "bool" else [0, 7] + ([] if dtype.startswith("uint") else [-1]) + (
        [float("nan"), -0.0, 1.5] if NUMERIC_DTYPES[dtype] == "float" else [])
    if draw(st.booleans()):
        count = draw(st.sampled_from([n, n, n + 1, max(n - 1, 0)]))
        default = draw(st.one_of(st.none(), st.sampled_from(pad_values)))
        return FixedLen(draw(_shapes(count)), dtype, default=default)
    return VarLen(dtype, max_len=draw(st.integers(0, n + 2)), pad=draw(st.sampled_from(pad_values)),
                  truncate=draw(st.booleans()))


@st.composite
def batches_and_specs(draw):
    batch = draw(st.lists(examples(max_size=4), min_size=1, max_size=4))
    pool = sorted({n for e in batch for n in e}) + [draw(names)]
    chosen = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4, unique=True))
    spec = {}
    for name in chosen:
        kind, values = next((e[name] for e in batch if name in e), (None, []))
        spec[name] = draw(spec_entry(kind, values))
    rng = draw(st.randoms(use_true_random=False))
    canonical = draw(st.booleans())
    records = [ref.encode(e, None if canonical else rng) for e in batch]
    return records, spec


def _outcome_of_reference(records, spec, index_base):
    try:
        return ref.parse(records, spec, index_base)
    except ref.RefDecodeError as e:
        return e


def assert_parse_matches_reference(records, spec, index_base=0, got=None, start=0):
    want = _outcome_of_reference(records, spec, index_base)
    parser = infeed.ExampleParser(spec)
    try:
        if got is None:
            got = parser.parse(records, index_base=index_base)
        else:
            parser.parse(records, out=got, start=start, index_base=index_base)
    except infeed.DecodeError as e:
        assert isinstance(want, ref.RefDecodeError), f"infeed raised {e!r}; the reference decodes the batch"
        assert (e.feature, e.record_index) == (want.feature, want.record_index), (str(e), str(want))
        return want
    assert not isinstance(want, ref.RefDecodeError), f"the reference raises {want}; infeed decoded the batch"
    rows = slice(start, start + len(records))
    for name in spec:
        if isinstance(got[name], Padded):
            (wv, wl), gv, gl = want[name], got[name].values[rows], got[name].lengths[rows]
            assert gl.tolist() == wl.tolist(), name
        else:
            wv, gv = want[name], got[name][rows]
        assert gv.dtype == wv.dtype and gv.shape == wv.shape, (name, gv.shape, wv.shape)
        assert gv.tobytes() == wv.tobytes(), (name, gv, wv)
    return want


@settings(PROFILE)
@given(batches_and_specs(), st.integers(0, 10**6))
def test_parse_matches_the_reference_parser(case, index_base):
    records, spec = case
    assert_parse_matches_reference(records, spec, index_base)


@settings(PROFILE)
@given(batches_and_specs(), st.integers(0, 3), st.integers(0, 3))
def test_parse_into_rows_of_a_larger_out_matches_the_reference(case, start, extra):
    records, spec = case
    out = infeed.ExampleParser(spec).allocate(start + len(records) + extra)
    assert_parse_matches_reference(records, spec, 0, got=out, start=start)


@settings(PROFILE)
@given(examples(max_size=4), st.randoms(use_true_random=False))
def test_strict_and_lazy_reference_agree_on_valid_records(example, rng):
    """The reference's own consistency: lazy validation never changes a valid record's result."""
    record = ref.encode(example, rng)
    assert same(ref.decode_example(record, strict=False), ref.decode_example(record, strict=True))


@settings(PROFILE)
@given(batches_and_specs())
def test_parse_takes_any_buffer_as_a_record(case):
    records, spec = case
    kinds = [bytes, bytearray, lambda r: memoryview(b"\xff" + r)[1:], lambda r: np.frombuffer(r, np.uint8)]
    mixed = [kinds[i % len(kinds)](r) for i, r in enumerate(records)]
    want = _outcome_of_reference(records, spec, 0)
    try:
        got = infeed.ExampleParser(spec).parse(mixed)
    except infeed.DecodeError as e:
        assert isinstance(want, ref.RefDecodeError) and e.feature == want.feature, (e, want)
        return
    assert not isinstance(want, ref.RefDecodeError), want
    for name in spec:
        g, w = (got[name], want[name]) if not isinstance(got[name], Padded) else (got[name].values, want[name][0])
        assert g.tobytes() == w.tobytes()


# ---------------------------------------------------------------------------
# TFRecord framing


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("properties")


record_lists = st.lists(st.one_of(st.binary(max_size=300), st.sampled_from([b"", b"\0" * 70, b"x" * 1000])),
                        max_size=12)


@settings(PROFILE)
@given(records=record_lists, compression=st.sampled_from([None, "GZIP", "ZLIB"]),
       buffer_size=st.integers(64, 300), flushes=st.lists(st.booleans(), max_size=12))
def test_tfrecords_round_trip_across_small_buffers(scratch, records, compression, buffer_size, flushes):
    path = scratch / "round_trip.tfrecord"
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for i, r in enumerate(records):
            w.write(r)
            if i < len(flushes) and flushes[i]:
                w.flush()
    if compression is None:
        assert path.read_bytes() == b"".join(ref.frame(r) for r in records)
    for declared in (compression, "auto"):
        reader = infeed.read_records(path, compression=declared, buffer_size=buffer_size)
        assert list(reader) == records
        assert reader.skipped_regions == 0 and reader.records_read == len(records)


@settings(PROFILE)
@given(records=record_lists, buffer_size=st.integers(64, 300), known_size=st.booleans())
def test_record_reader_over_any_stream(records, buffer_size, known_size):
    data = b"".join(ref.frame(r) for r in records)
    reader = _tfrecord.RecordReader(io.BytesIO(data), "<memory>", len(data) if known_size else -1,
                                    False, buffer_size)
    assert list(reader) == records
    assert reader.tell() == len(data)


@settings(PROFILE)
@given(records=record_lists)
def test_frame_matches_the_pure_python_framing(records):
    for r in records:
        assert _tfrecord.frame(r) == ref.frame(r)
        assert _tfrecord.masked_crc32c(r) == ref.masked_crc32c(r)


# ---------------------------------------------------------------------------
# CRC32C: hardware path == table path == pure Python


@settings(PROFILE)
@given(data=st.binary(max_size=300), offset=st.integers(0, 15), cut=st.integers(0, 15),
       crc=st.one_of(st.just(0), st.integers(0, 2**32 - 1)))
def test_crc32c_paths_agree_on_unaligned_slices(data, offset, cut, crc):
    buf = bytes(16) + data + bytes(16)
    view = memoryview(buf)[offset: offset + len(data) + cut]
    want = ref.crc32c(view, crc)
    assert _tfrecord.crc32c(view, crc) == want
    assert _tfrecord.crc32c_table(view, crc) == want


def test_crc32c_paths_agree_on_large_buffers():
    rng = random.Random(4)
    data = rng.randbytes(70_000)
    for offset in range(9):
        view = memoryview(data)[offset:]
        want = ref.crc32c(view)
        assert _tfrecord.crc32c(view) == want == _tfrecord.crc32c_table(view)
    # and the pieces compose
    assert _tfrecord.crc32c(data[5:], _tfrecord.crc32c(data[:5])) == _tfrecord.crc32c(data)
    assert ref.crc32c(b"123456789") == 0xE3069283


def test_reference_encoder_produces_varied_encodings():
    """The alternative encodings really vary (guards against an encoder that always writes one form)."""
    example = {"a": ("int64", np.arange(5)), "b": ("float", np.ones(3, np.float32)), "": (None, [])}
    forms = {ref.encode(example, random.Random(seed)) for seed in range(50)}
    assert len(forms) > 40
    typed = {"a": ("int64", np.arange(5)), "b": ("float", np.ones(3, np.float32))}
    assert ref.encode(typed) == infeed.encode_example({"a": np.arange(5), "b": np.ones(3, np.float32)})
    assert struct.unpack("<I", ref.frame(b"x")[8:12])[0] == _tfrecord.masked_crc32c(struct.pack("<Q", 1))
