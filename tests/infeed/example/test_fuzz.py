"""Bounded fuzzing in the normal suite: damaged records and files against the reference and the contracts.

Every loop is seeded, so a failure reproduces; the message shows the input
as a bytes literal.  ``INFEED_FUZZ_SCALE=10 pytest tests/infeed/example/test_fuzz.py``
runs ten times as many inputs.  The long-running harness is
tests/fuzz/fuzz_infeed.py (atheris).
"""

import io
import os
import random

import numpy as np
import pytest

import infeed
from infeed import Bytes, FixedLen, Padded, VarLen
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.index import RecordIndex, indexed_runs

import image_seeds
import reference as ref

SCALE = float(os.environ.get("INFEED_FUZZ_SCALE", "1"))


def n_cases(n: int) -> int:
    return max(1, int(n * SCALE))


# ---------------------------------------------------------------------------
# Seeds and mutations

SEED_EXAMPLES = [
    {},
    {"x": ("float", np.array([1.0, -0.0, np.inf, np.nan], np.float32))},
    {"label": ("int64", [-1, 0, 2**63 - 1, -(2**63), 300]), "id": ("bytes", [b"abc\0"])},
    {"tokens": ("int64", list(range(20))), "": (None, []), "é": ("bytes", [b"", b"\xff" * 5])},
    {"img": ("float", np.linspace(-1, 1, 12, dtype=np.float32)), "y": ("int64", [2**31]),
     "name": ("bytes", [b"hello"]), "empty": ("float", np.zeros(0, np.float32))},
    {"label": ("int64", [0, 255, 127, -128, 65535]), "tokens": ("int64", list(range(-10, 10))),
     "x": ("float", np.array([65520.0, 1 + 2**-8, 2**-25, 1e-40], np.float32))},
]

SPECS = [
    {"x": FixedLen((4,), "float32")},
    {"label": VarLen("int32", max_len=3, pad=-1), "id": Bytes(4, default=b"?")},
    {"tokens": VarLen("int64", max_len=8, truncate=True), "": FixedLen((0,), "float32"),
     "é": Bytes(8, truncate=True)},
    {"img": FixedLen((3, 4), "float32", default=0.5), "y": FixedLen((), "int64"),
     "name": Bytes(5), "empty": VarLen("float32", max_len=2)},
    {"label": FixedLen((5,), "int64"), "x": VarLen("float32", max_len=4, pad=np.nan)},
    {"x": FixedLen((4,), "bfloat16"), "label": VarLen("uint8", max_len=5, pad=255),
     "img": VarLen("float16", max_len=12, truncate=True), "tokens": FixedLen((20,), "int16", default=-1)},
    {"label": VarLen("int8", max_len=5, truncate=True), "y": FixedLen((), "uint16", default=9),
     "x": VarLen("float16", max_len=4, pad=-0.0), "tokens": VarLen("uint16", max_len=20)},
]

INTERESTING = [0x00, 0x01, 0x02, 0x04, 0x05, 0x08, 0x0A, 0x0B, 0x0C, 0x0D, 0x12, 0x1A, 0x1B, 0x1C,
               0x22, 0x7F, 0x80, 0x81, 0xFE, 0xFF]


def seed_records(rng: random.Random, n_alternatives: int = 6) -> list[bytes]:
    out = []
    for example in SEED_EXAMPLES:
        out.append(ref.encode(example))
        out.extend(ref.encode(example, random.Random(rng.random()), p=0.4) for _ in range(n_alternatives))
    return out


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to three random edits: bit flips, byte edits, truncations, insertions, deletions, copies."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(data))
        if op == 0 and data:                                   # flip one bit
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        elif op == 1 and data:                                 # set a byte to an interesting value
            data[rng.randrange(len(data))] = rng.choice(INTERESTING)
        elif op == 2 and data:                                 # set a byte to anything
            data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 3:                                          # truncate
            del data[pos:]
        elif op == 4:                                          # insert bytes
            data[pos:pos] = bytes(rng.choice(INTERESTING) for _ in range(rng.randint(1, 4))) \
                if rng.random() < 0.5 else rng.randbytes(rng.randint(1, 8))
        elif op == 5:                                          # delete a range
            del data[pos:pos + rng.randint(1, 8)]
        elif op == 6 and data:                                 # copy a range elsewhere
            a = rng.randrange(len(data))
            chunk = data[a:a + rng.randint(1, 16)]
            data[pos:pos] = chunk
        elif op == 7:                                          # lengthen a varint byte
            if pos < len(data) and data[pos] < 0x80:
                data[pos:pos + 1] = bytes([data[pos] | 0x80, 0x00])
    return bytes(data)


