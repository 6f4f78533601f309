"""The integrity of an export: every file's size and SHA-256, listed in ``signature.json``, and the digest of
``signature.json`` itself, which a user pins; export files are opened only when they are regular files.

:func:`file_digests` lists every file of the export but ``signature.json`` (``saved_model/`` too) as
``{name: {"size", "sha256"}}``, names ``/``-separated and relative to the export. :func:`check_listing`
refuses an export whose list is missing, unparsable or partial (a file not listed, a listed file
absent) with :class:`ExportIntegrityError`; :func:`open_checked` streams a file through SHA-256 before
it is parsed. The list protects against accidental damage and partial copies (a flipped bit, a file
cut short or left behind); it does not protect against someone who can rewrite both a file and the list.
:func:`export_digest` closes that gap: the SHA-256 of ``signature.json``'s bytes (what ``sha256sum
<export>/signature.json`` prints), which covers every file through the list. Pinned where the export was
written and passed by another channel to ``load_exported(path, expected_digest=...)``, it makes a
rewritten export an error too.

A size is trusted only of a regular file opened without following a symbolic link: a link to
``/dev/zero``, a FIFO or a device would be read without end (or block), so each is
:class:`CorruptExportError` naming it.
"""

from __future__ import annotations

import os
import re

from estimator import regular_files
from estimator.errors import CorruptExportError, ExportIntegrityError

__all__ = ["SIGNATURE", "SHA256_HEX", "open_regular", "open_checked", "file_digests", "check_listing", "export_digest"]

SIGNATURE = "signature.json"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")      # how a digest is written: 64 lowercase hex digits
def open_regular(path: str):
    """``path`` opened for reading in binary if it is a regular file (:mod:`estimator.regular_files`); a
    symbolic link, a FIFO, a device or a missing file is :class:`CorruptExportError` naming it."""
    try:
        return regular_files.open_regular(path)
    except FileNotFoundError:
        raise CorruptExportError(path, "it is missing") from None
    except regular_files.NotARegularFile as e:
        raise CorruptExportError(path, f"it is {e.reason}") from None


def open_checked(path: str, entry: dict | None):
    """:func:`open_regular`, and when ``entry`` (``{"size", "sha256"}``) is given, the file's size and
    SHA-256 checked against it in one bounded pass; the file is returned at its start."""
    f = open_regular(path)
    if entry is None:
        return f
    size, digest = regular_files.sha256_of(f)
    if size != entry["size"] or digest != entry["sha256"]:
        f.close()
        raise CorruptExportError(path, f"it has {size} bytes, {entry['size']} were exported" if size != entry["size"]
                                 else "its SHA-256 differs from the one recorded when it was exported")
    f.seek(0)
    return f


def _names(directory: str, prefix: str = "") -> list[str]:
    """Every entry under ``directory`` that is not a directory, ``/``-separated; links are not followed."""
    names = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                names += _names(entry.path, f"{prefix}{entry.name}/")
            else:
                names.append(prefix + entry.name)
    return names


def file_digests(directory: str) -> dict[str, dict]:
    """``{name: {"size", "sha256"}}`` of every file under ``directory`` but ``signature.json``."""
    files = {}
    for name in sorted(_names(directory)):
        if name != SIGNATURE:
            with open_regular(os.path.join(directory, name)) as f:
                size, digest = regular_files.sha256_of(f)
            files[name] = {"size": size, "sha256": digest}
    return files


def check_listing(directory: str, signature: dict, required: tuple[str, ...]) -> dict[str, dict]:
    """The ``files`` of ``signature``, checked to be well formed, to include ``required`` and to name exactly
    the files under ``directory``; :class:`ExportIntegrityError` names the export and what is missing."""
    path = os.path.join(directory, SIGNATURE)
    if "files" not in signature:
        raise ExportIntegrityError(directory, path, "it lists no file digests, so a changed file would go unnoticed "
                                   "(load_exported(..., verify=False) loads it without the digest checks)")
    files = signature["files"]
    if not (isinstance(files, dict) and all(
            isinstance(e, dict) and type(e.get("size")) is int and e["size"] >= 0
            and isinstance(e.get("sha256"), str) and SHA256_HEX.fullmatch(e["sha256"]) for e in files.values())):
        raise ExportIntegrityError(directory, path, "its file digests are not {name: {size, sha256}}")
    for name in required:
        if name not in files:
            raise ExportIntegrityError(directory, os.path.join(directory, name), f"{SIGNATURE} lists no digest for it")
    found = set(_names(directory)) - {SIGNATURE}
    unlisted, absent = sorted(found - set(files)), sorted(set(files) - found)
    if unlisted:
        raise ExportIntegrityError(directory, os.path.join(directory, unlisted[0]),
                                   f"it is in the export but {SIGNATURE} lists no digest for it")
    if absent:
        raise ExportIntegrityError(directory, os.path.join(directory, absent[0]),
                                   f"{SIGNATURE} lists it, but the export has no such file")
    return files


def export_digest(directory) -> str:
    """The SHA-256 of ``<directory>/signature.json`` (hex), which lists every file's SHA-256: the one digest
    of the whole export to pin, and to pass to ``load_exported(directory, expected_digest=...)``.

    >>> import tempfile, numpy as np
    >>> from estimator.export import TensorSpec, export_model, load_exported
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = export_model(lambda v, f: {"y": f["x"] * v}, np.float32(2), {"x": TensorSpec((None,), "float32")},
    ...                         tmp + "/model", platforms=("cpu",))
    ...     digest = export_digest(path)           # at export: keep it apart from the files
    ...     serve = load_exported(path, expected_digest=digest)
    >>> serve.digest == digest and len(digest)
    64
    """
    with open_regular(os.path.join(os.fspath(directory), SIGNATURE)) as f:
        return regular_files.sha256_of(f)[1]
