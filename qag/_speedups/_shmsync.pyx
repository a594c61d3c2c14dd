# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Shared-memory synchronisation for the host's shared state: the compiled twin of shmsync.py (rules in its
docstring).

Words are read and written with C11-style atomics (GCC/Clang __atomic builtins): acquire loads, release stores,
a compare-and-swap mutex holding the owner's pid, and seqlock copies fenced on both sides, so they are correct
on weakly ordered processors too. Waiting for the mutex releases the GIL. The host table's `Table` does each
operation as one critical section in C: the entries are C structs of the table's little-endian layout, the clocks
are read with clock_gettime (the same clocks as time.monotonic and time.time) unless a test injects its own.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint64_t, int64_t, uint32_t
from libc.string cimport memcpy, memset

import os

__all__ = ["Sync", "Table"]

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


# --- the host table of rate-limit buckets, max_concurrent slots and quota counts (qag/policy/hostlimits.py) -----
# The pure twin (shmsync.py) says what each operation does; here each is one critical section in C, the entries
# read and written as C structs of the same little-endian layout.

cdef extern from *:
    """
    #include <stddef.h>
    #include <math.h>

    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
    #error "qag's host table is little-endian"
    #endif

    typedef struct { uint64_t h2; int64_t kind; double used; } qt_head;
    typedef struct { uint64_t h2; int64_t kind; double used; double tokens; double at; int64_t count; double period; }
        qt_bucket;
    typedef struct { uint64_t h2; int64_t kind; double used; int64_t held; uint32_t pids[20]; uint32_t counts[20]; }
        qt_slots;
    typedef struct {
        uint64_t h2; int64_t kind; double used;
        int64_t calls, rows, base_calls, base_rows, other_calls, other_rows;
        double read_at; int64_t flushing; double flush_deadline; double reset_at;
        uint32_t pids[11]; uint32_t counts[11];
    } qt_quota;
    _Static_assert(sizeof(qt_bucket) == 56, "bucket entry layout");
    _Static_assert(sizeof(qt_slots) == 192 && offsetof(qt_slots, pids) == 32, "slots entry layout");
    _Static_assert(sizeof(qt_quota) == 192 && offsetof(qt_quota, pids) == 104, "quota entry layout");

    /* A product kept apart from the sum it feeds (no fused multiply-add): the pure twin's float results, bit for
       bit. */
    static inline double qt_mul(double a, double b) { volatile double p = a * b; return p; }
    static inline double qt_clock(clockid_t id) {
        struct timespec ts;
        clock_gettime(id, &ts);
        return (double)((int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec) / 1e9;
    }
    static inline int qt_alive(uint32_t pid) { return !(kill((pid_t)pid, 0) != 0 && errno == ESRCH); }
    """
    ctypedef int clockid_t
    int CLOCK_MONOTONIC
    int CLOCK_REALTIME
    ctypedef struct qt_head:
        uint64_t h2
        int64_t kind
        double used
    ctypedef struct qt_bucket:
        uint64_t h2
        int64_t kind
        double used
        double tokens
        double at
        int64_t count
        double period
    ctypedef struct qt_slots:
        uint64_t h2
        int64_t kind
        double used
        int64_t held
        uint32_t pids[20]
        uint32_t counts[20]
    ctypedef struct qt_quota:
        uint64_t h2
        int64_t kind
        double used
        int64_t calls
        int64_t rows
        int64_t base_calls
        int64_t base_rows
        int64_t other_calls
        int64_t other_rows
        double read_at
        int64_t flushing
        double flush_deadline
        double reset_at
        uint32_t pids[11]
        uint32_t counts[11]
    double qt_mul(double a, double b) nogil
    double qt_clock(clockid_t id) nogil
    int qt_alive(uint32_t pid) nogil
    double ceil(double x) nogil


import time as _time

TABLE_HEADER = 64
TABLE_LOCK, TABLE_FULL, TABLE_EVICTIONS = 16, 24, 32
TABLE_ENTRY = 192
TABLE_PROBE = 8
BUCKET, SLOTS, QUOTA, ADDRESS = 1, 2, 3, 4
SLOT_PIDS = 20
QUOTA_PIDS = 11
FLUSH_GRACE = 30.0

cdef enum:
    T_HEADER = 64
    T_LOCK = 16
    T_FULL = 24
    T_EVICTIONS = 32
    T_ENTRY = 192
    T_PROBE = 8
    K_BUCKET = 1
    K_SLOTS = 2
    K_QUOTA = 3
    K_ADDRESS = 4
    R_SPENT_ADDRESS = 4   # the eviction rank of a spent address bucket, for a key's entry only (shmsync.py says why)
    N_SLOT_PIDS = 20
    N_QUOTA_PIDS = 11
