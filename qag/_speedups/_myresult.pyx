# cython: language_level=3, boundscheck=False, wraparound=False
"""A MySQL statement's stored reply read with the client library called directly: the compiled twin of myresult.py.

The functions are looked up with dlsym through the handle of mysqlclient's own `_mysql` extension module, so they
are those of the client library (libmariadb or libmysqlclient) that mysqlclient is linked to, never another
copy. A Reader takes the connection's MYSQL* from mysqlclient (`_get_native_connection()`, mysqlclient 2.1 and
later) once, and each read does what mysqlclient's store_result, describe and fetch_row do, in the same order and
with the interpreter lock let go around mysql_store_result (which reads the reply from the network) as
mysqlclient does: no result object, no description tuple per column, no converter looked up per column per call.
The statement is sent and its reply's first packet read the same way (mysql_send_query, a poll() on the socket,
mysql_read_query_result), in one release of the interpreter lock where mysqlclient's send_query and
read_query_result take two.
A Reader keeps the last reply's column names and converters and reuses them while the replies' fields (name,
type, flags, charset) and the connection's charset stay the same, as they do for a saved query run again.

Values are converted as mysqlclient's _mysql_field_to_python converts them: the connection's converter map is
resolved once per Reader into a table by field type and binary-ness (charset 63), the way mysqlclient resolves
it per result; a converter entry the table can't hold exactly (a flag test other than BINARY_FLAG) is resolved
per column per read with mysqlclient's own rule. str, bytes (and no converter) and int are converted in C as
mysqlclient's fast paths do (int from canonical digits directly, anything else by PyLong_FromString); any other
converter is called with the str or bytes mysqlclient would pass it.

The import fails, saying why (auto mode then runs the pure twin, and `qag._speedups.fallbacks()` tells), when
mysqlclient is installed but its client library can't be driven this way (a function missing). A Reader whose
connection can't be read this way (no native connection, a client library that isn't the bound one) and a read
of a skip or count outside mysqlclient's int range run the pure twin's code. Without mysqlclient, or with one
that can't load (no `_mysql` extension, a client library missing), this imports (nothing to drive), as the twins
of the other optional drivers do: the startup check says what to install.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong
from cpython.mem cimport PyMem_Calloc, PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8, PyUnicode_Decode, PyUnicode_FromStringAndSize
from libc.limits cimport INT_MAX
from libc.math cimport isfinite
from libc.string cimport memcmp, memcpy, strcmp, strlen, strncmp

from qag._speedups._jsontext cimport canonical_int, escaped_size, json_keys, plain_text, write_escaped

from qag._speedups._lonewait cimport (POLLIN, POLLPRI, poll, pollfd, qag_lone_wait_begin, qag_lone_wait_end, slept,
                                       spin_first)

import datetime
import importlib.machinery
import importlib.util
import os
import sys
from decimal import Decimal

# One Reader behaviour and one error mapping for both twins (the pure twin's code runs where this one can't).
from qag._speedups.myresult import Reader as _PureReader
from qag._speedups.myresult import driver_error
from qag._speedups.rowjson import unique_columns
from qag._speedups import mysqltime as _pure_time
try:
    from qag._speedups import _mysqltime as _compiled_time
except ImportError:     # not built: only the pure twin's parsers can be in a connection's map
    _compiled_time = _pure_time

__all__ = ["Reader", "driver_error", "LIBRARY"]

cdef extern from "<dlfcn.h>" nogil:
    ctypedef struct Dl_info:
        const char *dli_fname
        void *dli_fbase
        const char *dli_sname
        void *dli_saddr
    void *dlopen(const char *filename, int flags)
    void *dlsym(void *handle, const char *symbol)
    char *dlerror()
    int dladdr(const void *addr, Dl_info *info)
    int RTLD_NOW
    int RTLD_LOCAL

cdef extern from "Python.h":
    object PyLong_FromString(const char *text, char **end, int base)
    object PyObject_CallOneArg(object callable, object arg)
    int PySequence_Check(object o)
    double PyOS_string_to_double(const char *s, char **endptr, PyObject *overflow_exception) except? -1.0
    char* PyOS_double_to_string(double val, char format_code, int precision, int flags, int* ptype) except NULL
    int Py_DTSF_ADD_DOT_0

# The client library's MYSQL_FIELD (the same layout in libmariadb 3 and MySQL 8's libmysqlclient; no headers
# needed). MYSQL and MYSQL_RES are opaque here.
ctypedef struct MYSQL_FIELD:
    char *name
    char *org_name
    char *table
    char *org_table
    char *db
    char *catalog
    char *def_ "def"
    unsigned long length
    unsigned long max_length
    unsigned int name_length
    unsigned int org_name_length
    unsigned int table_length
    unsigned int org_table_length
    unsigned int db_length
    unsigned int catalog_length
    unsigned int def_length
    unsigned int flags
    unsigned int decimals
    unsigned int charsetnr
    int type
    void *extension

ctypedef void *(*res_of_conn_f)(void *mysql) noexcept nogil
ctypedef unsigned int (*uint_of_res_f)(void *res) noexcept nogil
ctypedef MYSQL_FIELD *(*fields_f)(void *res) noexcept nogil
ctypedef char **(*row_f)(void *res) noexcept nogil
ctypedef unsigned long *(*lengths_f)(void *res) noexcept nogil
ctypedef void (*seek_f)(void *res, unsigned long long offset) noexcept nogil
ctypedef unsigned long long (*rows_f)(void *res) noexcept nogil
ctypedef void (*free_f)(void *res) noexcept nogil
ctypedef unsigned int (*errno_f)(void *mysql) noexcept nogil
ctypedef const char *(*text_of_conn_f)(void *mysql) noexcept nogil
ctypedef char (*flag_of_conn_f)(void *mysql) noexcept nogil
ctypedef int (*send_f)(void *mysql, const char *query, unsigned long length) noexcept nogil

# What a field's plan depends on besides its name (compared byte for byte with the last reply's, _plan).
ctypedef struct _FieldKey:
    int type
    unsigned int flags
    unsigned int charsetnr
    unsigned int name_length

cdef unsigned int _BINARY_FLAG = 128
cdef unsigned int _BINARY_CHARSET = 63
cdef int _TYPES = 256          # field type codes (enum_field_types) are below this

# How a column's values are converted (mysqlclient's _mysql_field_to_python, in its order).
cdef enum Kind:
    TEXT = 0        # converter str: decoded by the connection's encoding
    RAW = 1         # converter bytes, or none: the bytes
    WHOLE = 2       # converter int: PyLong_FromString
    CALL_TEXT = 3   # any other converter, given str (DECIMAL, NEWDECIMAL, TIMESTAMP, DATETIME, TIME, DATE)
    CALL_RAW = 4    # any other converter, given bytes


# How read_page writes a column's values into a page's JSON itself (each only when the text is what rowjson writes
# for the value the converter makes of it; any other text hands the page to rowjson).
cdef enum JsonKind:
    J_NO = 0        # not written here: the rows are made and rowjson encodes them
    J_INT = 1       # converter int: canonical digits as they are
    J_TEXT = 2      # converter str: plain printable ASCII in quotes; on a UTF-8 connection any valid UTF-8, escaped
    J_DECIMAL = 3   # converter Decimal: float(Decimal(text)) is the text read as a double; written as its repr
    J_DATETIME = 4  # qag's or mysqlclient's DATETIME/TIMESTAMP parser: a valid datetime, written to the second
    J_DATE = 5      # their DATE parser: a valid date, written as it is


cdef class _Client:
    """The client library functions mysqlclient's `_mysql` module is linked to."""

    cdef res_of_conn_f store_result
    cdef uint_of_res_f num_fields
    cdef fields_f fetch_fields
    cdef row_f fetch_row
    cdef lengths_f fetch_lengths
    cdef seek_f data_seek
    cdef rows_f num_rows
    cdef free_f free_result
    cdef errno_f error_code
    cdef text_of_conn_f error
    cdef text_of_conn_f character_set_name
    cdef flag_of_conn_f more_results
    cdef flag_of_conn_f read_query_result
    cdef send_f send_query
    cdef readonly str path       # the client library file the functions are in


