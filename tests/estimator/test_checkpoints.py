import importlib.util
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import estimator as est
from estimator.checkpoints import Checkpoints
from estimator.checkpoints.warm_start import warm_start


def _params(scale=1.0):
    return {"dense1": {"w": jnp.full((4, 3), scale), "b": jnp.zeros(3)}, "dense2": {"w": jnp.full((3, 2), scale)}}


def _train_state(seed=0):
    params, optimizer = _params(), optax.adam(1e-3)
    opt_state = optimizer.init(params)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5 + seed), params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
            "step": jnp.int32(7 + seed), "rng": jax.random.key(42 + seed)}


def _assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_of_adam_state_params_step_typed_key_and_extras(tmp_path):
    state = _train_state()
    extras = {"input": {"epoch": 1, "batch": 17, "files": ["a-0.tfrecord", "a-1.tfrecord"]},
              "lr": 1e-3, "resumed": True, "note": None}
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(7, state, extras)
        ckpt.wait()
        restored, restored_extras = ckpt.restore(_train_state(seed=1))   # same structure, other values
    _assert_trees_equal(restored, state)
    assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
    assert restored["rng"].dtype == state["rng"].dtype                 # typed keys come back typed
    assert restored_extras == extras


def test_extras_that_do_not_round_trip_through_json_are_refused(tmp_path):
    with Checkpoints(tmp_path) as ckpt, pytest.raises(ValueError, match="JSON"):
        ckpt.save(1, {"w": jnp.ones(2)}, {"shape": (2, 3)})
    assert ckpt.all_steps() == []


def test_keeps_the_last_k_checkpoints(tmp_path):
    with Checkpoints(tmp_path, keep=2) as ckpt:
        for step in range(1, 6):
            ckpt.save(step, {"w": jnp.full(3, step)}, {"step": step})
        ckpt.wait()
        assert ckpt.all_steps() == [4, 5]
        assert ckpt.latest_step() == 5 and ckpt.latest_path() == str(tmp_path / "5")
        assert ckpt.restore_numpy(4)[1] == {"step": 4}
    assert sorted(os.listdir(tmp_path)) == ["4", "5"]


def test_async_save_returns_before_the_write_and_survives_deleting_the_arrays(tmp_path):
    big = jnp.asarray(np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32))
    expected = np.asarray(big)
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(1, {"big": big})
        big.delete()                        # what donating the state to the next loop does
        assert ckpt.all_steps() == []        # still being written: not listed
        ckpt.save(1, {"big": jnp.zeros(3)})  # the step being written is not saved again
        ckpt.wait()
        assert ckpt.all_steps() == [1]
        np.testing.assert_array_equal(ckpt.restore_numpy()[0]["big"], expected)


def test_existing_step_is_not_saved_again_unless_forced(tmp_path):
    with Checkpoints(tmp_path, async_save=False) as ckpt:
        ckpt.save(3, {"w": jnp.ones(2)}, {"v": 1})
        ckpt.save(3, {"w": jnp.zeros(2)}, {"v": 2})
        assert ckpt.restore_numpy(3)[1] == {"v": 1}
        ckpt.save(3, {"w": jnp.zeros(2)}, {"v": 3}, force=True)
        state, extras = ckpt.restore_numpy(3)
    assert extras == {"v": 3} and state["w"].tolist() == [0.0, 0.0]


def test_restore_numpy_needs_no_target(tmp_path):
    state = _train_state()
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(7, state, {"k": [1, 2]})
        ckpt.wait()
        restored, extras = ckpt.restore_numpy()
    assert extras == {"k": [1, 2]}
    assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(restored))
    np.testing.assert_array_equal(restored["params"]["dense1"]["w"], state["params"]["dense1"]["w"])
    np.testing.assert_array_equal(restored["opt_state"][0]["mu"]["dense2"]["w"],     # a named tuple saved as a dict
                                  state["opt_state"][0].mu["dense2"]["w"])
    np.testing.assert_array_equal(restored["rng"], jax.random.key_data(state["rng"]))
    assert restored["step"] == 7


