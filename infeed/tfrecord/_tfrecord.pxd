# The C-level interface of the record sources, for the decoder to read records in place (infeed/example/_example.pyx).
from libc.stdint cimport uint8_t, int64_t


cdef class Frames:
    cdef int next_frame(self, bint check_data, const uint8_t **data, Py_ssize_t *size) except -1


cdef class RecordReader(Frames):
    cdef object source
    cdef object _readinto
    cdef uint8_t *buf
    cdef Py_ssize_t cap, start, end, chunk
    cdef int64_t buf_offset      # stream offset of buf[0]
    cdef bint eof
    cdef object error
    cdef readonly str path
    cdef readonly int64_t size
    cdef readonly int64_t max_record_size
    cdef readonly bint follow
    cdef readonly int64_t records_read
    cdef readonly bint skip_corrupt
    cdef readonly int64_t skipped_regions
    cdef readonly int64_t skipped_bytes

    cdef int next_frame(self, bint check_data, const uint8_t **data, Py_ssize_t *size) except -1
    cdef int _fill(self) except -1
    cdef int _grow(self, Py_ssize_t want) except -1
    cdef int _ensure(self, Py_ssize_t need) except -1
    cdef int _fail(self, int64_t index, int64_t offset, str kind, str detail) except -1
    cdef str _hint(self)
    cdef object _step(self, bint want_data)
    cdef bint _corrupt(self, int64_t offset, str kind, str detail) except -1
    cdef int64_t _resync(self) except -1
    cdef bint _grew(self) except -1
    cdef bint _writer_open(self) except -1
