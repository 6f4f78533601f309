"""Reading TFRecord files: local paths or any URI pyarrow.fs understands, plain or compressed."""

from __future__ import annotations

import collections
import concurrent.futures
import datetime
import errno
import logging
import operator
import os
import stat
import threading
import time
import zlib

from infeed.errors import CompressedStreamError, SourceChangedError, located_os_error
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.filesystems import REMOTE_ATTEMPTS, REMOTE_RETRY_WAIT_S, REMOTE_TIMEOUT_S  # noqa: F401
from infeed.tfrecord.names import path_str

__all__ = ["read_records", "open_input", "open_random_access", "COMPRESSIONS", "MAX_RECORD_SIZE", "RecordReader"]

RecordReader = _tfrecord.RecordReader
#: The longest record a reader takes unless told otherwise (``max_record_size``).
MAX_RECORD_SIZE = _tfrecord.MAX_RECORD_SIZE

#: Accepted values of ``compression``: ``""`` is TensorFlow's spelling of None (no compression).
COMPRESSIONS = (None, "", "GZIP", "ZLIB", "auto")

_DEFAULT_BUFFER = 8 << 20
_EXTENSIONS = {".gz": "GZIP", ".gzip": "GZIP", ".zlib": "ZLIB", ".zz": "ZLIB"}

#: Reading a remote file front to back (read_records, the daemon's streamed reads): ranges of READ_AHEAD_BYTES,
#: up to READ_AHEAD_RANGES of them requested ahead of the reader, on a pool of READ_AHEAD_THREADS threads a
#: process. Memory: READ_AHEAD_RANGES * READ_AHEAD_BYTES an open file, beside the reader's own buffer.
READ_AHEAD_BYTES = 4 << 20
READ_AHEAD_RANGES = 8
READ_AHEAD_THREADS = 64

#: OSErrors that no retry cures: raised at the first attempt.
_PERMANENT_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
#: What pyarrow's S3 (the AWS SDK's error names) and GCS (google-cloud-cpp's status codes) clients say when the store
#: refused the request as made by whoever made it: no retry cures that either.
_REFUSALS = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "PERMISSION_DENIED",
             "UNAUTHENTICATED")

_log = logging.getLogger("infeed")


def _is_uri(path: str) -> bool:
    return "://" in path


def _filesystem(uri: str):
    """``(pyarrow filesystem, path inside it)`` for a URI (:mod:`infeed.tfrecord.filesystems`)."""
    from infeed.tfrecord.filesystems import filesystem_for

    return filesystem_for(uri)


def _retrying(call, uri: str, what: str):
    """``call()``, tried up to REMOTE_ATTEMPTS times while it raises a transient OSError, with a
    growing wait between attempts, and none begun once the URI's budget is spent (REMOTE_TIMEOUT_S, or its
    ``timeout_s``); the last error names the URI and says how many attempts were made, in how long."""
    began = time.monotonic()
    wait = REMOTE_RETRY_WAIT_S
    for attempt in range(1, REMOTE_ATTEMPTS + 1):
        try:
            return call()
        except _PERMANENT_ERRORS:
            raise
        except OSError as e:
            if any(refusal in str(e) for refusal in _REFUSALS):
                raise PermissionError(errno.EACCES, f"{e} ({what}; refused, not retried: check the credentials "
                                                    f"and the bucket's permissions)") from e
            spent = time.monotonic() - began
            budget = None
            if attempt < REMOTE_ATTEMPTS:
                from infeed.tfrecord.filesystems import remote_timeout_s

                budget = remote_timeout_s(uri)
            if attempt == REMOTE_ATTEMPTS or spent + wait >= budget:
                tries = f"{attempt} attempt{'s' if attempt > 1 else ''} in {spent:.1f} s"
                limit = "" if budget is None else f", the time allowed being {budget:g} s (timeout_s)"
                reason = f"{e.strerror or e or type(e).__name__} ({what}; gave up after {tries}{limit})"
                raise OSError(e.errno or errno.EIO, reason, uri) from e
            _log.warning("%s: %s failed (%s); attempt %d of %d in %.2g s", uri, what, e, attempt + 1,
                         REMOTE_ATTEMPTS, wait)
            time.sleep(wait)
            wait *= 2


