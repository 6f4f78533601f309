"""`python -m bench decode` end to end, on a few records: the table and JSON carry every figure."""

import json
import os
import sys

import pytest

from bench import __main__ as bench_main
from bench.suites import decode_suite

PIPELINES = [decode_suite.PAGE_CACHE, decode_suite.PAGE_CACHE_ONE, decode_suite.READ, decode_suite.PARSE]
TF_PIPELINES = [decode_suite.TF_READ, decode_suite.TF_PARSE]
LAYOUTS = ["mnist", "criteo", "imagenet"]


def _run(tmp_path, capsys, *extra):
    out_json = tmp_path / "decode.json"
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert bench_main.main(["decode", "--scale", "0.004", "--repeats", "1", "--json", str(out_json),
                            "--data-dir", str(tmp_path / "data"), *extra]) == 0
    assert affinity is None or os.sched_getaffinity(0) == affinity      # pinning is undone
    return capsys.readouterr().out, json.loads(out_json.read_text())


def test_decode_suite_without_tensorflow_prints_every_figure_and_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)     # `import tensorflow` raises ImportError
    text, doc = _run(tmp_path, capsys)
    assert text.splitlines()[0].startswith("reproduce: python -m bench decode --scale 0.004")
    assert "pip install -e .[tf]" in text and "Traceback" not in text
    for layout in LAYOUTS:
        for pipeline in PIPELINES:
            assert any(line.startswith(layout) and pipeline in line for line in text.splitlines())
    suite = doc["suites"]["decode"]
    assert {(f["group"], f["name"]) for f in suite["figures"]} == {(l, p) for l in LAYOUTS for p in PIPELINES}
    assert all(f["repeats"] == 1 and f["records_per_s"] > 0 and f["mb_per_s"] > 0 for f in suite["figures"])
    assert {(r["group"], r["target"]) for r in suite["ratios"]} == {(l, t) for l in LAYOUTS for t in (0.5, None)}
    assert doc["machine"]["cpu_count"] == os.cpu_count() and doc["command"].startswith("python -m bench decode")
    assert suite["params"]["tensorflow"] is None


def test_decode_suite_reuses_its_data_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", None)
    _run(tmp_path, capsys, "--layouts", "criteo")
    text, _ = _run(tmp_path, capsys, "--layouts", "criteo")
    assert "reused" in text


def test_decode_suite_compares_with_tf_data(tmp_path, capsys):
    pytest.importorskip("tensorflow", reason="TensorFlow not installed (pip install -e .[tf])")
    text, doc = _run(tmp_path, capsys, "--layouts", "mnist,imagenet")
    suite = doc["suites"]["decode"]
    assert {(f["group"], f["name"]) for f in suite["figures"]} == {
        (l, p) for l in ["mnist", "imagenet"] for p in PIPELINES + TF_PIPELINES}
    assert any(r["group"] == "mnist" and r["target"] == 3.0 for r in suite["ratios"])
    assert "decode the first batch to identical values" in text
