"""Host functions called from inside a compiled loop, in step order.

>>> import jax, jax.numpy as jnp
>>> from xla_runtime.context import in_loop
>>> seen = []
>>> def body(i, x):
...     with in_loop(i):
...         every_n(2, lambda step, x: seen.append((step, float(x))), x * 10)
...     return i + 1, None
>>> _ = jax.block_until_ready(jax.jit(lambda xs: jax.lax.scan(body, jnp.int32(0), xs))(jnp.arange(5.0)))
>>> seen
[(0, 0.0), (2, 20.0), (4, 40.0)]

**After the loop, or during it.** A host function that only consumes its
arguments (logging, summaries, counters) need not run while the program runs:
with ``after_loop=True`` its arguments become outputs of the loop, stacked
``[K, ...]`` and moved to the host in one transfer, and ``fn`` runs once per
step, in step order, on a thread of the host once the program has ended
(:func:`wait_for_host_calls` waits for them): nothing stops inside the
program, and the device never waits for the host. Without it, ``fn`` runs
*during* the loop, inside the step (what must happen at that moment: progress
mid-loop, something written at a given step), at the costs below. Outside
:func:`xla_runtime.compile_loop` (a ``lax.scan`` of your own) there is no loop
to carry the arguments out of, and ``after_loop=True`` calls run during it.

**Ordering after the loop.** Within a loop, step by step, and within a step
in the order they are written; loop after loop, in the order the loops were
dispatched from this process (one host thread runs them); after every
in-loop call of the same loop. ``every_n(n, fn, ..., after_loop=True)``
carries its arguments out of every step and calls ``fn`` on every ``n``-th.
At most :data:`AFTER_LOOP_PENDING` loops' calls wait to run: a loop's
dispatch waits while more do (the host functions are slower than the
device), so their arguments take bounded memory.

**Ordering during the loop.** Each call is an ``io_callback(..., ordered=True)``: within a
program, calls happen in program order (step 0's before step 1's, and in the
order they are written within a step), and across programs in the order the
programs were dispatched from this thread. A call runs once per step it is
reached in, however many devices the program spans: outside ``shard_map``,
JAX gives the callback a maximal sharding (device 0 of the program), so the
arrays are gathered to that device and ``fn`` sees whole global arrays. JAX
0.10.2 allows this ordered effect on several devices because it declares it
*shardable* (``jax._src.callback``: ``shardable_ordered_effects``). Arrays
with an automatic mesh are constrained to be replicated first: the same
gather, without the partitioner's "involuntary full rematerialization"
warning. Inside a ``shard_map`` body a callback would run once per device,
with that device's shard: call host functions from the step itself. With
several processes, only the process holding device 0 runs ``fn``. JAX
refuses host calls on values being differentiated or vmapped ("IO callbacks
do not support JVP", "Cannot `vmap` ordered IO callback"): pass what
``value_and_grad`` returned.

**Costs during the loop.** ``fn`` runs synchronously inside the step, on the runtime's
thread, holding the GIL: devices waiting for the next collective wait for
it, so keep it short (hand slow work to a queue). Each call also pays the
gather and device-to-host copy of its arrays, JAX's ``io_callback`` (about
40 µs, plus about 20 µs per array leaf: JAX puts every argument on the CPU
device as a ``jax.Array`` before the call; the step index is one of them),
a copy into fresh numpy arrays (the runtime may reuse its buffers once the
callback returns) and the Python call. On a shared 2-core machine one
``host_call`` of one scalar added 70-110 µs to a step on one CPU device,
about 240 µs on 8 (``test_cost_of_a_host_call_per_step`` prints the figure
for the machine at hand). Stack small values into one array
(``jnp.stack([loss, lr])``) where that matters. :func:`every_n` skips all of
it on the steps in between (a ``lax.cond``: under 1 µs).

**Errors.** An exception inside a callback must not reach XLA: on several
devices device 0 stops while the others wait in their next collective, and
the process aborts when XLA's rendezvous times out (40 s on CPU); on one
device JAX raises a ``JaxRuntimeError`` ("CpuCallback error") carrying only
the traceback's text. So ``fn``'s exception is caught and logged, every later
host function is skipped, and :func:`raise_host_call_error` raises it as a
:class:`HostCallError` (its ``__cause__`` the original exception) once the
loop's results are ready.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec as P

from xla_runtime.context import collecting, current_step

__all__ = ["AFTER_LOOP_PENDING", "HostCallError", "every_n", "host_call", "raise_host_call_error",
           "wait_for_host_calls"]

#: Loops whose after-loop host calls may wait to run before the next loop's dispatch waits for them.
AFTER_LOOP_PENDING = 2

_log = logging.getLogger("xla_runtime")
_lock = threading.Lock()
_failure: HostCallError | None = None
#: The after-loop host calls of the step being traced, while compile_loop traces one (:func:`carrying_out`).
_carried: contextvars.ContextVar[list | None] = contextvars.ContextVar("xla_runtime_after_loop", default=None)
_after_loop_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xla_runtime-after-loop")
_after_loop_slots = threading.BoundedSemaphore(AFTER_LOOP_PENDING)
_after_loop_pending: list[concurrent.futures.Future] = []


class HostCallError(RuntimeError):
    """A host function called from inside a compiled loop raised; ``__cause__`` is its exception."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        #: The global step at which the host function raised.
        self.step = step


