# Types for Cython's build of app.py (pure-Python mode): the Gateway as an extension type, so the request
# pipeline's reads of its own parts are C field reads and its own steps C calls. app.py stays the pure twin.
cimport cython
from qag.auth cimport Caller
from qag.http.request cimport Request
from qag.http.response cimport Response
from qag.observe.observer cimport Observer as ObserverType   # app.py imports the class by its own name

cdef class Gateway:
    cdef public object settings, store, store_unavailable, redis, metadata, outages, store_files, backends, secret
    cdef public object auth, headers, max_body, trust_proxy, server_timing, admin_listener, rate_limit
    cdef public object limit_stats, limit_table, address_buckets, key_buckets, slots, quotas, router
    cdef public ObserverType observe   # each response is recorded with a C call
    cdef public object tracing, response_cache, run, manage, ops, catalog, events, mcp, mcp_target

    @cython.locals(request=Request, response=Response)
    cpdef _call(self, dict environ, start_response)   # WSGI's environ is a dict (PEP 3333): its .get is a C call
    @cython.locals(environ=dict, caller=Caller)
    cpdef handle(self, Request request, origin)
    cpdef _limit_address(self, request)
    cpdef _limit_key(self, caller, environ)
    cpdef _limits(self, caller, environ, data)
    cpdef _quota(self, caller, environ, data)
