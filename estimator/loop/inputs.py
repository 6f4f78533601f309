"""What an ``input_fn`` returns, turned into device batches of ``[K, B, ...]`` for the compiled loops.

``input_fn(params)`` returns either an :class:`infeed.Dataset` (decoded by an
:class:`infeed.Daemon`, ``K`` batches per ring slot, moved to the devices by an
:class:`xla_runtime.Feeder` while the previous loop runs) or any iterable of
``(features, labels)`` numpy batches (stacked ``K`` at a time on the host, and
fed the same way). Either way a loop sees one flat dict per step: the
features, the labels (``"labels"`` for an iterable; the Dataset's ``labels``
features), and for evaluation and prediction ``"is_padding"`` ``[B]``, so the
last partial batch is padded, never dropped, and its padding masked.

**Resuming a training input.** Each checkpoint saves, beside the step, where
the input stands after the last batch trained on (never after the batches the
feeder prefetched beyond it), and the next ``train`` (of this Estimator, or
of a new one on the same ``model_dir``) resumes there. A Dataset saves its
position (epoch, batch, seed). An iterable does when the iterator ``iter()``
gives for it has Grain's ``get_state()`` (JSON or bytes) and
``set_state(state)``: a ``grain.DataLoader``, a ``grain.MapDataset`` or
``IterDataset``, any iterator of yours with the two methods
(:mod:`estimator.loop.resumable`); its state is taken after each batch is pulled
and travels with that batch. Any other iterable (a list, a generator) starts
again from its beginning: ``train`` warns of it, or refuses it with
``RunConfig(require_resumable_input=True)``.

**Several processes** (``jax.distributed``). Each process reads its own part
of the input: a Dataset with ``num_shards=1`` is sharded by process
(``shard_index=jax.process_index()``), and an iterable is taken to be this
process's part already. Every process must then run the same loops, so for
evaluation and prediction the processes first agree on the number of batches
(each counts its own: :meth:`infeed.Dataset.count_records`, or the iterable's
length) and a process whose part is shorter feeds all-padding batches after
its own, which the mask removes. Training inputs repeat or are long enough:
a process whose training input ends first stops every process with an error
from the collective, never a silent hang of the others' loop.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Iterable, Iterator

import jax
import numpy as np
from jax.profiler import TraceAnnotation
from jax.sharding import PartitionSpec as P

import infeed
from estimator.errors import InputError
from estimator.loop import resumable
from infeed.daemon.dataset import PADDING_KEY
from xla_runtime import Feeder

__all__ = ["Input", "split_batch", "fetch", "local_part", "gather_json", "PADDING_KEY"]

LABELS = "labels"


def split_batch(batch: dict, labels: tuple[str, ...] | None):
    """(features, labels, padding mask or None) of one step's flat batch dict.

    ``labels``: the Dataset's label feature names (one name: that array; several:
    a dict), or None for an iterable's batches (the ``"labels"`` entry).
    """
    batch = dict(batch)
    mask = batch.pop(PADDING_KEY, None)
    if labels is None:
        return batch.pop("features"), batch.pop(LABELS, None), mask
    found = {name: batch.pop(name) for name in labels}
    if not found:
        return batch, None, mask
    return batch, (found[labels[0]] if len(labels) == 1 else found), mask


class Input:
    """The device batches of one ``input_fn`` for one mode; a context manager that stops its daemon."""

    def __init__(self, source, mesh, steps: int, batch_size: int, *, exact: bool, state: dict | None = None,
                 workers: int = 2, slots: int = 4):
        self.mesh, self.steps, self.batch_size, self.exact = mesh, steps, batch_size, exact
        self._daemon = None
        self._source = source.to_json() if isinstance(source, infeed.Dataset) else None
        self.ended = False                  # the iteration ran out: nothing more to take
        self._before, self._taken = None, 0  # the state before the last loop handed out, and its steps
        processes = jax.process_count()
        if isinstance(source, infeed.Dataset):
            self.resumable, self.description = True, "an infeed.Dataset"
            if resumable.is_iterator_state(state):
                raise InputError(f"the checkpoint holds the input position of a {state.get('iterator')} iterator; "
                                 f"input_fn gave an infeed.Dataset instead: it cannot resume there")
            if source.batch_size != batch_size:
                raise InputError(f"input_fn's Dataset has batch_size={source.batch_size}; this mode's per-host "
                                 f"batch is {batch_size} (use params['batch_size'])")
            changes = {"steps_per_slot": steps}
            if exact:
                changes.update(final_batch="pad", num_epochs=1)
            if processes > 1 and source.num_shards == 1:
                changes.update(shard_index=jax.process_index(), num_shards=processes)
            self.dataset = source.replace(**changes)
            self.labels = self.dataset.labels
            self._daemon = infeed.Daemon(self.dataset, num_workers=workers, slots=slots, state=state)
            self._daemon.annotate = TraceAnnotation           # "infeed/wait_for_slot" events in a profile
            host = self._daemon if steps > 1 else _OneStep(self._daemon)
            if exact and processes > 1:
                padding = {name: _zeros(spec) for name, spec in self.dataset.template().items()}
                padding[PADDING_KEY][:] = True
                local = -(-self.dataset.count_records() // batch_size)
                host = _aligned(host, max(_all_processes(local)), steps, padding)
        elif isinstance(source, Iterable):
            self.dataset, self.labels = None, None
            items = iter(source)
            self.resumable = resumable.has_protocol(items)
            self.description = (f"an object of type {resumable.type_name(source)}" if items is source else
                                f"an object of type {resumable.type_name(source)} (iterated by "
                                f"{resumable.type_name(items)})")
            if state is not None:
                resumable.restore(items, state, self.description)
            if exact and processes > 1:
                items = [_as_batch(item, batch_size, exact) for item in items]
                total = max(_all_processes(len(items)))
                if items or total:
                    padding = jax.tree.map(np.zeros_like, items[0] if items else _no_batch())
                    padding[PADDING_KEY][:] = True
                    items = itertools.chain(items, itertools.repeat(padding, total - len(items)))
            host = _Stacked(items, steps, batch_size, exact,
                            functools.partial(resumable.snapshot, items) if self.resumable and not exact else None)
        else:
            raise InputError(f"input_fn must return an infeed.Dataset or an iterable of (features, labels) batches, "
                             f"got {type(source).__name__}")
        self._feeder = Feeder(host, mesh, P(None, "data"))

    def __iter__(self) -> Iterator:
        while True:                         # not ``yield from``: it would close the feeder when a loop breaks
            before = self._feeder.state()
            batch = next(self._feeder, None)
            if batch is None:
                break
            self._before, self._taken = before, jax.tree.leaves(batch)[0].shape[0]
            yield batch
        self.ended = True                   # not on a break: a loop that stops early may go on later

    @property
    def wait_s(self) -> float:
        """Seconds the loops have waited for their device batches so far."""
        return self._feeder.stats.wait_s

    def stats(self) -> infeed.InputStats | None:
        """Where a Dataset input's time went (None for an iterable): the daemon's stages, the feeder's
        host-to-device copies, and the loops' wait for device batches after the first."""
        if self._daemon is None:
            return None
        f = self._feeder.stats
        return self._daemon.stats().with_consumer_stages(host_to_device=f.transfer_s,
                                                         trainer_wait=f.wait_s - f.first_wait_s)

    def state(self, steps: int | None = None) -> dict | None:
        """Where the input resumes after the batches handed out (None for an input without state);
        ``steps``: after only the first ``steps`` of the last loop handed out (a partial loop: the
        rest of its batches were not trained on). An iterable's: its iterator's state after that batch."""
        after = self._feeder.state()
        partial = steps is not None and steps < self._taken
        if self._daemon is None:            # an iterable's: its iterator's states after each batch of that loop
            return None if after is None else after[steps - 1 if partial else -1]
        if not partial or after is None or self._before is None:
            return after
        return dict(self._before, batch=self._before["batch"] + steps)

    def warn_unless_resumable(self, required: bool) -> None:
        """A WARNING that this (training) input starts again from its beginning on the next train() and
        after a restore, or an InputError when ``required``; nothing for a resumable input."""
        if not self.resumable:
            resumable.not_resumable(self.description, required)

    def continues_at(self, state: dict | None) -> bool:
        """Whether this input (a Dataset's, not run out) hands out next the batch where ``state`` resumes."""
        return self._source is not None and not self.ended and state is not None and self.state() == state

    def continues(self, source, state: dict | None) -> bool:
        """Whether this input gives what a new one of ``source`` resuming at ``state`` would: the
        same Dataset (its settings and matched files), standing at ``state``."""
        return isinstance(source, infeed.Dataset) and source.to_json() == self._source and self.continues_at(state)

    def close(self) -> None:
        try:
            self._feeder.close()
        finally:
            if self._daemon is not None:
                self._daemon.close()

    def __enter__(self) -> "Input":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _as_batch(item, batch_size: int, exact: bool) -> dict:
    if isinstance(item, dict) and PADDING_KEY in item:       # already made (several processes: see Input)
        return item
    try:
        features, labels = item
    except (TypeError, ValueError):
        raise InputError("an input_fn iterable must yield (features, labels) pairs (labels may be None)") from None
    batch = {"features": features, LABELS: labels} if labels is not None else {"features": features}
    batch = jax.tree.map(np.asarray, batch)
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(batch)}
    if len(sizes) != 1 or None in sizes:
        raise InputError(f"every array of an input batch needs the same leading batch dimension, found {sizes}")
    n = sizes.pop()
    if n > batch_size or (n < batch_size and not exact):
        raise InputError(f"an input batch has {n} examples; this mode's per-host batch is {batch_size}"
                         + ("" if exact else " (only evaluation and prediction pad a short last batch)"))
    if exact:
        batch = jax.tree.map(lambda x: np.concatenate([x, np.zeros((batch_size - n,) + x.shape[1:], x.dtype)]), batch)
        batch[PADDING_KEY] = np.arange(batch_size) >= n
    return batch


