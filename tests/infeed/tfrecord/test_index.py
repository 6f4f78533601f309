"""Record-offset sidecars: building, the binary format, untrusted loading, and ``infeed index``."""

import json
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

import infeed
from infeed.commands.cli import main
from infeed.errors import IndexFileError
from infeed.tfrecord import _tfrecord
from infeed.tfrecord.index import (BatchRuns, RecordIndex, build_index, index_path, indexed_runs, load_index, read_indexed,
                                  write_index)
from tfrecord_files import write_records

RECORDS = [infeed.encode_example({"x": list(range(n)), "id": b"r%d" % n}) for n in (0, 1, 7, 300)] + [b"", b"z"]
HEADER = struct.Struct("<8sIIQQI4x")


def _write(path, records=RECORDS, compression=None):
    return str(write_records(path, records, compression))


def _walk_framing(data: bytes):
    """(offsets, lengths) by following each record's length field."""
    offsets, lengths, pos = [], [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        offsets.append(pos)
        lengths.append(n)
        pos += 12 + n + 4
    return offsets, lengths


def test_offsets_and_lengths_follow_the_framing_and_read_the_records(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    data = Path(path).read_bytes()
    assert index.count == len(RECORDS) and index.file_size == len(data)
    assert (index.offsets.tolist(), index.lengths.tolist()) == _walk_framing(data)
    assert write_index(index) == index_path(path) == path + ".index"
    loaded = load_index(path)
    assert loaded.path == path and loaded.file_size == len(data)
    assert loaded.offsets.dtype == loaded.lengths.dtype == np.int64
    assert np.array_equal(loaded.offsets, index.offsets) and np.array_equal(loaded.lengths, index.lengths)
    fd = os.open(path, os.O_RDONLY)
    try:
        read = [os.pread(fd, n, off + 12) for off, n in zip(loaded.offsets.tolist(), loaded.lengths.tolist())]
    finally:
        os.close(fd)
    assert read == list(infeed.read_records(path)) == RECORDS


def test_the_sidecar_is_a_small_header_one_uint64_offset_and_one_uint32_data_crc_per_record(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    raw = Path(write_index(build_index(path))).read_bytes()
    magic, version, flags, size, count, crc = HEADER.unpack_from(raw)
    assert (magic, version, flags, size, count) == (b"INFEEDIX", 2, 0, os.path.getsize(path), len(RECORDS))
    assert len(raw) == HEADER.size + 12 * count and crc == _tfrecord.crc32c(raw[HEADER.size:])
    crcs = np.frombuffer(raw, "<u4", count, HEADER.size + 8 * count)
    assert crcs.tolist() == [_tfrecord.masked_crc32c(r) for r in RECORDS]        # as each record's footer holds it
    assert load_index(path).data_crcs.tolist() == crcs.tolist()


def test_a_version_1_sidecar_without_data_crcs_is_still_read_and_written(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    raw = Path(write_index(index._replace(data_crcs=None))).read_bytes()
    assert HEADER.unpack_from(raw)[1] == 1 and len(raw) == HEADER.size + 8 * len(RECORDS)
    loaded = load_index(path)
    assert loaded.data_crcs is None and np.array_equal(loaded.offsets, index.offsets)
    paths = [path]
    with open(path, "rb") as f:
        data = f.read()
    assert read_indexed(lambda f, o, n: data[o:o + n], paths, [loaded].__getitem__, [0] * 6, range(6)) == RECORDS


def test_a_record_rewritten_in_place_after_indexing_is_a_source_change_never_its_new_value(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    data = bytearray(Path(path).read_bytes())
    k = 2                                                  # same length, other bytes, both CRCs valid
    other = infeed.encode_example({"x": [9] * 7, "id": b"r7"})
    assert len(other) == len(RECORDS[k]) and other != RECORDS[k]
    start = int(index.offsets[k])
    data[start:start + 16 + len(other)] = _tfrecord.frame(other)
    read_at = lambda f, o, n: bytes(data[o:o + n])
    assert read_indexed(read_at, [path], [index].__getitem__, [0, 0], [0, 1]) == RECORDS[:2]
    with pytest.raises(infeed.SourceChangedError) as caught:
        read_indexed(read_at, [path], [index].__getitem__, [0] * 4, range(4))
    e = caught.value
    assert (e.path, e.record_index, e.offset) == (path, k, start)
    assert (e.before, e.after) == (_tfrecord.masked_crc32c(RECORDS[k]), _tfrecord.masked_crc32c(other))
    assert f"{path}: record 2 at byte offset {start} is not the record indexed" in str(e)
    assert "index it again" in str(e)
    with pytest.raises(infeed.SourceChangedError):         # through the same index without the CRCs: unseen here,
        read_indexed(read_at, [path], [index].__getitem__, [0], [k])
    v1 = index._replace(data_crcs=None)                    # which is why reads through it look the file up again
    assert read_indexed(read_at, [path], [v1].__getitem__, [0], [k]) == [other]


def test_an_empty_file_indexes_to_no_records(tmp_path):
    path = _write(tmp_path / "e.tfrecord", [])
    write_index(build_index(path))
    index = load_index(path)
    assert (index.count, index.file_size, index.lengths.tolist()) == (0, 0, [])


def test_no_sidecar_loads_as_none(tmp_path):
    assert load_index(_write(tmp_path / "d.tfrecord")) is None


def test_uris_build_write_and_load_without_leaving_temporary_files(tmp_path):
    uri = f"file://{_write(tmp_path / 'd.tfrecord')}"
    assert write_index(build_index(uri)) == uri + ".index"
    assert load_index(uri).count == len(RECORDS)
    assert sorted(os.listdir(tmp_path)) == ["d.tfrecord", "d.tfrecord.index"]


def test_a_sidecar_of_a_file_that_changed_size_is_stale(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    write_index(build_index(path))
    with open(path, "ab") as f:
        f.write(_tfrecord.frame(b"one more"))
    with pytest.raises(IndexFileError, match="stale") as caught:
        load_index(path)
    assert caught.value.path == path + ".index" and "stale" in caught.value.problem


def _with_offsets(raw: bytes, offsets) -> bytes:
    """The sidecar ``raw`` holding ``offsets`` instead (and as many data CRCs), with its count and CRC made to match."""
    magic, version, flags, size, _, _ = HEADER.unpack_from(raw)
    payload = np.array(offsets, "<u8").tobytes() + np.zeros(len(offsets), "<u4").tobytes()
    return HEADER.pack(magic, version, flags, size, len(offsets), _tfrecord.crc32c(payload)) + payload


def _flip(raw: bytes, at: int) -> bytes:
    return raw[:at] + bytes([raw[at] ^ 0x01]) + raw[at + 1:]


@pytest.mark.parametrize("damage, problem", [
    (lambda raw, offs: b"NOTINDEX" + raw[8:], "bad magic"),
    (lambda raw, offs: raw[:8] + struct.pack("<I", 3) + raw[12:], r"version 3, this infeed reads versions \(1, 2\)"),
    (lambda raw, offs: raw[:20], "truncated header"),
    (lambda raw, offs: raw[:-3], "truncated or oversized"),
    (lambda raw, offs: raw + b"\0" * 8, "truncated or oversized"),
    (lambda raw, offs: _flip(raw, HEADER.size + 9), "CRC32C mismatch"),
    (lambda raw, offs: _with_offsets(raw, [offs[0], offs[2], offs[1]] + offs[3:]), "offsets not increasing"),
    (lambda raw, offs: _with_offsets(raw, [offs[0], offs[1], offs[1] + 3] + offs[3:]), "overlap"),
    (lambda raw, offs: _with_offsets(raw, [4] + offs[1:]), "first record starts at byte 4"),
    (lambda raw, offs: _with_offsets(raw, offs + [2**64 - 8]), f"record 6 starts at byte {2**64 - 8}, outside"),
    (lambda raw, offs: _with_offsets(raw, []), "no records, but the file has"),
])
def test_a_damaged_or_inconsistent_sidecar_is_refused_naming_the_problem(tmp_path, damage, problem):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    sidecar = write_index(index)
    Path(sidecar).write_bytes(damage(Path(sidecar).read_bytes(), index.offsets.tolist()))
    with pytest.raises(IndexFileError, match=problem) as caught:
        load_index(path)
    assert str(caught.value).startswith(f"{sidecar}: unusable record index: ")
    assert isinstance(caught.value, infeed.InfeedError)
    assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)


def test_an_inconsistent_index_is_not_written(tmp_path):
    index = build_index(_write(tmp_path / "d.tfrecord"))
    with pytest.raises(ValueError, match="inconsistent index: its lengths"):
        write_index(index._replace(lengths=index.lengths + 1))
    with pytest.raises(ValueError, match="inconsistent index: offsets not increasing"):
        write_index(index._replace(offsets=index.offsets[[0, 2, 1, 3, 4, 5]]))
    with pytest.raises(ValueError, match="no records, but the file has"):
        write_index(RecordIndex(index.path, index.file_size, np.zeros(0, np.int64), np.zeros(0, np.int64)))
    with pytest.raises(ValueError, match="inconsistent index: its data CRCs are not one uint32 per record"):
        write_index(index._replace(data_crcs=index.data_crcs[:-1]))
    with pytest.raises(ValueError, match="inconsistent index: its data CRCs"):
        write_index(index._replace(data_crcs=index.data_crcs.astype(np.int64) - 2**40))
    assert not os.path.exists(index_path(index.path))


@pytest.mark.parametrize("call, error, message", [
    (lambda p: build_index(None), TypeError, "path must be a str or os.PathLike path or URI, got None"),
    (lambda p: load_index(3), TypeError, "path must be .* got 3"),
    (lambda p: index_path(None), TypeError, "path must be .* got None"),
    (lambda p: write_index(None), TypeError, "index must be a RecordIndex"),
    (lambda p: write_index(build_index(p), dest=7), TypeError, "dest must be .* got 7"),
    (lambda p: write_index(RecordIndex(p, 100, None, None)), ValueError, "w.tfrecord: refusing to write"),
    (lambda p: write_index(RecordIndex(p, "big", [0], [1])), ValueError, "w.tfrecord: refusing to write"),
])
def test_bad_arguments_name_the_argument_or_file(tmp_path, call, error, message):
    path = _write(tmp_path / "w.tfrecord")
    with pytest.raises(error, match=message):
        call(path)


@pytest.mark.parametrize("name", ["d.tfrecord.gz", "sniffed.tfrecord"])
def test_compressed_files_are_refused(tmp_path, name):
    path = _write(tmp_path / name, compression="GZIP")
    with pytest.raises(ValueError, match="GZIP-compressed file: offsets in a compressed stream give no random"):
        build_index(path)


def test_read_indexed_joins_records_that_follow_each_other_and_keeps_the_order_asked(tmp_path):
    paths = [_write(tmp_path / "a.tfrecord"), _write(tmp_path / "b.tfrecord", RECORDS[::-1])]
    indexes = [build_index(p) for p in paths]
    want = [RECORDS, RECORDS[::-1]]
    reads = []

    def read_at(f, offset, size):
        reads.append((f, size))
        with open(paths[f], "rb") as handle:
            handle.seek(offset)
            return handle.read(size)

    files, records = [0, 0, 0, 1, 1, 0, 0, 1], [1, 2, 3, 0, 1, 5, 5, 4]
    got = read_indexed(read_at, paths, indexes.__getitem__, files, records)
    assert got == [want[f][k] for f, k in zip(files, records)]
    assert [f for f, _ in reads] == [0, 1, 0, 0, 1]          # runs 1-3 and 0-1 read in one call each
    reads.clear()
    assert read_indexed(read_at, paths, indexes.__getitem__, [0] * 6, range(6), max_joined=100) == RECORDS
    assert len(reads) > 1 and all(size <= 100 or size == 16 + len(RECORDS[3]) for _, size in reads)
    assert read_indexed(read_at, paths, indexes.__getitem__, [], []) == []
    views = read_indexed(read_at, paths, indexes.__getitem__, files, records, views=True)
    assert all(type(v) is memoryview for v in views) and [bytes(v) for v in views] == got


def test_batch_runs_give_each_batch_the_runs_of_its_records_alone(tmp_path):
    """A planner's runs for many batches at once: batch j's are indexed_runs of its own records, never a run across
    two batches, whatever the files, the order and the joined reads' bound."""
    paths = [_write(tmp_path / "a.tfrecord"), _write(tmp_path / "b.tfrecord", RECORDS[::-1])]
    indexes = [build_index(p) for p in paths]
    rng = np.random.default_rng(3)
    for _ in range(50):
        n, size = int(rng.integers(0, 30)), int(rng.integers(1, 8))
        files = rng.integers(0, 2, n)
        records = np.where(rng.random(n) < 0.6, np.arange(n) % 6, rng.integers(0, 6, n))
        joined = int(rng.choice([20, 100, 1 << 20]))
        runs = BatchRuns(indexes.__getitem__, files, records, size, joined)
        assert len(runs) == -(-n // size)
        plain = lambda rs: [(r.file, r.first, r.base, r.size, r.offsets.tolist(), r.lengths.tolist(),
                             r.data_crcs.tolist()) for r in rs]
        for j in range(len(runs)):
            assert plain(runs[j]) == plain(indexed_runs(indexes.__getitem__, files[j * size:(j + 1) * size],
                                                        records[j * size:(j + 1) * size], joined))
        with pytest.raises(IndexError):
            runs[len(runs)]


def test_read_indexed_names_the_first_record_a_short_read_cuts_or_a_damaged_one(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    data = open(path, "rb").read()
    cut = int(index.offsets[3]) + 20                         # record 3's frame cut after 20 bytes
    with pytest.raises(infeed.CorruptRecordError) as info:
        read_indexed(lambda f, offset, size: data[offset:min(offset + size, cut)], [path], [index].__getitem__,
                     [0] * 5, range(5))
    assert (info.value.record_index, info.value.offset, info.value.kind) == (3, int(index.offsets[3]),
                                                                             "truncated_data")
    damaged = bytearray(data)
    damaged[int(index.offsets[2]) + 12] ^= 1                 # record 2's first data byte
    with pytest.raises(infeed.CorruptRecordError) as info:
        read_indexed(lambda f, offset, size: bytes(damaged[offset:offset + size]), [path], [index].__getitem__,
                     [0] * 5, range(5))
    assert (info.value.path, info.value.record_index, info.value.kind) == (path, 2, "data_crc")
    with pytest.raises(ValueError, match="offsets"):
        _tfrecord.unframe_run(data, path, 0, 0, index.offsets[:2], index.lengths[:3])


SPEC = {"x": infeed.VarLen("int64", max_len=300), "id": infeed.Bytes(max_bytes=8, default=b"")}


def _decode_in_place(paths, indexes, files, records, read_at, spec=None):
    """Records ``records[i]`` of ``files[i]`` decoded where they lie in their reads (``IndexedFrames``), as a
    worker decodes an indexed batch without images."""
    parser = infeed.ExampleParser(spec or SPEC)
    runs = indexed_runs(indexes.__getitem__, files, records)
    frames = _tfrecord.IndexedFrames(runs, [read_at(run.file, run.base, run.size) for run in runs], list(paths))
    out = parser.allocate(len(records))
    assert parser.reads_in_place
    return parser.read_into(frames, len(records), out), out, frames


def test_indexed_frames_decode_each_record_where_it_lies_as_the_records_would(tmp_path):
    paths = [_write(tmp_path / "a.tfrecord"), _write(tmp_path / "b.tfrecord", RECORDS[::-1])]
    indexes = [build_index(p) for p in paths]
    datas = [Path(p).read_bytes() for p in paths]
    files, records = [0, 0, 0, 1, 1, 0, 0, 1], [1, 2, 3, 1, 2, 0, 0, 4]   # runs 1-3, 1-2, 0, 0, 4
    read_at = lambda f, offset, size: datas[f][offset:offset + size]
    (count, nbytes), out, frames = _decode_in_place(paths, indexes, files, records, read_at)
    want = read_indexed(read_at, paths, indexes.__getitem__, files, records)
    assert (count, nbytes, frames.records_read) == (8, sum(map(len, want)), 8)
    parsed = infeed.ExampleParser(SPEC).parse(want)
    for name in out:
        assert np.array_equal(out[name].values, parsed[name].values)
        assert np.array_equal(out[name].lengths, parsed[name].lengths)
    image = infeed.ExampleParser({"image": infeed.Image((4, 4), key="id")})
    assert not image.reads_in_place                          # images need a memoryview each (ReadGroup.records)


def test_indexed_frames_name_a_short_read_a_damaged_record_and_one_of_another_version(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    index = build_index(path)
    data = Path(path).read_bytes()
    cut = int(index.offsets[3]) + 20                         # record 3's frame cut after 20 bytes
    with pytest.raises(infeed.CorruptRecordError) as info:
        _decode_in_place([path], [index], [0] * 5, range(5), lambda f, offset, size: data[offset:min(offset + size, cut)])
    assert (info.value.path, info.value.record_index, info.value.offset, info.value.kind) == (
        path, 3, int(index.offsets[3]), "truncated_data")
    damaged = bytearray(data)
    damaged[int(index.offsets[2]) + 12] ^= 1                 # record 2's first data byte
    with pytest.raises(infeed.CorruptRecordError) as info:
        _decode_in_place([path], [index], [0] * 5, range(5), lambda f, offset, size: bytes(damaged[offset:offset + size]))
    assert (info.value.record_index, info.value.kind) == (2, "data_crc")
    other = infeed.encode_example({"x": [9] * 7, "id": b"r7"})  # same length, both CRCs valid, another record
    replaced = bytearray(data)
    start = int(index.offsets[2])
    replaced[start:start + 16 + len(other)] = _tfrecord.frame(other)
    with pytest.raises(infeed.SourceChangedError) as caught:
        _decode_in_place([path], [index], [0] * 4, range(4), lambda f, offset, size: bytes(replaced[offset:offset + size]))
    assert (caught.value.path, caught.value.record_index, caught.value.offset) == (path, 2, start)
    runs = indexed_runs([index].__getitem__, [0, 0], [0, 1])
    with pytest.raises(ValueError, match="1 runs and 0 reads"):
        _tfrecord.IndexedFrames(runs, [], [path])
    with pytest.raises(ValueError, match="file 0"):
        _tfrecord.IndexedFrames(runs, [data[:runs[0].size]], [])


def test_a_corrupt_data_file_raises_naming_the_file_and_offset(tmp_path):
    path = _write(tmp_path / "d.tfrecord")
    offsets, _ = _walk_framing(Path(path).read_bytes())
    data = bytearray(Path(path).read_bytes())
    data[offsets[3] + 20] ^= 0xFF                     # inside record 3's data
    Path(path).write_bytes(bytes(data))
    with pytest.raises(infeed.CorruptRecordError) as caught:
        build_index(path)
    assert (caught.value.path, caught.value.record_index, caught.value.offset) == (path, 3, offsets[3])


@pytest.fixture
def shards(tmp_path):
    return [_write(tmp_path / f"s{i}.tfrecord", RECORDS[: i + 2]) for i in range(2)]


def test_cli_indexes_each_file_then_finds_them_up_to_date(tmp_path, shards, capsys):
    assert main(["index", str(tmp_path / "s*.tfrecord")]) == 0
    lines = capsys.readouterr().out.splitlines()
    sizes = [os.path.getsize(p) for p in shards]
    assert lines[0].startswith(f"{shards[0]}: 2 records, {sizes[0]} bytes, indexed in ")
    assert lines[1].startswith(f"{shards[1]}: 3 records, {sizes[1]} bytes, indexed in ")
    assert lines[2] == f"2 files, 5 records, {sum(sizes)} bytes: 2 indexed, 0 up to date"
    assert load_index(shards[1]).count == 3

    assert main(["index", str(tmp_path / "*")]) == 0              # the sidecars it matches are skipped
    assert capsys.readouterr().out.splitlines() == [
        f"{shards[0]}: 2 records, {sizes[0]} bytes, up to date",
        f"{shards[1]}: 3 records, {sizes[1]} bytes, up to date",
        f"2 files, 5 records, {sum(sizes)} bytes: 0 indexed, 2 up to date"]


def test_cli_force_rebuilds_and_a_stale_sidecar_is_replaced(shards, capsys):
    main(["index", *shards])
    capsys.readouterr()
    with open(shards[0], "ab") as f:
        f.write(_tfrecord.frame(b"more"))
    assert main(["index", *shards]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{shards[0]}: 3 records, ") and "replaced an unusable index: stale" in out[0]
    assert out[1].endswith("up to date")
    assert main(["index", "--force", shards[1]]) == 0
    assert "indexed in" in capsys.readouterr().out


def test_cli_rebuilds_a_version_1_sidecar_as_version_2(shards, capsys):
    write_index(build_index(shards[0])._replace(data_crcs=None))
    assert main(["index", shards[0]]) == 0
    assert "replaced an unusable index: version 1, without record CRCs" in capsys.readouterr().out
    assert load_index(shards[0]).data_crcs is not None


def test_cli_json_lists_one_entry_per_file(shards, capsys):
    assert main(["index", "--json", *shards]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(r["path"], r["records"], r["status"], r["index"]) for r in report] == [
        (shards[0], 2, "indexed", shards[0] + ".index"), (shards[1], 3, "indexed", shards[1] + ".index")]
    assert main(["index", "--json", shards[0]]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {"path": shards[0], "records": 2, "bytes": os.path.getsize(shards[0]), "status": "up to date"}]


def test_cli_exit_statuses(tmp_path, capsys):
    corrupt = _write(tmp_path / "c.tfrecord")
    data = bytearray(Path(corrupt).read_bytes())
    data[-1] ^= 0xFF
    Path(corrupt).write_bytes(bytes(data))
    assert main(["index", corrupt]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"infeed index: error: {corrupt}: corrupt record {len(RECORDS) - 1} at byte offset ")
    assert not os.path.exists(index_path(corrupt))

    gz = _write(tmp_path / "g.tfrecord.gz", compression="GZIP")
    assert main(["index", gz]) == 2
    assert "compressed stream give no random access" in capsys.readouterr().err
    assert main(["index", str(tmp_path / "none-*.tfrecord")]) == 2
    assert "no files match" in capsys.readouterr().err
