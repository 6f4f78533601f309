"""Exporting a predict function for serving, and calling it back without the model's code.

:func:`export_model` traces ``predict_fn(variables, features) -> dict of arrays``
once with :mod:`jax.export` and writes a directory that
:func:`load_exported` turns into a plain callable:

``predict.jaxexport``
    ``Exported.serialize()``: the StableHLO of the function, its input and
    output shapes and the platforms it was lowered for (no VJP is kept).
``variables.npz``
    the variables' leaves, each under its JAX key path (``"['dense']['w']"``),
    written and read with ``allow_pickle=False``. The variables are an
    *argument* of the exported function, not constants baked into it.
``signature.json``
    the format version, the feature specs, the outputs' shapes and dtypes
    (symbolic dimensions as strings, such as ``"batch"``), every variable's
    key path, shape and dtype, the JAX version, the platforms, the time, and
    the size and SHA-256 of the two files above.

**Loading runs no code from the directory.** :func:`load_exported` reads
JSON, the flatbuffer of ``jax.export`` and ``.npy`` arrays, never pickle.
Before it parses anything it checks the signature (its name, dtypes and
variables) and each file's size and SHA-256 against it: a file that was
changed, cut short, replaced (say, by a pickle), an array stored as Python
objects, or an array whose shape or dtype differ from the signature raises
:class:`CorruptExportError` naming the file. (Exports written before the
digests were recorded are checked for all but them.)

Shapes: a ``None`` dimension of a :class:`TensorSpec` is symbolic. The first
``None`` of every feature is the one shared batch dimension ``batch``, so all
features must agree on it; any further ``None`` in a feature gets a symbol of
its own, ``<feature>_dim<axis>`` (``tokens_dim1``). JAX compiles the function
again for each new concrete shape; symbolic dimensions must be at least 1.

Platforms: JAX lowers for any of ``"cpu"``, ``"cuda"``, ``"rocm"`` and ``"tpu"``
without that backend being present, and one artefact may hold several (the
platform is then picked when it is called). By default an export is for the
current backend and the CPU; calling it on a platform it was not exported for
raises JAX's ``ValueError``.

The variables may be any pytree (Flax, Equinox or plain dicts): the exported
function takes their flat list of leaves, so its structure needs no
registration. :attr:`LoadedModel.variables` rebuilds them as nested dicts keyed
by the key path entries (dict keys, sequence indices, attribute names).

``saved_model=True`` also writes a TensorFlow SavedModel through ``jax2tf`` into
``saved_model/`` (serving signature ``serving_default``). It needs TensorFlow,
which is never a dependency of this project.

>>> import tempfile, numpy as np
>>> def predict(v, f):
...     return {"y": f["x"] @ v["w"]}
>>> with tempfile.TemporaryDirectory() as tmp:
...     path = export_model(predict, {"w": np.eye(3, dtype=np.float32)}, {"x": TensorSpec((None, 3), "float32")},
...                         tmp + "/model", platforms=("cpu",))
...     serve = load_exported(path)
>>> serve({"x": np.ones((2, 3), np.float32)})["y"].tolist()
[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
>>> serve.signature["outputs"]
{'y': {'shape': ['batch', 3], 'dtype': 'float32'}}
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import logging
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from estimator.errors import (ArgumentTypeError, CorruptExportError, ExportExistsError, InputError,
                              InvalidArgumentError, MissingDependencyError, ModelFnError, NotAnExportError)

FORMAT = "estimator.export"
FORMAT_VERSION = 1
BATCH = "batch"

__all__ = ["LoadedModel", "TensorSpec", "export_model", "load_exported"]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"[\w.-]+")
VARIABLES = "variables.npz"
SIGNATURE = "signature.json"


@dataclass(frozen=True)
class TensorSpec:
    """One serving input: ``shape`` with ``None`` for symbolic dimensions (the batch), and a dtype name."""

    shape: tuple
    dtype: str

    def __post_init__(self):
        shape = tuple(self.shape)
        if not all(d is None or (isinstance(d, int) and d >= 0) for d in shape):
            raise InvalidArgumentError(f"TensorSpec shape {self.shape!r}: each dimension must be None or an int >= 0")
        try:
            dtype = jnp.dtype(self.dtype).name
        except TypeError as e:
            raise InvalidArgumentError(f"TensorSpec dtype {self.dtype!r} is not a dtype") from e
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "dtype", dtype)


def _symbolic_shapes(features: Mapping[str, TensorSpec]) -> dict[str, tuple]:
    """Each spec's shape with its ``None`` dimensions replaced by names: ``batch`` first, then ``<feature>_dim<axis>``."""
    named = {}
    for name, spec in features.items():
        nones = [axis for axis, d in enumerate(spec.shape) if d is None]
        stem = re.sub(r"\W", "_", name)
        symbols = {axis: BATCH if i == 0 else f"{stem}_dim{axis}" for i, axis in enumerate(nones)}
        named[name] = tuple(symbols.get(axis, d) for axis, d in enumerate(spec.shape))
    return named


