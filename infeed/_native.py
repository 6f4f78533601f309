"""The compiled extensions, imported first by ``infeed/__init__.py`` so that an unbuilt checkout fails
with the command that builds them."""

try:
    from infeed.tfrecord import _tfrecord  # noqa: F401
    from infeed.example import _example, _image  # noqa: F401
    from infeed.ring import _ring  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised by tests/infeed/test_native.py in a subprocess
    raise ImportError(
        f"infeed's Cython extensions are not built ({e}). Build them with `pip install -e .` "
        "from the project's root (or `make demo`, which creates .venv and does it)."
    ) from e
