"""infeed: TFRecord reading, writing and tf.train.Example decoding into fixed-shape batches."""

from infeed.daemon import Batch, Daemon, Feed, attach
from infeed.dataset import Dataset
from infeed.errors import (AttachError, CorruptRecordError, DecodeError, IndexFileError, InfeedError, ShmSpaceError,
                           Timeout, WorkerDied)
from infeed.example import ExampleParser, decode_example, encode_example, parse_examples
from infeed.reader import read_records
from infeed.ring import Ring
from infeed.spec import Bytes, FixedLen, Padded, VarLen
from infeed.writer import TFRecordWriter

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
    "FixedLen",
    "IndexFileError",
    "InfeedError",
    "Padded",
    "Ring",
    "ShmSpaceError",
    "TFRecordWriter",
    "Timeout",
    "VarLen",
    "WorkerDied",
    "attach",
    "decode_example",
    "encode_example",
    "parse_examples",
    "read_records",
]
