"""Files we write, TensorFlow reads back, value for value (skipped when TensorFlow is absent)."""

import numpy as np
import pytest

import infeed

tf = pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_tensorflow_reads_our_records_and_examples(tmp_path, compression):
    rng = np.random.default_rng(0)
    rows = [{"image": rng.random(12, dtype=np.float32), "label": int(rng.integers(-2**63, 2**63 - 1)),
             "tokens": rng.integers(0, 1000, int(rng.integers(0, 9))), "id": f"rec-{i}".encode()}
            for i in range(50)]
    path = tmp_path / "ours.tfrecord"
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for row in rows:
            w.write(infeed.encode_example(row))
    spec = {"image": tf.io.FixedLenFeature([12], tf.float32), "label": tf.io.FixedLenFeature([], tf.int64),
            "tokens": tf.io.VarLenFeature(tf.int64), "id": tf.io.FixedLenFeature([], tf.string)}
    ds = tf.data.TFRecordDataset(str(path), compression_type=compression or "")
    for row, serialized in zip(rows, ds, strict=True):
        got = tf.io.parse_single_example(serialized, spec)
        assert np.array_equal(got["image"].numpy(), row["image"])
        assert got["label"].numpy() == row["label"]
        assert got["tokens"].values.numpy().tolist() == row["tokens"].tolist()
        assert got["id"].numpy() == row["id"]
