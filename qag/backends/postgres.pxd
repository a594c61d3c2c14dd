# Types for Cython's build of postgres.py (pure-Python mode): the backend as an extension type, so a call's steps
# (take, send, read, give back) are C calls and its reads of the Call's parts and of its own pool C field reads.
# postgres.py stays the pure twin. _Link stays a Python class, so the tests can stand in for its socket reads.
from qag.backends.base cimport Backend, Call
from qag.backends.pool cimport Pool


cdef class PostgresBackend(Backend):
    cdef public object settings, _spin, _schemas, _refreshing, _schema_lock, _generation, _own_segment
    cdef public Pool pool

    cpdef _take(self, key, dict fields, defer=*, deadline=*, label=*)
    cpdef _give_back(self, key, link, str sql=*)
    cpdef _inline_reset(self, link, Call call, list statements, reset)
    cpdef _exchange(self, key, dict fields, Call call, list statements)
    cpdef _attempt(self, link, Call call, list statements, reset, deadline)
    cpdef run(self, dict fields, Call call)


cpdef send_call(link, Call call, list statements, reset, deadline, inline=*)