def test_restore_onto_sharded_targets_on_an_8_device_mesh(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    state = {"w": jnp.arange(32.0).reshape(8, 4),                                   # saved on one device
             "b": jax.device_put(jnp.arange(8.0), data),                            # saved sharded
             "rng": jax.random.key(3)}
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(1, state)
        ckpt.wait()
        target = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=data),
                  "b": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=replicated),
                  "rng": jax.ShapeDtypeStruct((), state["rng"].dtype, sharding=replicated)}
        restored, _ = ckpt.restore(target)
        again, _ = ckpt.restore(restored)            # arrays as the target: their shardings
    for name, leaf in target.items():
        assert restored[name].sharding == leaf.sharding, name
        assert again[name].sharding == leaf.sharding, name
    assert restored["w"].addressable_shards[1].data.tolist() == [[4.0, 5.0, 6.0, 7.0]]
    _assert_trees_equal(restored, state)


def test_restore_with_a_target_of_another_structure_names_what_differs(tmp_path):
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(1, _train_state())
        ckpt.wait()
        target = _train_state()
        target["params"]["dense3"] = {"w": jnp.ones(2)}
        del target["params"]["dense2"]
        target["params"]["dense1"]["w"] = jnp.ones((5, 3))
        with pytest.raises(ValueError) as error:
            ckpt.restore(target)
    message = str(error.value)
    assert "not in the checkpoint: ['params']['dense3']['w']" in message
    assert "in the checkpoint but not in the target: ['params']['dense2']['w']" in message
    assert "['params']['dense1']['w'] (checkpoint (4, 3), target (5, 3))" in message


def test_warm_start_takes_the_included_variables_of_the_same_shape(tmp_path, caplog):
    with Checkpoints(tmp_path) as ckpt:
        ckpt.save(10, {"params": _params(scale=2.0), "step": 10})
        ckpt.save(20, {"params": _params(scale=3.0), "step": 20})
        ckpt.wait()
    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    target = {"params": {"dense1": {"w": jax.device_put(jnp.zeros((4, 3)), NamedSharding(mesh, P())),
                                    "b": jnp.ones(3)},
                         "dense2": {"w": jnp.zeros((3, 5))},          # another shape: skipped
                         "dense3": {"w": jnp.zeros(2)}}}              # not in the checkpoint

    only_dense1 = warm_start(str(tmp_path / "10"), target, include=r"\['dense1'\]")
    assert only_dense1["params"]["dense1"]["w"].tolist() == [[2.0] * 3] * 4
    assert only_dense1["params"]["dense1"]["w"].sharding == target["params"]["dense1"]["w"].sharding
    assert only_dense1["params"]["dense1"]["b"].tolist() == [0.0] * 3
    assert only_dense1["params"]["dense3"]["w"] is target["params"]["dense3"]["w"]

    with caplog.at_level(logging.INFO, logger="estimator.checkpoints"):
        everything = warm_start(str(tmp_path), target)             # the root: its latest checkpoint
    assert everything["params"]["dense1"]["w"].tolist() == [[3.0] * 3] * 4
    assert everything["params"]["dense2"]["w"] is target["params"]["dense2"]["w"]
    assert everything["params"]["dense3"]["w"] is target["params"]["dense3"]["w"]
    assert "warm-started 2 variables" in caplog.text
    assert "['params']['dense2']['w'] (checkpoint float32[3, 2], target float32[3, 5])" in caplog.text
    assert "not in the checkpoint, kept as initialised: ['params']['dense3']['w']" in caplog.text

    with pytest.raises(ValueError, match="no variable matched"):
        warm_start(str(tmp_path), target, include=["dense2", "dense3"])


