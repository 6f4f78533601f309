"""Coverage-guided fuzzing of infeed's decoder, spec parser and TFRecord reader, with atheris.

Not collected by pytest (no ``test_`` prefix); the bounded fuzzing that runs in
the normal suite is tests/infeed/example/test_fuzz.py.  Run from the project root,
with the extensions built::

    pip install atheris
    python tests/fuzz/fuzz_infeed.py -max_total_time=60
    python tests/fuzz/fuzz_infeed.py --seed-corpus=/tmp/infeed-corpus -max_total_time=600
    python tests/fuzz/fuzz_infeed.py -fork=2 -ignore_crashes=1 -max_total_time=600   # 2 processes, every crash
    python tests/fuzz/fuzz_infeed.py crash-<hash>          # replay one input

``--seed-corpus=DIR`` writes valid encodings (the reference encoder's
alternative forms, framed files, tests/infeed/example/image_seeds.py's images
through every image spec) into DIR, each that DIR lacks (they are named by
their content's hash: a corpus grown before gets the seeds added since), and
fuzzes with DIR as the corpus, which libFuzzer grows.  Every other argument
goes to libFuzzer.

The first byte of an input picks the target, the second a parameter (spec,
buffer size, skip_corrupt), the rest is the payload:

* 0: ``infeed.decode_example`` against the pure-Python reference
  (tests/infeed/example/reference.py), which atheris instruments: its coverage steers
  the fuzzer through the wire format, the Cython code being opaque to it.
* 1: ``ExampleParser.parse`` with one of a few specs, the payload between good
  records and canary rows, against the reference parser.
* 2: ``RecordReader`` over the payload as an uncompressed stream, skip off and on.
* 3: the same through the GZIP/ZLIB decompressor.
* 4: an ``infeed.Image`` feature (one of a few specs) decoding the payload as its encoded image.

A crash is any exception other than the ones documented (DecodeError,
CorruptRecordError), a disagreement with the reference, a canary row
overwritten, an over-long message, or a crash of the process.

libFuzzer writes each crashing input to ./crash-<sha1> and, unless run with
-fork=N -ignore_crashes=1, stops at the first.
"""

import hashlib
import io
import logging
import os
import random
import sys

try:
    import atheris