cdef void *_symbol(void *handle, str name, str where) except NULL:
    cdef bytes encoded = name.encode()
    cdef void *address = dlsym(handle, encoded)
    if address == NULL:
        raise ImportError(f"the client library of {where} has no {name}")
    return address


cdef _Client _bind(str module_file):
    """The client library functions `module_file` (mysqlclient's _mysql) is linked to, None when that module can't
    be loaded; ImportError saying why when its library can't be driven."""
    cdef bytes encoded = os.fsencode(module_file)
    cdef void *handle = dlopen(encoded, RTLD_NOW | RTLD_LOCAL)
    cdef bytes text
    if handle == NULL:
        # mysqlclient's own import fails the same way (its client library is missing, say), and qag's startup
        # check names what to install: nothing to drive here, as without mysqlclient.
        return None
    cdef _Client lib = _Client()
    cdef Dl_info info
    lib.store_result = <res_of_conn_f>_symbol(handle, "mysql_store_result", module_file)
    if dladdr(<void *>lib.store_result, &info) == 0 or info.dli_fname == NULL:
        raise ImportError(f"the client library of {module_file} can't be located")
    text = info.dli_fname
    lib.path = os.fsdecode(text)
    lib.num_fields = <uint_of_res_f>_symbol(handle, "mysql_num_fields", module_file)
    lib.fetch_fields = <fields_f>_symbol(handle, "mysql_fetch_fields", module_file)
    lib.fetch_row = <row_f>_symbol(handle, "mysql_fetch_row", module_file)
    lib.fetch_lengths = <lengths_f>_symbol(handle, "mysql_fetch_lengths", module_file)
    lib.data_seek = <seek_f>_symbol(handle, "mysql_data_seek", module_file)
    lib.num_rows = <rows_f>_symbol(handle, "mysql_num_rows", module_file)
    lib.free_result = <free_f>_symbol(handle, "mysql_free_result", module_file)
    lib.error_code = <errno_f>_symbol(handle, "mysql_errno", module_file)
    lib.error = <text_of_conn_f>_symbol(handle, "mysql_error", module_file)
    lib.character_set_name = <text_of_conn_f>_symbol(handle, "mysql_character_set_name", module_file)
    lib.more_results = <flag_of_conn_f>_symbol(handle, "mysql_more_results", module_file)
    lib.read_query_result = <flag_of_conn_f>_symbol(handle, "mysql_read_query_result", module_file)
    lib.send_query = <send_f>_symbol(handle, "mysql_send_query", module_file)
    return lib


