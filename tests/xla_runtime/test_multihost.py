"""Two processes on localhost through jax.distributed (gloo): one data-parallel loop over a global mesh."""

import os
import textwrap

import jax
import numpy as np

from xla_runtime.loop import compile_loop
from xla_runtime.mesh import make_mesh

WORKER = textwrap.dedent("""
    import json, sys
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2, process_id=int(sys.argv[2]),
                               initialization_timeout=60)
    import numpy as np
    import xla_runtime as xr
    sys.path.insert(0, sys.argv[3])
    from test_loop import K, batches, init, sgd_step

    assert jax.process_count() == 2 and len(jax.devices()) == 8 and len(jax.local_devices()) == 4
    mesh = xr.make_mesh({"data": -1})
    seen = []

    def step(params, batch):
        params, out = sgd_step(params, batch)
        xr.host_call(lambda s, x: seen.append([int(s), x.shape[0], float(x.sum())]), xr.current_step(),
                     batch["x"], after_loop=True)
        return params, out

    loop = xr.compile_loop(step, K, mesh)
    pid = jax.process_index()
    mine = lambda tree: {k: v[:, pid * 8:(pid + 1) * 8] for k, v in tree.items()}   # this host's half
    params, out = loop(init(), mine(batches()))
    params, out = loop(params, mine(batches(seed=2)))
    xr.wait_for_host_calls()
    result = {k: np.asarray(v.addressable_data(0)).tolist() for k, v in params.items()}
    print(json.dumps({**result, "after_loop_calls": seen}), flush=True)
""")



def test_two_processes_train_like_one(run_two_processes):
    from test_loop import K, batches, init, sgd_step

    loop = compile_loop(sgd_step, K, make_mesh({"data": -1}))
    params, _ = loop(init(), batches())
    params, _ = loop(params, batches(seed=2))
    want = jax.device_get(params)

    here = os.path.dirname(os.path.abspath(__file__))
    results = run_two_processes(WORKER, here)
    for got in results:
        for name, value in want.items():
            np.testing.assert_allclose(np.asarray(got[name]), value, rtol=2e-5, atol=2e-6)
    # after-loop host calls: on process 0 only, step by step, each with the whole global batch (both halves)
    whole = [*batches()["x"], *batches(seed=2)["x"]]
    assert results[1]["after_loop_calls"] == []
    assert [c[:2] for c in results[0]["after_loop_calls"]] == [[s, 16] for s in range(2 * K)]
    np.testing.assert_allclose([c[2] for c in results[0]["after_loop_calls"]], [x.sum() for x in whole], rtol=1e-4)
