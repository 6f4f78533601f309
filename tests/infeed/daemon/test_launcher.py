"""Workers forked by the launcher: the trainer's own children, with their exit statuses and signals; a launcher
that dies, an environment that changes, a trainer that forks (another thread starting a daemon) or is killed,
and the opt-out."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen, WorkerDied
from infeed.daemon import launcher
from infeed.daemon.daemon import WorkerProcess
from infeed.daemon.launcher import LAUNCHER_ENV, LaunchedWorker
from tests.reliability.processes import children

SPEC = {"id": FixedLen((), "int64")}


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("launcher") / "train.tfrecord")
    with infeed.TFRecordWriter(path) as writer:
        for i in range(24):
            writer.write(infeed.encode_example({"id": [i]}))
    return path


@pytest.fixture
def dataset(path):
    return Dataset(path, SPEC, batch_size=4)


def ids(feed) -> list:
    return [i for batch in feed for i in batch["id"].tolist()]


def test_forked_workers_are_this_processs_children_and_decode_as_fresh_ones(dataset, monkeypatch):
    with Daemon(dataset, num_workers=2, lock_memory=False) as feed:
        assert all(isinstance(p, LaunchedWorker) for p in feed._procs)
        assert set(feed.worker_pids) <= children()
        assert launcher._launcher.process.pid in children()
        forked = ids(feed)
    monkeypatch.setenv(LAUNCHER_ENV, "0")
    with Daemon(dataset, num_workers=2, lock_memory=False) as feed:
        assert all(type(p) is WorkerProcess for p in feed._procs)
        assert ids(feed) == forked == list(range(24))
    assert not set(feed.worker_pids) & children()          # both kinds reaped at close


def test_a_killed_forked_worker_is_worker_died_with_its_signal(dataset):
    with Daemon(dataset, num_workers=1, slots=1, lock_memory=False, timeout=30) as feed:
        os.kill(feed.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDied) as info:
            ids(feed)
    assert info.value.signal == signal.SIGKILL and feed._procs[0].returncode == -signal.SIGKILL


def test_a_dead_launcher_is_replaced_and_an_environment_change_gets_a_new_one(dataset, monkeypatch):
    with Daemon(dataset, num_workers=1, lock_memory=False) as feed:
        ids(feed)
    first = launcher._launcher.process
    first.kill()
    first.wait()
    with Daemon(dataset, num_workers=1, lock_memory=False) as feed:
        assert isinstance(feed._procs[0], LaunchedWorker) and ids(feed) == list(range(24))
    second = launcher._launcher.process
    assert second.pid != first.pid
    monkeypatch.setenv("INFEED_TEST_LAUNCHER_ENV", "changed")
    with Daemon(dataset, num_workers=1, lock_memory=False) as feed:
        with open(f"/proc/{feed.worker_pids[0]}/environ", "rb") as f:
            assert b"INFEED_TEST_LAUNCHER_ENV=changed" in f.read().split(b"\0")
        ids(feed)
    assert second.poll() is not None and launcher._launcher.process.pid != second.pid     # the old one ended


def test_the_workers_run_in_the_trainers_working_directory_of_the_moment(dataset, tmp_path, monkeypatch):
    with Daemon(dataset, num_workers=1, lock_memory=False) as feed:      # the launcher started elsewhere
        ids(feed)
    monkeypatch.chdir(tmp_path)
    with Daemon(dataset, num_workers=1, lock_memory=False) as feed:
        assert os.readlink(f"/proc/{feed.worker_pids[0]}/cwd") == str(tmp_path)
        ids(feed)


def test_the_launcher_ends_with_a_killed_trainer_and_a_forked_trainer_has_its_own(path):
    script = textwrap.dedent(f"""
        import os, sys, time, infeed
        from infeed import Daemon, Dataset, FixedLen
        from infeed.daemon import launcher
        ds = Dataset({path!r}, {{"id": FixedLen((), "int64")}}, batch_size=4)
        def run():
            with Daemon(ds, num_workers=1, lock_memory=False) as feed:
                assert [i for b in feed for i in b["id"].tolist()] == list(range(24))
            return launcher._launcher.process.pid
        parent = run()
        launcher._lock.acquire()                # as another thread starting a daemon would at the fork
        child = os.fork()
        if child == 0:
            os._exit(0 if run() != parent else 3)
        launcher._lock.release()
        deadline = time.monotonic() + 30
        while not (done := os.waitpid(child, os.WNOHANG))[0] and time.monotonic() < deadline:
            time.sleep(0.05)
        if not done[0]:
            os.kill(child, 9)
            sys.exit("the forked trainer's daemon hung")
        assert os.waitstatus_to_exitcode(done[1]) == 0
        print(parent, flush=True)
        time.sleep(60)
    """)
    trainer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = trainer.stdout.readline()
        assert line, f"the trainer ended with status {trainer.wait()}"
        pid = int(line)
        os.kill(pid, 0)                                     # the parent's launcher lives on
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break                                       # ended, waiting for init to reap it
        time.sleep(0.05)
    else:
        assert not os.path.exists(f"/proc/{pid}"), "the launcher outlived its killed trainer"


def test_where_no_launcher_can_start_the_workers_are_fresh_interpreters(dataset, monkeypatch):
    def cannot(env):
        raise OSError("the worker launcher ended (status 1)")

    monkeypatch.setattr(launcher, "_launcher", None)
    monkeypatch.setattr(launcher, "_Launcher", cannot)
    with Daemon(dataset, num_workers=2, lock_memory=False) as feed:
        assert all(type(p) is WorkerProcess for p in feed._procs)
        assert ids(feed) == list(range(24))
