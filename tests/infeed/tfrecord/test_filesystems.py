"""Which filesystem opens a URI: registered ones (by the longest prefix, built from JSON options or a factory, in
the daemon's workers too), gs:// options from the query and STORAGE_EMULATOR_HOST, and the errors that name the
URI. The servers themselves are in tests/object_stores; here a factory maps a bucket onto a local folder."""

import os
import time

import numpy as np
import pyarrow.fs as pafs
import pytest

import infeed
from infeed.errors import FileSystemConfigError
from infeed.tfrecord import filesystems
from infeed.tfrecord.filesystems import (filesystem_for, register_filesystem, registered_filesystems,
                                         unregister_filesystem)
from tfrecord_files import write_records

RECORDS = [infeed.encode_example({"x": [float(i)] * 2, "label": [i]}) for i in range(24)]
SPEC = {"x": infeed.FixedLen((2,), "float32"), "label": infeed.FixedLen((), "int64")}


def local_tree(root):
    """A factory for register_filesystem: bucket/key under the folder ``root``."""
    return pafs.SubTreeFileSystem(root, pafs.LocalFileSystem())


@pytest.fixture
def bucket(tmp_path, clean_registry):
    """s3://test-bucket/ registered onto tmp_path/test-bucket through a factory."""
    (tmp_path / "test-bucket").mkdir()
    register_filesystem("s3://test-bucket", factory=f"{__name__}:local_tree", root=str(tmp_path))
    return tmp_path / "test-bucket"


def test_a_registered_bucket_is_read_written_and_globbed_through_its_filesystem(bucket):
    write_records(bucket / "a.tfrecord", RECORDS[:10])
    with infeed.TFRecordWriter("s3://test-bucket/b.tfrecord") as writer:
        for record in RECORDS[10:]:
            writer.write(record)
    assert (bucket / "b.tfrecord").exists()
    assert list(infeed.read_records("s3://test-bucket/a.tfrecord")) == RECORDS[:10]
    assert [r for f in infeed.tfrecord.expand_files("s3://test-bucket/*.tfrecord") for r in infeed.read_records(f)] \
        == RECORDS


def test_the_daemons_workers_open_a_registered_filesystem_too(bucket):
    for k in range(2):
        write_records(bucket / f"part-{k}.tfrecord", RECORDS[k::2])
    ds = infeed.Dataset("s3://test-bucket/part-*.tfrecord", SPEC, batch_size=4, shuffle_buffer=6, seed=1)
    with infeed.Daemon(ds, num_workers=2, slots=4, lock_memory=False) as daemon:
        labels = np.concatenate([np.array(batch["label"]) for batch in daemon])     # copies: slots are reused
    assert sorted(labels.tolist()) == list(range(24))


def test_the_longest_registered_prefix_wins_and_unregistering_restores_the_default(tmp_path, clean_registry):
    (tmp_path / "one").mkdir()
    (tmp_path / "two" / "b" / "deep").mkdir(parents=True)
    register_filesystem("s3://", factory=f"{__name__}:local_tree", root=str(tmp_path / "one"))
    register_filesystem("S3://b/deep/", factory=f"{__name__}:local_tree", root=str(tmp_path / "two"))
    write_records(tmp_path / "two" / "b" / "deep" / "x.tfrecord", RECORDS[:3])
    assert list(infeed.read_records("s3://b/deep/x.tfrecord")) == RECORDS[:3]
    with pytest.raises(FileNotFoundError):
        list(infeed.read_records("s3://b/shallow.tfrecord"))          # under one/, where nothing is
    unregister_filesystem("s3://")
    unregister_filesystem("s3://b/deep/")
    assert registered_filesystems() == []
    fs, inner = filesystem_for("file:///tmp/x.tfrecord")
    assert isinstance(fs, pafs.LocalFileSystem) and inner == "/tmp/x.tfrecord"


def test_an_s3_kind_is_built_from_json_options():
    with pytest.raises(FileSystemConfigError, match="s3://cfg-bucket: building its filesystem"):
        register_filesystem("s3://cfg-bucket", "s3", no_such_option=1)


