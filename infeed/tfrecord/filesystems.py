"""Which ``pyarrow.fs`` filesystem opens a URI, by the conventions the users' other tools already follow.

In order:

1. **A filesystem registered** for the URI's bucket or scheme (:func:`register_filesystem`: the longest
   registered prefix of the URI wins), for what a URI cannot carry: credentials, endpoints, retry limits,
   a filesystem of your own. It is registered as what builds it (a kind and its keyword arguments, or a
   ``"module:function"`` factory), never as an object: the registry goes to the daemon's worker processes as
   JSON on their standard input, as the :class:`~infeed.Dataset` does, and each builds its own.
2. **``gs://`` and ``gcs://``**: the URI's query (``scheme``, ``endpoint_override``, ``retry_limit_seconds``,
   as pyarrow reads them, and ``anonymous``, ``project_id``, ``default_bucket_location``; or pyarrow's
   ``gs://anonymous@bucket/...``), and
   ``STORAGE_EMULATOR_HOST`` (``host:port`` or ``http://host:port``), which Google's own clients honour:
   where it is set and the query names no endpoint, the emulator is used, anonymously.
   Otherwise Google's default credentials, where there are some to find (``GOOGLE_APPLICATION_CREDENTIALS``,
   gcloud's application default credentials, a Compute Engine machine's metadata server); where there are
   none, :class:`~infeed.errors.FileSystemConfigError` at once, naming what was looked for, instead of the
   metadata server's lookup, which off Google Cloud waits 30 s and more before it fails.
3. **Anything else** as ``pyarrow.fs.FileSystem.from_uri`` reads it: ``s3://`` with the AWS environment
   (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID`` ...: the AWS SDK's own) and its query
   (``?endpoint_override=host:port&scheme=http&region=...``), ``hdfs://``, ``file://``.

Each open and read of a remote file has one time budget, every attempt included
(:func:`remote_timeout_s`: ``REMOTE_TIMEOUT_S``, 60 s, unless a URI's query or a
registration says ``timeout_s``). The S3 and GCS filesystems built here get their client's own timeouts and retries
from it (:func:`s3_timeouts`, :func:`gcs_retry_limit_s`), so that the store's client, retrying beneath infeed's
attempts, does not multiply them; a filesystem a factory makes is its own, and only infeed's attempts stop at the
budget.

>>> register_filesystem("s3://example-bucket", "s3", endpoint_override="127.0.0.1:9000", scheme="http",
...                     region="us-east-1", access_key="key", secret_key="secret", retry_max_attempts=3)
>>> fs, inner = filesystem_for("s3://example-bucket/train/part-0.tfrecord")
>>> type(fs).__name__, inner
('S3FileSystem', 'example-bucket/train/part-0.tfrecord')
>>> unregister_filesystem("s3://example-bucket")
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import threading
import urllib.parse
from dataclasses import dataclass, field

from infeed.errors import FileSystemConfigError
from infeed.tfrecord.names import split_query

__all__ = ["filesystem_for", "google_credentials_source", "register_filesystem", "registered_filesystems",
           "gcs_retry_limit_s", "remote_timeout_s", "restore_registered_filesystems", "s3_timeouts",
           "unregister_filesystem"]

#: Attempts at each open and read of a remote file (URI), the first included, before its OSError
#: is raised; and the wait before the second attempt, doubled before each further one. The waits (1, 2 and 4 s)
#: outlast a store restarting (SeaweedFS came back in 0.8-5.3 s): with 0.25 s doubling, a read in flight when
#: the store went away gave up 3.7 s later, before the store was back.
REMOTE_ATTEMPTS = 4
REMOTE_RETRY_WAIT_S = 1.0
#: The time one open or read of a remote file may take, all its attempts (and the store client's own retries within
#: them) together: no attempt begins once it is spent. A URI's query or a registration may say another
#: (``timeout_s``: :func:`remote_timeout_s`); the S3 and GCS clients infeed builds take
#: their timeouts and retries from it when they are made (:func:`s3_timeouts`).
REMOTE_TIMEOUT_S = 60.0

#: The GCS options a gs:// URI's query may give (pyarrow's three, the ones it cannot say, and infeed's budget).
GCS_QUERY_OPTIONS = ("scheme", "endpoint_override", "retry_limit_seconds", "anonymous", "project_id",
                     "default_bucket_location", "timeout_s")

#: The option, in any remote URI's query or a registration, for the time one open or read may take, all its attempts
#: together (``REMOTE_TIMEOUT_S`` where none says).
TIMEOUT_OPTION = "timeout_s"

_TRUE, _FALSE = ("1", "true", "yes"), ("0", "false", "no")

#: How long pyarrow's GCS client retries a failing request (throttling, a server away) when the URI does not say
#: (``retry_limit_seconds``): its own default is minutes, during which a read gives no sign; infeed's own
#: attempts (``REMOTE_ATTEMPTS``) come on top.
GCS_RETRY_LIMIT_S = 15

#: The AWS SDK's attempts at each request (its standard retry strategy, pyarrow's default) within each of infeed's, in
#: the S3 filesystems infeed builds; a registration's ``retry_max_attempts`` replaces it.
S3_SDK_ATTEMPTS = 3


def _timeout(where: str, value) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise FileSystemConfigError(where, f"{TIMEOUT_OPTION}={value!r}: a number of seconds above 0")
    return seconds


def _attempt_share_s(timeout_s: float) -> float:
    """The budget's share of one of infeed's attempts: ``timeout_s`` less infeed's waits between its
    REMOTE_ATTEMPTS attempts, divided among them."""
    attempts = max(1, REMOTE_ATTEMPTS)
    waits = REMOTE_RETRY_WAIT_S * (2 ** (attempts - 1) - 1)
    return max(timeout_s - waits, 0.0) / attempts


def s3_timeouts(timeout_s: float, sdk_attempts: int | None = None) -> tuple[float, float]:
    """``(connect_timeout, request_timeout)`` in seconds for ``pyarrow.fs.S3FileSystem``, such that infeed's
    REMOTE_ATTEMPTS attempts at a request to a server that never answers, each made of ``sdk_attempts`` of the AWS
    SDK's (its standard strategy's back-off between them, up to 1, 2, 4 ... s, included) and infeed's waits
    between them, fit in ``timeout_s``: each SDK request has a third of its share to connect and two thirds to wait
    for a byte (the SDK's request timeout: on Linux, curl's "less than 1 byte/s for that many whole seconds"). Each
    at least 1 s: a smaller budget is then kept by infeed's attempts alone, which stop once it is spent.

    >>> [round(t, 2) for t in s3_timeouts(60)]      # with REMOTE_ATTEMPTS 4, 1 s apart and doubling
    [1.14, 2.28]
    """
    sdk_attempts = max(1, int(S3_SDK_ATTEMPTS if sdk_attempts is None else sdk_attempts))
    back_off = sum(min(2.0 ** k, 20.0) for k in range(sdk_attempts - 1))
    share = max(_attempt_share_s(timeout_s) - back_off, 0.0) / sdk_attempts
    return max(1.0, share / 3), max(1.0, 2 * share / 3)


def gcs_retry_limit_s(timeout_s: float) -> int:
    """pyarrow's GCS client's ``retry_limit_seconds`` where none is given: GCS_RETRY_LIMIT_S, or less, the budget's
    share of one of infeed's attempts (whole seconds, at least 1: the client ignores fractions)."""
    return max(1, min(GCS_RETRY_LIMIT_S, int(_attempt_share_s(timeout_s))))


