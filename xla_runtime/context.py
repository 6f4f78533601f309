"""The global step index, inside a step traced by :func:`xla_runtime.compile_loop`.

>>> import jax, jax.numpy as jnp
>>> def body(i, x):
...     with in_loop(10 + i):               # what compile_loop does around each traced step
...         return i + 1, x * current_step()
>>> jax.lax.scan(body, jnp.int32(0), jnp.ones(3))[1].tolist()
[10.0, 11.0, 12.0]

The loop traces its step function once, inside ``lax.scan``; around that call
it enters :func:`in_loop` with the step's global index (the loop's first step,
an argument of the compiled program, plus the scan counter), so code inside
the step, host calls among it, can read it with :func:`current_step` as an
``int32`` scalar tracer. The index lives in a ``contextvars.ContextVar``: each
thread (and asyncio task) tracing a loop sees its own, and an inner
``in_loop`` hides an outer one until it exits. Nothing here runs at run time:
it only decides what the traced program computes.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
import jax.numpy as jnp

__all__ = ["collecting", "current_step", "in_loop", "watching_step_reads"]

_step: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("xla_runtime_step", default=None)
_reads: contextvars.ContextVar[list | None] = contextvars.ContextVar("xla_runtime_step_reads", default=None)


def current_step() -> jax.Array:
    """The global index of the step being traced (an ``int32`` scalar): the index within
    the loop plus the loop's first step. Raises ``RuntimeError`` outside a loop's step."""
    step = _step.get()
    if step is None:
        raise RuntimeError("current_step() is available only inside a step traced by xla_runtime.compile_loop "
                           "(or within xla_runtime.context.in_loop)")
    reads = _reads.get()
    if reads is not None:
        reads.append(step)
    return step


def watching_step_reads() -> contextlib.AbstractContextManager[list]:
    """Yields a list that :func:`current_step` appends to while the block runs: empty at its end where
    nothing traced within read the step index (compile_loop then leaves the index out of its program)."""
    return collecting(_reads)


@contextlib.contextmanager
def collecting(var: contextvars.ContextVar) -> Iterator[list]:
    """Sets ``var`` to a new list for the block, which yields it (what the code traced within adds to it)."""
    items: list = []
    token = var.set(items)
    try:
        yield items
    finally:
        var.reset(token)


@contextlib.contextmanager
def in_loop(step_index) -> Iterator[None]:
    """Makes ``step_index`` (an int or an integer scalar, usually a tracer: the loop's first
    step plus the scan counter) what :func:`current_step` returns until the block ends."""
    token = _step.set(jnp.asarray(step_index, jnp.int32))
    try:
        yield
    finally:
        _step.reset(token)
