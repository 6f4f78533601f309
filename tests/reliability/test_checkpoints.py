"""Issue 8, checkpoints: a save killed at any point loses nothing, a failed save is raised, a damaged
file is named and never restored, ``keep`` deletes only our own checkpoints, a NaN/Inf loss stops training."""

import errno
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
import xla_runtime
from estimator.checkpoints import Checkpoints
from estimator.checkpoints.manifest import MANIFEST
from estimator.checkpoints.warm_start import warm_start
from estimator.errors import CheckpointSaveError, CorruptCheckpointError
from orbax.checkpoint._src.path import async_path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}

# --- a save killed at random points -------------------------------------------------------------

STEPS, EVERY, KEEP, SIZE = 32, 2, 2, 1 << 20        # 2 arrays of 1M float32: 8 MiB a checkpoint

_TRAINER = """
import os, signal, sys
import jax, jax.numpy as jnp
from tests.reliability.test_checkpoints import train_step, initial_state, STEPS, EVERY, KEEP
import estimator.checkpoints.manager as checkpoints
from orbax.checkpoint._src.path import async_path

directory, kill_at = sys.argv[1], sys.argv[2]
def die():
    os.kill(os.getpid(), signal.SIGKILL)
if kill_at == "manifest written":             # the manifest is in the temporary directory, orbax has not committed
    write = checkpoints.write_manifest
    def write_manifest(path, step):
        write(path, step)
        if step == 3 * EVERY:
            die()
    checkpoints.write_manifest = write_manifest
elif kill_at == "before the rename":          # every file written, commit_success.txt too: only the rename is left
    rename = async_path.rename
    async def renamed(src, dst):
        if str(dst.parent) == directory and dst.name == str(3 * EVERY):
            die()
        return await rename(src, dst)
    async_path.rename = renamed
elif kill_at == "deleting an old checkpoint":  # a few of an old checkpoint's files gone
    rmtree, unlink, unlinked = checkpoints._rmtree, os.unlink, []
    def _rmtree(path):
        if path.name.endswith(".deleting"):
            os.unlink = counted
        rmtree(path)
    def counted(*args, **kwargs):
        unlinked.append(args)
        if len(unlinked) == 4:
            die()
        return unlink(*args, **kwargs)
    checkpoints._rmtree = _rmtree

ckpt = checkpoints.Checkpoints(directory, keep=KEEP)
state, step = initial_state(), 0
state = train_step(state, jnp.int32(0))    # compiled before the clock starts
state = initial_state()
print("ready", flush=True)
while step < STEPS:
    step += 1
    state = train_step(state, jnp.int32(step))
    if step % EVERY == 0:
        ckpt.save(step, state, {"step": step})
        print("committed", step - EVERY, flush=True)   # save() waited for the previous save
ckpt.close()
print("committed", STEPS, flush=True)
"""


@jax.jit
def train_step(state, step):
    w = state["w"] * 0.99 + jnp.sin(state["v"] + step.astype(jnp.float32))
    return {"w": w, "v": state["v"] + 1e-3 * w}


def initial_state():
    return {"w": jnp.linspace(-1.0, 1.0, SIZE, dtype=jnp.float32), "v": jnp.zeros(SIZE, jnp.float32)}


@pytest.fixture(scope="module")
def trajectory():
    """The uninterrupted run's state after each step (0: the initial state), as numpy."""
    states, state = [jax.device_get(initial_state())], initial_state()
    for step in range(1, STEPS + 1):
        state = train_step(state, jnp.int32(step))
        states.append(jax.device_get(state))
    return states


_DELAYS = random.Random(8).sample(range(20, 800, 10), 3)    # ms after the first step (a run takes ~1 s): seeded
# What each precise kill leaves: the step directories listed, and the leftovers beside them.
_LEFT_BY = {"manifest written": (["2", "4"], ["6.orbax-checkpoint-tmp"]),
            "before the rename": (["2", "4"], ["6.orbax-checkpoint-tmp"]),
            "deleting an old checkpoint": (["4", "6"], [".2.deleting"])}


@pytest.mark.parametrize("kill_at", ["manifest written", "before the rename", "deleting an old checkpoint"]
                         + [f"{ms} ms in" for ms in _DELAYS])