@pytest.mark.parametrize("call, problem", [
    (lambda: register_filesystem("bucket", "s3"), "a prefix is a URI's scheme or location"),
    (lambda: register_filesystem("s3://b?region=x", "s3"), "a prefix is a URI's scheme or location"),
    (lambda: register_filesystem("s3://b"), "give exactly one of a kind"),
    (lambda: register_filesystem("s3://b", "s3", factory="m:f"), "give exactly one of a kind"),
    (lambda: register_filesystem("s3://b", "ftp"), "unknown kind 'ftp'"),
    (lambda: register_filesystem("s3://b", factory="no_colon"), "a factory is 'module:function'"),
    (lambda: register_filesystem("s3://b", factory="no_such_module_here:f"), "building its filesystem"),
    (lambda: register_filesystem("s3://b", "s3", retry=object()), "options must be JSON"),
    (lambda: register_filesystem("s3://b", "s3", region=("a", "b")), "options must be JSON"),
])
def test_a_registration_that_cannot_work_is_refused_at_once(call, problem, clean_registry):
    with pytest.raises(FileSystemConfigError, match=problem):
        call()
    assert registered_filesystems() == []


def test_a_gs_query_option_pyarrow_and_we_do_not_know_is_named(monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    with pytest.raises(FileSystemConfigError, match=r"gs://b/k\?regoin=x: unknown option 'regoin'.*anonymous"):
        filesystem_for("gs://b/k?regoin=x")
    with pytest.raises(FileSystemConfigError, match="anonymous='maybe' in the query: true or false"):
        filesystem_for("gs://b/k?anonymous=maybe")


def test_storage_emulator_host_and_an_anonymous_query_make_a_gcs_filesystem_that_needs_no_credentials(monkeypatch):
    """Built without a credentials lookup (which, with none on the machine, took 30 s and more): anonymous."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    fs, inner = filesystem_for("gs://bucket/dir/file.tfrecord")
    assert isinstance(fs, pafs.GcsFileSystem) and inner == "bucket/dir/file.tfrecord"
    assert filesystem_for("gs://bucket/other")[0] is fs                   # one client per set of options
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    fs2, _ = filesystem_for("gs://bucket/k?anonymous=true&scheme=http&endpoint_override=127.0.0.1:9"
                            "&retry_limit_seconds=1")
    assert isinstance(fs2, pafs.GcsFileSystem) and fs2 is not fs


@pytest.fixture
def nowhere_to_find_google_credentials(monkeypatch, tmp_path):
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "GCE_METADATA_HOST", "GCE_METADATA_ROOT",
                 "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(filesystems, "GCE_PRODUCT_NAME_FILE", str(tmp_path / "product_name"))
    return tmp_path


def test_gs_without_any_credentials_to_find_fails_at_once_naming_where_it_looked(nowhere_to_find_google_credentials):
    started = time.monotonic()
    with pytest.raises(FileSystemConfigError, match=r"gs://bucket/train.tfrecord: no Google credentials to be found: "
                                                     r"GOOGLE_APPLICATION_CREDENTIALS is unset, .*gcloud"
                                                     r"/application_default_credentials.json does not exist"):
        list(infeed.read_records("gs://bucket/train.tfrecord"))
    assert time.monotonic() - started < 5                       # not the metadata server's 30 s and more
    assert isinstance(filesystem_for("gs://anonymous@bucket/x")[0], pafs.GcsFileSystem)    # asks for none


@pytest.mark.parametrize("where", ["GOOGLE_APPLICATION_CREDENTIALS", "gcloud", "GCE_METADATA_HOST", "gce"])
def test_each_place_google_credentials_come_from_lets_gs_through(nowhere_to_find_google_credentials, monkeypatch,
                                                                 where):
    home = nowhere_to_find_google_credentials
    if where == "gcloud":
        (home / ".config" / "gcloud").mkdir(parents=True)
        (home / ".config" / "gcloud" / "application_default_credentials.json").write_text("{}")
    elif where == "gce":
        (home / "product_name").write_text("Google Compute Engine\n")
    else:
        monkeypatch.setenv(where, str(home / "key.json") if where.startswith("GOOGLE") else "127.0.0.1:9")
    assert filesystems.google_credentials_source() is not None
