"""Names derived from a file named by a URI with a query (``?endpoint_override=...&region=...``): the suffix goes on
the URI's path and the query stays last, so a sidecar index, a temporary name or a shard reaches the same store with
the same options. ``file://`` URIs take a query as ``s3://`` ones do (pyarrow parses both), so the whole path runs
here without a server: before, ``data?region=x`` + ``.index`` named the data file itself with the region ``x.index``.
"""

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import infeed
from infeed.commands.cli import main
from infeed.commands.convert import convert, shard_paths
from infeed.tfrecord.names import split_query, with_suffix
from infeed.tfrecord.index import build_index, index_path, is_index_file, load_index, write_index
from tfrecord_files import write_records

QUERY = "?region=us-east-1&connect_timeout=5"
RECORDS = [infeed.encode_example({"x": [float(i)] * 3, "label": [i]}) for i in range(40)]
SPEC = {"x": infeed.FixedLen((3,), "float32"), "label": infeed.FixedLen((), "int64")}


def uri(path) -> str:
    return f"file://{path}{QUERY}"


@pytest.mark.parametrize("path, suffix, want", [
    ("s3://bucket/k/train.tfrecord?endpoint_override=127.0.0.1:9000&scheme=http", ".index",
     "s3://bucket/k/train.tfrecord.index?endpoint_override=127.0.0.1:9000&scheme=http"),
    ("gs://bucket/train.tfrecord", ".index", "gs://bucket/train.tfrecord.index"),
    ("data/odd?name.tfrecord", ".index", "data/odd?name.tfrecord.index"),        # a local name: ? is a character
    ("s3://bucket/prefix?region=eu-west-1", "-00000-of-00001.tfrecord",
     "s3://bucket/prefix-00000-of-00001.tfrecord?region=eu-west-1"),
])
def test_a_suffix_goes_on_the_path_and_the_query_stays_last(path, suffix, want):
    assert with_suffix(path, suffix) == want
    assert split_query(want)[1] == split_query(path)[1]


def test_index_names_of_uris_with_a_query():
    assert index_path("s3://b/train.tfrecord?region=x") == "s3://b/train.tfrecord.index?region=x"
    assert is_index_file("s3://b/train.tfrecord.index?region=x")
    assert not is_index_file("s3://b/train.tfrecord?region=x.index")        # a query that happens to end so
    assert shard_paths("gs://b/out/train?anonymous=true", 2, "GZIP") == [
        "gs://b/out/train-00000-of-00002.tfrecord.gz?anonymous=true",
        "gs://b/out/train-00001-of-00002.tfrecord.gz?anonymous=true"]


def test_a_sidecar_written_through_a_uri_with_a_query_lands_beside_the_data_and_leaves_it_whole(tmp_path):
    data = write_records(tmp_path / "d.tfrecord", RECORDS)
    before = data.read_bytes()
    written = write_index(build_index(uri(data)))
    assert written == uri(str(data) + ".index")
    assert data.read_bytes() == before                            # not overwritten by the sidecar
    assert sorted(os.listdir(tmp_path)) == ["d.tfrecord", "d.tfrecord.index"]       # no temporary left either
    assert load_index(uri(data)).count == len(RECORDS)
    assert load_index(data).count == len(RECORDS)                 # the same sidecar, by its local name


def test_infeed_index_and_a_dataset_with_sidecars_over_uris_with_a_query(tmp_path):
    for k in range(2):
        write_records(tmp_path / f"s{k}.tfrecord", RECORDS[k::2])
    assert main(["index", uri(tmp_path / "s*.tfrecord")]) == 0
    assert sorted(os.listdir(tmp_path)) == ["s0.tfrecord", "s0.tfrecord.index", "s1.tfrecord", "s1.tfrecord.index"]
    assert main(["index", uri(tmp_path / "*")]) == 0              # the sidecars it matches are skipped
    assert sorted(os.listdir(tmp_path)) == ["s0.tfrecord", "s0.tfrecord.index", "s1.tfrecord", "s1.tfrecord.index"]
    ds = infeed.Dataset(uri(tmp_path / "s*.tfrecord"), SPEC, batch_size=5, labels="label", shuffle_buffer=8, seed=3)
    assert set(ds.indexes()) == {uri(tmp_path / f"s{k}.tfrecord") for k in range(2)}    # both sidecars found
    with infeed.Daemon(ds, num_workers=2, slots=4, lock_memory=False) as daemon:
        labels = np.concatenate([np.array(batch["label"]) for batch in daemon])
    assert sorted(labels.tolist()) == list(range(40))             # every record once, shuffled by the index


def test_convert_writes_shards_through_a_uri_with_a_query(tmp_path):
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0]}), tmp_path / "t.parquet")
    (tmp_path / "out").mkdir()
    result = convert([str(tmp_path / "t.parquet")], uri(tmp_path / "out" / "train"), shards=2)
    assert [s.path for s in result.shards] == [uri(tmp_path / "out" / f"train-0000{k}-of-00002.tfrecord")
                                               for k in range(2)]
    assert sorted(os.listdir(tmp_path / "out")) == ["train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]
    assert sum(1 for s in result.shards for _ in infeed.read_records(s.path)) == 3
    (tmp_path / "out" / "train-00000-of-00005.tfrecord").write_bytes(b"")          # an older run's shard
    stale = convert([str(tmp_path / "t.parquet")], uri(tmp_path / "out" / "train"), shards=2).stale
    assert stale == (uri(tmp_path / "out" / "train-00000-of-00005.tfrecord"),)
