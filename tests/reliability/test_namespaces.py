"""Rings shared across PID namespaces: two containers that share ``/dev/shm`` but not their PIDs (a trainer
and an ``infeed serve`` sidecar in one Kubernetes pod, ``docker --ipc=host``). The server runs here under
``unshare --pid --fork --mount-proc``: its PIDs mean nothing (or someone else) to this process.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

import infeed
from infeed import Dataset
from infeed.ring.names import alias_path
from infeed.ring.orphans import collect, orphans
from infeed.ring.segments import SHM_DIR

from .processes import ROOT, SPEC, kill_server, read_line, wait_until, write_files


def _unshare_works() -> str:
    """Why a PID namespace cannot be made here, or ""."""
    if shutil.which("unshare") is None:
        return "no unshare command (util-linux)"
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c",
                            "import os; print(os.getpid())"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        return f"unshare --pid --fork --mount-proc failed here: {probe.stderr.strip()[:200]}"
    return ""


# serial: a ring must stay an orphan until the test collects it, and the test collects every orphan of the user.
pytestmark = [pytest.mark.skipif(bool(reason := _unshare_works()), reason=reason or "unused"), pytest.mark.serial]


@pytest.fixture
def served(tmp_path):
    """An ``infeed serve`` in its own PID namespace (name ``ns-<pid>``), killed with it at the end."""
    ds = Dataset(write_files(tmp_path), SPEC, batch_size=2, num_epochs=None)
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(ds.to_json()))
    name = f"ns-{os.getpid()}"
    # --kill-child: SIGKILL to unshare is SIGKILL to the server, PID 1 of its namespace, and so to its workers.
    # Its own session too: whatever ends the test (its server never saying it serves included), the group goes.
    server = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL",
                               sys.executable, "-m", "infeed", "serve", "--config", str(config), "--name", name,
                               "--workers", "2", "--slots", "4", "--no-mlock"],
                              stdout=subprocess.PIPE, text=True, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": ROOT}, start_new_session=True)
    segment = None
    try:
        line = read_line(server)
        assert line.startswith("serving"), line
        segment = os.path.join(SHM_DIR, line.split("(ring ")[1].split(",")[0])
        yield name, segment, server
    finally:
        kill_server(server, segment)
        collect()


def test_gc_keeps_a_ring_served_from_another_pid_namespace_and_attach_reads_it(served):
    name, segment, server = served
    assert segment not in orphans() and os.path.exists(segment)
    collect()
    assert os.path.exists(segment) and os.path.exists(alias_path(name))
    with infeed.attach(name, timeout=60) as feed:
        ids = [next(feed)["id"].tolist() for _ in range(30)]     # the owner and workers checked all along
        assert feed.ring.creator_pid == 1
    assert ids == [[(2 * b) % 100, (2 * b + 1) % 100] for b in range(30)]
    assert server.poll() is None and os.path.exists(segment)


def test_a_killed_server_in_another_namespace_has_its_ring_and_name_collected(served):
    name, segment, server = served
    with infeed.attach(name, timeout=60) as feed:
        next(feed)
        server.send_signal(signal.SIGKILL)
        server.wait()
        with pytest.raises((infeed.WorkerDied, infeed.InfeedError)):     # never a hang
            for _ in range(1000):
                next(feed)
    assert wait_until(lambda: segment in orphans(), 10)
    removed = {path for path, _ in collect()}
    assert segment in removed or not os.path.exists(segment)
    assert not os.path.exists(segment) and not os.path.exists(alias_path(name))
