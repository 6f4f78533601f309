"""Workers forked from a launcher: a process per trainer that has imported the worker's modules once.

A worker started as a fresh interpreter spends about 0.4 CPU-seconds importing numpy and infeed before it
decodes a record; one forked from the launcher (:mod:`infeed.daemon.launcher_process`) starts in a few
milliseconds. The worker is still this process's own child (re-parented to it: this process is a child
subreaper while it waits for the launcher's reply), so :class:`LaunchedWorker` waits for it, reads its exit
status and signals it as :class:`subprocess.Popen` does, and its stderr is an
:class:`~infeed.daemon.output.OutputTail` like a fresh worker's.

The launcher is started at the first worker, with the workers' environment; a later worker with another
environment (or after this process forked) gets a new launcher. Where no launcher can be had (it cannot
start or died, no ``prctl``), or ``INFEED_WORKER_LAUNCHER=0``, :func:`launch` returns ``None`` and the
daemon starts a fresh interpreter. The launcher holds the modules as they were when it started: a trainer
that edits infeed's source between daemons sets ``INFEED_WORKER_LAUNCHER=0``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from infeed.daemon.output import OutputTail

__all__ = ["LAUNCHER_ENV", "LaunchedWorker", "launch", "launcher_pid"]

#: ``0`` starts every worker as a fresh interpreter.
LAUNCHER_ENV = "INFEED_WORKER_LAUNCHER"

#: Seconds the launcher may take to start (its imports) or to fork a worker before it is given up.
LAUNCHER_TIMEOUT = 60.0

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37

_log = logging.getLogger("infeed")
_lock = threading.Lock()
_launcher: "_Launcher | None" = None


class LaunchedWorker:
    """A worker forked by the launcher, this process's child: ``pid``, ``returncode``, :meth:`poll`,
    :meth:`wait`, :meth:`send_signal`, :meth:`kill` and :meth:`terminate` as :class:`subprocess.Popen`'s;
    ``stdin`` takes its config; ``output`` keeps the end of its stderr."""

    def __init__(self, pid: int, stdin, output: OutputTail):
        self.pid, self.stdin, self.output = pid, stdin, output
        self.args = ["infeed.daemon.launcher_process", str(pid)]
        self.returncode: int | None = None
        self._wait_lock = threading.Lock()

    def poll(self) -> int | None:
        with self._wait_lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:       # reaped by someone else's waitpid(-1): as Popen, status unknown
                    self.returncode = 0
                else:
                    if pid == self.pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:     # not yet reaped, so the pid is still this worker's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _Launcher:
    """The launcher process and this process's end of its socket."""

    def __init__(self, env: dict):
        self.env, self.owner = env, os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "infeed.daemon.launcher_process", str(theirs.fileno())],
                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.socket = ours
        ours.settimeout(LAUNCHER_TIMEOUT)
        if self._receive().get("ready") is not True:
            self.close()
            raise OSError("the worker launcher did not start")

    def _receive(self) -> dict:
        try:
            reply = self.socket.recv(1024)
        except OSError as error:
            raise OSError(f"the worker launcher did not answer: {error}") from None
        if not reply:
            raise OSError(f"the worker launcher ended (status {self.process.wait()})")
        return json.loads(reply)

    def fork_worker(self, stdin: int, stderr: int) -> int:
        socket.send_fds(self.socket, [json.dumps({"cwd": os.getcwd()}).encode()], [stdin, stderr])
        reply = self._receive()
        if "error" in reply:
            raise OSError(f"the worker launcher could not fork a worker: {reply['error']}")
        return int(reply["pid"])

    def close(self) -> None:
        self.socket.close()         # the launcher ends at the end of its socket
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class _Subreaper:
    """This process as a child subreaper for the block (as it was before, after it): orphans of its
    descendants, such as a worker whose forking parent exited, become its children."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._was = ctypes.c_int(0)
        if self._libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(self._was), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_GET_CHILD_SUBREAPER) failed")

    def _set(self, value: int) -> None:
        if self._libc.prctl(_PR_SET_CHILD_SUBREAPER, ctypes.c_ulong(value), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")

    def __enter__(self):
        if not self._was.value:
            self._set(1)

    def __exit__(self, *exc):
        if not self._was.value:
            self._set(0)


def _forget_in_child() -> None:
    """In a child forked from this process: the parent's launcher is not its own (and its socket closes
    here, so the launcher still ends with the parent), and the lock is new (another of the parent's threads
    may have held it at the fork)."""
    global _launcher, _lock
    _lock = threading.Lock()
    if _launcher is not None:
        _launcher.socket.close()
        _launcher = None


os.register_at_fork(after_in_child=_forget_in_child)


def _launcher_for(env: dict) -> _Launcher:
    global _launcher
    if _launcher is not None and (_launcher.env != env or _launcher.process.poll() is not None):
        old, _launcher = _launcher, None
        old.close()
    if _launcher is None:
        _launcher = _Launcher(env)
    return _launcher


def _stop_launcher() -> None:
    global _launcher
    with _lock:
        if _launcher is not None:
            old, _launcher = _launcher, None
            old.close()


def launcher_pid() -> int | None:
    """The pid of this process's launcher while one runs (the one child of this process a daemon leaves)."""
    current = _launcher
    return None if current is None or current.owner != os.getpid() else current.process.pid


def launch(env: dict) -> LaunchedWorker | None:
    """A worker forked by this process's launcher (started with ``env`` where none is running with it),
    re-parented to this process; ``None`` where none can be had (the daemon starts a fresh interpreter)."""
    global _launcher
    if os.environ.get(LAUNCHER_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return None
    with _lock:
        stdin_read, stdin_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            try:
                launcher = _launcher_for(env)
                with _Subreaper():
                    pid = launcher.fork_worker(stdin_read, err_write)
            except (OSError, ValueError) as error:
                _log.debug("infeed: no worker launcher (%s); the worker starts as a fresh interpreter", error)
                if _launcher is not None:
                    old, _launcher = _launcher, None
                    old.close()
                os.close(err_read)
                os.close(stdin_write)
                return None
        finally:
            os.close(stdin_read)
            os.close(err_write)
        try:
            reaped, status = os.waitpid(pid, os.WNOHANG)    # this process's child now, or not ours to wait for
        except ChildProcessError:
            _log.debug("infeed: the launcher's worker %d was not re-parented here; starting a fresh one", pid)
            os.close(err_read)
            os.close(stdin_write)           # it reads an empty config and exits
            return None
        worker = LaunchedWorker(pid, os.fdopen(stdin_write, "wb"), OutputTail(err_read))
        if reaped == pid:
            worker.returncode = os.waitstatus_to_exitcode(status)
        return worker


atexit.register(_stop_launcher)