def _module_file():
    """The file of mysqlclient's `_mysql` (the one loaded, else the one an import would load), or None without
    mysqlclient. Found without importing it: drivers load on first use."""
    loaded = sys.modules.get("MySQLdb._mysql")
    if loaded is not None:
        return loaded.__file__
    spec = importlib.util.find_spec("MySQLdb")
    if spec is None or not spec.submodule_search_locations:
        return None
    for directory in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            candidate = os.path.join(directory, "_mysql" + suffix)
            if os.path.exists(candidate):
                return candidate
    return None   # a MySQLdb that can't load (qag's startup check names what to install): nothing to drive


cdef str _FILE = _module_file()
cdef _Client _LIB = _bind(_FILE) if _FILE is not None else None
LIBRARY = _LIB.path if _LIB is not None else None   # the client library file this twin calls


cdef object _resolve(object fun, unsigned int flags):
    """mysqlclient's converter for a field whose map entry is `fun` and whose flags (BINARY_FLAG set by charset 63,
    as mysqlclient sets it) are `flags`: its rule for a sequence of (mask, converter), None for no match."""
    if fun is None or not PySequence_Check(fun):
        return fun
    for item in fun:
        if isinstance(item, tuple) and len(item) == 2:
            mask, found = item
            if not isinstance(mask, int) or <long>mask & flags:
                return found
    return None


cdef bint _binary_only(object fun):
    """Whether the rule above picks from `fun` by the binary flag alone (each int mask is BINARY_FLAG)."""
    if fun is None or not PySequence_Check(fun):
        return True
    for item in fun:
        if isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], int) and item[0] != _BINARY_FLAG:
            return False
    return True


cdef inline object _whole(const char *text, unsigned long length):
    """int of a value's text as PyLong_FromString(text, NULL, 10) reads it: canonical digits (up to 18, after an
    optional minus) directly, anything else by PyLong_FromString itself."""
    cdef long long value = 0
    cdef unsigned long i = 0
    cdef bint negative = length > 0 and text[0] == 45
    if negative:
        i = 1
    if length == i or length - i > 18 or text[length] != 0:
        return PyLong_FromString(text, NULL, 10)
    while i < length:
        if text[i] < 48 or text[i] > 57:
            return PyLong_FromString(text, NULL, 10)
        value = value * 10 + (text[i] - 48)
        i += 1
    return PyLong_FromLongLong(-value if negative else value)


cdef struct _Seen:
    const char *text            # inside the stored result, alive until it is freed
    unsigned long length
    PyObject *value


# The types a converter's value may be shared between rows as: immutable, so no caller can tell.
cdef frozenset _IMMUTABLE = frozenset((str, bytes, int, float, Decimal, datetime.datetime, datetime.date,
                                       datetime.time, datetime.timedelta))


