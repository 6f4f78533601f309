"""RunConfig.profile_steps: a jax.profiler trace of the loops running those steps, with the input's stages named."""

import glob
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
import infeed
from estimator.profiling import ProfileWindow, profile_dir

D = 4
SPEC = {"x": infeed.FixedLen((D,), "float32"), "y": infeed.FixedLen((), "float32")}


def init_fn(rng, features):
    return {"params": {"w": jax.random.normal(rng, (D,)) * 0.1}}


def model_fn(variables, features, labels, mode, params):
    loss = jnp.mean((features["x"] @ variables["params"]["w"] - labels) ** 2)
    return est.EstimatorSpec(mode, loss=loss)


def make(model_dir, profile_steps, k=5, save_every=15):
    config = est.RunConfig(model_dir=str(model_dir), iterations_per_loop=k, save_checkpoints_steps=save_every,
                           profile_steps=profile_steps)
    return est.Estimator(model_fn, init_fn, optax.sgd(0.1), config, train_batch_size=8)


def batches(count=None, fail_at=None):
    """An input_fn of ``count`` batches (None: endless) whose iteration raises at batch ``fail_at``."""
    def input_fn(params):
        rng = np.random.default_rng(0)
        i = 0
        while count is None or i < count:
            if i == fail_at:
                raise RuntimeError(f"the input broke at batch {i}")
            yield {"x": rng.normal(size=(params["batch_size"], D)).astype(np.float32)}, \
                np.zeros(params["batch_size"], np.float32)
            i += 1
    return input_fn


def traces(model_dir) -> list[str]:
    return glob.glob(os.path.join(str(model_dir), "profile", "plugins", "profile", "*", "*.xplane.pb"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("profile") / "train.tfrecord")
    rng = np.random.default_rng(0)
    with infeed.TFRecordWriter(path) as w:
        for _ in range(256):
            w.write(infeed.encode_example({"x": rng.normal(size=D).astype(np.float32), "y": [0.0]}))
    return [path]


def test_profile_steps_write_a_trace_with_the_input_stages_named(files, tmp_path, caplog):
    e = make(tmp_path, (10, 14))
    dataset = lambda params: infeed.Dataset(files, SPEC, batch_size=params["batch_size"], labels="y",
                                            num_epochs=None)
    with caplog.at_level(logging.INFO, logger="estimator"):
        e.train(dataset, max_steps=25)
    e.close()
    [trace] = traces(tmp_path)
    data = open(trace, "rb").read()
    for name in (b"feeder/wait", b"feeder/source", b"feeder/transfer", b"feeder/wait_ready", b"infeed/wait_for_slot",
                 b"estimator/fetch_outputs", b"estimator/summaries", b"estimator/checkpoint"):
        assert name in data, name
    assert b"Feeder" in data                                   # the feeder's thread, named for the profiler
    assert os.path.exists(os.path.join(os.path.dirname(trace), "perfetto_trace.json.gz"))
    assert "profile of the loops of steps 10..14 written to " + os.path.dirname(trace) in caplog.text
    assert "tensorboard --logdir " + str(tmp_path / "profile") in caplog.text
    assert "the decoding workers run outside it: `infeed stats infeed-" in caplog.text
    stages = next(r.getMessage() for r in caplog.records if "the input over the profiled loops" in r.getMessage())
    assert "wait_for_slot" in stages and stages.splitlines()[-1].split(":")[0] in (
        "input-bound", "trainer-bound", "balanced", "hand-off-bound")


class _Profiler:
    """jax.profiler's start_trace and stop_trace, recorded with the step the window had seen."""

    def __init__(self, monkeypatch):
        self.calls, self.window = [], None
        monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: self.calls.append(("start", self.window.step)))
        monkeypatch.setattr(jax.profiler, "stop_trace", lambda: self.calls.append(("stop", self.window.step)))

    def run(self, window: ProfileWindow, loops: list[int]) -> list:
        """Drives ``window`` as train() does over loops of the given sizes (then the input ends, if
        before the target); returns the calls."""
        self.window, step = window, window.start
        try:
            for n in loops:
                window.before_loop(step)
                step += n
                window.after_loop(step)
            if step < window.target:
                window.before_loop(step)        # the input's end is found waiting for the next loop's batches
        finally:
            window.close()
        return self.calls


