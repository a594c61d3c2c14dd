# Types for Cython's build of pool.py (pure-Python mode): the Pool as an extension type, so a call's acquire and
# release read its parts as C fields and take an idle connection by a C call. pool.py stays the pure twin.

cdef class Pool:
    cdef public object idle_limit, idle_timeout, max_open, wait, _close, _idle, _open, _lock, _freed, _waiting
    cdef public object waiting, waits

    cpdef _notify(self)
    cpdef _take_idle(self, key, prefer, list stale, fallback=*, oldest=*)