cdef class Reader:
    """Reads the replies of one mysqlclient connection (rules in myresult.py and above)."""

    cdef object conn
    cdef object pure              # the pure twin's Reader: what runs where this one can't
    cdef void *mysql              # the connection's MYSQL*, inside `conn` (alive as long as it is)
    cdef bint direct
    cdef list table               # [type * 2 + binary] -> converter, for the types resolved once
    cdef bytearray exact          # [type]: 1 when its converter is resolved once (the table holds it)
    cdef object converters        # the connection's converter map
    # The plan of the last reply (_plan): its fields' key, charset, names, converters and kinds.
    cdef bytes plan_key
    cdef bytes plan_charset
    cdef unsigned int plan_n
    cdef list plan_columns
    cdef list plan_converters
    cdef bytes plan_kinds
    cdef bint plan_utf8
    cdef bytes plan_encoding
    cdef bytes plan_json          # [column]: its JsonKind, or None when a column's values are never written here
    cdef list plan_keys           # the columns' JSON keys (_jsontext.json_keys) when plan_json is not None
    # The lone wait (query): the connection's socket, seconds to spin, and whether the last spin missed.
    cdef int fd
    cdef double spin
    cdef bint missed

    def __init__(self, conn, spin=0.0):
        self.conn = conn
        self.pure = _PureReader(conn)
        self.direct = False
        self.spin = spin
        self.missed = False
        self.fd = conn.fileno() if spin > 0 else -1
        if _LIB is None:
            return
        module = sys.modules.get("MySQLdb._mysql")
        native = getattr(conn, "_get_native_connection", None)
        if (native is None or module is None or not isinstance(conn, module.connection)
                or getattr(module, "__file__", None) != _FILE):
            return
        self.mysql = PyCapsule_GetPointer(native(), b"_mysql.connection.native_connection")
        self.converters = conn.converter
        self.table = [None] * (_TYPES * 2)
        self.exact = bytearray(_TYPES)
        for code in range(_TYPES):
            try:
                fun = self.converters[code]
            except KeyError:
                fun = None
            if _binary_only(fun):
                self.table[code * 2] = _resolve(fun, 0)
                self.table[code * 2 + 1] = _resolve(fun, _BINARY_FLAG)
                self.exact[code] = 1
        self.direct = True
        self.fd = conn.fileno()

    cdef object _converter(self, MYSQL_FIELD *field):
        """mysqlclient's converter for a field (the connection's map and its rule)."""
        cdef unsigned int flags = field.flags
        flags = (flags | _BINARY_FLAG) if field.charsetnr == _BINARY_CHARSET else (flags & ~_BINARY_FLAG)
        if 0 <= field.type < _TYPES and self.exact[field.type]:
            return self.table[field.type * 2 + (1 if flags & _BINARY_FLAG else 0)]
        try:
            fun = self.converters[field.type]
        except KeyError:
            return None
        return _resolve(fun, flags)

    def query(self, statement, deadline=None):
        """Send a statement and wait for its reply's first packet, as mysqlclient's query does: with `spin`, sent
        and read by mysqlclient's send_query and read_query_result, and the wait between them spun first when this
        thread waits alone (_lonewait). A direct Reader calls the client library itself to send, wait and read, in
        one release of the interpreter lock instead of mysqlclient's two (each a chance for another thread to take
        the lock, and for this one to wait to get it back); its wait is a poll() on the socket, so the library's
        first read finds the reply there instead of failing with EAGAIN and polling itself (one system call less).
        A connection mysqlclient has closed, and a statement that isn't bytes, are sent by mysqlclient's send_query
        instead (its checks and errors)."""
        if self.direct:
            return self._query_direct(statement, deadline)
        if self.fd < 0:
            self.conn.query(statement)
            return
        cdef double began = 0.0, limit = 0.0 if deadline is None else deadline
        cdef bint bounded = deadline is not None, came
        conn = self.conn
        conn.send_query(statement)
        with nogil:
            came = spin_first(self.fd, self.spin, bounded, limit, &self.missed, &began)
        if came:
            conn.read_query_result()
            return
        qag_lone_wait_begin()
        try:
            conn.read_query_result()
        finally:
            qag_lone_wait_end()
        slept(self.spin, began, &self.missed)

    cdef _query_direct(self, statement, deadline):
        cdef double began = 0.0, limit = 0.0 if deadline is None else deadline
        cdef bint bounded = deadline is not None, came = False
        cdef void *mysql = self.mysql
        cdef int fd = self.fd, refused = 0
        cdef char failed = 0
        cdef const char *data = NULL
        cdef unsigned long size = 0
        cdef pollfd wait
        conn = self.conn
        if type(statement) is bytes and conn.open:
            data = <bytes>statement
            size = len(<bytes>statement)
        else:
            conn.send_query(statement)   # mysqlclient's own checks and errors (a closed connection, a bad type)
        with nogil:
            if data != NULL:
                refused = _LIB.send_query(mysql, data, size)
            if refused == 0:
                came = spin_first(fd, self.spin, bounded, limit, &self.missed, &began)
                if not came:
                    qag_lone_wait_begin()
                    # Unbounded, as the library's own wait is (qag sets no read timeout): the watchdog shuts the
                    # socket of a call past its deadline, which ends this poll. Any return (readable, hung up, a
                    # signal) goes on to the library's read, which waits again itself if it must.
                    wait.fd = fd
                    wait.events = POLLIN | POLLPRI
                    wait.revents = 0
                    poll(&wait, 1, -1)
                failed = _LIB.read_query_result(mysql)
                if not came:
                    qag_lone_wait_end()
                    slept(self.spin, began, &self.missed)
        if refused or failed:
            raise _failure(mysql)

    def read(self, skip, count):
        """(column names, rows): as myresult.Reader.read."""
        if not self.direct or type(skip) is not int or type(count) is not int or not (
                0 <= skip <= INT_MAX and 0 <= count <= INT_MAX):
            return self.pure.read(skip, count)
        columns, rows, _ = self._stored(skip, count, 0)
        return columns, rows

    def read_page(self, skip, count, json_rows):
        """(column names, rows, json, fetched): as myresult.Reader.read_page. The JSON of the first `json_rows`
        fetched rows is written here from the reply's text when every column is of a JsonKind and every value's
        text passes its kind's test; otherwise the rows are made as read() makes them and json is None."""
        if not self.direct or type(skip) is not int or type(count) is not int or type(json_rows) is not int or not (
                0 <= skip <= INT_MAX and 0 <= count <= INT_MAX and 0 < json_rows <= INT_MAX):
            columns, rows = self.read(skip, count)
            return columns, rows, None, len(rows)
        columns, rows, page = self._stored(skip, count, json_rows)
        if page is None:
            return columns, rows, None, len(rows)
        return columns, None, page[0], page[1]

    cdef tuple _stored(self, int skip, int count, int json_rows):
        """(column names, rows, None), or with `json_rows` (column names, None, (json, fetched)) when _json writes
        the page: the reply stored, read, freed, and any further result sets (a CALL's) read after it."""
        cdef void *mysql = self.mysql
        cdef void *res
        cdef object page = None
        with nogil:
            res = _LIB.store_result(mysql)
        if res == NULL:
            if _LIB.error_code(mysql):
                raise _failure(mysql)
            columns, rows = [], []
        else:
            try:
                if json_rows:
                    self._plan(mysql, _LIB.fetch_fields(res), _LIB.num_fields(res))
                    if self.plan_json is not None:
                        page = self._json(mysql, res, skip, count, json_rows)
                        if page is None:
                            _LIB.data_seek(res, 0)     # _json read some rows: _rows starts over
                if page is None:
                    columns, rows = self._rows(mysql, res, skip, count)
                else:
                    columns, rows = self.plan_columns[:], None
            finally:
                _LIB.free_result(res)
        if _LIB.more_results(mysql):
            conn = self.conn
            while conn.next_result() == 0:
                conn.discard_result()
        return columns, rows, page

    cdef object _json(self, void *mysql, void *res, int skip, int count, int json_rows):
        """(the JSON bytes rowjson.encode_json(columns, rows[:json_rows]) makes, the number of rows fetched) for the
        rows after `skip` (at most `count`, 0: all) of a planned reply whose columns are all of a JsonKind; None
        when a value's text fails its kind's test, or no row is fetched."""
        cdef unsigned int n = self.plan_n, i
        cdef const unsigned char *kinds = self.plan_json
        cdef bint utf8 = self.plan_utf8
        cdef list keys = self.plan_keys
        cdef char **row
        cdef unsigned long *lengths
        cdef const char *text
        cdef unsigned long length
        cdef long long maxrows = count if count else <long long>_LIB.num_rows(res)
        cdef int fetched = 0
        cdef _Out out
        cdef bytes key
        out.data = NULL
        out.size = out.cap = 0
        if skip:
            _LIB.data_seek(res, <unsigned int>skip)
        try:
            _put(&out, b"[", 1)
            while maxrows > 0:
                maxrows -= 1
                row = _LIB.fetch_row(res)
                if row == NULL:
                    if _LIB.error_code(mysql):
                        raise _failure(mysql)
                    break
                fetched += 1
                lengths = _LIB.fetch_lengths(res)
                if fetched > json_rows:
                    # Counted only (the look past the page, has_more), but its text must be text read() can decode:
                    # text that doesn't goes to read(), which raises what it raises for it.
                    for i in range(n):
                        if (kinds[i] == J_TEXT and row[i] != NULL and not plain_text(row[i], lengths[i])
                                and not (utf8 and escaped_size(row[i], lengths[i]) >= 0)):
                            return None
                    continue
                if fetched > 1:
                    _put(&out, b",{", 2)
                else:
                    _put(&out, b"{", 1)
                for i in range(n):
                    key = <bytes>keys[i]
                    _put(&out, key, len(key))
                    text, length = row[i], lengths[i]
                    if text == NULL:
                        _put(&out, b"null", 4)
                    elif kinds[i] == J_INT:
                        if not canonical_int(text, length):
                            return None
                        _put(&out, text, length)
                    elif kinds[i] == J_TEXT:
                        if plain_text(text, length):
                            _put(&out, b'"', 1)
                            _put(&out, text, length)
                            _put(&out, b'"', 1)
                        elif not (utf8 and _put_text(&out, text, length)):
                            return None
                    elif kinds[i] == J_DECIMAL:
                        if not _put_decimal(&out, text, length):
                            return None
                    elif kinds[i] == J_DATETIME:
                        if not _valid_datetime(text, length):
                            return None
                        _put(&out, b'"', 1)
                        _put(&out, text, 19)      # rowjson writes a datetime to the second
                        _put(&out, b'"', 1)
                    else:
                        if not (length == 10 and _valid_date(text)):
                            return None
                        _put(&out, b'"', 1)
                        _put(&out, text, 10)
                        _put(&out, b'"', 1)
                _put(&out, b"}", 1)
            if not fetched:
                return None
            _put(&out, b"]\n", 2)
            return PyBytes_FromStringAndSize(out.data, out.size), fetched
        finally:
            PyMem_Free(out.data)

    cdef bint _plan(self, void *mysql, MYSQL_FIELD *fields, unsigned int n) except -1:
        """Make the column names, converters and kinds of this reply's fields the Reader's plan: the previous
        reply's when its fields (name, type, flags, charset) and the connection's charset are the same (a pooled
        connection mostly runs the same statements), else worked out now."""
        cdef const char *charset = _LIB.character_set_name(mysql)
        cdef unsigned int i
        cdef _FieldKey key
        cdef const char *kept
        cdef Py_ssize_t at = 0
        if self.plan_key is not None and n == self.plan_n and strcmp(charset, self.plan_charset) == 0:
            kept = self.plan_key
            for i in range(n):
                key.type, key.flags, key.charsetnr = fields[i].type, fields[i].flags, fields[i].charsetnr
                key.name_length = fields[i].name_length
                if (memcmp(kept + at, &key, sizeof(_FieldKey)) != 0
                        or memcmp(kept + at + sizeof(_FieldKey), fields[i].name, key.name_length) != 0):
                    break
                at += sizeof(_FieldKey) + key.name_length
            else:
                return True
        self.plan_key = None
        cdef bint utf8 = strncmp(b"utf8", charset, 4) == 0
        cdef bytes encoding_name = _encoding(charset)
        cdef const char *encoding = encoding_name
        cdef list columns = []
        cdef list converters = []
        cdef bytearray kinds = bytearray(n)
        cdef bytearray json_kinds = bytearray(n)
        cdef bytearray field_keys = bytearray()
        cdef int t
        for i in range(n):
            if utf8:
                columns.append(PyUnicode_DecodeUTF8(fields[i].name, fields[i].name_length, "replace"))
            else:
                columns.append(PyUnicode_Decode(fields[i].name, fields[i].name_length, encoding, "replace"))
            fun = self._converter(&fields[i])
            converters.append(fun)
            t = fields[i].type
            if fun is str:
                kinds[i] = <unsigned char>TEXT
            elif fun is bytes or fun is None:
                kinds[i] = <unsigned char>RAW
            elif fun is int:
                kinds[i] = <unsigned char>WHOLE
            elif t == 0 or t == 246 or t == 7 or t == 12 or t == 11 or t == 10:
                kinds[i] = <unsigned char>CALL_TEXT   # DECIMAL, NEWDECIMAL, TIMESTAMP, DATETIME, TIME, DATE
            else:
                kinds[i] = <unsigned char>CALL_RAW
            json_kinds[i] = _json_kind(kinds[i], fun, t)
            key.type, key.flags, key.charsetnr = fields[i].type, fields[i].flags, fields[i].charsetnr
            key.name_length = fields[i].name_length
            field_keys += (<char *>&key)[:sizeof(_FieldKey)]
            field_keys += fields[i].name[:key.name_length]
        self.plan_columns, self.plan_converters, self.plan_kinds = columns, converters, bytes(kinds)
        self.plan_keys = json_keys(unique_columns(columns[:])) if n and 0 not in json_kinds else None
        self.plan_json = bytes(json_kinds) if self.plan_keys is not None else None
        self.plan_utf8, self.plan_encoding, self.plan_n = utf8, encoding_name, n
        self.plan_charset = <bytes>charset
        self.plan_key = bytes(field_keys)
        return True

    cdef tuple _rows(self, void *mysql, void *res, int skip, int count):
        cdef unsigned int n = _LIB.num_fields(res)
        self._plan(mysql, _LIB.fetch_fields(res), n)
        cdef bint utf8 = self.plan_utf8
        cdef const char *encoding = self.plan_encoding
        cdef list converters = self.plan_converters
        cdef const unsigned char *kinds = self.plan_kinds
        cdef unsigned int i
        cdef char **row
        cdef unsigned long *lengths
        cdef list rows = []
        cdef object value
        cdef long long maxrows
        # Per column, the last text made into an immutable value, and that value (borrowed: the row that holds it
        # is in `rows`): the same text in the next row gives the same object, not a new one. A join repeats its
        # parent's columns on every row (Order-Status: the customer's balance, the order's date), and a
        # Decimal or datetime costs a converter call; the encoders then see the same object again (rowjson).
        cdef _Seen *seen = NULL
        if n:
            seen = <_Seen *>PyMem_Calloc(n, sizeof(_Seen))
            if seen == NULL:
                raise MemoryError()
        if skip:
            _LIB.data_seek(res, <unsigned int>skip)
        maxrows = count if count else <int><Py_ssize_t>_LIB.num_rows(res)
        try:
            while maxrows > 0:
                maxrows -= 1
                row = _LIB.fetch_row(res)
                if row == NULL:
                    if _LIB.error_code(mysql):
                        raise _failure(mysql)
                    break
                lengths = _LIB.fetch_lengths(res)
                record = PyTuple_New(n)
                for i in range(n):
                    if row[i] == NULL:
                        value = None
                    elif kinds[i] == WHOLE:
                        value = _whole(row[i], lengths[i])
                    elif (seen[i].value != NULL and seen[i].length == lengths[i]
                          and memcmp(seen[i].text, row[i], lengths[i]) == 0):
                        value = <object>seen[i].value
                    else:
                        if kinds[i] == TEXT:
                            if utf8:
                                value = PyUnicode_DecodeUTF8(row[i], lengths[i], NULL)
                            else:
                                value = PyUnicode_Decode(row[i], lengths[i], encoding, NULL)
                        elif kinds[i] == RAW:
                            value = PyBytes_FromStringAndSize(row[i], lengths[i])
                        elif kinds[i] == CALL_TEXT:
                            value = PyObject_CallOneArg(converters[i],
                                                        PyUnicode_FromStringAndSize(row[i], lengths[i]))
                        else:
                            value = PyObject_CallOneArg(converters[i], PyBytes_FromStringAndSize(row[i], lengths[i]))
                        if type(value) in _IMMUTABLE:
                            seen[i].text = row[i]
                            seen[i].length = lengths[i]
                            seen[i].value = <PyObject *>value
                        else:
                            seen[i].value = NULL
                    Py_INCREF(value)
                    PyTuple_SET_ITEM(record, i, value)
                rows.append(record)
        finally:
            PyMem_Free(seen)
        return self.plan_columns[:], rows   # a list of its own for each caller


