# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False, cdivision=True
"""Result rows to JSON, NDJSON, CSV and TSV bytes: the compiled twin of rowjson.py (rules in its docstring).

The bytes are built in one growable C buffer: strings are escaped or UTF-8 encoded straight from the
str's code units, ints and floats are formatted without intermediate objects, and exact datetime,
date and time values are formatted from their C fields. Every other type goes through the same
conversions as the pure twin, written out again here because both must give the same bytes and
errors without importing each other.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.datetime cimport (
    import_datetime, datetime_year, datetime_month, datetime_day, datetime_hour, datetime_minute,
    datetime_second, datetime_microsecond, date_year, date_month, date_day,
    time_hour, time_minute, time_second, time_microsecond, time_tzinfo,
)
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_AsDouble
from cpython.list cimport PyList_GET_ITEM
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.math cimport NAN, isfinite
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy, strlen

from qag._speedups._jsontext cimport escape

import json
import math
from datetime import date, datetime, time
import decimal
from decimal import Decimal

cdef extern from "Python.h":
    unsigned int PyUnicode_KIND(object o)
    void* PyUnicode_DATA(object o)
    Py_ssize_t PyUnicode_GET_LENGTH(object o)
    bint PyUnicode_Check(object o)
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags, int* ptype) except NULL
    int Py_DTSF_ADD_DOT_0
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1

cdef extern from *:
    """
    /* Strings made by the legacy wchar API are not "ready" before 3.12; reading their code units
       needs the canonical representation. From 3.12 every str is ready. */
    static int qag_str_ready(PyObject *s) {
    #if PY_VERSION_HEX < 0x030C0000
        return PyUnicode_READY(s);
    #else
        (void)s;
        return 0;
    #endif
    }
    """
    int qag_str_ready(object s) except -1

cdef extern from *:
    """
    /* CPython's C decimal type (Modules/_decimal) on 64-bit libmpdec: the object's head, its hash, then the
       mpd_t of its value, (-1)^(flags & 1) x coefficient x 10^exp, the coefficient in base-10^19 words. Read
       only after qag_decimal_parts agreed with as_tuple() on known values (_decimal_fields_agree). */
    typedef struct { uint8_t flags; Py_ssize_t exp; Py_ssize_t digits; Py_ssize_t len; Py_ssize_t alloc;
                     uint64_t *data; } qag_mpd;
    typedef struct { PyObject_HEAD Py_hash_t hash; qag_mpd dec; } qag_decimal;
    static int qag_decimal_fields_known = 0;
    static const double qag_tens[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12,
                                        1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

    static void qag_decimal_parts(PyObject *v, int *flags, Py_ssize_t *exp, Py_ssize_t *len, uint64_t *low) {
        const qag_mpd *d = &((const qag_decimal *)v)->dec;
        *flags = d->flags; *exp = d->exp; *len = d->len; *low = d->len > 0 ? d->data[0] : 0;
    }

    /* float(v) in one correctly rounded IEEE operation when the coefficient and the power of ten are both exact
       doubles (at most 2^53 and 10^22: Clinger's fast path); 0 when the value is outside it or special. */
    static inline int qag_decimal_double(PyObject *v, double *out) {
        const qag_mpd *d = &((const qag_decimal *)v)->dec;
        double x;
        if (!qag_decimal_fields_known || (d->flags & 14) || d->len != 1 || d->data[0] > 9007199254740992ULL
                || d->exp < -22 || d->exp > 22)
            return 0;
        x = (double)d->data[0];
        x = d->exp < 0 ? x / qag_tens[-d->exp] : x * qag_tens[d->exp];
        *out = (d->flags & 1) ? -x : x;
        return 1;
    }
    """
    int qag_decimal_fields_known
    Py_ssize_t qag_decimal_size "sizeof(qag_decimal)"
    void qag_decimal_parts(object v, int *flags, Py_ssize_t *exp, Py_ssize_t *len, uint64_t *low) noexcept
    bint qag_decimal_double(object v, double *out) noexcept

import_datetime()

__all__ = ["unique_columns", "encode_json", "encode_ndjson", "encode_delimited"]

cdef object _Decimal = Decimal
cdef object _datetime = datetime
cdef tuple _date_time = (date, time)
cdef tuple _BINARY = (bytes, bytearray, memoryview)
cdef tuple _CONTAINERS = (dict, list)

# 1 for the code units json.dumps(ensure_ascii=True) writes as they are: printable ASCII but " and \.
cdef uint8_t _JSON_PLAIN[256]
for _i in range(256):
    _JSON_PLAIN[_i] = 1 if (0x20 <= _i <= 0x7E and _i != 0x22 and _i != 0x5C) else 0
del _i


cdef struct Buf:
    char* data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _grow(Buf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = b.cap * 2
    if cap < b.size + extra:
        cap = b.size + extra
    cdef char* p = <char*>PyMem_Realloc(b.data, cap)
    if p == NULL:
        raise MemoryError()
    b.data = p
    b.cap = cap
    return 0


cdef inline int _reserve(Buf* b, Py_ssize_t extra) except -1:
    if b.size + extra > b.cap:
        return _grow(b, extra)
    return 0


cdef inline int _put(Buf* b, const char* s, Py_ssize_t n) except -1:
    _reserve(b, n)
    memcpy(b.data + b.size, s, n)
    b.size += n
    return 0


cdef inline int _put_bytes(Buf* b, bytes s) except -1:
    return _put(b, PyBytes_AS_STRING(s), PyBytes_GET_SIZE(s))


cdef int _open(Buf* b, Py_ssize_t cap) except -1:
    b.data = <char*>PyMem_Malloc(cap)
    if b.data == NULL:
        raise MemoryError()
    b.size = 0
    b.cap = cap
    return 0


cdef inline bytes _close(Buf* b):
    return PyBytes_FromStringAndSize(b.data, b.size)


cdef const char* _PAIRS = (b"00010203040506070809101112131415161718192021222324252627282930313233343536373839"
                           b"4041424344454647484950515253545556575859606162636465666768697071727374757677787980"
                           b"81828384858687888990919293949596979899")
cdef unsigned long long _TENS[20]
_TENS[0] = 1
for _i in range(1, 20):
    _TENS[_i] = _TENS[_i - 1] * 10


cdef int _put_llong(Buf* b, long long v) except -1:
    # Written in place, two digits a step: an int is most of a page's values (pgbench rows: three of four).
    _reserve(b, 20)
    cdef char* o = b.data + b.size
    cdef unsigned long long u = (<unsigned long long>(-(v + 1))) + 1 if v < 0 else <unsigned long long>v
    cdef int n = 1
    if v < 0:
        o[0] = b'-'
        o += 1
    while n < 20 and u >= _TENS[n]:
        n += 1
    cdef char* p = o + n
    b.size = p - b.data
    while u >= 100:
        p -= 2
        memcpy(p, _PAIRS + (u % 100) * 2, 2)
        u //= 100
    if u >= 10:
        memcpy(p - 2, _PAIRS + u * 2, 2)
    else:
        p[-1] = <char>(48 + u)
    return 0


cdef int _put_ascii_str(Buf* b, str s) except -1:
    # Only for text known to be ASCII (digits of a big int); one byte per code unit.
    return _put(b, <const char*>PyUnicode_DATA(s), PyUnicode_GET_LENGTH(s))


cdef int _put_int(Buf* b, object v) except -1:
    cdef int overflow = 0
    cdef long long x = PyLong_AsLongLongAndOverflow(v, &overflow)
    if overflow:
        # int.__repr__ as the json encoder and csv writer call it, with the same digit limit error.
        return _put_ascii_str(b, int.__repr__(v))
    return _put_llong(b, x)


cdef double _P10[23]
for _i in range(23):
    _P10[_i] = 10.0 ** _i
del _i


cdef int _put_short_double(Buf* b, double d) except -1:
    # repr() of floats with at most 15 significant digits in repr's fixed-notation range, without
    # its general algorithm: returns 1 when written, 0 to leave it to _put_double. For k = 0, 1, ...
    # m = round(d * 10**k) is the only k-decimal candidate (exact while m < 1e15), and m / 10**k
    # (a correctly rounded division of exact values, which is what parsing "m e-k" gives) equals d
    # exactly when the candidate reads back as d. The first k that does is the shortest repr:
    # decimals of up to 15 digits map to distinct floats, so there is no tie to break.
    cdef double a = -d if d < 0 else d
    cdef double x
    cdef long long m, ip
    cdef int k, i
    cdef char tmp[40]
    cdef char* o
    if not (1e-4 <= a < 1e15):
        return 0
    for k in range(23):
        x = a * _P10[k]
        if x >= 1e15:
            return 0
        m = <long long>(x + 0.5)
        if <double>m / _P10[k] != a:
            continue
        o = tmp + 40
        if k == 0:
            o -= 2
            o[0] = b'.'
            o[1] = b'0'
        else:
            for i in range(k):
                o -= 1
                o[0] = <char>(48 + m % 10)
                m //= 10
            o -= 1
            o[0] = b'.'
        ip = m
        while True:
            o -= 1
            o[0] = <char>(48 + ip % 10)
            ip //= 10
            if ip == 0:
                break
        if d < 0:
            o -= 1
            o[0] = b'-'
        _put(b, o, tmp + 40 - o)
        return 1
    return 0


cdef int _put_double(Buf* b, double d) except -1:
    if _put_short_double(b, d):
        return 0
    # float.__repr__'s own formatting call: shortest round-trip digits, ".0" added to integers.
    cdef char* s = PyOS_double_to_string(d, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        _put(b, s, strlen(s))
    finally:
        PyMem_Free(s)
    return 0


cdef uint64_t _ONES = 0x0101010101010101ULL
cdef uint64_t _HIGH = 0x8080808080808080ULL


cdef inline bint _has_zero_byte(uint64_t v) noexcept:
    return ((v - _ONES) & ~v & _HIGH) != 0


cdef inline bint _plain8(uint64_t w) noexcept:
    """Whether all eight bytes of w are _JSON_PLAIN: none at or over 0x7F, under 0x20, a quote or a backslash.
    Each test is exact as a whole (a borrow only ever flags bytes above one that is already flagged)."""
    if w & _HIGH:
        return False
    if (w + _ONES) & _HIGH:                 # 0x7F (no carry between bytes: all are under 0x80 here)
        return False
    if (w - 0x2020202020202020ULL) & ~w & _HIGH:      # a byte under 0x20
        return False
    return not (_has_zero_byte(w ^ 0x2222222222222222ULL) or _has_zero_byte(w ^ 0x5C5C5C5C5C5C5C5CULL))


cdef int _put_json_str(Buf* b, object s) except -1:
    qag_str_ready(s)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i
    cdef unsigned int kind = PyUnicode_KIND(s)
    cdef void* data = PyUnicode_DATA(s)
    cdef const uint8_t* d1
    cdef const uint16_t* d2
    cdef const uint32_t* d4
    cdef uint32_t c
    # Worst case per code unit: 6 bytes (\uXXXX), 12 for an astral code point (a surrogate pair).
    _reserve(b, 2 + n * (12 if kind == 4 else 6))
    cdef char* o = b.data + b.size
    o[0] = b'"'
    o += 1
    cdef uint64_t w
    if kind == 1:
        d1 = <const uint8_t*>data
        i = 0
        while i < n:
            # Eight code units at a time while none needs escaping (most text): one test and one copy each.
            if i + 8 <= n:
                memcpy(&w, d1 + i, 8)
                if _plain8(w):
                    memcpy(o, &w, 8)
                    o += 8
                    i += 8
                    continue
            c = d1[i]
            if _JSON_PLAIN[c]:
                o[0] = <char>c
                o += 1
            else:
                o = escape(o, c)
            i += 1
    else:
        d2 = <const uint16_t*>data
        d4 = <const uint32_t*>data
        for i in range(n):
            c = d2[i] if kind == 2 else d4[i]
            if c < 256 and _JSON_PLAIN[c]:
                o[0] = <char>c
                o += 1
            else:
                o = escape(o, c)
    o[0] = b'"'
    o += 1
    b.size = o - b.data
    return 0


cdef inline char* _d2(char* o, int v) noexcept:
    o[0] = <char>(48 + v // 10)
    o[1] = <char>(48 + v % 10)
    return o + 2


cdef inline char* _ymd(char* o, int y, int m, int d) noexcept:
    o[0] = <char>(48 + y // 1000)
    o[1] = <char>(48 + (y // 100) % 10)
    o = _d2(o + 2, y % 100)
    o[0] = b'-'
    o = _d2(o + 1, m)
    o[0] = b'-'
    return _d2(o + 1, d)


cdef inline char* _hms(char* o, int h, int mi, int s) noexcept:
    o = _d2(o, h)
    o[0] = b':'
    o = _d2(o + 1, mi)
    o[0] = b':'
    return _d2(o + 1, s)


cdef inline char* _fraction(char* o, int us) noexcept:
    cdef int i
    o[0] = b'.'
    for i in range(6, 0, -1):
        o[i] = <char>(48 + us % 10)
        us //= 10
    return o + 7


cdef int _put_exact_datetime(Buf* b, object v, bint fraction) except -1:
    # "YYYY-MM-DD HH:MM:SS", plus ".ffffff" when asked and non-zero (str() of a naive datetime).
    _reserve(b, 26)
    cdef char* o = _ymd(b.data + b.size, datetime_year(v), datetime_month(v), datetime_day(v))
    o[0] = b' '
    o = _hms(o + 1, datetime_hour(v), datetime_minute(v), datetime_second(v))
    if fraction and datetime_microsecond(v):
        o = _fraction(o, datetime_microsecond(v))
    b.size = o - b.data
    return 0


cdef int _put_exact_date(Buf* b, object v) except -1:
    _reserve(b, 10)
    b.size = _ymd(b.data + b.size, date_year(v), date_month(v), date_day(v)) - b.data
    return 0


cdef int _put_naive_time(Buf* b, object v) except -1:
    # time.isoformat() and str() of a time without tzinfo.
    _reserve(b, 15)
    cdef char* o = _hms(b.data + b.size, time_hour(v), time_minute(v), time_second(v))
    if time_microsecond(v):
        o = _fraction(o, time_microsecond(v))
    b.size = o - b.data
    return 0


def _datetime_text(value):
    return "%04d-%02d-%02d %02d:%02d:%02d" % (value.year, value.month, value.day,
                                             value.hour, value.minute, value.second)


cdef bint _decimal_fields_agree():
    # The fast path reads the decimal type's C fields: only on a 64-bit CPython whose Decimal reads as its
    # as_tuple() says for values at and past the path's edges (else float() of each value, as before).
    cdef int flags
    cdef Py_ssize_t exp, length
    cdef uint64_t low
    if sizeof(void *) != 8 or not hasattr(decimal, "__libmpdec_version__") or (
            _Decimal.__basicsize__ < qag_decimal_size):
        return False
    for text in ("0", "-0.00", "123.45", "-9007199254740992", "1E+22", "-7.5E-22", "9999999999999999999",
                 "12345678901234567890.123", "-Infinity", "NaN", "sNaN"):
        value = _Decimal(text)
        sign, digits, exponent = value.as_tuple()
        qag_decimal_parts(value, &flags, &exp, &length, &low)
        if (flags & 1) != sign or bool(flags & 14) != (not isinstance(exponent, int)):
            return False
        if isinstance(exponent, int):
            coefficient = int("".join(map(str, digits)))
            words, rest = 1, coefficient // 10 ** 19
            while rest:
                words, rest = words + 1, rest // 10 ** 19
            if exp != exponent or length != words or low != coefficient % 10 ** 19:
                return False
    return True


qag_decimal_fields_known = _decimal_fields_agree()
decimal_fields_known = bool(qag_decimal_fields_known)   # for the tests: the fast path is on


cdef inline double _exact_decimal_double(object value) except? -1.0:
    # float() of an exact Decimal is its value (a quiet NaN gives NaN); only a signalling NaN refuses, and it
    # means NaN as in _decimal_float. Without the Python call: Decimal columns come in every row. Most values
    # (a few digits after the point) take the C fields' way, where float() would print and parse the text.
    cdef double d
    if qag_decimal_double(value, &d):
        return d
    try:
        return PyFloat_AsDouble(value)
    except ValueError:
        return NAN


def _decimal_float(value):
    # float() refuses a signalling NaN; it means NaN like the quiet one.
    return math.nan if value.is_nan() else float(value)


def _nested_default(value):
    if isinstance(value, _datetime):
        return _datetime_text(value)
    if isinstance(value, _date_time):
        return value.isoformat()
    if isinstance(value, _Decimal):
        return _decimal_float(value)
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


cdef object _json_other(object value):
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return str(value)
    if isinstance(value, _Decimal):
        value = _decimal_float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, _datetime):
        return _datetime_text(value)
    if isinstance(value, _date_time):
        return value.isoformat()
    if isinstance(value, _CONTAINERS):
        return json.dumps(value, default=_nested_default)
    return str(value)


cdef object _csv_other(object value):
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, _Decimal):
        return repr(_decimal_float(value))
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, _datetime):
        return str(value.replace(tzinfo=None) if value.tzinfo is not None else value)
    if isinstance(value, _date_time):
        return str(value)
    if isinstance(value, _CONTAINERS):
        return json.dumps(value, default=_nested_default)
    return str(value)


cdef int _put_json_value(Buf* b, object v) except -1:
    cdef type t = type(v)
    cdef double d
    if t is str:
        return _put_json_str(b, v)
    if t is int:
        return _put_int(b, v)
    if t is float:
        d = PyFloat_AS_DOUBLE(v)
        if isfinite(d):
            return _put_double(b, d)
        return _put(b, b"null", 4)
    if v is None:
        return _put(b, b"null", 4)
    if t is bool:
        return _put(b, b"true", 4) if v else _put(b, b"false", 5)
    if t is _datetime or t is date or (t is time and time_tzinfo(v) is None):
        _put(b, b'"', 1)
        if t is _datetime:
            _put_exact_datetime(b, v, False)
        elif t is date:
            _put_exact_date(b, v)
        else:
            _put_naive_time(b, v)
        return _put(b, b'"', 1)
    if t is _Decimal:
        d = _exact_decimal_double(v)
        if isfinite(d):
            return _put_double(b, d)
        return _put(b, b"null", 4)
    if t is bytes:
        return _put_json_str(b, (<bytes>v).decode("utf-8", "replace"))
    v = _json_other(v)
    if v is None:
        return _put(b, b"null", 4)
    if PyUnicode_Check(v):
        return _put_json_str(b, v)
    if type(v) is int:
        return _put_int(b, v)
    return _put_double(b, PyFloat_AS_DOUBLE(v))


def unique_columns(names):
    """Result column names with later duplicates renamed `<name>_2`, `<name>_3`, ... (see rowjson.py)."""
    cdef list out = [name if type(name) is str else str(name) for name in names]
    if len(set(out)) == len(out):
        return out
    cdef set taken = set(out)
    cdef set seen = set()
    cdef dict last = {}
    cdef Py_ssize_t i, k
    for i in range(len(out)):
        name = out[i]
        if name not in seen:
            seen.add(name)
            continue
        k = last.get(name, 1)
        while True:
            k += 1
            candidate = f"{name}_{k}"
            if candidate not in taken:
                break
        last[name] = k
        taken.add(candidate)
        out[i] = candidate
    return out


cdef list _json_keys(list columns, const char* first, Py_ssize_t first_len, const char* sep,
                     Py_ssize_t sep_len, const char* colon, Py_ssize_t colon_len):
    # Each key with what goes before it (first: nothing or "{", others: the separator) and its colon.
    cdef list keys = []
    cdef Buf b
    cdef Py_ssize_t i
    _open(&b, 64)
    try:
        for i in range(len(columns)):
            b.size = 0
            if i == 0:
                _put(&b, first, first_len)
            else:
                _put(&b, sep, sep_len)
            _put_json_str(&b, columns[i])
            _put(&b, colon, colon_len)
            keys.append(_close(&b))
    finally:
        PyMem_Free(b.data)
    return keys


cdef struct _Written:
    PyObject* value         # a strong reference (see _forget), or NULL
    Py_ssize_t at           # where its JSON starts in the buffer (an offset: the buffer may move)
    Py_ssize_t length


cdef int _put_object(Buf* b, tuple row, list keys, Py_ssize_t ncols, bint spaced, _Written* written) except -1:
    # `written` (ncols entries): per column, the last str, Decimal or datetime written and where. The same object
    # again in the next row (a join's parent columns, which the MySQL reader gives as one object: myresult) is
    # copied from the buffer instead of encoded again; these types are immutable, so its JSON is the same.
    cdef Py_ssize_t i, start, n = PyTuple_GET_SIZE(row)
    cdef PyObject* p
    cdef type t
    if n > ncols:
        n = ncols
    if n == 0:
        return _put(b, b"{}", 2)
    if not spaced:
        _put(b, b"{", 1)
    for i in range(n):
        _put_bytes(b, <bytes>PyList_GET_ITEM(keys, i))
        p = PyTuple_GET_ITEM(row, i)
        if p == written[i].value:
            _reserve(b, written[i].length)
            memcpy(b.data + b.size, b.data + written[i].at, written[i].length)
            b.size += written[i].length
            continue
        start = b.size
        _put_json_value(b, <object>p)
        t = type(<object>p)
        if t is str or t is _Decimal or t is _datetime:
            Py_XDECREF(written[i].value)
            Py_INCREF(<object>p)
            written[i].value = p
            written[i].at = start
            written[i].length = b.size - start
    return _put(b, b"}", 1)


cdef void _forget(_Written* written, Py_ssize_t n) noexcept:
    cdef Py_ssize_t i
    for i in range(n):
        Py_XDECREF(written[i].value)
    PyMem_Free(written)


cdef list _row_list(rows):
    # Rows become tuples, in the pure twin's order of conversion (so with its errors). Tuples also
    # keep the values that the encoders borrow alive, whatever a value's __str__ might do to a list.
    cdef list rowlist = rows if type(rows) is list else list(rows)
    for row in rowlist:
        if type(row) is not tuple:
            return [row if type(row) is tuple else tuple(row) for row in rowlist]
    return rowlist


cdef dict _KEYS = {}      # (column names, spaced) -> their JSON keys: a saved query's columns repeat per call
cdef Py_ssize_t _KEYS_MAX = 512
cdef Py_ssize_t _KEYS_WIDEST = 128   # wider results are worked out each time: the table stays a few MB at most


cdef list _object_keys(columns, bint spaced):
    # Each key with what goes before it (see _json_keys), for the unique names of `columns`. Lists of up to
    # _KEYS_WIDEST exact str are remembered by value (a bounded table, emptied when full); anything else is
    # worked out each time.
    cdef tuple names
    cdef object key
    cdef list keys
    if (type(columns) is tuple or type(columns) is list) and len(columns) <= _KEYS_WIDEST:
        names = tuple(columns)
        for name in names:
            if type(name) is not str:
                return _new_object_keys(names, spaced)
        key = (names, spaced)
        keys = _KEYS.get(key)
        if keys is None:
            keys = _new_object_keys(names, spaced)
            if len(_KEYS) >= _KEYS_MAX:
                _KEYS.clear()
            _KEYS[key] = keys
        return keys
    return _new_object_keys(columns, spaced)


cdef list _new_object_keys(columns, bint spaced):
    cdef list cols = unique_columns(columns)
    if spaced:
        # The opening brace rides on the first key; an empty object is written on its own.
        return _json_keys(cols, b'{', 1, b", ", 2, b": ", 2)
    return _json_keys(cols, b"", 0, b",", 1, b":", 1)


cdef bytes _encode_objects(columns, rows, bint spaced):
    cdef list keys = _object_keys(columns, spaced)
    cdef list rowlist = _row_list(rows)
    cdef Py_ssize_t nrows = len(rowlist), ncols = len(keys), estimate
    cdef bint first = True
    cdef Buf b
    cdef _Written* written = <_Written*>PyMem_Calloc(ncols if ncols else 1, sizeof(_Written))
    if written == NULL:
        raise MemoryError()
    _open(&b, 256)
    try:
        if not spaced:
            _put(&b, b"[", 1)
        for row in rowlist:
            if not first and not spaced:
                _put(&b, b",", 1)
            _put_object(&b, <tuple?>row, keys, ncols, spaced, written)
            if spaced:
                _put(&b, b"\n", 1)
            if first and nrows > 1:
                first = False
                # Results are usually uniform: size the buffer once from the first row, within reason.
                estimate = (b.size + 2) * (nrows - 1) + (b.size >> 3)
                if estimate < (1 << 24):
                    _reserve(&b, estimate)
            first = False
        if not spaced:
            _put(&b, b"]\n", 2)
        return _close(&b)
    finally:
        PyMem_Free(b.data)
        _forget(written, ncols)


def encode_json(columns, rows):
    """A compact JSON array of row objects, keys in column order, ASCII only, ending with one newline."""
    return _encode_objects(columns, rows, False)


def encode_ndjson(columns, rows):
    """One JSON object per row with ", "/": " separators, each line ending with a newline; b"" for no rows."""
    return _encode_objects(columns, rows, True)


cdef int _quote_from(Buf* b, Py_ssize_t start) except -1:
    # Wraps the field written since `start` in quotes, doubling the quotes inside it.
    cdef Py_ssize_t i, quotes = 0, end = b.size
    for i in range(start, end):
        if b.data[i] == b'"':
            quotes += 1
    _reserve(b, quotes + 2)
    cdef Py_ssize_t d = end + quotes + 1
    cdef char c
    b.data[d] = b'"'
    d -= 1
    i = end - 1
    while i >= start:
        c = b.data[i]
        b.data[d] = c
        d -= 1
        if c == b'"':
            b.data[d] = b'"'
            d -= 1
        i -= 1
    b.data[d] = b'"'
    b.size = end + quotes + 2
    return 0


cdef int _quote_if_needed(Buf* b, Py_ssize_t start, char delimiter) except -1:
    cdef Py_ssize_t i
    cdef char c
    for i in range(start, b.size):
        c = b.data[i]
        if c == delimiter or c == b'"' or c == b'\r' or c == b'\n':
            return _quote_from(b, start)
    return 0


cdef int _put_csv_str(Buf* b, object s, uint32_t delimiter) except -1:
    qag_str_ready(s)
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(s), i
    cdef Py_ssize_t start = b.size
    cdef unsigned int kind = PyUnicode_KIND(s)
    cdef void* data = PyUnicode_DATA(s)
    cdef const uint8_t* d1
    cdef const uint16_t* d2
    cdef const uint32_t* d4
    cdef uint32_t c
    cdef bint special = False
    _reserve(b, n * (kind + 1 if kind < 4 else 4))
    cdef char* o = b.data + b.size
    if kind == 1:
        d1 = <const uint8_t*>data
        for i in range(n):
            c = d1[i]
            if c < 0x80:
                if c == delimiter or c == 0x22 or c == 0x0D or c == 0x0A:
                    special = True
                o[0] = <char>c
                o += 1
            else:
                o[0] = <char>(0xC0 | (c >> 6))
                o[1] = <char>(0x80 | (c & 0x3F))
                o += 2
    else:
        d2 = <const uint16_t*>data
        d4 = <const uint32_t*>data
        for i in range(n):
            c = d2[i] if kind == 2 else d4[i]
            if c < 0x80:
                if c == delimiter or c == 0x22 or c == 0x0D or c == 0x0A:
                    special = True
                o[0] = <char>c
                o += 1
            elif c < 0x800:
                o[0] = <char>(0xC0 | (c >> 6))
                o[1] = <char>(0x80 | (c & 0x3F))
                o += 2
            elif 0xD800 <= c <= 0xDFFF:
                # UTF-8 cannot hold a lone surrogate; str.encode("utf-8", "replace") writes "?".
                o[0] = b'?'
                o += 1
            elif c < 0x10000:
                o[0] = <char>(0xE0 | (c >> 12))
                o[1] = <char>(0x80 | ((c >> 6) & 0x3F))
                o[2] = <char>(0x80 | (c & 0x3F))
                o += 3
            else:
                o[0] = <char>(0xF0 | (c >> 18))
                o[1] = <char>(0x80 | ((c >> 12) & 0x3F))
                o[2] = <char>(0x80 | ((c >> 6) & 0x3F))
                o[3] = <char>(0x80 | (c & 0x3F))
                o += 4
    b.size = o - b.data
    if special:
        _quote_from(b, start)
    return 0


cdef int _put_csv_value(Buf* b, object v, char delimiter) except -1:
    cdef type t = type(v)
    cdef Py_ssize_t start = b.size
    if t is str:
        return _put_csv_str(b, v, <uint8_t>delimiter)
    if v is None:
        return 0
    if t is int:
        _put_int(b, v)
    elif t is float:
        _put_double(b, PyFloat_AS_DOUBLE(v))
    elif t is bool:
        if v:
            _put(b, b"True", 4)
        else:
            _put(b, b"False", 5)
    elif t is _datetime:
        _put_exact_datetime(b, v, True)
    elif t is date:
        _put_exact_date(b, v)
    elif t is time and time_tzinfo(v) is None:
        _put_naive_time(b, v)
    elif t is _Decimal:
        _put_double(b, _exact_decimal_double(v))
    elif t is bytes:
        return _put_csv_str(b, (<bytes>v).decode("utf-8", "replace"), <uint8_t>delimiter)
    else:
        return _put_csv_str(b, _csv_other(v), <uint8_t>delimiter)
    # Numbers and dates hold no quote, CR or LF, but an unusual delimiter may be among their characters.
    return _quote_if_needed(b, start, delimiter)


cdef int _put_csv_line(Buf* b, tuple row, char delimiter) except -1:
    cdef Py_ssize_t i, n = PyTuple_GET_SIZE(row)
    cdef Py_ssize_t start = b.size
    for i in range(n):
        if i:
            _put(b, &delimiter, 1)
        _put_csv_value(b, <object>PyTuple_GET_ITEM(row, i), delimiter)
    if n == 1 and b.size == start:
        # As Python's csv writer: a lone empty field is quoted so the line is not blank.
        _put(b, b'""', 2)
    return _put(b, b"\r\n", 2)


def _check_delimiter(delimiter):
    if type(delimiter) is not str or len(delimiter) != 1 or delimiter > "\x7f" or delimiter in '"\r\n':
        raise ValueError(f"delimiter must be one ASCII character other than '\"', CR and LF, not {delimiter!r}")


def encode_delimited(columns, rows, delimiter):
    """Header line then one line per row, minimal quoting, CRLF line ends, NULL as an empty field, UTF-8."""
    _check_delimiter(delimiter)
    cdef char delim = <char>ord(delimiter)
    cdef list cols = unique_columns(columns)
    cdef list rowlist = _row_list(rows)
    cdef Buf b
    _open(&b, 256)
    try:
        _put_csv_line(&b, tuple(cols), delim)
        for row in rowlist:
            _put_csv_line(&b, <tuple?>row, delim)
        return _close(&b)
    finally:
        PyMem_Free(b.data)
