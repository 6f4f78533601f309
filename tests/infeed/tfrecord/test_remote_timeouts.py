"""One time budget for each open and read of a remote file, all its attempts and the store client's retries within
them together (``reader.REMOTE_TIMEOUT_S``, or ``timeout_s`` in the URI's query or a registration). The red team's
case: a server that accepts connections and never answers held ``read_records`` 398 s (infeed's 4 attempts, each
on top of the AWS SDK's own ~30 requests of 3 s). Here such a server is a socket on 127.0.0.1 in a thread, reached as
an ``s3://`` endpoint; it either answers nothing, or answers the look-ups (HEAD) and never the reads (GET)."""

import logging
import socket
import threading
import time

import pyarrow.fs as pafs
import pytest

import infeed
from infeed.errors import FileSystemConfigError
from infeed.tfrecord import filesystems, reader
from infeed.tfrecord.filesystems import filesystem_for, register_filesystem, remote_timeout_s, s3_timeouts

BUDGET_S = 3.0
HEAD_ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\nContent-Type: application/octet-stream\r\n"
               b"Last-Modified: Wed, 01 Jan 2025 00:00:00 GMT\r\nETag: \"0123\"\r\n\r\n")


class SilentServer:
    """Accepts every connection on 127.0.0.1; answers HEAD requests when ``answer_heads``, else nothing; never answers
    anything else. ``held``: the requests (or connections, when it answers nothing) it left unanswered. Closed, every
    connection with it, on leaving the ``with``."""

    def __init__(self, answer_heads: bool):
        self.answer_heads = answer_heads
        self.held = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._connections: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]

    def __enter__(self):
        self._threads[0].start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        with self._lock:
            for c in self._connections:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                c.close()
        for t in list(self._threads):
            t.join(timeout=5)
        self._listener.close()

    def _accept(self):
        while not self._stop.is_set():
            try:
                c, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._stop.is_set():
                    c.close()
                    return
                self._connections.append(c)
                if not self.answer_heads:
                    self.held += 1
                    continue
                t = threading.Thread(target=self._serve, args=(c,), daemon=True)
                self._threads.append(t)
            t.start()

    def _serve(self, c: socket.socket):
        c.settimeout(0.1)
        pending = b""
        while not self._stop.is_set():
            try:
                data = c.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            pending += data
            while b"\r\n\r\n" in pending:
                request, pending = pending.split(b"\r\n\r\n", 1)
                if request.startswith(b"HEAD "):
                    c.sendall(HEAD_ANSWER)
                else:
                    with self._lock:
                        self.held += 1                 # and never a byte more on this connection
                    self._stop.wait()
                    return


@pytest.fixture(params=[False, True], ids=["nothing-answered", "reads-unanswered"])
def silent_s3(request, monkeypatch):
    """A silent server, with the AWS environment (dummy keys) by which s3:// URIs reach it."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "dummy-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "dummy-secret")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with SilentServer(answer_heads=request.param) as server:
        yield server


def uri_of(server, name: str, timeout: bool) -> str:
    query = f"?endpoint_override={server.endpoint}&scheme=http" + (f"&timeout_s={BUDGET_S:g}" if timeout else "")
    return f"s3://bucket/{name}.tfrecord{query}"


def assert_bounded(server, error, uri: str, took: float):
    assert took < 3 * BUDGET_S, f"{took:.1f} s for a budget of {BUDGET_S} s"
    assert error.filename == uri or uri in str(error), error
    assert "gave up after" in str(error) and "s, the time allowed being 3 s (timeout_s)" in str(error), error
    assert 0 < server.held <= filesystems.S3_SDK_ATTEMPTS * reader.REMOTE_ATTEMPTS    # the SDK's retries bounded


@pytest.mark.parametrize("budget_in", ["query", "constant"])
def test_read_records_from_a_silent_s3_server_gives_up_within_the_budget_naming_the_uri(silent_s3, budget_in,
                                                                                      monkeypatch):
    if budget_in == "constant":
        monkeypatch.setattr(filesystems, "REMOTE_TIMEOUT_S", BUDGET_S)
    uri = uri_of(silent_s3, "streamed", timeout=budget_in == "query")
    began = time.monotonic()
    with pytest.raises(OSError) as failed:
        list(infeed.read_records(uri))
    assert_bounded(silent_s3, failed.value, uri, time.monotonic() - began)


def test_a_random_access_read_from_a_silent_s3_server_gives_up_within_the_budget_naming_the_uri(silent_s3):
    uri = uri_of(silent_s3, "indexed", timeout=True)
    began = time.monotonic()
    with pytest.raises(OSError) as failed:
        f = reader.open_random_access(uri)             # nothing answered: its look-up fails here
        try:
            f.read_at(0, 100)
        finally:
            f.close()
    assert_bounded(silent_s3, failed.value, uri, time.monotonic() - began)


def test_the_default_budget_keeps_a_silent_server_within_60_s_by_the_settings_made():
    """Not waited for: the S3 client infeed builds has connect and request timeouts such that every attempt at a
    request, infeed's REMOTE_ATTEMPTS and the SDK's S3_SDK_ATTEMPTS in each (with its back-off, up to 1 s, 2 s ...),
    and infeed's waits, fit in REMOTE_TIMEOUT_S, which is 60 s."""
    assert reader.REMOTE_TIMEOUT_S <= 60
    assert remote_timeout_s("s3://bucket/x.tfrecord") == remote_timeout_s("gs://bucket/x") == reader.REMOTE_TIMEOUT_S
    fs, _ = filesystem_for("s3://bucket/x.tfrecord?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1")
    options = fs.__reduce__()[1][0]
    connect, request = options["connect_timeout"], options["request_timeout"]
    assert (connect, request) == s3_timeouts(reader.REMOTE_TIMEOUT_S) and connect >= 1 and request >= 1
    k, attempts = filesystems.S3_SDK_ATTEMPTS, reader.REMOTE_ATTEMPTS
    back_off = sum(2.0 ** i for i in range(k - 1))
    waits = sum(reader.REMOTE_RETRY_WAIT_S * 2 ** i for i in range(attempts - 1))
    assert attempts * (k * (connect + request) + back_off) + waits <= 60.0 + 1e-9
    assert filesystems.gcs_retry_limit_s(reader.REMOTE_TIMEOUT_S) * attempts + waits <= 60.0


