"""HostBuffers: a copy's memory is reused only once nothing can read it, on any Python's reference counts."""

import random
import sys

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xla_runtime.feeder import Feeder
from xla_runtime.host_buffers import ALIGN, HostBuffers


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()).reshape(8), ("data",))


@pytest.fixture
def no_reference_counts(monkeypatch):
    """An interpreter whose counts say nothing references anything (3.14 reads lower than 3.13): lifetimes
    must not be decided by them."""
    monkeypatch.setattr(sys, "getrefcount", lambda obj: 0)


def test_copies_are_aligned_equal_and_of_the_leafs_dtype_and_shape():
    pool = HostBuffers(per_size=2)
    for leaf in (np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.arange(5, dtype=np.int64),
                 np.array(7, np.int32), np.zeros((0, 3), np.float32),
                 np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(3, 2),
                 np.arange(12, dtype=np.uint8).reshape(3, 4)[:, ::2]):          # not contiguous
        out = pool.copy(leaf)
        assert out.dtype == leaf.dtype and out.shape == leaf.shape and out.flags.writeable
        assert out.ctypes.data % ALIGN == 0 or leaf.nbytes == 0
        np.testing.assert_array_equal(out, leaf)


def test_a_copy_any_view_of_it_keeps_its_memory_from_reuse(no_reference_counts):
    """Views of views, reshapes and np.asarray of a copy all hold it; only once the last goes is it reused."""
    pool = HostBuffers(per_size=1)
    first = pool.copy(np.arange(8.0))
    views = [first[2:], first.reshape(2, 4)[1], np.asarray(first)[::3], first.view(np.int64)[:1]]
    del first
    for k in range(20):
        pool.copy(np.full(8, -k, np.float64))                   # new memory each time: the kept one is in use
        np.testing.assert_array_equal(views[0], np.arange(2.0, 8.0))
    assert pool.reused == 0 and pool.free_count(64) == 0
    while views:
        views.pop()
        assert pool.free_count(64) == (0 if views else 1)
    pool.copy(np.zeros(8))
    assert pool.reused == 1


def test_memory_comes_back_only_to_the_size_it_was_kept_for_and_up_to_per_size():
    pool = HostBuffers(per_size=2)
    copies = [pool.copy(np.zeros(4, np.float32)) for _ in range(3)]      # the third is not kept
    del copies
    assert pool.free_count(16) == 2 and pool.free_count(32) == 0
    pool.copy(np.zeros(8, np.float32))
    assert pool.reused == 0
    a, b, c = (pool.copy(np.zeros(4, np.float32)) for _ in range(3))
    assert pool.reused == 2 and pool.allocated == 5
    with pytest.raises(ValueError, match="per_size"):
        HostBuffers(per_size=-1)


def test_device_arrays_kept_across_many_reuses_hold_what_was_fed(mesh, no_reference_counts):
    """The Feeder on CPU devices: device arrays alias its copies. Some batches (and slices of them, and host views
    of them) are kept alive while a hundred others go through reused memory; each holds what was fed."""
    rng = random.Random(0)

    def fed(k):
        return {"x": np.full((16, 128), k, np.float32), "id": np.arange(16, dtype=np.int32) + 100 * k}

    kept, in_flight = [], []
    total = jax.jit(lambda x: x.sum())
    with Feeder((fed(k) for k in range(100)), mesh, P("data"), prefetch=1) as feeder:
        for k, batch in enumerate(feeder):
            in_flight.append((k, total(batch["x"])))
            if rng.random() < 0.1:
                kept.append((k, batch, batch["x"][3:], np.asarray(batch["id"])[5:]))
            if len(in_flight) > 4:
                in_flight.pop(0)
            for j, s in in_flight[:1]:
                assert float(s) == 16 * 128 * j
        buffers = feeder._buffers
    assert len(kept) >= 5 and buffers.reused > 50
    for k, batch, tail, ids in kept:
        np.testing.assert_array_equal(np.asarray(batch["x"]), fed(k)["x"])
        np.testing.assert_array_equal(np.asarray(batch["id"]), fed(k)["id"])
        np.testing.assert_array_equal(np.asarray(tail), fed(k)["x"][3:])
        np.testing.assert_array_equal(ids, fed(k)["id"][5:])
        assert batch["x"].sharding == NamedSharding(mesh, P("data"))
