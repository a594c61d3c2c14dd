# Types for Cython's build of events.py (pure-Python mode): the BatchWriter as an extension type, so a request
# thread's put() reads the writer's parts as C fields. events.py stays the pure twin.

cdef class BatchWriter:
    cdef public object name, _host, capacity, interval, wake_at, _write, _tick, _tick_every, _retry, _queue, _wake
    cdef public object _flush_lock, _drop_lock, _thread, _running, _closed, _held, _held_since, dropped, written
    cdef public object failed, _dropped_logged, _last_drop_log, _held_id
    cdef object __weakref__   # the module's WeakSet of writers (started afresh after a fork)

    cpdef put(self, record)   # a C call from the request threads (observer.pxd types its queues)
