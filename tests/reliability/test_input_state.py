"""The input's state: taken anywhere in the sequence, restored in a fresh process with any number
of workers, it gives exactly the batches that were left; restored with another dataset, it fails
naming what differs."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from infeed import Daemon, Dataset, FixedLen

from .processes import ROOT, SPEC, write_files

#: Batches per epoch of 100 records in batches of 7 with the last one padded.
PER_EPOCH = 15

RESTORE = textwrap.dedent("""
    import json, sys, infeed
    job = json.load(sys.stdin)
    ds = infeed.Dataset(job["files"], {"id": infeed.FixedLen((), "int64")}, **job["settings"])
    out = {}
    for point, (state, workers) in job["states"].items():
        with infeed.Daemon(ds, num_workers=workers, state=state, lock_memory=False, timeout=60) as feed:
            out[point] = [batch["id"].tolist() for batch in feed]
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("state"))


def restore_elsewhere(files, settings: dict, states: dict) -> dict:
    """``{point: ids of every batch}`` of daemons resumed in a fresh process, ``states`` being
    ``{point: (state, number of workers)}``."""
    job = json.dumps({"files": files, "settings": settings, "states": states})
    done = subprocess.run([sys.executable, "-c", RESTORE], input=job, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("shuffle_buffer", [0, 25], ids=["in order", "shuffled"])
def test_a_state_restored_in_a_fresh_process_gives_exactly_the_remaining_batches(files, shuffle_buffer):
    """Taken with 2 workers; restored with 1 or 3 (each point gets both over the two orders)."""
    settings = dict(batch_size=7, shuffle_buffer=shuffle_buffer, shuffle_files=bool(shuffle_buffer), num_epochs=2,
                    final_batch="pad", seed=3)
    ds = Dataset(files, SPEC, **settings)
    points = {"mid-epoch": 5, "at the epoch boundary": PER_EPOCH, "before the last batch": 2 * PER_EPOCH - 1,
              "at the last batch": 2 * PER_EPOCH}
    taken, states, full = {}, {}, []
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        states["at the start"], taken["at the start"] = feed.state(), 0
        for batch in feed:
            full.append(batch["id"].tolist())
            for point, n in points.items():
                if len(full) == n:
                    states[point], taken[point] = feed.state(), n
        states["after exhaustion"], taken["after exhaustion"] = feed.state(), len(full)
    assert len(full) == 2 * PER_EPOCH and len(states) == 6
    workers = {point: (1, 3)[(i + bool(shuffle_buffer)) % 2] for i, point in enumerate(states)}
    got = restore_elsewhere(files, settings, {p: (json.loads(json.dumps(states[p])), workers[p]) for p in states})
    for point, n in taken.items():
        assert got[point] == full[n:], (point, workers[point])


def test_a_state_restored_with_another_dataset_fails_naming_the_field(files):
    ds = Dataset(files, SPEC, batch_size=7, seed=3)
    with Daemon(ds, num_workers=1, lock_memory=False, timeout=60) as feed:
        next(feed)
        state = json.loads(json.dumps(feed.state()))
    others = {"files": Dataset(files[:2], SPEC, batch_size=7, seed=3),
              "features": Dataset(files, {"id": FixedLen((), "float32")}, batch_size=7, seed=3),
              "batch_size": Dataset(files, SPEC, batch_size=8, seed=3),
              "seed": Dataset(files, SPEC, batch_size=7, seed=4)}
    for field, other in others.items():
        with pytest.raises(ValueError, match=rf"another dataset \({field} differs\): saved with {field} .+, "
                                             rf"this dataset has {field} .+$"):
            Daemon(other, num_workers=1, state=state, lock_memory=False)
    with pytest.raises(ValueError, match=r"\(batch_size, seed differ\): saved with batch_size 7, this dataset has "
                                         r"batch_size 8; saved with seed 3, this dataset has seed 4$"):
        Daemon(Dataset(files, SPEC, batch_size=8, seed=4), num_workers=1, state=state, lock_memory=False)
    # A state saved before states named their settings is still checked, by its fingerprint.
    old = {k: v for k, v in state.items() if k != "dataset"}
    with pytest.raises(ValueError, match="another dataset"):
        Daemon(others["batch_size"], num_workers=1, state=old, lock_memory=False)
    with Daemon(ds, num_workers=2, state=old, lock_memory=False, timeout=60) as feed:
        assert next(feed)["id"].tolist() == list(range(7, 14))