def random_record(rng: random.Random) -> bytes:
    n = rng.choice([rng.randint(0, 8), rng.randint(0, 64)])
    if rng.random() < 0.5:
        return rng.randbytes(n)
    return bytes(rng.choice(INTERESTING) if rng.random() < 0.7 else rng.randrange(256) for _ in range(n))


# ---------------------------------------------------------------------------
# Outcomes, compared with the reference


def decode_outcome(record):
    try:
        return infeed.decode_example(record)
    except infeed.DecodeError as e:
        assert len(str(e)) < 1024
        return e


def ref_decode_outcome(record):
    try:
        return ref.decode_example(record)
    except ref.RefDecodeError as e:
        return e


def same_decoded(got: dict, want: dict) -> bool:
    if got.keys() != want.keys():
        return False
    for name, (gk, gv) in got.items():
        wk, wv = want[name]
        if gk != wk:
            return False
        if gk in ("bytes", None):
            if gv != wv:
                return False
        elif gv.dtype != wv.dtype or gv.tobytes() != wv.tobytes():
            return False
    return True


def disagreement(record) -> str | None:
    """None when infeed's answer for ``record`` is right; else what is wrong.

    Right means: what the reference decodes, infeed decodes alike; what the
    reference refuses, infeed refuses, naming the same feature.  infeed may
    also refuse a record that only the reference's lazy validation lets
    through, when protobuf (``strict``) refuses it too.
    """
    got, want = decode_outcome(record), ref_decode_outcome(record)
    if isinstance(got, infeed.DecodeError):
        if not isinstance(want, ref.RefDecodeError):
            if not ref.is_valid_protobuf(record):
                return None
            return f"infeed raised {got}; the reference decodes {want!r}"
        if got.feature != want.feature:
            return f"infeed names {got.feature!r}, the reference {want.feature!r} ({got}; {want})"
        return None
    if isinstance(want, ref.RefDecodeError):
        return f"infeed decoded {got!r}; the reference raises {want}"
    if not same_decoded(got, want):
        return f"infeed decoded {got!r}, the reference {want!r}"
    return None


