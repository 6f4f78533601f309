"""The main job (``make demo``): real handwritten digits through TFRecords, the daemon and the Estimator.

Run with ``make demo`` (or ``python examples/digits.py``). The 1,797 8x8
images of scikit-learn's digits dataset (shipped inside scikit-learn: no
network) are scaled to [0, 1], split with a fixed seed into a training set
and a held-out set (300 by default), and written as TFRecord files with
``infeed.TFRecordWriter`` and ``infeed.encode_example``. An MLP is trained on
them by an ``Estimator`` whose ``input_fn`` returns an ``infeed.Dataset``
(decoded by an ``infeed.Daemon``, ``iterations_per_loop`` steps per compiled
loop), evaluated exactly on the held-out set (its last partial batch padded
and masked), used to predict every held-out example, exported, reloaded
without the model's code and checked to agree with ``predict``. A summary
table is printed; TensorBoard event files are left in the model directory.

The exit status is 1 when the held-out accuracy is below ``--min-accuracy``
(0.95) or a check fails (the evaluated examples, the served predictions).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import estimator as est
import infeed
from estimator.summaries import read_scalars

SPEC = {"image": infeed.FixedLen((64,), "float32"), "label": infeed.FixedLen((), "int64")}
CLASSES = 10


# --- data ---------------------------------------------------------------------------------------
def load_digits(heldout: int, seed: int) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((train images, labels), (held-out images, labels)): images [N, 64] float32 in [0, 1], labels int64."""
    from sklearn.datasets import load_digits as sklearn_digits

    images, labels = sklearn_digits(return_X_y=True)
    images = (images / 16.0).astype(np.float32)                      # pixel values are 0..16
    labels = labels.astype(np.int64)
    if not 0 < heldout < len(labels):
        raise ValueError(f"--heldout must be between 1 and {len(labels) - 1}, got {heldout}")
    order = np.random.default_rng(seed).permutation(len(labels))
    test, train = order[:heldout], order[heldout:]
    return (images[train], labels[train]), (images[test], labels[test])


def write_records(path: str, images: np.ndarray, labels: np.ndarray) -> None:
    with infeed.TFRecordWriter(path) as w:
        for image, label in zip(images, labels):
            w.write(infeed.encode_example({"image": image, "label": [int(label)]}))


def write_dataset(directory: str, train, heldout, shards: int) -> tuple[list[str], str]:
    """The training set as ``shards`` files and the held-out set as one file, in input order."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s, part in enumerate(np.array_split(np.arange(len(train[1])), shards)):
        paths.append(os.path.join(directory, f"train-{s:05d}-of-{shards:05d}.tfrecord"))
        write_records(paths[-1], train[0][part], train[1][part])
    heldout_path = os.path.join(directory, "heldout.tfrecord")
    write_records(heldout_path, *heldout)
    return paths, heldout_path


# --- model --------------------------------------------------------------------------------------
def make_init_fn(hidden: int):
    """``init_fn`` of an MLP 64 -> hidden -> hidden -> 10, He-initialised.

    Jitted, with one normal draw sliced into the weights: XLA:CPU compiles that
    in a fraction of the time of one threefry program per layer.
    """
    @jax.jit
    def init_fn(rng, features):
        sizes = [features["image"].shape[-1], hidden, hidden, CLASSES]
        shapes = list(zip(sizes[:-1], sizes[1:]))
        draw = jax.random.normal(rng, (sum(m * n for m, n in shapes),))
        params, start = {}, 0
        for i, (m, n) in enumerate(shapes):
            w = draw[start:start + m * n].reshape(m, n) * math.sqrt(2.0 / m)
            params[f"layer{i}"] = {"w": w, "b": jnp.zeros(n)}
            start += m * n
        return {"params": params}
    return init_fn


def logits_of(params, x):
    layers = [params[f"layer{i}"] for i in range(len(params))]
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def model_fn(variables, features, labels, mode, params):
    logits = logits_of(variables["params"], features["image"])
    predictions = {"class": logits.argmax(-1), "probabilities": jax.nn.softmax(logits), "logits": logits}
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions=predictions)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    real = est.metrics.current_mask()    # evaluation pads its last batch: leave the padding rows out of the loss
    loss = losses.mean() if real is None else (losses * real).sum() / jnp.maximum(real.sum(), 1.0)
    return est.EstimatorSpec(mode, loss=loss, predictions=predictions,
                             eval_metrics={"accuracy": est.metrics.accuracy(labels, predictions["class"])})


def cross_entropy(logits: np.ndarray, labels: np.ndarray) -> float:
    """The mean softmax cross-entropy, in float64 on the host."""
    logits = logits.astype(np.float64)
    top = logits.max(-1)
    log_z = top + np.log(np.exp(logits - top[:, None]).sum(-1))
    return float(np.mean(log_z - logits[np.arange(len(labels)), labels]))


# --- the job ------------------------------------------------------------------------------------
def job_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An argument parser with the options :func:`run_job` reads: ``--dir``, ``--model-dir`` and ``--quiet``."""
    ap = argparse.ArgumentParser(prog=prog, description=description)
    ap.add_argument("--dir", help="where the TFRecords, the model directory and the export go "
                                  "(default: a new temporary directory, kept for TensorBoard)")
    ap.add_argument("--model-dir", help="the Estimator's model_dir (default: DIR/model); must be new or empty")
    ap.add_argument("--quiet", action="store_true",
                    help="no estimator progress lines, only the table (RunConfig(log_step_count_steps=None))")
    return ap


