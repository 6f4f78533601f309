"""Where an input's time goes: the ring's per-stage counters read as shares of wall time, with a verdict.

Every worker times its stages into its entry of the ring's worker table
(:data:`infeed.ring.layout.WORKER`): reading files (opening them and the
stream's reads: I/O, or the page cache's copy), inflating GZIP/ZLIB, checking
data CRCs, decoding into the slot, and waiting for a free slot; the rest of its
wall time (``other``) is planning the batch sequence and moving past the
records of batches other workers own. The consumer times its waits for a
ready slot in the ring's header. The counters are always on: a clock read per
batch and per buffer refill, and per sampled record's CRC (see
``infeed.tfrecord._tfrecord``), never a lock or a system call.

:meth:`InputStats.read` takes the totals since the ring was made;
:meth:`InputStats.since` the difference between two reads (rates over that
interval); :meth:`InputStats.with_consumer_stages` adds what the consumer's
side measured beyond the ring (the ``Feeder``'s host-to-device copies and the
trainer's wait for its device batches). :meth:`InputStats.table` prints it,
:meth:`InputStats.bottleneck` says in one sentence what limits the input,
:meth:`InputStats.to_json` gives it to tools.

>>> stats = feed.stats()            # doctest: +SKIP
>>> print(stats.bottleneck())       # doctest: +SKIP
input-bound: the trainer waited 31 % of the time; workers spend 72 % decoding: add workers or cores (2 workers
and the trainer share 2 cores)
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Mapping

__all__ = ["InputStats", "WorkerStats", "WORKER_STAGES", "CONSUMER_STAGES", "INPUT_BOUND", "IDLE_WORKERS",
           "CACHED_READ_MB_S", "PASSING_READS"]

#: A worker's stages, in the order of a batch's path, and what each means.
WORKER_STAGES = {
    "read": "reading files (open and read: I/O or the page cache)",
    "inflate": "inflating GZIP/ZLIB",
    "crc": "checking CRC32C",
    "decode": "decoding into the slot",
    "wait_for_slot": "waiting for a free slot",
    "other": "planning, moving past other workers' records",
}
#: The consumer's stages (the last two only when a Feeder's figures are added).
CONSUMER_STAGES = {
    "start_up": "waiting for the first batch (workers starting)",
    "wait_for_batch": "waiting for a ready slot",
    "host_to_device": "copying batches to the devices",
    "trainer_wait": "the training loop waiting for its next device batch",
}
#: The stages a record passes through, timed per record in :meth:`WorkerStats.us_per_record`.
_PER_RECORD_STAGES = ("read", "inflate", "crc", "decode")
#: What a worker does in each stage that CPUs limit, as the bottleneck sentence says it.
_WORK = {"decode": "decodes", "crc": "checks CRCs", "inflate": "inflates"}
#: The trainer's share of time waiting for input above which the input is the bottleneck.
INPUT_BOUND = 0.10
#: The workers' share of time waiting for free slots above which the input has capacity to spare.
IDLE_WORKERS = 0.30
#: Reads faster than this (MB/s while reading) come from the page cache, not from storage.
CACHED_READ_MB_S = 1000.0
#: Bytes read over bytes decoded from which workers are said to read other workers' records.
PASSING_READS = 1.5

_ADVICE = {
    "read": "the storage is the limit: more workers help only where it serves reads in parallel",
    "inflate": "store the files uncompressed, or add workers or cores",
    "crc": "add workers or cores",
    "decode": "add workers or cores",
    "other": "each worker reads the framing of every record: index the files (Dataset(build_indexes=True) builds "
             "the indexes before the first epoch, `infeed index` writes them), with which workers read only "
             "their own batches, or use fewer workers",
}
#: In place of the advice to index, where the workers read only their own records (through an index, or one alone).
_OWN_RECORDS = ("each reads only its own records already, so that time is per batch: spread it over more records "
                "(a larger batch_size, or several batches in a slot: steps_per_slot)")
#: In place of the advice to index, for compressed files: GZIP and ZLIB streams have no random access.
_COMPRESSED = ("the files are compressed (GZIP/ZLIB), which no index can serve (no random access), so each worker "
               "inflates every record: store them uncompressed, or use fewer workers")


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class WorkerStats:
    """One worker over an interval: seconds per stage (:data:`WORKER_STAGES`), what it delivered."""

    index: int
    pid: int
    elapsed_s: float
    batches: int
    records: int
    bytes: int                  #: bytes of the records it decoded
    read_bytes: int             #: bytes its streams handed over (inflated)
    compressed_bytes: int       #: compressed bytes it inflated
    stages: Mapping[str, float]
    since_beat_s: float = 0.0
    skipped: int = 0            #: records it made padding rows (``skip_corrupt``: an image that did not decode)

    @classmethod
    def from_counters(cls, w: Mapping) -> "WorkerStats":
        """From an entry of ``Ring.workers()``."""
        read = w["read_s"] - w["inflate_s"]
        stages = {"read": read, "inflate": w["inflate_s"], "crc": w["crc_s"], "decode": w["decode_s"],
                  "wait_for_slot": w["wait_s"]}
        stages["other"] = max(w["elapsed_s"] - sum(stages.values()), 0.0)
        return cls(w["index"], w["pid"], w["elapsed_s"], w["batches"], w["records"], w["bytes"], w["read_bytes"],
                   w["compressed_bytes"], stages, w["since_beat"], w["skipped"])

    def since(self, earlier: "WorkerStats") -> "WorkerStats":
        """This worker's figures between ``earlier`` (the same worker) and now."""
        if earlier.pid != self.pid:              # another process took this worker's place: all of it is new
            return self
        counts = {f: getattr(self, f) - getattr(earlier, f)
                  for f in ("elapsed_s", "batches", "records", "bytes", "read_bytes", "compressed_bytes", "skipped")}
        stages = {s: max(self.stages[s] - earlier.stages.get(s, 0.0), 0.0) for s in self.stages}
        return dataclasses.replace(self, stages=stages, **counts)

    def share(self, stage: str) -> float:
        """The share of its wall time spent in ``stage``."""
        return _share(self.stages.get(stage, 0.0), self.elapsed_s)

    def us_per_record(self, stage: str) -> float:
        """Microseconds of ``stage`` per record it decoded (padding rows of skipped records included): where a
        worker's own work slows as workers are added (shared cores, memory bandwidth, clocks), this grows."""
        return 1e6 * _share(self.stages.get(stage, 0.0), self.records + self.skipped)

    def to_json(self) -> dict:
        rate = 1 / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {"index": self.index, "pid": self.pid, "elapsed_s": self.elapsed_s,
                "batches_per_s": self.batches * rate, "records_per_s": self.records * rate,
                "decoded_mb_per_s": self.bytes * rate / 1e6, "read_mb_per_s": self.read_bytes * rate / 1e6,
                "compressed_mb_per_s": self.compressed_bytes * rate / 1e6, "since_heartbeat_s": self.since_beat_s,
                "records": self.records, "skipped": self.skipped,
                "us_per_record": {s: self.us_per_record(s) for s in _PER_RECORD_STAGES},
                "stages_s": dict(self.stages), "shares": {s: self.share(s) for s in self.stages}}


