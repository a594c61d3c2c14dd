# cython: language_level=3
"""A compiled driver's wait for its database's reply: a thread that waits alone spins before it sleeps.

Shared by the compiled twins that wait on a database socket (_pgpipe, _myresult); inline, so each module has its
own copy of the code and of the count of its waiters. Why spin: a core left idle halts, and waking it (on a virtual
machine above all) costs more than a short reply takes, so a lone call spins so that its reply finds the core awake.
The rule, per connection (`missed`): a spin that ends before the reply comes makes the next waits sleep at once (a
write's reply, a long query's), until a reply that was slept for comes within a spin's time.
"""

from posix.time cimport clock_gettime, timespec, CLOCK_MONOTONIC

cdef extern from "<sched.h>" nogil:
    int sched_yield()

# poll() for both drivers' waits (_pgpipe's too).
cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN
    short POLLPRI
    short POLLOUT

# How many of this process's threads wait for a reply of this module's database right now (atomic: they wait
# without the interpreter lock). Only a thread that waits alone spins.
cdef extern from *:
    """
    static int qag_lone_waiting = 0;
    static inline int qag_lone_wait_begin(void) { return __atomic_fetch_add(&qag_lone_waiting, 1, __ATOMIC_RELAXED); }
    static inline void qag_lone_wait_end(void) { __atomic_fetch_sub(&qag_lone_waiting, 1, __ATOMIC_RELAXED); }
    """
    int qag_lone_wait_begin() nogil
    void qag_lone_wait_end() nogil


cdef inline double monotonic() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)     # the clock of time.monotonic(), which the deadlines come from
    return <double>now.tv_sec + <double>now.tv_nsec * 1e-9


cdef inline bint spin_until_readable(int fd, double spin, bint bounded, double limit) noexcept nogil:
    """Look at the socket without sleeping for up to `spin` seconds (never past `limit` when `bounded`), giving the
    core to any other runnable thread between looks; whether the reply came."""
    cdef pollfd fds
    cdef double until = monotonic() + spin
    if bounded and limit < until:
        until = limit                   # never past the call's deadline: the wait after it reports that
    fds.fd = fd
    fds.events = POLLIN | POLLPRI
    while True:
        fds.revents = 0
        if poll(&fds, 1, 0) > 0:
            return True
        if monotonic() >= until:
            return False
        sched_yield()


cdef inline bint spin_first(int fd, double spin, bint bounded, double limit, bint *missed,
                            double *began) noexcept nogil:
    """Before a wait for a reply: spin when `spin` > 0, the last spin didn't miss and no other thread of the process
    waits; whether the reply came (if not, the caller sleeps for it between qag_lone_wait_begin and _end, then
    calls slept with `began`)."""
    cdef bint came = False
    began[0] = monotonic() if spin > 0 else 0.0
    if spin > 0 and not missed[0]:
        if qag_lone_wait_begin() == 0:
            came = spin_until_readable(fd, spin, bounded, limit)
            missed[0] = not came
        qag_lone_wait_end()
    return came


cdef inline void slept(double spin, double began, bint *missed) noexcept nogil:
    """After a reply that was slept for: one that came within a spin's time turns spinning back on."""
    if missed[0] and monotonic() - began < spin:
        missed[0] = False
