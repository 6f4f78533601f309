"""A daemon alone in its own process, known by a name, for trainers that attach to it (``infeed serve``).

The ring's segment keeps its unguessable name; the name is an alias (:mod:`infeed.ring.names`). The
server records a worker's death in the ring, so the attached trainer raises
:class:`~infeed.WorkerDied` for it, and it ends (removing ring and alias) on
Ctrl-C, SIGTERM, or once the data is exhausted and every slot handed back.
"""

from __future__ import annotations

import os
import signal
import time

from infeed.daemon.daemon import Daemon
from infeed.errors import WorkerDied
from infeed.ring.names import alias_path, write_alias

__all__ = ["serve"]

#: How often the server looks at its workers.
POLL = 0.2


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve(dataset, name: str, *, num_workers: int = 2, slots: int = 8, state: dict | None = None,
          lock_memory: bool = True, ready=None) -> int:
    """Runs a daemon until interrupted or drained; returns the exit status (1 when a worker failed)."""
    alias_path(name)                                     # a bad name fails before anything starts
    daemon = Daemon(dataset, num_workers, slots, state=state, lock_memory=lock_memory)
    alias = None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        alias = write_alias(name, daemon.ring.name)
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
