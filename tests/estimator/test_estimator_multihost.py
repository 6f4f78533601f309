"""Two processes on localhost through jax.distributed (gloo): each reads its shard through its own daemon,
trains one model, checkpoints and resumes both input positions, evaluates exactly, predicts its own part."""

import os
import sys
import textwrap

import pytest

import numpy as np

import infeed
from infeed.ring.orphans import ring_is_orphan

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))



WORKER = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address, pid, root, data = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    import numpy as np, optax
    import estimator as est, infeed
    sys.path.insert(0, root + "/tests/estimator")
    from test_estimator import SPEC, init_fn, logits_of, model_fn

    def make(model_dir):
        config = est.RunConfig(model_dir=model_dir, iterations_per_loop=7, save_checkpoints_steps=10,
                               distributed=True, coordinator_address=address, num_processes=2, process_id=pid,
                               infeed_workers=1)
        return est.Estimator(model_fn, init_fn, optax.adam(1e-2), config, train_batch_size=32,
                             eval_batch_size=32, predict_batch_size=32)

    train = lambda params: infeed.Dataset([data + "/train-0.tfrecord", data + "/train-1.tfrecord"], SPEC,
                                          batch_size=params["batch_size"], labels="label", shuffle_buffer=50,
                                          num_epochs=None)
    evaluate = lambda params: infeed.Dataset([data + "/eval-0.tfrecord", data + "/eval-1.tfrecord"], SPEC,
                                             batch_size=params["batch_size"], labels="label")
    whole = make(data + "/whole").train(train, max_steps=40)       # the first Estimator starts jax.distributed
    assert jax.process_count() == 2 and len(jax.devices()) == 8
    make(data + "/split").train(train, max_steps=20)
    resumed = make(data + "/split").train(train, max_steps=40)
    result = whole.evaluate(evaluate)
    preds = [int(p["class"]) for p in whole.predict(evaluate)]
    print(json.dumps({"whole": jax.tree.map(lambda x: np.asarray(x).tolist(), whole.get_variables()),
                      "resumed": jax.tree.map(lambda x: np.asarray(x).tolist(), resumed.get_variables()),
                      "eval": result, "predictions": preds}), flush=True)
""")


@pytest.mark.serial
def test_two_processes_train_resume_evaluate_and_predict(tmp_path, run_two_processes):
    sys.path.insert(0, HERE)
    from test_estimator import logits_of, make_data

    x, y = make_data(600)
    ex, ey = make_data(257, seed=1)
    shards = {"train-0": range(0, 300), "train-1": range(300, 600)}
    for name, rows in shards.items():
        with infeed.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
            for i in rows:
                w.write(infeed.encode_example({"x": x[i], "label": [int(y[i])]}))
    for name, rows in {"eval-0": range(0, 150), "eval-1": range(150, 257)}.items():   # uneven: 10 and 7 batches of 16
        with infeed.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
            for i in rows:
                w.write(infeed.encode_example({"x": ex[i], "label": [int(ey[i])]}))

    segments = set(os.listdir("/dev/shm"))
    results = run_two_processes(WORKER, ROOT, str(tmp_path), timeout=240)

    first, second = results
    for got in results:                      # one model: the same on both processes, resumed exactly
        for name, value in first["whole"]["params"].items():
            np.testing.assert_allclose(got["whole"]["params"][name], value, rtol=1e-6)
            np.testing.assert_allclose(got["resumed"]["params"][name], value, rtol=1e-5, atol=1e-6)
    variables = {"params": {k: np.asarray(v, np.float32) for k, v in first["whole"]["params"].items()}}
    want = np.asarray(logits_of(variables, ex)).argmax(-1)
    for got in results:                      # exact over both shards, the shorter one padded
        assert got["eval"]["examples"] == 257 and got["eval"]["global_step"] == 40
        assert abs(got["eval"]["accuracy"] - np.mean(want == ey)) < 1e-6
    assert first["predictions"] == want[:150].tolist()          # each process: its own shard, padding removed
    assert second["predictions"] == want[150:].tolist()
    # no ring left behind by the two processes: a new one whose creator is gone (another test process's live
    # rings may come and go meanwhile)
    assert not [n for n in set(os.listdir("/dev/shm")) - segments
                if n.startswith(f"infeed-{os.getuid()}-") and ring_is_orphan(os.path.join("/dev/shm", n))]
