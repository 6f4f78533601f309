# cython: language_level=3
"""Process-shared primitives for `infeed.ring.ring`: a shared mapping and semaphores inside it.

`Mapping` maps a file descriptor with ``mmap(2)`` and keeps no descriptor of its
own (Python's ``mmap.mmap`` duplicates the fd, which would leak one per ring
until garbage collection). It exports the buffer protocol, so numpy views keep
the mapping alive: the pages are unmapped only when the last view is gone, and
a view never dangles.

Semaphores are POSIX unnamed semaphores (``sem_init`` with ``pshared=1``)
placed at offsets inside the mapping; waits release the GIL and use
``sem_clockwait`` on ``CLOCK_MONOTONIC``, so a change of wall-clock time does not
shorten or stretch them.
"""

from cpython.buffer cimport PyBuffer_FillInfo
from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport errno, EINTR, ETIMEDOUT, EAGAIN

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    cdef struct timespec:
        time_t tv_sec
        long tv_nsec
    ctypedef int clockid_t
    int clock_gettime(clockid_t clk, timespec *ts)
    enum: CLOCK_MONOTONIC

cdef extern from "<semaphore.h>" nogil:
    ctypedef struct sem_t:
        pass
    int sem_init(sem_t *sem, int pshared, unsigned int value)
    int sem_post(sem_t *sem)
    int sem_trywait(sem_t *sem)
    int sem_clockwait(sem_t *sem, clockid_t clk, const timespec *abstime)
    int sem_getvalue(sem_t *sem, int *sval)

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<sys/mman.h>" nogil:
    void *mmap(void *addr, size_t length, int prot, int flags, int fd, long offset)
    int munmap(void *addr, size_t length)
    int mlock(const void *addr, size_t length)
    enum: PROT_READ
    enum: PROT_WRITE
    enum: MAP_SHARED
    enum: MAP_POPULATE
    void *MAP_FAILED

cdef extern from *:
    """
    static inline long long infeed_fetch_add(long long *p, long long n) {
        return __atomic_fetch_add(p, n, __ATOMIC_SEQ_CST);
    }
    """
    long long infeed_fetch_add(long long *p, long long n) nogil

#: Bytes one semaphore occupies (callers place them on 64-byte boundaries).
SEM_SIZE = sizeof(sem_t)


cdef class Mapping:
    """``size`` bytes of ``fd`` mapped shared, read-write; unmapped when the last user is gone.

    ``populate``: map every page now (``MAP_POPULATE``), so that the first
    write to each does not fault later, in the middle of a batch.
    """

    cdef char *addr
    cdef readonly size_t size

    def __cinit__(self, int fd, size_t size, bint populate=False):
        self.addr = NULL
        self.size = size
        if size == 0:
            raise ValueError("cannot map 0 bytes")
        cdef void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | (MAP_POPULATE if populate else 0),
                            fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, f"mmap of {size} bytes failed")
        self.addr = <char *>p

    def __dealloc__(self):
        if self.addr != NULL:
            munmap(self.addr, self.size)
            self.addr = NULL

    def __getbuffer__(self, Py_buffer *buffer, int flags):
        PyBuffer_FillInfo(buffer, self, self.addr, <Py_ssize_t>self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer *buffer):
        pass

    @property
    def address(self):
        """The mapping's start address (page-aligned)."""
        return <size_t>self.addr

    def mlock(self):
        """Locks the pages in memory; returns 0 or the errno of the failure."""
        if mlock(self.addr, self.size) != 0:
            return errno
        return 0

    cdef sem_t *_sem(self, size_t offset) except NULL:
        if offset % 16 != 0 or offset + sizeof(sem_t) > self.size:
            raise ValueError(f"no semaphore fits at offset {offset} of a {self.size}-byte mapping")
        return <sem_t *>(self.addr + offset)

    def fetch_add(self, size_t offset, long long n):
        """Adds ``n`` to the int64 at ``offset`` (8-aligned) atomically; returns the value before."""
        if offset % 8 or offset + 8 > self.size:
            raise ValueError(f"offset {offset} is no int64 inside the mapping")
        return infeed_fetch_add(<long long *>(self.addr + offset), n)

    def sem_init(self, size_t offset, unsigned int value):
        """Initialises a process-shared semaphore at ``offset`` (only the creator, only once)."""
        if sem_init(self._sem(offset), 1, value) != 0:
            raise OSError(errno, "sem_init failed")

    def sem_post(self, size_t offset):
        if sem_post(self._sem(offset)) != 0:
            raise OSError(errno, "sem_post failed")

    def sem_value(self, size_t offset):
        cdef int value = 0
        if sem_getvalue(self._sem(offset), &value) != 0:
            raise OSError(errno, "sem_getvalue failed")
        return value

    def sem_trywait(self, size_t offset):
        """Decrements without blocking; True when it did."""
        cdef sem_t *sem = self._sem(offset)
        while sem_trywait(sem) != 0:
            if errno == EAGAIN:
                return False
            if errno != EINTR:
                raise OSError(errno, "sem_trywait failed")
        return True

    def sem_wait(self, size_t offset, double seconds, double spin=0.0):
        """Waits up to ``seconds`` (GIL released) to decrement; True when it did, False on timeout.

        ``spin``: seconds to poll before sleeping. A post that finds no sleeper
        costs the poster no system call (in a virtual machine, waking a sleeper
        on another CPU costs tens of microseconds), so a consumer that expects
        its batch soon polls briefly, yielding its CPU between polls in case
        the producer is waiting for it. An interrupting signal returns to Python
        (so its handler runs) and the wait goes on until the deadline.
        """
        cdef sem_t *sem = self._sem(offset)
        cdef timespec deadline, now
        cdef int rc = 0, err = 0
        cdef long long spin_ns = <long long>(min(spin, seconds) * 1e9), start_ns
        if seconds < 0:
            seconds = 0
        if spin_ns > 0:
            with nogil:
                clock_gettime(CLOCK_MONOTONIC, &now)
                start_ns = now.tv_sec * 1000000000LL + now.tv_nsec
                while True:
                    if sem_trywait(sem) == 0:
                        rc = 1
                        break
                    clock_gettime(CLOCK_MONOTONIC, &now)
                    if now.tv_sec * 1000000000LL + now.tv_nsec - start_ns >= spin_ns:
                        break
                    sched_yield()      # the producer may be waiting for this very CPU
            if rc:
                return True
        clock_gettime(CLOCK_MONOTONIC, &deadline)
        cdef long long ns = deadline.tv_nsec + <long long>((seconds - <long long>seconds) * 1e9)
        deadline.tv_sec += <time_t>seconds + <time_t>(ns // 1000000000)
        deadline.tv_nsec = <long>(ns % 1000000000)
        while True:
            with nogil:
                rc = sem_clockwait(sem, CLOCK_MONOTONIC, &deadline)
                err = errno
            if rc == 0:
                return True
            if err == ETIMEDOUT:
                return False
            if err != EINTR:
                raise OSError(err, "sem_clockwait failed")
            # A signal: let Python run its handler (KeyboardInterrupt, SystemExit) before waiting on.
            _check_signals()


cdef int _check_signals() except -1:
    return PyErr_CheckSignals()
