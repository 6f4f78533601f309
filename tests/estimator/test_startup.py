"""Start-up: what ``import estimator`` leaves for later, and ``RunConfig.compilation_cache_dir`` (JAX's persistent
compilation cache, read by the next process training the same model)."""

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import optax
import pytest

import estimator as est

ROOT = os.path.dirname(os.path.dirname(est.__file__))


def _python(source: str, *args: str) -> str:
    """Runs ``source`` in a fresh process on one CPU device, with JAX's cache settings cleared, and returns the
    last line it printed."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", source, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def test_import_estimator_leaves_orbax_and_optax_for_later():
    loaded = json.loads(_python("import json, sys, estimator; "
                                "print(json.dumps([m for m in ('orbax.checkpoint', 'optax') if m in sys.modules]))"))
    assert loaded == []


def test_compilation_cache_dir_is_a_directory_path_or_none(tmp_path):
    assert est.RunConfig(model_dir=str(tmp_path)).compilation_cache_dir is None
    config = est.RunConfig(model_dir=str(tmp_path), compilation_cache_dir=pathlib.Path(tmp_path, "cache"))
    assert config.compilation_cache_dir == str(tmp_path / "cache")
    for bad in (3, "", b"cache", ["cache"]):
        with pytest.raises(est.InvalidArgumentError,
                           match=rf"RunConfig.compilation_cache_dir must be a directory path or None, got "
                                 rf"{bad!r}".replace("[", r"\[").replace("]", r"\]")):
            est.RunConfig(model_dir=str(tmp_path), compilation_cache_dir=bad)


def _model_fn(variables, features, labels, mode, params):
    return est.EstimatorSpec(mode, loss=((features["x"] @ variables["w"]) ** 2).mean())


def _estimator(model_dir, cache_dir):
    config = est.RunConfig(model_dir=str(model_dir), compilation_cache_dir=cache_dir and str(cache_dir))
    return est.Estimator(_model_fn, lambda rng, features: {"w": features["x"][:, None] * 0}, optax.sgd(0.1), config,
                         train_batch_size=8)


def test_an_estimator_asking_for_another_cache_directory_than_the_process_has_is_refused(tmp_path,
                                                                                       jax_cache_settings):
    _estimator(tmp_path / "a", tmp_path / "cache-a")           # made, nothing compiled: the process's cache is set
    assert (tmp_path / "cache-a").is_dir()
    _estimator(tmp_path / "b", tmp_path / "cache-a")           # the same directory: fine
    _estimator(tmp_path / "c", None)                           # none asked for: the process's is left as it is
    with pytest.raises(est.InvalidArgumentError, match=rf"RunConfig.compilation_cache_dir: this process already "
                                                       rf"keeps its compiled programs in {tmp_path / 'cache-a'}"):
        _estimator(tmp_path / "d", tmp_path / "cache-b")
    assert not (tmp_path / "d").exists() and not (tmp_path / "cache-b").exists()


TRAIN = textwrap.dedent("""
    import json, sys
    import numpy as np, optax
    import estimator as est, xla_runtime as xr

    def model_fn(variables, features, labels, mode, params):
        logits = features["x"] @ variables["w"] + variables["b"]
        return est.EstimatorSpec(mode, loss=optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())

    def init_fn(rng, features):
        return {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}

    def input_fn(params):
        rng = np.random.default_rng(0)
        return ((({"x": rng.normal(size=(8, 4)).astype(np.float32)}, rng.integers(0, 3, 8)) for _ in range(6)))

    model_dir, cache_dir = sys.argv[1:]
    with xr.CompileWatch() as watch:
        e = est.Estimator(model_fn, init_fn, optax.sgd(0.1), est.RunConfig(
            model_dir=model_dir, iterations_per_loop=3, compilation_cache_dir=cache_dir), train_batch_size=8)
        e.train(input_fn, max_steps=6)
    print(json.dumps({"w": e.get_variables()["w"].tolist(), **watch.as_dict()}))
""")


def test_a_second_process_training_the_same_model_reads_its_programs_from_the_cache(tmp_path):
    cache = tmp_path / "cache"
    first = json.loads(_python(TRAIN, str(tmp_path / "first"), str(cache)))
    assert first["cache_writes"] >= 1 and first["cache_hits"] == 0
    assert len(os.listdir(cache)) >= first["cache_writes"]
    second = json.loads(_python(TRAIN, str(tmp_path / "second"), str(cache)))
    assert second["cache_hits"] == first["cache_writes"] and second["cache_writes"] == 0
    assert second["w"] == first["w"]
