"""The digest manifest of a checkpoint: the size and SHA-256 of each of its files, written into the step's
directory just before orbax commits it, and checked before a restore reads the files.

The manifest, ``estimator_digests.json``, is a JSON document ``{"format", "version", "step",
"files": {path: {"size", "sha256"}}, "sha256"}`` whose last field is the SHA-256 of the rest (its
keys sorted, no spaces), so a damaged manifest is refused too. It names the step it was written for:
a checkpoint renamed to another step is refused. Paths are relative to the step's directory and
``/``-separated; one that leaves it (absolute, or with ``..``) is refused. On a local disk the manifest and
the files it lists are read only when they are regular files (never through a symbolic link, never a FIFO)
and never past the size the manifest records, so a planted link to ``/dev/zero`` is an error, not a hang.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os

from etils import epath

from estimator import regular_files
from estimator.errors import CorruptCheckpointError

__all__ = ["MANIFEST", "COMMIT_FILE", "STEP_METADATA", "write_manifest", "verify_manifest"]

MANIFEST = "estimator_digests.json"
_MANIFEST_FORMAT = "estimator.checkpoint-digests"
COMMIT_FILE = "commit_success.txt"            # orbax's last file of a complete step or item
STEP_METADATA = "_CHECKPOINT_METADATA"         # orbax's step metadata, updated while it finalizes
#: Bytes a manifest may take (it lists a few hundred files at most): what is past them is not read.
_MAX_MANIFEST = 16 << 20


def write_manifest(directory: epath.Path, step: int) -> None:
    """Writes ``MANIFEST``: the size and SHA-256 of every file under ``directory`` (but orbax's step
    metadata and commit file, which it writes while committing, and which a restore does not read)."""
    names = sorted(name for name in _files(directory) if name not in (STEP_METADATA, COMMIT_FILE))
    with concurrent.futures.ThreadPoolExecutor(min(8, max(1, len(names)))) as pool:
        digests = list(pool.map(lambda name: _digest(directory, name), names))
    files = {name: {"size": size, "sha256": digest} for name, (size, digest) in zip(names, digests)}
    body = {"format": _MANIFEST_FORMAT, "version": 1, "step": step, "files": files}
    document = dict(body, sha256=_json_digest(body))
    (directory / MANIFEST).write_text(json.dumps(document, indent=1, sort_keys=True))


def verify_manifest(checkpoint: epath.Path, step: int, items: tuple[str, ...]) -> None:
    """Checks the files of ``items`` (``"state"``, ``"extras"``) in ``checkpoint``, the directory of
    checkpoint ``step``, against its manifest; :class:`CorruptCheckpointError` names the first that differs."""
    manifest_path = checkpoint / MANIFEST
    if not manifest_path.exists():
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(manifest_path),
                                     "missing (for a checkpoint written before the manifest existed, "
                                     "restore with verify=False to read it unchecked)")
    files = _read_manifest(checkpoint, manifest_path, step)
    wanted = {name: entry for name, entry in files.items() if name.split("/", 1)[0] in items}
    if {name.split("/", 1)[0] for name in wanted} != set(items):
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(manifest_path),
                                     f"does not list the files of {' and '.join(items)}")
    with concurrent.futures.ThreadPoolExecutor(min(8, len(wanted))) as pool:
        found = dict(zip(wanted, pool.map(lambda name: _digest(checkpoint, name, wanted[name]["size"]), wanted)))
    for name, entry in sorted(wanted.items()):
        size, digest = found[name]
        if size is None:
            reason = "missing"
        elif size > entry["size"]:
            reason = f"more than the {entry['size']} bytes written"
        elif size != entry["size"]:
            reason = f"{size} bytes, {entry['size']} were written"
        elif digest != entry["sha256"]:
            reason = f"its SHA-256 is {digest}, {entry['sha256']} was written"
        else:
            continue
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(checkpoint / name), reason)


def _files(directory: epath.Path, prefix: str = "") -> list[str]:
    """The files under ``directory``, as ``/``-separated paths relative to it."""
    names = []
    for path in directory.iterdir():
        if path.is_dir():
            names += _files(path, f"{prefix}{path.name}/")
        else:
            names.append(prefix + path.name)
    return names


def _read_manifest(checkpoint: epath.Path, path: epath.Path, step: int) -> dict:
    """The ``files`` of checkpoint ``step``'s manifest if its own digest verifies; CorruptCheckpointError otherwise."""
    try:
        with _open(checkpoint, path) as f:
            document = json.loads(f.read(_MAX_MANIFEST + 1)[:_MAX_MANIFEST])
        body = {k: v for k, v in document.items() if k != "sha256"}
        ok = document.get("format") == _MANIFEST_FORMAT and document.get("sha256") == _json_digest(body)
    except (ValueError, AttributeError, UnicodeDecodeError) as e:
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(path), f"not a digest manifest ({e})") from None
    if not ok:
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(path), "its own digest does not match")
    if document["step"] != step:
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(path),
                                     f"it was written for step {document['step']}, not {step}")
    files = document["files"]
    for name in files:
        if name.startswith("/") or ".." in name.split("/"):
            raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(path), f"lists a file outside it: {name!r}")
    return files


def _json_digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _open(checkpoint: epath.Path, path: epath.Path):
    """``path`` opened for binary reading; on a local disk only a regular file (CorruptCheckpointError)."""
    if "://" in os.fspath(path):                  # a remote store: no links nor FIFOs to fear there
        return path.open("rb")
    try:
        return regular_files.open_regular(os.fspath(path))
    except regular_files.NotARegularFile as e:
        raise CorruptCheckpointError(os.fspath(checkpoint), os.fspath(path), e.reason) from None


def _digest(checkpoint: epath.Path, name: str, size_written: int | None = None) -> tuple[int | None, str | None]:
    """(size, SHA-256) of file ``name`` of ``checkpoint``, reading at most one byte more than ``size_written``
    when it is given; (None, None) when the file is missing."""
    try:
        with _open(checkpoint, checkpoint / name) as f:
            return regular_files.sha256_of(f, size_written)
    except FileNotFoundError:
        return None, None