def test_a_registered_s3_kind_takes_its_timeouts_from_the_budget_and_its_own_retries(clean_registry):
    register_filesystem("s3://budget-bucket", "s3", endpoint_override="127.0.0.1:9", scheme="http",
                        region="us-east-1", access_key="k", secret_key="s", retry_max_attempts=5, timeout_s=30)
    options = filesystem_for("s3://budget-bucket/x")[0].__reduce__()[1][0]
    assert (options["connect_timeout"], options["request_timeout"]) == s3_timeouts(30, 5)
    assert remote_timeout_s("s3://budget-bucket/x?timeout_s=7") == 30      # the registration's, as its filesystem
    register_filesystem("s3://own-timeouts", "s3", endpoint_override="127.0.0.1:9", request_timeout=9.0)
    assert filesystem_for("s3://own-timeouts/x")[0].__reduce__()[1][0]["request_timeout"] == 9.0
    with pytest.raises(FileSystemConfigError, match="s3://bad-budget: timeout_s='soon'"):
        register_filesystem("s3://bad-budget", "s3", timeout_s="soon")


def _failing_slowly(calls):
    def call():
        calls.append(time.monotonic())
        time.sleep(0.3)
        raise OSError("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached")
    return call


def test_a_factorys_filesystem_is_its_own_but_no_attempt_begins_once_the_budget_is_spent(clean_registry,
                                                                                       monkeypatch, caplog):
    register_filesystem("s3://factory-bucket", factory="pyarrow.fs:LocalFileSystem", timeout_s=0.5)   # not passed on
    monkeypatch.setattr(reader, "REMOTE_RETRY_WAIT_S", 0.01)
    calls = []
    with caplog.at_level(logging.WARNING, logger="infeed"), pytest.raises(OSError) as failed:
        reader._retrying(_failing_slowly(calls), "s3://factory-bucket/x", "read at byte 0")
    assert len(calls) == 2 < reader.REMOTE_ATTEMPTS                   # 0.3 s, 0.6 s: spent
    assert failed.value.filename == "s3://factory-bucket/x" and failed.value.errno is not None
    assert "(read at byte 0; gave up after 2 attempts in 0.6 s, the time allowed being 0.5 s" in str(failed.value)
    assert "curlCode: 28" in str(failed.value)
    assert "attempt 2 of 4" in caplog.text                             # a warning for each retry, as ever


def test_a_timeout_in_the_query_is_infeeds_never_pyarrows_and_must_be_a_number():
    fs, inner = filesystem_for("s3://bucket/k.tfrecord?endpoint_override=127.0.0.1:9&timeout_s=5&scheme=http")
    assert inner == "bucket/k.tfrecord" and isinstance(fs, pafs.S3FileSystem)
    assert fs.__reduce__()[1][0]["scheme"] == "http"                 # the options either side of it kept
    assert remote_timeout_s("s3://bucket/k.tfrecord?endpoint_override=127.0.0.1:9&timeout_s=5&scheme=http") == 5
    for bad in ("0", "-1", "nan", "inf", "soon", ""):
        with pytest.raises(FileSystemConfigError, match="timeout_s=.*a number of seconds above 0"):
            filesystem_for(f"s3://bucket/k?endpoint_override=127.0.0.1:9&timeout_s={bad}")
    with pytest.raises(FileSystemConfigError, match="a number of seconds above 0"):
        filesystem_for("gs://anonymous@bucket/k?timeout_s=never")
