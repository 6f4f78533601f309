"""Indexes kept apart from the data (infeed.tfrecord.index_cache): written by `infeed index --output-dir`,
found by a Dataset's index_dir after any sidecar, keyed by the file's path and identity, checked when loaded,
written whole by writers racing for the same entry."""

import errno
import os
import threading
import time

import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.commands.cli import main
from infeed.errors import IndexFileError
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.index import build_index, load_index, write_index
from infeed.tfrecord.index_build import build_indexes
from infeed.tfrecord.index_cache import (INDEX_DIR_ENV, cache_entries, cached_index_path, data_identity,
                                         default_index_dir, find_index, load_cached_index, write_cached_index)
from tfrecord_files import write_example_shards

SPEC = {"id": FixedLen((), "int64")}


@pytest.fixture
def shards(tmp_path):
    return write_example_shards(tmp_path / "data", [f"train-{s:05d}-of-00002" for s in range(2)],
                                lambda s: ({"id": [12 * s + i]} for i in range(12)))


def test_the_cli_keeps_indexes_in_the_output_dir_and_nothing_beside_the_data(tmp_path, shards, capsys):
    before = sorted(os.listdir(os.path.dirname(shards[0])))
    kept = tmp_path / "indexes"
    assert main(["index", "--output-dir", str(kept), *shards]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("2 indexed, 0 up to date")
    assert sorted(os.listdir(os.path.dirname(shards[0]))) == before           # no sidecar, no temporary file
    assert sorted(os.listdir(kept)) == sorted(os.path.basename(cached_index_path(kept, data_identity(p)))
                                               for p in shards)
    assert main(["index", "--output-dir", str(kept), *shards]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("0 indexed, 2 up to date")
    assert load_cached_index(shards[1], kept).count == 12 and load_index(shards[1]) is None


def test_a_dataset_reads_through_the_kept_indexes_as_through_sidecars(tmp_path, shards):
    kept = tmp_path / "indexes"
    main(["index", "--output-dir", str(kept), *shards])
    ds = Dataset(shards, SPEC, batch_size=4, shuffle="global", seed=3, index_dir=kept)
    assert ds.index_dir == str(kept) and set(ds.indexes()) == set(shards)
    with Daemon(ds, num_workers=2, timeout=60) as feed:
        kept_order = [i for batch in feed for i in batch["id"].tolist()]
    for path in shards:
        write_index(build_index(path))
    with Daemon(Dataset(shards, SPEC, batch_size=4, shuffle="global", seed=3, index_dir=False), num_workers=1,
                timeout=60) as feed:
        sidecar_order = [i for batch in feed for i in batch["id"].tolist()]
    assert kept_order == sidecar_order and sorted(kept_order) == list(range(24)) and kept_order != list(range(24))


def test_a_sidecar_comes_first_and_false_means_sidecars_only(tmp_path, shards):
    kept = tmp_path / "indexes"
    entry = write_cached_index(build_index(shards[0]), kept)
    with open(entry, "r+b") as f:                  # the kept index damaged: a sidecar beside the data wins
        f.seek(40)
        f.write(b"\xff" * 8)
    write_index(build_index(shards[0]))
    assert find_index(shards[0], kept).count == 12
    os.unlink(shards[0] + ".index")
    with pytest.raises(IndexFileError, match=rf"{entry}.*payload CRC32C mismatch"):
        find_index(shards[0], kept)
    assert find_index(shards[0], False) is None
    assert Dataset(shards, SPEC, batch_size=4, index_dir=False).indexes() is None


def test_a_file_changed_since_it_was_indexed_has_no_kept_index(tmp_path, shards):
    kept = tmp_path / "indexes"
    write_cached_index(build_index(shards[0]), kept)
    with open(shards[0], "ab") as f:
        f.write(_tfrecord.frame(infeed.encode_example({"id": [99]})))
    assert load_cached_index(shards[0], kept) is None
    with pytest.raises(ValueError, match=rf"needs a record index for every file and {shards[0]} has none beside it "
                                         rf"or in {kept}: run `infeed index`.*--output-dir DIR"):
        Dataset(shards, SPEC, batch_size=4, shuffle="global", index_dir=kept).indexes()


def test_an_index_of_a_file_that_changed_while_it_was_indexed_is_refused(tmp_path, shards):
    identity = data_identity(shards[0])
    index = build_index(shards[0])
    with open(shards[0], "ab") as f:
        f.write(_tfrecord.frame(b"late"))
    with pytest.raises(IndexFileError, match="changed while it was indexed"):
        write_cached_index(index, tmp_path / "indexes", identity)
    with pytest.raises(IndexFileError, match=rf"the index covers {index.file_size} bytes"):
        write_cached_index(index, tmp_path / "indexes")
    assert not (tmp_path / "indexes").exists() or os.listdir(tmp_path / "indexes") == []


def test_writers_racing_for_the_same_entry_leave_one_whole_index(tmp_path, shards):
    kept = tmp_path / "indexes"
    index = build_index(shards[1])
    start, errors = threading.Barrier(8), []

    def write():
        start.wait()
        try:
            for _ in range(20):
                write_cached_index(index, kept)
        except Exception as e:           # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=write) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(os.listdir(kept)) == 1
    assert load_cached_index(shards[1], kept).offsets.tolist() == index.offsets.tolist()


def test_the_default_directory_is_named_by_the_environment(monkeypatch, tmp_path, shards):
    monkeypatch.setenv(INDEX_DIR_ENV, str(tmp_path / "named"))
    assert default_index_dir() == str(tmp_path / "named")
    write_cached_index(build_index(shards[0]), tmp_path / "named")
    ds = Dataset(shards[:1], SPEC, batch_size=1)
    assert ds.index_dir is None and ds.indexes()[shards[0]].count == 12      # the default, looked up when used
    monkeypatch.delenv(INDEX_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_index_dir() == str(tmp_path / "xdg" / "infeed" / "indexes")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_index_dir() == os.path.join(os.path.expanduser("~"), ".cache", "infeed", "indexes")


def test_the_index_dir_travels_with_the_dataset_and_changes_no_fingerprint(tmp_path, shards):
    ds = Dataset(shards, SPEC, batch_size=4, index_dir=tmp_path / "indexes")
    again = Dataset.from_json(ds.to_json(), matched=True)
    assert again.index_dir == str(tmp_path / "indexes")
    assert Dataset(shards, SPEC, batch_size=4).to_json()["index_dir"] is None     # each host's own default
    assert ds.fingerprint() == Dataset(shards, SPEC, batch_size=4, index_dir=False).fingerprint()
    with pytest.raises(ValueError, match="index_dir must be a directory path, None"):
        Dataset(shards, SPEC, batch_size=4, index_dir=True)


def test_no_kept_directory_costs_no_look_up_of_the_data(tmp_path, shards, monkeypatch):
    from infeed.tfrecord import index_cache

    def refuse(path):
        raise AssertionError(f"looked {path} up")

    monkeypatch.setattr(index_cache, "data_identity", refuse)       # a round trip per object for a bucket's
    assert find_index(shards[0], tmp_path / "none here") is None


def _age(path, days: float) -> None:
    """Makes ``path``'s last use ``days`` days ago."""
    when = os.stat(path).st_mtime - days * 86400
    os.utime(path, (when, when))


def _rewrite(path, ids) -> None:
    """Writes ``path`` again with other records (another size), as a dataset regenerated in place."""
    with infeed.TFRecordWriter(path) as w:
        for i in ids:
            w.write(infeed.encode_example({"id": [i]}))


def test_an_older_versions_entry_goes_once_a_newer_one_is_built_and_it_is_unused_for_a_day(tmp_path, shards):
    kept = tmp_path / "indexes"
    build_indexes(shards, kept)
    old_entry, other = (cached_index_path(kept, data_identity(p)) for p in shards)
    _rewrite(shards[0], range(100, 115))
    new_entry = cached_index_path(kept, data_identity(shards[0]))
    assert new_entry != old_entry
    build_indexes([shards[0]], kept)                    # the old entry was used today: kept (a host may read it)
    assert os.path.exists(old_entry) and os.path.exists(new_entry)
    _age(old_entry, 2)
    _age(other, 2)                                      # another file's entry: never superseded by this one
    _rewrite(shards[0], range(200, 216))
    build_indexes([shards[0]], kept)
    assert not os.path.exists(old_entry) and os.path.exists(other)
    assert os.path.exists(new_entry)                    # the version before, used today, stays a day
    assert load_cached_index(shards[0], kept).count == 16


def test_a_load_marks_its_entry_used_and_gc_removes_only_entries_unused_for_a_month(tmp_path, shards, capsys):
    kept = tmp_path / "indexes"
    build_indexes(shards, kept)
    used, unused = (cached_index_path(kept, data_identity(p)) for p in shards)
    (kept / "train-00000-of-00002.idx").write_text("0 12\n")   # a tfrecord2idx index: the user's, never removed
    _age(kept / "train-00000-of-00002.idx", 90)
    for entry in (used, unused):
        _age(entry, 40)
    assert load_cached_index(shards[0], kept).count == 12
    assert time.time() - os.stat(used).st_mtime < 60
    assert [e.path for e in cache_entries(kept)] == [unused, used]               # oldest use first
    assert main(["gc", "--dry-run", "--index-dir", str(kept)]) == 0
    assert f"would remove {unused}" in capsys.readouterr().out and os.path.exists(unused)
    assert main(["gc", "--index-dir", str(kept)]) == 0
    out = capsys.readouterr().out
    assert f"removed {unused}" in out and "removed 1 index(es)" in out and used not in out
    assert sorted(os.listdir(kept)) == sorted([os.path.basename(used), "train-00000-of-00002.idx"])
    assert main(["gc", "--index-dir", str(kept), "--unused-days", "0"]) == 0      # every entry, used or not
    assert os.listdir(kept) == ["train-00000-of-00002.idx"]


def test_a_read_only_directory_of_indexes_is_read_without_marking_its_entries(tmp_path, shards, monkeypatch):
    kept = tmp_path / "indexes"
    build_indexes(shards, kept)
    entry = cached_index_path(kept, data_identity(shards[0]))
    _age(entry, 40)
    before = os.stat(entry).st_mtime

    def read_only(*args, **kwargs):                     # a read-only mount: root cannot write it either
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))
    monkeypatch.setattr(os, "utime", read_only)
    assert load_cached_index(shards[0], kept).count == 12 and os.stat(entry).st_mtime == before
