"""Reliability of the reader and the decoder: every kind of damage is located, skipped only on request,
never confused with an I/O error, and never lets the decoder write outside its row (issue 8).

The long coverage-guided runs are `make fuzz` / `make asan` (tests/fuzz/fuzz_infeed.py); the
hypothesis tests here are bounded so that the file runs in seconds.
"""

import concurrent.futures
import errno
import gzip
import io
import logging
import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infeed
from infeed import Bytes, FixedLen, Padded, VarLen
from infeed.tfrecord import _tfrecord, reader
from tfrecord_files import SAMPLE_RECORDS, write_records

from .processes import ROOT

BOUNDED = settings(max_examples=60, deadline=None, derandomize=True,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


FRAMED = b"".join(_tfrecord.frame(r) for r in SAMPLE_RECORDS)


def _offset(i):
    return sum(len(r) + 16 for r in SAMPLE_RECORDS[:i])


def _damaged(tmp_path, mutate, name="d.tfrecord"):
    data = bytearray(FRAMED)
    mutate(data)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def _read_until_error(path, **kw):
    """(records read, the CorruptRecordError that stopped the reader)."""
    got = []
    with pytest.raises(infeed.CorruptRecordError) as info:
        for r in infeed.read_records(path, **kw):
            got.append(r)
    return got, info.value


# --- each damage to a record ---------------------------------------------------------------------

@pytest.mark.parametrize("kind, mutate", [
    ("length_crc", lambda d: d.__setitem__(_offset(3) + 2, d[_offset(3) + 2] ^ 1)),        # length byte
    ("length_crc", lambda d: d.__setitem__(_offset(3) + 9, d[_offset(3) + 9] ^ 0x80)),     # its CRC
    ("data_crc", lambda d: d.__setitem__(_offset(3) + 20, d[_offset(3) + 20] ^ 4)),        # data
    ("data_crc", lambda d: d.__setitem__(_offset(4) - 1, d[_offset(4) - 1] ^ 4)),          # data CRC
])
def test_each_damage_names_file_record_offset_and_kind(tmp_path, kind, mutate):
    path = _damaged(tmp_path, mutate)
    reader_ = infeed.read_records(path)
    got = []
    with pytest.raises(infeed.CorruptRecordError) as info:
        for r in reader_:
            got.append(r)
    err = info.value
    assert got == SAMPLE_RECORDS[:3]
    assert (err.kind, err.record_index, err.offset, err.path) == (kind, 3, _offset(3), str(path))
    assert f"{path}: corrupt record 3 at byte offset {_offset(3)}" in str(err)
    with pytest.raises(infeed.CorruptRecordError) as again:          # nothing is yielded past damage
        next(reader_)
    assert again.value is err


def test_truncations_are_named_for_what_was_cut(tmp_path):
    cases = {_offset(4) + 5: "truncated_header", _offset(4) + 20: "truncated_data", _offset(5) - 1: "truncated_data"}
    for cut, kind in cases.items():
        path = tmp_path / f"cut{cut}.tfrecord"
        path.write_bytes(FRAMED[:cut])
        got, err = _read_until_error(path)
        assert got == SAMPLE_RECORDS[:4]
        assert (err.kind, err.record_index, err.offset, err.path) == (kind, 4, _offset(4), str(path))


def _bogus_length_frame(length):
    header = struct.pack("<Q", length)
    return header + struct.pack("<I", _tfrecord.masked_crc32c(header)) + b"x" * 100


@pytest.mark.parametrize("length", [1 << 60, 1 << 40, 10 << 20])
def test_a_length_beyond_the_file_is_never_allocated(tmp_path, length):
    """A valid-CRC length larger than the file fails as length_exceeds_file, plain or GZIP (whose size
    is unknown up front), and the reader's buffer never grows towards the bogus length."""
    data = _tfrecord.frame(b"ok") + _bogus_length_frame(length)
    for compression in (None, "GZIP"):
        path = tmp_path / f"big{compression}.tfrecord"
        path.write_bytes(gzip.compress(data) if compression else data)
        tracemalloc.start()
        try:
            reader_ = infeed.read_records(path, compression=compression, buffer_size=64 << 10)
            assert next(reader_) == b"ok"
            with pytest.raises(infeed.CorruptRecordError) as info:
                next(reader_)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        err = info.value
        # A compressed stream's size is unknown: a length past max_record_size (256 MiB) is refused at once.
        kind = "record_too_large" if compression and length > 256 << 20 else "length_exceeds_file"
        assert (err.kind, err.record_index, err.offset) == (kind, 1, 18)
        assert f"length {length}" in str(err)
        assert peak < 4 << 20, f"{compression}: {peak} bytes allocated for a {len(data)}-byte file"


def test_a_stream_of_unknown_size_buffers_only_what_arrives():
    """Size unknown (a pipe, a remote stream): the buffer grows with the data that really arrives
    (here 3 MiB after a header claiming 1 TiB), never to the claimed length."""
    data = _bogus_length_frame(1 << 40) + os.urandom(3 << 20)
    tracemalloc.start()
    try:
        reader_ = _tfrecord.RecordReader(io.BytesIO(data), "<pipe>", -1, False, 64 << 10, 1 << 62)
        with pytest.raises(infeed.CorruptRecordError) as info:
            next(reader_)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (info.value.kind, info.value.offset, info.value.path) == ("length_exceeds_file", 0, "<pipe>")
    assert peak < 3 * len(data), peak


BOMB = """
import gzip, resource, struct, sys
import infeed
from infeed.tfrecord import _tfrecord
path, limit = sys.argv[1], int(sys.argv[2])
header = struct.pack("<Q", 1 << 30)                       # a 1 GiB record, in a file of about 1 MB
with gzip.open(path, "wb") as f:
    f.write(header + struct.pack("<I", _tfrecord.masked_crc32c(header)))
    for _ in range(1024):
        f.write(bytes(1 << 20))
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    next(infeed.read_records(path))
except infeed.CorruptRecordError as e:
    print(type(e).__name__, e.kind, e.path, e.offset)
"""


def test_a_small_gzip_file_declaring_a_1_gib_record_is_refused_in_bounded_memory(tmp_path):
    """1 MB on disk, a valid header claiming 1 GiB: refused by max_record_size (256 MiB) before the
    reader reserves or inflates it, under a 1 GiB address-space limit: never MemoryError."""
    path = tmp_path / "bomb.tfrecord.gz"
    out = subprocess.run([sys.executable, "-c", BOMB, str(path), str(1 << 30)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["CorruptRecordError", "record_too_large", str(path), "0"], out.stdout
    assert os.path.getsize(path) < 2 << 20


def test_max_record_size_is_the_readers_to_set():
    records = [b"x" * 100, b"y" * 1000]
    data = b"".join(_tfrecord.frame(r) for r in records)
    assert list(_tfrecord.RecordReader(io.BytesIO(data), "<m>", len(data), False, 64 << 10, 1000)) == records
    reader_ = _tfrecord.RecordReader(io.BytesIO(data), "<m>", len(data), False, 64 << 10, 999)
    assert next(reader_) == records[0]
    with pytest.raises(infeed.CorruptRecordError, match="length 1000, max_record_size 999") as info:
        next(reader_)
    assert (info.value.kind, info.value.record_index, info.value.offset) == ("record_too_large", 1, 116)
    with pytest.raises(ValueError, match="max_record_size"):
        _tfrecord.RecordReader(io.BytesIO(data), "<m>", len(data), False, 64 << 10, -1)


# --- pipes, FIFOs and files being written ----------------------------------------------------------

def test_a_fifo_is_read_to_its_end(tmp_path):
    """A FIFO has no size (fstat says 0): its records are read as they come, to the writer's end."""
    fifo = tmp_path / "records.fifo"
    os.mkfifo(fifo)
    records = [os.urandom(n) for n in (0, 10, 70_000, 3)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        def write():
            with open(fifo, "wb") as f:
                for r in records:
                    f.write(_tfrecord.frame(r))
        done = pool.submit(write)
        assert list(infeed.read_records(fifo, compression=None)) == records
        done.result(timeout=30)


def test_a_file_being_appended_to_yields_its_whole_records_and_names_a_cut_one_truthfully(tmp_path):
    """The size read at open is no limit: records appended since are read, and a record its writer has
    not finished is truncated_data with the bytes really there (never a negative count)."""
    path = tmp_path / "growing.tfrecord"
    first, later = [b"a" * 10, b"b" * 20], [b"c" * 5000, b"d" * 7]
    path.write_bytes(b"".join(_tfrecord.frame(r) for r in first))
    reader_ = infeed.read_records(path, compression=None, buffer_size=64)
    assert [next(reader_) for _ in first] == first
    with open(path, "ab") as f:                                      # appended after the reader opened it
        f.write(b"".join(_tfrecord.frame(r) for r in later))
        f.write(_tfrecord.frame(b"e" * 100)[:50])                   # a record still being written
    assert [next(reader_) for _ in later] == later
    with pytest.raises(infeed.CorruptRecordError) as info:
        next(reader_)
    err = info.value
    assert (err.kind, err.record_index) == ("truncated_data", 4)
    assert "-" not in str(err).split("bytes left")[0].split(",")[-1], str(err)


# --- files that are not TFRecords, damaged compressed streams ------------------------------------

@pytest.mark.parametrize("content, hint", [
    (b"this is a plain text file, not records\n" * 3, "is this a TFRecord file? It starts with b'this is a plain "),
    (b"id,label\n", "is this a TFRecord file? It starts with b'id,label\\n'"),        # shorter than a header
    (b"\xff\xd8\xff\xe0" + b"\0" * 40, "JPEG"),
    (gzip.compress(b"x" * 100, mtime=0), "read it with compression='GZIP'"),
    (zlib.compress(b"x" * 100), "read it with compression='ZLIB'"),
])
def test_a_file_that_is_not_a_tfrecord_fails_at_offset_zero_with_a_hint(tmp_path, content, hint):
    path = tmp_path / "not.tfrecord"
    path.write_bytes(content)
    got, err = _read_until_error(path, compression=None)
    assert got == []
    assert (err.offset, err.record_index, err.path) == (0, 0, str(path))
    assert err.kind in ("length_crc", "truncated_header")
    assert hint in str(err)


def test_a_plain_file_read_as_gzip_fails_at_offset_zero_with_a_hint(tmp_path):
    path = write_records(tmp_path / "plain.tfrecord", SAMPLE_RECORDS)
    got, err = _read_until_error(path, compression="GZIP")
    assert got == []
    assert (err.kind, err.offset, err.record_index) == ("compressed_stream", 0, 0)
    assert "is the file really GZIP-compressed?" in str(err) and "no record was read before it" in str(err)


@pytest.mark.parametrize("compression, wbits", [("GZIP", 31), ("ZLIB", 15)])
def test_damaged_compressed_stream_names_file_and_last_good_record(tmp_path, compression, wbits):
    """Every record before the damaged compressed byte is yielded; the error names the file, the
    last good record, the record's uncompressed offset and the compressed byte."""
    z = zlib.compressobj(wbits=wbits)
    good = z.compress(FRAMED) + z.flush(zlib.Z_FULL_FLUSH)
    path = tmp_path / f"d.tfrecord.{'gz' if compression == 'GZIP' else 'zlib'}"
    path.write_bytes(good + b"\x07" + os.urandom(200))         # 0x07: a final block of reserved type 3
    for buffer_size in (64, 8 << 20):
        got, err = _read_until_error(path, buffer_size=buffer_size)
        assert got == SAMPLE_RECORDS
        assert (err.kind, err.record_index, err.offset, err.path) == ("compressed_stream", 5, len(FRAMED), str(path))
        assert f"invalid block type) at compressed byte {len(good)}" in str(err)
        assert "the last good record is 4" in str(err)


def test_damage_inside_a_deflate_block_still_yields_every_record_before_it(tmp_path):
    records = [os.urandom(2000) for _ in range(50)]
    data = bytearray(gzip.compress(b"".join(_tfrecord.frame(r) for r in records)))
    data[len(data) // 2] ^= 0xFF                            # random data: stored blocks, so a CRC catches it
    path = tmp_path / "r.tfrecord.gz"
    path.write_bytes(bytes(data))
    got, err = _read_until_error(path, buffer_size=1024)
    assert got == records[:len(got)] and err.record_index == len(got)
    assert err.offset == sum(len(r) + 16 for r in got) and err.path == str(path)
    assert err.kind in ("compressed_stream", "data_crc", "length_crc")


def test_gzip_stream_cut_short_names_the_last_good_record(tmp_path):
    records = [os.urandom(2000) for _ in range(50)]
    data = gzip.compress(b"".join(_tfrecord.frame(r) for r in records))
    path = tmp_path / "r.tfrecord.gz"
    path.write_bytes(data[: len(data) - 30])                # the trailer and the end of the last block
    got, err = _read_until_error(path)
    assert got == records[:len(got)] and len(got) >= 45
    assert (err.kind, err.record_index, err.offset) == ("compressed_stream", len(got), sum(len(r) + 16 for r in got))
    assert f"GZIP stream cut short at compressed byte {len(data) - 30}" in str(err)
    assert f"the last good record is {len(got) - 1}" in str(err)


# --- skip_corrupt ---------------------------------------------------------------------------------

def test_skip_corrupt_resynchronises_in_the_same_file_and_counts(tmp_path, caplog):
    def mutate(d):
        d[_offset(1) + 13] ^= 1          # record 1's data
        d[_offset(3) + 3] ^= 1           # record 3's length
    path = _damaged(tmp_path, mutate)
    with caplog.at_level(logging.WARNING, logger="infeed"):
        reader_ = infeed.read_records(path, skip_corrupt=True)
        got = list(reader_)
    assert got == [SAMPLE_RECORDS[0], SAMPLE_RECORDS[2], SAMPLE_RECORDS[4]]
    assert reader_.skipped_regions == 2
    assert reader_.skipped_bytes == len(SAMPLE_RECORDS[1]) + 16 + len(SAMPLE_RECORDS[3]) + 16
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 2
    assert f"at byte offset {_offset(1)}" in warnings[0] and "data does not match" in warnings[0]
    assert f"skipped {len(SAMPLE_RECORDS[1]) + 16} bytes" in warnings[0]
    assert f"at byte offset {_offset(3)}" in warnings[1] and "length field" in warnings[1]


def test_skip_corrupt_with_garbage_between_records(tmp_path):
    framed = [_tfrecord.frame(r) for r in SAMPLE_RECORDS]
    path = tmp_path / "g.tfrecord"
    path.write_bytes(framed[0] + os.urandom(333) + framed[1] + b"\0" * 7 + b"".join(framed[2:]))
    reader_ = infeed.read_records(path, skip_corrupt=True)
    assert list(reader_) == SAMPLE_RECORDS
    assert reader_.skipped_bytes == 340 and reader_.skipped_regions == 2


def test_skip_corrupt_skip_passes_exactly_the_records_a_read_yields(tmp_path):
    """``skip()`` (framing only, used to hand records to other workers and to count them) must agree
    with a read under skip_corrupt, or workers would deliver a record twice or lose one."""
    path = _damaged(tmp_path, lambda d: d.__setitem__(_offset(2) + 30, d[_offset(2) + 30] ^ 1))
    skipping = infeed.read_records(path, skip_corrupt=True)
    assert skipping.skip(3) == 3 and next(skipping) == SAMPLE_RECORDS[4]     # 0, 1, 3 passed: 2 is damaged
    assert skipping.skipped_regions == 1
    counting = infeed.read_records(path, skip_corrupt=True)
    assert counting.skip(100) == 4 == len(list(infeed.read_records(path, skip_corrupt=True)))


def test_dataset_with_skip_corrupt_delivers_every_good_record_once(tmp_path):
    """Through the daemon, two workers: each good record of a damaged file exactly once."""
    path = tmp_path / "d.tfrecord"
    frames = [_tfrecord.frame(infeed.encode_example({"x": [float(i)]})) for i in range(12)]
    data = bytearray(b"".join(frames))
    data[len(frames[0]) * 3 + 20] ^= 1                          # record 3's data
    data[len(frames[0]) * 8 + 2] ^= 1                           # record 8's length
    path.write_bytes(bytes(data))
    ds = infeed.Dataset(str(path), {"x": FixedLen((), "float32")}, 2, skip_corrupt=True, final_batch="pad")
    with infeed.Daemon(ds, num_workers=2, slots=2) as feed:
        got = [float(v) for b in feed for v, pad in zip(np.asarray(b["x"]), np.asarray(b["is_padding"])) if not pad]
    assert got == [float(i) for i in range(12) if i not in (3, 8)]
    assert ds.count_records() == 10


# --- I/O errors -------------------------------------------------------------------------------------

class _FailingStream:
    """A file-like stream that raises ``error`` once ``fail_at`` bytes have been read."""

    def __init__(self, data, fail_at, error):
        self._data, self._pos, self._fail_at, self._error = data, 0, fail_at, error

    def readinto(self, view):
        if self._pos >= self._fail_at:
            raise self._error
        n = min(len(view), self._fail_at - self._pos, len(self._data) - self._pos)
        view[:n] = self._data[self._pos:self._pos + n]
        self._pos += n
        return n

    def read(self, n=-1):
        buf = bytearray(n if n >= 0 else len(self._data))
        return bytes(buf[:self.readinto(memoryview(buf))])

    def close(self):
        pass


@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_an_io_error_mid_read_is_an_oserror_naming_the_file(tmp_path, monkeypatch, compression):
    path = str(tmp_path / "eio.tfrecord")
    data = gzip.compress(FRAMED) if compression else FRAMED
    fail_at = _offset(3) + 100 if compression is None else len(data) // 2
    monkeypatch.setattr(reader, "open_input",
                        lambda p: (_FailingStream(data, fail_at, OSError(errno.EIO, "Input/output error")), len(data)))
    got = []
    with pytest.raises(OSError) as info:
        for r in infeed.read_records(path, compression=compression, buffer_size=64):
            got.append(r)
    err = info.value
    assert not isinstance(err, infeed.CorruptRecordError)
    assert (err.errno, err.filename) == (errno.EIO, path)
    assert got == SAMPLE_RECORDS[:len(got)]
    assert f"reading record {len(got)} at byte offset {_offset(len(got))}" in str(err)
    if compression is None:
        assert len(got) == 3


@pytest.fixture()
def flaky_remote(monkeypatch):
    """``make(data, failures, error)``: a fake remote filesystem behind the URI ``mock://bucket/f``
    whose files raise ``error`` on their first ``failures`` reads in all; counts opens and reads."""
    import pyarrow.fs as pafs

    monkeypatch.setattr(reader, "REMOTE_RETRY_WAIT_S", 0.001)

    class File:
        def __init__(self, fs):
            self.fs, self.pos = fs, 0

        def seek(self, pos):
            self.pos = pos

        def _fail(self):
            self.fs.reads += 1
            if self.fs.failures:
                self.fs.failures -= 1
                raise self.fs.error

        def readinto(self, view):
            self._fail()
            n = min(len(view), len(self.fs.data) - self.pos)
            view[:n] = self.fs.data[self.pos:self.pos + n]
            self.pos += n
            return n

        def read(self, n=None):
            self._fail()
            out = self.fs.data[self.pos:None if n is None else self.pos + n]
            self.pos += len(out)
            return out

        def read_at(self, n, offset):
            self._fail()
            import pyarrow as pa
            return pa.py_buffer(self.fs.data[offset:offset + n])

        def close(self):
            pass

    class FS:
        def __init__(self, data, failures, error):
            self.data, self.failures, self.error, self.reads, self.opens = data, failures, error, 0, 0

        def get_file_info(self, inner):
            return pafs.FileInfo(inner, pafs.FileType.File, size=len(self.data))

        def open_input_file(self, inner):
            self.opens += 1
            return File(self)

    def make(data, failures, error=None):
        fs = FS(data, failures, error or ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
        monkeypatch.setattr(reader, "_filesystem", lambda uri: (fs, uri.split("://", 1)[1]))
        return fs
    return make


def test_remote_reads_retry_transient_errors(flaky_remote, caplog):
    fs = flaky_remote(FRAMED, failures=reader.REMOTE_ATTEMPTS - 1)
    with caplog.at_level(logging.WARNING, logger="infeed"):
        assert list(infeed.read_records("mock://bucket/f.tfrecord", buffer_size=1024)) == SAMPLE_RECORDS
    assert fs.opens == reader.REMOTE_ATTEMPTS                     # each retry on the file opened afresh
    retries = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert len(retries) == reader.REMOTE_ATTEMPTS - 1 and "mock://bucket/f.tfrecord" in retries[0]


def test_remote_reads_give_up_after_bounded_attempts_naming_the_file(flaky_remote):
    uri = "mock://bucket/f.tfrecord"
    fs = flaky_remote(FRAMED, failures=10 ** 9)
    with pytest.raises(ConnectionResetError) as info:
        list(infeed.read_records(uri))
    assert fs.reads == reader.REMOTE_ATTEMPTS
    assert info.value.filename == uri and f"gave up after {reader.REMOTE_ATTEMPTS} attempts" in str(info.value)
    assert "reading record 0 at byte offset 0" in str(info.value)


def test_a_remote_error_without_an_errno_keeps_its_reason_when_located(flaky_remote):
    """pyarrow's errors have no errno: located as they were, they printed "[Errno None] None: '<uri>'"."""
    uri = "mock://bucket/f.tfrecord"
    flaky_remote(FRAMED, failures=10 ** 9, error=OSError("AWS Error UNKNOWN (HTTP status 503) during GetObject"))
    with pytest.raises(OSError) as info:
        list(infeed.read_records(uri))
    assert info.value.filename == uri and "None: " not in str(info.value)
    assert "HTTP status 503" in str(info.value) and f"gave up after {reader.REMOTE_ATTEMPTS} attempts" in str(info.value)


def test_a_remote_file_gone_mid_read_is_not_retried(flaky_remote):
    fs = flaky_remote(FRAMED, failures=1, error=FileNotFoundError(errno.ENOENT, "No such object"))
    with pytest.raises(FileNotFoundError) as info:
        list(infeed.read_records("mock://bucket/f.tfrecord"))
    assert fs.reads == 1 and info.value.filename == "mock://bucket/f.tfrecord"


def test_random_access_reads_retry_then_name_the_file_and_offset(flaky_remote):
    uri = "mock://bucket/f.tfrecord"
    fs = flaky_remote(FRAMED, failures=2)
    f = reader.open_random_access(uri)
    assert f.read_at(_offset(2), 16) == FRAMED[_offset(2):_offset(2) + 16] and fs.reads == 3
    fs.failures = 10 ** 9
    with pytest.raises(OSError) as info:
        f.read_at(_offset(3), 100)
    assert info.value.filename == uri and f"reading 100 bytes at byte offset {_offset(3)}" in str(info.value)
    f.close()


class SlowStore:
    """A remote filesystem whose reads each take ``delay`` seconds (a store's time to first byte); records the
    ranges read and the most reads in flight at once. ``size_known=False``: get_file_info gives no size."""

    def __init__(self, data: bytes, delay: float = 0.02, size_known: bool = True):
        import threading

        self.data, self.delay, self.size_known = data, delay, size_known
        self.ranges, self.in_flight, self.most_in_flight = [], 0, 0
        self.lock = threading.Lock()

    def get_file_info(self, inner):
        import pyarrow.fs as pafs

        return pafs.FileInfo(inner, pafs.FileType.File, size=len(self.data) if self.size_known else None)

    def open_input_file(self, inner):
        store = self

        class File:
            def read_at(self, n, offset):
                with store.lock:
                    store.in_flight += 1
                    store.most_in_flight = max(store.most_in_flight, store.in_flight)
                    store.ranges.append((offset, n))
                time.sleep(store.delay)
                with store.lock:
                    store.in_flight -= 1
                return store.data[offset:offset + n]

            def close(self):
                pass
        return File()


@pytest.mark.parametrize("size_known", [True, False])
def test_a_remote_file_is_read_in_ranges_requested_ahead_of_the_reader(monkeypatch, size_known):
    records = [bytes([k % 251]) * (100 + 37 * k) for k in range(300)]
    data = b"".join(_tfrecord.frame(r) for r in records)
    store = SlowStore(data, size_known=size_known)
    monkeypatch.setattr(reader, "_filesystem", lambda uri: (store, uri.split("://", 1)[1]))
    monkeypatch.setattr(reader, "READ_AHEAD_BYTES", 16 << 10)
    assert list(infeed.read_records("mock://bucket/big.tfrecord", buffer_size=4096)) == records
    ranges = sorted(store.ranges)
    assert [offset for offset, _ in ranges] == list(range(0, ranges[-1][0] + 1, 16 << 10))     # each range once
    if size_known:
        assert [n for _, n in ranges] == [16 << 10] * (len(ranges) - 1) + [len(data) - ranges[-1][0]]
    else:                             # whole ranges until one comes back short (and at most the ones in flight)
        assert {n for _, n in ranges} == {16 << 10} and ranges[-1][0] < len(data) + (16 << 10) * reader.READ_AHEAD_RANGES
    assert store.most_in_flight == reader.READ_AHEAD_RANGES       # ahead of the reader, and no further


def test_a_remote_batchs_indexed_reads_are_in_flight_together_and_adjacent_batches_share_one(monkeypatch, tmp_path):
    from infeed.daemon.indexed_reads import IndexedFiles
    from infeed.daemon.read_ahead import ReadAhead
    from infeed.tfrecord.index import build_index

    records = [bytes([k]) * (50 + k) for k in range(40)]
    local = tmp_path / "f.tfrecord"
    local.write_bytes(b"".join(_tfrecord.frame(r) for r in records))
    index = build_index(str(local))
    store = SlowStore(local.read_bytes())
    monkeypatch.setattr(reader, "_filesystem", lambda uri: (store, uri.split("://", 1)[1]))
    files = IndexedFiles(["mock://bucket/f.tfrecord"], [index], ReadAhead(remote=True))
    order = [7, 3, 30, 12, 25, 0]                                  # six records, none adjacent: six reads
    try:
        first = files.start(files.runs(np.zeros(6, np.int64), np.array(order), 6))
        second = files.start(files.runs(np.zeros(2, np.int64), np.array([20, 21]), 2))       # adjacent: one read
        assert [bytes(r) for r in first.records(0)] == [records[k] for k in order]
        assert [bytes(r) for r in second.records(0)] == records[20:22]
        assert len(store.ranges) == 7 and store.most_in_flight > 1
        # Three batches started together whose records follow each other in the file: one read, each batch's
        # records apart.
        group = files.start(files.runs(np.zeros(9, np.int64), np.arange(31, 40), 3))
        assert [[bytes(r) for r in group.records(j)] for j in range(3)] == [records[31:34], records[34:37],
                                                                            records[37:40]]
        assert len(store.ranges) == 8
    finally:
        files.close()


# --- the decoder ------------------------------------------------------------------------------------

def _varint(value):
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def _ld(field, payload):
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _example(*entries):
    return _ld(1, b"".join(_ld(1, e) for e in entries))


GOOD_ENTRY = _ld(1, b"k") + _ld(2, _ld(3, _ld(1, _varint(5))))        # "k": int64_list packed [5]


@pytest.mark.parametrize("record, what", [
    (b"\x80" * 10 + b"\x00", "varint longer than 64 bits"),                                  # 11-byte tag
    (_example(_ld(1, b"k") + _ld(2, _ld(3, b"\x08" + b"\xff" * 9 + b"\x02"))), "varint longer than 64 bits"),
    (b"\x0a" + b"\x80" * 10 + b"\x00", "varint longer than 64 bits"),                        # 11-byte length
    (b"\x0a\x05\x0a\x01", "length runs past the end of its message"),
    (b"\x0a" + b"\xff" * 9 + b"\x01", "length runs past the end of its message"),            # 2**64 - 1
    (_ld(1, b"\x0a\x09" + GOOD_ENTRY[:5]) + GOOD_ENTRY, "length runs past the end of its message"),
    (_example(_ld(1, b"k") + b"\x12\x40" + _ld(3, b"")), "length runs past the end of its message"),
    (_example(_ld(1, b"k") + _ld(2, b"\x1a\x10\x0a\x01\x01")), "length runs past the end of its message"),
    (_example(_ld(1, b"k") + _ld(2, _ld(3, b"\x0a\x08\x01"))), "length runs past the end of its message"),
])
def test_malformed_wire_format_is_a_decode_error_saying_what(record, what):
    """Over-long varints, lengths past the end of the record and nested lengths overflowing their
    parent: DecodeError with the record index and what was wrong, in both decoders."""
    with pytest.raises(infeed.DecodeError) as info:
        infeed.decode_example(record, 7)
    assert info.value.record_index == 7 and what in str(info.value)
    parser = infeed.ExampleParser({"k": VarLen("int64", max_len=4)})
    with pytest.raises(infeed.DecodeError) as info:
        parser.parse([_example(GOOD_ENTRY), record], index_base=40)
    err = info.value
    assert err.record_index == 41 and f"invalid protobuf: {what}" in str(err)
    assert err.offset is not None and 0 <= err.offset <= len(record)


SPEC = {"v": VarLen("int32", max_len=2), "b": Bytes(3), "f": FixedLen((2,), "float32")}
GOOD = {"v": [1], "b": [b"ab"], "f": np.ones(2, np.float32)}


@pytest.mark.parametrize("change, feature, expected, found", [
    ({"b": np.ones(1, np.float32)}, "b", "bytes values", "float values"),                     # wrong type
    ({"f": [1, 2]}, "f", "float values", "int64 values"),
    ({"f": np.ones(3, np.float32)}, "f", "2 float values", "3"),                              # wrong count
    ({"v": [1, 2, 3]}, "v", "at most 2 values", "3"),
    ({"b": [b"abcd"]}, "b", "at most 3 bytes", "4"),
    ({"v": [2 ** 31]}, "v", "values that fit int32", str(2 ** 31)),
    ({"f": None}, "f", "required", "no such feature"),
])
def test_wrong_types_and_counts_are_decode_errors_naming_the_feature(change, feature, expected, found):
    example = {**GOOD, **change}
    record = infeed.encode_example({k: v for k, v in example.items() if v is not None})
    with pytest.raises(infeed.DecodeError) as info:
        infeed.ExampleParser(SPEC).parse([infeed.encode_example(GOOD), record], index_base=10)
    err = info.value
    assert (err.feature, err.record_index) == (feature, 11)
    assert expected in str(err.expected) and found in str(err.found)
    assert "record 11" in str(err) and f"feature {feature!r}" in str(err)


CANARY = 0x5A


def _canaried(parser, rows):
    out = parser.allocate(rows)
    for arr in out.values():
        for part in ((arr.values, arr.lengths) if isinstance(arr, Padded) else (arr,)):
            part.view(np.uint8)[...] = CANARY
    return out


def _assert_only_row_written(out, row):
    for name, arr in out.items():
        for part in ((arr.values, arr.lengths) if isinstance(arr, Padded) else (arr,)):
            others = np.delete(part.view(np.uint8).reshape(len(part), -1), row, axis=0)
            assert (others == CANARY).all(), f"{name!r}: a byte outside row {row} was written"


DAMAGED_RECORDS = {
    "truncated": infeed.encode_example(GOOD)[:-3],
    "too many values": infeed.encode_example({**GOOD, "v": [1, 2, 3]}),
    "too many bytes": infeed.encode_example({**GOOD, "b": [b"abcdefgh" * 100]}),
    "too many floats": infeed.encode_example({**GOOD, "f": np.ones(1000, np.float32)}),
    "wrong type": infeed.encode_example({**GOOD, "f": [b"xy"]}),
    "out of range": infeed.encode_example({**GOOD, "v": [-2 ** 40]}),
    "missing": infeed.encode_example({"v": GOOD["v"], "b": GOOD["b"]}),
    "garbage": bytes(random.Random(1).randbytes(300)),
    "good": infeed.encode_example(GOOD),
}


@pytest.mark.parametrize("name", sorted(DAMAGED_RECORDS))
def test_canary_bytes_around_an_output_row_are_never_touched(tmp_path, name):
    """A record decoded into row 2 of 5 writes nothing outside that row, whether it is good or
    damaged, from a list of records (parse) or in place in the reader's buffer (read_into)."""
    record = DAMAGED_RECORDS[name]
    parser = infeed.ExampleParser(SPEC)
    out = _canaried(parser, 5)
    try:
        parser.parse([record], out=out, start=2)
    except infeed.DecodeError as e:
        assert name != "good" and e.record_index == 0
    else:
        assert name == "good" and out["v"].lengths[2] == 1
    _assert_only_row_written(out, 2)
    path = write_records(tmp_path / "r.tfrecord", [record])
    out = _canaried(parser, 5)
    try:
        assert parser.read_into(infeed.read_records(path), 1, out, start=2) == (1, len(record))
    except infeed.DecodeError as e:
        assert name != "good" and e.record_index == 0
    _assert_only_row_written(out, 2)


def test_ten_megabytes_of_garbage_give_a_short_message():
    garbage = random.Random(5).randbytes(10 << 20)
    parser = infeed.ExampleParser({"k": VarLen("int64", max_len=4)})
    for record in (garbage, b"\x0a" + _varint(len(garbage)) + garbage, b"\x0a\xff\xff\xff\x7f" + garbage):
        for decode in (infeed.decode_example, lambda r: parser.parse([r])):
            with pytest.raises(infeed.DecodeError) as info:
                decode(record)
            assert len(str(info.value)) < 1024, str(info.value)[:200]


# --- bounded property tests (hypothesis) -------------------------------------------------------------

@BOUNDED
@given(records=st.lists(st.binary(max_size=300), min_size=1, max_size=6), data=st.data(),
       size_known=st.booleans(), buffer_size=st.sampled_from([64, 100, 4096]))
def test_any_byte_flip_is_located_or_skipped_exactly(records, data, size_known, buffer_size):
    """A flip anywhere: the reader yields the records before the damaged frame, then raises for that
    frame's index and offset; with skip_corrupt it yields every other record and counts the frame."""
    framed = [_tfrecord.frame(r) for r in records]
    blob = bytearray(b"".join(framed))
    pos = data.draw(st.integers(0, len(blob) - 1))
    blob[pos] ^= 1 << data.draw(st.integers(0, 7))
    starts = np.cumsum([0] + [len(f) for f in framed])
    hit = int(np.searchsorted(starts, pos, side="right") - 1)

    def run(skip):
        got = []
        r = _tfrecord.RecordReader(io.BytesIO(bytes(blob)), "<flip>", len(blob) if size_known else -1, skip, buffer_size)
        try:
            for x in r:
                got.append(x)
        except infeed.CorruptRecordError as e:
            return got, e, r
        return got, None, r

    got, err, _ = run(False)
    assert got == records[:hit]
    assert err is not None and (err.record_index, err.offset) == (hit, int(starts[hit]))
    assert err.kind in infeed.errors.CORRUPTION_KINDS
    got, err, r = run(True)
    assert err is None
    # a flip can, rarely, make a valid frame of the damaged bytes' tail: then more is kept, never less
    kept = records[:hit] + records[hit + 1:]
    assert got == kept or (r.skipped_bytes + sum(len(x) + 16 for x in got) == len(blob))
    assert r.skipped_regions == 1


@BOUNDED
@given(record=st.binary(max_size=200) | st.builds(lambda r, cut: r[:cut],
       st.just(infeed.encode_example({**GOOD, "v": [3, 4]})), st.integers(0, 60)),
       row=st.integers(0, 3))
def test_arbitrary_bytes_decode_or_raise_decode_error_within_their_row(record, row):
    parser = infeed.ExampleParser(SPEC)
    out = _canaried(parser, 4)
    try:
        parser.parse([record], out=out, start=row, index_base=3)
    except infeed.DecodeError as e:
        assert e.record_index == 3 and len(str(e)) < 1024
    _assert_only_row_written(out, row)


def test_follow_waits_for_a_record_still_being_written_and_reports_a_cut_one_once_its_writer_closed(tmp_path):
    """follow=True: a record cut by the end of the file is waited for while a writer has the file open
    (the reader knows it by a read lease it cannot take), and is truncated_data once none has."""
    path = tmp_path / "live.tfrecord"
    done, cut = _tfrecord.frame(b"a" * 10), _tfrecord.frame(b"b" * 300)
    writer = open(path, "wb", buffering=0)
    writer.write(done + cut[:100])
    reader_ = infeed.read_records(path, compression=None, buffer_size=64, follow=True)
    assert next(reader_) == b"a" * 10
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(next, reader_)
        time.sleep(0.3)
        assert not waiting.done()                                   # the writer still has it open: it waits
        writer.write(cut[100:] + _tfrecord.frame(b"c") + b"\x05\x00")
        assert waiting.result(timeout=30) == b"b" * 300
        assert next(reader_) == b"c"
        stuck = pool.submit(next, reader_)                           # 2 bytes of a header, writer open
        time.sleep(0.3)
        assert not stuck.done()
        writer.close()
        with pytest.raises(infeed.CorruptRecordError) as info:
            stuck.result(timeout=30)
    assert (info.value.kind, info.value.record_index) == ("truncated_header", 3)
    # without follow, the same cut record is reported at once
    reader_ = infeed.read_records(path, compression=None)
    assert [next(reader_) for _ in range(3)] == [b"a" * 10, b"b" * 300, b"c"]
    with pytest.raises(infeed.CorruptRecordError, match="2 of 12 header bytes"):
        next(reader_)
