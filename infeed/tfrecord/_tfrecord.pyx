# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""TFRecord framing: CRC32C, and a reader that finds and checks records in a stream.

A frame is ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little-endian.  The reader keeps one large buffer
(several MiB), fills it with ``readinto`` from any binary stream, and checks
every frame before it yields the data.  Lengths are never trusted: nothing is
allocated for a record until its bytes have arrived.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.mem cimport PyMem_Malloc, PyMem_Realloc, PyMem_Free
from cpython.memoryview cimport PyMemoryView_FromMemory
from cpython.buffer cimport PyBUF_WRITE, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcpy, memmove
from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

import fcntl
import logging
import os
import time

from infeed.errors import CompressedStreamError, CorruptRecordError, SourceChangedError, located_os_error

cdef extern from "_crc32c.h":
    uint32_t infeed_crc32c_extend(uint32_t crc, const uint8_t *data, size_t n) nogil
    uint32_t infeed_crc32c_mask(uint32_t crc) nogil
    uint32_t infeed_crc32c_table(uint32_t crc, const uint8_t *data, size_t n) nogil
    const char *infeed_crc32c_impl()

_log = logging.getLogger("infeed")

DEF HEADER = 12
DEF FOOTER = 4
DEF NOGIL_BYTES = 65536

#: The longest record a reader takes by default (``max_record_size``): a length field beyond it is refused
#: before any memory is reserved for the record, whatever the stream (a 1 MB GZIP file can declare 1 GiB).
MAX_RECORD_SIZE = 256 << 20
#: Seconds between two looks at a file being written, with ``follow=True``.
FOLLOW_POLL = 0.05


# --- stage counters -------------------------------------------------------------------------------
# What every reader of this process spent reading and checking, for a worker to report per stage
# (infeed.ring: the worker table): nanoseconds of CLOCK_MONOTONIC (time.monotonic_ns's clock) and bytes.
# Process-wide and unlocked: a worker reads records from one thread.
DEF C_READ_NS = 0           # in the stream's read/readinto (and opening files): I/O, and inflating when compressed
DEF C_READ_BYTES = 1        # bytes the streams handed over (inflated bytes when compressed)
DEF C_CRC_TIMED_NS = 2      # data CRCs timed (see crc_timed)
DEF C_CRC_TIMED_BYTES = 3
DEF C_CRC_BYTES = 4         # all bytes whose data CRC was checked
DEF C_INFLATE_NS = 5        # inflating GZIP/ZLIB streams (within C_READ_NS)
DEF C_COMPRESSED_BYTES = 6  # compressed bytes read by those streams
DEF C_CRC_CALLS = 7
DEF N_COUNTERS = 8
#: A record's data CRC is timed when it has at least this many bytes, and otherwise once in
#: CRC_SAMPLE records: two clock reads (~25 ns each) per small record would cost more than the CRC
#: itself; the time of the others is estimated from the bytes timed (the CRC's cost is per byte).
DEF CRC_TIMED_BYTES = 16384
DEF CRC_SAMPLE = 16
cdef int64_t counters[N_COUNTERS]


cdef inline int64_t now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <int64_t>ts.tv_sec * 1000000000 + ts.tv_nsec


cdef inline bint crc_timed(Py_ssize_t length) noexcept nogil:
    """Whether to time this record's CRC (every call counts towards the sampling)."""
    counters[C_CRC_CALLS] += 1
    return length >= CRC_TIMED_BYTES or counters[C_CRC_CALLS] % CRC_SAMPLE == 0


cdef inline uint32_t data_crc(const uint8_t *p, Py_ssize_t length) noexcept nogil:
    """The masked CRC32C of ``length`` bytes at ``p``, counted (and timed when sampled)."""
    cdef int64_t t0
    cdef uint32_t crc
    counters[C_CRC_BYTES] += length
    if not crc_timed(length):
        return infeed_crc32c_mask(infeed_crc32c_extend(0, p, length))
    t0 = now_ns()
    crc = infeed_crc32c_mask(infeed_crc32c_extend(0, p, length))
    counters[C_CRC_TIMED_NS] += now_ns() - t0
    counters[C_CRC_TIMED_BYTES] += length
    return crc


