"""infeed.grain: indexed TFRecord files as a Grain source, decoded by ExampleParser, against TensorFlow's values."""

import concurrent.futures
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

grain = pytest.importorskip("grain")

import infeed  # noqa: E402
from infeed.grain import MAX_JOINED_READ, ParseBatch, ParseExample, TFRecordSource  # noqa: E402
from infeed.tfrecord.index import build_index, index_path, write_index  # noqa: E402

DENSE_SPEC = {
    "x": infeed.FixedLen((16,), "float32"),
    "label": infeed.FixedLen((), "int64"),
    "weight": infeed.FixedLen((), "float32", default=1.0),
    "tokens": infeed.VarLen("int64", max_len=12),
    "id": infeed.Bytes(max_bytes=16),
}


@pytest.fixture(scope="module")
def expected(fixtures_dir):
    return json.loads((fixtures_dir / "expected.json").read_text())


def _indexed_copy(fixtures_dir, tmp_path, name: str, as_name: str | None = None) -> str:
    """A copy of a fixture (they are read-only) with its sidecar written beside it."""
    path = str(tmp_path / (as_name or name))
    shutil.copy(fixtures_dir / name, path)
    os.chmod(path, 0o644)
    write_index(build_index(path))
    return path


@pytest.fixture
def dense(fixtures_dir, tmp_path):
    return _indexed_copy(fixtures_dir, tmp_path, "dense.tfrecord")


@pytest.fixture
def two_files(fixtures_dir, tmp_path):
    return [_indexed_copy(fixtures_dir, tmp_path, "dense.tfrecord"),
            _indexed_copy(fixtures_dir, tmp_path, "varied.tfrecord")]


def _records(*paths) -> list[bytes]:
    out = []
    for path in paths:
        with infeed.read_records(path) as reader:
            out += [bytes(r) for r in reader]
    return out


def _same(a, b) -> bool:
    if isinstance(a, infeed.Padded):
        return isinstance(b, infeed.Padded) and _same(a.values, b.values) and _same(a.lengths, b.lengths)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_batch(a: dict, b: dict) -> bool:
    return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)


# --- the source --------------------------------------------------------------------------------------------

def test_the_source_gives_every_record_of_every_file_in_order(two_files):
    source = TFRecordSource(two_files)
    want = _records(*two_files)
    assert len(source) == len(want) == 257 + 300
    assert [source[i] for i in range(len(source))] == want
    assert source[-1] == want[-1] and source[np.int64(260)] == want[260]
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    with pytest.raises(IndexError, match="557 records"):
        source[557]
    assert source.locate(257 + 5) == (two_files[1], 5, build_index(two_files[1]).offsets[5])
    source.close()                                           # reads open the files again
    assert source[300] == want[300] and source._files[1] is not None


def test_batched_reads_join_adjacent_records_and_keep_the_order_asked(two_files, monkeypatch):
    source = TFRecordSource(two_files)
    want = _records(*two_files)
    order = np.random.default_rng(0).permutation(len(source)).tolist()
    assert source._getitems(order) == [want[i] for i in order]
    assert source.__getitems__([3, 3, 256, 257, 258, 2]) == [want[i] for i in [3, 3, 256, 257, 258, 2]]
    reads = []
    for f in range(2):
        handle = source._file(f)
        monkeypatch.setattr(handle, "read_at", lambda o, n, r=handle.read_at: reads.append(n) or r(o, n))
    assert source._getitems(range(10, 74)) == want[10:74]
    assert len(reads) == 1                                  # 64 adjacent records: one read
    monkeypatch.setattr("infeed.grain.MAX_JOINED_READ", 1000)
    reads.clear()
    assert source._getitems(range(10, 74)) == want[10:74]
    assert len(reads) > 1 and max(reads) <= 1000 and MAX_JOINED_READ == 8 << 20


def test_the_source_reads_from_many_threads_at_once(two_files):
    source = TFRecordSource(two_files)
    want = _records(*two_files)
    order = np.random.default_rng(1).permutation(len(source)).tolist() * 4
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(source.__getitem__, order))
    assert got == [want[i] for i in order]


