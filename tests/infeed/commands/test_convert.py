"""infeed convert: tables to sharded TFRecords, read back through read_records + decode_example."""

import datetime
import glob
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

import infeed
from infeed.commands import convert as convert_module
from infeed.commands.convert import convert, detect_format, shard_paths, shard_sizes
from infeed.errors import ColumnError, ConvertError
from infeed.example.arrow import encode_batch, plan_columns


def read_back(paths):
    """Every record of ``paths``, in order, decoded."""
    return [infeed.decode_example(r) for p in paths for r in infeed.read_records(p)]


def values(example, name):
    kind, vals = example[name]
    return kind, (list(vals) if kind == "bytes" else vals.tolist())


EVERY_TYPE = pa.table({
    "i8": pa.array([1, None, -128], pa.int8()),
    "i64": pa.array([2**62, -1, None], pa.int64()),
    "u64": pa.array([0, 2**63 - 1, 7], pa.uint64()),
    "flag": pa.array([True, False, None]),
    "f16": pa.array(np.array([0.5, 1.5, -2.0], np.float16)),
    "f32": pa.array([1.25, None, -0.0], pa.float32()),
    "f64": pa.array([0.1, 2.5, float("nan")], pa.float64()),
    "s": pa.array(["héllo", "", None]),
    "ls": pa.array(["x", None, "yy"], pa.large_string()),
    "b": pa.array([b"\x00\xff", None, b""], pa.binary()),
    "fsb": pa.array([b"ab", b"cd", None], pa.binary(2)),
    "cat": pa.array(["red", None, "red"]).dictionary_encode(),
    "ints": pa.array([[1, 2, 3], [], None], pa.list_(pa.int32())),
    "floats": pa.array([[1.5], None, [2.0, -3.0]], pa.large_list(pa.float64())),
    "words": pa.array([["a", "bc"], [], None], pa.list_(pa.string())),
    "pairs": pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int64(), 2)),
    "nothing": pa.array([None, None, None], pa.null()),
})

EXPECTED = [  # per row: name -> (kind, values); missing names are omitted features
    {"i8": ("int64", [1]), "i64": ("int64", [2**62]), "u64": ("int64", [0]), "flag": ("int64", [1]),
     "f16": ("float", [0.5]), "f32": ("float", [1.25]), "f64": ("float", [np.float32(0.1)]),
     "s": ("bytes", ["héllo".encode()]), "ls": ("bytes", [b"x"]), "b": ("bytes", [b"\x00\xff"]),
     "fsb": ("bytes", [b"ab"]), "cat": ("bytes", [b"red"]), "ints": ("int64", [1, 2, 3]),
     "floats": ("float", [1.5]), "words": ("bytes", [b"a", b"bc"]), "pairs": ("int64", [1, 2])},
    {"i64": ("int64", [-1]), "u64": ("int64", [2**63 - 1]), "flag": ("int64", [0]), "f16": ("float", [1.5]),
     "f64": ("float", [2.5]), "s": ("bytes", [b""]), "fsb": ("bytes", [b"cd"]), "ints": ("int64", []),
     "words": ("bytes", [])},
    {"i8": ("int64", [-128]), "u64": ("int64", [7]), "f16": ("float", [-2.0]), "f32": ("float", [-0.0]),
     "f64": ("float", [float("nan")]), "ls": ("bytes", [b"yy"]), "b": ("bytes", [b""]),
     "cat": ("bytes", [b"red"]), "floats": ("float", [2.0, -3.0]), "pairs": ("int64", [5, 6])},
]


#: pyarrow < 26 cannot round-trip a null fixed-size list through Parquet (its writer refuses one before 25, its
#: reader before 26): there the Parquet files leave that column ("pairs") out.
PARQUET_KEEPS_NULL_FIXED_SIZE_LISTS = int(pa.__version__.split(".")[0]) >= 26


def write_every_type_parquet(path):
    """EVERY_TYPE as a Parquet file at ``path``; returns the rows expected from it."""
    if PARQUET_KEEPS_NULL_FIXED_SIZE_LISTS:
        pq.write_table(EVERY_TYPE, path)
        return EXPECTED
    pq.write_table(EVERY_TYPE.drop_columns(["pairs"]), path)
    return [{name: value for name, value in row.items() if name != "pairs"} for row in EXPECTED]


