# Types for Cython's build of router.py (pure-Python mode): the router as an extension type and the segment binder
# as a C function with typed locals, so a match (one per call) is C reads and calls. router.py stays the pure twin.
cimport cython


cdef class Router:
    cdef public dict _by_length

    @cython.locals(params=dict)
    cpdef match(self, list segments, method)


@cython.locals(params=dict, i=Py_ssize_t, kind=int, text=str, segment=str)
cpdef dict _bind(tuple pattern, list segments)