def shrink(data: bytes, failing) -> bytes:
    """A smaller input that still fails: greedy removal of byte runs (for readable reports)."""
    chunk = max(1, len(data) // 2)
    while chunk:
        i = 0
        while i < len(data):
            candidate = data[:i] + data[i + chunk:]
            if failing(candidate):
                data = candidate
            else:
                i += chunk
        chunk //= 2
    return data


def check_all(records) -> None:
    bad = [r for r in records if disagreement(r) is not None]
    if bad:
        small = sorted({shrink(r, lambda c: disagreement(c) is not None) for r in bad[:20]}, key=len)
        report = "\n".join(f"{r!r}: {disagreement(r)}" for r in small[:5])
        pytest.fail(f"{len(bad)} of {len(records)} records decode wrongly; shrunk examples:\n{report}")


def test_mutated_records_decode_like_the_reference():
    rng = random.Random(1)
    seeds = seed_records(rng)
    check_all([mutate(rng, rng.choice(seeds)) for _ in range(n_cases(12000))])


def test_random_bytes_decode_like_the_reference():
    rng = random.Random(2)
    check_all([random_record(rng) for _ in range(n_cases(12000))])


def test_records_valid_for_protobuf_decode_alike():
    """Where protobuf itself accepts a damaged record, infeed must accept it with the same values."""
    rng = random.Random(3)
    seeds = seed_records(rng)
    checked = 0
    for _ in range(n_cases(12000)):
        record = mutate(rng, rng.choice(seeds))
        if ref.is_valid_protobuf(record):
            checked += 1
            got = decode_outcome(record)
            assert isinstance(got, dict), f"{record!r}: protobuf parses it, infeed raised {got}"
            assert same_decoded(got, ref.decode_example(record, strict=True)), record
    assert checked > 100


# ---------------------------------------------------------------------------
# Spec-driven parsing of damaged batches, with canary rows around the batch

CANARY = 0x5A


def canary_out(parser, rows: int) -> dict:
    out = parser.allocate(rows)
    for arr in out.values():
        if isinstance(arr, Padded):
            arr.values.view(np.uint8)[...] = CANARY
            arr.lengths[...] = -7
        else:
            arr.view(np.uint8)[...] = CANARY
    return out


def assert_canaries_intact(out: dict, rows) -> None:
    for name, arr in out.items():
        values, lengths = (arr.values, arr.lengths) if isinstance(arr, Padded) else (arr, None)
        for r in rows:
            assert (values[r:r + 1].view(np.uint8) == CANARY).all(), f"{name!r}: canary row {r} overwritten"
            if lengths is not None:
                assert lengths[r] == -7, f"{name!r}: canary length {r} overwritten"


def ref_parse_outcome(records, spec, index_base, strict=False):
    try:
        return ref.parse(records, spec, index_base, strict)
    except ref.RefDecodeError as e:
        return e


def parse_and_compare(parser, spec, records, index_base, before=2, after=2):
    """Parses ``records`` between canary rows and checks infeed against the reference.

    Returns the DecodeError infeed raised, or None.  As for decode_example,
    infeed may refuse a batch the lazy reference decodes only when protobuf
    refuses it too.
    """
    out = canary_out(parser, before + len(records) + after)
    want = ref_parse_outcome(records, spec, index_base)
    try:
        parser.parse(records, out=out, start=before, index_base=index_base)
    except infeed.DecodeError as e:
        assert len(str(e)) < 1024
        if isinstance(want, ref.RefDecodeError):
            assert (e.feature, e.record_index) == (want.feature, want.record_index), \
                f"{records!r}: infeed says {e}; the reference {want}"
        else:
            assert isinstance(ref_parse_outcome(records, spec, index_base, strict=True), ref.RefDecodeError), \
                f"{records!r}: infeed raised {e}, the reference (even strict) decodes"
        got = e
    else:
        assert not isinstance(want, ref.RefDecodeError), f"{records!r}: the reference raises {want}"
        rows = slice(before, before + len(records))
        for name in spec:
            if isinstance(out[name], Padded):
                assert out[name].lengths[rows].tolist() == want[name][1].tolist(), (records, name)
                assert out[name].values[rows].tobytes() == want[name][0].tobytes(), (records, name)
            else:
                assert out[name][rows].tobytes() == want[name].tobytes(), (records, name)
        got = None
    assert_canaries_intact(out, [*range(before), *range(before + len(records), before + len(records) + after)])
    return got


def test_mutated_batches_parse_like_the_reference_and_spare_canary_rows():
    rng = random.Random(4)
    seeds = seed_records(rng, n_alternatives=3)
    parsers = [(spec, infeed.ExampleParser(spec)) for spec in SPECS]
    outcomes = {"ok": 0, "error": 0}
    for _ in range(n_cases(4000)):
        spec, parser = rng.choice(parsers)
        batch = [rng.choice(seeds) for _ in range(rng.randint(1, 4))]
        for _ in range(rng.randint(0, 2)):
            i = rng.randrange(len(batch))
            batch[i] = mutate(rng, batch[i]) if rng.random() < 0.9 else random_record(rng)
        err = parse_and_compare(parser, spec, batch, rng.randint(0, 1000), rng.randint(0, 2), rng.randint(0, 2))
        outcomes["error" if err else "ok"] += 1
    assert min(outcomes.values()) > 50, outcomes


# ---------------------------------------------------------------------------
# Crafted damage: varints, lengths, nesting


def ld(field: int, payload: bytes) -> bytes:
    return ref.varint(field << 3 | 2) + ref.varint(len(payload)) + payload


def example_of(*entries: bytes) -> bytes:
    return ld(1, b"".join(ld(1, e) for e in entries))


GOOD_ENTRY = ld(1, b"k") + ld(2, ld(3, ld(1, ref.varint(5))))
GOOD_EXAMPLE = example_of(GOOD_ENTRY)

CRAFTED = {
    # varints
    "tag of 11 bytes": b"\x80" * 10 + b"\x00",
    "tag varint cut short": b"\x80\x80",
    "value varint of 11 bytes": example_of(ld(1, b"k") + ld(2, ld(3, b"\x08" + b"\xff" * 10 + b"\x01"))),
    "10-byte varint past 64 bits": example_of(ld(1, b"k") + ld(2, ld(3, b"\x08" + b"\xff" * 9 + b"\x02"))),
    "packed varint cut short": example_of(ld(1, b"k") + ld(2, ld(3, ld(1, b"\x01\x80")))),
    "length varint of 11 bytes": b"\x0a" + b"\x80" * 10 + b"\x00",
    "tag above 32 bits": b"\x80\x80\x80\x80\x10\x00",
    "field number 0": b"\x00\x00",
    "field number 0 in an entry": example_of(b"\x02\x00" + GOOD_ENTRY),
    "wire type 6": b"\x0e",
    "wire type 7 in a list": example_of(ld(1, b"k") + ld(2, ld(3, b"\x0f"))),
    "end group without start": b"\x0c",
    "group never ended": b"\x0b\x08\x01",
    "group ended by another field": b"\x0b\x14",
    "nested group ended by another field": b"\x2b\x33\x3c\x2c",
    # lengths
    "length past the record": b"\x0a\x05\x0a\x01",
    "huge length": b"\x0a" + b"\xff" * 9 + b"\x01",
    "entry longer than its Features": ld(1, b"\x0a\x09" + GOOD_ENTRY[:5]) + GOOD_ENTRY,
    "Feature longer than its entry": example_of(ld(1, b"k") + b"\x12\x40" + ld(3, b"")),
    "list longer than its Feature": example_of(ld(1, b"k") + ld(2, b"\x1a\x10\x0a\x01\x01")),
    "packed run longer than its list": example_of(ld(1, b"k") + ld(2, ld(3, b"\x0a\x08\x01"))),
    "packed floats of 5 bytes": example_of(ld(1, b"k") + ld(2, ld(2, ld(1, b"\0" * 5)))),
    "fixed32 cut short": example_of(ld(1, b"k") + ld(2, ld(2, b"\x0d\x00\x00"))),
    "fixed64 cut short": b"\x09\x00\x00\x00",
    "bytes value past its list": example_of(ld(1, b"k") + ld(2, ld(1, b"\x0a\x09abc"))),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_damage_is_a_decode_error_everywhere(name):
    record = CRAFTED[name]
    with pytest.raises(ref.RefDecodeError):
        ref.decode_example(record)
    with pytest.raises(infeed.DecodeError) as info:
        infeed.decode_example(record)
    assert len(str(info.value)) < 1024
    with pytest.raises(infeed.DecodeError) as info:
        infeed.parse_examples([GOOD_EXAMPLE, record], {"k": VarLen("int64", max_len=4)})
    assert info.value.record_index == 1


def test_ten_byte_varints_at_the_edge_are_accepted():
    # 2**64 - 1 (ten bytes, the last one 0x01) and 0 written in ten bytes are valid
    record = example_of(ld(1, b"k") + ld(2, ld(3, b"\x08" + b"\xff" * 9 + b"\x01" + b"\x08" + b"\x80" * 9 + b"\x00")))
    assert infeed.decode_example(record)["k"][1].tolist() == [-1, 0]
    assert ref.decode_example(record)["k"][1].tolist() == [-1, 0]


def test_deep_but_bounded_group_nesting():
    depth = ref.MAX_GROUP_DEPTH
    ok = b"\x0b" * depth + b"\x0c" * depth
    assert infeed.decode_example(ok) == {} == ref.decode_example(ok)
    too_deep = b"\x0b" * (depth + 1) + b"\x0c" * (depth + 1)
    with pytest.raises(infeed.DecodeError):
        infeed.decode_example(too_deep)
    with pytest.raises(infeed.DecodeError):           # deep nesting never recurses in C: no stack overflow
        infeed.decode_example(b"\x0b" * 1_000_000)


def test_huge_invalid_utf8_key_gives_a_short_message():
    key = b"\xff" * (10 << 20)
    record = example_of(ld(1, key) + ld(2, b""))
    with pytest.raises(infeed.DecodeError) as info:
        infeed.decode_example(record)
    assert len(str(info.value)) < 1024, f"message of {len(str(info.value))} characters"


def test_huge_values_give_short_messages():
    big = b"\x01" * (10 << 20)
    record = ref.encode({"b": ("bytes", [big]), "i": ("int64", [7] * 100_000)})
    for spec in ({"b": Bytes(4)}, {"i": VarLen("int64", max_len=2)}, {"b": FixedLen((1,), "int64")},
                 {"i": FixedLen((3,), "int64")}):
        with pytest.raises(infeed.DecodeError) as info:
            infeed.parse_examples([record], spec)
        assert len(str(info.value)) < 1024


# ---------------------------------------------------------------------------
# TFRecord files


def frames_of(records):
    starts, pos = [], 0
    for r in records:
        starts.append((pos, pos + len(r) + 16))
        pos += len(r) + 16
    return starts


def read_all(data: bytes, skip: bool, buffer_size: int, size_known: bool = True):
    reader = _tfrecord.RecordReader(io.BytesIO(data), "<fuzz>", len(data) if size_known else -1, skip, buffer_size)
    got, err = [], None
    try:
        for r in reader:
            got.append(r)
    except infeed.CorruptRecordError as e:
        err = e
    return got, err, reader


def damage(rng, records):
    """One damage to the framed file: (what, damaged file, indices of intact frames, frames before the
    damage, whether any bytes are now not part of a good frame)."""
    data = b"".join(_tfrecord.frame(r) for r in records)
    spans = frames_of(records)
    op = rng.choice(["flip", "set", "truncate", "insert"])
    if op in ("flip", "set"):
        p = rng.randrange(len(data))
        new = data[p] ^ (1 << rng.randrange(8)) if op == "flip" else rng.choice([b for b in range(256) if b != data[p]])
        mutated = data[:p] + bytes([new]) + data[p + 1:]
        intact = [i for i, (s, e) in enumerate(spans) if not s <= p < e]
        garbage = True
    elif op == "truncate":
        p = rng.randrange(len(data))
        mutated = data[:p]
        intact = [i for i, (s, e) in enumerate(spans) if e <= p]
        garbage = p not in [s for s, _ in spans]
    else:
        p = rng.choice([rng.randint(0, len(data)), rng.choice(spans)[0]])
        mutated = data[:p] + rng.randbytes(rng.randint(1, 20)) + data[p:]
        intact = [i for i, (s, e) in enumerate(spans) if p <= s or p >= e]
        garbage = True
    before = sum(1 for _, e in spans if e <= p)
    return op, mutated, intact, before, garbage


def test_damaged_tfrecord_files_fail_at_the_damage_or_skip_exactly_it():
    rng = random.Random(6)
    for _ in range(n_cases(1500)):
        records = [rng.randbytes(rng.choice([0, 1, 5, 40, 200, 700])) for _ in range(rng.randint(1, 6))]
        op, data, intact, before, garbage = damage(rng, records)
        buffer_size = rng.choice([64, 65, 100, 333, 1 << 16])
        size_known = rng.random() < 0.7
        where = f"{op} of {records!r} -> {data!r} (buffer {buffer_size}, size known {size_known})"

        got, err, _ = read_all(data, False, buffer_size, size_known)
        assert got == records[:before], where
        if garbage:
            assert err is not None, where
            assert err.record_index == len(got) and err.offset == sum(len(r) + 16 for r in got), (where, err)
            assert err.kind in infeed.errors.CORRUPTION_KINDS, err.kind
        else:
            assert err is None, where

        got, err, reader = read_all(data, True, buffer_size, size_known)
        assert err is None, (where, err)
        assert got == [records[i] for i in intact], where
        assert reader.skipped_regions == (1 if garbage else 0), where
        assert reader.skipped_bytes + sum(len(r) + 16 for r in got) == len(data), where


def test_randomly_mutated_tfrecord_files_only_raise_corrupt_record_error(tmp_path):
    rng = random.Random(7)
    path = tmp_path / "mutated.tfrecord"
    for _ in range(n_cases(1000)):
        records = [rng.randbytes(rng.choice([0, 3, 50, 300])) for _ in range(rng.randint(0, 5))]
        data = mutate(rng, b"".join(_tfrecord.frame(r) for r in records))
        buffer_size = rng.choice([64, 100, 4096])
        # skip_corrupt: every byte is in a yielded frame or counted as skipped
        kept, err, reader = read_all(data, True, buffer_size, rng.random() < 0.5)
        assert err is None, (data, err)
        assert _is_subsequence(kept, records) or _all_frames_of(data, kept), data
        assert reader.skipped_bytes + sum(len(r) + 16 for r in kept) == len(data), data
        # without it: the same records up to the first damage, then the error, naming that record
        got, err, _ = read_all(data, False, buffer_size, rng.random() < 0.5)
        assert got == kept[:len(got)], data
        if err is not None:
            assert err.record_index == len(got), (data, err)
            assert err.offset == sum(len(r) + 16 for r in got), (data, err)
        else:
            assert got == kept, data
        # (a copied whole frame is damage no reader can see; test_damaged_tfrecord_files_... checks
        # that detectable damage stops the reader exactly there)
        # the same file through read_records, the extension sniffed: still only CorruptRecordError
        path.write_bytes(data)
        got = []
        try:
            for r in infeed.read_records(path, compression="auto", buffer_size=buffer_size):
                got.append(r)
        except infeed.CorruptRecordError as e:
            assert e.record_index == len(got) and e.path == str(path)
        assert got == kept[:len(got)], data


def test_mutated_files_read_through_a_clean_index_give_the_indexed_records_or_a_named_error():
    """What a worker decodes where records lie in its reads (``IndexedFrames``): an index built before the file
    was damaged, or before a read was cut short, gives exactly the indexed records up to the first one that
    differs, which raises CorruptRecordError or SourceChangedError naming it, never another record."""
    rng = random.Random(11)
    parser = infeed.ExampleParser({"x": Bytes(max_bytes=400, default=b"")})
    for _ in range(n_cases(400)):
        values = [rng.randbytes(rng.choice([0, 3, 50, 300])) for _ in range(rng.randint(1, 5))]
        records = [infeed.encode_example({"x": v}) for v in values]
        clean = b"".join(_tfrecord.frame(r) for r in records)
        lengths = np.array([len(r) for r in records], np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths + 16)[:-1]]).astype(np.int64)
        crcs = np.array([_tfrecord.masked_crc32c(r) for r in records], np.uint32)
        index = RecordIndex("f", len(clean), offsets, lengths, crcs if rng.random() < 0.7 else None)
        data = mutate(rng, clean)
        wanted = rng.sample(range(len(records)), rng.randint(1, len(records)))     # the rows' records, in order
        runs = indexed_runs([index].__getitem__, [0] * len(wanted), wanted, max_joined=rng.choice([1, 64, 1 << 20]))
        frames = _tfrecord.IndexedFrames(runs, [data[run.base:run.base + run.size] for run in runs], ["f"])
        out = parser.allocate(len(wanted))
        try:
            count, _ = parser.read_into(frames, len(wanted), out)
            assert count == len(wanted), (data, wanted)
        except (infeed.CorruptRecordError, infeed.SourceChangedError) as e:
            count, k = frames.records_read, wanted[frames.records_read]
            assert (e.path, e.record_index, e.offset) == ("f", k, offsets[k]), (data, wanted, e)
        except infeed.DecodeError:              # a frame whose CRCs verify, of another record (no CRCs indexed)
            assert index.data_crcs is None, (data, wanted)
            count = 0
        if index.data_crcs is not None:        # every row decoded is its indexed record's
            for row in range(count):
                got = bytes(out["x"].values[row, :out["x"].lengths[row]])
                assert got == values[wanted[row]], (data, wanted, row)


