"""Writing an export: :func:`export_model` traces ``predict_fn(variables, features) -> dict of arrays`` once with
:mod:`jax.export` and writes its directory (the files: :mod:`estimator.export`) under a temporary name, renamed
into place once every file and the digests of ``signature.json`` are written.

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
registration. :attr:`~estimator.export.loading.LoadedModel.variables` rebuilds
them as nested dicts keyed by the key path entries (dict keys, sequence
indices, attribute names).

``saved_model=True`` also writes a TensorFlow SavedModel through ``jax2tf`` into
``saved_model/`` (serving signature ``serving_default``). It needs TensorFlow,
which is never a dependency of this project.
"""

from __future__ import annotations

import datetime
import json
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

from estimator.errors import (ArgumentTypeError, ExportExistsError, InvalidArgumentError, MissingDependencyError,
                              ModelFnError)
from estimator.export.integrity import SIGNATURE, file_digests
from estimator.export.layout import FORMAT, FORMAT_VERSION, NAME, NAME_RULE, VARIABLES, local_path

BATCH = "batch"

__all__ = ["TensorSpec", "export_model"]


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
    if not NAME.fullmatch(name):
        raise InvalidArgumentError(f"export name {name!r} must be {NAME_RULE}")
    directory = os.path.abspath(os.fspath(local_path(directory, "export")))
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


def _write_leaves(path: str, keys: list[str], leaves: list[np.ndarray]) -> None:
    """The archive numpy's ``savez`` writes (one stored ``<key>.npy`` member per leaf), each leaf written without
    pickle: numpy 2.0's ``savez`` takes no ``allow_pickle`` (it would store the flag as one more array)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as npz:
        for key, leaf in zip(keys, leaves):
            with npz.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, leaf, allow_pickle=False)
