"""Iterable inputs with get_state()/set_state() (Grain's and our own) resume exactly where training stopped;
inputs without state are warned of, or refused."""

import base64
import json
import logging
import os
import shutil

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
from estimator.checkpoints import Checkpoints
from estimator.loop import resumable

B, D = 8, 3                     # the global batch: a multiple of the 8 CPU devices


def batch_of(ids):
    """One (features, labels) batch whose examples are ``ids``: the model_fn records them, and they fix its loss."""
    ids = np.asarray(ids, np.int32)
    x = np.stack([np.cos(ids), np.sin(ids), np.ones(len(ids))], -1).astype(np.float32)
    return {"id": ids, "x": x}, (ids % 5).astype(np.float32)


def init_fn(rng, features):
    return {"w": jnp.zeros(D)}


def recording(seen):
    """A model_fn whose host_call appends each trained step's example ids to ``seen``."""
    def model_fn(variables, features, labels, mode, params):
        loss = jnp.mean((features["x"] @ variables["w"] - labels) ** 2)
        return est.EstimatorSpec(mode, loss=loss, host_call=(lambda step, ids: seen.append(tuple(ids.tolist())),
                                                             {"ids": features["id"]}))
    return model_fn


def make(model_dir, seen, k=3, **config):
    config = est.RunConfig(model_dir=str(model_dir), iterations_per_loop=k, log_step_count_steps=1000, **config)
    return est.Estimator(recording(seen), init_fn, optax.sgd(0.1), config, train_batch_size=B)


class Counting:
    """A stateful iterator of our own: batch i holds examples i*B .. i*B+B-1. ``as_bytes``: its state is bytes."""

    def __init__(self, as_bytes=False):
        self.i, self.as_bytes = 0, as_bytes

    def __iter__(self):
        return self

    def __next__(self):
        self.i += 1
        return batch_of(range((self.i - 1) * B, self.i * B))

    def get_state(self):
        state = {"i": self.i}
        return json.dumps(state).encode() if self.as_bytes else state

    def set_state(self, state):
        self.i = (json.loads(state) if self.as_bytes else state)["i"]


def ids(i):
    """The example ids of Counting's batch i."""
    return tuple(range(i * B, i * B + B))


def grain_map_dataset(params):
    import grain
    n = params["batch_size"]                # an infinite, shuffled sequence of batches, prefetched by Grain's threads
    return (grain.MapDataset.range(10_000).shuffle(seed=3).map(lambda i: batch_of(range(i * n, i * n + n)))
            .to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)))


def grain_data_loader(params):
    import grain

    class ToBatch(grain.transforms.Map):
        def map(self, ids):
            return batch_of(ids)

    sampler = grain.samplers.IndexSampler(num_records=4096, shard_options=grain.sharding.NoSharding(),
                                          shuffle=True, num_epochs=1, seed=7)
    return grain.DataLoader(data_source=list(range(4096)), sampler=sampler, worker_count=0,
                            operations=[grain.transforms.Batch(params["batch_size"]), ToBatch()])


INPUTS = {
    "grain.MapDataset": grain_map_dataset,
    "grain.DataLoader": grain_data_loader,
    "an iterator with a JSON state": lambda params: Counting(),
    "an iterator with a bytes state": lambda params: Counting(as_bytes=True),
}


@pytest.mark.parametrize("name", list(INPUTS))
def test_a_run_stopped_and_restarted_trains_on_the_batches_of_one_uninterrupted_run(name, tmp_path):
    if name.startswith("grain"):
        pytest.importorskip("grain")            # in the dev extra; the estimator never imports it
    input_fn = INPUTS[name]
    whole, split = [], []
    # 3 steps per loop and the feeder's 2 loops of prefetch: at step 7 (2 loops and a partial one of 1 step)
    # the input has given up to 3 + 3 + 3 + 6 batches, of which 7 were trained on.
    make(tmp_path / "whole", whole).train(input_fn, max_steps=14)
    make(tmp_path / "split", split).train(input_fn, max_steps=7)
    assert len(split) == 7
    make(tmp_path / "split", split).train(input_fn, max_steps=14)       # a new Estimator: from the checkpoint
    assert len(whole) == 14 and len(set(whole)) == 14
    assert split == whole
    if name == "an iterator with a JSON state":
        assert whole == [ids(i) for i in range(14)]
    with Checkpoints(tmp_path / "split" / "checkpoints") as ckpt:
        saved = ckpt.extras()
    assert saved["global_step"] == 14 and saved["input"]["kind"] == "get_state"


def test_each_checkpoint_saves_the_position_after_its_last_trained_batch_not_after_prefetched_ones(tmp_path):
    seen = []
    make(tmp_path, seen, k=3, save_checkpoints_steps=2, keep_checkpoint_max=None).train(
        lambda params: Counting(), max_steps=11)                # loops end at 3, 6, 9, 11 (a partial loop)
    assert seen == [ids(i) for i in range(11)]
    with Checkpoints(tmp_path / "checkpoints") as ckpt:
        assert ckpt.all_steps() == [3, 6, 9, 11]
        for step in ckpt.all_steps():
            assert ckpt.extras(step)["input"] == {"kind": "get_state", "iterator": f"{__name__}.Counting",
                                                  "json": {"i": step}}
    for step in (9, 6, 3):                      # the newer ones dropped, a new run restores from `step` ...
        for later in [s for s in os.listdir(tmp_path / "checkpoints") if s.isdigit() and int(s) > step]:
            shutil.rmtree(tmp_path / "checkpoints" / later)
        after = []
        make(tmp_path, after, k=3, save_checkpoints_steps=2).train(lambda params: Counting(), max_steps=13)
        assert after == [ids(i) for i in range(step, 13)]      # ... and goes on with the batch after it


