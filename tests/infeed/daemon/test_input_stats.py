"""InputStats: the ring's per-stage counters read as shares of time, the bottleneck named."""

import json
import os

import numpy as np
import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.daemon.input_stats import WORKER_STAGES, InputStats, WorkerStats


def worker(index=0, elapsed=10.0, read=0.0, inflate=0.0, crc=0.0, decode=0.0, wait=0.0, read_bytes=0, pid=100,
           compressed_bytes=0):
    return WorkerStats.from_counters({
        "index": index, "pid": pid, "elapsed_s": elapsed, "since_beat": 0.0, "batches": 100, "records": 1000, "skipped": 0,
        "bytes": 10**6, "read_s": read + inflate, "inflate_s": inflate, "crc_s": crc, "decode_s": decode,
        "wait_s": wait, "read_bytes": read_bytes, "compressed_bytes": compressed_bytes})


def stats(workers, wait=0.0, elapsed=10.0, cpus=2, startup=0.0, physical_cores=0):
    return InputStats("r", elapsed, 8, 2, 100, 1, {"start_up": startup, "wait_for_batch": wait}, tuple(workers), cpus,
                      physical_cores)


def test_worker_stages_cover_its_wall_time():
    w = worker(read=1, inflate=0.5, crc=0.5, decode=6, wait=1)
    assert w.stages == {"read": 1, "inflate": 0.5, "crc": 0.5, "decode": 6, "wait_for_slot": 1, "other": 1}
    assert w.share("decode") == 0.6 and sum(w.share(s) for s in WORKER_STAGES) == pytest.approx(1)


def test_input_bound_on_decoding_names_the_cores():
    s = stats([worker(decode=7.2, read=1)], wait=3.1, cpus=1)
    assert s.trainer_wait == pytest.approx(0.31)
    assert s.bottleneck() == ("input-bound: the trainer waited 31 % of the time; workers spend 72 % decoding into "
                              "the slot: add workers or cores (1 worker and the trainer share 1 core)")
    assert "share" not in stats([worker(decode=7.2)], wait=3.1, cpus=4).bottleneck()


def test_workers_past_the_physical_cores_are_named_as_what_limits_scaling():
    """A 16-CPU host with 8 physical cores (SMT): 12 workers decoding, each slower than alone."""
    twelve = [worker(index=k, decode=9.4) for k in range(12)]
    s = stats(twelve, wait=4.0, cpus=16, physical_cores=8)
    assert s.bottleneck().endswith(
        "add workers or cores (12 workers and the trainer outnumber the 8 physical cores under these 16 CPUs: SMT "
        "siblings share a core's units, so each worker decodes slower than alone, and workers past 7 add less than "
        "one worker's speed each)")
    assert "physical" not in stats(twelve[:7], wait=4.0, cpus=16, physical_cores=8).bottleneck()
    assert "share 16 cores" in stats(twelve + twelve[:5], wait=4.0, cpus=16, physical_cores=8).bottleneck()


def test_time_per_record_of_each_stage():
    w = worker(decode=2.0, read=0.5, crc=0.1)                     # 1000 records
    assert w.us_per_record("decode") == pytest.approx(2000) and w.us_per_record("read") == pytest.approx(500)
    doc = stats([w, worker(index=1, decode=4.0)], physical_cores=2).to_json()
    assert doc["us_per_record"]["decode"] == pytest.approx(3000) and doc["physical_cores"] == 2
    assert doc["workers"][0]["us_per_record"] == {"read": pytest.approx(500), "inflate": 0.0,
                                                  "crc": pytest.approx(100), "decode": pytest.approx(2000)}


def test_start_up_is_not_counted_as_waiting():
    s = stats([worker(decode=9)], wait=1.0, elapsed=12.0, startup=2.0)
    assert s.trainer_wait == pytest.approx(0.1)


def test_input_bound_on_reading_tells_storage_from_page_cache():
    slow = stats([worker(read=8, read_bytes=800 * 10**6)], wait=5).bottleneck()
    assert "workers spend 80 % reading files (100 MB/s while reading): the storage is the limit" in slow
    fast = stats([worker(read=8, read_bytes=40 * 10**9)], wait=5).bottleneck()
    assert "(5000 MB/s while reading): that speed is the page cache's" in fast


def test_input_bound_on_inflating_and_on_passing_records():
    assert "inflating GZIP/ZLIB: store the files uncompressed" in stats([worker(inflate=9)], wait=5).bottleneck()
    assert "infeed index" in stats([worker(decode=1)], wait=5).bottleneck()         # "other" dominates


def test_trainer_bound_balanced_and_hand_off_bound():
    assert stats([worker(decode=3, wait=6)], wait=0.2).bottleneck().startswith(
        "trainer-bound: the trainer waited 2 % of the time; workers wait 60 % of theirs for a free slot")
    assert stats([worker(decode=8, wait=1)], wait=0.5).bottleneck().startswith("balanced: the trainer waited 5 %")
    assert stats([worker(decode=3, wait=6)], wait=4).bottleneck().startswith("hand-off-bound")
    assert stats([]).bottleneck() == "no worker has reported yet"


def test_since_takes_differences_and_a_restarted_worker_whole():
    early = stats([worker(decode=2, elapsed=4), worker(1, decode=1, elapsed=4)], wait=1, elapsed=4)
    late = stats([worker(decode=5, elapsed=10), worker(1, decode=9, elapsed=10, pid=200)], wait=1.5, elapsed=10)
    d = late.since(early)
    assert d.elapsed_s == 6 and d.consumer["wait_for_batch"] == 0.5 and d.taken == 0
    assert d.workers[0].stages["decode"] == 3 and d.workers[0].elapsed_s == 6
    assert d.workers[1].stages["decode"] == 9 and d.workers[1].elapsed_s == 10      # another process


