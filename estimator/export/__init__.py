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

The parts, in the order an export goes: :mod:`estimator.export.saving` (the
symbolic shapes, the platforms, the variables, the optional SavedModel),
:mod:`estimator.export.layout` (the directory's names and version),
:mod:`estimator.export.integrity` (the files' digests and the one digest to
pin) and :mod:`estimator.export.loading` (what is checked before anything is
parsed: no code from the directory runs, memory stays bounded).

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

from estimator.export.integrity import export_digest
from estimator.export.loading import LoadedModel, is_export, load_exported, read_exported_variables
from estimator.export.saving import TensorSpec, export_model

__all__ = ["LoadedModel", "TensorSpec", "export_digest", "export_model", "is_export", "load_exported",
           "read_exported_variables"]
