"""What the daemon's fault-injection tests share: small TFRecord files, trainer processes, and a
clean-up that leaves no process or segment behind whatever a test does."""

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import infeed
from infeed import FixedLen
from infeed.ring.processes import process_state
from infeed.ring.segments import SHM_DIR

ROOT = str(Path(__file__).resolve().parents[2])
SPEC = {"id": FixedLen((), "int64")}
SIZES = (40, 23, 37)          # records per file: ids 0..99 in order


def children(pid: int | str = "self") -> set[int]:
    """The pids of the children of process ``pid`` (this one by default), of all its threads."""
    found = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.update(int(p) for p in f.read().split())
        except (FileNotFoundError, ProcessLookupError):     # a thread that ended since the listing (seen on 3.14)
            continue
    return found


def write_files(root: Path) -> list[str]:
    """Three files holding records with ids 0..99 (40, 23 and 37 of them)."""
    paths, start = [], 0
    for k, n in enumerate(SIZES):
        path = str(root / f"part-{k}.tfrecord")
        with infeed.TFRecordWriter(path) as w:
            for i in range(start, start + n):
                w.write(infeed.encode_example({"id": [i]}))
        paths.append(path)
        start += n
    return paths


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie does not)."""
    return process_state(pid) not in ("gone", "dead", "dead, not yet reaped")


def wait_until(predicate, seconds: float) -> bool:
    """Polls ``predicate`` until it holds or ``seconds`` pass; its last value."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.02)
    return True


def read_line(proc: subprocess.Popen, seconds: float = 60) -> str:
    """The next line ``proc`` prints, waiting at most ``seconds`` for it."""
    ready, _, _ = select.select([proc.stdout], [], [], seconds)
    assert ready, f"process {proc.pid} printed nothing in {seconds} s"
    return proc.stdout.readline()


def segment_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies not counted) of process group ``pgid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
            except (OSError, ValueError):
                continue
            if int(group) == pgid and state not in ("Z", "X"):
                found.append(int(entry))
    return found


def kill_server(server: subprocess.Popen, segment: str | None = None, grace: float = 2.0) -> None:
    """Ends ``server``, started in a session of its own (``start_new_session=True``), with everything it
    started, whatever state it is in (stopped, hung, exited): SIGKILL to it, ``grace`` seconds for its workers
    to see it gone and remove its ring, then SIGKILL to what is left of its process group; ``segment`` (a
    path), if still there, is removed too. Safe to call twice."""
    if server.poll() is None:
        server.kill()
    server.wait()
    if not wait_until(lambda: not group_members(server.pid), grace):
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wait_until(lambda: not group_members(server.pid), 10)
    for stream in (server.stdin, server.stdout):
        if stream is not None:
            stream.close()
    if segment is not None:
        try:
            os.unlink(segment)
        except FileNotFoundError:
            pass


class Reaper:
    """Processes and segments a test made; whatever is left of them at the end is killed and removed."""

    def __init__(self):
        self.pids: list[int] = []
        self.paths: list[str] = []
        self.popens: list[subprocess.Popen] = []

    def clean(self) -> None:
        for pid in self.pids + [p.pid for p in self.popens]:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
        for p in self.popens:
            p.wait(10)
            for stream in (p.stdin, p.stdout):
                if stream is not None:
                    try:
                        stream.close()
                    except OSError:
                        pass
        for path in self.paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


@pytest.fixture
def reaper():
    r = Reaper()
    try:
        yield r
    finally:
        r.clean()


TRAINER = textwrap.dedent("""
    import sys, time, infeed
    mode, paths = sys.argv[1], sys.argv[2:]
    ds = infeed.Dataset(paths, {"id": infeed.FixedLen((), "int64")}, batch_size=2, num_epochs=None)
    try:
        with infeed.Daemon(ds, num_workers=2, slots=2, lock_memory=False) as feed:
            next(feed)
            print(feed.ring.name, *feed.worker_pids, flush=True)
            if mode == "idle":
                sys.stdin.read()
            else:
                for batch in feed:
                    pass
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


def start_trainer(reaper: Reaper, files, mode: str = "iterate", new_session: bool = False):
    """A trainer process feeding from a 2-worker daemon over ``files`` forever: ``iterate`` takes
    batches as fast as they come, ``idle`` holds one and waits on its stdin. Returns
    (process, segment path, worker pids), all registered with ``reaper``."""
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, mode, *files], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, start_new_session=new_session,
                               env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    reaper.popens.append(trainer)
    name, *pids = read_line(trainer).split()
    pids = [int(p) for p in pids]
    reaper.pids.extend(pids)
    reaper.paths.append(segment_path(name))
    return trainer, segment_path(name), pids
