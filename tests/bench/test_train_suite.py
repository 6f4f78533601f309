"""`python -m bench train` end to end on tiny settings (loops of 10 steps, runs of 20): the table and JSON carry
every figure, timing and ratio, and no ring segment outlives the run."""

import glob
import importlib.util
import json
import os
import re

import pytest

from bench import __main__ as bench_main
from bench.suites import train_suite as suite
from infeed.ring.orphans import orphans

K, STEPS = 10, 20


def _segments() -> set:
    return set(glob.glob(f"/dev/shm/infeed-{os.getuid()}-*"))


def _rows(text: str) -> set:
    """(first column, second column) of every table row: columns are separated by two or more spaces."""
    return {tuple(re.split(r"\s{2,}", line.strip())[:2]) for line in text.splitlines() if "  " in line.strip()}


@pytest.mark.serial
def test_train_suite_prints_every_figure_timing_and_ratio_and_leaves_no_ring_behind(tmp_path, capsys, monkeypatch):
    real, calls = suite.run, []

    def tiny(*args, **kwargs):           # what `python -m bench train` asks for, on loops of K steps
        calls.append((args, kwargs))
        return real(*args, **kwargs, k=K)

    monkeypatch.setattr(suite, "run", tiny)
    out_json = tmp_path / "train.json"
    segments, orphaned = _segments(), set(orphans())
    assert bench_main.main(["train", "--quick", "--repeats", "1", "--steps", str(STEPS), "--json", str(out_json),
                            "--data-dir", str(tmp_path / "data")]) == 0
    # Every ring the measuring process and its workers made is gone (others' rings, of live processes, may be there).
    assert set(orphans()) - orphaned == set()
    assert [s for s in _segments() - segments if s in orphans()] == []
    assert calls == [(([1],), {"quick": True, "repeats": 1, "steps": STEPS, "data_dir": str(tmp_path / "data"),
                               "seed": 0})]

    text = capsys.readouterr().out
    assert text.splitlines()[0] == (f"reproduce: python -m bench train --quick --repeats 1 --steps {STEPS} "
                                    f"--json {out_json} --data-dir {tmp_path / 'data'}")
    assert "Traceback" not in text and "timings (lower is better):" in text and "ratios of medians" in text
    group = suite.group_name(1)
    keras = importlib.util.find_spec("keras") is not None      # the bench extra's peer: a row, or a note
    figures = suite.figure_names(K) + ([suite.KERAS] if keras else [])
    timings, ratios = suite.timing_names(K), suite.ratio_targets(K, keras)
    assert (suite.KERAS_MISSING in text) is not keras
    rows = _rows(text)
    for name in [*figures, *timings, *ratios]:
        assert (group, name) in rows, name
    assert f"{group}: per train() call the estimator spends" in text

    doc = json.loads(out_json.read_text())
    assert doc["command"] == text.splitlines()[0].removeprefix("reproduce: ")
    got = doc["suites"]["train"]
    assert [(f["group"], f["name"]) for f in got["figures"]] == [(group, n) for n in figures]
    for f in got["figures"]:
        assert f["repeats"] == 1 and f["records_per_s"] > 0 and f["batches_per_s"] > 0 and f["mb_per_s"] > 0
        assert f["batches"] == (STEPS - K if f["name"].endswith(suite.STEADY) else STEPS)
        assert f["records"] == f["batches"] * suite.BATCH
    assert [(t["group"], t["name"]) for t in got["timings"]] == [(group, n) for n in timings]
    for t in got["timings"]:
        assert t["samples"] == 1 and t["unit"] == ("%" if t["name"] == suite.INPUT_CPU else "ms")
        assert t["target_max"] is None
        assert t["min"] == t["median"] == t["max"] and (t["median"] >= 0 or t["name"] == suite.OVERHEAD)
    assert 0 < got["timings"][-1]["median"] < 100                       # the input's share of the CPUs
    [stages] = got["stages"]
    assert (stages["group"], stages["name"]) == (group, suite.EST) and stages["workers"] == suite.WORKERS
    assert [(r["group"], r["name"], r["target"]) for r in got["ratios"]] == [
        (group, n, target) for n, target in ratios.items()]
    assert all(r["value"] > 0 and (r["met"] is None) == (r["target"] is None) for r in got["ratios"])
    # The targets: the estimator within 5% of compile_loop fed by the same daemon, 90% of the in-memory loop, and
    # 95% of the in-memory loop less the input's CPU share.
    assert {r["name"]: r["target"] for r in got["ratios"] if r["target"] is not None} == {
        f"{suite.EST} / {suite.cl_name(K)}": 0.95, f"{suite.EST} / {suite.mem_name(K)}": 0.9,
        suite.less_input_name(K): 0.95}
    params = got["params"]
    assert params["devices"] == [1] and params["k"] == K and params["steps"] == STEPS and params["repeats"] == 1
    assert params["platform"] == "cpu" and params["jax"] and params["infeed_workers"] == suite.WORKERS
    assert os.listdir(tmp_path / "data") == [os.path.basename(got["notes"][0].rsplit(": ", 1)[1])]


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": [3]}, "does not divide over 3 devices"),
    ({"devices": [0]}, "positive ints"),
    ({"k": 0}, "k must be a positive int"),
    ({"k": 10, "steps": 25}, "a multiple of K=10"),
    ({"k": 10, "steps": 10}, "at least two loops"),
    ({"repeats": 0}, "at least 1"),
])
def test_train_suite_rejects_bad_settings_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError) as info:
        suite.run(**kwargs)
    assert message in str(info.value)


def test_steps_are_checked(capsys):
    with pytest.raises(SystemExit):
        bench_main.parse_args(["train", "--steps", "0"])
    assert "--steps must be positive" in capsys.readouterr().err


def test_devices_default_per_suite(monkeypatch):
    args = bench_main.parse_args(["train", "loop"])
    assert args.devices is None
    seen = {}
    monkeypatch.setattr(suite, "run", lambda devices, **kw: seen.setdefault("train", devices))
    monkeypatch.setattr(bench_main.loop_suite, "run", lambda devices, **kw: seen.setdefault("loop", devices))
    bench_main.SUITES["train"](args), bench_main.SUITES["loop"](args)
    assert seen == {"train": list(suite.DEVICES), "loop": list(bench_main.loop_suite.DEVICES)}
    assert bench_main.parse_args(["train", "--devices", "1,8"]).devices == [1, 8]
    assert bench_main.parse_args(["train"]).steps is None
    assert bench_main.parse_args(["train", "--steps", "200"]).steps == 200
    assert suite.default_steps() == suite.STEPS and suite.default_steps(quick=True) == suite.QUICK_STEPS