def test_remote_paths_through_pyarrow(two_files):
    uris = [f"file://{p}" for p in two_files]
    source = TFRecordSource(uris)
    assert [source[i] for i in (0, 256, 257, 556)] == [_records(*two_files)[i] for i in (0, 256, 257, 556)]
    assert source.locate(300)[0] == uris[1]


def test_a_glob_leaves_out_the_sidecars(two_files, tmp_path):
    source = TFRecordSource(str(tmp_path / "*"))
    assert source.paths == tuple(sorted(two_files)) and len(source) == 557


# --- pickling and processes --------------------------------------------------------------------------------

def test_the_source_pickles_by_path_and_reads_in_the_new_process_alike(two_files):
    source = TFRecordSource(two_files)
    source[0]                                                # files open here: not part of the pickle
    blob = pickle.dumps(source)
    assert len(blob) < 1000                                  # paths and counts, not the offsets
    again = pickle.loads(blob)
    assert len(again) == len(source) and repr(again) == repr(source)
    assert [again[i] for i in (5, 300, 556)] == [source[i] for i in (5, 300, 556)]


def test_a_source_indexed_in_memory_carries_its_offsets(fixtures_dir):
    source = TFRecordSource(fixtures_dir / "dense.tfrecord", missing_index="build")
    again = pickle.loads(pickle.dumps(source))
    assert [again[i] for i in range(len(again))] == _records(fixtures_dir / "dense.tfrecord")


def test_a_sidecar_that_changed_after_pickling_is_an_index_file_error(two_files):
    source = TFRecordSource(two_files)
    blob = pickle.dumps(source)
    shutil.copy(two_files[0], two_files[1])                  # the second file is now another one
    write_index(build_index(two_files[1]))
    again = pickle.loads(blob)
    assert again[0] == source[0]
    with pytest.raises(infeed.IndexFileError, match="changed since the source was made"):
        again[300]


# The fork is the point (Grain's fork-started workers): the warnings Python 3.12+ and JAX give for a fork of a
# multi-threaded process are expected here, and the child only reads a file and exits.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning",
                            "ignore:os.fork\\(\\) was called:RuntimeWarning")
def test_a_forked_child_reads_with_its_own_descriptors(two_files):
    source = TFRecordSource(two_files)
    want = source[400]
    pid = os.fork()
    if pid == 0:                                             # the child: exit status says whether it read right
        try:
            os._exit(0 if source[400] == want and source._files[1] is not None else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


def test_the_decoders_pickle_as_their_settings(dense):
    parse = ParseBatch(DENSE_SPEC, pad_to=300)
    again = pickle.loads(pickle.dumps(parse))
    records = _records(dense)
    assert _same_batch(again(records), parse(records)) and again.pad_to == 300
    one = pickle.loads(pickle.dumps(ParseExample(DENSE_SPEC)))
    assert _same(one(records[3])["tokens"].values, parse(records)["tokens"].values[3])


# --- errors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("damaged, kind", [("corrupt_data_crc.tfrecord", "data_crc"),
                                           ("corrupt_length_crc.tfrecord", "length_crc")])
def test_a_damaged_record_names_file_record_and_offset(fixtures_dir, tmp_path, expected, damaged, kind):
    case = next(c for c in expected["corrupt"] if c["file"] == damaged)
    good = _indexed_copy(fixtures_dir, tmp_path, "varied.tfrecord")
    path = _indexed_copy(fixtures_dir, tmp_path, "dense.tfrecord", "second.tfrecord")
    shutil.copy(fixtures_dir / damaged, path)                # the same size: the sidecar still fits
    source = TFRecordSource([good, path])
    assert source[300 + 4] == _records(fixtures_dir / "dense.tfrecord")[4]
    for read in (lambda: source[300 + case["record_index"]],
                 lambda: source._getitems(range(300, 310)),
                 lambda: list(grain.MapDataset.source(source)[300:].batch(64, batch_fn=ParseBatch(DENSE_SPEC)))):
        with pytest.raises(infeed.CorruptRecordError) as info:
            read()
        err = info.value
        assert (err.path, err.record_index, err.offset, err.kind) == (path, case["record_index"],
                                                                      case["record_offset"], kind)
        assert f"{path}: corrupt record 5 at byte offset 832" in str(err)


