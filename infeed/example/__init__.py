"""``tf.train.Example``: the feature specs, the Cython decoder writing records straight into fixed-shape
batches, the encoder, and (in :mod:`infeed.example.arrow`) Arrow columns encoded as Examples."""

from infeed.example.codec import ExampleParser, decode_example, encode_example, parse_examples
from infeed.example.spec import Bytes, FixedLen, Padded, VarLen

__all__ = ["Bytes", "ExampleParser", "FixedLen", "Padded", "VarLen", "decode_example", "encode_example",
           "parse_examples"]
