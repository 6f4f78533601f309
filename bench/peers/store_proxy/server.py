"""The proxy itself (:class:`ProxyServer`): a thread accepting connections and one per client connection, each
request passed on to the server over a kept-alive connection of its own (:class:`Upstream`) and its answer passed
back ``latency_s`` after it, or a fault's answer or a reset instead."""

from __future__ import annotations

import collections
import itertools
import select
import socket
import struct
import threading
import time
from typing import Callable

from bench.peers.store_proxy.faults import Fault, Match
from bench.peers.store_proxy.messages import (CONTINUE, UNTIL_CLOSE, BadMessage, Head, copy_body, discard,
                                              keeps_alive, read_head, request_framing, request_line,
                                              response_framing)

__all__ = ["ProxyServer", "Listening", "parse_upstream", "latency_seconds", "HOST", "THREAD_PREFIX"]

HOST = "127.0.0.1"
#: Every thread of a proxy is named ``store-proxy-PORT-...``.
THREAD_PREFIX = "store-proxy"
#: How many (method, path, status) triples ``recent`` keeps, and what ``counts()`` counts.
RECENT, COUNTERS = 10_000, ("requests", "failed", "dropped", "bytes_out")
#: How long ``close()`` waits for the proxy's threads in all; a connection to the server may take to open.
JOIN_SECONDS, CONNECT_SECONDS = 5.0, 10.0


class Listening:
    """Where a proxy listens (``host`` and ``port``), in the forms its clients take."""

    host: str
    port: int

    @property
    def endpoint(self) -> str:
        """``host:port``, for ``endpoint_override``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://host:port``, for ``AWS_ENDPOINT_URL`` and ``STORAGE_EMULATOR_HOST``."""
        return f"http://{self.endpoint}"


def latency_seconds(seconds: float) -> float:
    """A proxy's ``latency_s``, refused below 0."""
    if not seconds >= 0:
        raise ValueError(f"latency_s must be 0 or more, not {seconds}")
    return float(seconds)


def parse_upstream(upstream: str) -> tuple[str, int]:
    """``host:port`` or ``http://host:port`` as (host, port)."""
    if upstream.startswith("https://"):
        raise ValueError(f"the proxy speaks plain HTTP to its server, not {upstream}")
    host, sep, port = upstream.removeprefix("http://").rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not host:port: {upstream!r}")
    return host.strip("[]"), int(port)


