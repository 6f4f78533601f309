"""``infeed serve`` names: kept in a directory private to the user, never blocked or redirected by a planted
file or link, replaced when their server is gone, collected by ``infeed gc``."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import infeed
from infeed import Dataset
from infeed.ring.names import alias_path, names_dir, resolve_name, write_alias
from infeed.ring.orphans import collect
from infeed.ring.segments import SHM_DIR

from .processes import (ROOT, SPEC, alive, children, group_members, kill_server, read_line, segment_path,
                        write_files)


class Servers:
    """The ``infeed serve`` processes a test starts, each in a session of its own; :meth:`close` (the ``serve``
    fixture's teardown, whatever ended the test: a failed assertion, a timeout, an interrupt) kills each with
    its workers and removes its ring."""

    def __init__(self):
        self.started: list[tuple[subprocess.Popen, str | None]] = []

    def start(self, tmp_path, name: str, wait: float = 60) -> tuple[subprocess.Popen, str]:
        """A server of a 2-record-batch dataset under ``name``, once it says it serves (within ``wait`` s):
        (process, segment name)."""
        tmp_path.mkdir(exist_ok=True)
        ds = Dataset(write_files(tmp_path), SPEC, batch_size=2, num_epochs=None)
        config = tmp_path / "ds.json"
        config.write_text(json.dumps(ds.to_json()))
        server = subprocess.Popen([sys.executable, "-m", "infeed", "serve", "--config", str(config), "--name",
                                   name, "--workers", "1", "--slots", "2", "--no-mlock"], stdout=subprocess.PIPE,
                                  text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                                  start_new_session=True)
        self.started.append((server, None))
        line = read_line(server, wait)
        assert line.startswith("serving"), line
        segment = line.split("(ring ")[1].split(",")[0]
        self.started[-1] = (server, segment_path(segment))
        return server, segment

    def close(self) -> None:
        while self.started:
            server, segment = self.started.pop()
            kill_server(server, segment)

    def __enter__(self) -> "Servers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@pytest.fixture
def serve():
    """``serve(tmp_path, name)``: :meth:`Servers.start`; every server started is gone after the test."""
    with Servers() as servers:
        yield servers.start


@pytest.fixture
def name(request):
    name = f"names-{os.getpid()}-{request.node.name[-20:]}".replace("[", "-").replace("]", "")
    yield name
    try:
        os.unlink(alias_path(name))
    except FileNotFoundError:
        pass


def test_names_live_in_a_private_directory(tmp_path, name, serve):
    server, segment = serve(tmp_path, name)
    try:
        st = os.lstat(names_dir())
        assert oct(st.st_mode & 0o777) == "0o700" and st.st_uid == os.getuid()
        assert oct(os.stat(alias_path(name)).st_mode & 0o777) == "0o600"
        assert resolve_name(name) == segment
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(20)


def test_a_planted_link_at_a_name_is_an_attach_error_naming_the_path(name):
    os.makedirs(names_dir(), mode=0o700, exist_ok=True)
    os.symlink("/etc/passwd", alias_path(name))
    with pytest.raises(infeed.AttachError, match="symbolic link") as info:
        infeed.attach(name)
    assert alias_path(name) in str(info.value) and info.value.check == "alias"


def test_a_names_directory_that_is_not_private_is_refused_not_used(name, monkeypatch, tmp_path):
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o777)
    os.chmod(planted, 0o777)
    monkeypatch.setattr("infeed.ring.names.names_dir", lambda: str(planted))
    with pytest.raises(infeed.AttachError, match="0o777") as info:
        write_alias(name, "infeed-0-x")
    assert str(planted) in str(info.value)
    assert os.listdir(planted) == []


@pytest.mark.serial
def test_a_killed_servers_name_is_replaced_by_the_next_server_and_collected_by_gc(tmp_path, name, serve):
    server, segment = serve(tmp_path / "a", name)
    server.kill()
    server.wait()
    assert os.path.exists(alias_path(name))                      # left behind by the SIGKILL
    again, second = serve(tmp_path / "b", name)                 # a stale name does not block its next server
    try:
        assert resolve_name(name) == second != segment
        with infeed.attach(name, timeout=60) as feed:
            assert np.array_equal(next(feed)["id"], [0, 1])
    finally:
        again.kill()
        again.wait()
    removed = {path for path, _ in collect()}
    assert alias_path(name) in removed and os.path.join(SHM_DIR, second) in removed


def test_a_live_name_is_not_taken_by_a_second_server(tmp_path, name, serve):
    server, segment = serve(tmp_path, name)
    try:
        with pytest.raises(ValueError, match="already served"):
            write_alias(name, "infeed-0-other")
        assert resolve_name(name) == segment
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(20)


def test_a_server_that_outlives_its_test_is_killed_with_its_workers_and_ring(tmp_path, name):
    # The serve fixture's teardown where the test timed out waiting for its server to stop.
    with pytest.raises(subprocess.TimeoutExpired):
        with Servers() as servers:
            server, segment = servers.start(tmp_path, name)
            workers = sorted(children(server.pid))
            assert workers and os.path.exists(segment_path(segment))
            os.kill(server.pid, signal.SIGSTOP)             # it cannot stop on its own
            server.send_signal(signal.SIGINT)
            server.wait(0.5)
    assert server.returncode == -signal.SIGKILL and not group_members(server.pid)
    assert not any(alive(pid) for pid in workers) and not os.path.exists(segment_path(segment))
