"""current_step, host_call and every_n inside a jitted lax.scan (as compile_loop builds it), on 1 and 8 CPU devices."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from xla_runtime.context import current_step, in_loop
from xla_runtime.host_calls import HostCallError, every_n, host_call, raise_host_call_error

K, B, D = 6, 16, 4

MESHES = {
    "1 device": lambda: (Mesh(np.array(jax.devices()[:1]), ("data",)), P(None, "data")),
    "8 x data": lambda: (Mesh(np.array(jax.devices()).reshape(8), ("data",)), P(None, "data")),
    "4 data x 2 model": lambda: (Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model")),
                                 P(None, "data", "model")),
}


def compiled_loop(step):
    """What xla_runtime.compile_loop does: one program scanning ``step`` over [K, ...] batches,
    the step index being the loop's first step (an argument) plus the scan counter."""
    def run(state, batches, first_step):
        def body(carry, batch):
            state, i = carry
            with in_loop(first_step + i):
                state, out = step(state, batch)
            return (state, i + 1), out
        (state, _), outs = jax.lax.scan(body, (state, jnp.int32(0)), batches)
        return state, outs
    return jax.jit(run)


def sharded_batches(mesh_name, steps=K, seed=0):
    mesh, spec = MESHES[mesh_name]()
    x = np.random.default_rng(seed).normal(size=(steps, B, D)).astype(np.float32)
    return x, jax.device_put(x, NamedSharding(mesh, spec))


@pytest.fixture(autouse=True)
def no_failure_left():
    yield
    raise_host_call_error()     # a test that leaves a host function's failure behind fails here


def test_current_step_only_inside_a_loop():
    with pytest.raises(RuntimeError, match="only inside a step traced by xla_runtime.compile_loop"):
        current_step()
    with pytest.raises(RuntimeError, match="only inside a step traced by xla_runtime.compile_loop"):
        jax.jit(lambda x: host_call(print, x))(1.0)


def test_in_loop_nests_and_is_per_thread():
    seen = {}
    with in_loop(3):
        assert int(current_step()) == 3 and current_step().dtype == jnp.int32
        with in_loop(7):
            assert int(current_step()) == 7
            worker = threading.Thread(target=lambda: seen.update(other=_step_or_none()))
            worker.start()
            worker.join()
        assert int(current_step()) == 3
    assert _step_or_none() is None and seen == {"other": None}


def _step_or_none():
    try:
        return int(current_step())
    except RuntimeError:
        return None


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_host_calls_arrive_in_step_order_once_per_step(mesh_name, capfd):
    calls = []

    def step(total, batch):
        total = total + batch.sum()
        host_call(lambda *a: calls.append(("first", *a)), current_step(), {"batch": batch, "total": total})
        host_call(lambda *a: calls.append(("second", *a)), batch.mean(axis=0))
        return total, batch.mean()

    x, batches = sharded_batches(mesh_name)
    total, means = compiled_loop(step)(jnp.float32(0), batches, jnp.int32(0))
    jax.block_until_ready((total, means))

    assert [c[0] for c in calls] == ["first", "second"] * K
    running = np.float32(0)
    for k in range(K):
        (_, step_index, tree), (_, column_means) = calls[2 * k], calls[2 * k + 1]
        running += x[k].sum()
        assert int(step_index) == k
        assert isinstance(tree["batch"], np.ndarray) and tree["batch"].shape == (B, D)   # the whole global batch
        np.testing.assert_array_equal(tree["batch"], x[k])
        np.testing.assert_allclose(tree["total"], running, rtol=1e-5)
        np.testing.assert_allclose(column_means, x[k].mean(axis=0), rtol=1e-5)
    # The arrays are replicated before the callback: no partitioner warning about a forced full rematerialisation.
    assert "Involuntary full rematerialization" not in capfd.readouterr().err


@pytest.mark.parametrize("mesh_name", ["1 device", "4 data x 2 model"])
def test_every_n_calls_on_multiples_of_n_from_step_0(mesh_name):
    calls = []

    def step(state, batch):
        every_n(3, lambda step, b, s: calls.append((step, b, s)), batch, state)
        return state + 1, ()

    x, batches = sharded_batches(mesh_name, steps=10)
    jax.block_until_ready(compiled_loop(step)(jnp.int32(100), batches, jnp.int32(0)))

    assert [c[0] for c in calls] == [0, 3, 6, 9] and all(type(c[0]) is int for c in calls)
    for step_index, b, s in calls:
        np.testing.assert_array_equal(b, x[step_index])
        assert int(s) == 100 + step_index


