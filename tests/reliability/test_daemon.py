"""The daemon under fault injection: workers killed, crashed, failing or stalled; the trainer killed
or interrupted; a whole process group killed; and 100 daemons in a row leaving nothing behind."""

import datetime
import gc
import json
import logging
import os
import resource
import secrets
import signal
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest

import infeed
from infeed import Daemon, Dataset
from infeed.commands.cli import main as cli_main
from infeed.daemon import daemon as daemon_module
from infeed.daemon.feed import Feed
from infeed.ring import Ring
from infeed.ring.layout import HEADER
from infeed.ring.orphans import ring_is_orphan
from infeed.ring.processes import process_state
from infeed.ring.segments import SHM_DIR
from infeed.ring.slots import REPORTED_ERROR, SLOT_ERROR

from .processes import (ROOT, SPEC, alive, children, read_line, reaper, segment_path,  # noqa: F401
                        start_trainer, wait_until, write_files)

#: The issue's bounds: a failure reaches the trainer within 10 s, an interrupted trainer is gone within 5 s.
REPORT_WITHIN, EXIT_WITHIN = 10, 5


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("daemon"))


@pytest.fixture
def no_core_files():
    """Crashing workers dump no core file (the soft limit is the test process's, inherited)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def expected_ids(batch: int, size: int = 2) -> list[int]:
    """Record ids of batch ``batch`` of the files read in order, forever."""
    return [(batch * size + i) % 100 for i in range(size)]


def take_until_error(feed, error, within: float = REPORT_WITHIN) -> tuple[list, pytest.ExceptionInfo]:
    """Batches' ids until ``feed`` raises ``error`` (for ``within`` seconds at most: never endless). Bounded by
    time, not by batches: a signalled worker dies when it next runs, which on a loaded machine took longer than
    the 500 tiny batches the other worker made meanwhile (a suite run: "DID NOT RAISE WorkerDied")."""
    seen = []
    began = time.monotonic()
    with pytest.raises(error) as info:
        while time.monotonic() - began < within:
            seen.append(next(feed)["id"].tolist())
    return seen, info


# --- a worker killed, crashed or failing ---------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV, signal.SIGBUS], ids=lambda s: s.name)
def test_a_killed_or_crashed_worker_raises_worker_died_at_the_first_batch_it_owed(files, sig, no_core_files):
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
        first = next(feed)["id"].tolist()
        victim = feed.worker_pids[1]
        os.kill(victim, sig)
        began = time.monotonic()
        seen, info = take_until_error(feed, infeed.WorkerDied)
        assert time.monotonic() - began < REPORT_WITHIN
        workers = feed.worker_pids
    seen = [first] + seen
    # Every batch before the failure is there and right; the error comes at the first batch awaited after the
    # death (the dead worker's own, or a later one where it owed none: the others took its share).
    assert seen == [expected_ids(b) for b in range(len(seen))]
    e = info.value
    assert (e.pid, e.signal, e.exitcode) == (victim, sig, None)
    assert f"batch {len(seen)}" in str(e) and signal.Signals(sig).name in str(e)
    assert not any(alive(p) for p in workers)


# A worker killed owing a batch past those the others filled: they all come first. Batches 1-3 filled and
# batch 0 held, units 4 and 5 taken (one by each worker, both waiting for their slot): the trainer, slow (the
# workers are checked before each batch), must get every batch up to the victim's, then WorkerDied naming it.
@pytest.mark.parametrize("victim_owes", [4, 5])
def test_a_worker_killed_owing_a_later_batch_fails_no_batch_the_other_filled(files, victim_owes):
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
        ring = feed.ring
        seen = [next(feed)["id"].tolist()]

        def settled():
            claims = sorted(u for k in range(2) for u in ring.worker_claims(k) if u >= 0)
            return claims == [4, 5] and all(ring.slot_state(i) == ("filled", i) for i in (1, 2, 3))
        assert wait_until(settled, 20), [ring.worker_claims(k) for k in range(2)]
        victim = next(k for k in range(2) if victim_owes in ring.worker_claims(k))
        os.kill(feed.worker_pids[victim], signal.SIGKILL)
        with pytest.raises(infeed.WorkerDied) as info:
            for _ in range(20):
                time.sleep(0.12)                # a slow trainer: the workers are checked before each batch
                seen.append(next(feed)["id"].tolist())
        pid = feed.worker_pids[victim]
    assert seen == [expected_ids(b) for b in range(victim_owes)]
    e = info.value
    assert (e.pid, e.signal) == (pid, signal.SIGKILL)
    assert f"worker {victim}, which owed batch {victim_owes}" in str(e)


def test_a_worker_killed_before_it_registers_fails_no_batch_the_others_filled(files, monkeypatch, reaper):
    # Worker 1 dies by SIGKILL at once: its entry in the ring stays zeros (claims (0, 0) read as numbers).
    dying = []

    def start_workers(ring, dataset, workers, start, index_files=None):
        procs = real_start(ring, dataset, 1, start, index_files)
        dying.append(subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 9)"]))
        return procs + dying
    real_start = daemon_module.start_workers
    monkeypatch.setattr(daemon_module, "start_workers", start_workers)
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
        ring = feed.ring
        assert dying[0].wait(20) == -signal.SIGKILL
        assert wait_until(lambda: all(ring.slot_state(i) == ("filled", i) for i in range(4)), 20)
        assert [w["index"] for w in ring.workers()] == [0]
        reaper.pids.append(feed.worker_pids[0])
        os.kill(feed.worker_pids[0], signal.SIGSTOP)      # batches 0-3 are all there will be
        seen, info = take_until_error(feed, infeed.WorkerDied)
    assert seen == [expected_ids(b) for b in range(4)]
    e = info.value
    assert (e.pid, e.signal) == (dying[0].pid, signal.SIGKILL)
    assert "worker 1, which never registered; the input stops at batch 4" in str(e)


#: Worker 1 as the daemon starts it, with a failure injected before its first unit: argv[1] "setup" (its
#: Producer cannot be made: a MemoryError, as for arrays it cannot allocate) or "start" (run() fails at once:
#: the file it pins changed, a SourceChangedError with attributes of several types).
FAILING_WORKER = textwrap.dedent("""
    import datetime, os, sys
    import infeed.daemon.worker as worker
    from infeed.errors import SourceChangedError

    def setup(*args, **kwargs):
        raise MemoryError("cannot allocate the worker's arrays (injected)")

    def start(*args, **kwargs):
        raise SourceChangedError("/data/part-1.tfrecord", (40, datetime.datetime(2026, 1, 2, 3, 4, 5)),
                                 (41, datetime.datetime(2026, 1, 2, 3, 4, 6)), 0)

    if sys.argv[1] == "setup":
        worker.Producer.__init__ = setup
    else:
        worker.Dataset.indexes = start
    status = worker.main()
    sys.stderr.flush()
    os._exit(status)