@pytest.mark.parametrize("steps, start, target, loops, calls", [
    ((10, 14), 0, 30, [5] * 6, [("start", 10), ("stop", 15)]),        # exactly the loops 10..14
    ((12, 17), 0, 30, [5] * 6, [("start", 10), ("stop", 20)]),        # the loops holding 12 and 17
    ((0, 0), 0, 30, [5] * 6, [("start", 0), ("stop", 5)]),            # the first loop (compilation included)
    ((27, 40), 0, 30, [5] * 6, [("start", 25), ("stop", 30)]),        # the call ends first: stopped by close
    ((27, 40), 0, 29, [5] * 5 + [4], [("start", 25), ("stop", 29)]),  # a partial last loop
    ((20, 30), 0, 30, [5] * 4, [("start", 20), ("stop", 20)]),        # the input ends as the window begins
    ((30, 40), 0, 30, [5] * 6, []),                                   # not reached
    ((3, 8), 10, 30, [5] * 4, []),                                    # trained before this call
])
def test_the_trace_covers_the_loops_that_run_the_profiled_steps(tmp_path, monkeypatch, steps, start, target,
                                                                 loops, calls):
    config = est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=5, profile_steps=steps)
    assert _Profiler(monkeypatch).run(ProfileWindow(config, start, target), loops) == calls


def test_a_window_never_reached_traces_nothing_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="estimator"):
        make(tmp_path, (100, 110)).train(batches(), max_steps=10)
    assert not os.path.exists(tmp_path / "profile")
    assert "RunConfig.profile_steps=(100, 110): no trace, this call trained steps 0..9" in caplog.text


def test_a_run_that_fails_mid_profile_stops_the_trace(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="estimator"), pytest.raises(RuntimeError, match="broke at batch 12"):
        make(tmp_path, (5, 50)).train(batches(fail_at=12), max_steps=100)     # loops of 5 batches: the third fails
    assert len(traces(tmp_path)) == 1
    assert "(the call ended after step 9, before step 50)" in caplog.text
    jax.profiler.start_trace(str(tmp_path / "again"))           # no trace left running
    jax.profiler.stop_trace()


def test_an_input_that_ends_mid_profile_stops_the_trace(tmp_path):
    make(tmp_path, (5, 50)).train(batches(count=60), max_steps=100)    # 12 loops of 5, then the input ends
    assert len(traces(tmp_path)) == 1
    jax.profiler.start_trace(str(tmp_path / "again"))
    jax.profiler.stop_trace()


def test_a_trace_already_running_is_left_alone(tmp_path, caplog):
    jax.profiler.start_trace(str(tmp_path / "mine"))
    try:
        with caplog.at_level(logging.WARNING, logger="estimator"):
            make(tmp_path, (0, 4)).train(batches(), max_steps=10)
        assert "no trace of steps 0..4" in caplog.text and "already been started" in caplog.text
    finally:
        jax.profiler.stop_trace()                              # still ours to stop
    assert not os.path.exists(tmp_path / "profile")


@pytest.mark.parametrize("steps", [(3,), (1, 2, 3), (5, 2), (-1, 3), (1.0, 2), (True, 2), "0,1", 4, (None, 3)])
def test_profile_steps_are_checked(tmp_path, steps):
    with pytest.raises(est.InvalidArgumentError, match="RunConfig.profile_steps"):
        est.RunConfig(model_dir=str(tmp_path), profile_steps=steps)


def test_profile_steps_may_be_a_list_and_default_to_none(tmp_path):
    assert est.RunConfig(model_dir=str(tmp_path), profile_steps=[2, 2]).profile_steps == (2, 2)
    assert est.RunConfig(model_dir=str(tmp_path)).profile_steps is None


def test_each_process_traces_into_its_own_directory(tmp_path, monkeypatch):
    config = est.RunConfig(model_dir=str(tmp_path), profile_steps=(0, 1))
    assert profile_dir(config) == str(tmp_path / "profile")
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    assert profile_dir(config) == str(tmp_path / "profile" / "process_1")