def test_a_missing_index_is_a_clear_error_or_built(fixtures_dir, tmp_path):
    path = str(tmp_path / "dense.tfrecord")
    shutil.copy(fixtures_dir / "dense.tfrecord", path)
    with pytest.raises(ValueError, match=r"has no record index .*run `infeed index`.*missing_index='build'"):
        TFRecordSource(path)
    assert len(TFRecordSource(path, missing_index="build")) == 257
    assert not os.path.exists(index_path(path))
    assert len(TFRecordSource(path, missing_index="write")) == 257
    assert os.path.exists(index_path(path)) and len(TFRecordSource(path)) == 257
    with pytest.raises(ValueError, match="missing_index must be one of"):
        TFRecordSource(path, missing_index="ignore")


def test_a_stale_index_is_an_index_file_error_unless_rebuilding(dense):
    with open(dense, "ab") as f:
        f.write(open(dense, "rb").read(100))
    with pytest.raises(infeed.IndexFileError, match="stale"):
        TFRecordSource(dense)
    with pytest.raises(infeed.CorruptRecordError):           # rebuilding reads the appended half-record
        TFRecordSource(dense, missing_index="build")


def test_a_damaged_file_cannot_be_indexed_in_memory_either(fixtures_dir):
    with pytest.raises(infeed.CorruptRecordError) as info:
        TFRecordSource(fixtures_dir / "corrupt_data_crc.tfrecord", missing_index="build")
    assert (info.value.record_index, info.value.offset) == (5, 832)


def test_a_compressed_file_cannot_be_a_source(fixtures_dir):
    with pytest.raises(ValueError, match="GZIP-compressed"):
        TFRecordSource(fixtures_dir / "varied.tfrecord.gz", missing_index="build")


# --- decoding: TensorFlow's values -------------------------------------------------------------------------

def test_parse_batch_gives_tensorflow_parse_example_values(dense, expected):
    tf_out = expected["dense"]["parse_example_all_records"]
    ds = grain.MapDataset.source(TFRecordSource(dense)).batch(257, batch_fn=ParseBatch(DENSE_SPEC))
    [out] = list(ds)
    assert out["x"].shape == (257, 16) and out["x"].dtype == np.float32
    assert out["x"].tobytes() == np.array(tf_out["x"], np.float32).tobytes()
    assert out["label"].tolist() == tf_out["label"]
    assert out["weight"].tobytes() == np.array(tf_out["weight"], np.float32).tobytes()
    width = len(tf_out["tokens"][0])
    assert out["tokens"].values[:, :width].tolist() == tf_out["tokens"]
    assert [bytes(v[:n]).decode() for v, n in zip(out["id"].values, out["id"].lengths)] == tf_out["id"]


def test_parse_batch_gives_infeeds_own_decode_of_the_varied_fixture(fixtures_dir, tmp_path, expected):
    path = _indexed_copy(fixtures_dir, tmp_path, "varied.tfrecord")
    want = expected["varied"]["records"]
    kinds = {k: f["kind"] for r in want for k, f in r.items() if f["kind"] != "bytes"}
    spec = {k: infeed.VarLen("float32" if kind == "float" else "int64", max_len=64) for k, kind in kinds.items()}
    source = TFRecordSource(path)
    [out] = list(grain.MapDataset.source(source).batch(300, batch_fn=ParseBatch(spec)))
    assert _same_batch(out, infeed.parse_examples(_records(path), spec))
    for i, record in enumerate(want):
        for key in spec:
            values = record.get(key, {"values": []})["values"]
            n = out[key].lengths[i]
            assert n == len(values), (i, key)
            if kinds[key] == "int64":
                assert out[key].values[i, :n].tolist() == values, (i, key)
            else:
                got = out[key].values[i, :n]
                tf = np.array([float(v) for v in values], np.float32)
                assert np.array_equal(got.view(np.uint32), tf.view(np.uint32)) or \
                    np.array_equal(np.isnan(got), np.isnan(tf)) and np.array_equal(got[~np.isnan(got)],
                                                                                   tf[~np.isnan(tf)]), (i, key)


