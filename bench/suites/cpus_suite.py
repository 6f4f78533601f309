"""The ``cpus`` suite: what each of this machine's CPUs gives one JPEG decoder, alone and with the others busy.

The bound under ``bench images``' scaling, CPU by CPU. One process is pinned to
each allowed CPU (``os.sched_setaffinity``), started before timing; each decodes
the same photos (:mod:`bench.data.photos`' 500x375 JPEGs, the images suite's,
``simplejpeg.decode_jpeg`` with ``fastdct``, full size) when told to and
reports its seconds. Interleaved, per round:

- ``CPU c alone``: the process on CPU c, every other one idle, each CPU in turn;
- ``CPU c, N at once``: the processes on the first N CPUs at the same time, for
  N = every CPU, and half of them where that is 2 or more.

Ratios: ``slowest CPU / fastest CPU`` alone (1.0: the CPUs are equal), and for
each N ``N at once / alone`` (the N CPUs' decoding rate together over the sum of
the same CPUs' rates alone: 1.0 where N decoders do not slow each other) with
``slowest / fastest`` among them. Where ``N at once / alone`` is well under 1.0
with equal CPUs, the CPUs share what a decoder needs: SMT siblings of one core
(in a virtual machine, vCPUs the host places on siblings without saying so),
power and clock limits, memory bandwidth. No scheduling of workers gets past
that; where some CPUs are slower than others, the slowest sets the pace of
workers dealt equal shares.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.data import photos
from bench.harness import Case, Measurement, Ratio, SuiteResult, cpus_allowed, log

__all__ = ["run", "alone_name", "at_once_group", "PHOTOS"]

SUITE = "cpus"
#: Photos each process decodes per round (500x375, the images suite's).
PHOTOS = 64
ALONE = "alone"


def alone_name(cpu: int) -> str:
    return f"CPU {cpu}"


def at_once_group(n: int) -> str:
    return f"{n} at once"


class _Decoder:
    """A process pinned to ``cpu``, decoding the photos of ``path`` ``rounds`` times whenever told to."""

    def __init__(self, cpu: int, path: str, rounds: int):
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.cpu = cpu
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.suites.cpus_suite", str(cpu), path, str(rounds)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"cpus: the decoder on CPU {cpu} failed to start (exit status {self.proc.wait()})")

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def seconds(self) -> float:
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _case(cpu: int, images: int, nbytes: int) -> Case:
    """A figure's case: timed in the decoder processes, never run here."""
    return Case(alone_name(cpu), lambda: images, images, nbytes)


def run(*, quick: bool = False, repeats: int | None = None, data_dir=None, seed: int = 0) -> SuiteResult:
    """Times every allowed CPU alone and the CPUs at once; see the module's description."""
    repeats = repeats if repeats is not None else (3 if quick else 7)
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    cpus = sorted(os.sched_getaffinity(0))
    rounds = 2 if quick else 6
    groups = sorted({n for n in (len(cpus) // 2, len(cpus)) if n >= 2})
    result = SuiteResult(SUITE, group_label="CPUs", name_label="decoder",
                         params={"cpus": cpus, "photos": PHOTOS, "rounds": rounds, "repeats": repeats,
                                 "warmup": 1, "at_once": groups})
    with contextlib.ExitStack() as stack:
        if data_dir is None:
            data_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="infeed-bench-cpus-"))
        os.makedirs(data_dir, exist_ok=True)
        path, _ = photos.ensure_photos(data_dir, "500x375", PHOTOS, seed)
        nbytes = os.path.getsize(path) * rounds
        log(f"cpus: starting a decoder on each of {len(cpus)} CPUs ...")
        decoders = []
        stack.callback(lambda: [d.close() for d in decoders])
        for cpu in cpus:
            decoders.append(_Decoder(cpu, path, rounds))
        alone = {d.cpu: [] for d in decoders}
        together = {(n, d.cpu): [] for n in groups for d in decoders[:n]}
        log(f"cpus: timing {PHOTOS * rounds} decodes per CPU, alone and {', '.join(map(str, groups))} at once "
            f"({repeats} runs each) ...")
        for rep in range(1 + repeats):
            for d in decoders:
                d.go()
                seconds = d.seconds()
                if rep:
                    alone[d.cpu].append(seconds)
            for n in groups:
                for d in decoders[:n]:
                    d.go()
                for d in decoders[:n]:
                    seconds = d.seconds()
                    if rep:
                        together[n, d.cpu].append(seconds)
    images = PHOTOS * rounds
    for cpu, seconds in alone.items():
        result.figures.append(Measurement(_case(cpu, images, nbytes), seconds).figure(SUITE, ALONE))
    for (n, cpu), seconds in together.items():
        result.figures.append(Measurement(_case(cpu, images, nbytes), seconds).figure(SUITE, at_once_group(n)))
    rate = {(f.group, f.name): f.records_per_s for f in result.figures}
    alone_rates = [rate[ALONE, alone_name(c)] for c in cpus]
    result.ratios.append(Ratio(SUITE, ALONE, "slowest CPU / fastest CPU", min(alone_rates) / max(alone_rates)))
    for n in groups:
        group, first = at_once_group(n), cpus[:n]
        busy = [rate[group, alone_name(c)] for c in first]
        result.ratios.append(Ratio(SUITE, group, f"{group} / {ALONE}, in all",
                                   sum(busy) / sum(rate[ALONE, alone_name(c)] for c in first)))
        result.ratios.append(Ratio(SUITE, group, "slowest CPU / fastest CPU", min(busy) / max(busy)))
    result.notes.append(
        f"each process pinned to its CPU decodes {PHOTOS} photos of 500x375 {rounds} times a run (simplejpeg, "
        f"fastdct, full size); records/s = decodes/s; 'alone': one CPU at a time, the others' processes idle; "
        f"'N at once': the first N CPUs' processes together, each figure that CPU's own rate; "
        f"{cpus_allowed()} CPUs allowed")
    return result


def main(argv=None) -> int:
    """A decoder process: ``python -m bench.suites.cpus_suite CPU FILE ROUNDS``; prints ``ready``, then its seconds
    for every ``go`` line."""
    import simplejpeg

    import infeed

    cpu, path, rounds = argv or sys.argv[1:]
    os.sched_setaffinity(0, {int(cpu)})
    with infeed.read_records(path) as reader:
        images = photos.images_of(list(reader))
    print("ready", flush=True)
    for _ in sys.stdin:
        began = time.perf_counter()
        for _ in range(int(rounds)):
            for data in images:
                simplejpeg.decode_jpeg(data, fastdct=True)
        print(time.perf_counter() - began, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
