# cython: language_level=3, boundscheck=False, wraparound=False
"""A PostgreSQL connection's libpq pipeline with libpq called directly: the compiled twin of pgpipe.py (rules there).

The functions are looked up with dlsym through the handle of psycopg's own C `pq` module, so they are those of the
libpq that module is linked to (psycopg_binary's bundled copy, or the system's for psycopg_c), never another
copy: PQsendQueryParams, PQsendPipelineSync, PQflush, PQisBusy, PQconsumeInput. They are called with the
interpreter lock held (each is a few hundred instructions), except the system calls of a call's exchange: a flush
only marks the queue as due, and the next segment sends it, waits for the reply and reads it into libpq's buffer
with the lock let go once for all three, as psycopg2 does around a whole query. Holding the lock through a send
or a read made threads queue for it: on one core the kernel often preempts a thread as its system call returns
(another thread's reply has woken that thread), and a thread preempted holding the lock keeps every other
waiting (docs/performance-log.md, 2026-12-02). Results still come from psycopg's get_result (which keeps the lock), so they are
psycopg PGresults that its Transformer loads exactly as before.

The import fails, saying why (auto mode then runs the pure twin, and `qag._speedups.fallbacks()` tells), when
psycopg is installed but the libpq it will load can't be driven this way: its ctypes implementation, a libpq
before 17 (no PQsendPipelineSync), a missing function. Which pq module psycopg will load is read without importing
psycopg (a third of a second, and drivers load on first use): the module it has loaded when it is imported already,
otherwise the one its own rule picks (PSYCOPG_IMPL, else psycopg_c, else psycopg_binary), found and opened the way
it would be. A Pipe always binds through the module of the PGconn it is given, so a wrong guess can't call another
libpq. Without psycopg this imports (nothing to drive), as the twins of the other optional drivers do.
"""

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_FromLongLong, PyLong_FromString
from cpython.object cimport PyObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.string cimport memcmp, memcpy, strlen
from cpython.mem cimport PyMem_Malloc, PyMem_Free
from libc.errno cimport errno, EINTR
from libc.math cimport ceil
from libc.stdint cimport uint64_t, uintptr_t

from qag._speedups._jsontext cimport canonical_int, escaped_size, json_keys, plain_text, write_escaped
from qag._speedups._lonewait cimport (POLLIN, POLLOUT, POLLPRI, monotonic as _monotonic, poll, pollfd, qag_lone_wait_begin,
                                     qag_lone_wait_end, slept, spin_first)

import importlib.machinery
import importlib.util
import os
import sys

# One exception class and one set of status codes for both twins (the callers catch them whichever runs).
from qag._speedups.pgpipe import (COMMAND_OK, FATAL_ERROR, Gone, PIPELINE_ABORTED, PIPELINE_SYNC, TUPLES_OK,
                                  NOTHING_PENDING, _operational_error, error_of, name_of, transformer_rows)
from qag._speedups.rowjson import unique_columns


cdef inline bint _no_result(bint ended) except -1:
    """The pure twin's no_result as a C call (it runs after every statement's results)."""
    if ended:
        raise _operational_error(NOTHING_PENDING)
    return True


__all__ = ["Gone", "Pipe", "COMMAND_OK", "TUPLES_OK", "FATAL_ERROR", "PIPELINE_SYNC", "PIPELINE_ABORTED", "LIBPQ"]

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

# libpq's prototypes (its ABI is stable; no headers needed). A PGconn is opaque here.
ctypedef unsigned int Oid
ctypedef int (*send_params_f)(void *conn, const char *command, int n, const Oid *types, const char * const *values,
                              const int *lengths, const int *formats, int result_format) noexcept nogil
ctypedef int (*conn_f)(void *conn) noexcept nogil
ctypedef int (*version_f)() noexcept nogil
ctypedef void *(*get_result_f)(void *conn) noexcept nogil
ctypedef int (*result_f)(const void *result) noexcept nogil
ctypedef void (*clear_f)(void *result) noexcept nogil
ctypedef char *(*error_field_f)(const void *result, int code) noexcept nogil
ctypedef char *(*message_f)(const void *result) noexcept nogil
ctypedef char *(*fname_f)(const void *result, int column) noexcept nogil
ctypedef int (*column_f)(const void *result, int column) noexcept nogil
ctypedef char *(*value_f)(const void *result, int row, int column) noexcept nogil
ctypedef int (*value_int_f)(const void *result, int row, int column) noexcept nogil

