"""``infeed index FILES...``: writes a record-offset sidecar (``FILE.index``) beside each TFRecord file, or
with ``--output-dir DIR`` an index kept apart from the data in DIR (:mod:`infeed.tfrecord.index_cache`: for
files in a read-only bucket or mount; a Dataset with ``index_dir=DIR``, or ``INFEED_INDEX_DIR=DIR``, finds it).

A file whose sidecar (or entry in DIR) loads (intact and matching the file's size) is left alone
unless ``--force``; a missing, damaged or stale one is rebuilt, and so is one of
version 1 (no record CRCs: reads through it must look the file up after each
batch). Indexing reads every record and checks both CRCs, so it also validates
the files.
"""

from __future__ import annotations

import json
import time

from infeed.errors import IndexFileError
from infeed.tfrecord.files import expand_files
from infeed.tfrecord.index import INDEX_SUFFIX, build_index, is_index_file, load_index, write_index
from infeed.tfrecord.index_cache import data_identity, load_cached_index, remove_superseded, write_cached_index

HELP = "write a sidecar of record offsets beside each TFRecord file (or into --output-dir), for random access"
USAGE_ERRORS = (ValueError,)

__all__ = ["index_file"]


def index_file(path: str, force: bool = False, output_dir: str | None = None) -> dict:
    """Indexes ``path`` unless ``force`` is off and its index is up to date: its sidecar, or with ``output_dir``
    its entry there; returns what happened."""
    replaced = None
    if not force:
        try:
            index = load_index(path) if output_dir is None else load_cached_index(path, output_dir)
        except IndexFileError as e:
            index, replaced = None, e.problem
        if index is not None and index.data_crcs is None:
            index, replaced = None, "version 1, without record CRCs"
        if index is not None:
            return {"path": path, "records": index.count, "bytes": index.file_size, "status": "up to date"}
    start = time.perf_counter()
    identity = None if output_dir is None else data_identity(path)
    index = build_index(path)
    sidecar = write_index(index) if output_dir is None else write_cached_index(index, output_dir, identity)
    return {"path": path, "records": index.count, "bytes": index.file_size, "status": "indexed",
            "seconds": round(time.perf_counter() - start, 6), "index": sidecar, "replaced": replaced}


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILES",
                        help="uncompressed TFRecord files: paths, glob patterns or URIs")
    parser.add_argument("--force", action="store_true", help="rebuild indexes that are up to date")
    parser.add_argument("--output-dir", metavar="DIR",
                        help="keep the indexes in DIR, apart from the data (for files in read-only places); "
                             "Dataset(index_dir=DIR) or INFEED_INDEX_DIR=DIR reads them")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one entry per file")


def run(args) -> int:
    paths = [p for p in expand_files(args.files) if not is_index_file(p)]
    if not paths:
        raise ValueError(f"{' '.join(args.files)} names only {INDEX_SUFFIX} sidecars, no data files")
    reports = []
    for path in paths:
        report = index_file(path, args.force, args.output_dir)
        reports.append(report)
        if not args.json:
            print(_describe(report), flush=True)
    if args.output_dir is not None:          # the entries of older versions of these files, unused for a day
        remove_superseded(args.output_dir, [r["index"] for r in reports if r["status"] == "indexed"])
    if args.json:
        print(json.dumps(reports, indent=2))
        return 0
    indexed = sum(r["status"] == "indexed" for r in reports)
    print(f"{len(reports)} files, {sum(r['records'] for r in reports)} records, "
          f"{sum(r['bytes'] for r in reports)} bytes: {indexed} indexed, {len(reports) - indexed} up to date")
    return 0


def _describe(report: dict) -> str:
    line = f"{report['path']}: {report['records']} records, {report['bytes']} bytes, "
    if report["status"] == "up to date":
        return line + "up to date"
    line += f"indexed in {report['seconds']:.3f} s"
    return line + (f" (replaced an unusable index: {report['replaced']})" if report["replaced"] else "")
