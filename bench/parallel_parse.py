"""``parse (W processes at once)``: the infeed suite's parse baseline run by W processes at the same time.

Each process reads and parses the whole file (``read_batch`` + ``ExampleParser.parse``, as
``bench.decode.parse_case``) when told to, and says how many records it parsed. Their combined rate is
what this machine's CPUs give W decoders that share nothing: a bound on what W daemon workers can reach
(on a 2-CPU virtual machine two such processes make about 1.7x one, not 2x). The processes are started
once, before timing, and wait on their standard input (``go`` lines), so a run times the parsing alone.

Run as ``python -m bench.parallel_parse FILE LAYOUT BATCH_SIZE`` by :class:`ParallelParse`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ParallelParse", "main"]


class ParallelParse:
    """``processes`` parsing processes over ``path`` (a :mod:`bench.datasets` ``layout``); :meth:`run`
    parses the file once in each, all at once, and returns the records they parsed together."""

    def __init__(self, path: str, layout: str, batch_size: int, processes: int):
        root = str(Path(__file__).resolve().parents[1])          # the checkout that holds bench/
        env = dict(os.environ, PYTHONPATH=root + (os.pathsep + os.environ["PYTHONPATH"]
                                                  if os.environ.get("PYTHONPATH") else ""))
        self._procs = []
        try:
            for _ in range(processes):
                self._procs.append(subprocess.Popen(
                    [sys.executable, "-m", "bench.parallel_parse", path, layout, str(batch_size)],
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


def main(argv=None) -> int:
    import infeed
    from bench import datasets

    path, layout, batch_size = argv or sys.argv[1:]
    batch_size = int(batch_size)
    parser = infeed.ExampleParser(datasets.LAYOUTS[layout].spec())
    out = parser.allocate(batch_size)
    print("ready", flush=True)
    for _ in sys.stdin:
        n = 0
        with infeed.read_records(path) as reader:
            while batch := reader.read_batch(batch_size):
                parser.parse(batch, out=out)
                n += len(batch)
        print(n, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
