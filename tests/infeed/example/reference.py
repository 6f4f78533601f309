"""A pure-Python reference of infeed's tf.train.Example decoder, spec parser and CRC32C.

Slow and plain on purpose: every rule of the wire format is one visible line,
so the Cython decoder (infeed/_example.pyx) can be compared with it on random
and mutated input.  Three parts:

* ``decode_example(record)``: ``{name: (kind, values)}`` exactly as
  :func:`infeed.decode_example` returns it, or :class:`RefDecodeError`.
* ``parse(records, spec)``: what :meth:`infeed.ExampleParser.parse` fills in,
  or the error it raises (feature name and record index).
* ``encode(example, rng)``: a flexible encoder of a logical Example that, given
  a ``random.Random``, produces one of the many other valid encodings protobuf
  accepts (split messages, repeated keys, oneof kinds overridden, unpacked and
  mixed lists, unknown fields of every wire type, non-minimal varints...).

A logical Example is ``{name: (kind, values)}`` with kind ``"bytes"`` (list of
bytes), ``"float"`` (float32 array; NaN payloads are kept bit for bit),
``"int64"`` (list or array of ints) or None (a Feature with no kind set).

Validation scope.  Protobuf rejects a record that is malformed anywhere.  The
decoder, like TensorFlow's fast parser, reads only what it uses, so it
validates: the Example, Features and map-entry structure of the whole record
(and, for ``decode_example``, the UTF-8 of every key); the Feature message of
each key's *last* entry; the list messages of that Feature's final oneof run.
``strict=True`` checks everything protobuf checks instead (superseded entries,
overridden oneof runs, features the spec does not name, the UTF-8 of every key
field); a record valid under ``strict`` decodes to the same result under both.

Where protobuf implementations disagree, the reference takes infeed's side: a
10-byte varint whose last byte is above 1 (bits past 64) is malformed (as in
Go's protowire; C++ and upb drop the extra bits), and tags and lengths may take
up to 10 bytes (as in Go; C++ and upb refuse more than 5).
"""

from __future__ import annotations

import random
import struct

import ml_dtypes  # noqa: F401  (np.dtype("bfloat16"))
import numpy as np

MAX_VARINT_BYTES = 10
#: Groups nested deeper than this inside one unknown field are refused (as infeed does).
MAX_GROUP_DEPTH = 64

KINDS = {1: "bytes", 2: "float", 3: "int64"}
KIND_FIELDS = {v: k for k, v in KINDS.items()}
SPEC_KINDS = {"float32": "float", "bfloat16": "float", "float16": "float", "int64": "int64", "int32": "int64",
              "int16": "int64", "uint16": "int64", "int8": "int64", "uint8": "int64", "bool": "int64"}
#: The values each int64-read dtype holds.
INT_RANGES = {**{d: (np.iinfo(d).min, np.iinfo(d).max) for d in ("int64", "int32", "int16", "uint16", "int8", "uint8")},
              "bool": (0, 1)}


class Malformed(Exception):
    """Invalid protobuf wire format at ``offset`` of the record."""

    def __init__(self, what: str, offset: int):
        super().__init__(f"{what} (byte {offset})")
        self.what = what
        self.offset = offset


class RefDecodeError(Exception):
    """What the reference says infeed must raise: a DecodeError for ``feature`` and ``record_index``.

    ``code`` is one of malformed, utf8, missing, kind, count, too_long, range.
    """

    def __init__(self, feature, record_index, code, detail=""):
        super().__init__(f"record {record_index}: feature {feature!r}: {code} {detail}")
        self.feature = feature
        self.record_index = record_index
        self.code = code
        self.detail = detail