#: The names of :func:`stage_totals`' numbers, in order.
STAGE_TOTALS = ("read_ns", "inflate_ns", "crc_ns", "read_bytes", "compressed_bytes")


cdef inline int64_t crc_estimate() noexcept nogil:
    if counters[C_CRC_TIMED_BYTES] <= 0:
        return counters[C_CRC_TIMED_NS]
    return <int64_t>(<double>counters[C_CRC_TIMED_NS] * counters[C_CRC_BYTES] / counters[C_CRC_TIMED_BYTES])


def stage_totals():
    """:data:`STAGE_TOTALS` as a tuple (what a worker stores after every batch: cheaper than a dict)."""
    return (counters[C_READ_NS], counters[C_INFLATE_NS], crc_estimate(), counters[C_READ_BYTES],
            counters[C_COMPRESSED_BYTES])


def stage_counters():
    """What this process's readers spent so far: ``read_ns`` (in the streams' reads and opening files,
    inflating included), ``inflate_ns`` (inflating GZIP/ZLIB), ``crc_ns`` (checking data CRCs:
    estimated from a sample, see ``CRC_SAMPLE``), and the bytes read, inflated from, and checked."""
    return dict(zip(STAGE_TOTALS, stage_totals()), crc_bytes=counters[C_CRC_BYTES])


def count_read(int64_t ns, int64_t nbytes=0):
    """Adds a read made outside a RecordReader (opening a file, a read at an offset) to the counters."""
    counters[C_READ_NS] += ns
    counters[C_READ_BYTES] += nbytes


def count_inflate(int64_t ns, int64_t compressed_bytes):
    """Adds the time spent inflating ``compressed_bytes`` (within a stream's read) to the counters."""
    counters[C_INFLATE_NS] += ns
    counters[C_COMPRESSED_BYTES] += compressed_bytes


def reset_stage_counters():
    """Zeroes the counters (a new worker process starts from zero anyway; for tests and benchmarks)."""
    cdef int i
    for i in range(N_COUNTERS):
        counters[i] = 0


def located_io_error(OSError error, str path, int64_t record_index, int64_t offset):
    """``error``, raised by the stream under a reader, as an OSError that names the file and where
    the read was (see :func:`infeed.errors.located_os_error`)."""
    return located_os_error(error, path, f"reading record {record_index} at byte offset {offset}")


ctypedef uint32_t (*crc_function)(uint32_t, const uint8_t *, size_t) noexcept nogil


cdef uint32_t crc_of(data, uint32_t crc, crc_function fn) except? 0xffffffff:
    cdef Py_buffer view
    cdef uint32_t out
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    try:
        with nogil:
            out = fn(crc, <const uint8_t *>view.buf, view.len)
    finally:
        PyBuffer_Release(&view)
    return out


def crc32c(data, unsigned int crc=0):
    """CRC32C of a bytes-like object, extending ``crc``."""
    return crc_of(data, crc, infeed_crc32c_extend)


def crc32c_table(data, unsigned int crc=0):
    """CRC32C through the portable table, whatever the CPU offers (for tests)."""
    return crc_of(data, crc, infeed_crc32c_table)


def masked_crc32c(data):
    """TFRecord's masked CRC32C of a bytes-like object."""
    return infeed_crc32c_mask(crc32c(data))


def crc32c_implementation():
    """``"sse4.2"``, ``"armv8-crc"`` or ``"table"``: what this CPU uses."""
    return infeed_crc32c_impl().decode()


cdef inline uint64_t load_u64(const uint8_t *p) noexcept nogil:
    cdef uint64_t v = 0
    cdef int i
    for i in range(8):
        v |= (<uint64_t>p[i]) << (8 * i)
    return v


