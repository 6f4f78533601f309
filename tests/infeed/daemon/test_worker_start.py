"""The workers import the infeed the trainer imported, never the current directory's; one that dies before
it can say why through the ring shows its stderr in the trainer's WorkerDied."""

import os
import subprocess
import sys
import time

import pytest

import infeed
from infeed import Daemon, Dataset, FixedLen
from infeed.daemon.output import KEPT, OutputTail

SPEC = {"id": FixedLen((), "int64")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("start") / "train.tfrecord")
    with infeed.TFRecordWriter(path) as writer:
        for i in range(20):
            writer.write(infeed.encode_example({"id": [i]}))
    return [path]


def decoy(root, name: str, marker) -> None:
    """A package ``name`` under ``root`` that leaves ``marker`` and fails when imported."""
    os.makedirs(root / name)
    (root / name / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
                                             f"raise ImportError('the decoy {name} was imported')\n")


def test_the_workers_never_import_packages_of_the_current_directory(files, tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    cwd = tmp_path / "project"
    for name in ("infeed", "estimator", "xla_runtime"):
        decoy(cwd, name, marker)
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend("")         # the trainer's own path holds the current directory too
    with Daemon(Dataset(files, SPEC, batch_size=4, num_epochs=1), num_workers=2, timeout=60) as feed:
        ids = [i for batch in feed for i in batch["id"].tolist()]
    assert ids == list(range(20))
    assert not marker.exists(), marker.read_text()


def _worker_setting(files, name: str) -> str:
    """``name`` in the environment the daemon's worker was started with (its /proc/PID/environ)."""
    with Daemon(Dataset(files, SPEC, batch_size=4, num_epochs=None), num_workers=1, timeout=60) as feed:
        next(feed)
        [proc] = feed._procs
        with open(f"/proc/{proc.pid}/environ", "rb") as f:
            env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    return env.get(name.encode(), b"<unset>").decode()


def test_the_workers_blas_runs_one_thread_unless_the_trainers_environment_says(files, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert _worker_setting(files, "OPENBLAS_NUM_THREADS") == "1"
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "3")
    assert _worker_setting(files, "OPENBLAS_NUM_THREADS") == "3"


def test_a_worker_failing_to_import_shows_its_error_in_the_trainers_exception(files, tmp_path, monkeypatch):
    # numpy, shadowed for the workers alone (the trainer imported its own already): they fail at start-up.
    os.makedirs(tmp_path / "shadow" / "numpy")
    (tmp_path / "shadow" / "numpy" / "__init__.py").write_text("raise ImportError('numpy cannot load (injected)')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    began = time.monotonic()
    with pytest.raises(infeed.WorkerDied) as info:
        with Daemon(Dataset(files, SPEC, batch_size=4, num_epochs=None), num_workers=1, timeout=60) as feed:
            path = feed.ring.path
            next(feed)
    assert time.monotonic() - began < 10
    e = info.value
    assert e.exitcode == 1 and "ImportError: numpy cannot load (injected)" in e.output
    assert "the end of its stderr:" in str(e) and "numpy cannot load (injected)" in str(e)
    assert "Traceback (most recent call last)" in str(e)
    assert not os.path.exists(path)


def test_a_workers_stderr_is_passed_on_and_only_its_end_kept(capfd):
    # A megabyte written at once: the pipe is drained (the child never blocks), the memory kept is bounded.
    read, write = os.pipe()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stderr.write('x' * 1_000_000 + 'END')"],
                             stderr=write)
    os.close(write)
    tail = OutputTail(read)
    assert child.wait(30) == 0
    text = tail.text(wait=10)
    assert text.endswith("END") and len(text) == KEPT
    assert len(capfd.readouterr().err) == 1_000_003
