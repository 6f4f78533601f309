"""MNIST on the estimator: TPUEstimator's classic ``mnist_tpu.py`` ported line by line.

The TensorFlow original (tensorflow/tpu, ``models/official/mnist/mnist_tpu.py``)
and this port are compared section by section in ``docs/porting.md``; the
comments marked ``TF:`` below name the line each one replaces.

    python examples/mnist_port.py                          # made-up data, 300 steps of the original net
    python examples/mnist_port.py --filters 8 --hidden 128 # a narrower net: a minute or two on a CPU
    python examples/mnist_port.py --data_dir DIR           # DIR/{train,validation,test}.tfrecords

The records have the layout of TensorFlow's ``convert_to_records.py`` (what the
original reads): ``image_raw``, the 784 pixels as one bytes value, and
``label``, an int64. Without ``--data_dir`` the script writes such files
itself (noisy digit glyphs from ``examples/infeed_roundtrip.py``, MNIST-shaped) with
``infeed.TFRecordWriter`` and ``infeed.encode_example``. It trains, evaluates
every validation example exactly once, prints a few predictions, exports the
model with ``jax.export`` and checks the export answers as ``predict`` did.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import optax

import estimator as est
import infeed

# TF: features = {"image_raw": tf.io.FixedLenFeature((), tf.string), "label": tf.io.FixedLenFeature((), tf.int64)}
FEATURES = {"image_raw": infeed.Bytes(max_bytes=28 * 28), "label": infeed.FixedLen((), "int64")}


def metric_fn(labels, logits):
    """TF: ``tf.metrics.accuracy(labels=labels, predictions=tf.argmax(logits, axis=1))``, on the host.

    Called once, after the last batch, with every evaluated example's tensors
    (numpy, padding removed); it returns numbers, not (value, update_op) pairs.
    """
    return {"accuracy": float(np.mean(labels == np.argmax(logits, axis=1)))}


# --- the model: TF's tf.layers, written with jax.lax -----------------------------------------

def init_fn(rng, features, filters=32, hidden=1024):
    """Creates the variables (TF: the tf.layers created them while model_fn built the graph).

    ``features`` is one batch of the input (unused: the shapes are fixed). ``filters``
    and ``hidden`` are the original's 32 and 1024; ``--filters``/``--hidden`` shrink them
    for quick runs (``functools.partial``: init_fn is not given ``params``).
    """
    del features
    k1, k2, k3, k4 = jax.random.split(rng, 4)
    glorot = jax.nn.initializers.glorot_uniform()  # tf.layers' default kernel initializer; biases start at zero
    return {"params": {
        "conv1": {"w": glorot(k1, (5, 5, 1, filters)), "b": jnp.zeros(filters)},
        "conv2": {"w": glorot(k2, (5, 5, filters, filters)), "b": jnp.zeros(filters)},
        "dense1": {"w": glorot(k3, (7 * 7 * filters, hidden)), "b": jnp.zeros(hidden)},
        "logits": {"w": glorot(k4, (hidden, 10)), "b": jnp.zeros(10)},
    }}


def conv_relu(layer, x):
    """TF: ``tf.layers.Conv2D(filters=32, kernel_size=5, padding="same", activation="relu")``."""
    y = jax.lax.conv_general_dilated(x, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + layer["b"])


def max_pool(x):
    """TF: ``tf.layers.MaxPooling2D(pool_size=(2, 2), strides=(2, 2), padding="same")``."""
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")


def dropout(x, rate, rng):
    """TF: ``tf.layers.Dropout(rate)(x, training=True)``."""
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def pixels(features):
    """The ``[B, 28, 28, 1]`` uint8 images (TF: ``tf.decode_raw`` + ``tf.reshape`` in the input pipeline).

    From TFRecords, ``image_raw`` is an ``infeed.Padded`` (the bytes as ``[B, 784]``
    uint8 ``values`` and their ``lengths``); an exported model is served plain
    ``[B, 784]`` uint8 arrays.
    """
    raw = features["image_raw"]
    if isinstance(raw, infeed.Padded):
        raw = raw.values
    return raw.reshape(-1, 28, 28, 1)


def model_fn(variables, features, labels, mode, params):
    """TF: ``model_fn(features, labels, mode, params)``; here the variables come in, and it returns the loss."""
    p = variables["params"]
    image = pixels(features).astype(jnp.float32) / 255.0      # TF: image = features / 255.

    y = max_pool(conv_relu(p["conv1"], image))
    y = max_pool(conv_relu(p["conv2"], y))
    y = y.reshape(y.shape[0], -1)                             # TF: tf.layers.Flatten()
    y = jax.nn.relu(y @ p["dense1"]["w"] + p["dense1"]["b"])  # TF: tf.layers.Dense(1024, activation="relu")
    if mode == est.ModeKeys.TRAIN:                            # TF: Dropout(0.4)(y, training=(mode == TRAIN))
        y = dropout(y, 0.4, est.step_rng())
    logits = y @ p["logits"]["w"] + p["logits"]["b"]          # TF: tf.layers.Dense(10)

    if mode == est.ModeKeys.PREDICT:
        predictions = {"class_ids": jnp.argmax(logits, axis=1), "probabilities": jax.nn.softmax(logits)}
        return est.EstimatorSpec(mode, predictions=predictions)

    # TF: tf.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits), the batch mean. Per-example
    # losses [B] instead: the estimator takes their mean to train, and leaves padding out of the eval loss.
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)

    if mode == est.ModeKeys.TRAIN:
        # TF: the optimizer, CrossShardOptimizer and train_op=optimizer.minimize(...) lived here; the
        # estimator holds the optax optimizer and differentiates the loss (see make_estimator).
        return est.EstimatorSpec(mode, loss=loss)

    if mode == est.ModeKeys.EVAL:
        if params.get("host_metrics"):                        # TF: eval_metrics=(metric_fn, [labels, logits])
            return est.EstimatorSpec(mode, loss=loss, eval_metrics=(metric_fn, {"labels": labels, "logits": logits}))
        return est.EstimatorSpec(mode, loss=loss, eval_metrics={  # accumulated inside the compiled loop
            "accuracy": est.metrics.accuracy(labels, jnp.argmax(logits, axis=1))})


# --- input ---------------------------------------------------------------------------------

def dataset(records_file, params, **options):
    """TF: ``tf.data.TFRecordDataset(records_file).map(decode_record)``, batched by ``params["batch_size"]``."""
    return infeed.Dataset(records_file, FEATURES, batch_size=params["batch_size"], labels="label", **options)


def train_input_fn(params):
    """TF: ``dataset(...).cache().repeat().shuffle(buffer_size=50000).batch(batch_size, drop_remainder=True)``."""
    records_file = os.path.join(params["data_dir"], "train.tfrecords")
    return dataset(records_file, params, num_epochs=None, shuffle_buffer=50_000)


def eval_input_fn(params):
    """TF: ``dataset(...).batch(batch_size, drop_remainder=True)``; here the last batch is padded, not dropped."""
    records_file = os.path.join(params["data_dir"], "validation.tfrecords")
    return dataset(records_file, params)


def predict_input_fn(params):
    """TF: ``dataset(...).take(10).batch(batch_size)``; ``take(10)`` becomes ``islice`` on the predictions."""
    records_file = os.path.join(params["data_dir"], "test.tfrecords")
    return dataset(records_file, params)


# --- data, when none is given ----------------------------------------------------------------

def write_mnist_like(data_dir, train=6_000, validation=1_000, test=100, seed=0):
    """``train.tfrecords``, ``validation.tfrecords`` and ``test.tfrecords`` in TF's MNIST record layout."""
    from infeed_roundtrip import make_digits      # examples/, beside this file

    os.makedirs(data_dir, exist_ok=True)
    for k, (name, n) in enumerate((("train", train), ("validation", validation), ("test", test))):
        images, labels = make_digits(n, seed=seed + k)
        images = np.round(images * 255).astype(np.uint8)
        with infeed.TFRecordWriter(os.path.join(data_dir, f"{name}.tfrecords")) as writer:
            for image, label in zip(images, labels):
                writer.write(infeed.encode_example({"height": 28, "width": 28, "depth": 1, "label": int(label),
                                                    "image_raw": image.tobytes()}))
    return data_dir


