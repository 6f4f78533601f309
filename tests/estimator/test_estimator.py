"""Estimator on 8 CPU devices: train from TFRecords through the daemon, exact evaluation, prediction, resume."""

import logging
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
import xla_runtime as xr
from jax.sharding import PartitionSpec as P
import infeed

D, C = 6, 3
SPEC = {"x": infeed.FixedLen((D,), "float32"), "label": infeed.FixedLen((), "int64")}


def make_data(n, seed=0):
    centers = np.random.default_rng(1234).normal(size=(C, D)) * 3      # one problem, whatever the sample
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, C, n)
    return (centers[labels] + rng.normal(size=(n, D))).astype(np.float32), labels


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("est")
    x, y = make_data(1000)
    paths = []
    for k in range(2):
        paths.append(str(root / f"train-{k}.tfrecord"))
        with infeed.TFRecordWriter(paths[-1]) as w:
            for i in range(k * 500, k * 500 + 500):
                w.write(infeed.encode_example({"x": x[i], "label": [int(y[i])]}))
    ex, ey = make_data(257, seed=1)
    path = str(root / "eval.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        for i in range(257):
            w.write(infeed.encode_example({"x": ex[i], "label": [int(ey[i])]}))
    return {"train": paths, "eval": path, "eval_arrays": (ex, ey)}


def init_fn(rng, features):
    k1, k2 = jax.random.split(rng)
    return {"params": {"w1": jax.random.normal(k1, (D, 16)) * 0.3, "b1": jnp.zeros(16),
                       "w2": jax.random.normal(k2, (16, C)) * 0.3, "b2": jnp.zeros(C)}}


def logits_of(variables, x):
    p = variables["params"]
    return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def model_fn(variables, features, labels, mode, params):
    logits = logits_of(variables, features["x"])
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"class": logits.argmax(-1), "logits": logits})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return est.EstimatorSpec(mode, loss=loss, eval_metrics={
        "accuracy": est.metrics.accuracy(labels, logits.argmax(-1)),
        "count": est.metrics.sum(jnp.ones_like(loss, shape=labels.shape))})


def make(model_dir, **kw):
    config = est.RunConfig(model_dir=str(model_dir), iterations_per_loop=kw.pop("k", 10),
                           save_checkpoints_steps=kw.pop("save_every", 50), log_step_count_steps=20)
    return est.Estimator(model_fn, init_fn, optax.adam(1e-2), config, train_batch_size=32, eval_batch_size=64,
                         predict_batch_size=64, **kw)


def train_input(files, seed=0):
    return lambda params: infeed.Dataset(files["train"], SPEC, batch_size=params["batch_size"], labels="label",
                                         shuffle_files=True, shuffle_buffer=100, seed=seed, num_epochs=None)


def eval_input(files):
    return lambda params: infeed.Dataset(files["eval"], SPEC, batch_size=params["batch_size"], labels="label")


def test_train_evaluate_predict(files, tmp_path):
    e = make(tmp_path)
    e.train(train_input(files), max_steps=95)                 # 9 loops of 10, then a partial loop of 5
    assert e.global_step() == 95 and e.checkpoints.latest_step() == 95
    result = e.evaluate(eval_input(files))
    assert result["examples"] == 257 and result["count"] == 257.0 and result["global_step"] == 95
    assert result["accuracy"] > 0.9
    ex, ey = files["eval_arrays"]
    preds = list(e.predict(eval_input(files)))
    assert len(preds) == 257 and set(preds[0]) == {"class", "logits"}
    variables = e.get_variables()
    want = np.asarray(logits_of(variables, ex)).argmax(-1)
    assert [int(p["class"]) for p in preds] == want.tolist()
    assert result["accuracy"] == pytest.approx(np.mean(want == ey))
    path = e.export(tmp_path / "export", {"x": est.TensorSpec((None, D), "float32")})
    assert path.endswith("/95")
    served = est.load_exported(path)({"x": ex[:7]})
    assert served["class"].tolist() == want[:7].tolist()
    np.testing.assert_allclose(served["logits"], np.stack([p["logits"] for p in preds[:7]]), rtol=1e-5, atol=1e-6)
    with pytest.raises(FileExistsError):
        e.export(tmp_path / "export", {"x": est.TensorSpec((None, D), "float32")})


