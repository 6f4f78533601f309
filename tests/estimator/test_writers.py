"""Metric writers: the protocol and its checks, TensorBoard's histograms, images and hparams as TensorBoard
reads them, JSON lines, every writer receiving everything, writers closed whatever ends a call, and the
tracker recipe of docs/porting.md."""

import dataclasses
import io
import json
import os
import re
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from PIL import Image as PILImage
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata as hparams_metadata

import estimator as est
from estimator.summaries import SummaryWriter, read_scalars
from estimator.summaries.data import histogram
from estimator.summaries.writers.run_writers import RunWriters, hparams_of
from estimator.summaries.writers.values import sort_values
from estimator.writers import (Histogram, Image, JsonLinesWriter, MetricWriter, TensorBoardWriter,
                               read_metrics)

D, C = 6, 3
ROOT = Path(__file__).resolve().parents[2]


def accumulator(logdir):
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0, "histograms": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def png_pixels(data: bytes) -> np.ndarray:
    return np.asarray(PILImage.open(io.BytesIO(data)))


# ---------------------------------------------------------------- a small model, trained from numpy batches

def make_data(n, seed=0):
    centers = np.random.default_rng(1234).normal(size=(C, D)) * 3
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, C, n)
    return (centers[labels] + rng.normal(size=(n, D))).astype(np.float32), labels


def init_fn(rng, features):
    return {"params": {"w": jax.random.normal(rng, (D, C)) * 0.3, "b": jnp.zeros(C)}}


def model_fn(variables, features, labels, mode, params):
    p = variables["params"]
    logits = features["x"] @ p["w"] + p["b"]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return est.EstimatorSpec(mode, loss=loss, eval_metrics={"accuracy": est.metrics.accuracy(labels,
                                                                                             logits.argmax(-1))})


def summarising_model_fn(variables, features, labels, mode, params):
    """model_fn whose host_call returns a scalar, a histogram, an image and a text every 10 steps."""
    spec = model_fn(variables, features, labels, mode, params)
    if mode != est.ModeKeys.TRAIN:
        return spec
    picture = (jnp.abs(variables["params"]["w"])[:, :, None] * 255).clip(0, 255).astype(jnp.uint8)   # [D, C, 1]

    def host_fn(step, loss, w, picture):
        if step % 10:
            return None
        return {"batch_loss": loss, "weights": w, "picture": picture, "note": f"step {step}"}

    return est.EstimatorSpec(mode, loss=spec.loss, host_call=(host_fn, {
        "loss": spec.loss, "w": variables["params"]["w"], "picture": picture}))


def train_batches(params):
    x, y = make_data(4000)
    b = params["batch_size"]
    return [({"x": x[i:i + b]}, y[i:i + b]) for i in range(0, len(x) - b + 1, b)]


def eval_batches(params):
    x, y = make_data(100, seed=1)
    b = params["batch_size"]
    return [({"x": x[i:i + b]}, y[i:i + b]) for i in range(0, len(x), b)]


def make(model_dir, writers, fn=model_fn, **kw):
    config = est.RunConfig(model_dir=str(model_dir), iterations_per_loop=10, save_summary_steps=10,
                           log_step_count_steps=10, save_checkpoints_steps=50, writers=writers)
    return est.Estimator(fn, init_fn, optax.adam(1e-2), config, params={"learning_rate": 0.01, "depth": 2},
                         train_batch_size=32, eval_batch_size=32, **kw)


class Recorder:
    """A MetricWriter that remembers every call, in order (as a class: made per call, from its logdir)."""

    made: list = []

    def __init__(self, logdir=None):
        self.logdir, self.calls, self.closed, self.flushes = logdir, [], False, 0
        Recorder.made.append(self)

    def write_scalars(self, step, scalars):
        self.calls.append(("scalars", step, {k: float(v) for k, v in scalars.items()}))

    def write_histograms(self, step, arrays, num_buckets=None):
        self.calls.append(("histograms", step, {k: np.asarray(v).shape for k, v in arrays.items()}))

    def write_images(self, step, images):
        self.calls.append(("images", step, {k: np.asarray(v).shape for k, v in images.items()}))

    def write_texts(self, step, texts):
        self.calls.append(("texts", step, dict(texts)))

    def write_hparams(self, hparams):
        self.calls.append(("hparams", None, dict(hparams)))

    def flush(self):
        self.flushes += 1

    def close(self):
        assert not self.closed, "closed twice"
        self.closed = True


