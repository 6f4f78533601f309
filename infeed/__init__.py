"""infeed: TFRecord files decoded by worker processes into fixed-shape batches in shared memory.

The sub-packages follow a batch's path: :mod:`infeed.tfrecord` (files and records) ->
:mod:`infeed.example` (specs and the decoder) -> :mod:`infeed.ring` (shared-memory slots) ->
:mod:`infeed.daemon` (datasets, workers, the trainer's feed); :mod:`infeed.commands` is the CLI.
"""

from infeed import _native  # noqa: F401  (first: an unbuilt checkout fails saying how to build it)
from infeed.daemon import Batch, Daemon, Dataset, Feed, InputStats, attach
from infeed.errors import (AttachError, CorruptRecordError, DecodeError, FileSystemConfigError, IndexFileError,
                           InfeedError, ShmSpaceError, SourceChangedError, Timeout, TransformError, WorkerDied)
from infeed.example import (Bytes, ExampleParser, FixedLen, Image, Padded, VarLen, decode_example, encode_example,
                            parse_examples)
from infeed.ring import Ring
from infeed.tfrecord import TFRecordWriter, read_records
from infeed.tfrecord.filesystems import register_filesystem, unregister_filesystem

__all__ = [
    "AttachError",
    "Batch",
    "Bytes",
    "CorruptRecordError",
    "Daemon",
    "Dataset",
    "DecodeError",
    "ExampleParser",
    "Feed",
    "FileSystemConfigError",
    "FixedLen",
    "Image",
    "IndexFileError",
    "InfeedError",
    "InputStats",
    "Padded",
    "Ring",
    "ShmSpaceError",
    "SourceChangedError",
    "TFRecordWriter",
    "Timeout",
    "TransformError",
    "VarLen",
    "WorkerDied",
    "attach",
    "decode_example",
    "encode_example",
    "parse_examples",
    "read_records",
    "register_filesystem",
    "unregister_filesystem",
]