def test_a_dataset_with_a_transform_trains_and_evaluates_on_the_transforms_outputs(files, tmp_path):
    import transforms_for_tests as tx

    seen = {}

    def model_on_xx(variables, features, labels, mode, params):
        seen[mode] = {"labels": (labels.shape, labels.dtype), **{k: (v.shape, v.dtype) for k, v in features.items()}}
        x = (features["xx"][:, :D] - features["xx"][:, D:]) / 2            # x, if the second half is -x
        return model_fn(variables, {"x": x}, labels, mode, params)

    def input_fn(name, **kw):
        return lambda params: infeed.Dataset(files[name], SPEC, batch_size=params["batch_size"], labels="label",
                                             transform="transforms_for_tests:with_negated",
                                             outputs=tx.NEGATED_OUTPUTS, **kw)

    config = est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=10, save_checkpoints_steps=50)
    e = est.Estimator(model_on_xx, init_fn, optax.adam(1e-2), config, train_batch_size=32, eval_batch_size=64)
    e.train(input_fn("train", shuffle_buffer=100, num_epochs=None), max_steps=60)
    result = e.evaluate(input_fn("eval"))
    assert result["examples"] == 257 and result["accuracy"] > 0.9
    assert seen[est.ModeKeys.TRAIN] == {"labels": ((32,), jnp.int32), "xx": ((32, 2 * D), jnp.float32)}
    assert seen[est.ModeKeys.EVAL]["xx"] == ((64, 2 * D), jnp.float32)


def test_bfloat16_features_and_uint8_labels_reach_the_model_as_decoded(files, tmp_path):
    narrow = {"x": infeed.FixedLen((D,), "bfloat16"), "label": infeed.FixedLen((), "uint8")}
    seen = set()

    def narrow_model_fn(variables, features, labels, mode, params):
        seen.add((features["x"].dtype, labels.dtype))
        return model_fn(variables, features, labels, mode, params)

    def dataset(name, **kw):
        return lambda params: infeed.Dataset(files[name], narrow, batch_size=params["batch_size"], labels="label", **kw)

    config = est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=10, save_checkpoints_steps=50)
    e = est.Estimator(narrow_model_fn, init_fn, optax.adam(1e-2), config, train_batch_size=32, eval_batch_size=64)
    e.train(dataset("train", num_epochs=None), max_steps=40)
    result = e.evaluate(dataset("eval"))
    assert seen == {(jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.uint8))}
    assert result["examples"] == 257 and result["accuracy"] > 0.85


def test_a_stopped_run_resumes_to_the_weights_of_an_uninterrupted_one(files, tmp_path):
    whole = make(tmp_path / "whole", k=7).train(train_input(files), max_steps=40).get_variables()
    make(tmp_path / "split", k=7).train(train_input(files), max_steps=20)      # 20 = 2 loops of 7 + 6
    resumed = make(tmp_path / "split", k=7).train(train_input(files), max_steps=40).get_variables()
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), whole, resumed)


def test_steps_counts_from_the_current_step_and_config_is_checked(files, tmp_path):
    e = make(tmp_path)
    e.train(train_input(files), steps=12).train(train_input(files), steps=8)
    assert e.global_step() == 20
    with pytest.raises(ValueError, match="exactly one"):
        e.train(train_input(files))
    with pytest.raises(ValueError, match="iterations_per_loop"):
        est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=0)
    with pytest.raises(ValueError, match="multiple of the mesh's data axis"):
        est.Estimator(model_fn, init_fn, optax.sgd(0.1), est.RunConfig(model_dir=str(tmp_path)), train_batch_size=12)


def test_an_iterable_input_and_host_side_metric_fn(files, tmp_path):
    ex, ey = files["eval_arrays"]

    def batches(params):
        b = params["batch_size"]
        return [({"x": ex[i:i + b]}, ey[i:i + b]) for i in range(0, 257, b)]

    def host_metrics(variables, features, labels, mode, params):
        spec = model_fn(variables, features, labels, mode, params)
        logits = logits_of(variables, features["x"])
        return est.EstimatorSpec(mode, loss=spec.loss, eval_metrics=(
            lambda labels, classes: {"host_accuracy": float(np.mean(labels == classes)), "n": len(labels)},
            [labels, logits.argmax(-1)]))                         # a list, as TPUEstimator code passes them

    e = make(tmp_path)
    e.train(train_input(files), max_steps=30)
    e.model_fn = host_metrics
    result = e.evaluate(batches)
    assert result["n"] == 257.0 and result["examples"] == 257
    assert result["host_accuracy"] == pytest.approx(e.evaluate(eval_input(files))["host_accuracy"])