def assert_rows_equal(got, expected):
    assert len(got) == len(expected)
    for example, want in zip(got, expected):
        assert sorted(example) == sorted(want)
        for name, (kind, vals) in want.items():
            got_kind, got_vals = values(example, name)
            assert got_kind == kind, name
            if kind == "float":
                np.testing.assert_array_equal(np.float32(got_vals), np.float32(vals), err_msg=name)
            else:
                assert got_vals == vals, name


def test_parquet_with_every_supported_type_round_trips(tmp_path):
    expected = write_every_type_parquet(tmp_path / "t.parquet")
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "out" / "train"))
    assert result.rows == 3
    assert [s.path for s in result.shards] == [str(tmp_path / "out" / "train-00000-of-00001.tfrecord")]
    assert result.bytes == os.path.getsize(result.shards[0].path)
    assert_rows_equal(read_back([s.path for s in result.shards]), expected)


def test_empty_lists_keep_their_column_kind(tmp_path):
    # encode_example writes every empty list as a float_list; the converter keeps the column's kind.
    write_every_type_parquet(tmp_path / "t.parquet")
    (row,) = read_back([s.path for s in convert([str(tmp_path / "t.parquet")], str(tmp_path / "o"),
                                                 columns=["ints", "words"]).shards])[1:2]
    assert row["ints"][0] == "int64" and row["words"] == ("bytes", [])


def test_records_are_byte_identical_to_encode_example():
    table = pa.table({"n": [1, -2, 300], "x": [0.5, 1.0, 2.0], "s": ["a", "bb", ""],
                      "v": pa.array([[1.0, 2.0], [3.0], [4.0]], pa.list_(pa.float32()))})
    records = encode_batch(table.to_batches()[0], plan_columns(table.schema))
    expected = [infeed.encode_example({"n": r["n"], "x": r["x"], "s": r["s"], "v": np.float32(r["v"])})
                for r in table.to_pylist()]
    assert records == expected


def test_csv_and_feather_and_jsonl_inputs(tmp_path):
    table = pa.table({"id": ["a", "b", "c"], "x": [1.5, None, 3.0], "n": [1, 2, 3]})
    pacsv.write_csv(table, tmp_path / "t.csv")
    feather.write_feather(table, tmp_path / "t.feather")
    (tmp_path / "t.jsonl").write_text('{"id": "a", "x": 1.5, "n": 1}\n{"id": "b", "x": null, "n": 2}\n'
                                      '{"id": "c", "x": 3.0, "n": 3}\n')
    expected = [{"id": ("bytes", [b"a"]), "x": ("float", [1.5]), "n": ("int64", [1])},
                {"id": ("bytes", [b"b"]), "n": ("int64", [2])},
                {"id": ("bytes", [b"c"]), "x": ("float", [3.0]), "n": ("int64", [3])}]
    for name in ("t.csv", "t.feather", "t.jsonl"):
        result = convert([str(tmp_path / name)], str(tmp_path / name.replace(".", "_")))
        assert_rows_equal(read_back([s.path for s in result.shards]), expected)


def test_format_flag_overrides_the_extension(tmp_path):
    pacsv.write_csv(pa.table({"n": [1, 2]}), tmp_path / "data.txt")
    result = convert([str(tmp_path / "data.txt")], str(tmp_path / "o"), format="csv")
    assert [values(e, "n") for e in read_back([s.path for s in result.shards])] == [("int64", [1]), ("int64", [2])]


def test_arrow_ipc_stream_format_is_read_too(tmp_path):
    table = pa.table({"n": [1, 2, 3]})
    with pa.ipc.new_stream(tmp_path / "t.arrow", table.schema) as w:
        w.write_table(table)
    result = convert([str(tmp_path / "t.arrow")], str(tmp_path / "o"), shards=2)
    assert [values(e, "n")[1][0] for e in read_back([s.path for s in result.shards])] == [1, 2, 3]


def test_shards_hold_contiguous_runs_in_row_order(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_module, "ROWS_PER_CHUNK", 7)        # shard ends fall inside chunks
    pq.write_table(pa.table({"row": np.arange(100)}), tmp_path / "a.parquet", row_group_size=30)
    pq.write_table(pa.table({"row": np.arange(100, 150)}), tmp_path / "b.parquet")
    result = convert([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], str(tmp_path / "out/t"),
                     shards=4)
    names = [os.path.basename(s.path) for s in result.shards]
    assert names == [f"t-0000{k}-of-00004.tfrecord" for k in range(4)]
    assert [s.rows for s in result.shards] == [38, 38, 37, 37]
    per_shard = [[values(e, "row")[1][0] for e in read_back([s.path])] for s in result.shards]
    assert [len(rows) for rows in per_shard] == [38, 38, 37, 37]
    assert sum(per_shard, []) == list(range(150))
    assert sorted(glob.glob(str(tmp_path / "out/*"))) == [s.path for s in result.shards]   # no temporaries