cdef short _READ = POLLIN | POLLPRI
cdef short _READ_WRITE = POLLIN | POLLPRI | POLLOUT
cdef int _SMALL = 16          # parameters passed in stack arrays; more are allocated
cdef int _SYNC_STATUS = PIPELINE_SYNC
cdef int _ABORTED_STATUS = PIPELINE_ABORTED
cdef int _COMMAND_OK = COMMAND_OK
cdef int _TUPLES_OK = TUPLES_OK
cdef int _FATAL_STATUS = FATAL_ERROR
cdef int _PG_DIAG_SQLSTATE = 67    # 'C'


cdef class _Libpq:
    """The libpq functions of one psycopg pq module (found through its handle)."""

    cdef send_params_f send_query_params
    cdef conn_f send_pipeline_sync
    cdef conn_f flush
    cdef conn_f is_busy
    cdef conn_f consume_input
    cdef get_result_f get_result
    cdef result_f result_status
    cdef result_f nfields
    cdef clear_f clear
    cdef error_field_f error_field
    cdef message_f error_message
    cdef fname_f fname
    cdef result_f ntuples
    cdef column_f ftype
    cdef column_f fformat
    cdef value_f getvalue
    cdef value_int_f getlength
    cdef value_int_f getisnull
    cdef readonly str path       # the libpq file the functions are in
    cdef readonly int version    # PQlibVersion()


cdef void *_symbol(void *handle, str name, str where) except NULL:
    cdef bytes encoded = name.encode()
    cdef void *address = dlsym(handle, encoded)
    if address == NULL:
        need = " (libpq 17 or later)" if name == "PQsendPipelineSync" else ""
        raise ImportError(f"the libpq of {where} has no {name}{need}")
    return address


cdef _Libpq _bind(str module_file):
    """The libpq functions `module_file` (a psycopg C pq module) is linked to; ImportError saying why not."""
    cdef bytes encoded = os.fsencode(module_file)
    cdef void *handle = dlopen(encoded, RTLD_NOW | RTLD_LOCAL)
    cdef const char *error
    cdef bytes text = b"unknown error"
    if handle == NULL:
        error = dlerror()
        if error != NULL:
            text = error
        raise ImportError(f"{module_file} can't be loaded: {text.decode('utf-8', 'replace')}")
    cdef _Libpq lib = _Libpq()
    cdef Dl_info info
    lib.send_query_params = <send_params_f>_symbol(handle, "PQsendQueryParams", module_file)
    if dladdr(<void *>lib.send_query_params, &info) == 0 or info.dli_fname == NULL:
        raise ImportError(f"the libpq of {module_file} can't be located")
    text = info.dli_fname
    lib.path = os.fsdecode(text)
    lib.version = (<version_f>_symbol(handle, "PQlibVersion", module_file))()
    if lib.version < 170000:
        raise ImportError(f"{lib.path} is libpq {lib.version}; queueing a Sync without sending it needs "
                          f"PQsendPipelineSync (libpq 17 or later)")
    lib.send_pipeline_sync = <conn_f>_symbol(handle, "PQsendPipelineSync", module_file)
    lib.flush = <conn_f>_symbol(handle, "PQflush", module_file)
    lib.is_busy = <conn_f>_symbol(handle, "PQisBusy", module_file)
    lib.consume_input = <conn_f>_symbol(handle, "PQconsumeInput", module_file)
    lib.get_result = <get_result_f>_symbol(handle, "PQgetResult", module_file)
    lib.result_status = <result_f>_symbol(handle, "PQresultStatus", module_file)
    lib.nfields = <result_f>_symbol(handle, "PQnfields", module_file)
    lib.clear = <clear_f>_symbol(handle, "PQclear", module_file)
    lib.error_field = <error_field_f>_symbol(handle, "PQresultErrorField", module_file)
    lib.error_message = <message_f>_symbol(handle, "PQresultErrorMessage", module_file)
    lib.fname = <fname_f>_symbol(handle, "PQfname", module_file)
    lib.ntuples = <result_f>_symbol(handle, "PQntuples", module_file)
    lib.ftype = <column_f>_symbol(handle, "PQftype", module_file)
    lib.fformat = <column_f>_symbol(handle, "PQfformat", module_file)
    lib.getvalue = <value_f>_symbol(handle, "PQgetvalue", module_file)
    lib.getlength = <value_int_f>_symbol(handle, "PQgetlength", module_file)
    lib.getisnull = <value_int_f>_symbol(handle, "PQgetisnull", module_file)
    return lib


cdef dict _libs = {}          # pq module file → its _Libpq


