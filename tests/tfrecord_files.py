"""TFRecord files for tests (``tests/`` is on ``sys.path`` through its conftest.py)."""

import os

import infeed

#: Records of several sizes: empty, one byte, text, random bytes past a buffer's first read, every byte value.
SAMPLE_RECORDS = [b"", b"a", b"hello world" * 10, os.urandom(5000), bytes(range(256)) * 3]


def write_records(path, records=SAMPLE_RECORDS, compression=None):
    """Writes ``records`` to ``path`` with infeed's writer; returns ``path``."""
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for r in records:
            w.write(r)
    return path
