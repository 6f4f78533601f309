"""infeed: TFRecord reading, writing and tf.train.Example decoding into fixed-shape batches."""

from infeed.errors import CorruptRecordError, DecodeError, InfeedError
from infeed.example import ExampleParser, decode_example, encode_example, parse_examples
from infeed.reader import read_records
from infeed.spec import Bytes, FixedLen, Padded, VarLen
from infeed.writer import TFRecordWriter

__all__ = [
    "Bytes",
    "CorruptRecordError",
    "DecodeError",
    "ExampleParser",
    "FixedLen",
    "InfeedError",
    "Padded",
    "TFRecordWriter",
    "VarLen",
    "decode_example",
    "encode_example",
    "parse_examples",
    "read_records",
]
