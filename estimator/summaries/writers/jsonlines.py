"""``JsonLinesWriter``: a MetricWriter appending one JSON object per value to ``<logdir>/metrics.jsonl``.

Every line has ``step``, ``wall_time``, ``kind`` and ``tag``, then what the kind holds::

    {"step": 100, "wall_time": 1767225600.5, "kind": "scalar", "tag": "loss", "value": 0.25}
    {"step": 100, ..., "kind": "histogram", "tag": "w", "count": 96, "min": -0.9, "max": 1.1, "mean": 0.01,
     "std": 0.3, "sum": 0.96, "nonfinite": 0, "edges": [-0.9, ...], "counts": [2, ...]}
    {"step": 100, ..., "kind": "image", "tag": "digits", "shape": [28, 28, 1], "path": "images/digits/100.png"}
    {"step": 100, ..., "kind": "text", "tag": "note", "text": "..."}
    {"step": null, ..., "kind": "hparams", "tag": "hparams", "hparams": {"learning_rate": 0.01}}

Histograms are the statistics of the finite values and ``counts[i]`` values in ``[edges[i],
edges[i + 1])`` (equal-width buckets: ``matplotlib``'s ``stairs(counts, edges)`` draws one). An
image's PNG is written beside the file (``path`` is relative to it; a batch [N, H, W, C] gives N
lines with ``index`` 0 ... N-1 and files ``<step>_<index>.png``), or not at all with
``save_images=False`` (the line keeps the shape). Values that are not finite are written as
Python's ``json`` writes them (``NaN``, ``Infinity``, ``-Infinity``): ``json.loads`` reads them, strict
JSON parsers do not.

The file is opened for appending: a restarted run adds to it (steps written again after a resume
from an earlier checkpoint appear twice, the later lines the newer values), and a last line cut
short by a crash is removed first. Each write is flushed to the operating system as a whole number
of lines. One process writes a file (the estimator writes on process 0 only).

>>> import tempfile
>>> logdir = tempfile.mkdtemp()
>>> with JsonLinesWriter(logdir) as w:
...     w.write_scalars(10, {"loss": 0.5})
...     w.write_texts(10, {"note": "hello"})
>>> [(m["step"], m["kind"], m["tag"]) for m in read_metrics(logdir)]
[(10, 'scalar', 'loss'), (10, 'text', 'note')]
"""

from __future__ import annotations

import json
import logging
import operator
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Self

import numpy as np

from estimator.errors import InvalidArgumentError
from estimator.summaries.data import as_image_batch, encode_png, histogram

__all__ = ["JsonLinesWriter", "read_metrics"]

_log = logging.getLogger("estimator")

FILENAME = "metrics.jsonl"


def _plain(value):
    """A hyperparameter as JSON holds it: bools, numbers and strings as they are, anything else as ``str``."""
    if isinstance(value, np.generic):
        value = value.item()
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def _tag(tag) -> str:
    if not isinstance(tag, str) or not tag:
        raise InvalidArgumentError(f"a summary tag must be a non-empty str, got {tag!r}")
    return tag


def _file_part(tag: str) -> str:
    """``tag`` as one safe file name: runs of characters other than letters, digits, ``.``, ``_`` and ``-``
    become ``_`` (``eval/digits`` -> ``eval_digits``), never starting with a dot."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", tag).lstrip(".") or "_"


def _drop_torn_line(path: str) -> None:
    """Cuts a last line that has no newline (a write cut short by a crash) off the file at ``path``."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        end = size
        while end > 0:                                        # find the last newline, 64 KiB at a time
            start = max(0, end - 65536)
            f.seek(start)
            i = f.read(end - start).rfind(b"\n")
            if i >= 0:
                end = start + i + 1
                break
            end = start
        f.truncate(end)
        _log.warning("%s: removed a last line cut short (%d bytes) before appending", path, size - end)


