"""The daemon and its rings under load: ``make soak`` (``SOAK_SECONDS``, default 180; ``SOAK_CLIENTS``, 3).

Several client processes, for the whole time, each repeat at random:

- ``daemon``: a ``Daemon`` with 1-3 workers and 2-8 slots, some batches read and checked, closed;
- ``worker-kill``: the same, a worker SIGKILLed mid-stream: ``WorkerDied`` must come, after good batches only;
- ``serve``: an ``infeed serve`` (some in their own PID namespace, where ``unshare`` works) attached, read,
  detached and attached again several times (each attach must go on where the last one stopped), then
  ended by SIGINT or SIGKILL;
- ``group-kill``: a trainer process with its daemon, its whole process group SIGKILLed: its ring is left
  for ``gc``.

Meanwhile this process runs ``infeed gc``'s collection every half second: it must never take a ring in
use (a client would see its creator "gone" or lose a batch). At the end the clients' counts are summed
and every ring and name of this user must be gone after one last collection. Prints the figures and
exits 1 on any lost or wrong batch, unexpected error, leaked segment or leftover process.

    python tests/soak/soak_daemon.py [--seconds 180] [--clients 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import infeed  # noqa: E402
from infeed.ring.names import names_dir  # noqa: E402
from infeed.ring.orphans import collect, orphans  # noqa: E402
from infeed.ring.segments import SHM_DIR, name_prefix  # noqa: E402
from reliability.processes import SPEC, write_files  # noqa: E402   the fault tests' files: ids 0..99

RECORDS = 100
ENV = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
TRAINER = """
import sys, infeed
ds = infeed.Dataset(sys.argv[1:], {"id": infeed.FixedLen((), "int64")}, batch_size=2, num_epochs=None)
with infeed.Daemon(ds, num_workers=2, slots=4, lock_memory=False) as feed:
    next(feed)
    print("ready", flush=True)
    for batch in feed:
        pass
"""


def expected(batch: int, size: int) -> list[int]:
    return [(batch * size + i) % RECORDS for i in range(size)]


class Client:
    """One client process's loop of random actions, and its counts."""

    def __init__(self, files: list[str], seed: int, unshare: bool):
        self.files, self.rng, self.unshare = files, random.Random(seed), unshare
        self.counts: collections.Counter = collections.Counter()
        self.problems: list[str] = []

    def check(self, batch, seq: int, size: int, what: str) -> None:
        got = batch["id"].tolist()
        self.counts["batches"] += 1
        if got != expected(seq, size):
            self.counts["wrong_batches"] += 1
            self.problems.append(f"{what}: batch {seq} held {got}, expected {expected(seq, size)}")

    def dataset(self, size: int) -> infeed.Dataset:
        return infeed.Dataset(self.files, SPEC, batch_size=size, num_epochs=None)

    def daemon(self) -> None:
        size, n = self.rng.choice([1, 2, 5]), self.rng.randint(1, 60)
        with infeed.Daemon(self.dataset(size), num_workers=self.rng.randint(1, 3), slots=self.rng.randint(2, 8),
                           lock_memory=False, timeout=60) as feed:
            for seq in range(n):
                self.check(next(feed), seq, size, "daemon")
        self.counts["daemon_cycles"] += 1

    def worker_kill(self) -> None:
        size = 2
        with infeed.Daemon(self.dataset(size), num_workers=2, slots=4, lock_memory=False, timeout=60) as feed:
            for seq in range(3):
                self.check(next(feed), seq, size, "worker-kill")
            os.kill(self.rng.choice(feed.worker_pids), signal.SIGKILL)
            self.counts["workers_killed"] += 1
            seq = 3
            try:
                for seq in range(3, 10_000):
                    self.check(next(feed), seq, size, "worker-kill")
                self.problems.append("worker-kill: no WorkerDied after 10,000 batches")
            except infeed.WorkerDied:
                self.counts["worker_died_raised"] += 1

    def serve(self) -> None:
        size, name = 2, f"soak-{os.getpid()}-{self.rng.randrange(1 << 30)}"
        config = os.path.join(os.path.dirname(self.files[0]), f"{name}.json")
        with open(config, "w") as f:
            json.dump(self.dataset(size).to_json(), f)
        isolated = self.unshare and self.rng.random() < 0.5
        prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGKILL"] if isolated else []
        server = subprocess.Popen(prefix + [sys.executable, "-m", "infeed", "serve", "--config", config, "--name",
                                            name, "--workers", str(self.rng.randint(1, 2)), "--slots", "4",
                                            "--no-mlock"], stdout=subprocess.PIPE, text=True, env=ENV)
        try:
            line = server.stdout.readline()
            if not line.startswith("serving"):
                self.problems.append(f"serve: the server printed {line!r}")
                return
            seq = 0
            for _ in range(self.rng.randint(1, 5)):
                with infeed.attach(name, timeout=60) as feed:
                    for _ in range(self.rng.randint(1, 20)):
                        self.check(next(feed), seq, size, "serve")
                        seq += 1
                self.counts["attaches"] += 1
            self.counts["namespaced_servers" if isolated else "servers"] += 1
            if self.rng.random() < 0.5:
                os.kill(_child_of(server.pid) if isolated else server.pid, signal.SIGINT)   # unshare ignores it
                if server.wait(30) != 0:
                    self.problems.append(f"serve: the server ended with {server.returncode} on SIGINT")
            else:
                server.kill()
                self.counts["servers_killed"] += 1
        finally:
            if server.poll() is None:
                server.kill()
            server.wait()
            server.stdout.close()

    def group_kill(self) -> None:
        trainer = subprocess.Popen([sys.executable, "-c", TRAINER, *self.files], stdout=subprocess.PIPE, text=True,
                                   start_new_session=True, env=ENV)
        try:
            if trainer.stdout.readline().strip() != "ready":
                self.problems.append("group-kill: the trainer did not start")
            os.killpg(trainer.pid, signal.SIGKILL)
            self.counts["process_groups_killed"] += 1
        finally:
            trainer.wait()
            trainer.stdout.close()

    def run(self, seconds: float) -> dict:
        actions = [self.daemon] * 4 + [self.worker_kill] * 2 + [self.serve] * 3 + [self.group_kill]
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            action = self.rng.choice(actions)
            try:
                action()
            except Exception as e:  # every exception is a finding: the actions expect none but their own
                self.counts["unexpected_errors"] += 1
                self.problems.append(f"{action.__name__}: {type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}")
        return {"counts": dict(self.counts), "problems": self.problems[:20]}


