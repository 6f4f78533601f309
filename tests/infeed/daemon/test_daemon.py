"""The decoding daemon: batch order, padding, resume, sharding, errors and clean-up across processes."""

import contextlib
import json
import os

import numpy as np
import pytest

import infeed
from infeed import Bytes, Daemon, Dataset, FixedLen, VarLen
from infeed.daemon.plan import ShuffleBuffer, epoch_paths
from infeed.ring.segments import SHM_DIR

SPEC = {"id": FixedLen((), "int64"), "tokens": VarLen("int32", max_len=4), "name": Bytes(max_bytes=8)}
SIZES = (40, 23, 37)          # records per file: 100 in all


def record(i: int) -> bytes:
    return infeed.encode_example({"id": [i], "tokens": list(range(i % 5)), "name": [b"r%d" % i]})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("daemon")
    paths, start = [], 0
    for k, n in enumerate(SIZES):
        path = str(root / f"train-{k}.tfrecord")
        with infeed.TFRecordWriter(path) as w:
            for i in range(start, start + n):
                w.write(record(i))
        paths.append(path)
        start += n
    return paths


def ids_of(batches):
    return [b["id"].tolist() for b in batches]


def collect(ds, **kw):
    """Every batch of ``ds`` through a daemon, copied out of the ring."""
    with Daemon(ds, lock_memory=False, timeout=60, **kw) as feed:
        return [{k: (infeed.Padded(v.values.copy(), v.lengths.copy()) if isinstance(v, infeed.Padded)
                     else v.copy()) for k, v in batch.items()} for batch in feed]


def reference(records, batch_size, final_batch="drop"):
    """parse_examples over the records in order, cut into batches (the documented order)."""
    out = []
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        if len(chunk) < batch_size and final_batch == "drop":
            break
        parsed = infeed.parse_examples(chunk, SPEC)
        n = len(chunk)
        if n < batch_size:
            full = infeed.ExampleParser(SPEC).allocate(batch_size)
            infeed.ExampleParser(SPEC).parse(chunk, out=full)
            parsed = full
        if final_batch == "pad":
            parsed["is_padding"] = np.arange(batch_size) >= n
        out.append(parsed)
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in w:
            if isinstance(w[k], infeed.Padded):
                np.testing.assert_array_equal(g[k].values, w[k].values)
                np.testing.assert_array_equal(g[k].lengths, w[k].lengths)
            else:
                np.testing.assert_array_equal(g[k], w[k])


def all_records(paths):
    return [r for p in paths for r in infeed.read_records(p)]


def segments():
    return {n for n in os.listdir(SHM_DIR) if n.startswith(f"infeed-{os.getuid()}-")}


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("final_batch", ["drop", "pad"])
def test_batches_equal_parse_examples_in_file_order_for_any_worker_count(files, workers, final_batch):
    ds = Dataset(files, SPEC, batch_size=16, final_batch=final_batch)
    got = collect(ds, num_workers=workers, slots=2)
    assert_same(got, reference(all_records(files), 16, final_batch))
    if final_batch == "pad":
        assert got[-1]["is_padding"].tolist() == [False] * 4 + [True] * 12
        assert got[-1]["id"][4:].tolist() == [0] * 12 and got[-1]["tokens"].lengths[4:].tolist() == [0] * 12


def shuffled_reference(ds, epoch):
    """The documented order written out: files shuffled per epoch, then a shuffle buffer."""
    records = all_records(epoch_paths(ds, epoch))
    buffer, out = ShuffleBuffer(ds.shuffle_buffer, ds.seed, epoch), []
    for r in records:
        left = buffer.push(r)
        if left is not None:
            out.append(left)
    return out + buffer.drain()


