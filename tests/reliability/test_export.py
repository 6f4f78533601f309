"""Issue 8, exports: ``load_exported`` never unpickles, and refuses a tampered or pickle-carrying export
with an error naming the file, before any of it is parsed, let alone run; an export without a complete
list of digests, or not the one pinned by ``expected_digest``, is refused; memory stays bounded whatever
an export declares."""

import hashlib
import io
import json
import os
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from estimator.checkpoints.warm_start import warm_start
from estimator.errors import CorruptExportError, ExportIntegrityError, InvalidArgumentError
from estimator.export import TensorSpec, export_model, load_exported
from estimator.export.integrity import export_digest

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
    """Makes ``export`` look written before the file digests: refused unless loaded with verify=False."""
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


@pytest.mark.parametrize("digests", ["recorded", "absent, verify=False", "forged"])
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
    loads = [load_exported] + ([lambda path: warm_start(str(path), VARIABLES)]   # it reads the variables alone
                               if target.name == "variables.npz" else [])
    if digests == "absent, verify=False":
        _without_digests(export)
        loads = [lambda path: load_exported(path, verify=False)]
    elif digests == "forged":
        _redigest(export, target.name)

    for load in loads:
        with pytest.raises(CorruptExportError) as error:
            load(export)
        assert error.value.path == str(target) and str(target) in str(error.value)
        assert not marker.exists(), "the planted pickle ran"
    if digests == "recorded":
        assert "SHA-256" in error.value.reason or "bytes" in error.value.reason
    elif plant == "variables.npz is a pickle":
        assert error.value.reason == "not an .npz archive: it is a pickle, and pickles are never loaded"
    elif target.name == "variables.npz":
        assert "holds Python objects, which only a pickle could load, and pickles are never loaded" \
            in error.value.reason
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
    with open(export / "variables.npz", "wb") as f:     # same keys, other contents: no garbage view of them
        np.savez(f, **{"['b']": np.ones(2, np.float64), "['w']": VARIABLES["w"]})
    _redigest(export, "variables.npz")
    with pytest.raises(CorruptExportError, match=r"\['b'\] is stored as float64, the signature says float32"):
        load_exported(export)
    with open(export / "variables.npz", "wb") as f:
        np.savez(f, **{"['b']": np.ones(3, np.float32), "['w']": VARIABLES["w"]})
    with pytest.raises(CorruptExportError, match=r"\['b'\] has shape \[3\], the signature says \[2\]"):
        load_exported(export, verify=False)


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
    source = "".join(path.read_text() for path in sorted((ROOT / "estimator" / "export").glob("*.py")))
    assert not re.search(r"\bimport\s+\w*pickle|\bpickle\.\w|allow_pickle=True", source)
    assert "np.save" not in source and source.count("write_array(") == 1     # the one write of arrays
    assert "np.lib.format.write_array(member, leaf, allow_pickle=False)" in source
    assert "np.load(" not in source and source.count("read_array(") == 1     # and the one read
    assert "np.lib.format.read_array(member, allow_pickle=False)" in source
    with zipfile.ZipFile(export / "variables.npz") as z:
        for member in z.namelist():
            with z.open(member) as f:
                assert np.lib.format.read_array(f, allow_pickle=False).dtype != object


def _replace_variables(export: Path, w: np.ndarray) -> None:
    """variables.npz rewritten with other weights of the same shape and dtype: only a digest can tell."""
    with open(export / "variables.npz", "wb") as f:
        np.savez(f, **{"['b']": VARIABLES["b"], "['w']": w})


def test_an_export_without_its_list_of_digests_is_refused_unless_verify_is_false(export):
    _replace_variables(export, -VARIABLES["w"])
    _without_digests(export)
    with pytest.raises(ExportIntegrityError, match="lists no file digests") as error:
        load_exported(export)
    assert error.value.path == str(export / "signature.json") and error.value.export == str(export)
    with pytest.raises(ExportIntegrityError, match="lists no file digests"):
        warm_start(str(export), VARIABLES)
    np.testing.assert_array_equal(load_exported(export, verify=False).variables["w"], -VARIABLES["w"])