def _is_subsequence(items, of):
    it = iter(of)
    return all(any(x == y for y in it) for x in items)


def _all_frames_of(data, got):
    """A copy mutation can duplicate a whole frame: then each yielded record is one really in the file."""
    return all(_tfrecord.frame(r) in data for r in got)


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_damaged_compressed_files_only_raise_corrupt_record_error(tmp_path, compression):
    rng = random.Random(8)
    path = tmp_path / "damaged.tfrecord"
    for _ in range(n_cases(300)):
        records = [rng.randbytes(rng.choice([0, 3, 50, 300])) for _ in range(rng.randint(1, 5))]
        with infeed.TFRecordWriter(path, compression=compression) as w:
            for r in records:
                w.write(r)
        path.write_bytes(mutate(rng, path.read_bytes()))
        for skip in (False, True):
            got = []
            try:
                for r in infeed.read_records(path, compression=compression, skip_corrupt=skip,
                                             buffer_size=rng.choice([64, 100, 4096])):
                    got.append(r)
            except infeed.CorruptRecordError as e:
                assert e.record_index == len(got) or skip, e
            if not skip:
                assert got == records[:len(got)], path.read_bytes()
            else:
                # deflate back-references can repeat a frame from garbled output: only membership holds
                assert all(r in records for r in got), path.read_bytes()


