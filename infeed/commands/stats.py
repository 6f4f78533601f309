"""``infeed stats NAME``: where a ring's time goes, read from its header without disturbing it.

Two reads ``--interval`` seconds apart: the slots filled, batches/s taken by
the consumer and the share of its time spent waiting for them; per worker,
the share of its wall time in each stage (reading files, inflating, CRC,
decoding, waiting for a free slot, the rest), records/s and MB/s read; and
the bottleneck in one sentence (see :mod:`infeed.daemon.input_stats`).
``--json`` prints the same for tools.
"""

from __future__ import annotations

import json
import time

from infeed.daemon.input_stats import InputStats
from infeed.errors import AttachError
from infeed.ring import Ring
from infeed.ring.names import resolve_name

HELP = "show where a ring's time goes: per-stage shares per worker, batches/s, stalls and the bottleneck"
USAGE_ERRORS = (ValueError, AttachError)


def add_arguments(parser) -> None:
    parser.add_argument("name", help="the name given to infeed serve, or a ring's segment name")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two samples (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    if not args.interval > 0:
        raise ValueError(f"--interval must be positive, got {args.interval}")
    ring = Ring.attach(resolve_name(args.name))
    try:
        first = InputStats.read(ring)
        time.sleep(args.interval)
        stats = InputStats.read(ring).since(first)
    finally:
        ring.close()
    print(json.dumps(stats.to_json(), indent=2) if args.json else stats.table())
    return 0
