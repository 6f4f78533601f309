# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""tf.train.Example decoding over the protobuf wire format, without protobuf.

Messages (field numbers in brackets)::

    Example  { Features features [1] }
    Features { map<string, Feature> feature [1] }   # entries: key [1], value [2]
    Feature  { oneof { BytesList [1], FloatList [2], Int64List [3] } }
    BytesList { repeated bytes value [1] }
    FloatList { repeated float value [1] }          # packed (wire 2) or not (wire 5)
    Int64List { repeated int64 value [1] }          # packed (wire 2) or not (wire 0)

Protobuf merge rules are followed exactly: a message split in parts is merged,
a repeated map key keeps its last entry, a oneof keeps its last kind, and
packed and unpacked values of one list are concatenated (TensorFlow keeps only
the packed run there; the specification says concatenate).  Unknown fields are
skipped.  A Feature with no kind set, or an empty list of another kind than the
spec's, holds no value and reads as an empty list.  Every length is checked against the end of its enclosing message
before it is used: no read ever leaves the record.

Bounds: every pointer below moves only after a check against ``end`` that is
visible on the line before it; that is why bounds checking is off.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int8_t, int16_t, int32_t, int64_t
from libc.string cimport memcpy, memcmp, memset

import numpy as np
cimport numpy as cnp

from infeed.errors import DecodeError
from infeed.example.halves cimport bfloat16_bits, float16_bits
from infeed.tfrecord._tfrecord cimport Frames

cnp.import_array()

# Kinds, as the Feature oneof numbers them (0: no kind set).
#: Records at least this long are decoded with the GIL released (below, releasing costs more than it frees).
DEF NOGIL_RECORD = 65536
DEF KIND_NONE = 0
DEF KIND_BYTES = 1
DEF KIND_FLOAT = 2
DEF KIND_INT64 = 3

# Output element types: float32 and the narrower floats read float_list, the integers int64_list.
DEF OUT_F32 = 0
DEF OUT_I64 = 1
DEF OUT_I32 = 2
DEF OUT_U8 = 3
DEF OUT_BF16 = 4
DEF OUT_F16 = 5
DEF OUT_I8 = 6
DEF OUT_I16 = 7
DEF OUT_U16 = 8
DEF OUT_BOOL = 9          # int64_list values 0 and 1 (TFDS's bools), one byte each

# Layouts.
DEF LAYOUT_FIXED = 0
DEF LAYOUT_VARLEN = 1
DEF LAYOUT_BYTES = 2
DEF LAYOUT_SPAN = 3        # one bytes value, left where it lies: (offset in the record, length) as 2 int64

# Errors.
DEF OK = 0
DEF E_MALFORMED = 1
DEF E_MISSING = 2
DEF E_KIND = 3
DEF E_COUNT = 4
DEF E_TOO_LONG = 5
DEF E_RANGE = 6

DEF MAX_GROUP_DEPTH = 64

KIND_NAMES = {KIND_NONE: "no kind", KIND_BYTES: "bytes", KIND_FLOAT: "float", KIND_INT64: "int64"}


cdef struct Error:
    int code
    int feature            # index in the plan, -1 outside any feature
    int64_t offset         # byte offset inside the record
    int64_t expected
    int64_t found
    int found_kind
    const char *what       # for E_MALFORMED: what was wrong


cdef struct Cursor:
    const uint8_t *p
    const uint8_t *end


# ---------------------------------------------------------------------------
# Wire-format primitives.  Each returns 0 on success, -1 on malformed input and
# then leaves a description in err.what.

cdef inline int read_varint(Cursor *c, uint64_t *out, Error *err) noexcept nogil:
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef uint8_t b
    if c.p < c.end and c.p[0] < 0x80:      # tags, small lengths and small ints: one byte
        out[0] = c.p[0]
        c.p += 1
        return 0
    while True:
        if c.p >= c.end:
            err.what = "varint runs past the end of its message"
            return -1
        b = c.p[0]
        c.p += 1
        if shift == 63 and b > 1:
            err.what = "varint longer than 64 bits"
            return -1
        v |= (<uint64_t>(b & 0x7f)) << shift
        if b < 0x80:
            out[0] = v
            return 0
        shift += 7


cdef inline int read_tag(Cursor *c, uint32_t *field, int *wire, Error *err) noexcept nogil:
    cdef uint64_t tag
    if read_varint(c, &tag, err) < 0:
        return -1
    if tag > 0xffffffffu or (tag >> 3) == 0:
        err.what = "invalid field tag"
        return -1
    field[0] = <uint32_t>(tag >> 3)
    wire[0] = <int>(tag & 7)
    return 0


cdef inline int read_len(Cursor *c, Cursor *sub, Error *err) noexcept nogil:
    """Reads a length prefix and the bytes it covers, checked against c.end."""
    cdef uint64_t n
    if read_varint(c, &n, err) < 0:
        return -1
    if n > <uint64_t>(c.end - c.p):
        err.what = "length runs past the end of its message"
        return -1
    sub.p = c.p
    sub.end = c.p + n
    c.p += n
    return 0


