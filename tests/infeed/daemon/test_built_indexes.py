"""Indexes built for the user: a Daemon over uncompressed files without an index builds them into the index
directory before its first epoch (each file read once, in the trainer), so its workers read only their own
batches; the batches are those of streaming; the next run finds them; an unwritable directory, compressed files
and ``build_indexes=False`` stream, saying why once; ``"auto"`` builds where it saves reads."""

import json
import logging
import os
import subprocess
import sys

import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.tfrecord.index import load_index
from infeed.tfrecord.index_cache import data_identity, cached_index_path, find_index
from tfrecord_files import write_example_shards

SPEC = {"id": FixedLen((), "int64")}


@pytest.fixture
def files(tmp_path):
    return write_example_shards(tmp_path / "data", [f"part-{s}.tfrecord" for s in range(3)],
                                lambda s: ({"id": [100 * s + i], "pad": b"p" * (i % 7)} for i in range(40)))


def _run(ds, workers=2):
    """(every id in batch order, the feed's stats)."""
    with Daemon(ds, num_workers=workers, slots=4, lock_memory=False, timeout=60) as feed:
        ids = [i for batch in feed for i in batch["id"].tolist()]
        return ids, feed.stats()


@pytest.mark.parametrize("order", [dict(shuffle_buffer=16, shuffle_files=True), dict()], ids=["shuffled", "plain"])
def test_the_first_daemon_builds_the_indexes_and_gives_the_batches_streaming_gives(files, tmp_path, caplog, order):
    kept = tmp_path / "indexes"
    streamed, stats = _run(Dataset(files, SPEC, batch_size=8, seed=5, index_dir=kept, build_indexes=False, **order))
    # Streamed: the worker that made the last batch read every record of the epoch before it (the other may
    # have stopped after its own last batch: batches go to whichever worker is free)
    assert not kept.exists() and max(w.read_bytes for w in stats.workers) == sum(map(os.path.getsize, files))
    with caplog.at_level(logging.INFO, logger="infeed"):
        built, stats = _run(Dataset(files, SPEC, batch_size=8, seed=5, index_dir=kept, build_indexes=True, **order))
    assert built == streamed and sorted(built) == sorted(100 * s + i for s in range(3) for i in range(40))
    [line] = [r.getMessage() for r in caplog.records if "indexed" in r.getMessage()]
    total = sum(map(os.path.getsize, files))
    assert line.startswith(f"infeed: indexed 3 files (120 records, {total / 1e6:.1f} MB) in ")
    assert f"into {kept}: the workers read only their own batches" in line
    assert sorted(os.listdir(kept)) == sorted(os.path.basename(cached_index_path(kept, data_identity(p)))
                                              for p in files)
    assert sum(w.read_bytes for w in stats.workers) < 1.1 * total              # every record read once in all
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="infeed"):                      # the next run: found, not built
        again, _ = _run(Dataset(files, SPEC, batch_size=8, seed=5, index_dir=kept, build_indexes=True, **order))
    assert again == streamed and not [r for r in caplog.records if "indexed" in r.getMessage()]


def test_a_global_shuffle_needs_no_index_written_by_hand(files, tmp_path):
    ds = Dataset(files, SPEC, batch_size=8, shuffle="global", seed=2, index_dir=tmp_path / "indexes")
    ids, _ = _run(ds)
    assert sorted(ids) == sorted(100 * s + i for s in range(3) for i in range(40))
    assert ids != sorted(ids)
    with pytest.raises(ValueError, match="shuffle='global' needs a record index for every file"):
        Daemon(Dataset(files, SPEC, batch_size=8, shuffle="global", index_dir=tmp_path / "other",
                       build_indexes=False))


def test_an_index_dir_that_cannot_be_written_streams_with_one_warning(files, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    ds = Dataset(files, SPEC, batch_size=8, seed=1, shuffle_buffer=8, index_dir=blocker / "indexes", build_indexes=True)
    with caplog.at_level(logging.INFO, logger="infeed"):
        ids, stats = _run(ds)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"infeed: could not keep record indexes ({blocker / 'indexes'}")
    assert "0 of 3 files indexed; the others stream" in warnings[0]
    assert ids == _run(ds.replace(build_indexes=False))[0]
    assert find_index(files[0], blocker / "indexes") is None


def test_compressed_files_stream_and_say_so_once(tmp_path, caplog):
    paths = []
    for s in range(2):
        path = str(tmp_path / f"part-{s}.tfrecord.gz")
        with infeed.TFRecordWriter(path, compression="GZIP") as w:
            for i in range(16):
                w.write(infeed.encode_example({"id": [i]}))
        paths.append(path)
    with caplog.at_level(logging.INFO, logger="infeed"):
        ids, _ = _run(Dataset(paths, SPEC, batch_size=4, index_dir=tmp_path / "indexes", build_indexes=True))
    assert sorted(ids) == sorted(list(range(16)) * 2) and not (tmp_path / "indexes").exists()
    [line] = [r.getMessage() for r in caplog.records if "compressed" in r.getMessage()]
    assert line.startswith("infeed: 2 of the 2 files are compressed") and "each reading every record" in line