def test_a_shuffled_pipeline_decodes_the_records_it_drew(two_files):
    """shuffle, batch (records as a list), map: each batch is ExampleParser's decode of the records drawn."""
    spec = {"image/class/label": infeed.VarLen("int64", max_len=64), "label": infeed.FixedLen((), "int64", default=-1)}
    source = TFRecordSource(two_files)
    records = _records(*two_files)
    ds = grain.MapDataset.source(source).shuffle(seed=7).batch(50, batch_fn=list).map(ParseBatch(spec))
    order = list(grain.MapDataset.range(len(source)).shuffle(seed=7))
    assert sorted(order) == list(range(len(source))) and order != sorted(order)
    batches = list(ds)
    assert len(batches) == 12 and batches[-1]["label"].shape == (7,)
    for k, batch in enumerate(batches):
        assert _same_batch(batch, infeed.parse_examples([records[i] for i in order[k * 50:(k + 1) * 50]], spec))


def test_per_record_parse_then_grains_batch_gives_the_same_arrays(dense):
    source = TFRecordSource(dense)
    whole = list(grain.MapDataset.source(source).batch(64, drop_remainder=True, batch_fn=ParseBatch(DENSE_SPEC)))
    rows = list(grain.MapDataset.source(source).map(ParseExample(DENSE_SPEC)).batch(64, drop_remainder=True))
    assert len(whole) == len(rows) == 4
    assert all(_same_batch(a, b) for a, b in zip(whole, rows))


def test_pad_to_gives_fixed_shapes_and_a_padding_mask_like_the_daemon(dense):
    ds = grain.MapDataset.source(TFRecordSource(dense)).batch(100, batch_fn=ParseBatch(DENSE_SPEC, pad_to=100))
    last = ds[2]
    assert last["x"].shape == (100, 16) and last["is_padding"].tolist() == [False] * 57 + [True] * 43
    assert not last["x"][57:].any() and not last["tokens"].lengths[57:].any()
    daemon = infeed.Daemon(infeed.Dataset(dense, DENSE_SPEC, batch_size=100, final_batch="pad"), num_workers=1,
                           lock_memory=False)
    with daemon as feed:
        batches = [{k: (infeed.Padded(v.values.copy(), v.lengths.copy()) if isinstance(v, infeed.Padded)
                        else v.copy()) for k, v in b.items()} for b in feed]
    assert len(batches) == 3 and all(_same_batch(a, b) for a, b in zip(batches, ds))
    with pytest.raises(ValueError, match="batch of 101 records"):
        ParseBatch(DENSE_SPEC, pad_to=100)([b""] * 101)


def test_parse_batch_refuses_grains_default_stacking_that_drops_trailing_nuls(dense):
    ds = grain.MapDataset.source(TFRecordSource(dense)).batch(8).map(ParseBatch(DENSE_SPEC))
    with pytest.raises(TypeError, match=r"trailing NUL bytes.*batch_fn=ParseBatch\(spec\)"):
        ds[0]


def test_a_decode_error_names_the_feature_and_the_position_in_the_batch(dense):
    spec = {**DENSE_SPEC, "x": infeed.FixedLen((8,), "float32")}
    with pytest.raises(infeed.DecodeError) as info:
        grain.MapDataset.source(TFRecordSource(dense)).batch(16, batch_fn=ParseBatch(spec))[1]
    assert info.value.feature == "x" and info.value.record_index == 0


def test_parsers_decode_right_from_many_threads_at_once(dense):
    source = TFRecordSource(dense)
    parse = ParseBatch(DENSE_SPEC)
    records = _records(dense)
    chunks = [records[i:i + 32] for i in range(0, 257, 32)] * 6
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        got = list(pool.map(parse, chunks))
    assert all(_same_batch(g, infeed.parse_examples(c, DENSE_SPEC)) for g, c in zip(got, chunks))
    threaded = grain.MapDataset.source(source).batch(32, batch_fn=parse).to_iter_dataset(
        grain.ReadOptions(num_threads=4, prefetch_buffer_size=8))
    assert all(_same_batch(g, infeed.parse_examples(records[k * 32:(k + 1) * 32], DENSE_SPEC))
               for k, g in enumerate(threaded))


