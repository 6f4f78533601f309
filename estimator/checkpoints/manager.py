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
an atomic rename it writes ``commit_success.txt`` last instead). Just before
that, the digest manifest ``estimator_digests.json`` (each file's size and
SHA-256; :mod:`estimator.checkpoints.manifest`) is written into the same
directory, so it appears with the checkpoint. A save cut short (the process
killed at any point) leaves only the temporary directory:
:meth:`Checkpoints.all_steps` and :meth:`Checkpoints.latest_step` list
complete checkpoints only, and the first ``save`` of the next run removes what
a killed save left behind.

**Verified.** A restore first checks every file of what it reads against the
manifest: a damaged, truncated or missing file raises
:class:`~estimator.errors.CorruptCheckpointError` naming it, never restores
other values than were saved. (Checkpoints from before the manifest existed
are read with ``verify=False``.)

**The last K.** Once a save is complete, the complete checkpoints beyond the
newest ``keep`` are deleted: only directories named by a step that hold our
manifest, never a symbolic link or what it points to, nor any other file or
directory. Each is first renamed to ``.<step>.deleting`` (a killed deletion
never leaves a half-deleted ``<step>`` behind) and then removed without
following the links inside it. On object stores, which rename object by object,
its commit file is deleted first instead: a deletion cut short leaves an
uncommitted ``<step>``, which is not listed and which the next writer removes.

**Object stores.** ``gs://`` as orbax writes it (through gcsfs or TensorFlow's
gfile, and tensorstore): :mod:`estimator.checkpoints.storage` refuses what would
not work before anything is written (other schemes, no client, no credentials,
an emulator only one of the two clients would use).

**Asynchronous.** With ``async_save`` (the default), :meth:`Checkpoints.save`
returns once the arrays are copied to host memory, so the caller may donate or
delete them at once; a background thread writes the files. One save is in
flight at a time: the next ``save`` first waits for the previous one.
:meth:`Checkpoints.wait` blocks until every save is durable; ``close`` waits
too. A save that fails is raised as :class:`CheckpointSaveError` naming the
step and its directory, never only logged: by ``save`` itself when its
directory cannot be made (a read-only directory), else, once the background
write fails (a full disk), by the next ``save``, ``wait`` or ``close``; what it
had written is removed.

**Existing steps.** A step that exists (or is being written) is not saved
again; with ``force=True`` it is deleted and written again (not atomically: a
crash between the two loses that step, never older ones).

**Several processes** (``jax.distributed``): every process calls ``save`` with
its part of the global arrays and orbax coordinates them (barriers, one
process writes the metadata and renames); every process calls ``restore``
with the same target shardings. :meth:`Checkpoints.restore_numpy`
(and :func:`estimator.checkpoints.warm_start.warm_start`) read whole arrays on each process.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import os
import re
import shutil
import stat
from typing import Self

import jax
import numpy as np
from etils import epath

from estimator.checkpoints.manifest import COMMIT_FILE, MANIFEST, STEP_METADATA, verify_manifest, write_manifest
from estimator.checkpoints.storage import check_checkpoint_storage
from estimator.errors import CheckpointMismatchError, CheckpointSaveError, InvalidArgumentError, NoCheckpointError

__all__ = ["Checkpoints"]

logger = logging.getLogger("estimator.checkpoints")     # the name users configure: the package, not this module

_STEP = re.compile(r"(0|[1-9][0-9]*)")
_LEFTOVER = re.compile(r"(0|[1-9][0-9]*)\.orbax-checkpoint-tmp(-[0-9]+)?|\.(0|[1-9][0-9]*)\.deleting")


