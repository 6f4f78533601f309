"""Checkpoints of the train state with orbax: atomic, asynchronous, the last K kept.

>>> import tempfile, jax.numpy as jnp
>>> with tempfile.TemporaryDirectory() as model_dir, Checkpoints(model_dir, keep=2) as ckpt:
...     ckpt.save(100, {"w": jnp.ones(3), "step": 100}, extras={"input": {"epoch": 0, "batch": 100}})
...     ckpt.wait()
...     state, extras = ckpt.restore({"w": jnp.zeros(3), "step": 0})
>>> state["w"].tolist(), state["step"], extras
([1.0, 1.0, 1.0], 100, {'input': {'epoch': 0, 'batch': 100}})

Each checkpoint is the directory ``<directory>/<step>`` holding two orbax
items: ``state``, a pytree of arrays (``jax.Array`` sharded over any mesh,
numpy arrays, Python scalars, typed PRNG keys from ``jax.random.key``), and
``extras``, a small JSON document (the input pipeline's state, the config).
Nothing is pickled.

**Atomic.** Orbax writes a step into ``<step>.orbax-checkpoint-tmp`` and
renames it to ``<step>`` once every file is written (on object stores without
an atomic rename it writes ``commit_success.txt`` last instead). A save cut
short leaves only the temporary directory: :meth:`Checkpoints.all_steps` and
:meth:`Checkpoints.latest_step` read the directory and list complete
checkpoints only, and orbax removes the leftover (with a warning) when that
step is saved again. Older checkpoints beyond ``keep`` are deleted only after
the new one is complete.

**Asynchronous.** With ``async_save`` (the default), :meth:`Checkpoints.save`
returns once the arrays are copied to host memory, so the caller may donate or
delete them at once; a background thread writes the files. One save is in
flight at a time: the next ``save`` first waits for the previous one.
:meth:`Checkpoints.wait` blocks until every save is durable; ``close`` waits too.

**Existing steps.** Orbax refuses to overwrite a step (``StepAlreadyExistsError``);
``save`` of a step that exists (or is being written) does nothing, and with
``force=True`` deletes it and writes it again (not atomically: a crash between
the two loses that step, never older ones).

**Several processes** (``jax.distributed``): every process calls ``save`` with
its part of the global arrays and orbax coordinates them (barriers, one
process writes the metadata and renames); every process calls ``restore``
with the same target shardings. :func:`warm_start` and
:meth:`Checkpoints.restore_numpy` read whole arrays on each process.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from typing import Self

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

__all__ = ["Checkpoints", "warm_start"]

logger = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoints in ``directory``: save, list, restore (a context manager that closes them).

    ``keep``: how many of the newest checkpoints to keep (``None``: all).
    ``async_save``: write in a background thread (see the module's docstring).
    """

    def __init__(self, directory, keep: int | None = 5, async_save: bool = True):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive int or None, got {keep!r}")
        directory = os.fspath(directory)
        self.directory = directory if "://" in directory else os.path.abspath(directory)   # orbax needs absolute
        self._manager = ocp.CheckpointManager(
            epath.Path(self.directory),
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "extras": ocp.JsonCheckpointHandler()})

    def save(self, step: int, state, extras: dict | None = None, *, force: bool = False) -> None:
        """Saves ``state`` (a pytree of arrays) and ``extras`` (JSON) as checkpoint ``step``.

        A step that already exists is left as it is, unless ``force`` (then it is rewritten).
        ``extras`` must come back equal from JSON: str keys, lists rather than tuples.
        """
        step, extras = int(step), {} if extras is None else extras
        if json.loads(json.dumps(extras, allow_nan=False)) != extras:
            raise ValueError(f"extras must round-trip through JSON unchanged (str keys, lists, no tuples): {extras!r}")
        if step in self._manager.all_steps():   # orbax's list: the complete steps and the one being written
            if not force:
                logger.info("checkpoint %d already exists in %s: not saved again", step, self.directory)
                return
            self._manager.wait_until_finished()
            self._manager.delete(step)
        # force=True: save now; orbax's own policy would skip a step while a previous save is in flight.
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         extras=ocp.args.JsonSave(extras)), force=True)

    def wait(self) -> None:
        """Blocks until every save so far is complete on disk."""
        self._manager.wait_until_finished()

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints on disk, ascending (saves in flight are not listed)."""
        return sorted(ocp.utils.checkpoint_steps(self.directory))

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def latest_path(self) -> str | None:
        """The newest complete checkpoint's directory, or ``None``."""
        step = self.latest_step()
        return None if step is None else os.path.join(self.directory, str(step))

    def restore(self, target, step: int | None = None):
        """``(state, extras)`` of checkpoint ``step`` (the latest by default), ``state`` shaped like ``target``.

        ``target`` is a pytree like the saved state whose leaves are arrays or
        ``jax.ShapeDtypeStruct`` with a ``sharding``: each array is restored with
        that sharding (and cast to that dtype). A target whose key paths or
        shapes differ from the checkpoint's raises ``ValueError`` naming them.
        Only complete checkpoints are read: :meth:`wait` first for a save in flight.
        """
        step = self._existing_step(step)
        target = jax.tree.map(_abstract, target)
        _check_matches(target, self._manager.item_metadata(step)["state"].tree,
                       f"checkpoint {step} in {self.directory}")
        return self._restore(step, target)

    def restore_numpy(self, step: int | None = None):
        """``(state, extras)`` of checkpoint ``step`` (the latest by default), without a target.

        ``state`` is a tree of numpy arrays in the containers orbax saves (dicts
        for dicts and named tuples, lists for tuples, ``None`` for empty nodes
        such as ``optax.EmptyState()``); PRNG keys come back as their ``jax.random.key_data``.
        """
        step = self._existing_step(step)
        saved = self._manager.item_metadata(step)["state"].tree
        return self._restore(step, jax.tree.map(lambda leaf: np.empty(leaf.shape, leaf.dtype), saved))

    def extras(self, step: int | None = None) -> dict:
        """The JSON ``extras`` of checkpoint ``step`` (the latest by default), without reading the state."""
        step = self._existing_step(step)
        return self._manager.restore(step, args=ocp.args.Composite(extras=ocp.args.JsonRestore()))["extras"]

    def close(self) -> None:
        """Waits for saves in flight and releases orbax's threads."""
        self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _restore(self, step: int, target):
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target), extras=ocp.args.JsonRestore()))
        return restored["state"], restored["extras"]

    def _existing_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None and steps:
            return steps[-1]
        if step is not None and int(step) in steps:
            return int(step)
        raise FileNotFoundError(f"no complete checkpoint {'' if step is None else f'{step} '}in {self.directory} "
                                f"(complete steps: {steps})")


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
    taken is a ``ValueError``.
    """
    from estimator.export import is_export, read_exported_variables

    path = epath.Path(source)
    if not path.exists():
        raise FileNotFoundError(f"warm-start source {source} does not exist")
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
        value = saved.get(_path_names(key_path))
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
        raise ValueError(f"warm start from {source}: no variable matched include={include!r} with the same shape "
                         f"and dtype (mismatched: {mismatched or 'none'}; not in the checkpoint: {missing or 'none'})")
    logger.info("warm-started %d variables from %s: %s", len(taken), source, ", ".join(taken))
    if mismatched:
        logger.warning("warm start from %s skipped (shape or dtype differ): %s", source, ", ".join(mismatched))
    if missing:
        logger.warning("warm start from %s: not in the checkpoint, kept as initialised: %s", source, ", ".join(missing))
    return result


def _abstract(leaf):
    """A restore target leaf for orbax: arrays become ShapeDtypeStructs with their sharding."""
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    return np.asarray(leaf) if isinstance(leaf, np.generic) else leaf


def _path_names(key_path) -> tuple[str, ...]:
    """A key path as names that agree between a pytree and orbax's saved tree (which has dicts for
    named tuples and lists for tuples): dict keys, sequence indices and attribute names alike."""
    return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path)


def _by_path(tree) -> dict:
    return {_path_names(p): leaf for p, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _stored_shape(leaf) -> tuple[int, ...]:
    """The shape orbax stores for a target leaf: a typed PRNG key array is stored as its key data."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, dtype)).shape
    return tuple(np.shape(leaf))


def _check_matches(target, saved, what: str) -> None:
    """Raises ValueError naming every key path missing, unexpected or of another shape."""
    want = {_path_names(p): (jax.tree_util.keystr(p), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(target)[0]}
    have = {_path_names(p): (jax.tree_util.keystr(p), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(saved)[0]}
    problems = []
    if missing := [want[k][0] for k in want if k not in have]:
        problems.append(f"not in the checkpoint: {', '.join(missing)}")
    if extra := [have[k][0] for k in have if k not in want]:
        problems.append(f"in the checkpoint but not in the target: {', '.join(extra)}")
    if shapes := [f"{name} (checkpoint {tuple(have[k][1].shape)}, target {_stored_shape(leaf)})"
                  for k, (name, leaf) in want.items() if k in have and tuple(have[k][1].shape) != _stored_shape(leaf)]:
        problems.append(f"shapes differ: {', '.join(shapes)}")
    if problems:
        raise ValueError(f"{what} does not match the restore target: " + "; ".join(problems))