@dataclasses.dataclass(frozen=True)
class InputStats:
    """An input pipeline over an interval: the consumer's and every worker's time per stage."""

    ring: str
    elapsed_s: float            #: the consumer's wall time covered
    slots: int
    filled: int                 #: slots filled and waiting, when read
    taken: int                  #: slots the consumer took (each holds ``steps_per_slot`` batches)
    steps_per_slot: int
    consumer: Mapping[str, float]     #: seconds per :data:`CONSUMER_STAGES` entry measured
    workers: tuple[WorkerStats, ...]
    cpus: int
    physical_cores: int = 0     #: the physical cores under those CPUs (fewer with SMT); 0: unknown

    @classmethod
    def read(cls, ring) -> "InputStats":
        """The totals of ``ring`` (an ``infeed.ring.Ring``) since it was made."""
        consumer = ring.consumer_counters()
        filled = sum(ring.slot_state(i)[0] == "filled" for i in range(ring.slots))
        workers = tuple(WorkerStats.from_counters(w) for w in ring.workers())
        waits = {"start_up": consumer["startup_s"], "wait_for_batch": consumer["stall_s"]}
        cpus = _cpu_ids()
        return cls(ring.name, consumer["elapsed_s"], ring.slots, filled, int(consumer["taken"]), ring.steps_per_slot,
                   waits, workers, len(cpus), _physical_cores(cpus))

    def since(self, earlier: "InputStats") -> "InputStats":
        """The figures between ``earlier`` (read from the same ring) and these."""
        before = {w.index: w for w in earlier.workers}
        workers = tuple(w.since(before[w.index]) if w.index in before else w for w in self.workers)
        consumer = {s: max(v - earlier.consumer.get(s, 0.0), 0.0) for s, v in self.consumer.items()}
        return dataclasses.replace(self, elapsed_s=self.elapsed_s - earlier.elapsed_s,
                                   taken=self.taken - earlier.taken, consumer=consumer, workers=workers)

    def with_consumer_stages(self, **seconds: float) -> "InputStats":
        """These figures with more consumer stages (``host_to_device=``, ``trainer_wait=``: seconds over the
        same interval), as a ``Feeder`` measures them."""
        unknown = sorted(set(seconds) - set(CONSUMER_STAGES))
        if unknown:
            raise ValueError(f"unknown consumer stages {unknown}; known: {sorted(CONSUMER_STAGES)}")
        return dataclasses.replace(self, consumer={**self.consumer, **seconds})

    # --- reading them ---------------------------------------------------------------------------
    @property
    def trainer_wait(self) -> float:
        """The share of the consumer's time after start-up spent waiting for input: the training loop's wait
        for device batches when a Feeder's figures are added, else the wait for ready slots."""
        stage = "trainer_wait" if "trainer_wait" in self.consumer else "wait_for_batch"
        return _share(self.consumer[stage], self.elapsed_s - self.consumer.get("start_up", 0.0))

    def worker_share(self, stage: str) -> float:
        """The share of all workers' wall time spent in ``stage``."""
        return _share(sum(w.stages[stage] for w in self.workers), sum(w.elapsed_s for w in self.workers))

    @property
    def skipped(self) -> int:
        """Records the workers made padding rows (``skip_corrupt``: an image that did not decode)."""
        return sum(w.skipped for w in self.workers)

    @property
    def batches_per_s(self) -> float:
        return _share(self.taken * self.steps_per_slot, self.elapsed_s)

    def bottleneck(self) -> str:
        """One sentence: what limits the input, and what to do about it."""
        if not self.workers or self.elapsed_s <= 0:
            return "no worker has reported yet"
        waited = f"the trainer waited {100 * self.trainer_wait:.0f} % of the time"
        idle = self.worker_share("wait_for_slot")
        work = {s: self.worker_share(s) for s in WORKER_STAGES if s != "wait_for_slot"}
        top = max(work, key=work.get)
        doing = f"workers spend {100 * work[top]:.0f} % {WORKER_STAGES[top].split(' (')[0]}"
        if self.trainer_wait >= INPUT_BOUND:
            if idle >= IDLE_WORKERS:
                return (f"hand-off-bound: {waited}, yet workers wait {100 * idle:.0f} % of theirs for a free "
                        f"slot: slots come back in order, so a worker that is ahead waits while the consumer "
                        f"waits for another's batch (or the consumer holds its batches too long): put several "
                        f"batches in a slot (steps_per_slot), add slots, or leave a core free of workers")
            advice = _ADVICE[top]
            n, physical = len(self.workers), self.physical_cores or self.cpus
            if top in ("decode", "crc", "inflate") and n + 1 > self.cpus:
                advice += (f" ({n} worker{'s' if n > 1 else ''} and the trainer "
                           f"share {self.cpus} core{'s' if self.cpus > 1 else ''})")
            elif top in ("decode", "crc", "inflate") and n + 1 > physical:
                advice += (f" ({n} workers and the trainer outnumber the {physical} physical cores under these "
                           f"{self.cpus} CPUs: SMT siblings share a core's units, so each worker "
                           f"{_WORK[top]} slower than alone, and workers past {physical - 1} add less than one "
                           f"worker's speed each)")
            if top == "read":
                mb = sum(w.read_bytes for w in self.workers) / 1e6
                speed = _share(mb, sum(w.stages["read"] for w in self.workers))
                doing += f" ({speed:.0f} MB/s while reading)"
                if speed >= CACHED_READ_MB_S:
                    advice = "that speed is the page cache's (a memory copy): add workers or cores"
                passing = _share(sum(w.read_bytes for w in self.workers), sum(w.bytes for w in self.workers))
                if len(self.workers) > 1 and passing >= PASSING_READS:
                    advice = (f"each worker reads every record and decodes its share ({passing:.1f}x the bytes "
                              f"it decodes): index the files (Dataset(build_indexes=True), or `infeed index`), "
                              f"with which workers read only their own batches")
            if top in ("read", "other", "inflate") and "index" in advice and self.compressed:
                advice = _COMPRESSED
            read_bytes = sum(w.read_bytes for w in self.workers)
            if top == "other" and not self.compressed and 0 < read_bytes < PASSING_READS * sum(
                    w.bytes for w in self.workers):      # no worker moves past another's records: the rest is per batch
                doing = (f"workers spend {100 * work[top]:.0f} % outside reading, checking and decoding (planning, "
                         f"taking batches and handing them over)")
                advice = _OWN_RECORDS
            return f"input-bound: {waited}; {doing}: {advice}"
        if idle >= IDLE_WORKERS:
            return (f"trainer-bound: {waited}; workers wait {100 * idle:.0f} % of theirs for a free slot: "
                    f"the input keeps up with room to spare")
        return (f"balanced: {waited}; {doing} and wait {100 * idle:.0f} % for a free slot: the input keeps up "
                f"with little to spare")

    @property
    def compressed(self) -> bool:
        """Whether the workers inflated what they read (the files are GZIP or ZLIB)."""
        return any(w.compressed_bytes for w in self.workers)

    def table(self) -> str:
        """A text table: the consumer's stages, then each worker's share of wall time per stage and rates."""
        lines = [f"ring {self.ring}: {self.filled}/{self.slots} slots filled, {self.batches_per_s:.1f} batches/s "
                 f"over {self.elapsed_s:.1f} s"]
        for stage, seconds in self.consumer.items():
            lines.append(f"  consumer {CONSUMER_STAGES[stage]:<52} {100 * _share(seconds, self.elapsed_s):5.1f} %")
        header = "  worker  " + "".join(f"{s:>14}" for s in WORKER_STAGES) + "   records/s   read MB/s"
        lines.append(header)
        for w in self.workers:
            rate = _share(1, w.elapsed_s)
            lines.append(f"  {w.index:>6}  " + "".join(f"{100 * w.share(s):>12.1f} %" for s in WORKER_STAGES)
                         + f"{w.records * rate:>12.0f}{w.read_bytes * rate / 1e6:>12.1f}")
        lines.append(self.bottleneck())
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A JSON-serialisable dict of everything, shares and rates included."""
        return {"ring": self.ring, "elapsed_s": self.elapsed_s, "slots": self.slots, "filled": self.filled,
                "taken": self.taken, "batches_per_s": self.batches_per_s, "cpus": self.cpus,
                "consumer_s": dict(self.consumer),
                "consumer_shares": {s: _share(v, self.elapsed_s) for s, v in self.consumer.items()},
                "trainer_wait": self.trainer_wait, "skipped": self.skipped, "physical_cores": self.physical_cores,
                "us_per_record": {s: 1e6 * _share(sum(w.stages[s] for w in self.workers),
                                                  sum(w.records + w.skipped for w in self.workers))
                                  for s in _PER_RECORD_STAGES},
                "worker_shares": {s: self.worker_share(s) for s in WORKER_STAGES},
                "workers": [w.to_json() for w in self.workers], "bottleneck": self.bottleneck()}


def _cpu_ids() -> frozenset[int]:
    return frozenset(os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1))


@functools.lru_cache(maxsize=8)
def _physical_cores(cpus: frozenset[int]) -> int:
    """The physical cores under ``cpus``, from Linux's topology (SMT siblings share one); 0 where it does not
    say. Read once per set of CPUs: every ``stats()`` asks, and a 200-CPU host has 400 files to read."""
    cores = set()
    try:
        for cpu in cpus:
            topology = f"/sys/devices/system/cpu/cpu{cpu}/topology"
            with open(f"{topology}/physical_package_id") as package, open(f"{topology}/core_id") as core:
                cores.add((package.read().strip(), core.read().strip()))
    except OSError:
        return 0
    return len(cores)
