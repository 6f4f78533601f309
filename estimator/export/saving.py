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
    the size and SHA-256 of every other file of the export (``files``).

**Loading runs no code from the directory.** :func:`load_exported` reads
JSON, the flatbuffer of ``jax.export`` and ``.npy`` arrays, never pickle.
Before it parses anything it checks the signature (its name, dtypes and
variables) and each file's size and SHA-256 against it: a file that was
changed, cut short, replaced (say, by a pickle), an array stored as Python
objects, or an array whose shape or dtype differ from the signature raises
:class:`CorruptExportError` naming the file; a signature without the list
of digests, or a list that misses a file or names one that is absent,
raises :class:`ExportIntegrityError`. ``verify=False`` skips the digests
(for exports written before they were recorded); the other checks stay.
What the digests protect against, and the one digest of the whole export to
pin (``expected_digest``): :mod:`estimator.export_integrity`.

Memory stays bounded by the files' real sizes whatever they declare: only
regular files are read (never a symbolic link, a FIFO or a device), and an
array whose header declares more bytes than its ``.npz`` member holds is
refused before it is allocated.

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
import json
import math
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

from estimator.errors import (ArgumentTypeError, CorruptExportError, ExportExistsError, ExportIntegrityError,
                              InputError, InvalidArgumentError, MissingDependencyError, ModelFnError, NotAnExportError)
from estimator.export_integrity import (SHA256_HEX, SIGNATURE, check_listing, file_digests, open_checked,
                                        open_regular)

FORMAT = "estimator.export"
FORMAT_VERSION = 1
BATCH = "batch"

__all__ = ["LoadedModel", "TensorSpec", "export_model", "load_exported"]

_NAME = re.compile(r"\w[\w.-]{0,99}")     # a plain file name: no path, not hidden, not "." or ".."
_NAME_RULE = "a plain file name (a letter, digit or _, then at most 99 of those, '.' or '-')"
VARIABLES = "variables.npz"


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


def _local(directory, what: str):
    """``directory``, refused with InvalidArgumentError when it is a URI: an export is written, renamed
    into place and checked file by file with the operating system's calls, which a bucket does not take."""
    if isinstance(directory, (str, os.PathLike)) and "://" in os.fsdecode(os.fspath(directory)):
        raise InvalidArgumentError(f"{what}: export directories are local paths, got {directory!r}: export to a "
                                   "local directory, then copy it to the bucket (gcloud storage cp -r, aws s3 cp "
                                   "--recursive), and load it from a local copy")
    return directory            # anything else as it came: the callers' own checks name a wrong type


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
        raise InvalidArgumentError(f"export name {name!r} must be {_NAME_RULE}")
    directory = os.path.abspath(os.fspath(_local(directory, "export")))
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
        _write_leaves(os.path.join(tmp, VARIABLES), keys, leaves)
        if saved_model:
            _write_saved_model(os.path.join(tmp, "saved_model"), flat_predict, leaves, shapes, serving_features, platforms)
        signature["files"] = file_digests(tmp)
        with open(os.path.join(tmp, SIGNATURE), "w") as f:
            json.dump(signature, f, indent=2)
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

    ``signature`` is ``signature.json``; ``digest`` its SHA-256 (see :func:`estimator.export_digest`);
    ``variables`` the exported variables as nested dicts of numpy arrays; ``exported`` the
    :class:`jax.export.Exported`, which can also be called inside other JAX code.
    """

    def __init__(self, directory, *, verify: bool = True, expected_digest: str | None = None):
        if not isinstance(directory, (str, os.PathLike)):
            raise ArgumentTypeError(f"an export directory is a path, got {type(directory).__name__}")
        directory = os.fspath(directory)
        if expected_digest is not None and not (verify and isinstance(expected_digest, str)
                                                and SHA256_HEX.fullmatch(expected_digest)):
            raise InvalidArgumentError(f"expected_digest {expected_digest!r} must be the 64 lowercase hex digits "
                                       "of export_digest(), with verify=True")
        self.signature, self.digest, files = _open_export(directory, verify, expected_digest)
        program = f"{self.signature['name']}.jaxexport"
        for name in sorted(files.keys() - {program, VARIABLES}):     # saved_model/: checked, never read here
            open_checked(os.path.join(directory, name), files[name]).close()
        path = os.path.join(directory, program)
        with open_checked(path, files.get(program)) as f:
            data = f.read()
        try:
            self.exported = jax_export.deserialize(bytearray(data))
        except Exception as e:
            raise CorruptExportError(path, f"not a jax.export serialization ({type(e).__name__}: {e})") from None
        leaves = _read_leaves(directory, self.signature, files.get(VARIABLES))
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


def _open_export(directory: str, verify: bool, expected_digest: str | None) -> tuple[dict, str, dict]:
    """``signature.json`` checked (against ``expected_digest`` first, if given), its SHA-256, and with
    ``verify`` its file digests, checked to list exactly the export's files (else ``{}``)."""
    path = os.path.join(directory, SIGNATURE)
    if not os.path.lexists(path):
        raise NotAnExportError(f"{directory} is not an export: it has no {SIGNATURE}")
    with open_regular(path) as f:
        data = f.read()
    digest = hashlib.sha256(data).hexdigest()
    if expected_digest is not None and digest != expected_digest:
        raise ExportIntegrityError(directory, path, f"its SHA-256 is {digest}, not the expected {expected_digest}: "
                                   "the export was changed since that digest was taken")
    signature = _parse_signature(directory, path, data)
    files = check_listing(directory, signature, (f"{signature['name']}.jaxexport", VARIABLES)) if verify else {}
    return signature, digest, files