cdef int skip_field(Cursor *c, uint32_t field, int wire, Error *err) noexcept nogil:
    cdef uint64_t v
    cdef Cursor sub
    cdef uint32_t f
    cdef int w
    cdef int depth
    cdef uint32_t open_fields[MAX_GROUP_DEPTH]
    if wire == 0:
        return read_varint(c, &v, err)
    if wire == 1:
        if c.end - c.p < 8:
            err.what = "fixed64 runs past the end of its message"
            return -1
        c.p += 8
        return 0
    if wire == 2:
        return read_len(c, &sub, err)
    if wire == 5:
        if c.end - c.p < 4:
            err.what = "fixed32 runs past the end of its message"
            return -1
        c.p += 4
        return 0
    if wire == 3:  # a group: skip to its matching end tag, each nested end matching its start
        depth = 1
        open_fields[0] = field
        while True:
            if c.p >= c.end:
                err.what = "group without its end tag"
                return -1
            if read_tag(c, &f, &w, err) < 0:
                return -1
            if w == 3:
                if depth == MAX_GROUP_DEPTH:
                    err.what = "groups nested too deep"
                    return -1
                open_fields[depth] = f
                depth += 1
            elif w == 4:
                depth -= 1
                if f != open_fields[depth]:
                    err.what = "group end tag does not match its start"
                    return -1
                if depth == 0:
                    return 0
            elif skip_field(c, f, w, err) < 0:
                return -1
    if wire == 4:
        err.what = "group end tag without a start"
        return -1
    err.what = "invalid wire type"
    return -1


# ---------------------------------------------------------------------------
# Feature values.  A feature's value is given as its map *entry* (key and one
# or more value fields, which protobuf merges), so a Feature split in parts is
# read exactly as its merge.  scan_kind finds the oneof's final kind and the
# ordinal of the first kind field of the final run; later passes read only that
# run.

cdef inline int next_value(Cursor *entry, Cursor *value, Error *err) noexcept nogil:
    """Advances to the next value field [2] of a map entry: 1 found, 0 none left, -1 error."""
    cdef uint32_t f
    cdef int w
    while entry.p < entry.end:
        if read_tag(entry, &f, &w, err) < 0:
            return -1
        if f == 2 and w == 2:
            if read_len(entry, value, err) < 0:
                return -1
            return 1
        if skip_field(entry, f, w, err) < 0:
            return -1
    return 0


cdef int scan_kind(Cursor entry, int *kind, int *run_start, Error *err) noexcept nogil:
    cdef Cursor value, sub
    cdef uint32_t f
    cdef int w, r, ordinal = 0
    kind[0] = KIND_NONE
    run_start[0] = 0
    while True:
        r = next_value(&entry, &value, err)
        if r <= 0:
            return r
        while value.p < value.end:
            if read_tag(&value, &f, &w, err) < 0:
                return -1
            if 1 <= f <= 3 and w == 2:
                if read_len(&value, &sub, err) < 0:
                    return -1
                if <int>f != kind[0]:
                    kind[0] = <int>f
                    run_start[0] = ordinal
                ordinal += 1
            elif skip_field(&value, f, w, err) < 0:
                return -1


cdef struct Sink:
    # Where values go: up to `cap` elements of `out_type` at `dst`.
    char *dst
    int64_t cap
    int out_type
    int64_t count          # values seen (may exceed cap)
    int64_t range_value    # for E_RANGE


cdef inline int put_small_int(Sink *s, int64_t v) noexcept nogil:
    """Stores ``v`` as the sink's 8- or 16-bit integer type or bool: -1 (``range_value`` set) when it does not fit."""
    if s.out_type == OUT_BOOL and 0 <= v <= 1:
        (<uint8_t *>s.dst)[s.count] = <uint8_t>v
    elif s.out_type == OUT_U8 and 0 <= v <= 255:
        (<uint8_t *>s.dst)[s.count] = <uint8_t>v
    elif s.out_type == OUT_I8 and -128 <= v <= 127:
        (<int8_t *>s.dst)[s.count] = <int8_t>v
    elif s.out_type == OUT_U16 and 0 <= v <= 65535:
        (<uint16_t *>s.dst)[s.count] = <uint16_t>v
    elif s.out_type == OUT_I16 and -32768 <= v <= 32767:
        (<int16_t *>s.dst)[s.count] = <int16_t>v
    else:
        s.range_value = v
        return -1
    return 0


cdef inline int put_i64(Sink *s, int64_t v) noexcept nogil:
    if s.count < s.cap:
        if s.out_type == OUT_I64:
            (<int64_t *>s.dst)[s.count] = v
        elif s.out_type == OUT_I32:
            if v < -2147483648 or v > 2147483647:
                s.range_value = v
                return -1
            (<int32_t *>s.dst)[s.count] = <int32_t>v
        elif put_small_int(s, v) < 0:
            return -1
    s.count += 1
    return 0


cdef inline void put_floats(char *dst, int64_t at, int out_type, const uint8_t *src, int64_t n) noexcept nogil:
    """Stores ``n`` little-endian float32 values from ``src`` as elements ``at...`` of ``dst``, an array of
    ``out_type`` (float32: copied; bfloat16, float16: converted)."""
    cdef int64_t i
    cdef uint32_t x
    cdef uint16_t *half = <uint16_t *>dst + at
    if out_type == OUT_F32:
        memcpy(dst + 4 * at, src, 4 * n)
    elif out_type == OUT_BF16:
        for i in range(n):
            memcpy(&x, src + 4 * i, 4)
            half[i] = bfloat16_bits(x)
    else:
        for i in range(n):
            memcpy(&x, src + 4 * i, 4)
            half[i] = float16_bits(x)