def test_opting_out_or_sidecars_only_builds_nothing(files, tmp_path):
    for ds in (Dataset(files, SPEC, batch_size=8, index_dir=tmp_path / "indexes", build_indexes=False),
               Dataset(files, SPEC, batch_size=8, index_dir=False)):
        assert ds.build_missing_indexes() is None
    assert not (tmp_path / "indexes").exists() and all(load_index(p) is None for p in files)
    assert Dataset(files, SPEC, batch_size=8, build_indexes=False).replace(seed=3).build_indexes is False
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=f"build_indexes must be 'auto', True or False, got {bad!r}"):
            Dataset(files, SPEC, batch_size=8, build_indexes=bad)


def test_auto_builds_where_it_saves_reads(files, tmp_path):
    def built(workers, **settings):            # with build_indexes left at its default, "auto"
        kept = tmp_path / f"indexes-{len(os.listdir(tmp_path))}"
        ds = Dataset(files, SPEC, batch_size=8, index_dir=kept, **settings)
        return ds.build_missing_indexes(workers) is not None

    assert not built(1)                                              # local files, one worker: it streams
    assert built(2) and built(4) and built(16)                       # LOCAL_BUILD_WORKERS on
    assert built(1, shuffle="global")                                # a global shuffle needs them


def test_files_in_a_directory_the_user_may_only_read_are_indexed_into_theirs_and_give_the_streamed_batches(
        files, tmp_path):
    data = os.path.dirname(files[0])
    listed = sorted(os.listdir(data))
    os.chmod(data, 0o555)                   # read-only (for a user other than root, whom nothing stops)
    try:
        kept = tmp_path / "indexes"
        ds = Dataset(files, SPEC, batch_size=8, shuffle_files=True, seed=3, index_dir=kept)
        streamed, _ = _run(ds.replace(build_indexes=False), workers=1)
        got, stats = _run(ds, workers=2)          # "auto": local files from 2 workers on
        assert got == streamed and sorted(os.listdir(kept)) != [] and sorted(os.listdir(data)) == listed
        assert sum(w.read_bytes for w in stats.workers) == sum(map(os.path.getsize, files))   # each record once
    finally:
        os.chmod(data, 0o755)


HOST = """
import json, sys
from infeed import Daemon, Dataset, FixedLen
paths, kept, index = json.loads(sys.argv[1])
ds = Dataset(paths, {"id": FixedLen((), "int64")}, batch_size=4, index_dir=kept, num_shards=2, shard_index=index,
             shuffle="global", seed=9)           # a global shuffle needs the indexes: each host builds them
with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
    print(json.dumps([i for batch in feed for i in batch["id"].tolist()]))
"""


def test_two_hosts_sharing_a_file_build_its_index_at_once_into_one_cache_and_split_its_records(tmp_path):
    """Fewer files than hosts: each host takes every other record of the one file, so both need its index, build
    it at the same moment into the cache they share, and find one whole entry; their records split the file."""
    (path,) = write_example_shards(tmp_path / "data", ["one.tfrecord"], lambda s: ({"id": [i]} for i in range(64)))
    kept = str(tmp_path / "indexes")
    hosts = [subprocess.Popen([sys.executable, "-c", HOST, json.dumps([[path], kept, k])], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    outs = [host.communicate(timeout=120) for host in hosts]
    assert [host.returncode for host in hosts] == [0, 0], [err for _, err in outs]
    ids = [json.loads(out) for out, _ in outs]
    assert sorted(ids[0] + ids[1]) == list(range(64)) and set(ids[0]).isdisjoint(ids[1])
    assert len(os.listdir(kept)) == 1 and find_index(path, kept).count == 64


def test_each_host_builds_only_the_files_of_its_shard(files, tmp_path):
    kept = tmp_path / "indexes"
    ds = Dataset(files, SPEC, batch_size=4, index_dir=kept, shard_index=1, num_shards=2, build_indexes=True)
    result = ds.build_missing_indexes()
    assert result.built == (files[1],) and result.records == 40 and result.failure is None
    assert find_index(files[1], kept) is not None and find_index(files[0], kept) is None
    assert ds.build_missing_indexes() is None                                 # nothing left to build


def test_a_damaged_file_is_left_to_stream_and_fails_there_as_it_would_have(files, tmp_path, caplog):
    with open(files[1], "r+b") as f:                                          # the second record's data CRC
        f.seek(os.path.getsize(files[1]) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    ds = Dataset(files, SPEC, batch_size=8, index_dir=tmp_path / "indexes", build_indexes=True)
    with caplog.at_level(logging.WARNING, logger="infeed"):
        result = ds.build_missing_indexes()
    assert set(result.built) == {files[0], files[2]}
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"infeed: {files[1]} is not indexed, and streams: ") and "corrupt record" in warning
    with pytest.raises(infeed.CorruptRecordError, match="part-1.tfrecord"):
        _run(ds)