def test_a_save_killed_at_any_point_keeps_the_last_checkpoint_and_resumes_to_the_same_weights(
        tmp_path, trajectory, kill_at):
    directory = tmp_path / "checkpoints"
    child = subprocess.Popen([sys.executable, "-c", _TRAINER, str(directory), kill_at], env=ENV, cwd=ROOT,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        if kill_at.endswith("ms in"):
            time.sleep(int(kill_at.split()[0]) / 1000)
            child.send_signal(signal.SIGKILL)
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == -signal.SIGKILL, out
    if kill_at in _LEFT_BY:
        names = sorted(os.listdir(directory))
        assert ([n for n in names if n.isdigit()], [n for n in names if not n.isdigit()]) == _LEFT_BY[kill_at]
        if kill_at == "before the rename":                  # complete but for the rename: still not listed
            # (orbax >= 0.12.3 has written its commit_success.txt there too; older orbax writes none locally)
            assert MANIFEST in os.listdir(directory / "6.orbax-checkpoint-tmp")
    # whole lines only: the kill may cut the last one short ("committed" without its step, or "committed 1" of 12)
    committed = max([int(line.split()[1]) for line in out.split("\n")[:-1] if line.startswith("committed")] + [0])

    with Checkpoints(directory, keep=KEEP) as ckpt:
        steps = ckpt.all_steps()
        # the previous checkpoint stays the latest: every save that had completed is listed, the partial one is not
        assert committed == 0 or (steps and steps[-1] >= committed), (steps, committed)
        for step in steps:                                    # and each listed one holds exactly that step's state
            state, extras = ckpt.restore_numpy(step)
            assert extras == {"step": step}
            for name in ("w", "v"):
                np.testing.assert_array_equal(state[name], trajectory[step][name], err_msg=f"step {step}")
        start = steps[-1] if steps else 0
        state = ckpt.restore(initial_state())[0] if steps else initial_state()
        for step in range(start + 1, STEPS + 1):             # resume
            state = train_step(state, jnp.int32(step))
        for name in ("w", "v"):
            np.testing.assert_array_equal(np.asarray(state[name]), trajectory[STEPS][name])
        ckpt.save(STEPS + EVERY, state, {"step": STEPS + EVERY})     # the next run's first save cleans up
    left = sorted(os.listdir(directory))
    assert all(name.isdigit() for name in left) and len(left) <= KEEP, left


def test_a_partial_checkpoint_is_ignored_and_cleaned_at_the_next_start(tmp_path):
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(5, {"w": jnp.ones(2)}, {"step": 5})
        ckpt.wait()
    leftovers = [tmp_path / "9.orbax-checkpoint-tmp", tmp_path / "11.orbax-checkpoint-tmp-1732012345678",
                 tmp_path / ".3.deleting"]                    # what killed saves and deletions leave
    for path in leftovers:
        (path / "state").mkdir(parents=True)
        (path / "state" / "manifest.ocdbt").write_bytes(b"\0" * 10)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "12.orbax-checkpoint-tmp").symlink_to(tmp_path / "elsewhere")    # not a directory of ours
    with Checkpoints(tmp_path) as ckpt:
        assert ckpt.all_steps() == [5] and ckpt.latest_step() == 5
        assert ckpt.restore_numpy()[1] == {"step": 5}
        with pytest.raises(FileNotFoundError, match="no complete checkpoint 9"):
            ckpt.restore_numpy(9)
        assert all(path.exists() for path in leftovers)      # a reader removes nothing: a writer may be at work
        ckpt.save(6, {"w": jnp.zeros(2)}, {"step": 6})
        ckpt.wait()
        assert ckpt.all_steps() == [5, 6]
    assert sorted(os.listdir(tmp_path)) == ["12.orbax-checkpoint-tmp", "5", "6", "elsewhere"]


# --- failed saves -------------------------------------------------------------------------------

D = 4


def _linear_model(nan_from=None, value=jnp.nan):
    def model_fn(variables, features, labels, mode, params):
        loss = jnp.mean((features @ variables["params"]["w"] - labels) ** 2)
        if nan_from is not None:
            loss = jnp.where(xla_runtime.current_step() >= nan_from, value, loss)
        return est.EstimatorSpec(mode, loss=loss)
    return model_fn


def _init_fn(rng, features):
    return {"params": {"w": jax.random.normal(rng, (D,)) * 0.1}}