cdef struct RunWalk:
    # Walks the list messages of a Feature's final oneof run (see scan_kind).
    Cursor entry           # what is left of the map entry
    Cursor value           # what is left of the current value (Feature) field
    bint in_value
    int ordinal            # kind fields seen so far
    int run_start          # ordinal of the first field of the final run


cdef inline RunWalk start_run(Cursor entry, int run_start) noexcept nogil:
    cdef RunWalk wk
    wk.entry = entry
    wk.value = entry       # unused until in_value; set so no field is left undefined
    wk.in_value = False
    wk.ordinal = 0
    wk.run_start = run_start
    return wk


cdef int next_list(RunWalk *wk, Cursor *lst, Error *err) noexcept nogil:
    """Advances to the next list message of the final run: 1 found, 0 none left, -1 error."""
    cdef uint32_t f
    cdef int w, r
    while True:
        if not wk.in_value:
            r = next_value(&wk.entry, &wk.value, err)
            if r <= 0:
                return r
            wk.in_value = True
        while wk.value.p < wk.value.end:
            if read_tag(&wk.value, &f, &w, err) < 0:
                return -1
            if not (1 <= f <= 3 and w == 2):
                if skip_field(&wk.value, f, w, err) < 0:
                    return -1
                continue
            if read_len(&wk.value, lst, err) < 0:
                return -1
            wk.ordinal += 1
            if wk.ordinal - 1 >= wk.run_start:
                return 1
        wk.in_value = False


cdef int fill_numbers(Cursor entry, int kind, int run_start, Sink *s, Error *err) noexcept nogil:
    """Writes the float or int64 values of the final run into the sink; counts them all."""
    cdef RunWalk wk = start_run(entry, run_start)
    cdef Cursor lst, packed
    cdef uint32_t lf
    cdef int lw, r
    cdef uint64_t v
    cdef int64_t n, room
    while True:
        r = next_list(&wk, &lst, err)
        if r <= 0:
            return r
        while lst.p < lst.end:
            if read_tag(&lst, &lf, &lw, err) < 0:
                return -1
            if lf != 1:
                if skip_field(&lst, lf, lw, err) < 0:
                    return -1
            elif kind == KIND_FLOAT and lw == 2:
                if read_len(&lst, &packed, err) < 0:
                    return -1
                n = packed.end - packed.p
                if n % 4 != 0:
                    err.what = "packed floats not a multiple of 4 bytes"
                    return -1
                n //= 4
                room = s.cap - s.count
                if room > n:
                    room = n
                if room > 0:
                    put_floats(s.dst, s.count, s.out_type, packed.p, room)
                s.count += n
            elif kind == KIND_FLOAT and lw == 5:
                if lst.end - lst.p < 4:
                    err.what = "fixed32 runs past the end of its message"
                    return -1
                if s.count < s.cap:
                    put_floats(s.dst, s.count, s.out_type, lst.p, 1)
                s.count += 1
                lst.p += 4
            elif kind == KIND_INT64 and lw == 2:
                if read_len(&lst, &packed, err) < 0:
                    return -1
                while packed.p < packed.end:
                    if read_varint(&packed, &v, err) < 0:
                        return -1
                    if put_i64(s, <int64_t>v) < 0:
                        return -2
            elif kind == KIND_INT64 and lw == 0:
                if read_varint(&lst, &v, err) < 0:
                    return -1
                if put_i64(s, <int64_t>v) < 0:
                    return -2
            elif skip_field(&lst, lf, lw, err) < 0:
                return -1


cdef struct BytesWalk:
    RunWalk run
    Cursor lst             # what is left of the current BytesList
    bint in_list


cdef int next_bytes(BytesWalk *wk, Cursor *item, Error *err) noexcept nogil:
    """Advances to the next bytes value of the final run: 1 found, 0 none left, -1 error."""
    cdef uint32_t f
    cdef int w, r
    while True:
        if not wk.in_list:
            r = next_list(&wk.run, &wk.lst, err)
            if r <= 0:
                return r
            wk.in_list = True
        while wk.lst.p < wk.lst.end:
            if read_tag(&wk.lst, &f, &w, err) < 0:
                return -1
            if f == 1 and w == 2:
                return -1 if read_len(&wk.lst, item, err) < 0 else 1
            if skip_field(&wk.lst, f, w, err) < 0:
                return -1
        wk.in_list = False


cdef int each_bytes(Cursor entry, int run_start, Cursor *first, int64_t *count, Error *err) noexcept nogil:
    """Counts the bytes values of the final run and finds the first one."""
    cdef BytesWalk wk
    cdef Cursor item
    cdef int r
    wk.run = start_run(entry, run_start)
    wk.lst = entry
    wk.in_list = False
    count[0] = 0
    while True:
        r = next_bytes(&wk, &item, err)
        if r <= 0:
            return r
        if count[0] == 0:
            first[0] = item
        count[0] += 1


# ---------------------------------------------------------------------------
# Records: find each map entry and hand (key, entry) to a callback-free loop.

cdef struct EntryWalk:
    Cursor example          # what is left of the Example
    Cursor features         # what is left of the current Features part
    bint in_features