def test_a_second_loop_continues_the_numbering():
    calls = []

    def step(state, batch):
        host_call(lambda s, b: calls.append(("host_call", int(s), float(b[0, 0]))), current_step(), batch)
        every_n(3, lambda s: calls.append(("every_3", s)))
        return state, ()

    x, batches = sharded_batches("8 x data", steps=10)
    loop = compiled_loop(step)
    first = loop(jnp.float32(0), batches, jnp.int32(0))
    second = loop(jnp.float32(0), batches, jnp.int32(10))     # dispatched before the first is waited for
    jax.block_until_ready((first, second))

    assert [c[1] for c in calls if c[0] == "host_call"] == list(range(20))
    assert [c[1] for c in calls if c[0] == "every_3"] == [0, 3, 6, 9, 12, 15, 18]
    assert [c[2] for c in calls if c[0] == "host_call"] == [float(x[k % 10, 0, 0]) for k in range(20)]


@pytest.mark.parametrize("mesh_name", ["1 device", "8 x data"])
def test_an_exception_in_fn_is_raised_after_the_loop(mesh_name, caplog):
    """Raised inside the callback, the exception would abort an 8-device program (the other devices
    wait in their collective until XLA gives up and exits): host_call catches it, skips later host
    functions and raise_host_call_error raises it once the results are ready."""
    calls = []

    def log(step, loss):
        calls.append(step)
        if step == 2:
            raise OSError(f"disk full writing step {step}")

    def step(state, batch):
        loss = jnp.mean(batch) + state           # a reduction over the sharded batch: a collective per step
        every_n(1, log, loss)
        return state + 1, loss

    _, batches = sharded_batches(mesh_name)
    loop = compiled_loop(step)
    state, losses = loop(jnp.float32(0), batches, jnp.int32(0))
    jax.block_until_ready((state, losses))
    assert float(state) == K and calls == [0, 1, 2]           # the program finished; nothing called after step 2
    assert "host function test_an_exception_in_fn_is_raised_after_the_loop.<locals>.log raised at step 2" in caplog.text

    with pytest.raises(HostCallError, match=r"log raised OSError at step 2: disk full writing step 2") as info:
        raise_host_call_error()
    assert info.value.step == 2 and isinstance(info.value.__cause__, OSError)
    raise_host_call_error()                                   # reported once

    jax.block_until_ready(loop(jnp.float32(0), batches, jnp.int32(K)))   # host functions run again
    assert calls == [0, 1, 2, 6, 7, 8, 9, 10, 11]


def test_every_n_needs_a_positive_int():
    for n in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            with in_loop(0):
                every_n(n, print)


@pytest.mark.parametrize("mesh_name", ["1 device", "8 x data"])
def test_cost_of_a_host_call_per_step(mesh_name):
    """Prints (asserts nothing) what one host_call adds to each step of a 1000-step loop."""
    steps, calls = 1000, []

    def plain(state, batch):
        return state + jnp.mean(batch), ()

    def with_call(state, batch):
        state, out = plain(state, batch)
        host_call(lambda s: calls.append(s), state)
        return state, out

    x, batches = sharded_batches(mesh_name, steps=steps)
    timings = {}
    for name, step in (("plain", plain), ("host_call", with_call)):
        loop = compiled_loop(step)
        jax.block_until_ready(loop(jnp.float32(0), batches, jnp.int32(0)))     # compile
        runs = []
        for _ in range(5):
            began = time.perf_counter()
            jax.block_until_ready(loop(jnp.float32(0), batches, jnp.int32(0)))
            runs.append(time.perf_counter() - began)
        timings[name] = np.median(runs) / steps * 1e6
    assert len(calls) == 6 * steps
    print(f"\n{mesh_name}: {timings['plain']:.1f} us/step without, {timings['host_call']:.1f} us/step with one "
          f"host_call: {timings['host_call'] - timings['plain']:.1f} us per call")


def test_a_host_function_that_is_not_callable_is_named_before_anything_is_traced():
    with pytest.raises(TypeError, match="host_call needs a function to run on the host, got int"):
        host_call(5)
    with pytest.raises(TypeError, match="every_n needs a function to run on the host, got str"):
        every_n(2, "print")
