"""The benchmark datasets: three tf.train.Example layouts, written deterministically from a seed.

- ``mnist``: ``image`` 784 float32 (pixel / 255), ``label`` int64 in 0..9; ~3.2 KB a record.
- ``criteo``: ``I1..I13`` int64 counts (log-normal), ``C1..C26`` int64 hashed
  categories (32-bit), ``label`` float 0/1, each its own feature; ~0.7 KB a record.
- ``imagenet``: ``image/encoded`` 100-120 KB of random (incompressible) bytes,
  ``image/class/label`` int64 in 0..999; ~110 KB a record.

The same (layout, records, seed) always gives the same file, byte for byte.

>>> ds = write_dataset(LAYOUTS["mnist"], "/tmp/doc-mnist.tfrecord", records=4, seed=0)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

import infeed

__all__ = ["Layout", "Dataset", "LAYOUTS", "IMAGE_BYTES", "write_dataset", "ensure_dataset", "make_records"]

#: Bumped when a layout's content changes, so files cached in a --data-dir are not reused.
FORMAT_VERSION = 1

#: Size range of the imagenet layout's encoded images, in bytes (mean ~110 KB).
IMAGE_BYTES = (100_000, 120_000)

_CHUNK = 1024     # rows drawn from the generator at a time


def _mnist_rows(rng: np.random.Generator, n: int) -> Iterator[dict]:
    for start in range(0, n, _CHUNK):
        k = min(_CHUNK, n - start)
        images = (rng.integers(0, 256, (k, 784)) / 255).astype(np.float32)
        labels = rng.integers(0, 10, k).tolist()
        for i in range(k):
            yield {"image": images[i], "label": labels[i]}


_DENSE = [f"I{i}" for i in range(1, 14)]
_CATEGORICAL = [f"C{i}" for i in range(1, 27)]


def _criteo_rows(rng: np.random.Generator, n: int) -> Iterator[dict]:
    for start in range(0, n, _CHUNK):
        k = min(_CHUNK, n - start)
        dense = np.floor(rng.lognormal(1.5, 2.0, (k, len(_DENSE)))).clip(0, 2**31 - 1).astype(np.int64).tolist()
        cats = rng.integers(0, 2**32, (k, len(_CATEGORICAL))).tolist()
        labels = (rng.random(k) < 0.25).astype(np.float32).tolist()
        for i in range(k):
            row = dict(zip(_DENSE, dense[i]))
            row.update(zip(_CATEGORICAL, cats[i]))
            row["label"] = labels[i]
            yield row


def _imagenet_rows(rng: np.random.Generator, n: int) -> Iterator[dict]:
    sizes = rng.integers(IMAGE_BYTES[0], IMAGE_BYTES[1] + 1, n)
    labels = rng.integers(0, 1000, n).tolist()
    for i in range(n):
        yield {"image/encoded": rng.bytes(int(sizes[i])), "image/class/label": labels[i]}


@dataclass(frozen=True)
class Layout:
    """A dataset layout: how its rows are made, and the infeed spec that decodes them.

    records, quick_records: how many records the full and the --quick runs write.
    """

    name: str
    description: str
    records: int
    quick_records: int
    rows: Callable[[np.random.Generator, int], Iterator[dict]]
    spec: Callable[[], dict]


LAYOUTS: Mapping[str, Layout] = {
    layout.name: layout for layout in [
        Layout("mnist", "image: 784 float32, label: int64", 32_768, 4_096, _mnist_rows,
               lambda: {"image": infeed.FixedLen((784,), "float32"), "label": infeed.FixedLen((), "int64")}),
        Layout("criteo", "I1..I13, C1..C26: int64 scalars, label: float", 65_536, 4_096, _criteo_rows,
               lambda: {**{k: infeed.FixedLen((), "int64") for k in _DENSE + _CATEGORICAL},
                        "label": infeed.FixedLen((), "float32")}),
        Layout("imagenet", "image/encoded: 100-120 KB bytes, image/class/label: int64", 1_024, 128,
               _imagenet_rows,
               lambda: {"image/encoded": infeed.Bytes(max_bytes=IMAGE_BYTES[1]),
                        "image/class/label": infeed.FixedLen((), "int64")}),
    ]
}


@dataclass(frozen=True)
class Dataset:
    """A written file: its layout, path, record count and size; ``write_seconds`` is None when reused."""

    layout: Layout
    path: str
    records: int
    nbytes: int
    write_seconds: float | None


def _rng(layout: Layout, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(layout.name.encode())])


def make_records(layout: Layout, records: int, seed: int = 0) -> list[bytes]:
    """The serialized Examples of a dataset, in memory (for kernel benchmarks)."""
    return [infeed.encode_example(row) for row in layout.rows(_rng(layout, seed), records)]


def record_bytes(layout: Layout, seed: int = 0, sample: int = 64) -> float:
    """The mean bytes a record of ``layout`` takes in a file (its TFRecord framing, 16 bytes, included), over the
    first ``sample`` records of ``seed``'s data."""
    records = make_records(layout, sample, seed)
    return sum(len(r) + 16 for r in records) / len(records)