class Checkpoints:
    """The checkpoints in ``directory``: save, list, restore (a context manager that closes them).

    ``keep``: how many of the newest checkpoints to keep (``None``: all).
    ``async_save``: write in a background thread (see the module's docstring).
    """

    def __init__(self, directory, keep: int | None = 5, async_save: bool = True):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise InvalidArgumentError(f"keep must be a positive int or None, got {keep!r}")
        directory = os.fspath(directory)
        check_checkpoint_storage(directory, "Checkpoints")
        self.directory = directory if "://" in directory else os.path.abspath(directory)   # orbax needs absolute
        self.keep, self._async = keep, async_save
        self._pending: int | None = None          # the step being written in the background
        self._leftovers_removed = False
        root = epath.Path(self.directory)
        ocp = _orbax()
        path_class = _committing_path_class(root, self._prune)
        # Orbax commits a step by renaming its temporary directory (local paths) or, where it has no atomic rename
        # (gs://), by writing commit_success.txt last. Orbax before 0.12.3 writes no commit file with the rename:
        # there the final name itself says the step is complete.
        self._renamed = issubclass(path_class, ocp.path.atomicity.AtomicRenameTemporaryPath)
        self._manager = ocp.CheckpointManager(
            root,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=None,                   # the last K: self._prune, which deletes only our own
                enable_async_checkpointing=async_save,
                # the directory is made in save(): made in orbax's background thread, a failure to make it
                # (a read-only directory) left the writing threads waiting for it, for 20 minutes
                async_options=ocp.AsyncOptions(create_directories_asynchronously=False),
                temporary_path_class=path_class),
            item_handlers={"state": ocp.StandardCheckpointHandler(), "extras": ocp.JsonCheckpointHandler()})

    def save(self, step: int, state, extras: dict | None = None, *, force: bool = False) -> None:
        """Saves ``state`` (a pytree of arrays) and ``extras`` (JSON) as checkpoint ``step``.

        A step that already exists is left as it is, unless ``force`` (then it is rewritten).
        ``extras`` must come back equal from JSON: str keys, lists rather than tuples.
        Raises :class:`CheckpointSaveError` for this save or for the previous one, if it failed.
        """
        step, extras = int(step), {} if extras is None else extras
        if json.loads(json.dumps(extras, allow_nan=False)) != extras:
            raise InvalidArgumentError(f"extras must round-trip through JSON unchanged (str keys, lists, no tuples): "
                                       f"{extras!r}")
        if step == self._pending and not force:
            logger.info("checkpoint %d is being written to %s: not saved again", step, self.directory)
            return
        self._finish()
        if not self._leftovers_removed:
            self.remove_leftovers()
        if step in self.all_steps():
            if not force:
                logger.info("checkpoint %d already exists in %s: not saved again", step, self.directory)
                return
            self._delete(step)
        if step in self._manager.all_steps():        # orbax's own list, out of date after a deletion or a failure
            self._manager.reload()
        logger.info("Saving checkpoints for %d into %s.", step, self.directory)      # TPUEstimator's line
        try:
            # force=True: save now; orbax's own policy would skip a step while a previous save is in flight.
            args = _orbax().args
            self._manager.save(step, args=args.Composite(state=args.StandardSave(state), extras=args.JsonSave(extras)),
                               force=True)
        except Exception as e:
            raise self._failed(step, e) from e
        self._pending = step
        if not self._async:
            self._finish()

    def wait(self) -> None:
        """Blocks until every save so far is complete on disk; raises :class:`CheckpointSaveError` if one failed."""
        self._finish()

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints on disk, ascending (saves in flight are not listed).

        A complete checkpoint is a directory (not a symbolic link) named by its step, which orbax
        committed and which holds our digest manifest (or orbax's metadata, for checkpoints older
        than the manifest).
        """
        root = epath.Path(self.directory)
        _forget_listings(root)
        if not root.exists():
            return []
        return sorted(int(p.name) for p in root.iterdir() if _STEP.fullmatch(p.name) and self._is_complete(p))

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def latest_path(self) -> str | None:
        """The newest complete checkpoint's directory, or ``None``."""
        step = self.latest_step()
        return None if step is None else os.path.join(self.directory, str(step))

    def restore(self, target, step: int | None = None, *, verify: bool = True):
        """``(state, extras)`` of checkpoint ``step`` (the latest by default), ``state`` shaped like ``target``.

        ``target`` is a pytree like the saved state whose leaves are arrays or
        ``jax.ShapeDtypeStruct`` with a ``sharding``: each array is restored with
        that sharding (and cast to that dtype). A target whose key paths or
        shapes differ from the checkpoint's raises :class:`~estimator.errors.CheckpointMismatchError`
        naming them; a damaged file raises :class:`~estimator.errors.CorruptCheckpointError` naming it
        (``verify=False``: read unchecked, for checkpoints written before the digest manifest).
        Only complete checkpoints are read: :meth:`wait` first for a save in flight.
        """
        step = self._existing_step(step)
        if verify:
            self._verify(step, ("state", "extras"))
        target = jax.tree.map(_abstract, target)
        _check_matches(target, self._manager.item_metadata(step)["state"].tree,
                       f"checkpoint {step} in {self.directory}")
        return self._restore(step, target)

    def restore_numpy(self, step: int | None = None, *, verify: bool = True):
        """``(state, extras)`` of checkpoint ``step`` (the latest by default), without a target.

        ``state`` is a tree of numpy arrays in the containers orbax saves (dicts
        for dicts and named tuples, lists for tuples, ``None`` for empty nodes
        such as ``optax.EmptyState()``); PRNG keys come back as their ``jax.random.key_data``.
        ``verify`` as in :meth:`restore`.
        """
        step = self._existing_step(step)
        if verify:
            self._verify(step, ("state", "extras"))
        saved = self._manager.item_metadata(step)["state"].tree
        return self._restore(step, jax.tree.map(lambda leaf: np.empty(leaf.shape, leaf.dtype), saved))

    def extras(self, step: int | None = None, *, verify: bool = True) -> dict:
        """The JSON ``extras`` of checkpoint ``step`` (the latest by default), without reading the state."""
        step = self._existing_step(step)
        if verify:
            self._verify(step, ("extras",))
        args = _orbax().args
        return self._manager.restore(step, args=args.Composite(extras=args.JsonRestore()))["extras"]

    def remove_leftovers(self) -> list[str]:
        """Removes what killed saves and deletions left (``<step>.orbax-checkpoint-tmp*``,
        ``.<step>.deleting``; on object stores, a ``<step>`` without orbax's commit file), real directories only;
        returns their paths. The first :meth:`save`
        calls it (a reader never does: another process may be writing a checkpoint)."""
        self._leftovers_removed = True
        root, removed = epath.Path(self.directory), []
        _forget_listings(root)
        if jax.process_index() != 0 or not root.exists():
            return removed
        for path in root.iterdir():
            if _LEFTOVER.fullmatch(path.name) or self._uncommitted(path):
                if _is_real_directory(path):
                    _rmtree(path)
                    removed.append(os.fspath(path))
                else:
                    logger.warning("%s looks like a leftover checkpoint but is not a directory: left as it is", path)
        if removed:
            logger.warning("removed what killed or failed checkpoint saves left: %s", ", ".join(removed))
        return removed

    def close(self) -> None:
        """Waits for saves in flight (raising :class:`CheckpointSaveError` if one failed), releases orbax's threads."""
        try:
            self._finish()
        finally:
            self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _finish(self) -> None:
        """Waits for the save in flight; its failure becomes a CheckpointSaveError naming its step."""
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            if step is None:
                raise
            raise self._failed(step, e) from e

    def _failed(self, step: int, error: BaseException) -> CheckpointSaveError:
        """The error to raise for a failed save of ``step``, once what it wrote is removed."""
        if jax.process_index() == 0:
            try:
                root = epath.Path(self.directory)
                for path in root.iterdir() if root.exists() else ():
                    match = _LEFTOVER.fullmatch(path.name)
                    ours = ((match and match.group(1) == str(step))
                            or (path.name == str(step) and self._uncommitted(path)))
                    if ours and _is_real_directory(path):
                        _rmtree(path)
            except OSError as cleanup_error:
                logger.warning("could not remove what the failed save of checkpoint %d left in %s: %s",
                               step, self.directory, cleanup_error)
        self._manager.reload()
        latest = self.latest_step()
        logger.error("saving checkpoint %d failed (the latest complete checkpoint is %s): %s", step,
                     "none" if latest is None else latest, error)
        return CheckpointSaveError(step, os.path.join(self.directory, str(step)), error)

    def _prune(self) -> None:
        """Deletes the complete checkpoints beyond the newest ``keep`` (after each save, in its thread)."""
        if self.keep is None:
            return
        for step in self.all_steps()[:-self.keep]:
            try:
                self._delete(step)
            except OSError as e:
                logger.warning("could not delete old checkpoint %d in %s: %s", step, self.directory, e)

    def _delete(self, step: int) -> None:
        """Deletes checkpoint ``step`` if it is ours (a real directory holding our manifest)."""
        path = epath.Path(self.directory) / str(step)
        if not (self._is_complete(path) and (path / MANIFEST).exists()):
            logger.warning("%s is not a checkpoint this class wrote (no %s, or not a directory): not deleted",
                           path, MANIFEST)
            return
        if self._renamed:
            doomed = path.parent / f".{step}.deleting"
            if doomed.exists():
                _rmtree(doomed)
            path.rename(doomed)      # atomic: a deletion cut short never leaves a half-deleted <step>
            _rmtree(doomed)
        else:
            # An object store renames a directory object by object: the commit file goes first instead, so a
            # deletion cut short leaves an uncommitted <step>, never listed and removed by the next writer.
            (path / COMMIT_FILE).unlink()
            _rmtree(path)
        logger.debug("deleted old checkpoint %s", path)

    def _is_complete(self, path: epath.Path) -> bool:
        """A committed checkpoint directory: a real directory under its final name (where orbax commits by
        renaming) or with orbax's commit file, and with our manifest (or orbax's metadata, for checkpoints from
        before the manifest)."""
        return (_is_real_directory(path) and (self._renamed or (path / COMMIT_FILE).exists())
                and ((path / MANIFEST).exists() or (path / STEP_METADATA).exists()))

    def _uncommitted(self, path: epath.Path) -> bool:
        """Where orbax commits by writing its commit file last (object stores): a step without it, which a save or
        a deletion cut short left (no save is in flight when this is asked). The callers check that it is a
        directory (a request each, on a bucket: asked once)."""
        return not self._renamed and _STEP.fullmatch(path.name) is not None and not (path / COMMIT_FILE).exists()

    def _verify(self, step: int, items: tuple[str, ...]) -> None:
        """Checks the files of ``items`` in checkpoint ``step`` against its digest manifest."""
        verify_manifest(epath.Path(self.directory) / str(step), step, items)

    def _restore(self, step: int, target):
        args = _orbax().args
        restored = self._manager.restore(step, args=args.Composite(state=args.StandardRestore(target),
                                                                   extras=args.JsonRestore()))
        return restored["state"], restored["extras"]

    def _existing_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None and steps:
            return steps[-1]
        if step is not None and int(step) in steps:
            return int(step)
        raise NoCheckpointError(f"no complete checkpoint {'' if step is None else f'{step} '}in {self.directory} "
                                f"(complete steps: {steps})")