class _Stacked:
    """Host batches of ``items`` stacked ``steps`` at a time (fewer at the end).

    With ``snapshot`` (the iterator's state as JSON, :func:`estimator.loop.resumable.snapshot`), it is
    taken right after each item is pulled: :meth:`state` is the list of the states after each batch
    of the last stack made, which the Feeder reads on its thread right after taking that stack and
    hands back with it (``Feeder.state``), so prefetched stacks never move the position saved.
    """

    def __init__(self, items: Iterator, steps: int, batch_size: int, exact: bool, snapshot=None):
        self._items, self._steps, self._batch_size, self._exact = items, steps, batch_size, exact
        self._snapshot = snapshot
        self._states = [snapshot()] if snapshot is not None else None      # where it stands before any batch

    def state(self) -> list | None:
        return self._states

    def __iter__(self) -> Iterator[dict]:
        while True:
            chunk, states = [], []
            for item in itertools.islice(self._items, self._steps):
                chunk.append(_as_batch(item, self._batch_size, self._exact))
                if self._snapshot is not None:
                    states.append(self._snapshot())
            if not chunk:
                return
            if self._snapshot is not None:
                self._states = states
            yield jax.tree.map(lambda *xs: np.stack(xs), *chunk)


class _Slot(dict):
    """A slot's arrays under another shape; ``release`` gives the slot back."""

    def __init__(self, arrays: dict, release):
        super().__init__(arrays)
        self.release = release


