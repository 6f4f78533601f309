"""A loopback HTTP proxy that gives an object store's test server a real store's manners: time to first byte,
throttling and dropped connections.

S3 and GCS answer each request after tens of milliseconds and now and then throttle (S3: 503 with the XML error
``SlowDown``; GCS: 429 or 503 with a JSON error); SeaweedFS and fake-gcs-server on 127.0.0.1 (the
``tests/object_stores`` fixtures) answer in about a millisecond and never refuse. A :class:`StoreProxy` sits between
pyarrow and such a server: pyarrow is pointed at the proxy (``endpoint_override=proxy.endpoint``, or
``AWS_ENDPOINT_URL`` / ``STORAGE_EMULATOR_HOST`` set to ``proxy.url``), and every request goes on to the server
unchanged, its answer coming back unchanged ``latency_s`` after the request; or, without reaching the server, a
throttling answer or a reset comes back instead (:meth:`StoreProxy.fail_next`, :meth:`StoreProxy.drop_next`)::

    with StoreProxy(s3_server.endpoint, latency_s=0.03) as proxy:
        fs = pyarrow.fs.S3FileSystem(endpoint_override=proxy.endpoint, scheme="http", ...)
        proxy.fail_next(2, *s3_slow_down())          # pyarrow's retries must get past these two
        data = fs.open_input_file("bucket/key").read()
        proxy.requests, proxy.failed, proxy.recent   # forwarded, answered by the proxy, the last (method, path, status)

``tests/object_stores/test_store_proxy.py`` checks it against both servers (uploads, whole and ranged reads,
listings, latency per request and not per connection, pyarrow's retries past injected throttling and resets) and
against a plain server of its own (chunked bodies, ``Expect: 100-continue``, the Host header, kept-alive
connections). It is meant for ``python -m bench`` suites that read TFRecords from a bucket: a proxy in front of the
loopback server, its ``latency_s`` set per measurement, makes the reads those of a store with a real store's delays.

The proxy runs in a process of its own (``python -m bench.store_proxy``, driven over its stdin and stdout), one
thread per client connection: pyarrow holds the GIL in some calls that wait on the network (``closed``, which it
checks before every read, waits for a GCS download's first byte), so a proxy thread in the calling process could
not answer them, and would take the GIL from the process it measures.

Requests go to the server as they came, the Host header included: SigV4 signs the Host that the AWS SDK sent (the
proxy's host:port) and SeaweedFS checks the signature against the Host it receives (one rewritten to the server's
address is refused, SignatureDoesNotMatch); fake-gcs-server names its resumable upload sessions from it, so that an
upload's later requests come through the proxy too. Bodies pass through framed as they came (``Content-Length``, or
chunked with its extensions and trailers, as the AWS SDK sends its ``aws-chunked`` parts; an answer may also run
until the server closes); a client that sends ``Expect: 100-continue`` (the AWS SDK's parts, google-cloud-cpp's
large uploads) is told to go on at once, and the server's own ``100 Continue`` is not passed on. Both sides are
kept alive, so the latency is per request, not per connection. Standard library only.
"""

from __future__ import annotations

import argparse
import base64
import collections
import dataclasses
import http
import itertools
import json
import os
import pickle
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["StoreProxy", "ProxyServer", "Requests", "s3_slow_down", "gcs_rate_limited", "ProxyFailed",
           "THREAD_PREFIX"]

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]
#: Every thread of a proxy is named ``store-proxy-PORT-...``.
THREAD_PREFIX = "store-proxy"
#: How many (method, path, status) triples ``recent`` keeps, and what ``counts()`` counts.
RECENT, COUNTERS = 10_000, ("requests", "failed", "dropped", "bytes_out")
#: The most bytes moved in one read or write of a body.
CHUNK = 64 * 1024
#: The longest start line or header line, and the most header lines in one message.
MAX_LINE, MAX_HEADERS = 64 * 1024, 200
#: How long ``close()`` waits for the proxy's threads in all; a connection to the server may take to open; the
#: proxy's process may take to start, and to answer a call.
JOIN_SECONDS, CONNECT_SECONDS, START_SECONDS, CALL_SECONDS = 5.0, 10.0, 30.0, 30.0
#: A body's framing besides a length in bytes: chunked transfer coding, or everything until the server closes.
CHUNKED, UNTIL_CLOSE = "chunked", "until-close"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

#: A function of (method, path with its query) that says whether a fault applies to a request.
Match = Callable[[str, str], bool]