cdef inline uint32_t load_u32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0]) | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16) | (<uint32_t>p[3] << 24)


cdef inline void store_u32(uint8_t *p, uint32_t v) noexcept nogil:
    p[0] = v & 0xff
    p[1] = (v >> 8) & 0xff
    p[2] = (v >> 16) & 0xff
    p[3] = (v >> 24) & 0xff


cdef inline bint header_ok(const uint8_t *p) noexcept nogil:
    return infeed_crc32c_mask(infeed_crc32c_extend(0, p, 8)) == load_u32(p + 8)


def frame(data):
    """One TFRecord frame (header, data, footer) around a bytes-like object."""
    cdef Py_buffer view
    PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
    cdef Py_ssize_t n = view.len
    cdef bytes out
    cdef uint8_t *o
    cdef int i
    try:
        out = PyBytes_FromStringAndSize(NULL, n + HEADER + FOOTER)
        o = <uint8_t *>PyBytes_AS_STRING(out)
        with nogil:
            for i in range(8):
                o[i] = (<uint64_t>n >> (8 * i)) & 0xff
            store_u32(o + 8, infeed_crc32c_mask(infeed_crc32c_extend(0, o, 8)))
            memcpy(o + HEADER, view.buf, n)
            store_u32(o + HEADER + n, infeed_crc32c_mask(infeed_crc32c_extend(0, <const uint8_t *>view.buf, n)))
    finally:
        PyBuffer_Release(&view)
    return out


cdef int _check_indexed(const uint8_t *run, Py_ssize_t n, int64_t at, str path, int64_t record_index,
                        int64_t offset, int64_t length, const uint32_t *indexed_crc) except -1:
    """Checks the record an index places at ``at`` of a read of ``n`` bytes at ``run`` (``offset`` of ``path``):
    :func:`_check_frame`, and its data CRC against the one indexed (``indexed_crc``; NULL: none), a record of
    another version of the file being a :class:`~infeed.errors.SourceChangedError`."""
    cdef uint32_t stored
    if at < 0 or at >= n:          # nothing read there: refused before anything is read
        _check_frame(NULL, 0, path, record_index, offset, length)
    _check_frame(run + at, n - at, path, record_index, offset, length)
    if indexed_crc != NULL:
        stored = load_u32(run + at + HEADER + length)
        if stored != indexed_crc[0]:
            raise SourceChangedError(path, indexed_crc[0], stored, offset, record_index)
    return 0


cdef int _check_frame(const uint8_t *p, Py_ssize_t avail, str path, int64_t record_index, int64_t offset,
                      int64_t length) except -1:
    """Checks the framed record at ``p`` (``avail`` bytes read there, from ``offset`` of ``path``): its header
    says ``length``, and both CRCs verify."""
    if length < 0 or avail < HEADER + length + FOOTER:
        raise CorruptRecordError(path, record_index, offset, "truncated_data",
                                 f"read {max(avail, 0)} bytes where the index promises {length + HEADER + FOOTER}")
    if not header_ok(p):
        raise CorruptRecordError(path, record_index, offset, "length_crc",
                                 f"length field reads {load_u64(p)} (is the index stale?)")
    if load_u64(p) != <uint64_t>length:
        raise CorruptRecordError(path, record_index, offset, "length_crc",
                                 f"length field reads {load_u64(p)}, the index says {length} (is it stale?)")
    cdef uint32_t want
    if length >= NOGIL_BYTES:      # below this, releasing the GIL costs more than it frees
        with nogil:
            want = data_crc(p + HEADER, <Py_ssize_t>length)
    else:
        want = data_crc(p + HEADER, <Py_ssize_t>length)
    if want != load_u32(p + HEADER + length):
        raise CorruptRecordError(path, record_index, offset, "data_crc",
                                 f"stored {hex(load_u32(p + HEADER + length))}, computed {hex(want)}")
    return 0


