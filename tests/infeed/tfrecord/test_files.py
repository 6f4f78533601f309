"""Naming input files: paths, globs, URIs and lists of them."""

import pytest

from infeed.tfrecord.files import expand_files


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
    with pytest.raises(FileNotFoundError):
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