def s3_slow_down() -> tuple[int, bytes, dict[str, str]]:
    """S3's throttling answer, as (status, body, headers) for :meth:`StoreProxy.fail_next`.

    >>> status, body, headers = s3_slow_down()
    >>> status, b"<Code>SlowDown</Code>" in body, headers["Content-Type"]
    (503, True, 'application/xml')
    """
    body = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b'<Message>Please reduce your request rate.</Message></Error>')
    return 503, body, {"Content-Type": "application/xml"}


def gcs_rate_limited(status: int = 429) -> tuple[int, bytes, dict[str, str]]:
    """GCS's throttling answer, as (status, body, headers) for :meth:`StoreProxy.fail_next`: 429 (a rate limit
    exceeded) or 503 (the backend asking for a retry), each with the JSON error GCS sends.

    >>> gcs_rate_limited(503)[0], json.loads(gcs_rate_limited()[1])["error"]["errors"][0]["reason"]
    (503, 'rateLimitExceeded')
    """
    if status not in (429, 503):
        raise ValueError(f"GCS throttles with 429 or 503, not {status}")
    reason, message = (("rateLimitExceeded", "The rate of requests exceeds the rate limit. Please reduce your "
                        "request rate.") if status == 429 else
                       ("backendError", "We encountered an internal error. Please try again."))
    error = {"code": status, "message": message, "errors": [{"message": message, "domain": "global",
                                                             "reason": reason}]}
    return status, json.dumps({"error": error}).encode(), {"Content-Type": "application/json; charset=UTF-8"}


@dataclasses.dataclass(frozen=True)
class Requests:
    """A ``match`` for :meth:`StoreProxy.fail_next` and :meth:`StoreProxy.drop_next`: the requests with ``method``
    (any: None) whose path, query included, contains a match of the regular expression ``path`` (any: None).

    >>> Requests("GET", r"[?&]alt=media")("GET", "/storage/v1/b/tfrecords/o/a.bin?alt=media")
    True
    >>> Requests("PUT")("GET", "/tfrecords/a.bin")
    False
    """
    method: str | None = None
    path: str | None = None

    def __call__(self, method: str, path: str) -> bool:
        return ((self.method is None or method == self.method)
                and (self.path is None or re.search(self.path, path) is not None))


class ProxyFailed(RuntimeError):
    """The proxy's process did not start, exited, or did not answer a call in time."""


class _Listening:
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


class StoreProxy(_Listening):
    """A reverse proxy on ``host:port`` (0: a free port) for the plain-HTTP server at ``upstream`` (``host:port`` or
    ``http://host:port``), in a process of its own (a :class:`ProxyServer` there) started at once and stopped by
    :meth:`close` or the end of a ``with`` block.

    Every request goes to the server unchanged and its answer comes back unchanged, its first byte ``latency_s``
    seconds (settable at any time) after the request's last, unless a fault set by :meth:`fail_next` or
    :meth:`drop_next` applies to it. ``requests`` counts the requests forwarded, ``failed`` those answered by a
    fault, ``dropped`` those reset, ``bytes_out`` the bytes sent back to clients (heads and bodies); ``recent``
    lists the last ``RECENT`` requests as (method, path with query, status; None where reset). Any thread may call
    any of these (one call at a time goes to the process).
    """

    def __init__(self, upstream: str, *, latency_s: float = 0.0, host: str = HOST, port: int = 0):
        parse_upstream(upstream)
        self.upstream, self._latency_s = upstream, _latency(latency_s)
        self._lock = threading.Lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
        argv = [sys.executable, "-m", "bench.store_proxy", "--upstream", upstream, "--host", host, "--port", str(port),
                "--latency", repr(self._latency_s)]
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
        self._call("latency", seconds=_latency(seconds))
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


def _latency(seconds: float) -> float:
    if not seconds >= 0:
        raise ValueError(f"latency_s must be 0 or more, not {seconds}")
    return float(seconds)


def _pickled(match: Match | None) -> str | None:
    if match is None:
        return None
    try:
        return base64.b64encode(pickle.dumps(match)).decode()
    except (pickle.PicklingError, AttributeError, TypeError) as e:
        raise TypeError(f"match {match!r} cannot go to the proxy's process ({e}): give a Requests(method, path), or "
                        f"a function defined at a module's top level") from None


# --- the proxy ---


class BadMessage(Exception):
    """What a peer sent is not an HTTP/1.x message (or it closed the connection inside one)."""