def unframe_run(run, str path, int64_t first_index, int64_t base, const int64_t[::1] offsets,
                const int64_t[::1] lengths, bint views=False, data_crcs=None):
    """The data of records ``first_index``, ``first_index + 1``, ... of ``path``, read in one piece from
    offset ``base`` (``run``): record ``first_index + i`` starts at ``offsets[i]`` with ``lengths[i]`` data
    bytes (from an index). Each is checked (its header against the index, both CRCs); a read cut short is
    ``truncated_data`` naming the first record it cuts. ``views``: memoryviews into ``run`` rather than bytes (no copy).

    ``data_crcs`` (uint32, from a version-2 index): each record's data CRC as its footer held it when the file was
    indexed. A record whose own CRCs verify but whose data CRC is another is a record of another version of the
    file: :class:`~infeed.errors.SourceChangedError`, never a record mixed into the batch."""
    cdef const uint8_t[::1] b = run
    cdef Py_ssize_t n = b.shape[0], i, at, count = offsets.shape[0]
    cdef const uint32_t[::1] crcs
    cdef bint pinned = data_crcs is not None
    if lengths.shape[0] != count:
        raise ValueError(f"{count} offsets and {lengths.shape[0]} lengths")
    if pinned:
        crcs = data_crcs
        if crcs.shape[0] != count:
            raise ValueError(f"{count} offsets and {crcs.shape[0]} data CRCs")
    whole = memoryview(run) if views else None
    cdef list out = []
    for i in range(count):
        at = offsets[i] - base
        _check_indexed(&b[0] if n else NULL, n, at, path, first_index + i, offsets[i], lengths[i],
                       &crcs[i] if pinned else NULL)
        if views:
            out.append(whole[at + HEADER:at + HEADER + lengths[i]])
        else:
            out.append(PyBytes_FromStringAndSize(<const char *>&b[0] + at + HEADER, <Py_ssize_t>lengths[i]))
    return out


cdef struct FramedRun:
    const uint8_t *data         # the run's bytes as read, from file offset `base`
    Py_ssize_t avail
    int64_t base
    int64_t first               # the file's record number of its first record
    const int64_t *offsets      # per record, from the index: its header's file offset,
    const int64_t *lengths      # its data length,
    const uint32_t *crcs        # and its data CRC (NULL: a version-1 index has none)
    Py_ssize_t count
    Py_ssize_t file             # into the paths, for errors


cdef class Frames:
    """A source of checked records that the decoder reads where they lie (``CompiledSpec.decode_from``):
    :class:`RecordReader` over a stream, :class:`IndexedFrames` over reads by an index's offsets."""

    cdef int next_frame(self, bint check_data, const uint8_t **data, Py_ssize_t *size) except -1:
        raise NotImplementedError