def _pq_module_files() -> list:
    """The C pq modules psycopg has loaded or would try, in its order; [] without psycopg (ImportError when
    psycopg is there but would run its ctypes implementation)."""
    pq = sys.modules.get("psycopg.pq")
    if pq is not None:
        if pq.__impl__ not in ("c", "binary"):
            raise ImportError(f"psycopg runs its {pq.__impl__} implementation: there is no C libpq binding to drive")
        return [sys.modules[pq.PGconn.__module__].__file__]
    if importlib.util.find_spec("psycopg") is None:
        return []
    impl = os.environ.get("PSYCOPG_IMPL", "").lower()
    if impl == "python":
        raise ImportError("PSYCOPG_IMPL=python: psycopg runs its ctypes implementation, there is no C libpq "
                          "binding to drive")
    names = {"": ("psycopg_c", "psycopg_binary"), "c": ("psycopg_c",), "binary": ("psycopg_binary",)}.get(impl)
    if names is None:
        raise ImportError(f"PSYCOPG_IMPL={impl!r} names no psycopg implementation")
    files = []
    for name in names:
        spec = importlib.util.find_spec(name)
        for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:
                path = os.path.join(folder, "pq" + suffix)
                if os.path.isfile(path):
                    files.append(path)
                    break
    if not files:
        raise ImportError("psycopg has neither of its C implementations here (psycopg_c, psycopg_binary): "
                          "it would run its ctypes one")
    return files


def _predict():
    """The libpq file of the pq module psycopg runs or will run (bound now), or None without psycopg."""
    reasons = []
    for path in _pq_module_files():
        try:
            _libs[path] = _bind(path)
        except ImportError as exc:   # as psycopg does when a module fails to load: the next one
            reasons.append(str(exc))
            continue
        return _libs[path].path
    if reasons:
        raise ImportError("; ".join(reasons))
    return None


LIBPQ = _predict()


cdef _Libpq _lib_of(pgconn):
    """The functions of the libpq `pgconn` lives in: those of its own pq module."""
    path = sys.modules[type(pgconn).__module__].__file__
    lib = _libs.get(path)
    if lib is None:
        lib = _libs[path] = _bind(path)
    return lib


# _pump's outcomes other than 0 (done)
cdef int _INTERRUPTED = 1
cdef int _LATE = 2
cdef int _FLUSH_FAILED = 3
cdef int _CONSUME_FAILED = 4
cdef int _POLL_FAILED = 5


cdef int _poll_until(int fd, short events, bint bounded, double limit, short *revents, int *error) noexcept nogil:
    """poll() until `events` or the deadline: 0 ready, else an outcome."""
    cdef pollfd fds
    cdef int rc, timeout = -1
    cdef double left
    fds.fd = fd
    fds.events = events
    while True:
        if bounded:
            left = limit - _monotonic()
            if left <= 0:
                return _LATE
            timeout = <int>min(ceil(left * 1000.0), 2147483647.0)
        fds.revents = 0
        rc = poll(&fds, 1, timeout)
        if rc > 0:
            revents[0] = fds.revents
            return 0
        if rc == 0:
            return _LATE
        if errno == EINTR:
            return _INTERRUPTED
        error[0] = errno
        return _POLL_FAILED


cdef int _pump(conn_f flush, conn_f consume_input, void *conn, int fd, int *due, bint bounded, double limit,
               bint receive, double spin, bint *missed, int *error) noexcept nogil:
    """Without the interpreter lock: send what is due (reading the server's replies meanwhile, so neither side can
    block the other), then, when `receive`, wait for input and read what has come (spinning first up to `spin`
    seconds when no other thread waits for a reply, unless the last spin `missed` and no sleep since was shorter
    than the spin: slow replies, a write's say, are slept for at once). 0 when done, else an outcome."""
    cdef int rc, step
    cdef double began = 0.0
    cdef short revents = 0
    while due[0]:
        rc = flush(conn)
        if rc == 0:
            due[0] = 0
            break
        if rc < 0:
            return _FLUSH_FAILED
        step = _poll_until(fd, _READ_WRITE, bounded, limit, &revents, error)
        if step:
            return step
        if revents & _READ and consume_input(conn) != 1:
            return _CONSUME_FAILED
    if not receive:
        return 0
    if not spin_first(fd, spin, bounded, limit, missed, &began):
        qag_lone_wait_begin()
        step = _poll_until(fd, _READ, bounded, limit, &revents, error)
        qag_lone_wait_end()
        if step:
            return step
        slept(spin, began, missed)
    if consume_input(conn) != 1:
        return _CONSUME_FAILED
    return 0


# How `rows` reads a column's text values, by the loader the connection's Transformer has for its type: as psycopg's
# C loaders do (IntLoader: int(text); BoolLoader: the first byte is 't'; TextLoader of a UTF-8 connection: the
# text decoded, errors raised), or through the Transformer for any other loader.
cdef enum:
    _BY_PSYCOPG = 0
    _INT = 1
    _BOOL = 2
    _UTF8_TEXT = 3
    _MAX_DIRECT_COLUMNS = 64      # wider results go to the Transformer (a stack array holds the kinds)

