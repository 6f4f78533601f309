"""``infeed convert``: tables (Parquet, CSV, Arrow IPC / Feather, JSON Lines) to sharded TFRecord files.

Inputs are read through pyarrow a record batch at a time, so memory stays
bounded whatever their size; they may be local paths or any URI pyarrow.fs
opens (``gs://``, ``s3://``, ``hdfs://``, ``file://``).  Each row becomes one
``tf.train.Example`` with a feature per column (the type mapping is in
:mod:`infeed.example.arrow`).

Shards are named as TensorFlow names them, ``PREFIX-00000-of-00004.tfrecord``
(``.gz`` / ``.zlib`` added when compressed, so readers detect it), and hold
contiguous runs of rows: reading the shards in name order gives the rows in
input order (inputs in the order given).  ``shards=N`` makes sizes that differ
by at most one, the larger first; ``records_per_shard=N`` fills each shard but
the last.  Both need the row count first: free for Parquet and Arrow files,
an extra read for CSV and JSON Lines.  Local shards are written under a
temporary name and renamed once every shard is complete; on failure none is
left behind.

>>> convert(["data.parquet"], "out/train", shards=4)     # doctest: +SKIP
ConvertResult(rows=1000, shards=(Shard(path='out/train-00000-of-00004.tfrecord', ...), ...))
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from infeed.commands.arguments import positive_int
from infeed.errors import ColumnError, ConvertError, FileSystemConfigError
from infeed.example.arrow import ColumnPlan, encode_batch, plan_columns
from infeed.tfrecord.names import split_query, with_suffix
from infeed.tfrecord.filesystems import filesystem_for
from infeed.tfrecord.writer import TFRecordWriter

__all__ = ["ConvertResult", "Shard", "convert", "detect_format", "shard_sizes",
           "shard_paths", "FORMATS", "add_arguments", "run", "USAGE_ERRORS"]

HELP = "convert Parquet / CSV / Arrow / JSON Lines tables to sharded TFRecord files"

#: Input formats, and the extensions ``format="auto"`` recognises for each.
FORMATS = {
    "parquet": (".parquet", ".pq", ".parq"),
    "csv": (".csv",),
    "arrow": (".arrow", ".feather", ".ipc"),
    "jsonl": (".jsonl", ".ndjson"),
}
_FORMAT_ALIASES = {"feather": "arrow", "ipc": "arrow", "ndjson": "jsonl"}
#: Stream compressions pyarrow undoes for CSV and JSON Lines (``data.csv.gz``).
_STREAM_COMPRESSION = (".gz", ".bz2", ".zst", ".lz4", ".br")
_OUTPUT_EXTENSION = {None: ".tfrecord", "GZIP": ".tfrecord.gz", "ZLIB": ".tfrecord.zlib"}

ROWS_PER_CHUNK = 1024            # rows encoded at a time: bounds memory for wide rows
_TEXT_BLOCK_BYTES = 8 << 20      # CSV / JSON block; types are inferred from the first block


@dataclass(frozen=True)
class Shard:
    """One written file: its path (or URI), rows, and size in bytes."""

    path: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class ConvertResult:
    """What :func:`convert` wrote.

    rows: rows written, over all shards.
    shards: the files, in row order.
    stale: other files with the same prefix and a different shard count
        (from an earlier run), which a glob such as ``PREFIX-*`` would also match.
    """

    rows: int
    shards: tuple[Shard, ...]
    stale: tuple[str, ...] = ()

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def convert(inputs: Sequence[str], output: str, *, format: str = "auto", shards: int | None = None,
            records_per_shard: int | None = None, compression: str | None = None,
            columns: Sequence[str] | None = None, temporal_as_int64: bool = False) -> ConvertResult:
    """Writes the rows of ``inputs`` as tf.train.Examples to shards named ``output-0000k-of-0000n``.

    format: ``"auto"`` (from each input's extension) or a key of :data:`FORMATS`
        (``"feather"`` is ``"arrow"``).
    shards / records_per_shard: how to split the rows (at most one; neither
        gives one shard).
    compression: None, ``"GZIP"`` or ``"ZLIB"``.
    columns: the columns to write, in this order; default all, in table order.
    temporal_as_int64: write timestamp / date / time / duration columns as
        int64 in their unit (seconds... nanoseconds, days for date32) instead
        of refusing them.

    Raises :class:`ConvertError` for bad arguments and inputs, and
    :class:`~infeed.errors.ColumnError` for a column (or a value) that
    a tf.train.Example cannot hold; nothing is left under the final names then.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if not inputs:
        raise ConvertError("no inputs given")
    if shards is not None and records_per_shard is not None:
        raise ConvertError("give shards or records_per_shard, not both")
    _check_positive("shards", shards)
    _check_positive("records_per_shard", records_per_shard)
    output = os.fspath(output)
    if compression not in _OUTPUT_EXTENSION:
        raise ConvertError(f"compression must be None, 'GZIP' or 'ZLIB', got {compression!r}")
    _check_prefix(output)
    tables = [_Table(os.fspath(path), format) for path in inputs]
    plans = [_plan(table, columns, temporal_as_int64) for table in tables]
    _check_kinds_agree(tables, plans)
    if shards is None and records_per_shard is None:
        sizes = None                                   # one shard, whatever the count
        paths = shard_paths(output, 1, compression)
    else:
        sizes = shard_sizes(sum(t.count_rows() for t in tables), shards, records_per_shard)
        paths = shard_paths(output, len(sizes), compression)
    writer = _ShardWriter(paths, sizes, compression)
    try:
        for table, table_plans in zip(tables, plans):
            for first_row, batch in table.chunks([p.name for p in table_plans]):
                try:
                    records = encode_batch(batch, table_plans, first_row)
                except ColumnError as e:
                    raise _with_path(e, table.path) from None
                writer.write(records, table.path)
        written = writer.finish()
    except BaseException:
        writer.abort()
        raise
    return ConvertResult(sum(s.rows for s in written), tuple(written), _stale_shards(output, paths))


def shard_sizes(total: int, shards: int | None = None, records_per_shard: int | None = None) -> list[int]:
    """Rows per shard, in order: ``shards`` near-equal runs (larger first), or runs of ``records_per_shard``.

    >>> shard_sizes(10, shards=4), shard_sizes(10, records_per_shard=4), shard_sizes(0, records_per_shard=4)
    ([3, 3, 2, 2], [4, 4, 2], [0])
    """
    if (shards is None) == (records_per_shard is None):
        raise ConvertError("give exactly one of shards and records_per_shard")
    _check_positive("shards", shards)
    _check_positive("records_per_shard", records_per_shard)
    if shards is not None:
        return [total // shards + (k < total % shards) for k in range(shards)]
    full, rest = divmod(total, records_per_shard)
    return [records_per_shard] * full + ([rest] if rest or not full else [])


def _check_positive(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConvertError(f"{name} must be a positive int, got {value!r}")


def shard_paths(prefix: str, count: int, compression: str | None = None) -> list[str]:
    """TensorFlow-style shard names: ``prefix-00000-of-00003.tfrecord[.gz|.zlib]`` (a URI's query kept last).

    >>> shard_paths("out/train", 2, "GZIP")
    ['out/train-00000-of-00002.tfrecord.gz', 'out/train-00001-of-00002.tfrecord.gz']
    >>> shard_paths("s3://bucket/train?region=eu-west-1", 1)
    ['s3://bucket/train-00000-of-00001.tfrecord?region=eu-west-1']
    """
    width = max(5, len(str(count)))
    ext = _OUTPUT_EXTENSION[compression]
    return [with_suffix(prefix, f"-{k:0{width}d}-of-{count:0{width}d}{ext}") for k in range(count)]


def detect_format(path: str, format: str = "auto") -> str:
    """The key of :data:`FORMATS` for ``path``: ``format`` itself, or read from the extension.

    >>> detect_format("gs://bucket/part-0.csv.gz"), detect_format("x.feather")
    ('csv', 'arrow')
    """
    format = _FORMAT_ALIASES.get(format, format)
    if format in FORMATS:
        return format
    if format != "auto":
        raise ConvertError(f"unknown format {format!r}; choose auto, {', '.join(FORMATS)} or feather")
    name = path.rstrip("/").lower()
    for ext in _STREAM_COMPRESSION:
        if name.endswith(ext):
            name = name[: -len(ext)]
            break
    for fmt, extensions in FORMATS.items():
        if name.endswith(extensions):
            return fmt
    known = ", ".join(e for extensions in FORMATS.values() for e in extensions)
    raise ConvertError(f"{path}: cannot tell the format from the extension (known: {known}); "
                       "pass --format")


# ---------------------------------------------------------------------------
# Inputs


def _filesystem(path: str):
    """(pyarrow filesystem, path inside it) for a local path or a URI."""
    if "://" in path:
        try:
            return filesystem_for(path)
        except FileSystemConfigError as e:
            raise ConvertError(str(e)) from None
    return pafs.LocalFileSystem(), os.path.abspath(path)


class _Table:
    """One input: its schema, its row count, and its record batches, whatever the format."""

    def __init__(self, path: str, format: str):
        self.path = path
        self.format = detect_format(path, format)
        self.fs, self.inner = _filesystem(path)
        info = self.fs.get_file_info(self.inner)
        if info.type == pafs.FileType.NotFound:
            raise ConvertError(f"{path}: no such file")
        if info.type == pafs.FileType.Directory:
            raise ConvertError(f"{path}: is a directory; pass the files in it")
        with self._open(None) as reader:
            self.schema = reader.schema

    def count_rows(self) -> int:
        """The number of rows: from metadata for Parquet and Arrow files, by reading for the others."""
        with self._open(self.schema.names[:1]) as reader:
            if isinstance(reader, _ParquetBatches):
                return reader.num_rows
            if isinstance(reader, pa.ipc.RecordBatchFileReader):
                return reader.count_rows()
            return sum(batch.num_rows for batch in _batches(reader))

    def chunks(self, columns: list[str]) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(index of the first row, batch of at most ROWS_PER_CHUNK rows with ``columns`` in order)."""
        first_row = 0
        with self._open(columns) as reader:
            for batch in _batches(reader):
                batch = batch.select(columns)
                for start in range(0, batch.num_rows, ROWS_PER_CHUNK):
                    chunk = batch.slice(start, ROWS_PER_CHUNK)
                    yield first_row, chunk
                    first_row += chunk.num_rows

    @contextlib.contextmanager
    def _open(self, columns):
        """pyarrow's reader for the format (``columns`` limits parsing where it can), closed after;
        read and parse errors become a ConvertError naming the input."""
        source = None
        try:
            if self.format in ("parquet", "arrow"):
                source = (pa.memory_map(self.inner) if isinstance(self.fs, pafs.LocalFileSystem)
                          else self.fs.open_input_file(self.inner))
            else:
                source = self.fs.open_input_stream(self.inner)      # decompressed per its extension
            yield _READERS[self.format](source, columns)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            hint = (f" (column types are inferred from the first {_TEXT_BLOCK_BYTES >> 20} MiB; a file whose "
                    "later values do not fit them needs converting to Parquet with explicit types)"
                    if self.format in ("csv", "jsonl") and "conversion error" in str(e).lower() else "")
            raise ConvertError(f"{self.path}: cannot read it as {self.format}: {e}{hint}") from None
        except (FileNotFoundError, PermissionError) as e:
            raise ConvertError(f"{self.path}: {e.strerror or e}") from None
        finally:
            if source is not None:
                source.close()


class _ParquetBatches:
    """A Parquet file as record batches, with the ``schema`` every reader has."""

    def __init__(self, source, columns):
        import pyarrow.parquet as pq

        self._file = pq.ParquetFile(source)
        self._columns = columns
        self.schema = self._file.schema_arrow
        self.num_rows = self._file.metadata.num_rows

    def __iter__(self):
        return self._file.iter_batches(batch_size=ROWS_PER_CHUNK, columns=self._columns)


def _arrow_reader(source, columns):
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:                       # not the IPC file format: the stream format?
        source.seek(0)
        return pa.ipc.open_stream(source)


def _csv_reader(source, columns):
    import pyarrow.csv as pacsv

    return pacsv.open_csv(source, read_options=pacsv.ReadOptions(block_size=_TEXT_BLOCK_BYTES),
                          convert_options=pacsv.ConvertOptions(include_columns=columns or []))


def _jsonl_reader(source, columns):
    import pyarrow.json as pajson

    options = pajson.ReadOptions(block_size=_TEXT_BLOCK_BYTES)
    if hasattr(pajson, "open_json"):
        return pajson.open_json(source, read_options=options)
    return pajson.read_json(source, read_options=options).to_reader()      # pyarrow < 19: whole file


#: format -> reader factory ``(source, columns) -> reader with .schema, iterable over record batches``.
_READERS = {"parquet": _ParquetBatches, "arrow": _arrow_reader, "csv": _csv_reader, "jsonl": _jsonl_reader}


def _batches(reader) -> Iterator[pa.RecordBatch]:
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        return (reader.get_batch(i) for i in range(reader.num_record_batches))
    return iter(reader)


def _plan(table: _Table, columns, temporal_as_int64) -> list[ColumnPlan]:
    schema = table.schema
    if columns is not None:
        if not columns:
            raise ConvertError("columns is empty; name at least one column")
        missing = [c for c in columns if c not in schema.names]
        if missing:
            raise ConvertError(f"{table.path}: no column {', '.join(map(repr, missing))}; "
                               f"its columns are {', '.join(schema.names)}")
        if len(set(columns)) < len(columns):
            raise ConvertError(f"columns names a column twice: {', '.join(columns)}")
        schema = pa.schema([schema.field(c) for c in columns])
    try:
        return plan_columns(schema, temporal_as_int64)
    except ColumnError as e:
        raise _with_path(e, table.path) from None


def _with_path(error: ColumnError, path: str) -> ColumnError:
    return ColumnError(error.column, error.arrow_type, error.problem, error.row, path)


def _check_kinds_agree(tables, plans):
    """Each feature keeps one kind over all inputs (CSV type inference can differ between files)."""
    first = {}
    for table, table_plans in zip(tables, plans):
        for p in table_plans:
            if p.kind is None:
                continue
            seen = first.setdefault(p.name, (table.path, p))
            if seen[1].kind != p.kind:
                raise ConvertError(f"column {p.name!r} is {seen[1].arrow_type} ({seen[1].kind} feature) in "
                                   f"{seen[0]} but {p.arrow_type} ({p.kind} feature) in {table.path}; "
                                   "make the inputs' types agree")


# ---------------------------------------------------------------------------
# Outputs


def _check_prefix(output: str):
    location = split_query(output)[0]
    if not location or location.endswith(("/", os.sep)) or ("://" not in output and os.path.isdir(output)):
        raise ConvertError(f"--output is a file name prefix such as out/train, got the directory {output!r}")


class _ShardWriter:
    """Writes records into consecutive shards of planned sizes; renames local shards into place at the end."""

    def __init__(self, paths: list[str], sizes: list[int] | None, compression: str | None):
        self.paths, self.sizes, self.compression = paths, sizes, compression
        self.fs, _ = _filesystem(paths[0])
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.staged = [p + ".incomplete" if self.local else p for p in paths]
        self.rows = [0] * len(paths)
        self.index = -1
        self.writer = None
        if self.local:
            self.fs.create_dir(os.path.dirname(_filesystem(paths[0])[1]), recursive=True)

    def write(self, records: list[bytes], source: str):
        for record in records:
            while self.writer is None or (self.sizes is not None and
                                          self.rows[self.index] == self.sizes[self.index]):
                self._next(source)
            self.writer.write(record)
            self.rows[self.index] += 1

    def finish(self) -> list[Shard]:
        while self.index + 1 < len(self.paths):       # the shards still unopened (empty ones included)
            self._next(None)
        self.writer.close()
        if self.sizes is not None and self.rows != self.sizes:
            raise ConvertError(f"the inputs changed while converting: counted {sum(self.sizes)} rows, "
                               f"read {sum(self.rows)}")
        if self.local:
            for staged, path in zip(self.staged, self.paths):
                self.fs.move(_filesystem(staged)[1], _filesystem(path)[1])
        infos = self.fs.get_file_info([_filesystem(p)[1] for p in self.paths])
        return [Shard(p, n, info.size) for p, n, info in zip(self.paths, self.rows, infos)]

    def abort(self):
        """Closes and deletes what was written (best effort: the original error matters more)."""
        if self.writer is not None:
            try:
                self.writer.close()
            except Exception:
                pass
        for staged in self.staged[: self.index + 1]:
            try:
                self.fs.delete_file(_filesystem(staged)[1])
            except Exception:
                pass

    def _next(self, source):
        if self.index + 1 >= len(self.paths):
            raise ConvertError(f"{source}: more rows than counted ({sum(self.sizes)}): "
                               "the inputs changed while converting")
        if self.writer is not None:
            self.writer.close()
        self.index += 1
        self.writer = TFRecordWriter(self.staged[self.index], compression=self.compression)


def _stale_shards(prefix: str, paths: list[str]) -> tuple[str, ...]:
    """Files named like shards of ``prefix`` that this run did not write."""
    fs, inner = _filesystem(prefix)
    parent, base = os.path.split(inner)
    pattern = re.compile(re.escape(base) + r"-\d{5,}-of-\d{5,}\.tfrecord(\.gz|\.zlib)?$")
    try:
        infos = fs.get_file_info(pafs.FileSelector(parent or ".", allow_not_found=True))
    except (OSError, pa.ArrowException):
        return ()
    ours = {os.path.basename(split_query(p)[0]) for p in paths}
    location, query = split_query(prefix)
    head = location[: len(location) - len(base)]
    return tuple(sorted(head + i.base_name + query for i in infos
                        if pattern.match(i.base_name) and i.base_name not in ours))


# ---------------------------------------------------------------------------
# Command line

#: Errors meaning the command cannot run as asked (exit status 2).
USAGE_ERRORS = (ConvertError, ColumnError)


def add_arguments(parser) -> None:
    """Adds ``infeed convert``'s arguments to an argparse parser."""
    parser.epilog = ("Rows keep their order: shards hold contiguous runs of rows, so reading the shards "
                     "in name order gives the inputs' rows in order. Type mapping: integers and bools -> "
                     "int64_list, floats -> float_list (float32), strings and binary -> bytes_list, lists of "
                     "those -> several values, null -> the feature is left out of that row.")
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="table files (local paths or URIs)")
    parser.add_argument("-o", "--output", required=True, metavar="PREFIX",
                        help="shard name prefix: PREFIX-00000-of-00004.tfrecord")
    parser.add_argument("--format", default="auto", choices=["auto", *FORMATS, "feather"],
                        help="input format (default: from each input's extension)")
    split = parser.add_mutually_exclusive_group()
    split.add_argument("--shards", type=positive_int, metavar="N", help="write N shards of near-equal size")
    split.add_argument("--records-per-shard", type=positive_int, metavar="N",
                       help="write shards of N records (the last one may be smaller)")
    parser.add_argument("--compression", type=str.upper, choices=["GZIP", "ZLIB"],
                        help="compress the shards (adds .gz / .zlib)")
    parser.add_argument("--columns", type=_column_list, metavar="A,B,...",
                        help="write only these columns, in this order")
    parser.add_argument("--temporal-as-int64", action="store_true",
                        help="write timestamp/date/time/duration columns as int64 in their unit "
                             "(e.g. ms since the epoch for timestamp[ms], days for date32)")


def run(args) -> int:
    """Runs ``infeed convert`` for parsed arguments; prints what was written."""
    result = convert(args.inputs, args.output, format=args.format, shards=args.shards,
                     records_per_shard=args.records_per_shard, compression=args.compression,
                     columns=args.columns, temporal_as_int64=args.temporal_as_int64)
    n = len(result.shards)
    print(f"wrote {result.rows:,} rows to {n} shard{'s' * (n != 1)}, {result.bytes:,} bytes")
    listed = result.shards if n <= 8 else (*result.shards[:3], None, result.shards[-1])
    cells = [(s.path, f"{s.rows:,} rows", f"{s.bytes:,} bytes") for s in result.shards]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    for shard in listed:
        if shard is None:
            print(f"  ... {n - 4} more")
        else:
            path, rows, size = cells[result.shards.index(shard)]
            print(f"  {path:<{widths[0]}}  {rows:>{widths[1]}}  {size:>{widths[2]}}")
    if result.stale:
        print(f"note: {len(result.stale)} other file(s) from an earlier run share the prefix "
              f"(delete them if you read the shards with a glob): {', '.join(result.stale)}")
    return 0


def _column_list(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated column names, got {text!r}")
    return names