def host_call(fn: Callable, *arrays, after_loop: bool = False) -> None:
    """From inside a step: ``fn(*arrays)`` on the host with numpy copies of ``arrays``
    (arrays or pytrees of arrays, whole global values), once per step, in step order:
    during the loop, or with ``after_loop`` once its program has ended (see the module's docstring)."""
    _check_function("host_call", fn)
    if not (after_loop and _carry_out(fn, False, 1, arrays)):      # numbered on the host: no index read
        _emit(fn, False, current_step(), arrays)


def every_n(n: int, fn: Callable, *arrays, after_loop: bool = False) -> None:
    """From inside a step: ``fn(step, *arrays)`` on the host on the steps whose global index is
    a multiple of ``n`` (step 0 included), ``step`` a Python int; during the loop (skipped inside
    the program on the other steps), or with ``after_loop`` once its program has ended."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"every_n needs a positive int n, got {n!r}")
    _check_function("every_n", fn)
    if after_loop and _carry_out(fn, True, n, arrays):
        return
    step = current_step()
    jax.lax.cond(step % n == 0, lambda step, arrays: _emit(fn, True, step, arrays), lambda step, arrays: None,
                 step, arrays)


def wait_for_host_calls() -> None:
    """Waits until the after-loop host calls of every loop dispatched so far have run, then raises the
    :class:`HostCallError` of one that failed (as :func:`raise_host_call_error`)."""
    while _after_loop_pending:
        _after_loop_pending.pop(0).result()
    raise_host_call_error()


def carrying_out() -> contextlib.AbstractContextManager[list]:
    """Around the tracing of one step (compile_loop): collects its after-loop host calls, each
    ``(fn, with_step, n, arrays)``, into the list it yields, in the order the step makes them."""
    return collecting(_carried)


def run_after_loop(calls: list, first_step: int, steps: int, carried: list) -> None:
    """Queues the host calls ``calls`` (``(fn, with_step, n)``, as :func:`carrying_out` collected them) of a
    loop of ``steps`` steps from ``first_step``, with ``carried`` (their arguments, stacked ``[steps, ...]``,
    device arrays the program is computing) to run on the host once those are ready. Waits first while
    :data:`AFTER_LOOP_PENDING` loops' calls are queued."""
    _after_loop_slots.acquire()
    while _after_loop_pending and _after_loop_pending[0].done():
        _after_loop_pending.pop(0)
    future = _after_loop_thread.submit(_run_loop_calls, calls, first_step, steps, carried)
    _after_loop_pending.append(future)