def test_shuffled_sequence_depends_on_seed_not_on_workers(files):
    ds = Dataset(files, SPEC, batch_size=10, shuffle_files=True, shuffle_buffer=30, seed=7, num_epochs=2)
    one, three = collect(ds, num_workers=1), collect(ds, num_workers=3, slots=3)
    assert ids_of(one) == ids_of(three)
    want = reference(shuffled_reference(ds, 0), 10) + reference(shuffled_reference(ds, 1), 10)
    assert_same(one, want)
    epoch0, epoch1 = sum(ids_of(one[:10]), []), sum(ids_of(one[10:]), [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(100)) and epoch0 != epoch1
    other = collect(Dataset(files, SPEC, batch_size=10, shuffle_files=True, shuffle_buffer=30, seed=8))
    assert sum(ids_of(other), []) != epoch0


def test_steps_per_slot_stacks_consecutive_batches_and_trims_the_last_slot(files):
    ds = Dataset(files, SPEC, batch_size=8, steps_per_slot=5)          # 12 batches: slots of 5, 5, 2
    got = collect(ds, num_workers=2, slots=2)
    assert [b["id"].shape for b in got] == [(5, 8), (5, 8), (2, 8)]
    assert got[2]["tokens"].values.shape == (2, 8, 4) and got[2]["tokens"].lengths.shape == (2, 8)
    flat = [row for b in got for row in b["id"].tolist()]
    assert flat == ids_of(reference(all_records(files), 8))


def test_shards_by_file_and_by_record_partition_the_data(files):
    by_file = [sum(ids_of(collect(Dataset(files, SPEC, batch_size=1, shard_index=i, num_shards=3))), [])
               for i in range(3)]
    assert sorted(sum(by_file, [])) == list(range(100)) and by_file[1] == list(range(40, 63))
    by_record = [sum(ids_of(collect(Dataset(files, SPEC, batch_size=1, shard_index=i, num_shards=4))), [])
                 for i in range(4)]
    assert by_record[1] == list(range(1, 100, 4))
    assert sorted(sum(by_record, [])) == list(range(100))


def test_forever_keeps_going_and_close_leaves_nothing(files):
    ds = Dataset(files, SPEC, batch_size=30, num_epochs=None, shuffle_files=True)
    with Daemon(ds, num_workers=2, slots=2, lock_memory=False) as feed:
        ids = [next(feed)["id"].tolist() for _ in range(12)]       # four epochs of three batches
        pids, name = feed.worker_pids, feed.ring.name
    assert all(sorted(sum(ids[i:i + 3], [])) == sorted(set(sum(ids[i:i + 3], []))) for i in range(0, 12, 3))
    assert name not in segments()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_batch_is_a_view_released_at_the_next_batch(files):
    with Daemon(Dataset(files, SPEC, batch_size=4), num_workers=1, slots=2, lock_memory=False) as feed:
        first = next(feed)
        assert feed.ring.slot_state(0)[0] == "reading"
        first.release()
        first.release()
        assert feed.ring.slot_state(0)[0] in ("free", "writing", "filled")
        second = next(feed)
        assert second["id"].base is not None and not second["id"].flags.owndata


def test_annotate_wraps_each_wait_for_a_filled_slot(files):
    events = []

    @contextlib.contextmanager
    def annotate(name):
        events.append(name)
        yield

    with Daemon(Dataset(files, SPEC, batch_size=30), num_workers=2, slots=2, lock_memory=False) as feed:
        next(feed)
        feed.annotate = annotate
        assert len(list(feed)) == 2
    assert events == ["infeed/wait_for_slot"] * 3          # two batches, then the slot that ends the data


def test_a_record_that_breaks_the_spec_names_file_record_and_offset(files, tmp_path):
    bad = str(tmp_path / "spec.tfrecord")
    records = all_records([files[0]])
    records[13] = infeed.encode_example({"id": [1, 2]})
    with infeed.TFRecordWriter(bad) as w:
        for r in records:
            w.write(r)
    offset = sum(len(r) + 16 for r in records[:13])
    with Daemon(Dataset([bad], SPEC, batch_size=5), num_workers=2, lock_memory=False, timeout=60) as feed:
        with pytest.raises(infeed.DecodeError) as info:
            list(feed)
    e = info.value
    assert (e.path, e.record_index, e.offset, e.feature) == (bad, 13, offset, "id")


def test_bfloat16_and_uint8_outputs_come_through_the_workers_converted_as_astype(tmp_path):
    spec = {"x": FixedLen((3,), "bfloat16"), "tokens": VarLen("uint8", max_len=4, pad=255)}
    rng = np.random.default_rng(5)
    floats = (rng.standard_normal((60, 3)) * 2.0 ** rng.integers(-20, 20, (60, 3))).astype(np.float32)
    floats[7] = [1 + 2**-8, np.nan, 3.4e38]                                # a tie, a NaN, past bfloat16's max
    tokens = [rng.integers(0, 256, i % 5).tolist() for i in range(60)]
    path = str(tmp_path / "narrow.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        for x, t in zip(floats, tokens):
            w.write(infeed.encode_example({"x": x, "tokens": t}))
    ds = Dataset([path], spec, batch_size=8)
    assert ds.template()["x"] == ((8, 3), np.dtype("bfloat16"))
    got = collect(ds, num_workers=2, slots=2)
    assert len(got) == 7
    for k, batch in enumerate(got):
        rows = slice(8 * k, 8 * (k + 1))
        assert batch["x"].dtype == np.dtype("bfloat16")
        assert batch["x"].view(np.uint16).tolist() == floats[rows].astype("bfloat16").view(np.uint16).tolist()
        want = np.full((8, 4), 255, np.uint8)
        for i, t in enumerate(tokens[rows]):
            want[i, :len(t)] = np.array(t, np.int64).astype(np.uint8)
        assert batch["tokens"].values.dtype == np.uint8 and batch["tokens"].values.tolist() == want.tolist()
        assert batch["tokens"].lengths.tolist() == [len(t) for t in tokens[rows]]
    with infeed.TFRecordWriter(path) as w:
        for i in range(16):
            w.write(infeed.encode_example({"x": floats[i], "tokens": [256] if i == 11 else tokens[i]}))
    with Daemon(Dataset([path], spec, batch_size=8), num_workers=2, lock_memory=False, timeout=60) as feed:
        with pytest.raises(infeed.DecodeError, match="values that fit uint8") as info:
            list(feed)
    assert (info.value.path, info.value.record_index, info.value.feature) == (path, 11, "tokens")


def test_dataset_checks_its_arguments(files):
    with pytest.raises(FileNotFoundError, match="no files match"):
        Dataset(os.path.join(os.path.dirname(files[0]), "nothing-*.tfrecord"), SPEC, 4)
    with pytest.raises(ValueError, match="batch_size"):
        Dataset(files, SPEC, 0)
    with pytest.raises(ValueError, match="final_batch"):
        Dataset(files, SPEC, 4, final_batch="keep")
    with pytest.raises(ValueError, match="shard_index"):
        Dataset(files, SPEC, 4, shard_index=2, num_shards=2)
    with pytest.raises(ValueError, match="is_padding"):
        Dataset(files, {"is_padding": FixedLen(())}, 4, final_batch="pad")
    ds = Dataset(files[0], SPEC, 4, shuffle_buffer=9, num_epochs=None)
    again = Dataset.from_json(json.loads(json.dumps(ds.to_json())))
    assert again.to_json() == ds.to_json() and again.fingerprint() == ds.fingerprint()


def test_an_epoch_without_a_full_batch_is_an_error_not_a_hang(files):
    ds = Dataset(files[1], SPEC, batch_size=50, num_epochs=None)
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        with pytest.raises(infeed.InfeedError, match="no batch"):
            next(feed)


def test_resume_with_stacked_slots_and_compressed_files_read_through_uris(files, tmp_path):
    gz = []
    for k, path in enumerate(files):
        gz.append(str(tmp_path / f"part-{k}.tfrecord.gz"))
        with infeed.TFRecordWriter(gz[-1], compression="GZIP") as w:
            for r in infeed.read_records(path):
                w.write(r)
    ds = Dataset(f"file://{tmp_path}/part-*.tfrecord.gz", SPEC, batch_size=6, steps_per_slot=4, shuffle_buffer=10,
                 num_epochs=2)
    full = [row for b in collect(ds, num_workers=2) for row in b["id"].tolist()]
    assert len(full) == 2 * 16 and all(len(set(sum(e, []))) == 96 for e in (full[:16], full[16:]))
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        head = [row for _ in range(3) for row in next(feed)["id"].tolist()]
        state = feed.state()
    tail = [row for b in collect(ds, num_workers=1, state=state) for row in b["id"].tolist()]
    assert head + tail == full


@pytest.fixture
def indexed(files, tmp_path):
    """Copies of the files, each with an `infeed index` sidecar."""
    from infeed.tfrecord.index import build_index, write_index

    paths = []
    for path in files:
        copy = tmp_path / os.path.basename(path)
        copy.write_bytes(open(path, "rb").read())
        write_index(build_index(str(copy)))
        paths.append(str(copy))
    return paths


@pytest.mark.parametrize("shuffle_buffer", [0, 30])
def test_an_index_changes_how_records_are_read_not_which(files, indexed, shuffle_buffer):
    kw = dict(batch_size=9, shuffle_files=True, shuffle_buffer=shuffle_buffer, seed=4, num_epochs=2, final_batch="pad")
    streamed = collect(Dataset(files, SPEC, **kw), num_workers=2)
    through_index = collect(Dataset(indexed, SPEC, **kw), num_workers=3)
    assert_same(through_index, streamed)


def test_through_an_index_a_batch_is_one_read_and_a_damaged_record_is_named(indexed, monkeypatch):
    from infeed.daemon import indexed_reads, plan
    from infeed.tfrecord.index import load_index

    reads = []
    real = indexed_reads._spans

    def counted(runs):                               # the requests of a group of batches' reads
        spans = real(runs)
        reads.extend(size for _, _, size in spans[0])
        return spans
    monkeypatch.setattr(indexed_reads, "_spans", counted)
    ds = Dataset(indexed, SPEC, batch_size=10, num_epochs=1)
    parser, ids = infeed.ExampleParser(SPEC), []
    for planned in plan.epoch_batches(ds, 0, 0, lambda index, ahead=False: index % 2 == 0, ds.indexes()):  # a worker of 2
        if planned.fill is not None:
            out = parser.allocate(10)
            planned.fill(parser, out)
            ids.append(out["id"].tolist())
    assert ids == [list(range(i, i + 10)) for i in range(0, 100, 20)]
    assert len(reads) == 5 + 1                # one read a batch it owns, two for records 60-69 (in two files)
    offset = int(load_index(indexed[1]).offsets[3])
    with open(indexed[1], "r+b") as f:        # a byte of record 3's data: the file keeps its size and index
        f.seek(offset + 14)
        byte = f.read(1)
        f.seek(offset + 14)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(infeed.CorruptRecordError) as info:
        collect(Dataset(indexed, SPEC, batch_size=10, num_epochs=1), num_workers=2)
    err = info.value
    assert (err.path, err.record_index, err.offset, err.kind) == (indexed[1], 3, offset, "data_crc")


def test_a_workers_indexed_files_are_opened_once_and_kept_from_epoch_to_epoch(indexed, monkeypatch):
    """An open costs a bucket's object a round trip (a gs:// one the start of a download of all of it): a worker
    opens each file once, whatever the epochs, and closes them at its end."""
    from infeed.daemon import indexed_reads, plan

    opens, closed = [], []
    real = indexed_reads.open_indexed

    def counted(path, index):
        handle = real(path, index)
        opens.append(path)
        close = handle.close
        handle.close = lambda: (closed.append(path), close())[1]
        return handle
    monkeypatch.setattr(indexed_reads, "open_indexed", counted)
    ds = Dataset(indexed, SPEC, batch_size=10, shuffle_files=True, seed=5, num_epochs=3)
    parser, kept, ids = infeed.ExampleParser(SPEC), indexed_reads.OpenFiles(), []
    for epoch in range(3):
        for planned in plan.epoch_batches(ds, epoch, 0, lambda index, ahead=False: True, ds.indexes(), opened=kept):
            out = parser.allocate(10)
            planned.fill(parser, out)
            ids.append(out["id"].tolist())
    assert sorted(opens) == sorted(indexed) and closed == []             # each once, for the three epochs
    kept.close()
    assert sorted(closed) == sorted(indexed)
    assert ids == ids_of(collect(ds, num_workers=1))                     # the batches a daemon gives
    opens.clear()
    for epoch in range(2):                                               # without a worker's: each epoch its own
        for planned in plan.epoch_batches(ds, epoch, 0, lambda index, ahead=False: True, ds.indexes()):
            planned.fill(parser, parser.allocate(10))
    assert len(opens) == 2 * len(indexed)


def test_global_shuffle_is_a_seeded_permutation_whatever_the_workers(indexed):
    ds = Dataset(indexed, SPEC, batch_size=10, shuffle="global", seed=11, num_epochs=2)
    one, two = ids_of(collect(ds, num_workers=1)), ids_of(collect(ds, num_workers=2))
    assert one == two
    epoch0, epoch1 = sum(one[:10], []), sum(one[10:], [])
    assert sorted(epoch0) == sorted(epoch1) == list(range(100)) and epoch0 != epoch1
    # records from every file are mixed from the first batch on, unlike a 10-record buffer
    assert len({i // 40 for i in one[0]}) > 1
    assert ids_of(collect(Dataset(indexed, SPEC, batch_size=10, shuffle="global", seed=12))) != one[:10]
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        head = [next(feed)["id"].tolist() for _ in range(13)]
        state = feed.state()
    assert head + ids_of(collect(ds, num_workers=1, state=state)) == one


def test_global_shuffle_without_an_index_or_with_a_stale_one_is_refused(files, indexed, tmp_path):
    with pytest.raises(ValueError, match="infeed index"):           # by default the index is built for it instead
        Daemon(Dataset(files, SPEC, batch_size=10, shuffle="global", build_indexes=False, index_dir=tmp_path))
    with open(indexed[1], "ab") as f:
        f.write(open(files[0], "rb").read()[:100])
    with pytest.raises(infeed.errors.IndexFileError, match="stale|size"):
        Daemon(Dataset(indexed, SPEC, batch_size=10, shuffle="global"))
    with pytest.raises(infeed.errors.IndexFileError, match="stale"):     # any shuffle: before a worker starts
        Daemon(Dataset(indexed, SPEC, batch_size=10), num_workers=1, lock_memory=False, timeout=60)


@pytest.mark.parametrize("shuffle_buffer", [0, 20])
def test_a_position_past_an_epochs_end_goes_on_into_the_next_epoch(files, shuffle_buffer):
    """(epoch, batch + n) is the position n batches after (epoch, batch), across epoch ends too."""
    ds = Dataset(files, SPEC, batch_size=9, shuffle_buffer=shuffle_buffer, shuffle_files=True, num_epochs=3, seed=2)
    full = ids_of(collect(ds, num_workers=2))                       # 11 batches an epoch
    with Daemon(ds, num_workers=1, lock_memory=False) as feed:
        state = feed.state()
    assert ids_of(collect(ds, num_workers=2, state=dict(state, batch=15))) == full[15:]
    assert ids_of(collect(ds, num_workers=1, state=dict(state, epoch=1, batch=30))) == []
