"""``infeed serve``: the daemon alone in its own process, for trainers that attach by name.

    infeed serve --config ds.json --name train --workers 2 --slots 8
    # in the trainer:  for batch in infeed.attach("train"): ...

The ring's segment keeps its unguessable name; ``--name`` is an alias, a small
file ``/dev/shm/infeed-<uid>-name-<NAME>`` (mode 0600) holding it. The server
records a worker's death in the ring, so the attached trainer raises
:class:`~infeed.WorkerDied` for it, and it ends (removing ring and alias) on
Ctrl-C, SIGTERM, or once the data is exhausted and every slot handed back.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import time

from infeed.errors import AttachError, WorkerDied
from infeed.ring import SHM_DIR

HELP = "run a decoding daemon in this process; trainers attach with infeed.attach(NAME)"
USAGE_ERRORS = (ValueError,)

__all__ = ["alias_path", "resolve_name", "serve"]

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: How often the server looks at its workers.
POLL = 0.2


def alias_path(name: str) -> str:
    """Where the alias ``name`` of a served ring lives."""
    if not _NAME.fullmatch(name) or name.startswith("."):
        raise ValueError(f"a ring name is 1 to 64 letters, digits, '_', '-' or '.', got {name!r}")
    return os.path.join(SHM_DIR, f"infeed-{os.getuid()}-name-{name}")


def resolve_name(name: str) -> str:
    """The segment name behind ``name``: an alias ``infeed serve`` wrote, else ``name`` itself."""
    if name.startswith(f"infeed-{os.getuid()}-") and "-name-" not in name:
        return name
    path = alias_path(name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AttachError(name, "exists", f"a ring served as {name!r} (infeed serve --name {name})", "none") \
            from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) != 0o600:
            raise AttachError(name, "owner", f"an alias of uid {os.getuid()} with mode 0o600",
                              f"uid {st.st_uid}, mode {oct(stat.S_IMODE(st.st_mode))}")
        target = f.read(200).decode(errors="replace").strip()
    return target


def _write_alias(name: str, target: str) -> str:
    path = alias_path(name)
    if os.path.exists(path):
        try:
            if os.path.exists(os.path.join(SHM_DIR, resolve_name(name))):
                raise ValueError(f"a ring is already served as {name!r}")
        except AttachError:
            pass
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(target.encode())
    return path


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(dataset, name: str, *, num_workers: int = 2, slots: int = 8, state: dict | None = None,
          lock_memory: bool = True, ready=None) -> int:
    """Runs a daemon until interrupted or drained; returns the exit status (1 when a worker failed)."""
    from infeed.daemon import Daemon

    alias_path(name)                                     # a bad name fails before anything starts
    daemon = Daemon(dataset, num_workers, slots, state=state, lock_memory=lock_memory)
    alias = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        alias = _write_alias(name, daemon.ring.name)
        if ready is not None:
            ready(daemon)
        while True:
            time.sleep(POLL)
            codes = [p.poll() for p in daemon._procs]
            for proc, code in zip(daemon._procs, codes):
                if code is not None and code < 0:
                    daemon.ring.set_error(WorkerDied(proc.pid, signal=-code))
                    return 1
            if all(c is not None for c in codes) and all(
                    daemon.ring.slot_state(i)[0] == "free" for i in range(daemon.ring.slots)):
                return 1 if any(codes) else 0
    except KeyboardInterrupt:
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if alias is not None:
            try:
                os.unlink(alias)
            except FileNotFoundError:
                pass
        daemon.close()


def add_arguments(parser) -> None:
    from infeed.cli import positive_int

    parser.add_argument("--config", required=True, help="the dataset as JSON (infeed.Dataset(...).to_json())")
    parser.add_argument("--name", required=True, help="the name trainers attach to")
    parser.add_argument("--workers", type=positive_int, default=2, help="decoding processes (default 2)")
    parser.add_argument("--slots", type=positive_int, default=8, help="ring slots (default 8)")
    parser.add_argument("--state", help="a JSON file holding a feed's state(), to resume from")
    parser.add_argument("--no-mlock", action="store_true", help="do not lock the ring's pages in memory")


def run(args) -> int:
    from infeed.dataset import Dataset

    with open(args.config) as f:
        dataset = Dataset.from_json(json.load(f))
    state = None
    if args.state:
        with open(args.state) as f:
            state = json.load(f)

    def ready(daemon):
        print(f"serving {dataset!r} as {args.name!r} (ring {daemon.ring.name}, "
              f"workers {' '.join(map(str, daemon.worker_pids))})", flush=True)

    return serve(dataset, args.name, num_workers=args.workers, slots=args.slots, state=state,
                 lock_memory=not args.no_mlock, ready=ready)
