"""HTTP/1.x messages as the proxy passes them on: a head as received (:class:`Head`), and a body copied as it is
framed (``Content-Length``, chunked with its extensions and trailers, or until the connection closes)."""

from __future__ import annotations

import dataclasses
from typing import Callable

__all__ = ["BadMessage", "Head", "read_head", "request_line", "request_framing", "response_framing", "keeps_alive",
           "copy_body", "discard", "CHUNKED", "UNTIL_CLOSE", "CONTINUE"]

#: The most bytes moved in one read or write of a body.
CHUNK = 64 * 1024
#: The longest start line or header line, and the most header lines in one message.
MAX_LINE, MAX_HEADERS = 64 * 1024, 200
#: A body's framing besides a length in bytes: chunked transfer coding, or everything until the server closes.
CHUNKED, UNTIL_CLOSE = "chunked", "until-close"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


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


def discard(data: bytes):
    """A ``send`` that throws a body away."""
