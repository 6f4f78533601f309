"""infeed inspect: per-feature statistics, and a suggested spec that parses the file it came from."""

import numpy as np
import pytest

import infeed
from infeed.commands.inspect import format_text, suggest_spec, to_json
from infeed.example.survey import summarize


def write(path, examples, compression=None):
    with infeed.TFRecordWriter(path, compression=compression) as w:
        for example in examples:
            w.write(example if isinstance(example, bytes) else infeed.encode_example(example))
    return str(path)


def mixed_examples(n=20):
    """image: always 4 floats; label: one int; tokens: 1..n ints; id: one bytes value, missing in
    every fifth record; score: one float, missing in every third."""
    out = []
    for i in range(n):
        example = {"image": np.full(4, i, np.float32), "label": i % 3, "tokens": np.arange(i % 7 + 1)}
        if i % 5:
            example["id"] = f"id-{i}" * (1 + i % 2)
        if i % 3:
            example["score"] = 0.5 * i
        out.append(example)
    return out


def eval_spec(code):
    return eval(code, {"infeed": infeed})


def test_statistics_count_presence_values_and_bytes(tmp_path):
    summary = summarize(write(tmp_path / "m.tfrecord", mixed_examples()))
    assert summary.records == 20 and summary.complete
    f = summary.features
    assert list(f) == ["image", "label", "tokens", "id", "score"]     # order of first appearance
    assert (f["image"].kind, f["image"].present, f["image"].min_values, f["image"].max_values) == ("float", 20, 4, 4)
    assert (f["tokens"].kind, f["tokens"].min_values, f["tokens"].max_values) == ("int64", 1, 7)
    assert (f["id"].kind, f["id"].present, f["id"].min_bytes, f["id"].max_bytes) == ("bytes", 16, 4, 10)
    assert f["score"].present == 13


def test_suggested_spec_parses_the_file(tmp_path):
    path = write(tmp_path / "m.tfrecord", mixed_examples())
    code = suggest_spec(summarize(path))
    spec = eval_spec(code)
    assert spec == {"image": infeed.FixedLen((4,), "float32"), "label": infeed.FixedLen((), "int64"),
                    "tokens": infeed.VarLen("int64", max_len=7),
                    "id": infeed.Bytes(max_bytes=10, default=b""),
                    "score": infeed.FixedLen((), "float32", default=0.0)}
    assert "missing in 7 of 20 records" in code
    batch = infeed.parse_examples(list(infeed.read_records(path)), spec)
    assert batch["tokens"].lengths.tolist() == [i % 7 + 1 for i in range(20)]
    assert batch["score"][4] == 2.0 and batch["score"][3] == 0.0          # 3: missing, the default


def test_lists_of_bytes_and_mixed_kinds_are_comments_not_specs(tmp_path):
    records = [{"tags": [b"a", b"b"], "x": 1, "n": 1}, {"tags": [b"c"], "x": 2.5, "n": 2}]
    code = suggest_spec(summarize(write(tmp_path / "b.tfrecord", records)))
    assert '# "tags": bytes, 1 to 2 values per record: no static layout for lists of bytes yet' in code
    assert '# "x": kinds differ between records (int64 in 1 records, float in 1 records)' in code
    assert eval_spec(code) == {"n": infeed.FixedLen((), "int64")}


def test_empty_lists_decode_as_zero_values_whatever_their_kind(tmp_path):
    # encode_example writes an empty list as a float_list; it must not make an int64 feature "mixed".
    records = [{"ids": np.array([1, 2])}, {"ids": []}, {"ids": np.array([3])}]
    path = write(tmp_path / "e.tfrecord", records)
    spec = eval_spec(suggest_spec(summarize(path)))
    assert spec == {"ids": infeed.VarLen("int64", max_len=2)}
    assert infeed.parse_examples(list(infeed.read_records(path)), spec)["ids"].lengths.tolist() == [2, 0, 1]


@pytest.mark.parametrize("compression", ["GZIP", "ZLIB"])
def test_compressed_files_are_detected(tmp_path, compression):
    path = write(tmp_path / "c.tfrecord", mixed_examples(5), compression)       # no telling extension
    assert summarize(path).records == 5


def test_records_limit_reads_the_first_records_and_says_so(tmp_path):
    summary = summarize(write(tmp_path / "m.tfrecord", mixed_examples()), max_records=3)
    assert summary.records == 3 and not summary.complete
    assert summary.features["tokens"].max_values == 3
    assert "from the first 3 records only" in suggest_spec(summary)
    assert "first 3 records (more follow)" in format_text(summary)
    assert summarize(write(tmp_path / "s.tfrecord", mixed_examples(3)), max_records=3).complete


def test_text_report_lists_features_and_ends_with_the_spec(tmp_path):
    summary = summarize(write(tmp_path / "m.tfrecord", mixed_examples()))
    text = format_text(summary)
    assert text.startswith(f"{tmp_path / 'm.tfrecord'}: 20 records, ")
    assert any(line.split() == ["tokens", "int64", "20", "1..7"] for line in text.splitlines())
    assert any(line.split() == ["id", "bytes", "16", "1", "4..10"] for line in text.splitlines())
    assert eval_spec(text.split("suggested spec:\n", 1)[1]) == eval_spec(suggest_spec(summary))


def test_json_summary_holds_the_statistics_and_spec(tmp_path):
    data = to_json(summarize(write(tmp_path / "m.tfrecord", mixed_examples())))
    assert data["records"] == 20 and data["complete"] is True
    assert data["features"]["id"] == {"kind": "bytes", "kinds": {"bytes": 16}, "present": 16,
                                      "values": {"min": 1, "max": 1}, "bytes": {"min": 4, "max": 10}}
    assert "tokens" in eval_spec(data["suggested_spec"])


def test_empty_file_summarises_to_nothing(tmp_path):
    (tmp_path / "e.tfrecord").write_bytes(b"")
    summary = summarize(str(tmp_path / "e.tfrecord"))
    assert summary.records == 0 and eval_spec(suggest_spec(summary)) == {}


def test_a_record_that_is_not_an_example_names_file_and_record(tmp_path):
    path = write(tmp_path / "bad.tfrecord", [{"x": 1}, b"\x0a\xff"])
    with pytest.raises(infeed.DecodeError, match=r"bad.tfrecord: record 1"):
        summarize(path)


def test_corrupt_file_raises_with_file_record_and_offset(tmp_path):
    path = write(tmp_path / "c.tfrecord", [{"x": 1}] * 3)
    data = bytearray((tmp_path / "c.tfrecord").read_bytes())
    data[-6] ^= 0xFF                                  # inside the last record's data
    (tmp_path / "c.tfrecord").write_bytes(bytes(data))
    with pytest.raises(infeed.CorruptRecordError) as caught:
        summarize(path)
    assert (caught.value.path, caught.value.record_index) == (path, 2)