cdef class IndexedFrames(Frames):
    """The records of runs read by an index's offsets (``infeed.tfrecord.index.indexed_runs``: ``runs[i]``'s
    bytes in ``datas[i]``), given to the decoder one by one where they lie, each checked as
    :func:`unframe_run` checks it (its header against the index, both CRCs, its data CRC against the
    indexed one), with no object per record."""

    cdef list _keep             # what the pointers point into: the runs' arrays, the datas, the paths
    cdef list _paths
    cdef Py_buffer *_views
    cdef FramedRun *_runs
    cdef Py_ssize_t _nruns, _nviews, _run, _at
    cdef readonly int64_t records_read

    def __cinit__(self, list runs, list datas, list paths):
        cdef Py_ssize_t i, count
        cdef const int64_t[::1] offsets
        cdef const int64_t[::1] lengths
        cdef const uint32_t[::1] crcs
        cdef FramedRun *r
        if len(runs) != len(datas):
            raise ValueError(f"{len(runs)} runs and {len(datas)} reads")
        self._paths = paths
        self._keep = [runs, datas]
        self._runs = <FramedRun *>PyMem_Malloc(sizeof(FramedRun) * max(len(runs), 1))
        self._views = <Py_buffer *>PyMem_Malloc(sizeof(Py_buffer) * max(len(runs), 1))
        if self._runs == NULL or self._views == NULL:
            raise MemoryError()
        for i, run in enumerate(runs):
            r = &self._runs[self._nruns]
            offsets, lengths = run.offsets, run.lengths
            count = offsets.shape[0]
            if lengths.shape[0] != count or not 0 <= run.file < len(paths):
                raise ValueError(f"run {i}: {count} offsets, {lengths.shape[0]} lengths, file {run.file}")
            if count == 0:
                continue
            r.crcs = NULL
            if run.data_crcs is not None:
                crcs = run.data_crcs
                if crcs.shape[0] != count:
                    raise ValueError(f"run {i}: {count} offsets and {crcs.shape[0]} data CRCs")
                r.crcs = &crcs[0]
            r.offsets, r.lengths, r.count = &offsets[0], &lengths[0], count
            r.base, r.first, r.file = run.base, run.first, run.file
            PyObject_GetBuffer(datas[i], &self._views[self._nviews], PyBUF_SIMPLE)
            self._nviews += 1
            r.data, r.avail = <const uint8_t *>self._views[self._nviews - 1].buf, self._views[self._nviews - 1].len
            self._nruns += 1

    def __dealloc__(self):
        cdef Py_ssize_t i
        if self._views != NULL:
            for i in range(self._nviews):
                PyBuffer_Release(&self._views[i])
        PyMem_Free(self._views)
        PyMem_Free(self._runs)

    cdef int next_frame(self, bint check_data, const uint8_t **data, Py_ssize_t *size) except -1:
        """Always checks both CRCs and the indexed one, whatever ``check_data``."""
        cdef FramedRun *r
        cdef Py_ssize_t i
        cdef int64_t at, length
        while self._run < self._nruns and self._at == self._runs[self._run].count:
            self._run += 1
            self._at = 0
        if self._run == self._nruns:
            return 0
        r, i = &self._runs[self._run], self._at
        at, length = r.offsets[i] - r.base, r.lengths[i]
        _check_indexed(r.data, r.avail, at, self._paths[r.file], r.first + i, r.offsets[i], length,
                       &r.crcs[i] if r.crcs != NULL else NULL)
        data[0] = r.data + at + HEADER
        size[0] = <Py_ssize_t>length
        self._at += 1
        self.records_read += 1
        return 1


def looks_like_tfrecord(head):
    """True when ``head`` (at least 12 bytes) starts with a valid TFRecord header."""
    cdef const uint8_t[:] b = head
    if b.shape[0] < HEADER:
        return False
    return header_ok(&b[0])


