"""examples/imagenet_style.py at a tiny size: JPEGs in ImageNet's TFRecord layout, trained on through the daemon's
random crops and flips, evaluated on centre crops, exported and served.

The job runs as ``python examples/imagenet_style.py`` does, in its own process on one CPU device (a conv net split
over the 8 devices of tests/conftest.py runs at half the speed on 2 cores).
"""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import simplejpeg

import infeed

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--train-records", "384", "--validation-records", "96", "--train-shards", "2", "--validation-shards", "1",
        "--image-size", "32", "--steps", "300", "--batch-size", "32", "--eval-batch-size", "32",
        "--min-accuracy", "0.25", "--quiet"]


def test_the_written_files_have_the_layout_of_build_imagenet_data(tmp_path, load_example):
    job = load_example("imagenet_style")
    paths = job.write_split(str(tmp_path), "validation", 12, 2, job.load_photos(), seed=0)
    assert [os.path.basename(p) for p in paths] == ["validation-00000-of-00002", "validation-00001-of-00002"]
    records = [infeed.decode_example(r) for p in paths for r in infeed.read_records(p)]
    assert len(records) == 12
    kinds = {"image/encoded": "bytes", "image/class/label": "int64", "image/class/text": "bytes",
             "image/height": "int64", "image/width": "int64", "image/channels": "int64", "image/colorspace": "bytes",
             "image/format": "bytes", "image/filename": "bytes"}
    assert all({k: v[0] for k, v in r.items()} == kinds for r in records)
    labels = [int(r["image/class/label"][1][0]) for r in records]
    assert sorted(labels) == sorted(list(range(6)) * 2)                    # the classes balanced
    for i, r in enumerate(records):
        encoded = r["image/encoded"][1][0]
        height, width, _, _ = simplejpeg.decode_jpeg_header(encoded)
        assert (height, width) == (r["image/height"][1][0], r["image/width"][1][0])
        assert 300 <= height <= 500 and 300 <= width <= 500
        assert r["image/class/text"][1][0] == job.CLASSES[labels[i]].encode()
        assert r["image/format"][1][0] == b"JPEG" and r["image/filename"][1][0] == f"validation_{i:06d}.JPEG".encode()


def test_the_same_seed_draws_the_same_pictures_whatever_the_sharding(tmp_path, load_example):
    job = load_example("imagenet_style")
    photos = job.load_photos()
    one = job.write_split(str(tmp_path / "one"), "train", 5, 1, photos, seed=3)
    two = job.write_split(str(tmp_path / "two"), "train", 5, 2, photos, seed=3)
    assert [r for p in one for r in infeed.read_records(p)] == [r for p in two for r in infeed.read_records(p)]


def test_the_tiny_job_trains_beats_chance_evaluates_every_picture_and_serves_the_export(tmp_path):
    flags = os.environ.get("XLA_FLAGS", "").replace("--xla_force_host_platform_device_count=8", "")
    env = dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, str(ROOT / "examples" / "imagenet_style.py"), "--dir", str(tmp_path), *TINY]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = dict(re.findall(r"^(\S.*?)\s{2,}(.*)$", done.stdout, re.MULTILINE))

    data = sorted(os.listdir(tmp_path / "data"))
    assert data == ["train-00000-of-00002", "train-00001-of-00002", "validation-00000-of-00001"]
    assert rows["train steps"].startswith("300 (batch 32, 100 steps per compiled loop")
    first, last = re.fullmatch(r"(\S+) at the first summary, (\S+) at the last", rows["train loss"]).groups()
    assert float(last) < float(first)
    accuracy, right, loss = re.match(r"(\d\.\d{4}) \((\d+)/96\), loss (\S+),", rows["eval accuracy"]).groups()
    assert float(accuracy) >= 0.25 and int(right) == round(float(accuracy) * 96)     # 1.5 times chance (1/6)
    assert math.isfinite(float(loss))
    assert rows["export"] == str(tmp_path / "export" / "300")
    assert os.path.isfile(tmp_path / "export" / "300" / "signature.json")
    served = int(re.match(r"(\d+)/96 right from the export", rows["served"]).group(1))
    assert abs(served - int(right)) <= 1
    assert "loss" in rows["train summaries"] and "accuracy" in rows["eval summaries"]
    assert rows["result"] == "PASS"
