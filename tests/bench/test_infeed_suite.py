"""`python -m bench infeed` end to end, on a few records: the table and JSON carry every figure, timing and
ratio, each daemon figure from at least STEADY_BATCHES_PER_WORKER batches per worker or refused with the reason
(and no ratio of it), and no ring segment or worker process outlives the run."""

import glob
import json
import os
import re

import pytest

from bench import __main__ as bench_main
from bench.suites import infeed_suite as suite
from bench.harness import STEADY_BATCHES_PER_WORKER, cpus_allowed, daemon_batches
from infeed.daemon.launcher import launcher_pid
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


def _line(text: str, group: str, name: str) -> str:
    """The one printed row whose first two columns are ``group`` and ``name``."""
    [line] = [x for x in text.splitlines() if re.split(r"\s{2,}", x.strip())[:2] == [group, name]]
    return line


def _run(tmp_path, capsys, *extra):
    out_json = tmp_path / "infeed.json"
    segments, children = _segments(), _children()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    assert bench_main.main(["infeed", "--repeats", "1", "--json", str(out_json),
                            "--data-dir", str(tmp_path / "data"), *extra]) == 0
    assert affinity is None or os.sched_getaffinity(0) == affinity      # nothing pinned, nothing left pinned
    assert _created_here(_segments() - segments) == []                  # every ring removed
    launcher = launcher_pid()          # the daemons' worker launcher stays for the next daemon (one at most)
    left = {pid: cmd for pid, cmd in _children().items() if pid not in children and pid != launcher}
    assert left == {}, f"processes left behind: {left}"                 # every worker stopped and reaped
    return capsys.readouterr().out, json.loads(out_json.read_text())


def _daemon_figures(w, slots):
    return [suite.daemon_name(w), suite.indexed_name(w), *([suite.default_name(w)] if w >= 2 else []),
            suite.startup_name(w), *(suite.busy_name(w, n) for n in sorted({suite.SLOTS, *slots}))]


def _expected(workers, slots=suite.SLOT_SWEEP, layout="mnist", refused=()):
    """The figures, timings and {ratio: target} given, and the figures and ratios refused, where the worker
    counts ``refused`` are."""
    timed = [w for w in workers if w not in refused]
    figures = ([suite.PARSE] + [suite.parallel_name(w) for w in workers if w > 1]
               + [name for w in timed for name in _daemon_figures(w, slots)])
    timings = ([suite.startup_timing(w) for w in timed] + [suite.every_worker_timing(w) for w in timed if w > 1]
               + [suite.cpu_timing(w) for w in timed] + [suite.HANDOFF])
    base = min(workers)
    ratios = {f"{suite.daemon_name(w)} / {suite.PARSE}": (0.95 if w == 1 else None) for w in workers}
    ratios.update({f"{suite.daemon_name(w)} / {suite.daemon_name(base)}": None for w in workers if w != base})
    ratios.update({f"{suite.busy_name(w)} / {suite.busy_name(base)}": None for w in workers if w != base})
    ratios.update({f"{suite.parallel_name(w)} / {suite.PARSE}": None for w in workers if w > 1})
    ratios.update({f"{suite.indexed_name(w)} / {suite.daemon_name(w)}": None for w in workers})
    ratios.update({f"{suite.indexed_name(w)} / {suite.indexed_name(base)}": None for w in workers if w != base})
    ratios.update({suite.scaling_name(w): None for w in workers if w > 1 and base == 1})
    ratios.update({f"{suite.default_name(w)} / {suite.indexed_name(w)}": None for w in workers if w >= 2})
    refused_ratios = {name for name in ratios if any(re.search(rf"W={w}\b", name) for w in refused)}
    refused_figures = [name for w in refused for name in _daemon_figures(w, slots)]
    return (figures, timings, {n: t for n, t in ratios.items() if n not in refused_ratios}, refused_figures,
            refused_ratios)


def _steady_batches_or_refused(doc, text, batch_size):
    """Every daemon figure (the saved one, as printed) counts at least STEADY_BATCHES_PER_WORKER batches per
    worker, all of batch_size records; every refused one gives its reason in the table."""
    for f in doc["figures"]:
        w = re.search(r"W=(\d+)", f["name"])
        if w:
            assert f["batches"] >= STEADY_BATCHES_PER_WORKER * int(w[1]), f
            assert f["records"] == f["batches"] * batch_size[f["group"]], f
            assert _line(text, f["group"], f["name"]).endswith(f"  {f['records']:,}")
    for r in doc.get("refused", []):     # the reason in place of the numbers; never a ratio
        line = _line(text, r["group"], r["name"])
        assert line.endswith(f"  refused: {r['reason']}") and not re.search(r"\d\.\d\dx", line), line


