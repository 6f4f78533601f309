"""User transforms in the workers: imported by name, run per record and per batch, their generators keyed
by record and batch, their outputs checked, their failures located."""

import json
import types

import numpy as np
import pytest

import infeed
import transforms_for_tests as tx
from infeed import Daemon, Dataset, FixedLen, TransformError
from infeed.daemon.plan import epoch_paths
from infeed.example.randomness import STREAM_BATCH_TRANSFORM, STREAM_TRANSFORM, record_generator
from test_daemon import SIZES, SPEC, assert_same, collect, files  # noqa: F401 (files: the daemon tests' fixture)

NAME = "transforms_for_tests"


def where_is(record_id: int) -> tuple[int, int]:
    """(file number, index in the file) of the record with ``record_id``."""
    for k, n in enumerate(SIZES):
        if record_id < n:
            return k, record_id
        record_id -= n
    raise IndexError(record_id)


def copied(batch):
    return {k: (infeed.Padded(v.values.copy(), v.lengths.copy()) if isinstance(v, infeed.Padded) else v.copy())
            for k, v in batch.items()}


def noisy_dataset(files, **kw):
    return Dataset(files, SPEC, batch_size=8, transform=tx.noisy, outputs=tx.NOISY_OUTPUTS, **kw)


@pytest.mark.parametrize("final_batch", ["drop", "pad"])
def test_a_transform_writes_its_outputs_the_same_for_one_or_two_workers(files, final_batch):
    ds = noisy_dataset(files, final_batch=final_batch)
    one, two = collect(ds, num_workers=1), collect(ds, num_workers=2)
    assert_same(one, two)
    assert len(one) == (13 if final_batch == "pad" else 12)
    ids = np.concatenate([b["id"] for b in one])
    real = ids if final_batch == "drop" else ids[~np.concatenate([b["is_padding"] for b in one])]
    assert real.tolist() == list(range(len(real)))
    batch = one[0]
    assert set(batch) == set(tx.NOISY_OUTPUTS) | ({"is_padding"} if final_batch == "pad" else set())
    assert batch["twice"].dtype == np.int32 and batch["twice"].tolist() == [[2 * i] * 2 for i in range(8)]
    assert batch["tokens"].lengths.tolist() == [i % 5 for i in range(8)]
    assert batch["tokens"].values[4].tolist() == [0, 1, 2, 3]
    if final_batch == "pad":
        last = one[-1]
        assert last["is_padding"].tolist() == [False] * 4 + [True] * 4
        assert not last["id"][4:].any() and not last["noise"][4:].any()


@pytest.mark.serial                         # how many batches each worker makes depends on the CPU it gets
def test_batches_go_to_whichever_worker_is_free_so_a_slow_worker_makes_few(files, tmp_path, monkeypatch):
    """One worker 50 ms slower a batch: dealt in turn it would make 12 of the 25 batches and the other would
    wait for it; taking the next batch nobody has, the other makes most. The batches are the same. The fast
    worker can run ahead of the slow one's batch by at most the ring's slots, so 8 slots let it make up to ~7
    in each 50 ms (4 slots capped it at ~4, and a loaded machine then met the bound of 3 exactly)."""
    monkeypatch.setenv(tx.SLOW_MARKER, str(tmp_path / "slow"))
    want = collect(Dataset(files, SPEC, batch_size=4, batch_transform=tx.summed, outputs=tx.SUMMED_OUTPUTS),
                   num_workers=1)
    ds = Dataset(files, SPEC, batch_size=4, batch_transform=tx.slow_in_one_worker, outputs=tx.SUMMED_OUTPUTS)
    with Daemon(ds, num_workers=2, slots=8, lock_memory=False, timeout=60) as feed:
        got = [copied(batch) for batch in feed]
        made = sorted(w.batches for w in feed.stats().workers)
    assert_same(got, want)
    assert sum(made) == len(want) == 25
    assert made[1] >= 3 * made[0]


def test_each_record_draws_from_its_own_generator_whatever_the_order_workers_or_resume(files):
    ds = noisy_dataset(files, shuffle_files=True, shuffle_buffer=20, seed=5, num_epochs=2)
    full = collect(ds, num_workers=2)
    assert_same(full, collect(ds, num_workers=1))
    per_epoch = len(full) // 2
    for n, batch in enumerate(full):
        epoch = n // per_epoch
        for record_id, noise in zip(batch["id"].tolist(), batch["noise"].tolist()):
            file, index = where_is(record_id)
            assert noise == record_generator(5, (epoch, file, index), STREAM_TRANSFORM).random()
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        head = [copied(next(feed)) for _ in range(per_epoch + 3)]
        state = feed.state()
    assert_same(head + collect(ds, num_workers=1, state=state), full)
    assert epoch_paths(ds, 0) != epoch_paths(ds, 1)                 # the records came in another order