""")


@pytest.mark.parametrize("where", ["setup", "start"])
def test_a_worker_failing_before_its_first_unit_raises_its_own_error_naming_it(files, monkeypatch, where):
    # Worker 0 makes every batch alone: the error must still come, as itself, after the batches published.
    failing = []

    def start_workers(ring, dataset, workers, start, index_files=None):
        procs = real_start(ring, dataset, 1, start, index_files)
        proc = subprocess.Popen([sys.executable, "-c", FAILING_WORKER, where], stdin=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=daemon_module._worker_environment())
        config = {"ring": ring.name, "worker": 1, "start": list(start), "dataset": dataset.to_json(),
                  "sys_path": sys.path, "filesystems": []}
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
        failing.append(proc)
        return procs + failing
    real_start = daemon_module.start_workers
    monkeypatch.setattr(daemon_module, "start_workers", start_workers)
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    began = time.monotonic()
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
        path, workers = feed.ring.path, feed.worker_pids
        seen = []
        with pytest.raises(MemoryError if where == "setup" else infeed.SourceChangedError) as info:
            while time.monotonic() - began < REPORT_WITHIN:         # never endless: worker 0 goes on forever
                seen.append(next(feed)["id"].tolist())
        assert failing[0].poll() == REPORTED_ERROR
    assert seen == [expected_ids(b) for b in range(len(seen))]       # every batch published before it, good
    e = info.value
    if where == "setup":
        assert e.args == ("cannot allocate the worker's arrays (injected)",)
    else:
        assert (e.path, e.before, e.after, e.offset, e.record_index) == (
            "/data/part-1.tfrecord", (40, datetime.datetime(2026, 1, 2, 3, 4, 5)),
            (41, datetime.datetime(2026, 1, 2, 3, 4, 6)), 0, None)
    notes = "\n".join(getattr(e, "__notes__", ()))
    assert "Raised in the producer process" in notes
    assert (f"(raised in infeed worker 1 (pid {failing[0].pid}), which failed owing no batch; the input stops at "
            f"batch {len(seen)})") in notes
    assert not os.path.exists(path) and not any(alive(p) for p in workers)


#: Registers as worker argv[2] of ring argv[1], takes argv[3] units, takes slot argv[4] for writing (before
#: its turn, in these tests), says so, and sends itself signal argv[5].
HOLDER = textwrap.dedent("""
    import os, signal, sys
    from infeed.ring import Ring
    ring = Ring.attach(sys.argv[1])
    index = int(sys.argv[2])
    ring.register_worker(index)
    for _ in range(int(sys.argv[3])):
        ring.take_unit(index)
    ring.acquire_free(int(sys.argv[4]), timeout=10)
    print("holding", flush=True)
    os.kill(os.getpid(), getattr(signal, sys.argv[5]))
    sys.stdin.read()