def _input_fn(params):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(params["batch_size"], D)).astype(np.float32)
    return itertools.repeat((x, x @ np.arange(1.0, D + 1, dtype=np.float32)))   # the same batch every step


def _estimator(model_dir, model_fn=None, **config):
    config = est.RunConfig(model_dir=str(model_dir), iterations_per_loop=5, save_checkpoints_steps=5, **config)
    return est.Estimator(model_fn or _linear_model(), _init_fn, optax.sgd(0.05), config, train_batch_size=8)


def test_a_failed_async_save_is_raised_in_the_trainer_naming_the_step_and_directory(tmp_path, monkeypatch):
    rename = async_path.rename

    async def failing(src, dst):
        if dst.name == "10" and dst.parent.name == "checkpoints":
            raise OSError(errno.EIO, "Input/output error (injected)", str(src))
        return await rename(src, dst)

    e = _estimator(tmp_path / "run")
    monkeypatch.setattr(async_path, "rename", failing)
    with pytest.raises(CheckpointSaveError) as error:
        e.train(_input_fn, max_steps=15)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert error.value.step == 10 and error.value.path == str(checkpoints / "10")
    assert str(error.value).startswith(f"saving checkpoint 10 to {checkpoints / '10'} failed: OSError: [Errno 5]")
    assert isinstance(error.value.__cause__, OSError) and error.value.__cause__.errno == errno.EIO
    assert e.checkpoints.all_steps() == [5] and sorted(os.listdir(checkpoints)) == ["5"]   # nothing half-written left

    monkeypatch.setattr(async_path, "rename", rename)
    assert e.train(_input_fn, max_steps=15).global_step() == 15                 # goes on from step 5
    uninterrupted = _estimator(tmp_path / "whole").train(_input_fn, max_steps=15)
    np.testing.assert_array_equal(e.get_variables()["params"]["w"], uninterrupted.get_variables()["params"]["w"])


_FAILING_DIRECTORY = """
import json, os, subprocess, sys
import numpy as np, jax.numpy as jnp
from estimator.checkpoints import Checkpoints
from estimator.errors import CheckpointSaveError
directory, failure = sys.argv[1], sys.argv[2]
if failure == "disk full":      # a 2 MiB file system, in this process's own mount namespace
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", directory], check=True)
ckpt = Checkpoints(directory)
ckpt.save(1, {"w": jnp.ones(4)}, {"step": 1})
ckpt.wait()
if failure == "read-only":
    subprocess.run(["mount", "--bind", directory, directory], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", directory, directory], check=True)
result = {}
try:
    ckpt.save(2, {"w": np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)}, {"step": 2})  # 4 MiB
    result["raised_by"] = "wait"
    ckpt.wait()
    result["raised_by"] = None
except CheckpointSaveError as e:
    result.update(step=e.step, path=e.path, message=str(e))
    result.setdefault("raised_by", "save")
result["steps"] = ckpt.all_steps()
result["restored"] = ckpt.restore_numpy()[1]
result["left"] = sorted(os.listdir(directory))
ckpt.close()
print(json.dumps(result))
"""


@pytest.mark.parametrize("failure, expected", [("read-only", "Read-only file system"),
                                               ("disk full", "No space left on device")])