# ---------------------------------------------------------------------------
# Wire format


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``pos``; at most 10 bytes, value below 2**64."""
    value = 0
    for i in range(MAX_VARINT_BYTES):
        if pos >= end:
            raise Malformed("varint runs past the end of its message", pos)
        b = buf[pos]
        pos += 1
        if i == MAX_VARINT_BYTES - 1 and b > 1:
            raise Malformed("varint longer than 64 bits", pos - 1)
        value |= (b & 0x7F) << (7 * i)
        if b < 0x80:
            return value, pos
    raise AssertionError("unreachable: the tenth byte is at most 1")


def read_tag(buf, pos: int, end: int) -> tuple[int, int, int]:
    """(field, wire type, next position): field 0 and tags above 32 bits are malformed."""
    start = pos
    tag, pos = read_varint(buf, pos, end)
    if tag > 0xFFFFFFFF or tag >> 3 == 0:
        raise Malformed("invalid field tag", start)
    return tag >> 3, tag & 7, pos


def _skip_group(buf, pos: int, end: int, field: int) -> int:
    """Position after the end tag of the group ``field`` whose start tag ends at ``pos``."""
    depth = 1
    stack = [field]
    while True:
        if pos >= end:
            raise Malformed("group without its end tag", pos)
        f, w, pos = read_tag(buf, pos, end)
        if w == 3:
            depth += 1
            if depth > MAX_GROUP_DEPTH:
                raise Malformed("groups nested too deep", pos)
            stack.append(f)
        elif w == 4:
            if stack.pop() != f:        # every end tag closes the group its field number opened
                raise Malformed("group end tag does not match its start", pos)
            depth -= 1
            if depth == 0:
                return pos
        else:
            pos = _skip_scalar(buf, pos, end, w)


def _skip_scalar(buf, pos: int, end: int, wire: int) -> int:
    if wire == 0:
        return read_varint(buf, pos, end)[1]
    if wire == 1:
        if end - pos < 8:
            raise Malformed("fixed64 runs past the end of its message", pos)
        return pos + 8
    if wire == 2:
        n, pos = read_varint(buf, pos, end)
        if n > end - pos:
            raise Malformed("length runs past the end of its message", pos)
        return pos + n
    if wire == 5:
        if end - pos < 4:
            raise Malformed("fixed32 runs past the end of its message", pos)
        return pos + 4
    if wire == 4:
        raise Malformed("group end tag without a start", pos)
    raise Malformed("invalid wire type", pos)


def fields(buf, start: int, end: int):
    """Yields ``(field, wire, payload)`` for each field of the message in ``buf[start:end]``.

    payload: the int for wire 0, the ``(start, end)`` span for wires 1, 2 and 5,
    None for a group (skipped whole).  Raises Malformed where the bytes stop
    making sense, after yielding every field before that point.
    """
    pos = start
    while pos < end:
        f, w, pos = read_tag(buf, pos, end)
        if w == 0:
            v, pos = read_varint(buf, pos, end)
            yield f, w, v
        elif w == 3:
            pos = _skip_group(buf, pos, end, f)
            yield f, w, None
        else:
            body = _skip_scalar(buf, pos, end, w)
            if w == 2:
                n, p = read_varint(buf, pos, end)
                yield f, w, (p, body)
            else:
                yield f, w, (pos, body)
            pos = body


# ---------------------------------------------------------------------------
# tf.train.Example


def _walk(record, strict: bool):
    """Yields ``(key bytes, entry span)`` for each map entry, in record order."""
    for f, w, span in fields(record, 0, len(record)):
        if f == 1 and w == 2:                                   # Example.features
            for f2, w2, entry in fields(record, *span):
                if f2 == 1 and w2 == 2:                         # Features.feature (a map entry)
                    key = b""
                    for f3, w3, p3 in fields(record, *entry):
                        if f3 == 1 and w3 == 2:                 # the last key wins
                            key = bytes(record[p3[0]:p3[1]])
                            if strict:
                                _check_utf8(key, p3[0])
                        elif f3 == 2 and w3 == 2 and strict:
                            _check_feature(record, p3)
                    yield key, entry


def _check_utf8(key: bytes, offset: int):
    """Strict mode: proto3 refuses every string field occurrence that is not UTF-8."""
    try:
        key.decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed("a key is not UTF-8", offset) from None


def _check_feature(record, span):
    """Strict mode: every list of every kind in a Feature part must parse."""
    for f, w, lst in fields(record, *span):
        if 1 <= f <= 3 and w == 2:
            for _ in _list_values(record, [lst], KINDS[f]):
                pass


def _kind_run(record, entry):
    """(final kind or None, list spans of the final run of that kind) of a map entry's merged Feature."""
    kind, run = None, []
    for f, w, value in fields(record, *entry):
        if f == 2 and w == 2:                                   # a Feature part: parts merge
            for f2, w2, lst in fields(record, *value):
                if 1 <= f2 <= 3 and w2 == 2:
                    if KINDS[f2] != kind:                       # another kind clears the oneof
                        kind, run = KINDS[f2], []
                    run.append(lst)                             # the same kind again concatenates
    return kind, run