""")


def _hold_out_of_turn(reaper, ring, sig: str) -> subprocess.Popen:
    """Worker 1 takes unit 0 here; worker 0, another process, takes units 1 and 2 and slot 0 (unit 2's, before
    unit 0's turn), then sends itself ``sig``. Returns worker 0's process."""
    ring.register_worker(1)
    assert ring.take_unit(1) == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ring.name, "0", "2", "0", sig], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    reaper.popens.append(holder)
    assert read_line(holder, 30).strip() == "holding"
    assert ring.worker_claims(0) == (1, 2) and ring.slot_state(0)[0] == "writing"
    return holder


def test_a_timeout_names_the_worker_stopped_holding_the_slot_out_of_turn(files, reaper):
    ds = Dataset(files, SPEC, batch_size=2)
    with Ring.create(ds.template(), 2, max_workers=2, lock_memory=False) as ring:
        holder = _hold_out_of_turn(reaper, ring, "SIGSTOP")
        assert wait_until(lambda: process_state(holder.pid).startswith("stopped"), 10)
        with pytest.raises(infeed.Timeout) as info:
            next(Feed(ring, ds, lambda seq: None, timeout=0.3, workers=2))
    e = info.value
    assert (e.worker, e.pid) == (0, holder.pid)
    assert f"from worker 1 (pid {os.getpid()}, " in str(e)
    assert f"its slot held out of turn by worker 0 (pid {holder.pid}, stopped by a signal" in str(e)


def test_a_timeout_reads_no_claim_in_a_worker_entry_never_registered(files):
    ds = Dataset(files, SPEC, batch_size=2)
    with Ring.create(ds.template(), 2, max_workers=2, lock_memory=False) as ring:
        ring.register_worker(1)             # worker 0 never registers: its entry is zeros
        assert ring.take_unit(1) == 0
        with pytest.raises(infeed.Timeout) as info:
            next(Feed(ring, ds, lambda seq: None, timeout=0.2, workers=2))
    e = info.value
    assert (e.worker, e.pid) == (1, os.getpid()) and f"from worker 1 (pid {os.getpid()}, " in str(e)


class _Proc:
    def __init__(self, pid: int, code: int | None):
        self.pid, self.code = pid, code

    def poll(self):
        return self.code


def test_a_worker_killed_holding_the_awaited_slot_out_of_turn_is_named_at_that_batch(files, reaper):
    # The slot's free token died with it: batch 0 can never be written. A worker killed owing a later
    # batch and holding no slot fails nothing before it.
    ds = Dataset(files, SPEC, batch_size=2)
    with Ring.create(ds.template(), 2, max_workers=2, lock_memory=False) as ring:
        holder = _hold_out_of_turn(reaper, ring, "SIGKILL")
        assert holder.wait(10) == -signal.SIGKILL
        daemon = object.__new__(Daemon)
        daemon.ring, daemon._lost_at = ring, {}
        daemon._procs = [_Proc(holder.pid, -signal.SIGKILL), _Proc(os.getpid(), None)]
        with pytest.raises(infeed.WorkerDied) as info:
            daemon._check_workers(0)
        assert info.value.pid == holder.pid and "worker 0, which held batch 0's slot 0 out of turn" in str(info.value)
        ring.release(0)                     # the slot handed back: worker 0 owes batches 1 and 2 only
        daemon._check_workers(0)
        with pytest.raises(infeed.WorkerDied, match="worker 0, which owed batch 1"):
            daemon._check_workers(1)


#: Registers as worker 0 of ring argv[1], records a corrupt record at unit 5 (one it read through and did not
#: take), and exits as a worker that said why.
LATER_ERROR = textwrap.dedent("""
    import os, sys
    from infeed.errors import CorruptRecordError
    from infeed.ring import Ring
    from infeed.ring.slots import REPORTED_ERROR
    ring = Ring.attach(sys.argv[1])
    ring.register_worker(0)
    ring.set_error(CorruptRecordError("/data/part-1.tfrecord", 10, 1234, "data_crc"), unit=5)
    ring.close()
    os._exit(REPORTED_ERROR)
""")


def test_a_worker_error_recorded_at_a_later_unit_fails_no_batch_before_it(files, reaper):
    # Worker 0 failed at unit 5 owing none; worker 1 (this process, alive) makes batches 0-4 meanwhile.
    ds = Dataset(files, SPEC, batch_size=2)
    with Ring.create(ds.template(), 4, max_workers=2, lock_memory=False) as ring:
        failing = subprocess.Popen([sys.executable, "-c", LATER_ERROR, ring.name],
                                   env=daemon_module._worker_environment())
        reaper.popens.append(failing)
        assert failing.wait(30) == REPORTED_ERROR
        ring.register_worker(1)
        daemon = object.__new__(Daemon)
        daemon.ring, daemon._lost_at = ring, {}
        daemon._procs = [failing, _Proc(os.getpid(), None)]
        for seq in range(5):
            daemon._check_workers(seq)
        with pytest.raises(infeed.CorruptRecordError) as info:
            daemon._check_workers(5)
        assert (info.value.path, info.value.record_index, info.value.offset) == ("/data/part-1.tfrecord", 10, 1234)
        assert info.value.__notes__[-1] == (f"(raised in infeed worker 0 (pid {failing.pid}), which failed owing no "
                                            "batch; the input stops at batch 5)")
        ring.acquire_free(1, timeout=10)            # batch 5's owner publishes the failure in its slot:
        ring.publish(1, 5, flags=SLOT_ERROR, steps=0)
        daemon._check_workers(5)                    # the feed raises it there


def _damaged_copy(files, tmp_path):
    """files[1] with the data of its record 10 (id 50) flipped: (paths, damaged path, its offset)."""
    bad = str(tmp_path / "bad.tfrecord")
    data = bytearray(open(files[1], "rb").read())
    offsets = [0]
    for r in infeed.read_records(files[1]):
        offsets.append(offsets[-1] + len(r) + 16)
    data[offsets[10] + 14] ^= 0xFF
    open(bad, "wb").write(bytes(data))
    return [files[0], bad, files[2]], bad, offsets[10]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failing_worker_raises_its_own_exception_with_its_traceback_at_its_batch(files, tmp_path, workers):
    paths, bad, offset = _damaged_copy(files, tmp_path)
    ds = Dataset(paths, SPEC, batch_size=10)
    with Daemon(ds, num_workers=workers, lock_memory=False, timeout=60) as feed:
        seen, info = take_until_error(feed, infeed.CorruptRecordError)
    assert seen == [list(range(b * 10, b * 10 + 10)) for b in range(5)]     # batch 5 holds record 50
    e = info.value
    assert (e.path, e.record_index, e.offset, e.kind) == (bad, 10, offset, "data_crc")
    notes = "\n".join(e.__notes__)
    assert "Raised in the producer process" in notes and os.path.join("infeed", "daemon", "worker.py") in notes


def test_a_file_gone_before_its_turn_raises_oserror_with_the_path_at_its_batch(files, tmp_path):
    paths = []
    for path in files:
        paths.append(str(tmp_path / os.path.basename(path)))
        open(paths[-1], "wb").write(open(path, "rb").read())
    ds = Dataset(paths, SPEC, batch_size=10)
    os.unlink(paths[1])                                  # matched when the dataset was made, gone since
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        seen, info = take_until_error(feed, OSError)
    assert seen == [list(range(b * 10, b * 10 + 10)) for b in range(4)]    # batch 4 starts the second file
    assert paths[1] in str(info.value)
    assert any("Raised in the producer process" in n for n in info.value.__notes__)


# --- a stalled worker ----------------------------------------------------------------------------

def test_a_stopped_worker_gives_a_timeout_naming_it(files, reaper):
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=3) as feed:
        next(feed)
        victims = feed.worker_pids          # both: batches go to whichever worker is free
        reaper.pids.extend(victims)
        for victim in victims:
            os.kill(victim, signal.SIGSTOP)
        began = time.monotonic()
        seen, info = take_until_error(feed, infeed.Timeout)
        assert time.monotonic() - began < REPORT_WITHIN
        for victim in victims:
            os.kill(victim, signal.SIGCONT)
    e = info.value
    assert e.seconds == 3 and f"batch {len(seen) + 1}" in str(e) and "stopped by a signal" in str(e)
    if e.worker is not None:                # the worker that took the batch, else every worker's state
        assert e.pid == victims[e.worker] and f"worker {e.worker} (pid {e.pid}, stopped by a signal" in str(e)


def test_a_stopped_worker_without_a_timeout_gives_periodic_warnings_naming_it(files, reaper, caplog):
    caplog.set_level(logging.WARNING, logger="infeed")
    ds = Dataset(files, SPEC, batch_size=2, num_epochs=None)
    with Daemon(ds, num_workers=2, slots=4, lock_memory=False) as feed:
        next(feed)
        feed.stall_warning = 0.5            # after the first batch, which a busy machine may take longer for
        victims = feed.worker_pids          # both: batches go to whichever worker is free
        reaper.pids.extend(victims)
        for victim in victims:
            os.kill(victim, signal.SIGSTOP)

        def stalls():
            return [r.getMessage() for r in caplog.records if "waited" in r.getMessage()]

        def resume():           # once warned twice (or after 20 s whatever happened): the wait must end
            wait_until(lambda: len(stalls()) >= 2, 20)
            for victim in victims:
                os.kill(victim, signal.SIGCONT)
        resumer = threading.Thread(target=resume)
        resumer.start()
        try:
            ids = [next(feed)["id"].tolist() for _ in range(20)]
        finally:
            resumer.join()
    assert ids == [expected_ids(b) for b in range(1, 21)]       # after the stall, on as if nothing happened
    warned = stalls()
    assert len(warned) >= 2
    assert all("stopped by a signal" in m and any(f"pid {pid}" in m for pid in victims) for m in warned)


# --- the trainer killed or interrupted -----------------------------------------------------------

def test_a_sigkilled_trainer_leaves_no_segment_and_no_worker(files, reaper):
    trainer, path, pids = start_trainer(reaper, files, "idle")
    assert os.path.exists(path)
    trainer.kill()
    trainer.wait()
    assert wait_until(lambda: not os.path.exists(path) and not any(alive(p) for p in pids), REPORT_WITHIN)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_an_interrupted_trainer_exits_cleanly_within_5_s_leaving_nothing(files, reaper, sig):
    trainer, path, pids = start_trainer(reaper, files, "iterate")
    time.sleep(0.2)
    began = time.monotonic()
    trainer.send_signal(sig)
    code = trainer.wait(timeout=EXIT_WITHIN)
    # Ctrl-C is a KeyboardInterrupt the trainer catches; SIGTERM kills it as it would have without infeed.
    if sig == signal.SIGINT:
        assert code == 0 and read_line(trainer, 1).strip() == "interrupted"
    else:
        assert code == -signal.SIGTERM
    assert not os.path.exists(path)
    assert wait_until(lambda: not any(alive(p) for p in pids), EXIT_WITHIN - (time.monotonic() - began))


# --- a whole process group killed ----------------------------------------------------------------

def _dead_ring(reaper, files) -> str:
    """A segment whose creator and workers were all killed at once (their process group)."""
    trainer, path, pids = start_trainer(reaper, files, "idle", new_session=True)
    os.killpg(trainer.pid, signal.SIGKILL)
    trainer.wait()
    assert wait_until(lambda: not any(alive(p) for p in pids), REPORT_WITHIN)
    return path


def _dead_header() -> bytes:
    """The first page of a ring whose creator is gone (a process that ran and was reaped)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with Ring.create({"x": ((4,), "float32")}, slots=1, lock_memory=False) as ring:
        header = bytearray(open(ring.path, "rb").read(4096))
    offset = HEADER.fields["creator_pid"][1]
    header[offset:offset + 8] = gone.pid.to_bytes(8, "little")
    return bytes(header)


def _plant(reaper, name: str, data: bytes, owner: int | None = None) -> str:
    path = segment_path(name)
    reaper.paths.append(path)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o600)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def _other_users_rings(reaper) -> list[str]:
    """Dead rings of another user: one under that user's prefix, and (where this test may give
    files away, as root) one under ours. Named afresh each time: two tests planting the same names at once (on
    two xdist workers) removed each other's on their way out."""
    other, header = os.getuid() + 1, _dead_header()
    planted = [_plant(reaper, f"infeed-{other}-{secrets.token_hex(16)}", header,
                      other if os.geteuid() == 0 else None)]
    if os.geteuid() == 0:
        planted.append(_plant(reaper, f"infeed-{os.getuid()}-{secrets.token_hex(16)}", header, other))
    return planted