cdef tuple _psycopg_loaders = None      # (IntLoader, BoolLoader, TextLoader): psycopg's C classes, looked up on first use


cdef int _kind_of_loader(loader) except -1:
    global _psycopg_loaders
    if _psycopg_loaders is None:
        import psycopg      # loaded already: a result to read came through it
        _psycopg_loaders = tuple(psycopg.adapters.get_loader(oid, 0) for oid in (23, 16, 25))
    cls = type(loader)
    if cls is _psycopg_loaders[0]:
        return _INT
    if cls is _psycopg_loaders[1]:
        return _BOOL
    # A TextLoader decodes with the connection's encoding as it was when the Transformer made it (kept for the
    # Transformer's life, as this kind is kept for the Pipe's): UTF-8 is told by what it makes of a UTF-8 'é'
    # (SQL_ASCII gives bytes, another encoding other characters).
    if cls is _psycopg_loaders[2] and loader.load(b"\xc3\xa9") == "\u00e9":
        return _UTF8_TEXT
    return _BY_PSYCOPG


cdef object _int_of(const char *text, int length):
    """int(text) for PostgreSQL's text form of an integer; anything else (or over 18 digits) as psycopg parses it."""
    cdef int i = 0
    cdef long long value = 0
    cdef unsigned int digit
    if length > 0 and text[0] == b'-':
        i = 1
    if length - i < 1 or length - i > 18:
        return PyLong_FromString(text, NULL, 10)       # libpq ends every value with a NUL
    while i < length:
        digit = <unsigned char>text[i] - 48
        if digit > 9:
            return PyLong_FromString(text, NULL, 10)
        value = value * 10 + digit
        i += 1
    return PyLong_FromLongLong(-value if text[0] == b'-' else value)


# --- Pipe.json: a page's JSON written from libpq's text values ---------------------------------------------------
# Only values whose JSON is their text as it is, a fixed word, or their UTF-8 text escaped as rowjson escapes a str
# (_jsontext) are written here; for any other value `json` returns None and the caller makes the rows and has
# rowjson encode them.

cdef dict _KEYS = {}           # column names (a tuple) → their JSON keys, or None: a saved query's names repeat
cdef Py_ssize_t _KEYS_MAX = 512


cdef object _plain_keys(names):
    """rowjson's JSON keys of these column names (_jsontext.json_keys), or None, kept for the next call."""
    key = tuple(names)
    if key in _KEYS:
        return _KEYS[key]
    keys = json_keys(unique_columns(list(key)))
    if len(_KEYS) >= _KEYS_MAX:
        _KEYS.clear()
    _KEYS[key] = keys
    return keys


cdef extern from *:
    """
    static inline void *qag_pointer_at(PyObject *o, Py_ssize_t at) { return *(void **)((char *)o + at); }
    """
    void *qag_pointer_at(object o, Py_ssize_t at) noexcept


cdef Py_ssize_t _pointer_field(pgconn) except -1:
    # psycopg's C PGconn (a Cython extension type) keeps its libpq pointer as its first field, after the object's
    # head and its method table, and sets it to NULL when it frees the connection. Read there, the pointer is a
    # load where the pgconn_ptr property is a Python call (a dozen uses a call). Only when that field holds what
    # the property says now: another layout reads through the property, as before.
    ptr = pgconn.pgconn_ptr
    cdef Py_ssize_t at = sizeof(PyObject) + sizeof(void *)
    if ptr is None or type(pgconn).__basicsize__ < at + <Py_ssize_t>sizeof(void *):
        return 0
    return at if <uintptr_t>qag_pointer_at(pgconn, at) == <uintptr_t>ptr else 0