def _s3(options: dict, timeout_s: float | None = None):
    import pyarrow.fs as pafs

    options = dict(options)
    sdk_attempts = int(options.pop("retry_max_attempts", S3_SDK_ATTEMPTS))
    # pyarrow takes a strategy object: JSON carries the number
    options.setdefault("retry_strategy", pafs.AwsStandardS3RetryStrategy(max_attempts=sdk_attempts))
    connect, request = s3_timeouts(REMOTE_TIMEOUT_S if timeout_s is None else timeout_s, sdk_attempts)
    options.setdefault("connect_timeout", connect)          # the registration's own, where it gives them
    options.setdefault("request_timeout", request)
    return pafs.S3FileSystem(**options)


def _gcs(options: dict, timeout_s: float | None = None):
    import pyarrow.fs as pafs

    options = dict(options)
    if "retry_limit_seconds" not in options:
        options["retry_limit_seconds"] = gcs_retry_limit_s(REMOTE_TIMEOUT_S if timeout_s is None
                                                           else timeout_s)
    # pyarrow takes a timedelta: JSON carries the seconds
    options["retry_time_limit"] = datetime.timedelta(seconds=float(options.pop("retry_limit_seconds")))
    return pafs.GcsFileSystem(**options)


def _hdfs(options: dict, timeout_s: float | None = None):
    import pyarrow.fs as pafs

    return pafs.HadoopFileSystem(**options)