def _list_values(record, run, kind):
    """Yields the values of a run of list messages: bytes, 4-byte float chunks or ints."""
    for span in run:
        for f, w, p in fields(record, *span):
            if f != 1:
                continue                                        # unknown field, skipped
            if kind == "bytes" and w == 2:
                yield bytes(record[p[0]:p[1]])
            elif kind == "float" and w == 2:                    # packed
                if (p[1] - p[0]) % 4:
                    raise Malformed("packed floats not a multiple of 4 bytes", p[0])
                for i in range(p[0], p[1], 4):
                    yield bytes(record[i:i + 4])
            elif kind == "float" and w == 5:
                yield bytes(record[p[0]:p[1]])
            elif kind == "int64" and w == 2:                    # packed
                pos = p[0]
                while pos < p[1]:
                    v, pos = read_varint(record, pos, p[1])
                    yield _signed(v)
            elif kind == "int64" and w == 0:
                yield _signed(p)
            # field 1 with another wire type is an unknown field too


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _values_array(kind, values):
    if kind == "bytes":
        return list(values)
    if kind == "float":
        return np.frombuffer(b"".join(values), "<f4").astype(np.float32)
    return np.array(list(values), dtype=np.int64)


def last_entries(record, strict: bool = False, check_utf8: bool = False, record_index: int = 0):
    """``{key bytes: entry span}`` keeping each key's last entry, ordered by that last entry."""
    entries = {}
    try:
        for key, entry in _walk(record, strict):
            if check_utf8:
                try:
                    key.decode("utf-8")
                except UnicodeDecodeError:
                    raise RefDecodeError(None, record_index, "utf8", repr(key[:40])) from None
            entries.pop(key, None)
            entries[key] = entry
    except Malformed as e:
        raise RefDecodeError(None, record_index, "malformed", e.what) from None
    return entries


def decode_example(record, strict: bool = False, record_index: int = 0) -> dict:
    """``{name: (kind, values)}``, as :func:`infeed.decode_example`; RefDecodeError otherwise."""
    record = bytes(record)
    out = {}
    for key, entry in last_entries(record, strict, True, record_index).items():
        name = key.decode("utf-8")
        try:
            kind, run = _kind_run(record, entry)
            values = [] if kind is None else _values_array(kind, _list_values(record, run, kind))
        except Malformed as e:
            raise RefDecodeError(name, record_index, "malformed", e.what) from None
        out[name] = (kind, values)
    return out


def is_valid_protobuf(record) -> bool:
    """True when protobuf itself would parse ``record`` as a tf.train.Example (proto3: UTF-8 keys)."""
    try:
        decode_example(record, strict=True)
    except RefDecodeError:
        return False
    return True


# ---------------------------------------------------------------------------
# Spec-driven parsing (infeed.ExampleParser.parse)


