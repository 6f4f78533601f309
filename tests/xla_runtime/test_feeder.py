"""Feeder: host batches to sharded device arrays on a thread, ahead of the consumer, slots released safely."""

import textwrap
import threading
import time

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import infeed
from xla_runtime.feeder import Feeder


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(8), ("data",))


@pytest.fixture(scope="module")
def mesh2d():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def aligned(shape, dtype):
    """Zeros in 64-byte aligned memory, as every array of a ring slot is."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def host_batch(k, rows=16):
    return {"image": np.arange(rows * 4, dtype=np.float32).reshape(rows, 4) + 1000 * k,
            "label": np.arange(rows, dtype=np.int32) + k,
            "tokens": infeed.Padded(np.full((rows, 5), k, np.int32), np.arange(rows, dtype=np.int32) % 5)}


def assert_tree_equal(device, host):
    assert jax.tree_util.tree_structure(device) == jax.tree_util.tree_structure(host)
    for d, h in zip(jax.tree_util.tree_leaves(device), jax.tree_util.tree_leaves(host)):
        np.testing.assert_array_equal(np.asarray(d), h)


class Slot(dict):
    """A fake ring-slot batch: views into a buffer the producer refills once the batch is released."""

    def __init__(self, arrays, on_release):
        super().__init__(arrays)
        self.on_release = on_release

    def release(self):
        self.on_release(self)


class Ring:
    """A source of ``n`` Slot batches over ``slots`` reused aligned buffers; release overwrites with garbage."""

    def __init__(self, n=None, slots=2, rows=16):
        self.n, self.rows = n, rows
        self.buffers = [{"x": aligned((rows, 128), np.float32), "id": aligned((rows,), np.int64)} for _ in range(slots)]
        self.taken, self.released = 0, []

    def __iter__(self):
        k = 0
        while self.n is None or k < self.n:
            buf = self.buffers[k % len(self.buffers)]
            buf["x"][:] = k
            buf["id"][:] = np.arange(self.rows) + 100 * k
            self.taken += 1
            yield Slot(buf, self.release)
            k += 1

    def release(self, batch):
        for a in batch.values():
            a.fill(-1)                  # a worker refilling the slot
        self.released.append(int(self.taken))


def test_device_batches_equal_host_batches_and_carry_the_sharding(mesh):
    with Feeder((host_batch(k) for k in range(4)), mesh, P("data")) as feeder:
        got = list(feeder)
    assert len(got) == 4 and feeder.stats.batches == 4
    want = NamedSharding(mesh, P("data"))
    for k, batch in enumerate(got):
        assert_tree_equal(batch, host_batch(k))
        assert isinstance(batch["tokens"], infeed.Padded)
        for leaf in jax.tree_util.tree_leaves(batch):
            assert isinstance(leaf, jax.Array) and leaf.sharding == want
            assert sorted(s.index[0].start for s in leaf.addressable_shards) == list(range(0, 16, 2))


def test_two_axis_mesh_splits_on_data_and_replicates_on_model(mesh2d):
    spec = {"image": P("data", "model"), "label": P("data"), "tokens": P("data")}
    with Feeder((host_batch(k) for k in range(2)), mesh2d, spec, prefetch=1) as feeder:
        got = list(feeder)
    for k, batch in enumerate(got):
        assert_tree_equal(batch, host_batch(k))
        label = batch["label"]
        assert label.sharding == NamedSharding(mesh2d, P("data"))
        assert {s.data.shape for s in label.addressable_shards} == {(4,)}
        assert sorted(s.replica_id for s in label.addressable_shards) == [0, 0, 0, 0, 1, 1, 1, 1]
        assert {s.data.shape for s in batch["image"].addressable_shards} == {(4, 2)}


def test_a_named_sharding_and_the_multihost_path_in_one_process(mesh, monkeypatch):
    monkeypatch.setattr(jax, "process_count", lambda: 2)     # make_array_from_process_local_data, one process
    with Feeder((host_batch(k) for k in range(2)), mesh, NamedSharding(mesh, P("data"))) as feeder:
        assert feeder._multihost
        for k, batch in enumerate(feeder):
            assert_tree_equal(batch, host_batch(k))
            assert batch["image"].sharding == NamedSharding(mesh, P("data"))


def test_cpu_device_put_alone_would_alias_a_slot(mesh):
    """The hazard the Feeder's copy removes: in jax 0.10.2 on CPU, device_put of 64-byte aligned numpy memory
    aliases it even with may_alias=False (jax-ml/jax#37830). If this starts failing after a JAX upgrade,
    may_alias=False may now be honoured and the Feeder's host copy could use it instead."""
    slot = aligned((16, 128), np.float32)
    slot[:] = 1
    put = jax.device_put(slot, NamedSharding(mesh, P("data")), may_alias=False).block_until_ready()
    slot[:] = -1
    assert (np.asarray(put) == -1).all()


def test_a_released_slot_can_be_overwritten_at_once(mesh):
    ring = Ring(n=12, slots=2)
    with Feeder(ring, mesh, P("data"), prefetch=3) as feeder:
        got = list(feeder)
    assert ring.released == list(range(1, 13))       # each batch released before the next was taken
    for k, batch in enumerate(got):                  # every slot was refilled, then overwritten with -1
        np.testing.assert_array_equal(np.asarray(batch["x"]), np.full((16, 128), k, np.float32))
        np.testing.assert_array_equal(np.asarray(batch["id"]), np.arange(16) + 100 * k)
        slot = ring.buffers[k % 2]["x"]
        for shard in batch["x"].addressable_shards:
            assert not slot.ctypes.data <= shard.data.unsafe_buffer_pointer() < slot.ctypes.data + slot.nbytes


def test_host_copies_reuse_memory_only_once_no_device_array_or_computation_uses_it(mesh):
    """On CPU the device arrays alias the feeder's copies: a copy's memory is reused for a later batch only
    after every device array on it, and every computation reading it, is gone."""
    ring = Ring(n=12, slots=2)
    total = jax.jit(lambda x: x.sum())
    with Feeder(ring, mesh, P("data"), prefetch=2) as feeder:
        kept, sums = [], []
        for k, batch in enumerate(feeder):
            sums.append(total(batch["x"]))               # in flight; the batch itself dropped unless kept
            if k % 3 == 0:
                kept.append((k, batch))
        buffers = feeder._buffers
    for k, batch in kept:                               # alive all along: never written over
        np.testing.assert_array_equal(np.asarray(batch["x"]), np.full((16, 128), k, np.float32))
    assert [float(s) for s in sums] == [16 * 128 * k for k in range(12)]
    # At least one buffer a kept batch's "x" (its "id" too where the device array aliases it: jax 0.10, not 0.7).
    assert buffers.reused > 0 and buffers.allocated >= 4


@pytest.mark.serial
def test_transfer_overlaps_compute(mesh):
    n, pause = 8, 0.05
    requested, computed = [], []

    def slow_source():
        for k in range(n):
            requested.append(time.perf_counter())        # the thread starts on batch k
            time.sleep(pause)
            yield host_batch(k)

    began = time.perf_counter()
    with Feeder(slow_source(), mesh, P("data")) as feeder:
        for batch in feeder:
            time.sleep(pause)                             # the compiled loop's compute
            computed.append(time.perf_counter())
    elapsed, serial = time.perf_counter() - began, 2 * n * pause
    assert len(computed) == n
    assert elapsed < 0.8 * serial, (elapsed, serial)
    # The input of loop k+1 is under way while loop k computes.
    assert all(requested[k + 1] < computed[k] for k in range(n - 1)), (requested, computed)
    assert feeder.stats.source_s > (n - 1) * pause and feeder.stats.transfer_s > 0


def test_source_errors_are_raised_at_their_batch(mesh):
    def failing():
        for k in range(3):
            yield host_batch(k)
        raise infeed.WorkerDied(1234, signal=9, detail="while batch 3 was awaited")

    feeder = Feeder(failing(), mesh, P("data"))
    assert [int(b["label"][0]) for b in (next(feeder), next(feeder), next(feeder))] == [0, 1, 2]
    with pytest.raises(infeed.WorkerDied) as e:
        next(feeder)
    assert e.value.pid == 1234 and e.value.signal == 9
    with pytest.raises(StopIteration):
        next(feeder)
    feeder.close()


def test_a_dimension_that_does_not_divide_by_its_mesh_axis_is_named(mesh, mesh2d):
    ring = Ring(n=1, rows=16)
    batches = [next(iter(ring)), {"image": np.zeros((12, 784), np.float32)}, host_batch(9)]
    with Feeder(iter(batches), mesh, P("data")) as feeder:
        assert next(feeder)["x"].shape == (16, 128)
        with pytest.raises(ValueError, match=r"^batch leaf 'image' has shape \(12, 784\): dimension 0 \(12\) "
                                             r"does not divide by mesh axis 'data' of size 8$"):
            next(feeder)
        assert list(feeder) == []
    assert ring.released == [1]
    odd = {"tokens": infeed.Padded(np.zeros((8, 6), np.int32), np.zeros(8, np.int32))}
    with Feeder(iter([odd]), mesh2d, P(None, ("data", "model"))) as feeder, \
            pytest.raises(ValueError, match=r"leaf 'tokens.values' has shape \(8, 6\): dimension 1 \(6\) does not "
                                            r"divide by mesh axes \('data', 'model'\) of size 8"):
        next(feeder)
    with Feeder(iter([odd]), mesh, {"label": P("data")}) as feeder, \
            pytest.raises(ValueError, match=r"batch_sharding .* does not fit the batch"):
        next(feeder)


@pytest.mark.serial
def test_close_mid_stream_releases_slots_and_stops_the_thread(mesh):
    ring = Ring(n=None, slots=3)                        # endless
    feeder = Feeder(ring, mesh, P("data"), prefetch=2)
    first = next(feeder)
    time.sleep(0.2)                                     # the thread fills its prefetch room
    began = time.perf_counter()
    feeder.close()
    assert time.perf_counter() - began < 1.0
    assert not feeder._thread.is_alive()
    assert ring.taken == len(ring.released) == 3        # the batch handed over and 2 ahead, all released
    assert feeder._ready.empty()
    with pytest.raises(StopIteration):
        next(feeder)
    np.testing.assert_array_equal(np.asarray(first["x"]), np.zeros((16, 128), np.float32))


@pytest.mark.serial
def test_close_does_not_wait_for_a_stuck_source(mesh):
    gate, released = threading.Event(), []

    class Stuck(dict):
        def release(self):
            released.append(True)

    def source():
        gate.wait(10)                                   # a daemon that has no batch yet
        yield Stuck(host_batch(0))

    feeder = Feeder(source(), mesh, P("data"))
    time.sleep(0.1)
    began = time.perf_counter()
    feeder.close(timeout=0.2)
    assert time.perf_counter() - began < 1.0 and feeder._thread.is_alive()
    gate.set()                                          # the batch arrives after close: released, not fed
    feeder._thread.join(5)
    assert not feeder._thread.is_alive() and released == [True] and feeder._ready.empty()


def record(i):
    return infeed.encode_example({"x": [i, i + 0.5, -i], "id": [i], "tokens": list(range(i % 5))})


SPEC = {"x": infeed.FixedLen((3,), "float32"), "id": infeed.FixedLen((), "int64"),
        "tokens": infeed.VarLen("int32", max_len=4)}
#: The same features in the narrow dtypes the decoder converts to: half and a quarter of the bytes.
NARROW_SPEC = {"x": infeed.FixedLen((3,), "bfloat16"), "id": infeed.FixedLen((), "int64"),
               "tokens": infeed.VarLen("uint8", max_len=4)}


@pytest.mark.parametrize("spec", [SPEC, NARROW_SPEC], ids=["wide", "narrow"])
def test_daemon_end_to_end(mesh, tmp_path, spec):
    records, paths = [record(i) for i in range(100)], []
    for k in range(2):
        paths.append(str(tmp_path / f"train-{k}.tfrecord"))
        with infeed.TFRecordWriter(paths[-1]) as w:
            for r in records[50 * k:50 * (k + 1)]:
                w.write(r)
    ds = infeed.Dataset(paths, spec, batch_size=16, final_batch="pad")
    states = []
    with infeed.Daemon(ds, num_workers=2, slots=2, lock_memory=False, timeout=60) as feed, \
            Feeder(feed, mesh, P("data"), prefetch=2) as feeder:
        got = []
        for batch in feeder:
            got.append(batch)
            states.append(feeder.state()["batch"])
    assert len(got) == 7 and states == list(range(1, 8))
    for k, batch in enumerate(got):
        chunk = records[16 * k:16 * (k + 1)]
        want = infeed.ExampleParser(spec).allocate(16)
        infeed.ExampleParser(spec).parse(chunk, out=want)
        want["is_padding"] = np.arange(16) >= len(chunk)
        if len(chunk) == 16:
            assert_tree_equal({k: v for k, v in want.items() if k != "is_padding"}, infeed.parse_examples(chunk, spec))
        assert_tree_equal(batch, want)
        assert batch["x"].sharding == NamedSharding(mesh, P("data"))
        assert batch["x"].dtype == spec["x"].dtype and batch["tokens"].values.dtype == spec["tokens"].dtype


WORKER = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                               initialization_timeout=60)
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from xla_runtime.feeder import Feeder

    pid = jax.process_index()
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("data",))
    full = [np.arange(48, dtype=np.float32).reshape(16, 3) + 100 * k for k in range(3)]
    sums = []
    with Feeder(({"x": f[8 * pid:8 * (pid + 1)]} for f in full), mesh, P("data")) as feeder:
        for k, batch in enumerate(feeder):
            x = batch["x"]
            assert x.shape == (16, 3) and len(x.addressable_shards) == 4
            for shard in x.addressable_shards:
                np.testing.assert_array_equal(np.asarray(shard.data), full[k][shard.index])
            sums.append(float(jax.jit(lambda a: a.sum(), out_shardings=None)(x)))
    with Feeder(iter([{"x": np.zeros((6, 3), np.float32)}]), mesh, P("data")) as feeder:
        try:
            next(feeder)
        except ValueError as e:
            error = str(e)
    print(json.dumps({"sums": sums, "error": error}), flush=True)
""")



def test_two_processes_assemble_the_global_batch(run_two_processes):
    results = run_two_processes(WORKER)
    for got in results:
        assert got["sums"] == [float((np.arange(48) + 100 * k).sum()) for k in range(3)]
        assert got["error"] == ("batch leaf 'x' has shape (6, 3): dimension 0 (6) does not divide by the 4 parts "
                                "of mesh axis 'data' (size 8) on this process's devices")


def test_the_wait_for_the_first_batch_is_counted_apart(mesh):
    def slow_start():
        time.sleep(0.3)                 # a daemon's workers starting
        yield from (host_batch(k) for k in range(3))

    with Feeder(slow_start(), mesh, P("data")) as feeder:
        assert len(list(feeder)) == 3
    assert feeder.stats.first_wait_s >= 0.25 and feeder.stats.wait_s >= feeder.stats.first_wait_s
