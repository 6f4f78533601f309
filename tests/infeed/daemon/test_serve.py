"""`infeed serve` with `infeed.attach`, `infeed stats` and `infeed gc`, across real processes."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.commands.cli import main as cli_main
from infeed.ring.segments import SHM_DIR
from reliability.processes import kill_server

SPEC = {"id": FixedLen((), "int64"), "x": FixedLen((3,), "float32")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    paths = []
    for k in range(2):
        path = str(root / f"part-{k}.tfrecord")
        with infeed.TFRecordWriter(path) as w:
            for i in range(k * 50, k * 50 + 50):
                w.write(infeed.encode_example({"id": [i], "x": [i, i + 0.5, -i]}))
        paths.append(path)
    return paths


@pytest.fixture
def start_server():
    """``start_server(tmp_path, ds, name, *flags)``: an ``infeed serve`` once it says it serves (within 60 s);
    every one started is killed with its workers after the test, whatever ended it."""
    started = []

    def start(tmp_path, ds, name, *extra):
        config = tmp_path / "ds.json"
        config.write_text(json.dumps(ds.to_json()))
        server = subprocess.Popen([sys.executable, "-m", "infeed", "serve", "--config", str(config), "--name", name,
                                   "--slots", "4", "--no-mlock", *extra], stdout=subprocess.PIPE, text=True,
                                  start_new_session=True)
        started.append(server)
        ready, _, _ = select.select([server.stdout], [], [], 60)
        assert ready, f"infeed serve (pid {server.pid}) printed nothing in 60 s"
        line = server.stdout.readline()
        assert line.startswith("serving"), line
        return server

    try:
        yield start
    finally:
        for server in started:
            kill_server(server)


def test_an_attached_trainer_gets_the_daemons_batches_and_the_server_cleans_up(files, tmp_path, start_server):
    ds = Dataset(files, SPEC, batch_size=8, shuffle_buffer=20, shuffle_files=True, seed=5, final_batch="pad")
    with Daemon(ds, num_workers=1, lock_memory=False) as local:
        want = [b["id"].copy() for b in local]
    server = start_server(tmp_path, ds, "t-attach")
    with infeed.attach("t-attach", timeout=60) as feed:
        got = [b["id"].copy() for b in feed]
        name = feed.ring.name
        assert feed.state()["epoch"] == 1
    assert len(got) == len(want) == 13
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert server.wait(timeout=20) == 0                      # drained: it ends on its own
    assert not os.path.exists(os.path.join(SHM_DIR, name))
    with pytest.raises(infeed.AttachError, match="t-attach"):
        infeed.attach("t-attach")


def test_a_second_attach_goes_on_where_the_first_stopped(files, tmp_path, start_server):
    ds = Dataset(files, SPEC, batch_size=10)
    server = start_server(tmp_path, ds, "t-resume", "--workers", "2")
    with infeed.attach("t-resume", timeout=60) as feed:
        first = [next(feed)["id"].tolist() for _ in range(3)]
    with infeed.attach("t-resume", timeout=60) as feed:
        rest = [b["id"].tolist() for b in feed]
    assert sum(first + rest, []) == list(range(100))
    assert server.wait(timeout=20) == 0


def test_a_killed_worker_of_the_server_reaches_the_attached_trainer(files, tmp_path, start_server):
    ds = Dataset(files, SPEC, batch_size=1, num_epochs=None)
    server = start_server(tmp_path, ds, "t-kill", "--workers", "2")
    with infeed.attach("t-kill", timeout=60) as feed:
        next(feed)
        victim = feed.ring.workers()[0]["pid"]
        os.kill(victim, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(infeed.WorkerDied) as info:
            for _ in feed:
                pass
        assert time.monotonic() - began < 10
    assert info.value.pid == victim and info.value.signal == signal.SIGKILL
    assert server.wait(timeout=20) == 1


def test_stats_reports_fill_rates_and_workers(files, capsys):
    ds = Dataset(files, SPEC, batch_size=5, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False) as feed:
        for _ in range(10):
            next(feed)
        # Nothing taken during the interval: the consumer is idle, the workers wait for free slots once they have
        # filled them all (on a loaded machine they may still be filling the last during the first looks).
        for _ in range(25):
            assert cli_main(["stats", feed.ring.name, "--interval", "0.2", "--json"]) == 0
            report = json.loads(capsys.readouterr().out)
            if report["filled"] == 4 and all(w["shares"]["wait_for_slot"] > 0.5 for w in report["workers"]):
                break
        assert report["slots"] == 4 and report["taken"] == 0 and 0 <= report["filled"] <= 4
        assert 0.15 < report["elapsed_s"] < 5
        assert [w["pid"] for w in report["workers"]] == feed.worker_pids
        assert all(w["shares"]["wait_for_slot"] > 0.5 for w in report["workers"])
        assert report["bottleneck"].startswith("trainer-bound")
        assert cli_main(["stats", feed.ring.name, "--interval", "0.1"]) == 0
        text = capsys.readouterr().out
        assert "slots filled" in text and "wait_for_slot" in text and "trainer-bound" in text
        assert len([line for line in text.splitlines() if line.split()[:1] in (["0"], ["1"])]) == 2
    assert cli_main(["stats", "no-such-ring"]) == 2
