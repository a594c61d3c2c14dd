# Types for Cython's build of watchdog.py (pure-Python mode): the watchdog as an extension type, so a MySQL call's
# arm and disarm (two per call) are C calls reading C fields. watchdog.py stays the pure twin.
cdef class Watchdog:
    cdef object _lock, _thread
    cdef dict _armed
    cdef long long _last
    cdef public object fired

    cpdef long long arm(self, fd, deadline, cancel=*, tuple args=*) except -1
    cpdef bint disarm(self, long long token) except -1


cpdef deadline_of(timeout)
