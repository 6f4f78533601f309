"""`python -m bench startup` end to end, quick: every import and run-to-first-step timing in the table, the JSON and
the report's headline (import estimator's target), the persistent cache's second run reading every program."""

import json

import pytest

from bench import __main__ as bench_main
from bench.suites import startup_suite as suite


def test_startup_suite_quick_times_imports_and_three_kinds_of_run_to_the_first_step(tmp_path, capsys):
    out_json = tmp_path / "startup.json"
    assert bench_main.main(["startup", "--quick", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "Traceback" not in text and "timings (lower is better):" in text
    doc = json.loads(out_json.read_text())["suites"]["startup"]
    imports = {("imports", suite.import_name(p)) for p in suite.IMPORTS}
    runs = {(kind, name) for kind in suite.RUNS for name in suite.TIMINGS}
    assert {(t["group"], t["name"]) for t in doc["timings"]} == imports | runs
    for t in doc["timings"]:
        assert t["unit"] == "ms" and t["samples"] == (2 if t["group"] == "imports" else 1)
        assert t["target_max"] == (suite.IMPORT_TARGET_MS if t["name"] == "import estimator" else None)
        assert t["median"] > 0 or t["name"] == suite.EXCLUDING
    for name in (f"{group}  {timing}" for group, timing in imports | runs):
        assert any(" ".join(line.split()).startswith(" ".join(name.split())) for line in text.splitlines()), name
    by = {(t["group"], t["name"]): t["median"] for t in doc["timings"]}
    for kind in suite.RUNS:
        parts = by[kind, suite.EXCLUDING] + by[kind, suite.XLA_COMPILE] + by[kind, suite.TRACE_LOWER]
        assert parts == pytest.approx(by[kind, suite.FIRST_STEP])
    p = doc["params"]
    assert p["cache_hits"][suite.NO_CACHE] == [0] and p["cache_writes"][suite.NO_CACHE] == [0]
    assert p["programs"][suite.NO_CACHE][0] > 0
    assert p["cache_writes"][suite.CACHE_FIRST] == p["programs"][suite.CACHE_FIRST]
    second = suite.CACHE_SECOND
    assert p["cache_hits"][second] == p["programs"][second] == p["cache_writes"][suite.CACHE_FIRST]
    assert p["jax"] and p["k"] == suite.K and p["repeats"] == 1
    assert "the persistent cache's second run reaches its first step in" in text
    md = (tmp_path / "startup.md").read_text()
    headline = md.split("## Headline: the targets")[1].split("\n## ")[0]
    assert "| startup | imports | import estimator |" in headline and "< 1000 ms" in headline


@pytest.mark.parametrize("repeats", [0, -1, True, 1.5])
def test_startup_suite_rejects_bad_repeats_before_starting_anything(repeats):
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        suite.run(repeats=repeats)


def test_all_runs_the_startup_suite_too():
    assert "startup" in bench_main.SUITES and bench_main.parse_args(["startup"]).suites == ["startup"]
    assert list(bench_main.SUITES)[-1] == "startup"