cdef double T_FLUSH_GRACE = 30.0

cdef uint64_t _me = <uint64_t>os.getpid()   # the lock word's owner: this process (kept current across forks)


def _after_fork_in_child():
    global _me
    _me = <uint64_t>os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


cdef inline int _take_hold(uint32_t *pids, uint32_t *counts, int n, uint32_t pid) noexcept nogil:
    cdef int i
    for i in range(n):
        if pids[i] == pid:
            counts[i] += 1
            return 1
    for i in range(n):
        if pids[i] == 0:
            pids[i] = pid
            counts[i] += 1
            return 1
    return 0


cdef inline void _drop_hold(uint32_t *pids, uint32_t *counts, int n, uint32_t pid) noexcept nogil:
    cdef int i
    cdef int64_t left
    for i in range(n):
        if pids[i] == pid:
            left = <int64_t>counts[i] - 1
            if left <= 0:
                pids[i] = 0
                counts[i] = 0
            else:
                counts[i] = <uint32_t>left
            return


cdef inline int64_t _reclaim(uint32_t *pids, uint32_t *counts, int n, uint32_t dead) noexcept nogil:
    """Clear the holders that died (or the one pid `dead` when not 0); how many holds they had."""
    cdef int i
    cdef int64_t freed = 0
    cdef uint32_t pid
    for i in range(n):
        pid = pids[i]
        if pid and ((pid == dead) if dead else not qt_alive(pid)):
            freed += counts[i]
            pids[i] = 0
            counts[i] = 0
    return freed


