"""TFRecord files: CRC-checked reading (plain, GZIP, ZLIB; local or any ``pyarrow.fs`` URI), writing,
record-offset index sidecars and file lists. Nothing here knows what a record holds."""

from infeed.tfrecord.files import expand_files
from infeed.tfrecord.index import RecordIndex, build_index, load_index, write_index
from infeed.tfrecord.reader import read_records
from infeed.tfrecord.writer import TFRecordWriter

__all__ = ["RecordIndex", "TFRecordWriter", "build_index", "expand_files", "load_index", "read_records",
           "write_index"]