@pytest.mark.parametrize("cleaner", ["infeed gc", "the next start"])
def test_segments_of_a_killed_process_group_are_removed_by_gc_or_the_next_start(files, reaper, capsys, caplog,
                                                                                 cleaner):
    caplog.set_level(logging.WARNING, logger="infeed")
    foreign = _other_users_rings(reaper)
    with Ring.create({"x": ((4,), "float32")}, slots=1, lock_memory=False) as live:
        # Any process of this user that starts a daemon meanwhile collects the dead ring too (as it
        # should): the test then cannot tell who did, and tries again.
        for _ in range(3):
            dead = _dead_ring(reaper, files)
            if cleaner == "infeed gc":
                assert cli_main(["gc", "--dry-run"]) == 0
                listed = capsys.readouterr().out
                assert live.path not in listed and not any(p in listed for p in foreign)
                assert cli_main(["gc"]) == 0
                if f"would remove {dead}" in listed and f"removed {dead}" in capsys.readouterr().out:
                    break
            else:
                caplog.clear()
                with Daemon(Dataset(files, SPEC, batch_size=50), num_workers=1, lock_memory=False,
                            timeout=60) as feed:
                    assert len(list(feed)) == 2
                if any(dead in r.getMessage() for r in caplog.records):
                    break
        else:
            pytest.fail("another process collected the dead ring first, three times in a row")
        assert not os.path.exists(dead)
        assert os.path.exists(live.path) and all(os.path.exists(p) for p in foreign)