def parse_args(argv):
    ap = job_parser("python examples/digits.py", __doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000, help="training steps (default 1000)")
    ap.add_argument("--iterations-per-loop", type=int, default=100, help="steps per compiled loop (default 100)")
    ap.add_argument("--batch-size", type=int, default=64, help="training batch (default 64)")
    ap.add_argument("--eval-batch-size", type=int, default=128, help="evaluation and prediction batch (default 128)")
    ap.add_argument("--hidden", type=int, default=128, help="width of the two hidden layers (default 128)")
    ap.add_argument("--learning-rate", type=float, default=2e-3, help="Adam's learning rate (default 2e-3)")
    ap.add_argument("--heldout", type=int, default=300, help="held-out examples (default 300)")
    ap.add_argument("--shards", type=int, default=3, help="training TFRecord files (default 3)")
    ap.add_argument("--workers", type=int, default=2, help="daemon worker processes (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="split, shuffle and initialisation seed (default 0)")
    ap.add_argument("--min-accuracy", type=float, default=0.95, help="held-out accuracy to pass (default 0.95)")
    return ap.parse_args(argv)


def _tags(logdir: str) -> str:
    scalars = read_scalars(logdir) if os.path.isdir(logdir) else {}
    return ", ".join(scalars) or "none"


def report(title: str, rows: list[tuple[str, str]], model_dir: str, failed: list[str]) -> int:
    """Prints ``(name, value)`` rows under ``title``, aligned, then where TensorBoard finds the summaries and the
    result; returns the exit status (1 when a check in ``failed`` did not pass)."""
    rows = rows + [
        ("TensorBoard", f"tensorboard --logdir {model_dir}"),
        ("train summaries", _tags(model_dir)),
        ("eval summaries", _tags(os.path.join(model_dir, "eval"))),
        ("result", "PASS" if not failed else "FAIL: " + "; ".join(failed)),
    ]
    width = max(len(name) for name, _ in rows)
    rule = "-" * (width + 2 + max(len(value) for _, value in rows))
    print(f"\n{title}\n{rule}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print(rule)
    return 1 if failed else 0


def run_job(args, prefix: str, job) -> int:
    """``job(args, root, model_dir)``'s exit status: ROOT is ``--dir`` (default: a new temporary directory named
    ``prefix...``), MODEL_DIR ``--model-dir`` (default: ROOT/model). 2, said on stderr, when the model directory
    holds a previous run. The estimator's progress lines go to stderr (its own handler, as nothing here configures
    logging) unless ``--quiet``, which the job's RunConfig turns into ``log_step_count_steps=None``."""
    root = args.dir or tempfile.mkdtemp(prefix=prefix)
    model_dir = args.model_dir or os.path.join(root, "model")
    if os.path.isdir(model_dir) and os.listdir(model_dir):
        print(f"{model_dir} is not empty (a previous run?): give a new --dir or --model-dir", file=sys.stderr)
        return 2
    return job(args, root, model_dir)


def main(argv=None) -> int:
    return run_job(parse_args(argv), "estimator-demo-", run)


def run(args, root: str, model_dir: str) -> int:
    train, heldout = load_digits(args.heldout, args.seed)
    t0 = time.perf_counter()
    train_files, heldout_file = write_dataset(os.path.join(root, "data"), train, heldout, args.shards)
    t_write = time.perf_counter() - t0

    def train_input_fn(params):
        return infeed.Dataset(train_files, SPEC, batch_size=params["batch_size"], labels="label",
                              shuffle_files=True, shuffle_buffer=len(train[1]), seed=args.seed, num_epochs=None)

    def heldout_input_fn(params):
        return infeed.Dataset(heldout_file, SPEC, batch_size=params["batch_size"], labels="label")

    k = args.iterations_per_loop
    config = est.RunConfig(model_dir=model_dir, iterations_per_loop=k, save_checkpoints_steps=args.steps,
                           save_summary_steps=k, seed=args.seed,
                           log_step_count_steps=None if args.quiet else max(k, args.steps // 4 // k * k),
                           infeed_workers=args.workers)
    estimator = est.Estimator(model_fn, make_init_fn(args.hidden), optax.adam(args.learning_rate), config,
                              train_batch_size=args.batch_size, eval_batch_size=args.eval_batch_size)

    t0 = time.perf_counter()
    estimator.train(train_input_fn, max_steps=args.steps)
    t_train = time.perf_counter() - t0

    t0 = time.perf_counter()
    result = estimator.evaluate(heldout_input_fn)
    t_eval = time.perf_counter() - t0

    predictions = list(estimator.predict(heldout_input_fn))
    classes = np.array([int(p["class"]) for p in predictions])
    probabilities = np.stack([p["probabilities"] for p in predictions]) if predictions else np.zeros((0, CLASSES))
    complete = len(classes) == len(heldout[1])
    right = int(np.sum(classes == heldout[1])) if complete else -1
    host_loss = cross_entropy(np.stack([p["logits"] for p in predictions]), heldout[1]) if complete else math.nan

    path = estimator.export(os.path.join(root, "export"), {"image": est.TensorSpec((None, 64), "float32")})
    served = est.load_exported(path)({"image": heldout[0]})
    same = int(np.sum(served["class"] == classes)) if complete else 0
    gap = float(np.max(np.abs(served["probabilities"] - probabilities))) if same else math.inf

    steady = [v for _, v in read_scalars(model_dir).get("global_step/sec", [])]
    n = len(heldout[1])
    eval_batches = -(-n // args.eval_batch_size)
    checks = {
        f"accuracy >= {args.min_accuracy:g}": result["accuracy"] >= args.min_accuracy,
        "evaluated every held-out example once": result["examples"] == n,
        "predict() gave every example": len(predictions) == n,
        "evaluate and predict agree": (complete and math.isclose(result["accuracy"], right / n, abs_tol=1e-6)
                                       and math.isclose(result["loss"], host_loss, rel_tol=1e-4, abs_tol=1e-6)),
        "served == predict": same == n and gap <= 1e-5,
    }
    failed = [name for name, ok in checks.items() if not ok]
    devices = jax.devices()
    rows = [
        ("data", f"scikit-learn digits: {len(train[1]):,} train / {n:,} held out, "
                 f"{args.shards + 1} TFRecord files written in {t_write:.2f} s"),
        ("model", f"MLP 64-{args.hidden}-{args.hidden}-10, Adam {args.learning_rate:g}, "
                  f"{len(devices)} {devices[0].platform.upper()} device{'s' if len(devices) > 1 else ''}"),
        ("train steps", f"{estimator.global_step():,} (batch {args.batch_size}, {k} steps per compiled loop, "
                        f"through infeed.Daemon with {args.workers} workers)"),
        ("train time", f"{t_train:.2f} s (daemon start and compilation included)"),
        ("steps/s", f"{estimator.global_step() / t_train:,.0f} overall"
                    + (f", {steady[-1]:,.0f} steady (TensorBoard global_step/sec)" if steady else "")),
        ("eval examples", f"{result['examples']:,} of {n:,} ({eval_batches} batches of {args.eval_batch_size}"
                          + (", the last padded and masked" if n % args.eval_batch_size else "")
                          + f"), {t_eval:.2f} s"),
        ("eval accuracy", f"{result['accuracy']:.4f} ({right}/{n} from predict())"),
        ("eval loss", f"{result['loss']:.4f} ({host_loss:.4f} from predict()'s logits)"),
        ("predictions", f"{len(predictions):,} in input order, keys {sorted(predictions[0]) if predictions else []}"),
        ("export", path),
        ("served vs predict", f"{same}/{n} classes agree, max |probability difference| {gap:.1e}"),
    ]
    return report("estimator demo", rows, model_dir, failed)


if __name__ == "__main__":
    sys.exit(main())