def test_consumer_stages_from_a_feeder_drive_the_verdict():
    s = stats([worker(decode=9)], wait=0.0).with_consumer_stages(host_to_device=1.0, trainer_wait=4.0)
    assert s.trainer_wait == 0.4 and s.bottleneck().startswith("input-bound: the trainer waited 40 %")
    assert "copying batches to the devices" in s.table()
    with pytest.raises(ValueError, match="unknown consumer stages \\['device'\\]"):
        s.with_consumer_stages(device=1.0)


def test_json_holds_every_share():
    doc = json.loads(json.dumps(stats([worker(decode=6, wait=2)], wait=1).to_json()))
    assert doc["worker_shares"]["decode"] == 0.6 and doc["consumer_shares"]["wait_for_batch"] == 0.1
    assert doc["workers"][0]["shares"]["other"] == pytest.approx(0.2)
    assert doc["bottleneck"].startswith("input-bound: the trainer waited 10 %") and doc["trainer_wait"] == 0.1


SPEC = {"x": FixedLen((64,), "float32"), "y": FixedLen((), "int64")}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("stats")
    rng = np.random.default_rng(0)
    out = {}
    for name, compression in (("plain.tfrecord", None), ("packed.tfrecord.gz", "GZIP")):
        path = str(root / name)
        with infeed.TFRecordWriter(path, compression=compression) as w:
            for i in range(2000):
                w.write(infeed.encode_example({"x": rng.random(64, dtype=np.float32), "y": [i]}))
        out[compression] = path
    return out


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_a_daemon_reports_every_stage(data, compression):
    ds = Dataset(data[compression], SPEC, batch_size=50, num_epochs=1, build_indexes=False)    # streamed
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False) as feed:
        taken = sum(1 for _ in feed)
        s = feed.stats()
    assert taken == 40 and s.taken == 40 and 1 <= len(s.workers) <= 2      # batches go to whichever worker is free
    assert sum(w.records for w in s.workers) == 2000 and sum(w.batches for w in s.workers) == 40
    size = os.path.getsize(data[compression])
    # A worker that started after the other had dealt itself every batch made none, and counted nothing (seen with
    # three test processes on two cores); the stages of each that made any:
    assert any(w.batches for w in s.workers) and all(w.records == 0 for w in s.workers if not w.batches)
    for w in (w for w in s.workers if w.batches):
        assert w.stages["decode"] > 0 and w.stages["read"] > 0 and w.stages["crc"] > 0
        assert sum(w.stages.values()) == pytest.approx(w.elapsed_s, rel=0.05)
        # Each worker reads the whole file (the framing of the other's batches too) and checks its own records.
        if compression:
            assert w.stages["inflate"] > 0 and w.compressed_bytes == size
        else:
            assert w.stages["inflate"] == 0 and w.read_bytes == size
    assert s.consumer["start_up"] > 0 and 0 < s.elapsed_s
    assert s.bottleneck().split(":")[0] in ("input-bound", "trainer-bound", "balanced", "hand-off-bound")
    assert "ring " + feed.ring.name in s.table()


def test_workers_reading_every_record_to_decode_their_share_are_told_to_write_an_index():
    four = [worker(index=k, read=6.0, decode=2.0, read_bytes=4 * 10**6) for k in range(4)]
    said = stats(four, wait=5.0, cpus=8).bottleneck()
    assert said.endswith("workers spend 60 % reading files (1 MB/s while reading): each worker reads every record "
                         "and decodes its share (4.0x the bytes it decodes): index the files "
                         "(Dataset(build_indexes=True), or `infeed index`), with which workers read only their own "
                         "batches")
    assert "storage is the limit" in stats(four[:1], wait=5.0, cpus=8).bottleneck()        # one worker passes none


def test_workers_that_read_only_their_own_records_are_not_told_to_index_for_their_other_time():
    indexed = [worker(index=k, read=1.0, decode=2.0, read_bytes=10**6) for k in range(2)]   # each read what it decoded
    said = stats(indexed, wait=5.0, cpus=8).bottleneck()
    assert said.endswith("workers spend 70 % outside reading, checking and decoding (planning, taking batches and "
                         "handing them over): each reads only its own records already, so that time is per batch: "
                         "spread it over more records (a larger batch_size, or several batches in a slot: "
                         "steps_per_slot)")
    streaming = [worker(index=k, read=1.0, decode=2.0, read_bytes=2 * 10**6) for k in range(2)]    # each read all
    assert "index the files" in stats(streaming, wait=5.0, cpus=8).bottleneck()


def test_workers_inflating_every_record_of_compressed_files_are_told_no_index_serves_them():
    four = [worker(index=k, read=6.0, decode=2.0, read_bytes=4 * 10**6, compressed_bytes=10**6) for k in range(4)]
    said = stats(four, wait=5.0, cpus=8).bottleneck()
    assert said.endswith("the files are compressed (GZIP/ZLIB), which no index can serve (no random access), so each "
                         "worker inflates every record: store them uncompressed, or use fewer workers")
    assert "infeed index" not in said
    passing = [worker(index=k, elapsed=10.0, read=1.0, decode=1.0, compressed_bytes=10**6) for k in range(2)]
    assert "no index can serve" in stats(passing, wait=5.0, cpus=8).bottleneck()        # "other" on top: the same
