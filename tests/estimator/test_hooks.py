"""estimator/hooks.py: the hook protocol in train and train_and_evaluate, stopping, failures, and the built-in hooks."""

import gc
import itertools
import json
import logging
import math
import os

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
import infeed
import xla_runtime as xr
from estimator import hooks
from estimator.hooks import EvaluationContext, LoopContext
from infeed.ring import segments

D = 4
X = np.random.default_rng(0).normal(size=(8, D)).astype(np.float32)
Y = X @ np.arange(1.0, D + 1, dtype=np.float32)


def model_fn(variables, features, labels, mode, params):
    predictions = features["x"] @ variables["params"]["w"]
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"y": predictions})
    return est.EstimatorSpec(mode, loss=jnp.mean((predictions - labels) ** 2),
                             eval_metrics={"mae": est.metrics.mean_absolute_error(labels, predictions)})


def init_fn(rng, features):
    return {"params": {"w": jnp.zeros(D)}}


def train_input(params):
    return itertools.repeat(({"x": X}, Y))            # the same batch every step


def eval_input(params):
    return [({"x": X}, Y)] * 2


def make(model_dir, learning_rate=0.02, **config):
    config = est.RunConfig(model_dir=str(model_dir), **{"iterations_per_loop": 5, "save_checkpoints_steps": 10,
                                                        "log_step_count_steps": 10, **config})
    return est.Estimator(model_fn, init_fn, optax.sgd(learning_rate), config, train_batch_size=8,
                         eval_batch_size=8, predict_batch_size=8)


class Recorder(hooks.Hook):
    """Every call, in order: ("begin",), ("loop", global_step, steps, len(losses)), ("eval", step), ("end", ...)."""

    def __init__(self, stop_at=None, stop_after_evaluations=None):
        self.calls, self.contexts = [], []
        self.stop_at, self.stop_after_evaluations = stop_at, stop_after_evaluations

    def begin(self, estimator):
        self.calls.append(("begin",))

    def after_loop(self, context):
        self.contexts.append(context)
        self.calls.append(("loop", context.global_step, context.steps, len(context.losses)))
        if self.stop_at is not None and context.global_step >= self.stop_at:
            context.request_stop(f"step {context.global_step} reached")

    def before_checkpoint(self, context):
        self.calls.append(("checkpoint", context.global_step))

    def after_evaluation(self, context):
        self.calls.append(("eval", context.global_step))
        if self.stop_after_evaluations is not None and len(
                [c for c in self.calls if c[0] == "eval"]) >= self.stop_after_evaluations:
            context.request_stop("enough evaluations")

    def end(self, context):
        self.calls.append(("end", context.global_step, context.stop_reason, type(context.error).__name__))


# --- the protocol in train --------------------------------------------------------------------

def test_train_tells_hooks_of_each_loop_and_checkpoint_between_one_begin_and_one_end(tmp_path):
    hook = Recorder()
    make(tmp_path).train(train_input, max_steps=23, hooks=[hook])          # loops end at 5, 10, 15, 20, 23
    assert hook.calls == [("begin",), ("loop", 5, 5, 5), ("loop", 10, 5, 5), ("checkpoint", 10), ("loop", 15, 5, 5),
                          ("loop", 20, 5, 5), ("checkpoint", 20), ("loop", 23, 3, 3), ("checkpoint", 23),
                          ("end", 23, None, "NoneType")]
    first, second = hook.contexts[:2]
    assert first.includes_startup and not second.includes_startup
    assert second.first_step == 5 and second.examples_per_step == 8 and second.seconds > 0
    assert second.loss == float(second.outputs["loss"][-1]) and second.losses.shape == (5,)
    assert second.loss < first.losses[0]                              # it learns
    assert isinstance(second.estimator, est.Estimator)


