# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of respond.py: an application's WSGI fields checked, then written, taken or dropped (rules in
its docstring)."""

import re

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


cdef inline bint _plain(str value):
    """Printable ASCII only (space to tilde): valid as it is."""
    cdef Py_UCS4 ch
    for ch in value:
        if ch < 32 or ch > 126:
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


def sort_fields(headers):
    cdef list kept = []
    cdef list pieces = []
    cdef object length = None
    cdef bint close = False
    cdef object found
    cdef int kind
    cdef str text
    for name, value in headers:
        try:
            found = _ROLES.get(name)
        except TypeError:   # unhashable
            found = None
        if found is None:
            found = role(name)
        kind = found
        if type(value) is not str or not _plain(<str>value):
            if not isinstance(value, str) or not _VALUE.fullmatch(value):
                raise ValueError(f"invalid value for header {name!r}")
        if kind == _WRITE:
            if type(value) is str and not _padded(<str>value):
                text = <str>value
            else:
                text = value.strip(" \t")
            kept.append((name, text))
            pieces.append(name)
            pieces.append(": ")
            pieces.append(text)
            pieces.append("\r\n")
        elif kind == _LENGTH:
            length = int(value.strip())
            kept.append((name, value.strip(" \t")))
        elif kind == _CONNECTION and value.strip().lower() == "close":
            close = True
    return kept, "".join(pieces), length, close
