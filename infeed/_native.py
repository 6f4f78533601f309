"""The compiled extensions, imported first by ``infeed/__init__.py`` so that an unbuilt checkout fails
with the command that builds them."""

try:
    from infeed.tfrecord import _tfrecord  # noqa: F401
    from infeed.example import _example, _image  # noqa: F401
    from infeed.ring import _ring  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by tests/infeed/test_native.py in a subprocess
    raise ImportError(
        f"infeed's Cython extensions are not built in {__file__.rpartition('/infeed/')[0]} ({e}). Build them in "
        "place with `pip install -e .` from the project's root (or `python setup.py build_ext --inplace`, or "
        "`make test`, which creates .venv and does it). A package installed with `pip install .` is not this "
        "copy: the current directory's infeed comes first (`python -m`, `python -c`)."
    ) from e