cdef unsigned char _json_kind(unsigned char kind, object fun, int field_type):
    """The JsonKind of a column with this Kind, converter and field type."""
    if kind == WHOLE:
        return J_INT
    if kind == TEXT:
        return J_TEXT
    if kind != CALL_TEXT:
        return J_NO
    if fun is Decimal:
        return J_DECIMAL
    if fun is _pure_time.datetime_or_none or fun is _compiled_time.datetime_or_none:
        return J_DATETIME
    if fun is _pure_time.date_or_none or fun is _compiled_time.date_or_none:
        return J_DATE
    return J_NO


cdef struct _Out:
    char *data
    Py_ssize_t size
    Py_ssize_t cap


cdef int _room(_Out *out, Py_ssize_t length) except -1:
    cdef Py_ssize_t cap
    cdef char *grown
    if out.size + length > out.cap:
        cap = max(out.cap * 2, out.size + length + 512)
        grown = <char *>PyMem_Realloc(out.data, cap)
        if grown == NULL:
            raise MemoryError()
        out.data, out.cap = grown, cap
    return 0


cdef int _put(_Out *out, const char *text, Py_ssize_t length) except -1:
    _room(out, length)
    memcpy(out.data + out.size, text, length)
    out.size += length
    return 0


cdef int _put_text(_Out *out, const char *text, Py_ssize_t length) except -1:
    """UTF-8 text as rowjson writes the str it decodes to (_jsontext.escaped_size); 0 when Python's strict decoder
    refuses it (read() raises)."""
    cdef Py_ssize_t size = escaped_size(text, length)
    if size < 0:
        return 0
    _room(out, size)
    out.size = write_escaped(out.data + out.size, text, length) - out.data
    return 1


