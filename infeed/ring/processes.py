"""What a process is doing, from ``/proc`` (for messages), and a liveness check for child processes."""

from __future__ import annotations

from typing import Callable

from infeed.errors import WorkerDied

__all__ = ["process_state", "watch_processes"]


#: What the state letter of /proc/PID/stat says of a process, in words.
_PROCESS_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O", "I": "idle",
                   "T": "stopped by a signal (SIGSTOP, SIGTSTP)", "t": "stopped by a debugger",
                   "Z": "dead, not yet reaped", "X": "dead"}


def process_state(pid: int) -> str:
    """What process ``pid`` is doing, in words (``running``, ``sleeping``, ``stopped by a signal ...``, ``gone``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return "gone"
    letter = data[data.rindex(b")") + 2:][:1].decode()
    return _PROCESS_STATES.get(letter, f"state {letter}")


def watch_processes(processes) -> Callable[[], None]:
    """A liveness check for child processes (``multiprocessing.Process`` or ``subprocess.Popen``).

    The check raises :class:`~infeed.WorkerDied` with the pid and the signal or
    exit status of the first one that has ended.
    """
    processes = list(processes)

    def check():
        for p in processes:
            code = p.exitcode if hasattr(p, "exitcode") else p.poll()
            if code is not None:
                raise WorkerDied(p.pid, signal=-code if code < 0 else None, exitcode=code if code >= 0 else None)
    return check
