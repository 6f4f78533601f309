"""A build of tensorflow-datasets found by its own metadata, with no import of TensorFlow or TFDS:
``<data_dir>/<name>/<config>/<version>/`` holds ``dataset_info.json`` (the splits, each shard's example count,
the file names' template), ``features.json`` (each feature's type, dtype, shape, image encoding) and the
shards, ``<name>-<split>.tfrecord-00000-of-00003`` and on.

:func:`open_build` takes the version folder, or a dataset or config folder with one build below it (several
configs or versions are refused, naming them); :class:`TfdsBuild` gives each split's shards in order and
their exact example counts.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from infeed.errors import TfdsBuildError
from infeed.tfrecord.names import path_str
from infeed.tfrecord.reader import _is_uri, open_input

__all__ = ["TfdsBuild", "TfdsSplit", "holds_build", "open_build", "INFO_FILE", "FEATURES_FILE"]

INFO_FILE = "dataset_info.json"
FEATURES_FILE = "features.json"
#: The shards' names where dataset_info.json gives no template (TFDS's default).
DEFAULT_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
_PLACEHOLDER = re.compile(r"{([A-Z_]+)}")
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


@dataclass(frozen=True)
class TfdsSplit:
    """One split of a build: its shards in TFDS's order and each one's example count."""

    name: str
    files: tuple[str, ...]
    shard_lengths: tuple[int, ...]

    @property
    def examples(self) -> int:
        """The split's examples, as TFDS counted them when it wrote the shards."""
        return sum(self.shard_lengths)


@dataclass(frozen=True)
class TfdsBuild:
    """A TFDS build folder: its dataset ``name``, ``config`` (None where it has none), ``version``, splits and the
    ``features.json`` document (:func:`infeed.tfds.features.stored_features` reads it)."""

    folder: str
    name: str
    config: str | None
    version: str
    splits: dict[str, TfdsSplit]
    features: dict

    def split(self, name: str) -> TfdsSplit:
        """The split ``name``; a :class:`~infeed.errors.TfdsBuildError` naming the build's splits where it has
        none of that name."""
        try:
            return self.splits[name]
        except KeyError:
            raise TfdsBuildError(self.folder, f"no split {name!r}; the build has {sorted(self.splits)}") from None


def open_build(path) -> TfdsBuild:
    """The TFDS build at ``path``: a version folder (``dataset_info.json`` in it), or a local dataset or config
    folder with exactly one build below it. Raises :class:`~infeed.errors.TfdsBuildError` naming what it found
    instead (several configs or versions, no build, an ``array_record`` build) and FileNotFoundError naming a
    missing shard."""
    path = path_str(path)
    folder = _build_folder((path if _is_uri(path) else os.path.expanduser(path)).rstrip("/"))
    info = _read_json(_join(folder, INFO_FILE))
    features = _read_json(_join(folder, FEATURES_FILE))
    file_format = info.get("fileFormat", "tfrecord")
    if file_format != "tfrecord":
        raise TfdsBuildError(folder, f"a TFDS build of {file_format} files; infeed reads TFRecord builds (TFDS "
                                     "writes them with file_format='tfrecord', its default)")
    name = info.get("name")
    if not name:
        raise TfdsBuildError(_join(folder, INFO_FILE), "no dataset name in it")
    splits = {}
    for split in info.get("splits", []):
        lengths = tuple(int(n) for n in split.get("shardLengths", []))
        template = split.get("filepathTemplate") or DEFAULT_TEMPLATE
        files = tuple(_join(folder, _shard_name(template, name, split["name"], file_format, i, len(lengths)))
                      for i in range(len(lengths)))
        if not _is_uri(folder):
            missing = [f for f in files if not os.path.isfile(f)]
            if missing:
                raise FileNotFoundError(f"{folder}: split {split['name']!r} has {len(files)} shards in "
                                        f"{INFO_FILE}, and {len(missing)} are missing: {missing[0]}"
                                        + (" ..." if len(missing) > 1 else ""))
        splits[split["name"]] = TfdsSplit(split["name"], files, lengths)
    return TfdsBuild(folder, name, info.get("configName") or None, info.get("version", ""), splits, features)


def _build_folder(path: str) -> str:
    """``path``, or the one build folder below it (a dataset folder's config, a config folder's version)."""
    if _exists(_join(path, INFO_FILE)):
        return path
    if _is_uri(path):
        raise TfdsBuildError(path, f"no {INFO_FILE} in it: name the build's version folder "
                                   "(<data_dir>/<name>/<config>/<version>)")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such folder")
    for _ in range(2):                          # a dataset folder, then a config folder
        builds = sorted(entry for entry in os.listdir(path) if os.path.isdir(os.path.join(path, entry))
                        and not entry.startswith(".") and _holds_build(os.path.join(path, entry)))
        if not builds:
            break
        if len(builds) > 1:
            kind = "versions" if all(_VERSION.fullmatch(b) for b in builds) else "configs"
            raise TfdsBuildError(path, f"holds several TFDS {kind}: {', '.join(builds)}; name one "
                                       f"({os.path.join(path, builds[0])})")
        path = os.path.join(path, builds[0])
        if os.path.isfile(os.path.join(path, INFO_FILE)):
            return path
    raise TfdsBuildError(path, f"not a TFDS build: no {INFO_FILE} in it or in one config or version folder "
                               "below it")


def holds_build(path) -> bool:
    """Whether the local folder ``path`` is a TFDS build, or holds builds a config or a version below it (what
    :func:`open_build` looks for; it may still find several)."""
    path = os.path.expanduser(path_str(path))
    if not os.path.isdir(path):
        return False
    return _holds_build(path) or any(_holds_build(os.path.join(path, e)) for e in os.listdir(path)
                                     if not e.startswith(".") and os.path.isdir(os.path.join(path, e)))


def _holds_build(folder: str) -> bool:
    """Whether ``folder`` is a build, or holds one a level or two below (a config's versions)."""
    if os.path.isfile(os.path.join(folder, INFO_FILE)):
        return True
    try:
        entries = os.listdir(folder)
    except OSError:
        return False
    return any(os.path.isfile(os.path.join(folder, e, INFO_FILE)) for e in entries if not e.startswith("."))


def _shard_name(template: str, dataset: str, split: str, file_format: str, index: int, count: int) -> str:
    values = {"DATASET": dataset, "SPLIT": split, "FILEFORMAT": file_format,
              "SHARD_X_OF_Y": f"{index:05d}-of-{count:05d}", "SHARD_INDEX": f"{index:05d}",
              "NUM_SHARDS": f"{count:05d}"}

    def fill(match):
        try:
            return values[match[1]]
        except KeyError:
            raise TfdsBuildError(INFO_FILE, f"the shards' template {template!r} has {{{match[1]}}}, which infeed "
                                            f"does not know (it knows {', '.join(sorted(values))})") from None
    return _PLACEHOLDER.sub(fill, template)


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if _is_uri(folder) else os.path.join(folder, name)


def _exists(path: str) -> bool:
    if not _is_uri(path):
        return os.path.isfile(path)
    try:
        stream, _ = open_input(path)
    except FileNotFoundError:
        return False
    stream.close()
    return True


def _read_json(path: str) -> dict:
    try:
        if _is_uri(path):
            stream, _ = open_input(path)
            with stream:
                text = stream.read()
        else:
            with open(path, "rb") as f:
                text = f.read()
        doc = json.loads(text)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: missing, which every TFDS build has") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TfdsBuildError(path, f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise TfdsBuildError(path, "not a JSON object")
    return doc
