# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of httphead.py: complete request heads of the plainest kind, taken without llhttp (grammar and
rules in its docstring). One pass checks a head's bytes; a second builds the request. A limit about to be
passed is left to http11's own check_line/add_header, which raise the refusal; headers_done decides the rest."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeLatin1
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.string cimport memcmp

from qag.http11 import Request, add_header, check_line, headers_done

cdef bint _TCHAR[256]
cdef int _c
for _c in range(256):
    _TCHAR[_c] = (48 <= _c <= 57 or 65 <= _c <= 90 or 97 <= _c <= 122
                  or _c in b"!#$%&'*+-.^_`|~")


# Field names clients commonly send, upper-cased as the request keeps them: such a name is this same str each
# time (its hash computed once, for the environ's lookups), not a new one decoded per request.
cdef tuple _KNOWN = tuple("HOST ACCEPT ACCEPT-ENCODING ACCEPT-LANGUAGE USER-AGENT CONNECTION X-API-KEY AUTHORIZATION "
                          "X-REQUEST-ID IF-NONE-MATCH IF-MATCH ORIGIN REFERER COOKIE CACHE-CONTROL CONTENT-TYPE "
                          "X-FORWARDED-FOR X-FORWARDED-PROTO TRACEPARENT".split())


cdef extern from "Python.h":
    void* PyUnicode_DATA(object)
    Py_ssize_t PyUnicode_GET_LENGTH(object)


cdef str _known_name(const unsigned char* upper, Py_ssize_t n):
    """The str of _KNOWN equal to the n upper-case bytes, or a new one."""
    cdef Py_ssize_t i
    cdef object known
    for i in range(PyTuple_GET_SIZE(_KNOWN)):
        known = <object>PyTuple_GET_ITEM(_KNOWN, i)
        if PyUnicode_GET_LENGTH(known) == n and memcmp(PyUnicode_DATA(known), upper, n) == 0:
            return <str>known
    return PyUnicode_DecodeLatin1(<const char*>upper, n, NULL)


cdef inline unsigned char _lower(unsigned char c):
    return c + 32 if 65 <= c <= 90 else c


cdef bint _named(const unsigned char* p, Py_ssize_t n, const char* lower_name):
    """Whether the n bytes at p are lower_name (ASCII, any case)."""
    cdef Py_ssize_t i
    for i in range(n):
        if _lower(p[i]) != <unsigned char>lower_name[i]:
            return False
    return True


cdef bint _left_to_llhttp(const unsigned char* p, Py_ssize_t n):
    if n == 14:
        return _named(p, n, b"content-length")
    if n == 17:
        return _named(p, n, b"transfer-encoding")
    if n == 7:
        return _named(p, n, b"upgrade")
    if n == 6:
        return _named(p, n, b"expect")
    return False


cdef Py_ssize_t _head_end(const unsigned char* p, Py_ssize_t pos, Py_ssize_t n):
    """The index after the head starting at pos if it is complete and simple, else -1 (checks only)."""
    cdef Py_ssize_t i, j
    if n - pos >= 4 and memcmp(p + pos, b"GET ", 4) == 0:
        i = pos + 4
    elif n - pos >= 5 and memcmp(p + pos, b"HEAD ", 5) == 0:
        i = pos + 5
    else:
        return -1
    if i >= n or p[i] != 47:                                  # "/"
        return -1
    i += 1
    while i < n and 33 <= p[i] <= 126 and p[i] != 35:        # visible ASCII but "#"
        i += 1
    if n - i < 11 or memcmp(p + i, b" HTTP/1.", 8) != 0 or (p[i + 8] != 48 and p[i + 8] != 49) \
            or p[i + 9] != 13 or p[i + 10] != 10:
        return -1
    i += 11
    while True:
        if i + 1 < n and p[i] == 13 and p[i + 1] == 10:
            return i + 2
        j = i
        while j < n and _TCHAR[p[j]]:
            j += 1
        if j == i or j >= n or p[j] != 58:                   # a token, then ":"
            return -1
        if _left_to_llhttp(p + i, j - i):
            return -1
        j += 1
        while j < n and (p[j] == 9 or 32 <= p[j] <= 126):
            j += 1
        if j + 1 >= n or p[j] != 13 or p[j + 1] != 10:
            return -1
        i = j + 2


def take(data, limits, ready):
    if type(data) is not bytes:
        return 0, False
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t pos = 0, end, i, j, k, vs, ve, url_start
    cdef Py_ssize_t line_limit = limits.line, fields_limit = limits.fields, size_limit = limits.field_size
    cdef unsigned char upper[128]
    cdef list headers
    cdef str method, key, text
    cdef object connection
    cdef int minor
    while True:
        end = _head_end(p, pos, n)
        if end < 0:
            return pos, False
        if p[pos] == 71:                                      # "G"
            method, i = "GET", pos + 4
        else:
            method, i = "HEAD", pos + 5
        url_start = i
        while p[i] != 32:
            i += 1
        if len(method) + 1 + (i - url_start) + 9 > line_limit:
            check_line(method, i - url_start, limits)         # raises the refusal
        req = Request(method, PyUnicode_DecodeLatin1(<const char*>p + url_start, i - url_start, NULL))
        minor = p[i + 8] - 48
        i += 11
        headers = []
        connection = None
        while i < end - 2:
            j = i
            while p[j] != 58:
                j += 1
            vs = j + 1
            while p[vs] == 32 or p[vs] == 9:                  # llhttp drops the value's leading whitespace
                vs += 1
            ve = vs
            while p[ve] != 13:
                ve += 1
            if (j - i) + 2 + (ve - vs) > size_limit or len(headers) >= fields_limit:
                req.headers = headers
                add_header(req, data[i:j], data[vs:ve], limits)   # raises the refusal
            if j - i <= 128:
                for k in range(j - i):
                    upper[k] = p[i + k] - 32 if 97 <= p[i + k] <= 122 else p[i + k]
                key = _known_name(upper, j - i)
            else:
                key = PyUnicode_DecodeLatin1(<const char*>p + i, j - i, NULL).upper()
            k = ve
            while k > vs and (p[k - 1] == 32 or p[k - 1] == 9):
                k -= 1
            text = PyUnicode_DecodeLatin1(<const char*>p + vs, k - vs, NULL)
            if j - i == 10 and key == "CONNECTION":
                connection = text if connection is None else connection + "," + text
            headers.append((key, text))
            i = ve + 2
        req.headers = headers
        req._connection = connection
        headers_done(req, 1, minor, limits)
        ready.append(req)
        pos = end
        if not req.keep_alive:
            return pos, True
