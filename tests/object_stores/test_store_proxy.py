"""``bench.peers.store_proxy`` between pyarrow and the loopback stores: objects written, read whole and by range and listed
through it; its latency per request, with connections served side by side; pyarrow's retries past S3's SlowDown,
GCS's 429 and 503 and a reset connection, and no retry where none is allowed; a clean stop. Against a plain server
of the test's own: bodies (chunked with trailers, ``Expect: 100-continue``, HEAD) and the Host header pass through
unchanged over kept-alive connections, injected answers leave the connection usable, and a server that is down
gives 502."""

import hashlib
import http.client
import http.server
import json
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pyarrow.fs as pafs
import pytest

from bench.peers.store_proxy import THREAD_PREFIX, ProxyServer, Requests, StoreProxy, gcs_rate_limited, s3_slow_down

from bench.peers.object_stores import GcsServer

DATA = bytes(range(256)) * 41 + b"end"          # 10499 bytes; a range read at the wrong offset shows
LATENCY = 0.05


@pytest.fixture(params=["s3_server", "gcs_server"])
def store(request):
    return request.getfixturevalue(request.param)


def through(store, proxy, **options):
    """A pyarrow filesystem for ``store`` that reaches it through ``proxy``."""
    if isinstance(store, GcsServer):
        options.setdefault("retry_time_limit", timedelta(seconds=15))
        return pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=proxy.endpoint, **options)
    return pafs.S3FileSystem(endpoint_override=proxy.endpoint, scheme="http", access_key=store.access_key,
                             secret_key=store.secret_key, region=store.region, **options)


def _path(store, request, name: str) -> str:
    """A key of this test's own, so that tests sharing a session's bucket do not see each other's objects."""
    return f"{store.bucket}/proxy/{request.node.name}/{name}"


def _write(fs, path: str, data: bytes = DATA):
    with fs.open_output_stream(path) as f:
        f.write(data)


def test_objects_write_read_back_and_list_through_the_proxy(store, request):
    big = os.urandom(3 << 20)                        # 3 MB: a resumable upload for GCS, a multipart one for S3
    small, large = _path(store, request, "small.bin"), _path(store, request, "large.bin")
    with StoreProxy(store.endpoint) as proxy:
        fs = through(store, proxy)
        _write(fs, small)
        _write(fs, large, big)
        with fs.open_input_file(small) as f:
            assert f.read_at(100, 5000) == DATA[5000:5100]
            assert f.read_at(100, len(DATA) - 3) == b"end"
            assert f.read() == DATA
        with fs.open_input_file(large) as f:
            assert f.read_at(1000, 2_000_000) == big[2_000_000:2_001_000]
            assert f.read() == big
        listed = {i.path: i.size for i in fs.get_file_info(pafs.FileSelector(small.rpartition("/")[0]))}
        assert listed == {small: len(DATA), large: len(big)}
        recent = proxy.recent
        assert proxy.requests == len(recent) >= 8 and proxy.failed == proxy.dropped == 0
        assert proxy.bytes_out > len(big)
    assert all(status < 400 for _, _, status in recent), recent
    assert {"POST", "PUT", "GET"} <= {method for method, _, _ in recent}
    assert 206 in {status for _, _, status in recent}                       # the range reads
    with store.filesystem().open_input_file(large) as f:                    # it is in the server
        assert f.read() == big


@pytest.mark.serial
def test_each_request_waits_the_latency_and_connections_are_served_side_by_side(store, request):
    path, reads, readers = _path(store, request, "a.bin"), 10, 8
    _write(store.filesystem(), path)

    def read(f):
        for k in range(reads):
            assert f.read_at(100, 1000 * k) == DATA[1000 * k:1000 * k + 100]

    with StoreProxy(store.endpoint, latency_s=LATENCY) as proxy:
        fs = through(store, proxy)
        files = [fs.open_input_file(path) for _ in range(readers)]
        for f in files:                              # each file's first read sets it up (GCS: a download stream)
            assert f.read_at(3, 0) == DATA[:3]
        started = time.monotonic()
        read(files[0])
        one = time.monotonic() - started
        before = proxy.requests
        started = time.monotonic()
        with ThreadPoolExecutor(readers) as pool:
            list(pool.map(read, files))
        side_by_side = time.monotonic() - started
        assert proxy.requests - before >= readers * reads
    assert one >= reads * LATENCY
    assert side_by_side >= reads * LATENCY
    assert side_by_side < readers / 2 * one, (one, side_by_side)            # one after the other: readers * one


