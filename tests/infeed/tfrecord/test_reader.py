"""read_records and TFRecordWriter: framing, compression, damage, remote paths."""

import gzip
import io
import os
import struct
import zlib

import pytest

import infeed
from infeed.tfrecord import _tfrecord
from tfrecord_files import SAMPLE_RECORDS, write_records


def test_crc32c_matches_the_standard_check_value():
    assert _tfrecord.crc32c(b"123456789") == 0xE3069283
    assert _tfrecord.crc32c_table(b"123456789") == 0xE3069283
    assert _tfrecord.crc32c(b"") == 0


def test_crc32c_extends_over_pieces():
    data = os.urandom(1000)
    assert _tfrecord.crc32c(data[300:], _tfrecord.crc32c(data[:300])) == _tfrecord.crc32c(data)


def test_frame_is_the_tfrecord_layout():
    data = b"payload"
    framed = _tfrecord.frame(data)
    length = struct.pack("<Q", len(data))
    assert framed[:8] == length
    assert struct.unpack("<I", framed[8:12])[0] == _tfrecord.masked_crc32c(length)
    assert framed[12:-4] == data
    assert struct.unpack("<I", framed[-4:])[0] == _tfrecord.masked_crc32c(data)


@pytest.mark.parametrize("compression", [None, "GZIP", "ZLIB"])
def test_written_records_read_back(tmp_path, compression):
    path = write_records(tmp_path / "r.tfrecord", SAMPLE_RECORDS, compression)
    assert list(infeed.read_records(path, compression=compression)) == SAMPLE_RECORDS
    assert list(infeed.read_records(path)) == SAMPLE_RECORDS            # auto: sniffed


@pytest.mark.parametrize("buffer_size", [64, 100, 4096])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_records_larger_than_the_buffer_straddle_it(tmp_path, buffer_size, compression):
    records = [os.urandom(n) for n in (0, 1, 63, 64, 65, 700, 10_000, 3)]
    path = write_records(tmp_path / "r.tfrecord", records, compression)
    assert list(infeed.read_records(path, buffer_size=buffer_size)) == records


def test_buffer_size_below_a_header_is_refused(tmp_path):
    path = write_records(tmp_path / "r.tfrecord", SAMPLE_RECORDS)
    with pytest.raises(ValueError, match="buffer_size"):
        infeed.read_records(path, buffer_size=8)


def test_empty_file_has_no_records(tmp_path):
    (tmp_path / "e.tfrecord").write_bytes(b"")
    assert list(infeed.read_records(tmp_path / "e.tfrecord")) == []


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        infeed.read_records(tmp_path / "nope.tfrecord")
    with pytest.raises(FileNotFoundError):
        infeed.read_records((tmp_path / "nope.tfrecord").as_uri())


def test_unknown_compression_is_refused(tmp_path):
    with pytest.raises(ValueError, match="compression"):
        infeed.read_records(tmp_path / "x", compression="BZIP2")
    with pytest.raises(ValueError, match="compression"):
        infeed.TFRecordWriter(tmp_path / "x", compression="gzip")


def test_uris_go_through_pyarrow_filesystems(tmp_path):
    path = write_records(tmp_path / "r.tfrecord.gz", SAMPLE_RECORDS, "GZIP")
    assert list(infeed.read_records(path.as_uri())) == SAMPLE_RECORDS
    out = (tmp_path / "w.tfrecord").as_uri()
    write_records(out, SAMPLE_RECORDS)
    assert list(infeed.read_records(tmp_path / "w.tfrecord")) == SAMPLE_RECORDS


def test_gzip_written_by_python_gzip_reads(tmp_path):
    """Any GZIP writer, including concatenated members (as `cat a.gz b.gz` makes)."""
    framed = b"".join(_tfrecord.frame(r) for r in SAMPLE_RECORDS)
    path = tmp_path / "cat.tfrecord.gz"
    path.write_bytes(gzip.compress(framed[:100]) + gzip.compress(framed[100:]))
    assert list(infeed.read_records(path)) == SAMPLE_RECORDS


def test_read_batch_returns_up_to_n_records(tmp_path):
    path = write_records(tmp_path / "r.tfrecord", SAMPLE_RECORDS)
    reader = infeed.read_records(path)
    assert reader.read_batch(2) == SAMPLE_RECORDS[:2]
    assert reader.read_batch(10) == SAMPLE_RECORDS[2:]
    assert reader.read_batch(10) == []


def test_read_batch_of_zero_reads_nothing_and_negative_is_refused(tmp_path):
    reader = infeed.read_records(write_records(tmp_path / "r.tfrecord", SAMPLE_RECORDS))
    assert reader.read_batch(0) == []
    with pytest.raises(ValueError, match="max_records"):
        reader.read_batch(-1)
    assert list(reader) == SAMPLE_RECORDS