def test_a_save_into_a_read_only_or_full_directory_is_raised_naming_it(tmp_path, failure, expected):
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("needs a mount namespace (unshare -rm) to make a directory read-only or full")
    command = ["unshare", "-rm", "--propagation", "private", sys.executable, "-c", _FAILING_DIRECTORY,
               str(tmp_path), failure]
    child = subprocess.run(command, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(child.stdout.splitlines()[-1])
    # raised by the trainer's next call: save() when the directory cannot even be made, else wait()
    assert result["raised_by"] == ("save" if failure == "read-only" else "wait")
    assert result["step"] == 2 and result["path"] == str(tmp_path / "2")
    assert result["message"].startswith(f"saving checkpoint 2 to {tmp_path / '2'} failed:")
    assert expected in result["message"]
    assert result["steps"] == [1] and result["restored"] == {"step": 1}
    assert result["left"] == ["1"]                      # what the failed save wrote is gone


# --- damaged files ------------------------------------------------------------------------------

def _saved(directory):
    with Checkpoints(directory) as ckpt:
        ckpt.save(3, {"w": jnp.arange(1000.0), "b": jnp.ones(10)}, {"input": {"batch": 3}})
        ckpt.wait()
    return directory / "3"


def _largest_array_file(checkpoint):
    return max((p for p in (checkpoint / "state").rglob("*") if p.is_file() and "/d/" in str(p)),
               key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("which", ["array data", "state/_METADATA", "extras/metadata", MANIFEST])
def test_a_damaged_checkpoint_file_fails_to_restore_naming_it(tmp_path, which, damage):
    checkpoint = _saved(tmp_path)
    path = _largest_array_file(checkpoint) if which == "array data" else checkpoint / which
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01           # one bit: without the digests orbax restores other numbers
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[:len(data) // 2]))
    else:
        path.unlink()
    with Checkpoints(tmp_path) as ckpt:
        reads = [ckpt.restore_numpy, lambda: ckpt.restore({"w": jnp.zeros(1000), "b": jnp.zeros(10)}),
                 lambda: warm_start(str(checkpoint), {"w": jnp.zeros(1000)})]
        if which not in ("array data", "state/_METADATA"):
            reads.append(ckpt.extras)
        for read in reads:
            with pytest.raises(CorruptCheckpointError) as error:
                read()
            assert error.value.path == str(path) and error.value.checkpoint == str(checkpoint)
            assert str(path) in str(error.value) and "nothing was restored" in str(error.value)
    reason = error.value.reason
    if damage == "delete":
        assert reason.startswith("missing")
    elif which == MANIFEST:
        assert reason == "its own digest does not match" or reason.startswith("not a digest manifest")
    elif damage == "flip":
        assert reason.startswith("its SHA-256 is ") and reason.endswith(" was written")
    else:
        assert reason == f"{len(data) // 2} bytes, {len(data)} were written"


def test_a_checkpoint_without_its_manifest_is_read_only_when_asked_unverified(tmp_path):
    checkpoint = _saved(tmp_path)
    (checkpoint / MANIFEST).unlink()                     # as a checkpoint written before the manifest existed
    with Checkpoints(tmp_path) as ckpt:
        assert ckpt.latest_step() == 3
        with pytest.raises(CorruptCheckpointError, match="verify=False"):
            ckpt.restore_numpy()
        assert ckpt.restore_numpy(verify=False)[1] == {"input": {"batch": 3}}


def test_a_checkpoint_renamed_to_another_step_is_refused(tmp_path):
    checkpoint = _saved(tmp_path)
    checkpoint.rename(tmp_path / "30")
    with Checkpoints(tmp_path) as ckpt, pytest.raises(CorruptCheckpointError, match="written for step 3, not 30"):
        ckpt.restore_numpy()


# --- keep_checkpoint_max ------------------------------------------------------------------------

def test_keep_deletes_only_our_own_checkpoints_never_user_files_or_behind_a_symlink(tmp_path):
    root, outside = tmp_path / "checkpoints", tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("the user's")
    _saved(outside / "archive")                                  # a real checkpoint, linked in as step 2
    root.mkdir()
    (root / "notes.txt").write_text("the user's")
    (root / "1").mkdir()                                          # a directory named like a step: not ours
    (root / "1" / "data.bin").write_bytes(b"the user's")
    (root / "2").symlink_to(outside / "archive" / "3")
    (root / "3").symlink_to(outside)                              # a link to a directory of user files
    with Checkpoints(root, keep=2) as ckpt:
        assert ckpt.all_steps() == []                              # neither a user's directory nor a link is listed
        ckpt.save(4, {"w": jnp.full(3, 4.0)})
        ckpt.wait()
        (root / "4" / "state" / "link").symlink_to(outside / "precious.txt")   # inside our own checkpoint
        for step in range(5, 9):
            ckpt.save(step, {"w": jnp.full(3, float(step))})
        ckpt.wait()
        assert ckpt.all_steps() == [7, 8]
    assert sorted(os.listdir(root)) == ["1", "2", "3", "7", "8", "notes.txt"]
    assert (root / "notes.txt").read_text() == "the user's" and (root / "1" / "data.bin").read_bytes() == b"the user's"
    assert (outside / "precious.txt").read_text() == "the user's"
    assert sorted(os.listdir(outside / "archive" / "3")) == sorted(os.listdir(root / "8"))   # untouched
    with Checkpoints(outside / "archive") as archive:
        assert archive.restore_numpy()[1] == {"input": {"batch": 3}}


# --- NaN and Inf losses -------------------------------------------------------------------------

@pytest.mark.parametrize("value", [jnp.nan, jnp.inf, -jnp.inf])
def test_a_non_finite_loss_stops_training_naming_the_step_and_loop_and_keeps_the_last_checkpoint(tmp_path, value):
    e = _estimator(tmp_path, _linear_model(nan_from=12, value=value))          # step 13 (0-based 12) goes bad
    with pytest.raises(FloatingPointError, match=rf"the loss is {value} at step 13 \(in the loop of steps 11\.\.15\)"
                                                 r".*the last checkpoint is step 10"):
        e.train(_input_fn, max_steps=20)
    assert e.checkpoints.all_steps() == [5, 10] and e.global_step() == 10
    good = _estimator(tmp_path / "good").train(_input_fn, max_steps=10)
    np.testing.assert_array_equal(e.get_variables()["params"]["w"], good.get_variables()["params"]["w"])
    e.model_fn = _linear_model()
    assert e.train(_input_fn, max_steps=15).global_step() == 15                # goes on from the last good one


def test_a_non_finite_state_is_never_checkpointed_even_when_the_loss_has_not_shown_it_yet(tmp_path):
    def model_fn(variables, features, labels, mode, params):   # the update of step 10, the loop's last, goes bad
        spec = _linear_model()(variables, features, labels, mode, params)
        bad = jnp.where(xla_runtime.current_step() >= 9, jnp.inf, 0.0)
        return est.EstimatorSpec(mode, loss=spec.loss, updates={"stats": variables["stats"] + bad})

    def init_fn(rng, features):
        return dict(_init_fn(rng, features), stats=jnp.zeros(()))

    config = est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=5, save_checkpoints_steps=5)
    e = est.Estimator(model_fn, init_fn, optax.sgd(0.05), config, train_batch_size=8)
    with pytest.raises(FloatingPointError, match=r"the train state's \['variables'\]\['stats'\] holds NaN or Inf "
                                                 r"after step 10 .*the last checkpoint is step 5"):
        e.train(_input_fn, max_steps=20)
    assert e.checkpoints.all_steps() == [5]
    assert np.isfinite(e.checkpoints.restore_numpy()[0]["variables"]["stats"])


def test_stop_on_nan_is_on_by_default_and_can_be_turned_off(tmp_path):
    assert est.RunConfig(model_dir=str(tmp_path)).stop_on_nan is True
    e = _estimator(tmp_path, _linear_model(nan_from=3), stop_on_nan=False)
    assert e.train(_input_fn, max_steps=10).global_step() == 10
    assert e.checkpoints.all_steps() == [5, 10]


CHILD_RESTORE = """
import sys
import jax.numpy as jnp
from estimator.checkpoints import Checkpoints
from estimator.errors import CorruptCheckpointError
with Checkpoints(sys.argv[1]) as ckpt:
    try:
        ckpt.restore({"w": jnp.zeros(1000), "b": jnp.zeros(10)})
    except CorruptCheckpointError as e:
        print(e.path, "|", e.reason)
"""


@pytest.mark.parametrize("planted", ["link to /dev/zero", "FIFO", "grown"])
def test_a_checkpoint_file_that_is_a_link_a_fifo_or_longer_is_refused_at_once(tmp_path, planted):
    """Restored in a child with a deadline: a link to /dev/zero, a FIFO or a file longer than written
    would be read without end, or block, if digests were taken of whatever the path holds."""
    checkpoint = _saved(tmp_path)
    path = _largest_array_file(checkpoint)
    size = path.stat().st_size
    if planted == "grown":
        with open(path, "ab") as f:
            f.write(bytes(10 << 20))
    else:
        path.unlink()
        os.symlink("/dev/zero", path) if planted.startswith("link") else os.mkfifo(path)
    out = subprocess.run([sys.executable, "-c", CHILD_RESTORE, str(tmp_path)], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    where, reason = out.stdout.strip().split(" | ")
    assert where == str(path)
    assert reason == {"link to /dev/zero": "a symbolic link, and such files are never followed",
                      "FIFO": "a FIFO, not a regular file", "grown": f"more than the {size} bytes written"}[planted]