def _spec_layout(f):
    """(layout, kind, dtype, width) of an infeed spec entry."""
    name = type(f).__name__
    if name == "FixedLen":
        return "fixed", SPEC_KINDS[f.dtype], f.dtype, int(np.prod(f.shape, dtype=np.int64))
    if name == "VarLen":
        return "varlen", SPEC_KINDS[f.dtype], f.dtype, f.max_len
    if name == "Bytes":
        return "bytes", "bytes", "uint8", f.max_bytes
    raise TypeError(f"not a feature spec: {f!r}")


def parse_row(record, spec: dict, record_index: int = 0, strict: bool = False) -> dict:
    """One record's row per feature: ``values`` (1-D array of the row) or ``(values, length)``."""
    record = bytes(record)
    entries = last_entries(record, strict, False, record_index)
    row = {}
    for name, f in spec.items():
        layout, want, dtype, width = _spec_layout(f)
        entry = entries.get(name.encode("utf-8"))
        if entry is None:
            row[name] = _missing(f, layout, dtype, width, name, record_index)
            continue
        try:
            row[name] = _present(record, entry, f, layout, want, dtype, width, name, record_index)
        except Malformed as e:
            raise RefDecodeError(name, record_index, "malformed", e.what) from None
    return row


def _missing(f, layout, dtype, width, name, index):
    if layout == "varlen":
        return np.full(width, f.pad, dtype=dtype), 0
    if layout == "fixed" and f.default is not None:
        return np.asarray(f.default, dtype=dtype).reshape(-1).copy()
    if layout == "bytes" and f.default is not None:
        return np.frombuffer(f.default.ljust(width, b"\0"), np.uint8).copy(), len(f.default)
    raise RefDecodeError(name, index, "missing")


def _present(record, entry, f, layout, want, dtype, width, name, index):
    kind, run = _kind_run(record, entry)
    if kind is not None and kind != want:
        # An empty list of another kind holds no value: it reads as no kind at all.
        if sum(1 for _ in _list_values(record, run, kind)):
            raise RefDecodeError(name, index, "kind", f"{want} wanted, {kind} found")
        kind = None
    if layout == "bytes":
        values = [] if kind is None else list(_list_values(record, run, kind))
        if len(values) != 1:
            raise RefDecodeError(name, index, "count", f"1 wanted, {len(values)} found")
        v = values[0]
        if len(v) > width:
            if not f.truncate:
                raise RefDecodeError(name, index, "too_long", f"{len(v)} bytes")
            v = v[:width]
        return np.frombuffer(v.ljust(width, b"\0"), np.uint8).copy(), len(v)
    stored, count = [], 0
    if kind is not None:
        for v in _list_values(record, run, kind):
            if count < width:              # values past the width are counted, not stored or checked
                if SPEC_KINDS[dtype] == "int64" and not INT_RANGES[dtype][0] <= v <= INT_RANGES[dtype][1]:
                    raise RefDecodeError(name, index, "range", str(v))
                stored.append(v)
            count += 1
    with np.errstate(all="ignore"):          # float16 overflows to inf, as numpy casts
        arr = (np.frombuffer(b"".join(stored), "<f4").astype(dtype) if SPEC_KINDS[dtype] == "float"
               else np.array(stored, dtype=dtype))
    if layout == "fixed":
        if count != width:
            raise RefDecodeError(name, index, "count", f"{width} wanted, {count} found")
        return arr
    if count > width and not f.truncate:
        raise RefDecodeError(name, index, "too_long", f"{count} values")
    n = min(count, width)
    row = np.full(width, f.pad, dtype=dtype)
    row[:n] = arr[:n]
    return row, n