def test_host_calls_inside_and_after_the_loop_learning_rate_and_summaries(files, tmp_path):
    seen, inside = [], []

    def with_host_calls(variables, features, labels, mode, params):
        spec = model_fn(variables, features, labels, mode, params)
        xr.host_call(lambda n, loss: inside.append(int(n)), labels.shape[0], spec.loss)  # under grad
        return est.EstimatorSpec(mode, loss=spec.loss, host_call=(lambda step, loss: seen.append((step, float(loss))),
                                                                  {"loss": spec.loss}))

    config = est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=10, save_summary_steps=10,
                           log_step_count_steps=10)
    e = est.Estimator(with_host_calls, init_fn, optax.inject_hyperparams(optax.adam)(learning_rate=0.01), config,
                      train_batch_size=32)
    e.train(train_input(files), max_steps=25)
    assert [s for s, _ in seen] == list(range(25)) and all(np.isfinite(v) for _, v in seen)
    assert inside == [32] * 25
    scalars = est.summaries.read_scalars(tmp_path)
    assert [s for s, _ in scalars["loss"]] == [10, 20, 25]
    assert scalars["learning_rate"][0][1] == pytest.approx(0.01)
    assert "global_step/sec" in scalars and "examples/sec" in scalars
    assert all(0 <= share <= 1 for _, share in scalars["input_wait_share"])


def test_a_train_call_logs_its_input_wait_and_where_the_input_time_went(files, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="estimator")
    e = make(tmp_path)
    e.train(train_input(files), max_steps=60)
    lines = [r.getMessage() for r in caplog.records if r.name == "estimator"]
    assert any(re.fullmatch(r"input wait: \d+ % of the time", line) for line in lines)
    verdict = [line for line in lines if line.startswith("input: ")]
    assert len(verdict) == 1 and verdict[0].split(": ")[1] in ("input-bound", "trainer-bound", "balanced",
                                                                 "hand-off-bound")
    table = next(line for line in lines if line.startswith("input stages over this train call"))
    assert "copying batches to the devices" in table and "decode" in table
    stats = e.input_stats()                     # the input the call left open
    assert stats.taken >= 6 and len(stats.workers) == 2 and stats.consumer["host_to_device"] > 0
    assert stats.since(stats).elapsed_s == 0
    e.close()
    assert e.input_stats() is None
    caplog.clear()
    x, y = make_data(32)
    make(tmp_path / "iterable").train(lambda params: [({"x": x}, y)] * 20, steps=10)   # an iterable: no stages
    assert not any(r.getMessage().startswith("input: ") for r in caplog.records)


def test_consecutive_train_calls_go_on_from_one_open_input_and_train_as_one_call(files, tmp_path, monkeypatch):
    daemons = []
    start = infeed.Daemon.__init__

    def recorded(daemon, *args, **kwargs):
        daemons.append(daemon)
        start(daemon, *args, **kwargs)
    monkeypatch.setattr(infeed.Daemon, "__init__", recorded)
    with make(tmp_path / "whole") as whole:
        want = whole.train(train_input(files), max_steps=45).get_variables()
    assert len(daemons) == 1 and daemons[0].ring.closed          # ``with`` closed the input train() kept
    e = make(tmp_path / "split")
    e.train(train_input(files), steps=20).train(train_input(files), steps=20)
    assert len(daemons) == 2 and not daemons[1].ring.closed      # the second call took the first's input
    e.train(train_input(files), steps=5)                         # half a loop: the slot's rest is dropped ...
    assert len(daemons) == 2 and daemons[1].ring.closed          # ... so the input is not kept
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), want, e.get_variables())
    e.train(train_input(files), steps=10)
    assert len(daemons) == 3 and not daemons[2].ring.closed
    e.evaluate(eval_input(files))                                # evaluation has its own input ...
    assert len(daemons) == 4 and daemons[3].ring.closed and not daemons[2].ring.closed
    with pytest.raises(ValueError, match="saved with seed 0"):   # ... and another Dataset replaces the kept one
        e.train(train_input(files, seed=1), steps=10)
    assert daemons[2].ring.closed and e.global_step() == 55
    assert e.train(train_input(files), steps=10).global_step() == 65
    workers = daemons[-1].worker_pids
    assert len(daemons) == 6 and not daemons[-1].ring.closed
    e.close()
    assert daemons[-1].ring.closed and not any(os.path.exists(f"/proc/{pid}") for pid in workers)


