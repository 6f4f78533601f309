"""Where an iterator input stands, as checkpoints save it: the ``get_state`` / ``set_state`` protocol.

An ``input_fn`` that returns an iterable (not an ``infeed.Dataset``) resumes
exactly when the iterator ``iter()`` gives for it has Grain's two methods:

- ``get_state()``: the iterator's position after the items it has given, as
  JSON (dicts with str keys, lists, str, int, float, bool, None; it must come
  back from JSON equal, so no tuples, int keys or numpy scalars) or as bytes;
- ``set_state(state)``: go back to such a position (it receives what
  ``get_state`` gave, bytes as bytes).

Grain's iterators have them: what iterating a ``grain.MapDataset`` or
``grain.IterDataset`` gives (``grain.DatasetIterator``) and a
``grain.DataLoader``'s. Grain is never imported: the protocol is duck-typed.

>>> class Counter:
...     def __init__(self): self.i = 0
...     def __iter__(self): return self
...     def __next__(self): self.i += 1; return self.i
...     def get_state(self): return {"i": self.i}
...     def set_state(self, state): self.i = state["i"]
>>> c = Counter(); next(c), next(c)
(1, 2)
>>> saved = snapshot(c)
>>> saved
{'kind': 'get_state', 'iterator': 'estimator.loop.resumable.Counter', 'json': {'i': 2}}
>>> restore(Counter(), saved, "a Counter")

The state is taken right after each item is pulled and travels with the
item's batch (through the stacking of ``iterations_per_loop`` batches and the
feeder's prefetch), so a checkpoint saves the position after the last batch
trained on, never after the batches prefetched beyond it. Each state is kept
in a checkpoint's JSON extras as ``{"kind": "get_state", "iterator": TYPE,
"json": STATE}`` (``"base64": ...`` for bytes); nothing is pickled.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging

from estimator.errors import InputError

__all__ = ["KIND", "has_protocol", "snapshot", "restore", "is_iterator_state", "not_resumable"]

_log = logging.getLogger("estimator")

#: The ``"kind"`` of a saved iterator state (an ``infeed.Dataset``'s position has none).
KIND = "get_state"


def has_protocol(iterator) -> bool:
    """Whether ``iterator`` has callable ``get_state`` and ``set_state``."""
    return callable(getattr(iterator, "get_state", None)) and callable(getattr(iterator, "set_state", None))


def type_name(obj) -> str:
    """``obj``'s type as ``module.Qualname`` (a builtin's bare name)."""
    kind = type(obj)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def snapshot(iterator) -> dict:
    """``iterator.get_state()`` now, as the JSON document a checkpoint keeps (a copy: later
    changes of the iterator's own objects do not reach it); an InputError when it is not JSON."""
    state = iterator.get_state()
    name = type_name(iterator)
    if isinstance(state, (bytes, bytearray, memoryview)):
        return {"kind": KIND, "iterator": name, "base64": base64.b64encode(bytes(state)).decode("ascii")}
    try:
        copy = json.loads(json.dumps(state, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise InputError(f"the input's iterator {name}.get_state() gave a state that is not JSON ({e}): it must "
                         f"return dicts with str keys, lists, str, int, float, bool and None, or bytes") from None
    if copy != state:
        raise InputError(f"the input's iterator {name}.get_state() gave a state that does not come back from JSON "
                         f"equal (tuples, int keys, numpy values?): {state!r} came back as {copy!r}")
    return {"kind": KIND, "iterator": name, "json": copy}


def is_iterator_state(saved) -> bool:
    """Whether ``saved`` (an input position from a checkpoint) is an iterator's, made by :func:`snapshot`."""
    return isinstance(saved, dict) and saved.get("kind") == KIND


def restore(iterator, saved: dict, what: str) -> None:
    """Puts ``iterator`` (of the input ``what``, for messages) back at the position ``saved``; an
    InputError when it cannot take it (no ``set_state``, another kind of position, a refusal)."""
    if not is_iterator_state(saved):
        raise InputError(f"the checkpoint holds an infeed.Dataset's input position; input_fn gave {what} instead: "
                         f"it cannot resume there (give the Dataset, or train in a new model_dir)")
    if not has_protocol(iterator):
        raise InputError(f"the checkpoint holds the input position of a {saved.get('iterator')} iterator; "
                         f"input_fn gave {what}, whose iterator {type_name(iterator)} has no get_state()/set_state(): "
                         f"it cannot resume there")
    try:
        state = base64.b64decode(saved["base64"], validate=True) if "base64" in saved else saved["json"]
    except (KeyError, TypeError, binascii.Error) as e:
        raise InputError(f"the checkpoint's iterator input position is malformed ({type(e).__name__}: {e}): "
                         f"{saved!r}") from None
    try:
        iterator.set_state(state)
    except Exception as e:                  # noqa: BLE001 -- whatever it is, the user's iterator refused the state
        raise InputError(f"{type_name(iterator)}.set_state refused the input position saved by a "
                         f"{saved.get('iterator')} iterator: {type(e).__name__}: {e}") from e


def not_resumable(what: str, required: bool) -> None:
    """Says loudly that the training input ``what`` will start again from its beginning: a WARNING on
    the ``estimator`` logger, or an InputError when ``required`` (``RunConfig.require_resumable_input``)."""
    message = (f"input_fn gave {what}, which cannot save its position (an infeed.Dataset, a Grain DataLoader or "
               f"dataset, or an iterator with get_state()/set_state() can): the next train() call and a run "
               f"restored from a checkpoint read it again from its beginning")
    if required:
        raise InputError(message + " (RunConfig.require_resumable_input=True)")
    _log.warning("%s (RunConfig(require_resumable_input=True) makes this an error)", message)
