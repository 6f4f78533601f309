"""How an indexed worker reads ahead: the units it takes at a time (runs read with one request, only from a store and
in file order), the depth it keeps from what it measured (bandwidth x latency, within its bounds), and a daemon
over a bucket through its indexes giving the batches streaming gives, each record read once."""

import os

import pyarrow.fs as pafs
import pytest

from infeed import Daemon, Dataset, FixedLen
from infeed.daemon import read_ahead
from infeed.daemon.read_ahead import MAX_READ_AHEAD_BYTES, ReadAhead, units_per_take
from infeed.ring.layout import MAX_CLAIMS
from infeed.tfrecord.filesystems import registered_filesystems, register_filesystem, unregister_filesystem
from infeed.tfrecord.index_build import build_indexes
from infeed.tfrecord.reader import READ_AHEAD_BYTES
from tfrecord_files import write_example_shards

SPEC = {"id": FixedLen((), "int64")}
MS = 1_000_000


def local_tree(root):
    """A factory for register_filesystem: bucket/key under the folder ``root``."""
    return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())


@pytest.fixture
def bucket(tmp_path):
    """s3://rh-bucket/ (the daemon's workers open it too) over tmp_path/rh-bucket, holding 3 files of 60 records
    (ids 100 * file + record); registered for the test only."""
    before = {entry["prefix"] for entry in registered_filesystems()}
    register_filesystem("s3://rh-bucket", factory=f"{__name__}:local_tree", root=str(tmp_path))
    write_example_shards(tmp_path / "rh-bucket", [f"part-{s}.tfrecord" for s in range(3)],
                         lambda s: ({"id": [100 * s + i], "pad": b"p" * (i % 5)} for i in range(60)))
    yield [f"s3://rh-bucket/part-{s}.tfrecord" for s in range(3)]
    for entry in registered_filesystems():
        if entry["prefix"] not in before:
            unregister_filesystem(entry["prefix"])


def _run(ds, workers, slots=4):
    with Daemon(ds, num_workers=workers, slots=slots, lock_memory=False, timeout=60) as feed:
        ids = [i for batch in feed for i in batch["id"].tolist()]
        return ids, feed.stats()


# --- runs of units --------------------------------------------------------------------------------

def test_runs_of_units_only_from_a_store_in_file_order_each_about_one_request(bucket, tmp_path, monkeypatch):
    indexes_dir = tmp_path / "indexes"
    build_indexes(bucket, str(indexes_dir))
    ds = Dataset(bucket, SPEC, batch_size=4, index_dir=indexes_dir, build_indexes=False)
    indexes = ds.indexes()
    unit_bytes = sum(int(ix.lengths.sum()) for ix in indexes.values()) // 180 * 4
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", 5 * unit_bytes)     # a request holds about five units
    assert units_per_take(ds, indexes, slots=16, workers=1) == 5
    assert units_per_take(ds, indexes, slots=2, workers=2) == 4               # several workers: twice the slots at most
    assert units_per_take(ds, None, slots=16, workers=1) == 1                 # streamed
    for order in (dict(shuffle="global"), dict(shuffle_buffer=8), dict(num_shards=2, shard_index=0)):
        # (one file, two hosts: each takes every other record)
        other = Dataset(bucket[:1] if "num_shards" in order else bucket, SPEC, batch_size=4, index_dir=indexes_dir,
                        **order)
        assert units_per_take(other, other.indexes(), slots=16, workers=1) == 1, order   # not in file order
    monkeypatch.setattr(read_ahead, "READ_AHEAD_BYTES", READ_AHEAD_BYTES)
    assert units_per_take(ds, indexes, slots=8, workers=1) == MAX_CLAIMS // 4     # one worker: its claims bound it


def test_local_files_take_one_unit_at_a_time(tmp_path):
    paths = write_example_shards(tmp_path, ["a.tfrecord"], lambda s: ({"id": [i]} for i in range(20)))
    build_indexes(paths, str(tmp_path / "ix"))
    ds = Dataset(paths, SPEC, batch_size=2, index_dir=tmp_path / "ix")
    assert units_per_take(ds, ds.indexes(), slots=16, workers=1) == 1


