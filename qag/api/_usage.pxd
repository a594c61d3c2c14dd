# Types for Cython's build of _usage.py (pure-Python mode): the thread's metrics shard as its extension type, so
# recording a run reads its two usage tables as C fields and looks them up with C calls. _usage.py stays the pure twin.
cimport cython
from qag.observe.metrics cimport _Shard


cdef class Usage:
    cdef public object metrics, _local

    @cython.locals(shard=_Shard, c=list, k=list)
    cpdef record(self, connection, key, ok, rows, duration_ms)