def _orbax():
    """``orbax.checkpoint``, imported when first used: it takes ~0.15 s, which ``import estimator`` (and a
    process that only serves exports) need not pay."""
    import orbax.checkpoint

    return orbax.checkpoint


def _committing_path_class(root: epath.Path, on_commit):
    """Orbax's temporary-path class for ``root`` that writes the digest manifest into a step's directory
    just before orbax commits it, and calls ``on_commit()`` once it is committed."""
    base = _orbax().path.atomicity_defaults.get_default_temporary_path_class(root)

    class CommittingPath(base):
        async def finalize(self, *args, **kwargs):
            final = self.get_final()
            if final.parent != root:           # an item inside the step's directory: orbax's own commit
                return await super().finalize(*args, **kwargs)
            await asyncio.to_thread(write_manifest, self.get(), int(final.name))
            result = await super().finalize(*args, **kwargs)
            await asyncio.to_thread(on_commit)
            return result

    return CommittingPath


def _is_local(path: epath.Path) -> bool:
    return "://" not in os.fspath(path)


def _forget_listings(path: epath.Path) -> None:
    """Drops gcsfs's cached listings under ``path``: gcsfs keeps a folder's listing until told (its default), so
    a process that listed the checkpoints once would miss every step written since, by another process or by
    tensorstore (orbax's arrays), and a leftover made since. ``fsspec.filesystem`` gives the instance etils.epath
    made with the same arguments (fsspec caches instances by them): none in etils 1.7, ``finalize_on_close=True``
    in 1.15. Elsewhere (TensorFlow's gfile) nothing is cached."""
    if not os.fspath(path).startswith("gs://") or importlib.util.find_spec("gcsfs") is None:
        return
    import fsspec

    for options in ({}, {"finalize_on_close": True}):
        fsspec.filesystem("gcs", **options).invalidate_cache(os.fspath(path))


