# Types for Cython's build of mysql.py (pure-Python mode): a pooled connection and the backend as extension types,
# so a call's reads of their parts are C field reads and the backend's own steps C calls. mysql.py stays the pure
# twin.
from qag.backends.base cimport Backend, Call
from qag.backends.watchdog cimport Watchdog

# The process's watchdog, typed: its arm and disarm are C calls.
cdef Watchdog WATCHDOG


cdef class _Link:
    cdef public object conn, fd, thread_id, cursor, reader, poll, pending, arrived, mariadb, with_hint, session_ms
    cdef public object renews, read_only_variable, names, reused

    cpdef readable(self)


cdef class MysqlBackend(Backend):
    cdef public object settings, pool, _grow, _spin, _with_hint, _schemas, renewal_waits
    cdef object __weakref__   # the schema reader's probe holds it weakly

    cpdef _take(self, key, dict fields, read_only, str sql=*, deadline=*, label=*)
    cpdef _give_back(self, key, _Link link, read_only, str sql)
    cpdef _prepare(self, _Link link, str sql, timeout)
    cpdef _cut(self, key, _Link link)
    cpdef run(self, dict fields, Call call)


cpdef tuple _execute(_Link link, str sql, args, skip, count, deadline, json_rows=*)
cpdef bint _preferred(_Link link)
cpdef int _session_use(str sql)