def write_dataset(layout: Layout, path, records: int, seed: int = 0) -> Dataset:
    """Writes ``records`` records of ``layout`` to ``path`` with infeed's TFRecordWriter."""
    path = os.fspath(path)
    t0 = time.perf_counter()
    with infeed.TFRecordWriter(path) as w:
        for row in layout.rows(_rng(layout, seed), records):
            w.write(infeed.encode_example(row))
    return Dataset(layout, path, records, os.path.getsize(path), time.perf_counter() - t0)


def ensure_dataset(layout: Layout, data_dir, records: int, seed: int = 0) -> Dataset:
    """The dataset's file in ``data_dir``, written unless a finished one is already there.

    The name carries the layout, count, seed and FORMAT_VERSION; files are
    written under a temporary name and renamed, so a cut-short write is never reused.
    """
    path = os.path.join(os.fspath(data_dir), f"{layout.name}-{records}-seed{seed}-v{FORMAT_VERSION}.tfrecord")
    if os.path.exists(path):
        return Dataset(layout, path, records, os.path.getsize(path), None)
    tmp = f"{path}.partial{os.getpid()}"
    try:
        ds = write_dataset(layout, tmp, records, seed)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Dataset(layout, path, records, ds.nbytes, ds.write_seconds)


def ensure_datasets(stack: contextlib.ExitStack, data_dir, counts: Mapping[str, int], seed: int,
                    log: Callable[[str], None], suite: str) -> list[Dataset]:
    """:func:`ensure_dataset` for each layout name of ``counts`` (in its order) in ``data_dir``: a temporary
    directory that ``stack`` removes when None. Logs each write as ``<suite>: writing ...``."""
    if data_dir is None:
        data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="infeed-bench-"))
    else:
        os.makedirs(data_dir, exist_ok=True)
    written = []
    for name, count in counts.items():
        log(f"{suite}: writing {count:,} {name} records to {data_dir} ...")
        written.append(ensure_dataset(LAYOUTS[name], data_dir, count, seed))
    return written


def data_note(ds: Dataset, detail: str = "") -> str:
    """The report's note on a suite's data file: records, size, ``detail``, and whether it was reused."""
    how = "reused" if ds.write_seconds is None else f"written in {ds.write_seconds:.1f} s"
    return (f"data: {ds.layout.name}: {ds.records:,} records, {ds.nbytes / 1e6:,.1f} MB "
            f"({ds.nbytes / ds.records:,.0f} B/record), {detail}{how}: {ds.path}")


def indexed_link(path: str) -> str:
    """A hard link of the data file (a copy where links fail) with its own ``infeed index`` sidecar: the
    file itself keeps none, so that its other readers stream it."""
    from infeed.tfrecord.index import build_index, load_index, write_index

    stem, ext = os.path.splitext(path)
    link = f"{stem}.indexed{ext}"
    if not os.path.exists(link):
        tmp = f"{link}.partial{os.getpid()}"
        try:
            os.link(path, tmp)
        except OSError:
            import shutil

            shutil.copyfile(path, tmp)
        os.replace(tmp, link)
    try:
        found = load_index(link)
    except infeed.IndexFileError:
        found = None
    if found is None:
        write_index(build_index(link))
    return link