#: The kinds :func:`register_filesystem` builds, by name, from JSON-able keyword arguments.
KINDS = {"s3": _s3, "gcs": _gcs, "hdfs": _hdfs}


@dataclass
class _Entry:
    prefix: str
    kind: str | None
    factory: str | None
    options: dict
    built: object = field(default=None, repr=False)

    def to_json(self) -> dict:
        return {"prefix": self.prefix, "kind": self.kind, "factory": self.factory, "options": self.options}

    def filesystem(self):
        if self.built is None:
            self.built = _build(self.prefix, self.kind, self.factory, self.options)
        return self.built


_registry: dict[str, _Entry] = {}
_lock = threading.Lock()


def _normalise_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or "://" not in prefix or "?" in prefix:
        raise FileSystemConfigError(prefix, "a prefix is a URI's scheme or location without a query, such as "
                                            "'s3://' or 'gs://bucket/data/'")
    scheme, rest = prefix.split("://", 1)
    return f"{scheme.lower()}://{rest}"


def _build(prefix: str, kind: str | None, factory: str | None, options: dict):
    import pyarrow.fs as pafs

    options = dict(options)
    timeout_s = _timeout(prefix, options.pop(TIMEOUT_OPTION)) if TIMEOUT_OPTION in options else None
    try:
        if factory is not None:
            module, _, name = factory.partition(":")
            fs = getattr(importlib.import_module(module), name)(**options)
            if not isinstance(fs, pafs.FileSystem):
                fs = pafs.PyFileSystem(pafs.FSSpecHandler(fs))        # an fsspec filesystem
        else:
            fs = KINDS[kind](options, timeout_s)
    except FileSystemConfigError:
        raise
    except Exception as e:
        what = f"factory {factory!r}" if factory is not None else f"{kind} with {sorted(options)}"
        raise FileSystemConfigError(prefix, f"building its filesystem ({what}) failed: {type(e).__name__}: {e}") \
            from e
    return fs


def register_filesystem(prefix: str, kind: str | None = None, /, *, factory: str | None = None, **options) -> None:
    """Opens every URI that starts with ``prefix`` (``"s3://"``, ``"gs://bucket"``, ``"s3://bucket/data/"``)
    with the filesystem built from ``kind`` and ``options``, in this process and in the daemon's workers it
    starts from now on.

    ``kind``: ``"s3"`` (``pyarrow.fs.S3FileSystem(**options)``; ``retry_max_attempts=N`` for its retry
    strategy, S3_SDK_ATTEMPTS where not given; ``connect_timeout`` and ``request_timeout`` from the budget where not
    given, :func:`s3_timeouts`), ``"gcs"`` (``pyarrow.fs.GcsFileSystem(**options)``; ``retry_limit_seconds=S``,
    :func:`gcs_retry_limit_s` where not given) or ``"hdfs"``.
    ``factory``: instead of a kind, ``"module:function"``, called with ``options`` in each process to make
    the filesystem (a ``pyarrow.fs.FileSystem``, or an fsspec one, wrapped). ``timeout_s=S``, with either, is
    the budget of each open and read under the prefix, all attempts together (:func:`remote_timeout_s`; not
    passed to a factory). ``options`` must be JSON
    (they travel to the workers so); credentials among them stay in memory and on the workers' pipes, never
    on disk. The filesystem is built once here at once, so a wrong option fails now:
    :class:`~infeed.errors.FileSystemConfigError`, naming the prefix. Registering a prefix again replaces it.
    """
    prefix = _normalise_prefix(prefix)
    if (kind is None) == (factory is None):
        raise FileSystemConfigError(prefix, f"give exactly one of a kind ({', '.join(KINDS)}) and a factory "
                                            "('module:function')")
    if kind is not None and kind not in KINDS:
        raise FileSystemConfigError(prefix, f"unknown kind {kind!r}: one of {', '.join(KINDS)}, or a factory")
    if factory is not None and (not isinstance(factory, str) or ":" not in factory):
        raise FileSystemConfigError(prefix, f"a factory is 'module:function', got {factory!r}")
    try:
        same = json.loads(json.dumps(options, allow_nan=False)) == options
    except (TypeError, ValueError):
        same = False
    if not same:
        raise FileSystemConfigError(prefix, "options must be JSON (str keys; numbers, strings, booleans, lists): "
                                            "they are sent to the worker processes")
    entry = _Entry(prefix, kind, factory, options)
    entry.filesystem()
    with _lock:
        _registry[prefix] = entry


