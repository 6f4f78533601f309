"""`python -m bench infeed` end to end, on a few records: the table and JSON carry every figure, timing and
ratio, and no ring segment or worker process outlives the run."""

import glob
import json
import os
import re

import pytest

from bench import __main__ as bench_main
from bench import infeed_suite as suite
from infeed.errors import AttachError
from infeed.ring import Ring

LAYOUTS = ["mnist", "criteo", "imagenet"]


def _segments() -> set:
    return set(glob.glob(f"/dev/shm/infeed-{os.getuid()}-*"))


def _created_here(paths) -> list:
    """The segments among ``paths`` that this process created (other processes may be making rings meanwhile)."""
    mine = []
    for path in paths:
        try:
            ring = Ring.attach(os.path.basename(path))
        except (AttachError, OSError):      # gone meanwhile, or not a finished ring
            continue
        try:
            if ring.creator_pid == os.getpid():
                mine.append(path)
        finally:
            ring.close()
    return mine


def _children() -> dict:
    """{pid: command line} of this process's child processes (zombies included, as '<zombie>')."""
    out = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat, "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            if int(fields[1]) != os.getpid():
                continue
            with open(stat[:-4] + "cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out[int(stat.split("/")[2])] = cmd if fields[0] != b"Z" else "<zombie>"
        except (OSError, ValueError, IndexError):
            continue
    return out


def _rows(text: str) -> set:
    """(first column, second column) of every table row: columns are separated by two or more spaces."""
    return {tuple(re.split(r"\s{2,}", line.strip())[:2]) for line in text.splitlines() if "  " in line.strip()}


def _run(tmp_path, capsys, *extra):
    out_json = tmp_path / "infeed.json"
    segments, children = _segments(), _children()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert bench_main.main(["infeed", "--scale", "0.004", "--repeats", "1", "--json", str(out_json),
                            "--data-dir", str(tmp_path / "data"), *extra]) == 0
    assert affinity is None or os.sched_getaffinity(0) == affinity      # nothing pinned, nothing left pinned
    assert _created_here(_segments() - segments) == []                  # every ring removed
    left = {pid: cmd for pid, cmd in _children().items() if pid not in children}
    assert left == {}, f"processes left behind: {left}"                 # every worker stopped and reaped
    return capsys.readouterr().out, json.loads(out_json.read_text())


def _expected(workers, slots=suite.SLOT_SWEEP, layout="mnist"):
    figures = ([suite.PARSE] + [suite.parallel_name(w) for w in workers if w > 1]
               + [f(w) for f in (suite.daemon_name, suite.indexed_name, suite.startup_name) for w in workers]
               + [suite.busy_name(w, n) for w in workers for n in sorted({suite.SLOTS, *slots})])
    timings = ([suite.startup_timing(w) for w in workers] + [suite.every_worker_timing(w) for w in workers if w > 1]
               + [suite.cpu_timing(w) for w in workers] + [suite.HANDOFF])
    base = min(workers)
    ratios = {f"{suite.daemon_name(w)} / {suite.PARSE}": (0.95 if w == 1 else None) for w in workers}
    ratios.update({f"{suite.daemon_name(w)} / {suite.daemon_name(base)}": None for w in workers if w != base})
    ratios.update({f"{suite.busy_name(w)} / {suite.busy_name(base)}": None for w in workers if w != base})
    ratios.update({f"{suite.parallel_name(w)} / {suite.PARSE}": None for w in workers if w > 1})
    ratios.update({f"{suite.indexed_name(w)} / {suite.daemon_name(w)}": None for w in workers})
    ratios.update({f"{suite.indexed_name(w)} / {suite.indexed_name(base)}": None for w in workers if w != base})
    ratios.update({suite.scaling_name(w): None for w in workers if w > 1 and base == 1})
    return figures, timings, ratios


def test_infeed_suite_prints_every_figure_timing_and_ratio_and_leaves_nothing_behind(tmp_path, capsys):
    text, doc = _run(tmp_path, capsys)
    assert text.splitlines()[0].startswith("reproduce: python -m bench infeed --scale 0.004")
    assert "Traceback" not in text and "timings (lower is better):" in text
    figures, timings, ratios = _expected([1, 2])
    rows = _rows(text)
    for layout in LAYOUTS:
        for name in figures + timings:
            assert (layout, name) in rows, (layout, name)
        for name in ratios:
            assert (layout, name) in rows, (layout, name)
    suite_doc = doc["suites"]["infeed"]
    assert {(f["group"], f["name"]) for f in suite_doc["figures"]} == {(l, n) for l in LAYOUTS for n in figures}
    for f in suite_doc["figures"]:
        assert f["repeats"] == 1 and f["records"] > 0 and f["records_per_s"] > 0 and f["mb_per_s"] > 0
        assert f["batches_per_s"] > 0
    assert {(t["group"], t["name"]) for t in suite_doc["timings"]} == {(l, n) for l in LAYOUTS for n in timings}
    for t in suite_doc["timings"]:
        assert t["samples"] >= 1 and 0 < t["min"] <= t["median"] <= t["p90"] <= t["max"]
        assert (t["target_max"], t["met"] is None) == ((suite.HANDOFF_TARGET_US, False) if t["name"] == suite.HANDOFF
                                                       else (None, True))
    assert {(r["group"], r["name"], r["target"]) for r in suite_doc["ratios"]} == {
        (l, n, target) for l in LAYOUTS for n, target in _expected([1, 2], layout=l)[2].items()}
    daemons = [n for n in figures if n.startswith("daemon") and "start-up" not in n]
    assert {(r["group"], r["name"]) for r in suite_doc["stages"]} == {(l, n) for l in LAYOUTS for n in daemons}
    for row in suite_doc["stages"]:
        assert set(row["worker_shares"]) == {"read", "inflate", "crc", "decode", "wait_for_slot", "other"}
        assert 0 <= row["trainer_wait"] <= 1 and row["bottleneck"]
    assert "Where the time went" in (tmp_path / "infeed.md").read_text()
    assert all(r["value"] > 0 and (r["met"] is None) == (r["target"] is None) for r in suite_doc["ratios"])
    params = suite_doc["params"]
    assert params["workers"] == [1, 2] and params["slots"] == suite.SLOTS and params["pinned"] is False
    assert params["slot_sweep"] == sorted({suite.SLOTS, *suite.SLOT_SWEEP})
    assert doc["command"].startswith("python -m bench infeed")


def test_infeed_suite_with_other_worker_counts(tmp_path, capsys):
    text, doc = _run(tmp_path, capsys, "--layouts", "mnist", "--workers", "1,3", "--slots", "3")
    figures, timings, ratios = _expected([1, 3], slots=[3])
    assert suite.busy_name(3, 3) == "daemon W=3, 3 slots, busy consumer" and suite.busy_name(3) in figures
    suite_doc = doc["suites"]["infeed"]
    assert {f["name"] for f in suite_doc["figures"]} == set(figures)
    assert {t["name"] for t in suite_doc["timings"]} == set(timings)
    assert {(r["name"], r["target"]) for r in suite_doc["ratios"]} == set(ratios.items())
    assert ("mnist", f"{suite.busy_name(3)} / {suite.busy_name(1)}") in _rows(text)


@pytest.mark.parametrize("bad", ["0", "1,x", ",", "-1"])
def test_infeed_suite_rejects_bad_worker_counts(bad, capsys):
    with pytest.raises(SystemExit):
        bench_main.parse_args(["infeed", "--workers", bad])
    assert "--workers" in capsys.readouterr().err


def test_record_counts_give_the_ring_room_to_turn_over():
    from bench import datasets

    for layout in datasets.LAYOUTS.values():
        assert suite.record_count(layout) >= max(layout.records, suite.MIN_BATCHES * suite.BATCH_SIZE)
        assert suite.record_count(layout, quick=True) >= suite.QUICK_MIN_BATCHES * suite.BATCH_SIZE
        assert suite.record_count(layout, scale=1e-9) == suite.SMALLEST
