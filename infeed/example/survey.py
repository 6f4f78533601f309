"""What the records of TFRecord files of tf.train.Examples hold, feature by feature: kinds, presence, the fewest
and most values a record holds and the shortest and longest bytes value (:func:`summarize` for one file,
:func:`summarize_files` for several, merged). ``infeed inspect`` prints it and suggests a spec from it; a TFDS
build's spec takes its variable lengths from it (:mod:`infeed.tfds`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from infeed.errors import DecodeError
from infeed.example.codec import decode_example
from infeed.tfrecord.reader import read_records

__all__ = ["FeatureStats", "FileSummary", "summarize", "summarize_files"]

_JPEG = b"\xff\xd8\xff"
_PNG = b"\x89PNG\r\n\x1a\n"


@dataclass
class FeatureStats:
    """What one feature looks like over the records read.

    kinds: records per kind (``"int64"``, ``"float"``, ``"bytes"``) among
        those with at least one value; an empty list has no kind that matters,
        since any empty list decodes as zero values.
    present: records that have the feature (with values or not).
    min_values / max_values: fewest and most values in a record that has it.
    min_bytes / max_bytes: shortest and longest bytes value (None when none).
    images: bytes values that are encoded images, per format (``"JPEG"``, ``"PNG"``), by their first bytes,
        of ``bytes_values`` in all.
    """

    name: str
    kinds: dict[str, int] = field(default_factory=dict)
    present: int = 0
    min_values: int = 0
    max_values: int = 0
    min_bytes: int | None = None
    max_bytes: int | None = None
    images: dict[str, int] = field(default_factory=dict)
    bytes_values: int = 0

    @property
    def kind(self) -> str | None:
        """The feature's kind; ``"mixed"`` when records disagree; None when no record has values."""
        if not self.kinds:
            return None
        return next(iter(self.kinds)) if len(self.kinds) == 1 else "mixed"

    def merge(self, other: "FeatureStats") -> "FeatureStats":
        """These counts and ``other``'s (the same feature, in other records), as one."""
        both = FeatureStats(self.name, dict(self.kinds), self.present + other.present)
        for kind, n in other.kinds.items():
            both.kinds[kind] = both.kinds.get(kind, 0) + n
        present = [s for s in (self, other) if s.present]
        both.min_values = min((s.min_values for s in present), default=0)
        both.max_values = max(self.max_values, other.max_values)
        lows = [s.min_bytes for s in (self, other) if s.min_bytes is not None]
        highs = [s.max_bytes for s in (self, other) if s.max_bytes is not None]
        both.min_bytes, both.max_bytes = (min(lows), max(highs)) if lows else (None, None)
        both.images = {f: self.images.get(f, 0) + other.images.get(f, 0) for f in {**self.images, **other.images}}
        both.bytes_values = self.bytes_values + other.bytes_values
        return both

    @property
    def image_format(self) -> str | None:
        """``"JPEG"`` or ``"PNG"`` where every bytes value seen is an image of that format (or of either:
        ``"JPEG or PNG"``), else None."""
        if not self.images or sum(self.images.values()) != self.bytes_values:
            return None
        return " or ".join(sorted(self.images)) if len(self.images) > 1 else next(iter(self.images))

    def add(self, kind, values) -> None:
        """Counts one record's ``(kind, values)``, as :func:`infeed.decode_example` gives them."""
        n = len(values)
        self.min_values = n if not self.present else min(self.min_values, n)
        self.max_values = max(self.max_values, n)
        self.present += 1
        if n:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind == "bytes" and n:
            self.bytes_values += n
            for v in values:
                head = v[:8]
                found = "JPEG" if head[:3] == _JPEG else "PNG" if head == _PNG else None
                if found:
                    self.images[found] = self.images.get(found, 0) + 1
            lengths = [len(v) for v in values]
            shortest, longest = min(lengths), max(lengths)
            self.min_bytes = shortest if self.min_bytes is None else min(self.min_bytes, shortest)
            self.max_bytes = longest if self.max_bytes is None else max(self.max_bytes, longest)


@dataclass
class FileSummary:
    """A file's records and features.

    records: records read.  complete: False when ``max_records`` stopped the
    read before the end.  record_bytes: (shortest, longest, total) serialized
    size.  features: per name, in order of first appearance.  files: the files
    read (several, merged: :func:`summarize_files`).
    """

    path: str
    records: int = 0
    complete: bool = True
    record_bytes: tuple[int, int, int] = (0, 0, 0)
    features: dict[str, FeatureStats] = field(default_factory=dict)
    files: int = 1

    def merge(self, other: "FileSummary") -> "FileSummary":
        """This summary and ``other``'s (other records), as one: a feature missing from one file's records counts
        as absent from them."""
        (a_low, a_high, a_total), (b_low, b_high, b_total) = self.record_bytes, other.record_bytes
        lows = [low for low, n in ((a_low, self.records), (b_low, other.records)) if n]
        features = {}
        for name in {**self.features, **other.features}:
            mine, theirs = self.features.get(name), other.features.get(name)
            features[name] = mine.merge(theirs) if mine and theirs else (mine or theirs)
        return FileSummary(self.path, self.records + other.records, self.complete and other.complete,
                           (min(lows, default=0), max(a_high, b_high), a_total + b_total), features,
                           self.files + other.files)


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


def summarize_files(paths: Iterable[str], max_records: int | None = None, compression: str = "auto",
                    only: set[str] | None = None) -> FileSummary:
    """:func:`summarize` of each of ``paths`` (each whole, or its first ``max_records``), merged into one summary
    whose ``path`` is the first file's and ``files`` their count; ``only``: the features counted (the others
    are left out)."""
    merged = None
    for path in paths:
        one = summarize(path, max_records, compression)
        if only is not None:
            one.features = {name: stats for name, stats in one.features.items() if name in only}
        merged = one if merged is None else merged.merge(one)
    if merged is None:
        raise ValueError("no files to summarize")
    return merged