@dataclasses.dataclass
class Head:
    """A request's or response's start line and header lines, as received (without their line ends), so that they go
    on unchanged."""
    start: bytes
    lines: list[bytes]

    def values(self, name: str) -> list[str]:
        """The values of every header line called ``name`` (any case), in order."""
        key = name.lower().encode()
        return [value.strip().decode("latin-1") for field, _, value in (line.partition(b":") for line in self.lines)
                if field.strip().lower() == key]

    def tokens(self, name: str) -> set[str]:
        """The comma-separated tokens of the ``name`` headers, lower-cased (``Connection: Keep-Alive, TE``)."""
        return {token.strip().lower() for value in self.values(name) for token in value.split(",") if token.strip()}

    def to_bytes(self) -> bytes:
        return b"\r\n".join([self.start, *self.lines, b"", b""])

    @property
    def status(self) -> int:
        """A response's status code."""
        try:
            return int(self.start.split(None, 2)[1])
        except (IndexError, ValueError):
            raise BadMessage(f"not a status line: {self.start[:100]!r}") from None


def read_line(rfile) -> bytes | None:
    """The next line without its end; None when the connection closes first."""
    line = rfile.readline(MAX_LINE + 1)
    if not line:
        return None
    if not line.endswith(b"\n"):
        raise BadMessage("a line longer than the limit, or cut short by the connection closing")
    return line.rstrip(b"\r\n")


def read_head(rfile) -> Head | None:
    """The next message head; None when the connection closes before one starts."""
    start = read_line(rfile)
    while start == b"":              # empty lines before a request line are to be ignored (RFC 9112, 2.2)
        start = read_line(rfile)
    if start is None:
        return None
    lines = []
    while line := read_line(rfile):
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise BadMessage(f"more than {MAX_HEADERS} header lines")
    if line is None:
        raise BadMessage("the connection closed inside a message head")
    return Head(start, lines)


def request_line(head: Head) -> tuple[str, str, str]:
    """A request's method, target (path and query) and HTTP version."""
    parts = head.start.decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadMessage(f"not a request line: {head.start[:100]!r}")
    return parts[0], parts[1], parts[2]


def content_length(head: Head) -> int | None:
    values = head.values("content-length")
    if not values:
        return None
    if len(set(values)) > 1 or not values[0].isdigit():
        raise BadMessage(f"a bad Content-Length: {values}")
    return int(values[0])


def request_framing(head: Head) -> int | str:
    """How a request's body ends: ``CHUNKED``, or its length (0: no body)."""
    if "chunked" in head.tokens("transfer-encoding"):
        return CHUNKED
    return content_length(head) or 0


def response_framing(head: Head, method: str) -> int | str:
    """How a response's body ends: its length (0: no body), ``CHUNKED`` or ``UNTIL_CLOSE`` (RFC 9112, 6.3)."""
    if method == "HEAD" or head.status in (204, 304) or head.status < 200:
        return 0
    if "chunked" in head.tokens("transfer-encoding"):
        return CHUNKED
    length = content_length(head)
    return UNTIL_CLOSE if length is None else length


def keeps_alive(head: Head, version: str) -> bool:
    """Whether an HTTP/1.1 message leaves its connection open (HTTP/1.0 connections are closed after one answer)."""
    return version == "HTTP/1.1" and "close" not in head.tokens("connection")


def copy_exactly(rfile, send: Callable[[bytes], object], length: int) -> int:
    """Passes ``length`` bytes from ``rfile`` to ``send`` as they come; returns ``length``."""
    left = length
    while left:
        data = rfile.read1(min(CHUNK, left))
        if not data:
            raise BadMessage(f"the connection closed {left} bytes before the end of a body")
        send(data)
        left -= len(data)
    return length


def copy_chunked(rfile, send: Callable[[bytes], object]) -> int:
    """Passes a chunked body on as it is framed (sizes, extensions, trailers); returns the bytes passed."""
    passed = 0
    while True:
        line = read_line(rfile)
        if line is None:
            raise BadMessage("the connection closed inside a chunked body")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise BadMessage(f"not a chunk size: {line[:100]!r}") from None
        send(line + b"\r\n")
        passed += len(line) + 2
        if size == 0:
            return passed + copy_trailers(rfile, send)
        passed += copy_exactly(rfile, send, size + 2)       # the chunk and its CRLF


def copy_trailers(rfile, send: Callable[[bytes], object]) -> int:
    """Passes a chunked body's trailer lines and the empty line that ends it; returns the bytes passed."""
    passed = 0
    while True:
        line = read_line(rfile)
        if line is None:
            raise BadMessage("the connection closed inside a chunked body's trailers")
        send(line + b"\r\n")
        passed += len(line) + 2
        if not line:
            return passed