@pytest.mark.parametrize("fields, name, scheme", [
    ({"model_dir": "s3://bucket/model"}, "model_dir", "s3"),
    ({"model_dir": "/tmp/m", "checkpoint_dir": "s3://bucket/ckpt"}, "checkpoint_dir", "s3"),
    ({"model_dir": "hdfs://namenode/model"}, "model_dir", "hdfs"),
])
def test_checkpoints_on_a_store_orbax_cannot_write_are_refused_by_runconfig(fields, name, scheme):
    with pytest.raises(est.InvalidArgumentError, match=rf"RunConfig.{name}: checkpoints cannot be written to "
                                                       rf"{scheme}://.*Use a local directory .* or gs://"):
        est.RunConfig(**fields)


def test_model_dir_on_a_bucket_with_local_checkpoints_is_accepted(tmp_path):
    config = est.RunConfig(model_dir="s3://bucket/model", checkpoint_dir=str(tmp_path / "ckpt"))
    assert config.checkpoint_directory == str(tmp_path / "ckpt")


def test_gs_checkpoints_without_gcsfs_or_tensorflow_are_refused_naming_the_package(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("gcsfs", "tensorflow")
                        else real(name, *a))
    with pytest.raises(est.InvalidArgumentError,
                       match=r"gs:// checkpoints .* needs gcsfs \(pip install 'tpu-estimator-jax\[gcs\]'\)"):
        est.RunConfig(model_dir="gs://bucket/model")


@pytest.fixture
def nowhere_to_find_google_credentials(tmp_path, monkeypatch):
    from infeed.tfrecord import filesystems

    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG", "GCE_METADATA_HOST", "GCE_METADATA_ROOT",
                 "STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_AUTH_TOKEN_FOR_TESTING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(filesystems, "GCE_PRODUCT_NAME_FILE", str(tmp_path / "product_name"))
    return tmp_path


@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("gcsfs", "tensorflow")), reason="no GCS client")
def test_gs_checkpoints_with_no_credentials_to_find_are_refused_at_once_not_left_to_wait(
        nowhere_to_find_google_credentials):
    started = time.monotonic()
    with pytest.raises(est.InvalidArgumentError, match=r"RunConfig.model_dir: no Google credentials to write gs:// "
                                                       r"checkpoints \('gs://bucket/model/checkpoints'\) with: "
                                                       r"GOOGLE_APPLICATION_CREDENTIALS is unset"):
        est.RunConfig(model_dir="gs://bucket/model")
    with pytest.raises(est.InvalidArgumentError, match=r"Checkpoints: no Google credentials"):
        Checkpoints("gs://bucket/model/checkpoints")
    assert time.monotonic() - started < 5             # tensorstore's own lookup still waited after 200 s
    (nowhere_to_find_google_credentials / "product_name").write_text("Google Compute Engine\n")
    assert est.RunConfig(model_dir="gs://bucket/model").checkpoint_directory == "gs://bucket/model/checkpoints"


@pytest.mark.skipif(not any(importlib.util.find_spec(m) for m in ("gcsfs", "tensorflow")), reason="no GCS client")
def test_an_emulator_only_gcsfs_would_use_is_refused_naming_tensorstores_variables(nowhere_to_find_google_credentials,
                                                                                   monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    with pytest.raises(est.InvalidArgumentError, match=r"STORAGE_EMULATOR_HOST=127.0.0.1:4443 .* tensorstore, which "
                                                       r"does not read it: set TENSORSTORE_GCS_HTTP_URL and "
                                                       r"GOOGLE_AUTH_TOKEN_FOR_TESTING too \(TENSORSTORE_GCS_HTTP_URL="
                                                       r"http://127.0.0.1:4443 "):
        est.RunConfig(model_dir="/tmp/m", checkpoint_dir="gs://bucket/ckpt")
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", "http://127.0.0.1:4443")
    monkeypatch.setenv("GOOGLE_AUTH_TOKEN_FOR_TESTING", "emulator")
    assert est.RunConfig(model_dir="/tmp/m", checkpoint_dir="gs://bucket/ckpt").checkpoint_directory == \
        "gs://bucket/ckpt"
