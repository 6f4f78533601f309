"""pytest-benchmark figures for infeed's hot kernels: CRC32C, Example parsing, record reading.

    pytest tests/benchmarks --benchmark-only -p no:cacheprovider -o addopts=""

In the normal test run (``--benchmark-disable``) each runs once, as a test of
its result; nothing here asserts on time.
"""

import collections
import os

import numpy as np
import pytest

import infeed
from bench import datasets
from infeed import _tfrecord

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
