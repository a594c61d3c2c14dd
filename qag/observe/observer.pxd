# Types for Cython's build of observer.py (pure-Python mode): the Observer as an extension type, so recording a
# request or a run reads its parts as C fields. observer.py stays the pure twin.

cdef class Observer:
    cdef public object gateway, history, logs, metrics, handlers, live, log_requests, log_statements, slow_ms
    cdef public object tracing, _closed, _runs, _lines
    cdef object __weakref__   # the module's WeakSet of open observers (closed at exit)

    cpdef _publish(self, record)
    cpdef _log_run(self, plan, at, duration_ms)