class JsonLinesWriter:
    """Appends JSON lines to ``<logdir>/<filename>`` (see the module's docstring for the lines).

    ``save_images``: write each image's PNG under ``<logdir>/images/<tag>/`` (else only its shape).
    ``num_buckets``: a histogram's buckets unless a call asks for others (default 30). A local
    directory (no URI). Thread-safe; writing after :meth:`close` raises ``InvalidArgumentError``.
    """

    def __init__(self, logdir, *, filename: str = FILENAME, save_images: bool = True,
                 num_buckets: int | None = None):
        self.logdir = os.fspath(logdir)
        if "://" in self.logdir:
            raise InvalidArgumentError(f"JsonLinesWriter writes local files, got {self.logdir!r}")
        if not isinstance(filename, str) or not filename or os.sep in filename:
            raise InvalidArgumentError(f"JsonLinesWriter's filename must be a file name, got {filename!r}")
        self.path = os.path.join(self.logdir, filename)
        self.save_images, self.num_buckets = bool(save_images), num_buckets
        os.makedirs(self.logdir, exist_ok=True)
        _drop_torn_line(self.path)
        self._file = open(self.path, "a", encoding="utf-8", newline="\n")
        self._lock = threading.Lock()

    # ------------------------------------------------------------ MetricWriter
    def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
        step = operator.index(step)
        self._write([self._line("scalar", step, tag, value=float(value)) for tag, value in scalars.items()])

    def write_histograms(self, step: int, arrays: Mapping[str, Any],
                         num_buckets: Mapping[str, int] | None = None) -> None:
        step = operator.index(step)
        lines = []
        for tag, values in arrays.items():
            h = histogram(values, (num_buckets or {}).get(tag, self.num_buckets), tag=tag)
            lines.append(self._line("histogram", step, tag, count=h.count, min=h.min, max=h.max, mean=h.mean,
                                    std=h.std, sum=h.sum, nonfinite=h.nonfinite, edges=list(h.edges),
                                    counts=list(h.counts)))
        self._write(lines)

    def write_images(self, step: int, images: Mapping[str, Any]) -> None:
        step = operator.index(step)
        lines = []
        for tag, image in images.items():
            batch, is_batch = as_image_batch(image, tag=_tag(tag))
            for i, pixels in enumerate(batch):
                fields = {"index": i} if is_batch else {}
                fields["shape"] = list(pixels.shape)
                if self.save_images:
                    fields["path"] = self._save_png(tag, f"{step}_{i}" if is_batch else f"{step}", pixels)
                lines.append(self._line("image", step, tag, **fields))
        self._write(lines)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        step = operator.index(step)
        self._write([self._line("text", step, tag, text=str(text)) for tag, text in texts.items()])

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._write([self._line("hparams", None, "hparams", hparams={_tag(k): _plain(v) for k, v in hparams.items()})])

    def flush(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JsonLinesWriter({self.path!r}{', closed' if self._file.closed else ''})"

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _line(kind: str, step: int | None, tag: str, **fields) -> str:
        return json.dumps({"step": step, "wall_time": time.time(), "kind": kind, "tag": _tag(tag), **fields},
                          ensure_ascii=False) + "\n"

    def _write(self, lines: list[str]) -> None:
        with self._lock:
            if self._file.closed:
                raise InvalidArgumentError(f"{self.path}: write to a closed JsonLinesWriter")
            if lines:
                self._file.write("".join(lines))
                self._file.flush()

    def _save_png(self, tag: str, name: str, pixels: np.ndarray) -> str:
        """Writes ``images/<tag>/<name>.png`` beside the file (by a rename: never half a file) and
        returns its path relative to the file's directory."""
        relative = os.path.join("images", _file_part(tag), name + ".png")
        path = os.path.join(self.logdir, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(encode_png(pixels))
        os.replace(path + ".tmp", path)
        return relative


def read_metrics(path_or_dir, kind: str | None = None) -> list[dict]:
    """The lines of a :class:`JsonLinesWriter`'s file (or of ``metrics.jsonl`` in a directory) as dicts,
    in the order written, only those of ``kind`` when given; a last line cut short is left out."""
    path = os.fspath(path_or_dir)
    if os.path.isdir(path):
        path = os.path.join(path, FILENAME)
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.endswith("\n"):
                break                                  # a write cut short: the writer drops it on its next open
            record = json.loads(line)
            if kind is None or record.get("kind") == kind:
                out.append(record)
    return out
