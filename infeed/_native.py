"""The compiled extensions, with an error that says how to build them when they are missing."""

try:
    from infeed import _example, _ring, _tfrecord
except ImportError as e:  # pragma: no cover - exercised by hand on an unbuilt checkout
    raise ImportError(
        f"infeed's Cython extensions are not built ({e}). Build them with `pip install -e .` "
        "from the project's root (or `make demo`, which creates .venv and does it)."
    ) from e

__all__ = ["_example", "_ring", "_tfrecord"]
