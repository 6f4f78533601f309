"""read_records and TFRecordWriter: framing, compression, damage, remote paths."""

import gzip
import io
import logging
import os
import struct
import zlib

import pytest

import infeed
from infeed import _tfrecord


def _write(path, records, compression=None):
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for r in records:
            w.write(r)
    return path


RECORDS = [b"", b"a", b"hello world" * 10, os.urandom(5000), bytes(range(256)) * 3]


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
    path = _write(tmp_path / "r.tfrecord", RECORDS, compression)
    assert list(infeed.read_records(path, compression=compression)) == RECORDS
    assert list(infeed.read_records(path)) == RECORDS            # auto: sniffed


@pytest.mark.parametrize("buffer_size", [64, 100, 4096])
@pytest.mark.parametrize("compression", [None, "GZIP"])
def test_records_larger_than_the_buffer_straddle_it(tmp_path, buffer_size, compression):
    records = [os.urandom(n) for n in (0, 1, 63, 64, 65, 700, 10_000, 3)]
    path = _write(tmp_path / "r.tfrecord", records, compression)
    assert list(infeed.read_records(path, buffer_size=buffer_size)) == records


def test_buffer_size_below_a_header_is_refused(tmp_path):
    path = _write(tmp_path / "r.tfrecord", RECORDS)
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
    path = _write(tmp_path / "r.tfrecord.gz", RECORDS, "GZIP")
    assert list(infeed.read_records(path.as_uri())) == RECORDS
    out = (tmp_path / "w.tfrecord").as_uri()
    _write(out, RECORDS)
    assert list(infeed.read_records(tmp_path / "w.tfrecord")) == RECORDS


def test_gzip_written_by_python_gzip_reads(tmp_path):
    """Any GZIP writer, including concatenated members (as `cat a.gz b.gz` makes)."""
    framed = b"".join(_tfrecord.frame(r) for r in RECORDS)
    path = tmp_path / "cat.tfrecord.gz"
    path.write_bytes(gzip.compress(framed[:100]) + gzip.compress(framed[100:]))
    assert list(infeed.read_records(path)) == RECORDS


def test_read_batch_returns_up_to_n_records(tmp_path):
    path = _write(tmp_path / "r.tfrecord", RECORDS)
    reader = infeed.read_records(path)
    assert reader.read_batch(2) == RECORDS[:2]
    assert reader.read_batch(10) == RECORDS[2:]
    assert reader.read_batch(10) == []


def test_read_batch_of_zero_reads_nothing_and_negative_is_refused(tmp_path):
    reader = infeed.read_records(_write(tmp_path / "r.tfrecord", RECORDS))
    assert reader.read_batch(0) == []
    with pytest.raises(ValueError, match="max_records"):
        reader.read_batch(-1)
    assert list(reader) == RECORDS


def test_tell_is_the_offset_of_the_next_record(tmp_path):
    path = _write(tmp_path / "r.tfrecord", RECORDS)
    reader = infeed.read_records(path)
    offsets = [reader.tell()]
    for _ in reader:
        offsets.append(reader.tell())
    assert offsets == [sum(len(r) + 16 for r in RECORDS[:i]) for i in range(len(RECORDS) + 1)]


# --- damage ----------------------------------------------------------------------------------

def _damaged(tmp_path, mutate, name="d.tfrecord"):
    data = bytearray(b"".join(_tfrecord.frame(r) for r in RECORDS))
    mutate(data)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def _offset(i):
    return sum(len(r) + 16 for r in RECORDS[:i])


@pytest.mark.parametrize("kind, mutate", [
    ("length_crc", lambda d: d.__setitem__(_offset(3) + 2, d[_offset(3) + 2] ^ 1)),        # length byte
    ("length_crc", lambda d: d.__setitem__(_offset(3) + 9, d[_offset(3) + 9] ^ 0x80)),     # its CRC
    ("data_crc", lambda d: d.__setitem__(_offset(3) + 20, d[_offset(3) + 20] ^ 4)),        # data
    ("data_crc", lambda d: d.__setitem__(_offset(4) - 1, d[_offset(4) - 1] ^ 4)),          # data CRC
])
def test_each_damage_names_file_record_offset_and_kind(tmp_path, kind, mutate):
    path = _damaged(tmp_path, mutate)
    got = []
    with pytest.raises(infeed.CorruptRecordError) as info:
        for r in infeed.read_records(path):
            got.append(r)
    err = info.value
    assert got == RECORDS[:3]
    assert (err.kind, err.record_index, err.offset, err.path) == (kind, 3, _offset(3), str(path))
    assert f"{path}: corrupt record 3 at byte offset {_offset(3)}" in str(err)


