"""``infeed stats NAME``: how a ring is doing, read from its header without disturbing it.

Fill level (slots filled and waiting for the trainer), batches/s taken by the
trainer and the share of its time spent waiting for them (stalls: the
workers are too slow), and per worker: batches/s, records/s, MB/s and the
share of its time spent decoding versus waiting for a free slot (the trainer
is too slow).
"""

from __future__ import annotations

import json
import time

from infeed.errors import AttachError
from infeed.ring import Ring
from infeed.ring.names import resolve_name

HELP = "show a ring's fill level, batches/s, per-worker throughput and stalls"
USAGE_ERRORS = (ValueError, AttachError)

__all__ = ["snapshot", "rates"]


def snapshot(ring: Ring) -> dict:
    """The ring's counters now."""
    consumer = ring.consumer_counters()
    states = [ring.slot_state(i)[0] for i in range(ring.slots)]
    return {"time": time.monotonic(), "slots": ring.slots, "filled": states.count("filled"),
            "taken": consumer["taken"], "stall_s": consumer["stall_s"], "workers": ring.workers()}


def rates(before: dict, after: dict) -> dict:
    """Rates between two snapshots of the same ring."""
    dt = max(after["time"] - before["time"], 1e-9)
    workers = []
    for w0, w1 in zip(before["workers"], after["workers"]):
        busy, wait = w1["busy_s"] - w0["busy_s"], w1["wait_s"] - w0["wait_s"]
        workers.append({"index": w1["index"], "pid": w1["pid"],
                        "batches_per_s": (w1["batches"] - w0["batches"]) / dt,
                        "records_per_s": (w1["records"] - w0["records"]) / dt,
                        "mb_per_s": (w1["bytes"] - w0["bytes"]) / dt / 1e6,
                        "busy": busy / dt, "waiting_for_slot": wait / dt,
                        "since_heartbeat_s": w1["since_beat"]})
    return {"interval_s": dt, "slots": after["slots"], "filled": after["filled"], "taken": after["taken"],
            "batches_per_s": (after["taken"] - before["taken"]) / dt,
            "trainer_waiting": (after["stall_s"] - before["stall_s"]) / dt, "workers": workers}


def add_arguments(parser) -> None:
    parser.add_argument("name", help="the name given to infeed serve, or a ring's segment name")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between the two samples (default 1)")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args) -> int:
    if not args.interval > 0:
        raise ValueError(f"--interval must be positive, got {args.interval}")
    ring = Ring.attach(resolve_name(args.name))
    try:
        first = snapshot(ring)
        time.sleep(args.interval)
        report = rates(first, snapshot(ring))
    finally:
        ring.close()
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"ring {ring.name}: {report['filled']}/{report['slots']} slots filled, "
          f"{report['taken']} batches taken, {report['batches_per_s']:.1f} batches/s, "
          f"trainer waiting {100 * report['trainer_waiting']:.0f}% of the time")
    for w in report["workers"]:
        print(f"  worker {w['index']} (pid {w['pid']}): {w['batches_per_s']:.1f} batches/s, "
              f"{w['records_per_s']:.0f} records/s, {w['mb_per_s']:.1f} MB/s, busy {100 * w['busy']:.0f}%, "
              f"waiting for a slot {100 * w['waiting_for_slot']:.0f}%")
    return 0
