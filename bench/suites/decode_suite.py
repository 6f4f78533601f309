"""The ``decode`` suite: TFRecord reading and tf.train.Example decoding, on one core.

Per layout (see :mod:`bench.data.datasets`) and on one pinned CPU, it times, interleaved:

- ``page cache readinto 8 MiB``: the file's bytes read with ``readinto``
  into one 8 MiB buffer (read_records' own buffer size), the file already in
  the page cache: what read_records' reads alone cost, the floor for a reader
  that copies the file (the read_records target is against this row).
- ``page cache readinto 1 buffer``: the same into one buffer the size of the
  file (at most 256 MiB): a slower floor (the buffer does not stay in cache).
- ``infeed read_records``: every record framed and both CRCs checked.
- ``infeed read + parse``: ``read_batch(128)`` and ``ExampleParser.parse`` into
  one preallocated ``out`` reused for every batch, as the ring buffer does.
- ``tf.data read``: ``tf.data.TFRecordDataset(files).batch(128)`` iterated.
- ``tf.data read + parse``: ``TFRecordDataset(files).batch(128).map(lambda x:
  tf.io.parse_example(x, tf_spec))`` iterated to the end.

The tf.data rows appear when TensorFlow is importable; otherwise one note says
how to install it.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Mapping, Sequence

import numpy as np

import infeed
from bench.data import datasets
from bench.harness import Case, Ratio, SuiteResult, interleave, log, pinned_to_one_cpu, settle_allocator

__all__ = ["run", "tf_feature_spec", "parse_case", "BATCH_SIZE", "PAGE_CACHE_BUFFER", "TARGETS",
           "PAGE_CACHE", "PAGE_CACHE_ONE", "READ", "PARSE", "TF_READ", "TF_PARSE"]

BATCH_SIZE = 128
#: read_records' default buffer size: the page-cache baseline reads in the same chunks.
PAGE_CACHE_BUFFER = 8 << 20
#: The largest buffer of the one-buffer page-cache baseline.
ONE_BUFFER_MAX = 256 << 20

PAGE_CACHE = "page cache readinto 8 MiB"
PAGE_CACHE_ONE = "page cache readinto 1 buffer"
READ = "infeed read_records"
PARSE = "infeed read + parse"
TF_READ = "tf.data read"
TF_PARSE = "tf.data read + parse"

#: The issue's targets: (numerator, denominator) -> {layout: minimum ratio of median throughputs}.
TARGETS = {
    (PARSE, TF_PARSE): {"mnist": 3.0, "criteo": 3.0},
    (READ, PAGE_CACHE): {"mnist": 0.5, "criteo": 0.5, "imagenet": 0.5},
}

TF_MISSING = ("tf.data comparison skipped: TensorFlow is not installed "
              "(install it with `pip install -e .[tf]` to compare against tf.data)")


def tf_feature_spec(spec: Mapping, tf) -> dict:
    """The ``tf.io.parse_example`` spec that decodes what an infeed spec decodes."""
    dtypes = {"float32": tf.float32, "int64": tf.int64, "int32": tf.int64}
    out = {}
    for name, f in spec.items():
        if isinstance(f, infeed.FixedLen):
            out[name] = tf.io.FixedLenFeature(list(f.shape), dtypes[f.dtype])
        elif isinstance(f, infeed.VarLen):
            out[name] = tf.io.VarLenFeature(dtypes[f.dtype])
        elif isinstance(f, infeed.Bytes):
            out[name] = tf.io.FixedLenFeature([], tf.string)
        else:
            raise TypeError(f"spec[{name!r}]: no tf.io equivalent for {f!r}")
    return out


def _page_cache_case(ds: datasets.Dataset, name: str, buffer_size: int) -> Case:
    buf = bytearray(min(buffer_size, max(ds.nbytes, 1)))

    def run():
        total = 0
        with open(ds.path, "rb", buffering=0) as f:
            while got := f.readinto(buf):
                total += got
        if total != ds.nbytes:
            raise RuntimeError(f"{ds.path}: read {total} bytes, expected {ds.nbytes}")
        return ds.records

    return Case(name, run, ds.records, ds.nbytes)


def _read_case(ds: datasets.Dataset) -> Case:
    def run():
        with infeed.read_records(ds.path) as reader:
            collections.deque(reader, maxlen=0)
            return reader.records_read

    return Case(READ, run, ds.records, ds.nbytes)


def parse_case(ds: datasets.Dataset, batch_size: int) -> Case:
    """``read_batch(batch_size)`` and ``ExampleParser.parse`` into one preallocated batch, in this process."""
    parser = infeed.ExampleParser(ds.layout.spec())
    out = parser.allocate(batch_size)

    def run():
        n = 0
        with infeed.read_records(ds.path) as reader:
            while batch := reader.read_batch(batch_size):
                parser.parse(batch, out=out)
                n += len(batch)
        return n

    return Case(PARSE, run, ds.records, ds.nbytes)


def _tf_cases(ds: datasets.Dataset, batch_size: int, tf) -> list[Case]:
    spec = tf_feature_spec(ds.layout.spec(), tf)
    first = next(iter(spec))
    raw = tf.data.TFRecordDataset([ds.path]).batch(batch_size)
    parsed = tf.data.TFRecordDataset([ds.path]).batch(batch_size).map(lambda x: tf.io.parse_example(x, spec))

    def read():
        return sum(int(b.shape[0]) for b in raw)

    def parse():
        return sum(int(b[first].shape[0]) for b in parsed)

    return [Case(TF_READ, read, ds.records, ds.nbytes), Case(TF_PARSE, parse, ds.records, ds.nbytes)]


def _check_same_first_batch(ds: datasets.Dataset, batch_size: int, tf) -> None:
    """tf.data and infeed must decode the same values, or the comparison means nothing."""
    spec = ds.layout.spec()
    with infeed.read_records(ds.path) as reader:
        ours = infeed.parse_examples(reader.read_batch(batch_size), spec)
    theirs = next(iter(tf.data.TFRecordDataset([ds.path]).batch(batch_size)
                       .map(lambda x: tf.io.parse_example(x, tf_feature_spec(spec, tf)))))
    for name, f in spec.items():
        if isinstance(f, infeed.FixedLen):
            same = np.array_equal(ours[name], theirs[name].numpy())
        elif isinstance(f, infeed.Bytes):
            values, lengths = ours[name]
            same = [bytes(v[:n]) for v, n in zip(values, lengths)] == list(theirs[name].numpy())
        else:
            values, lengths = ours[name]
            same = ([v[:n].tolist() for v, n in zip(values, lengths)]
                    == tf.RaggedTensor.from_sparse(theirs[name]).to_list())
        if not same:
            raise RuntimeError(f"{ds.layout.name}: infeed and tf.data decode {name!r} differently")


def _cases(ds: datasets.Dataset, batch_size: int, tf) -> list[Case]:
    """Every pipeline of one layout, its file warmed into the page cache."""
    with open(ds.path, "rb") as f:
        while f.read(PAGE_CACHE_BUFFER):
            pass
    cases = [_page_cache_case(ds, PAGE_CACHE, PAGE_CACHE_BUFFER), _page_cache_case(ds, PAGE_CACHE_ONE, ONE_BUFFER_MAX),
             _read_case(ds), parse_case(ds, batch_size)]
    if tf is not None:
        _check_same_first_batch(ds, batch_size, tf)
        cases += _tf_cases(ds, batch_size, tf)
    return cases


def _import_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError:
        return None
    return tf


def run(layouts: Sequence[str] = tuple(datasets.LAYOUTS), *, records: Mapping[str, int] | None = None,
        scale: float = 1.0, quick: bool = False, repeats: int | None = None, data_dir=None, seed: int = 0,
        cpu: int | None = None, tensorflow: bool = True, batch_size: int = BATCH_SIZE) -> SuiteResult:
    """Measures every layout; returns the figures, the ratios against TARGETS and notes.

    records: per-layout record counts; a layout not named gets its default
        (``records``, or ``quick_records`` with ``quick``) times ``scale`` (at least 1).
    repeats: timed runs per case (default 7, 3 with ``quick``); one untimed warm-up run precedes them.
    data_dir: where the files go and are reused from; default a temporary directory, removed after.
    cpu: the CPU to pin to (default: the last one allowed).
    tensorflow: compare with tf.data when TensorFlow is importable.
    """
    unknown = [name for name in layouts if name not in datasets.LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {sorted(datasets.LAYOUTS)}")
    repeats = repeats if repeats is not None else (3 if quick else 7)
    counts = {}
    for name in layouts:
        layout = datasets.LAYOUTS[name]
        default = max(1, round((layout.quick_records if quick else layout.records) * scale))
        counts[name] = int((records or {}).get(name, default))
    result = SuiteResult("decode", group_label="layout", name_label="pipeline",
                         params={"layouts": list(layouts), "records": counts, "repeats": repeats, "warmup": 1,
                                 "batch_size": batch_size, "seed": seed})
    with contextlib.ExitStack() as stack:
        files = datasets.ensure_datasets(stack, data_dir, counts, seed, log, "decode")
        result.notes.extend(datasets.data_note(ds) for ds in files)
        pinned = stack.enter_context(pinned_to_one_cpu(cpu))
        # TensorFlow is imported after pinning, so that its thread pools start on the one CPU too.
        tf = _import_tensorflow() if tensorflow else None
        result.params.update(cpu=pinned, tensorflow=getattr(tf, "__version__", None))
        for ds in files:
            log(f"decode: timing {ds.layout.name} ({repeats} runs per case) ...")
            cases = _cases(ds, batch_size, tf)
            settle_allocator()
            for m in interleave(cases, repeats):
                result.figures.append(m.figure("decode", ds.layout.name))
            _add_ratios(result, ds.layout.name, tf is not None)
    pin_note = f"one CPU (#{pinned}, every thread pinned)" if pinned is not None else "no CPU pinning (unsupported)"
    result.notes += [
        f"run on {pin_note}; batch {batch_size}; each figure is the median of the stated runs "
        "(one warm-up run first; cases interleaved A B C A B C; garbage collector off while timing; "
        "malloc settled first, see bench.harness.settle_allocator)",
        "MB/s: file bytes (TFRecord framing included) / s, MB = 10^6 bytes; the file is in the page cache",
    ]
    if tf is not None:
        result.notes.append(f"tf.data: TensorFlow {tf.__version__}; both pipelines decode the first batch "
                            "to identical values (checked)")
    elif tensorflow:
        result.notes.append(TF_MISSING)
    else:
        result.notes.append("tf.data comparison not run (--no-tf)")
    return result


def _add_ratios(result: SuiteResult, layout: str, with_tf: bool) -> None:
    pairs = [(READ, PAGE_CACHE), (READ, PAGE_CACHE_ONE)]
    if with_tf:
        pairs += [(PARSE, TF_PARSE), (READ, TF_READ)]
    for num, den in pairs:
        value = result.figure(layout, num).records_per_s / result.figure(layout, den).records_per_s
        result.ratios.append(Ratio("decode", layout, f"{num} / {den}", value,
                                   TARGETS.get((num, den), {}).get(layout)))
