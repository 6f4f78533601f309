"""The readers' process-wide stage counters (what a worker reports per stage to the ring)."""

import os

import numpy as np
import pytest

import infeed
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.reader import open_random_access
from tfrecord_files import write_records


@pytest.fixture(autouse=True)
def zeroed():
    _tfrecord.reset_stage_counters()
    yield
    _tfrecord.reset_stage_counters()


def test_reading_counts_bytes_crc_and_time(tmp_path):
    records = [os.urandom(n) for n in (10, 3000, 40000)] * 20        # small and timed-in-full records
    path = write_records(str(tmp_path / "a.tfrecord"), records)
    assert list(infeed.read_records(path)) == records
    c = _tfrecord.stage_counters()
    assert c["read_bytes"] == os.path.getsize(path)
    assert c["crc_bytes"] == sum(map(len, records))
    assert c["read_ns"] > 0 and c["crc_ns"] > 0
    assert c["inflate_ns"] == 0 and c["compressed_bytes"] == 0


def test_skipping_checks_no_data_crc(tmp_path):
    path = write_records(str(tmp_path / "a.tfrecord"), [b"x" * 100] * 10)
    with infeed.read_records(path) as reader:
        assert reader.skip(10) == 10
    c = _tfrecord.stage_counters()
    assert c["read_bytes"] == os.path.getsize(path) and c["crc_bytes"] == 0


def test_compressed_streams_count_inflating(tmp_path):
    records = [os.urandom(100) + b"\0" * 2000 for _ in range(50)]
    path = write_records(str(tmp_path / "a.tfrecord.gz"), records, compression="GZIP")
    assert list(infeed.read_records(path)) == records
    c = _tfrecord.stage_counters()
    assert c["compressed_bytes"] == os.path.getsize(path)
    assert c["read_bytes"] == sum(len(r) + 16 for r in records)          # inflated
    assert 0 < c["inflate_ns"] <= c["read_ns"]


def test_reads_at_offsets_count_their_crc(tmp_path):
    path = write_records(str(tmp_path / "a.tfrecord"), [b"abc" * 10])
    f = open_random_access(path)
    try:
        frame = f.read_at(0, 46)
    finally:
        f.close()
    assert _tfrecord.unframe_run(frame, path, 0, 0, np.array([0]), np.array([30])) == [b"abc" * 10]
    assert _tfrecord.stage_counters()["crc_bytes"] == 30


def test_counts_added_from_outside_a_reader():
    _tfrecord.count_read(1000, 50)
    _tfrecord.count_inflate(400, 20)
    c = _tfrecord.stage_counters()
    assert (c["read_ns"], c["read_bytes"], c["inflate_ns"], c["compressed_bytes"]) == (1000, 50, 400, 20)


def test_crc_time_of_unsampled_records_is_estimated_per_byte(tmp_path):
    path = write_records(str(tmp_path / "a.tfrecord"), [b"y" * 200] * 64)       # every 16th timed
    list(infeed.read_records(path))
    c = _tfrecord.stage_counters()
    assert c["crc_bytes"] == 64 * 200 and c["crc_ns"] > 0
