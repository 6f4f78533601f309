"""Checks an installed copy of the project, away from any checkout: `make check-install` runs it with the Python of
a fresh venv that holds only the sdist or the wheel (and their dependencies), as `python -I`, from an empty folder.

It checks that ``infeed``, ``xla_runtime`` and ``estimator`` come from site-packages with compiled extensions
(JPEGs through the crop-window decoder, whose window is the whole image's pixels there), that the decoder gives
what TensorFlow decoded for the shared fixture ``dense.tfrecord``, and that the estimator trains a few steps
from TFRecords through the decoding daemon, evaluates every example once, and exports a model that serves what
``predict`` gives. Exits non-zero, naming the check, when one fails.

    python -I tools/check_installed.py FIXTURES_DIR
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import sysconfig
import tempfile


def check(condition: bool, what: str) -> None:
    print(f"{'ok  ' if condition else 'FAIL'} {what}", flush=True)
    if not condition:
        sys.exit(f"check_installed: {what}: failed")


def check_where_installed() -> None:
    import estimator
    import infeed
    import xla_runtime
    from infeed.example import _example, _image, _jpeg, image
    from infeed.ring import _ring
    from infeed.tfrecord import _tfrecord

    site = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
    for module in (infeed, xla_runtime, estimator):
        where = pathlib.Path(module.__file__).resolve()
        check(site in where.parents, f"{module.__name__} imported from site-packages ({where.parent})")
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    for extension in (_tfrecord, _example, _image, _jpeg, _ring):
        check(extension.__file__.endswith(suffix), f"{extension.__name__} is a compiled extension ({suffix})")
    check(image.JPEG_DECODER == "libjpeg-turbo crop window", f"JPEGs decode through the crop window "
          f"({image.JPEG_DECODER}; the wheel carries libjpeg-turbo, the sdist needs its headers)")


def check_jpeg_window() -> None:
    """A photo's crop window decoded by the installed decoder is the same as its whole image decoded and cut."""
    import numpy as np
    import simplejpeg

    import infeed

    y, x = np.mgrid[0:96, 0:128]
    pixels = np.stack([(x * 2) % 256, (y * 3) % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    data = simplejpeg.encode_jpeg(pixels, quality=95)
    crop = infeed.Image(size=(40, 60), resize="random_resized_crop", area=(0.1953125, 0.1953125), aspect=(1.5, 1.5))
    whole = infeed.parse_examples([infeed.encode_example({"image/encoded": data})],
                                  {"image": infeed.Image(size=(96, 128), resize=None)})["image"][0]
    window = infeed.ExampleParser({"image": crop}, seed=5).parse([infeed.encode_example({"image/encoded": data})],
                                                                 ids=[(0, 0, 0)])["image"][0]
    check(whole.shape == (96, 128, 3) and window.shape == (40, 60, 3) and
          any(np.array_equal(window, whole[y0:y0 + 40, x0:x0 + 60]) for y0 in range(57) for x0 in range(69)),
          "a JPEG's 40x60 crop window, decoded alone, is the whole image's pixels there")


def check_fixture(fixtures: pathlib.Path) -> None:
    import numpy as np

    import infeed

    expected = json.loads((fixtures / "expected.json").read_text())["dense"]["parse_example_all_records"]
    records = list(infeed.read_records(fixtures / "dense.tfrecord"))        # every record's CRCs checked
    spec = {"x": infeed.FixedLen((16,), "float32"), "label": infeed.FixedLen((), "int64"),
            "weight": infeed.FixedLen((), "float32", default=1.0)}
    out = infeed.parse_examples(records, spec)
    want_x = np.array(expected["x"], np.float32)
    check(len(records) == 257 and out["x"].shape == (257, 16), "dense.tfrecord: 257 records of 16 floats")
    check(out["x"].view(np.uint32).tolist() == want_x.view(np.uint32).tolist(), "x bit for bit as TensorFlow")
    check(out["label"].tolist() == expected["label"], "label as TensorFlow")
    check(out["weight"].tolist() == np.array(expected["weight"], np.float32).tolist(), "weight's default as TensorFlow")


def check_training(root: pathlib.Path) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    import estimator as est
    import infeed

    rng = np.random.default_rng(0)
    files = []
    for shard in range(2):
        path = root / f"train-{shard}.tfrecord"
        with infeed.TFRecordWriter(path) as writer:
            for _ in range(96):
                x = rng.normal(size=4).astype(np.float32)
                writer.write(infeed.encode_example({"x": x, "label": np.int64(x.sum() > 0)}))
        files.append(str(path))
    spec = {"x": infeed.FixedLen((4,), "float32"), "label": infeed.FixedLen((), "int64")}

    def model_fn(variables, features, labels, mode, params):
        logits = features["x"] @ variables["params"]["w"] + variables["params"]["b"]
        predictions = {"class": logits.argmax(-1)}
        if mode == est.ModeKeys.PREDICT:
            return est.EstimatorSpec(mode, predictions=predictions)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        mask = est.metrics.current_mask()
        loss = losses.mean() if mask is None else (losses * mask).sum() / jnp.maximum(mask.sum(), 1.0)
        return est.EstimatorSpec(mode, loss=loss, predictions=predictions,
                                 eval_metrics={"accuracy": est.metrics.accuracy(labels, predictions["class"])})

    def init_fn(key, features):
        return {"params": {"w": 0.1 * jax.random.normal(key, (4, 2)), "b": jnp.zeros(2)}}

    def input_fn(params):
        return infeed.Dataset(files, spec, batch_size=params["batch_size"], labels="label", num_epochs=None)

    def eval_input_fn(params):
        return infeed.Dataset(files[:1], spec, batch_size=params["batch_size"], labels="label")

    config = est.RunConfig(model_dir=str(root / "model"), iterations_per_loop=4, save_checkpoints_steps=8,
                           infeed_workers=1)
    estimator = est.Estimator(model_fn, init_fn, optax.sgd(0.5), config, train_batch_size=16)
    try:
        estimator.train(input_fn, max_steps=12)
        check(estimator.checkpoints.latest_step() == 12, "trained 12 steps from TFRecords through the daemon")
        result = estimator.evaluate(eval_input_fn)
        check(result["examples"] == 96 and math.isfinite(result["loss"]),
              f"evaluated the 96 examples once (loss {result['loss']:.4f}, accuracy {result['accuracy']:.3f})")
        predicted = np.array([int(p["class"]) for p in estimator.predict(eval_input_fn)])
        export = estimator.export(str(root / "export"), {"x": est.TensorSpec((None, 4), "float32")})
    finally:
        estimator.close()
    x = infeed.parse_examples(list(infeed.read_records(files[0])), spec)["x"]
    served = est.load_exported(export)({"x": x})
    check(np.array_equal(np.asarray(served["class"]), predicted), "the export serves what predict gave")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fixtures", type=pathlib.Path, help="the shared TFRecord fixtures (shared/fixtures/tfrecord)")
    args = parser.parse_args()
    check(sys.flags.isolated == 1, "run as python -I (no checkout on sys.path)")
    print(f"Python {sys.version.split()[0]}", flush=True)
    check_where_installed()
    check_jpeg_window()
    check_fixture(args.fixtures)
    with tempfile.TemporaryDirectory() as root:
        check_training(pathlib.Path(root))
    print("check_installed: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