def _parse_signature(directory: str, path: str, data: bytes) -> dict:
    """``signature.json`` parsed and checked: its format, a plain program name, plain array dtypes, a list of variables."""
    try:
        signature = json.loads(data)
    except ValueError as e:
        raise CorruptExportError(path, f"not JSON ({e})") from None
    if not isinstance(signature, dict) or signature.get("format") != FORMAT \
            or signature.get("format_version") != FORMAT_VERSION:
        raise NotAnExportError(f"{directory} is not an {FORMAT} directory of version {FORMAT_VERSION}")
    try:
        if not (isinstance(signature["name"], str) and _NAME.fullmatch(signature["name"])):
            raise ValueError(f"name {signature['name']!r} is not {_NAME_RULE}")
        specs = [(f"variable {v['key']!r}", v["dtype"], v["shape"]) for v in signature["variables"]]
        specs += [(f"feature {n!r}", spec["dtype"], spec["shape"]) for n, spec in signature["features"].items()]
        for what, dtype, shape in specs:
            if not isinstance(dtype, str) or not isinstance(shape, list):
                raise ValueError(f"{what} has dtype {dtype!r} and shape {shape!r}")
            if _plain_dtype(dtype) is None:
                raise ValueError(f"{what} has dtype {dtype!r}, not a numeric or boolean array dtype")
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise CorruptExportError(path, f"not a valid signature ({type(e).__name__}: {e})") from None
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


def _write_leaves(path: str, keys: list[str], leaves: list[np.ndarray]) -> None:
    """The archive numpy's ``savez`` writes (one stored ``<key>.npy`` member per leaf), each leaf written without
    pickle: numpy 2.0's ``savez`` takes no ``allow_pickle`` (it would store the flag as one more array)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
        for key, leaf in zip(keys, leaves):
            with npz.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, leaf, allow_pickle=False)


def _read_leaves(directory: str, signature: dict, digest: dict | None) -> list[np.ndarray]:
    """The exported variables' leaves in signature order, read without pickle, one ``.npz`` member at a time,
    after the file's ``digest`` (``{"size", "sha256"}``) if given."""
    path = os.path.join(directory, VARIABLES)
    with open_checked(path, digest) as f:
        if (head := f.read(2)) != b"PK":
            raise CorruptExportError(path, "not an .npz archive" + (
                ": it is a pickle, and pickles are never loaded" if head[:1] == b"\x80" else ""))
        f.seek(0)
        try:
            with zipfile.ZipFile(f) as npz:
                return [_read_leaf(npz, v, os.fstat(f.fileno()).st_size) for v in signature["variables"]]
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise CorruptExportError(path, f"not the exported variables ({type(e).__name__}: {e})") from None


def _read_leaf(npz: zipfile.ZipFile, variable: dict, file_size: int) -> np.ndarray:
    """One variable, its ``.npy`` header checked against the signature and against the bytes its member really
    holds before the array is allocated: an archive that declares more than it holds is never read."""
    key, dtype, shape = variable["key"], _plain_dtype(variable["dtype"]), variable["shape"]
    info = npz.getinfo(f"{key}.npy")
    if info.compress_type != zipfile.ZIP_STORED or not info.file_size == info.compress_size <= file_size:
        raise ValueError(f"{key} is compressed, or declares more bytes ({info.file_size}) than the file has")
    with npz.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{key} is an .npy file of version {version}, not 1.0 or 2.0")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        stored_shape, _, stored = read_header(member)
        if stored.hasobject:
            raise ValueError(f"{key} holds Python objects, which only a pickle could load, and pickles are never loaded")
        # bfloat16 and other ml_dtypes are stored as raw void bytes: they are viewed as the recorded dtype
        if stored != dtype and not (stored.kind == "V" and stored.itemsize == dtype.itemsize
                                    and stored.names is None and stored.subdtype is None):
            raise ValueError(f"{key} is stored as {stored}, the signature says {dtype}")
        if list(stored_shape) != shape:
            raise ValueError(f"{key} has shape {list(stored_shape)}, the signature says {shape}")
        declared, held = math.prod(stored_shape) * stored.itemsize, info.file_size - member.tell()
        if declared != held:
            raise ValueError(f"{key} declares {declared} bytes ({stored}{list(stored_shape)}), its member holds {held}")
        member.seek(0)
        return np.lib.format.read_array(member, allow_pickle=False).view(dtype)


def is_export(directory) -> bool:
    """Whether ``directory`` holds an :func:`export_model` artefact."""
    return os.path.isfile(os.path.join(_local(directory, "is_export"), SIGNATURE))


def read_exported_variables(directory):
    """An export's variables as nested dicts of numpy arrays (see :attr:`LoadedModel.variables`),
    without loading its program; its list of digests and the variables' digest are checked."""
    directory = os.fspath(_local(directory, "read_exported_variables"))
    signature, _, files = _open_export(directory, True, None)
    return _nest([v["path"] for v in signature["variables"]], _read_leaves(directory, signature, files[VARIABLES]))


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


def load_exported(directory, *, verify: bool = True, expected_digest: str | None = None) -> LoadedModel:
    """Load an :func:`export_model` directory; needs neither the model's code nor pickle.

    A file that differs from what was exported is refused with :class:`CorruptExportError` naming it; an
    export whose ``signature.json`` lists no digests, or not every file, with :class:`ExportIntegrityError`.
    ``verify=False`` skips the digest checks (an export written before they were recorded); the checks
    that keep pickles out and memory bounded stay. ``expected_digest``: the :func:`estimator.export_digest`
    taken at export and kept apart from the files; a ``signature.json`` of another SHA-256 is
    :class:`ExportIntegrityError`, which makes an export rewritten with a matching list an error too.
    """
    return LoadedModel(_local(directory, "load_exported"), verify=verify, expected_digest=expected_digest)
