"""compile_loop on 8 CPU devices: same results as one device, donation, caching, errors, inspection."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import xla_runtime as xr
from xla_runtime.collectives import cross_replica_mean
from xla_runtime.loop import compile_loop
from xla_runtime.mesh import make_mesh

K, B, D, H = 6, 16, 5, 8


def init(seed=0):
    rng = np.random.default_rng(seed)
    return {"w1": jnp.asarray(rng.normal(size=(D, H)), jnp.float32), "b1": jnp.zeros(H, jnp.float32),
            "w2": jnp.asarray(rng.normal(size=(H, 1)), jnp.float32)}


def loss_fn(params, batch):
    hidden = jnp.tanh(batch["x"] @ params["w1"] + params["b1"])
    return jnp.mean(((hidden @ params["w2"])[:, 0] - batch["y"]) ** 2)


def sgd_step(params, batch):
    loss, grads = jax.value_and_grad(loss_fn)(params, batch)
    params = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
    return params, {"loss": loss, "grad_w1": grads["w1"]}


def batches(steps=K, seed=1):
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(size=(steps, B, D)).astype(np.float32), "y": rng.normal(size=(steps, B)).astype(np.float32)}


def one_device():
    return make_mesh({"data": 1}, jax.devices()[:1])


def run(mesh, **kw):
    loop = compile_loop(sgd_step, K, mesh, **kw)
    params, out = loop(init(), batches())
    return jax.device_get(params), jax.device_get(out)


def assert_close(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6)


def test_data_parallel_and_2d_meshes_match_one_device():
    assert len(jax.devices()) == 8
    want = run(one_device())
    assert_close(run(make_mesh({"data": -1})), want)
    two_d = make_mesh({"data": 4, "model": 2})
    assert_close(run(two_d, state_sharding=[(r"w1", P(None, "model")), (r"w2", P("model", None))]), want)
    assert_close(run(two_d, state_sharding={"w1": P(None, "model"), "b1": P("model"), "w2": P()}), want)


def test_data_parallel_gradients_equal_single_device_gradients():
    """Sharded jit all-reduces the gradients of a mean loss: no cross-shard optimizer needed."""
    single = run(one_device())[1]["grad_w1"]
    sharded = run(make_mesh({"data": 8}))[1]["grad_w1"]
    np.testing.assert_allclose(sharded, single, rtol=2e-5, atol=2e-6)


def test_cross_replica_mean_under_shard_map_matches_the_global_gradient():
    mesh = make_mesh({"data": 8})

    def per_shard(params, batch):
        grads = jax.grad(loss_fn)(params, batch)
        return cross_replica_mean(grads)

    batch = jax.tree.map(lambda x: x[0], batches())
    want = jax.grad(loss_fn)(init(), batch)
    grads = jax.jit(jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(),
                                  check_vma=False))(init(), batch)
    assert_close(grads, want)
    # With check_vma=True (the default) JAX itself sums the gradients of replicated parameters over the axis.
    summed = jax.jit(jax.shard_map(lambda p, b: jax.grad(loss_fn)(p, b), mesh=mesh, in_specs=(P(), P("data")),
                                   out_specs=P()))(init(), batch)
    assert_close(jax.tree.map(lambda g: g / 8, summed), want)


def test_state_is_donated_and_the_new_state_keeps_its_sharding():
    mesh = make_mesh({"data": 4, "model": 2})
    loop = compile_loop(sgd_step, K, mesh, state_sharding=[("w1", P(None, "model"))])
    params = jax.device_put(init(), {"w1": NamedSharding(mesh, P(None, "model")),
                                     "b1": NamedSharding(mesh, P()), "w2": NamedSharding(mesh, P())})
    new, _ = loop(params, batches())
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(params))
    assert new["w1"].sharding.spec == P(None, "model")
    again, _ = loop(new, batches(seed=2))
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(new)) and not again["w1"].is_deleted()
    kept = init()
    compile_loop(sgd_step, K, mesh, donate_state=False)(kept, batches())
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(kept))


def test_one_compilation_per_shape_and_one_for_the_final_partial_loop():
    loop = compile_loop(sgd_step, K, make_mesh({"data": -1}))
    params = init()
    for seed in range(3):
        params, _ = loop(params, batches(seed=seed))
    for seed in range(2):
        params, out = loop(params, batches(steps=2, seed=seed))
    assert out["loss"].shape == (2,)
    assert loop.compilations == 2 and len(loop.compile_seconds) == 2
    assert loop.steps_run == 3 * K + 2 * 2
    assert loop.time_to_first_step is not None and loop.time_to_first_step >= loop.compile_seconds[0]


def test_xla_compiles_one_program_whatever_placement_the_calls_pass():
    """The first call places the state and step index itself; later calls pass the previous
    call's device outputs, or start at a chosen step: XLA compiles the loop once (counted by
    jax's own compile events, not only by the loop's counter)."""
    loop = compile_loop(sgd_step, K, make_mesh({"data": -1}))
    params = jax.block_until_ready(init())
    data = [batches(seed=seed) for seed in range(6)]
    on_devices = jax.device_put(data[5], NamedSharding(loop.mesh, P(None, "data")))
    with xr.CompileWatch() as watch:                  # jax.monitoring's backend compile events
        for seed in range(3):
            params, _ = loop(params, data[seed])
        params, _ = loop(params, data[4], first_step=100)
        params, _ = loop(params, on_devices)
        jax.block_until_ready(params)
    assert loop.compilations == 2 == watch.programs   # numpy batches, then batches already on the devices
    assert loop.steps_run == 100 + 2 * K


def test_the_result_of_a_split_run_equals_one_long_run():
    whole = run(make_mesh({"data": -1}))[0]
    loop = compile_loop(sgd_step, 4, make_mesh({"data": -1}))
    params, data = init(), batches()
    params, _ = loop(params, jax.tree.map(lambda x: x[:4], data))
    params, _ = loop(params, jax.tree.map(lambda x: x[4:], data))
    assert_close(jax.device_get(params), whole)


def test_a_batch_that_does_not_split_over_the_data_axis_is_named():
    loop = compile_loop(sgd_step, K, make_mesh({"data": 8}))
    bad = {"x": np.zeros((K, 12, D), np.float32), "y": np.zeros((K, 12), np.float32)}
    with pytest.raises(ValueError, match=r"batch leaf \['x'\] has shape \(6, 12, 5\): dimension 1 \(12\) does not "
                                         r"divide by mesh axis 'data' of size 8"):
        loop(init(), bad)


def test_a_state_whose_structure_changed_is_refused_with_the_leaf():
    loop = compile_loop(sgd_step, K, make_mesh({"data": -1}), donate_state=False)
    loop(init(), batches())
    changed = dict(init(), w2=jnp.zeros((H, 2)))
    with pytest.raises(ValueError, match=r"state leaf \['w2'\] changed between calls: shape \(8, 1\)"):
        loop(changed, batches())
    with pytest.raises(ValueError, match="structure changed"):
        loop({"w1": init()["w1"]}, batches())
    with pytest.raises(ValueError, match="stack 7 steps"):
        loop(init(), batches(steps=7))


def test_check_finite_names_the_output_and_the_step():
    def step(state, batch):
        return state + 1, {"ratio": batch["x"] / batch["d"], "count": state}
    loop = compile_loop(step, 4, make_mesh({"data": -1}), check_finite=True)
    d = np.ones((4, 8), np.float32)
    d[2, 5] = 0
    with pytest.raises(FloatingPointError, match=r"output \['ratio'\] \(shape \(8,\) per step\) is not finite "
                                                 r"at step 2"):
        loop(jnp.int32(0), {"x": np.ones((4, 8), np.float32), "d": d})
    state, out = loop(jnp.int32(0), {"x": np.ones((4, 8), np.float32), "d": np.ones((4, 8), np.float32)})
    assert int(state) == 4


def test_inspection_of_the_compiled_program():
    loop = compile_loop(sgd_step, K, make_mesh({"data": -1}))
    with pytest.raises(RuntimeError, match="call it once"):
        loop.as_text()
    loop(init(), batches())
    assert loop.cost_analysis()["flops"] > 0
    assert loop.memory_analysis().argument_size_in_bytes > 0
    assert "HloModule" in loop.as_text() and "while" in loop.as_text()


def test_the_step_index_is_in_the_program_only_where_the_step_reads_it():
    """An index returned to the host costs every call (a few us: on a tiny model, a few % of a 100-step loop)."""
    def root_of(loop):
        text = loop.as_text()
        return next(line for line in text[text.index("ENTRY"):].splitlines() if "ROOT" in line)

    def plain(total, batch):
        xr.host_call(lambda t: None, total, after_loop=True)            # numbered on the host: reads no index
        return total + batch.sum(), ()

    def reading(total, batch):
        return total + batch.sum() * xr.current_step(), ()

    mesh, x = make_mesh({"data": 1}, jax.devices()[:1]), np.ones((3, 4), np.float32)
    loops = {step: compile_loop(step, 3, mesh, batch_sharding=None) for step in (plain, reading)}
    totals = {step: jnp.float32(0) for step in loops}
    for first in (0, 3, 10, 13):                # a jump (10), then on from where that loop ended
        for step, loop in loops.items():
            totals[step], _ = loop(totals[step], x, first_step=first if first in (0, 10) else None)
    xr.wait_for_host_calls()
    assert "s32[]" not in root_of(loops[plain]) and "s32[]" in root_of(loops[reading])
    assert float(totals[plain]) == 48 and float(totals[reading]) == 4 * sum([0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15])


def test_package_exports_what_the_readme_shows():
    mesh = xr.make_mesh({"data": -1, "model": 1})
    assert dict(mesh.shape) == {"data": 8, "model": 1}
    assert xr.replicated(mesh).spec == P()
    with pytest.raises(ValueError, match="needs 6 devices"):
        xr.make_mesh({"data": 3, "model": 2})


def test_host_calls_from_a_compiled_loop_on_8_devices_arrive_in_order_and_every_n():
    seen, sparse = [], []

    def step(state, batch):
        state = state + batch["x"].sum()
        xr.host_call(lambda s, total: seen.append((int(s), float(total))), xr.current_step(), state)
        xr.every_n(4, lambda i, x: sparse.append((i, x.shape)), batch["x"])
        return state, {}

    loop = compile_loop(step, 5, make_mesh({"data": -1}))
    state = jnp.float32(0)
    for _ in range(2):
        state, _ = loop(state, {"x": np.ones((5, 8, 2), np.float32)})
    jax.block_until_ready(state)
    assert seen == [(i, 16.0 * (i + 1)) for i in range(10)]
    assert sparse == [(0, (8, 2)), (4, (8, 2)), (8, (8, 2))]


def test_a_failing_host_call_is_raised_by_the_loop():
    def step(state, batch):
        xr.host_call(lambda s: 1 / 0 if int(s) == 2 else None, xr.current_step())
        return state + 1, {}

    loop = compile_loop(step, 4, make_mesh({"data": -1}))
    with pytest.raises(xr.HostCallError) as info:
        loop(jnp.int32(0), {"x": np.zeros((4, 8), np.float32)})
    assert info.value.step == 2 and isinstance(info.value.__cause__, ZeroDivisionError)