def test_a_hook_that_requests_a_stop_ends_train_after_that_loop_checkpointed_as_at_the_end(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="estimator")
    hook = Recorder(stop_at=12)
    e = make(tmp_path, iterations_per_loop=4, save_checkpoints_steps=8).train(train_input, max_steps=40, hooks=[hook])
    assert e.global_step() == 12 and e.checkpoints.all_steps() == [8, 12]      # the cadence, then the stop
    assert hook.calls[-2:] == [("checkpoint", 12), ("end", 12, "step 12 reached", "NoneType")]
    assert "training stops at step 12: step 12 reached" in caplog.text
    assert "the input ended" not in caplog.text
    assert e.train(train_input, max_steps=20).global_step() == 20                # goes on from there


def test_hooks_run_on_the_host_and_never_compile_a_program(tmp_path):
    e = make(tmp_path)
    e.train(train_input, max_steps=20)                 # compiles the loop and the checkpoint's finiteness check
    with xr.CompileWatch() as bare:
        e.train(train_input, steps=20)
    every = [Recorder(stop_at=10 ** 9), hooks.StepTimeLogger(every_steps=10), hooks.EarlyStopping("loss")]
    with xr.CompileWatch() as hooked:
        e.train(train_input, steps=20, hooks=every)
    assert hooked.programs == bare.programs == 0
    assert e.global_step() == 60 and len(every[0].contexts) == 4


def test_hooks_must_be_hook_objects(tmp_path):
    e = make(tmp_path)
    with pytest.raises(est.ArgumentTypeError, match=r"hooks\[1\] must be an estimator.hooks.Hook .*got function"):
        e.train(train_input, max_steps=5, hooks=[Recorder(), lambda context: None])
    with pytest.raises(est.ArgumentTypeError, match="hooks must be a list of estimator.hooks.Hook, got Recorder"):
        e.train(train_input, max_steps=5, hooks=Recorder())
    with pytest.raises(est.ArgumentTypeError, match=r"TrainSpec.hooks\[0\]"):
        est.TrainSpec(train_input, max_steps=5, hooks=["early"])
    with pytest.raises(est.ArgumentTypeError, match=r"EvalSpec.hooks\[0\]"):
        est.EvalSpec(eval_input, hooks=[None])
    assert est.EvalSpec(eval_input, hooks=[hooks.EarlyStopping()]).hooks[0].metric == "loss"       # kept as a tuple


# --- failures ---------------------------------------------------------------------------------

@pytest.fixture
def records(tmp_path):
    path = str(tmp_path / "train.tfrecord")
    with infeed.TFRecordWriter(path) as w:
        for x, y in zip(X, Y):
            w.write(infeed.encode_example({"x": x, "y": [float(y)]}))
    return path


class Boom(hooks.Hook):
    def __init__(self, at):
        self.at, self.ended = at, None

    def after_loop(self, context):
        if context.global_step >= self.at:
            raise RuntimeError("the hook broke")

    def end(self, context):
        self.ended = context


def test_a_hook_error_propagates_naming_the_hook_and_train_closes_its_input(tmp_path, records):
    spec = {"x": infeed.FixedLen((D,), "float32"), "y": infeed.FixedLen((), "float32")}

    def dataset(params):
        return infeed.Dataset(records, spec, batch_size=params["batch_size"], labels="y", num_epochs=None)

    # The rings this process owns, before. Earlier tests' Estimators left unclosed keep their training input (a
    # daemon and its ring) until the cyclic collector frees them (ModelSteps holds Estimator._spec: a cycle): collected
    # now, not by a full collection in the middle of this test, which would take their rings out of the set below.
    gc.collect()
    owned = set(segments._OWNED)
    e, boom = make(tmp_path / "model"), Boom(at=15)
    with pytest.raises(RuntimeError, match="the hook broke") as raised:
        e.train(dataset, max_steps=30, hooks=[boom])
    assert "(raised by the hook Boom.after_loop at global step 15)" in raised.value.__notes__
    assert isinstance(boom.ended.error, RuntimeError) and boom.ended.global_step == 10    # end told, after clean-up
    assert e._kept_input is None and set(segments._OWNED) == owned         # no daemon, no shared memory left
    assert e.checkpoints.all_steps() == [10]
    assert e.train(dataset, max_steps=20).global_step() == 20               # resumes from the checkpoint
    e.close()
    assert set(segments._OWNED) == owned


