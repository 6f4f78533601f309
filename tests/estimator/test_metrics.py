"""est.metrics: each metric against numpy / scikit-learn, merging over any split, inside a
compiled scan, exact under the padding mask, sharded over 8 devices, 0/0 and misuse."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from estimator import metrics as M

B = 120


def roc_auc_score(*args, **kwargs):
    """scikit-learn's, imported when a test calls it (the import costs ~1 s in every test process that collects
    this file)."""
    from sklearn.metrics import roc_auc_score as score
    return score(*args, **kwargs)


def average_precision_score(*args, **kwargs):
    from sklearn.metrics import average_precision_score as score
    return score(*args, **kwargs)


def data(seed=0, n=B):
    """A batch of every input the metrics take, and positive weights."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, n)
    scores = np.clip(rng.normal(0.35 + 0.3 * labels, 0.25), 0, 1).astype(np.float32)
    return {"labels": labels, "scores": scores, "predictions": (scores > 0.5).astype(np.int32),
            "values": rng.normal(size=(n, 3)).astype(np.float32),
            "weights": rng.uniform(0.2, 2.0, n).astype(np.float32)}


def weighted_mean(x, w):
    w = np.broadcast_to(w.reshape(w.shape + (1,) * (x.ndim - w.ndim)), x.shape)
    return np.sum(x * w) / np.sum(w)


# name -> (build a Metric from a batch and weights, numpy reference)
CASES = {
    "sum": (lambda d, w: M.sum(d["values"], w), lambda d, w: np.sum(d["values"] * w[:, None])),
    "mean": (lambda d, w: M.mean(d["values"], w), lambda d, w: weighted_mean(d["values"], w)),
    "accuracy": (lambda d, w: M.accuracy(d["labels"], d["predictions"], w),
                 lambda d, w: weighted_mean(d["labels"] == d["predictions"], w)),
    "precision": (lambda d, w: M.precision(d["labels"], d["predictions"], w),
                  lambda d, w: weighted_mean(d["labels"][d["predictions"] == 1], w[d["predictions"] == 1])),
    "precision_of_scores": (lambda d, w: M.precision(d["labels"], d["scores"], w),
                            lambda d, w: weighted_mean(d["labels"][d["scores"] > 0.5], w[d["scores"] > 0.5])),
    "recall": (lambda d, w: M.recall(d["labels"], d["predictions"].astype(bool), w),
               lambda d, w: weighted_mean(d["predictions"][d["labels"] == 1], w[d["labels"] == 1])),
    "mean_squared_error": (lambda d, w: M.mean_squared_error(d["values"], d["values"] ** 2, w),
                           lambda d, w: weighted_mean((d["values"] - d["values"] ** 2) ** 2, w)),
    "mean_absolute_error": (lambda d, w: M.mean_absolute_error(d["labels"], d["scores"], w),
                            lambda d, w: weighted_mean(np.abs(d["labels"] - d["scores"]), w)),
    "auc": (lambda d, w: M.auc(d["labels"], d["scores"], w),
            lambda d, w: roc_auc_score(d["labels"], np.floor(d["scores"] * 200), sample_weight=w)),
    "auc_pr": (lambda d, w: M.auc(d["labels"], d["scores"], w, num_buckets=50, curve="PR"),
               lambda d, w: average_precision_score(d["labels"], np.floor(d["scores"] * 50), sample_weight=w)),
}


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("name", list(CASES))
def test_against_reference(name, weighted):
    build, reference = CASES[name]
    d = data()
    w = d["weights"] if weighted else np.ones(B, np.float32)
    assert build(d, w if weighted else None).result() == pytest.approx(reference(d, w), rel=1e-5)


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_bucketed_auc_is_close_to_the_exact_one(weighted):
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 2, 4000)
    scores = jax.nn.sigmoid(rng.normal(labels, 1.5)).__array__()
    w = rng.uniform(0.1, 3.0, 4000) if weighted else None
    assert M.auc(labels, scores, w).result() == pytest.approx(roc_auc_score(labels, scores, sample_weight=w), abs=1e-2)
    assert M.auc(labels, scores, w, curve="PR").result() == pytest.approx(
        average_precision_score(labels, scores, sample_weight=w), abs=1e-2)


