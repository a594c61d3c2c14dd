# Types for Cython's build of poller.py (pure-Python mode): the epoll poller as an extension type, so a pool
# thread's wait, re-arm and idle (each once per request) read its state as C fields. poller.py stays the pure twin.
cdef class EpollPoller:
    cdef double _spin
    cdef bint _missed
    cdef long _busy
    cdef object _busy_lock, _ep, _conn_ep
    cdef dict _data, _conns
    cdef int _stop_r, _stop_w

    cpdef wait(self, double timeout, bint answered=*)
    cpdef rearm(self, conn)
    cpdef idle(self)