cdef class Pipe:
    """One connection's pipeline: queue statements and Syncs, send them, read a segment's results."""

    cdef object _pg
    cdef object _get_result
    cdef _Libpq _lib
    cdef int _fd
    cdef bint _due          # flush() was asked for and the queue is not all sent yet: segment() sends it first
    cdef dict _kinds        # type OID → how `rows` reads it (its Transformer's loaders stay the same for its life)
    cdef double _spin       # seconds a lone wait for a reply spins before it sleeps
    cdef bint _missed       # the last spin ended before its reply came (and none has come within a spin since)
    cdef readonly Py_ssize_t pointer_at   # where the PGconn keeps its libpq pointer (_pointer_field), or 0: unknown

    def __init__(self, pgconn, spin=0.0):
        self._spin = spin
        self._lib = _lib_of(pgconn)
        self._pg = pgconn
        self._get_result = pgconn.get_result
        self._fd = pgconn.socket
        self._kinds = {}
        self.pointer_at = _pointer_field(pgconn)

    cdef void *_conn(self, str closed) except NULL:
        # Read on every use: psycopg frees the PGconn when its connection is closed and sets its pointer to NULL
        # (pgconn_ptr None). From the field where _pointer_field found it, else through the property.
        cdef void *conn
        if self.pointer_at > 0:
            conn = qag_pointer_at(self._pg, self.pointer_at)
            if conn == NULL:
                raise _operational_error(closed)
            return conn
        ptr = self._pg.pgconn_ptr
        if ptr is None:
            raise _operational_error(closed)
        return <void *><uintptr_t>ptr

    cdef short _wait(self, object deadline, short events) except -1:
        """poll() for `events` until one is ready (returns them), releasing the interpreter lock only when the
        socket is not ready at once; Gone past the deadline."""
        cdef pollfd fds
        cdef int rc, timeout = -1
        cdef double left = 0.0, limit = 0.0
        cdef bint bounded = deadline is not None
        if bounded:
            limit = deadline
            left = limit - _monotonic()
            if left <= 0:
                raise Gone()
        fds.fd = self._fd
        fds.events = events
        fds.revents = 0
        rc = poll(&fds, 1, 0)
        while rc <= 0:
            if rc < 0:
                if errno != EINTR:
                    raise OSError(errno, os.strerror(errno))
                PyErr_CheckSignals()          # a signal handler's exception ends the wait, as in Python's poll
            if bounded:
                left = limit - _monotonic()
                if left <= 0:
                    raise Gone()
                timeout = <int>min(ceil(left * 1000.0), 2147483647.0)
            with nogil:
                rc = poll(&fds, 1, timeout)
            if rc == 0:
                raise Gone()
        return fds.revents

    cdef int _consume(self, void *conn) except -1:
        if self._lib.consume_input(conn) != 1:
            raise _operational_error(f"consuming input failed: {self._pg.get_error_message()}")
        return 0

    def send(self, bytes sql not None, values=None, types=None, formats=None):
        self._send(self._conn("the connection is closed"), sql, values, types, formats)

    def put(self, list items not None, deadline):
        """Queue each item (bytes: a statement without values; a tuple: send's arguments; None: a Sync), then
        flush(deadline): a call's whole pipeline in one method call, the connection looked up once."""
        cdef void *conn = self._conn("the connection is closed")
        cdef tuple args
        cdef Py_ssize_t n
        for item in items:
            if item is None:
                self._sync(conn)
            elif type(item) is bytes:
                self._send(conn, item, None, None, None)
            elif type(item) is tuple and 1 <= len(<tuple>item) <= 4:
                args = <tuple>item
                n = len(args)
                self._send(conn, args[0], args[1] if n > 1 else None, args[2] if n > 2 else None,
                           args[3] if n > 3 else None)
            else:
                raise TypeError(f"a pipeline item is bytes, a tuple of send's arguments or None, not {item!r}")
        self._due = True

    cdef int _send(self, void *conn, bytes sql, values, types, formats) except -1:
        if sql is None:
            raise TypeError("a statement must be bytes, not None")
        cdef Py_ssize_t n = 0, i
        items = type_items = format_items = None
        if values is not None:
            items = values if type(values) is list or type(values) is tuple else tuple(values)
            n = len(items)
        if types is not None:
            type_items = types if type(types) is list or type(types) is tuple else tuple(types)
            if len(type_items) != n:
                raise ValueError(f"got {n} param_values but {len(type_items)} param_types")
        if formats is not None:
            format_items = formats if type(formats) is list or type(formats) is tuple else tuple(formats)
            if len(format_items) != n:
                raise ValueError(f"got {n} param_values but {len(format_items)} param_formats")
        cdef const char *small_values[16]
        cdef int small_lengths[16]
        cdef int small_formats[16]
        cdef Oid small_types[16]
        cdef const char **cvalues = small_values
        cdef int *clengths = small_lengths
        cdef int *cformats = small_formats
        cdef Oid *ctypes = small_types
        cdef Py_buffer *views = NULL          # made for the first value that is neither bytes nor bytearray
        cdef Py_ssize_t held = 0
        cdef int rc = 0
        try:
            if n > _SMALL:
                cvalues = <const char **>PyMem_Malloc(n * sizeof(char *))
                clengths = <int *>PyMem_Malloc(n * sizeof(int))
                cformats = <int *>PyMem_Malloc(n * sizeof(int))
                ctypes = <Oid *>PyMem_Malloc(n * sizeof(Oid))
                if cvalues == NULL or clengths == NULL or cformats == NULL or ctypes == NULL:
                    raise MemoryError()
            for i in range(n):
                item = items[i]
                if item is None:
                    cvalues[i] = NULL
                    clengths[i] = 0
                elif type(item) is bytes:
                    cvalues[i] = PyBytes_AS_STRING(item)
                    clengths[i] = <int>PyBytes_GET_SIZE(item)
                elif type(item) is bytearray:         # what psycopg's C dumpers make
                    cvalues[i] = PyByteArray_AS_STRING(item)
                    clengths[i] = <int>PyByteArray_GET_SIZE(item)
                else:                                 # any other buffer, held until libpq has copied it
                    if views == NULL:
                        views = <Py_buffer *>PyMem_Malloc(n * sizeof(Py_buffer))
                        if views == NULL:
                            raise MemoryError()
                    PyObject_GetBuffer(item, &views[held], PyBUF_SIMPLE)
                    held += 1
                    cvalues[i] = <const char *>views[held - 1].buf
                    clengths[i] = <int>views[held - 1].len
                cformats[i] = format_items[i] if format_items is not None else 0
                ctypes[i] = type_items[i] if type_items is not None else 0
            rc = self._lib.send_query_params(conn, sql, <int>n, ctypes if type_items is not None else NULL,
                                             cvalues if n else NULL, clengths if n else NULL,
                                             cformats if format_items is not None else NULL, 0)
        finally:
            for i in range(held):
                PyBuffer_Release(&views[i])
            PyMem_Free(views)
            if n > _SMALL:
                PyMem_Free(cvalues)
                PyMem_Free(clengths)
                PyMem_Free(cformats)
                PyMem_Free(ctypes)
        if not rc:
            raise _operational_error(f"sending query and params failed: {self._pg.get_error_message()}")
        return 0

    def sync(self):
        self._sync(self._conn("the connection is closed"))

    cdef int _sync(self, void *conn) except -1:
        if self._lib.send_pipeline_sync(conn) != 1:
            raise _operational_error("could not queue a pipeline sync")
        return 0

    def flush(self, deadline):
        """Mark everything queued as due: the next segment() sends it, waiting until the socket takes it all (past
        the deadline, Gone), inside its one release of the interpreter lock; readable() sends it first too."""
        self._conn("flushing failed: the connection is closed")
        self._due = True

    cdef int _exchange(self, void *conn, object deadline, bint receive=True) except -1:
        """Send what is due, then (`receive`) wait for input and read it into libpq's buffer, the lock let go once
        for all of it; Gone past the deadline."""
        cdef int step, error = 0, due = self._due
        cdef bint bounded = deadline is not None
        cdef double limit = deadline if bounded else 0.0
        while True:
            with nogil:
                step = _pump(self._lib.flush, self._lib.consume_input, conn, self._fd, &due, bounded, limit, receive,
                             self._spin, &self._missed, &error)
            self._due = due
            if step == 0:
                return 0
            if step == _INTERRUPTED:
                PyErr_CheckSignals()          # a signal handler's exception ends the wait, as in Python's poll
                continue
            if step == _LATE:
                raise Gone()
            if step == _FLUSH_FAILED:
                raise _operational_error(f"flushing failed: {self._pg.get_error_message()}")
            if step == _CONSUME_FAILED:
                raise _operational_error(f"consuming input failed: {self._pg.get_error_message()}")
            raise OSError(error, os.strerror(error))

    def segment(self, deadline):
        cdef void *conn = self._conn("the connection is closed")
        cdef list out = []
        cdef conn_f is_busy = self._lib.is_busy
        cdef int status
        cdef bint ended = False
        get_result = self._get_result
        while True:
            if self._due:
                self._exchange(conn, deadline)
            while is_busy(conn):
                self._wait(deadline, _READ)
                self._consume(conn)
            result = get_result()
            if result is None:
                ended = _no_result(ended)
                continue
            ended = False
            status = result.status
            if status == _SYNC_STATUS:
                return out
            if status != _ABORTED_STATUS:
                out.append(result)

    cdef int _ready(self, void *conn, object deadline) except -1:
        """Send what is due and read until libpq has the next result whole."""
        if self._due:
            self._exchange(conn, deadline)
        while self._lib.is_busy(conn):
            self._wait(deadline, _READ)
            self._consume(conn)
        return 0

    cdef tuple _error(self, const void *result):
        cdef const char *state = self._lib.error_field(result, _PG_DIAG_SQLSTATE)
        cdef const char *message = self._lib.error_message(result)
        return error_of(None if state == NULL else <bytes>state, None if message == NULL else <bytes>message)

    cdef list _names(self, object result):
        # name_of's decoding (UTF-8, errors replaced) without a bytes object and a Python call per column
        cdef const void *ptr = <const void *><uintptr_t>result.pgresult_ptr
        cdef int i, n = self._lib.nfields(ptr)
        cdef const char *name
        cdef list names = []
        for i in range(n):
            name = self._lib.fname(ptr, i)
            if name == NULL:
                names.append(name_of(None))
            else:
                names.append(PyUnicode_DecodeUTF8(name, strlen(name), "replace"))
        return names

    def outcome(self, deadline, int want):
        """The results other than the wanted one are read and freed here, never made into Python objects."""
        cdef void *conn = self._conn("the connection is closed")
        cdef _Libpq lib = self._lib
        cdef void *ptr
        cdef int status, index = 0
        cdef bint ended = False
        result = names = error = None
        while True:
            self._ready(conn, deadline)
            if index == want:
                item = self._get_result()
                if item is None:
                    ended = _no_result(ended)
                    continue
                ended = False
                status = item.status
                if status == _SYNC_STATUS:
                    return result, names, error
                if status == _ABORTED_STATUS:
                    continue
                index += 1
                if status == _TUPLES_OK:
                    result, names = item, self._names(item)
                elif status == _FATAL_STATUS and error is None:
                    error = self._error(<const void *><uintptr_t>item.pgresult_ptr)
                continue
            ptr = lib.get_result(conn)
            if ptr == NULL:
                ended = _no_result(ended)
                continue
            ended = False
            status = lib.result_status(ptr)
            if status == _FATAL_STATUS and error is None:
                try:
                    error = self._error(ptr)
                except BaseException:
                    lib.clear(ptr)
                    raise
            lib.clear(ptr)
            if status == _SYNC_STATUS:
                return result, names, error
            if status != _ABORTED_STATUS:
                index += 1

    def settle(self, deadline):
        cdef void *conn = self._conn("the connection is closed")
        cdef _Libpq lib = self._lib
        cdef void *ptr
        cdef int status
        cdef bint ok = True
        cdef bint ended = False
        while True:
            self._ready(conn, deadline)
            ptr = lib.get_result(conn)
            if ptr == NULL:
                ended = _no_result(ended)
                continue
            ended = False
            status = lib.result_status(ptr)
            lib.clear(ptr)
            if status == _SYNC_STATUS:
                return ok
            if status != _COMMAND_OK and status != _TUPLES_OK:
                ok = False

    cdef int _kind(self, tx, Oid oid) except -1:
        kind = self._kinds.get(oid)
        if kind is None:
            kind = self._kinds[oid] = _kind_of_loader(tx.get_loader(oid, 0))
        return kind

    def rows(self, result, tx, Py_ssize_t start, Py_ssize_t end):
        cdef const void *ptr = <const void *><uintptr_t>result.pgresult_ptr
        cdef _Libpq lib = self._lib
        cdef int columns = lib.nfields(ptr), c, r
        cdef int kinds[_MAX_DIRECT_COLUMNS]
        cdef const char *text
        cdef int length
        # Per text column, the last text decoded and its str (borrowed: its row is in `out`): the same text in
        # the next row gives the same str (a join repeats its parent's columns; a padded column its blanks).
        cdef const char *seen_text[_MAX_DIRECT_COLUMNS]
        cdef int seen_length[_MAX_DIRECT_COLUMNS]
        cdef PyObject *seen_value[_MAX_DIRECT_COLUMNS]
        if not 0 <= start <= end <= lib.ntuples(ptr) or columns > _MAX_DIRECT_COLUMNS:
            return transformer_rows(result, tx, start, end)
        for c in range(columns):
            kinds[c] = self._kind(tx, lib.ftype(ptr, c)) if lib.fformat(ptr, c) == 0 else _BY_PSYCOPG
            if kinds[c] == _BY_PSYCOPG:
                return transformer_rows(result, tx, start, end)
            seen_value[c] = NULL
        cdef list out = PyList_New(end - start)
        for r in range(<int>start, <int>end):
            row = PyTuple_New(columns)
            # The list owns the tuple before its values are made: an error below frees both.
            Py_INCREF(row)
            PyList_SET_ITEM(out, r - start, row)
            for c in range(columns):
                # A NULL's text is empty: only an empty text needs PQgetisnull to tell it from ''.
                length = lib.getlength(ptr, r, c)
                if length == 0 and lib.getisnull(ptr, r, c):
                    value = None
                else:
                    text = lib.getvalue(ptr, r, c)
                    if kinds[c] == _INT:
                        value = _int_of(text, length)
                    elif kinds[c] == _UTF8_TEXT:
                        if (seen_value[c] != NULL and seen_length[c] == length
                                and memcmp(seen_text[c], text, length) == 0):
                            value = <object>seen_value[c]
                        else:
                            value = PyUnicode_DecodeUTF8(text, length, NULL)
                            seen_text[c] = text
                            seen_length[c] = length
                            seen_value[c] = <PyObject *>value
                    else:
                        value = True if text[0] == b't' else False
                Py_INCREF(value)
                PyTuple_SET_ITEM(row, c, value)
        return out

    def json(self, result, tx, Py_ssize_t start, Py_ssize_t end, names):
        """The bytes rowjson.encode_json(names, self.rows(result, tx, start, end)) makes, written from libpq's text
        values without making the rows (text escaped as rowjson escapes it: _jsontext); None when some value's JSON
        is not its text (an int that isn't canonical_int, text that isn't UTF-8), a column is not of a direct kind,
        or the range is empty."""
        cdef const void *ptr = <const void *><uintptr_t>result.pgresult_ptr
        cdef _Libpq lib = self._lib
        cdef int columns = lib.nfields(ptr), c, r, length
        cdef int kinds[_MAX_DIRECT_COLUMNS]
        cdef const char *text
        cdef Py_ssize_t escaped
        if not 0 <= start < end <= lib.ntuples(ptr) or not 0 < columns <= _MAX_DIRECT_COLUMNS:
            return None
        keys = _plain_keys(names)
        if keys is None or len(keys) != columns:
            return None
        cdef Py_ssize_t row_size = 2        # its braces
        for c in range(columns):
            kinds[c] = self._kind(tx, lib.ftype(ptr, c)) if lib.fformat(ptr, c) == 0 else _BY_PSYCOPG
            if kinds[c] == _BY_PSYCOPG:
                return None
            row_size += PyBytes_GET_SIZE(keys[c])
        cdef Py_ssize_t count = (end - start) * columns, i = 0
        # First each value's text (NULL for SQL NULL) and the body's size, then the body written into its bytes.
        cdef const char **texts = <const char **>PyMem_Malloc(count * sizeof(char *))
        cdef int *lengths = <int *>PyMem_Malloc(count * sizeof(int))
        cdef Py_ssize_t size = 3 + (end - start) * (row_size + 1) - 1      # "[", "]\n"; a comma between rows
        cdef char *o
        try:
            if texts == NULL or lengths == NULL:
                raise MemoryError()
            for r in range(<int>start, <int>end):
                for c in range(columns):
                    length = lib.getlength(ptr, r, c)
                    if length == 0 and lib.getisnull(ptr, r, c):
                        texts[i] = NULL
                        size += 4
                    else:
                        text = lib.getvalue(ptr, r, c)
                        if kinds[c] == _INT:
                            if not canonical_int(text, length):
                                return None
                            size += length
                        elif kinds[c] == _UTF8_TEXT:
                            if plain_text(text, length):
                                size += length + 2
                            else:                       # written escaped: its length kept negative (~length)
                                escaped = escaped_size(text, length)
                                if escaped < 0:
                                    return None
                                size += escaped
                                length = ~length
                        else:
                            length = 4 if text[0] == b't' else 5     # as rows() reads a boolean: 't' or not
                            size += length
                        texts[i] = text
                    lengths[i] = length
                    i += 1
            body = PyBytes_FromStringAndSize(NULL, size)
            o = PyBytes_AS_STRING(body)
            o[0] = b'['
            o += 1
            i = 0
            for r in range(<int>(end - start)):
                if r:
                    o[0] = b','
                    o += 1
                o[0] = b'{'
                o += 1
                for c in range(columns):
                    key = <bytes>keys[c]
                    memcpy(o, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))
                    o += PyBytes_GET_SIZE(key)
                    if texts[i] == NULL:
                        memcpy(o, b"null", 4)
                        o += 4
                    elif kinds[c] == _INT:
                        memcpy(o, texts[i], lengths[i])
                        o += lengths[i]
                    elif kinds[c] == _UTF8_TEXT and lengths[i] < 0:
                        o = write_escaped(o, texts[i], ~lengths[i])
                    elif kinds[c] == _UTF8_TEXT:
                        o[0] = b'"'
                        memcpy(o + 1, texts[i], lengths[i])
                        o[lengths[i] + 1] = b'"'
                        o += lengths[i] + 2
                    else:
                        memcpy(o, b"true" if lengths[i] == 4 else b"false", lengths[i])
                        o += lengths[i]
                    i += 1
                o[0] = b'}'
                o += 1
            memcpy(o, b"]\n", 2)
            return body
        finally:
            PyMem_Free(texts)
            PyMem_Free(lengths)

    def readable(self):
        cdef void *conn = self._conn("the connection is closed")
        if self._due:                 # what a flush made due is sent (never waiting for a reply) before the look
            self._exchange(conn, None, False)
        cdef pollfd fds
        cdef int rc
        fds.fd = self._fd
        fds.events = _READ
        fds.revents = 0
        rc = poll(&fds, 1, 0)
        while rc < 0:
            if errno != EINTR:
                raise OSError(errno, os.strerror(errno))
            PyErr_CheckSignals()
            rc = poll(&fds, 1, 0)
        return rc > 0