def test_truncations_are_named_for_what_was_cut(tmp_path):
    full = b"".join(_tfrecord.frame(r) for r in RECORDS)
    cases = {_offset(4) + 5: "truncated_header", _offset(4) + 20: "truncated_data", _offset(5) - 1: "truncated_data"}
    for cut, kind in cases.items():
        path = tmp_path / f"cut{cut}.tfrecord"
        path.write_bytes(full[:cut])
        with pytest.raises(infeed.CorruptRecordError) as info:
            list(infeed.read_records(path))
        assert (info.value.kind, info.value.record_index, info.value.offset) == (kind, 4, _offset(4))


def test_a_length_beyond_the_file_is_never_allocated(tmp_path):
    """A valid-CRC length of 2**60 must fail at once, not try to buffer an exabyte."""
    length = struct.pack("<Q", 1 << 60)
    frame = length + struct.pack("<I", _tfrecord.masked_crc32c(length)) + b"x" * 100
    for compression in (None, "GZIP"):
        path = _write(tmp_path / f"big{compression}.tfrecord", [b"ok"], compression)
        raw = gzip.decompress(path.read_bytes()) if compression else path.read_bytes()
        data = raw + frame
        path.write_bytes(gzip.compress(data) if compression else data)
        reader = infeed.read_records(path)
        assert next(reader) == b"ok"
        with pytest.raises(infeed.CorruptRecordError) as info:
            next(reader)
        assert info.value.kind == "length_exceeds_file" and info.value.record_index == 1


def test_damaged_gzip_stream_names_file_and_last_good_record(tmp_path):
    path = _write(tmp_path / "r.tfrecord.gz", [os.urandom(2000) for _ in range(50)], "GZIP")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(infeed.CorruptRecordError) as info:
        list(infeed.read_records(path, buffer_size=1024))
    assert info.value.kind in ("compressed_stream", "data_crc", "length_crc")
    assert str(path) in str(info.value)


def test_gzip_stream_cut_short_is_reported(tmp_path):
    path = _write(tmp_path / "r.tfrecord.gz", [os.urandom(2000) for _ in range(50)], "GZIP")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 30])
    with pytest.raises(infeed.CorruptRecordError) as info:
        list(infeed.read_records(path))
    assert info.value.kind in ("compressed_stream", "truncated_data", "truncated_header")


@pytest.mark.parametrize("content, hint", [
    (b"this is a plain text file, not records\n" * 3, "is this a TFRecord file"),
    (b"\xff\xd8\xff\xe0" + b"\0" * 40, "JPEG"),
    (gzip.compress(b"x" * 100), "GZIP"),
])
def test_a_file_that_is_not_a_tfrecord_fails_at_offset_zero_with_a_hint(tmp_path, content, hint):
    path = tmp_path / "not.tfrecord"
    path.write_bytes(content)
    with pytest.raises(infeed.CorruptRecordError) as info:
        list(infeed.read_records(path, compression=None))
    assert info.value.offset == 0 and info.value.record_index == 0
    assert hint in str(info.value)


def test_skip_corrupt_resynchronises_in_the_same_file_and_counts(tmp_path, caplog):
    def mutate(d):
        d[_offset(1) + 13] ^= 1          # record 1's data
        d[_offset(3) + 3] ^= 1           # record 3's length
    path = _damaged(tmp_path, mutate)
    with caplog.at_level(logging.WARNING, logger="infeed"):
        reader = infeed.read_records(path, skip_corrupt=True)
        got = list(reader)
    assert got == [RECORDS[0], RECORDS[2], RECORDS[4]]
    assert reader.skipped_regions == 2
    assert reader.skipped_bytes == len(RECORDS[1]) + 16 + len(RECORDS[3]) + 16
    assert len([r for r in caplog.records if "skipped" in r.getMessage()]) == 2


def test_skip_corrupt_with_garbage_between_records(tmp_path):
    framed = [_tfrecord.frame(r) for r in RECORDS]
    path = tmp_path / "g.tfrecord"
    path.write_bytes(framed[0] + os.urandom(333) + framed[1] + b"\0" * 7 + b"".join(framed[2:]))
    reader = infeed.read_records(path, skip_corrupt=True)
    assert list(reader) == RECORDS
    assert reader.skipped_bytes == 340 and reader.skipped_regions == 2


def test_writer_refuses_writes_after_close(tmp_path):
    w = infeed.TFRecordWriter(tmp_path / "w.tfrecord")
    w.write(b"x")
    w.close()
    w.close()                                        # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write(b"y")
    assert w.records_written == 1


def test_flush_makes_compressed_records_readable_before_close(tmp_path):
    w = infeed.TFRecordWriter(tmp_path / "w.tfrecord.zlib", compression="ZLIB")
    w.write(b"first")
    w.flush()
    data = (tmp_path / "w.tfrecord.zlib").read_bytes()
    d = zlib.decompressobj()
    assert d.decompress(data)[12:17] == b"first"
    w.close()


def test_reader_reads_any_stream_with_readinto():
    data = b"".join(_tfrecord.frame(r) for r in RECORDS)
    reader = _tfrecord.RecordReader(io.BytesIO(data), "<memory>", len(data), False, 64)
    assert list(reader) == RECORDS


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
