"""`python -m bench grain` on a few records: every pipeline's figure and ratio, checked values, no files left
behind in a shared data directory but its own, and a note instead of figures without Grain."""

import json
import os

import numpy as np
import pytest

import infeed
from bench import __main__ as bench_main
from bench.data import datasets
from bench.suites import grain_suite as suite

pytest.importorskip("grain")


def test_grain_suite_prints_every_pipeline_and_ratio(tmp_path, capsys):
    data = tmp_path / "data"
    out = tmp_path / "grain.json"
    assert bench_main.main(["grain", "--quick", "--scale", "0.125", "--repeats", "1", "--layouts", "mnist,imagenet",
                            "--data-dir", str(data), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("reproduce: python -m bench grain --quick")
    doc = json.loads(out.read_text())["suites"]["grain"]
    assert {(f["group"], f["name"]) for f in doc["figures"]} == {("mnist", n) for n in suite.CASES}
    assert all(f["records_per_s"] > 0 and f["repeats"] == 1 for f in doc["figures"])
    assert {(t["group"], t["name"]) for t in doc["timings"]} == {("mnist", n) for n in suite.PARTS}
    assert all(t["unit"] == "us" and t["median"] > 0 for t in doc["timings"])
    assert {r["name"] for r in doc["ratios"]} == {f"{a} / {b}" for a, b in suite.RATIOS}
    assert all(r["target"] is None and r["value"] > 0 for r in doc["ratios"])
    assert any("imagenet left out" in n for n in doc["notes"])
    assert doc["params"]["grain"] and doc["params"]["records"] == {"mnist": 256}
    # The data file itself has no sidecar: it would change how other suites' daemons read it.
    names = sorted(os.listdir(data))
    assert names == ["mnist-256-seed0-v1.array_record", "mnist-256-seed0-v1.indexed.tfrecord",
                     "mnist-256-seed0-v1.indexed.tfrecord.index", "mnist-256-seed0-v1.tfrecord"]
    assert "grain" in bench_main.SUITES


def test_without_grain_the_suite_is_a_note(monkeypatch):
    monkeypatch.setattr(suite, "_import_grain", lambda: None)
    result = suite.run(quick=True, repeats=1)
    assert result.figures == [] and result.notes == [suite.SKIPPED]


def test_the_protobuf_path_decodes_as_infeed_does():
    layout = datasets.LAYOUTS["criteo"]
    records = datasets.make_records(layout, 5)
    rows = suite.protobuf_rows(layout.spec())
    want = infeed.parse_examples(records, layout.spec())
    for i, record in enumerate(records):
        got = rows(record)
        assert set(got) == set(want) and all(np.array_equal(got[k], want[k][i]) for k in want)
    with pytest.raises(ValueError, match="'x'"):
        suite.protobuf_rows({"x": infeed.VarLen("int64", max_len=3)})
