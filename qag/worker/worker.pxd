# Types for Cython's build of worker.py (pure-Python mode): a client connection and the pool threads' answerer as
# extension types, so reading a connection and answering its requests read their state and the worker's settings
# as C fields, and call each other, the request (http11) and the response writer (wsgi) as C functions. The gunicorn
# worker class itself stays a Python class (gunicorn subclasses need one). worker.py stays the pure twin.
cimport cython

from qag.http11 cimport Request
from qag.worker.wsgi cimport Response


cdef class _Conn:
    cdef public object sock, fd, client, server, base, parser, deadline, started, refusal, in_app, closed, lock
    cdef public object draining, unsent, then_keep, queued


cdef class _Answerer:
    cdef public object worker, poller, log, app, sort_fields, pre_request, post_request, served, max_requests
    cdef public object conns, returned, jobs
    cdef public bint log_access
    cdef public double client_timeout, keepalive
    cdef public int wake_fd

    cpdef follow(self)
    cpdef serve(self)
    cpdef bint read(self, _Conn conn) except -1
    cpdef wait_more(self, _Conn conn)
    cpdef log_refusal(self, _Conn conn, exc)
    cpdef answer(self, _Conn conn, bint keep=*)
    cpdef park(self, _Conn conn, bint keep)
    cpdef wait_room(self, _Conn conn)
    cpdef flush(self, _Conn conn)
    @cython.locals(resp=Response, env=dict, writer=object, unsent=object)
    cpdef bint handle(self, _Conn conn, Request req) except -1
    cpdef unregister_close(self, _Conn conn)
    cpdef close(self, _Conn conn)
    cpdef bint half_close(self, _Conn conn, double seconds) except -1