def _run_loop_calls(calls: list, first_step: int, steps: int, carried: list) -> None:
    try:
        if jax.process_index() != 0:           # one process runs host functions, as during the loop
            return
        values = jax.device_get(carried)        # waits for the program: the device has long gone on
        flat = [(fn, with_step, n, *jax.tree.flatten(arrays)) for (fn, with_step, n), arrays in zip(calls, values)]
        for i in range(steps):
            step = first_step + i
            for fn, with_step, n, leaves, tree in flat:
                if step % n == 0 and _failure is None:
                    _invoke(fn, with_step, step, tree.unflatten([leaf[i] for leaf in leaves]))
    except BaseException as error:             # noqa: BLE001 - the device_get: reported as the calls' failure
        _record(calls[0][0], first_step, error)
    finally:
        _after_loop_slots.release()


def _carry_out(fn: Callable, with_step: bool, n: int, arrays: tuple) -> bool:
    """Adds the call to the step's after-loop calls; False outside compile_loop (nothing to carry it out of)."""
    calls = _carried.get()
    if calls is None:
        return False
    calls.append((fn, with_step, n, jax.tree.map(lambda x: jax.lax.stop_gradient(jnp.asarray(x)), arrays)))
    return True


def raise_host_call_error() -> None:
    """Raises the :class:`HostCallError` of the first host function that failed (in this process,
    whichever loop ran it) since the last call, and clears it (so host functions run again). Host functions run while a program
    runs, after its dispatch returned: call this once the loop's results are ready."""
    global _failure
    if _failure is None:                   # every loop call asks: no lock for the usual answer
        return
    with _lock:
        failure, _failure = _failure, None
    if failure is not None:
        raise failure


def _gathered(x):
    x = jnp.asarray(x)
    mesh = jax.typeof(x).sharding.mesh
    if mesh.empty or not mesh.are_all_axes_auto:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P()))


def _check_function(name: str, fn) -> None:
    if not callable(fn):
        raise TypeError(f"{name} needs a function to run on the host, got {type(fn).__name__}")


def _emit(fn: Callable, with_step: bool, step, arrays: tuple) -> None:
    # a host function only reads its arguments: no gradient flows through it (and io_callback has no JVP)
    arrays = jax.tree.map(lambda x: _gathered(jax.lax.stop_gradient(x)), arrays)
    io_callback(functools.partial(_call, fn, with_step), None, _gathered(step), arrays, ordered=True)


def _call(fn: Callable, with_step: bool, step, arrays: tuple) -> None:
    """Runs on the runtime's thread, inside the program: never lets an exception out."""
    if _failure is not None:
        return
    # int() of the jax.Array itself costs ~20 µs more
    _invoke(fn, with_step, int(np.asarray(step)), arrays, copy=True)


def _invoke(fn: Callable, with_step: bool, step: int, arrays: tuple, copy: bool = False) -> None:
    """``fn`` on ``arrays``, numpy arrays, or copies made here (``copy``: the runtime may reuse its buffers once
    a callback returns); an exception, the copying's included, is recorded, never raised."""
    try:
        if copy:
            arrays = jax.tree.map(np.array, arrays)
        fn(step, *arrays) if with_step else fn(*arrays)
    except BaseException as error:             # noqa: BLE001 - never into XLA, nor lost on the host thread
        _record(fn, step, error)


def _record(fn, step: int, error: BaseException) -> None:
    global _failure
    name = getattr(fn, "__qualname__", repr(fn))
    _log.error("host function %s raised at step %d; later host calls are skipped", name, step,
               exc_info=(type(error), error, error.__traceback__))
    failure = HostCallError(f"host function {name} raised {type(error).__name__} at step {step}: {error}", step)
    failure.__cause__ = error
    with _lock:
        if _failure is None:
            _failure = failure
