"""Transforms for tests: module-level functions the daemon's workers import by name (``tests/`` is on
``sys.path`` through its conftest.py, and the workers get the daemon's ``sys.path``)."""

import os
import time

import numpy as np

import infeed

#: What :func:`noisy` returns, one example's arrays.
NOISY_OUTPUTS = {"id": ((), "int64"), "twice": ((2,), "int32"), "noise": ((), "float64"),
                 "tokens": infeed.Padded(((4,), "int32"), ((), "int32"))}


def noisy(example, rng):
    """The record's id, twice its id as a pair, its first draw, its tokens as they are."""
    return {"id": example["id"], "twice": np.full(2, example["id"] * 2), "noise": rng.random(),
            "tokens": example["tokens"]}


def without_rng(example):
    return {"id": example["id"], "twice": [example["id"] * 2] * 2, "noise": 0.5, "tokens": example["tokens"]}


def batch_noise(batch, rng):
    """Each row's ``noise`` plus the batch's first draw (the rows' ids as they are)."""
    return {**batch, "noise": batch["noise"] + rng.random()}


#: What :func:`summed` returns, one example's arrays (from the decoded features, for a batch_transform alone).
SUMMED_OUTPUTS = {"id": ((), "int64"), "length": ((), "int32")}


def summed(batch):
    return {"id": batch["id"], "length": batch["tokens"].lengths + batch["id"] % 2}


#: The environment variable naming the file whose creation makes a worker the slow one (:func:`slow_in_one_worker`).
SLOW_MARKER = "INFEED_TEST_SLOW_MARKER"
_slow: list = []


def slow_in_one_worker(batch):
    """:func:`summed`'s outputs; in the one worker that creates ``$INFEED_TEST_SLOW_MARKER`` first, 50 ms late."""
    if not _slow:
        try:
            os.close(os.open(os.environ[SLOW_MARKER], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            _slow.append(True)
        except FileExistsError:
            _slow.append(False)
    if _slow[0]:
        time.sleep(0.05)
    return summed(batch)


def wrong_shape(example):
    return {**noisy(example, np.random.default_rng(0)), "twice": np.zeros(3, np.int32)}


def wrong_dtype(example):
    return {**noisy(example, np.random.default_rng(0)), "twice": np.full(2, 0.5)}


def missing_output(example):
    out = noisy(example, np.random.default_rng(0))
    del out["noise"]
    return out


def extra_output(example):
    return {**noisy(example, np.random.default_rng(0)), "more": 1}


def not_a_dict(example):
    return [example["id"]]


def _check(record_id):
    if record_id == 7:
        raise ZeroDivisionError(f"record id {record_id} is unlucky")


def fails_on_seven(example):
    _check(int(example["id"]))
    return without_rng(example)


def batch_fails(batch, rng):
    raise RuntimeError(f"a batch of {len(batch['id'])}")


def takes_three(example, rng, more):
    return example


NOT_CALLABLE = 3


#: What :func:`with_negated` returns: the estimator tests' ``x`` beside ``-x``, and their label as int32.
NEGATED_OUTPUTS = {"xx": ((12,), "float32"), "label": ((), "int32")}


def with_negated(example):
    return {"xx": np.concatenate([example["x"], -example["x"]]), "label": example["label"]}


#: What :func:`image_halves` returns from a 16x16 RGB image.
IMAGE_OUTPUTS = {"half": ((8, 8, 3), "uint8"), "mean": ((), "bfloat16"), "is_view": ((), "bool")}


def image_halves(example):
    """Every other pixel of the decoded image, its mean, and whether it came as a view of the decoded batch."""
    image = example["image"]
    return {"half": image[::2, ::2], "mean": image.mean(), "is_view": image.base is not None}