def _shutdown(sock: socket.socket):
    """Ends a socket's traffic both ways, waking any thread blocked on it (it stays open until closed)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _no_delay(sock: socket.socket) -> socket.socket:
    """Small writes (a head, a chunk's size line) go out at once: Nagle's wait would add tens of milliseconds."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class Upstream:
    """One connection to the server, kept open from request to request while both ends allow."""

    def __init__(self, address: tuple[str, int]):
        self.sock = _no_delay(socket.create_connection(address, timeout=CONNECT_SECONDS))
        self.sock.settimeout(None)
        self.rfile = self.sock.makefile("rb")

    def closed_by_server(self) -> bool:
        """Whether the server has closed this idle connection (it reads as ready: the end of the stream)."""
        return bool(select.select([self.sock], [], [], 0)[0])

    def final_head(self) -> Head:
        """The response's head, past any interim 1xx answers (a ``100 Continue`` was sent to the client already)."""
        while True:
            head = read_head(self.rfile)
            if head is None:
                raise BadMessage("the server closed the connection without answering")
            if head.status >= 200:
                return head

    def close(self):
        self.rfile.close()
        self.sock.close()


class ProxyServer(Listening):
    """The proxy itself, serving in the process that makes it: a thread accepting connections and one per client
    connection, started at once and stopped by :meth:`close` or the end of a ``with`` block. The same interface as
    :class:`StoreProxy` (which runs one in a process of its own), ``match`` any callable.

    Only for clients that never hold the GIL while they wait for it (``http.client``; not pyarrow, see
    :mod:`bench.peers.store_proxy`).
    """

    def __init__(self, upstream: str, *, latency_s: float = 0.0, host: str = HOST, port: int = 0):
        self.upstream = parse_upstream(upstream)
        self.latency_s = latency_s
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._faults: list[Fault] = []
        self._counts = collections.Counter()
        self._recent: collections.deque = collections.deque(maxlen=RECENT)
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._ids = itertools.count(1)
        self._listener = socket.create_server((host, port), backlog=128)
        self._listener.settimeout(0.5)          # a fallback: close() wakes accept() by shutting the socket down
        self.host, self.port = self._listener.getsockname()[:2]
        self._accepter = self._start_thread("accept", self._accept_loop)

    @property
    def latency_s(self) -> float:
        return self._latency_s

    @latency_s.setter
    def latency_s(self, seconds: float):
        self._latency_s = latency_seconds(seconds)

    def fail_next(self, count: int, status: int = 503, body: bytes | str = b"", headers: dict | None = None,
                  match: Match | None = None):
        """As :meth:`StoreProxy.fail_next`; ``match`` runs under the proxy's lock, and must be quick. ``headers``
        may be (name, value) pairs too; Content-Length and Connection are the proxy's to set."""
        body = body.encode() if isinstance(body, str) else bytes(body)
        pairs = headers.items() if isinstance(headers, dict) else headers or ()
        kept = tuple((str(name), str(value)) for name, value in pairs
                     if str(name).lower() not in ("content-length", "connection", "transfer-encoding"))
        self._add_fault(Fault(count, match, status, body, kept))

    def drop_next(self, count: int, match: Match | None = None):
        """As :meth:`StoreProxy.drop_next`."""
        self._add_fault(Fault(count, match))

    def clear_faults(self) -> int:
        """Forgets the faults not used up; returns how many requests they would still have applied to."""
        with self._lock:
            left = sum(f.remaining for f in self._faults)
            self._faults.clear()
        return left

    def counts(self) -> dict[str, int]:
        """``requests``, ``failed``, ``dropped`` and ``bytes_out`` (as :class:`StoreProxy` counts them) at one
        moment."""
        with self._lock:
            return {name: self._counts[name] for name in COUNTERS}

    requests = property(lambda self: self.counts()["requests"])
    failed = property(lambda self: self.counts()["failed"])
    dropped = property(lambda self: self.counts()["dropped"])
    bytes_out = property(lambda self: self.counts()["bytes_out"])

    @property
    def recent(self) -> list[tuple[str, str, int | None]]:
        """The last ``RECENT`` requests, oldest first, as (method, path with query, status; None where reset)."""
        with self._lock:
            return list(self._recent)

    def close(self, timeout: float = JOIN_SECONDS):
        """Stops accepting, ends every connection (a request under way is cut off) and waits up to ``timeout``
        seconds in all for the proxy's threads to end. Idempotent."""
        self._stopping.set()
        deadline = time.monotonic() + timeout
        _shutdown(self._listener)
        self._accepter.join(timeout)
        self._listener.close()
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _shutdown(sock)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            left, self._sockets = list(self._sockets), set()
        for sock in left:                       # only where a thread did not end in time
            sock.close()

    def __enter__(self) -> ProxyServer:
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"ProxyServer({self.endpoint} -> {self.upstream[0]}:{self.upstream[1]}, latency_s={self.latency_s})"

    # --- bookkeeping, shared by the connections' threads ---

    def _add_fault(self, fault: Fault):
        if fault.remaining < 1:
            raise ValueError(f"count must be 1 or more, not {fault.remaining}")
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, method: str, path: str) -> Fault | None:
        """The first fault that applies to this request, used once; None when the request goes to the server."""
        with self._lock:
            for fault in self._faults:
                if fault.applies(method, path):
                    fault.remaining -= 1
                    if not fault.remaining:
                        self._faults.remove(fault)
                    return fault
        return None

    def _record(self, method: str, path: str, status: int | None, counter: str | None = None):
        with self._lock:
            self._recent.append((method, path, status))
            if counter:
                self._counts[counter] += 1

    def _add(self, counter: str, n: int = 1):
        with self._lock:
            self._counts[counter] += n

    def _track(self, sock: socket.socket) -> bool:
        """Registers a socket for ``close()`` to shut down; False (and the socket shut down) once stopping."""
        with self._lock:
            if self._stopping.is_set():
                _shutdown(sock)
                return False
            self._sockets.add(sock)
            return True

    def _untrack(self, sock: socket.socket):
        with self._lock:
            self._sockets.discard(sock)
        sock.close()

    def _wait_until(self, deadline: float) -> bool:
        """Sleeps until ``deadline`` (``time.monotonic()``); False if the proxy is stopping meanwhile."""
        left = deadline - time.monotonic()
        if left > 0:
            self._stopping.wait(left)
        return not self._stopping.is_set()

    def _start_thread(self, what: str, target: Callable, *args) -> threading.Thread:
        thread = threading.Thread(target=self._run_thread, args=(target, *args), daemon=True,
                                  name=f"{THREAD_PREFIX}-{self.port}-{what}")
        with self._lock:
            self._threads.add(thread)
        thread.start()
        return thread

    def _run_thread(self, target: Callable, *args):
        try:
            target(*args)
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return                          # shut down by close()
            sock.settimeout(None)
            if self._track(_no_delay(sock)):
                self._start_thread(f"connection-{next(self._ids)}", self._serve, sock)
            else:
                sock.close()

    def _serve(self, sock: socket.socket):
        try:
            Connection(self, sock).serve()
        finally:
            self._untrack(sock)