def _child_of(pid: int) -> int:
    """The first child of process ``pid`` (the server that ``unshare --fork`` started)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return int(f.read().split()[0])


def _marked_processes(token: str) -> list[int]:
    """Processes whose environment carries ``INFEED_SOAK=token``: this run's, whatever their parent."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if f"INFEED_SOAK={token}".encode() in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _own_entries() -> list[str]:
    entries = [os.path.join(SHM_DIR, n) for n in os.listdir(SHM_DIR) if n.startswith(name_prefix())
               and os.path.join(SHM_DIR, n) != names_dir()]
    if os.path.isdir(names_dir()):
        entries += [os.path.join(names_dir(), n) for n in os.listdir(names_dir())]
    return entries


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True)
    return probe.returncode == 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 180)))
    p.add_argument("--clients", type=int, default=int(os.environ.get("SOAK_CLIENTS", 3)))
    p.add_argument("--json", help="write the figures here too")
    p.add_argument("--client", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:                                   # one client process: its counts as JSON on stdout
        config = json.loads(args.client)
        out = Client(config["files"], config["seed"], config["unshare"]).run(config["seconds"])
        print(json.dumps(out), flush=True)
        return 0
    before = set(_own_entries())
    unshare = _unshare_works()
    token = os.urandom(8).hex()
    env = {**ENV, "INFEED_SOAK": token}
    with tempfile.TemporaryDirectory(prefix="infeed-soak-") as tmp:
        files = write_files(pathlib.Path(tmp))
        clients = [subprocess.Popen([sys.executable, __file__, "--client", json.dumps(
            {"files": files, "seed": k, "unshare": unshare, "seconds": args.seconds})],
            stdout=subprocess.PIPE, text=True, env=env) for k in range(args.clients)]
        collected, started = 0, time.monotonic()
        while any(c.poll() is None for c in clients):
            collected += len(collect())
            time.sleep(0.5)
        results = [json.loads(c.stdout.read().strip().splitlines()[-1]) for c in clients]
        for c in clients:
            c.stdout.close()
    totals: collections.Counter = collections.Counter()
    problems = []
    for r in results:
        totals.update(r["counts"])
        problems += r["problems"]
    left_before_gc = sorted(set(orphans()) - before)
    collected_at_end = len(collect())
    leaked = sorted(set(orphans()) - before)          # other users of /dev/shm (live rings) are not ours to count
    time.sleep(1)
    leftover = _marked_processes(token)
    figures = {"seconds": round(time.monotonic() - started, 1), "clients": args.clients,
               "pid_namespaces": unshare, **dict(sorted(totals.items())),
               "collected_by_gc_while_running": collected, "left_at_the_end_before_gc": len(left_before_gc),
               "collected_at_the_end": collected_at_end, "leaked_after_gc": len(leaked),
               "leftover_processes": len(leftover),
               "lost_or_wrong_batches": totals["wrong_batches"], "problems": problems[:10]}
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    for pid in leftover:
        os.kill(pid, signal.SIGKILL)
    failed = problems or leaked or leftover or totals["wrong_batches"] or totals["unexpected_errors"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
