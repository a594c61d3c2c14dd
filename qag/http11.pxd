# Types for Cython's build of http11.py (pure-Python mode): a parsed request and the limits as extension types, so
# the rules below (run for every request) read and set their fields as C fields. http11.py stays the pure twin.
cimport cython


cdef class Limits:
    cdef public object line, fields, field_size, body, head


cdef class Request:
    cdef public object method, uri, version, headers, body, chunked, content_length, keep_alive, expect_continue
    cdef public object over_limit, upgrade, _te, _cl, _connection, _upgrade_hdr, _expect


cpdef check_line(method, url_len, Limits limits)
@cython.locals(key=str, text=str)
cpdef add_header(Request req, name, value, Limits limits)
@cython.locals(te=object, cl=object)
cpdef headers_done(Request req, major, minor, Limits limits)