cdef inline bint _any(uint32_t *pids, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if pids[i]:
            return True
    return False


cdef class Table:
    """The host table's operations on a mapping (qag/policy/hostlimits.py), under `sync`'s mutex; as the pure
    twin's Table."""

    cdef Sync _sync
    cdef char *_base
    cdef Py_ssize_t _data
    cdef readonly Py_ssize_t entries
    cdef object _clock
    cdef object _wall
    cdef bint _c_clock
    cdef bint _c_wall

    def __cinit__(self, Sync sync, Py_ssize_t entries, clock=_time.monotonic, wall=_time.time):
        if not sync._held or entries < T_PROBE or T_HEADER + entries * (8 + T_ENTRY) > sync._size:
            raise ValueError(f"a table of {entries} entries does not fit the shared buffer")
        self._sync = sync
        self._base = sync._base
        self.entries = entries
        self._data = T_HEADER + entries * 8
        self._clock, self._wall = clock, wall
        self._c_clock = clock is _time.monotonic
        self._c_wall = wall is _time.time

    # --- the lock and the clocks -----------------------------------------------------------------------------
    cdef inline int _lock(self) except -1:
        if not self._sync._held:
            raise ValueError("the shared buffer was released")
        cdef uint64_t *p = <uint64_t *>(self._base + T_LOCK)
        cdef uint64_t me = _me
        if qag_cas(p, 0, me):
            return 0
        with nogil:
            qag_lock_wait(p, me)
        return 0

    cdef inline void _unlock(self) noexcept:
        qag_store(<uint64_t *>(self._base + T_LOCK), 0)

    cdef inline double _now(self) except? -1.0:
        if self._c_clock:
            return qt_clock(CLOCK_MONOTONIC)
        return self._clock()

    cdef inline double _walltime(self) except? -1.0:
        if self._c_wall:
            return qt_clock(CLOCK_REALTIME)
        return self._wall()

    # --- places (under the lock) -----------------------------------------------------------------------------
    cdef inline uint64_t *_index(self, Py_ssize_t place) noexcept:
        return <uint64_t *>(self._base + T_HEADER + place * 8)

    cdef inline char *_at(self, Py_ssize_t place) noexcept:
        return self._base + self._data + place * T_ENTRY

    cdef Py_ssize_t _find(self, uint64_t h1, uint64_t h2, double now, bint insert, bint *found,
                          bint address=False) except -2:
        """The entry's place (*found set), else a place to put it in (a free one, or one whose entry may go: for a
        key's entry, `address` False, the least recently used spent address bucket last), else -1."""
        cdef Py_ssize_t start = <Py_ssize_t>(h1 % <uint64_t>(self.entries - T_PROBE + 1))
        cdef uint64_t *words = self._index(start)
        cdef int j, r, rank = 9
        cdef Py_ssize_t victim = -1
        cdef double wall, used, oldest = 0.0
        cdef char *e
        found[0] = False
        for j in range(T_PROBE):
            if words[j] == h1 and (<qt_head *>self._at(start + j)).h2 == h2:
                found[0] = True
                return start + j
        if not insert:
            return -1
        for j in range(T_PROBE):
            if words[j] == 0:
                return start + j
        wall = self._walltime()
        for j in range(T_PROBE):
            e = self._at(start + j)
            r = self._evictable(e, now, wall, address)
            if r == R_SPENT_ADDRESS:
                used = (<qt_head *>e).used
                if rank > r or (rank == r and used < oldest):
                    victim, rank, oldest = start + j, r, used
            elif r < rank:
                victim, rank = start + j, r
        return victim

    cdef int _evictable(self, char *e, double now, double wall, bint address) noexcept:
        cdef qt_bucket *b
        cdef qt_quota *q
        cdef int64_t kind = (<qt_head *>e).kind
        if kind == K_BUCKET or kind == K_ADDRESS:
            b = <qt_bucket *>e
            if b.period <= 0 or b.tokens + (now - b.at) * <double>b.count / b.period >= <double>b.count:
                return 1
            return R_SPENT_ADDRESS if kind == K_ADDRESS and not address else 9
        if kind == K_SLOTS:
            return 2 if (<qt_slots *>e).held <= 0 else 9
        if kind == K_QUOTA:
            q = <qt_quota *>e
            if wall > q.reset_at + 60:
                return 3
            if (not _any(q.pids, N_QUOTA_PIDS) and q.calls == q.base_calls and q.rows == q.base_rows
                    and q.flushing <= 0):
                return 3
            return 9
        return 1

    cdef inline void _claim(self, Py_ssize_t place, uint64_t h1) noexcept:
        cdef uint64_t *index = self._index(place)
        if index[0]:
            (<uint64_t *>(self._base + T_EVICTIONS))[0] += 1
        index[0] = h1

    cdef inline void _no_room(self) noexcept:
        (<uint64_t *>(self._base + T_FULL))[0] += 1

    cdef inline Py_ssize_t _entry(self, uint64_t h1, uint64_t h2) except -2:
        cdef bint found
        cdef Py_ssize_t place = self._find(h1, h2, 0.0, False, &found)
        return self._data + place * T_ENTRY if found else -1

    # --- token buckets ---------------------------------------------------------------------------------------
    cdef object _take(self, uint64_t h1, uint64_t h2, int64_t count, double period, double now, bint address):
        cdef bint found
        cdef Py_ssize_t place = self._find(h1, h2, now, True, &found, address)
        cdef qt_bucket *b
        cdef double tokens, refilled
        cdef object result
        if place < 0:
            self._no_room()
            return None
        b = <qt_bucket *>self._at(place)
        if found:
            refilled = b.tokens + qt_mul(now - b.at, <double>count / period)
            tokens = refilled if refilled < <double>count else <double>count
        else:
            tokens = <double>count
        if tokens >= 1.0:
            tokens -= 1.0
            result = (<int64_t>tokens, 0)
        else:
            result = (0, max(<int64_t>1, <int64_t>ceil((1.0 - tokens) * period / <double>count)))
        b.h2, b.kind, b.used, b.tokens, b.at, b.count, b.period = (h2, K_ADDRESS if address else K_BUCKET, now,
                                                                    tokens, now, count, period)
        if not found:
            self._claim(place, h1)
        return result

    def take(self, uint64_t h1, uint64_t h2, int64_t count, double period, bint address=False):
        self._lock()
        try:
            return self._take(h1, h2, count, period, self._now(), address)
        finally:
            self._unlock()

    # --- max_concurrent slots --------------------------------------------------------------------------------
    def acquire(self, uint64_t h1, uint64_t h2, int64_t limit, uint32_t pid):
        cdef bint found
        cdef Py_ssize_t place
        cdef qt_slots e
        cdef qt_slots *at
        cdef double now
        self._lock()
        try:
            now = self._now()
            place = self._find(h1, h2, now, True, &found)
            if place < 0:
                self._no_room()
                return None
            at = <qt_slots *>self._at(place)
            if found:
                memcpy(&e, at, sizeof(qt_slots))
            else:
                memset(&e, 0, sizeof(qt_slots))
                e.h2, e.kind, e.used = h2, K_SLOTS, now
            if e.held >= limit:
                e.held -= _reclaim(e.pids, e.counts, N_SLOT_PIDS, 0)   # holders that died
                if e.held >= limit:
                    memcpy(at, &e, sizeof(qt_slots))
                    return False
            if not _take_hold(e.pids, e.counts, N_SLOT_PIDS, pid):
                e.held -= _reclaim(e.pids, e.counts, N_SLOT_PIDS, 0)
                if not _take_hold(e.pids, e.counts, N_SLOT_PIDS, pid):
                    self._no_room()
                    return None
            e.held += 1
            e.used = now
            memcpy(at, &e, sizeof(qt_slots))
            if not found:
                self._claim(place, h1)
            return self._data + place * T_ENTRY
        finally:
            self._unlock()

    def release(self, uint64_t h1, uint64_t h2, uint32_t pid, Py_ssize_t at=-1):
        cdef Py_ssize_t off
        cdef qt_slots *e
        cdef int i
        cdef int64_t left
        self._lock()
        try:
            if (at >= self._data and (at - self._data) % T_ENTRY == 0 and at + T_ENTRY <= self._sync._size
                    and (<qt_head *>(self._base + at)).h2 == h2):
                off = at
            else:
                off = self._entry(h1, h2)
                if off < 0:
                    return None
            e = <qt_slots *>(self._base + off)
            for i in range(N_SLOT_PIDS):
                if e.pids[i] == pid:
                    left = <int64_t>e.counts[i] - 1
                    if left <= 0:
                        e.pids[i] = 0
                        left = 0
                    e.counts[i] = <uint32_t>left
                    e.held -= 1
                    return None
            return None
        finally:
            self._unlock()

    def held(self, uint64_t h1, uint64_t h2):
        cdef Py_ssize_t off
        self._lock()
        try:
            off = self._entry(h1, h2)
            return (<qt_slots *>(self._base + off)).held if off >= 0 else 0
        finally:
            self._unlock()

    # --- quotas ----------------------------------------------------------------------------------------------
    cdef object _quota(self, uint64_t h1, uint64_t h2, int64_t calls_limit, int64_t rows_limit, bint reserve,
                       double reread_every, uint32_t pid, double now):
        cdef bint found
        cdef Py_ssize_t place = self._find(h1, h2, now, True, &found)
        cdef qt_quota *e
        cdef int64_t calls, rows, freed
        cdef int allowed = 1
        cdef object reread = None
        if not found:
            return None if place >= 0 else False
        e = <qt_quota *>self._at(place)
        if now - e.read_at >= reread_every and (e.flushing <= 0 or now > e.flush_deadline):
            e.read_at, e.flushing = now, 0
            reread = (e.base_calls, e.base_rows)
        calls, rows = e.calls + e.other_calls, e.rows + e.other_rows
        if reserve:
            if calls_limit and calls >= calls_limit and _any(e.pids, N_QUOTA_PIDS):
                freed = _reclaim(e.pids, e.counts, N_QUOTA_PIDS, 0)   # reservations of processes that died
                e.calls -= freed
                calls -= freed
            if (calls_limit and calls >= calls_limit) or (rows_limit and rows >= rows_limit):
                allowed = 0
            else:
                _take_hold(e.pids, e.counts, N_QUOTA_PIDS, pid)
                e.calls += 1
                calls += 1
        e.used = now
        return allowed, calls, rows, reread

    def quota(self, uint64_t h1, uint64_t h2, int64_t calls_limit, int64_t rows_limit, bint reserve,
              double reread_every, uint32_t pid):
        self._lock()
        try:
            return self._quota(h1, h2, calls_limit, rows_limit, reserve, reread_every, pid, self._now())
        finally:
            self._unlock()

    def admit(self, uint64_t bh1, uint64_t bh2, int64_t count, double period, uint64_t qh1, uint64_t qh2,
              int64_t calls_limit, int64_t rows_limit, bint reserve, double reread_every, uint32_t pid,
              bint address=False):
        cdef double now
        cdef object taken
        self._lock()
        try:
            now = self._now()
            taken = self._take(bh1, bh2, count, period, now, address)
            if taken is None:
                return None
            left, retry = taken
            return left, retry, self._quota(qh1, qh2, calls_limit, rows_limit, reserve and not retry,
                                            reread_every, pid, now)
        finally:
            self._unlock()

    def quota_seed(self, uint64_t h1, uint64_t h2, int64_t calls, int64_t rows, double reset_at):
        cdef bint found
        cdef Py_ssize_t place
        cdef qt_quota *e
        cdef double now
        self._lock()
        try:
            now = self._now()
            place = self._find(h1, h2, now, True, &found)
            if found:
                return True
            if place < 0:
                self._no_room()
                return False
            e = <qt_quota *>self._at(place)
            memset(e, 0, sizeof(qt_quota))
            e.h2, e.kind, e.used = h2, K_QUOTA, now
            e.calls, e.rows, e.base_calls, e.base_rows = calls, rows, calls, rows
            e.read_at, e.reset_at = now, reset_at
            self._claim(place, h1)
            return True
        finally:
            self._unlock()

    def quota_reread(self, uint64_t h1, uint64_t h2, int64_t base_calls, int64_t base_rows, int64_t calls,
                     int64_t rows):
        cdef Py_ssize_t off
        cdef qt_quota *e
        self._lock()
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return None
            e = <qt_quota *>(self._base + off)
            if e.base_calls != base_calls or e.base_rows != base_rows or e.flushing > 0:
                return None
            e.other_calls = max(<int64_t>0, calls - e.base_calls)
            e.other_rows = max(<int64_t>0, rows - e.base_rows)
            return None
        finally:
            self._unlock()

    def quota_add(self, uint64_t h1, uint64_t h2, int64_t calls, int64_t rows, bint settle, uint32_t pid):
        cdef Py_ssize_t off
        cdef qt_quota *e
        self._lock()
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return None
            e = <qt_quota *>(self._base + off)
            if settle:
                _drop_hold(e.pids, e.counts, N_QUOTA_PIDS, pid)
            e.calls += calls
            e.rows += rows
            return e.calls + e.other_calls, e.rows + e.other_rows
        finally:
            self._unlock()

    def quota_peek(self, uint64_t h1, uint64_t h2):
        cdef Py_ssize_t off
        cdef qt_quota *e
        self._lock()
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return None
            e = <qt_quota *>(self._base + off)
            return e.calls + e.other_calls, e.rows + e.other_rows
        finally:
            self._unlock()

    def quota_writing(self, list idents, written=None):
        cdef Py_ssize_t off, i
        cdef qt_quota *e
        cdef double now
        cdef uint64_t h1, h2
        # Converted before the lock: a bad argument raises with nothing changed.
        cdef list keys = [(<uint64_t>h1_, <uint64_t>h2_) for h1_, h2_ in idents]
        cdef list done = None
        if written is not None:
            done = [None if d is None else (<int64_t>d[0], <int64_t>d[1]) for d in written]
            if len(done) != len(keys):
                raise ValueError("written must have one item per identity")
        self._lock()
        try:
            now = self._now()
            for i in range(len(keys)):
                h1, h2 = keys[i]
                off = self._entry(h1, h2)
                if off < 0:
                    continue
                e = <qt_quota *>(self._base + off)
                if done is None:
                    e.flushing += 1
                    e.flush_deadline = now + T_FLUSH_GRACE
                else:
                    e.flushing = max(<int64_t>0, e.flushing - 1)
                    if done[i] is not None:
                        e.base_calls += <int64_t>done[i][0]
                        e.base_rows += <int64_t>done[i][1]
            return None
        finally:
            self._unlock()

    # --- a process gone --------------------------------------------------------------------------------------
    def sweep(self, int64_t pid, Py_ssize_t chunk=512):
        cdef Py_ssize_t first, place, last
        cdef int64_t freed = 0, n
        cdef char *e
        cdef int64_t kind
        if pid <= 0 or pid > 0xFFFFFFFF:
            return 0
        if chunk < 1:
            chunk = 1
        first = 0
        while first < self.entries:
            last = min(first + chunk, self.entries)
            self._lock()
            try:
                for place in range(first, last):
                    if not self._index(place)[0]:
                        continue
                    e = self._at(place)
                    kind = (<qt_head *>e).kind
                    if kind == K_SLOTS:
                        n = _reclaim((<qt_slots *>e).pids, (<qt_slots *>e).counts, N_SLOT_PIDS, <uint32_t>pid)
                        (<qt_slots *>e).held -= n
                    elif kind == K_QUOTA:
                        n = _reclaim((<qt_quota *>e).pids, (<qt_quota *>e).counts, N_QUOTA_PIDS, <uint32_t>pid)
                        (<qt_quota *>e).calls -= n
                    else:
                        n = 0
                    freed += n
            finally:
                self._unlock()
            first = last
        return freed

    def used(self):
        cdef Py_ssize_t place, n = 0
        if not self._sync._held:
            raise ValueError("the shared buffer was released")
        for place in range(self.entries):
            if self._index(place)[0]:
                n += 1
        return n
