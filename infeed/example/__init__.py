"""``tf.train.Example``: the feature specs, the Cython decoder writing records straight into fixed-shape
batches, encoded images decoded into them (:mod:`infeed.example.image`), the encoder, and (in
:mod:`infeed.example.arrow`) Arrow columns encoded as Examples."""

from infeed.example.codec import ExampleParser, decode_example, encode_example, parse_examples
from infeed.example.spec import Bytes, FixedLen, Image, Padded, VarLen

__all__ = ["Bytes", "ExampleParser", "FixedLen", "Image", "Padded", "VarLen", "decode_example", "encode_example",
           "parse_examples"]
