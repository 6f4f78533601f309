"""The loopback object stores work through ``pyarrow.fs``: objects written read back whole and by range, list, outlive
a restart, and the S3 one is reached by URI (keys in the URI or the environment) and by a plain ``s3://`` URI under
its AWS environment variables."""

from datetime import timedelta

import pyarrow.fs as pafs
import pytest

from bench.peers.object_stores import GcsServer

DATA = bytes(range(256)) * 41 + b"end"          # 10499 bytes; a range read at the wrong offset shows


@pytest.fixture(params=["s3_server", "gcs_server"])
def store(request):
    return request.getfixturevalue(request.param)


def _write(fs, path: str, data: bytes = DATA):
    with fs.open_output_stream(path) as f:
        f.write(data)


def _impatient(store):
    """A filesystem for ``store`` that gives up at the first failed request."""
    if isinstance(store, GcsServer):
        return store.filesystem(retry_time_limit=timedelta(seconds=1))
    return store.filesystem(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))


def _key(request, name: str) -> str:
    """A key of this test's own, so that tests sharing a session's bucket do not see each other's objects."""
    return f"smoke/{request.node.name}/{name}"


def test_an_object_reads_back_whole_and_by_range(store, request):
    fs, path = store.filesystem(), f"{store.bucket}/{_key(request, 'a.bin')}"
    _write(fs, path)
    with fs.open_input_file(path) as f:
        assert f.size() == len(DATA)
        assert f.read_at(100, 5000) == DATA[5000:5100]
        assert f.read_at(100, len(DATA) - 3) == b"end"
        assert f.read() == DATA
    assert fs.get_file_info(path).size == len(DATA)


def test_objects_under_a_prefix_list_with_a_selector(store, request):
    fs, prefix = store.filesystem(), f"{store.bucket}/{_key(request, 'dir')}"
    for name in ("x", "y", "sub/z"):
        _write(fs, f"{prefix}/{name}", name.encode())
    files = {i.path: i.size for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True))
             if i.type == pafs.FileType.File}
    assert files == {f"{prefix}/x": 1, f"{prefix}/y": 1, f"{prefix}/sub/z": 5}
    assert fs.get_file_info(pafs.FileSelector(prefix + "/nothing-here", allow_not_found=True)) == []


def test_objects_outlive_a_restart_and_reads_fail_while_the_server_is_down(store, request):
    path = f"{store.bucket}/{_key(request, 'kept.bin')}"
    _write(store.filesystem(), path)
    store.kill()
    try:
        assert not store.answers()
        with pytest.raises(OSError):
            _impatient(store).open_input_file(path).read()
    finally:
        store.restart()
    with store.filesystem().open_input_file(path) as f:
        assert f.read() == DATA


def test_an_s3_uri_with_the_keys_in_it_reaches_the_server(s3_server, request):
    key = _key(request, "by uri.bin")
    _write(s3_server.filesystem(), f"{s3_server.bucket}/{key}")
    fs, path = pafs.FileSystem.from_uri(s3_server.uri(key, credentials=True))
    assert path == f"{s3_server.bucket}/{key}"
    assert fs.open_input_file(path).read_at(10, 256) == DATA[256:266]


def test_an_s3_uri_takes_its_keys_from_the_environment(s3_server, request, monkeypatch):
    key = _key(request, "b.bin")
    _write(s3_server.filesystem(), f"{s3_server.bucket}/{key}")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, s3_server.env()[name])
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    fs, path = pafs.FileSystem.from_uri(s3_server.uri(key))
    assert fs.open_input_file(path).read() == DATA


def test_a_plain_s3_uri_reaches_the_server_under_its_environment(s3_server, request, monkeypatch):
    key = _key(request, "c.bin")
    _write(s3_server.filesystem(), f"{s3_server.bucket}/{key}")
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    fs, path = pafs.FileSystem.from_uri(f"s3://{s3_server.bucket}/{key}")
    assert fs.region == s3_server.region
    assert fs.open_input_file(path).read_at(3, len(DATA) - 3) == b"end"


def test_a_gs_uri_reaches_the_server(gcs_server, request):
    key = _key(request, "by uri.bin")
    _write(gcs_server.filesystem(), f"{gcs_server.bucket}/{key}")
    fs, path = pafs.FileSystem.from_uri(gcs_server.uri(key))
    assert path == f"{gcs_server.bucket}/{key}"
    assert fs.open_input_file(path).read_at(10, 256) == DATA[256:266]


def test_a_large_object_goes_up_in_a_resumable_upload_and_reads_back_by_range(gcs_server, request):
    data = DATA * 1000                               # 10 MB: more than one upload chunk
    fs, path = gcs_server.filesystem(), f"{gcs_server.bucket}/{_key(request, 'large.bin')}"
    _write(fs, path, data)
    with fs.open_input_file(path) as f:
        assert f.size() == len(data)
        assert f.read_at(1000, 7_000_000) == data[7_000_000:7_001_000]
