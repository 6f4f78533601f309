"""The harness's noise flags, the results file, its Markdown report and plots, and ``python -m bench compare``."""

import dataclasses
import json
import os
import re

import pytest

from bench import harness
from bench import __main__ as bench_main
from bench.harness import Figure, Ratio, SuiteResult, Timing
from bench.report import compare, markdown


def _figure(name, seconds, group="g", suite="s", records=1000):
    return Figure(suite, group, name, records, records * 10, len(seconds), sorted(seconds)[len(seconds) // 2],
                  min(seconds), max(seconds), batches=10)


def _suite(a=(1.0, 1.02, 1.01), b=(2.0, 2.01, 2.02), ttfs=(100.0, 104.0, 101.0)):
    r = SuiteResult("s", group_label="layout", name_label="pipeline")
    r.figures += [_figure("fast", a), _figure("slow", b)]
    r.timings.append(Timing.of("s", "g", "start-up", "ms", ttfs, target_max=500))
    r.ratios.append(Ratio("s", "g", "fast / slow", r.figure("g", "fast").records_per_s /
                          r.figure("g", "slow").records_per_s, 1.5))
    return r


def _doc(tmp_path, result, name="run.json"):
    path = tmp_path / name
    harness.write_json(path, "python -m bench s", {"cpu_model": "test"}, [result])
    return path


def test_a_figure_wider_than_the_bound_is_flagged_noisy_and_so_is_a_ratio_of_it():
    quiet, noisy, once = _figure("a", [1.0, 1.05, 1.02]), _figure("b", [1.0, 1.5, 1.2]), _figure("c", [1.0])
    assert quiet.spread == pytest.approx(0.05 / 1.02) and quiet.noise(0.10) == ""
    assert noisy.noise(0.10) == "NOISY" and noisy.noise(0.6) == ""
    assert once.noise(0.10) == "1 run"
    r = _suite(b=(2.0, 2.9, 2.5))
    assert r.ratio_noise(r.ratios[0]) == "NOISY"
    text = harness.format_result(r)
    assert "NOISY" in text and "g: slow (NOISY, spread 36%)" in text
    assert "fast / slow" in text and "(NOISY)" in text.split("fast / slow")[1].splitlines()[0]


def test_a_steady_state_timed_over_runs_of_a_few_milliseconds_is_flagged_short_and_so_is_a_ratio_of_it():
    short, long = _figure("quick", [0.004, 0.004, 0.0041]), _figure("long", [0.05, 0.05, 0.05])
    assert short.noise(0.10) == ""                  # a transfer, a loop: one timed operation, however short
    short, long = dataclasses.replace(short, steady=True), dataclasses.replace(long, steady=True)
    assert short.noise(0.10) == "SHORT" and long.noise(0.10) == ""      # a daemon's steady state
    assert dataclasses.replace(_figure("once", [0.004]), steady=True).noise(0.10) == "1 run"
    r = SuiteResult("s")
    r.figures += [short, long]
    r.ratios.append(Ratio("s", "g", "quick / long", short.records_per_s / long.records_per_s))
    assert r.ratio_noise(r.ratios[0]) == "SHORT"
    text = harness.format_result(r)
    assert ("flagged, not to be quoted before a rerun on a quieter machine or with more --repeats: 1 of 2 figures; 1 "
            "timed over runs under 50 ms each (SHORT; a larger --scale times them longer): g: quick (SHORT)") in text
    assert "(SHORT)" in text.split("quick / long")[1].splitlines()[0]


def test_one_outlier_in_five_runs_does_not_flag_a_figure_but_a_wide_middle_does():
    def measured(seconds):
        return harness.Measurement(harness.Case("x", lambda: 0, 100, 100), list(seconds)).figure("s", "g")

    outlier = measured([1.0, 1.01, 1.02, 1.0, 2.0])
    assert outlier.runs == (1.0, 1.01, 1.02, 1.0, 2.0) and outlier.seconds_max == 2.0
    assert outlier.spread == pytest.approx(0.02 / 1.01) and outlier.noise() == ""
    assert measured([1.0, 1.2, 1.4, 1.0, 1.3]).noise() == "NOISY"          # the middle runs differ by 30%
    assert measured([1.0, 1.0, 2.0]).spread == 1.0                          # too few runs for quartiles
    settled = Timing.of("s", "g", "start-up", "ms", [100, 101, 102, 100, 300])
    assert settled.spread == pytest.approx(2 / 101) and settled.noise() == ""


def test_a_latency_distribution_is_not_flagged_by_its_tail():
    many = Timing.of("s", "g", "hand-off", "us", [5.0] * 20 + [50.0])
    few = Timing.of("s", "g", "start-up", "ms", [100.0, 200.0, 150.0])
    assert many.spread is None and many.noise(0.1) == ""
    assert few.spread == pytest.approx(100 / 150) and few.noise(0.1) == "NOISY"


def test_results_file_carries_spread_noise_and_machine(tmp_path):
    doc = json.loads(_doc(tmp_path, _suite(b=(2.0, 3.0, 2.5))).read_text())
    suite = doc["suites"]["s"]
    assert suite["noise_bound"] == harness.NOISE_BOUND
    by_name = {f["name"]: f for f in suite["figures"]}
    assert by_name["fast"]["noise"] == "" and by_name["slow"]["noise"] == "NOISY"
    assert by_name["slow"]["spread"] == pytest.approx(0.4)
    assert suite["ratios"][0]["noise"] == "NOISY"
    assert doc["machine"] == {"cpu_model": "test"} and doc["command"] == "python -m bench s"


def test_report_has_the_headline_tables_notes_and_plots(tmp_path):
    r = _suite()
    r.ratios.append(Ratio("s", "g", "fast / slow, strict", 1.99, 3.0, strict=True))
    r.notes.append("a note")
    md, pngs = markdown.write_report(_doc(tmp_path, r))
    text = open(md).read()
    assert md == str(tmp_path / "run.md")
    assert "## Headline: the targets" in text and "2 of 3 targets met." in text
    assert "| s | g | start-up | 101 ms | < 500 ms: met |  |" in text
    assert "| s | g | fast / slow | 1.99x | >= 1.5x: met |  |" in text
    assert "| s | g | fast / slow, strict | 1.99x | > 3x: **MISSED** |  |" in text
    assert "python -m bench s" in text
    assert "| g | fast |" in text and "| g | start-up |" in text
    assert "- a note" in text
    assert pngs == [] or all(os.path.getsize(p) > 1000 for p in pngs)


def test_report_plots_every_suite_it_knows(tmp_path):
    pytest.importorskip("matplotlib")
    suites = []
    for suite, names in {"decode": ["page cache readinto 8 MiB", "infeed read_records"],
                         "infeed": ["parse (1 process)", "daemon W=1", "daemon W=2", "daemon W=1, busy consumer",
                                    "daemon W=1, 2 slots, busy consumer"],
                         "loop": ["per-step python loop", "hand-written scan K=100", "compile_loop K=1",
                                  "compile_loop K=100"],
                         "train": ["Estimator.train from TFRecords", "compile_loop K=100 in device memory"]}.items():
        r = SuiteResult(suite, params={"slots": 8})
        r.figures += [_figure(n, [1.0, 1.01], group="mnist", suite=suite) for n in names]
        if suite == "loop":
            r.timings += [Timing.of(suite, "mnist", "time to first step: compile_loop K=100", "ms", [900, 950]),
                          Timing.of(suite, "mnist", "time to first step: compile_loop K=100, persistent cache", "ms",
                                    [300, 310])]
        suites.append(r)
    path = tmp_path / "all.json"
    harness.write_json(path, "python -m bench all", {}, suites)
    md, pngs = markdown.write_report(path)
    assert sorted(os.path.basename(p) for p in pngs) == ["decode.png", "infeed.png", "loop.png",
                                                          "time-to-first-step.png", "train.png"]
    text = open(md).read()
    for p in pngs:
        assert f"]({os.path.relpath(p, tmp_path)})" in text
        with open(p, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_command_refuses_what_is_not_a_results_file(tmp_path, capsys):
    bad = tmp_path / "x.json"
    bad.write_text('{"figures": []}')
    assert bench_main.main(["report", str(bad)]) == 2
    assert "not a results file" in capsys.readouterr().err
    bad.write_text("{")
    assert bench_main.main(["report", str(bad)]) == 2


def _changes(tmp_path, old, new, **kw):
    a, b = _doc(tmp_path, old, "old.json"), _doc(tmp_path, new, "new.json")
    return {(c.kind, c.name): c for c in compare.compare(harness.read_json(a), harness.read_json(b), **kw)[0]}


def test_compare_flags_a_regression_only_beyond_threshold_and_noise(tmp_path):
    old = _suite(a=(1.0, 1.01, 1.02), b=(2.0, 2.01, 2.02), ttfs=(100, 101, 102))
    # fast: 20% slower, ranges apart -> regression; slow: 20% slower but inside old's wide range -> "~"
    new = _suite(a=(1.2, 1.21, 1.22), b=(3.0, 3.01, 3.02), ttfs=(80, 81, 82))
    old.figures[1] = _figure("slow", [2.0, 2.5, 3.0])
    c = _changes(tmp_path, old, new)
    assert c[("figure", "fast")].verdict == "regression"
    assert c[("figure", "fast")].change == pytest.approx(1.01 / 1.21 - 1)
    assert c[("figure", "slow")].verdict == "~"
    assert c[("timing", "start-up")].verdict == "improvement"            # shorter is better
    assert c[("ratio", "fast / slow")].verdict == "~"                     # old's slow figure was noisy
    same = _changes(tmp_path, old, old)
    assert {x.verdict for x in same.values()} == {""}


def test_compare_command_exit_status_and_lines(tmp_path, capsys):
    old, new = _suite(), _suite(a=(1.5, 1.51, 1.52))
    new.figures.append(_figure("extra", [1.0, 1.0]))
    a, b = _doc(tmp_path, old, "old.json"), _doc(tmp_path, new, "new.json")
    assert bench_main.main(["compare", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "s | g | fast" in out and "REGRESSION" in out
    assert "only in NEW: figure s / g: extra" in out
    assert "2 regressed" in out          # the figure, and the ratio of it
    assert bench_main.main(["compare", str(a), str(a)]) == 0
    assert bench_main.main(["compare", str(a), str(tmp_path / "missing.json")]) == 2


def test_a_run_saves_results_report_under_out_named_by_date_and_host(tmp_path, capsys):
    out = tmp_path / "results"
    assert bench_main.main(["decode", "--scale", "0.004", "--repeats", "1", "--no-tf", "--layouts", "criteo",
                            "--out", str(out)]) == 0
    files = sorted(os.listdir(out))
    [json_file] = [f for f in files if f.endswith(".json")]
    stem = json_file[:-5]
    assert f"{stem}.md" in files
    assert stem[:4].isdigit() and stem.count("-") >= 4          # <YYYY-MM-DD-HHMMSS>-<host>
    doc = json.loads((out / json_file).read_text())
    assert {"host", "cpu_model", "memory_gib", "jax", "jaxlib", "numpy", "backend"} <= set(doc["machine"])
    printed = capsys.readouterr()
    assert f"wrote {out / json_file}" in printed.out
    assert "[1/1] decode: starting" in printed.err and "[1/1] decode: done in" in printed.err


def test_no_save_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert bench_main.main(["decode", "--scale", "0.004", "--repeats", "1", "--no-tf", "--layouts", "criteo",
                            "--no-save"]) == 0
    assert os.listdir(tmp_path) == []


def test_a_scaling_table_has_a_row_per_w_its_efficiency_and_shares_a_refused_w_and_its_plot(tmp_path):
    r = SuiteResult("infeed", group_label="layout", name_label="pipeline")
    shares = {"read": 0.1, "inflate": 0.0, "crc": 0.1, "decode": 0.5, "wait_for_slot": 0.2, "other": 0.1}
    for w, seconds in {1: 1.0, 2: 0.6, 4: 0.4}.items():
        r.figures.append(_figure(f"daemon W={w}", [seconds], group="mnist", suite="infeed"))
        r.stages.append({"group": "mnist", "name": f"daemon W={w}", "trainer_wait": 0.25, "worker_shares": shares,
                         "us_per_record": {"read": 1.0, "inflate": 0.0, "crc": 1.0, "decode": 5.0 * w},
                         "bottleneck": "decode", "worker_decode_us_per_record": [5.0 * w] * (w - 1) + [7.5 * w]})
    bound = {1: "parse (1 process)", 2: "parse (2 processes at once)", 4: "parse (4 processes at once)"}
    for w, seconds in {1: 1.0, 2: 0.55, 4: 0.3}.items():       # what W processes parsing alone give
        r.figures.append(_figure(bound[w], [seconds], group="mnist", suite="infeed"))
    r.refuse("mnist", ["daemon W=8"], "W=8 needs 72 batches (8 to start, then 8 per worker), the file has 27")
    r.add_scaling("mnist", "idle consumer", {w: f"daemon W={w}" for w in (1, 2, 4, 8)}, bound)
    r.add_scaling("mnist", "one W only", {1: "daemon W=1"})          # one W: no table
    [table] = r.scaling
    rows = {row["workers"]: row for row in table["rows"]}
    assert sorted(rows) == [1, 2, 4, 8]
    assert [rows[w]["speedup"] for w in (1, 2, 4)] == pytest.approx([1.0, 1 / 0.6, 2.5])
    assert [rows[w]["efficiency"] for w in (1, 2, 4)] == pytest.approx([1.0, 1 / 1.2, 0.625])
    assert rows[8] == {"workers": 8, "oversubscribed": 8 > harness.cpus_allowed(), "refused": r.refused[0].reason}
    assert all(rows[w]["worker_shares"] == shares and rows[w]["consumer_wait"] == 0.25 for w in (1, 2, 4))
    assert [rows[w]["decode_us_per_record"] for w in (1, 2, 4)] == [5.0, 10.0, 20.0]     # each worker slower
    assert "decode_slowest_over_fastest" not in rows[1] and rows[4]["decode_slowest_over_fastest"] == 1.5
    assert [rows[w]["bound_speedup"] for w in (1, 2, 4)] == pytest.approx([1.0, 1 / 0.55, 1 / 0.3])
    assert [rows[w]["of_bound"] for w in (1, 2, 4)] == pytest.approx([1.0, 0.55 / 0.6, 0.75])
    text = harness.format_result(r)
    assert "  refused: W=8 needs 72 batches" in text and "  62%  " in text and "  2.50x  " in text
    assert re.search(r"W processes alone +of that\n", text) and re.search(r"  20\.0 +1\.50x +3\.33x +75%\n", text)
    md, pngs = markdown.write_report(_doc(tmp_path, r))
    assert json.loads((tmp_path / "run.json").read_text())["suites"]["infeed"]["scaling"] == r.scaling
    page = open(md).read()
    four, eight = (f"{w} (oversubscribed: {table['cpus']} CPUs)" if w > table["cpus"] else f"{w}" for w in (4, 8))
    assert (f"| mnist | idle consumer | {four} | 2,500 | 2.50x | 62 % | 10 % | 0 % | 10 % | 50 % | 20 % | 10 % | 25 % "
            f"| 20.0 | 1.50x | 3.33x | 75 % |" in page)
    assert f"| mnist | idle consumer | {eight} | refused: W=8 needs 72 batches" in page
    assert pngs == [] or "infeed-scaling.png" in [os.path.basename(p) for p in pngs]


def test_a_speed_up_above_w_is_flagged_as_what_w_cpus_cannot_give(tmp_path):
    """W=2 at 2.34x one worker (the W=1 run was slow) is no figure to quote: the row says so, and the table why."""
    r = SuiteResult("images", group_label="source", name_label="pipeline")
    shares = {"read": 0.0, "inflate": 0.0, "crc": 0.0, "decode": 1.0, "wait_for_slot": 0.0, "other": 0.0}
    for w, seconds in {1: 2.34, 2: 1.0, 4: 0.6}.items():
        r.figures.append(_figure(f"daemon W={w}", [seconds] * 3, group="500x375", suite="images"))
        r.stages.append({"group": "500x375", "name": f"daemon W={w}", "trainer_wait": 1.0, "worker_shares": shares,
                         "us_per_record": {"read": 0.0, "inflate": 0.0, "crc": 0.0, "decode": 1000.0},
                         "bottleneck": "decode"})
    r.add_scaling("500x375", "centre crop", {w: f"daemon W={w}" for w in (1, 2, 4)})
    rows = {row["workers"]: row for row in r.scaling[0]["rows"]}
    assert rows[2]["over_w"] == ["speedup"] and "over_w" not in rows[1] and "over_w" not in rows[4]   # 3.9x at W=4
    text = harness.format_scaling(r.scaling)
    assert "  2.34x (> W)  " in text and text.endswith(harness.OVER_W_NOTE) and "3.90x (> W)" not in text
    md, _ = markdown.write_report(_doc(tmp_path, r))
    assert "| 2.34x (> W) |" in open(md).read() and harness.OVER_W_NOTE in open(md).read()


def test_jax_devices_asks_a_fresh_process_once_per_environment(monkeypatch):
    from bench.harness import machine

    asked = []
    monkeypatch.setattr(machine, "_devices_seen", {})
    monkeypatch.setattr(machine, "_ask_jax_devices", lambda timeout: asked.append(os.environ.get("XLA_FLAGS")) or
                        {"backend": "cpu", "devices": ["1 x cpu"]})
    first = machine.jax_devices()
    first["devices"].append("changed by the caller")
    assert machine.jax_devices() == {"backend": "cpu", "devices": ["1 x cpu"]} and len(asked) == 1
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    machine.jax_devices()
    assert asked == [asked[0], "--xla_force_host_platform_device_count=2"]


def test_a_bench_run_keeps_the_indexes_its_daemons_build_in_a_directory_of_its_own(monkeypatch):
    """Its data is its own (often temporary): their entries would stay in the user's index cache for good."""
    monkeypatch.delenv("INFEED_INDEX_DIR", raising=False)
    with bench_main._indexes_of_its_own():
        kept = os.environ["INFEED_INDEX_DIR"]
        assert os.path.isdir(kept) and os.path.basename(kept).startswith("bench-indexes-")
    assert "INFEED_INDEX_DIR" not in os.environ and not os.path.exists(kept)
    monkeypatch.setenv("INFEED_INDEX_DIR", "/somewhere/named")             # named by the user: theirs
    with bench_main._indexes_of_its_own():
        assert os.environ["INFEED_INDEX_DIR"] == "/somewhere/named"
