# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of respond.py: an application's WSGI fields checked, then written, taken or dropped (rules in
its docstring)."""

import re

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

_NAME = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+")
_VALUE = re.compile(r"[ \t\x21-\x7e\x80-\xff]*")
_HOP = frozenset("connection keep-alive proxy-authenticate proxy-authorization te trailers transfer-encoding "
                 "upgrade server date".split())
WRITE, LENGTH, CONNECTION, DROP = range(4)
cdef enum:
    _WRITE = 0
    _LENGTH = 1
    _CONNECTION = 2
    _DROP = 3
cdef dict _ROLES = {}
cdef Py_ssize_t _KNOWN_LIMIT = 1024


def role(name):
    """The role of a field name: WRITE, LENGTH, CONNECTION or DROP; ValueError for an invalid name."""
    if type(name) is not str or not _NAME.fullmatch(name):
        raise ValueError(f"invalid header name {name!r}")
    cdef str lname = (<str>name).lower()
    cdef int found
    if lname == "content-length":
        found = _LENGTH
    elif lname == "connection":
        found = _CONNECTION
    elif lname in _HOP:
        found = _DROP
    else:
        found = _WRITE
    if len(_ROLES) < _KNOWN_LIMIT:
        _ROLES[name] = found
    return found


cdef extern from "Python.h":
    int PyUnicode_KIND(object)
    void* PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)
    int PyUnicode_1BYTE_KIND


cdef inline bint _field_value(str value):
    """The value's grammar: tab, space to tilde, U+0080 to U+00FF. A str holding a character above U+00FF is not
    stored one byte a character, so the kind alone refuses it."""
    if PyUnicode_KIND(value) != PyUnicode_1BYTE_KIND:
        return False
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(value)
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(PyUnicode_GET_LENGTH(value)):
        c = p[i]
        if (c < 32 and c != 9) or c == 127:
            return False
    return True


cdef inline bint _padded(str value):
    """Whether the value starts or ends with a space or a tab (strip(" \\t") would change it)."""
    cdef Py_ssize_t n = len(value)
    if n == 0:
        return False
    cdef Py_UCS4 first = value[0]
    cdef Py_UCS4 last = value[n - 1]
    return first == 32 or first == 9 or last == 32 or last == 9


cdef struct _Buffer:
    char* data
    Py_ssize_t size
    Py_ssize_t room
    bint heap   # data was allocated here (else it is the caller's stack array)


# A usual head's fields fit on the stack: no allocation per response (a few reallocs from empty cost ~1,400
# instructions a call).
cdef enum:
    _STACK_ROOM = 1024


cdef int _put(_Buffer* buf, str name, str text) except -1:
    """Append "name: text\\r\\n" (checked fields: one byte a character, so their Latin-1 bytes)."""
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(name), t = PyUnicode_GET_LENGTH(text)
    cdef Py_ssize_t need = buf.size + n + t + 4
    cdef char* grown
    if need > buf.room:
        if buf.heap:
            grown = <char*>realloc(buf.data, need * 2)
        else:
            grown = <char*>malloc(need * 2)
            if grown != NULL:
                memcpy(grown, buf.data, buf.size)
        if grown == NULL:
            raise MemoryError()
        buf.data, buf.room, buf.heap = grown, need * 2, True
    cdef char* out = buf.data + buf.size
    memcpy(out, PyUnicode_DATA(name), n)
    out[n] = 58   # ": "
    out[n + 1] = 32
    memcpy(out + n + 2, PyUnicode_DATA(text), t)
    out[n + 2 + t] = 13   # CRLF
    out[n + 3 + t] = 10
    buf.size = need
    return 0


cdef object _length(str value):
    """int(value.strip()): a plain run of up to 18 ASCII digits read here, anything else by int()."""
    cdef const unsigned char* p = <const unsigned char*>PyUnicode_DATA(value)
    cdef Py_ssize_t i, n = PyUnicode_GET_LENGTH(value)
    cdef long long number = 0
    if PyUnicode_KIND(value) != PyUnicode_1BYTE_KIND or n == 0 or n > 18:
        return int(value.strip())
    for i in range(n):
        if not 48 <= p[i] <= 57:
            return int(value.strip())
        number = number * 10 + (p[i] - 48)
    return number


def sort_fields(headers):
    cdef list kept = []
    cdef object length = None
    cdef bint close = False
    cdef object found
    cdef int kind
    cdef str text
    cdef char stack[_STACK_ROOM]
    cdef _Buffer buf
    buf.data, buf.size, buf.room, buf.heap = stack, 0, _STACK_ROOM, False
    try:
        for field in headers:
            name, value = field
            # only an exact str is looked up: anything else (an object equal to a known name included) goes to
            # role(), which refuses it, so what is written below is always a checked str
            found = _ROLES.get(name) if type(name) is str else None
            if found is None:
                found = role(name)
            kind = found
            if type(value) is not str or not _field_value(<str>value):
                if not isinstance(value, str) or not _VALUE.fullmatch(value):
                    raise ValueError(f"invalid value for header {name!r}")
            if kind == _WRITE or kind == _LENGTH:
                if type(value) is str and not _padded(<str>value):
                    text = <str>value
                    # the caller's own pair when it is already what is kept (no new tuple)
                    kept.append(field if type(field) is tuple and len(<tuple>field) == 2 else (name, text))
                else:
                    text = value.strip(" \t")
                    kept.append((name, text))
                if kind == _WRITE:
                    _put(&buf, <str>name, text)
                else:
                    length = _length(<str>value)
            elif kind == _CONNECTION and value.strip().lower() == "close":
                close = True
        return kept, PyBytes_FromStringAndSize(buf.data, buf.size), length, close
    finally:
        if buf.heap:
            free(buf.data)