def _key_entries(path) -> list:
    """A key path as JSON-able entries: dict keys, sequence indices or attribute names."""
    entries = []
    for k in path:
        entry = next(getattr(k, a) for a in ("key", "idx", "name") if hasattr(k, a))
        entries.append(entry if isinstance(entry, int) else str(entry))
    return entries


def export_model(predict_fn, variables, serving_features: Mapping[str, TensorSpec], directory, *,
                 platforms=None, name: str = "predict", overwrite: bool = False, saved_model: bool = False) -> str:
    """Export ``predict_fn(variables, features) -> dict of arrays`` into a new ``directory``; returns its path.

    ``platforms`` defaults to the current backend plus ``"cpu"``. The directory is written
    under a temporary name and renamed into place; an existing non-empty directory is
    refused unless ``overwrite=True``.
    """
    if not serving_features or not all(isinstance(s, TensorSpec) for s in serving_features.values()):
        raise ArgumentTypeError("serving_features must be a non-empty dict of feature name -> TensorSpec")
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"export name {name!r} must be a plain file name")
    directory = os.path.abspath(os.fspath(directory))
    if os.path.exists(directory) and not (os.path.isdir(directory) and (overwrite or not os.listdir(directory))):
        raise ExportExistsError(f"{directory} already exists and is not an empty directory "
                                "(pass overwrite=True to replace it)")
    platforms = tuple(dict.fromkeys(platforms or (jax_export.default_export_platform(), "cpu")))

    paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(variables)
    leaves = [np.asarray(jnp.asarray(leaf)) for _, leaf in paths_leaves]
    keys = [jax.tree_util.keystr(path) for path, _ in paths_leaves]

    def flat_predict(leaves, features):
        return predict_fn(jax.tree_util.tree_unflatten(treedef, leaves), features)

    shapes = _symbolic_shapes(serving_features)
    names = sorted({d for shape in shapes.values() for d in shape if isinstance(d, str)})
    symbols = dict(zip(names, jax_export.symbolic_shape(", ".join(names))))  # one call: one scope, shared symbols
    feature_args = {n: jax.ShapeDtypeStruct(tuple(symbols.get(d, d) for d in shapes[n]), spec.dtype)
                    for n, spec in serving_features.items()}
    leaf_args = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in leaves]
    exported = jax_export.export(jax.jit(flat_predict), platforms=platforms)(leaf_args, feature_args)
    outputs = jax.tree_util.tree_unflatten(exported.out_tree, exported.out_avals)
    if not (isinstance(outputs, dict) and all(isinstance(k, str) and hasattr(v, "shape") for k, v in outputs.items())):
        raise ModelFnError(f"predict_fn must return a flat dict of arrays keyed by name; it returned {outputs!r}")

    signature = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "name": name,
        "features": {n: {"shape": list(shapes[n]), "dtype": s.dtype} for n, s in serving_features.items()},
        "outputs": {n: {"shape": [d if isinstance(d, int) else str(d) for d in a.shape], "dtype": a.dtype.name}
                    for n, a in outputs.items()},
        "variables": [{"key": k, "path": _key_entries(p), "shape": list(x.shape), "dtype": x.dtype.name}
                      for k, (p, _), x in zip(keys, paths_leaves, leaves)],
        "platforms": list(platforms), "jax_version": jax.__version__,
        "calling_convention_version": exported.calling_convention_version,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }

    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.tmp-", dir=parent)
    try:
        with open(os.path.join(tmp, f"{name}.jaxexport"), "wb") as f:
            f.write(exported.serialize())
        with open(os.path.join(tmp, VARIABLES), "wb") as f:
            np.savez(f, allow_pickle=False, **dict(zip(keys, leaves)))
        signature["files"] = {}
        for file in (f"{name}.jaxexport", VARIABLES):
            with open(os.path.join(tmp, file), "rb") as f:
                data = f.read()
            signature["files"][file] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        with open(os.path.join(tmp, SIGNATURE), "w") as f:
            json.dump(signature, f, indent=2)
        if saved_model:
            _write_saved_model(os.path.join(tmp, "saved_model"), flat_predict, leaves, shapes, serving_features, platforms)
        if os.path.isdir(directory) and os.listdir(directory):  # overwrite: move the old export aside, then swap
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(directory)}.old-", dir=parent)
            os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old)
        else:
            os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def _write_saved_model(path, flat_predict, leaves, shapes, serving_features, platforms):
    """The optional TensorFlow SavedModel: the same function through ``jax2tf``, the variables as ``tf.Variable``."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise MissingDependencyError("saved_model=True needs TensorFlow (pip install tensorflow); "
                                     "the jax.export artefact does not") from e
    from jax.experimental import jax2tf

    names = sorted(serving_features)
    tf_fn = jax2tf.convert(lambda leaves, *xs: flat_predict(leaves, dict(zip(names, xs))), with_gradient=False,
                           polymorphic_shapes=[None] + [f"({', '.join(map(str, shapes[n]))})" for n in names],
                           native_serialization_platforms=platforms)
    module = tf.Module()
    module.leaves = [tf.Variable(x, trainable=False) for x in leaves]
    input_signature = [tf.TensorSpec([d if isinstance(d, int) else None for d in shapes[n]],
                                     serving_features[n].dtype, name=n) for n in names]
    module.serve = tf.function(lambda *xs: tf_fn(module.leaves, *xs), autograph=False, input_signature=input_signature)
    tf.saved_model.save(module, path, signatures=module.serve.get_concrete_function())


class LoadedModel:
    """An exported predict function, callable on any batch size: ``model(features) -> dict of numpy arrays``.

    ``signature`` is ``signature.json``; ``variables`` the exported variables as nested dicts of numpy
    arrays; ``exported`` the :class:`jax.export.Exported`, which can also be called inside other JAX code.
    """

    def __init__(self, directory):
        directory = os.fspath(directory)
        self.signature = _read_signature(directory)
        program = os.path.join(directory, f"{self.signature['name']}.jaxexport")
        data = _read_checked(program, self.signature)
        try:
            self.exported = jax_export.deserialize(bytearray(data))
        except Exception as e:
            raise CorruptExportError(program, f"not a jax.export serialization ({type(e).__name__}: {e})") from None
        leaves = _read_leaves(directory, self.signature)
        self._leaves = jax.device_put(leaves)
        self._call = jax.jit(self.exported.call)
        self.variables = _nest([v["path"] for v in self.signature["variables"]], leaves)

    def __call__(self, features: Mapping) -> dict[str, np.ndarray]:
        if not isinstance(features, Mapping):
            raise InputError(f"features must be a dict of feature name -> array, not {type(features).__name__}")
        expected = self.signature["features"]
        unknown, missing = sorted(set(features) - set(expected)), sorted(set(expected) - set(features))
        if unknown or missing:
            raise InputError(f"unknown features {unknown} and missing features {missing}; "
                             f"this model takes {sorted(expected)}")
        arrays, sizes = {}, {}
        for name, spec in expected.items():
            x = features[name] if hasattr(features[name], "shape") else np.asarray(features[name])
            if np.dtype(x.dtype) != jnp.dtype(spec["dtype"]):
                raise InputError(f"feature {name!r} has dtype {np.dtype(x.dtype).name}, expected {spec['dtype']}")
            shape = spec["shape"]
            if len(x.shape) != len(shape) or any(isinstance(d, int) and d != n for d, n in zip(shape, x.shape)):
                raise InputError(f"feature {name!r} has shape {tuple(x.shape)}, expected {_show(shape)}")
            for d, n in zip(shape, x.shape):
                if isinstance(d, str):
                    if n < 1:
                        raise InputError(f"feature {name!r} has shape {tuple(x.shape)}: its dimension {d!r} "
                                         "must be at least 1")
                    first = sizes.setdefault(d, (n, name))
                    if first[0] != n:
                        raise InputError(f"feature {name!r} has {d} = {n} "
                                         f"but feature {first[1]!r} has {d} = {first[0]}")
            arrays[name] = x
        return {k: np.asarray(v) for k, v in self._call(self._leaves, arrays).items()}


def _read_signature(directory: str) -> dict:
    """``signature.json``, checked: its format, a plain program name, plain array dtypes, a list of variables."""
    path = os.path.join(directory, SIGNATURE)
    try:
        with open(path, "rb") as f:
            signature = json.loads(f.read())
    except FileNotFoundError:
        raise NotAnExportError(f"{directory} is not an export: it has no {SIGNATURE}") from None
    except ValueError as e:
        raise CorruptExportError(path, f"not JSON ({e})") from None
    if not isinstance(signature, dict) or signature.get("format") != FORMAT \
            or signature.get("format_version") != FORMAT_VERSION:
        raise NotAnExportError(f"{directory} is not an {FORMAT} directory of version {FORMAT_VERSION}")
    try:
        if not (isinstance(signature["name"], str) and _NAME.fullmatch(signature["name"])):
            raise ValueError(f"name {signature['name']!r} is not a plain file name")
        specs = [(f"variable {v['key']!r}", v["dtype"], v["shape"]) for v in signature["variables"]]
        specs += [(f"feature {n!r}", spec["dtype"], spec["shape"]) for n, spec in signature["features"].items()]
        for what, dtype, shape in specs:
            if not isinstance(dtype, str) or not isinstance(shape, list):
                raise ValueError(f"{what} has dtype {dtype!r} and shape {shape!r}")
            if _plain_dtype(dtype) is None:
                raise ValueError(f"{what} has dtype {dtype!r}, not a numeric or boolean array dtype")
        files = signature.get("files", {})
        if not (isinstance(files, dict) and all(isinstance(e, dict) and isinstance(e.get("size"), int)
                                                and isinstance(e.get("sha256"), str) for e in files.values())):
            raise ValueError("its file digests are not {name: {size, sha256}}")
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise CorruptExportError(path, f"not a valid signature ({type(e).__name__}: {e})") from None
    if "files" not in signature:
        logger.warning("%s records no file digests (written before they were): its files are not checked", path)
    return signature


def _plain_dtype(name: str):
    """The dtype called ``name`` if it holds plain numbers or booleans (no objects, no fields), else None."""
    try:
        dtype = jnp.dtype(name)
    except TypeError:
        return None
    if dtype.hasobject or dtype.names is not None or dtype.subdtype is not None or dtype.kind not in "biufcV":
        return None
    return dtype


def _read_checked(path: str, signature: dict) -> bytes:
    """The bytes of an export file, refused unless their size and SHA-256 are those the signature records."""
    with open(path, "rb") as f:
        data = f.read()
    expected = signature.get("files", {}).get(os.path.basename(path))
    if expected is None:
        if "files" in signature:
            raise CorruptExportError(path, "the signature records no digest for it")
        return data
    if len(data) != expected["size"]:
        raise CorruptExportError(path, f"it has {len(data)} bytes, {expected['size']} were exported")
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise CorruptExportError(path, "its SHA-256 differs from the one recorded when it was exported")
    return data


def _read_leaves(directory: str, signature: dict) -> list[np.ndarray]:
    """The exported variables' leaves in signature order, read without pickle and checked against the signature."""
    path = os.path.join(directory, VARIABLES)
    data = _read_checked(path, signature)
    if not data.startswith(b"PK"):
        raise CorruptExportError(path, "not an .npz archive" + (
            ": it is a pickle, and pickles are never loaded" if data[:1] == b"\x80" else ""))
    leaves = []
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            for v in signature["variables"]:
                stored, dtype = npz[v["key"]], _plain_dtype(v["dtype"])
                # bfloat16 and other ml_dtypes come back as raw void bytes: view them as the recorded dtype
                if stored.dtype != dtype and not (stored.dtype.kind == "V" and stored.dtype.itemsize == dtype.itemsize
                                                  and stored.dtype.names is None):
                    raise ValueError(f"{v['key']} is stored as {stored.dtype}, the signature says {dtype}")
                leaf = stored.view(dtype)
                if list(leaf.shape) != v["shape"]:
                    raise ValueError(f"{v['key']} has shape {list(leaf.shape)}, the signature says {v['shape']}")
                leaves.append(leaf)
    except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise CorruptExportError(path, f"not the exported variables ({type(e).__name__}: {e})") from None
    return leaves


def is_export(directory) -> bool:
    """Whether ``directory`` holds an :func:`export_model` artefact."""
    return os.path.isfile(os.path.join(os.fspath(directory), SIGNATURE))


def read_exported_variables(directory):
    """An export's variables as nested dicts of numpy arrays (see :attr:`LoadedModel.variables`),
    without loading its program."""
    directory = os.fspath(directory)
    signature = _read_signature(directory)
    return _nest([v["path"] for v in signature["variables"]], _read_leaves(directory, signature))


def _show(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def _nest(paths, leaves):
    """Nested dicts from key-path entries; a lone leaf at the root is returned as is."""
    if len(paths) == 1 and not paths[0]:
        return leaves[0]
    root = {}
    for path, leaf in zip(paths, leaves):
        node = root
        for entry in path[:-1]:
            node = node.setdefault(entry, {})
        node[path[-1]] = leaf
    return root


def load_exported(directory) -> LoadedModel:
    """Load an :func:`export_model` directory; needs neither the model's code nor pickle.

    A file that differs from what was exported is refused with :class:`CorruptExportError` naming it.
    """
    return LoadedModel(directory)