def test_a_batch_transform_runs_after_the_transform_with_the_batchs_generator(files):
    ds = Dataset(files, SPEC, batch_size=8, transform=tx.without_rng, batch_transform=f"{NAME}:batch_noise",
                 outputs=tx.NOISY_OUTPUTS, num_epochs=2, seed=3, final_batch="pad")
    batches = collect(ds, num_workers=2)
    assert_same(batches, collect(ds, num_workers=1))
    per_epoch = len(batches) // 2
    for n, batch in enumerate(batches):
        draw = record_generator(3, (n // per_epoch, 0, n % per_epoch), STREAM_BATCH_TRANSFORM).random()
        real = ~batch["is_padding"]
        np.testing.assert_array_equal(batch["noise"][real], 0.5 + draw)
        assert not batch["noise"][~real].any()                      # the padding rows stay zero
    assert batches[0]["twice"].tolist() == [[2 * i] * 2 for i in range(8)]


def test_a_batch_transform_alone_reads_the_decoded_features(files):
    ds = Dataset(files, SPEC, batch_size=10, batch_transform=tx.summed, outputs=tx.SUMMED_OUTPUTS)
    (batch, *_), template = collect(ds, num_workers=2), ds.template()
    assert template == {"id": ((10,), np.dtype("int64")), "length": ((10,), np.dtype("int32"))}
    assert batch["length"].tolist() == [i % 5 + i % 2 for i in range(10)]


def test_a_transform_sees_decoded_images_as_views_and_writes_bfloat16(tmp_path):
    import simplejpeg

    path, rng = str(tmp_path / "images.tfrecord"), np.random.default_rng(0)
    with infeed.TFRecordWriter(path) as w:
        for i in range(6):
            pixels = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
            w.write(infeed.encode_example({"image/encoded": simplejpeg.encode_jpeg(pixels), "label": i}))
    spec = {"image": infeed.Image(size=(16, 16)), "label": FixedLen((), "int64")}
    (plain,) = collect(Dataset(path, spec, batch_size=6), num_workers=1)
    (batch,) = collect(Dataset(path, spec, batch_size=6, transform=tx.image_halves, outputs=tx.IMAGE_OUTPUTS),
                       num_workers=1)
    np.testing.assert_array_equal(batch["half"], plain["image"][:, ::2, ::2])
    assert batch["mean"].dtype.name == "bfloat16" and batch["is_view"].all()
    np.testing.assert_allclose(batch["mean"].astype(np.float32), plain["image"].mean(axis=(1, 2, 3)), rtol=1e-2)


@pytest.mark.parametrize("function, problem", [
    (tx.wrong_shape, r"output 'twice': declared shape \(2,\) int32, found shape \(3,\) int32"),
    (tx.wrong_dtype, r"output 'twice': declared dtype int32, found float64, which does not cast"),
    (tx.missing_output, r"returned no 'noise' \(declared in outputs\)"),
    (tx.extra_output, r"returned 'more', which outputs does not declare"),
    (tx.not_a_dict, r"returned a list, not a dict"),
])
def test_outputs_that_differ_from_the_declared_ones_are_errors_naming_function_output_and_record(
        files, function, problem):
    ds = Dataset(files, SPEC, batch_size=8, transform=function, outputs=tx.NOISY_OUTPUTS)
    with pytest.raises(TransformError, match=problem) as info:
        collect(ds, num_workers=1)
    e = info.value
    assert (e.function, e.path, e.record_index, e.epoch, e.batch) == (f"{NAME}:{function.__name__}", files[0], 0, 0, 0)
    assert str(e).startswith(f"{files[0]}: record 0 (epoch 0, batch 0): transform {NAME}:{function.__name__}: ")


def test_an_exception_in_a_transform_names_file_record_and_function_with_its_traceback(files):
    ds = Dataset(files, SPEC, batch_size=5, transform=tx.fails_on_seven, outputs=tx.NOISY_OUTPUTS)
    with Daemon(ds, num_workers=2, lock_memory=False, timeout=60) as feed:
        assert next(feed)["id"].tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(TransformError) as info:
            next(feed)
    e = info.value
    assert (e.path, e.record_index, e.epoch, e.batch, e.error_type) == (files[0], 7, 0, 1, "ZeroDivisionError")
    assert str(e) == (f"{files[0]}: record 7 (epoch 0, batch 1): transform {NAME}:fails_on_seven: "
                      "ZeroDivisionError: record id 7 is unlucky")
    assert "in fails_on_seven" in e.traceback and "in _check" in e.traceback
    assert any("in _check" in note for note in e.__notes__)


def test_an_exception_in_a_batch_transform_names_the_batch(files):
    ds = Dataset(files, SPEC, batch_size=5, batch_transform=tx.batch_fails, outputs=tx.SUMMED_OUTPUTS)
    with pytest.raises(TransformError, match=r"^epoch 0, batch 0: batch_transform transforms_for_tests:batch_fails: "
                                             r"RuntimeError: a batch of 5\n") as info:
        collect(ds, num_workers=1)
    assert info.value.record_index is None and "in batch_fails" in info.value.traceback


def test_a_transform_error_survives_a_round_trip_through_pickle_and_the_ring():
    import pickle

    from infeed.ring.failures import decode_failure, encode_failure

    e = TransformError("m:f", "ValueError: " + "x" * 1000, "/data/f", 3, 1, 2, "ValueError", "Traceback\n" * 1000)
    again = pickle.loads(pickle.dumps(e))
    assert (str(again), again.traceback, again.__notes__) == (str(e), e.traceback, e.__notes__)
    message, rebuilt, _ = decode_failure(encode_failure(e, 4032))
    assert isinstance(rebuilt, TransformError) and str(rebuilt) == str(e) and rebuilt.traceback == e.traceback
    assert len(e.traceback) <= TransformError.TRACEBACK_LIMIT + 3


def local_transform_factory():
    def local(example):
        return example
    return local


@pytest.mark.parametrize("transform, problem", [
    (lambda example: example, "is a lambda"),
    (local_transform_factory(), "defined inside a function"),
    ("__main__:train_transform", "in __main__, which the workers cannot import: move the function into a module"),
    (f"{NAME}:no_such_function", "cannot be imported"),
    ("no_such_module.f", "cannot be imported .*No module named 'no_such_module'"),
    (f"{NAME}:NOT_CALLABLE", "names an int, not a function"),
    (tx.takes_three, r"must take \(data\) or \(data, rng\)"),
    (3, "must be a function or its 'module:function' name"),
])
def test_functions_the_workers_cannot_import_are_refused_when_the_dataset_is_made(files, transform, problem):
    with pytest.raises(ValueError, match=problem):
        Dataset(files, SPEC, batch_size=8, transform=transform, outputs=tx.NOISY_OUTPUTS)


def test_a_function_of_main_is_refused(files):
    function = types.FunctionType(tx.without_rng.__code__, {}, "train_transform")
    function.__module__ = "__main__"
    with pytest.raises(ValueError, match="is in __main__, which the workers cannot import: move the function into"):
        Dataset(files, SPEC, batch_size=8, transform=function, outputs=tx.NOISY_OUTPUTS)


def test_outputs_are_declared_with_transforms_and_only_with_them(files):
    with pytest.raises(ValueError, match="need outputs"):
        Dataset(files, SPEC, batch_size=8, transform=tx.noisy)
    with pytest.raises(ValueError, match="neither is given"):
        Dataset(files, SPEC, batch_size=8, outputs=tx.NOISY_OUTPUTS)
    with pytest.raises(ValueError, match=r"outputs\['x'\] must be a \(shape, dtype\) pair"):
        noisy_dataset(files).replace(outputs={"x": "float32"})
    with pytest.raises(ValueError, match="dtype must be a bool, integer or float"):
        noisy_dataset(files).replace(outputs={"x": ((), "U3")})
    with pytest.raises(ValueError, match="labels .* are not outputs"):
        noisy_dataset(files, labels="name")
    with pytest.raises(ValueError, match="an output named 'is_padding'"):
        Dataset(files, SPEC, 8, transform=tx.noisy, outputs={"is_padding": ((), "bool")}, final_batch="pad")


def test_json_names_the_functions_and_the_fingerprint_follows_them(files):
    ds = Dataset(files, SPEC, batch_size=8, transform=f"{NAME}.noisy", batch_transform=tx.batch_noise,
                 outputs=tx.NOISY_OUTPUTS, labels="id")
    doc = json.loads(json.dumps(ds.to_json()))
    assert (doc["transform"], doc["batch_transform"]) == (f"{NAME}:noisy", f"{NAME}:batch_noise")
    assert doc["outputs"]["tokens"] == {"values": {"shape": [4], "dtype": "int32"},
                                        "lengths": {"shape": [], "dtype": "int32"}}
    again = Dataset.from_json(doc)
    assert again.to_json() == ds.to_json() and again.fingerprint() == ds.fingerprint()
    assert again.transform.fn is tx.noisy and again.template() == ds.template()
    plain = Dataset(files, SPEC, batch_size=8)
    assert "transform" not in plain.identity() and plain.fingerprint() != ds.fingerprint()
    other = ds.replace(transform=f"{NAME}:without_rng")
    assert other.fingerprint() != ds.fingerprint() and other.identity()["transform"] == f"{NAME}:without_rng"
    with Daemon(ds.replace(batch_transform=None), num_workers=1, lock_memory=False, timeout=60) as feed:
        next(feed)
        state = feed.state()
    with pytest.raises(ValueError, match="transform differs"):
        Daemon(other.replace(batch_transform=None), num_workers=1, lock_memory=False, state=state)


def test_the_workers_import_functions_from_the_daemons_sys_path(files, tmp_path, monkeypatch):
    (tmp_path / "elsewhere_transforms.py").write_text(
        "def plus_one(example):\n    return {'id': example['id'] + 1}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ds = Dataset(files, SPEC, batch_size=4, transform="elsewhere_transforms:plus_one", outputs={"id": ((), "int64")})
    assert collect(ds, num_workers=1)[0]["id"].tolist() == [1, 2, 3, 4]
