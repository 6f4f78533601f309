"""The infeed command: dispatch, output, and exit statuses (0 done, 1 damaged data, 2 cannot run as asked)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import infeed
from infeed.commands.cli import main

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def table_file(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "x": [0.5, None, 1.5, 2.0],
                             "tokens": pa.array([[1, 2], [3], [], [4, 5, 6]])}), path)
    return str(path)


def test_python_m_infeed_help_lists_the_commands():
    out = subprocess.run([sys.executable, "-m", "infeed", "--help"], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    assert "convert" in out.stdout and "inspect" in out.stdout


def test_convert_then_inspect_suggests_a_spec_that_parses_the_shards(tmp_path, table_file, capsys):
    assert main(["convert", table_file, "--output", str(tmp_path / "out/t"), "--shards", "2",
                 "--compression", "gzip"]) == 0
    out = capsys.readouterr().out
    shard = str(tmp_path / "out/t-00000-of-00002.tfrecord.gz")
    assert out.startswith("wrote 4 rows to 2 shards, ") and shard in out
    assert main(["inspect", shard, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 2
    spec = eval(report["suggested_spec"], {"infeed": infeed})
    assert spec == {"id": infeed.Bytes(max_bytes=1), "x": infeed.FixedLen((), "float32", default=0.0),
                    "tokens": infeed.VarLen("int64", max_len=2)}
    assert infeed.parse_examples(list(infeed.read_records(shard)), spec)["x"].tolist() == [0.5, 0.0]


def test_inspect_prints_a_table_and_the_spec(tmp_path, table_file, capsys):
    main(["convert", table_file, "-o", str(tmp_path / "t")])
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "t-00000-of-00001.tfrecord"), "--records", "2"]) == 0
    out = capsys.readouterr().out
    assert "first 2 records (more follow)" in out and '"tokens": infeed.VarLen("int64", max_len=2)' in out


@pytest.mark.parametrize("argv, message", [
    (["convert", "{tmp}/missing.parquet", "-o", "{tmp}/t"], "missing.parquet: no such file"),
    (["convert", "{table}", "-o", "{tmp}/t", "--columns", "id,nope"], "no column 'nope'"),
    (["convert", "{tmp}/t.xlsx", "-o", "{tmp}/t"], "cannot tell the format"),
    (["convert", "{tmp}/bad.parquet", "-o", "{tmp}/t"], "column 'when' (timestamp[us]): "),
    (["inspect", "{tmp}/missing.tfrecord"], "no such file"),
])
def test_usage_problems_exit_2_with_a_message_and_no_traceback(tmp_path, table_file, capsys, argv, message):
    (tmp_path / "t.xlsx").write_bytes(b"")
    pq.write_table(pa.table({"when": pa.array([0], pa.timestamp("us"))}), tmp_path / "bad.parquet")
    argv = [a.format(tmp=tmp_path, table=table_file) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"infeed {argv[0]}: error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    [], ["frobnicate"], ["convert", "x.parquet"], ["convert", "x.parquet", "-o", "t", "--format", "xls"],
    ["convert", "x.parquet", "-o", "t", "--shards", "0"], ["convert", "x.csv", "-o", "t", "--shards", "2",
                                                          "--records-per-shard", "3"],
    ["inspect", "x.tfrecord", "--records", "-1"],
])
def test_argument_errors_exit_2(argv, capsys):
    assert main(argv) == 2
    assert "usage: infeed" in capsys.readouterr().err


def test_corrupt_file_exits_1_naming_file_record_and_offset(tmp_path, capsys):
    path = tmp_path / "c.tfrecord"
    with infeed.TFRecordWriter(path) as w:
        for _ in range(3):
            w.write(infeed.encode_example({"x": 1}))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF                  # inside record 1
    path.write_bytes(bytes(data))
    assert main(["inspect", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("infeed inspect: error: ") and str(path) in err
    assert "corrupt record 1 at byte offset" in err and "Traceback" not in err


def test_wrong_format_exits_2_without_a_traceback_in_a_fresh_process(tmp_path, table_file):
    out = subprocess.run([sys.executable, "-c", "import sys; from infeed.commands.cli import main; sys.exit(main())",
                          "convert", table_file, "-o", str(tmp_path / "t"), "--format", "feather"],
                         cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 2 and "cannot read it as arrow" in out.stderr and "Traceback" not in out.stderr