def _is_real_directory(path: epath.Path) -> bool:
    """A directory, not a symbolic link to one (object stores have no links)."""
    if not _is_local(path):
        return path.is_dir()
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def _rmtree(path: epath.Path) -> None:
    """Removes a directory tree; locally without following symbolic links (shutil's fd-based rmtree)."""
    if _is_local(path):
        shutil.rmtree(os.fspath(path))
    else:
        path.rmtree()


def _abstract(leaf):
    """A restore target leaf for orbax: arrays become ShapeDtypeStructs with their sharding."""
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    return np.asarray(leaf) if isinstance(leaf, np.generic) else leaf


def path_names(key_path) -> tuple[str, ...]:
    """A key path as names that agree between a pytree and orbax's saved tree (which has dicts for
    named tuples and lists for tuples): dict keys, sequence indices and attribute names alike."""
    return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in key_path)


def _stored_shape(leaf) -> tuple[int, ...]:
    """The shape orbax stores for a target leaf: a typed PRNG key array is stored as its key data."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, dtype)).shape
    return tuple(np.shape(leaf))


def _check_matches(target, saved, what: str) -> None:
    """Raises CheckpointMismatchError naming every key path missing, unexpected or of another shape."""
    want = {path_names(p): (jax.tree_util.keystr(p), leaf)
            for p, leaf in jax.tree_util.tree_flatten_with_path(target)[0]}
    have = {path_names(p): (jax.tree_util.keystr(p), leaf)
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
        raise CheckpointMismatchError(f"{what} does not match the restore target: " + "; ".join(problems))