@pytest.fixture(autouse=True)
def fresh_recorders():
    Recorder.made = []


# ---------------------------------------------------------------- the protocol and its checks

def test_writers_that_are_not_writers_are_refused_naming_what_they_lack(tmp_path):
    d = str(tmp_path)
    with pytest.raises(est.InvalidArgumentError, match=r"RunConfig.writers must be a list .*put it in a list"):
        est.RunConfig(model_dir=d, writers=TensorBoardWriter)

    class OnlyScalars:
        def write_scalars(self, step, scalars):
            pass

    with pytest.raises(est.InvalidArgumentError,
                       match=r"writers\[1\] .*the class .*OnlyScalars, which lacks write_histograms, write_images, "
                             r"write_texts, write_hparams, flush, close"):
        est.RunConfig(model_dir=d, writers=[TensorBoardWriter, OnlyScalars])
    with pytest.raises(est.InvalidArgumentError,
                       match=r"writers\[0\] .*got an object of class OnlyScalars, which lacks write_histograms"):
        est.RunConfig(model_dir=d, writers=[OnlyScalars()])
    with pytest.raises(ValueError, match=r"writers\[0\] must be a MetricWriter .*got 'tensorboard' \(a str\)"):
        est.RunConfig(model_dir=d, writers=["tensorboard"])

    # a factory's writer is checked when it is made, naming the entry and the directory
    config = est.RunConfig(model_dir=d, writers=[lambda logdir: OnlyScalars()])
    with pytest.raises(est.InvalidArgumentError,
                       match=r"writers\[0\] \(.*<lambda>\) called with .* gave an object of class OnlyScalars, "
                             r"which is no MetricWriter: it lacks write_histograms"):
        RunWriters(config.writers, d, active=True)


def test_what_passes_the_checks():
    assert est.RunConfig(model_dir="m").writers == (TensorBoardWriter,)           # the default
    assert est.RunConfig(model_dir="m", writers=[]).writers == ()                 # no summaries at all
    shared = Recorder()
    config = est.RunConfig(model_dir="m", writers=[TensorBoardWriter, JsonLinesWriter, shared,
                                                   lambda logdir: Recorder(logdir)])
    assert config.writers[2] is shared and isinstance(config.writers, tuple)
    assert isinstance(shared, MetricWriter) and not isinstance(object(), MetricWriter)


def test_a_host_call_value_is_sorted_by_kind():
    v = sort_values({"a": 1, "b": np.float32(2), "c": jnp.ones(()), "d": np.ones([1]), "e": np.arange(5),
                     "f": np.zeros((4, 4, 3), np.uint8), "g": np.zeros((2, 4, 4, 1), np.uint8),
                     "h": np.zeros((4, 4, 3), np.float32), "i": Image(np.zeros((4, 4, 3))),
                     "j": Histogram(np.zeros((4, 4, 3), np.uint8), num_buckets=7), "k": "text", "l": np.array(True)})
    assert v.scalars == {"a": 1, "b": 2.0, "c": 1.0, "d": 1.0, "l": True}
    assert sorted(v.histograms) == ["e", "h", "j"] and v.num_buckets == {"j": 7}
    assert sorted(v.images) == ["f", "g", "i"] and v.texts == {"k": "text"}
    with pytest.raises(est.InvalidArgumentError, match="host_call returned NoneType .* under 'x'"):
        sort_values({"x": None})
    with pytest.raises(est.InvalidArgumentError, match="host_call returned list: return None, or a mapping"):
        sort_values([1.0])
    with pytest.raises(est.InvalidArgumentError, match="tags are non-empty strings"):
        sort_values({"": 1.0})


def test_hyperparameters_are_the_flat_plain_entries_of_params():
    got = hparams_of({"lr": 0.1, "opt": "adam", "bn": True, "n": np.int32(3), "nested": {"a": 1}, "arr": np.ones(3),
                      "fn": print, "none": None}, train_batch_size=32, other=None)
    assert got == {"lr": 0.1, "opt": "adam", "bn": True, "n": 3, "nested/a": 1, "train_batch_size": 32}


# ---------------------------------------------------------------- TensorBoard, as TensorBoard reads it

