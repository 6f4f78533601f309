"""infeed inspect: per-feature statistics, and a suggested spec that parses the file it came from."""

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image as PILImage

import infeed
from infeed.commands.cli import main
from infeed.commands.inspect import SAMPLE_FROM_FILES, format_text, sample_size, suggest_spec, to_json
from infeed.example.survey import summarize

TFDS_BUILD = Path(__file__).resolve().parents[2] / "fixtures" / "tfds" / "infeed_fixture" / "jpeg" / "1.0.0"


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
                                      "values": {"min": 1, "max": 1}, "bytes": {"min": 4, "max": 10}, "images": {}}
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


def _image(fmt: str) -> bytes:
    out = io.BytesIO()
    PILImage.new("RGB", (5, 3), (10, 20, 30)).save(out, fmt)
    return out.getvalue()


def test_several_files_a_glob_and_a_folder_merge_and_images_are_suggested_as_images(tmp_path, capsys):
    for k in range(3):
        write(tmp_path / "d" / f"s-{k}.tfrecord" if (tmp_path / "d").mkdir(exist_ok=True) is None else None,
              [{"photo": [_image("JPEG" if k else "PNG")], "tokens": np.arange(k + 1), "label": k}])
    (tmp_path / "d" / "notes.json").write_text("{}")
    for args in ([str(tmp_path / "d")], [str(tmp_path / "d" / "s-*.tfrecord")],
                 [str(tmp_path / "d" / f"s-{k}.tfrecord") for k in range(3)]):
        assert main(["inspect", *args]) == 0
        text = capsys.readouterr().out
        assert text.startswith(f"3 files ({tmp_path / 'd' / 's-0.tfrecord'}, ...): 3 records, ")
        code = text.split("suggested spec:\n", 1)[1]
        assert '"photo": infeed.Image(key="photo", size=(224, 224)),  # JPEG or PNG images: choose the size' in code
        assert eval_spec(code) == {"photo": infeed.Image(key="photo", size=(224, 224)),
                                   "tokens": infeed.VarLen("int64", max_len=3), "label": infeed.FixedLen((), "int64")}
    assert main(["inspect", "--json", str(tmp_path / "d")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["files"] == 3 and doc["features"]["photo"]["images"] == {"JPEG": 2, "PNG": 1}


def test_many_files_are_sampled_and_say_so(tmp_path, capsys):
    n = SAMPLE_FROM_FILES + 1
    each = sample_size(n)
    assert sample_size(1000) == 32 and sample_size(10**6) == 16                  # about 32,768 records in all
    for k in range(n):
        write(tmp_path / f"s-{k:03d}.tfrecord", [{"x": i} for i in range(each + 1)])
    assert main(["inspect", str(tmp_path / "s-*.tfrecord")]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{n} files (") and f"a sample of {n * each:,} records, the first of each " \
                                                "file (more follow; --all reads all)" in text
    assert f"# from a sample, the first records of each of {n} files ({n * each:,} in all)" in text
    assert main(["inspect", "--all", str(tmp_path / "s-*.tfrecord")]) == 0
    assert f"{n} files (" in (out := capsys.readouterr().out) and f": {n * (each + 1):,} records, " in out


def test_a_tfds_build_is_inspected_by_its_metadata(tmp_path, capsys):
    assert main(["inspect", str(TFDS_BUILD.parent)]) == 0               # the config folder: its one version
    text = capsys.readouterr().out
    assert text.splitlines()[:3] == [
        f"{TFDS_BUILD}: TFDS build infeed_fixture, config jpeg, version 1.0.0",
        f"  split train: 3 shards, 20 examples ({TFDS_BUILD / 'infeed_fixture-train.tfrecord-00000-of-00003'}, ...)",
        f"  split test: 3 shards, 6 examples ({TFDS_BUILD / 'infeed_fixture-test.tfrecord-00000-of-00003'}, ...)"]
    code = text.split("all its records):\n", 1)[1]
    assert '"matrix": infeed.FixedLen((2, 3), "int64"),' in code                  # shapes from features.json
    assert '"image": infeed.Image(key="image", size=(224, 224), channels=3),  # JPEG images of any size' in code
    spec = eval_spec(code)
    assert spec["thumbnail"] == infeed.Image(key="thumbnail", size=(8, 8), channels=3, resize=None)
    assert spec["flag"] == infeed.FixedLen((), "bool") and spec["tokens"] == infeed.VarLen("int64", max_len=8)
    assert main(["inspect", "--json", "--split", "test", str(TFDS_BUILD)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["spec_split"] == "test" and [len(doc["splits"][s]["files"]) for s in ("train", "test")] == [3, 3]
    assert sum(doc["splits"]["test"]["examples"]) == 6 and "infeed.Image" in doc["suggested_spec"]
    both = tmp_path / "infeed_fixture"
    shutil.copytree(TFDS_BUILD.parents[1], both)
    assert main(["inspect", str(both)]) == 2                             # two configs: named
    assert "holds several TFDS configs: jpeg, png" in capsys.readouterr().err
