# Types for Cython's build of run.py (pure-Python mode): the per-call Plan and the handlers as extension types, so
# their fields are C reads and the handlers' own steps are C calls. run.py stays the pure twin, unchanged by this.
cimport cython
from qag.api._usage cimport Usage
from qag.auth cimport Caller
from qag.observe.observer cimport Observer


cdef class Plan:
    cdef public object connection, prepared, values, read_only, timeout, fmt, page, size, stream, label
    cdef public object show_detail, request_id, key, query, version, uuid, sql, database, timing, rules
    cdef public object mask, masked, transport


cdef class RunHandlers:
    cdef public object gateway, store, settings, _resolvers, masking, outages, streams
    cdef public Usage usage        # what _run records and observes each call: C calls
    cdef public Observer observe

    cpdef _resolver(self, version)
    cpdef _format_and_timeout(self, request, args, body, Caller caller)
    cpdef _paging(self, args, Caller caller, fmt, ceiling=*)
    cpdef writes_allowed(self, Caller caller, query_name, prepared=*)
    cpdef _check_tables(self, Plan plan, Caller caller, fields)
    cpdef _statement(self, Plan plan)
    @cython.locals(observe=Observer)
    cpdef _execute(self, Plan plan, Caller caller, writes, version)
    cpdef _run(self, Plan plan, Caller caller, writes, version, at)
    cpdef run_named(self, request, Caller caller, name)


cdef _count_text(n)   # a C call from _run
cdef _given(dict args, dict body, str name)