def test_tell_is_the_offset_of_the_next_record(tmp_path):
    path = write_records(tmp_path / "r.tfrecord", SAMPLE_RECORDS)
    reader = infeed.read_records(path)
    offsets = [reader.tell()]
    for _ in reader:
        offsets.append(reader.tell())
    assert offsets == [sum(len(r) + 16 for r in SAMPLE_RECORDS[:i]) for i in range(len(SAMPLE_RECORDS) + 1)]


def test_writer_refuses_writes_after_close(tmp_path):
    w = infeed.TFRecordWriter(tmp_path / "w.tfrecord")
    w.write(b"x")
    w.close()
    w.close()                                        # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write(b"y")
    assert w.records_written == 1


@pytest.mark.parametrize("use", [lambda w: w.flush(), lambda w: w.write(b"y"), lambda w: w.__enter__()])
def test_a_closed_writer_refuses_io_as_python_files_do_naming_the_path(tmp_path, use):
    w = infeed.TFRecordWriter(tmp_path / "w.tfrecord", compression="GZIP")
    w.close()
    with pytest.raises(ValueError, match="I/O operation on closed file") as info:
        use(w)
    assert str(tmp_path / "w.tfrecord") in str(info.value)


@pytest.mark.parametrize("call, error, message", [
    (lambda p: infeed.read_records(None), TypeError, "path must be a str or os.PathLike path or URI, got None"),
    (lambda p: infeed.read_records(5), TypeError, "path must be .* got 5"),
    (lambda p: infeed.read_records(p, compression=[]), ValueError, "compression must be one of"),
    (lambda p: infeed.read_records(p, buffer_size=None), TypeError, "buffer_size must be an int, got None"),
    (lambda p: infeed.read_records(p, buffer_size="big"), TypeError, "buffer_size must be an int"),
    (lambda p: infeed.TFRecordWriter(None), TypeError, "path must be .* got None"),
    (lambda p: infeed.TFRecordWriter(p, compression="GZIP", level=99), ValueError, "level must be an int from 0 to 9"),
    (lambda p: infeed.TFRecordWriter(p, level="fast"), ValueError, "level must be"),
    (lambda p: infeed.TFRecordWriter(p).write(None), TypeError, "w.tfrecord: a record must be bytes-like, got NoneType"),
    (lambda p: infeed.TFRecordWriter(p).write("text"), TypeError, "a record must be bytes-like, got str"),
])
def test_bad_arguments_to_readers_and_writers_name_the_argument_or_file(tmp_path, call, error, message):
    path = write_records(tmp_path / "w.tfrecord", SAMPLE_RECORDS)
    with pytest.raises(error, match=message):
        call(path)


@pytest.mark.parametrize("compression", ["", None])
def test_an_empty_compression_is_tensorflows_spelling_of_none(tmp_path, compression):
    path = tmp_path / "w.tfrecord"
    with infeed.TFRecordWriter(path, compression=compression) as w:
        assert w.compression is None
        for record in SAMPLE_RECORDS:
            w.write(record)
    assert path.read_bytes() == b"".join(_tfrecord.frame(r) for r in SAMPLE_RECORDS)
    assert list(infeed.read_records(path, compression=compression)) == SAMPLE_RECORDS
    gz = write_records(tmp_path / "g.tfrecord", SAMPLE_RECORDS, "GZIP")
    with pytest.raises(infeed.CorruptRecordError, match="starts like GZIP"):
        list(infeed.read_records(gz, compression=compression))          # no compression, not "auto"


def test_flush_makes_compressed_records_readable_before_close(tmp_path):
    w = infeed.TFRecordWriter(tmp_path / "w.tfrecord.zlib", compression="ZLIB")
    w.write(b"first")
    w.flush()
    data = (tmp_path / "w.tfrecord.zlib").read_bytes()
    d = zlib.decompressobj()
    assert d.decompress(data)[12:17] == b"first"
    w.close()


def test_reader_reads_any_stream_with_readinto():
    data = b"".join(_tfrecord.frame(r) for r in SAMPLE_RECORDS)
    reader = _tfrecord.RecordReader(io.BytesIO(data), "<memory>", len(data), False, 64)
    assert list(reader) == SAMPLE_RECORDS


def test_a_damaged_plain_file_that_starts_like_zlib_is_read_as_plain(tmp_path):
    """Sniffing inflates the first bytes: a ZLIB-looking magic alone does not switch compression."""
    data = bytearray(b"".join(_tfrecord.frame(b"rec%d" % i) for i in range(5)))
    data[:2] = b"\x78\x9c"
    path = tmp_path / "noext"
    path.write_bytes(bytes(data))
    reader = infeed.read_records(path, skip_corrupt=True)
    assert list(reader) == [b"rec%d" % i for i in range(1, 5)]
    with pytest.raises(infeed.CorruptRecordError) as info:
        list(infeed.read_records(path))
    assert info.value.kind == "length_crc" and info.value.offset == 0
