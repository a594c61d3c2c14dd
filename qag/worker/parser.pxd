# Types for Cython's build of parser.py (pure-Python mode): the llhttp parser's state as an extension type, so feed()
# and the callbacks (run for every request) read and set it as C fields. parser.py stays the pure twin's partner.
cimport cython


cdef class CParser:
    cdef public object limits, ready, partial, continue_due, dead, _p, _req, _url, _body, _in_head, _fed
    cdef public object take_simple
