"""examples/mnist_port.py, the port of TPUEstimator's MNIST in docs/porting.md, runs as the doc says.

Small settings (a narrower net, fewer steps) on the 8 CPU devices of tests/conftest.py.
"""

import os

import numpy as np
import pytest

import estimator as est
import infeed

SMALL = ["--batch_size", "32", "--train_steps", "100", "--iterations", "20", "--filters", "8", "--hidden", "64",
         "--learning_rate", "0.2", "--train_records", "1024", "--validation_records", "640", "--infeed_workers", "1"]


@pytest.fixture
def mnist_port(load_example):
    return load_example("mnist_port")


def test_the_port_trains_evaluates_predicts_and_exports(mnist_port, tmp_path, capsys):
    out = mnist_port.main(SMALL + ["--model_dir", str(tmp_path / "model"), "--eval_every", "100"])
    printed = capsys.readouterr().out
    result = out["result"]
    assert result["global_step"] == 100 and result["examples"] == 640       # every validation example, once
    assert result["accuracy"] > 0.7 and np.isfinite(result["loss"])
    assert len(out["predictions"]) == 10 and printed.count("Prediction is") == 10
    assert set(out["predictions"][0]) == {"class_ids", "probabilities"}
    assert out["export_path"] == str(tmp_path / "model" / "export" / "100")

    # the export serves the uint8 pixels without the model's code, as predict did
    records = infeed.read_records(str(tmp_path / "model" / "data" / "test.tfrecords")).read_batch(10)
    pixels = infeed.ExampleParser({"image_raw": infeed.Bytes(max_bytes=784)}).parse(records)["image_raw"].values
    served = est.load_exported(out["export_path"])({"image_raw": pixels})
    np.testing.assert_allclose(served["probabilities"], np.stack([p["probabilities"] for p in out["predictions"]]),
                               rtol=1e-4, atol=1e-5)

    # TPUEstimator's eval_metrics=(metric_fn, tensors) on the host gives the in-loop accuracy
    again = mnist_port.main(SMALL + ["--model_dir", str(tmp_path / "model"), "--host_metrics", "--no_predict",
                                     "--no_export", "--data_dir", str(tmp_path / "model" / "data")])
    assert again["result"]["global_step"] == 100                               # nothing more to train
    assert again["result"]["accuracy"] == pytest.approx(result["accuracy"], abs=1e-9)
    assert again["result"]["loss"] == pytest.approx(result["loss"], rel=1e-5)


def test_the_made_up_data_has_tensorflows_mnist_layout(mnist_port, tmp_path):
    data_dir = mnist_port.write_mnist_like(str(tmp_path), train=20, validation=5, test=3)
    assert sorted(os.listdir(data_dir)) == ["test.tfrecords", "train.tfrecords", "validation.tfrecords"]
    record = next(iter(infeed.read_records(os.path.join(data_dir, "test.tfrecords"))))
    features = infeed.decode_example(record)
    assert features["image_raw"][0] == "bytes" and len(features["image_raw"][1][0]) == 784
    assert {k: v[0] for k, v in features.items() if k != "image_raw"} == {
        "label": "int64", "height": "int64", "width": "int64", "depth": "int64"}
