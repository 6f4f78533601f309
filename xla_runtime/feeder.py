"""Feeding host batches to a device mesh, one batch ahead of the compiled loop (or more).

>>> import numpy as np, jax
>>> from jax.sharding import Mesh, PartitionSpec as P
>>> mesh = Mesh(np.array(jax.devices()), ("data",))
>>> batches = ({"x": np.full((8, 3), k, np.float32)} for k in range(3))
>>> with Feeder(batches, mesh, P("data")) as feeder:
...     [float(batch["x"].sum()) for batch in feeder]          # each batch a dict of sharded jax.Arrays
[0.0, 24.0, 48.0]

**Thread and prefetch depth.** A daemonic thread takes host batches (pytrees
of numpy arrays: dicts, ``infeed.Padded`` tuples, ``infeed.Batch`` ring
slots) from the source, transfers each one to the mesh and waits until its
arrays are ready. At most ``prefetch`` batches are taken ahead of the
consumer (being transferred or ready): with ``prefetch=1`` the transfer of
loop k+1's input already overlaps loop k's compute. Whatever the thread meets
(an exception of the source such as ``infeed.WorkerDied``, a batch that does
not fit the mesh) is raised by the consumer's ``next`` after the batches
before it; the source's end ends the iteration. Every wait polls a stop flag,
so :meth:`Feeder.close` returns within ``timeout`` seconds whatever the source
does; it does not close the source (close the feeder first, then the source:
nested ``with`` blocks do).

**Aliasing rule.** A host batch is released (``.release()``, when it has one:
an infeed ring slot goes back to the workers) once its device arrays are
ready and none of them shares its memory, so a source may overwrite a batch's
memory as soon as it is released or the next one is taken. On a GPU (or TPU)
the transfer is a copy and the release follows its completion; a ring slot is
already pinned (``Feed.pinned``: registered with CUDA by infeed), so the
driver copies it by DMA and the feeder makes no staging copy of its own. On
the CPU, ``jax.device_put`` of a numpy array whose memory is 64-byte aligned
(every ring slot array) returns arrays that alias it, and in jax 0.10.2
``may_alias=False`` does not prevent it for numpy inputs (jax-ml/jax#37830).
So on CPU devices each leaf is first copied into 64-byte aligned memory of
the feeder's own that the device arrays then alias: one copy, as on a GPU.
That memory is reused (:class:`~xla_runtime.host_buffers.HostBuffers`) once
the copy's lease is finalized: the CPU client holds a reference to the numpy
array that device arrays alias until the last of them, and every computation
reading it, is gone, and every view of a copy leads back to its lease. Fresh memory for each batch costs the
kernel's zeroing of its pages and their unmapping, which also interrupts the
compute threads: on an idle 2-core machine the copy and transfer of a 40 MB
slot took 26 ms into fresh memory, 15 ms into reused memory.

**Multi-host.** With ``jax.process_count() > 1`` each process feeds its own
part of the global batch (its daemon reads its shard of the files) and the
global arrays are assembled with ``jax.make_array_from_process_local_data``:
a dimension split over a mesh axis must then divide by the number of parts
of that axis this process's devices hold.

**Trace events.** Each wait and transfer is a named ``jax.profiler``
event (``TraceAnnotation``, a few hundred nanoseconds when no trace is
active), so a profile shows where the input's time goes: on the consumer's
thread ``feeder/wait`` (``next`` waiting for a device batch: the loop is
input-bound while it lasts); on the feeder's thread (``Feeder`` in a
profile, its name on Linux) ``feeder/wait_for_room`` (``prefetch`` batches ready: the input is ahead),
``feeder/source`` (the source's ``next``: for an infeed feed, the wait for a
filled ring slot), ``feeder/transfer`` and, inside it, ``feeder/host_copy``
(the CPU backend's copy) and ``feeder/wait_ready`` (until the device arrays
are ready).

**Resume.** The thread runs ahead of the consumer, so the source's
``state()`` (``infeed.Feed.state``) counts batches not yet trained on:
checkpoint :meth:`Feeder.state` instead, the source's state as of the last
batch the consumer took.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import math
import queue
import sys
import threading
import time
from typing import Any, Iterable

import jax
import numpy as np
from jax.profiler import TraceAnnotation
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from xla_runtime.host_buffers import HostBuffers

__all__ = ["Feeder", "FeederStats"]

#: Seconds between looks at the stop flag in every wait of the thread and the consumer.
POLL = 0.05
#: prctl's option that names the calling thread (15 bytes at most).
_PR_SET_NAME = 15


@dataclasses.dataclass
class FeederStats:
    """Counters a :class:`Feeder` keeps (seconds are wall-clock, summed over batches)."""

    batches: int = 0            #: device batches handed to the consumer
    wait_s: float = 0.0         #: the consumer waited for them (input-bound when this grows), the first included
    first_wait_s: float = 0.0   #: of which for the first batch (the source's start-up)
    source_s: float = 0.0       #: the thread waited for host batches from the source
    transfer_s: float = 0.0     #: copies and transfers, until the device arrays were ready


class _Failure:
    """What the thread met, to raise in the consumer."""

    def __init__(self, error: BaseException):
        self.error = error


_END = object()
_NO_EVENT = contextlib.nullcontext()


class Feeder:
    """Iterates over ``source`` 's host batches as pytrees of jax.Arrays sharded over ``mesh``.

    ``batch_sharding``: a ``PartitionSpec`` (e.g. ``P("data")``) or a
    ``Sharding``, or a pytree of them that is a prefix of the batch's
    structure (``{"image": P("data"), "label": P()}``). A batch with
    ``.release()`` (``infeed.Batch``) comes out as a plain dict of the same
    keys. See the module's documentation for the thread, ``prefetch``, the
    aliasing rule and the multi-host path.
    """

    def __init__(self, source: Iterable, mesh: Mesh, batch_sharding: Any, prefetch: int = 2):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be a positive int, got {prefetch!r}")
        self.mesh = mesh
        self.batch_sharding = batch_sharding
        self.prefetch = prefetch
        self.stats = FeederStats()
        state_of = getattr(source, "state", None)
        self._state_of = state_of if callable(state_of) else None
        self._state = self._state_of() if self._state_of else None
        self._multihost = jax.process_count() > 1
        self._on_host = all(d.platform == "cpu" for d in mesh.devices.flat)
        self._buffers = HostBuffers(per_size=prefetch + 2)
        self._shardings: dict = {}
        self._iterator = iter(source)
        self._ready: queue.Queue = queue.Queue()
        self._room = threading.Semaphore(prefetch)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="xla_runtime.Feeder", daemon=True)
        self._thread.start()

    # --- the consumer -----------------------------------------------------------------------
    def __iter__(self) -> "Feeder":
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        began = time.perf_counter()
        with TraceAnnotation("feeder/wait"):
            while True:
                try:
                    item = self._ready.get(timeout=POLL)
                    break
                except queue.Empty:
                    if self._stop.is_set():
                        self._done = True
                        raise StopIteration from None
        waited = time.perf_counter() - began
        self.stats.wait_s += waited
        if self.stats.batches == 0 and not self.stats.first_wait_s:
            self.stats.first_wait_s = waited
        if item is _END or isinstance(item, _Failure):
            self._done = True
            if item is _END:
                raise StopIteration
            raise item.error
        batch, self._state = item
        self._room.release()
        self.stats.batches += 1
        return batch

    def state(self) -> Any:
        """The source's ``state()`` after the last batch the consumer took (None without one)."""
        return self._state

    def close(self, timeout: float = 5.0) -> None:
        """Stops the thread (waiting up to ``timeout`` s) and drops the batches it had ready.

        The host batch the thread holds is released as soon as its transfer
        or the source's ``next`` returns. Iteration ends; the source stays open.
        Close a feeder left before its end (``with`` does): its thread would
        otherwise keep waiting for room, holding the batches it had ready.
        """
        self._stop.set()
        self._done = True
        self._thread.join(timeout)
        while not self._ready.empty():
            self._ready.get_nowait()

    def __enter__(self) -> "Feeder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the thread -------------------------------------------------------------------------
    def _run(self) -> None:
        _name_native_thread(b"Feeder")
        try:
            while self._take_room():
                began = time.perf_counter()
                try:
                    with TraceAnnotation("feeder/source"):
                        host = next(self._iterator)
                except StopIteration:
                    self._ready.put(_END)
                    return
                taken = time.perf_counter()
                try:
                    if self._stop.is_set():
                        return
                    with TraceAnnotation("feeder/transfer"):
                        batch = self._transfer(host)
                finally:
                    release = getattr(host, "release", None)
                    if callable(release):
                        release()
                state = self._state_of() if self._state_of else None
                self.stats.source_s += taken - began
                self.stats.transfer_s += time.perf_counter() - taken
                if self._stop.is_set():
                    return
                self._ready.put((batch, state))
        except BaseException as e:      # noqa: BLE001 -- whatever it is, the consumer raises it at this batch
            self._ready.put(_Failure(e))

    def _take_room(self) -> bool:
        """Waits until fewer than ``prefetch`` batches are ahead of the consumer; False once stopped."""
        with TraceAnnotation("feeder/wait_for_room"):
            while not self._stop.is_set():
                if self._room.acquire(timeout=POLL):
                    return not self._stop.is_set()
        return False

    def _transfer(self, host: Any) -> Any:
        """The device batch of ``host``, ready; no device array aliases ``host`` 's memory."""
        tree = dict(host) if isinstance(host, dict) and _is_leaf(host) else host
        named, treedef = jax.tree_util.tree_flatten_with_path(tree)
        shardings = self._shardings.get(treedef)
        if shardings is None:
            shardings = self._shardings[treedef] = self._leaf_shardings(tree, treedef)
        leaves = []
        with TraceAnnotation("feeder/host_copy") if self._on_host else _NO_EVENT:
            for (path, leaf), sharding in zip(named, shardings):
                leaf = np.asarray(leaf)
                if isinstance(sharding, NamedSharding):
                    _check_divides(jax.tree_util.keystr(path, simple=True, separator="."), leaf.shape, sharding)
                leaves.append(self._buffers.copy(leaf) if self._on_host else leaf)
        if self._multihost:
            arrays = jax.make_array_from_process_local_data(shardings, leaves)
        else:
            arrays = jax.device_put(leaves, shardings)
        with TraceAnnotation("feeder/wait_ready"):
            return jax.block_until_ready(jax.tree_util.tree_unflatten(treedef, arrays))

    def _leaf_shardings(self, tree: Any, treedef) -> list:
        """One Sharding per leaf of ``tree``, from ``batch_sharding`` (a prefix of its structure)."""
        def expand(spec, subtree):
            sharding = spec if isinstance(spec, Sharding) else NamedSharding(self.mesh, spec)
            return jax.tree_util.tree_map(lambda _: sharding, subtree)

        try:
            full = jax.tree_util.tree_map(expand, self.batch_sharding, tree,
                                          is_leaf=lambda s: isinstance(s, (PartitionSpec, Sharding)))
            return treedef.flatten_up_to(full)
        except (ValueError, TypeError) as e:
            raise ValueError(f"batch_sharding {self.batch_sharding} does not fit the batch "
                             f"{jax.tree_util.tree_structure(tree)}: {e}") from None