def test_updates_carry_non_trainable_state_and_step_rng_differs_per_step(files, tmp_path):
    def counting(variables, features, labels, mode, params):
        spec = model_fn(variables, features, labels, mode, params)
        noise = jax.random.uniform(est.step_rng(), ())
        return est.EstimatorSpec(mode, loss=spec.loss, updates={
            "stats": {"count": variables["stats"]["count"] + 1, "noise_sum": variables["stats"]["noise_sum"] + noise}})

    def init_with_stats(rng, features):
        return dict(init_fn(rng, features), stats={"count": jnp.zeros((), jnp.int32), "noise_sum": jnp.zeros(())})

    e = est.Estimator(counting, init_with_stats, optax.adam(1e-2), est.RunConfig(model_dir=str(tmp_path),
                      iterations_per_loop=4), train_batch_size=32)
    e.train(train_input(files), max_steps=10)
    stats = e.get_variables()["stats"]
    assert int(stats["count"]) == 10
    assert 1.0 < float(stats["noise_sum"]) < 9.0           # ten different uniform draws, not one drawn ten times


def test_train_and_evaluate_alternates_and_ends_with_an_evaluation(files, tmp_path):
    e = make(tmp_path)
    results = est.train_and_evaluate(e, est.TrainSpec(train_input(files), max_steps=50),
                                     est.EvalSpec(eval_input(files), every_steps=20, name="held_out"))
    assert [r["global_step"] for r in results] == [20, 40, 50]
    assert all(r["examples"] == 257 for r in results)
    assert [s for s, _ in est.summaries.read_scalars(tmp_path / "eval_held_out")["accuracy"]] == [20, 40, 50]
    with pytest.raises(ValueError, match="max_steps"):
        est.TrainSpec(train_input(files), max_steps=0)


def test_per_example_losses_make_the_evaluation_loss_exact(files, tmp_path):
    def per_example(variables, features, labels, mode, params):
        logits = logits_of(variables, features["x"])
        return est.EstimatorSpec(mode, loss=optax.softmax_cross_entropy_with_integer_labels(logits, labels))

    e = est.Estimator(per_example, init_fn, optax.adam(1e-2), est.RunConfig(model_dir=str(tmp_path),
                      iterations_per_loop=10), train_batch_size=32, eval_batch_size=64)
    e.train(train_input(files), max_steps=20)
    ex, ey = files["eval_arrays"]
    logits = logits_of(e.get_variables(), ex)
    want = float(optax.softmax_cross_entropy_with_integer_labels(logits, ey).mean())
    assert e.evaluate(eval_input(files))["loss"] == pytest.approx(want, rel=1e-5)     # 257 = 4 x 64 + 1: padded


def test_warm_start_from_a_model_dir_or_an_export_takes_the_included_variables(files, tmp_path):
    source = make(tmp_path / "source").train(train_input(files), max_steps=20)
    trained = source.get_variables()["params"]
    fresh = init_fn(jax.random.fold_in(jax.random.key(0), 0), None)["params"]
    exported = source.export(tmp_path / "export", {"x": est.TensorSpec((None, D), "float32")})
    for origin, name in ((tmp_path / "source", "from_dir"), (exported, "from_export")):
        e = est.Estimator(model_fn, init_fn, optax.sgd(0.0), est.RunConfig(model_dir=str(tmp_path / name),
                          iterations_per_loop=1), train_batch_size=32, warm_start_from=str(origin),
                          warm_start_include=r"\['(w1|b1)'\]")
        got = e.train(train_input(files), max_steps=1).get_variables()["params"]
        np.testing.assert_array_equal(got["w1"], trained["w1"])
        np.testing.assert_array_equal(got["b1"], trained["b1"])
        np.testing.assert_allclose(got["w2"], fresh["w2"], rtol=1e-6)
        assert not np.array_equal(got["w2"], trained["w2"])


def test_variables_split_over_a_model_axis_train_like_replicated_ones(files, tmp_path):
    rules = [(r"\['w1'\]", P(None, "model")), (r"\['b1'\]", P("model")), (r"\['w2'\]", P("model", None))]
    results = {}
    for name, sharding in (("replicated", None), ("split", rules)):
        config = est.RunConfig(model_dir=str(tmp_path / name), iterations_per_loop=5,
                               mesh_shape={"data": 4, "model": 2}, variable_sharding=sharding)
        e = est.Estimator(model_fn, init_fn, optax.adam(1e-2), config, train_batch_size=32, eval_batch_size=64)
        e.train(train_input(files), max_steps=10)
        results[name] = (e.get_variables()["params"], e.evaluate(eval_input(files))["accuracy"])
        if sharding:
            assert e._state["variables"]["params"]["w1"].sharding.spec == P(None, "model")
            assert e._state["opt_state"][0].mu["w2"].sharding.spec == P("model", None)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 results["replicated"][0], results["split"][0])
    assert results["replicated"][1] == results["split"][1]
    with pytest.raises(ValueError, match="variable_sharding"):
        est.RunConfig(model_dir=str(tmp_path), variable_sharding={"w1": P("model")})