def test_gc_never_follows_a_link_nor_takes_a_ring_in_creation(tmp_path):
    """Judged where no other process collects: a plain copy of a dead ring is an orphan, a link to
    that copy is not (it may point anywhere), nor a ring whose creator has not written its pid yet."""
    header = _dead_header()
    dead = tmp_path / "dead"
    dead.write_bytes(header)
    link = tmp_path / "link"
    link.symlink_to(dead)
    creating = tmp_path / "creating"
    creating.write_bytes(header[:8].ljust(4096, b"\0"))           # the magic, no pid yet
    assert ring_is_orphan(str(dead))
    assert not ring_is_orphan(str(link)) and not ring_is_orphan(str(creating))
    os.utime(creating, (time.time() - 3600,) * 2)                 # an hour old: its creator never finished
    assert ring_is_orphan(str(creating))


# --- 100 daemons in a row --------------------------------------------------------------------------

def _own_segments() -> set[str]:
    """Names of the rings in /dev/shm that this process created."""
    mine = set()
    prefix = f"infeed-{os.getuid()}-"
    for name in os.listdir(SHM_DIR):
        if name.startswith(prefix) and "-name-" not in name:
            try:
                with open(segment_path(name), "rb") as f:
                    raw = f.read(HEADER.itemsize)
            except OSError:
                continue
            if len(raw) == HEADER.itemsize and int(np.frombuffer(raw, HEADER, 1)[0]["creator_pid"]) == os.getpid():
                mine.add(name)
    return mine


