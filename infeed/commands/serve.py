"""``infeed serve``: the daemon alone in its own process, for trainers that attach by name.

    infeed serve --config ds.json --name train --workers 2 --slots 8
    # in the trainer:  for batch in infeed.attach("train"): ...

See :mod:`infeed.daemon.serve`.
"""

from __future__ import annotations

import json

from infeed.commands.arguments import positive_int
from infeed.daemon.dataset import Dataset
from infeed.daemon.serve import serve

HELP = "run a decoding daemon in this process; trainers attach with infeed.attach(NAME)"
USAGE_ERRORS = (ValueError,)


def add_arguments(parser) -> None:
    parser.add_argument("--config", required=True, help="the dataset as JSON (infeed.Dataset(...).to_json())")
    parser.add_argument("--name", required=True, help="the name trainers attach to")
    parser.add_argument("--workers", type=positive_int, default=2, help="decoding processes (default 2)")
    parser.add_argument("--slots", type=positive_int, default=8, help="ring slots (default 8)")
    parser.add_argument("--state", help="a JSON file holding a feed's state(), to resume from")
    parser.add_argument("--no-mlock", action="store_true", help="do not lock the ring's pages in memory")


def run(args) -> int:
    with open(args.config) as f:
        dataset = Dataset.from_json(json.load(f))
    state = None
    if args.state:
        with open(args.state) as f:
            state = json.load(f)

    def ready(daemon):
        print(f"serving {dataset!r} as {args.name!r} (ring {daemon.ring.name}, "
              f"workers {' '.join(map(str, daemon.worker_pids))})", flush=True)

    return serve(dataset, args.name, num_workers=args.workers, slots=args.slots, state=state,
                 lock_memory=not args.no_mlock, ready=ready)