class _RemoteInput:
    """A remote file read front to back, with ranges requested ahead of the reader: up to ``READ_AHEAD_RANGES``
    reads of ``READ_AHEAD_BYTES`` each in flight at once (on a shared pool of threads), so that a store's time to
    first byte (tens of milliseconds a request) is spent while the records already read are decoded. Memory:
    at most ``READ_AHEAD_RANGES * READ_AHEAD_BYTES`` per open file. Each range read is retried as
    :meth:`_ArrowRandomAccess.read_at`'s are; a failure is raised when the reader reaches that range.

    The file is pinned as it was when opened (``info``: its size and modification time): after each range is
    read, the file is looked up again, and a range is handed to the reader only while the file is unchanged,
    else :class:`~infeed.errors.SourceChangedError`: records are never mixed from two versions of an object
    replaced while it is read. (pyarrow gives neither S3's ETag nor GCS's generation; a replacement within the
    same second at the same size, the modification time's granularity on S3, goes unseen.)"""

    def __init__(self, fs, inner: str, uri: str, info):
        self._file = _ArrowRandomAccess(fs, inner, uri, info)
        self._size = info.size                            # None: read until a range comes back short
        self._requested = 0                               # the offset of the next range to request
        self._pending: collections.deque = collections.deque()
        self._chunk = memoryview(b"")

    def _request_ahead(self) -> None:
        while len(self._pending) < READ_AHEAD_RANGES and (self._size is None or self._requested < self._size):
            n = READ_AHEAD_BYTES if self._size is None else min(READ_AHEAD_BYTES, self._size - self._requested)
            future = read_ahead_pool().submit(self._read_unchanged, self._requested, n)
            self._pending.append((self._requested, n, future))
            self._requested += n

    def _read_unchanged(self, offset: int, n: int) -> bytes:
        """``n`` bytes at ``offset``, read while the file was as pinned (checked after the read)."""
        data = self._file.read_at(offset, n)
        self._file.check_unchanged(offset)
        return data

    def readinto(self, view) -> int:
        if not self._chunk:
            self._request_ahead()
            if not self._pending:
                return 0
            offset, n, future = self._pending.popleft()
            data = future.result()
            if len(data) < n:                    # the end of a file whose size was not known
                self._size = self._requested = offset + len(data)
                self._cancel_pending()
            self._chunk = memoryview(data)
            self._request_ahead()
        n = min(len(view), len(self._chunk))
        view[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n

    def read(self, n: int = -1) -> bytes:
        out = bytearray()
        while n < 0 or len(out) < n:
            piece = bytearray(READ_AHEAD_BYTES if n < 0 else n - len(out))
            got = self.readinto(memoryview(piece))
            if not got:
                break
            out += piece[:got]
        return bytes(out)

    def _cancel_pending(self) -> None:
        while self._pending:
            self._pending.pop()[2].cancel()       # one already running finishes; its bytes are dropped

    def close(self) -> None:
        self._cancel_pending()
        self._chunk = memoryview(b"")
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_pool = None
_pool_lock = threading.Lock()


def read_ahead_pool():
    """The process's threads for remote reads ahead of their reader (made at the first remote file; each waits on
    the network with the GIL released): the streamed reads' ranges and the indexed reads' runs."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=READ_AHEAD_THREADS,
                                                          thread_name_prefix="infeed-read-ahead")
        return _pool


def open_input(path: str):
    """A binary input stream and its size in bytes (-1 when unknown) for a path or URI.

    A URI's file is read with bounded retries (REMOTE_ATTEMPTS) of each failed open or read, and ranges
    requested ahead of the reader (READ_AHEAD_RANGES of READ_AHEAD_BYTES)."""
    path = path_str(path)
    if not _is_uri(path):
        f = open(path, "rb", buffering=0)
        st = os.fstat(f.fileno())
        return f, (st.st_size if stat.S_ISREG(st.st_mode) else -1)      # a pipe or FIFO: read to its end
    fs, inner, info = remote_file_info(path)
    size = info.size if info.size is not None else -1
    try:
        stream = _RemoteInput(fs, inner, path, info)    # opened now: a failure to open is raised here
    except OSError as e:
        raise _tfrecord.located_io_error(e, path, 0, 0) from e
    return stream, size


def remote_file_info(uri: str):
    """``(filesystem, inner path, pyarrow FileInfo)`` of the remote file ``uri``, looked up with bounded retries
    (REMOTE_ATTEMPTS); FileNotFoundError where there is none."""
    import pyarrow.fs as pafs

    fs, inner = _filesystem(uri)
    try:
        info = _retrying(lambda: fs.get_file_info(inner), uri, "looking the file up")
    except OSError as e:
        raise _tfrecord.located_io_error(e, uri, 0, 0) from e
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(errno.ENOENT, "no such file", uri)
    return fs, inner, info


def _located(error: OSError, path: str, offset: int, n: int) -> OSError:
    return located_os_error(error, path, f"reading {n} bytes at byte offset {offset}")


class _LocalRandomAccess:
    """Reads at offsets of a local file, pinned as it was when opened: ``version``, its (size, modification
    time); :meth:`check_unchanged` raises :class:`~infeed.errors.SourceChangedError` once it was written since.
    (A file replaced by another under its name is not: the open file is still the one pinned.)"""

    def __init__(self, path: str):
        self._path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(self._fd)
        self._key, self.version = (st.st_size, st.st_mtime_ns), _local_version(st)

    def check_unchanged(self, offset: int) -> None:
        """SourceChangedError (naming ``offset``, the read that found it) when the file is no longer as pinned."""
        st = os.fstat(self._fd)
        if (st.st_size, st.st_mtime_ns) != self._key:
            raise SourceChangedError(self._path, self.version, _local_version(st), offset)

    def read_at(self, offset: int, n: int) -> bytes:
        try:
            return os.pread(self._fd, n, offset)
        except OSError as e:
            raise _located(e, self._path, offset, n) from e

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _local_version(st: os.stat_result) -> tuple:
    return st.st_size, datetime.datetime.fromtimestamp(st.st_mtime_ns / 1e9, datetime.timezone.utc)


class _ArrowRandomAccess:
    """Reads at offsets of a remote file, each failed read retried on the file opened afresh; safe to call from
    several threads at once (pyarrow's files read at offsets concurrently).

    The file is pinned as it was when opened (``version``: its size and modification time, from ``info`` where
    the caller looked it up already): :meth:`check_unchanged` raises :class:`~infeed.errors.SourceChangedError`
    once it is another. (pyarrow gives neither S3's ETag nor GCS's generation; a replacement within the same
    second at the same size, the modification time's granularity on S3, goes unseen by this check.)"""

    def __init__(self, fs, inner: str, uri: str, info=None):
        self._fs = fs
        self._inner = inner
        self._uri = uri
        self._lock = threading.Lock()
        self._closed = False
        if info is None:
            info = self._look_up()
        self.version = (info.size, info.mtime)
        self._file = _retrying(lambda: fs.open_input_file(inner), uri, "opening the file")

    def _look_up(self):
        return _retrying(lambda: self._fs.get_file_info(self._inner), self._uri, "looking the file up")

    def check_unchanged(self, offset: int) -> None:
        """SourceChangedError (naming ``offset``, the read that found it) when the file is no longer as pinned;
        a file gone since is left to the reads (they find it gone)."""
        import pyarrow.fs as pafs

        info = self._look_up()
        if info.type != pafs.FileType.NotFound and (info.size, info.mtime) != self.version:
            raise SourceChangedError(self._uri, self.version, (info.size, info.mtime), offset)

    def _opened(self):
        with self._lock:
            if self._closed:
                raise ValueError(f"{self._uri}: read after close")
            if self._file is None:
                self._file = self._fs.open_input_file(self._inner)
            return self._file

    def _drop(self, f) -> None:
        with self._lock:
            if self._file is not f:
                return                                  # another thread dropped it already
            self._file = None
        try:
            f.close()
        except OSError:
            pass                    # closing a broken connection may fail too; the retry opens anew

    def read_at(self, offset: int, n: int) -> bytes:
        def attempt():
            f = self._opened()
            try:
                data = f.read_at(n, offset)        # bytes from pyarrow's files, a Buffer from some
                return data if isinstance(data, bytes) else data.to_pybytes()
            except OSError:
                self._drop(f)        # a file after an error is in no known state: reopen it
                raise
            except ValueError:       # pyarrow's "closed file": dropped by another thread's failed read meanwhile
                with self._lock:
                    dropped = self._file is not f
                if dropped:
                    raise OSError(errno.EIO, "the file was closed after another read's error") from None
                raise
        try:
            return _retrying(attempt, self._uri, f"read at byte {offset}")
        except FileNotFoundError as e:
            self.check_unchanged(offset)    # GCS reads the generation opened: replaced, it is "not found"
            raise _located(e, self._uri, offset, n) from e
        except OSError as e:
            raise _located(e, self._uri, offset, n) from e

    def close(self) -> None:
        with self._lock:
            f, self._file, self._closed = self._file, None, True
        if f is not None:
            f.close()


def open_random_access(path: str):
    """An object with ``read_at(offset, n) -> bytes`` and ``close()`` for a path or URI.

    A failed read raises OSError naming the file and offset, after bounded retries for a URI."""
    path = path_str(path)
    if not _is_uri(path):
        return _LocalRandomAccess(path)
    fs, inner = _filesystem(path)
    return _ArrowRandomAccess(fs, inner, path)


def open_output(path: str):
    """A binary output stream for a path or URI."""
    path = path_str(path)
    if not _is_uri(path):
        return open(path, "wb")
    fs, inner = _filesystem(path)
    return fs.open_output_stream(inner, compression=None)


_SALVAGE_PIECE = 4096            # deflate inflates at most 1032 bytes per input byte: 4 MiB a piece
_SALVAGE_LIMIT = 64 << 20


class _Decompressing:
    """``readinto`` over a GZIP or ZLIB stream (concatenated members too).

    At damage, it first hands out all that inflates before the damaged byte, so that the reader
    yields every record before it, then raises CompressedStreamError naming that byte's offset
    in the compressed file."""

    def __init__(self, raw, compression: str, path: str, chunk: int):
        self._raw = raw
        self._wbits = 31 if compression == "GZIP" else 15
        self._name = compression
        self._path = path
        self._chunk = chunk
        self._z = zlib.decompressobj(self._wbits)
        self._pending = b""
        self._raw_eof = False
        self._started = False        # the current member has consumed input
        self._raw_read = 0           # compressed bytes read so far; what is fed is always their tail
        self._inflated = 0           # bytes inflated so far
        self._failure = None         # raised once what inflated before the damage is handed out
        self._salvaged = b""         # that output, handed out from _salvaged_at
        self._salvaged_at = 0

    def _damaged(self, what: str, at: int, exact: bool = True) -> CompressedStreamError:
        hint = (f"; nothing inflated before it: is the file really {self._name}-compressed?"
                if self._inflated == 0 and not self._salvaged else "")
        where = "at" if exact else "at or after"
        return CompressedStreamError(f"{what} {where} compressed byte {at}{hint}")

    def _salvage(self, z, data: bytes) -> tuple[bytes, int, bool]:
        """What ``z`` (the decompressor before ``data``) inflates from ``data`` before its damage:
        ``(output, offset in data of the byte that fails, whether that byte was found)``.

        Inflated again in pieces, copying the decompressor before each, byte by byte in the piece
        that fails: inflate's verdict on damage may depend on how its output is cut (a window
        smaller than a distance is legal only within one call), so the output handed out is
        this pass's own.  It stops early after _SALVAGE_LIMIT bytes of output."""
        out = bytearray()
        for i in range(0, len(data), _SALVAGE_PIECE):
            if len(out) >= _SALVAGE_LIMIT:
                return bytes(out), i, False
            piece, saved = data[i:i + _SALVAGE_PIECE], z.copy()
            try:
                out += z.decompress(piece)
            except zlib.error:
                z = saved
                for j in range(len(piece)):
                    try:
                        out += z.decompress(piece[j:j + 1])
                    except zlib.error:
                        return bytes(out), i + j, True
                return bytes(out), i + len(piece), True      # (inflate rejected only the whole piece)
            if z.eof:
                return bytes(out), i + len(piece), True       # the damage was in the next member's start
        return bytes(out), len(data), True

    def readinto(self, view) -> int:
        want = len(view)
        while True:
            if self._salvaged:
                n = min(want, len(self._salvaged) - self._salvaged_at)
                view[:n] = self._salvaged[self._salvaged_at:self._salvaged_at + n]
                self._salvaged_at += n
                if self._salvaged_at == len(self._salvaged):
                    self._salvaged, self._salvaged_at = b"", 0
                self._inflated += n
                return n
            if self._failure is not None:
                raise self._failure
            if self._pending:
                data = self._pending
            elif self._z.unconsumed_tail:
                data = self._z.unconsumed_tail
            else:
                if self._raw_eof:
                    return 0
                data = self._raw.read(self._chunk)
                self._raw_read += len(data)
                if not data:
                    self._raw_eof = True
                    if not self._z.eof and (self._z.unconsumed_tail or self._started):
                        raise self._damaged(f"{self._name} stream cut short", self._raw_read)
                    return 0
            self._pending = b""
            before = self._z.copy()
            began = time.monotonic_ns()
            try:
                out = self._z.decompress(data, want)
            except zlib.error as e:
                self._salvaged, at, exact = self._salvage(before, data)
                self._salvaged_at = 0
                at += self._raw_read - len(data)      # what is fed is always the tail of what was read
                self._failure = self._damaged(f"damaged {self._name} stream ({e})", at, exact)
                continue
            _tfrecord.count_inflate(time.monotonic_ns() - began, len(data) - len(self._z.unconsumed_tail))
            self._started = True
            if self._z.eof:
                rest = self._z.unused_data
                self._z = zlib.decompressobj(self._wbits)     # a following member, if any
                self._started = False
                self._pending = rest
            if out:
                view[: len(out)] = out
                self._inflated += len(out)
                return len(out)

    def close(self):
        self._raw.close()


_SNIFF_BYTES = 4096


def _sniff(head: bytes) -> str | None:
    """GZIP or ZLIB when ``head`` starts such a stream and inflates without error, else None.

    A two-byte magic alone is not enough: a damaged plain file may start with one.
    """
    if _tfrecord.looks_like_tfrecord(head):
        return None
    if head[:2] == b"\x1f\x8b":
        guess, wbits = "GZIP", 31
    elif len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0:
        guess, wbits = "ZLIB", 15
    else:
        return None
    try:
        zlib.decompressobj(wbits).decompress(head)
    except zlib.error:
        return None
    return guess


class _Peeked:
    """A stream with its first bytes read ahead (for sniffing) and put back."""

    def __init__(self, raw, head: bytes):
        self._raw = raw
        self._head = head

    def read(self, n=-1):
        if not self._head:
            return self._raw.read(n)
        cut = len(self._head) if n < 0 else n
        out, self._head = self._head[:cut], self._head[cut:]
        return out

    def readinto(self, view):
        if self._head:
            n = min(len(view), len(self._head))
            view[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        return self._raw.readinto(view)

    def fileno(self):
        return self._raw.fileno()      # a local file's size is followed as it grows (RecordReader)

    def close(self):
        self._raw.close()


def read_records(path, compression="auto", skip_corrupt: bool = False, buffer_size: int = _DEFAULT_BUFFER,
                 max_record_size: int = MAX_RECORD_SIZE, follow: bool = False) -> RecordReader:
    """Iterates over the records of a TFRecord file, checking both CRCs of each.

    ``compression`` is None (or ``""``, as TensorFlow spells it), ``"GZIP"``, ``"ZLIB"`` or ``"auto"``
    (from the extension, else from the stream's first bytes).  Damage raises
    :class:`infeed.CorruptRecordError` (file, record index, byte offset); with
    ``skip_corrupt=True`` the reader resynchronises at the next good record
    instead, in the same file, logs a warning and counts what it skipped
    (``reader.skipped_regions``, ``reader.skipped_bytes``).  A damaged GZIP/ZLIB
    stream cannot be resynchronised: it raises (kind ``compressed_stream``)
    naming the last good record.  An I/O error is an OSError naming the file,
    the record and the offset; a URI's reads are retried first (REMOTE_ATTEMPTS).
    A record longer than ``max_record_size`` (default 256 MiB) is refused before
    anything is read or reserved for it (kind ``record_too_large``), so a small
    hostile file cannot make the reader allocate what its length field claims.
    Pipes and FIFOs are read to their end; a file being appended to is read as far
    as it holds whole records. A record its writer has not finished is reported as
    ``truncated_data``, with the bytes really there, at once; with ``follow=True``,
    only once no process has the file open for writing (until then the reader
    waits for the rest of the record).

    >>> for record in read_records("train.tfrecord"):   # doctest: +SKIP
    ...     example = decode_example(record)
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    for name, value in (("buffer_size", buffer_size), ("max_record_size", max_record_size)):
        try:
            operator.index(value)
        except TypeError:
            raise TypeError(f"{name} must be an int, got {value!r:.80}") from None
    compression = compression or None
    path = path_str(path)
    began = time.monotonic_ns()
    raw, size = open_input(path)
    _tfrecord.count_read(time.monotonic_ns() - began)     # opening is part of the read stage
    try:
        if compression == "auto":
            ext = os.path.splitext(path.rstrip("/"))[1].lower()
            compression = _EXTENSIONS.get(ext)
            if compression is None:
                try:
                    head = raw.read(_SNIFF_BYTES)
                except OSError as e:
                    raise _tfrecord.located_io_error(e, path, 0, 0) from e
                compression = _sniff(head)
                raw = _Peeked(raw, head)
        if compression is not None:
            raw = _Decompressing(raw, compression, path, min(buffer_size, 1 << 20))
            size = -1
        return RecordReader(raw, path, size, skip_corrupt, buffer_size, max_record_size, follow)
    except BaseException:
        raw.close()
        raise