def _name_native_thread(name: bytes) -> None:
    """Names the calling thread for the kernel (where profilers read thread names), on Linux; no-op elsewhere."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name[:15]))
        except (OSError, AttributeError):
            pass


def _is_leaf(tree: Any) -> bool:
    """Whether JAX sees ``tree`` as one leaf (a dict subclass it does not know, such as infeed.Batch)."""
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(tree))


def _check_divides(name: str, shape: tuple, sharding: NamedSharding) -> None:
    """A ValueError naming the leaf when a dimension does not split evenly over its mesh axes."""
    spec, mesh = sharding.spec, sharding.mesh
    if len(spec) > len(shape):
        raise ValueError(f"batch leaf {name!r} has shape {shape}: {spec} splits {len(spec)} dimensions")
    for dim, axes in enumerate(spec):
        if axes is None or axes is PartitionSpec.UNCONSTRAINED:
            continue
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        size, parts = math.prod(mesh.shape[a] for a in axes), _local_parts(mesh, axes)
        if shape[dim] % parts:
            axis = f"mesh axis {axes[0]!r}" if len(axes) == 1 else f"mesh axes {axes}"
            where = (f"{axis} of size {size}" if parts == size
                     else f"the {parts} parts of {axis} (size {size}) on this process's devices")
            raise ValueError(f"batch leaf {name!r} has shape {shape}: dimension {dim} ({shape[dim]}) "
                             f"does not divide by {where}")


@functools.lru_cache(maxsize=None)
def _local_parts(mesh: Mesh, axes: tuple) -> int:
    """How many parts of a dimension split over ``axes`` this process's devices hold (all of them in one process)."""
    here = jax.process_index()
    mine = np.argwhere(np.vectorize(lambda d: d.process_index == here)(mesh.devices))
    keep = [mesh.axis_names.index(a) for a in axes]
    return len({tuple(c[keep]) for c in mine})
