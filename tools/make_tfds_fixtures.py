"""Builds the TFDS fixtures of ``tests/fixtures/tfds`` with tensorflow-datasets itself, and records what TFDS
reads back from them, so that infeed's reading of TFDS builds is checked against TFDS's own (as
``../shared/fixtures`` were written and decoded by TensorFlow).

TensorFlow and tensorflow-datasets are never infeed's dependencies: run this once, in a venv of its own::

    python3 -m venv /tmp/tfds-venv
    /tmp/tfds-venv/bin/pip install tensorflow-cpu==2.21.0 tensorflow-datasets==4.9.10
    /tmp/tfds-venv/bin/python tools/make_tfds_fixtures.py tests/fixtures/tfds

It writes, under the output folder:

- ``infeed_fixture/png/1.0.0/``: a build of 20 train and 6 test examples of every kind of feature below, its
  images PNG (TFDS's default), each split in 2 shards;
- ``infeed_fixture/jpeg/1.0.0/``: the same examples with JPEG images, each split in 3 shards;
- ``expected.json``: for each config and split, every example as TFDS gives it
  (``builder.as_dataset(split, shuffle_files=False)``: TFDS's default read order, its shards interleaved 16 at a
  time in blocks of 16), images as base64 of their decoded pixels; for each shard, the ids (``meta/id``) of its
  examples in file order; and the ids in TFDS's order with ``ReadConfig(interleave_cycle_length=2,
  interleave_block_length=3)``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys

import numpy as np
import tensorflow_datasets as tfds

#: The examples of each split: their count and the seed of their values.
SPLITS = {"train": (20, 1), "test": (6, 2)}
SHARDS = {"png": 2, "jpeg": 3}
LABELS = ["cat", "dog", "bird"]


def _features(encoding: str):
    return tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(None, None, 3), encoding_format=encoding),
        "mask": tfds.features.Image(shape=(None, None, 1), encoding_format="png"),
        "thumbnail": tfds.features.Image(shape=(8, 8, 3), encoding_format=encoding),
        "label": tfds.features.ClassLabel(names=LABELS),
        "text": tfds.features.Text(),
        "vector": tfds.features.Tensor(shape=(4,), dtype=np.float32),
        "matrix": tfds.features.Tensor(shape=(2, 3), dtype=np.int64),
        "score": tfds.features.Scalar(dtype=np.float64),
        "flag": tfds.features.Scalar(dtype=np.bool_),
        "small": tfds.features.Scalar(dtype=np.uint8),
        "tokens": tfds.features.Sequence(np.int64),
        "meta": tfds.features.FeaturesDict({"id": np.int32, "source": tfds.features.Text()}),
        "ragged": tfds.features.Sequence(tfds.features.Sequence(np.int32)),
    })


def _examples(count: int, seed: int, first_id: int):
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = (int(v) for v in rng.integers(6, 24, size=2))
        yield first_id + i, {
            "image": rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8),
            "mask": rng.integers(0, 256, size=(h, w, 1), dtype=np.uint8),
            "thumbnail": rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8),
            "label": int(rng.integers(0, len(LABELS))),
            "text": " ".join(["word"] * int(rng.integers(0, 5))) + f" #{first_id + i}",
            "vector": rng.standard_normal(4).astype(np.float32),
            "matrix": rng.integers(-10**12, 10**12, size=(2, 3)),
            "score": float(rng.standard_normal()),
            "flag": bool(rng.integers(0, 2)),
            "small": int(rng.integers(0, 256)),
            "tokens": rng.integers(0, 1000, size=int(rng.integers(0, 9))),
            "meta": {"id": first_id + i, "source": f"generator-{seed}"},
            "ragged": [rng.integers(-5, 5, size=int(rng.integers(0, 4))).astype(np.int32)
                       for _ in range(int(rng.integers(0, 4)))],
        }


class InfeedFixture(tfds.core.GeneratorBasedBuilder):
    """Every kind of feature infeed reads from a TFDS build, small."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name, description=f"{name.upper()} images")
                       for name in ("png", "jpeg")]

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=_features(self.builder_config.name),
                                     description="infeed's TFDS fixture")

    def _split_generators(self, dl_manager):
        first = 0
        out = {}
        for split, (count, seed) in SPLITS.items():
            out[split] = self._generate_examples(count, seed, first)
            first += 1000
        return out

    def _generate_examples(self, count, seed, first_id):
        for key, example in _examples(count, seed, first_id):
            yield key, example


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, np.ndarray):
        if value.dtype == np.uint8 and value.ndim == 3:           # an image: its decoded pixels
            return {"pixels": base64.b64encode(value.tobytes()).decode(), "shape": list(value.shape)}
        if value.dtype == object:
            return [_jsonable(v) for v in value]
        return {"dtype": value.dtype.name, "shape": list(value.shape), "values": value.tolist()}
    if isinstance(value, np.generic):
        return {"dtype": value.dtype.name, "shape": [], "values": value.item()}
    if hasattr(value, "to_list"):                                  # a ragged tensor
        return {"ragged": value.to_list()}
    raise TypeError(f"{type(value)}: {value!r:.80}")


def main(out: str) -> None:
    import tensorflow as tf

    root = os.path.abspath(out)
    for made in ("infeed_fixture", "downloads"):
        shutil.rmtree(os.path.join(root, made), ignore_errors=True)
    expected = {"tensorflow": tf.__version__, "tensorflow_datasets": tfds.__version__, "configs": {}}
    for config, shards in SHARDS.items():
        builder = InfeedFixture(config=config, data_dir=root)
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=shards))
        folder = builder.data_dir
        splits = {}
        for split in SPLITS:
            ds = builder.as_dataset(split=split, shuffle_files=False)
            examples = [_jsonable(tfds.as_numpy(example)) for example in ds]
            shard_ids = []
            for path in sorted(p for p in os.listdir(folder) if f"-{split}.tfrecord-" in p):
                raw = tf.data.TFRecordDataset(os.path.join(folder, path))
                parsed = [builder.info.features.deserialize_example(r) for r in raw]
                shard_ids.append({"file": path, "ids": [int(e["meta"]["id"]) for e in parsed]})
            # TFDS interleaves a split's shards (16 at a time, in blocks of 16: here, a shard after the other);
            # with 2 at a time in blocks of 3 the interleave shows on these small shards too.
            small = tfds.ReadConfig(interleave_cycle_length=2, interleave_block_length=3)
            interleaved = builder.as_dataset(split=split, shuffle_files=False, read_config=small)
            splits[split] = {"examples": examples, "shards": shard_ids,
                             "interleaved_2_3": [int(e["meta"]["id"]) for e in tfds.as_numpy(interleaved)]}
        expected["configs"][config] = {"folder": os.path.relpath(folder, root), "splits": splits}
    shutil.rmtree(os.path.join(root, "downloads"), ignore_errors=True)     # empty: nothing is downloaded
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tfds")
