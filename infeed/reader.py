"""Reading TFRecord files: local paths or any URI pyarrow.fs understands, plain or compressed."""

from __future__ import annotations

import os
import zlib

from infeed._native import _tfrecord

__all__ = ["read_records", "open_input", "open_random_access", "COMPRESSIONS", "RecordReader"]

RecordReader = _tfrecord.RecordReader

#: Accepted values of ``compression``.
COMPRESSIONS = (None, "GZIP", "ZLIB", "auto")

_DEFAULT_BUFFER = 8 << 20
_EXTENSIONS = {".gz": "GZIP", ".gzip": "GZIP", ".zlib": "ZLIB", ".zz": "ZLIB"}


def _is_uri(path: str) -> bool:
    return "://" in path


def open_input(path: str):
    """A binary input stream and its size in bytes (-1 when unknown) for a path or URI."""
    path = os.fspath(path)
    if not _is_uri(path):
        f = open(path, "rb", buffering=0)
        return f, os.fstat(f.fileno()).st_size
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no such file: {path}")
    return fs.open_input_stream(inner, compression=None), (info.size if info.size is not None else -1)


class _LocalRandomAccess:
    def __init__(self, path: str):
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self._fd, n, offset)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _ArrowRandomAccess:
    def __init__(self, stream):
        self._stream = stream

    def read_at(self, offset: int, n: int) -> bytes:
        return self._stream.read_at(n, offset).to_pybytes()

    def close(self) -> None:
        self._stream.close()


def open_random_access(path: str):
    """An object with ``read_at(offset, n) -> bytes`` and ``close()`` for a path or URI."""
    path = os.fspath(path)
    if not _is_uri(path):
        return _LocalRandomAccess(path)
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    return _ArrowRandomAccess(fs.open_input_file(inner))


def open_output(path: str):
    """A binary output stream for a path or URI."""
    path = os.fspath(path)
    if not _is_uri(path):
        return open(path, "wb")
    import pyarrow.fs as pafs

    fs, inner = pafs.FileSystem.from_uri(path)
    return fs.open_output_stream(inner, compression=None)


class _Decompressing:
    """``readinto`` over a GZIP or ZLIB stream (concatenated members too)."""

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

    def readinto(self, view) -> int:
        want = len(view)
        while True:
            if self._pending:
                data = self._pending
            elif self._z.unconsumed_tail:
                data = self._z.unconsumed_tail
            else:
                if self._raw_eof:
                    return 0
                data = self._raw.read(self._chunk)
                if not data:
                    self._raw_eof = True
                    if not self._z.eof and (self._z.unconsumed_tail or self._started):
                        raise _tfrecord.CompressedStreamError(f"{self._name} stream cut short")
                    return 0
            self._pending = b""
            try:
                out = self._z.decompress(data, want)
            except zlib.error as e:
                raise _tfrecord.CompressedStreamError(f"damaged {self._name} stream: {e}") from None
            self._started = True
            if self._z.eof:
                rest = self._z.unused_data
                self._z = zlib.decompressobj(self._wbits)     # a following member, if any
                self._started = False
                self._pending = rest
            if out:
                view[: len(out)] = out
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

    def close(self):
        self._raw.close()


def read_records(path, compression="auto", skip_corrupt: bool = False,
                 buffer_size: int = _DEFAULT_BUFFER) -> RecordReader:
    """Iterates over the records of a TFRecord file, checking both CRCs of each.

    ``compression`` is None, ``"GZIP"``, ``"ZLIB"`` or ``"auto"`` (from the
    extension, else from the stream's first bytes).  Damage raises
    :class:`infeed.CorruptRecordError` (file, record index, byte offset); with
    ``skip_corrupt=True`` the reader resynchronises at the next good record
    instead and counts what it skipped (``reader.skipped_regions``,
    ``reader.skipped_bytes``).

    >>> for record in read_records("train.tfrecord"):   # doctest: +SKIP
    ...     example = decode_example(record)
    """
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS}, got {compression!r}")
    path = os.fspath(path)
    raw, size = open_input(path)
    try:
        if compression == "auto":
            ext = os.path.splitext(path.rstrip("/"))[1].lower()
            compression = _EXTENSIONS.get(ext)
            if compression is None:
                head = raw.read(_SNIFF_BYTES)
                compression = _sniff(head)
                raw = _Peeked(raw, head)
        if compression is not None:
            raw = _Decompressing(raw, compression, path, min(buffer_size, 1 << 20))
            size = -1
        return RecordReader(raw, path, size, skip_corrupt, buffer_size)
    except BaseException:
        raw.close()
        raise