def test_skip_corrupt_images_are_zero_rows_flagged_in_the_padding_mask_like_the_daemon(tmp_path):
    simplejpeg = pytest.importorskip("simplejpeg")
    good = simplejpeg.encode_jpeg(np.full((8, 8, 3), 90, np.uint8))
    records = [infeed.encode_example({"image": b"GIF89a..." if i in (1, 4) else good, "id": i}) for i in range(5)]
    spec = {"image": infeed.Image(size=(4, 4), key="image"), "id": infeed.FixedLen((), "int64")}
    batch = ParseBatch(spec, pad_to=6, skip_corrupt=True)(records)
    assert batch["is_padding"].tolist() == [False, True, False, False, True, True]
    assert batch["id"].tolist() == [0, 0, 2, 3, 0, 0] and not batch["image"][[1, 4, 5]].any()
    assert ParseBatch(spec, skip_corrupt=True)(records[:3])["is_padding"].tolist() == [False, True, False]
    with pytest.raises(ValueError, match="'is_padding' clashes with the padding mask of skip_corrupt"):
        ParseBatch({**spec, "is_padding": infeed.FixedLen((), "int64")}, skip_corrupt=True)


def test_random_image_crops_need_grains_random_map(tmp_path):
    simplejpeg = pytest.importorskip("simplejpeg")
    path = str(tmp_path / "images.tfrecord")
    rng = np.random.default_rng(0)
    with infeed.TFRecordWriter(path) as w:
        for _ in range(6):
            pixels = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
            w.write(infeed.encode_example({"image": simplejpeg.encode_jpeg(pixels)}))
    spec = {"image": infeed.Image(size=(16, 16), resize="random_resized_crop", flip=True, key="image")}
    source = TFRecordSource(path, missing_index="build")
    with pytest.raises(ValueError, match="random_map"):
        grain.MapDataset.source(source).batch(3, batch_fn=ParseBatch(spec))[0]
    ds = grain.MapDataset.source(source).batch(3, batch_fn=list).random_map(ParseBatch(spec), seed=1)
    a, b = ds[0]["image"], ds[0]["image"]
    assert a.shape == (3, 16, 16, 3) and np.array_equal(a, b)             # Grain's seed: the same draws again
    other = grain.MapDataset.source(source).batch(3, batch_fn=list).random_map(ParseBatch(spec), seed=2)[0]["image"]
    assert not np.array_equal(a, other)
    rows = grain.MapDataset.source(source).random_map(ParseExample(spec), seed=1).batch(3)[0]["image"]
    assert rows.shape == (3, 16, 16, 3)


# --- Grain's DataLoader ------------------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 1])
def test_grains_data_loader_with_workers(dense, workers):
    from absl import flags

    if not flags.FLAGS.is_parsed():          # Grain 0.2's worker processes read an absl flag of the parent
        flags.FLAGS.mark_as_parsed()
    source = TFRecordSource(dense)
    sampler = grain.samplers.IndexSampler(num_records=len(source), shuffle=True, seed=3, num_epochs=1,
                                          shard_options=grain.sharding.NoSharding())
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=workers,
                              operations=[grain.transforms.Batch(64, drop_remainder=True,
                                                                 batch_fn=ParseBatch(DENSE_SPEC))])
    batches = list(loader)
    records = _records(dense)
    order = [sampler[i].record_key for i in range(len(source))]
    assert len(batches) == 4
    for k, batch in enumerate(batches):
        want = infeed.parse_examples([records[i] for i in order[k * 64:(k + 1) * 64]], DENSE_SPEC)
        assert set(batch) == set(want)
        for name in want:
            got = batch[name]
            if isinstance(want[name], infeed.Padded):
                assert np.array_equal(got[0], want[name].values) and np.array_equal(got[1], want[name].lengths)
            else:
                assert np.array_equal(got, want[name])


# --- optional dependency -----------------------------------------------------------------------------------

def test_import_infeed_does_not_import_grain_and_infeed_grain_without_it_names_the_extra():
    code = ("import sys, infeed\n"
            "assert 'grain' not in sys.modules, 'import infeed imported grain'\n"
            "sys.modules['grain'] = None\n"
            "try:\n"
            "    import infeed.grain\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install tpu-estimator-jax[grain]" in out.stdout
