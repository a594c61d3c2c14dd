# Types for Cython's build of logs.py (pure-Python mode): the LogWriter as an extension type, so the writer
# thread's line formatting reads its parts as C fields and calls its own steps as C calls. logs.py stays the pure
# twin.
cimport cython

cdef class LogWriter:
    cdef public object json, level, stream, enabled, formatter, _second, _stamp, buffer

    cpdef _line(self, item)
    @cython.locals(milli=cython.longlong, second=cython.longlong)
    cpdef _format(self, at, level, logger, rid, key, message, extras, trace=*)
