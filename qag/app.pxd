# Types for Cython's build of app.py (pure-Python mode): the Gateway as an extension type, so the request
# pipeline's reads of its own parts are C field reads and its own steps C calls. app.py stays the pure twin.
cimport cython

cdef class Gateway:
    cdef public object settings, store, store_unavailable, redis, metadata, outages, store_files, backends, secret
    cdef public object auth, headers, max_body, trust_proxy, server_timing, admin_listener, rate_limit
    cdef public object limit_stats, limit_table, address_buckets, key_buckets, slots, quotas, router, observe
    cdef public object tracing, response_cache, run, manage, ops, catalog, events, mcp, mcp_target

    @cython.locals(environ=dict)   # WSGI's environ is a dict (PEP 3333): its .get is a C call
    cpdef handle(self, request, origin)
    cpdef _limit_address(self, request)
    cpdef _limit_key(self, caller, environ)
    cpdef _limits(self, caller, environ, data)
    cpdef _quota(self, caller, environ, data)