def parse(records, spec: dict, index_base: int = 0, strict: bool = False) -> dict:
    """What ``infeed.ExampleParser(spec).parse(records)`` returns, or the RefDecodeError it must raise.

    FixedLen: ``[B, *shape]`` arrays; VarLen and Bytes: ``(values [B, width], lengths [B] int32)``.
    """
    rows = [parse_row(r, spec, index_base + i, strict) for i, r in enumerate(records)]
    out = {}
    for name, f in spec.items():
        layout, _, dtype, width = _spec_layout(f)
        if layout == "fixed":
            values = np.zeros((len(rows), *f.shape), dtype)
            for i, row in enumerate(rows):
                values[i] = row[name].reshape(f.shape)
            out[name] = values
        else:
            values = np.zeros((len(rows), width), dtype)
            lengths = np.zeros(len(rows), np.int32)
            for i, row in enumerate(rows):
                values[i], lengths[i] = row[name]
            out[name] = (values, lengths)
    return out


# ---------------------------------------------------------------------------
# Encoding: the canonical form and the alternatives protobuf also accepts


def varint(value: int, pad: int = 0) -> bytes:
    """A varint of ``value`` (negative: two's complement, 10 bytes), ``pad`` redundant bytes longer."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
        if not value:
            break
    pad = min(pad, MAX_VARINT_BYTES - len(out))
    out.extend(b"\x80" * pad)                # zero groups with the continuation bit, ...
    out[-1] &= 0x7F                          # ... the last byte ends the varint
    return bytes(out)


class Encoder:
    """Encodes logical Examples; with an ``rng`` picks at random among valid alternatives.

    ``p`` is the probability of each optional variation.  With ``rng=None``
    the output is the canonical encoding (the one TensorFlow writes).

    ``prefix_bytes`` caps the length of tags and length prefixes: the wire
    format allows 10-byte varints everywhere (and infeed, like Go's protowire,
    accepts them), while C++ protobuf and upb refuse tags and lengths longer
    than 5 bytes.  ``entry_unknowns=False`` keeps unknown fields out of map
    entries: upb moves such an entry out of the map instead of skipping the
    field (C++ protobuf and infeed skip it).
    """

    def __init__(self, rng: random.Random | None = None, p: float = 0.3, prefix_bytes: int = 10,
                 entry_unknowns: bool = True):
        self.rng = rng
        self.p = p
        self.prefix_bytes = prefix_bytes
        self.entry_unknowns = entry_unknowns

    # -- primitives

    def _maybe(self, p=None) -> bool:
        # random() near 1, not near 0, means yes: Hypothesis' simplest random stream is all
        # zeros, which then gives the canonical encoding instead of endless variations.
        return self.rng is not None and self.rng.random() >= 1 - (self.p if p is None else p)

    def varint(self, value: int, limit: int = MAX_VARINT_BYTES) -> bytes:
        """A varint, now and then with redundant bytes (at most ``limit`` bytes in all)."""
        pad = self.rng.randint(1, 9) if self._maybe(0.15) else 0
        minimal = len(varint(value))
        return varint(value, max(0, min(pad, limit - minimal)))

    def tag(self, field: int, wire: int) -> bytes:
        return self.varint(field << 3 | wire, self.prefix_bytes)

    def ld(self, field: int, payload: bytes) -> bytes:
        return self.tag(field, 2) + self.varint(len(payload), self.prefix_bytes) + payload

    # -- unknown fields

    def unknown(self, known: set, depth: int = 0) -> bytes:
        """One unknown field: any wire type (groups nested), a (field, wire) not in ``known``."""
        rng = self.rng
        while True:
            wire = rng.choice((0, 1, 2, 5, 3) if depth < 3 else (0, 1, 2, 5))
            field = rng.choice((rng.randint(1, 20), rng.randint(1, (1 << 29) - 1)))
            if (field, wire) not in known:
                break
        if wire == 0:
            return self.tag(field, 0) + self.varint(rng.choice((0, 1, 300, -1, rng.getrandbits(64))))
        if wire == 1:
            return self.tag(field, 1) + rng.randbytes(8)
        if wire == 5:
            return self.tag(field, 5) + rng.randbytes(4)
        if wire == 2:
            return self.ld(field, rng.randbytes(rng.randint(0, 12)))
        body = b"".join(self.unknown(set(), depth + 1) for _ in range(rng.randint(0, 3)))
        return self.tag(field, 3) + body + self.tag(field, 4)

    def sprinkle(self, parts: list, known: set) -> list:
        """``parts`` with unknown fields inserted at random places."""
        if self.rng is None:
            return parts
        out = []
        for part in parts + [None]:
            for _ in range(3):
                if not self._maybe(0.2):
                    break
                out.append(self.unknown(known))
            if part is not None:
                out.append(part)
        return out

    def split(self, items: list, max_parts: int = 3) -> list[list]:
        """``items`` cut into 1..max_parts consecutive runs (some maybe empty)."""
        if self.rng is None or not self._maybe():
            return [items]
        cuts = sorted(self.rng.randint(0, len(items)) for _ in range(self.rng.randint(1, max_parts - 1)))
        bounds = [0, *cuts, len(items)]
        return [items[a:b] for a, b in zip(bounds, bounds[1:])]

    # -- lists

    def list_fields(self, kind: str, values) -> list[bytes]:
        """The field-1 occurrences of one BytesList/FloatList/Int64List holding ``values``."""
        rng = self.rng
        if kind == "bytes":
            return [self.ld(1, v) for v in values]
        if kind == "float":
            raw = np.asarray(values, dtype="<f4").tobytes()
            chunks = [raw[i:i + 4] for i in range(0, len(raw), 4)]
            if rng is None:
                return [self.ld(1, raw)] if raw else []
            out = []
            for run in self.split(chunks, 4):
                if run and self._maybe(0.5):
                    out.extend(self.tag(1, 5) + c for c in run)              # unpacked
                elif run or self._maybe(0.1):
                    out.append(self.ld(1, b"".join(run)))                     # packed (maybe empty)
            return out
        ints = [int(v) for v in values]
        if rng is None:
            return [self.ld(1, b"".join(varint(v) for v in ints))] if ints else []
        out = []
        for run in self.split(ints, 4):
            if run and self._maybe(0.5):
                out.extend(self.tag(1, 0) + self.varint(v) for v in run)       # unpacked
            elif run or self._maybe(0.1):
                out.append(self.ld(1, b"".join(self.varint(v) for v in run)))   # packed (maybe empty)
        return out

    def list_message(self, kind: str, values) -> bytes:
        known = {(1, 2), (1, {"bytes": 2, "float": 5, "int64": 0}[kind])}
        parts = self.list_fields(kind, values)
        if self.rng is not None and self._maybe(0.1):
            # field 1 with a wire type the list does not use is an unknown field, skipped
            wrong = [w for w in (0, 1, 5) if (1, w) not in known]
            w = self.rng.choice(wrong)
            parts.insert(self.rng.randint(0, len(parts)),
                         self.tag(1, w) + (self.varint(7) if w == 0 else self.rng.randbytes(8 if w == 1 else 4)))
        return b"".join(self.sprinkle(parts, known))

    # -- features

    def random_values(self, kind: str):
        rng = self.rng
        n = rng.randint(0, 3)
        if kind == "bytes":
            return [rng.randbytes(rng.randint(0, 4)) for _ in range(n)]
        if kind == "float":
            return np.array([rng.uniform(-9, 9) for _ in range(n)], np.float32)
        return [rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(n)]

    def feature_message(self, kind, values) -> list[bytes]:
        """The fields of a Feature message (a list, so callers may split it in parts)."""
        kind_fields = []
        if kind is not None:
            if self._maybe():
                # earlier kinds, overridden: the run of the final kind starts after the last other kind
                decoys = [self.rng.choice(list(KIND_FIELDS)) for _ in range(self.rng.randint(1, 3))]
                if decoys[-1] == kind:
                    decoys.append(self.rng.choice([k for k in KIND_FIELDS if k != kind]))
                kind_fields += [self.ld(KIND_FIELDS[k], self.list_message(k, self.random_values(k)))
                                for k in decoys]
            runs = self.split(list(values), 3)
            kind_fields += [self.ld(KIND_FIELDS[kind], self.list_message(kind, run)) for run in runs]
        known = {(1, 2), (2, 2), (3, 2)}
        return self.sprinkle(kind_fields, known)

    def entry(self, name: str, kind, values) -> bytes:
        """A map entry: key [1], Feature [2] (maybe in parts), unknown fields, in a valid order."""
        key = name.encode("utf-8")
        feature = self.feature_message(kind, values)
        if self.rng is None:
            return self.ld(1, key) + self.ld(2, b"".join(feature))
        value_fields = [self.ld(2, b"".join(part)) for part in self.split(feature)]
        if not feature and self._maybe():
            value_fields = []                          # no value at all: a Feature with no kind
        for _ in range(2 if self._maybe(0.1) else 0):
            value_fields.insert(self.rng.randint(0, len(value_fields)), self.ld(2, b""))
        key_fields = [] if key == b"" and self._maybe(0.5) else [self.ld(1, key)]
        for _ in range(self.rng.randint(1, 2) if key_fields and self._maybe(0.15) else 0):
            decoy = "".join(self.rng.choice("ab\u00e9\u65e5\U0001d11e") for _ in range(self.rng.randint(0, 3)))
            key_fields.insert(0, self.ld(1, decoy.encode("utf-8")))                # earlier keys lose
        # Merge keys and values in a random order, each keeping its own order.
        merged = _interleave(self.rng, key_fields, value_fields)
        return b"".join(self.sprinkle(merged, {(1, 2), (2, 2)}) if self.entry_unknowns else merged)

    def decoy_entry(self, name: str) -> bytes:
        """An entry for ``name`` that a later entry replaces (a repeated map key)."""
        kind = self.rng.choice([None, *KIND_FIELDS])
        return self.entry(name, kind, [] if kind is None else self.random_values(kind))

    # -- examples

    def example(self, example: dict) -> bytes:
        """An Example holding ``example`` (``{name: (kind, values)}``)."""
        if self.rng is None:
            entries = [self.ld(1, self.entry(n, k, v)) for n, (k, v) in example.items()]
            return self.ld(1, b"".join(entries)) if entries else b""
        per_name = []
        for name, (kind, values) in example.items():
            seq = [self.ld(1, self.decoy_entry(name)) for _ in range(self.rng.randint(1, 2))] if self._maybe() else []
            per_name.append(seq + [self.ld(1, self.entry(name, kind, values))])
        entries = _interleave(self.rng, *per_name)
        parts = [self.ld(1, b"".join(self.sprinkle(part, {(1, 2)}))) for part in self.split(entries)]
        if not entries and self._maybe(0.5):
            parts = []
        return b"".join(self.sprinkle(parts, {(1, 2)}))


def _interleave(rng, *seqs):
    """A random merge of the sequences, each keeping its order."""
    pools = [list(s) for s in seqs if s]
    out = []
    while pools:
        i = rng.randrange(len(pools))
        out.append(pools[i].pop(0))
        if not pools[i]:
            pools.pop(i)
    return out


def encode(example: dict, rng: random.Random | None = None, p: float = 0.3, **options) -> bytes:
    """``example`` (``{name: (kind, values)}``) encoded canonically, or at random with ``rng``.

    ``options`` go to :class:`Encoder` (``prefix_bytes``, ``entry_unknowns``).
    """
    return Encoder(rng, p, **options).example(example)


# ---------------------------------------------------------------------------
# TFRecord framing


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data, crc: int = 0) -> int:
    """CRC32C (Castagnoli), bit by bit through a table, extending ``crc``."""
    c = crc ^ 0xFFFFFFFF
    for b in bytes(data):
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc32c(data) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One TFRecord frame: length, masked CRC of the length, data, masked CRC of the data."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc32c(length)) + data + struct.pack("<I", masked_crc32c(data))
