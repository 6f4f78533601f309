"""A producer's failure as the ring's error record carries it: JSON (type, constructor arguments,
traceback text), never a pickle, cut to fit the record.

The constructor arguments keep their types through the record: JSON's own values as they are, and tuples,
dicts, datetimes and bytes as tagged objects (``{"$": "tuple", "v": [...]}``), so that an error rebuilt in the
trainer has the attributes it had in the worker (a :class:`~infeed.errors.SourceChangedError`'s
``(size, modification time)`` pairs, for one). A value of any other type travels as its ``repr``."""

from __future__ import annotations

import base64
import builtins
import datetime
import json
import numbers
import traceback
from typing import NamedTuple

from infeed import errors as errors_module
from infeed.errors import InfeedError

__all__ = ["ProducerFailure", "encode_failure", "decode_failure"]

_PRODUCER_NOTE = "Raised in the producer process:\n"


def _tagged(value):
    """``value`` as JSON's values, tuples, dicts, datetimes and bytes tagged (see the module's docstring)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else {"$": "float", "v": repr(value)}
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, tuple):
        return {"$": "tuple", "v": [_tagged(v) for v in value]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"$": "dict", "v": {k: _tagged(v) for k, v in value.items()}}
    if isinstance(value, datetime.datetime):
        return {"$": "datetime", "v": value.isoformat()}
    if isinstance(value, (bytes, bytearray)):
        return {"$": "bytes", "v": base64.b64encode(bytes(value)).decode()}
    return {"$": "repr", "v": repr(value)}


_UNTAG = {
    "tuple": lambda v: tuple(_untagged(x) for x in v),
    "dict": lambda v: {k: _untagged(x) for k, x in v.items()},
    "datetime": datetime.datetime.fromisoformat,
    "bytes": base64.b64decode,
    "float": float,
    "repr": str,
}


def _untagged(value):
    """The value :func:`_tagged` made ``value`` of; ValueError for a record it cannot have made."""
    if isinstance(value, list):
        return [_untagged(v) for v in value]
    if isinstance(value, dict):
        untag = _UNTAG.get(value.get("$"))
        if untag is None or set(value) != {"$", "v"}:
            raise ValueError(f"not a tagged value: {value!r:.80}")
        return untag(value["v"])
    return value


class ProducerFailure(NamedTuple):
    """A ring's error record: who failed and with what (and where, in ``traceback``; ``unit``: the unit
    the producer was at, None where it failed at none)."""

    pid: int
    signal: int | None
    exception: BaseException | None
    message: str
    traceback: str = ""
    unit: int | None = None

    def raise_(self, note: str | None = None):
        """Raises the producer's exception; one of a type not rebuilt is an InfeedError with its message,
        both with the producer's traceback as a note (and ``note`` after it, if given)."""
        error = self.exception
        if error is None:
            error = InfeedError(f"process {self.pid} failed: {self.message}")
            if self.traceback:
                error.add_note(_PRODUCER_NOTE + self.traceback)
        if note:
            error.add_note(note)
        raise error


def encode_failure(error: BaseException | str, limit: int) -> bytes:
    """JSON of ``error`` in at most ``limit`` bytes (its traceback cut first, then its arguments)."""
    if isinstance(error, str):
        record = {"message": error}
    else:
        formatted = traceback.TracebackException.from_exception(error)
        if type(error).__module__ == errors_module.__name__:
            formatted.__notes__ = None          # rebuilt from its arguments, its own notes with it
        record = {"message": f"{type(error).__name__}: {error}", "type": type(error).__name__,
                  "module": type(error).__module__, "traceback": "".join(formatted.format())[-2048:]}
        reduced = error.__reduce__()
        args = reduced[1] if isinstance(reduced, tuple) and len(reduced) > 1 else error.args
        try:
            record["args"] = _tagged(list(args))
        except (TypeError, ValueError, RecursionError):
            pass
    payload = json.dumps(record).encode()
    tb, cut = record.get("traceback", ""), 0
    while len(payload) > limit and cut < len(tb):         # keep the exception, cut its traceback
        cut += len(payload) - limit + 64
        record["traceback"] = "..." + tb[cut:]
        payload = json.dumps(record).encode()
    if len(payload) > limit:
        record = {"message": record["message"][: limit // 2]}
        payload = json.dumps(record).encode()[:limit]
    return payload


def decode_failure(payload: bytes) -> tuple[str, BaseException | None, str]:
    """(message, rebuilt exception or None, the producer's traceback or ""); only infeed's errors and
    built-in exceptions are rebuilt (with the traceback as a note)."""
    try:
        record = json.loads(payload)
    except ValueError:
        return payload.decode(errors="replace"), None, ""
    if not isinstance(record, dict):
        return payload.decode(errors="replace"), None, ""
    message, tb = str(record.get("message", "")), str(record.get("traceback") or "")
    name, module, args = record.get("type"), record.get("module"), record.get("args")
    try:
        args = _untagged(args)
    except (TypeError, ValueError, AttributeError, RecursionError):
        args = None
    if module == "infeed.errors":
        cls = getattr(errors_module, name, None)
    elif module == "builtins":
        cls = getattr(builtins, name, None)
    else:
        cls = None
    if not (isinstance(cls, type) and issubclass(cls, Exception) and isinstance(args, list)):
        return message, None, tb
    try:
        exc = cls(*args)
    except Exception:
        return message, None, tb
    if tb:
        exc.add_note(_PRODUCER_NOTE + tb)
    return message, exc, tb