def _ring_mappings() -> int:
    """This process's mappings of ring segments (unlinked ones included)."""
    with open("/proc/self/maps") as f:
        return sum(f"{SHM_DIR}/infeed-" in line for line in f)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_100_daemons_in_a_row_return_descriptors_segments_children_and_memory_to_baseline(tmp_path):
    """Descriptors, segments, children, mappings and the daemons themselves are counted exactly, so one leaked in
    any cycle fails; the RSS allows 40 KiB a cycle (noise included), as 200 cycles with 8 MiB did."""
    path = str(tmp_path / "tiny.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        for i in range(8):
            w.write(infeed.encode_example({"id": [i]}))
    ds = Dataset(path, SPEC, batch_size=4)

    daemons = []

    def cycle():
        with Daemon(ds, num_workers=1, slots=1, lock_memory=False, timeout=60) as feed:
            assert [b["id"].tolist() for b in feed] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        daemons.append(weakref.ref(feed))

    for _ in range(5):                 # warm-up: imports, caches and the allocator's first pools
        cycle()
    gc.collect()
    fds, segments, kids, rss = len(os.listdir("/proc/self/fd")), _own_segments(), children(), _rss()
    for _ in range(100):
        cycle()
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == fds
    assert _own_segments() == segments == set()
    assert children() == kids          # the baseline: earlier tests in this process may have their own
    assert _ring_mappings() == 0 and not any(ref() for ref in daemons)      # every daemon and its ring freed
    assert _rss() - rss < 4 << 20, f"RSS grew by {(_rss() - rss) / 2**20:.1f} MiB over 100 daemons"