@pytest.mark.parametrize("damage, culprit, reason", [
    ("a file not listed", "variables.npz", "signature.json lists no digest for it"),
    ("a file added to the export", "notes.txt", "it is in the export but signature.json lists no digest for it"),
    ("a listed file missing", "saved_model/saved_model.pb", "signature.json lists it, but the export has no such file"),
    ("a listed file deleted", "variables.npz", "signature.json lists it, but the export has no such file"),
    ("a list that is not a dict", "signature.json", "its file digests are not {name: {size, sha256}}"),
    ("a digest that is not hex", "signature.json", "its file digests are not {name: {size, sha256}}"),
])
def test_a_partial_or_unparsable_list_of_digests_is_refused_naming_the_file(export, damage, culprit, reason):
    signature = json.loads((export / "signature.json").read_text())
    files = signature["files"]
    if damage == "a file not listed":
        del files["variables.npz"]
    elif damage == "a file added to the export":
        (export / "notes.txt").write_text("not exported")
    elif damage == "a listed file missing":
        files[culprit] = {"size": 1, "sha256": "0" * 64}
    elif damage == "a listed file deleted":
        (export / "variables.npz").unlink()
    elif damage == "a list that is not a dict":
        signature["files"] = list(files)
    else:
        files["variables.npz"]["sha256"] = "not hex"
    (export / "signature.json").write_text(json.dumps(signature))
    with pytest.raises(ExportIntegrityError) as error:
        load_exported(export)
    assert (error.value.path, error.value.reason, error.value.export) == (str(export / culprit), reason, str(export))
    assert str(export / culprit) in str(error.value)


def test_expected_digest_pins_the_whole_export_against_a_rewritten_list(export):
    digest = export_digest(export)
    assert digest == hashlib.sha256((export / "signature.json").read_bytes()).hexdigest()   # = sha256sum
    assert load_exported(export, expected_digest=digest).digest == digest
    _replace_variables(export, -VARIABLES["w"])
    _redigest(export, "variables.npz")              # files and list rewritten together: the list cannot tell
    np.testing.assert_array_equal(load_exported(export).variables["w"], -VARIABLES["w"])
    with pytest.raises(ExportIntegrityError, match=f"its SHA-256 is {export_digest(export)}, not the expected "
                                                   f"{digest}") as error:
        load_exported(export, expected_digest=digest)
    assert error.value.path == str(export / "signature.json")
    for bad in ("sha256:" + digest, digest.upper(), digest[:-1]):
        with pytest.raises(InvalidArgumentError, match="must be the 64 lowercase hex digits"):
            load_exported(export, expected_digest=bad)
    with pytest.raises(InvalidArgumentError, match="with verify=True"):
        load_exported(export, verify=False, expected_digest=digest)


def _load_in_a_child_with_1_gib_of_address_space(export: Path) -> str:
    """What ``load_exported(export)`` raises in a child process whose address space is capped at 1 GiB (set
    after the imports, which take about half of it); a hang fails the test through the timeout."""
    script = ("import resource, sys\n"
              "from estimator.errors import CorruptExportError\n"
              "from estimator.export import load_exported\n"
              "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
              "try:\n"
              "    load_exported(sys.argv[1])\n"
              "except CorruptExportError as e:\n"
              "    print(type(e).__name__, e)\n")
    child = subprocess.run([sys.executable, "-c", script, str(export)], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert child.returncode == 0, child.stderr[-2000:]
    return child.stdout


def _npy(shape: tuple, data: bytes) -> bytes:
    """An .npy file of float32 ``shape`` whatever ``data`` really holds."""
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": shape})
    return f.getvalue() + data


def test_an_npz_declaring_a_4_gib_array_in_4_mb_is_refused_in_bounded_memory(tmp_path):
    export = Path(export_model(lambda v, f: {"y": f["x"] * v["w"][0]}, {"w": np.zeros(1 << 20, np.float32)},
                               {"x": TensorSpec((None,), "float32")}, tmp_path / "model", platforms=("cpu",)))
    with zipfile.ZipFile(export / "variables.npz", "w") as z:           # 4 MiB held, 4 GiB declared
        z.writestr("['w'].npy", _npy((1 << 30,), bytes(4 << 20)))
    signature = json.loads((export / "signature.json").read_text())
    signature["variables"][0]["shape"] = [1 << 30]
    (export / "signature.json").write_text(json.dumps(signature))
    _redigest(export, "variables.npz")                              # a consistent forgery: no digest stops it
    out = _load_in_a_child_with_1_gib_of_address_space(export)
    assert out.startswith(f"CorruptExportError refusing to load the export file {export / 'variables.npz'}: ")
    assert "['w'] declares 4294967296 bytes (float32[1073741824]), its member holds 4194304" in out


@pytest.mark.parametrize("name, kind", [("variables.npz", "link to /dev/zero"), ("predict.jaxexport", "link to /dev/zero"),
                                        ("signature.json", "link to /dev/zero"), ("variables.npz", "FIFO")])
def test_an_export_file_that_is_not_a_regular_file_is_refused_in_bounded_memory(export, name, kind):
    (export / name).unlink()
    if kind == "FIFO":
        os.mkfifo(export / name)
    else:
        (export / name).symlink_to("/dev/zero")
    out = _load_in_a_child_with_1_gib_of_address_space(export)
    reason = "it is a FIFO, not a regular file" if kind == "FIFO" else \
        "it is a symbolic link, and such files are never followed"
    assert out == f"CorruptExportError refusing to load the export file {export / name}: {reason}\n"
