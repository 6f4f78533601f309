"""The proxy seen from the process it measures: :class:`StoreProxy` starts a :class:`~.server.ProxyServer` in a
process of its own (``python -m bench.peers.store_proxy``) and drives it over that process's stdin and stdout."""

from __future__ import annotations

import base64
import json
import os
import pickle
import select
import subprocess
import sys
import threading
from pathlib import Path

from bench.peers.store_proxy.faults import Match
from bench.peers.store_proxy.server import HOST, JOIN_SECONDS, Listening, latency_seconds, parse_upstream

__all__ = ["StoreProxy", "ProxyFailed"]

#: The checkout that holds bench/: the proxy's process runs there.
ROOT = Path(__file__).resolve().parents[3]
#: How long the proxy's process may take to start, and to answer a call.
START_SECONDS, CALL_SECONDS = 30.0, 30.0


class ProxyFailed(RuntimeError):
    """The proxy's process did not start, exited, or did not answer a call in time."""


class StoreProxy(Listening):
    """A reverse proxy on ``host:port`` (0: a free port) for the plain-HTTP server at ``upstream`` (``host:port`` or
    ``http://host:port``), in a process of its own (a :class:`~bench.peers.store_proxy.server.ProxyServer` there)
    started at once and stopped by :meth:`close` or the end of a ``with`` block.

    Every request goes to the server unchanged and its answer comes back unchanged, its first byte ``latency_s``
    seconds (settable at any time) after the request's last, unless a fault set by :meth:`fail_next` or
    :meth:`drop_next` applies to it. ``requests`` counts the requests forwarded, ``failed`` those answered by a
    fault, ``dropped`` those reset, ``bytes_out`` the bytes sent back to clients (heads and bodies); ``recent``
    lists the last ``RECENT`` requests as (method, path with query, status; None where reset). Any thread may call
    any of these (one call at a time goes to the process).
    """

    def __init__(self, upstream: str, *, latency_s: float = 0.0, host: str = HOST, port: int = 0):
        parse_upstream(upstream)
        self.upstream, self._latency_s = upstream, latency_seconds(latency_s)
        self._lock = threading.Lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        argv = [sys.executable, "-m", "bench.peers.store_proxy", "--upstream", upstream, "--host", host,
                "--port", str(port), "--latency", repr(self._latency_s)]
        self._process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=str(ROOT))
        try:
            address = self._reply(START_SECONDS)
        except BaseException:
            self.close()
            raise
        self.host, self.port = address["host"], address["port"]

    @property
    def latency_s(self) -> float:
        return self._latency_s

    @latency_s.setter
    def latency_s(self, seconds: float):
        self._call("latency", seconds=latency_seconds(seconds))
        self._latency_s = float(seconds)

    def fail_next(self, count: int, status: int = 503, body: bytes | str = b"", headers: dict | None = None,
                  match: Match | None = None):
        """The next ``count`` requests for which ``match(method, path)`` holds (every request: None) are answered
        ``status`` with ``body`` and ``headers``, and never reach the server: ``fail_next(2, *s3_slow_down())``.
        Faults apply in the order they were set. ``match`` runs in the proxy's process, so it goes there pickled:
        a :class:`Requests`, or a function importable there (defined at a module's top level)."""
        body = body.encode() if isinstance(body, str) else bytes(body)
        self._call("fail", count=count, status=status, body=base64.b64encode(body).decode(),
                   headers=[[str(name), str(value)] for name, value in (headers or {}).items()],
                   match=_pickled(match))

    def drop_next(self, count: int, match: Match | None = None):
        """The next ``count`` requests that ``match`` (as for :meth:`fail_next`) get their connection reset (a TCP
        RST) instead of an answer, and never reach the server."""
        self._call("drop", count=count, match=_pickled(match))

    def clear_faults(self) -> int:
        """Forgets the faults not used up; returns how many requests they would still have applied to."""
        return self._call("clear")

    def counts(self) -> dict[str, int]:
        """``requests``, ``failed``, ``dropped`` and ``bytes_out`` at one moment."""
        return self._call("counts")

    @property
    def requests(self) -> int:
        """Requests forwarded to the server."""
        return self.counts()["requests"]

    @property
    def failed(self) -> int:
        """Requests answered by :meth:`fail_next`."""
        return self.counts()["failed"]

    @property
    def dropped(self) -> int:
        """Requests whose connection :meth:`drop_next` reset."""
        return self.counts()["dropped"]

    @property
    def bytes_out(self) -> int:
        """Bytes sent back to clients: heads and bodies, the server's answers and the injected ones."""
        return self.counts()["bytes_out"]

    @property
    def recent(self) -> list[tuple[str, str, int | None]]:
        """The last ``RECENT`` requests, oldest first, as (method, path with query, status; None where reset)."""
        return [tuple(entry) for entry in self._call("recent")]

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    def close(self, timeout: float = JOIN_SECONDS + 5):
        """Stops the proxy (a request under way is cut off) and waits for its process to end, killing it after
        ``timeout`` seconds. Idempotent."""
        with self._lock:
            if not self._process.stdin.closed:
                try:        # told to stop, and its stdin ended (which a process forked from this one may hold open)
                    self._process.stdin.write(json.dumps({"command": "close"}).encode() + b"\n")
                    self._process.stdin.close()
                except OSError:
                    pass
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process.stdout.close()

    def __enter__(self) -> StoreProxy:
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"StoreProxy({getattr(self, 'endpoint', '?')} -> {self.upstream}, latency_s={self.latency_s})"

    def _call(self, command: str, **args):
        """Sends one command to the proxy's process; returns its answer's value."""
        with self._lock:
            if not self.running or self._process.stdin.closed:
                raise ProxyFailed(f"the proxy for {self.upstream} is not running (exit status "
                                  f"{self._process.returncode})")
            try:
                self._process.stdin.write(json.dumps({"command": command, **args}).encode() + b"\n")
                self._process.stdin.flush()
            except OSError as e:
                raise ProxyFailed(f"the proxy for {self.upstream} is gone: {e}") from None
            reply = self._reply(CALL_SECONDS)
        if "error" in reply:
            raise ValueError(reply["error"])
        return reply.get("value")

    def _reply(self, timeout: float) -> dict:
        """The process's next line, as JSON."""
        if not select.select([self._process.stdout], [], [], timeout)[0]:
            raise ProxyFailed(f"the proxy for {self.upstream} did not answer within {timeout:.0f} s")
        line = self._process.stdout.readline()
        if not line:
            try:
                self._process.wait(JOIN_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            raise ProxyFailed(f"the proxy for {self.upstream} ended (exit status {self._process.returncode}; its "
                              f"messages are above)")
        return json.loads(line)


def _pickled(match: Match | None) -> str | None:
    if match is None:
        return None
    try:
        return base64.b64encode(pickle.dumps(match)).decode()
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"match {match!r} cannot go to the proxy's process ({e}): give a Requests(method, path), or "
                        f"a function defined at a module's top level") from None