def test_records_per_shard_fills_shards_then_the_remainder(tmp_path):
    pacsv.write_csv(pa.table({"row": np.arange(10)}), tmp_path / "t.csv")
    result = convert([str(tmp_path / "t.csv")], str(tmp_path / "t"), records_per_shard=4)
    assert [s.rows for s in result.shards] == [4, 4, 2]
    assert [os.path.basename(s.path) for s in result.shards][-1] == "t-00002-of-00003.tfrecord"
    assert [values(e, "row")[1][0] for e in read_back([s.path for s in result.shards])] == list(range(10))


def test_more_shards_than_rows_writes_empty_shards(tmp_path):
    pq.write_table(pa.table({"n": [1, 2]}), tmp_path / "t.parquet")
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), shards=3)
    assert [s.rows for s in result.shards] == [1, 1, 0]
    assert list(infeed.read_records(result.shards[2].path)) == []


@given(st.integers(0, 10_000), st.integers(1, 300))
def test_shard_sizes_cover_every_row_once(total, n):
    by_count = shard_sizes(total, shards=n)
    assert len(by_count) == n and sum(by_count) == total and max(by_count) - min(by_count) <= 1
    assert by_count == sorted(by_count, reverse=True)
    by_size = shard_sizes(total, records_per_shard=n)
    assert sum(by_size) == total and all(s == n for s in by_size[:-1])
    assert 0 < by_size[-1] <= n if total else by_size == [0]


def test_shard_names_follow_tensorflow_and_mark_compression():
    assert shard_paths("gs://b/train", 3) == [f"gs://b/train-0000{k}-of-00003.tfrecord" for k in range(3)]
    assert shard_paths("t", 1, "ZLIB") == ["t-00000-of-00001.tfrecord.zlib"]
    assert shard_paths("t", 123456)[-1] == "t-123455-of-123456.tfrecord"


@pytest.mark.parametrize("compression, ext", [("GZIP", ".gz"), ("ZLIB", ".zlib")])
def test_compressed_shards_are_named_and_read_back(tmp_path, compression, ext):
    pq.write_table(pa.table({"s": ["x" * 100] * 50}), tmp_path / "t.parquet")
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), shards=2, compression=compression)
    assert all(s.path.endswith(".tfrecord" + ext) for s in result.shards)
    assert result.bytes < 50 * 100                                   # it did compress
    assert [values(e, "s") for e in read_back([s.path for s in result.shards])] == [("bytes", [b"x" * 100])] * 50


def test_columns_selects_and_orders_features(tmp_path):
    pq.write_table(pa.table({"a": [1], "b": [2.0], "c": ["z"]}), tmp_path / "t.parquet")
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), columns=["c", "a"])
    assert list(read_back([result.shards[0].path])[0]) == ["c", "a"]


def test_uri_inputs_and_outputs(tmp_path):
    pq.write_table(pa.table({"n": [1, 2, 3]}), tmp_path / "t.parquet")
    result = convert([(tmp_path / "t.parquet").as_uri()], (tmp_path / "uri" / "t").as_uri(), shards=2)
    assert result.shards[0].path.startswith("file://")
    assert [values(e, "n")[1][0] for e in read_back([s.path for s in result.shards])] == [1, 2, 3]


def test_compressed_csv_input_is_decompressed(tmp_path):
    import gzip

    (tmp_path / "t.csv.gz").write_bytes(gzip.compress(b"n,s\n1,a\n2,b\n"))
    assert detect_format(str(tmp_path / "t.csv.gz")) == "csv"
    result = convert([str(tmp_path / "t.csv.gz")], str(tmp_path / "t"))
    assert [values(e, "s") for e in read_back([result.shards[0].path])] == [("bytes", [b"a"]), ("bytes", [b"b"])]


def test_temporal_columns_become_int64_only_when_asked(tmp_path):
    table = pa.table({"ts": pa.array([datetime.datetime(2020, 1, 1), None], pa.timestamp("ms")),
                      "day": pa.array([datetime.date(1970, 1, 3), datetime.date(1969, 12, 31)])})
    pq.write_table(table, tmp_path / "t.parquet")
    with pytest.raises(ColumnError, match=r"column 'ts' \(timestamp\[ms\]\).*--temporal-as-int64") as caught:
        convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"))
    assert caught.value.column == "ts" and caught.value.path == str(tmp_path / "t.parquet")
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), temporal_as_int64=True)
    rows = read_back([result.shards[0].path])
    assert values(rows[0], "ts") == ("int64", [1577836800000]) and "ts" not in rows[1]
    assert [values(r, "day") for r in rows] == [("int64", [2]), ("int64", [-1])]