def test_a_bit_flip_inside_a_deflate_stream_is_reported(tmp_path):
    path = tmp_path / "flip.tfrecord.gz"
    records = [bytes(range(256)) * 4 for _ in range(20)]
    with infeed.TFRecordWriter(path, compression="GZIP") as w:
        for r in records:
            w.write(r)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(infeed.CorruptRecordError) as info:
        list(infeed.read_records(path))
    assert info.value.kind in ("compressed_stream", "data_crc", "length_crc", "truncated_data",
                               "truncated_header", "length_exceeds_file")


# ---------------------------------------------------------------------------
# Images

IMAGE_SPECS = [
    infeed.Image(size=(16, 16)),
    infeed.Image(size=(8, 12), resize="random_resized_crop", flip=True, dtype="bfloat16", mean=127, std=64),
    infeed.Image(size=(10, 10), resize="pad", channels=1, dtype="uint16"),
    infeed.Image(size=(12, 17), resize=None, channels=4, dtype="int8", mean=128, max_pixels=1 << 16),
]


def test_mutated_images_decode_to_the_spec_or_raise_a_decode_error_naming_the_feature():
    """Each seed image, damaged, through every spec: the spec's shape, or a DecodeError; nothing else, no hang."""
    rng = random.Random(7)
    seeds = image_seeds.seed_images()
    parsers = [infeed.ExampleParser({"image": spec, "id": FixedLen((), "int64")}) for spec in IMAGE_SPECS]
    outcomes = {"decoded": 0, "DecodeError": 0}
    for case in range(n_cases(300)):
        data = mutate(rng, rng.choice(seeds)) if case % 10 else rng.randbytes(rng.randint(0, 64))
        records = [infeed.encode_example({"image/encoded": seeds[0], "id": 0}),
                   infeed.encode_example({"image/encoded": data, "id": 1})]
        for parser in parsers:
            try:
                out = parser.parse(records)
            except infeed.DecodeError as e:
                assert (e.feature, e.record_index) == ("image/encoded", 1), (str(e), data)
                assert len(str(e)) < 1024
                outcomes["DecodeError"] += 1
                continue
            assert out["image"].shape[1:] == parser.spec["image"].shape and out["id"].tolist() == [0, 1], data
            outcomes["decoded"] += 1
    assert outcomes["decoded"] and outcomes["DecodeError"]
