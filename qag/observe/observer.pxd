# Types for Cython's build of observer.py (pure-Python mode): the Observer as an extension type, so recording a
# request or a run reads its parts as C fields, and its metrics and queues as their own extension types, so what
# it calls on them each call is a C call. The data plane (api/run.py, app.py) types its observer the same way.
# observer.py stays the pure twin.
from qag.observe.events cimport BatchWriter
from qag.observe.metrics cimport Metrics


cdef class Observer:
    cdef public object gateway, history, logs, handlers, live, log_requests, log_statements, slow_ms
    cdef public object tracing, _closed
    cdef public Metrics metrics
    cdef public BatchWriter _runs, _lines
    cdef object __weakref__   # the module's WeakSet of open observers (closed at exit)

    cpdef request(self, method, endpoint, status, key, seconds, request_id, path, at, trace_id=*)
    cpdef begin(self)
    cpdef done(self, plan, at, rows, duration_ms, encode_seconds)
    cpdef failed(self, plan, at, error, rows=*)
    cpdef refused(self, plan, at, error)
    cpdef streamed(self, plan, at, rows, truncated)
    cpdef _publish(self, record)
    cpdef _log_run(self, plan, at, duration_ms)