def copy_until_close(rfile, send: Callable[[bytes], object]) -> int:
    passed = 0
    while data := rfile.read1(CHUNK):
        send(data)
        passed += len(data)
    return passed


def copy_body(rfile, send: Callable[[bytes], object], framing: int | str) -> int:
    """Passes one body framed as ``framing`` says from ``rfile`` to ``send``; returns the bytes passed."""
    if framing == CHUNKED:
        return copy_chunked(rfile, send)
    if framing == UNTIL_CLOSE:
        return copy_until_close(rfile, send)
    return copy_exactly(rfile, send, framing)


def _discard(data: bytes):
    pass


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


@dataclasses.dataclass
class Fault:
    """What the next ``remaining`` requests that ``match`` get instead of the server's answer: ``status`` with
    ``body`` and ``headers``, or (status None) their connection reset."""
    remaining: int
    match: Match | None = None
    status: int | None = None
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    def applies(self, method: str, path: str) -> bool:
        return self.remaining > 0 and (self.match is None or bool(self.match(method, path)))

    def answer(self, method: str, keep_alive: bool) -> bytes:
        """The whole response: status line, headers (with Content-Length, and Connection: close unless
        ``keep_alive``) and the body (none to a HEAD)."""
        try:
            reason = http.HTTPStatus(self.status).phrase
        except ValueError:
            reason = "Injected"
        lines = [f"HTTP/1.1 {self.status} {reason}", *(f"{name}: {value}" for name, value in self.headers),
                 f"Content-Length: {len(self.body)}", *([] if keep_alive else ["Connection: close"])]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if method == "HEAD" else head + self.body


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


class ProxyServer(_Listening):
    """The proxy itself, serving in the process that makes it: a thread accepting connections and one per client
    connection, started at once and stopped by :meth:`close` or the end of a ``with`` block. The same interface as
    :class:`StoreProxy` (which runs one in a process of its own), ``match`` any callable.

    Only for clients that never hold the GIL while they wait for it (``http.client``; not pyarrow, see the module's
    description).
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
        self._latency_s = _latency(seconds)

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
            copy_body(self.rfile, _discard, framing)
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


# --- the proxy's process: python -m bench.store_proxy ---


def _unpickled(match: str | None) -> Match | None:
    return None if match is None else pickle.loads(base64.b64decode(match))


#: What the proxy's process does with each command that comes on its stdin (one JSON object a line): the value it
#: answers with on its stdout.
COMMANDS: dict[str, Callable[..., object]] = {
    "latency": lambda proxy, seconds: setattr(proxy, "latency_s", seconds),
    "fail": lambda proxy, count, status, body, headers, match: proxy.fail_next(
        count, status, base64.b64decode(body), headers, _unpickled(match)),
    "drop": lambda proxy, count, match: proxy.drop_next(count, _unpickled(match)),
    "clear": lambda proxy: proxy.clear_faults(),
    "counts": lambda proxy: proxy.counts(),
    "recent": lambda proxy: proxy.recent,
}


def run_command(proxy: ProxyServer, line: bytes) -> dict | None:
    """``{"value": ...}``, or ``{"error": ...}`` where the command failed; None for ``close``."""
    try:
        args = json.loads(line)
        if args.get("command") == "close":
            return None
        return {"value": COMMANDS[args.pop("command")](proxy, **args)}
    except Exception as e:          # a bad command or argument is the caller's error, not the proxy's end
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    """Serves until stdin ends or says ``{"command": "close"}`` (the :class:`StoreProxy` that started it closes, or
    exits), answering each other command, a JSON line on stdin, with one on stdout (``{"value": ...}`` or
    ``{"error": ...}``); the first line out is the address it listens on."""
    p = argparse.ArgumentParser(prog="python -m bench.store_proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--upstream", required=True, help="the server, host:port")
    p.add_argument("--host", default=HOST)
    p.add_argument("--port", type=int, default=0, help="0: a free port")
    p.add_argument("--latency", type=float, default=0.0, help="seconds before each answer's first byte")
    args = p.parse_args(argv)
    out, sys.stdout = sys.stdout.buffer, sys.stderr         # stdout carries the answers and nothing else
    with ProxyServer(args.upstream, latency_s=args.latency, host=args.host, port=args.port) as proxy:
        _answer(out, {"host": proxy.host, "port": proxy.port})
        for line in sys.stdin.buffer:
            if (reply := run_command(proxy, line)) is None:
                break
            _answer(out, reply)
    return 0


def _answer(out, reply: dict):
    out.write(json.dumps(reply).encode() + b"\n")
    out.flush()


if __name__ == "__main__":
    sys.exit(main())
