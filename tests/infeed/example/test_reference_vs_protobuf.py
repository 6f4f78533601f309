"""The reference decoder (tests/infeed/example/reference.py) checked against google.protobuf itself.

The differential tests trust the reference; this keeps the reference honest
on what protobuf implementations agree about: merging of split messages, map
keys (last wins), the oneof, packed and unpacked lists, unknown fields.  The
messages are built from descriptors here, so neither TensorFlow nor protoc is
needed; the module is skipped without the protobuf package.
"""

import os
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pb = pytest.importorskip("google.protobuf")
from google.protobuf.message import DecodeError as ProtobufDecodeError  # noqa: E402

import reference as ref  # noqa: E402
from bench.peers.example_proto import example_class  # noqa: E402
from test_properties import PROFILE, examples, same  # noqa: E402


Example = example_class()
KIND_OF_FIELD = {"bytes_list": "bytes", "float_list": "float", "int64_list": "int64"}


def protobuf_decode(record: bytes) -> dict:
    out = {}
    for name, f in Example.FromString(record).features.feature.items():
        which = f.WhichOneof("kind")
        if which is None:
            out[name] = (None, [])
        elif which == "bytes_list":
            out[name] = ("bytes", list(f.bytes_list.value))
        elif which == "float_list":
            out[name] = ("float", np.array(f.float_list.value, np.float32))
        else:
            out[name] = ("int64", np.array(f.int64_list.value, np.int64))
    return out


def same_up_to_nan_payloads(got: dict, want: dict) -> bool:
    """protobuf hands floats over as Python floats: a signalling NaN comes back quiet."""
    def quiet(d):
        return {k: (kind, np.where(np.isnan(v), np.float32("nan"), v).astype(np.float32) if kind == "float" else v)
                for k, (kind, v) in d.items()}
    return same(quiet(got), quiet(want))


@settings(PROFILE, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(examples(), st.randoms(use_true_random=False))
def test_alternative_encodings_mean_to_protobuf_what_they_mean_to_the_reference(example, rng):
    record = ref.encode(example, rng, p=0.4, prefix_bytes=5, entry_unknowns=False)
    assert same_up_to_nan_payloads(protobuf_decode(record), example)
    assert same(ref.decode_example(record, strict=True), example)


def test_protobuf_refuses_what_the_strict_reference_refuses():
    """On damaged records, the strict reference and protobuf agree except where implementations differ."""
    import test_fuzz

    rng = random.Random(12)
    seeds = [ref.encode(e, random.Random(rng.random()), p=0.4, prefix_bytes=5, entry_unknowns=False)
             for e in test_fuzz.SEED_EXAMPLES for _ in range(8)]
    checked = 0
    for _ in range(int(3000 * float(os.environ.get("INFEED_FUZZ_SCALE", "1")))):
        record = test_fuzz.mutate(rng, rng.choice(seeds))
        if _implementations_differ(record):
            continue
        try:
            got = protobuf_decode(record)
        except ProtobufDecodeError:
            got = None
        valid = ref.is_valid_protobuf(record)
        assert (got is not None) == valid, (record, got)
        if valid:
            assert same_up_to_nan_payloads(got, ref.decode_example(record, strict=True)), record
        checked += 1
    assert checked > 1000


def _implementations_differ(record: bytes) -> bool:
    """Records where C++/upb and Go protobuf disagree, or upb keeps a quirk of its own.

    Tags or lengths over 5 bytes, 10-byte varints with bits past 64, map
    entries holding unknown fields (upb moves the entry out of the map), and a
    tag of field number 0 inside a group (upb ends the group there).
    """
    differs = False
    in_group = 0

    def varint(buf, pos, end):
        nonlocal differs
        if end - pos >= 10 and all(b & 0x80 for b in buf[pos:pos + 9]) and 1 < buf[pos + 9] < 0x80:
            differs = True
        return orig_varint(buf, pos, end)

    def tag(buf, pos, end):
        nonlocal differs
        if in_group and pos < end and orig_varint(buf, pos, end)[0] >> 3 == 0:
            differs = True
        f, w, p = orig_tag(buf, pos, end)
        if p - pos > 5:
            differs = True
        return f, w, p

    def skip(buf, pos, end, wire):
        nonlocal differs
        if wire == 2 and orig_varint(buf, pos, end)[1] - pos > 5:
            differs = True
        return orig_skip(buf, pos, end, wire)

    def group(buf, pos, end, field):
        nonlocal in_group
        in_group += 1
        try:
            return orig_group(buf, pos, end, field)
        finally:
            in_group -= 1

    orig_varint, orig_tag, orig_skip, orig_walk = ref.read_varint, ref.read_tag, ref._skip_scalar, ref._walk
    orig_group = ref._skip_group

    def walk(record, strict):
        nonlocal differs
        for key, entry in orig_walk(record, strict):
            if any(not (f in (1, 2) and w == 2) for f, w, _ in ref.fields(record, *entry)):
                differs = True
            yield key, entry

    ref.read_varint, ref.read_tag, ref._skip_scalar, ref._walk, ref._skip_group = varint, tag, skip, walk, group
    try:
        ref.decode_example(record, strict=True)
    except ref.RefDecodeError:
        pass
    finally:
        ref.read_varint, ref.read_tag, ref._skip_scalar, ref._walk = orig_varint, orig_tag, orig_skip, orig_walk
        ref._skip_group = orig_group
    return differs
