"""Issue 8, exports: ``load_exported`` never unpickles, and refuses a tampered or pickle-carrying export
with an error naming the file, before any of it is parsed, let alone run."""

import hashlib
import json
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from estimator.errors import CorruptExportError
from estimator.export import TensorSpec, export_model, load_exported
from estimator.warm_start import warm_start

ROOT = Path(__file__).resolve().parents[2]


def predict(variables, features):
    return {"y": features["x"] @ variables["w"] + variables["b"]}


VARIABLES = {"w": np.arange(6, dtype=np.float32).reshape(3, 2), "b": np.ones(2, np.float32)}


@pytest.fixture
def export(tmp_path):
    return Path(export_model(predict, VARIABLES, {"x": TensorSpec((None, 3), "float32")}, tmp_path / "model",
                             platforms=("cpu",)))


class _Payload:
    """Unpickling this creates ``marker``: what an attacker's pickle would do, harmlessly."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _armed(payload_file: Path, marker: Path) -> None:
    """Proves the planted payload is live: pickle.load in another process creates ``marker``."""
    subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))",
                    str(payload_file)], check=True, timeout=60)
    assert marker.exists()
    marker.unlink()


def _without_digests(export: Path) -> None:
    """Makes ``export`` look written before the file digests: only the deeper checks stand."""
    signature = json.loads((export / "signature.json").read_text())
    del signature["files"]
    (export / "signature.json").write_text(json.dumps(signature))


def _redigest(export: Path, name: str) -> None:
    """Records the current digest of ``name``, as a tamperer who also edits the signature would."""
    signature = json.loads((export / "signature.json").read_text())
    data = (export / name).read_bytes()
    signature["files"][name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (export / "signature.json").write_text(json.dumps(signature))


def _pickled_npz(path: Path, marker: Path) -> None:
    """variables.npz whose arrays are object arrays: each one a pickle of the payload."""
    objects = np.empty(1, dtype=object)
    objects[0] = _Payload(marker)
    with open(path, "wb") as f:
        np.savez(f, **{"['b']": objects, "['w']": objects})


@pytest.mark.parametrize("digests", ["recorded", "absent", "forged"])
@pytest.mark.parametrize("plant", ["variables.npz is a pickle", "variables.npz holds object arrays",
                                   "predict.jaxexport is a pickle"])
def test_a_pickle_planted_in_an_export_is_refused_naming_the_file_and_never_runs(export, tmp_path, plant, digests):
    marker = tmp_path / "payload-ran"
    target = export / ("predict.jaxexport" if "jaxexport" in plant else "variables.npz")
    if plant == "variables.npz holds object arrays":
        _pickled_npz(target, marker)
        with zipfile.ZipFile(target) as z:                      # the member is a pickle of the payload
            (tmp_path / "member.pkl").write_bytes(z.read("['w'].npy")[128:])
        _armed(tmp_path / "member.pkl", marker)
    else:
        target.write_bytes(pickle.dumps(_Payload(marker)))
        _armed(target, marker)
    if digests == "absent":
        _without_digests(export)
    elif digests == "forged":
        _redigest(export, target.name)

    for load in (load_exported, lambda path: warm_start(str(path), VARIABLES)):
        if load is not load_exported and target.name != "variables.npz":
            continue                                          # warm start reads the variables alone
        with pytest.raises(CorruptExportError) as error:
            load(export)
        assert error.value.path == str(target) and str(target) in str(error.value)
        assert not marker.exists(), "the planted pickle ran"
    if digests == "recorded":
        assert "SHA-256" in error.value.reason or "bytes" in error.value.reason
    elif plant == "variables.npz is a pickle":
        assert error.value.reason == "not an .npz archive: it is a pickle, and pickles are never loaded"
    elif target.name == "variables.npz":
        assert "Object arrays cannot be loaded when allow_pickle=False" in error.value.reason
    else:
        assert "not a jax.export serialization" in error.value.reason


@pytest.mark.parametrize("damage", ["flip", "truncate"])
@pytest.mark.parametrize("name", ["predict.jaxexport", "variables.npz"])
def test_a_changed_export_file_is_refused_naming_it(export, name, damage):
    path = export / name
    data = bytearray(path.read_bytes())
    size = len(data)
    if damage == "flip":
        data[size // 2] ^= 0x01
    else:
        del data[size // 2:]
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptExportError, match=re.escape(str(path))) as error:
        load_exported(export)
    assert error.value.reason == ("its SHA-256 differs from the one recorded when it was exported" if damage == "flip"
                                  else f"it has {size // 2} bytes, {size} were exported")


def test_variables_of_another_dtype_or_shape_than_the_signature_are_refused(export):
    _without_digests(export)
    with open(export / "variables.npz", "wb") as f:     # same keys, other contents: no garbage view of them
        np.savez(f, allow_pickle=False, **{"['b']": np.ones(2, np.float64), "['w']": VARIABLES["w"]})
    with pytest.raises(CorruptExportError, match=r"\['b'\] is stored as float64, the signature says float32"):
        load_exported(export)
    with open(export / "variables.npz", "wb") as f:
        np.savez(f, allow_pickle=False, **{"['b']": np.ones(3, np.float32), "['w']": VARIABLES["w"]})
    with pytest.raises(CorruptExportError, match=r"\['b'\] has shape \[3\], the signature says \[2\]"):
        load_exported(export)


@pytest.mark.parametrize("field, value, message", [
    ("name", "../../etc/passwd", "is not a plain file name"),
    ("variables", [{"key": "['w']", "path": ["w"], "shape": [3, 2], "dtype": "object"}],
     "has dtype 'object', not a numeric or boolean array dtype"),
    ("variables", [{"key": "['w']", "path": ["w"], "shape": [3, 2], "dtype": "[('a', '<f4')]"}],
     "not a numeric or boolean array dtype"),
    ("files", {"variables.npz": {"size": "big"}}, "file digests are not"),
])
def test_a_tampered_signature_is_refused_naming_it(export, field, value, message):
    signature = json.loads((export / "signature.json").read_text())
    signature[field] = value
    (export / "signature.json").write_text(json.dumps(signature))
    with pytest.raises(CorruptExportError, match=re.escape(message)) as error:
        load_exported(export)
    assert error.value.path == str(export / "signature.json")


def test_a_signature_that_is_not_json_is_refused(export):
    (export / "signature.json").write_bytes(pickle.dumps({"format": "estimator.export"}))
    with pytest.raises(CorruptExportError, match="signature.json: not JSON"):
        load_exported(export)


def test_an_untouched_export_loads_and_serves(export):
    serve = load_exported(export)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(serve({"x": x})["y"], x @ VARIABLES["w"] + VARIABLES["b"])
    assert set(serve.signature["files"]) == {"predict.jaxexport", "variables.npz"}


def test_nothing_uses_pickle(export):
    source = (ROOT / "estimator" / "export.py").read_text()
    assert not re.search(r"\bimport\s+\w*pickle|\bpickle\.\w|allow_pickle=True", source)
    assert "np.savez(f, allow_pickle=False" in source          # the one write and the one read of arrays
    assert source.count("np.load(") == 1 and "np.load(io.BytesIO(data), allow_pickle=False)" in source
    with zipfile.ZipFile(export / "variables.npz") as z:
        for member in z.namelist():
            with z.open(member) as f:
                assert np.lib.format.read_array(f, allow_pickle=False).dtype != object
