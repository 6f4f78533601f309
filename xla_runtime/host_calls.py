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

**Prefer the loop's outputs.** Per-step values a step returns come back from
the loop stacked ``[K, ...]`` in one transfer, to be handed to host functions
(metrics, summaries) after the loop: nothing stops inside the program. Use
:func:`host_call` / :func:`every_n` only for what must happen *during* the
loop (logging progress mid-loop, writing something at a given step).

**Ordering.** Each call is an ``io_callback(..., ordered=True)``: within a
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

**Costs.** ``fn`` runs synchronously inside the step, on the runtime's
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

import functools
import logging
import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.sharding import NamedSharding, PartitionSpec as P

from xla_runtime.context import current_step

__all__ = ["HostCallError", "every_n", "host_call", "raise_host_call_error"]

_log = logging.getLogger("xla_runtime")
_lock = threading.Lock()
_failure: HostCallError | None = None


class HostCallError(RuntimeError):
    """A host function called from inside a compiled loop raised; ``__cause__`` is its exception."""

    def __init__(self, message: str, step: int):
        super().__init__(message)
        #: The global step at which the host function raised.
        self.step = step


def host_call(fn: Callable, *arrays) -> None:
    """From inside a step: ``fn(*arrays)`` on the host with numpy copies of ``arrays``
    (arrays or pytrees of arrays, whole global values), once per step, in step order."""
    _check_function("host_call", fn)
    _emit(fn, False, current_step(), arrays)


def every_n(n: int, fn: Callable, *arrays) -> None:
    """From inside a step: ``fn(step, *arrays)`` on the host on the steps whose global index is
    a multiple of ``n`` (step 0 included), ``step`` a Python int; skipped inside the program
    on the other steps."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"every_n needs a positive int n, got {n!r}")
    _check_function("every_n", fn)
    step = current_step()
    jax.lax.cond(step % n == 0, lambda step, arrays: _emit(fn, True, step, arrays), lambda step, arrays: None,
                 step, arrays)


def raise_host_call_error() -> None:
    """Raises the :class:`HostCallError` of the first host function that failed (in this process,
    whichever loop ran it) since the last call, and clears it (so host functions run again). Host functions run while a program
    runs, after its dispatch returned: call this once the loop's results are ready."""
    global _failure
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
    global _failure
    if _failure is not None:
        return
    step = int(np.asarray(step))            # int() of the jax.Array itself costs ~20 µs more
    try:
        arrays = jax.tree.map(np.array, arrays)
        fn(step, *arrays) if with_step else fn(*arrays)
    except BaseException as error:
        name = getattr(fn, "__qualname__", repr(fn))
        _log.exception("host function %s raised at step %d; later host calls are skipped", name, step)
        failure = HostCallError(f"host function {name} raised {type(error).__name__} at step {step}: {error}", step)
        failure.__cause__ = error
        with _lock:
            if _failure is None:
                _failure = failure
