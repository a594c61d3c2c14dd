# Types for Cython's build of _usage.py (pure-Python mode): a thread's shard as an extension type, so recording a
# run reads its two tables as C fields and looks them up with C calls. _usage.py stays the pure twin.
cimport cython


cdef class _Shard:
    cdef public dict connections, keys


cdef class Usage:
    cdef public object _shards, _local

    @cython.locals(shard=_Shard, c=list, k=list)
    cpdef record(self, connection, key, ok, rows, duration_ms)