def test_weights_broadcast_along_the_batch_axis_and_scalars():
    values = np.arange(6.0).reshape(3, 2)
    assert M.mean(values, weights=[0.0, 1.0, 0.0]).result() == 2.5
    assert M.mean(values, weights=np.ones((3, 2)) * [[1], [0], [0]]).result() == 0.5
    assert M.sum(values, weights=2.0).result() == 30.0
    with pytest.raises(ValueError, match=r"weights of shape \(2,\) does not fit values of shape \(3, 2\)"):
        M.mean(values, weights=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"labels of shape \(3, 1\) and predictions of shape \(3,\) differ"):
        M.accuracy(np.zeros((3, 1)), np.zeros(3))


def test_zero_weight_excludes_nan_values():
    values = np.array([1.0, np.nan, np.inf, 3.0])
    w = np.array([1.0, 0.0, 0.0, 1.0])
    assert M.mean(values, w).result() == 2.0
    assert M.mean_squared_error(values, np.zeros(4), w).result() == 5.0
    assert M.auc([1, 0, 1, 0], [0.9, np.nan, 0.8, 0.1], w).result() == 1.0


def split_and_merge(build, d, w, seed):
    """The metric built batch by batch over a random partition of the examples (batches of
    7, 33 and 80: few shapes, few compilations), merged in a random order."""
    parts = np.split(np.random.default_rng(seed).permutation(B), [7, 40])
    total = None
    for i in np.random.default_rng(seed).permutation(3):
        m = build({k: v[parts[i]] for k, v in d.items()}, w[parts[i]])
        total = m if total is None else total.merge(m)
    return total


@pytest.mark.parametrize("name", list(CASES))
def test_merging_any_split_equals_one_batch(name):
    build = CASES[name][0]
    d = data(2)
    whole = build(d, d["weights"])
    for seed in range(3):
        merged = split_and_merge(build, d, d["weights"], seed)
        np.testing.assert_allclose(merged.result(), whole.result(), rtol=1e-5)
    np.testing.assert_allclose(M.results(M.merge_all(None, {name: merged}))[name], whole.result(), rtol=1e-5)


def model_metrics(labels, predictions, scores, values):
    """What a model_fn's eval_metrics might hold."""
    return {"accuracy": M.accuracy(labels, predictions), "auc": M.auc(labels, scores),
            "count": M.sum(jnp.ones_like(scores)), "mean": M.mean(values),
            "precision": M.precision(labels, predictions), "recall": M.recall(labels, scores)}


def eager_metrics(d):
    """The same, computed eagerly over one unpadded batch."""
    return M.results(model_metrics(d["labels"], d["predictions"], d["scores"], d["values"]))