def unregister_filesystem(prefix: str) -> None:
    """Forgets what :func:`register_filesystem` registered for ``prefix`` (nothing when it registered nothing)."""
    with _lock:
        _registry.pop(_normalise_prefix(prefix), None)


def registered_filesystems() -> list[dict]:
    """The registry as JSON, for :func:`restore_registered_filesystems` in a worker process."""
    with _lock:
        return [entry.to_json() for entry in _registry.values()]


def restore_registered_filesystems(entries: list[dict]) -> None:
    """Registers what :func:`registered_filesystems` gave in another process; each filesystem is built at its
    first use here."""
    with _lock:
        for item in entries:
            _registry[item["prefix"]] = _Entry(item["prefix"], item["kind"], item["factory"], item["options"])


def _registered_for(location: str) -> _Entry | None:
    scheme, rest = location.split("://", 1)
    key = f"{scheme.lower()}://{rest}"
    with _lock:
        matches = [entry for prefix, entry in _registry.items() if key.startswith(prefix)]
    return max(matches, key=lambda entry: len(entry.prefix), default=None)


def _flag(uri: str, name: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise FileSystemConfigError(uri, f"{name}={value!r} in the query: true or false")


def _gcs_options(uri: str, query: str) -> dict:
    """GcsFileSystem's options from a gs:// URI's query and STORAGE_EMULATOR_HOST."""
    options: dict = {}
    for name, value in urllib.parse.parse_qsl(query.lstrip("?"), keep_blank_values=True):
        if name not in GCS_QUERY_OPTIONS:
            raise FileSystemConfigError(uri, f"unknown option {name!r} in the query: a gs:// URI takes "
                                             f"{', '.join(GCS_QUERY_OPTIONS)}")
        options[name] = _flag(uri, name, value) if name == "anonymous" else value
    if TIMEOUT_OPTION in options:
        options[TIMEOUT_OPTION] = _timeout(uri, options[TIMEOUT_OPTION])
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if emulator and "endpoint_override" not in options:
        scheme, _, host = emulator.rpartition("://")
        options.setdefault("scheme", scheme or "http")
        options["endpoint_override"] = host.rstrip("/")
        options.setdefault("anonymous", True)               # an emulator takes no credentials, as Google's clients
    return options


#: Where Linux tells the machine's maker: "Google Compute Engine" on GCE, GKE and Cloud TPU VMs (as google-auth reads it).
GCE_PRODUCT_NAME_FILE = "/sys/class/dmi/id/product_name"


def google_credentials_source() -> str | None:
    """Where Google's default credentials would come from here, or None when there is nowhere: looked up without
    a request (the metadata server's lookup, off Google Cloud, waits 30 s and more before it fails)."""
    explicit = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if explicit:
        return f"GOOGLE_APPLICATION_CREDENTIALS ({explicit})"
    config = os.environ.get("CLOUDSDK_CONFIG") or os.path.join(os.path.expanduser("~"), ".config", "gcloud")
    adc = os.path.join(config, "application_default_credentials.json")
    if os.path.isfile(adc):
        return f"gcloud's application default credentials ({adc})"
    for name in ("GCE_METADATA_HOST", "GCE_METADATA_ROOT"):
        if os.environ.get(name):
            return f"the metadata server at {name}={os.environ[name]}"
    try:
        with open(GCE_PRODUCT_NAME_FILE) as f:
            if f.read().strip().startswith("Google"):
                return "the Compute Engine metadata server"
    except OSError:
        pass
    return None


def _check_google_credentials(uri: str) -> None:
    if google_credentials_source() is None:
        config = os.environ.get("CLOUDSDK_CONFIG") or "~/.config/gcloud"
        raise FileSystemConfigError(uri, "no Google credentials to be found: GOOGLE_APPLICATION_CREDENTIALS is unset, "
                                         f"{config}/application_default_credentials.json does not exist, and this is "
                                         "no Compute Engine machine (GCE_METADATA_HOST unset). Set one of them "
                                         "(gcloud auth application-default login), STORAGE_EMULATOR_HOST for an "
                                         "emulator, gs://anonymous@bucket/... for a public bucket, or register "
                                         "a filesystem (infeed.register_filesystem)")


_gcs_cache: dict[tuple, object] = {}


def filesystem_for(uri: str):
    """``(pyarrow filesystem, path inside it)`` for ``uri``, by the rules of this module's docstring.

    Raises :class:`~infeed.errors.FileSystemConfigError` naming the URI for a query it cannot take."""
    location, query = split_query(uri)
    entry = _registered_for(location)
    if entry is not None:
        return entry.filesystem(), location.split("://", 1)[1]
    scheme, rest = location.split("://", 1)
    if scheme.lower() in ("gs", "gcs"):
        user, _, inner = rest.rpartition("@") if "@" in rest.partition("/")[0] else ("", "", rest)
        if user not in ("", "anonymous"):
            raise FileSystemConfigError(uri, "the only user a gs:// URI may name is 'anonymous' (gs://anonymous@bucket/"
                                             "...): credentials come from Google's usual places or a registered "
                                             "filesystem")
        options = _gcs_options(uri, query)
        if user:
            options["anonymous"] = True
        if not options.get("anonymous") and "access_token" not in options:
            _check_google_credentials(uri)
        if "retry_limit_seconds" not in options:   # as the budget is now (the key below keeps it)
            options["retry_limit_seconds"] = gcs_retry_limit_s(options.get(TIMEOUT_OPTION, REMOTE_TIMEOUT_S))
        key = tuple(sorted(options.items()))
        fs = _gcs_cache.get(key)
        if fs is None:
            fs = _gcs_cache[key] = _build(f"{scheme}://", "gcs", None, options)
        return fs, inner
    import pyarrow.fs as pafs

    timeout_s, query = _pop_timeout(uri, query)
    try:
        fs, inner = pafs.FileSystem.from_uri(location + query)
    except ValueError as e:                  # pyarrow.ArrowInvalid: an unknown scheme, an option its query cannot take
        raise FileSystemConfigError(uri, f"pyarrow cannot open this URI: {e}") from None
    if isinstance(fs, pafs.S3FileSystem):
        # from_uri takes no timeouts and leaves the AWS SDK's retries at its own default (30 connections and 100 s
        # to a server that never answers): built again with the options from_uri read (the URI's and the
        # environment's, as pickling carries them), and the budget's timeouts and retries.
        options = dict(fs.__reduce__()[1][0])
        for name in ("connect_timeout", "request_timeout", "retry_strategy"):
            options.pop(name, None)
        fs = _s3(options, timeout_s)
    return fs, inner


def _pop_timeout(uri: str, query: str) -> tuple[float | None, str]:
    """``timeout_s`` from a URI's query (None where it has none), and the query without it (for pyarrow,
    which takes no option it does not know); the others as written."""
    timeout_s, kept = None, []
    for item in query.lstrip("?").split("&") if query else ():
        name, _, value = item.partition("=")
        if urllib.parse.unquote_plus(name) == TIMEOUT_OPTION:
            timeout_s = _timeout(uri, urllib.parse.unquote_plus(value))
        else:
            kept.append(item)
    return timeout_s, "?" + "&".join(kept) if kept else ""


def remote_timeout_s(uri: str) -> float:
    """The time one open or read of ``uri`` may take, all its attempts together, in seconds: ``timeout_s`` of the
    filesystem registered for it, or of its query where none is registered, else
    ``REMOTE_TIMEOUT_S`` (60)."""
    location, query = split_query(uri)
    default = REMOTE_TIMEOUT_S
    if "://" not in location:
        return default
    entry = _registered_for(location)
    try:
        if entry is not None:
            value = entry.options.get(TIMEOUT_OPTION)
            return default if value is None else _timeout(entry.prefix, value)
        timeout_s, _ = _pop_timeout(uri, query)
    except FileSystemConfigError:
        return default                      # (refused where its filesystem was made)
    return default if timeout_s is None else timeout_s
