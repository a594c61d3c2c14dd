# Types for Cython's build of base.py (pure-Python mode): a call's Call and Result as extension types, so a
# compiled backend reads their fields as C fields, and Backend as one, so a compiled backend can be one too.
# base.py stays the pure twin.

cdef class Call:
    cdef public object sql, args, read_only, timeout, fetch, skip, schema, tables, cursor, functions, connection
    cdef public object identity, json_rows, default_text, writes, write_ops, masked


cdef class Result:
    cdef public object columns, rows, duration_ms, json, count


cdef class Backend:
    pass
