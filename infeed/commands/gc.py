"""``infeed gc``: removes this user's rings whose creator is gone, and aliases of rings that are gone
(see :mod:`infeed.ring.orphans`), and the record indexes kept apart from the data that nothing has read for
``--unused-days`` days (:func:`infeed.tfrecord.index_cache.remove_unused`: of ``--index-dir``, by default
``$INFEED_INDEX_DIR`` or ``~/.cache/infeed/indexes``; a file's next run builds its index again)."""

from __future__ import annotations

from infeed.ring.orphans import collect
from infeed.tfrecord.index_cache import UNUSED_DAYS, default_index_dir, remove_unused

HELP = "remove shared-memory rings whose creator is gone, and record indexes unused for a month"
USAGE_ERRORS = ()


def add_arguments(parser) -> None:
    parser.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    parser.add_argument("--index-dir", metavar="DIR",
                        help="the directory of indexes kept apart from the data (default: $INFEED_INDEX_DIR, "
                             "else $XDG_CACHE_HOME/infeed/indexes)")
    parser.add_argument("--unused-days", type=float, default=UNUSED_DAYS, metavar="DAYS",
                        help=f"remove the indexes nothing has read for DAYS days (default {UNUSED_DAYS})")


def run(args) -> int:
    removed = collect(args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for path, size in removed:
        print(f"{verb} {path} ({size / 1e6:.1f} MB)")
    print(f"{verb} {len(removed)} segment(s), {sum(s for _, s in removed) / 1e6:.1f} MB")
    index_dir = args.index_dir or default_index_dir()
    unused = remove_unused(index_dir, args.unused_days, args.dry_run)
    for entry in unused:
        print(f"{verb} {entry.path} ({entry.nbytes / 1e6:.1f} MB)")
    print(f"{verb} {len(unused)} index(es) of {index_dir} unused for {args.unused_days:g} days, "
          f"{sum(e.nbytes for e in unused) / 1e6:.1f} MB")
    return 0
