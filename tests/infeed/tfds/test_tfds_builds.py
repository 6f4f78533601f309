"""Builds that tensorflow-datasets 4.9.10 wrote (tests/fixtures/tfds, made by tools/make_tfds_fixtures.py), read by
their own metadata: the shards in order, the example counts, the spec, and every value as TFDS returned it."""

import base64
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import infeed
from infeed import Bytes, Daemon, Dataset, FixedLen, Image, VarLen
from infeed.example.image import ImageDecoder
from infeed.example.survey import summarize
from infeed.tfds import open_build, stored_features, tfds_spec
from infeed.tfrecord.reader import read_records

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tfds"
EXPECTED = json.loads((FIXTURES / "expected.json").read_text())
CONFIGS = ("png", "jpeg")
SIZES = {"image": infeed.Image(size=(12, 12), resize="random_resized_crop"), "mask": {"size": (12, 12)}}


def folder(config: str) -> Path:
    return FIXTURES / "infeed_fixture" / config / "1.0.0"


def expected(config: str, split: str) -> dict:
    return EXPECTED["configs"][config]["splits"][split]


def values(doc):
    """An expected value as numpy, bytes or a list of rows."""
    if "bytes" in doc:
        return base64.b64decode(doc["bytes"])
    if "pixels" in doc:
        return np.frombuffer(base64.b64decode(doc["pixels"]), np.uint8).reshape(doc["shape"])
    if "ragged" in doc:
        return doc["ragged"]
    return np.array(doc["values"], dtype=doc["dtype"]).reshape(doc["shape"])


def collect(ds, **kw):
    with Daemon(ds, num_workers=1, lock_memory=False, timeout=60, **kw) as feed:
        return [{k: (infeed.Padded(v.values.copy(), v.lengths.copy()) if isinstance(v, infeed.Padded) else v.copy())
                 for k, v in batch.items()} for batch in feed]


@pytest.mark.parametrize("config", CONFIGS)
def test_a_build_gives_its_shards_in_order_and_their_example_counts(config):
    build = open_build(FIXTURES / "infeed_fixture" / config)            # the config folder: its one version
    assert (build.name, build.config, build.version) == ("infeed_fixture", config, "1.0.0")
    assert build.folder == str(folder(config))
    for split, count in (("train", 20), ("test", 6)):
        shards = expected(config, split)["shards"]
        got = build.split(split)
        assert [os.path.basename(f) for f in got.files] == [s["file"] for s in shards]
        assert list(got.shard_lengths) == [len(s["ids"]) for s in shards] and got.examples == count
        assert sum(summarize(f).records for f in got.files) == count
    with pytest.raises(ValueError, match=r"no split 'validation'; the build has \['test', 'train'\]"):
        build.split("validation")


def test_a_folder_of_several_configs_is_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"holds several TFDS configs: jpeg, png; name one"):
        open_build(FIXTURES / "infeed_fixture")
    versions = tmp_path / "infeed_fixture" / "png"
    for version in ("1.0.0", "1.1.0"):
        shutil.copytree(folder("png"), versions / version)
    with pytest.raises(ValueError, match=r"holds several TFDS versions: 1.0.0, 1.1.0"):
        open_build(versions)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"empty: not a TFDS build: no dataset_info.json in it"):
        open_build(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match=r"nowhere: no such folder"):
        open_build(tmp_path / "nowhere")
    os.remove(versions / "1.1.0" / "infeed_fixture-train.tfrecord-00001-of-00002")
    with pytest.raises(FileNotFoundError, match=r"split 'train' has 2 shards in dataset_info.json, and 1 are "
                                                r"missing: .*infeed_fixture-train.tfrecord-00001-of-00002"):
        open_build(versions / "1.1.0")


