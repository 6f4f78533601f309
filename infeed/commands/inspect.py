"""``infeed inspect``: what a TFRecord file of tf.train.Examples holds, and a feature spec that reads it.

For each feature: its kind, in how many records it is present, the least and
most values a record holds and, for bytes, the shortest and longest value.
From those, a spec to paste (:func:`suggest_spec`): ``FixedLen`` when every
record holds the same number of values (shape ``()`` for one; with a default
when some records lack the feature), ``VarLen`` when the number varies,
``Bytes`` for one bytes value per record.  Lists of bytes have no static
layout yet and are left out, with a comment saying so.

>>> summary = infeed.example.survey.summarize("train.tfrecord")   # doctest: +SKIP
>>> spec = eval(suggest_spec(summary), {"infeed": infeed})  # doctest: +SKIP
"""

from __future__ import annotations

import json

from infeed.commands.arguments import positive_int
from infeed.example.survey import FeatureStats, FileSummary, summarize

__all__ = ["suggest_spec", "format_text", "to_json", "add_arguments", "run", "USAGE_ERRORS"]

HELP = "summarise a TFRecord file's features and suggest a feature spec that reads it"

_DTYPES = {"float": "float32", "int64": "int64"}


def suggest_spec(summary: FileSummary) -> str:
    """A Python dict expression of infeed specs that parses the records summarised (``infeed`` in scope).

    Features no spec can read yet (lists of bytes, kinds that differ between
    records, no values anywhere) appear as comments saying why.
    """
    lines = ["{"]
    if not summary.complete:
        lines.append(f"    # from the first {summary.records} records only: later ones may hold more values")
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
    what = f"{summary.records:,} records" if summary.complete else f"first {summary.records:,} records (more follow)"
    out = [f"{summary.path}: {what}, {total:,} bytes of records ({shortest:,} to {longest:,} per record)"]
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
        "records": summary.records,
        "complete": summary.complete,
        "record_bytes": {"min": shortest, "max": longest, "total": total},
        "features": {
            s.name: {"kind": s.kind, "kinds": s.kinds, "present": s.present,
                     "values": {"min": s.min_values, "max": s.max_values},
                     "bytes": None if s.min_bytes is None else {"min": s.min_bytes, "max": s.max_bytes}}
            for s in summary.features.values()
        },
        "suggested_spec": suggest_spec(summary),
    }


def _span(low, high) -> str:
    return f"{low}" if low == high else f"{low}..{high}"


# ---------------------------------------------------------------------------
# Command line

#: Errors meaning the command cannot run as asked (exit status 2); a damaged file exits with 1.
USAGE_ERRORS = ()


def add_arguments(parser) -> None:
    """Adds ``infeed inspect``'s arguments to an argparse parser."""
    parser.epilog = ("Compression (GZIP, ZLIB) is detected. A damaged file prints the error, which names "
                     "the file, the record and its byte offset, and exits with status 1.")
    parser.add_argument("file", metavar="FILE", help="a TFRecord file (local path or URI)")
    parser.add_argument("--records", type=positive_int, metavar="N",
                        help="read only the first N records (default: the whole file)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args) -> int:
    """Runs ``infeed inspect`` for parsed arguments."""
    summary = summarize(args.file, args.records)
    print(json.dumps(to_json(summary), indent=2) if args.json else format_text(summary))
    return 0