def test_infeed_suite_prints_every_figure_timing_and_ratio_and_leaves_nothing_behind(tmp_path, capsys):
    # mnist and criteo: 19 and 38 batches of 128, W=1 and W=2 timed; imagenet: 307 records, 4 batches of 76 (a
    # small --scale), too few for any W: its daemon figures refused, and every ratio of them
    text, doc = _run(tmp_path, capsys, "--scale", "0.075")
    assert text.splitlines()[0].startswith("reproduce: python -m bench infeed --repeats 1")
    assert "Traceback" not in text and "timings (lower is better):" in text
    refused = {"mnist": (), "criteo": (), "imagenet": (1, 2)}
    expected = {layout: _expected([1, 2], layout=layout, refused=refused[layout]) for layout in LAYOUTS}
    rows = _rows(text)
    for layout, (figures, timings, ratios, refused_figures, refused_ratios) in expected.items():
        for name in [*figures, *timings, *ratios, *refused_figures, *refused_ratios]:
            assert (layout, name) in rows, (layout, name)
    suite_doc = doc["suites"]["infeed"]
    assert {(f["group"], f["name"]) for f in suite_doc["figures"]} == {(l, n) for l, e in expected.items()
                                                                       for n in e[0]}
    assert {(r["group"], r["name"], r["kind"]) for r in suite_doc["refused"]} == {
        ("imagenet", n, "figure") for n in expected["imagenet"][3]} | {
        ("imagenet", n, "ratio") for n in expected["imagenet"][4]}
    assert suite_doc["refused"][0]["reason"] == (f"W=1 needs {daemon_batches(1)} batches (1 to start, then "
                                                 f"{STEADY_BATCHES_PER_WORKER} per worker), the file has 4")
    _steady_batches_or_refused(suite_doc, text, suite_doc["params"]["batch_size"])
    for f in suite_doc["figures"]:
        assert f["repeats"] == 1 and f["records"] > 0 and f["records_per_s"] > 0 and f["mb_per_s"] > 0
        assert f["batches_per_s"] > 0
    assert {(t["group"], t["name"]) for t in suite_doc["timings"]} == {(l, n) for l, e in expected.items()
                                                                       for n in e[1]}
    for t in suite_doc["timings"]:
        assert t["samples"] >= 1 and 0 < t["min"] <= t["median"] <= t["p90"] <= t["max"]
        assert (t["target_max"], t["met"] is None) == ((suite.HANDOFF_TARGET_US, False) if t["name"] == suite.HANDOFF
                                                       else (None, True))
    assert {(r["group"], r["name"], r["target"]) for r in suite_doc["ratios"]} == {
        (l, n, target) for l, e in expected.items() for n, target in e[2].items()}
    assert {(r["group"], r["name"]) for r in suite_doc["stages"]} == {
        (l, n) for l, e in expected.items() for n in e[0] if n.startswith("daemon") and "start-up" not in n}
    for row in suite_doc["stages"]:
        assert set(row["worker_shares"]) == {"read", "inflate", "crc", "decode", "wait_for_slot", "other"}
        assert 0 <= row["trainer_wait"] <= 1 and row["bottleneck"]
    assert "Where the time went" in (tmp_path / "infeed.md").read_text()
    rates = {(f["group"], f["name"]): f["records_per_s"] for f in suite_doc["figures"]}
    assert [t["group"] for t in suite_doc["scaling"]] == LAYOUTS
    for table in suite_doc["scaling"]:
        layout = table["group"]
        check_scaling(table, layout, "idle consumer", {w: suite.daemon_name(w) for w in (1, 2)},
                      {n: r for (g, n), r in rates.items() if g == layout}, refused=refused[layout])
    assert all(r["value"] > 0 and (r["met"] is None) == (r["target"] is None) for r in suite_doc["ratios"])
    params = suite_doc["params"]
    assert params["workers"] == [1, 2] and params["slots"] == suite.SLOTS and params["pinned"] is False
    assert params["slot_sweep"] == sorted({suite.SLOTS, *suite.SLOT_SWEEP})
    assert doc["command"].startswith("python -m bench infeed")


