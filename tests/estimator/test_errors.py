"""estimator/errors.py: one base, each error still the built-in it was, and the error paths that raise them."""

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import estimator as est
from estimator import errors
from estimator.checkpoints import Checkpoints
from estimator.export import TensorSpec, export_model, load_exported

#: Each public error and the built-ins that callers caught before it had a type of its own.
BUILTINS = {
    "InvalidArgumentError": (ValueError,),
    "ArgumentTypeError": (TypeError,),
    "ModelFnError": (TypeError, ValueError),
    "InputError": (TypeError, ValueError),
    "StepRngError": (RuntimeError,),
    "NonFiniteError": (FloatingPointError,),
    "NoCheckpointError": (FileNotFoundError, ValueError),
    "CheckpointMismatchError": (ValueError,),
    "CorruptCheckpointError": (ValueError,),
    "CheckpointSaveError": (OSError,),
    "ExportExistsError": (FileExistsError,),
    "NotAnExportError": (FileNotFoundError, ValueError),
    "CorruptExportError": (ValueError,),
    "ExportIntegrityError": (ValueError,),
    "MissingDependencyError": (ImportError,),
    "CorruptSummaryError": (ValueError,),
}


def test_every_public_error_is_an_estimator_error_and_still_its_builtin():
    public = {name for name in est.__all__ if isinstance(getattr(est, name), type)
              and issubclass(getattr(est, name), BaseException)}
    assert public == set(errors.__all__) == set(BUILTINS) | {"EstimatorError"}
    assert est.EstimatorError.__bases__ == (Exception,)
    for name, builtins in BUILTINS.items():
        error = getattr(est, name)
        assert issubclass(error, est.EstimatorError), name
        for builtin in builtins:
            assert issubclass(error, builtin), (name, builtin)


def test_the_errors_with_attributes_keep_their_signatures():
    cause = OSError(28, "No space left on device")
    saved = est.CheckpointSaveError(10, "/m/checkpoints/10", cause)
    assert (saved.step, saved.path) == (10, "/m/checkpoints/10") and saved.errno is None
    assert str(saved) == "saving checkpoint 10 to /m/checkpoints/10 failed: OSError: [Errno 28] No space left on device"
    corrupt = est.CorruptCheckpointError("/m/3", "/m/3/state/d", "missing")
    assert (corrupt.checkpoint, corrupt.path, corrupt.reason) == ("/m/3", "/m/3/state/d", "missing")
    export = est.CorruptExportError("/e/variables.npz", "not an .npz archive")
    assert (export.path, export.reason) == ("/e/variables.npz", "not an .npz archive")
    assert str(export) == "refusing to load the export file /e/variables.npz: not an .npz archive"
    integrity = est.ExportIntegrityError("/e", "/e/signature.json", "it lists no file digests")
    assert isinstance(integrity, est.CorruptExportError)
    assert (integrity.export, integrity.path, integrity.reason) == ("/e", "/e/signature.json", "it lists no file digests")
    assert str(integrity) == "refusing to load the export file /e/signature.json: it lists no file digests"


def init_fn(rng, features):
    return {"params": {"w": jnp.zeros((3, 2))}}


def model_fn(variables, features, labels, mode, params):
    logits = features @ variables["params"]["w"]
    if mode == est.ModeKeys.PREDICT:
        return est.EstimatorSpec(mode, predictions={"logits": logits})
    return est.EstimatorSpec(mode, loss=optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean())


def batches(params):
    n = params["batch_size"]
    return [(np.ones((n, 3), np.float32), np.zeros(n, np.int32))] * 4


def make(tmp_path, fn=model_fn):
    return est.Estimator(fn, init_fn, optax.sgd(0.1), est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=2),
                         train_batch_size=8)


def test_a_bad_setting_is_an_invalid_argument_error(tmp_path):
    with pytest.raises(est.InvalidArgumentError, match="RunConfig.iterations_per_loop must be a positive int, got 0"):
        est.RunConfig(model_dir=str(tmp_path), iterations_per_loop=0)
    with pytest.raises(est.ArgumentTypeError, match="config must be an estimator.RunConfig, got dict"):
        est.Estimator(model_fn, init_fn, optax.sgd(0.1), {"model_dir": str(tmp_path)})
    with pytest.raises(est.InvalidArgumentError, match="train needs exactly one of steps and max_steps"):
        make(tmp_path).train(batches)


def test_a_model_fn_that_returns_no_estimator_spec_is_a_model_fn_error(tmp_path):
    with pytest.raises(est.ModelFnError, match="model_fn must return an estimator.EstimatorSpec, got dict"):
        make(tmp_path, lambda variables, features, labels, mode, params: {"loss": 0.0}).train(batches, steps=2)


def test_a_non_finite_loss_is_a_non_finite_error(tmp_path):
    def nan_loss(variables, features, labels, mode, params):
        return est.EstimatorSpec(mode, loss=jnp.nan * jnp.sum(variables["params"]["w"]))

    with pytest.raises(est.NonFiniteError, match=r"the loss is nan at step 1 \(in the loop of steps 1\.\.2\)"):
        make(tmp_path, nan_loss).train(batches, steps=2)


def test_no_checkpoint_is_a_no_checkpoint_error(tmp_path):
    with pytest.raises(est.NoCheckpointError, match="no checkpoint in .* and nothing trained: train first"):
        make(tmp_path).evaluate(batches)
    with pytest.raises(est.NoCheckpointError, match=r"no complete checkpoint in .*\(complete steps: \[\]\)"):
        with Checkpoints(tmp_path / "empty") as ckpt:
            ckpt.restore_numpy()
    with pytest.raises(est.StepRngError, match="inside model_fn while training"):
        est.step_rng()


def test_a_damaged_or_missing_export_is_named(tmp_path):
    path = export_model(lambda v, f: {"y": f["x"] @ v["w"]}, {"w": np.eye(3, dtype=np.float32)},
                        {"x": TensorSpec((None, 3), "float32")}, tmp_path / "model", platforms=("cpu",))
    variables = tmp_path / "model" / "variables.npz"
    variables.write_bytes(variables.read_bytes()[:-1])
    with pytest.raises(est.CorruptExportError, match="variables.npz: it has") as error:
        load_exported(path)
    assert error.value.path == str(variables)
    with pytest.raises(est.NotAnExportError, match="is not an export: it has no signature.json"):
        load_exported(tmp_path)


def test_an_optimizer_or_an_export_path_of_the_wrong_type_is_named():
    config = est.RunConfig(model_dir="/tmp/estimator-errors-optimizer")
    with pytest.raises(est.ArgumentTypeError, match="optimizer must be an optax.GradientTransformation .* got int"):
        est.Estimator(lambda *a: None, lambda *a: None, optimizer=5, config=config)
    with pytest.raises(est.ArgumentTypeError, match="an export directory is a path, got NoneType"):
        est.load_exported(None)
