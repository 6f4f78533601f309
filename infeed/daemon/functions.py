"""User functions that the worker processes import by name: never pickled, never sent as code.

A function is named ``"package.module:qualname"`` (``"package.module.qualname"`` is read too). One
given as an object must be importable under its own ``__module__`` and ``__qualname__``, so lambdas,
functions defined inside other functions and functions of ``__main__`` (the worker's ``__main__`` is
not the trainer's script) are refused when the dataset is made, each with what to do instead.

>>> f = load_function("json.dumps")
>>> f.name, f.takes_rng
('json:dumps', False)
"""

from __future__ import annotations

import importlib
import inspect
from typing import Callable, NamedTuple

__all__ = ["UserFunction", "load_function"]


class UserFunction(NamedTuple):
    """A function found by name: ``name`` (``module:qualname``), the function, and whether it takes a generator
    (a second positional parameter: the generator is only made for functions that take it)."""

    name: str
    fn: Callable
    takes_rng: bool


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def _resolve(module_name: str, attribute: str):
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def _candidates(name: str) -> list[tuple[str, str]]:
    """(module, attribute path) pairs ``name`` may mean, the longest module first."""
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        return [(module_name, attribute)]
    parts = name.split(".")
    return [(".".join(parts[:i]), ".".join(parts[i:])) for i in range(len(parts) - 1, 0, -1)]


def _import(field: str, name: str) -> tuple[str, object]:
    """(``module:qualname``, the object) that ``name`` names; a ValueError naming ``field`` if none."""
    problems = []
    for module_name, attribute in _candidates(name):
        if not module_name or not attribute:
            continue
        if module_name == "__main__":
            raise ValueError(f"{field}={name!r} is in __main__, which the workers cannot import: "
                             "move the function into a module")
        try:
            return f"{module_name}:{attribute}", _resolve(module_name, attribute)
        except ModuleNotFoundError as e:
            if e.name is None or not (module_name + ".").startswith(e.name + "."):
                raise ValueError(f"{field}={name!r}: importing {module_name} failed: {e}") from e
            problems.append(str(e))
        except AttributeError as e:
            problems.append(f"module {module_name}: {e}")
        except Exception as e:
            raise ValueError(f"{field}={name!r}: importing {module_name} failed: {type(e).__name__}: {e}") from e
    found = "; ".join(problems) or "not a 'package.module:function' name"
    raise ValueError(f"{field}={name!r} cannot be imported ({found})")


def _takes_rng(field: str, name: str, fn) -> bool:
    """Whether ``fn`` is called with the generator: when it can take a second positional argument."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):             # no signature to read (some built-ins): pass the generator
        return True
    kind, parameters = inspect.Parameter, signature.parameters.values()
    positional = [p for p in parameters if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD)]
    varargs = any(p.kind is kind.VAR_POSITIONAL for p in parameters)
    required = [p for p in parameters if p.default is p.empty and p.kind not in (kind.VAR_POSITIONAL, kind.VAR_KEYWORD)]
    if not (positional or varargs) or len(required) > 2 or any(p.kind is kind.KEYWORD_ONLY for p in required):
        raise ValueError(f"{field}={name} must take (data) or (data, rng), its signature is {signature}")
    return varargs or len(positional) >= 2


def load_function(value, field: str = "function") -> UserFunction:
    """The function ``value`` names (a ``"module:qualname"`` string) or is (a module-level function);
    ``field`` names the argument in errors."""
    if isinstance(value, str):
        name, fn = _import(field, value)
        if not callable(fn):
            raise ValueError(f"{field}={value!r} names {_a(type(fn).__name__)}, not a function")
    elif callable(value):
        module_name, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
        if not isinstance(module_name, str) or not isinstance(qualname, str):
            raise ValueError(f"{field}={value!r:.80} has no importable name: pass a function defined with def "
                             "at the top level of a module, or its 'module:function' name")
        if qualname.split(".")[-1] == "<lambda>":
            raise ValueError(f"{field} is a lambda, which the workers cannot import by name: define it with def "
                             "at the top level of a module")
        if "<locals>" in qualname:
            raise ValueError(f"{field}={module_name}:{qualname} is defined inside a function, where the workers "
                             "cannot import it: define it at the top level of a module")
        name, fn = _import(field, f"{module_name}:{qualname}")
        if fn is not value:
            raise ValueError(f"{field}: {name} names another object than the one given (redefined or wrapped "
                             "without functools.wraps?)")
    else:
        raise ValueError(f"{field} must be a function or its 'module:function' name, got {value!r:.80}")
    return UserFunction(name, fn, _takes_rng(field, name, fn))