cdef class RecordReader(Frames):
    """Iterates over the records of one TFRecord stream, checking both CRCs.

    ``source`` is a binary stream with ``readinto`` (or ``read``); ``size`` is
    its length in bytes when known (uncompressed files), else -1: a file that grows
    while it is read (``fileno`` tells) is measured again before a record past the
    size known is called damaged; with ``follow=True`` a record cut by the end of
    such a file is waited for while a writer still has the file open (and reported
    as truncated once none has).  A record longer than ``max_record_size`` bytes is
    refused before anything is allocated for it (kind ``record_too_large``).  Each damaged
    record raises :class:`infeed.CorruptRecordError`, and the reader yields
    nothing after it.  With ``skip_corrupt=True`` it instead resynchronises to
    the next offset where both CRCs verify, logs a warning and counts what it
    skipped in ``skipped_regions`` and ``skipped_bytes``.
    """

    # Attributes and C methods are declared in _tfrecord.pxd.

    def __cinit__(self, source, str path, int64_t size=-1, bint skip_corrupt=False,
                  Py_ssize_t buffer_size=8 << 20, int64_t max_record_size=MAX_RECORD_SIZE, bint follow=False):
        if buffer_size < 64:
            raise ValueError(f"buffer_size must be at least 64 bytes, got {buffer_size}")
        if not 0 <= max_record_size <= (<int64_t>1 << 62):
            raise ValueError(f"max_record_size must be between 0 and 2**62 bytes, got {max_record_size}")
        self.max_record_size = max_record_size
        self.follow = follow
        self.source = source
        self._readinto = getattr(source, "readinto", None)
        self.path = path
        self.size = size
        self.skip_corrupt = skip_corrupt
        self.chunk = buffer_size
        self.cap = buffer_size if size < 0 or size + 1 > buffer_size else max(<Py_ssize_t>size + 1, 64)
        self.buf = <uint8_t *>PyMem_Malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        PyMem_Free(self.buf)

    def __iter__(self):
        return self

    def tell(self):
        """Stream offset of the next record."""
        return self.buf_offset + self.start

    def close(self):
        """Closes the underlying stream."""
        close = getattr(self.source, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    cdef int _fill(self) except -1:
        """Reads more bytes after ``end``; sets ``eof`` when the stream is done."""
        cdef Py_ssize_t got = 0
        if self.start > 0 and (self.end == self.cap or self.start >= self.cap // 2):
            memmove(self.buf, self.buf + self.start, self.end - self.start)
            self.buf_offset += self.start
            self.end -= self.start
            self.start = 0
        if self.end == self.cap:
            self._grow(self.cap * 2)
        view = PyMemoryView_FromMemory(<char *>self.buf + self.end, self.cap - self.end, PyBUF_WRITE)
        cdef int64_t began = now_ns()
        try:
            if self._readinto is not None:
                got = self._readinto(view) or 0
            else:
                data = self.source.read(self.cap - self.end)
                got = len(data)
                view[:got] = data
        except CompressedStreamError as e:
            last = (f"the last good record is {self.records_read - 1}" if self.records_read
                    else "no record was read before it")
            self._fail(self.records_read, self.buf_offset + self.start, "compressed_stream", f"{e}; {last}")
        except OSError as e:         # an I/O error is no damage: the reader stays usable for a retry
            raise located_io_error(e, self.path, self.records_read, self.buf_offset + self.start) from e
        finally:
            view.release()
            counters[C_READ_NS] += now_ns() - began
        counters[C_READ_BYTES] += got
        if got == 0:
            self.eof = True
        self.end += got
        return 0

    cdef int _grow(self, Py_ssize_t want) except -1:
        cdef uint8_t *p = <uint8_t *>PyMem_Realloc(self.buf, want)
        if p == NULL:
            raise MemoryError(f"{self.path}: cannot buffer a record of {want} bytes")
        self.buf = p
        self.cap = want
        return 0

    cdef int _ensure(self, Py_ssize_t need) except -1:
        """Makes ``need`` bytes available from ``start``, unless the stream ends first.

        The buffer grows only as data arrives (at most doubling), so a bogus
        length never allocates more than twice what the stream really holds.
        """
        while True:
            while self.end - self.start < need and not self.eof:
                if self.start + need > self.cap and self.start > 0:
                    memmove(self.buf, self.buf + self.start, self.end - self.start)
                    self.buf_offset += self.start
                    self.end -= self.start
                    self.start = 0
                if need > self.cap and self.end == self.cap:
                    self._grow(min(need, self.cap * 2))
                self._fill()
            if not (self.follow and self.eof and 0 < self.end - self.start < need and self._writer_open()):
                return 0
            time.sleep(FOLLOW_POLL)             # a record being written: wait for the rest of it
            self.eof = False

    cdef int _fail(self, int64_t index, int64_t offset, str kind, str detail) except -1:
        err = CorruptRecordError(self.path, index, offset, kind, detail)
        self.error = err
        raise err

    cdef str _hint(self):
        """At offset 0 only: what the file looks like, when it does not start with a record."""
        cdef const uint8_t *p = self.buf + self.start
        cdef Py_ssize_t avail = self.end - self.start
        if self.buf_offset + self.start != 0:
            return ""
        if avail >= 2 and p[0] == 0x1f and p[1] == 0x8b:
            return "; the file starts like GZIP: read it with compression='GZIP'"
        if avail >= 2 and p[0] == 0x78 and ((p[0] << 8) | p[1]) % 31 == 0:
            return "; the file starts like a ZLIB stream: read it with compression='ZLIB'"
        if avail >= 3 and p[0] == 0xff and p[1] == 0xd8 and p[2] == 0xff:
            return "; the file is a JPEG image, not a TFRecord file"
        head = PyBytes_FromStringAndSize(<const char *>p, min(avail, 16))
        return f"; is this a TFRecord file? It starts with {head!r}"

    def __next__(self):
        out = self._step(True)
        if out is None:
            raise StopIteration
        return out

    def skip(self, Py_ssize_t n):
        """Moves past up to ``n`` records without copying them; returns how many it passed (fewer
        at the end).  It checks their framing (header CRC and length); with ``skip_corrupt`` their
        data CRC too, so that it passes exactly the records a read would yield.  Otherwise the
        reader that owns those records checks their data."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        cdef Py_ssize_t done = 0
        while done < n and self._step(False) is not None:
            done += 1
        return done

    cdef object _step(self, bint want_data):
        """The next record's bytes (``want_data``) or True (skipped), or None at the end."""
        cdef const uint8_t *data
        cdef Py_ssize_t n
        if not self.next_frame(want_data, &data, &n):
            return None
        if not want_data:
            return True
        return PyBytes_FromStringAndSize(<const char *>data, n)

    cdef int next_frame(self, bint check_data, const uint8_t **data, Py_ssize_t *size) except -1:
        """Finds the next record: 1 with ``data``/``size`` pointing at it inside the buffer (valid
        until the next call), or 0 at the end. ``check_data``: verify its data CRC (else the framing only,
        unless ``skip_corrupt``: then a record with bad data must be skipped as a read would)."""
        cdef uint64_t length
        cdef Py_ssize_t avail
        cdef int64_t offset, total, left
        cdef const uint8_t *p
        cdef uint32_t want, got
        if self.error is not None:
            raise self.error
        while True:
            self._ensure(HEADER)
            avail = self.end - self.start
            offset = self.buf_offset + self.start
            if avail == 0:
                return 0
            if avail < HEADER:
                if self._corrupt(offset, "truncated_header",
                                 f"{avail} of {HEADER} header bytes before the end of the file" + self._hint()):
                    continue
                return 0
            p = self.buf + self.start
            if not header_ok(p):
                if self._corrupt(offset, "length_crc", f"length field reads {load_u64(p)}, CRC stored "
                                 + hex(load_u32(p + 8)) + ", computed "
                                 + hex(infeed_crc32c_mask(infeed_crc32c_extend(0, p, 8))) + self._hint()):
                    continue
                return 0
            length = load_u64(p)
            left = self.size - offset - HEADER - FOOTER
            if self.size >= 0 and (left < 0 or length > <uint64_t>left):
                if self._grew():                # a file being appended to: judge the record by its size now
                    continue
                if self.follow and self._writer_open():
                    time.sleep(FOLLOW_POLL)     # its writer has not finished it: wait for the rest
                    continue
                total = self.size
                if self._corrupt(offset, "length_exceeds_file" if length > <uint64_t>total else "truncated_data",
                                 f"length {length}, {total - offset - HEADER} bytes left after the header"):
                    continue
                return 0
            if length > <uint64_t>self.max_record_size:
                if self._corrupt(offset, "record_too_large",
                                 f"length {length}, max_record_size {self.max_record_size}"):
                    continue
                return 0
            self._ensure(HEADER + <Py_ssize_t>length + FOOTER)
            avail = self.end - self.start
            if avail < HEADER + <Py_ssize_t>length + FOOTER:
                total = self.buf_offset + self.end
                if self._corrupt(offset, "length_exceeds_file" if length > <uint64_t>total else "truncated_data",
                                 f"length {length}, {avail - HEADER} bytes left after the header"):
                    continue
                return 0
            p = self.buf + self.start
            data[0] = p + HEADER
            size[0] = <Py_ssize_t>length
            if not check_data and not self.skip_corrupt:
                self.start += HEADER + <Py_ssize_t>length + FOOTER
                self.records_read += 1
                return 1
            if length >= NOGIL_BYTES:      # below this, releasing the GIL costs more than it frees
                with nogil:
                    want = data_crc(p + HEADER, <Py_ssize_t>length)
            else:
                want = data_crc(p + HEADER, <Py_ssize_t>length)
            got = load_u32(p + HEADER + length)
            if want != got:
                if self._corrupt(offset, "data_crc", f"stored {hex(got)}, computed {hex(want)}"):
                    continue
                return 0
            self.start += HEADER + <Py_ssize_t>length + FOOTER
            self.records_read += 1
            return 1

    def read_batch(self, Py_ssize_t max_records):
        """Up to ``max_records`` records as a list (empty at the end of the stream)."""
        if max_records < 0:
            raise ValueError(f"max_records must be >= 0, got {max_records}")
        out = []
        while len(out) < max_records:
            record = self._step(True)
            if record is None:
                break
            out.append(record)
        return out

    cdef bint _corrupt(self, int64_t offset, str kind, str detail) except -1:
        """Raises, or with skip_corrupt resynchronises: True when a good record follows."""
        if not self.skip_corrupt:
            self._fail(self.records_read, offset, kind, detail)
        err = CorruptRecordError(self.path, self.records_read, offset, kind, detail)
        cdef int64_t skipped = self._resync()
        self.skipped_regions += 1
        self.skipped_bytes += skipped
        _log.warning("%s; skipped %d bytes to the next good record", err, skipped)
        return True

    cdef bint _grew(self) except -1:
        """Whether the file under the stream is larger now than ``size`` (it is being appended to);
        ``size`` follows it. Streams without ``fileno`` (compressed, remote) have no size to follow."""
        fileno = getattr(self.source, "fileno", None)
        if fileno is None or self.size < 0:
            return False
        try:
            now = os.fstat(fileno()).st_size
        except (OSError, ValueError):
            return False
        if now <= self.size:
            return False
        self.size = now
        return True

    cdef bint _writer_open(self) except -1:
        """Whether a process has the file under the stream open for writing: a read lease (``F_SETLEASE``)
        can only be taken when none has. False when that cannot be told (a pipe, a remote or compressed
        stream, a file of another owner): then the end of the stream is its end."""
        fileno = getattr(self.source, "fileno", None)
        if fileno is None:
            return False
        try:
            fd = fileno()
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except BlockingIOError:
            return True
        except (OSError, ValueError):
            return False
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False

    cdef int64_t _resync(self) except -1:
        """Moves ``start`` past the damage to the next offset where a whole frame verifies."""
        cdef int64_t begin = self.buf_offset + self.start
        cdef const uint8_t *p
        cdef uint64_t length
        cdef Py_ssize_t need
        self.start += 1
        while True:
            self._ensure(HEADER)
            if self.end - self.start < HEADER:
                self.start = self.end          # nothing valid before the end
                return self.buf_offset + self.start - begin
            p = self.buf + self.start
            if header_ok(p):
                length = load_u64(p)
                if length <= <uint64_t>self.max_record_size and (self.size < 0 or
                        length + HEADER + FOOTER <= <uint64_t>(self.size - self.buf_offset - self.start)):
                    need = HEADER + <Py_ssize_t>length + FOOTER
                    self._ensure(need)
                    p = self.buf + self.start
                    if self.end - self.start >= need and infeed_crc32c_mask(
                            infeed_crc32c_extend(0, p + HEADER, length)) == load_u32(p + HEADER + length):
                        return self.buf_offset + self.start - begin
            self.start += 1