except ImportError:
    sys.exit("tests/fuzz/fuzz_infeed.py needs atheris: pip install atheris "
             "(a manylinux wheel for CPython 3.8-3.11; elsewhere it builds with clang and libFuzzer)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "infeed", "example"))

with atheris.instrument_imports(include=["reference", "infeed"]):
    import numpy as np

    import image_seeds
    import infeed
    import reference as ref
    from infeed import Bytes, FixedLen, Padded, VarLen
    from infeed.tfrecord import _tfrecord
    from infeed.tfrecord.reader import _Decompressing

SPECS = [
    {"k": VarLen("int64", max_len=4)},
    {"x": FixedLen((2,), "float32", default=0.0), "k": Bytes(4, truncate=True)},
    {"k": FixedLen((), "int32"), "": VarLen("float32", max_len=3, pad=-1.0), "id": Bytes(8, default=b"-")},
    {"a": VarLen("int32", max_len=2, truncate=True), "b": FixedLen((3,), "int64", default=7)},
    {"k": VarLen("uint8", max_len=3, pad=255), "x": FixedLen((2,), "bfloat16", default=-0.5),
     "b": FixedLen((3,), "int16", default=-1)},
    {"a": VarLen("int8", max_len=2), "x": VarLen("float16", max_len=3), "k": FixedLen((), "uint16", default=1)},
]
PARSERS = [infeed.ExampleParser(s) for s in SPECS]
logging.getLogger("infeed").setLevel(logging.ERROR)        # skip_corrupt warns once per damaged region
def _check_message(e, payload):
    if len(str(e)) >= 1024:
        _fail(f"DecodeError message of {len(str(e))} characters", payload)
GOOD = ref.encode({"k": ("int64", [1]), "x": ("float", np.ones(2, np.float32)), "a": ("int64", [2])})
CANARY = 0x5A


def _fail(what, payload):
    raise AssertionError(f"{what}\ninput: {payload!r:.2000}")


def fuzz_decode(payload):
    try:
        got = infeed.decode_example(payload)
    except infeed.DecodeError as e:
        got = e
        _check_message(e, payload)
    try:
        want = ref.decode_example(payload)
    except ref.RefDecodeError as e:
        want = e
    if isinstance(got, infeed.DecodeError):
        if isinstance(want, ref.RefDecodeError):
            if got.feature != want.feature:
                _fail(f"infeed names feature {got.feature!r}, the reference {want.feature!r}", payload)
        elif ref.is_valid_protobuf(payload):
            _fail(f"infeed raised {got}; the record is valid", payload)
        return
    if isinstance(want, ref.RefDecodeError):
        _fail(f"infeed decoded {got!r:.300}; the reference raises {want}", payload)
    if got.keys() != want.keys():
        _fail(f"keys differ: {list(got)!r:.300} vs {list(want)!r:.300}", payload)
    for name, (kind, values) in got.items():
        wkind, wvalues = want[name]
        same = kind == wkind and (values == wvalues if kind in ("bytes", None)
                                  else values.dtype == wvalues.dtype and values.tobytes() == wvalues.tobytes())
        if not same:
            _fail(f"feature {name!r}: infeed {kind} {values!r:.200}, reference {wkind} {wvalues!r:.200}", payload)


def fuzz_parse(param, payload):
    spec, parser = SPECS[param % len(SPECS)], PARSERS[param % len(PARSERS)]
    records = [GOOD, payload] if param & 4 else [payload]
    before, after = 1 + (param >> 3 & 1), 1 + (param >> 4 & 1)
    out = parser.allocate(before + len(records) + after)
    for arr in out.values():
        (arr.values if isinstance(arr, Padded) else arr).view(np.uint8)[...] = CANARY
        if isinstance(arr, Padded):
            arr.lengths[...] = -7
    try:
        want = ref.parse(records, spec, index_base=5)
    except ref.RefDecodeError as e:
        want = e
    try:
        parser.parse(records, out=out, start=before, index_base=5)
    except infeed.DecodeError as e:
        _check_message(e, payload)
        if isinstance(want, ref.RefDecodeError):
            if (e.feature, e.record_index) != (want.feature, want.record_index):
                _fail(f"infeed: {e}; reference: {want}", payload)
        else:
            try:
                ref.parse(records, spec, index_base=5, strict=True)
                _fail(f"infeed raised {e}; the reference decodes the batch", payload)
            except ref.RefDecodeError:
                pass
    else:
        if isinstance(want, ref.RefDecodeError):
            _fail(f"infeed decoded the batch; the reference raises {want}", payload)
        rows = slice(before, before + len(records))
        for name in spec:
            got = out[name]
            g = (got.values[rows], got.lengths[rows]) if isinstance(got, Padded) else (got[rows],)
            w = want[name] if isinstance(want[name], tuple) else (want[name],)
            if any(a.tobytes() != b.tobytes() for a, b in zip(g, w)):
                _fail(f"feature {name!r}: infeed {g!r:.300}, reference {w!r:.300}", payload)
    canaries = [*range(before), *range(before + len(records), before + len(records) + after)]
    for name, arr in out.items():
        values = arr.values if isinstance(arr, Padded) else arr
        for r in canaries:
            if not (values[r:r + 1].view(np.uint8) == CANARY).all() or (
                    isinstance(arr, Padded) and arr.lengths[r] != -7):
                _fail(f"canary row {r} of {name!r} overwritten", payload)


def fuzz_reader(param, payload, compression=None):
    buffer_size = (64, 65, 100, 4096)[param & 3]
    for skip in (False, True):
        if compression:
            source = _Decompressing(io.BytesIO(payload), compression, "<fuzz>", 64 + (param >> 2 & 7) * 50)
            size = -1
        else:
            source, size = io.BytesIO(payload), (len(payload) if param & 4 else -1)
        reader = _tfrecord.RecordReader(source, "<fuzz>", size, skip, buffer_size)
        got = []
        try:
            for r in reader:
                got.append(r)
        except infeed.CorruptRecordError as e:
            if e.record_index != len(got) and not skip:
                _fail(f"error names record {e.record_index} after {len(got)} good ones", payload)
            if skip and not compression:
                _fail(f"skip_corrupt raised {e}", payload)
        if not compression:
            framed = sum(len(r) + 16 for r in got)
            if skip and reader.skipped_bytes + framed != len(payload):
                _fail(f"skipped {reader.skipped_bytes} + framed {framed} != {len(payload)} bytes", payload)
            for r in got:
                if _tfrecord.frame(r) not in payload:
                    _fail(f"yielded a record that is not framed in the input: {r!r:.100}", payload)


IMAGE_SPECS = [
    infeed.Image(size=(16, 16)),
    infeed.Image(size=(8, 12), resize="random_resized_crop", flip=True, dtype="bfloat16", mean=127, std=64),
    infeed.Image(size=(10, 10), resize="pad", channels=1, dtype="uint16"),
    infeed.Image(size=(16, 16), resize=None, channels=4, dtype="int8", mean=128, max_pixels=1 << 16),
    # The JPEG crop window (_jpeg.pyx over _jpeg_window.c) on image_seeds' larger photos (33x47 to 96x130):
    # random crops of a few pixels, inside one iMCU, thin (aspect 1/8 to 8) or not...
    infeed.Image(size=(4, 4), resize="random_resized_crop", area=(0.0005, 0.01), aspect=(1 / 8, 8), channels=4,
                 flip=True),
    infeed.Image(size=(12, 6), resize="random_resized_crop", area=(0.002, 0.05), channels=1, dtype="float32",
                 mean=100, std=50, fast_dct=False, antialias=True),
    # ... centre crops at each DCT scale (on the 96x130 photo: 1/1, 1/2, 1/4, 1/8), accurate and fast IDCT,
    # 1, 3 and 4 channels ...
    infeed.Image(size=(64, 64), fast_dct=False),
    infeed.Image(size=(24, 24), channels=1, antialias=True),
    infeed.Image(size=(12, 20), channels=4, dtype="float16", mean=(120, 110, 100, 255), std=60),
    infeed.Image(size=(6, 6), channels=1, dtype="int16", mean=128, fast_dct=False),
    # ... a small central window (rows skipped above it, iMCU columns cropped on both sides) ...
    infeed.Image(size=(8, 8), central_fraction=0.25, channels=4, flip=True, max_pixels=1 << 20),
    # ... the whole image fitted into a padded row at 1/4 and without DCT scaling.
    infeed.Image(size=(20, 40), resize="pad", channels=4, dtype="float32", antialias=True, fast_dct=False),
    infeed.Image(size=(10, 14), dct_scaling=False, antialias=True, max_pixels=1 << 20),
]
IMAGE_PARSERS = [infeed.ExampleParser({"image": spec}) for spec in IMAGE_SPECS]


def fuzz_image(param, payload):
    """Any bytes as an encoded image: decoded to the spec's shape, or a DecodeError naming the feature."""
    parser = IMAGE_PARSERS[param % len(IMAGE_PARSERS)]
    try:
        out = parser.parse([infeed.encode_example({"image/encoded": payload})], ids=[(param, 0, 1)])
    except infeed.DecodeError as e:
        if e.feature != "image/encoded" or e.record_index != 0:
            _fail(f"DecodeError names the wrong feature or record: {e}", payload)
        _check_message(e, payload)
        return
    if out["image"].shape[1:] != parser.spec["image"].shape:
        _fail(f"decoded to shape {out['image'].shape}", payload)


def TestOneInput(data: bytes):
    if len(data) < 2:
        return
    target, param, payload = data[0] % 5, data[1], data[2:]
    if target == 4:
        fuzz_image(param, payload)
        return
    if target == 0:
        fuzz_decode(payload)
    elif target == 1:
        fuzz_parse(param, payload)
    elif target == 2:
        fuzz_reader(param, payload)
    else:
        fuzz_reader(param, payload, "GZIP" if param & 0x80 else "ZLIB")


def write_seeds(directory: str) -> None:
    """Valid inputs for every target: canonical and alternative encodings, framed files."""
    import gzip
    import zlib

    os.makedirs(directory, exist_ok=True)
    rng = random.Random(0)
    examples = [
        {},
        {"k": ("int64", [1, -1, 2**63 - 1]), "x": ("float", np.array([0.5, np.nan], np.float32))},
        {"k": ("bytes", [b"abc", b""]), "id": ("bytes", [b"\0"]), "": (None, [])},
        {"a": ("int64", [2**31, 3]), "b": ("int64", [1, 2, 3]), "x": ("float", np.zeros(2, np.float32))},
    ]
    seeds = []
    for example in examples:
        records = [ref.encode(example)] + [ref.encode(example, random.Random(rng.random())) for _ in range(4)]
        for i, r in enumerate(records):
            seeds.append(bytes([0, 0]) + r)
            seeds.append(bytes([1, i]) + r)
        framed = b"".join(_tfrecord.frame(r) for r in records)
        seeds.append(bytes([2, 4]) + framed)
        seeds.append(bytes([3, 0x80]) + gzip.compress(framed))
        seeds.append(bytes([3, 0]) + zlib.compress(framed))
    for image in image_seeds.seed_images():            # each image through every spec
        seeds.extend(bytes([4, k]) + image for k in range(len(IMAGE_SPECS)))
    for s in seeds:                                     # named by content: a corpus made before gets only the new
        path = os.path.join(directory, f"seed-{hashlib.sha1(s).hexdigest()[:16]}")
        if not os.path.exists(path):
            with open(path, "wb") as f:
                f.write(s)


def main():
    # libFuzzer's -fork and -jobs modes run argv[0] through the shell: make it "python script"
    argv = [f"{sys.executable} {os.path.abspath(sys.argv[0])}"]
    for arg in sys.argv[1:]:
        if arg.startswith("--seed-corpus="):
            directory = arg.split("=", 1)[1]
            write_seeds(directory)
            argv.append(directory)
        else:
            argv.append(arg)
    atheris.Setup(argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
