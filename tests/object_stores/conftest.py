"""Session-wide object stores on loopback for tests that read through ``pyarrow.fs``: ``s3_server`` (SeaweedFS) and
``gcs_server`` (fake-gcs-server), each started on first use and killed when the session ends, failed tests or not.
A test that kills one restarts it before it ends (``restart()`` in a ``finally``); where a server's executable
cannot run here, the tests that use it skip."""

import pytest

from bench.peers.object_stores import Unavailable, start_fake_gcs, start_seaweedfs


def _serve(start, folder):
    try:
        server = start(folder)
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    yield from _serve(start_seaweedfs, tmp_path_factory.mktemp("seaweedfs"))


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    yield from _serve(start_fake_gcs, tmp_path_factory.mktemp("fake-gcs-server"))