def test_two_train_calls_of_one_estimator_go_on_where_the_first_stopped(tmp_path):
    whole, split, again = [], [], []
    make(tmp_path / "whole", whole).train(lambda params: Counting(), max_steps=10)
    e = make(tmp_path / "split", split)
    e.train(lambda params: Counting(), steps=5).train(lambda params: Counting(), steps=5)   # a new iterator each call
    assert split == whole
    shared = Counting()                         # the same iterator each call: prefetching moved it past step 5
    e = make(tmp_path / "shared", again)
    e.train(lambda params: shared, steps=5)
    assert shared.i > 5
    e.train(lambda params: shared, steps=5)
    assert again == whole


def test_an_input_without_state_is_warned_of_and_refused_when_required(tmp_path, caplog):
    seen = []
    batches = [batch_of(range(i * B, i * B + B)) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="estimator"):
        make(tmp_path / "warned", seen).train(lambda params: batches, steps=4)
    warnings = [r.getMessage() for r in caplog.records if r.name == "estimator" and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "input_fn gave an object of type list (iterated by list_iterator)" in warnings[0]
    assert "read it again from its beginning" in warnings[0] and "require_resumable_input=True" in warnings[0]
    assert len(seen) == 4
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="estimator"):
        make(tmp_path / "resumable", []).train(lambda params: Counting(), steps=2)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    seen.clear()
    e = make(tmp_path / "refused", seen, require_resumable_input=True)
    with pytest.raises(est.InputError, match=r"of type generator, which cannot save its position.*"
                                             r"require_resumable_input=True"):
        e.train(lambda params: (b for b in batches), steps=4)
    assert seen == [] and e.global_step() == 0 and e.latest_checkpoint() is None
    e.train(lambda params: Counting(), steps=2)                 # a resumable input trains
    assert len(seen) == 2
    with pytest.raises(est.InvalidArgumentError, match="require_resumable_input must be a bool, got 'yes'"):
        est.RunConfig(model_dir=str(tmp_path), require_resumable_input="yes")


class Stated(Counting):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def get_state(self):
        return self.state


@pytest.mark.parametrize("state, problem", [
    ({"i": np.int64(3)}, "is not JSON"),
    ({"i": float("nan")}, "is not JSON"),
    ({"pos": (1, 2)}, "does not come back from JSON equal"),
    ({1: 2}, "does not come back from JSON equal"),
])
def test_a_state_that_is_not_json_is_a_clear_error_before_any_step(state, problem, tmp_path):
    seen = []
    e = make(tmp_path, seen)
    with pytest.raises(est.InputError, match=f"{__name__}.Stated.get_state\\(\\) gave a state that {problem}"):
        e.train(lambda params: Stated(state), steps=3)
    assert seen == [] and e.latest_checkpoint() is None


def test_a_checkpointed_iterator_position_needs_an_input_that_can_take_it(tmp_path):
    make(tmp_path, []).train(lambda params: Counting(), steps=3)
    with pytest.raises(est.InputError, match="holds the input position of a .*Counting iterator; input_fn gave an "
                                             "object of type list .*has no get_state"):
        make(tmp_path, []).train(lambda params: [batch_of(range(B))] * 3, steps=3)

    class Refusing(Counting):
        def set_state(self, state):
            raise KeyError("not mine")
    with pytest.raises(est.InputError, match="Refusing.set_state refused the input position saved by a "
                                             ".*Counting iterator: KeyError") as info:
        make(tmp_path, []).train(lambda params: Refusing(), steps=3)
    assert isinstance(info.value.__cause__, KeyError)


def test_saved_states_are_json_bytes_in_base64_and_a_dataset_position_is_no_iterator_state():
    c = Counting(as_bytes=True)
    next(c)
    saved = resumable.snapshot(c)
    assert base64.b64decode(saved["base64"]) == b'{"i": 1}' and json.loads(json.dumps(saved)) == saved
    fresh = Counting(as_bytes=True)
    resumable.restore(fresh, saved, "a Counting")
    assert fresh.i == 1
    dataset_position = {"version": 1, "epoch": 0, "batch": 3, "seed": 0, "fingerprint": "x", "dataset": {}}
    assert not resumable.is_iterator_state(dataset_position) and resumable.is_iterator_state(saved)
    with pytest.raises(est.InputError, match="holds an infeed.Dataset's input position; input_fn gave a Counting"):
        resumable.restore(fresh, dataset_position, "a Counting")
    with pytest.raises(est.InputError, match="malformed"):
        resumable.restore(fresh, {"kind": "get_state", "base64": "not base64!"}, "a Counting")
