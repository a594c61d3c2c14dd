# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twin of mysqltime.py: MySQL's canonical DATETIME and DATE text read in C, anything else by mysqlclient.

The canonical text is `YYYY-MM-DD`, `YYYY-MM-DD hh:mm:ss` or that with `.` and 1-6 fraction digits: what the
server sends. For it, mysqlclient's parsers give datetime/date of the same numbers (fraction digits scaled to
microseconds), or None when the datetime constructor refuses them (the zero date). Any other text goes to the
pure twin, which is those parsers, so every result is theirs.
"""

from cpython.datetime cimport import_datetime, date_new, datetime_new

# mysqlclient's parsers, for any text that isn't canonical; the pure twin's names (which stand in when
# mysqlclient, the `mysql` extra, is not installed, so this module loads without it too).
from qag._speedups.mysqltime import date_or_none as _date_or_none
from qag._speedups.mysqltime import datetime_or_none as _datetime_or_none

import_datetime()

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object text, Py_ssize_t* size) except NULL

cdef int[7] _SCALE = [1000000, 100000, 10000, 1000, 100, 10, 1]


cdef inline int _number(const char* p, int count) noexcept:
    """The value of `count` ASCII digits at p, or -1 when one of them isn't a digit."""
    cdef int value = 0, i
    cdef char c
    for i in range(count):
        c = p[i]
        if c < 48 or c > 57:
            return -1
        value = value * 10 + (c - 48)
    return value


cdef inline bint _is_date(const char* p) noexcept:
    return p[4] == 45 and p[7] == 45   # YYYY-MM-DD


def datetime_or_none(s):
    """A DATETIME/TIMESTAMP value's text as a datetime, or None (as MySQLdb.times.DateTime_or_None)."""
    cdef Py_ssize_t n
    cdef const char* p
    cdef int year, month, day, hour, minute, second, micros = 0
    if type(s) is not str or not s.isascii():
        return _datetime_or_none(s)
    p = PyUnicode_AsUTF8AndSize(s, &n)
    if not (n == 19 or (21 <= n <= 26 and p[19] == 46)):
        return _datetime_or_none(s)
    if not (_is_date(p) and p[10] == 32 and p[13] == 58 and p[16] == 58):
        return _datetime_or_none(s)
    year, month, day = _number(p, 4), _number(p + 5, 2), _number(p + 8, 2)
    hour, minute, second = _number(p + 11, 2), _number(p + 14, 2), _number(p + 17, 2)
    if n > 19:
        micros = _number(p + 20, <int>(n - 20))
        if micros < 0:
            return _datetime_or_none(s)
        micros *= _SCALE[n - 20]
    if year < 0 or month < 0 or day < 0 or hour < 0 or minute < 0 or second < 0:
        return _datetime_or_none(s)
    try:
        return datetime_new(year, month, day, hour, minute, second, micros, None)
    except ValueError:
        return None


def date_or_none(s):
    """A DATE value's text as a date, or None (as MySQLdb.times.Date_or_None)."""
    cdef Py_ssize_t n
    cdef const char* p
    cdef int year, month, day
    if type(s) is not str or not s.isascii():
        return _date_or_none(s)
    p = PyUnicode_AsUTF8AndSize(s, &n)
    if n != 10 or not _is_date(p):
        return _date_or_none(s)
    year, month, day = _number(p, 4), _number(p + 5, 2), _number(p + 8, 2)
    if year < 0 or month < 0 or day < 0:
        return _date_or_none(s)
    try:
        return date_new(year, month, day)
    except ValueError:
        return None
