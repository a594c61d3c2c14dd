# Types for Cython's build of wsgi.py (pure-Python mode): the response writer as an extension type and the parsed
# request as http11's, so the per-request steps (environ, start_response, the head, the write) read their fields
# as C fields and call each other as C functions. wsgi.py stays the pure twin.
cimport cython

from qag.http11 cimport Request


@cython.locals(env=dict, keys=dict, uri=str, path_q=str, path=str, query=str, name=str, value=str, key=str,
               found=tuple, kind=int)
cpdef dict environ(Request req, dict base, client, server)
cpdef dict connection_environ(dict base, client)
cpdef _client_environ(dict env, client)
cpdef bytes _date()
cpdef send_now(sock, data)
cpdef send_all(sock, data, timeout)


cdef class Response:
    cdef public object sock, timeout, status, code, headers, length, chunked, close, headers_sent, sent, no_body
    cdef public object _head, _lines, _sort_fields
    cdef public Request req

    @cython.locals(lines=dict, known=tuple, code=object)
    cpdef start_response(self, status, headers, exc_info=*)
    @cython.locals(framing=bytes, connection=bytes, known_lengths=dict)
    cpdef bytes _build_head(self, body_len, body=*)
    cpdef write(self, data)
    cpdef write_whole(self, body)
    cpdef finish(self)
