"""A file rewritten after it was indexed, read through its index: never a batch of records of two versions.

Each case rewrites a local file in place with records of the same sizes and other values (every CRC of the new
file valid), as a replaced object of the same layout would be, and reads it through every path that goes
through an index: the daemon's global shuffle, its shuffle buffer over indexed files, a resume from its state,
the Grain source (sidecar or built in memory), and a version-1 sidecar or a tfrecord2idx text index, which pin
only the file's size and modification time. The error reaches the trainer as itself, with its attributes. The same on S3 and GCS servers:
tests/object_stores/test_infeed_on_object_stores.py."""

import os

import numpy as np
import pytest

import infeed
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.index import build_index, index_path, load_index, open_indexed, write_index
from tfrecord_files import tfrecord2idx

SPEC = {"x": infeed.FixedLen((2,), "float32"), "label": infeed.FixedLen((), "int64")}
COUNT, BATCH = 400, 8


def version(v: int) -> list[bytes]:
    """Records of the same sizes in every version (float32 values, the same labels): only ``x`` tells them apart."""
    return [infeed.encode_example({"x": [float(i), float(v)], "label": [i]}) for i in range(COUNT)]


def write(path, records) -> str:
    with infeed.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def rewrite_in_place(path: str, records) -> None:
    """The file's bytes overwritten through the same inode (the open descriptors of a reader see them)."""
    data = b"".join(_tfrecord.frame(r) for r in records)
    assert len(data) == os.path.getsize(path)
    with open(path, "r+b") as f:
        f.write(data)


@pytest.fixture
def indexed(tmp_path):
    path = write(tmp_path / "d.tfrecord", version(1))
    write_index(build_index(path))
    return path


def read_until_changed(ds, rewrite_after: int, path: str, state=None):
    """The batches a W=1 daemon gives before its error, the file rewritten once ``rewrite_after`` came."""
    got = []
    with infeed.Daemon(ds, num_workers=1, slots=2, lock_memory=False, timeout=60, state=state) as feed:
        with pytest.raises(infeed.SourceChangedError) as changed:
            for batch in feed:
                got.append(np.array(batch["x"]))
                if len(got) == rewrite_after:
                    rewrite_in_place(path, version(2))
    return np.concatenate(got) if got else np.zeros((0, 2)), changed.value


@pytest.mark.parametrize("shuffle", [dict(shuffle="global"), dict(shuffle_buffer=64)], ids=["global", "buffer"])
def test_a_daemon_reading_through_an_index_stops_at_the_first_record_of_the_new_version(indexed, shuffle):
    ds = infeed.Dataset(indexed, SPEC, batch_size=BATCH, seed=3, **shuffle)
    assert ds.indexes() is not None
    got, error = read_until_changed(ds, 3, indexed)
    assert len(got) >= 3 * BATCH and len(got) < COUNT
    assert (got[:, 1] == 1).all()                                 # version 1 only, up to the error
    assert type(error) is infeed.SourceChangedError and isinstance(error, OSError)   # itself, not an InfeedError
    assert error.path == indexed and error.record_index is not None
    assert error.offset == int(load_index(indexed).offsets[error.record_index])
    assert error.before != error.after
    assert f"record {error.record_index} at byte offset {error.offset} is not the record indexed" in str(error)


def test_a_resume_through_an_index_after_the_file_was_rewritten_raises_before_any_batch(indexed):
    ds = infeed.Dataset(indexed, SPEC, batch_size=BATCH, shuffle="global", seed=3)
    with infeed.Daemon(ds, num_workers=1, slots=2, lock_memory=False, timeout=60) as feed:
        for k, _ in zip(range(4), feed):
            pass
        state = feed.state()
    rewrite_in_place(indexed, version(2))
    got, error = read_until_changed(ds, -1, indexed, state=state)
    assert len(got) == 0 and error.path == indexed


@pytest.mark.parametrize("kind", ["version 1", "tfrecord2idx"])
def test_an_index_without_crcs_pins_the_file_at_open_and_finds_it_rewritten_after_a_batch(indexed, kind):
    if kind == "version 1":
        write_index(load_index(indexed)._replace(data_crcs=None))
    else:                                     # DALI's and the tfrecord package's text index, as the sidecar
        tfrecord2idx(indexed, index_path(indexed))
    assert load_index(indexed).data_crcs is None
    ds = infeed.Dataset(indexed, SPEC, batch_size=BATCH, shuffle="global", seed=3)
    got, error = read_until_changed(ds, 3, indexed)
    assert (got[:, 1] == 1).all() and len(got) < COUNT
    assert error.record_index is None and error.path == indexed
    assert error.before[0] == error.after[0] == os.path.getsize(indexed)   # the same size, modified later
    assert error.before[1] < error.after[1]
    assert "changed while it was read" in str(error)


def test_a_file_whose_size_changed_since_indexed_is_a_stale_index_before_anything_is_read(indexed):
    index = load_index(indexed)
    with open(indexed, "ab") as f:
        f.write(b"\0" * 16)
    with pytest.raises(infeed.IndexFileError, match=f"stale: built for {index.file_size} bytes"):
        open_indexed(indexed, index)


@pytest.mark.parametrize("missing_index", ["error", "build"])
def test_the_grain_source_never_hands_out_a_record_of_the_new_version(tmp_path, missing_index):
    grain_source = pytest.importorskip("infeed.grain")
    path = write(tmp_path / "d.tfrecord", version(1))
    if missing_index == "error":
        write_index(build_index(path))
    source = grain_source.TFRecordSource(path, missing_index=missing_index)
    assert source[5] == version(1)[5]
    rewrite_in_place(path, version(2))
    with pytest.raises(infeed.SourceChangedError) as changed:
        source._getitems([7, 8, 9])
    assert (changed.value.path, changed.value.record_index) == (path, 7)
    with pytest.raises(infeed.SourceChangedError):
        source[5]
