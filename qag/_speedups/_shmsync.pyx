# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Shared-memory synchronisation for the metadata cache: the compiled twin of shmsync.py (rules in its docstring).

Words are read and written with C11-style atomics (GCC/Clang __atomic builtins): acquire loads, release stores,
a compare-and-swap mutex holding the owner's pid, and seqlock copies fenced on both sides, so they are correct
on weakly ordered processors too. Waiting for the mutex releases the GIL.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t, int64_t
from libc.string cimport memcpy

import os

__all__ = ["Sync"]

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    #include <sched.h>
    #include <signal.h>
    #include <errno.h>
    #include <time.h>
    #include <unistd.h>

    static inline uint64_t qag_load(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline uint64_t qag_load_relaxed(volatile uint64_t *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
    static inline void qag_store(volatile uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    static inline void qag_store_relaxed(volatile uint64_t *p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
    static inline void qag_fence_acquire(void) { __atomic_thread_fence(__ATOMIC_ACQUIRE); }
    static inline void qag_fence_release(void) { __atomic_thread_fence(__ATOMIC_RELEASE); }
    static inline int qag_cas(volatile uint64_t *p, uint64_t expected, uint64_t desired) {
        return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    }
    static inline int qag_dead(uint64_t pid) {
        return pid != 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    /* Spin for the mutex at p (GIL released by the caller): yield, then sleep briefly; take it over from a dead
       owner. */
    static void qag_lock_wait(volatile uint64_t *p, uint64_t me) {
        unsigned long spins = 0;
        struct timespec pause = {0, 50000};
        for (;;) {
            uint64_t owner = __atomic_load_n(p, __ATOMIC_RELAXED);
            if (owner == 0) {
                if (qag_cas(p, 0, me)) return;
            } else if ((spins & 1023) == 1023 && qag_dead(owner)) {
                if (qag_cas(p, owner, me)) return;
            }
            spins++;
            if (spins < 64) sched_yield(); else nanosleep(&pause, NULL);
        }
    }
    /* Seqlock write: sequence odd, copy, sequence even. Returns the new sequence. */
    static uint64_t qag_seq_write(volatile uint64_t *seq, char *dst, const char *src, size_t n) {
        uint64_t s = __atomic_load_n(seq, __ATOMIC_RELAXED);
        if (s & 1) s++;
        __atomic_store_n(seq, s + 1, __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_RELEASE);
        memcpy(dst, src, n);
        __atomic_store_n(seq, s + 2, __ATOMIC_RELEASE);
        return s + 2;
    }
    """
    uint64_t qag_load(uint64_t *p) nogil
    void qag_store(uint64_t *p, uint64_t v) nogil
    void qag_fence_acquire() nogil
    int qag_cas(uint64_t *p, uint64_t expected, uint64_t desired) nogil
    void qag_lock_wait(uint64_t *p, uint64_t me) nogil
    uint64_t qag_load_relaxed(uint64_t *p) nogil
    uint64_t qag_seq_write(uint64_t *seq, char *dst, const char *src, size_t n) nogil


cdef class Sync:
    """Word access, a cross-process mutex, and seqlock copies on one shared buffer."""

    cdef Py_buffer _view
    cdef bint _held
    cdef char *_base
    cdef Py_ssize_t _size
    cdef int _fd

    def __cinit__(self, buf, int fd=-1):
        self._held = False
        try:
            PyObject_GetBuffer(buf, &self._view, PyBUF_WRITABLE | PyBUF_SIMPLE)
        except BufferError:
            raise ValueError("the shared buffer must be writable") from None
        self._held = True
        self._base = <char *>self._view.buf
        self._size = self._view.len
        self._fd = fd

    def __dealloc__(self):
        if self._held:
            PyBuffer_Release(&self._view)
            self._held = False

    @property
    def size(self):
        return self._size

    cdef inline uint64_t *_word(self, Py_ssize_t off) except NULL:
        if not self._held or off < 0 or off + 8 > self._size or off % 8:
            raise ValueError(f"word offset {off} is outside the shared buffer or not 8-aligned")
        return <uint64_t *>(self._base + off)

    cdef inline int _span(self, Py_ssize_t off, Py_ssize_t length) except -1:
        if not self._held or off < 0 or length < 0 or off + length > self._size:
            raise ValueError(f"span {off}+{length} is outside the shared buffer")
        return 0

    def load(self, Py_ssize_t off):
        return qag_load(self._word(off))

    def store(self, Py_ssize_t off, uint64_t value):
        qag_store(self._word(off), value)

    def lock(self, Py_ssize_t off):
        cdef uint64_t *p = self._word(off)
        cdef uint64_t me = <uint64_t>os.getpid()
        if qag_cas(p, 0, me):
            return
        with nogil:
            qag_lock_wait(p, me)

    def unlock(self, Py_ssize_t off):
        qag_store(self._word(off), 0)

    def write(self, Py_ssize_t seq_off, Py_ssize_t data_off, data):
        cdef uint64_t *seq = self._word(seq_off)
        cdef bytes raw = bytes(data)
        cdef Py_ssize_t n = len(raw)
        self._span(data_off, n)
        return qag_seq_write(seq, self._base + data_off, PyBytes_AS_STRING(raw), <size_t>n)

    def read(self, Py_ssize_t seq_off, Py_ssize_t data_off, Py_ssize_t length):
        cdef uint64_t *seq = self._word(seq_off)
        self._span(data_off, length)
        cdef uint64_t before = qag_load(seq)
        if before & 1:
            return None
        cdef bytes out = PyBytes_FromStringAndSize(NULL, length)
        memcpy(PyBytes_AS_STRING(out), self._base + data_off, <size_t>length)
        qag_fence_acquire()
        if qag_load_relaxed(seq) != before:
            return None
        return before, out

    def release(self):
        """Let go of the buffer (an mmap can only be closed once nothing holds it)."""
        if self._held:
            PyBuffer_Release(&self._view)
            self._held = False
