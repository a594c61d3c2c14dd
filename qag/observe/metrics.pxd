# Types for Cython's build of metrics.py (pure-Python mode): a thread's counters and the worker's Metrics as
# extension types, so the hot path (request, begin, run) reads them as C fields, and its series as a dict and
# lists, so their reads and updates are C calls. metrics.py stays the pure twin.
cimport cython


@cython.locals(bound=cython.double, i=cython.int)
cdef int _bucket(double seconds) noexcept


cdef class _Shard:
    cdef public object req, qry, ser, exp, cache, active
    cdef public dict usage_conn, usage_key   # api/_usage.pxd's record looks them up with C calls


cdef class Metrics:
    cdef public object _shards, _local, _gauges, _started, _pid, _file, _written, _write_lock, _start_lock
    cdef public object _stop
    cdef object __weakref__   # the module's WeakSet of every Metrics (flushed at exit)

    @cython.locals(series=dict, v=list)
    cpdef request(self, method, endpoint, status, key, seconds)
    @cython.locals(shard=_Shard)
    cpdef begin(self)
    @cython.locals(shard=_Shard, series=dict, v=list, s=list)
    cpdef run(self, connection, dialect, ok, key, rows, seconds, fmt=*, encode_seconds=*)
