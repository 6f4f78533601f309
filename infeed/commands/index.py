"""``infeed index FILES...``: writes a record-offset sidecar (``FILE.index``) beside each TFRecord file.

A file whose sidecar loads (intact and matching the file's size) is left alone
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

HELP = "write a sidecar of record offsets beside each TFRecord file, for random access"
USAGE_ERRORS = (ValueError,)

__all__ = ["index_file"]


def index_file(path: str, force: bool = False) -> dict:
    """Indexes ``path`` unless ``force`` is off and its sidecar is up to date; returns what happened."""
    replaced = None
    if not force:
        try:
            index = load_index(path)
        except IndexFileError as e:
            index, replaced = None, e.problem
        if index is not None and index.data_crcs is None:
            index, replaced = None, "version 1, without record CRCs"
        if index is not None:
            return {"path": path, "records": index.count, "bytes": index.file_size, "status": "up to date"}
    start = time.perf_counter()
    index = build_index(path)
    sidecar = write_index(index)
    return {"path": path, "records": index.count, "bytes": index.file_size, "status": "indexed",
            "seconds": round(time.perf_counter() - start, 6), "index": sidecar, "replaced": replaced}


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILES",
                        help="uncompressed TFRecord files: paths, glob patterns or URIs")
    parser.add_argument("--force", action="store_true", help="rebuild sidecars that are up to date")
    parser.add_argument("--json", action="store_true", help="print a JSON list, one entry per file")


def run(args) -> int:
    paths = [p for p in expand_files(args.files) if not is_index_file(p)]
    if not paths:
        raise ValueError(f"{' '.join(args.files)} names only {INDEX_SUFFIX} sidecars, no data files")
    reports = []
    for path in paths:
        report = index_file(path, args.force)
        reports.append(report)
        if not args.json:
            print(_describe(report), flush=True)
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
