"""Writing TFRecord files that TensorFlow reads back."""

from __future__ import annotations

import os
import zlib

from infeed.tfrecord import _tfrecord
from infeed.tfrecord.reader import open_output

__all__ = ["TFRecordWriter"]


class TFRecordWriter:
    """Writes records framed as TFRecords, optionally GZIP- or ZLIB-compressed.

    >>> with TFRecordWriter("/tmp/doc.tfrecord") as w:     # doctest: +SKIP
    ...     w.write(encode_example({"x": [1.0]}))

    Paths may be local or URIs (through pyarrow.fs).
    """

    def __init__(self, path, compression: str | None = None, level: int = 6):
        if compression not in (None, "GZIP", "ZLIB"):
            raise ValueError(f"compression must be None, 'GZIP' or 'ZLIB', got {compression!r}")
        self.path = os.fspath(path)
        self.compression = compression
        self._out = open_output(self.path)
        self._z = None if compression is None else zlib.compressobj(level, zlib.DEFLATED,
                                                                    31 if compression == "GZIP" else 15)
        self.records_written = 0

    def write(self, record) -> None:
        """Appends one record (bytes-like)."""
        if self._out is None:
            raise ValueError(f"{self.path}: write to a closed TFRecordWriter")
        framed = _tfrecord.frame(record)
        self._out.write(framed if self._z is None else self._z.compress(framed))
        self.records_written += 1

    def flush(self) -> None:
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
        return self

    def __exit__(self, *exc):
        self.close()