@pytest.mark.serial
def test_latency_changes_while_the_proxy_runs(s3_server, request):
    path = _path(s3_server, request, "a.bin")
    _write(s3_server.filesystem(), path)
    with StoreProxy(s3_server.endpoint, latency_s=0.3) as proxy:
        with through(s3_server, proxy).open_input_file(path) as f:           # the HEAD waits 0.3 s
            proxy.latency_s = 0
            started = time.monotonic()
            assert f.read_at(10, 0) == DATA[:10]
            assert time.monotonic() - started < 0.3 and proxy.latency_s == 0


def test_s3_retries_get_past_slow_down_and_a_reset_but_not_without_retries(s3_server, request):
    path = _path(s3_server, request, "a.bin")
    _write(s3_server.filesystem(), path)
    with StoreProxy(s3_server.endpoint) as proxy:
        proxy.fail_next(2, *s3_slow_down())
        patient = through(s3_server, proxy, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=4))
        with patient.open_input_file(path) as f:
            assert f.read() == DATA
        assert proxy.failed == 2 and [status for _, _, status in proxy.recent[:3]] == [503, 503, 200]

        proxy.drop_next(1)
        with patient.open_input_file(path) as f:
            assert f.read() == DATA
        assert proxy.dropped == 1 and (None in [status for _, _, status in proxy.recent])

        impatient = through(s3_server, proxy, retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        with impatient.open_input_file(path) as f:
            proxy.fail_next(1, *s3_slow_down(), match=Requests("GET"))
            with pytest.raises(OSError):
                f.read()
        proxy.fail_next(1, *s3_slow_down(), match=Requests("GET", "list-type=2"))
        with pytest.raises(OSError, match="SLOW_DOWN .* Please reduce your request rate"):    # the XML body read
            impatient.get_file_info(pafs.FileSelector(path.rpartition("/")[0]))
        assert proxy.failed == 4 and proxy.clear_faults() == 0


def test_gcs_retries_get_past_rate_limits_and_a_reset_but_not_after_its_time_limit(gcs_server, request):
    path = _path(gcs_server, request, "a.bin")
    _write(gcs_server.filesystem(), path)
    with StoreProxy(gcs_server.endpoint) as proxy:
        proxy.fail_next(1, *gcs_rate_limited(429))
        proxy.fail_next(1, *gcs_rate_limited(503))
        with through(gcs_server, proxy).open_input_file(path) as f:
            assert f.read() == DATA
        assert proxy.failed == 2 and [status for _, _, status in proxy.recent[:3]] == [429, 503, 200]

        proxy.drop_next(1, match=Requests("GET", "alt=media"))
        with through(gcs_server, proxy).open_input_file(path) as f:
            assert f.read() == DATA
        assert proxy.dropped == 1

        proxy.fail_next(1000, *gcs_rate_limited(503))
        with pytest.raises(OSError):
            through(gcs_server, proxy, retry_time_limit=timedelta(seconds=0.5)).open_input_file(path).read()
        assert 3 <= proxy.failed < 1002 and 0 < proxy.clear_faults() < 1000


def test_the_proxy_stops_cleanly(s3_server):
    errors = []

    def ask(fs):
        try:
            fs.get_file_info(s3_server.bucket)
        except OSError as e:
            errors.append(e)

    with StoreProxy(s3_server.endpoint, latency_s=30) as proxy:
        fs = through(s3_server, proxy, request_timeout=60,
                     retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        waiting = threading.Thread(target=ask, args=(fs,))
        waiting.start()                          # a request that waits out its 30 s latency when the proxy stops
        time.sleep(0.5)
        started = time.monotonic()
    assert time.monotonic() - started < 10
    waiting.join(30)
    assert not waiting.is_alive() and len(errors) == 1 and not proxy.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=5).close()
    assert not _threads(THREAD_PREFIX)


# --- against a plain server of the test's own ---


class Echo(http.server.BaseHTTPRequestHandler):
    """Answers each request with what it received, as JSON (with ``chunked`` in the path: in two chunks); HEAD with
    the same head and no body. ``server.seen`` lists (method, path, client port) as they come."""
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        body = self.body()
        self.server.seen.append((self.command, self.path, self.client_address[1]))
        reply = json.dumps({"method": self.command, "path": self.path, "host": self.headers["Host"],
                            "transfer-encoding": self.headers["Transfer-Encoding"], "length": len(body),
                            "sha256": hashlib.sha256(body).hexdigest(), "trailers": self.trailers}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        chunked = "chunked" in self.path
        self.send_header(*(("Transfer-Encoding", "chunked") if chunked else ("Content-Length", str(len(reply)))))
        self.end_headers()
        if self.command != "HEAD":
            halves = (reply[:10], reply[10:])
            self.wfile.write(b"".join(b"%x\r\n%s\r\n" % (len(h), h) for h in (*halves, b"")) if chunked else reply)

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET

    def body(self) -> bytes:
        self.trailers = []
        if "chunked" not in (self.headers["Transfer-Encoding"] or ""):
            return self.rfile.read(int(self.headers["Content-Length"] or 0))
        parts = []
        while size := int(self.rfile.readline().split(b";")[0], 16):
            parts.append(self.rfile.read(size))
            self.rfile.readline()
        while (line := self.rfile.readline().rstrip(b"\r\n")):
            self.trailers.append(line.decode())
        return b"".join(parts)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads, server.seen = False, []           # handler threads joined by server_close()
    thread = threading.Thread(target=server.serve_forever, name="echo-server")
    thread.start()
    try:
        yield server
    finally:                 # the proxy has gone by now (each test's with-block), so each handler has seen its EOF
        server.shutdown()
        server.server_close()
        thread.join(10)


def _ask(conn, method, path, body=None, headers=None, **options):
    conn.request(method, path, body=body, headers=headers or {}, **options)
    response = conn.getresponse()
    data = response.read()
    return response, (json.loads(data) if data and response.status == 200 else data)


def test_bodies_and_the_host_header_pass_through_unchanged_over_kept_alive_connections(echo):
    body = os.urandom(300_000)
    with StoreProxy(f"127.0.0.1:{echo.server_port}") as proxy:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)
        try:
            response, seen = _ask(conn, "PUT", "/a?x=1", iter([body[:1000], body[1000:]]), encode_chunked=True,
                                  headers={"Expect": "100-continue", "Transfer-Encoding": "chunked"})
            sock = conn.sock
            assert seen["host"] == proxy.endpoint and seen["path"] == "/a?x=1"        # SigV4 signs this Host
            assert seen["transfer-encoding"] == "chunked" and seen["sha256"] == hashlib.sha256(body).hexdigest()
            response, seen = _ask(conn, "GET", "/chunked", headers={"Range": "bytes=0-9"})
            assert response.getheader("Transfer-Encoding") == "chunked" and seen["method"] == "GET"
            response, data = _ask(conn, "HEAD", "/h")
            assert response.status == 200 and data == b"" and int(response.getheader("Content-Length")) > 0
            response, seen = _ask(conn, "POST", "/p", b"x" * 5000)
            assert seen["length"] == 5000 and seen["transfer-encoding"] is None
            response, seen = _ask(conn, "DELETE", "/d")
            assert seen["method"] == "DELETE"
            assert conn.sock is sock                                     # one connection to the proxy...
        finally:
            conn.close()
        assert len({port for _, _, port in echo.seen}) == 1 and len(echo.seen) == 5     # ... and one on to the server
        assert [status for _, _, status in proxy.recent] == [200] * 5 and proxy.requests == 5


def test_a_chunked_body_keeps_its_extensions_and_trailers(echo):
    with StoreProxy(f"127.0.0.1:{echo.server_port}") as proxy:
        with socket.create_connection((proxy.host, proxy.port), timeout=10) as sock:
            sock.sendall(b"POST /t HTTP/1.1\r\nHost: somewhere\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"5;name=value\r\nhello\r\n6\r\n world\r\n0\r\nx-amz-checksum-crc32: abc=\r\n\r\n")
            response = http.client.HTTPResponse(sock)
            response.begin()
            seen = json.loads(response.read())
    assert seen["length"] == 11 and seen["sha256"] == hashlib.sha256(b"hello world").hexdigest()
    assert seen["trailers"] == ["x-amz-checksum-crc32: abc="] and seen["host"] == "somewhere"


def test_injected_answers_leave_the_connection_usable_and_never_reach_the_server(echo):
    with StoreProxy(f"127.0.0.1:{echo.server_port}") as proxy:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)
        try:
            proxy.fail_next(1, *s3_slow_down(), match=Requests("PUT"))
            proxy.fail_next(1, 503, "slow", {"Retry-After": "1"}, match=Requests("HEAD"))
            assert _ask(conn, "GET", "/first")[0].status == 200
            response, data = _ask(conn, "PUT", "/object", os.urandom(100_000))
            assert response.status == 503 and b"<Code>SlowDown</Code>" in data
            assert response.getheader("Content-Type") == "application/xml"
            response, data = _ask(conn, "HEAD", "/object")
            assert response.status == 503 and data == b"" and response.getheader("Retry-After") == "1"
            sock = conn.sock
            assert _ask(conn, "GET", "/after")[1]["path"] == "/after" and conn.sock is sock
            proxy.drop_next(1)
            with pytest.raises(ConnectionError):
                _ask(conn, "GET", "/dropped")
        finally:
            conn.close()
        assert [path for _, path, _ in echo.seen] == ["/first", "/after"]
        assert proxy.recent == [("GET", "/first", 200), ("PUT", "/object", 503), ("HEAD", "/object", 503),
                                ("GET", "/after", 200), ("GET", "/dropped", None)]
        assert (proxy.requests, proxy.failed, proxy.dropped) == (2, 2, 1)


def test_a_match_that_cannot_reach_the_proxy_process_is_refused(echo):
    with StoreProxy(f"127.0.0.1:{echo.server_port}") as proxy:
        with pytest.raises(TypeError, match="Requests"):
            proxy.fail_next(1, match=lambda method, path: True)
        with pytest.raises(ValueError, match="count"):
            proxy.drop_next(0)


def test_a_server_that_is_down_gives_502():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]                   # nothing listens there once the socket is closed
    with StoreProxy(f"127.0.0.1:{port}") as proxy:
        conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=10)
        try:
            assert _ask(conn, "GET", "/x")[0].status == 502
        finally:
            conn.close()
        assert proxy.recent == [("GET", "/x", 502)]


def test_the_proxy_in_process_stops_its_threads_and_closes_its_sockets(echo):
    proxy = ProxyServer(f"127.0.0.1:{echo.server_port}", latency_s=30)
    conns = [http.client.HTTPConnection(proxy.host, proxy.port, timeout=60) for _ in range(3)]
    try:
        for conn in conns:
            conn.request("GET", "/waits")                            # each waits out its 30 s latency
        deadline = time.monotonic() + 10
        while len(_threads(f"{THREAD_PREFIX}-{proxy.port}-")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_threads(f"{THREAD_PREFIX}-{proxy.port}-")) == 4             # accepting, and one per connection
        started = time.monotonic()
        proxy.close()
        assert time.monotonic() - started < 5
        for conn in conns:
            with pytest.raises(ConnectionError):
                conn.getresponse()
    finally:
        proxy.close()
        for conn in conns:
            conn.close()
    assert not _threads(THREAD_PREFIX)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((proxy.host, proxy.port), timeout=5).close()


def _threads(prefix: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(prefix)]
