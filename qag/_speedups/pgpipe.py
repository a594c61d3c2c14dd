"""A PostgreSQL connection's libpq pipeline, driven through psycopg 3's pq wrappers: the pure twin of _pgpipe.

`Pipe(pgconn, spin=0.0)` drives a psycopg `pq.PGconn` that is in pipeline mode and non-blocking (as psycopg opens
it). `spin`: seconds the compiled twin's wait for a reply looks at the socket without sleeping, when no other
thread of the process is waiting for one (a halted core is slow to wake; a lone call's reply finds it awake); the
pure twin always sleeps in poll().
Both twins make the same libpq calls in the same order, so they give the same results and raise the same
exceptions; they differ only in how often the interpreter lock is let go (the compiled twin's reason to be:
psycopg's wrappers release it around every send and every PQisBusy, about twenty times a qag call, and each
release lets another thread in; the compiled twin releases it only to wait for the socket).

- `send(sql, values=None, types=None, formats=None)`: queue one statement through the extended protocol
  (PQsendQueryParams: `values` bytes-like or None per `$n`, `types` their OIDs, `formats` 0 text / 1 binary;
  results in text). Raises psycopg.OperationalError when libpq refuses it (a closed or broken connection).
- `sync()`: queue a Sync without sending it (libpq 17's PQsendPipelineSync; with an older libpq the pure twin
  uses PQpipelineSync, which also sends).
- `put(items, deadline)`: each item queued in order (bytes: `send(item)`; a tuple: `send(*item)`; None: `sync()`),
  then `flush(deadline)`: a call's pipeline in one method call (the compiled twin looks the connection up once).
- `flush(deadline)`: send everything queued, waiting for the socket to take more while the server has not read
  it yet (reading its replies meanwhile, so neither side can block the other). `deadline` is a
  `time.monotonic()` value or None (no limit); past it, `Gone`. The compiled twin only marks the queue as due
  here and sends it at the next `segment` (or `readable`), so that the send, the wait and the read share one
  release of the interpreter lock; what either twin returns or raises over a flush and its segment is the same.
- `segment(deadline)`: the results up to the next Sync, in order, as psycopg `PGresult`s; those of statements
  the pipeline aborted after an error are left out. Waits for the server as needed; past the deadline, `Gone`;
  a connection lost meanwhile, psycopg.OperationalError.
- `outcome(deadline, want)`: a segment read for a call: `(result, names, error)`, where `result` is the PGresult
  of the segment's `want`-th statement (from 0, counting only the results not aborted) when it returned rows
  (TUPLES_OK), else None; `names` its column names as str (None without a result); `error` the first failure's
  (SQLSTATE, message) as str, else None. The compiled twin makes a psycopg PGresult of that one result only.
- `settle(deadline)`: a segment read to its end; whether every statement in it succeeded (the reset's reply).
- `segment`, `outcome` and `settle` with no Sync pending (nothing sent since the last segment was read) raise
  psycopg.OperationalError at once: libpq has no reply to wait for.
- `readable()`: whether the socket has anything to read now (never waits).
- `rows(result, tx, start, end)`: rows `start` to `end` of a PGresult as tuples, loaded as `tx` (the connection's
  psycopg Transformer) loads them. The compiled twin reads the values through libpq itself for the columns whose
  loader is psycopg's own C loader of integers, of booleans or of UTF-8 text (their text forms are short and
  fixed: a decimal, `t`/`f`, the text), building the same objects without psycopg's per-value calls; a result
  with any other column, or a range psycopg refuses, goes to the Transformer as here.
- `json(result, tx, start, end, names)`: the bytes `rowjson.encode_json(names, rows(result, tx, start, end))`
  makes, or None. The compiled twin writes them from libpq's text values, without making the rows, when every
  value's JSON is its text as it is: a NULL, a boolean, an integer in its canonical decimal form, a text of
  printable ASCII without '"' or '\\' (and every column name such a text); for a column of another kind, any
  other value or an empty range it returns None, as the pure twin always does, and the caller makes the rows.

Every method raises psycopg.OperationalError on a connection psycopg has closed.
"""

from __future__ import annotations

import os
import select
import time

__all__ = ["Gone", "Pipe", "COMMAND_OK", "TUPLES_OK", "FATAL_ERROR", "PIPELINE_SYNC", "PIPELINE_ABORTED"]

# libpq's ExecStatusType values (stable libpq ABI): success without and with rows, a failure, a Sync's result and
# a result the pipeline aborted.
COMMAND_OK = 1
TUPLES_OK = 2
FATAL_ERROR = 7
PIPELINE_SYNC = 10
PIPELINE_ABORTED = 11
_UNNAMED = b"?column?"
_READ = select.POLLIN | select.POLLPRI
_READ_WRITE = _READ | select.POLLOUT


def transformer_rows(result, tx, start: int, end: int) -> list:
    """Rows `start` to `end` of `result` as tuples, loaded by the psycopg Transformer `tx` (both twins' way)."""
    tx.set_pgresult(result)
    try:
        return tx.load_rows(start, end, tuple)
    finally:
        tx.set_pgresult(None)


class Gone(Exception):
    """The server did not answer (or take the call's bytes) before the deadline. Both twins raise this class."""


def error_of(sqlstate: bytes | None, message: bytes | None) -> tuple[str, str]:
    """A failed result's (SQLSTATE, message) as both twins report it."""
    return ((sqlstate or b"").decode("ascii", "replace"), (message or b"").decode("utf-8", "replace").strip())


def name_of(name: bytes | None) -> str:
    """A column's name as both twins report it (libpq gives none only past the last column)."""
    return (name or _UNNAMED).decode("utf-8", "replace")


