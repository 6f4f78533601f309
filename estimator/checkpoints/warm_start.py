"""Warm start: a new model's variables taken, by name, from another run's checkpoint or from an export.

>>> import tempfile, jax.numpy as jnp
>>> from estimator.checkpoints import Checkpoints
>>> with tempfile.TemporaryDirectory() as model_dir:
...     with Checkpoints(model_dir) as ckpt:
...         ckpt.save(10, {"variables": {"w": jnp.ones(2), "b": jnp.ones(3)}})
...     target = {"w": jnp.zeros(2), "b": jnp.zeros(2)}
...     warm = warm_start(model_dir, target, include="w", within=("variables",))
>>> warm["w"].tolist(), warm["b"].tolist()
([1.0, 1.0], [0.0, 0.0])
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import jax
import numpy as np
from etils import epath

from estimator.checkpoints.manager import Checkpoints, path_names
from estimator.errors import CheckpointMismatchError, NoCheckpointError
from estimator.export.loading import is_export, read_exported_variables

__all__ = ["warm_start"]

logger = logging.getLogger("estimator.checkpoints")     # the checkpoints' logger: a warm start reads one


def warm_start(source: str, target, include: str | Sequence[str] | None = None, *, within: tuple[str, ...] = ()):
    """``target`` (a pytree of arrays) with leaves taken from the checkpoint ``source``.

    ``source`` is a checkpoint's directory (``<model_dir>/<step>``), a
    checkpoints directory (its latest checkpoint), or an export
    (:meth:`Estimator.export`: its variables, which are the train state's
    ``variables``; the paths then start at the variables, e.g. ``['params']['w']``).
    ``within``: where ``target`` lies in a checkpoint's saved tree (the
    estimator's variables are under ``("variables",)``); exports hold the
    variables alone. A leaf of ``target`` whose key path
    (``jax.tree_util.keystr``, e.g. ``['params']['dense1']['w']``) matches one of
    the regular expressions ``include`` (``re.search``; every leaf when ``None``)
    takes the checkpoint's value at the same path if its shape and dtype are
    the same, placed with the target leaf's sharding; every other leaf keeps
    the target's value. What was taken, skipped and missing is logged; nothing
    taken is a :class:`CheckpointMismatchError` (a ``ValueError``).
    """
    path = epath.Path(source)
    if not path.exists():
        raise NoCheckpointError(f"warm-start source {source} does not exist")
    if is_export(source):
        saved = _by_path(read_exported_variables(source))
    else:
        is_step_dir = path.name.isdigit() and (path / "state").exists()
        with Checkpoints(path.parent if is_step_dir else path, keep=None, async_save=False) as ckpt:
            saved, _ = ckpt.restore_numpy(int(path.name) if is_step_dir else None)
        saved = {names[len(within):]: leaf for names, leaf in _by_path(saved).items() if names[:len(within)] == within}
    patterns = [include] if isinstance(include, str) else include
    taken, mismatched, missing = [], [], []

    def take(key_path, leaf):
        name = jax.tree_util.keystr(key_path)
        if patterns is not None and not any(re.search(p, name) for p in patterns):
            return leaf
        value = saved.get(path_names(key_path))
        if value is None:
            missing.append(name)
            return leaf
        shape, dtype = np.shape(leaf), (leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf))
        if value.shape != shape or value.dtype != dtype:
            mismatched.append(f"{name} (checkpoint {value.dtype}{list(value.shape)}, target {dtype}{list(shape)})")
            return leaf
        taken.append(name)
        if isinstance(leaf, jax.Array):
            return jax.make_array_from_callback(shape, leaf.sharding, lambda index: value[index])
        return value

    result = jax.tree_util.tree_map_with_path(take, target)
    if not taken:
        raise CheckpointMismatchError(f"warm start from {source}: no variable matched include={include!r} with the "
                                      f"same shape and dtype (mismatched: {mismatched or 'none'}; not in the "
                                      f"checkpoint: {missing or 'none'})")
    logger.info("warm-started %d variables from %s: %s", len(taken), source, ", ".join(taken))
    if mismatched:
        logger.warning("warm start from %s skipped (shape or dtype differ): %s", source, ", ".join(mismatched))
    if missing:
        logger.warning("warm start from %s: not in the checkpoint, kept as initialised: %s", source, ", ".join(missing))
    return result


def _by_path(tree) -> dict:
    """``{path_names(key path): leaf}`` for every leaf of ``tree``."""
    return {path_names(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