def test_stacked_steps_of_a_compiled_scan_sum_to_one_batch():
    d = data(3)
    steps = {k: v.reshape((4, B // 4) + v.shape[1:]) for k, v in d.items()}

    @jax.jit
    def loop(steps):
        return jax.lax.scan(lambda c, s: (c, model_metrics(s["labels"], s["predictions"], s["scores"], s["values"])),
                            0, steps)[1]

    stacked = loop(steps)
    assert stacked["auc"].stats["positives"].shape == (4, 200)
    summed = M.sum_over_steps(jax.device_get(stacked))
    assert summed["count"].stats["total"].dtype == np.float64
    got = M.results(summed)
    for name, want in eager_metrics(d).items():
        assert got[name] == pytest.approx(want, rel=1e-6), name
    # two loops merged on the host give the same as one
    halves = [M.sum_over_steps(jax.device_get(loop({k: v[i:i + 2] for k, v in steps.items()}))) for i in (0, 2)]
    assert M.results(M.merge_all(M.merge_all(None, halves[0]), halves[1])) == pytest.approx(got, rel=1e-6)


def test_padded_batches_under_the_example_mask_count_every_example_once():
    d = data(4, n=257)
    padded = {k: np.concatenate([v, np.full((127,) + v.shape[1:], np.nan if v.dtype.kind == "f" else 1, v.dtype)])
              for k, v in d.items()}
    steps = {k: v.reshape((3, 128) + v.shape[1:]) for k, v in padded.items()}
    real = (np.arange(384) < 257).reshape(3, 128)

    def step(c, s):
        batch, mask = s
        with M.example_mask(mask):
            return c, model_metrics(batch["labels"], batch["predictions"], batch["scores"], batch["values"])

    got = M.results(M.sum_over_steps(jax.jit(lambda s: jax.lax.scan(step, 0, s)[1])((steps, real))))
    assert got["count"] == 257.0
    assert got["mean"] == pytest.approx(np.mean(d["values"]), rel=1e-6)
    assert got["accuracy"] == pytest.approx(np.mean(d["labels"] == d["predictions"]), rel=1e-6)
    assert got == pytest.approx(eager_metrics(d), rel=1e-6)


def test_example_mask_nests_and_resets():
    assert M.current_mask() is None
    with M.example_mask([1, 1, 0, 1]):
        with M.example_mask(np.array([True, False, True, True])):
            np.testing.assert_array_equal(M.current_mask(), [1, 0, 0, 1])
            assert M.sum(np.ones(4)).result() == 2.0
        assert M.sum(np.ones(4)).result() == 3.0
        with pytest.raises(ValueError, match=r"example mask of shape \(4,\) does not fit values of shape \(5,\)"):
            M.sum(np.ones(5))
    assert M.current_mask() is None
    with pytest.raises(ValueError, match=r"takes a \[batch\] mask"), M.example_mask(np.ones((2, 2))):
        pass


def test_sharded_over_eight_devices_gives_the_same_results():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    assert mesh.size == 8
    d = data(5)
    sharded = jax.device_put(d, NamedSharding(mesh, P("data")))
    mask = jax.device_put((np.arange(B) < 100).astype(np.float32), NamedSharding(mesh, P("data")))

    def evaluate(d, mask):
        with M.example_mask(mask):
            return model_metrics(d["labels"], d["predictions"], d["scores"], d["values"])

    got = M.results(jax.jit(evaluate)(sharded, mask))
    assert got["count"] == 100.0
    assert got == pytest.approx(M.results(evaluate(d, np.asarray(mask))), rel=1e-6)


def test_zero_over_zero_is_nan():
    none = np.zeros(4)
    assert np.isnan(M.mean(np.ones(4), weights=none).result())
    assert M.sum(np.ones(4), weights=none).result() == 0.0
    assert np.isnan(M.precision([1, 1, 0, 0], [0, 0, 0, 0]).result())   # nothing predicted positive
    assert np.isnan(M.recall([0, 0, 0, 0], [1, 1, 0, 0]).result())      # nothing labelled positive
    assert np.isnan(M.auc([0, 0, 0], [0.1, 0.5, 0.9]).result())
    assert np.isnan(M.auc([1, 1, 1], [0.1, 0.5, 0.9]).result())
    assert np.isnan(M.auc([0, 0, 0], [0.1, 0.5, 0.9], curve="PR").result())
    assert M.auc([1, 1, 1], [0.1, 0.5, 0.9], curve="PR").result() == 1.0


def test_misuse_raises_clear_errors():
    acc, mean = M.accuracy([1, 0], [1, 1]), M.mean([1.0, 2.0])
    with pytest.raises(ValueError, match="cannot merge metrics of different kinds: 'accuracy' and 'mean'"):
        acc.merge(mean)
    with pytest.raises(ValueError, match="different kinds: 'auc_roc' and 'auc_pr'"):
        M.auc([1], [0.5]).merge(M.auc([1], [0.5], curve="PR"))
    with pytest.raises(ValueError, match="different shapes"):
        M.auc([1], [0.5]).merge(M.auc([1], [0.5], num_buckets=10))
    with pytest.raises(ValueError, match="different kinds"):
        M.merge_all({"a": acc}, {"a": mean})
    with pytest.raises(TypeError, match="cannot merge a Metric with float"):
        acc.merge(0.5)
    with pytest.raises(ValueError, match="sum a stacked step axis with sum_over_steps"):
        jax.tree.map(lambda x: jnp.stack([x, x]), acc).result()
    with pytest.raises(ValueError, match="curve must be 'ROC' or 'PR'"):
        M.auc([1], [0.5], curve="roc")