def test_histograms_images_and_hparams_read_by_tensorboard(tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=1000)
    rgb = rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)
    grey_batch = rng.random((2, 4, 6, 1))                      # floats in [0, 1]
    with TensorBoardWriter(tmp_path, num_buckets=20) as w:
        w.write_histograms(3, {"weights": values, "few": np.array([1, 1, 2, np.nan, np.inf])}, {"few": 2})
        w.write_images(3, {"rgb": rgb, "grey": grey_batch})
        w.write_texts(3, {"note": "**bold**"})
        w.write_scalars(3, {"loss": 0.5})
        w.write_hparams({"learning_rate": 0.01, "optimizer": "adam", "dropout": False, "layers": (2, 3)})
    acc = accumulator(tmp_path)
    (event,) = acc.Histograms("weights")
    h = event.histogram_value
    counts, edges = np.histogram(values, bins=20)
    assert event.step == 3 and h.num == 1000 and h.min == values.min() and h.max == values.max()
    assert h.sum == pytest.approx(values.sum()) and h.sum_squares == pytest.approx((values ** 2).sum())
    assert list(h.bucket) == list(counts) and np.allclose(h.bucket_limit, edges[1:])
    assert len(acc.CompressedHistograms("weights")) == 1                # TensorBoard's Distributions tab
    few = acc.Histograms("few")[0].histogram_value
    assert (few.num, few.min, few.max, list(few.bucket)) == (3, 1.0, 2.0, [2, 1])      # NaN and Inf left out

    (image,) = acc.Images("rgb")
    assert (image.step, image.width, image.height) == (3, 7, 5)
    assert np.array_equal(png_pixels(image.encoded_image_string), rgb)
    assert sorted(acc.Tags()["images"]) == ["grey/0", "grey/1", "rgb"]
    for i in range(2):
        (image,) = acc.Images(f"grey/{i}")
        assert np.array_equal(png_pixels(image.encoded_image_string), np.rint(grey_batch[i, :, :, 0] * 255))

    assert read_scalars(tmp_path) == {"loss": [(3, 0.5)]}
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = hparams_metadata.parse_session_start_info_plugin_data(content)
    assert info.hparams["learning_rate"].number_value == 0.01
    assert info.hparams["optimizer"].string_value == "adam"
    assert info.hparams["dropout"].HasField("bool_value") and not info.hparams["dropout"].bool_value
    assert info.hparams["layers"].string_value == "(2, 3)"
    assert "note" in acc.Tags()["tensors"]


def test_summary_writer_refuses_what_is_no_image_or_histogram(tmp_path):
    with SummaryWriter(tmp_path) as w:
        with pytest.raises(est.InvalidArgumentError, match=r"x: an image is \[H, W, C\]"):
            w.image("x", np.zeros((4, 4)), 0)
        with pytest.raises(est.InvalidArgumentError, match="x: an image is .* with 1 to 4 channels"):
            w.image("x", np.zeros((4, 4, 5), np.uint8), 0)
        with pytest.raises(est.InvalidArgumentError, match="image pixels are uint8, bool or floats"):
            w.image("x", np.zeros((4, 4, 3), np.int32), 0)
        with pytest.raises(est.InvalidArgumentError, match="x: a histogram needs real numbers"):
            w.histogram("x", np.array(["a"]), 0)
        with pytest.raises(est.InvalidArgumentError, match="num_buckets must be a positive int"):
            w.histogram("x", np.ones(3), 0, num_buckets=0)


def test_histogram_of_nothing_and_of_one_value():
    assert histogram([]).counts == (0,) and histogram([]).count == 0
    h = histogram(np.full(7, 2.5))
    assert (h.count, h.edges, h.counts, h.mean, h.std) == (7, (2.5, 2.5), (7,), 2.5, 0.0)


# ---------------------------------------------------------------- JSON lines