def test_a_failing_begin_ends_only_the_hooks_that_began(tmp_path):
    class BadBegin(hooks.Hook):
        def begin(self, estimator):
            raise ValueError("no")

    first, after = Recorder(), Recorder()
    with pytest.raises(ValueError, match="no") as raised:
        make(tmp_path).train(train_input, max_steps=10, hooks=[first, BadBegin(), after])
    assert raised.value.__notes__ == ["(raised by the hook BadBegin.begin)"]
    assert first.calls == [("begin",), ("end", 0, None, "ValueError")] and after.calls == []


def test_stop_on_nan_runs_first_so_no_hook_sees_a_non_finite_loop(tmp_path):
    def nan_at_12(variables, features, labels, mode, params):
        spec = model_fn(variables, features, labels, mode, params)
        return spec if mode != est.ModeKeys.TRAIN else est.EstimatorSpec(
            mode, loss=jnp.where(xr.current_step() >= 11, jnp.nan, spec.loss))

    e = make(tmp_path)
    e.model_fn, hook = nan_at_12, Recorder()
    with pytest.raises(est.NonFiniteError, match=r"the loss is nan at step 12 \(in the loop of steps 11\.\.15\)"):
        e.train(train_input, max_steps=20, hooks=[hook])
    assert [c[1] for c in hook.calls if c[0] == "loop"] == [5, 10]
    assert hook.calls[-1] == ("end", 10, None, "NonFiniteError")
    quiet = make(tmp_path / "off", stop_on_nan=False)                  # the hook alone, where the config is off
    quiet.model_fn = nan_at_12
    with pytest.raises(est.NonFiniteError, match="at step 12"):
        quiet.train(train_input, max_steps=20, hooks=[hooks.StopOnNaN()])
    assert quiet.train(train_input, max_steps=20).global_step() == 20    # and without it, training goes on


# --- train_and_evaluate -----------------------------------------------------------------------

def test_train_and_evaluate_runs_its_hooks_once_from_begin_to_end(tmp_path):
    both, trained, evaluated = Recorder(), Recorder(), Recorder()
    results = est.train_and_evaluate(make(tmp_path), est.TrainSpec(train_input, 25, hooks=[both, trained]),
                                     est.EvalSpec(eval_input, every_steps=10, hooks=[both, evaluated]))
    assert [r["global_step"] for r in results] == [10, 20, 25]
    for hook in (both, trained, evaluated):                          # one list: each hook told of everything, once
        assert hook.calls[0] == ("begin",) and hook.calls[-1] == ("end", 25, None, "NoneType")
        assert [c for c in hook.calls if c[0] in ("loop", "eval")] == [
            ("loop", 5, 5, 5), ("loop", 10, 5, 5), ("eval", 10), ("loop", 15, 5, 5), ("loop", 20, 5, 5),
            ("eval", 20), ("loop", 25, 5, 5), ("eval", 25)]


def test_a_stop_after_a_loop_ends_train_and_evaluate_with_an_evaluation_of_that_step(tmp_path):
    hook = Recorder(stop_at=15)
    results = est.train_and_evaluate(make(tmp_path), est.TrainSpec(train_input, 100),
                                     est.EvalSpec(eval_input, every_steps=10), hooks=[hook])
    assert [r["global_step"] for r in results] == [10, 15]
    assert hook.calls[-1] == ("end", 15, "step 15 reached", "NoneType")


def test_a_stop_at_the_end_of_a_leg_is_not_trained_past(tmp_path):
    hook = Recorder(stop_at=20)                     # the step where the leg ends anyway
    results = est.train_and_evaluate(make(tmp_path), est.TrainSpec(train_input, 100),
                                     est.EvalSpec(eval_input, every_steps=10), hooks=[hook])
    assert [r["global_step"] for r in results] == [10, 20]


def test_early_stopping_ends_train_and_evaluate_when_the_metric_stops_improving(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="estimator")
    stop = hooks.EarlyStopping("mae", patience=2, mode="min")
    e = make(tmp_path, learning_rate=0.0)            # nothing learns: the first evaluation stays the best
    results = est.train_and_evaluate(e, est.TrainSpec(train_input, 1000),
                                     est.EvalSpec(eval_input, every_steps=10, hooks=[stop]))
    assert [r["global_step"] for r in results] == [10, 20, 30]
    assert e.global_step() == 30 and e.checkpoints.latest_step() == 30
    assert stop.best == results[0]["mae"] and stop.best_step == 10
    assert "train_and_evaluate stops at step 30: mae has not improved on" in caplog.text