# --- main ----------------------------------------------------------------------------------

def make_estimator(args):
    """TF: RunConfig(cluster=..., model_dir=..., tpu_config=TPUConfig(iterations, num_shards)) and TPUEstimator(...)."""
    run_config = est.RunConfig(
        model_dir=args.model_dir,
        iterations_per_loop=args.iterations,        # TF: TPUConfig(iterations_per_loop=FLAGS.iterations)
        mesh_shape={"data": -1},                    # TF: num_shards=8: every device here, batch split over them
        save_checkpoints_steps=args.save_checkpoints_steps,
        log_step_count_steps=args.log_step_count_steps,
        infeed_workers=args.infeed_workers)
    # TF: tf.train.exponential_decay(lr, global_step, decay_steps=100000, decay_rate=0.96) and
    #     GradientDescentOptimizer, wrapped in CrossShardOptimizer (nothing to wrap here).
    learning_rate = optax.exponential_decay(args.learning_rate, transition_steps=100_000, decay_rate=0.96)
    return est.Estimator(
        model_fn, functools.partial(init_fn, filters=args.filters, hidden=args.hidden), optax.sgd(learning_rate),
        run_config,
        params={"data_dir": args.data_dir, "host_metrics": args.host_metrics},
        # global batch sizes, as TPUEstimator's
        train_batch_size=args.batch_size, eval_batch_size=args.batch_size, predict_batch_size=args.batch_size)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_dir", default=None, help="directory with train/validation/test.tfrecords; "
                                                     "without it, small MNIST-shaped files are made")
    ap.add_argument("--model_dir", default=None, help="checkpoints, events, exports (default: a new temp dir)")
    ap.add_argument("--batch_size", type=int, default=128, help="global batch size")
    ap.add_argument("--train_steps", type=int, default=300)
    ap.add_argument("--eval_steps", type=int, default=None, help="at most this many eval batches (default: all)")
    ap.add_argument("--learning_rate", type=float, default=0.05)
    ap.add_argument("--iterations", type=int, default=50, help="steps per compiled loop")
    ap.add_argument("--save_checkpoints_steps", type=int, default=1000)
    ap.add_argument("--log_step_count_steps", type=int, default=100)
    ap.add_argument("--infeed_workers", type=int, default=2)
    ap.add_argument("--eval_every", type=int, default=None,
                    help="evaluate every N steps while training (est.train_and_evaluate)")
    ap.add_argument("--filters", type=int, default=32, help="convolution filters (the original: 32)")
    ap.add_argument("--hidden", type=int, default=1024, help="hidden units (the original: 1024)")
    ap.add_argument("--train_records", type=int, default=6_000, help="size of the made-up training set")
    ap.add_argument("--validation_records", type=int, default=1_000, help="size of the made-up validation set")
    ap.add_argument("--host_metrics", action="store_true", help="eval_metrics=(metric_fn, tensors), on the host")
    ap.add_argument("--no_predict", dest="enable_predict", action="store_false")
    ap.add_argument("--no_export", dest="export", action="store_false")
    args = ap.parse_args(argv)

    if jax.default_backend() == "cpu" and args.filters * args.hidden > 8 * 128:
        print("note: XLA:CPU runs this conv net's gradient slowly inside a compiled loop (seconds a step at "
              "the original size); --filters 8 --hidden 128 trains in a minute or two", file=sys.stderr)
    args.model_dir = args.model_dir or tempfile.mkdtemp(prefix="mnist_port-")
    if args.data_dir is None:
        args.data_dir = write_mnist_like(os.path.join(args.model_dir, "data"), train=args.train_records,
                                         validation=args.validation_records)

    estimator = make_estimator(args)
    if args.eval_every:                                                  # TF: tf.estimator.train_and_evaluate
        evaluations = est.train_and_evaluate(
            estimator, est.TrainSpec(train_input_fn, max_steps=args.train_steps),
            est.EvalSpec(eval_input_fn, steps=args.eval_steps, every_steps=args.eval_every))
        result = evaluations[-1]
    else:
        estimator.train(train_input_fn, max_steps=args.train_steps)      # TF: the same call
        result = estimator.evaluate(eval_input_fn, steps=args.eval_steps)  # TF: steps was required
    print(f"evaluation at step {result['global_step']}: accuracy {result['accuracy']:.4f}, "
          f"loss {result['loss']:.4f} over {result['examples']} examples")

    predictions = []
    if args.enable_predict:                                              # TF: estimator.predict(predict_input_fn)
        for pred_dict in itertools.islice(estimator.predict(predict_input_fn), 10):
            class_id = int(pred_dict["class_ids"])
            probability = pred_dict["probabilities"][class_id]
            print(f'Prediction is "{class_id}" ({100 * probability:.1f}%).')
            predictions.append(pred_dict)

    export_path = None
    if args.export:                                                      # TF: export_saved_model(dir, receiver_fn)
        export_path = estimator.export(os.path.join(args.model_dir, "export"),
                                       {"image_raw": est.TensorSpec((None, 28 * 28), "uint8")})
        serve = est.load_exported(export_path)                           # no model code needed from here on
        served = serve({"image_raw": _test_images(args.data_dir, 10)})
        if predictions and served["class_ids"].tolist() != [int(p["class_ids"]) for p in predictions]:
            raise RuntimeError("the exported model and predict disagree on the test images")
        print(f"exported to {export_path}")
    return {"result": result, "predictions": predictions, "export_path": export_path, "model_dir": args.model_dir}


def _test_images(data_dir, n):
    """The first ``n`` test images as ``[n, 784]`` uint8, read with infeed's parser (what a client would send)."""
    records = infeed.read_records(os.path.join(data_dir, "test.tfrecords")).read_batch(n)
    return infeed.ExampleParser({"image_raw": FEATURES["image_raw"]}).parse(records)["image_raw"].values


if __name__ == "__main__":
    logging.basicConfig()
    for name in ("estimator", "xla_runtime"):       # the step logs (loss, global_step/sec), as TPUEstimator's
        logging.getLogger(name).setLevel(logging.INFO)
    main()
