"""Dataset.count_records: the records of one epoch of a host's shard, as the daemon delivers them."""

import numpy as np
import pytest

import infeed
from infeed.tfrecord.index import build_index, write_index

SPEC = {"x": infeed.FixedLen((), "float32")}


@pytest.fixture()
def paths(tmp_path):
    out = []
    for f, n in enumerate([7, 10, 3]):
        out.append(str(tmp_path / f"f{f}.tfrecord") + (".gz" if f == 1 else ""))
        with infeed.TFRecordWriter(out[-1], compression="GZIP" if f == 1 else None) as w:
            for i in range(n):
                w.write(infeed.encode_example({"x": [float(100 * f + i)]}))
    return out


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4, 6])
def test_count_records_matches_what_each_shard_delivers(paths, num_shards):
    for shard in range(num_shards):
        ds = infeed.Dataset(paths, SPEC, 4, shard_index=shard, num_shards=num_shards, final_batch="pad")
        with infeed.Daemon(ds, num_workers=1, slots=2) as feed:
            delivered = sum(int((~np.asarray(b["is_padding"])).sum()) for b in feed)
        assert ds.count_records() == delivered


def test_count_records_uses_index_sidecars(paths, tmp_path):
    plain = [p for p in paths if not p.endswith(".gz")]
    for p in plain:
        write_index(build_index(p))
    ds = infeed.Dataset(plain, SPEC, 4)
    assert ds.indexes() is not None and ds.count_records() == 10


def test_an_empty_compression_reads_plain_files_as_tensorflow_spells_it(paths):
    plain = [p for p in paths if not p.endswith(".gz")]
    ds = infeed.Dataset(plain, SPEC, 4, compression="")
    assert ds.count_records() == 10
    with pytest.raises(ValueError, match="compression"):
        infeed.Dataset(plain, SPEC, 4, compression="gzip")


def test_max_record_size_reaches_the_workers_and_leaves_the_fingerprint_alone(tmp_path):
    path = str(tmp_path / "big.tfrecord")
    small, big = infeed.encode_example({"x": [1.0]}), infeed.encode_example({"x": [2.0], "pad": [b"z" * 500]})
    with infeed.TFRecordWriter(path) as w:
        for record in (small, small, big):
            w.write(record)
    ds = infeed.Dataset(path, SPEC, 1, max_record_size=100)
    assert infeed.Dataset.from_json(ds.to_json()).max_record_size == 100
    assert ds.fingerprint() == ds.replace(max_record_size=1 << 20).fingerprint()   # a resume may change it
    with infeed.Daemon(ds, num_workers=1, slots=2, lock_memory=False) as feed:
        assert [float(next(feed)["x"][0]) for _ in range(2)] == [1.0, 1.0]
        with pytest.raises(infeed.CorruptRecordError) as info:
            next(feed)
    err = info.value
    assert (err.kind, err.path, err.record_index, err.offset) == ("record_too_large", path, 2, 2 * (16 + len(small)))
    with pytest.raises(ValueError, match="max_record_size"):
        infeed.Dataset(path, SPEC, 1, max_record_size=0)