def test_a_scalar_loss_is_warned_of_only_when_it_ignores_the_padding_mask(files, tmp_path, caplog):
    e = make(tmp_path)
    e.train(train_input(files), max_steps=10)
    caplog.set_level(logging.WARNING, logger="estimator")
    e.evaluate(eval_input(files))           # 257 examples in batches of 64: the last one padded
    warned = lambda: [r for r in caplog.records if "loss is a scalar" in r.getMessage()]   # noqa: E731
    assert len(warned()) == 1               # model_fn's loss is a plain mean over the batch, padding included

    def masked(variables, features, labels, mode, params):
        losses = optax.softmax_cross_entropy_with_integer_labels(logits_of(variables, features["x"]), labels)
        real = est.metrics.current_mask()
        loss = losses.mean() if real is None else (losses * real).sum() / jnp.maximum(real.sum(), 1.0)
        return est.EstimatorSpec(mode, loss=loss)

    caplog.clear()
    e.model_fn = masked
    result = e.evaluate(eval_input(files))
    assert warned() == []
    ex, ey = files["eval_arrays"]
    want = optax.softmax_cross_entropy_with_integer_labels(logits_of(e.get_variables(), ex), ey).mean()
    assert result["loss"] == pytest.approx(float(want), rel=1e-4)


def test_checkpoint_dir_puts_the_checkpoints_apart_from_model_dir(files, tmp_path):
    config = est.RunConfig(model_dir=str(tmp_path / "model"), checkpoint_dir=tmp_path / "store", iterations_per_loop=10)
    assert config.checkpoint_dir == str(tmp_path / "store")
    e = est.Estimator(model_fn, init_fn, optax.sgd(0.1), config, train_batch_size=32)
    e.train(train_input(files), max_steps=10)
    assert e.latest_checkpoint() == str(tmp_path / "store" / "10")
    assert not (tmp_path / "model" / "checkpoints").exists()
    again = est.Estimator(model_fn, init_fn, optax.sgd(0.1), config, train_batch_size=32)
    assert again.global_step() == 10                       # found there by a new estimator
    with pytest.raises(ValueError, match="checkpoint_dir"):
        est.RunConfig(model_dir=str(tmp_path), checkpoint_dir="")
    with pytest.raises(est.NoCheckpointError, match="elsewhere"):
        est.Estimator(model_fn, init_fn, optax.sgd(0.1), est.RunConfig(
            model_dir=str(tmp_path / "model"), checkpoint_dir=tmp_path / "elsewhere")).get_variables()


def test_images_skipped_as_corrupt_are_masked_out_of_training_and_evaluation(tmp_path, caplog):
    import simplejpeg

    good = simplejpeg.encode_jpeg(np.full((8, 8, 3), 200, np.uint8))
    path = str(tmp_path / "images.tfrecord")
    bad = {1, 6, 7, 12}
    with infeed.TFRecordWriter(path) as w:
        for i in range(16):
            w.write(infeed.encode_example({"image/encoded": b"GIF89a..." if i in bad else good, "label": [1 + i % 3]}))
    spec = {"image": infeed.Image(size=(4, 4)), "label": infeed.FixedLen((), "int64")}

    def input_fn(**kw):
        return lambda params: infeed.Dataset(path, spec, batch_size=params["batch_size"], labels="label",
                                             skip_corrupt=True, **kw)

    def image_model(variables, features, labels, mode, params):
        zero_image = jnp.all(features["image"] == 0, axis=(1, 2, 3))
        # A padding row (zeros, label 0) costs 1000 if it is not masked out; a real row costs 0.
        loss = jnp.where(zero_image | (labels == 0), 1000.0, 0.0) + 0.0 * variables["w"]
        return est.EstimatorSpec(mode, loss=loss, eval_metrics={"count": est.metrics.sum(jnp.ones_like(loss))})

    config = est.RunConfig(model_dir=str(tmp_path / "model"), iterations_per_loop=2, log_step_count_steps=1)
    e = est.Estimator(image_model, lambda rng, features: {"w": jnp.zeros(())}, optax.sgd(0.1), config,
                      train_batch_size=16, eval_batch_size=8)
    with caplog.at_level(logging.INFO, logger="estimator"):
        e.train(input_fn(num_epochs=None), max_steps=4)          # every batch holds the 4 padding rows
    assert "Loss for final step: 0." in caplog.text
    assert re.findall(r"loss = ([0-9.e+-]+), step", caplog.text) == ["0"] * 3          # steps 1, 2 and 4
    result = e.evaluate(input_fn())
    assert result["examples"] == 12 and result["count"] == 12 and result["loss"] == 0.0