def test_json_lines_of_every_kind_and_pngs_beside(tmp_path):
    picture = np.random.default_rng(1).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
    with JsonLinesWriter(tmp_path) as w:
        w.write_hparams({"lr": np.float32(0.5), "name": "x", "layers": [1, 2]})
        w.write_scalars(1, {"loss": np.float32(0.25), "acc": jnp.array(1.0), "bad": float("nan")})
        w.write_histograms(1, {"w": np.arange(10.0)}, {"w": 5})
        w.write_images(1, {"eval/digits": picture, "one": picture[0]})
        w.write_texts(1, {"note": "héllo"})
    lines = Path(tmp_path, "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["kind"] for r in records] == ["hparams", "scalar", "scalar", "scalar", "histogram", "image", "image",
                                            "image", "image", "text"]
    assert all(list(r)[:4] == ["step", "wall_time", "kind", "tag"] for r in records)
    assert records[0]["hparams"] == {"lr": 0.5, "name": "x", "layers": "[1, 2]"} and records[0]["step"] is None
    assert [(r["tag"], r["value"]) for r in records[1:3]] == [("loss", 0.25), ("acc", 1.0)]
    assert np.isnan(records[3]["value"]) and "NaN" in lines[3]
    h = records[4]
    assert (h["count"], h["min"], h["max"], h["mean"], h["edges"], h["counts"]) == (
        10, 0.0, 9.0, 4.5, [0.0, 1.8, 3.6, 5.4, 7.2, 9.0], [2, 2, 2, 2, 2])
    images = records[5:9]
    assert [(r["tag"], r.get("index"), r["shape"]) for r in images] == [
        ("eval/digits", 0, [4, 4, 3]), ("eval/digits", 1, [4, 4, 3]), ("eval/digits", 2, [4, 4, 3]),
        ("one", None, [4, 4, 3])]
    assert images[1]["path"] == os.path.join("images", "eval_digits", "1_1.png")
    for r, want in zip(images, [*picture, picture[0]]):
        assert np.array_equal(np.asarray(PILImage.open(tmp_path / r["path"])), want)
    assert records[9]["text"] == "héllo"
    assert read_metrics(tmp_path) == records and read_metrics(tmp_path, "text") == [records[9]]
    with pytest.raises(ValueError, match="closed JsonLinesWriter"):
        w.write_scalars(2, {"loss": 1.0})
    w.close()                                                       # again: nothing


def test_json_lines_append_across_restarts_and_drop_a_torn_last_line(tmp_path, caplog):
    with JsonLinesWriter(tmp_path, save_images=False) as w:
        w.write_scalars(1, {"loss": 1.0})
        w.write_images(1, {"x": np.zeros((2, 2, 1), np.uint8)})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "wall_time": 1.0, "kind": "sca')           # a crash in the middle of a line
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 1]     # the reader leaves it out
    with JsonLinesWriter(tmp_path) as w:                            # a restarted run
        w.write_scalars(2, {"loss": 0.5})
    records = read_metrics(tmp_path)
    assert [(r["step"], r["kind"]) for r in records] == [(1, "scalar"), (1, "image"), (2, "scalar")]
    assert "path" not in records[1] and records[1]["shape"] == [2, 2, 1] and not (tmp_path / "images").exists()
    assert "removed a last line cut short (42 bytes)" in caplog.text
    assert Path(tmp_path, "metrics.jsonl").read_text().endswith("\n")


# ---------------------------------------------------------------- through the Estimator

def test_train_and_evaluate_write_json_lines_and_tensorboard(tmp_path):
    e = make(tmp_path, [TensorBoardWriter, JsonLinesWriter], fn=summarising_model_fn)
    e.train(train_batches, max_steps=25)
    result = e.evaluate(eval_batches)

    train = read_metrics(tmp_path)
    assert train[0]["kind"] == "hparams"
    assert train[0]["hparams"] == {"learning_rate": 0.01, "depth": 2, "train_batch_size": 32}
    scalars = [(r["step"], r["tag"]) for r in train if r["kind"] == "scalar"]
    assert [s for s, tag in scalars if tag == "loss"] == [10, 20, 25]
    assert [s for s, tag in scalars if tag == "batch_loss"] == [0, 10, 20]        # the host_call's steps
    assert {tag for _, tag in scalars} >= {"loss", "batch_loss", "global_step/sec", "examples/sec"}
    hists = [r for r in train if r["kind"] == "histogram"]
    assert [(r["step"], r["tag"], r["count"]) for r in hists] == [(0, "weights", D * C), (10, "weights", D * C),
                                                                  (20, "weights", D * C)]
    images = [r for r in train if r["kind"] == "image"]
    assert [(r["step"], r["shape"]) for r in images] == [(s, [D, C, 1]) for s in (0, 10, 20)]
    assert all((tmp_path / r["path"]).is_file() for r in images)
    assert [r["text"] for r in train if r["kind"] == "text"] == ["step 0", "step 10", "step 20"]
    (loss_20,) = [r["value"] for r in train if r["tag"] == "loss" and r["step"] == 20]

    evaluation = read_metrics(tmp_path / "eval")
    assert {r["tag"]: r["value"] for r in evaluation} == pytest.approx(
        {"loss": result["loss"], "accuracy": result["accuracy"]})
    assert {r["step"] for r in evaluation} == {25}

    acc = accumulator(tmp_path)                                  # the same values in TensorBoard's files
    assert [(ev.step, ev.value) for ev in acc.Scalars("loss")][1] == (20, pytest.approx(loss_20))
    assert [ev.step for ev in acc.Histograms("weights")] == [0, 10, 20]
    assert [ev.step for ev in acc.Images("picture")] == [0, 10, 20]
    assert read_scalars(tmp_path / "eval")["accuracy"] == [(25, pytest.approx(result["accuracy"]))]

    e.train(train_batches, max_steps=35)                        # a second call appends to the same file
    again = read_metrics(tmp_path)
    assert again[:len(train)] == train
    assert [r["step"] for r in again if r["tag"] == "loss"] == [10, 20, 25, 35]
    assert [r["kind"] for r in again].count("hparams") == 2