def test_the_spec_keeps_shapes_maps_dtypes_and_reads_lengths_from_the_data():
    build = open_build(folder("jpeg"))
    spec = tfds_spec(stored_features(build.features), build.split("train").files, images=SIZES)
    longest = {name: 0 for name in ("tokens", "text", "meta/source", "ragged/ragged_flat_values",
                                    "ragged/ragged_row_lengths_0")}
    for example in expected("jpeg", "train")["examples"]:
        longest["tokens"] = max(longest["tokens"], len(values(example["tokens"])))
        longest["text"] = max(longest["text"], len(values(example["text"])))
        longest["meta/source"] = max(longest["meta/source"], len(values(example["meta"]["source"])))
        rows = values(example["ragged"])
        longest["ragged/ragged_flat_values"] = max(longest["ragged/ragged_flat_values"], sum(map(len, rows)))
        longest["ragged/ragged_row_lengths_0"] = max(longest["ragged/ragged_row_lengths_0"], len(rows))
    assert spec == {
        "flag": FixedLen((), "bool"), "label": FixedLen((), "int64"), "matrix": FixedLen((2, 3), "int64"),
        "meta/id": FixedLen((), "int32"), "meta/source": Bytes(max_bytes=longest["meta/source"]),
        "score": FixedLen((), "float32"), "small": FixedLen((), "uint8"), "vector": FixedLen((4,), "float32"),
        "text": Bytes(max_bytes=longest["text"]), "tokens": VarLen("int64", max_len=longest["tokens"]),
        "ragged/ragged_flat_values": VarLen("int32", max_len=longest["ragged/ragged_flat_values"]),
        "ragged/ragged_row_lengths_0": VarLen("int64", max_len=longest["ragged/ragged_row_lengths_0"]),
        "image": Image(size=(12, 12), resize="random_resized_crop", key="image", channels=3),
        "mask": Image(size=(12, 12), key="mask", channels=1),
        "thumbnail": Image(size=(8, 8), resize=None, key="thumbnail", channels=3),   # its size is in the metadata
    }
    assert list(spec)[:3] == ["flag", "image", "label"]                          # features.json's order
    given = tfds_spec(stored_features(build.features), (), features=["tokens", "meta"],
                      max_lengths={"tokens": 50, "meta/source": 20})            # no read of the data
    assert given == {"meta/id": FixedLen((), "int32"), "meta/source": Bytes(max_bytes=20),
                     "tokens": VarLen("int64", max_len=50)}


def test_what_the_spec_cannot_know_is_asked_for_by_name():
    stored = stored_features(open_build(folder("png")).features)
    with pytest.raises(ValueError, match=r"feature 'image': its PNG images have any size .*shape \(None, None, 3\)"
                                         r".*images=\{'image': infeed.Image\(size=\(224, 224\)"):
        tfds_spec(stored, features=["image"])
    with pytest.raises(ValueError, match=r"features \['labels'\] are not features of the build \(flag, image, "):
        tfds_spec(stored, features=["labels"])
    with pytest.raises(ValueError, match=r"images names \['label'\], which are not image features of the build "
                                         r"\(image, mask, thumbnail\)"):
        tfds_spec(stored, features=["label"], images={"label": {"size": (2, 2)}})
    with pytest.raises(ValueError, match=r"features \['tokens'\] have no fixed length in the build's metadata"):
        tfds_spec(stored, features=["tokens"])


@pytest.mark.parametrize("config", CONFIGS)
def test_every_value_is_what_tfds_returned_in_shard_order(config):
    want = {e["meta"]["id"]["values"]: e for e in expected(config, "train")["examples"]}
    order = [i for shard in expected(config, "train")["shards"] for i in shard["ids"]]
    ds = Dataset.from_tfds(FIXTURES / "infeed_fixture" / config, "train", batch_size=4,
                           images={"image": Image(size=(12, 12)), "mask": Image(size=(12, 12))})
    batches = collect(ds)
    assert len(batches) == 5
    got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]
           if not isinstance(batches[0][k], infeed.Padded)}
    padded = {k: [row[:n] for b in batches for row, n in zip(b[k].values, b[k].lengths)]
              for k in batches[0] if isinstance(batches[0][k], infeed.Padded)}
    assert got["meta/id"].tolist() == order
    for row, i in enumerate(order):
        example = want[i]
        for name in ("label", "small", "matrix", "vector", "flag"):
            w = values(example[name])
            assert got[name][row].dtype == w.dtype and np.array_equal(got[name][row], w), (name, i)
        assert got["score"][row] == np.float32(values(example["score"]))           # float64 stored as float32
        assert padded["tokens"][row].tolist() == values(example["tokens"]).tolist()
        assert bytes(padded["text"][row]) == values(example["text"])
        assert bytes(padded["meta/source"][row]) == values(example["meta"]["source"])
        flat, lengths = padded["ragged/ragged_flat_values"][row], padded["ragged/ragged_row_lengths_0"][row]
        rows = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
        assert [r.tolist() for r in rows] == values(example["ragged"])
        assert np.array_equal(got["thumbnail"][row], values(example["thumbnail"]))   # decoded whole: TFDS's pixels


