"""`python -m bench loop` end to end on small settings: the table and JSON carry every figure, timing and ratio,
for 1 device and for 8 (each measured in its own process)."""

import functools
import json
import re

import pytest

from bench import __main__ as bench_main
from bench.harness import children
from bench.suites import loop_suite as suite


def _rows(text: str) -> set:
    """(first column, second column) of every table row: columns are separated by two or more spaces."""
    return {tuple(re.split(r"\s{2,}", line.strip())[:2]) for line in text.splitlines() if "  " in line.strip()}


def _run(tmp_path, capsys, *args):
    out_json = tmp_path / "loop.json"
    assert bench_main.main(["loop", "--repeats", "1", "--json", str(out_json), *args]) == 0
    return capsys.readouterr().out, json.loads(out_json.read_text())["suites"]["loop"]


def _check(text: str, doc: dict, devices: list, models: list, variants: bool) -> None:
    assert "Traceback" not in text and "timings (lower is better):" in text
    rows = _rows(text)
    groups = {(m, suite.group_name(m, d)) for d in devices for m in models}
    figures = {(g, n) for m, g in groups for n in suite.figure_names(m, variants)}
    timings = {(g, n) for m, g in groups for n in suite.timing_names(m)}
    ratios = {(g, n, t) for m, g in groups for n, t in suite.ratio_targets(m, variants).items()}
    assert figures | timings | {(g, n) for g, n, _ in ratios} <= rows
    assert {(f["group"], f["name"]) for f in doc["figures"]} == figures
    for f in doc["figures"]:
        assert f["repeats"] == 1 and f["records"] > 0 and f["records_per_s"] > 0 and f["batches_per_s"] > 0
        model = f["group"].split(",")[0]
        assert f["records"] == f["batches"] * suite.BATCH[model]
    assert {(t["group"], t["name"]) for t in doc["timings"]} == timings
    for t in doc["timings"]:
        assert t["samples"] >= 1 and t["min"] <= t["median"] <= t["p90"] <= t["max"]
        # host_call's two costs are differences of two runs (with the call, without): noise may take them below 0
        assert t["min"] > 0 or t["name"] in (suite.HOST_COST, suite.HOST_AFTER_COST)
        assert t["target_max"] == (suite.HOST_AFTER_TARGET_US if t["name"] == suite.HOST_AFTER_COST else None)
    assert {(r["group"], r["name"], r["target"]) for r in doc["ratios"]} == ratios
    assert all(r["value"] > 0 and (r["met"] is None) == (r["target"] is None) for r in doc["ratios"])
    # The targets: compile_loop K=100 within 3% of a hand-written scan (both models), 1.7x a per-step loop (tiny).
    targets = {(r["group"].split(",")[0], r["name"]): r["target"] for r in doc["ratios"] if r["target"] is not None}
    assert targets == {**{(m, f"{suite.cl_name(100)} / {suite.SCAN}"): 0.97 for m in models},
                       **({("tiny", f"{suite.cl_name(100)} / {suite.PY}"): 1.7} if "tiny" in models else {})}
    params = doc["params"]
    assert params["devices"] == devices and params["models"] == models and params["variants"] is variants
    assert params["in_flight"] == suite.IN_FLIGHT and params["jax"] and params["platform"] == "cpu"


def test_loop_suite_on_one_device_quick(tmp_path, capsys):
    text, doc = _run(tmp_path, capsys, "--quick", "--devices", "1")
    assert text.splitlines()[0] == (f"reproduce: python -m bench loop --repeats 1 --json {tmp_path / 'loop.json'} "
                                    "--quick --devices 1")
    _check(text, doc, [1], ["mlp", "tiny"], variants=False)
    assert doc["params"]["steps"] == {"1": {"mlp": 100, "tiny": 1000}}


def test_loop_suite_on_eight_devices_tiny_model_with_every_variant(tmp_path, capsys, monkeypatch):
    # One fresh compile_loop timed to its first step, and one from the cache, where the default takes 3 of each
    # (~10 s a sample on 2 cores): the rows and fields are the same.
    monkeypatch.setattr(suite, "run", functools.partial(suite.run, ttfs_samples=1))
    text, doc = _run(tmp_path, capsys, "--devices", "8", "--models", "tiny")
    _check(text, doc, [8], ["tiny"], variants=True)
    assert doc["params"]["steps"] == {"8": {"tiny": 1000}}
    assert "tiny, 8 devices: compile_loop costs about" in text


def test_child_env_sets_one_device_count(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/somewhere")
    env = children.child_env(1)
    assert env["XLA_FLAGS"].split() == ["--xla_cpu_foo=1", "--xla_force_host_platform_device_count=1"]
    assert env["JAX_PLATFORMS"] == "cpu" and "JAX_COMPILATION_CACHE_DIR" not in env


@pytest.mark.parametrize("kwargs, message", [
    ({"devices": [3]}, "does not divide over 3 devices"),
    ({"devices": [0]}, "positive ints"),
    ({"models": ["resnet"]}, "unknown models"),
    ({"steps": {"tiny": 1500}}, "do not divide into loops of [1000]"),
    ({"repeats": 0}, "at least 1"),
])
def test_loop_suite_rejects_bad_settings_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError) as info:
        suite.run(**kwargs)
    assert message in str(info.value)


@pytest.mark.parametrize("args, message", [(["--devices", "0"], "argument --devices: device counts must be positive"),
                                           (["--devices", "x"], "argument --devices: expected comma-separated"),
                                           (["--models", "resnet"], "unknown models ['resnet']")])
def test_loop_options_are_checked(args, message, capsys):
    with pytest.raises(SystemExit):
        bench_main.parse_args(["loop", *args])
    assert message in capsys.readouterr().err