cdef inline bint _digits(const char *text, int length) noexcept:
    cdef int i
    for i in range(length):
        if not b'0' <= text[i] <= b'9':
            return False
    return True


cdef inline int _number(const char *text, int length) noexcept:
    cdef int i, value = 0
    for i in range(length):
        value = value * 10 + (text[i] - 48)
    return value


cdef int[13] _MONTH_DAYS = [0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


cdef bint _valid_date(const char *text) noexcept:
    """Whether 10 bytes are MySQL's text of a date Python's date holds: YYYY-MM-DD, year 1 to 9999, a real day
    (the zero date and its kin are not: their parsers give None)."""
    if not (text[4] == b'-' and text[7] == b'-' and _digits(text, 4) and _digits(text + 5, 2)
            and _digits(text + 8, 2)):
        return False
    cdef int year = _number(text, 4), month = _number(text + 5, 2), day = _number(text + 8, 2)
    if year < 1 or month < 1 or month > 12 or day < 1:
        return False
    if month == 2 and year % 4 == 0 and (year % 100 != 0 or year % 400 == 0):
        return day <= 29
    return day <= _MONTH_DAYS[month]


cdef bint _valid_datetime(const char *text, unsigned long length) noexcept:
    """Whether the text is MySQL's of a datetime Python's datetime holds: YYYY-MM-DD HH:MM:SS with 1 to 6 digits
    of a fraction after a dot or none, a valid date and time of day."""
    if not (length == 19 or (21 <= length <= 26 and text[19] == b'.' and _digits(text + 20, <int>length - 20))):
        return False
    if not (_valid_date(text) and text[10] == b' ' and text[13] == b':' and text[16] == b':'
            and _digits(text + 11, 2) and _digits(text + 14, 2) and _digits(text + 17, 2)):
        return False
    return _number(text + 11, 2) < 24 and _number(text + 14, 2) < 60 and _number(text + 17, 2) < 60


cdef int _put_decimal(_Out *out, const char *text, unsigned long length) except -1:
    """A DECIMAL's text written as rowjson writes its Decimal: repr(float(value)). float(Decimal) reads the
    Decimal's str as a float, and the str of a Decimal made from MySQL's text (digits with a sign and a point) is
    the same number, so that float is the text read as a double (both correctly rounded). With at most 15
    significant digits (DBL_DIG: distinct such decimals are distinct doubles) repr's shortest digits are the text's
    own, written here in repr's fixed notation; anything else is read and written by CPython's own strtod and
    repr. 0 when the text isn't of that shape or the double isn't finite."""
    cdef unsigned long i = 1 if length and text[0] == b'-' else 0
    cdef unsigned long whole = i, point = length, first = length, last = length
    cdef char *end
    while i < length and b'0' <= text[i] <= b'9':
        i += 1
    if i == whole:
        return 0
    if i < length and text[i] == b'.':
        point = i
        i += 1
        while i < length and b'0' <= text[i] <= b'9':
            i += 1
        if i == point + 1:
            return 0
    if i != length or text[length] != 0:
        return 0
    # The significant digits: from the first nonzero digit (`first`) to the last (`last`), the point between.
    for i in range(whole, length):
        if text[i] != b'.' and text[i] != b'0':
            if first == length:
                first = i
            last = i
    if first == length:         # zero: 0.0, with its sign
        if text[0] == b'-':
            _put(out, b"-", 1)
        _put(out, b"0.0", 3)
        return 1
    # Where the point goes, counted in digits from the first significant one; how many significant digits.
    cdef long decpt = <long>point - <long>first if first < point else -(<long>first - <long>point - 1)
    cdef long significant = <long>last - <long>first + 1 - (1 if first < point < last else 0)
    if significant <= 15 and -4 < decpt <= 16:
        if text[0] == b'-':
            _put(out, b"-", 1)
        if decpt <= 0:
            _put(out, b"0.", 2)
            for i in range(<unsigned long>(-decpt)):
                _put(out, b"0", 1)
            _put(out, text + first, last - first + 1)   # all after the point: no point among them
        else:
            # The digits before the point, the point, then those after up to the last significant one (or ".0").
            _put(out, text + first, point - first)
            if last > point:
                _put(out, text + point, last - point + 1)
            else:
                _put(out, b".0", 2)
        return 1
    cdef double value = PyOS_string_to_double(text, &end, NULL)
    if end != text + length or not isfinite(value):
        return 0
    cdef char *written = PyOS_double_to_string(value, b'r', 0, Py_DTSF_ADD_DOT_0, NULL)
    try:
        _put(out, written, strlen(written))
    finally:
        PyMem_Free(written)
    return 1


cdef bytes _encoding(const char *charset):
    """The Python codec mysqlclient decodes a connection's text with (its _get_encoding)."""
    if strncmp(b"utf8", charset, 4) == 0:
        return b"utf8"
    if strncmp(b"latin1", charset, 6) == 0:
        return b"cp1252"
    if strncmp(b"koi8r", charset, 5) == 0:
        return b"koi8_r"
    if strncmp(b"koi8u", charset, 5) == 0:
        return b"koi8_u"
    return charset


cdef object _failure(void *mysql):
    """mysqlclient's exception for the connection's current error."""
    cdef const char *message = _LIB.error(mysql)
    return driver_error(_LIB.error_code(mysql), message.decode("utf-8"))