def test_infeed_suite_with_more_workers_than_cpus_times_each_from_its_steady_batches_or_refuses_it(tmp_path, capsys):
    # W=3 and W=6 on a 2-CPU machine: the quick data is sized for W=6 (54 batches of 128), halved by --scale: 27
    # batches, exactly W=3's 3 + 3 * 8; W=6 (54) is refused, its figures and every ratio of them
    text, doc = _run(tmp_path, capsys, "--quick", "--scale", "0.5", "--layouts", "mnist", "--workers", "1,3,6",
                     "--slots", "3")
    figures, timings, ratios, refused_figures, refused_ratios = _expected([1, 3, 6], slots=[3], refused=(6,))
    assert suite.busy_name(3, 3) == "daemon W=3, 3 slots, busy consumer" and suite.busy_name(3) in figures
    suite_doc = doc["suites"]["infeed"]
    assert suite_doc["params"]["records"] == {"mnist": daemon_batches(6) * suite.BATCH_SIZE // 2}
    assert {f["name"] for f in suite_doc["figures"]} == set(figures)
    assert {t["name"] for t in suite_doc["timings"]} == set(timings)
    assert {(r["name"], r["target"]) for r in suite_doc["ratios"]} == set(ratios.items())
    assert {(r["name"], r["kind"]) for r in suite_doc["refused"]} == {
        *((n, "figure") for n in refused_figures), *((n, "ratio") for n in refused_ratios)}
    steady = {f["name"]: f["batches"] for f in suite_doc["figures"]}
    assert steady[suite.daemon_name(1)] == 26 and steady[suite.daemon_name(3)] == 24 == 3 * STEADY_BATCHES_PER_WORKER
    _steady_batches_or_refused(suite_doc, text, {"mnist": suite.BATCH_SIZE})
    rows = _rows(text)
    assert ("mnist", f"{suite.busy_name(3)} / {suite.busy_name(1)}") in rows
    assert _line(text, "mnist", suite.daemon_name(6)).endswith(
        "  refused: W=6 needs 54 batches (6 to start, then 8 per worker), the file has 27")
    assert _line(text, "mnist", f"{suite.daemon_name(6)} / {suite.daemon_name(1)}").endswith(
        f"  refused: {suite.daemon_name(6)} is refused")
    report = (tmp_path / "infeed.md").read_text()        # the saved report too
    assert "| mnist | daemon W=6 | refused: W=6 needs 54 batches" in report
    assert "| mnist | daemon W=6 / daemon W=1 | refused: daemon W=6 is refused |" in report
    # the scaling table: a row per W, printed after the figures, saved, and in the report
    [table] = suite_doc["scaling"]
    rates = {f["name"]: f["records_per_s"] for f in suite_doc["figures"]}
    check_scaling(table, "mnist", "idle consumer", {w: suite.daemon_name(w) for w in (1, 3, 6)}, rates, refused=(6,))
    assert text.index("scaling with the workers") < text.index("timings (lower is better)")
    w_cell = {w: f"{w} (oversubscribed: {cpus_allowed()} CPUs)" if w > cpus_allowed() else f"{w}" for w in (1, 3, 6)}
    printed = {re.split(r"\s{2,}", x.strip())[2]: x for x in text.splitlines()
               if re.split(r"\s{2,}", x.strip())[:2] == ["mnist", "idle consumer"]}
    assert set(printed) == set(w_cell.values())
    assert printed[w_cell[6]].endswith(
        "  refused: W=6 needs 54 batches (6 to start, then 8 per worker), the file has 27")
    assert all(f"| mnist | idle consumer | {w_cell[w]} | " in report for w in (1, 3))
    assert f"| mnist | idle consumer | {w_cell[6]} | refused: W=6 needs 54 batches" in report


def check_scaling(table, group, name, figures, rates, refused=()):
    """``table`` has a row per W of ``figures`` (W -> figure name): records/s as ``rates`` (figure name -> its
    records/s) give them, speed-up over W=1 and efficiency = speed-up / W, stage shares in 0..1, oversubscribed
    where W exceeds the CPUs; a refused W's row gives the reason and no number."""
    cpus = cpus_allowed()
    assert (table["group"], table["name"], table["cpus"]) == (group, name, cpus)
    assert [r["workers"] for r in table["rows"]] == sorted(figures)
    for row in table["rows"]:
        w = row["workers"]
        assert row["oversubscribed"] == (w > cpus)
        if w in refused:
            assert set(row) == {"workers", "oversubscribed", "refused"} and row["refused"].startswith(f"W={w} needs")
            continue
        assert row["records_per_s"] == rates[figures[w]]
        assert row["speedup"] == pytest.approx(rates[figures[w]] / rates[figures[1]])
        assert row["efficiency"] == pytest.approx(row["speedup"] / w)
        assert set(row["worker_shares"]) == {"read", "inflate", "crc", "decode", "wait_for_slot", "other"}
        assert all(0 <= x <= 1 for x in [*row["worker_shares"].values(), row["consumer_wait"]]), row


@pytest.mark.parametrize("bad", ["0", "1,x", ",", "-1"])
def test_infeed_suite_rejects_bad_worker_counts(bad, capsys):
    with pytest.raises(SystemExit):
        bench_main.parse_args(["infeed", "--workers", bad])
    assert "--workers" in capsys.readouterr().err


def test_infeed_suite_accepts_more_workers_than_cpus_and_says_so(capsys):
    assert bench_main.parse_args(["infeed", "--workers", f"1,{cpus_allowed() + 1}"]).workers == [1, cpus_allowed() + 1]
    with pytest.raises(SystemExit):
        bench_main.parse_args(["--help"])
    assert "oversubscribed" in " ".join(capsys.readouterr().out.split())


def test_record_counts_give_the_ring_room_to_turn_over_and_the_largest_w_its_steady_batches():
    from bench.data import datasets

    for layout in datasets.LAYOUTS.values():
        assert suite.record_count(layout) >= max(layout.records, suite.MIN_BATCHES * suite.BATCH_SIZE)
        for quick in (False, True):
            for w in (1, 2, 8, 16):
                assert suite.record_count(layout, quick=quick, workers=w) >= daemon_batches(w) * suite.BATCH_SIZE
        assert suite.record_count(layout, scale=1e-9) == suite.SMALLEST
