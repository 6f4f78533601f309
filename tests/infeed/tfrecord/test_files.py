"""Naming input files: paths, globs, URIs and lists of them."""

import gzip
import shutil
from pathlib import Path

import pytest

import infeed
from infeed.commands.cli import main
from infeed.tfrecord.files import expand_files, record_files

TFDS_BUILD = Path(__file__).resolve().parents[2] / "fixtures" / "tfds" / "infeed_fixture" / "jpeg" / "1.0.0"


@pytest.fixture
def tree(tmp_path):
    for name in ("b/x3.tfrecord", "x2.tfrecord", "x1.tfrecord", "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def test_globs_are_sorted_patterns_keep_their_order_and_duplicates_go(tree):
    assert expand_files(str(tree / "x*.tfrecord")) == [str(tree / "x1.tfrecord"), str(tree / "x2.tfrecord")]
    got = expand_files([tree / "x2.tfrecord", str(tree / "**" / "*.tfrecord")])
    assert got == [str(tree / n) for n in ("x2.tfrecord", "b/x3.tfrecord", "x1.tfrecord")]


def test_directories_are_not_files(tree):
    assert expand_files(str(tree / "*")) == [str(tree / n) for n in ("notes.txt", "x1.tfrecord", "x2.tfrecord")]
    assert expand_files(f"file://{tree}/*") == [f"file://{tree}/{n}" for n in ("notes.txt", "x1.tfrecord", "x2.tfrecord")]
    with pytest.raises(IsADirectoryError, match=r"'.*b' is a folder: name its files, a split's shards alone .*"
                                                r"such as '.*b/x\*.tfrecord' \(1 file\)$"):
        expand_files(str(tree / "b"))


def test_uris_go_through_pyarrow_and_keep_their_scheme(tree):
    assert expand_files(f"file://{tree}/x*.tfrecord") == [f"file://{tree}/x1.tfrecord", f"file://{tree}/x2.tfrecord"]
    assert expand_files(f"file://{tree}/**/*3.tfrecord") == [f"file://{tree}/b/x3.tfrecord"]
    assert expand_files(f"file://{tree}/**/x1.tfrecord") == [f"file://{tree}/x1.tfrecord"]   # ** is zero folders too
    assert expand_files(f"file://{tree}/x1.tfrecord") == [f"file://{tree}/x1.tfrecord"]


@pytest.mark.parametrize("pattern", ["nothing-*.tfrecord", "missing.tfrecord"])
def test_a_pattern_matching_nothing_is_named(tree, pattern):
    with pytest.raises(FileNotFoundError, match=pattern.replace("*", r"\*")):
        expand_files(str(tree / pattern))
    with pytest.raises(FileNotFoundError, match="no"):
        expand_files(f"file://{tree}/{pattern}")


def test_bad_arguments_are_value_errors(tree):
    with pytest.raises(ValueError, match="empty"):
        expand_files([])
    with pytest.raises(ValueError, match="paths"):
        expand_files([str(tree / "x1.tfrecord"), 3])
    with pytest.raises(ValueError, match="files must be"):
        expand_files(b"x1.tfrecord")


def test_a_folder_names_the_patterns_of_its_shards_or_the_tfds_build_it_is(tmp_path):
    with pytest.raises(IsADirectoryError, match=r"a tensorflow-datasets build \(dataset_info.json\), which "
                                                r"infeed.Dataset.from_tfds\(.*, split, ...\) reads"):
        record_files(str(TFDS_BUILD))
    plain = tmp_path / "plain"
    shutil.copytree(TFDS_BUILD, plain)
    (plain / "dataset_info.json").unlink()
    with pytest.raises(IsADirectoryError, match=r"such as '.*infeed_fixture-test.tfrecord-\*-of-\*' \(3 files\), "
                                                r"'.*infeed_fixture-train.tfrecord-\*-of-\*' \(3 files\)$"):
        infeed.Dataset(str(plain), {"label": infeed.FixedLen((), "int64")}, batch_size=2)
    (tmp_path / "empty").mkdir()
    with pytest.raises(IsADirectoryError, match="holds no TFRecord files"):
        record_files(str(tmp_path / "empty"))


def test_a_pattern_that_takes_in_other_files_names_them_and_leaves_out_indexes(tmp_path):
    shutil.copytree(TFDS_BUILD, tmp_path / "b")
    with pytest.raises(ValueError, match=r"3 of the 9 files matched are not TFRecord files \(by their names, "
                                         r"or their first bytes.*\): .*dataset_info.json, .*features.json, "
                                         r".*label.labels.txt; name the TFRecord files alone"):
        infeed.Dataset(str(tmp_path / "b" / "*"), {"label": infeed.FixedLen((), "int64")}, batch_size=2)
    shards = sorted(str(p) for p in (tmp_path / "b").glob("*-train.tfrecord-*"))
    assert main(["index", *shards]) == 0                     # sidecars beside them: a pattern leaves them out
    assert record_files(str(tmp_path / "b" / "*-train.tfrecord-*")) == shards
    (tmp_path / "odd.tfrecord").write_bytes(b"<html>not found</html>")          # by its first bytes
    (tmp_path / "packed.tfrecord.gz").write_bytes(gzip.compress(open(shards[0], "rb").read()))
    (tmp_path / "empty.tfrecord").write_bytes(b"")
    (tmp_path / "cut.tfrecord").write_bytes(b"\x05")          # truncated: reading it says where
    with pytest.raises(ValueError, match=r"1 of the 4 files matched are not TFRecord files .*: .*odd.tfrecord;"):
        record_files(str(tmp_path / "*.tfrecord*"))
    assert record_files([str(tmp_path / "odd.tfrecord")]) == [str(tmp_path / "odd.tfrecord")]   # named: read as such
    (tmp_path / "odd.tfrecord").unlink()
    assert len(record_files(str(tmp_path / "*.tfrecord*"))) == 3


def test_name_at_n_is_its_n_shards_in_order(tmp_path):
    for i in range(3):
        (tmp_path / f"d-train.tfrecord-{i:05d}-of-00003").write_bytes(b"")
    assert expand_files(str(tmp_path / "d-train.tfrecord@3")) == [
        str(tmp_path / f"d-train.tfrecord-{i:05d}-of-00003") for i in range(3)]
    assert expand_files(f"file://{tmp_path}/d-train.tfrecord@3") == [
        f"file://{tmp_path}/d-train.tfrecord-{i:05d}-of-00003" for i in range(3)]
    with pytest.raises(FileNotFoundError, match=r"d-train.tfrecord-00000-of-00004"):
        expand_files(str(tmp_path / "d-train.tfrecord@4"))
    (tmp_path / "mail@2").write_bytes(b"")                   # a file of that very name is itself
    assert expand_files(str(tmp_path / "mail@2")) == [str(tmp_path / "mail@2")]
