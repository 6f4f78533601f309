"""``parse (W processes at once)``: a suite's one-process parse run by W processes at the same time.

Each process reads the file and parses it (``read_batch`` + ``ExampleParser.parse``, as
``bench.suites.decode_suite.parse_case``) when told to, and says how many records it parsed: the whole file (the infeed
suite), or with ``share=True`` its share of the batches, every W-th from its own, as a daemon's worker
parses them (the images suite: it reads the other batches' records and passes them by). Their combined rate
is what this machine's CPUs give W decoders that share nothing: a bound on what W daemon workers can reach
(on a 2-CPU virtual machine two such processes make about 1.7x one, not 2x; on a many-core host, shared
cores, memory bandwidth and clocks show here first). The processes are started once, before timing, and
wait on their standard input (``go`` lines), so a run times the parsing alone.

Run as ``python -m bench.peers.parallel_parse FILE SPEC BATCH_SIZE SHARE`` by :class:`ParallelParse`; SPEC is a
:data:`bench.data.datasets.LAYOUTS` name or ``images:<crop mode>`` (:func:`bench.data.photos.spec`), SHARE
``whole`` or ``<k>/<W>``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ParallelParse", "main"]


class ParallelParse:
    """``processes`` parsing processes over ``path`` with the spec named ``spec`` (see :func:`spec_of`);
    :meth:`run` parses the file (or, with ``share``, each process's share of its batches) in each, all at
    once, and returns the records they parsed together."""

    def __init__(self, path: str, spec: str, batch_size: int, processes: int, *, share: bool = False):
        root = str(Path(__file__).resolve().parents[2])          # the checkout that holds bench/
        env = dict(os.environ, PYTHONPATH=root + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
        self._procs = []
        try:
            for k in range(processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.peers.parallel_parse", path, spec, str(batch_size),
                     f"{k}/{processes}" if share else "whole"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
            for p in self._procs:
                if p.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"parallel parse: a process failed to start (exit status {p.wait()})")
        except BaseException:
            self.close()
            raise

    def run(self) -> int:
        for p in self._procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        return sum(int(p.stdout.readline()) for p in self._procs)

    def close(self) -> None:
        for p in self._procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
        for p in self._procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> "ParallelParse":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spec_of(name: str) -> dict:
    """The infeed spec named ``name``: a :data:`bench.data.datasets.LAYOUTS` layout's, or ``images:<crop mode>``
    for :func:`bench.data.photos.spec` of that mode."""
    if name.startswith("images:"):
        from bench.data import photos
        return photos.spec(name.removeprefix("images:"))
    from bench.data import datasets
    return datasets.LAYOUTS[name].spec()


def main(argv=None) -> int:
    import infeed

    path, spec, batch_size, share = argv or sys.argv[1:]
    batch_size = int(batch_size)
    k, every = (0, 1) if share == "whole" else map(int, share.split("/"))
    parser = infeed.ExampleParser(spec_of(spec))
    out = parser.allocate(batch_size)
    print("ready", flush=True)
    for _ in sys.stdin:
        n = 0
        with infeed.read_records(path) as reader:
            for i, batch in enumerate(iter(lambda: reader.read_batch(batch_size), [])):
                if i % every == k:
                    parser.parse(batch, out=out)
                    n += len(batch)
        print(n, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
