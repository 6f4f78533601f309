"""``RunWriters``: ``RunConfig.writers`` opened for one ``train`` or ``evaluate`` call, written to as one.

A ``RunConfig.writers`` entry is either

* a **writer factory**: a class such as :class:`~estimator.writers.TensorBoardWriter` or
  :class:`~estimator.writers.JsonLinesWriter`, or a function, called with the run's log directory
  (``model_dir`` for training, ``model_dir/eval`` or ``model_dir/eval_<name>`` for an evaluation:
  TensorBoard's runs) when a call starts, and closed when it ends, whatever ends it; or
* a **shared writer**: one MetricWriter object (a tracker's run, say) that every call writes to,
  training's values under their tags and an evaluation's under ``eval/<tag>`` (``eval_<name>/<tag>``).
  It is flushed when a call ends and never closed by the estimator: close it yourself after the last
  call. It gets ``write_hparams`` once.

Only process 0 writes (every process computes the same values); the others open nothing.
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Mapping
from typing import Any, Self

from estimator.summaries.writers.protocol import check_metric_writer, is_writer_factory
from estimator.summaries.writers.values import sort_values

__all__ = ["RunWriters", "hparams_of"]

_log = logging.getLogger("estimator")

# Shared writers already given their hyperparameters (CLU's writers ask for one write_hparams call).
_GIVEN_HPARAMS: weakref.WeakSet = weakref.WeakSet()


def _name(entry) -> str:
    return getattr(entry, "__qualname__", None) or type(entry).__qualname__


def hparams_of(params: Mapping[str, Any] | None, **extra) -> dict:
    """The hyperparameters in ``params`` (an Estimator's ``params``) and ``extra``: entries whose values are
    bools, numbers or strings (numpy scalars included), nested mappings flattened as ``outer/inner``;
    others (arrays, functions, None) left out."""
    out: dict = {}

    def add(prefix: str, mapping: Mapping) -> None:
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            if isinstance(value, Mapping):
                add(name + "/", value)
            elif hasattr(value, "item") and getattr(value, "shape", None) == ():
                out[name] = value.item()
            elif isinstance(value, (bool, int, float, str)):
                out[name] = value

    add("", dict(params or {}))
    add("", {k: v for k, v in extra.items() if v is not None})
    return out


class RunWriters:
    """Every writer of ``entries`` (a checked ``RunConfig.writers``) for the run ``run`` of ``model_dir``
    (``""``: training; ``"eval"``, ``"eval_<name>"``: an evaluation), each method writing to all of them
    in order. ``active`` (default: whether this is process 0): False opens and writes nothing.

    :meth:`close` (or the ``with`` block) closes the writers it made and flushes the shared ones; a
    writer's exception on a write propagates (the call fails, as any host work would), and on close
    the first one is raised once every writer has been closed (logged instead with ``quiet=True``,
    when the call is failing already).
    """

    def __init__(self, entries, model_dir: str, run: str = "", *, active: bool | None = None):
        if active is None:
            import jax
            active = jax.process_index() == 0
        self.logdir = os.path.join(model_dir, run) if run else model_dir
        self.prefix = f"{run}/" if run else ""
        self._writers: list[tuple[Any, bool]] = []          # (writer, made here)
        self._closed = False
        if not active:
            return
        try:
            for i, entry in enumerate(entries):
                if is_writer_factory(entry):
                    where = f"RunConfig.writers[{i}] ({_name(entry)}) called with {self.logdir!r}"
                    self._writers.append((check_metric_writer(entry(self.logdir), where), True))
                else:
                    self._writers.append((entry, False))
        except BaseException:
            self.close(quiet=True)
            raise

    def __len__(self) -> int:
        return len(self._writers)

    @property
    def writers(self) -> list:
        return [w for w, _ in self._writers]

    def _tags(self, mapping: Mapping, made_here: bool) -> Mapping:
        return mapping if made_here or not self.prefix else {self.prefix + k: v for k, v in mapping.items()}

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        if scalars:
            for w, own in self._writers:
                w.write_scalars(step, self._tags(scalars, own))

    def write_histograms(self, step: int, arrays: Mapping[str, Any],
                         num_buckets: Mapping[str, int] | None = None) -> None:
        if arrays:
            for w, own in self._writers:
                if num_buckets:
                    w.write_histograms(step, self._tags(arrays, own), self._tags(num_buckets, own))
                else:
                    w.write_histograms(step, self._tags(arrays, own))

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        if images:
            for w, own in self._writers:
                w.write_images(step, self._tags(images, own))

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        if texts:
            for w, own in self._writers:
                w.write_texts(step, self._tags(texts, own))

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """To every writer made here, and to each shared writer once (in this process's life)."""
        if not hparams:
            return
        for w, own in self._writers:
            if own:
                w.write_hparams(hparams)
                continue
            try:
                if w in _GIVEN_HPARAMS:
                    continue
                _GIVEN_HPARAMS.add(w)
            except TypeError:                # not weakly referenceable (or unhashable): it gets them each call
                pass
            w.write_hparams(hparams)

    def write_values(self, step: int, values: Mapping[str, Any] | None, where: str = "host_call") -> None:
        """``values`` (a host_call function's return: see :mod:`estimator.summaries.writers.values`) sorted by kind and
        written; None writes nothing. Checked in every process, written in the active one."""
        if values is None:
            return
        v = sort_values(values, where)
        self.write_scalars(step, v.scalars)
        self.write_histograms(step, v.histograms, v.num_buckets)
        self.write_images(step, v.images)
        self.write_texts(step, v.texts)

    def flush(self) -> None:
        for w, _ in self._writers:
            w.flush()

    def close(self, quiet: bool = False) -> None:
        """Closes the writers made here and flushes the shared ones (see the class)."""
        if self._closed:
            return
        self._closed = True
        first = None
        for w, own in self._writers:
            try:
                w.close() if own else w.flush()
            except Exception as e:          # noqa: BLE001 - every writer is closed before any error is raised
                if quiet or first is not None:
                    _log.error("closing the metric writer %r failed: %s: %s", w, type(e).__name__, e)
                else:
                    first = e
        if first is not None:
            raise first

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(quiet=exc is not None)
