"""``infeed inspect``: what TFRecord files of tf.train.Examples hold, and a feature spec that reads them.

For each feature: its kind, in how many records it is present, the least and
most values a record holds and, for bytes, the shortest and longest value.
From those, a spec to paste (:func:`suggest_spec`): ``FixedLen`` when every
record holds the same number of values (shape ``()`` for one; with a default
when some records lack the feature), ``VarLen`` when the number varies,
``Bytes`` for one bytes value per record, ``Image`` when those bytes are JPEG or
PNG images (the size and crop left for the user).  Lists of bytes have no static
layout yet and are left out, with a comment saying so.

It takes files, globs and folders (a folder's TFRecord files), read whole, or with more than
:data:`SAMPLE_FROM_FILES` files a sample of :data:`SAMPLE_RECORDS` records, the first of each file (said so;
``--records N`` and ``--all`` choose: 1,000 shards of 40-feature records in 1.6 s). A tensorflow-datasets
build folder is read by its metadata (:mod:`infeed.tfds`): its splits, shards and example counts, and the spec
from ``features.json``, shapes and image keys included.

>>> summary = infeed.example.survey.summarize("train.tfrecord")   # doctest: +SKIP
>>> spec = eval(suggest_spec(summary), {"infeed": infeed})  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os

from infeed.commands.arguments import positive_int
from infeed.errors import TfdsBuildError
from infeed.example.spec import Bytes, FixedLen, Image, VarLen
from infeed.example.survey import FeatureStats, FileSummary, summarize_files
from infeed.tfds.build import holds_build
from infeed.tfrecord.files import folder_files, record_files

__all__ = ["suggest_spec", "format_text", "to_json", "add_arguments", "run", "USAGE_ERRORS"]

HELP = "summarise TFRecord files' features (or a TFDS build's) and suggest a feature spec that reads them"

_DTYPES = {"float": "float32", "int64": "int64"}
#: With more files than this, inspect reads a sample unless told: the first records of each file, SAMPLE_RECORDS
#: in all (SAMPLE_RECORDS // SAMPLE_FROM_FILES a file at most, 16 at least): a few seconds whatever the count.
SAMPLE_FROM_FILES = 16
SAMPLE_RECORDS = 32768
_SAMPLE_LEAST = 16
#: The size an Image suggestion carries, for the user to change.
_PLACEHOLDER_SIZE = (224, 224)


def suggest_spec(summary: FileSummary) -> str:
    """A Python dict expression of infeed specs that parses the records summarised (``infeed`` in scope).

    Features no spec can read yet (lists of bytes, kinds that differ between
    records, no values anywhere) appear as comments saying why.
    """
    lines = ["{"]
    if not summary.complete:
        first = (f"the first {summary.records} records only" if summary.files == 1 else
                 f"a sample, the first records of each of {summary.files} files ({summary.records:,} in all)")
        lines.append(f"    # from {first}: later ones may hold more values")
    for stats in summary.features.values():
        spec, note = _suggest_one(stats, summary.records)
        key = json.dumps(stats.name, ensure_ascii=False)
        if spec is None:
            lines.append(f"    # {key}: {note}")
        else:
            lines.append(f"    {key}: {spec},{f'  # {note}' if note else ''}")
    lines.append("}")
    return "\n".join(lines)


def _suggest_one(stats: FeatureStats, records: int) -> tuple[str | None, str]:
    """(spec code or None, a note) for one feature."""
    missing = records - stats.present
    kind = stats.kind
    if kind is None:
        return None, "no values in any record: nothing to infer a spec from"
    if kind == "mixed":
        found = ", ".join(f"{k} in {n} records" for k, n in stats.kinds.items())
        return None, f"kinds differ between records ({found}): no single spec reads it"
    if kind == "bytes":
        if stats.min_values == stats.max_values == 1 and stats.image_format and not missing:
            return (f"infeed.Image(key={json.dumps(stats.name, ensure_ascii=False)}, size={_PLACEHOLDER_SIZE})",
                    f"{stats.image_format} images: choose the size and the crop (resize=...)")
        if stats.min_values == stats.max_values == 1:
            default = ', default=b""' if missing else ""
            note = f"missing in {missing} of {records} records: the default fills them" if missing else ""
            return f"infeed.Bytes(max_bytes={stats.max_bytes}{default})", note
        return None, (f"bytes, {stats.min_values} to {stats.max_values} values per record: "
                      "no static layout for lists of bytes yet")
    dtype = _DTYPES[kind]
    if stats.min_values == stats.max_values:
        count = stats.max_values
        shape = "()" if count == 1 else f"({count},)"
        if not missing:
            return f'infeed.FixedLen({shape}, "{dtype}")', ""
        zero = "0.0" if dtype == "float32" else "0"
        return (f'infeed.FixedLen({shape}, "{dtype}", default={zero})',
                f"missing in {missing} of {records} records: the default fills them")
    note = f"{stats.min_values} to {stats.max_values} values"
    if missing:
        note += f"; missing in {missing} of {records} records (length 0)"
    return f'infeed.VarLen("{dtype}", max_len={stats.max_values})', note


def format_text(summary: FileSummary) -> str:
    """The report ``infeed inspect`` prints: a table of features, then the suggested spec."""
    shortest, longest, total = summary.record_bytes
    if summary.files == 1:
        what = (f"{summary.records:,} records" if summary.complete else
                f"first {summary.records:,} records (more follow)")
        where = summary.path
    else:
        what = (f"{summary.records:,} records" if summary.complete else
                f"a sample of {summary.records:,} records, the first of each file (more follow; --all reads all)")
        where = f"{summary.files:,} files ({summary.path}, ...)"
    out = [f"{where}: {what}, {total:,} bytes of records ({shortest:,} to {longest:,} per record)"]
    if summary.features:
        rows = [("feature", "kind", "present", "values", "bytes")]
        for s in summary.features.values():
            rows.append((s.name, s.kind or "-", f"{s.present:,}", _span(s.min_values, s.max_values),
                         _span(s.min_bytes, s.max_bytes) if s.min_bytes is not None else ""))
        widths = [max(len(r[i]) for r in rows) for i in range(5)]
        out.append("")
        out += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    out += ["", "suggested spec:", suggest_spec(summary)]
    return "\n".join(out)


def to_json(summary: FileSummary) -> dict:
    """The summary as plain JSON types, with the suggested spec as a string."""
    shortest, longest, total = summary.record_bytes
    return {
        "path": summary.path,
        "files": summary.files,
        "records": summary.records,
        "complete": summary.complete,
        "record_bytes": {"min": shortest, "max": longest, "total": total},
        "features": {
            s.name: {"kind": s.kind, "kinds": s.kinds, "present": s.present,
                     "values": {"min": s.min_values, "max": s.max_values},
                     "bytes": None if s.min_bytes is None else {"min": s.min_bytes, "max": s.max_bytes},
                     "images": s.images}
            for s in summary.features.values()
        },
        "suggested_spec": suggest_spec(summary),
    }


def _span(low, high) -> str:
    return f"{low}" if low == high else f"{low}..{high}"


# ---------------------------------------------------------------------------
# Command line

#: Errors meaning the command cannot run as asked (exit status 2); a damaged file exits with 1.
USAGE_ERRORS = (TfdsBuildError,)


def add_arguments(parser) -> None:
    """Adds ``infeed inspect``'s arguments to an argparse parser."""
    parser.epilog = ("Compression (GZIP, ZLIB) is detected. A damaged file prints the error, which names "
                     "the file, the record and its byte offset, and exits with status 1.")
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="TFRecord files (local paths or URIs), glob patterns, folders of TFRecord files, or a "
                             "tensorflow-datasets build folder")
    read = parser.add_mutually_exclusive_group()
    read.add_argument("--records", type=positive_int, metavar="N",
                      help=f"read only the first N records of each file (default: whole files, or with more than "
                           f"{SAMPLE_FROM_FILES} files a sample of about {SAMPLE_RECORDS}, the first of each)")
    read.add_argument("--all", action="store_true", help="read every record of every file")
    parser.add_argument("--split", help="a TFDS build's split whose records give the lengths (default: train, "
                                        "else the first)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    """Runs ``infeed inspect`` for parsed arguments."""
    if len(args.files) == 1 and holds_build(args.files[0]):
        return _run_tfds(args)
    paths = []
    for name in args.files:
        paths += _folder_files(name) if os.path.isdir(name) else record_files(name)
    paths = list(dict.fromkeys(paths))
    records = args.records if args.records or args.all or len(paths) <= SAMPLE_FROM_FILES else sample_size(len(paths))
    summary = summarize_files(paths, None if args.all else records)
    print(json.dumps(to_json(summary), indent=2) if args.json else format_text(summary))
    return 0


def sample_size(files: int) -> int:
    """The records inspect reads of each of ``files`` files by default, past SAMPLE_FROM_FILES of them."""
    return max(_SAMPLE_LEAST, min(SAMPLE_RECORDS // SAMPLE_FROM_FILES, SAMPLE_RECORDS // files))


def _folder_files(folder: str) -> list[str]:
    """A folder's TFRecord files, its other files (indexes, metadata) left out."""
    found, others = folder_files(folder)
    if not found:
        raise FileNotFoundError(f"{folder}: no TFRecord files in it ({others} other files)")
    return found


def _run_tfds(args) -> int:
    """The report of a TFDS build: its splits, and the spec its metadata gives (lengths from a split's records)."""
    from infeed.tfds import open_build, stored_features, tfds_spec

    build = open_build(args.files[0])
    split = args.split or ("train" if "train" in build.splits else next(iter(build.splits)))
    stored = stored_features(build.features)
    sizes = {s.name: Image(size=_PLACEHOLDER_SIZE) for s in stored if s.kind == "image" and min(s.shape[:2]) < 1}
    files = build.split(split).files
    records = None if args.all else args.records or (sample_size(len(files)) if len(files) > SAMPLE_FROM_FILES
                                                     else None)
    spec = tfds_spec(stored, files, images=sizes, survey_records=records)
    if args.json:
        print(json.dumps({"folder": build.folder, "name": build.name, "config": build.config,
                          "version": build.version, "splits": {n: {"files": list(s.files),
                                                                   "examples": list(s.shard_lengths)}
                                                               for n, s in build.splits.items()},
                          "spec_split": split, "suggested_spec": _spec_code(spec, stored, sizes)}, indent=2))
        return 0
    out = [f"{build.folder}: TFDS build {build.name}" + (f", config {build.config}" if build.config else "")
           + f", version {build.version}"]
    for name, s in build.splits.items():
        out.append(f"  split {name}: {len(s.files)} shards, {s.examples:,} examples ({s.files[0]}, ...)")
    read = "all its records" if records is None else f"the first {records} records of each shard"
    out += ["", f"suggested spec (from features.json; lengths from split {split}, {read}):",
            _spec_code(spec, stored, sizes)]
    print("\n".join(out))
    return 0


def _spec_code(spec: dict, stored, sizes: dict) -> str:
    """The spec as a dict expression to paste, image sizes to choose marked."""
    notes = {s.name: f"{s.encoding.upper()} images of any size: choose the size and the crop (resize=...)"
             for s in stored if s.name in sizes}
    lines = ["{"]
    for name, f in spec.items():
        note = notes.get(name)
        lines.append(f"    {json.dumps(name, ensure_ascii=False)}: {_code(f)},{f'  # {note}' if note else ''}")
    lines.append("}")
    return "\n".join(lines)


def _code(f) -> str:
    if isinstance(f, FixedLen):
        return f'infeed.FixedLen({f.shape!r}, "{f.dtype}")'
    if isinstance(f, VarLen):
        return f'infeed.VarLen("{f.dtype}", max_len={f.max_len})'
    if isinstance(f, Bytes):
        return f"infeed.Bytes(max_bytes={f.max_bytes})"
    resize = "" if f.resize == "center_crop" else f", resize={f.resize!r}"
    return f"infeed.Image(key={json.dumps(f.key)}, size={f.size}, channels={f.channels}{resize})"