@pytest.mark.parametrize("config", CONFIGS)
def test_every_image_decodes_to_tfds_pixels(config):
    """Decoded at its own size (no resize), each image's pixels are those TFDS gave (JPEG: TF's default IDCT,
    libjpeg-turbo's fast integer one, which infeed.Image uses unless fast_dct=False)."""
    build = open_build(folder(config))
    want = {e["meta"]["id"]["values"]: e for e in expected(config, "train")["examples"]}
    checked = 0
    for path in build.split("train").files:
        with read_records(path) as reader:
            for record in reader:
                example = infeed.decode_example(record)
                i = int(example["meta/id"][1][0])
                for name, channels in (("image", 3), ("mask", 1), ("thumbnail", 3)):
                    pixels = values(want[i][name])
                    decoder = ImageDecoder(Image(size=pixels.shape[:2], resize=None, channels=channels, key=name),
                                           seed=0, stream=0)
                    out = np.empty(pixels.shape, np.uint8)
                    decoder.decode(example[name][1][0], out)
                    assert np.array_equal(out, pixels), (config, name, i)
                    checked += 1
    assert checked == 60


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("interleave, order", [((2, 3), "interleaved_2_3"), ((16, 16), "examples")])
def test_an_interleave_gives_tfds_order_for_any_worker_count_and_after_a_resume(config, interleave, order,
                                                                                 tmp_path):
    """(16, 16) is TFDS's default read of a split: here each shard is within a block, so one after another;
    (2, 3) interleaves these small shards as TFDS did with ReadConfig(interleave_cycle_length=2,
    interleave_block_length=3)."""
    split = expected(config, "train")
    want = split[order] if order != "examples" else [e["meta"]["id"]["values"] for e in split["examples"]]
    ds = Dataset.from_tfds(FIXTURES / "infeed_fixture" / config, "train", batch_size=2, features=["meta/id"],
                           interleave=interleave, index_dir=tmp_path / "indexes")
    one = [i for b in collect(ds) for i in b["meta/id"].tolist()]
    assert one == want
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        head = [i for _ in range(3) for i in next(feed)["meta/id"].tolist()]
        state = feed.state()
    tail = [i for b in collect(ds, state=state) for i in b["meta/id"].tolist()]
    assert head + tail == want


def test_interleave_follows_tf_data_when_files_end_mid_block_at_a_block_end_or_are_empty():
    from infeed.daemon.plan import interleave_order

    def tf_data(counts, cycle, block):     # tf.data's InterleaveDatasetOp, a record at a time
        files = [list(range(sum(counts[:f]), sum(counts[:f + 1]))) for f in range(len(counts))]
        slots, out, place, taken, nxt, opened = [None] * cycle, [], 0, 0, 0, 0
        while nxt < len(files) or opened:
            if slots[place] is not None:
                if slots[place]:
                    out.append(slots[place].pop(0))
                    taken += 1
                    if taken == block:
                        place, taken = (place + 1) % cycle, 0
                    continue
                slots[place], opened, place, taken = None, opened - 1, (place + 1) % cycle, 0
            elif nxt < len(files):
                slots[place], nxt, opened = list(files[nxt]), nxt + 1, opened + 1
            else:
                place, taken = (place + 1) % cycle, 0
        return out

    rng = np.random.default_rng(0)
    for counts, cycle, block in [([10, 10], 2, 3), ([7, 6, 7], 2, 3), ([3, 0, 6, 3], 3, 3), ([0, 0], 2, 1),
                                 *[(list(rng.integers(0, 9, rng.integers(1, 7))), int(rng.integers(1, 5)),
                                    int(rng.integers(1, 5))) for _ in range(200)]]:
        got = interleave_order(counts, cycle, block).tolist()
        assert got == tf_data(counts, cycle, block), (counts, cycle, block)
        assert sorted(got) == list(range(sum(counts)))


def test_an_interleave_is_checked_and_needs_indexes(tmp_path):
    files = [str(p) for p in sorted(folder("png").glob("*-train.tfrecord-*"))]
    for bad in ((2,), (0, 3), "23", (2, 1.5)):
        with pytest.raises(ValueError, match="interleave"):
            Dataset(files, {"meta/id": FixedLen((), "int32")}, batch_size=2, interleave=bad)
    ds = Dataset(files, {"meta/id": FixedLen((), "int32")}, batch_size=2, interleave=(2, 3), build_indexes=False,
                 index_dir=tmp_path / "none")
    with pytest.raises(ValueError, match=r"interleave needs a record index for every file and .* has none"):
        Daemon(ds, num_workers=1, lock_memory=False)
    assert Dataset.from_json(ds.to_json()).interleave == (2, 3)
    plain = Dataset(files, {"meta/id": FixedLen((), "int32")}, batch_size=2)
    assert "interleave" not in plain.identity() and ds.identity()["interleave"] == [2, 3]  # older states still match
    assert plain.fingerprint() != ds.fingerprint()
