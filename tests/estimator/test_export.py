"""estimator.export: a jax.export artefact with a symbolic batch, npz variables and a JSON signature, served without the model."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from estimator.errors import InvalidArgumentError
from estimator.export import TensorSpec, export_model, load_exported

ROOT = Path(__file__).resolve().parents[2]


def init_mlp(rng, sizes=(784, 64, 10)):
    keys = jax.random.split(rng, len(sizes) - 1)
    return {f"layer{i}": {"w": jax.random.normal(k, (a, b)) / np.sqrt(a), "b": jnp.full((b,), 0.1 * i)}
            for i, (k, a, b) in enumerate(zip(keys, sizes[:-1], sizes[1:]))}


def mlp_predict(params, features):
    h = features["image"]
    for i in range(len(params)):
        h = h @ params[f"layer{i}"]["w"] + params[f"layer{i}"]["b"]
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    h = h * features["scale"][:, None]
    return {"logits": h, "class": h.argmax(-1)}


FEATURES = {"image": TensorSpec((None, 784), "float32"), "scale": TensorSpec((None,), "float32")}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    params = init_mlp(jax.random.PRNGKey(0))
    path = export_model(mlp_predict, params, FEATURES, tmp_path_factory.mktemp("exports") / "mlp", platforms=("cpu",))
    return path, params


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"image": rng.normal(size=(n, 784)).astype(np.float32), "scale": rng.uniform(1, 2, size=n).astype(np.float32)}


def test_served_in_a_process_without_the_model_code(exported):
    path, params = exported
    feats = {n: batch(n, seed=n) for n in (1, 7, 130)}
    np.savez(Path(path).parent / "inputs.npz", **{f"{k}_{n}": v for n, f in feats.items() for k, v in f.items()})
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from estimator.export import load_exported
        serve = load_exported({path!r})
        inputs = np.load({str(Path(path).parent / "inputs.npz")!r}, allow_pickle=False)
        out = {{}}
        for n in (1, 7, 130):
            for k, v in serve({{"image": inputs[f"image_{{n}}"], "scale": inputs[f"scale_{{n}}"]}}).items():
                out[f"{{k}}_{{n}}"] = v
        np.savez({str(Path(path).parent / "outputs.npz")!r}, **out)
        assert not any(m == "tests" or m.startswith("test_") for m in sys.modules), "model code was imported"
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=Path(path).parent, timeout=120)
    with np.load(Path(path).parent / "outputs.npz", allow_pickle=False) as out:
        for n, f in feats.items():
            want = mlp_predict(params, f)
            np.testing.assert_allclose(out[f"logits_{n}"], want["logits"], rtol=1e-5, atol=1e-5)
            np.testing.assert_array_equal(out[f"class_{n}"], want["class"])
            assert out[f"logits_{n}"].shape == (n, 10) and out[f"class_{n}"].dtype == np.int32


def test_variables_round_trip_and_are_an_argument_not_constants(exported):
    path, params = exported
    serve = load_exported(path)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), serve.variables, params)
    assert jax.tree.structure(serve.variables) == jax.tree.structure(params)
    with np.load(Path(path) / "variables.npz", allow_pickle=False) as npz:
        assert sorted(npz) == sorted(["['layer0']['b']", "['layer0']['w']", "['layer1']['b']", "['layer1']['w']"])
    # the 784x64 float32 weights alone are 200 KB: they are not inside the serialized function
    assert (Path(path) / "predict.jaxexport").stat().st_size < 50_000


def test_signature(exported):
    path = exported[0]
    sig = json.loads((Path(path) / "signature.json").read_text())
    assert sig["format"] == "estimator.export" and sig["format_version"] == 1 and sig["name"] == "predict"
    assert sig["features"] == {"image": {"shape": ["batch", 784], "dtype": "float32"},
                               "scale": {"shape": ["batch"], "dtype": "float32"}}
    assert sig["outputs"] == {"logits": {"shape": ["batch", 10], "dtype": "float32"},
                              "class": {"shape": ["batch"], "dtype": "int32"}}
    assert {v["key"]: (v["path"], v["shape"], v["dtype"]) for v in sig["variables"]}["['layer0']['w']"] == \
        (["layer0", "w"], [784, 64], "float32")
    assert sig["platforms"] == ["cpu"] and sig["jax_version"] == jax.__version__ and sig["created"].endswith("+00:00")
    assert load_exported(path).signature == sig


def test_clear_errors_name_the_feature(exported):
    serve = load_exported(exported[0])
    good = batch(3)
    with pytest.raises(ValueError, match=r"unknown features \['img'\] and missing features \['image'\]"):
        serve({"img": good["image"], "scale": good["scale"]})
    with pytest.raises(TypeError, match="feature 'image' has dtype float64, expected float32"):
        serve({**good, "image": good["image"].astype(np.float64)})
    with pytest.raises(ValueError, match=r"feature 'image' has shape \(3, 783\), expected \(batch, 784\)"):
        serve({**good, "image": good["image"][:, :783]})
    with pytest.raises(ValueError, match=r"feature 'scale' has shape \(3, 1\), expected \(batch,\)"):
        serve({**good, "scale": good["scale"][:, None]})
    with pytest.raises(ValueError, match="feature 'scale' has batch = 2 but feature 'image' has batch = 3"):
        serve({**good, "scale": good["scale"][:2]})
    with pytest.raises(ValueError, match="dimension 'batch' must be at least 1"):
        serve(batch(0))


def test_refuses_to_overwrite_unless_asked(tmp_path):
    def fn(v, f):
        return {"y": f["x"] * v}
    spec = {"x": TensorSpec((None,), "float32")}
    path = export_model(fn, np.float32(2), spec, tmp_path / "e", platforms=("cpu",))
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_model(fn, np.float32(3), spec, tmp_path / "e", platforms=("cpu",))
    assert load_exported(path)({"x": np.ones(2, np.float32)})["y"].tolist() == [2, 2]
    export_model(fn, np.float32(3), spec, tmp_path / "e", platforms=("cpu",), overwrite=True)
    assert load_exported(path)({"x": np.ones(2, np.float32)})["y"].tolist() == [3, 3]
    assert load_exported(path).variables == 3
    assert sorted(os.listdir(tmp_path)) == ["e"]  # no temporary directory left behind
    (tmp_path / "empty").mkdir()
    export_model(fn, np.float32(1), spec, tmp_path / "empty", platforms=("cpu",))  # an empty directory is fine


@pytest.mark.parametrize("name", ["..", ".", ".hidden", "a/b", "", "a" * 300])
def test_an_export_name_that_is_not_a_plain_file_name_is_an_invalid_argument_error(tmp_path, name):
    with pytest.raises(InvalidArgumentError, match=re.escape(f"export name {name!r} must be a plain file name")):
        export_model(lambda v, f: {"y": f["x"]}, {}, {"x": TensorSpec((None,), "int32")}, tmp_path / "e", name=name)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("uri", ["gs://bucket/exports/e", "s3://bucket/exports/e"])
def test_an_export_to_or_from_a_bucket_is_refused_saying_what_to_do(tmp_path, monkeypatch, uri):
    """Before, ``export`` wrote to a local folder named like the URI (<cwd>/gs:/bucket/...) and said it had
    exported to the bucket."""
    from estimator.export import is_export, read_exported_variables

    monkeypatch.chdir(tmp_path)
    spec = {"x": TensorSpec((None,), "float32")}
    with pytest.raises(InvalidArgumentError, match=re.escape(f"export: export directories are local paths, got "
                                                             f"{uri!r}: export to a local directory, then copy")):
        export_model(lambda v, f: {"y": f["x"]}, {}, spec, uri, platforms=("cpu",))
    for load in (load_exported, is_export, read_exported_variables):
        with pytest.raises(InvalidArgumentError, match=f"{load.__name__}: export directories are local paths"):
            load(uri)
    assert os.listdir(tmp_path) == []                       # nothing made here in the bucket's name


def test_other_dtypes_extra_symbolic_dims_and_several_platforms(tmp_path):
    def predict(v, f):
        return {"total": jnp.sum(f["tokens"], axis=1) + v["bias"].astype(jnp.int32),
                "any": f["mask"].any(axis=1), "pixels": f["pixels"] // 2}
    spec = {"tokens": TensorSpec((None, None), "int32"), "mask": TensorSpec((None, 4), "bool"),
            "pixels": TensorSpec((None, 2, 2), "uint8")}
    path = export_model(predict, {"bias": jnp.ones((), jnp.bfloat16)}, spec, tmp_path / "e",
                        platforms=("cpu", "cuda", "tpu"))
    serve = load_exported(path)
    assert serve.signature["features"]["tokens"]["shape"] == ["batch", "tokens_dim1"]
    assert serve.signature["platforms"] == ["cpu", "cuda", "tpu"] and serve.exported.platforms == ("cpu", "cuda", "tpu")
    assert serve.variables["bias"].dtype == jnp.bfloat16 and serve.variables["bias"] == 1
    out = serve({"tokens": np.ones((3, 5), np.int32), "mask": np.eye(3, 4, dtype=bool),
                 "pixels": np.full((3, 2, 2), 9, np.uint8)})
    assert out["total"].tolist() == [6, 6, 6] and out["any"].tolist() == [True] * 3 and out["pixels"].max() == 4


def test_default_platforms_are_the_backend_and_cpu(tmp_path):
    path = export_model(lambda v, f: {"y": f["x"]}, {}, {"x": TensorSpec((None,), "int32")}, tmp_path / "e")
    assert load_exported(path).signature["platforms"] == list(dict.fromkeys([jax.export.default_export_platform(), "cpu"]))


def test_predict_fn_must_return_a_flat_dict(tmp_path):
    with pytest.raises(TypeError, match="flat dict of arrays"):
        export_model(lambda v, f: f["x"], {}, {"x": TensorSpec((None,), "int32")}, tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_saved_model_through_jax2tf(tmp_path):
    tf = pytest.importorskip("tensorflow")
    params = init_mlp(jax.random.PRNGKey(1), sizes=(784, 10))
    path = export_model(mlp_predict, params, FEATURES, tmp_path / "e", platforms=("cpu",), saved_model=True)
    loaded = tf.saved_model.load(os.path.join(path, "saved_model"))
    f = batch(5)
    out = loaded.signatures["serving_default"](image=tf.constant(f["image"]), scale=tf.constant(f["scale"]))
    np.testing.assert_allclose(out["logits"].numpy(), mlp_predict(params, f)["logits"], rtol=1e-5, atol=1e-5)