# --- the depth ---------------------------------------------------------------------------------------

@pytest.fixture
def measured(monkeypatch):
    """``measured(ra, read_ns, batch_ns, nbytes, batches=1, times=1)``: ``times`` batches (or runs of ``batches``)
    whose reads took ``read_ns`` and the worker ``batch_ns`` each, on a clock of the test's own."""
    clock = [0]
    monkeypatch.setattr(read_ahead.time, "monotonic_ns", lambda: clock[0])

    def measured(ra, read_ns, batch_ns, nbytes, batches=1, times=1):
        for _ in range(times):
            ra.read_done(clock[0], clock[0] + read_ns, nbytes, batches)
            clock[0] += batch_ns
            ra.handed_out(0)
    return measured


def test_local_reads_and_a_worker_that_measured_nothing_keep_one_batch_or_one_run_ahead():
    assert ReadAhead(remote=False).batches() == 1
    assert ReadAhead(remote=True).batches() == 1
    assert ReadAhead(remote=True, group=6).batches() == 6


def test_the_depth_covers_a_reads_time_at_the_workers_rate_growing_by_at_most_doubling(measured):
    ra = ReadAhead(remote=True)
    measured(ra, read_ns=25 * MS, batch_ns=1 * MS, nbytes=100_000, times=2)     # a request a batch, 25 ms each
    depths = [ra.batches() for _ in range(7)]
    assert depths == [2, 4, 8, 16, 26, 26, 26]               # 1 + 25 ms / 1 ms, reached by doubling
    assert ra.memory_bytes() == 26 * 100_000
    measured(ra, read_ns=25 * MS, batch_ns=50 * MS, nbytes=100_000, times=40)   # a slower worker needs fewer
    assert ra.batches() == 2                                 # at once


def test_the_depth_stays_within_the_bytes_in_flight_and_the_units_a_worker_may_owe(measured):
    big = ReadAhead(remote=True)
    measured(big, read_ns=100 * MS, batch_ns=1 * MS, nbytes=8 << 20, times=2)   # 8 MiB batches, 100 ms reads
    for _ in range(10):
        depth = big.batches()
    assert depth == MAX_READ_AHEAD_BYTES // (8 << 20) and big.memory_bytes() <= MAX_READ_AHEAD_BYTES
    small = ReadAhead(remote=True, group=8, per_slot=2)
    measured(small, read_ns=1000 * MS, batch_ns=1 * MS, nbytes=8 * 100, batches=8, times=2)
    for _ in range(12):
        depth = small.batches()
    assert depth == (MAX_CLAIMS - 8 // 2 - 2) * 2            # units owed: those ahead, the one made, a run more


# --- a daemon over a bucket -----------------------------------------------------------------------

@pytest.mark.parametrize("workers", [1, 2, 3])
def test_a_daemon_over_a_bucket_through_its_indexes_gives_the_batches_streaming_gives_each_record_read_once(
        bucket, tmp_path, workers):
    indexes_dir = tmp_path / "indexes"
    streamed, _ = _run(Dataset(bucket, SPEC, batch_size=4, index_dir=False), 1)
    build_indexes(bucket, str(indexes_dir))
    ds = Dataset(bucket, SPEC, batch_size=4, index_dir=indexes_dir, build_indexes=False)
    # Runs of 8 units a request with several workers (twice the slots), 64 with one, as the workers compute them.
    assert units_per_take(ds, ds.indexes(), slots=4, workers=workers) == (8 if workers > 1 else MAX_CLAIMS // 4)
    ids, stats = _run(ds, workers, slots=4)
    assert ids == streamed == [100 * s + i for s in range(3) for i in range(60)]
    total = sum(os.path.getsize(tmp_path / "rh-bucket" / f"part-{s}.tfrecord") for s in range(3))
    assert sum(w.read_bytes for w in stats.workers) <= total     # each record read by one worker only
