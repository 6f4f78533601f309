"""Writing TFRecord files that TensorFlow reads back."""

from __future__ import annotations

import zlib

from infeed.tfrecord import _tfrecord
from infeed.tfrecord.names import path_str
from infeed.tfrecord.reader import open_output

__all__ = ["TFRecordWriter"]


class TFRecordWriter:
    """Writes records framed as TFRecords, optionally GZIP- or ZLIB-compressed.

    >>> with TFRecordWriter("/tmp/doc.tfrecord") as w:     # doctest: +SKIP
    ...     w.write(encode_example({"x": [1.0]}))

    Paths may be local or URIs (through pyarrow.fs).
    """

    def __init__(self, path, compression: str | None = None, level: int = 6):
        if compression not in (None, "", "GZIP", "ZLIB"):
            raise ValueError(f"compression must be None (or '', as TensorFlow spells it), 'GZIP' or 'ZLIB', "
                             f"got {compression!r}")
        if isinstance(level, bool) or level not in range(-1, 10):
            raise ValueError(f"level must be an int from 0 to 9 (or -1, zlib's default), got {level!r:.80}")
        self.path = path_str(path)
        self.compression = compression or None
        self._out = open_output(self.path)
        self._z = None if self.compression is None else zlib.compressobj(
            level, zlib.DEFLATED, 31 if self.compression == "GZIP" else 15)
        self.records_written = 0

    def _check_open(self) -> None:
        if self._out is None:
            raise ValueError(f"I/O operation on closed file: {self.path} (a closed TFRecordWriter)")

    def write(self, record) -> None:
        """Appends one record (bytes-like)."""
        self._check_open()
        try:
            framed = _tfrecord.frame(record)
        except TypeError:
            raise TypeError(f"{self.path}: a record must be bytes-like, got {type(record).__name__}") from None
        self._out.write(framed if self._z is None else self._z.compress(framed))
        self.records_written += 1

    def flush(self) -> None:
        self._check_open()
        if self._z is not None:
            self._out.write(self._z.flush(zlib.Z_SYNC_FLUSH))
        self._out.flush()

    def close(self) -> None:
        if self._out is None:
            return
        try:
            if self._z is not None:
                self._out.write(self._z.flush())
        finally:
            out, self._out = self._out, None
            out.close()

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc):
        self.close()
