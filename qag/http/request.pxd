# Types for Cython's build of request.py (pure-Python mode): the request as an extension type, so its own reads
# and writes of its fields (every call parses a target, reads headers) are C field reads. request.py stays the
# pure twin; the environ is a dict (PEP 3333), so its lookups are C dict lookups.
cimport cython


@cython.locals(raw=str, plus_is_space=bint)
cpdef str _decode_component(raw, plus_is_space)
cpdef str _new_request_id()
@cython.locals(args=dict, part=str, name=str, value=str)
cpdef dict parse_query(str query)
cpdef tuple client_of(dict environ, trust_proxy)


cdef class Request:
    cdef public dict environ
    cdef public object method, path, segments, args, request_id, peer, max_body, _body, _json, https

    @cython.locals(raw=str, path=str, query=str, stripped=str)
    cpdef parse_target(self)
    @cython.locals(key=str, keys=dict)
    cpdef header(self, name)
