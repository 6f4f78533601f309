"""The worker launcher's process: it imports the worker's modules once, then forks a worker for each request.

Started by :mod:`infeed.daemon.launcher` as ``python -P -m infeed.daemon.launcher_process FD``, where ``FD``
is its end of a ``SOCK_SEQPACKET`` socket pair. A request is one message, ``{"cwd": DIR}`` as JSON, carrying two
descriptors (the worker's stdin and stderr); the reply is ``{"pid": P}`` or ``{"error": "..."}`` as JSON (never a pickle).
The worker is forked through a process that exits at once, so that it is re-parented to the trainer (a
child subreaper while it waits for the reply) and is the trainer's own child, as a worker started with
``subprocess`` is: the trainer waits for it, reads its exit status and signals it by its pid. The launcher
ends when the trainer's end of the socket closes (the trainer exited or was killed).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import traceback

__all__ = ["main"]


def _become_worker(control: socket.socket, stdin: int, stderr: int) -> None:
    """Runs :func:`infeed.daemon.worker.main` in this forked process, on the request's descriptors, and exits
    with its status; never returns."""
    status = 1
    try:
        control.close()
        os.dup2(stdin, 0)
        os.dup2(stderr, 2)
        os.close(stdin)
        os.close(stderr)
        signal.signal(signal.SIGINT, signal.SIG_DFL)        # the worker sets its own, as a fresh process would
        from infeed.daemon import worker
        status = worker.main()
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _fork_worker(control: socket.socket, cwd: str, stdin: int, stderr: int) -> int:
    """Forks a worker in the trainer's working directory ``cwd`` through a process that exits at once; returns
    the worker's pid once that process is gone (so the worker has been re-parented, in ``cwd``, by then)."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        try:
            os.close(read)
            os.chdir(cwd)
            pid = os.fork()
            if pid == 0:
                os.close(write)
                _become_worker(control, stdin, stderr)
            os.write(write, str(pid).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        data = b""
        while chunk := os.read(read, 64):
            data += chunk
    finally:
        os.close(read)
        os.waitpid(middle, 0)
    if not data:
        raise OSError("the worker could not be forked")
    return int(data)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)          # Ctrl-C is the trainer's to handle
    control = socket.socket(fileno=int(sys.argv[1]))
    from infeed.daemon import worker  # noqa: F401  (the imports every worker needs, done once here)
    control.send(b'{"ready": true}')
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(control, 1024, 2)
        except OSError:
            return 0
        if not message:
            return 0                                      # the trainer is gone
        try:
            if len(fds) != 2:
                raise ValueError(f"a request carries 2 descriptors, this one {len(fds)}")
            request = json.loads(message)
            reply = {"pid": _fork_worker(control, str(request["cwd"]), *fds)}
        except Exception as error:
            reply = {"error": f"{type(error).__name__}: {error}"}
        finally:
            for fd in fds:
                os.close(fd)
        try:
            control.send(json.dumps(reply).encode())
        except OSError:
            return 0


if __name__ == "__main__":
    sys.exit(main())