class Connection:
    """One client connection, served by its own thread: request after request until either end closes it, each
    forwarded over one kept-alive connection to the server (opened again where the server closed it)."""

    def __init__(self, proxy: ProxyServer, sock: socket.socket):
        self.proxy, self.sock = proxy, sock
        self.rfile = sock.makefile("rb")
        self.upstream: Upstream | None = None

    def serve(self):
        try:
            while not self.proxy._stopping.is_set():
                head = read_head(self.rfile)
                if head is None or not self.answer(head):
                    return
        except (OSError, BadMessage):
            pass        # a peer went away or sent what is not HTTP, or the proxy is stopping: the connection ends
        finally:
            self.rfile.close()
            self._close_upstream()

    def answer(self, head: Head) -> bool:
        """Answers one request; whether the connection stays open for the next."""
        method, path, version = request_line(head)
        fault = self.proxy._take_fault(method, path)
        if fault is None:
            return self.forward(head, method, path, version)
        if fault.status is None:
            self.proxy._record(method, path, None, "dropped")
            self.reset()
            return False
        return self.inject(fault, head, method, path, version)

    def send(self, data: bytes):
        """Sends to the client, counted first (what a client has received is in the counts by then)."""
        self.proxy._add("bytes_out", len(data))
        self.sock.sendall(data)

    # --- forwarding ---

    def forward(self, head: Head, method: str, path: str, version: str) -> bool:
        """Sends the request to the server and its answer back, the answer's first byte ``latency_s`` after the
        request's last."""
        self.proxy._add("requests")
        try:
            upstream = self.upstream_connection()
            self.send_request(upstream, head)
            deadline = time.monotonic() + self.proxy.latency_s
            response = upstream.final_head()
        except (OSError, BadMessage):
            self.bad_gateway(method, path)
            return False
        if not self.proxy._wait_until(deadline):
            return False
        return self.send_response(upstream, response, method, path) and keeps_alive(head, version)

    def upstream_connection(self) -> Upstream:
        if self.upstream is not None and self.upstream.closed_by_server():
            self._close_upstream()
        if self.upstream is None:
            upstream = Upstream(self.proxy.upstream)
            if not self.proxy._track(upstream.sock):
                upstream.close()
                raise ConnectionAbortedError("the proxy is stopping")
            self.upstream = upstream
        return self.upstream

    def send_request(self, upstream: Upstream, head: Head):
        """The head as received (Host included: SigV4 signed it), then the body as it comes, framed as it came. A
        client waiting for ``100 Continue`` gets it from the proxy at once."""
        framing = request_framing(head)
        upstream.sock.sendall(head.to_bytes())
        if framing and "100-continue" in head.tokens("expect"):
            self.send(CONTINUE)
        copy_body(self.rfile, upstream.sock.sendall, framing)

    def send_response(self, upstream: Upstream, response: Head, method: str, path: str) -> bool:
        """Passes the answer on; whether the server's connection stays open (then the client's may too)."""
        framing = response_framing(response, method)
        server_keeps = framing != UNTIL_CLOSE and "close" not in response.tokens("connection")
        self.proxy._record(method, path, response.status)
        self.send(response.to_bytes())
        copy_body(upstream.rfile, self.send, framing)
        if not server_keeps:
            self._close_upstream()
        return server_keeps

    def bad_gateway(self, method: str, path: str):
        """Answers 502 where the server could not be reached or broke off, unless the proxy is stopping."""
        if self.proxy._stopping.is_set():
            return
        self.proxy._record(method, path, 502)
        try:
            self.send(Fault(1, status=502, body=b"store proxy: the server did not answer").answer(method, False))
        except OSError:
            pass

    def _close_upstream(self):
        if self.upstream is not None:
            self.upstream.rfile.close()
            self.proxy._untrack(self.upstream.sock)
            self.upstream = None

    # --- faults ---

    def inject(self, fault: Fault, head: Head, method: str, path: str, version: str) -> bool:
        """Answers with the fault's status and body after ``latency_s``; the request's body is read and thrown away
        (unless the client waits for ``100 Continue``: then it is never sent, and the connection is closed)."""
        framing = request_framing(head)
        keep = keeps_alive(head, version) and not (framing and "100-continue" in head.tokens("expect"))
        if keep:
            copy_body(self.rfile, discard, framing)
        if not self.proxy._wait_until(time.monotonic() + self.proxy.latency_s):
            return False
        self.proxy._record(method, path, fault.status, "failed")
        self.send(fault.answer(method, keep))
        return keep

    def reset(self):
        """Closes the client's connection with a TCP RST (SO_LINGER 0), as a network failure would."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.rfile.close()
        self.sock.close()