def _operational_error(text: str) -> Exception:
    import psycopg   # imported by whoever made the PGconn; not at this module's import (drivers load on use)
    return psycopg.OperationalError(text)


NOTHING_PENDING = "no reply is pending on the connection: nothing was sent since its last Sync"


def no_result(ended: bool) -> bool:
    """After PQgetResult gave no result with libpq not busy: True (a statement's results ended; the next result
    comes), or, when the one before gave none either, OperationalError: libpq has nothing queued, so a read for a
    Sync would loop for ever (nothing was sent since the last Sync was read)."""
    if ended:
        raise _operational_error(NOTHING_PENDING)
    return True


_SYNC: list = []


def _sync_function():
    """PQsendPipelineSync of the libpq psycopg loaded (called through ctypes), or PGconn.pipeline_sync on a
    libpq before 17, which flushes too. Found once, on the first Pipe (psycopg is imported by then)."""
    if _SYNC:
        return _SYNC[0]
    import psycopg

    function = None
    try:
        import ctypes
        import glob

        import psycopg_binary  # psycopg's own wheel, which ships libpq beside it
        folder = os.path.join(os.path.dirname(os.path.dirname(psycopg_binary.__file__)), "psycopg_binary.libs")
        names = sorted(glob.glob(os.path.join(folder, "libpq*.so*")))
        lib = ctypes.CDLL(names[0] if names else "libpq.so.5")
        if lib.PQlibVersion() >= 170000:
            function = lib.PQsendPipelineSync
            function.argtypes = (ctypes.c_void_p,)
            function.restype = ctypes.c_int
    except (ImportError, OSError, AttributeError):
        function = None

    if function is None:
        def sync(pgconn) -> None:
            pgconn.pipeline_sync()
    else:
        def sync(pgconn) -> None:
            if function(pgconn.pgconn_ptr) != 1:
                raise psycopg.OperationalError("could not queue a pipeline sync")
    _SYNC.append(sync)
    return sync


def _wait(poller, deadline: float | None) -> list:
    """poll() until something is ready, or Gone past the deadline."""
    if deadline is None:
        return poller.poll()
    left = deadline - time.monotonic()
    # poll() takes an int of milliseconds: a deadline further off than that (a huge ?timeout=) waits its longest.
    ready = poller.poll(min(left * 1000.0, 2147483647.0)) if left > 0 else None
    if not ready:
        raise Gone()
    return ready


class Pipe:
    """One connection's pipeline: queue statements and Syncs, send them, read a segment's results."""

    __slots__ = ("_pg", "_sync", "_read", "_flush_poll")

    def __init__(self, pgconn, spin: float = 0.0):
        self._pg = pgconn
        self._sync = _sync_function()
        self._read = select.poll()
        self._read.register(pgconn.socket, _READ)
        self._flush_poll = None      # made on the first flush that has to wait

    def send(self, sql: bytes, values=None, types=None, formats=None) -> None:
        self._pg.send_query_params(sql, values, types, formats)

    def put(self, items: list, deadline: float | None) -> None:
        for item in items:
            if item is None:
                self.sync()
            elif type(item) is bytes:
                self.send(item)
            elif type(item) is tuple and 1 <= len(item) <= 4:
                self.send(*item)
            else:
                raise TypeError(f"a pipeline item is bytes, a tuple of send's arguments or None, not {item!r}")
        self.flush(deadline)

    def _open(self):
        # psycopg's send and flush say so themselves; PQisBusy and PQgetResult on a closed one would answer
        # "not busy" and "no result" for ever.
        pg = self._pg
        if pg.pgconn_ptr is None:
            raise _operational_error("the connection is closed")
        return pg

    def sync(self) -> None:
        self._sync(self._open())

    def flush(self, deadline: float | None) -> None:
        pg = self._pg
        while pg.flush():
            # The socket took only part: wait until it takes more, or until the server's replies (which it may
            # be blocked on sending) can be read into libpq's buffer.
            if self._flush_poll is None:
                self._flush_poll = select.poll()
                self._flush_poll.register(pg.socket, _READ_WRITE)
            if any(events & _READ for _, events in _wait(self._flush_poll, deadline)):
                pg.consume_input()

    def segment(self, deadline: float | None) -> list:
        pg = self._open()
        is_busy, get_result = pg.is_busy, pg.get_result      # bound once: the loop runs a dozen times a call
        out = []
        ended = False
        while True:
            while is_busy():
                _wait(self._read, deadline)
                pg.consume_input()
            result = get_result()
            if result is None:
                ended = no_result(ended)
                continue
            ended = False
            status = result.status
            if status == PIPELINE_SYNC:
                return out
            if status != PIPELINE_ABORTED:
                out.append(result)

    def outcome(self, deadline: float | None, want: int) -> tuple:
        result = names = error = None
        index = 0
        for item in self.segment(deadline):
            status = item.status
            if status == FATAL_ERROR and error is None:
                import psycopg
                error = error_of(item.error_field(psycopg.pq.DiagnosticField.SQLSTATE), item.error_message)
            elif index == want and status == TUPLES_OK:
                result = item
                names = [name_of(item.fname(i)) for i in range(item.nfields)]
            index += 1
        return result, names, error

    def settle(self, deadline: float | None) -> bool:
        return all(item.status in (COMMAND_OK, TUPLES_OK) for item in self.segment(deadline))

    def readable(self) -> bool:
        self._open()
        return bool(self._read.poll(0))

    def rows(self, result, tx, start: int, end: int) -> list:
        return transformer_rows(result, tx, start, end)

    def json(self, result, tx, start: int, end: int, names) -> bytes | None:
        return None        # the pure twin leaves the JSON to rowjson (see the module's docstring)
