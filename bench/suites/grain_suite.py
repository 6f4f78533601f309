"""The ``grain`` suite: a Grain pipeline over infeed's source and decoder, against Grain's own path and the daemon.

Per layout (``mnist``, ``criteo`` by default; files of :mod:`bench.data.datasets`,
:data:`RECORDS` records each), every pipeline takes one
epoch in a global shuffle (Grain's ``.shuffle(seed=0)`` / the daemon's
``shuffle="global"``) in batches of B, the final partial batch dropped, and the
consumer only takes the batches. Timed interleaved (A B C ... A B C):

- ``grain: TFRecordSource + ParseBatch``: ``MapDataset.source(TFRecordSource)
  .shuffle().batch(B, batch_fn=ParseBatch(spec))`` (:mod:`infeed.grain`: a
  ``pread`` and both CRCs per record, a batch decoded by ExampleParser),
  iterated with ``ReadOptions(num_threads=0)``: all in the consumer's thread.
- ``..., Grain's 16 threads``: the same pipeline iterated as Grain does by
  default (``ReadOptions()``: 16 threads read and decode ahead).
- ``grain: TFRecordSource + ParseExample + .batch()``: decoded per record, then
  Grain's ``.batch()`` stacks the rows (0 threads).
- ``grain: ArrayRecord + ParseBatch``: the same records in an ArrayRecord file
  (``group_size:1``, for random access) through Grain's
  ``ArrayRecordDataSource``, decoded by ParseBatch (0 threads): the source's
  share of the cost, apart.
- ``grain: ArrayRecord + protobuf + .batch()``: Grain's own path without
  TensorFlow: ``ArrayRecordDataSource``, each record parsed as a
  ``tf.train.Example`` by protobuf (the message built from its descriptor; the
  upb backend) and its features turned into numpy rows by a ``Map``, then
  Grain's ``.batch()`` (0 threads); ``..., Grain's 16 threads`` iterated as Grain
  does by default.
- ``grain DataLoader, 1 worker: TFRecordSource + ParseBatch``:
  ``grain.DataLoader(worker_count=1, read_options=ReadOptions(num_threads=0))``
  with an ``IndexSampler`` (shuffled) and ``Batch(B, batch_fn=ParseBatch(spec))``
  (Grain 0.2.18's default ``ReadOptions``, 16 threads and 500 records ahead,
  scans its whole buffer of futures for every record: 2-3x slower here, so
  the worker reads in its own thread): one process decodes, the consumer
  takes; steady state from the first batch's arrival (batches 2..N), its
  start-up (a spawned interpreter, imports) apart, as for the next two;
- ``grain mp_prefetch, 1 worker: TFRecordSource + ParseBatch``: the first
  pipeline (``to_iter_dataset(ReadOptions(num_threads=0))``) through
  ``.mp_prefetch(MultiprocessingOptions(num_workers=1))``, Grain's dataset API
  for worker processes;
- ``daemon W=1``: ``infeed.Daemon(Dataset(shuffle="global"), num_workers=1)``
  (reads through the same sidecar), steady state: batches 2..N.

And the timings (lower is better), in microseconds per record over the first
:data:`PART_RECORDS` records of the shuffle, interleaved: ``TFRecordSource[i]``,
``ArrayRecordDataSource[i]``, ``ParseBatch`` over batches of B, the protobuf
path's parse of one record into numpy rows, and Grain's own machinery alone
(``MapDataset.range(n).shuffle().batch(B, batch_fn=list)`` iterated: indices,
no data): where a Grain pipeline's time goes.

Before timing, each in-process pipeline's first batch is checked against
``ExampleParser.parse`` of the records its shuffle drew (the protobuf path's
too), or its figures would mean nothing. MB/s counts the TFRecord bytes of the
records taken (framing included) for every row, ArrayRecord ones too.

Sidecars: the suite indexes a hard link of each data file (``*.indexed.tfrecord``)
rather than the file itself, whose sidecar would change how the other suites'
daemons read it when they share ``--data-dir``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping, Sequence

import numpy as np

import infeed
from bench.data import datasets
from bench.harness import Case, Measurement, Ratio, SuiteResult, Timing, interleave, log, settle_allocator
from bench.peers.example_proto import example_class
from bench.suites import decode_suite, infeed_suite
from bench.suites.daemon_runs import DaemonCase

__all__ = ["run", "CASES", "SOURCE_PARSE", "SOURCE_PARSE_THREADS", "SOURCE_ROWS", "ARRAY_RECORD_PARSE",
           "PROTOBUF", "PROTOBUF_THREADS", "LOADER", "MP_PREFETCH", "DAEMON", "PARTS", "LAYOUTS", "SKIPPED",
           "protobuf_rows"]

SUITE = "grain"
BATCH_SIZE = decode_suite.BATCH_SIZE
#: The layouts this suite measures unless told (imagenet's records are one bytes feature: nothing to decode).
LAYOUTS = ("mnist", "criteo")
#: Records of each layout (a full run, --quick): 64 batches, enough for the steady states, while the slowest
#: pipelines (protobuf, Grain's DataLoader) keep a run to seconds.
RECORDS, QUICK_RECORDS = 8192, 2048
#: Untimed runs of every case before the timed ones.
WARMUP = 1
SEED = 0

SOURCE_PARSE = "grain: TFRecordSource + ParseBatch"
SOURCE_PARSE_THREADS = "grain: TFRecordSource + ParseBatch, Grain's 16 threads"
SOURCE_ROWS = "grain: TFRecordSource + ParseExample + .batch()"
ARRAY_RECORD_PARSE = "grain: ArrayRecord + ParseBatch"
PROTOBUF = "grain: ArrayRecord + protobuf + .batch()"
PROTOBUF_THREADS = "grain: ArrayRecord + protobuf + .batch(), Grain's 16 threads"
LOADER = "grain DataLoader, 1 worker: TFRecordSource + ParseBatch"
MP_PREFETCH = "grain mp_prefetch, 1 worker: TFRecordSource + ParseBatch"
DAEMON = "daemon W=1"
CASES = (SOURCE_PARSE, SOURCE_PARSE_THREADS, SOURCE_ROWS, ARRAY_RECORD_PARSE, PROTOBUF, PROTOBUF_THREADS, LOADER,
         MP_PREFETCH, DAEMON)
#: The ratios the report shows (information: no targets).
RATIOS = ((SOURCE_PARSE, PROTOBUF), (SOURCE_PARSE_THREADS, PROTOBUF_THREADS), (SOURCE_PARSE, ARRAY_RECORD_PARSE),
          (SOURCE_PARSE, SOURCE_ROWS), (DAEMON, LOADER), (DAEMON, MP_PREFETCH), (DAEMON, SOURCE_PARSE),
          (DAEMON, SOURCE_PARSE_THREADS))

#: Records the per-record costs (the timings) are measured over, at most.
PART_RECORDS = 2048
PART_SOURCE = "per record: TFRecordSource[i]"
PART_ARRAY_RECORD = "per record: ArrayRecordDataSource[i]"
PART_PARSE = "per record: ParseBatch, batches of B"
PART_PROTOBUF = "per record: protobuf Example -> numpy row"
PART_GRAIN = "per record: Grain's .shuffle().batch() of indices, no data"
PARTS = (PART_SOURCE, PART_ARRAY_RECORD, PART_PARSE, PART_PROTOBUF, PART_GRAIN)

SKIPPED = "grain suite skipped: Grain is not installed (pip install -e .[grain])"


def _import_grain():
    try:
        import grain
        from array_record.python import array_record_module  # noqa: F401  (Grain's ArrayRecordDataSource needs it)
        import infeed.grain  # noqa: F401
    except ImportError:
        return None
    return grain


# --- Grain's own path: tf.train.Example by protobuf --------------------------------------------------------

def protobuf_rows(spec: Mapping):
    """A function of one serialized Example -> ``{name: numpy row}`` for a spec of FixedLen features, by
    protobuf: what a Grain user without TensorFlow writes (each feature's kind and length checked)."""
    example = example_class()
    fields = {"float32": "float_list", "int64": "int64_list"}
    plan = []
    for name, f in spec.items():
        if not isinstance(f, infeed.FixedLen) or f.dtype not in fields:
            raise ValueError(f"the protobuf path handles float32 and int64 FixedLen features, not {name!r}: {f!r}")
        plan.append((name, fields[f.dtype], np.dtype(f.dtype), f.shape, f.count))

    def rows(record: bytes) -> dict:
        ex = example.FromString(record)
        feature = ex.features.feature
        out = {}
        for name, kind, dtype, shape, count in plan:
            values = getattr(feature[name], kind).value
            if len(values) != count:
                raise ValueError(f"feature {name!r}: {len(values)} values of {kind}, expected {count}")
            out[name] = np.array(values, dtype).reshape(shape)
        return out

    return rows


# --- the cases --------------------------------------------------------------------------------------------

def _pipelines(grain, source, array_source, spec: Mapping, b: int) -> dict:
    """Case name -> a function making that case's MapDataset (one epoch, shuffled, batches of b)."""
    from infeed.grain import ParseBatch, ParseExample

    rows = protobuf_rows(spec)

    def shuffled(src):
        return grain.MapDataset.source(src).shuffle(seed=SEED)

    return {
        SOURCE_PARSE: lambda: shuffled(source).batch(b, drop_remainder=True, batch_fn=ParseBatch(spec)),
        SOURCE_ROWS: lambda: shuffled(source).map(ParseExample(spec)).batch(b, drop_remainder=True),
        ARRAY_RECORD_PARSE: lambda: shuffled(array_source).batch(b, drop_remainder=True, batch_fn=ParseBatch(spec)),
        PROTOBUF: lambda: shuffled(array_source).map(rows).batch(b, drop_remainder=True),
    }


def _iterate(grain, make, threads: int | None):
    """A case's run: one epoch of ``make()``'s dataset, with Grain's ``threads`` (None: its default)."""
    options = grain.ReadOptions() if threads is None else grain.ReadOptions(num_threads=threads)

    def run() -> int:
        n = 0
        for batch in make().to_iter_dataset(options):
            n += len(next(iter(batch.values())))
        return n

    return run


class SteadyCase:
    """A pipeline whose batches come from one worker process, over an epoch: keeps its steady seconds (batches
    2..N, from the first one's arrival: the worker's start-up apart). ``make()`` returns its iterable."""

    def __init__(self, make, b: int):
        self.make, self.b = make, b
        self.steady: list[float] = []

    def run(self) -> int:
        it = iter(self.make())
        next(it)
        start = time.perf_counter()
        batches = 1
        for _ in it:
            batches += 1
        self.steady.append(time.perf_counter() - start)
        return batches * self.b


def _loader(grain, source, spec: Mapping, b: int):
    """Grain's DataLoader, one worker, the source's records shuffled and decoded by ParseBatch in batches."""
    from infeed.grain import ParseBatch

    parse = ParseBatch(spec)

    def make():
        sampler = grain.samplers.IndexSampler(num_records=len(source), shuffle=True, seed=SEED, num_epochs=1,
                                              shard_options=grain.sharding.NoSharding())
        return grain.DataLoader(data_source=source, sampler=sampler, worker_count=1,
                                read_options=grain.ReadOptions(num_threads=0),
                                operations=[grain.transforms.Batch(b, drop_remainder=True, batch_fn=parse)])

    return make


def _mp_prefetch(grain, make_dataset):
    """The MapDataset pipeline iterated through ``mp_prefetch`` with one worker process."""
    def make():
        return (make_dataset().to_iter_dataset(grain.ReadOptions(num_threads=0))
                .mp_prefetch(grain.MultiprocessingOptions(num_workers=1)))

    return make


def _array_record(path: str) -> str:
    """The records of ``path`` in an ArrayRecord file beside it (``group_size:1``: each record reachable alone)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    out = os.path.splitext(path)[0] + ".array_record"
    if os.path.exists(out):
        return out
    tmp = f"{out}.partial{os.getpid()}"
    writer = ArrayRecordWriter(tmp, "group_size:1")
    try:
        with infeed.read_records(path) as reader:
            for record in reader:
                writer.write(bytes(record))
    finally:
        writer.close()
    os.replace(tmp, out)
    return out


def _same(a, b) -> bool:
    if isinstance(a, infeed.Padded):
        return _same(a.values, b.values) and _same(a.lengths, b.lengths)
    return a.shape == b.shape and np.array_equal(a, b)


def _check_first_batches(grain, pipelines: Mapping, records: list, spec: Mapping, b: int, layout: str) -> None:
    order = list(grain.MapDataset.range(len(records)).shuffle(seed=SEED)[:b])
    want = infeed.parse_examples([records[i] for i in order], spec)
    for name, make in pipelines.items():
        got = make()[0]
        for key in spec:
            if not _same(want[key], got[key]):
                raise RuntimeError(f"{layout}: {name} decodes {key!r} of its first batch differently from "
                                   "ExampleParser.parse of the records its shuffle drew")


# --- the suite -------------------------------------------------------------------------------------------

def run(layouts: Sequence[str] = LAYOUTS, *, scale: float = 1.0, quick: bool = False, repeats: int | None = None,
        data_dir=None, seed: int = 0, batch_size: int = BATCH_SIZE) -> SuiteResult:
    """Measures every layout; returns the figures, ratios (information: no targets) and notes.

    repeats: timed runs per case (default 5, 3 with ``quick``), after one untimed warm-up run.
    data_dir: where the files go and are reused from; default a temporary directory, removed after.
    """
    unknown = [name for name in layouts if name not in datasets.LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {sorted(datasets.LAYOUTS)}")
    repeats = repeats if repeats is not None else (3 if quick else 5)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    result = SuiteResult(SUITE, group_label="layout", name_label="pipeline")
    left_out = [name for name in layouts if name not in LAYOUTS]
    if left_out:
        result.notes.append(f"layouts {', '.join(left_out)} left out: the protobuf path decodes numeric FixedLen "
                            f"features, and the suite measures {', '.join(LAYOUTS)}")
        layouts = [name for name in layouts if name in LAYOUTS]
    grain = _import_grain()
    if grain is None:
        result.notes.append(SKIPPED)
        return result
    from absl import flags

    if not flags.FLAGS.is_parsed():      # Grain 0.2's DataLoader reads an absl flag when it starts its workers
        flags.FLAGS.mark_as_parsed()
    counts = {name: max(infeed_suite.SMALLEST, round((QUICK_RECORDS if quick else RECORDS) * scale))
              for name in layouts}
    sizes = {name: min(batch_size, max(1, counts[name] // infeed_suite.SMALLEST)) for name in layouts}
    result.params.update(layouts=list(layouts), records=counts, batch_size=sizes, repeats=repeats, warmup=WARMUP,
                         seed=seed, shuffle_seed=SEED, grain=getattr(grain, "__version__", None),
                         protobuf=_protobuf_version(), cpus_allowed=len(os.sched_getaffinity(0)))
    with contextlib.ExitStack() as stack:
        written = datasets.ensure_datasets(stack, data_dir, counts, seed, log, SUITE)
        result.notes.extend(datasets.data_note(ds, f"batch {sizes[ds.layout.name]}, ") for ds in written)
        for ds in written:
            _measure_layout(grain, result, ds, sizes[ds.layout.name], repeats)
    result.notes += [
        "every pipeline: one epoch in a global shuffle (Grain's .shuffle(seed=0); the daemon's shuffle='global' "
        "through the same sidecar), batches of B, the partial one dropped; the consumer only takes the batches",
        "in-process grain rows: iterated with ReadOptions(num_threads=0) (all in the consumer's thread) unless "
        "marked \"Grain's 16 threads\" (ReadOptions() as Grain iterates by default: 16 threads read and decode "
        "ahead); 'DataLoader, 1 worker', 'mp_prefetch, 1 worker' and 'daemon W=1': one decoding process, steady "
        "state from the first "
        "batch's arrival (batches 2..N), their start-up apart",
        "MB/s: the TFRecord bytes of the records taken (framing included), for the ArrayRecord rows too (pro rata "
        "for the steady states); the files in the page cache",
        f"{len(os.sched_getaffinity(0))} CPUs allowed, nothing pinned; the figures are medians of the runs, cases "
        "interleaved, garbage collector off while timing",
    ]
    return result


def _protobuf_version() -> str | None:
    try:
        import google.protobuf
        from google.protobuf.internal import api_implementation
    except ImportError:
        return None
    return f"{google.protobuf.__version__} ({api_implementation.Type()})"


def _measure_layout(grain, result: SuiteResult, ds: datasets.Dataset, b: int, repeats: int) -> None:
    from infeed.grain import TFRecordSource

    name, spec = ds.layout.name, ds.layout.spec()
    log(f"grain: {name}: indexing a link of the file, writing its ArrayRecord copy ...")
    path = datasets.indexed_link(ds.path)
    array_path = _array_record(ds.path)
    for p in (path, array_path):                       # into the page cache
        with open(p, "rb") as f:
            while f.read(8 << 20):
                pass
    with infeed.read_records(path) as reader:
        records = [bytes(r) for r in reader]
    framed = [len(r) + 16 for r in records]
    n_batches = len(records) // b
    order = list(grain.MapDataset.range(len(records)).shuffle(seed=SEED))
    taken = sum(framed[i] for i in order[:n_batches * b])        # the shuffled epoch's first n_batches * b records

    source = TFRecordSource(path)
    array_source = grain.sources.ArrayRecordDataSource([array_path])
    pipelines = _pipelines(grain, source, array_source, spec, b)
    _check_first_batches(grain, pipelines, records, spec, b, name)

    runs = {SOURCE_PARSE: _iterate(grain, pipelines[SOURCE_PARSE], 0),
            SOURCE_PARSE_THREADS: _iterate(grain, pipelines[SOURCE_PARSE], None),
            SOURCE_ROWS: _iterate(grain, pipelines[SOURCE_ROWS], 0),
            ARRAY_RECORD_PARSE: _iterate(grain, pipelines[ARRAY_RECORD_PARSE], 0),
            PROTOBUF: _iterate(grain, pipelines[PROTOBUF], 0),
            PROTOBUF_THREADS: _iterate(grain, pipelines[PROTOBUF], None)}
    loader = SteadyCase(_loader(grain, source, spec, b), b)
    mp = SteadyCase(_mp_prefetch(grain, pipelines[SOURCE_PARSE]), b)
    daemon = DaemonCase(DAEMON, infeed.Dataset(path, spec, batch_size=b, num_epochs=1, shuffle="global", seed=SEED),
                        1)
    all_records = n_batches * b
    cases = [Case(n, r, all_records, taken) for n, r in runs.items()]
    cases += [Case(LOADER, loader.run, all_records, taken), Case(MP_PREFETCH, mp.run, all_records, taken),
              daemon.case(all_records, taken)]
    log(f"grain: timing {name} ({len(cases)} cases, {repeats} runs each) ...")
    settle_allocator()
    measured = interleave(cases, repeats, WARMUP)
    for m in measured[:len(runs)]:
        result.figures.append(dataclasses.replace(m.figure(SUITE, name), batches=n_batches))
    steady_records, steady_bytes = all_records - b, taken * (n_batches - 1) // n_batches
    for case_name, seconds in ((LOADER, loader.steady), (MP_PREFETCH, mp.steady), (DAEMON, daemon.steady)):
        case = Case(case_name, loader.run, steady_records, steady_bytes)
        result.figures.append(dataclasses.replace(Measurement(case, seconds[WARMUP:]).figure(SUITE, name),
                                                  batches=n_batches - 1, steady=True))
    _measure_parts(grain, result, name, source, array_source, records, order, spec, b, repeats)
    for num, den in RATIOS:
        value = result.figure(name, num).records_per_s / result.figure(name, den).records_per_s
        result.ratios.append(Ratio(SUITE, name, f"{num} / {den}", value))
    source.close()


def _measure_parts(grain, result: SuiteResult, name: str, source, array_source, records: list, order: list,
                   spec: Mapping, b: int, repeats: int) -> None:
    """Where a Grain pipeline's time goes, per record: each source's read, each decoder, Grain's own machinery."""
    from infeed.grain import ParseBatch

    keys = order[:PART_RECORDS]
    drawn = [records[i] for i in keys]
    n = len(keys)
    parse, rows = ParseBatch(spec), protobuf_rows(spec)
    indices = grain.MapDataset.range(n).shuffle(seed=SEED).batch(b, batch_fn=list)

    def counted(fn):
        def run():
            fn()
            return n
        return run

    parts = {PART_SOURCE: lambda: [source[i] for i in keys],
             PART_ARRAY_RECORD: lambda: [array_source[i] for i in keys],
             PART_PARSE: lambda: [parse(drawn[k:k + b]) for k in range(0, n, b)],
             PART_PROTOBUF: lambda: [rows(r) for r in drawn],
             PART_GRAIN: lambda: list(indices.to_iter_dataset(grain.ReadOptions(num_threads=0)))}
    measured = interleave([Case(part, counted(fn), n, 0) for part, fn in parts.items()], repeats, WARMUP)
    for m in measured:
        result.timings.append(Timing.of(SUITE, name, m.case.name, "us", [s / n * 1e6 for s in m.seconds]))