cdef int next_entry(EntryWalk *wk, Cursor *key, Cursor *entry, Error *err) noexcept nogil:
    """Advances to the next map entry of the record: 1 found, 0 none left, -1 error."""
    cdef uint32_t f
    cdef int w
    cdef Cursor e
    while True:
        if wk.in_features:
            while wk.features.p < wk.features.end:
                if read_tag(&wk.features, &f, &w, err) < 0:
                    return -1
                if f == 1 and w == 2:
                    if read_len(&wk.features, &e, err) < 0:
                        return -1
                    entry[0] = e
                    key.p = e.p
                    key.end = e.p
                    # the key is the last key field [1] of the entry
                    while e.p < e.end:
                        if read_tag(&e, &f, &w, err) < 0:
                            return -1
                        if f == 1 and w == 2:
                            if read_len(&e, key, err) < 0:
                                return -1
                        elif skip_field(&e, f, w, err) < 0:
                            return -1
                    return 1
                if skip_field(&wk.features, f, w, err) < 0:
                    return -1
            wk.in_features = False
        if wk.example.p >= wk.example.end:
            return 0
        if read_tag(&wk.example, &f, &w, err) < 0:
            return -1
        if f == 1 and w == 2:
            if read_len(&wk.example, &wk.features, err) < 0:
                return -1
            wk.in_features = True
        elif skip_field(&wk.example, f, w, err) < 0:
            return -1


# ---------------------------------------------------------------------------
# The compiled plan for a spec, and the batch decoder.

cdef struct Plan:
    const char *key
    Py_ssize_t key_len
    int kind               # the Feature kind the spec wants
    int layout
    int out_type
    int64_t count          # FixedLen: values per row; VarLen: max_len; Bytes: max_bytes
    bint truncate
    char *values           # row 0 of the values array
    Py_ssize_t row_bytes   # bytes per row of the values array
    int32_t *lengths       # VarLen and Bytes: one per row
    const char *fill       # FixedLen: default row or NULL; VarLen: a row of pad values
    int64_t fill_len       # Bytes: length of the default, -1 for none


cdef inline uint32_t fnv1a(const uint8_t *p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t h = 2166136261u
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ p[i]) * 16777619u
    return h


cdef inline bint take_field(Cursor *c, uint8_t tag, Cursor *sub) noexcept nogil:
    """Reads one length-delimited field with this exact one-byte tag, or returns False."""
    cdef Error ignored
    if c.p >= c.end or c.p[0] != tag:
        return False
    c.p += 1
    return read_len(c, sub, &ignored) == 0


cdef inline void put_span(char *dst, const uint8_t *rec, Cursor value) noexcept nogil:
    (<int64_t *>dst)[0] = value.p - rec
    (<int64_t *>dst)[1] = value.end - value.p


cdef bint fast_row(Plan *pl, Cursor entry, char *dst, Py_ssize_t row, const uint8_t *rec) noexcept nogil:
    """Decodes a feature written the way TensorFlow writes it, in one pass.

    Canonical form: ``key [1] | value [2] { list [kind] { value [1] packed } }``,
    each field once and each message ending where its parent does.  Returns
    False, having written nothing the general path will not rewrite, for
    anything else (other encodings, errors, truncation): the general path then
    decodes it and reports any error.
    """
    cdef Cursor key, value, lst, payload
    cdef int kind
    cdef int64_t n, k
    cdef Sink sink
    cdef uint64_t v
    cdef Error ignored
    cdef Py_ssize_t item
    cdef bint empty
    if not take_field(&entry, 0x0A, &key) or not take_field(&entry, 0x12, &value) or entry.p != entry.end:
        return False
    if value.p == value.end or value.p[0] != (pl.kind << 3 | 2):
        return False
    if not take_field(&value, <uint8_t>(pl.kind << 3 | 2), &lst) or value.p != value.end:
        return False
    empty = lst.p == lst.end
    if empty:
        payload.p = payload.end = lst.p
    elif not take_field(&lst, 0x0A, &payload) or lst.p != lst.end:
        return False
    kind = pl.kind
    if pl.layout == LAYOUT_SPAN:
        if empty:
            return False
        put_span(dst, rec, payload)
        return True
    if pl.layout == LAYOUT_BYTES:
        n = payload.end - payload.p
        if empty or n > pl.count:                      # no value at all, or too long: general path
            return False
        memcpy(dst, payload.p, n)
        memset(dst + n, 0, pl.row_bytes - n)
        pl.lengths[row] = <int32_t>n
        return True
    if kind == KIND_FLOAT:
        n = payload.end - payload.p
        if n % 4 != 0:
            return False
        n //= 4
        if (pl.layout == LAYOUT_FIXED and n != pl.count) or n > pl.count:
            return False
        put_floats(dst, 0, pl.out_type, payload.p, n)
    else:
        sink.dst = dst
        sink.cap = pl.count
        sink.out_type = pl.out_type
        sink.count = 0
        while payload.p < payload.end:
            if read_varint(&payload, &v, &ignored) < 0 or put_i64(&sink, <int64_t>v) < 0:
                return False
        n = sink.count
        if (pl.layout == LAYOUT_FIXED and n != pl.count) or n > pl.count:
            return False
    if pl.layout == LAYOUT_VARLEN:
        item = pl.row_bytes // pl.count if pl.count else 0
        memcpy(dst + n * item, pl.fill + n * item, pl.row_bytes - n * item)
        pl.lengths[row] = <int32_t>n
    return True