class _OneStep:
    """A daemon whose slots hold one batch ``[B, ...]``, seen as slots of one step ``[1, B, ...]`` (views)."""

    def __init__(self, daemon):
        self._daemon = daemon

    def state(self):
        return self._daemon.state()

    def __iter__(self) -> Iterator[dict]:
        for batch in self._daemon:
            yield _Slot(jax.tree.map(lambda x: x[None], dict(batch)), batch.release)


def _no_batch():
    raise InputError("with several processes, each process's evaluation or prediction input needs at least one "
                     "batch (its shape is what the others pad with)")


def _zeros(spec):
    """Zero arrays for one batch of a Dataset template entry: ``(shape, dtype)`` or a Padded pair of them."""
    if isinstance(spec, infeed.Padded):
        return infeed.Padded(*(np.zeros(shape, dtype) for shape, dtype in spec))
    shape, dtype = spec
    return np.zeros(shape, dtype)


def _aligned(slots, total: int, steps: int, padding: dict) -> Iterator[dict]:
    """A Dataset's slots re-cut to ``total`` batches in slots of ``steps`` (the last shorter), the same on
    every process: this process's own batches, then all-padding ones. Its full slots pass unchanged."""
    made = 0
    for slot in slots:
        have = len(slot[PADDING_KEY])
        want = min(steps, total - made)
        if have == want:
            yield slot
        else:                                       # this process's last, shorter slot: copied and padded
            tree = dict(slot)
            extended = jax.tree.map(
                lambda x, pad: np.concatenate([x, np.broadcast_to(pad, (want - have,) + pad.shape)]), tree, padding)
            getattr(slot, "release", lambda: None)()
            yield extended
        made += want
    while made < total:
        want = min(steps, total - made)
        yield jax.tree.map(lambda pad: np.broadcast_to(pad, (want,) + pad.shape).copy(), padding)
        made += want


def _all_processes(value: int) -> list[int]:
    """Every process's ``value``, in process order. A collective: every process calls it at the same point."""
    from jax.experimental import multihost_utils
    return [int(v) for v in np.asarray(multihost_utils.process_allgather(np.int32(value))).reshape(-1)]


def gather_json(obj) -> list:
    """Every process's JSON-able ``obj``, in process order (a collective; one process: ``[obj]``)."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(json.dumps(obj).encode(), np.uint8)
    size = max(_all_processes(len(data)))
    padded = np.zeros(size, np.uint8)
    padded[:len(data)] = data
    rows = np.asarray(multihost_utils.process_allgather(padded)).reshape(jax.process_count(), size)
    return [json.loads(bytes(row).rstrip(b"\0")) for row in rows]


def fetch(tree):
    """A pytree of jax.Arrays as numpy, whole: with several processes, an array split across them is
    gathered (a collective), a replicated one read from this process's copy."""
    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return np.asarray(x)
        if x.sharding.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        from jax.experimental import multihost_utils
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return jax.tree.map(one, tree)


def local_part(tree, mesh):
    """This process's rows of arrays stacked ``[K, B, ...]`` and split over ``data`` on dimension 1
    (what its own input fed), as numpy."""
    if jax.process_count() == 1:
        return fetch(tree)
    from jax.experimental import multihost_utils
    local = multihost_utils.global_array_to_host_local_array(tree, mesh, P(None, "data"))
    return jax.tree.map(np.asarray, local)
