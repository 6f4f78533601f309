"""tfrecord2idx's text indexes (NVIDIA DALI's tool, the tfrecord package's): read as sidecars (``FILE.index``,
``FILE.idx``, ``FILE.tfindex``), from an index directory named after their data files (DALI's ``idx_files/``),
and through ``load_index(index_file=)``; refused, naming the index and the line, when they do not tile the file."""

import os

import numpy as np
import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.commands.cli import main
from infeed.errors import IndexFileError
from infeed.tfrecord.index import build_index, is_index_file, load_index, write_index
from infeed.tfrecord.index_cache import find_index
from infeed.tfrecord.text_index import text_index_limit
from tfrecord_files import tfrecord2idx, write_example_shards

SPEC = {"id": FixedLen((), "int64")}


@pytest.fixture
def shards(tmp_path):
    """10 and 11 records of several sizes."""
    return write_example_shards(tmp_path / "data", [f"train-{s:05d}-of-00002" for s in range(2)],
                                lambda s: ({"id": [100 * s + i], "pad": b"x" * (7 * i)} for i in range(10 + s)))


def _ids(ds, workers=2):
    with Daemon(ds, num_workers=workers, timeout=60) as feed:
        return [i for batch in feed for i in batch["id"].tolist()]


def test_a_text_index_loads_as_the_offsets_and_lengths_infeed_builds_without_crcs(shards, tmp_path):
    built = build_index(shards[0])
    loaded = load_index(shards[0], index_file=tfrecord2idx(shards[0], tmp_path / "a.idx"))
    assert loaded.path == shards[0] and loaded.file_size == built.file_size == os.path.getsize(shards[0])
    assert loaded.offsets.dtype == loaded.lengths.dtype == np.int64
    assert loaded.offsets.tolist() == built.offsets.tolist() and loaded.lengths.tolist() == built.lengths.tolist()
    assert loaded.data_crcs is None                                           # read as a version-1 sidecar


ALL = list(range(10)) + list(range(100, 111))


@pytest.mark.parametrize("suffix", [".index", ".idx", ".tfindex"])
def test_a_text_index_beside_the_data_is_its_sidecar_and_gives_infeeds_global_shuffle_order(shards, suffix):
    for path in shards:
        tfrecord2idx(path, path + suffix)
    ds = Dataset(shards, SPEC, batch_size=3, shuffle="global", seed=4, index_dir=False)
    assert set(ds.indexes()) == set(shards)
    got = _ids(ds)
    for path in shards:                                   # infeed's own sidecars instead: the same batches
        os.unlink(path + suffix)
        write_index(build_index(path))
    assert got == _ids(Dataset(shards, SPEC, batch_size=3, shuffle="global", seed=4, index_dir=False))
    assert sorted(got) == ALL and got != ALL


def test_dalis_idx_files_folder_serves_as_the_index_dir(shards, tmp_path):
    folder = tmp_path / "idx_files"
    folder.mkdir()
    for path in shards:
        tfrecord2idx(path, folder / (os.path.basename(path) + ".idx"))
    assert find_index(shards[0], index_dir=False) is None                   # sidecars only: none
    assert find_index(shards[1], index_dir=folder).count == 11
    ds = Dataset(shards, SPEC, batch_size=3, shuffle="global", seed=1, index_dir=folder)
    assert set(ds.indexes()) == set(shards)
    assert sorted(_ids(ds, workers=1)) == ALL


def test_the_index_of_another_file_of_the_same_name_is_stale_never_read(shards, tmp_path):
    folder = tmp_path / "idx_files"
    folder.mkdir()
    tfrecord2idx(shards[1], folder / (os.path.basename(shards[0]) + ".idx"))     # shard 1's, named as shard 0's
    with pytest.raises(IndexFileError, match=r"train-00000-of-00002\.idx: unusable record index: stale: its "
                                             r"records end at byte \d+, the data file has \d+ bytes"):
        find_index(shards[0], index_dir=folder)


def test_a_file_appended_to_after_its_text_index_is_stale(shards):
    index = tfrecord2idx(shards[0], shards[0] + ".idx")
    with infeed.TFRecordWriter(shards[0] + ".more") as w:
        w.write(infeed.encode_example({"id": [999]}))
    with open(shards[0], "ab") as f, open(shards[0] + ".more", "rb") as more:
        f.write(more.read())
    with pytest.raises(IndexFileError, match=rf"{index}: unusable record index: stale: its records end at byte"):
        Dataset(shards, SPEC, batch_size=3, shuffle="global", index_dir=False).indexes()


@pytest.mark.parametrize("text, problem", [
    (b"0 20\nabc def\n", r"line 2 is b'abc def', not 'OFFSET LENGTH'"),
    (b"0 20 7\n", r"line 1 is b'0 20 7', not 'OFFSET LENGTH'"),
    (b"0 20\n21 30\n", r"line 2: record 1 starts at byte 21, where the records before it end at byte 20"),
    (b"0 12\n", r"line 1: record 0 is 12 bytes long, less than the 16 bytes of a record's framing"),
    (b"0 99999999999999999999999\n", r"a number too large for a byte offset"),
    (b"7\n", r"line 1 is b'7', not 'OFFSET LENGTH'"),
])
def test_a_damaged_text_index_is_refused_naming_the_index_and_the_line(shards, tmp_path, text, problem):
    index = tmp_path / "bad.idx"
    index.write_bytes(text)
    with pytest.raises(IndexFileError, match=rf"{index}: unusable record index: {problem}"):
        load_index(shards[0], index_file=index)


def test_a_text_index_longer_than_its_file_can_need_is_refused_unread(shards, tmp_path):
    size = os.path.getsize(shards[0])
    index = tmp_path / "long.idx"
    index.write_bytes(b"0 16\n" * (text_index_limit(size) // 5 + 1))
    with pytest.raises(IndexFileError, match=rf"more than a text index of the data file's {size} bytes can take"):
        load_index(shards[0], index_file=index)


def test_text_indexes_are_index_files_not_data_to_globs_and_infeed_index(shards, capsys):
    for path in shards:
        tfrecord2idx(path, path + ".idx")
    assert is_index_file(shards[0] + ".idx") and is_index_file("gs://b/x.tfindex?anonymous=true")
    assert not is_index_file(shards[0])
    assert main(["index", os.path.join(os.path.dirname(shards[0]), "*")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith("2 indexed, 0 up to date")
