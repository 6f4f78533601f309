"""tf.train.Example: encoding (for writers), schema-less and spec-driven decoding."""

from __future__ import annotations

import operator
import struct
import weakref
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from infeed.errors import DecodeError
from infeed.example import _example
from infeed.example.image import BadImage, Image, ImageDecoder
from infeed.example.randomness import STREAM_IMAGE
from infeed.example.spec import NUMERIC_DTYPES, Bytes, FixedLen, Padded, VarLen, numpy_dtype

__all__ = ["ExampleParser", "parse_examples", "decode_example", "encode_example"]

decode_example = _example.decode_example


#: Output arrays an ExampleParser remembers as checked (a ring's slots and steps).
_CHECKED_OUTPUTS = 256


def _none_ref():
    return None


class ExampleParser:
    """A spec compiled once, then used for every batch.

    >>> parser = ExampleParser({"x": FixedLen((2,), "float32")})
    >>> batch = parser.parse([encode_example({"x": [1.0, 2.0]})])
    >>> batch["x"].tolist()
    [[1.0, 2.0]]

    ``parse(records, out=...)`` decodes into arrays you own, such as a ring
    buffer slot made by :meth:`allocate`; rows ``start..start+len(records)``
    are written and nothing else.

    :class:`infeed.Image` features are decoded after the rest of each record,
    from where their bytes lie in it. ``seed`` keys their random crops and
    flips (with each record's ``(epoch, file, record)``). With
    ``skip_corrupt``, a record whose image cannot be decoded becomes a row of
    zeros (every feature of it), counted in :attr:`skipped_images`, its row in
    :attr:`last_skipped_rows` and its error in :attr:`last_skipped`, instead of
    raising: batches keep their size, every worker's plan of the batches stays
    the same, and the caller masks the row (a :class:`~infeed.Dataset` with
    ``skip_corrupt`` flags it in ``is_padding``; its workers log each one,
    naming its file). It is never a copy of another record: training would see
    that record twice and an evaluation count it twice.
    """

    def __init__(self, spec: Mapping[str, FixedLen | VarLen | Bytes | Image], seed: int = 0,
                 skip_corrupt: bool = False):
        if not isinstance(spec, Mapping) or not spec:
            raise ValueError(f"spec must be a non-empty dict of name -> FixedLen/VarLen/Bytes/Image, "
                             f"got {spec!r:.200}")
        features = []
        self._columns: list = []           # per compiled feature: the output's name, or None for an image's span
        self._images: list = []            # (name, decoder, the compiled position of its span)
        keys: dict = {}                    # Example key -> what reads it
        spans: dict = {}                   # Example key -> compiled position of its span
        for name, f in spec.items():
            if not isinstance(name, str):
                raise ValueError(f"feature names must be str, got {name!r}")
            key = f.key if isinstance(f, Image) else name
            if key in keys and not (isinstance(f, Image) and key in spans):
                raise ValueError(f"the Example feature {key!r} is read by both {keys[key]!r} and {name!r}; "
                                 f"only Image features may share one")
            keys.setdefault(key, name)
            if isinstance(f, FixedLen):
                fill = f.default.tobytes() if f.default is not None else None
                features.append((name, NUMERIC_DTYPES[f.dtype], "fixed", f.dtype, f.count, False, fill, -1))
            elif isinstance(f, VarLen):
                fill = np.full(f.max_len, f.pad, dtype=f.dtype).tobytes()
                features.append((name, NUMERIC_DTYPES[f.dtype], "varlen", f.dtype, f.max_len, f.truncate,
                                 fill, -1))
            elif isinstance(f, Bytes):
                fill = None if f.default is None else f.default.ljust(f.max_bytes, b"\0")
                features.append((name, "bytes", "bytes", "uint8", f.max_bytes, f.truncate, fill,
                                 -1 if f.default is None else len(f.default)))
            elif isinstance(f, Image):
                if key not in spans:
                    spans[key] = len(features)
                    features.append((key, "bytes", "span", "int64", 2, False, None, -1))
                    self._columns.append(None)
                decoder = ImageDecoder(f, seed, STREAM_IMAGE + len(self._images))
                self._images.append((name, decoder, spans[key]))
                continue
            else:
                raise ValueError(f"spec[{name!r}] must be FixedLen, VarLen, Bytes or Image, got {f!r}")
            self._columns.append(name)
        self.spec = dict(spec)
        self.skip_corrupt = bool(skip_corrupt)
        #: Records zeroed because their image could not be decoded (``skip_corrupt``), since the parser was made.
        self.skipped_images = 0
        #: The DecodeErrors of the records zeroed by the last parse call (``skip_corrupt``).
        self.last_skipped: list = []
        #: Their rows in that call's output arrays, ascending.
        self.last_skipped_rows: list[int] = []
        self._compiled = _example.CompiledSpec(features)
        self._spans = np.zeros((0, 2), np.int64)
        self._checked: dict = {}

    @property
    def uses_record_ids(self) -> bool:
        """Whether decoding draws random numbers per record: then ``ids`` name the records (see :meth:`parse`)."""
        return any(decoder.spec.random for _, decoder, _ in self._images)

    @property
    def reads_in_place(self) -> bool:
        """Whether :meth:`read_into` decodes every record where it lies, with no object per record (any spec
        without an image), so it also takes an ``IndexedFrames`` (records read by an index's offsets)."""
        return not self._images

    def allocate(self, batch_size: int) -> dict:
        """Zeroed output arrays for ``batch_size`` records, laid out as ``parse`` returns them."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 0:
            raise ValueError(f"batch_size must be a non-negative int, got {batch_size!r:.80}")
        out = {}
        for name, f in self.spec.items():
            if isinstance(f, FixedLen):
                out[name] = np.zeros((batch_size, *f.shape), f.dtype)
            elif isinstance(f, VarLen):
                out[name] = Padded(np.zeros((batch_size, f.max_len), f.dtype), np.zeros(batch_size, np.int32))
            elif isinstance(f, Image):
                out[name] = np.zeros((batch_size, *f.shape), numpy_dtype(f.dtype))
            else:
                out[name] = Padded(np.zeros((batch_size, f.max_bytes), np.uint8), np.zeros(batch_size, np.int32))
        return out

    def parse(self, records: Sequence, out: dict | None = None, start: int = 0, index_base: int = 0,
              ids: Sequence | None = None) -> dict:
        """Decodes serialized Examples into ``out`` (allocated when None) from row ``start``.

        Raises :class:`infeed.DecodeError` naming the feature and the record's
        index (``index_base`` + its position in ``records``). ``ids``: each
        record's ``(epoch, file, record)``, which keys its random image crop and
        flip (default ``(0, 0, index_base + position)``).
        """
        if not isinstance(records, Iterable) or isinstance(records, (str, bytes, bytearray, memoryview)):
            raise TypeError(f"records must be a sequence of serialized Examples, got {records!r:.80}")
        if out is None:
            if start:
                raise ValueError("start needs out")
            out = self.allocate(len(records))
        if self._images:
            records = list(records)
            if len(self._spans) < start + len(records):
                self._spans = np.zeros((start + len(records), 2), np.int64)
        values, lengths = self._outputs(out)
        self._compiled.decode_into(records, values, lengths, start, index_base)
        if self._images:
            self._decode_images(records, out, start, index_base, ids)
        return out

    def read_into(self, reader, n: int, out: dict, start: int = 0, index_base: int = 0,
                  origin: tuple | None = None) -> tuple[int, int]:
        """Reads up to ``n`` records from ``reader`` (a :func:`infeed.read_records` reader; or, where
        :attr:`reads_in_place`, an ``IndexedFrames``) and
        decodes each where it lies in the reader's buffer into rows ``start...`` of ``out``: the
        same values as ``parse(reader.read_batch(n), out)``, without a bytes object per record
        (with images, with one). ``origin``: ``(epoch, file)`` of the reader's file, for the
        records' ``ids`` (their numbers come from the reader).

        Returns ``(records decoded, their bytes)``, fewer records only at the end of the stream.
        """
        if self._images:
            records = reader.read_batch(n)
            epoch, file = origin if origin is not None else (0, 0)
            first = reader.records_read - len(records)
            ids = [(epoch, file, first + i) for i in range(len(records))]
            self.parse(records, out, start, index_base, ids)
            return len(records), sum(map(len, records))
        values, lengths = self._outputs(out)
        return self._compiled.decode_from(reader, n, values, lengths, start, index_base)

    def _decode_images(self, records: list, out: dict, start: int, index_base: int, ids) -> None:
        """Decodes every image feature of ``records`` (rows ``start...`` of ``out``) from their spans."""
        bad: dict = {}                             # position -> DecodeError
        for name, decoder, column in self._images:
            rows = out[name]
            for i, record in enumerate(records):
                if i in bad:
                    continue
                offset, length = self._spans[start + i]
                try:
                    decoder.decode(memoryview(record)[offset:offset + length], rows[start + i],
                                   ids[i] if ids is not None else (0, 0, index_base + i))
                except BadImage as e:
                    error = DecodeError(decoder.spec.key, index_base + i, "a JPEG or PNG image", e.found,
                                        offset=int(offset))
                    if not self.skip_corrupt:
                        raise error from None
                    bad[i] = error
        self.last_skipped = [bad[i] for i in sorted(bad)]
        self.last_skipped_rows = [start + i for i in sorted(bad)]
        for row in self.last_skipped_rows:         # every feature of the record: none of it is to be seen
            for arr in out.values():
                for part in (arr if isinstance(arr, Padded) else (arr,)):
                    part[row] = 0
        self.skipped_images += len(bad)

    def _outputs(self, out: dict) -> tuple[list, list]:
        """The value and length arrays of ``out`` in spec order, checked (once per set of arrays)."""
        if not isinstance(out, Mapping):
            raise TypeError(f"out must be a dict of arrays as allocate() makes, got {out!r:.80}")
        values, lengths = [], []
        for name in self._columns:
            if name is None:                       # an image's span: where its bytes lie, for _decode_images
                values.append(self._spans)
                lengths.append(None)
                continue
            try:
                arr = out[name]
            except KeyError:
                raise ValueError(f"out has no array for feature {name!r}") from None
            if isinstance(arr, Padded):
                values.append(arr.values)
                lengths.append(arr.lengths)
            else:
                values.append(arr)
                lengths.append(None)
        images = []
        for name, _, _ in self._images:
            if name not in out:
                raise ValueError(f"out has no array for feature {name!r}")
            images.append(out[name])
        arrays = values + lengths + images
        key = tuple(map(id, arrays))
        refs = self._checked.get(key)
        if refs is None or not all(map(operator.is_, map(operator.call, refs), arrays)):     # in C: per batch
            for name, v, n in zip(self._columns, values, lengths):
                if name is not None:
                    self._check_out(name, v, n)
            for (name, _, _), image in zip(self._images, images):
                self._check_out(name, image, None)
            # Reused outputs (the slots of a ring) are checked once; weak references never keep them alive.
            if len(self._checked) >= _CHECKED_OUTPUTS:
                self._checked.clear()
            self._checked[key] = [weakref.ref(a) if a is not None else _none_ref for a in arrays]
        return values, lengths

    def _check_out(self, name, values, lengths):
        f = self.spec[name]
        if isinstance(f, (FixedLen, Image)):
            want, dtype, padded = f.shape, f.dtype, False
        elif isinstance(f, VarLen):
            want, dtype, padded = (f.max_len,), f.dtype, True
        else:
            want, dtype, padded = (f.max_bytes,), "uint8", True
        if not isinstance(values, np.ndarray) or values.shape[1:] != want or values.dtype != numpy_dtype(dtype):
            got = (getattr(values, "shape", None), getattr(values, "dtype", type(values).__name__))
            raise ValueError(f"out[{name!r}] must be a {dtype} array of shape [B, {', '.join(map(str, want))}], "
                             f"got shape {got[0]} dtype {got[1]}")
        if padded != (lengths is not None):
            raise ValueError(f"out[{name!r}] must {'' if padded else 'not '}be an infeed.Padded")


def parse_examples(records: Sequence, spec: Mapping, out: dict | None = None) -> dict:
    """Decodes serialized Examples into a dict of arrays, leading dimension ``len(records)``.

    FixedLen features give ``[B, *shape]`` arrays; VarLen and Bytes give
    :class:`infeed.Padded` ``(values [B, width], lengths [B] int32)``.  For many
    batches, build one :class:`ExampleParser` and reuse it.
    """
    return ExampleParser(spec).parse(records, out)


# ---------------------------------------------------------------------------
# Encoding


_FLOAT32 = struct.Struct("<f")
_FLOAT_SCALAR_PREFIX = b"\x12\x06\x0a\x04"          # float_list [2] { packed value [1], 4 bytes }


def _utf8(name, text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"feature {name!r}: {text!r:.80} is not encodable as UTF-8: {e}") from None


def _key(name) -> bytes:
    if isinstance(name, str):
        return _utf8(name, name)
    if isinstance(name, (bytes, bytearray)):
        return bytes(name)
    raise TypeError(f"feature names must be str or bytes, got {name!r:.80}")


def _unencodable(name, value, error: Exception) -> Exception:
    """``error`` (a TypeError or ValueError of a conversion) as the same type naming the feature."""
    return type(error)(f"feature {name!r}: cannot encode {value!r:.80}: {error} (a value is bytes, str, "
                       "a number, or a list or numpy array of them)")


def _len_prefixed(field_tag: int, payload: bytes) -> bytes:
    return bytes([field_tag]) + varint(len(payload)) + payload


#: Varints of 0..16383: the lengths nearly every field has.
_SHORT_VARINTS = [bytes([n]) if n < 0x80 else bytes([n & 0x7F | 0x80, n >> 7]) for n in range(1 << 14)]


def varint(n: int) -> bytes:
    """The protobuf varint of a non-negative int below 2**64 (lengths, tags, int64 bit patterns)."""
    if n < 16384:
        return _SHORT_VARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _feature(name, value) -> bytes:
    """Encodes one Feature message, choosing the kind from the value's type."""
    kind = type(value)
    if kind is int:                                   # fast paths: plain Python scalars
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"feature {name!r} has integers outside int64")
        return _len_prefixed(0x1A, _len_prefixed(0x0A, varint(value & 0xFFFFFFFFFFFFFFFF)))
    if kind is float and -3.4028234663852886e38 <= value <= 3.4028234663852886e38:
        return _FLOAT_SCALAR_PREFIX + _FLOAT32.pack(value)
    if isinstance(value, (bytes, bytearray, memoryview, str)):
        value = [value]
    elif isinstance(value, (int, float, np.integer, np.floating, bool, np.bool_)):
        value = [value]
    arr = value if isinstance(value, np.ndarray) else None
    if arr is None:
        try:
            items = list(value)
        except TypeError as e:
            raise _unencodable(name, value, e) from None
        if items and all(isinstance(v, (bytes, bytearray, memoryview, str)) for v in items):
            payload = b"".join(_len_prefixed(0x0A, _utf8(name, v) if isinstance(v, str) else bytes(v)) for v in items)
            return _len_prefixed(0x0A, payload)                     # bytes_list [1]
        if any(isinstance(v, (bytes, bytearray, memoryview, str)) for v in items):
            raise TypeError(f"feature {name!r} mixes bytes and numbers")
        try:
            if any(isinstance(v, (float, np.floating)) for v in items):
                arr = np.asarray(items, np.float32)
            else:
                arr = np.asarray(items, np.int64) if items else np.zeros(0, np.float32)
        except OverflowError:
            raise ValueError(f"feature {name!r} has integers outside int64") from None
        except (TypeError, ValueError) as e:
            raise _unencodable(name, value, e) from None
    arr = np.asarray(arr)
    if arr.dtype.kind == "f":
        packed = arr.astype("<f4", copy=False).ravel().tobytes()
        return _len_prefixed(0x12, _len_prefixed(0x0A, packed) if packed else b"")   # float_list [2]
    if arr.dtype.kind in "iub":
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            raise ValueError(f"feature {name!r} has integers outside int64")
        packed = _example.encode_varints(arr.astype(np.int64).ravel())
        return _len_prefixed(0x1A, _len_prefixed(0x0A, packed) if packed else b"")   # int64_list [3]
    if arr.dtype.kind in "SO":
        if arr.size == 0:
            return _len_prefixed(0x0A, b"")                                               # empty bytes_list [1]
        try:
            items = [bytes(v) for v in arr.ravel()]
        except TypeError as e:
            raise _unencodable(name, value, e) from None
        return _feature(name, items)
    raise TypeError(f"feature {name!r}: cannot encode dtype {arr.dtype}")


def encode_example(features: Mapping) -> bytes:
    """Serializes a dict as a ``tf.train.Example``, in the form TensorFlow writes.

    Values: bytes or str (and lists of them) -> bytes_list; floats and float
    arrays -> float_list (as float32); ints, bools and integer arrays ->
    int64_list.  An empty list becomes an empty float_list, as TensorFlow's
    own ``tf.train.Feature(float_list=...)`` would; pass an empty array of the
    dtype you want to choose.

    >>> decode_example(encode_example({"n": [1, 2]}))["n"][0]
    'int64'
    """
    if not isinstance(features, Mapping):
        raise TypeError(f"features must be a mapping of name -> value, got {features!r:.80}")
    entries = []
    for name, value in features.items():
        entry = _len_prefixed(0x0A, _key(name)) + _len_prefixed(0x12, _feature(name, value))
        entries.append(_len_prefixed(0x0A, entry))
    return _len_prefixed(0x0A, b"".join(entries)) if entries else b""

