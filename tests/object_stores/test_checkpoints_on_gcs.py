"""Checkpoints with model_dir on gs://, against fake-gcs-server as a team on GCS reaches it: orbax's arrays through
tensorstore, its metadata, commit files and our manifest through gcsfs. Saved, resumed from, pruned (the commit
file deleted first), and a save or a deletion cut short never listed and removed by the next writer."""

import logging

import jax.numpy as jnp
import numpy as np
import optax
import pyarrow.fs as pafs
import pytest

import estimator as est
import infeed
from estimator.checkpoints import Checkpoints
from estimator.checkpoints import manager as checkpoints_module
from estimator.checkpoints.manifest import COMMIT_FILE, MANIFEST

pytest.importorskip("gcsfs", reason="gs:// checkpoints need gcsfs (the gcs extra)")

SPEC = {"x": infeed.FixedLen((4,), "float32"), "y": infeed.FixedLen((), "float32")}
W = np.array([1.0, -2.0, 0.5, 3.0], np.float32)


@pytest.fixture
def gcs(gcs_server, monkeypatch):
    """The environment a team points gs:// at an emulator with: STORAGE_EMULATOR_HOST for gcsfs and pyarrow, and
    tensorstore's own two variables, which orbax's arrays go through."""
    url = f"http://{gcs_server.endpoint}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", url)
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    return gcs_server


@pytest.fixture
def run_dir(gcs, request):
    """A gs:// folder of this test's own (the tests share the session's server)."""
    return f"gs://{gcs.bucket}/checkpoints/{request.node.name}"


def objects(gcs, uri: str) -> list[str]:
    """The object names under ``uri``, relative to it, as the server lists them (not through gcsfs's cache)."""
    folder = uri.removeprefix("gs://")
    infos = gcs.filesystem().get_file_info(pafs.FileSelector(folder, recursive=True, allow_not_found=True))
    return sorted(i.path.removeprefix(folder + "/") for i in infos if i.type == pafs.FileType.File)


def steps_stored(gcs, uri: str) -> set[str]:
    return {name.split("/", 1)[0] for name in objects(gcs, uri)}


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    path = str(tmp_path_factory.mktemp("data") / "train.tfrecord")
    with infeed.TFRecordWriter(path) as writer:
        for row in x:
            writer.write(infeed.encode_example({"x": row, "y": [float(row @ W)]}))
    return path


def model_fn(variables, features, labels, mode, params):
    prediction = features["x"] @ variables["w"]
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": prediction})
    loss = jnp.square(prediction - labels)
    return est.EstimatorSpec(mode, loss=loss, eval_metrics={"count": est.metrics.sum(jnp.ones_like(loss))})


def make_estimator(model_dir: str) -> est.Estimator:
    config = est.RunConfig(model_dir=model_dir, iterations_per_loop=5, save_checkpoints_steps=10)
    return est.Estimator(model_fn, lambda rng, features: {"w": jnp.zeros(4)}, optax.sgd(0.05), config,
                         train_batch_size=32, eval_batch_size=64)


def test_an_estimator_saves_resumes_and_evaluates_with_model_dir_on_gcs(run_dir, gcs, train_file):
    def train(params):
        return infeed.Dataset(train_file, SPEC, batch_size=params["batch_size"], labels="y", num_epochs=None)

    def evaluate(params):
        return infeed.Dataset(train_file, SPEC, batch_size=params["batch_size"], labels="y")

    first = make_estimator(run_dir)
    first.train(train, max_steps=20)
    assert {"10", "20"} <= steps_stored(gcs, f"{run_dir}/checkpoints")

    second = make_estimator(run_dir)               # a new process's view: everything from the bucket
    assert second.global_step() == 20
    second.train(train, max_steps=30)
    assert Checkpoints(f"{run_dir}/checkpoints").all_steps() == [10, 20, 30]
    result = second.evaluate(evaluate)
    assert result["global_step"] == 30 and result["examples"] == 256 and result["count"] == 256
    assert result["loss"] < 1.0                    # it learned: from 14.25 at w = 0
    names = objects(gcs, run_dir)
    assert any(n.startswith("events.out.tfevents.") for n in names)
    assert any(n.startswith("eval/events.out.tfevents.") for n in names)
    assert {f"checkpoints/30/{COMMIT_FILE}", f"checkpoints/30/{MANIFEST}"} <= set(names)


def test_old_checkpoints_on_gcs_are_deleted_commit_file_first_and_a_cut_deletion_is_never_listed(
        run_dir, gcs, monkeypatch, caplog):
    with Checkpoints(run_dir, keep=2) as checkpoints:
        for step in (1, 2, 3):
            checkpoints.save(step, {"w": jnp.full(3, float(step))})
        checkpoints.wait()
        assert checkpoints.all_steps() == [2, 3]
        assert steps_stored(gcs, run_dir) == {"2", "3"}

        def cut_short(path):
            raise OSError(f"connection lost deleting {path}")

        with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="estimator.checkpoints"):
            patch.setattr(checkpoints_module, "_rmtree", cut_short)      # deleting 2 stops after its commit file
            checkpoints.save(4, {"w": jnp.full(3, 4.0)})
            checkpoints.wait()
        assert "could not delete old checkpoint 2" in caplog.text
        assert "2" in steps_stored(gcs, run_dir)                        # half there, uncommitted
        assert f"2/{COMMIT_FILE}" not in objects(gcs, run_dir)
        assert checkpoints.all_steps() == [3, 4]

    reader = Checkpoints(run_dir, keep=2)
    state, _ = reader.restore({"w": jnp.zeros(3)})
    assert reader.latest_step() == 4 and state["w"].tolist() == [4.0, 4.0, 4.0]
    assert reader.remove_leftovers() == [f"{run_dir}/2"]
    assert steps_stored(gcs, run_dir) == {"3", "4"}
    reader.close()


def test_a_save_cut_short_on_gcs_is_never_listed_and_the_next_writer_removes_it(run_dir, gcs):
    with Checkpoints(run_dir) as checkpoints:
        checkpoints.save(1, {"w": jnp.ones(3)})
    filesystem, folder = gcs.filesystem(), run_dir.removeprefix("gs://")
    for name in objects(gcs, run_dir):             # step 7 as a killed save leaves it: all but the commit file
        if not name.endswith(f"1/{COMMIT_FILE}"):
            filesystem.copy_file(f"{folder}/{name}", f"{folder}/7/{name.split('/', 1)[1]}")

    with Checkpoints(run_dir) as checkpoints:
        assert checkpoints.all_steps() == [1]
        state, _ = checkpoints.restore({"w": jnp.zeros(3)})
        assert state["w"].tolist() == [1.0, 1.0, 1.0]
        assert "7" in steps_stored(gcs, run_dir)   # a reader removes nothing: another process may be writing
        checkpoints.save(2, {"w": jnp.full(3, 2.0)})
        checkpoints.wait()
        assert checkpoints.all_steps() == [1, 2]
    assert steps_stored(gcs, run_dir) == {"1", "2"}
