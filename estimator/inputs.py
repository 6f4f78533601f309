"""What an ``input_fn`` returns, turned into device batches of ``[K, B, ...]`` for the compiled loops.

``input_fn(params)`` returns either an :class:`infeed.Dataset` (decoded by an
:class:`infeed.Daemon`, ``K`` batches per ring slot, moved to the devices by an
:class:`xla_runtime.Feeder` while the previous loop runs) or any iterable of
``(features, labels)`` numpy batches (stacked ``K`` at a time on the host, and
fed the same way). Either way a loop sees one flat dict per step: the
features, the labels (``"labels"`` for an iterable; the Dataset's ``labels``
features), and for evaluation and prediction ``"is_padding"`` ``[B]``, so the
last partial batch is padded, never dropped, and its padding masked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import infeed
from infeed.dataset import PADDING_KEY
from xla_runtime import Feeder

__all__ = ["Input", "split_batch", "PADDING_KEY"]

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
        if isinstance(source, infeed.Dataset):
            if source.batch_size != batch_size:
                raise ValueError(f"input_fn's Dataset has batch_size={source.batch_size}; this mode's per-host "
                                 f"batch is {batch_size} (use params['batch_size'])")
            changes = {"steps_per_slot": steps}
            if exact:
                changes.update(final_batch="pad", num_epochs=1)
            self.dataset = source.replace(**changes)
            self.labels = self.dataset.labels
            self._daemon = infeed.Daemon(self.dataset, num_workers=workers, slots=slots, state=state)
            host = self._daemon
        elif isinstance(source, Iterable):
            if state is not None:
                raise ValueError("only an infeed.Dataset input can resume where a checkpoint left it")
            self.dataset, self.labels = None, None
            host = _stacked(iter(source), steps, batch_size, exact)
        else:
            raise TypeError(f"input_fn must return an infeed.Dataset or an iterable of (features, labels) batches, "
                            f"got {type(source).__name__}")
        self._feeder = Feeder(host, mesh, P(None, "data"))

    def __iter__(self) -> Iterator:
        return iter(self._feeder)

    def state(self) -> dict | None:
        """Where the input resumes after the batches handed out (a Dataset input only)."""
        return self._feeder.state() if self._daemon is not None else None

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
    try:
        features, labels = item
    except (TypeError, ValueError):
        raise TypeError("an input_fn iterable must yield (features, labels) pairs (labels may be None)") from None
    batch = {"features": features, LABELS: labels} if labels is not None else {"features": features}
    batch = jax.tree.map(np.asarray, batch)
    sizes = {np.shape(x)[0] if np.ndim(x) else None for x in jax.tree.leaves(batch)}
    if len(sizes) != 1 or None in sizes:
        raise ValueError(f"every array of an input batch needs the same leading batch dimension, found {sizes}")
    n = sizes.pop()
    if n > batch_size or (n < batch_size and not exact):
        raise ValueError(f"an input batch has {n} examples; this mode's per-host batch is {batch_size}"
                         + ("" if exact else " (only evaluation and prediction pad a short last batch)"))
    if exact:
        batch = jax.tree.map(lambda x: np.concatenate([x, np.zeros((batch_size - n,) + x.shape[1:], x.dtype)]), batch)
        batch[PADDING_KEY] = np.arange(batch_size) >= n
    return batch


def _stacked(items: Iterator, steps: int, batch_size: int, exact: bool) -> Iterator[dict]:
    """Host batches stacked ``steps`` at a time (fewer at the end)."""
    while True:
        chunk = [_as_batch(item, batch_size, exact) for item in itertools.islice(items, steps)]
        if not chunk:
            return
        yield jax.tree.map(lambda *xs: np.stack(xs), *chunk)
