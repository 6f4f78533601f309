"""Loading an export: :func:`load_exported` turns an :func:`~estimator.export.saving.export_model` directory back
into a plain callable, :class:`LoadedModel`, without the model's code.

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
pin (``expected_digest``): :mod:`estimator.export.integrity`.

Memory stays bounded by the files' real sizes whatever they declare: only
regular files are read (never a symbolic link, a FIFO or a device), and an
array whose header declares more bytes than its ``.npz`` member holds is
refused before it is allocated.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import zipfile
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import export as jax_export

from estimator.errors import (ArgumentTypeError, CorruptExportError, ExportIntegrityError, InputError,
                              InvalidArgumentError, NotAnExportError)
from estimator.export.integrity import SHA256_HEX, SIGNATURE, check_listing, open_checked, open_regular
from estimator.export.layout import FORMAT, FORMAT_VERSION, NAME, NAME_RULE, VARIABLES, local_path

__all__ = ["LoadedModel", "load_exported", "is_export", "read_exported_variables"]


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
        if not (isinstance(signature["name"], str) and NAME.fullmatch(signature["name"])):
            raise ValueError(f"name {signature['name']!r} is not {NAME_RULE}")
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
    """Whether ``directory`` holds an :func:`~estimator.export.saving.export_model` artefact."""
    return os.path.isfile(os.path.join(local_path(directory, "is_export"), SIGNATURE))


def read_exported_variables(directory):
    """An export's variables as nested dicts of numpy arrays (see :attr:`LoadedModel.variables`),
    without loading its program; its list of digests and the variables' digest are checked."""
    directory = os.fspath(local_path(directory, "read_exported_variables"))
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
    """Load an :func:`~estimator.export.saving.export_model` directory; needs neither the model's code nor pickle.

    A file that differs from what was exported is refused with :class:`CorruptExportError` naming it; an
    export whose ``signature.json`` lists no digests, or not every file, with :class:`ExportIntegrityError`.
    ``verify=False`` skips the digest checks (an export written before they were recorded); the checks
    that keep pickles out and memory bounded stay. ``expected_digest``: the :func:`estimator.export_digest`
    taken at export and kept apart from the files; a ``signature.json`` of another SHA-256 is
    :class:`ExportIntegrityError`, which makes an export rewritten with a matching list an error too.
    """
    return LoadedModel(local_path(directory, "load_exported"), verify=verify, expected_digest=expected_digest)