def test_every_writer_receives_everything(tmp_path):
    shared = Recorder()
    e = make(tmp_path, [Recorder, shared, lambda logdir: Recorder(logdir)], fn=summarising_model_fn)
    e.train(train_batches, max_steps=20)
    e.evaluate(eval_batches, name="holdout")
    e.train(train_batches, max_steps=30)

    made = [r for r in Recorder.made if r is not shared]
    assert [r.logdir for r in made] == [str(tmp_path)] * 2 + [str(tmp_path / "eval_holdout")] * 2 + [str(tmp_path)] * 2
    assert all(r.closed for r in made) and not shared.closed and shared.flushes == 3
    first_train, _, first_eval, _, second_train, _ = made
    assert made[0].calls == made[1].calls and made[2].calls == made[3].calls and made[4].calls == made[5].calls

    kinds = [(kind, step) for kind, step, _ in first_train.calls]
    assert kinds[0] == ("hparams", None)
    assert ("histograms", 0) in kinds and ("images", 10) in kinds and ("texts", 10) in kinds
    assert first_train.calls[1:5] == [("scalars", 0, first_train.calls[1][2]), ("histograms", 0, {"weights": (D, C)}),
                                      ("images", 0, {"picture": (D, C, 1)}), ("texts", 0, {"note": "step 0"})]
    (eval_call,) = first_eval.calls
    assert eval_call[0] == "scalars" and eval_call[1] == 20 and set(eval_call[2]) == {"loss", "accuracy"}

    # the shared writer: everything, evaluation's tags prefixed, hyperparameters once
    expected = first_train.calls + [("scalars", 20, {f"eval_holdout/{k}": v for k, v in eval_call[2].items()})] \
        + [c for c in second_train.calls if c[0] != "hparams"]
    assert shared.calls == expected


class FailingWriter(Recorder):
    fail_on = "write_scalars"

    def write_scalars(self, step, scalars):
        if self.fail_on == "write_scalars" and step >= 20:
            raise OSError("disk full")
        super().write_scalars(step, scalars)

    def close(self):
        super().close()
        if self.fail_on == "close":
            raise OSError("cannot close")


