"""A worker's standard error: passed on to the trainer's, its end kept for the error a death raises.

A worker that dies before it can write the ring's error record (an ImportError at start-up, a crash) has
said why on its stderr alone; :class:`OutputTail` keeps the last :data:`KEPT` bytes of it, so that the
trainer's :class:`~infeed.WorkerDied` shows them. A thread drains the pipe (the worker never blocks on a
full one) and writes each chunk on to this process's file descriptor 2, where the worker used to write.
"""

from __future__ import annotations

import os
import threading

__all__ = ["OutputTail", "KEPT"]

#: Bytes of a worker's stderr kept: the end of a traceback.
KEPT = 4096


class OutputTail:
    """Drains the read end ``fd`` of a worker's stderr pipe until the worker (and any process that inherited
    the pipe) has closed it; owns and closes ``fd``."""

    def __init__(self, fd: int):
        self._fd = fd
        self._kept = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name="infeed-worker-stderr", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while chunk := os.read(self._fd, 65536):
                with self._lock:
                    self._kept += chunk
                    del self._kept[:-KEPT]
                try:
                    os.write(2, chunk)
                except OSError:         # no stderr here (closed, a pipe nobody reads): kept all the same
                    pass
        finally:
            os.close(self._fd)

    def text(self, wait: float = 1.0) -> str:
        """The last bytes written, as text; waits up to ``wait`` seconds for the pipe's end first (a worker
        that has exited has written all it will)."""
        self._thread.join(wait)
        with self._lock:
            return self._kept.decode(errors="replace")

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