cdef int decode_row(const uint8_t *rec, Py_ssize_t n, Plan *plan, int nfeat, const int *table,
                    uint32_t mask, Cursor *found, Py_ssize_t row, Error *err) noexcept nogil:
    cdef EntryWalk wk
    cdef Cursor key, entry, first
    cdef int r, i, slot, kind, run_start
    cdef uint32_t h
    cdef Plan *pl
    cdef Sink sink
    cdef int64_t count, stored
    cdef char *dst
    wk.example.p = rec
    wk.example.end = rec + n
    wk.in_features = False
    for i in range(nfeat):
        found[i].p = NULL
    while True:
        r = next_entry(&wk, &key, &entry, err)
        if r < 0:
            err.code = E_MALFORMED
            err.offset = wk.example.p - rec
            return -1
        if r == 0:
            break
        h = fnv1a(key.p, key.end - key.p) & mask
        while True:
            slot = table[h]
            if slot < 0:
                break
            if plan[slot].key_len == key.end - key.p and \
                    memcmp(plan[slot].key, key.p, plan[slot].key_len) == 0:
                found[slot] = entry        # repeated key: the last entry wins
                break
            h = (h + 1) & mask
    for i in range(nfeat):
        pl = &plan[i]
        err.feature = i
        dst = pl.values + row * pl.row_bytes
        if found[i].p == NULL:
            if pl.layout == LAYOUT_VARLEN:
                memcpy(dst, pl.fill, pl.row_bytes)
                pl.lengths[row] = 0
                continue
            if pl.layout == LAYOUT_FIXED and pl.fill != NULL:
                memcpy(dst, pl.fill, pl.row_bytes)
                continue
            if pl.layout == LAYOUT_BYTES and pl.fill_len >= 0:
                memcpy(dst, pl.fill, pl.row_bytes)
                pl.lengths[row] = <int32_t>pl.fill_len
                continue
            err.code = E_MISSING
            err.offset = -1
            return -1
        if fast_row(pl, found[i], dst, row, rec):
            continue
        err.offset = found[i].p - rec
        if scan_kind(found[i], &kind, &run_start, err) < 0:
            err.code = E_MALFORMED
            return -1
        if kind != pl.kind and kind != KIND_NONE:
            # An empty list of another kind holds no value to misread: it is an empty list.
            if kind == KIND_BYTES:
                r = each_bytes(found[i], run_start, &first, &count, err)
            else:
                sink.dst = NULL
                sink.cap = 0
                sink.count = 0
                r = fill_numbers(found[i], kind, run_start, &sink, err)
                count = sink.count
            if r < 0:
                err.code = E_MALFORMED
                return -1
            if count != 0:
                err.code = E_KIND
                err.found_kind = kind
                return -1
            kind = KIND_NONE
        if pl.layout == LAYOUT_BYTES or pl.layout == LAYOUT_SPAN:
            count = 0
            if kind != KIND_NONE and each_bytes(found[i], run_start, &first, &count, err) < 0:
                err.code = E_MALFORMED
                return -1
            if count != 1:
                err.code = E_COUNT
                err.expected = 1
                err.found = count
                return -1
            if pl.layout == LAYOUT_SPAN:
                put_span(dst, rec, first)
                continue
            stored = first.end - first.p
            if stored > pl.count:
                if not pl.truncate:
                    err.code = E_TOO_LONG
                    err.expected = pl.count
                    err.found = stored
                    return -1
                stored = pl.count
            memcpy(dst, first.p, stored)
            memset(dst + stored, 0, pl.row_bytes - stored)
            pl.lengths[row] = <int32_t>stored
            continue
        sink.dst = dst
        sink.cap = pl.count
        sink.out_type = pl.out_type
        sink.count = 0
        if kind != KIND_NONE:
            r = fill_numbers(found[i], kind, run_start, &sink, err)
            if r == -1:
                err.code = E_MALFORMED
                return -1
            if r == -2:
                err.code = E_RANGE
                err.found = sink.range_value
                return -1
        if pl.layout == LAYOUT_FIXED:
            if sink.count != pl.count:
                err.code = E_COUNT
                err.expected = pl.count
                err.found = sink.count
                return -1
        else:
            if sink.count > pl.count:
                if not pl.truncate:
                    err.code = E_TOO_LONG
                    err.expected = pl.count
                    err.found = sink.count
                    return -1
                sink.count = pl.count
            stored = sink.count * (pl.row_bytes // pl.count) if pl.count else 0
            memcpy(dst + stored, pl.fill + stored, pl.row_bytes - stored)
            pl.lengths[row] = <int32_t>sink.count
    return 0


cdef dict _OUT_TYPES = {"float32": OUT_F32, "int64": OUT_I64, "int32": OUT_I32, "uint8": OUT_U8,
                        "bfloat16": OUT_BF16, "float16": OUT_F16, "int8": OUT_I8, "int16": OUT_I16, "uint16": OUT_U16,
                        "bool": OUT_BOOL}
#: Bytes per element of each output type.
cdef dict _ITEM_BYTES = {OUT_F32: 4, OUT_I64: 8, OUT_I32: 4, OUT_U8: 1, OUT_BF16: 2, OUT_F16: 2, OUT_I8: 1, OUT_I16: 2,
                         OUT_U16: 2, OUT_BOOL: 1}
cdef dict _LAYOUTS = {"fixed": LAYOUT_FIXED, "varlen": LAYOUT_VARLEN, "bytes": LAYOUT_BYTES, "span": LAYOUT_SPAN}
cdef dict _KINDS = {"bytes": KIND_BYTES, "float": KIND_FLOAT, "int64": KIND_INT64}


cdef class CompiledSpec:
    """A feature spec compiled to a decoding plan (built by infeed.example.codec.ExampleParser).

    ``features`` is a list of ``(name, kind, layout, dtype, count, truncate,
    fill, fill_len)``: ``fill`` is one row of bytes (the FixedLen default, the
    VarLen pad row, the Bytes default) or None, ``fill_len`` the length of a
    Bytes default (-1: none). A ``"span"`` layout (bytes kind, int64, count 2)
    stores where a feature's one bytes value lies in its record, ``(offset,
    length)``, for a later stage (images) to read it there.  ``decode_into`` fills preallocated arrays, row by
    row, without the GIL.
    """

    cdef Plan *plan
    cdef int nfeat
    cdef int *table
    cdef uint32_t mask
    cdef Cursor *found
    cdef list names
    cdef list keys
    cdef list layout_info
    cdef list fills

    def __cinit__(self, list features):
        cdef int i, size
        cdef uint32_t h
        self.nfeat = len(features)
        self.names = []
        self.keys = []
        self.layout_info = []
        self.fills = []
        size = 8
        while size < 4 * max(self.nfeat, 1):
            size *= 2
        self.mask = size - 1
        self.plan = <Plan *>PyMem_Malloc(sizeof(Plan) * max(self.nfeat, 1))
        self.table = <int *>PyMem_Malloc(sizeof(int) * size)
        self.found = <Cursor *>PyMem_Malloc(sizeof(Cursor) * max(self.nfeat, 1))
        if self.plan == NULL or self.table == NULL or self.found == NULL:
            raise MemoryError()
        memset(self.plan, 0, sizeof(Plan) * max(self.nfeat, 1))
        for i in range(size):
            self.table[i] = -1
        for i, (name, kind, layout, dtype, count, truncate, fill, fill_len) in enumerate(features):
            key = name.encode("utf-8")
            self.names.append(name)
            self.keys.append(key)
            self.layout_info.append((kind, layout, dtype))
            self.plan[i].key = PyBytes_AS_STRING(key)
            self.plan[i].key_len = len(key)
            self.plan[i].kind = _KINDS[kind]
            self.plan[i].layout = _LAYOUTS[layout]
            self.plan[i].out_type = _OUT_TYPES[dtype]
            self.plan[i].count = count
            self.plan[i].truncate = truncate
            self.plan[i].row_bytes = self._row_bytes(i)
            if fill is not None and len(fill) != self.plan[i].row_bytes:
                raise ValueError(f"fill row for {name!r} has {len(fill)} bytes, not {self.plan[i].row_bytes}")
            self.fills.append(fill)
            self.plan[i].fill = PyBytes_AS_STRING(fill) if fill is not None else NULL
            self.plan[i].fill_len = fill_len
            h = fnv1a(<const uint8_t *>self.plan[i].key, self.plan[i].key_len) & self.mask
            while self.table[h] >= 0:
                h = (h + 1) & self.mask
            self.table[h] = i

    def __dealloc__(self):
        PyMem_Free(self.plan)
        PyMem_Free(self.table)
        PyMem_Free(self.found)

    def decode_into(self, records, list values, list lengths, Py_ssize_t row0=0,
                    Py_ssize_t index_base=0):
        """Decodes ``records`` into rows ``row0...`` of ``values[i]`` (C-contiguous arrays).

        ``lengths[i]`` is an int32 array (VarLen, Bytes) or None.  Raises
        DecodeError naming the feature and ``index_base + i``.
        """
        records = tuple(records)     # the pointers below must outlive any change to the caller's list
        cdef Py_ssize_t nrec = len(records)
        cdef Py_ssize_t i, r
        cdef Error err
        cdef int rc = 0
        cdef const uint8_t **ptrs
        cdef Py_ssize_t *sizes
        cdef Py_ssize_t failed = -1
        cdef Py_buffer *views
        cdef int nviews = 0
        self._bind(values, lengths, row0, nrec)
        ptrs = <const uint8_t **>PyMem_Malloc(sizeof(void *) * max(nrec, 1))
        sizes = <Py_ssize_t *>PyMem_Malloc(sizeof(Py_ssize_t) * max(nrec, 1))
        views = <Py_buffer *>PyMem_Malloc(sizeof(Py_buffer) * max(nrec, 1))
        if ptrs == NULL or sizes == NULL or views == NULL:
            PyMem_Free(ptrs); PyMem_Free(sizes); PyMem_Free(views)
            raise MemoryError()
        try:
            for r in range(nrec):
                rec = records[r]
                if type(rec) is bytes:
                    ptrs[r] = <const uint8_t *>PyBytes_AS_STRING(rec)
                    sizes[r] = PyBytes_GET_SIZE(rec)
                else:
                    try:
                        PyObject_GetBuffer(rec, &views[nviews], PyBUF_SIMPLE)
                    except TypeError:
                        raise TypeError(f"records[{r}] must be a bytes-like serialized Example, "
                                        f"got {type(rec).__name__}") from None
                    ptrs[r] = <const uint8_t *>views[nviews].buf
                    sizes[r] = views[nviews].len
                    nviews += 1
            with nogil:
                for r in range(nrec):
                    err.code = OK
                    err.feature = -1
                    err.what = NULL
                    rc = decode_row(ptrs[r], sizes[r], self.plan, self.nfeat, self.table, self.mask,
                                    self.found, row0 + r, &err)
                    if rc < 0:
                        failed = r
                        break
        finally:
            for i in range(nviews):
                PyBuffer_Release(&views[i])
            PyMem_Free(ptrs)
            PyMem_Free(sizes)
            PyMem_Free(views)
        if failed >= 0:
            raise self._error(&err, index_base + failed, records[failed])

    def decode_from(self, Frames reader not None, Py_ssize_t n, list values, list lengths, Py_ssize_t row0=0,
                    Py_ssize_t index_base=0):
        """Reads up to ``n`` records from ``reader`` (a ``RecordReader``, or ``IndexedFrames`` over reads by an
        index; both CRCs checked) and decodes each where it lies in the reader's buffer, into rows ``row0...``:
        no bytes object, no copy of the record.

        Returns ``(records decoded, their bytes)``; fewer than ``n`` only at the end of the stream.
        """
        cdef Py_ssize_t r = 0, size = 0, nbytes = 0
        cdef const uint8_t *data
        cdef Error err
        cdef int rc = 0
        self._bind(values, lengths, row0, n)
        while r < n and reader.next_frame(True, &data, &size):
            err.code = OK
            err.feature = -1
            err.what = NULL
            if size >= NOGIL_RECORD:
                with nogil:
                    rc = decode_row(data, size, self.plan, self.nfeat, self.table, self.mask, self.found, row0 + r,
                                    &err)
            else:
                rc = decode_row(data, size, self.plan, self.nfeat, self.table, self.mask, self.found, row0 + r, &err)
            if rc < 0:
                raise self._error(&err, index_base + r, PyBytes_FromStringAndSize(<const char *>data, size))
            nbytes += size
            r += 1
        return r, nbytes

    cdef int _bind(self, list values, list lengths, Py_ssize_t row0, Py_ssize_t nrec) except -1:
        """Points the plan at the output arrays after checking that rows ``row0...row0+nrec`` fit."""
        cdef Py_ssize_t i, rows
        cdef cnp.ndarray arr
        if len(values) != self.nfeat or len(lengths) != self.nfeat:
            raise ValueError("decode_into needs one values and lengths entry per feature")
        for i in range(self.nfeat):
            arr = values[i]
            if not cnp.PyArray_IS_C_CONTIGUOUS(arr) or not cnp.PyArray_ISWRITEABLE(arr):
                raise ValueError(f"output for {self.names[i]!r} must be a writable C-contiguous array")
            rows = arr.shape[0] if arr.ndim else 0
            if row0 < 0 or nrec < 0 or row0 + nrec > rows:
                raise ValueError(f"output for {self.names[i]!r} has {rows} rows; "
                                 f"{nrec} records from row {row0} do not fit")
            if cnp.PyArray_NBYTES(arr) != rows * self._row_bytes(i):
                raise ValueError(f"output for {self.names[i]!r} has the wrong row size")
            self.plan[i].values = <char *>cnp.PyArray_DATA(arr)
            if self.plan[i].layout == LAYOUT_VARLEN or self.plan[i].layout == LAYOUT_BYTES:
                arr = lengths[i]
                if arr.dtype != np.int32 or not cnp.PyArray_IS_C_CONTIGUOUS(arr) or arr.shape[0] < row0 + nrec:
                    raise ValueError(f"lengths for {self.names[i]!r} must be int32 with a row per record")
                self.plan[i].lengths = <int32_t *>cnp.PyArray_DATA(arr)
        return 0

    cdef Py_ssize_t _row_bytes(self, int i):
        cdef Plan *pl = &self.plan[i]
        return pl.count * _ITEM_BYTES[pl.out_type]

    cdef object _error(self, Error *err, Py_ssize_t index, object record=None):
        name = self.names[err.feature] if err.feature >= 0 else None
        kind, layout, dtype = self.layout_info[err.feature] if err.feature >= 0 else (None, None, None)
        offset = err.offset if err.offset >= 0 else None
        if err.code == E_MALFORMED:
            what = err.what.decode() if err.what != NULL else "malformed"
            return DecodeError(name, index, "a serialized tf.train.Example",
                               f"invalid protobuf: {what}", offset=offset)
        if err.code == E_MISSING:
            found = "no such feature" + _features_it_has(record, name)
            if layout == "span":
                found += f"; an infeed.Image reads the feature its key= names (here key={name!r})"
            return DecodeError(name, index, f"a {kind} feature (required: it has no default)", found, offset=offset)
        if err.code == E_KIND:
            return DecodeError(name, index, f"{kind} values",
                               f"{KIND_NAMES.get(err.found_kind, err.found_kind)} values", offset=offset)
        if err.code == E_COUNT:
            unit = "value" if err.expected == 1 else "values"
            return DecodeError(name, index, f"{err.expected} {kind} {unit}", err.found, offset=offset)
        if err.code == E_TOO_LONG:
            unit = "bytes" if layout == "bytes" else "values"
            return DecodeError(name, index, f"at most {err.expected} {unit} (pass truncate=True to cut)",
                               err.found, offset=offset)
        if err.code == E_RANGE:
            return DecodeError(name, index, f"values that fit {dtype}", err.found, offset=offset)
        return DecodeError(name, index, "a valid record", f"error code {err.code}", offset=offset)


# ---------------------------------------------------------------------------
# Schema-less decoding, for inspection.

#: The most feature names a missing feature's error lists.
_LISTED_NAMES = 8


def _features_it_has(record, str missing) -> str:
    """``": the record has 'a', 'b' (nearest first)"`` for the error of a feature ``missing`` from ``record``, or
    nothing where the record cannot be read for its names."""
    if record is None:
        return ""
    try:
        names = list(decode_example(record))
    except (DecodeError, TypeError):
        return ""
    if not names:
        return ": the record has no features"
    import difflib

    nearest = sorted(names, key=lambda n: -difflib.SequenceMatcher(None, missing, n).ratio())
    shown = ", ".join(repr(n) for n in nearest[:_LISTED_NAMES])
    more = f" and {len(names) - _LISTED_NAMES} more" if len(names) > _LISTED_NAMES else ""
    return f": the record has {shown}{more} (nearest first)"


def decode_example(record, Py_ssize_t record_index=0):
    """``{name: (kind, values)}`` for one serialized Example.

    kind is ``"bytes"`` (values: list of bytes), ``"float"`` (float32 array),
    ``"int64"`` (int64 array), or ``None`` for a feature with no kind set
    (values: empty list).
    """
    cdef Py_buffer view
    cdef Error err
    cdef EntryWalk wk
    cdef Cursor key, entry, value, lst, item
    cdef int r, kind, run_start, w, lw, ordinal
    cdef uint32_t f, lf
    cdef Sink sink
    cdef cnp.ndarray arr
    err.what = NULL
    try:
        PyObject_GetBuffer(record, &view, PyBUF_SIMPLE)
    except TypeError:
        raise TypeError(f"record must be a bytes-like serialized Example, got {type(record).__name__}") from None
    try:
        base = <const uint8_t *>view.buf
        wk.example.p = <const uint8_t *>view.buf
        wk.example.end = wk.example.p + view.len
        wk.in_features = False
        entries = {}
        while True:
            r = next_entry(&wk, &key, &entry, &err)
            if r < 0:
                raise DecodeError(None, record_index, "a serialized tf.train.Example",
                                  f"invalid protobuf: {err.what.decode()}",
                                  offset=wk.example.p - <const uint8_t *>view.buf)
            if r == 0:
                break
            name_bytes = PyBytes_FromStringAndSize(<const char *>key.p, key.end - key.p)
            try:
                name = name_bytes.decode("utf-8")
            except UnicodeDecodeError:
                shown = repr(name_bytes[:40]) + (f"... ({len(name_bytes)} bytes)" if len(name_bytes) > 40 else "")
                raise DecodeError(None, record_index, "a UTF-8 feature name", shown,
                                  offset=key.p - <const uint8_t *>view.buf) from None
            entries.pop(name, None)            # last wins, in the order of the last entry
            entries[name] = (entry.p - <const uint8_t *>view.buf, entry.end - entry.p)
        out = {}
        for name, (start, size) in entries.items():
            entry.p = <const uint8_t *>view.buf + <Py_ssize_t>start
            entry.end = entry.p + <Py_ssize_t>size
            if scan_kind(entry, &kind, &run_start, &err) < 0:
                raise DecodeError(name, record_index, "a Feature message",
                                  f"invalid protobuf: {err.what.decode()}", offset=start)
            if kind == KIND_NONE:
                out[name] = (None, [])
            elif kind == KIND_BYTES:
                out[name] = ("bytes", _bytes_values(entry, run_start, record_index, name, start))
            else:
                sink.dst = NULL
                sink.cap = 0
                sink.count = 0
                sink.out_type = OUT_F32 if kind == KIND_FLOAT else OUT_I64
                if fill_numbers(entry, kind, run_start, &sink, &err) < 0:
                    raise DecodeError(name, record_index, "a Feature message",
                                      f"invalid protobuf: {err.what.decode()}", offset=start)
                arr = np.empty(sink.count, np.float32 if kind == KIND_FLOAT else np.int64)
                sink.dst = <char *>cnp.PyArray_DATA(arr)
                sink.cap = sink.count
                sink.count = 0
                fill_numbers(entry, kind, run_start, &sink, &err)
                out[name] = ("float" if kind == KIND_FLOAT else "int64", arr)
        return out
    finally:
        PyBuffer_Release(&view)


cdef list _bytes_values(Cursor entry, int run_start, Py_ssize_t record_index, name, start):
    cdef BytesWalk wk
    cdef Cursor item
    cdef int r
    cdef Error err
    err.what = NULL
    wk.run = start_run(entry, run_start)
    wk.lst = entry
    wk.in_list = False
    out = []
    while True:
        r = next_bytes(&wk, &item, &err)
        if r == 0:
            return out
        if r < 0:
            raise DecodeError(name, record_index, "a Feature message",
                              f"invalid protobuf: {err.what.decode()}", offset=start)
        out.append(PyBytes_FromStringAndSize(<const char *>item.p, item.end - item.p))


# ---------------------------------------------------------------------------
# Encoding helpers for the writer.

def encode_varints(values):
    """Protobuf varints of an int64 array, concatenated (negative values take 10 bytes)."""
    cdef const int64_t[::1] v = np.ascontiguousarray(values, dtype=np.int64)
    cdef Py_ssize_t n = v.shape[0], i, k = 0
    cdef uint64_t x
    out = PyBytes_FromStringAndSize(NULL, 10 * n)
    cdef uint8_t *o = <uint8_t *>PyBytes_AS_STRING(out)
    with nogil:
        for i in range(n):
            x = <uint64_t>v[i]
            while x >= 0x80:
                o[k] = <uint8_t>(x & 0x7f) | 0x80
                k += 1
                x >>= 7
            o[k] = <uint8_t>x
            k += 1
    return out[:k]
