"""host_call / every_n with after_loop=True through compile_loop, on 1 and 8 CPU devices: the arguments carried out
of the loop as outputs, the functions run on a host thread after the program, in step order, loop after loop."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import xla_runtime as xr
from xla_runtime.context import current_step, in_loop
from xla_runtime.host_calls import AFTER_LOOP_PENDING

K, B, D = 6, 16, 4


@pytest.fixture(autouse=True)
def no_failure_left():
    yield
    xr.wait_for_host_calls()    # a test that leaves a host function's failure behind fails here


def mesh_of(devices: int):
    return xr.make_mesh({"data": devices}, jax.devices()[:devices])


@pytest.mark.parametrize("devices", [1, 8])
def test_after_loop_calls_run_on_the_host_after_the_program_in_step_order_loop_after_loop(devices):
    calls = []

    def step(total, batch):
        total = total + batch.sum()
        xr.host_call(lambda *a: calls.append(("first", threading.current_thread().name, *a)), current_step(),
                     {"batch": batch, "total": total}, after_loop=True)
        xr.every_n(2, lambda s, m: calls.append(("every_2", s, m)), batch.mean(axis=0), after_loop=True)
        return total, batch.mean()

    x = np.random.default_rng(0).normal(size=(2 * K, B, D)).astype(np.float32)
    loop = xr.compile_loop(step, K, mesh_of(devices))
    total, _ = loop(jnp.float32(0), x[:K])
    total, _ = loop(total, x[K:])                       # dispatched before the first loop's calls have run
    xr.wait_for_host_calls()

    assert [c[0] for c in calls] == ["first", "every_2", "first"] * K
    firsts, evens = [c for c in calls if c[0] == "first"], [c for c in calls if c[0] == "every_2"]
    running = np.float32(0)
    for k, (_, thread, step_index, tree) in enumerate(firsts):
        running += x[k].sum()
        assert thread.startswith("xla_runtime-after-loop") and int(step_index) == k
        np.testing.assert_array_equal(tree["batch"], x[k])           # the whole global batch
        np.testing.assert_allclose(tree["total"], running, rtol=1e-5)
    assert [c[1] for c in evens] == list(range(0, 2 * K, 2)) and all(type(c[1]) is int for c in evens)
    for _, s, means in evens:
        np.testing.assert_allclose(means, x[s].mean(axis=0), rtol=1e-5)


def test_an_after_loop_exception_is_raised_by_wait_for_host_calls_and_calls_run_again_after(caplog):
    calls = []

    def log(step, loss):
        calls.append(step)
        if step == 2:
            raise OSError(f"disk full writing step {step}")

    def step(state, batch):
        xr.every_n(1, log, jnp.mean(batch) + state, after_loop=True)
        return state + 1, ()

    loop = xr.compile_loop(step, K, mesh_of(8))
    x = np.ones((K, B, D), np.float32)
    state, _ = loop(jnp.float32(0), x, first_step=100)     # the first call waits for its results: not this one
    state, _ = loop(state, x, first_step=0)
    with pytest.raises(xr.HostCallError, match=r"log raised OSError at step 2: disk full writing step 2") as info:
        xr.wait_for_host_calls()
    assert info.value.step == 2 and isinstance(info.value.__cause__, OSError)
    assert calls == [100, 101, 102, 103, 104, 105, 0, 1, 2]
    assert "log raised at step 2; later host calls are skipped" in caplog.text
    state, _ = loop(state, x, first_step=6)
    xr.wait_for_host_calls()
    assert calls[9:] == [6, 7, 8, 9, 10, 11]


def test_outside_compile_loop_an_after_loop_call_runs_during_the_loop():
    calls = []

    def run(xs):
        def body(i, x):
            with in_loop(i):
                xr.host_call(lambda v: calls.append(float(v)), x, after_loop=True)
            return i + 1, None
        return jax.lax.scan(body, jnp.int32(0), xs)

    jax.block_until_ready(jax.jit(run)(jnp.arange(3.0)))
    assert calls == [0.0, 1.0, 2.0]                     # no loop to carry them out of: run inside the program


def test_dispatch_waits_while_too_many_loops_calls_are_queued():
    def slow(x):
        time.sleep(0.15)

    def step(state, batch):
        xr.host_call(slow, batch, after_loop=True)
        return state, ()

    loop = xr.compile_loop(step, 1, mesh_of(1))
    loops = AFTER_LOOP_PENDING + 3
    began = time.perf_counter()
    for _ in range(loops):
        loop(jnp.float32(0), np.ones((1, 8), np.float32))
    dispatching = time.perf_counter() - began
    xr.wait_for_host_calls()
    # loop i waits for loop i - AFTER_LOOP_PENDING's calls: the queue, and the arguments it holds, stay bounded
    assert dispatching >= 0.15 * (loops - AFTER_LOOP_PENDING) - 0.05