def test_a_stop_after_an_evaluation_returns_at_once(tmp_path):
    hook = Recorder(stop_after_evaluations=1)
    results = est.train_and_evaluate(make(tmp_path), est.TrainSpec(train_input, 100),
                                     est.EvalSpec(eval_input, every_steps=10), hooks=[hook])
    assert [r["global_step"] for r in results] == [10]
    assert hook.calls[-1] == ("end", 10, "enough evaluations", "NoneType")


# --- EarlyStopping ----------------------------------------------------------------------------

def evaluate(hook, values, metric="loss"):
    """``hook.after_evaluation`` on each value (at steps 1, 2, ...); the step of the first stop request, or None."""
    hook.begin(None)
    for step, value in enumerate(values, 1):
        context = EvaluationContext(None, step, {metric: value, "global_step": step})
        hook.after_evaluation(context)
        if context.stop_requested:
            return step
    return None


def test_early_stopping_counts_evaluations_without_an_improvement_beyond_min_delta():
    assert evaluate(hooks.EarlyStopping(patience=2), [1.0, 0.9, 0.95, 0.8, 0.85, 0.81]) == 6
    assert evaluate(hooks.EarlyStopping(patience=3), [1.0, 0.9, 0.95, 0.8, 0.85, 0.81]) is None
    assert evaluate(hooks.EarlyStopping(patience=2, min_delta=0.15), [1.0, 0.9, 0.86, 0.7]) == 3  # not by > 0.15
    assert evaluate(hooks.EarlyStopping("acc", patience=1, mode="max"), [0.5, 0.6, 0.6], "acc") == 3
    assert evaluate(hooks.EarlyStopping(patience=2), [math.nan, math.nan]) == 2                   # NaN never improves
    hook = hooks.EarlyStopping(patience=1)
    assert evaluate(hook, [1.0, 2.0]) == 2 and evaluate(hook, [3.0, 2.0]) is None                 # begin starts over


def test_early_stopping_settings_and_metrics_are_checked():
    with pytest.raises(est.InvalidArgumentError, match="EarlyStopping.patience must be a positive int"):
        hooks.EarlyStopping(patience=0)
    with pytest.raises(est.InvalidArgumentError, match="EarlyStopping.mode must be 'min' or 'max', got 'lowest'"):
        hooks.EarlyStopping(mode="lowest")
    with pytest.raises(est.InvalidArgumentError, match="EarlyStopping.min_delta must be a number >= 0"):
        hooks.EarlyStopping(min_delta=-1)
    with pytest.raises(est.InvalidArgumentError, match="no metric 'accuracy'; it has global_step, loss"):
        evaluate(hooks.EarlyStopping("accuracy"), [1.0])


# --- BestExporter -----------------------------------------------------------------------------

SERVING = {"x": est.TensorSpec((None, D), "float32")}


class FakeEstimator:
    """What BestExporter uses of an Estimator; ``export`` writes ``<dir>/<step>/signature.json``."""

    def __init__(self, model_dir):
        self.config = est.RunConfig(model_dir=str(model_dir))
        self.step = 0

    def export(self, export_dir, serving_features, platforms=None):
        path = os.path.join(export_dir, str(self.step))
        os.makedirs(path)
        with open(os.path.join(path, "signature.json"), "w") as f:
            f.write("{}")
        return path


def exported(hook, estimator, values):
    hook.begin(estimator)
    for value in values:
        estimator.step += 10
        hook.after_evaluation(EvaluationContext(estimator, estimator.step, {"loss": value,
                                                                           "global_step": estimator.step}))
    return sorted(int(n) for n in os.listdir(os.path.join(estimator.config.model_dir, "export", "best"))
                  if not n.startswith("."))


