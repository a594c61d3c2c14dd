# Types for Cython's build of response.py (pure-Python mode): the header policy as an extension type, so finish()
# (run on every response) reads its settings as C fields, its own check as a C call, and the remembered roles as a
# C dict. response.py stays the pure twin.
cimport cython


cdef class HeaderPolicy:
    cdef public object cors_any, cors_origins, hsts

    cpdef allowed_origin(self, origin)
    cpdef list cors_headers(self, origin)
    @cython.locals(roles=dict)
    cpdef finish(self, response, request_id, origin, https)


cdef class Response:
    cdef public object status, headers, body