def test_writers_are_closed_whatever_ends_a_call(tmp_path, caplog):
    # a host_call function that raises: the train call fails, every writer made for it is closed
    def failing_host_call(variables, features, labels, mode, params):
        spec = model_fn(variables, features, labels, mode, params)

        def host_fn(step, loss):
            if step == 12:
                raise ValueError("bad step")
        return est.EstimatorSpec(mode, loss=spec.loss, host_call=(host_fn, {"loss": spec.loss}))

    shared = Recorder()
    e = make(tmp_path / "a", [Recorder, JsonLinesWriter, shared], fn=failing_host_call)
    with pytest.raises(ValueError, match="bad step"):
        e.train(train_batches, max_steps=30)
    assert [r.closed for r in Recorder.made] == [False, True] and shared.flushes == 1

    # a host_call function returning what is no value to write
    bad_return = lambda *a: dataclasses.replace(model_fn(*a), host_call=(lambda step, loss: [loss],
                                                                         {"loss": jnp.float32(1)}))
    e = make(tmp_path / "b", [Recorder], fn=bad_return)
    with pytest.raises(est.InvalidArgumentError, match=r"host_call's .*<lambda> returned list"):
        e.train(train_batches, max_steps=10)
    assert Recorder.made[-1].closed

    # a writer that raises: the call fails with its error, the other writers are closed
    e = make(tmp_path / "c", [Recorder, FailingWriter, JsonLinesWriter])
    with pytest.raises(OSError, match="disk full"):
        e.train(train_batches, max_steps=30)
    assert all(r.closed for r in Recorder.made[-2:])
    assert [r["step"] for r in read_metrics(tmp_path / "c") if r["tag"] == "loss"] == [10]

    # evaluation: the same
    make(tmp_path / "f", []).train(train_batches, max_steps=20)
    with pytest.raises(OSError, match="disk full"):
        make(tmp_path / "f", [Recorder, FailingWriter]).evaluate(eval_batches)
    assert all(r.closed for r in Recorder.made[-2:])

    # an error on closing is raised after every writer is closed, or logged when the call is failing already
    FailingWriter.fail_on = "close"
    try:
        e = make(tmp_path / "d", [FailingWriter, Recorder])
        with pytest.raises(OSError, match="cannot close"):
            e.train(train_batches, max_steps=10)
        assert all(r.closed for r in Recorder.made[-2:])
        e = make(tmp_path / "e", [FailingWriter, Recorder], fn=failing_host_call)
        with pytest.raises(ValueError, match="bad step"):
            e.train(train_batches, max_steps=30)
        assert all(r.closed for r in Recorder.made[-2:])
        assert "closing the metric writer" in caplog.text and "cannot close" in caplog.text
    finally:
        FailingWriter.fail_on = "write_scalars"


def test_only_process_zero_writes(tmp_path):
    writers = RunWriters([Recorder, Recorder()], str(tmp_path), active=False)
    assert len(writers) == 0 and len(Recorder.made) == 1           # the factory was never called
    writers.write_scalars(1, {"loss": 1.0})
    with pytest.raises(est.InvalidArgumentError):                   # a bad value is refused on every process
        writers.write_values(1, {"x": object()})
    writers.close()


# ---------------------------------------------------------------- docs/porting.md's tracker recipe

def porting_snippet() -> str:
    text = (ROOT / "docs" / "porting.md").read_text()
    (snippet,) = [block for block in re.findall(r"```python\n(.*?)```", text, re.S) if "class WandbWriter" in block]
    return snippet


class FakeRun:
    """What the recipe uses of a wandb run."""

    def __init__(self, **settings):
        self.settings, self.logged, self.config, self.finished = settings, [], {}, False
        self.config = types.SimpleNamespace(update=self._config_update, values={})

    def _config_update(self, values):
        self.config.values.update(values)

    def log(self, data, step):
        assert not self.logged or step >= self.logged[-1][0], "wandb drops steps that go back"
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_the_porting_recipe_for_a_tracker_runs(tmp_path, monkeypatch):
    fake = types.ModuleType("wandb")
    fake.init = lambda **kw: FakeRun(**kw)
    fake.Histogram = lambda values: ("histogram", np.asarray(values).shape)
    fake.Image = lambda image: ("image", np.asarray(image).shape)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.chdir(tmp_path)                 # the recipe's model_dir is relative

    namespace = {"est": est}
    exec(porting_snippet(), namespace)
    tracker, config = namespace["tracker"], namespace["config"]
    config = dataclasses.replace(config, iterations_per_loop=10, save_summary_steps=10, log_step_count_steps=10)
    e = est.Estimator(summarising_model_fn, init_fn, optax.adam(1e-2), config, params={"learning_rate": 0.01},
                      train_batch_size=32, eval_batch_size=32)
    e.train(train_batches, max_steps=20)
    result = e.evaluate(eval_batches)
    tracker.close()

    run = tracker.run
    assert run.finished and run.settings == {"project": "mnist"}
    assert run.config.values == {"learning_rate": 0.01, "train_batch_size": 32}
    logged = {}
    for step, data in run.logged:
        for k, v in data.items():
            logged.setdefault(k, []).append((step, v))
    assert [s for s, _ in logged["loss"]] == [10, 20]
    assert logged["weights"][0] == (0, ("histogram", (D, C))) and logged["picture"][1] == (10, ("image", (D, C, 1)))
    assert logged["note"] == [(0, "step 0"), (10, "step 10")]
    assert logged["eval/accuracy"] == [(20, pytest.approx(result["accuracy"]))]
    run_dir = tmp_path / namespace["model_dir"]
    assert read_metrics(run_dir)[0]["kind"] == "hparams"            # the recipe's other writers wrote too
    assert read_scalars(run_dir)["loss"][-1][0] == 20
