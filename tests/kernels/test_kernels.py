"""pytest-benchmark figures for infeed's hot kernels: CRC32C, Example parsing (whole batches, and packed
int64 varints and floats alone), record reading, and a ring slot's hand-off.

    pytest tests/kernels --benchmark-only

In the normal test run (benchmarking off: see tests/conftest.py) each runs once, as a test of
its result; nothing here asserts on time.
"""

import collections
import os

import numpy as np
import pytest

import infeed
from bench.data import datasets
from infeed.tfrecord import _tfrecord

MIB = os.urandom(1 << 20)
BATCH = 128


@pytest.fixture(scope="module")
def batches():
    """128 serialized records of each layout, with a reused parser and output."""
    out = {}
    for name in ("mnist", "criteo"):
        layout = datasets.LAYOUTS[name]
        parser = infeed.ExampleParser(layout.spec())
        out[name] = (datasets.make_records(layout, BATCH, seed=1), parser, parser.allocate(BATCH))
    return out


def test_crc32c_hardware_1mib(benchmark):
    if _tfrecord.crc32c_implementation() == "table":
        pytest.skip("no CRC32C instruction on this CPU")
    benchmark.extra_info["implementation"] = _tfrecord.crc32c_implementation()
    assert benchmark(_tfrecord.crc32c, MIB) == _tfrecord.crc32c_table(MIB)


def test_crc32c_table_1mib(benchmark):
    assert benchmark(_tfrecord.crc32c_table, MIB) == _tfrecord.crc32c(MIB)


@pytest.mark.parametrize("layout", ["mnist", "criteo"])
def test_parse_batch_of_128(benchmark, batches, layout):
    records, parser, out = batches[layout]
    benchmark.extra_info["records"] = len(records)
    got = benchmark(parser.parse, records, out=out)
    assert got is out
    want = infeed.parse_examples(records, parser.spec)
    for name in parser.spec:
        np.testing.assert_array_equal(got[name], want[name])


def test_read_records_small_file(benchmark, tmp_path):
    ds = datasets.write_dataset(datasets.LAYOUTS["mnist"], tmp_path / "mnist.tfrecord", records=256, seed=1)
    benchmark.extra_info.update(records=ds.records, bytes=ds.nbytes)

    def read_all():
        with infeed.read_records(ds.path) as reader:
            collections.deque(reader, maxlen=0)
            return reader.records_read

    assert benchmark(read_all) == ds.records


#: Values per record of the one-feature batches below: long packed lists, so that the kernel is what is timed.
VALUES = 1024


@pytest.fixture(scope="module")
def packed_batches():
    """128 records of one packed feature each: int64 varints (of 1 to 10 bytes) and floats."""
    rng = np.random.default_rng(2)
    ints = (rng.integers(0, 2**62, (BATCH, VALUES)) >> rng.integers(0, 62, (BATCH, VALUES))).astype(np.int64)
    ints[:, ::7] *= -1                      # negative int64s: 10-byte varints
    floats = rng.standard_normal((BATCH, VALUES)).astype(np.float32)
    out = {}
    for name, values, dtype in (("varint", ints, "int64"), ("float", floats, "float32")):
        spec = {"x": infeed.FixedLen((VALUES,), dtype)}
        parser = infeed.ExampleParser(spec)
        records = [infeed.encode_example({"x": row}) for row in values]
        out[name] = records, parser, parser.allocate(BATCH), values
    return out


@pytest.mark.parametrize("kind", ["varint", "float"])
def test_packed_decode_128_records_of_1024_values(benchmark, packed_batches, kind):
    """The inner loops of Example parsing: packed int64 varints (mixed lengths, negatives) and packed floats."""
    records, parser, out, values = packed_batches[kind]
    benchmark.extra_info.update(values=BATCH * VALUES, bytes=sum(map(len, records)))
    got = benchmark(parser.parse, records, out=out)
    np.testing.assert_array_equal(got["x"], values)


def test_slot_hand_off_round_trip(benchmark):
    """One slot through the ring's protocol in one process: producer acquire + publish, consumer acquire +
    release (two process-shared semaphore posts and waits: what a batch's hand-off costs, without a copy)."""
    with infeed.Ring.create({"x": ((BATCH, 784), np.float32)}, slots=2, lock_memory=False) as ring:
        seq = iter(range(1 << 62))

        def hand_off() -> int:
            n = next(seq)
            ring.acquire_free(0, timeout=5)
            ring.publish(0, n)
            got = ring.acquire_filled(0, timeout=5)
            ring.release(0)
            return got - n

        assert benchmark(hand_off) == 0
        assert ring.slot_state(0)[0] == "free"