def test_best_exporter_exports_each_new_best_and_keeps_the_newest_k(tmp_path):
    e = FakeEstimator(tmp_path)
    hook = hooks.BestExporter(SERVING, keep=2)
    assert exported(hook, e, [5.0, 4.0, 4.5, 3.0, 3.5, 2.0]) == [40, 60]
    assert [x["step"] for x in hook.exports] == [40, 60] and hook.best == 2.0
    record = json.loads((tmp_path / "export" / "best" / ".best_exports.json").read_text())
    assert record == {"metric": "loss", "mode": "min", "exports": [{"step": 40, "value": 3.0, "path": "40"},
                                                                   {"step": 60, "value": 2.0, "path": "60"}]}
    restarted = hooks.BestExporter(SERVING, keep=2)       # a new run: compares with the recorded best, prunes on
    assert exported(restarted, e, [2.5, 1.0]) == [60, 80]
    assert restarted.best == 1.0


def test_best_exporter_deletes_only_exports_it_made_never_through_a_link(tmp_path):
    e = FakeEstimator(tmp_path / "model")
    best = tmp_path / "model" / "export" / "best"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "signature.json").write_text("the user's")
    hook = hooks.BestExporter(SERVING, keep=1)
    assert exported(hook, e, [3.0]) == [10]
    os.rename(best / "10", tmp_path / "moved")
    (best / "10").symlink_to(outside)                    # the recorded export replaced by a link
    assert exported(hook, e, [2.0]) == [10, 20]
    assert (outside / "signature.json").read_text() == "the user's" and (best / "10").is_symlink()
    assert [x["step"] for x in hook.exports] == [20]


def test_best_exporter_in_train_and_evaluate_writes_loadable_exports_of_the_best_steps(tmp_path):
    e = make(tmp_path)
    best = hooks.BestExporter(SERVING, metric="mae", keep=2)
    results = est.train_and_evaluate(e, est.TrainSpec(train_input, 30), est.EvalSpec(eval_input, every_steps=10,
                                                                                     hooks=[best]))
    assert results[0]["mae"] > results[1]["mae"] > results[2]["mae"]         # each evaluation a new best
    export_dir = tmp_path / "export" / "best"
    assert sorted(n for n in os.listdir(export_dir) if not n.startswith(".")) == ["20", "30"]
    served = est.load_exported(str(export_dir / "30"))({"x": X})
    want = X @ np.asarray(e.get_variables()["params"]["w"])
    np.testing.assert_allclose(served["y"], want, rtol=1e-5)


# --- StepTimeLogger ---------------------------------------------------------------------------

def test_step_time_logger_logs_the_first_loop_apart_and_then_each_multiple(caplog):
    caplog.set_level(logging.INFO, logger="estimator")
    hook = hooks.StepTimeLogger(every_steps=20)
    hook.begin(None)
    for step, seconds, wait, first in [(10, 5.0, 1.0, True), (20, 1.0, 0.1, False), (30, 1.0, 0.1, False),
                                       (40, 2.0, 0.2, False)]:
        hook.after_loop(LoopContext(None, step, step - 10, {"loss": np.zeros(10)}, seconds, wait, 32, first))
    assert [r.getMessage() for r in caplog.records] == [
        "steps 1..10: 5.000 s, 500 ms/step, 2 steps/s, 64 examples/s, input wait 20 % (start-up included)",
        "steps 11..20: 1.000 s, 100 ms/step, 10 steps/s, 320 examples/s, input wait 10 %",
        "steps 21..40: 3.000 s, 150 ms/step, 6.667 steps/s, 213 examples/s, input wait 10 %"]
    assert hook.history == [(10, 0.5), (20, 0.1), (40, 0.15)]
    with pytest.raises(est.InvalidArgumentError, match="StepTimeLogger.every_steps"):
        hooks.StepTimeLogger(every_steps=0)


def test_step_time_logger_in_train_logs_each_loop(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="estimator")
    make(tmp_path).train(train_input, max_steps=15, hooks=[hooks.StepTimeLogger()])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("steps ")]
    assert [line.split(":")[0] for line in lines] == ["steps 1..5", "steps 6..10", "steps 11..15"]
    assert lines[0].endswith("(start-up included)") and "examples/s" in lines[1]