@pytest.mark.parametrize("column, type_text, advice", [
    (pa.array([1, 2], pa.decimal128(5, 2)), "decimal128(5, 2)", "float64"),
    (pa.array([{"a": 1}, {"a": 2}]), "struct<a: int64>", "flatten"),
    (pa.array([[[1]], [[2]]]), "list<element: list<element: int64>>", "nested lists"),   # as parquet names it
    (pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64())), "map<string, int64", "keys"),
])
def test_unsupported_column_type_names_the_column_and_a_cast(tmp_path, column, type_text, advice):
    pq.write_table(pa.table({"ok": [1, 2], "bad": column}), tmp_path / "t.parquet")
    with pytest.raises(ColumnError, match="column 'bad'") as caught:
        convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"))
    assert type_text in str(caught.value) and advice in str(caught.value)
    assert not os.path.exists(tmp_path / "t-00000-of-00001.tfrecord")


def test_null_inside_a_list_names_column_and_row_and_leaves_no_shard(tmp_path, monkeypatch):
    monkeypatch.setattr(convert_module, "ROWS_PER_CHUNK", 4)
    lists = [[1]] * 9 + [[2, None]]
    pq.write_table(pa.table({"v": pa.array(lists, pa.list_(pa.int64()))}), tmp_path / "t.parquet")
    with pytest.raises(ColumnError, match=r"t.parquet: column 'v' \(list<element: int64>\), row 9: .*null") as caught:
        convert([str(tmp_path / "t.parquet")], str(tmp_path / "out/t"), records_per_shard=3)
    assert caught.value.row == 9
    assert os.listdir(tmp_path / "out") == []


def test_uint64_beyond_int64_is_refused_with_its_row(tmp_path):
    pq.write_table(pa.table({"u": pa.array([1, 2**64 - 1], pa.uint64())}), tmp_path / "t.parquet")
    with pytest.raises(ColumnError, match="row 1: value 18446744073709551615 is outside the int64 range"):
        convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"))


@pytest.mark.parametrize("kwargs, message", [
    (dict(inputs=["missing.parquet"]), "missing.parquet: no such file"),
    (dict(inputs=["data.xls"]), "cannot tell the format from the extension"),
    (dict(format="excel"), "unknown format 'excel'"),
    (dict(columns=["a", "nope"]), r"no column 'nope'; its columns are a, b"),
    (dict(columns=[]), "columns is empty"),
    (dict(shards=2, records_per_shard=2), "not both"),
    (dict(shards=0), "shards must be a positive int"),
    (dict(compression="LZ4"), "compression must be"),
    (dict(output="somewhere/"), "file name prefix"),
])
def test_bad_arguments_raise_convert_error(tmp_path, monkeypatch, kwargs, message):
    monkeypatch.chdir(tmp_path)
    pq.write_table(pa.table({"a": [1], "b": [2]}), "t.parquet")
    (tmp_path / "data.xls").write_bytes(b"")
    args = dict(inputs=["t.parquet"], output="t") | kwargs
    with pytest.raises(ConvertError, match=message):
        convert(args.pop("inputs"), args.pop("output"), **args)


def test_a_file_that_is_not_the_format_names_the_file(tmp_path):
    (tmp_path / "t.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ConvertError, match=r"t.parquet: cannot read it as parquet"):
        convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"))


def test_inputs_whose_column_kinds_differ_are_refused(tmp_path):
    pq.write_table(pa.table({"x": [1.5]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"x": [1]}), tmp_path / "b.parquet")
    with pytest.raises(ConvertError, match=r"column 'x' is double \(float feature\) in .*a.parquet but int64"):
        convert([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], str(tmp_path / "t"))


def test_shards_of_an_earlier_run_with_another_count_are_reported(tmp_path):
    pq.write_table(pa.table({"n": [1, 2, 3]}), tmp_path / "t.parquet")
    convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), shards=2)
    result = convert([str(tmp_path / "t.parquet")], str(tmp_path / "t"), shards=3)
    assert [os.path.basename(p) for p in result.stale] == ["t-00000-of-00002.tfrecord", "t-00001-of-00002.tfrecord"]
