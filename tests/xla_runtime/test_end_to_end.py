"""TFRecords -> infeed.Daemon -> Feeder -> compile_loop on 8 devices: the same training as from memory."""

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import infeed
import xla_runtime as xr
from test_loop import D, assert_close, init, sgd_step


def test_training_from_the_daemon_equals_training_from_memory(tmp_path):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(200, D)).astype(np.float32), rng.normal(size=200).astype(np.float32)
    paths = []
    for k in range(2):
        paths.append(str(tmp_path / f"part-{k}.tfrecord"))
        with infeed.TFRecordWriter(paths[-1]) as w:
            for i in range(k * 100, k * 100 + 100):
                w.write(infeed.encode_example({"x": x[i], "y": [y[i]]}))
    spec = {"x": infeed.FixedLen((D,), "float32"), "y": infeed.FixedLen((), "float32")}
    ds = infeed.Dataset(paths, spec, batch_size=16, steps_per_slot=5, num_epochs=2)   # 12 batches an epoch

    mesh = xr.make_mesh({"data": -1})
    loop = xr.compile_loop(sgd_step, 5, mesh)
    params = init()
    with infeed.Daemon(ds, num_workers=2, slots=4, lock_memory=False, timeout=60) as feed, \
            xr.Feeder(feed, mesh, P(None, "data")) as feeder:
        for batches in feeder:
            params, out = loop(params, batches)
        state = feeder.state()
    assert loop.compilations == 2                 # 24 batches: 4 slots of 5 steps, then one of 4
    assert state["epoch"] == 2 and loop.steps_run == 24

    want = xr.compile_loop(sgd_step, 5, mesh)
    expected = init()
    order = np.concatenate([np.arange(192), np.arange(192)]).reshape(24, 16)
    for start in range(0, 24, 5):
        idx = order[start:start + 5]
        expected, _ = want(expected, {"x": x[idx], "y": y[idx]})
    assert_close(jax.device_get(params), jax.device_get(expected))
