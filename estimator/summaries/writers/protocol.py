"""``MetricWriter``: what a metric writer implements, and the checks of ``RunConfig.writers``' entries.

The method names and arguments are those of CLU's ``clu.metric_writers.MetricWriter``
(``write_scalars(step, scalars)``, ...), so a CLU writer is a MetricWriter here as it is.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from estimator.errors import InvalidArgumentError

__all__ = ["METHODS", "MetricWriter", "check_metric_writer", "check_writer_entries", "is_writer_factory"]

#: The methods every MetricWriter has, in the order the protocol lists them.
METHODS = ("write_scalars", "write_histograms", "write_images", "write_texts", "write_hparams", "flush", "close")


@runtime_checkable
class MetricWriter(Protocol):
    """Writes a run's summaries somewhere: event files, JSON lines, a tracking service.

    Any object with these seven methods is one (no base class to inherit). ``step`` is an int;
    values may be Python, numpy or JAX scalars and arrays. The estimator calls them on process 0
    only, from the thread that calls ``train`` / ``evaluate``.
    """

    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        """Numbers at ``step``, by tag."""

    def write_histograms(self, step: int, arrays: Mapping[str, Any],
                         num_buckets: Mapping[str, int] | None = None) -> None:
        """The distribution of each array's values at ``step`` (``num_buckets``: buckets per tag, when asked)."""

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        """Images at ``step``: [H, W, C] or [N, H, W, C], C from 1 to 4, uint8 or floats in [0, 1]."""

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Strings at ``step``, by tag."""

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """The run's hyperparameters (a flat mapping of bools, numbers and strings)."""

    def flush(self) -> None:
        """Writes out what is buffered."""

    def close(self) -> None:
        """Flushes and releases the writer; nothing is written to it afterwards."""


def _missing(obj) -> list[str]:
    return [name for name in METHODS if not callable(getattr(obj, name, None))]


def _described(obj) -> str:
    """``obj`` in a message: a class or function by its name, anything else by its repr and type."""
    if isinstance(obj, type):
        return f"the class {obj.__qualname__}"
    name = getattr(obj, "__qualname__", None)
    if isinstance(name, str):
        return f"{name} (a {type(obj).__name__})"
    if type(obj).__repr__ is object.__repr__:
        return f"an object of class {type(obj).__name__}"
    return f"{reprlib.repr(obj)} (a {type(obj).__name__})"


_WHAT = ("a MetricWriter (an object with " + ", ".join(METHODS[:-1]) + " and " + METHODS[-1]
         + ": see estimator.writers.MetricWriter), or a class or function making one from a log directory")


def is_writer_factory(entry) -> bool:
    """Whether a (checked) ``RunConfig.writers`` entry makes writers (a class, or a function) rather than
    being one writer shared by every call."""
    return isinstance(entry, type) or bool(_missing(entry))


def check_writer_entries(entries, where: str = "RunConfig.writers") -> tuple:
    """``entries`` as a tuple, each a MetricWriter, a class implementing it or another callable (a
    factory, checked when it is called); else ``InvalidArgumentError`` naming the entry and what it lacks."""
    if isinstance(entries, (str, bytes)) or not isinstance(entries, (list, tuple)):
        hint = ": put it in a list" if not isinstance(entries, (str, bytes)) and (
            callable(entries) or not _missing(entries)) else ""
        raise InvalidArgumentError(f"{where} must be a list of writers (each {_WHAT}), got {entries!r}{hint}")
    for i, entry in enumerate(entries):
        missing = _missing(entry)
        if isinstance(entry, type) and missing:
            raise InvalidArgumentError(f"{where}[{i}] must be {_WHAT}; got {_described(entry)}, "
                                       f"which lacks {', '.join(missing)}")
        if missing and (len(missing) < len(METHODS) or not callable(entry)):
            raise InvalidArgumentError(f"{where}[{i}] must be {_WHAT}; got {_described(entry)}, "
                                       f"which lacks {', '.join(missing)}")
    return tuple(entries)


def check_metric_writer(writer, where: str):
    """``writer`` itself when it has every method of :class:`MetricWriter`, else ``InvalidArgumentError``
    saying ``where`` it came from and what it lacks."""
    missing = _missing(writer)
    if missing:
        raise InvalidArgumentError(f"{where} gave {_described(writer)}, which is no MetricWriter: it lacks "
                                   f"{', '.join(missing)}")
    return writer
