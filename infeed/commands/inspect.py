"""``infeed inspect``: what a TFRecord file of tf.train.Examples holds, and a feature spec that reads it.

For each feature: its kind, in how many records it is present, the least and
most values a record holds and, for bytes, the shortest and longest value.
From those, a spec to paste (:func:`suggest_spec`): ``FixedLen`` when every
record holds the same number of values (shape ``()`` for one; with a default
when some records lack the feature), ``VarLen`` when the number varies,
``Bytes`` for one bytes value per record.  Lists of bytes have no static
layout yet and are left out, with a comment saying so.

>>> summary = summarize("train.tfrecord")                 # doctest: +SKIP
>>> spec = eval(suggest_spec(summary), {"infeed": infeed})  # doctest: +SKIP
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from infeed.commands.arguments import positive_int
from infeed.errors import DecodeError
from infeed.example.codec import decode_example
from infeed.tfrecord.reader import read_records

__all__ = ["FeatureStats", "FileSummary", "summarize", "suggest_spec", "format_text", "to_json",
           "add_arguments", "run", "USAGE_ERRORS"]

HELP = "summarise a TFRecord file's features and suggest a feature spec that reads it"

_DTYPES = {"float": "float32", "int64": "int64"}


@dataclass
class FeatureStats:
    """What one feature looks like over the records read.

    kinds: records per kind (``"int64"``, ``"float"``, ``"bytes"``) among
        those with at least one value; an empty list has no kind that matters,
        since any empty list decodes as zero values.
    present: records that have the feature (with values or not).
    min_values / max_values: fewest and most values in a record that has it.
    min_bytes / max_bytes: shortest and longest bytes value (None when none).
    """

    name: str
    kinds: dict[str, int] = field(default_factory=dict)
    present: int = 0
    min_values: int = 0
    max_values: int = 0
    min_bytes: int | None = None
    max_bytes: int | None = None

    @property
    def kind(self) -> str | None:
        """The feature's kind; ``"mixed"`` when records disagree; None when no record has values."""
        if not self.kinds:
            return None
        return next(iter(self.kinds)) if len(self.kinds) == 1 else "mixed"

    def add(self, kind, values) -> None:
        """Counts one record's ``(kind, values)``, as :func:`infeed.decode_example` gives them."""
        n = len(values)
        self.min_values = n if not self.present else min(self.min_values, n)
        self.max_values = max(self.max_values, n)
        self.present += 1
        if n:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "bytes" and n:
            lengths = [len(v) for v in values]
            shortest, longest = min(lengths), max(lengths)
            self.min_bytes = shortest if self.min_bytes is None else min(self.min_bytes, shortest)
            self.max_bytes = longest if self.max_bytes is None else max(self.max_bytes, longest)


@dataclass
class FileSummary:
    """A file's records and features.

    records: records read.  complete: False when ``max_records`` stopped the
    read before the end.  record_bytes: (shortest, longest, total) serialized
    size.  features: per name, in order of first appearance.
    """

    path: str
    records: int = 0
    complete: bool = True
    record_bytes: tuple[int, int, int] = (0, 0, 0)
    features: dict[str, FeatureStats] = field(default_factory=dict)


def summarize(path: str, max_records: int | None = None, compression: str = "auto") -> FileSummary:
    """Reads ``path`` (all of it, or its first ``max_records`` records) and counts what its features hold.

    Raises :class:`infeed.CorruptRecordError` for a damaged file and
    :class:`infeed.DecodeError` (with ``path``) for a record that is not a
    tf.train.Example.
    """
    summary = FileSummary(str(path))
    shortest, longest, total = None, 0, 0
    reader = read_records(path, compression=compression)
    with reader:
        for index, record in enumerate(reader):
            if max_records is not None and index >= max_records:
                summary.complete = False
                break
            try:
                example = decode_example(record, index)
            except DecodeError as e:
                raise DecodeError(e.feature, e.record_index, e.expected, e.found, str(path), e.offset) from None
            for name, (kind, values) in example.items():
                stats = summary.features.get(name)
                if stats is None:
                    stats = summary.features[name] = FeatureStats(name)
                stats.add(kind, values)
            shortest = len(record) if shortest is None else min(shortest, len(record))
            longest = max(longest, len(record))
            total += len(record)
            summary.records = index + 1
    summary.record_bytes = (shortest or 0, longest, total)
    return summary


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

