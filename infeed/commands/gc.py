"""``infeed gc``: removes this user's rings whose creator is gone, and aliases of rings that are gone
(see :mod:`infeed.ring.orphans`)."""

from __future__ import annotations

from infeed.ring.orphans import collect

HELP = "remove shared-memory rings whose creator is gone"
USAGE_ERRORS = ()


def add_arguments(parser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")


def run(args) -> int:
    removed = collect(args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for path, size in removed:
        print(f"{verb} {path} ({size / 1e6:.1f} MB)")
    print(f"{verb} {len(removed)} segment(s), {sum(s for _, s in removed) / 1e6:.1f} MB")
    return 0
