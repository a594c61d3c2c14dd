"""PostgreSQL connections on psycopg 3's libpq pipeline: the caller's statement through the extended protocol.

Every paged call is one flush of a pipeline and one wait for its replies (contract 10.4 keeps one round trip;
the messages are a deliberate departure, docs/compatibility.md):

    BEGIN READ ONLY (read-only)                                                ┐
    SELECT [pg_catalog.set_config('statement_timeout', $1, true), ...]        │
           pg_catalog.setseed($n)                                              │ the call's transaction
    <the caller's statement, its values bound as $1..$n>                       │
    ROLLBACK (read-only; a write commits at the Sync)                          ┘
    DISCARD ALL (the reset, pooled only: read-only calls)                        Sync   (one segment, one reply)

    a write:   SELECT [settings]; <statement>  Sync   DISCARD ALL  Sync   (the reset in a segment of its own)

Why this shape:
  - The caller's statement is one Parse message, so the server itself refuses a second statement ("cannot
    insert multiple commands into a prepared statement"), whatever qag's reading of the text said. Its values
    travel as Bind parameters, never as text the server reads as SQL under whatever encoding or
    standard_conforming_strings a session has.
  - Everything before a Sync runs as one transaction (the extended protocol commits only at Sync), so the
    BEGIN READ ONLY's access mode (never turned off after the transaction's first query, and the settings
    statement is one) and the first statement's settings hold for the caller's statement: the time limit and,
    for a table-restricted or masked call, the search_path, both transaction-local. A read-only call ends with
    ROLLBACK, so even what a read-only transaction lets through on PostgreSQL 15 (large-object writes,
    pg_notify, set_config) is undone; a statement that fails aborts the rest, and the Sync rolls it all back.
    It runs in an explicit block (BEGIN READ ONLY): a ROLLBACK in the protocol's implicit one still undoes it,
    but the server warns "there is no transaction in progress" each time, to the client and into its own log.
  - The reset is queued behind the call, before any other caller's bytes can reach the connection. After a
    read-only call's ROLLBACK it is in the call's own segment (it starts a transaction of its own there, as
    after a Sync), so the server answers the call and the reset in one reply, and the connection is pooled
    only once its reset is seen to have succeeded. A write's statement runs in the protocol's implicit
    transaction, where DISCARD ALL can't follow it: its reset is a segment of its own, whose reply is read when
    the connection is next taken (it has almost always arrived: no wait of its own), as is a stream's.
    DISCARD ALL ends settings of every kind (client_encoding included), roles and session authorization,
    advisory locks, temporary objects, prepared statements, cursors, LISTENs and sequence state
    (currval/lastval). It keeps the random seed, so every call's first statement seeds random() anew
    (setseed is not transactional): nothing one caller seeded reaches the next.
  - Every Sync is queued without a flush (libpq 17's PQsendPipelineSync), so the whole call is one write.
  - The pipeline is driven by the selected twin of qag._speedups.pgpipe: the compiled one calls libpq itself with
    the interpreter lock held and lets go of it only to wait for the socket (once a call, where psycopg's
    wrappers let go around every send and every PQisBusy: about twenty chances a call for another thread to
    take the lock); the pure one is psycopg's wrappers. Rows come out as psycopg's Transformer loads them
    (`Pipe.rows`: the compiled twin reads integers, booleans and UTF-8 text itself, the same objects).

A page of a query whose window can't be put in its SQL (Call.cursor) is read through a server-side cursor in an
explicit transaction in the same segment (BEGIN; ...; DECLARE qag_page ...; MOVE; FETCH; END), so the driver
never buffers more than the page.

Dead pooled connections, without a round trip (a deliberate departure from contract 10.2's "SELECT 1 after 5 s
idle"): a read-only call takes a pooled connection without looking at it (a reset left pending, a stream's, is
read with the call's reply); if the server had ended it (EOF after a close, a FATAL from pg_terminate_backend),
the idle connections of the same settings are closed and the call, which changed nothing, runs once more on a new
connection. A write's connection is looked at first (anything to read beyond its reset's reply: replaced before
anything is sent), and a write whose connection died unseen is never retried (it may have committed). A
connection whose call raised, was cancelled, or is not idle afterwards is closed, not pooled.

Streams (contract 3.8/10.4): `BEGIN READ ONLY; [limits]; DECLARE qag_stream NO SCROLL CURSOR FOR <sql>; FETCH
FORWARD <n> FROM qag_stream` in one segment, each further batch one FETCH, ended by ROLLBACK and the reset.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from os import urandom
import re
import threading
from time import monotonic, perf_counter
from collections import OrderedDict

import psycopg
from psycopg import pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.string import TextLoader

from .. import _speedups
from .._speedups.pgpipe import Gone as _Gone   # raised by both twins (the compiled one imports it from there)
from .._speedups.pgpipe import error_of, name_of   # how both twins read a failure and a column name
from ..errors import QagError
from ._postgres_schema import SCHEMA_MAX_TABLES, read_functions, read_schema
from .base import (Backend, Call, Result, connection_failed, network_timeout, opening_failed, query_failed,
                   refused_write_of, sent_write_error, timeout_error, write_refused, STALE_WINDOW)
from .pool import Pool, settings_key
from .watchdog import (KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, NETWORK_MARGIN, USER_TIMEOUT_MS,
                       deadline_of)

__all__ = ["PostgresBackend", "read_schema", "SCHEMA_MAX_TABLES"]

log = logging.getLogger("qag")

CONNECT_TIMEOUT = 10
# Passed to the driver as named; `database` becomes `dbname`. Anything else (`schema`, unknown options) is not.
DRIVER_FIELDS = ("host", "port", "user", "password", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl")
STREAM_CURSOR = "qag_stream"
PAGE_CURSOR = "qag_page"
SCHEMA_TTL = 60.0           # a schema older than this is read again before it is served
SCHEMA_REFRESH = 45.0       # ... and one older than this is served while a background thread reads it again
SCHEMA_CACHE_SIZE = 64      # schemas kept per backend (per connection settings and database)

_FATAL = pq.ExecStatus.FATAL_ERROR
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_PARSER_EXHAUSTED = "memory exhausted"     # a syntax error (42601) when the parser's stack runs out: input size
_BEGIN = {True: b"BEGIN READ ONLY", False: b"BEGIN"}
_END = {True: b"ROLLBACK", False: b"COMMIT"}
_DISCARD = b"DISCARD ALL"
# Statements that may leave dblink connections open on the session (dblink_connect, named or not): judged once per
# statement text (saved queries repeat); such a call's connection is closed, not pooled.
_REMOTE_SESSIONS: dict = {}


def _keeps_remote_sessions(sql: str) -> bool:
    found = _REMOTE_SESSIONS.get(sql)
    if found is None:
        found = "dblink" in sql.lower()
        if len(_REMOTE_SESSIONS) >= 1024:
            _REMOTE_SESSIONS.clear()
        _REMOTE_SESSIONS[sql] = found
    return found
_RESET_ITEMS = (_DISCARD, None)   # the reset's own segment (see _Link.send_reset), as Pipe.put items
_SEED_SCALE = 2 ** 52        # a seed of 52 random bits, as setseed's [0, 1)
_AUTO = PyFormat.AUTO        # read once: an Enum member read off its class costs ~850 instructions a read
_UTF8 = b"UTF8"
_MULTIPLE = "cannot insert multiple commands into a prepared statement"
# PostgreSQL's active_sql_transaction messages for a refused exit from a read-only transaction (the first line of
# the text; other 25001 errors, SET TRANSACTION ISOLATION after a query among them, are no such refusal).
_READ_WRITE_REFUSED = ("transaction read-write mode must be set before any query",
                       "cannot set transaction read-write mode")
_REFUSED = "the server refused the statement"      # a failure that came without a message
_LINE_RE = re.compile(r"^LINE (\d+):", re.MULTILINE)
_SEVERITY_RE = re.compile(r"[^\W\d_]+:  ")   # libpq's prefix: the severity word, in the server's language, ":  "
# Settings a call sets for itself when the server's default differs: dates as psycopg reads them, and strings
# read as PostgreSQL's parser in qag (qag/sql/pgread) reads them, so a backslash can't end a string the check
# thought open. The statement is parsed after this setting runs, in the same transaction.
_FORCED = (("DateStyle", b"ISO", lambda v: not v.startswith(b"ISO")),
           ("standard_conforming_strings", b"on", lambda v: v != b"on"))
# Types psycopg 3 would load as objects (UUID, ip_address, ...) that psycopg2 gave as text: loaded as text, so
# responses stay byte-for-byte what they were.
_TEXT_TYPES = ("uuid", "inet", "cidr", "macaddr", "macaddr8", "money")
# Read as PostgreSQL's own text, as psycopg2 (QueryAPIGate's driver) gives them: an anonymous record, `ROW(1, 'a',
# NULL)` → "(1,a,)" (psycopg 3 parses it into a tuple of texts), and multiranges, `{[1,3),[5,7)}` (psycopg 3's
# Multirange prints its ranges with spaces between), with their arrays.
_RECORD_TYPES = ("record", "int4multirange", "int8multirange", "nummultirange", "datemultirange", "tsmultirange",
                 "tstzmultirange")


# ---------------------------------------------------------------- statements (pure)


def _explicit(call: Call, statements: list[str]) -> bool:
    """Whether a call runs in an explicit transaction block. A read-only call does, so that its ROLLBACK ends
    a transaction: in the extended protocol's implicit one the server would answer (and write to its log)
    "WARNING: there is no transaction in progress" on every call. A cursor needs the block to outlive its
    statements."""
    return call.read_only or len(statements) > 1


STATEMENT_TIMEOUT_MAX_MS = 2147483647   # statement_timeout is an int: a larger value is refused by the server


def timeout_ms(timeout: float | None) -> int | None:
    """statement_timeout in whole milliseconds; never 0 for a limit that applies (0 would mean none), and never
    more than the server takes (about 24.8 days: a caller's ?timeout=1e12 runs with that limit, not 400)."""
    if not timeout:
        return None
    ms = timeout * 1000.0
    if not ms < STATEMENT_TIMEOUT_MAX_MS:   # larger, infinite or NaN: the longest limit there is
        return STATEMENT_TIMEOUT_MAX_MS
    return max(1, int(round(ms)))


def search_path(schema: str) -> str:
    """The search_path of a table-restricted or masked call (contract 6.2): unqualified names resolve in the
    schema its tables were checked with. pg_catalog goes first so built-in functions can't be shadowed by
    same-named ones in that schema, and pg_temp last so no temporary table shadows a checked name."""
    if "\x00" in schema:
        raise QagError("table_check_failed", "This API key may only query its allowed tables, and the "
                                             "connection's schema can't be pinned for the check")
    return 'pg_catalog, "' + schema.replace('"', '""') + '", pg_temp'


# The seeds: from the system's generator (os.urandom, ~0.4 µs a call). Not the random module's: its generator
# also makes the request ids every response carries, and a few hundred of them give its state away, so every
# call's seed with it; and two random() values give the seed back (the server's generator steps are
# invertible), so a caller could recover another's values. 52 bits, the most a float8 holds exactly, sent as an
# integer's text and divided as float8 by the server: a float's shortest text (repr) costs the worker ~7k
# instructions a call, and int8 divided as numeric costs the server ~5 µs more (benchmarks/pg_statements.py).
def _random_bits() -> int:
    return int.from_bytes(urandom(7), "big") >> 4


_SETTINGS: dict = {}
_SETTINGS_MAX = 256          # time limits and schemas are a handful of values; bounded all the same


def settings_statement(timeout: float | None, schema: str | None,
                       forced: tuple = (), identity: tuple | None = None) -> tuple[bytes, list]:
    """The first statement of a call, and its values: the transaction's time limit, search_path and `forced`
    settings (session defaults of the server that qag reads differently, see _FORCED), all transaction-local,
    and a new random seed. Built once per distinct set of settings; the seed is new each call. (A read-only
    call's access mode is its BEGIN READ ONLY: this statement, the transaction's first query, fixes it.)

    `identity` (claims JSON, database role or None) adds request.jwt.claims and role, transaction-local like the
    rest (set_config(..., true) is SET LOCAL): the database's row-security policies see the signed-in user, in the
    same round trip, and the Sync's end of the transaction (or DISCARD ALL) takes both away. Both travel as bound
    values, so neither a claim nor a role name is ever read as SQL. (List comprehensions, not generators: in the
    compiled build a generator makes a closure on every call, the common one included.)"""
    if identity is None:     # the common call: its key and values built without a generator
        named_identity = ()
        key = (timeout, schema, forced)
    else:
        named_identity = (("request.jwt.claims", identity[0]),) + (
            (("role", identity[1]),) if identity[1] is not None else ())
        key = (timeout, schema, forced, tuple([name for name, _ in named_identity]))
    built = _SETTINGS.get(key)
    if built is None:
        calls = []
        values: list[bytes] = []
        ms = timeout_ms(timeout)
        named = [("statement_timeout", str(ms).encode())] if ms is not None else []
        if schema is not None:
            named.append(("search_path", search_path(schema).encode()))
        for name, value in (*named, *forced):
            values.append(value)
            calls.append(f"pg_catalog.set_config('{name}', ${len(values)}, true)")
        for offset, (name, _) in enumerate(named_identity, start=len(values) + 1):
            calls.append(f"pg_catalog.set_config('{name}', ${offset}, true)")   # values: per call, below
        calls.append(f"pg_catalog.setseed(${len(values) + len(named_identity) + 1}::float8 / {_SEED_SCALE})")
        if len(_SETTINGS) >= _SETTINGS_MAX:
            _SETTINGS.clear()
        built = _SETTINGS[key] = (("SELECT " + ", ".join(calls)).encode(), tuple(values))
    text, values = built
    seed = b"%d" % _random_bits()
    if identity is None:
        return text, [*values, seed]
    return text, [*values, *[value for _, value in named_identity], seed]


def page_statements(sql: str, skip: int, fetch: int) -> list[str]:
    """A query read a page at a time by a cursor: declared, moved past `skip` rows, `fetch` rows fetched.

    The caller's text starts on a line of its own, so a syntax error's excerpt shows only the caller's line
    (its number is put back by `_own_lines`)."""
    out = [f"DECLARE {PAGE_CURSOR} NO SCROLL CURSOR FOR\n{sql}\n"]
    if skip:
        out.append(f"MOVE FORWARD {int(skip)} IN {PAGE_CURSOR}")
    out.append(f"FETCH FORWARD {int(fetch)} FROM {PAGE_CURSOR}")
    return out


def stream_statements(sql: str, first: int) -> list[str]:
    return [f"DECLARE {STREAM_CURSOR} NO SCROLL CURSOR FOR\n{sql}\n", f"FETCH FORWARD {int(first)} FROM {STREAM_CURSOR}"]


def fetch_statement(n: int) -> bytes:
    return f"FETCH FORWARD {int(n)} FROM {STREAM_CURSOR}".encode()


def connect_args(fields: dict) -> dict:
    """psycopg.connect keyword arguments for a connection's resolved fields (no `schema`, no unknown options).

    client_encoding goes in the startup packet, so the reset (DISCARD ALL) returns to UTF8, the encoding the
    values are decoded and encoded with.
    """
    args = {}
    for name in DRIVER_FIELDS:
        value = fields.get(name)
        if value is not None and value != "":
            args[name] = value if type(value) is str else str(value)
    database = fields.get("database")
    if database is not None and database != "":
        args["dbname"] = str(database)
    args["connect_timeout"] = CONNECT_TIMEOUT
    args["client_encoding"] = "UTF8"
    # A peer that vanished while the connection idles (or serves a call without a time limit) is noticed in
    # about a minute: keepalive probes after 30 s of silence, and unacknowledged data given up after 60 s.
    args.update(keepalives=1, keepalives_idle=KEEPALIVE_IDLE, keepalives_interval=KEEPALIVE_INTERVAL,
                keepalives_count=KEEPALIVE_COUNT, tcp_user_timeout=USER_TIMEOUT_MS)
    return args


def pool_key(fields: dict, read_only: bool):
    """Connections are interchangeable only with the same resolved fields (password included) and access mode."""
    return settings_key(fields), read_only


# ---------------------------------------------------------------- errors


class _ServerError(Exception):
    """A statement the server refused: its SQLSTATE and message."""

    def __init__(self, sqlstate: str, text: str):
        super().__init__(text)
        self.sqlstate = sqlstate
        self.text = text


class _Unreadable(Exception):
    """A value of a result the driver can't read (text that isn't UTF-8 in a SQL_ASCII database, a loader's
    refusal): the database ran the statement; nothing the caller sent was at fault."""


def _read_rows(link, result, start: int, end: int) -> list:
    """Rows `start` to `end` of a result (Pipe.rows, either twin); a value it can't read is _Unreadable."""
    try:
        return link.pipe.rows(result, link.tx, start, end)
    except (psycopg.DataError, ValueError, NotImplementedError, OverflowError) as exc:
        # ValueError: UnicodeDecodeError, and what a loader raises itself
        raise _Unreadable(_driver_text(exc)) from None


def _server_error(result) -> _ServerError:
    state, text = error_of(result.error_field(_SQLSTATE), result.error_message)
    return _ServerError(state, text or _REFUSED)


def _driver_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def _own_lines(text: str, shift: int) -> str:
    """A server message without its severity word (libpq's `ERROR:  `, as QueryAPIGate's driver shows it), and its
    'LINE n:' excerpts numbered as in the caller's statement (qag put `shift` lines first)."""
    severity = _SEVERITY_RE.match(text)
    if severity is not None:
        text = text[severity.end():]
    if not shift:
        return text
    return _LINE_RE.sub(lambda m: f"LINE {max(1, int(m.group(1)) - shift)}:", text)


def _time_up(timeout: float, deadline: float | None) -> bool:
    """Whether a statement cancelled now (SQLSTATE 57014) can have been cancelled by the call's statement_timeout.
    The server starts timing the statement after qag set the call's deadline (deadline_of: the limit plus
    NETWORK_MARGIN), so the limit can't end sooner than `deadline - NETWORK_MARGIN`, give or take the limit's
    rounding to a millisecond and the two clocks' rates. Sooner, someone else cancelled it (pg_cancel_backend, a
    SIGINT): qag itself never sends a cancel. Without a deadline, it is taken for the time limit."""
    return deadline is None or monotonic() >= deadline - NETWORK_MARGIN - 0.001 - timeout * 0.001


def mapped(exc: BaseException, timeout: float | None, shift: int = 0, deadline: float | None = None) -> QagError:
    """The contract's error for a failure on an open connection: cancelled by its time limit 504, cancelled by
    someone else 500 query_failed (as MariaDB's KILL QUERY is answered), unreachable 502, the server's
    refusal of a write 403, a value it refuses 400 value_invalid, a parameter it can't be sent 400 param_invalid, a
    second statement 400, anything else it refuses 500, and a result value the driver can't read (_Unreadable) 500
    query_failed, never blamed on a parameter. The detail is the text as the server (or libpq, for a connection
    lost) wrote it: the server never has the password in clear to quote (SCRAM), so only a statement that holds it
    could show it, and substituting it would tell a caller which of its guesses it is. (Opening a connection is
    another matter: PostgresBackend.connect, opening_detail.)"""
    if isinstance(exc, QagError):
        return exc
    if isinstance(exc, _Gone):
        return network_timeout(timeout) if timeout else connection_failed("The server stopped answering")
    if isinstance(exc, _ServerError):
        state, text = exc.sqlstate, _own_lines(exc.text, shift)
        if state == "57014":                     # query_canceled: the statement time limit, or a cancel
            return timeout_error(timeout) if timeout and _time_up(timeout, deadline) else query_failed(text)
        if state.startswith("08") or state in ("57P01", "57P02", "57P03"):
            return connection_failed(text)
        if state == "25006" or (state == "25001" and text.startswith(_READ_WRITE_REFUSED)):
            # read_only_sql_transaction: the engine refused a write; active_sql_transaction on
            # set_config('transaction_read_only', 'off', ...): a refused attempt to leave the read-only mode.
            return write_refused(text)
        if _MULTIPLE in text:
            return QagError("multiple_statements", "Only a single SQL statement can be executed at a time")
        if state.startswith("22"):               # data_exception: a value the database can't take
            return QagError("value_invalid", "The database refused a value of this call", detail=text)
        if state.startswith("54") or (state == "42601" and text.startswith(_PARSER_EXHAUSTED)):
            # program_limit_exceeded (stack depth, columns, arguments) and the parser's own stack: its size
            return QagError("value_too_large", "The statement exceeds a limit of the database server",
                            detail=text)
        return query_failed(text)
    if isinstance(exc, _Unreadable):
        return QagError("query_failed", "A value of the result can't be read: the statement ran, but its driver "
                                        "can't read what PostgreSQL returned", detail=str(exc))
    if isinstance(exc, (UnicodeError, psycopg.DataError)) or (isinstance(exc, ValueError) and "NUL" in str(exc)):
        # A parameter value PostgreSQL can't hold: a NUL character or a lone surrogate.
        return QagError("param_invalid", "A parameter value can't be sent to PostgreSQL: "
                                         "text may not contain NUL characters or unpaired surrogates")
    if isinstance(exc, (psycopg.Error, OSError)):
        return connection_failed(_driver_text(exc))
    raise exc


# ---------------------------------------------------------------- one connection


class _Link:
    """One server connection in pipeline mode and what qag knows of it."""

    __slots__ = ("conn", "pg", "pipe", "tx", "pending", "bad", "forced", "version")

    def __init__(self, conn: psycopg.Connection, spin: float = 0.0):
        self.conn = conn
        self.pg = conn.pgconn
        self.pipe = _speedups.get("pgpipe").Pipe(self.pg, spin)
        self.tx = Transformer(conn)
        self.pending = False      # a reset was sent and its reply not read yet
        self.bad = False          # something on it failed: never pooled again
        # Session defaults of this server that qag must not run under: each call sets its own for itself.
        self.forced = tuple((name, value) for name, value, differs in _FORCED
                            if differs(self.pg.parameter_status(name.encode()) or b""))
        self.version = self.pg.server_version

    def readable(self) -> bool:
        return self.pipe.readable()

    def close(self) -> None:
        self.conn.close()

    # --- sending --------------------------------------------------------------------------------------------
    def send(self, sql: bytes, values=None, types=None, formats=None) -> None:
        self.pipe.send(sql, values, types, formats)

    def bound(self, sql: str, args: tuple):
        """The caller's statement as a pipeline item (Pipe.put): its text, with its values as psycopg dumps them."""
        if args:
            tx = self.tx
            values = tx.dump_sequence(args, [_AUTO] * len(args))
            return (sql.encode(), values, tx.types, tx.formats)
        return sql.encode()

    def sync(self) -> None:
        self.pipe.sync()

    def send_reset(self) -> None:
        """Queue the reset (its own segment: DISCARD ALL can't run inside a transaction block, and on
        PostgreSQL 17 not after other statements of a pipeline either): read when the connection is taken."""
        self.pipe.send(_DISCARD)
        self.pipe.sync()
        self.pending = True

    def flush(self, deadline: float | None) -> None:
        """Send everything queued (waiting, until the deadline, while the server has not read a large call)."""
        self.pipe.flush(deadline)

    # --- receiving ------------------------------------------------------------------------------------------
    def segment(self, deadline: float | None) -> list:
        """Every result up to the next Sync (errors included, the aborted rest skipped)."""
        return self.pipe.segment(deadline)

    def finish_reset(self, deadline: float | None) -> None:
        """Read the reset's reply by the call's deadline (a failure sets `bad`)."""
        if not self.read_reset(deadline if deadline is not None else monotonic() + CONNECT_TIMEOUT):
            self.bad = True
        self.pending = False

    def read_reset(self, deadline: float | None) -> bool:
        """Read the reset segment's results, the next on the wire; whether it succeeded."""
        return self.pipe.settle(deadline)

    def clean(self) -> bool:
        """Whether the connection can be pooled: nothing failed on it and the call left the encoding UTF8 (the
        values its loaders decode were cached under it). Its transaction ended with the call's own segment."""
        return not self.bad and self.pg.parameter_status(b"client_encoding") == _UTF8


_ADAPTERS: list = []


def _adapters():
    """psycopg's adapters with _TEXT_TYPES and _RECORD_TYPES loaded as text and dates, times and intervals read
    leniently (_datetime_loaders); made once, copied by each connection."""
    if not _ADAPTERS:
        adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)
        for name in _TEXT_TYPES:
            adapters.register_loader(name, TextLoader)
        for name in _RECORD_TYPES:
            info = adapters.types[name]
            adapters.register_loader(info.oid, TextLoader)
            adapters.register_loader(info.array_oid, TextLoader)
        for name, loader in _datetime_loaders():
            adapters.register_loader(name, loader)
        _ADAPTERS.append(_Context(adapters))
    return _ADAPTERS[0]


def _datetime_loaders():
    """date, timestamp, timestamptz, time, timetz and interval loaders for the values PostgreSQL has and Python
    hasn't, where psycopg's own raise DataError and the row can't be read at all:
    - 'infinity' and '-infinity' dates and timestamps: the latest and earliest values Python has (as psycopg2,
      QueryAPIGate's driver, reads them);
    - any other value Python's types can't hold (a date BC or after 9999, the time 24:00:00, an interval over
      timedelta's 999,999,999 days, or in an IntervalStyle psycopg can't parse): PostgreSQL's own text of it,
      so the caller gets the value.
    Python-level loaders (a C one's load can't be overridden): they cost a call per value of these types. The
    interval one reads through psycopg's Python loader, which refuses what its C loader silently wraps (178000000
    years read as 545490560 days)."""
    from psycopg.types import datetime as types
    utc = dt.timezone.utc
    kinds = (("date", types.DateLoader, dt.date.max, dt.date.min),
             ("timestamp", types.TimestampLoader, dt.datetime.max, dt.datetime.min),
             ("timestamptz", types.TimestamptzLoader, dt.datetime.max.replace(tzinfo=utc),
              dt.datetime.min.replace(tzinfo=utc)),
             ("time", types.TimeLoader, None, None),
             ("timetz", types.TimetzLoader, None, None),
             ("interval", types.IntervalLoader, None, None))
    for name, base, latest, earliest in kinds:
        def load(self, data, _base=base, _latest=latest, _earliest=earliest):
            if _latest is not None and data[-8:] == b"infinity":
                return _earliest if data[:1] == b"-" else _latest
            try:
                return _base.load(self, data)
            except (psycopg.DataError, NotImplementedError):   # the latter: an IntervalStyle psycopg can't read
                return bytes(data).decode("utf-8", "replace")
        yield name, type(f"Lenient{base.__name__}", (base,), {"load": load})


class _Context:
    """An adaptation context that only carries adapters (what psycopg.connect copies from)."""

    __slots__ = ("adapters",)

    def __init__(self, adapters):
        self.adapters = adapters

    connection = None


def _first_error(results: list) -> _ServerError | None:
    for result in results:
        if result.status == _FATAL:
            return _server_error(result)
    return None


def _columns(result) -> list[str]:
    return [name_of(result.fname(i)) for i in range(result.nfields)]


def _lost(link: _Link, exc: BaseException) -> bool:
    """Whether a failure means the connection itself is gone (the server ended it), not the statement."""
    if link.pg.status == pq.ConnStatus.BAD:
        return True
    if isinstance(exc, _ResetFailed):
        return True
    return isinstance(exc, _ServerError) and (exc.sqlstate.startswith("08") or exc.sqlstate in ("57P01", "57P02"))


class _ResetFailed(psycopg.OperationalError):
    """The reset ahead of a read-only call failed: the call's results were dropped (it is run again elsewhere)."""


def _preferred(link: _Link) -> bool:
    # A connection whose reset reply has arrived (or, with none pending, a quiet socket: one that turned
    # readable was closed by the server).
    return link.readable() == link.pending


def _close(link: _Link) -> None:
    link.close()


def send_call(link: _Link, call: Call, statements: list[str], reset: bool, deadline,
               inline: bool = False) -> int:
    """The call's pipeline: its settings, its statements (the caller's one bound; a cursor's in an explicit
    transaction), ROLLBACK for a read-only call, Sync; then the reset when the connection will be pooled.
    One write. A write commits at the Sync: an explicit COMMIT would make the server answer in two parts
    (a second wake-up of the caller's thread per write). Returns the place in the segment of the last of
    `statements` (the caller's, or a cursor's FETCH), whose rows the call returns.

    `inline` (a call in an explicit block, `_inline_reset`): the reset goes in the call's own segment, after
    the block has ended, so the server answers the call and its reset in one reply. In a segment of its own
    it is a second reply the server sends and the gateway reads (and acknowledges) for every call."""
    read_only = call.read_only
    explicit = _explicit(call, statements)
    items = [_BEGIN[read_only]] if explicit else []
    items.append(settings_statement(call.timeout, call.schema, link.forced, call.identity))
    items.append(link.bound(statements[0], call.args))
    for sql in statements[1:]:
        items.append(sql.encode())
    if explicit:
        items.append(_END[read_only])
    inline = inline and reset and explicit
    if inline:
        items.append(_DISCARD)
    items.append(None)
    if reset and not inline:
        items += _RESET_ITEMS
    link.pipe.put(items, deadline)      # one method call for the whole pipeline
    if reset and not inline:
        link.pending = True
    return explicit + len(statements)


class PostgresBackend(Backend):
    """psycopg 3 connections in pipeline mode, pooled per worker (created after fork) by fields and access mode."""

    dialect = "postgres"
    style = "numeric"

    def __init__(self, settings):
        self.settings = settings
        self._spin = settings.spin_us / 1e6
        self.pool = Pool.from_settings(settings, close=_close)
        self._schemas: OrderedDict = OrderedDict()      # key → (read at, schema)
        self._refreshing: set = set()
        self._schema_lock = threading.Lock()
        self._generation = 0                            # bumped by close_idle: a refresh in flight is dropped
        self._own_segment: set[int] = set()             # server versions that refused the reset in a call's segment

    # --- connections -------------------------------------------------------------------------------------
    @staticmethod
    def connect(fields: dict, deadline: float | None = None, spin: float = 0.0) -> _Link:
        """A new connection in pipeline mode; any failure to open one is 502 connection_failed (libpq's text
        as base.opening_detail shows it: it may describe the connection's options): a login the server refuses, a
        server that is down, a database that is missing. With a call's deadline, the connect timeout is what is
        left of it (whole seconds, at least 2: libpq's rule). `spin`: the Pipe's lone-wait spin (QAG_SPIN_US, in
        seconds)."""
        args = connect_args(fields)
        if deadline is not None:
            left = deadline - monotonic()
            if left <= 0:
                raise _Gone()
            args["connect_timeout"] = max(2, min(CONNECT_TIMEOUT, math.ceil(left)))
        try:
            conn = psycopg.Connection.connect(autocommit=True, context=_adapters(), **args)
        except Exception as exc:  # OperationalError, or a driver refusal of the options (ProgrammingError)
            raise opening_failed(_driver_text(exc), fields) from None
        try:
            link = _Link(conn, spin)
            link.pg.enter_pipeline_mode()
        except (psycopg.Error, OSError) as exc:
            conn.close()
            raise opening_failed(_driver_text(exc), fields) from None
        return link

    def _take(self, key, fields: dict, defer: bool = False, deadline: float | None = None,
              label: str = "") -> tuple[_Link, bool]:
        """(connection, reused): a pooled one whose reset has been read and that shows no sign of being closed
        (looked at from the one pooled longest: the likeliest to have its reset's reply), or a new one.

        defer (read-only calls): the connection pooled longest is taken without a look at its socket (its reset
        has had the most time to be answered: the most recent one's is often still running on a busy server, a
        second wait for the call), and that reply is read just before the call's, in the same wait (`_attempt`):
        the server runs the reset before the call's statements either way (one connection, in order), and a call
        makes one wait and no look at the socket. A connection the server closed meanwhile fails that read, and
        the call, which changed nothing, runs again on a new connection (`_exchange`)."""
        while True:
            link, reused = self.pool.acquire(key, self.connect, None if defer else _preferred, 0, deadline, label,
                                             True, (fields, deadline, self._spin))
            if not reused or defer:
                return link, reused
            try:
                if link.pending:
                    link.finish_reset(deadline)
                if not link.bad and not link.readable():
                    return link, True
            except (psycopg.Error, OSError, _Gone):
                pass
            # Dead, or its reset failed: close it and take another.
            self.pool.release(key, link, False)

    def _give_back(self, key, link: _Link, sql: str = "") -> None:
        """Pool a clean connection (its reset queued: read when it is next taken, by then it has arrived) or
        close it: also after a statement that may have opened dblink connections, which DISCARD ALL leaves
        open (a later caller would use them, with their credentials and their remote session)."""
        self.pool.release(key, link, link.clean() and not _keeps_remote_sessions(sql))

    def _fail(self, key, link: _Link, exc: BaseException, call: Call, shift: int = 0,
              deadline: float | None = None) -> QagError:
        """The error for a call that failed once its pipeline was being sent; its connection is closed, never
        pooled again. A write's lost reply or connection is an unknown outcome (sent_write_error): it commits at
        the Sync, which the server may have reached. `deadline`: the one the statement was sent with (mapped)."""
        link.bad = True
        self.pool.release(key, link, False)
        if isinstance(exc, _Gone):
            # No answer by the deadline: the idle connections of the same settings share the path that stopped
            # answering; a dead one would hold its next call until that call's deadline.
            self.pool.close_idle(key)
        error = refused_write_of(mapped(exc, call.timeout, shift, deadline), call.read_only)
        return sent_write_error(error) if call.writes else error

    # --- calls ---------------------------------------------------------------------------------------------
    def _inline_reset(self, link: _Link, call: Call, statements: list[str], reset: bool) -> bool:
        """Whether the reset goes in the call's own segment (`send_call`): a call in an explicit block, on a
        server that has not refused it there. DISCARD ALL can't run inside a transaction block, nor (PostgreSQL 17)
        after a statement of the same implicit transaction; after the block's ROLLBACK or COMMIT it starts a
        transaction of its own, as it would after a Sync."""
        return reset and _explicit(call, statements) and link.version not in self._own_segment

    def _reset_refused(self, link: _Link, error: tuple) -> None:
        """The server refused the reset in the call's segment, after the call had run: the connection is closed
        (never pooled unreset), and this server version's calls reset in a segment of their own from now on."""
        link.bad = True
        if link.version not in self._own_segment:
            self._own_segment.add(link.version)
            log.warning("postgres: the server (version %s) refused DISCARD ALL after a call's transaction in the "
                        "same pipeline segment (SQLSTATE %s); its connections are reset in a segment of their own",
                        link.version, error[0])

    def _exchange(self, key, fields: dict, call: Call, statements: list[str]) -> tuple[_Link, tuple]:
        """(connection, the call's rows result and its column names) after the call ran and ended; retries a read
        once on a fresh connection when a reused one turns out to be dead. Raises the mapped error (connection
        closed)."""
        reset = self.pool.idle_limit > 0
        # Only a read-only call runs behind an unread reset: if the reset failed, its results are dropped and it
        # runs again on a fresh connection (it changed nothing); a write waits for the reset's reply first.
        deadline = deadline_of(call.timeout)
        try:
            link, reused = self._take(key, fields, call.read_only, deadline, call.connection)
        except _Gone:
            raise network_timeout(call.timeout) from None
        shift = 1 if statements[0].startswith("DECLARE") else 0
        try:
            sent = monotonic()
            try:
                return link, self._attempt(link, call, statements, reset, deadline)
            except (psycopg.OperationalError, OSError, _ServerError) as exc:
                if not (reused and call.read_only and _lost(link, exc)
                        and (isinstance(exc, _ResetFailed) or monotonic() - sent < STALE_WINDOW)):
                    raise
            link.bad = True
            self.pool.release(key, link, False)
            # The server ended a connection it had pooled: whatever ended it (a restart, a failover, an
            # administrator's pg_terminate_backend) has likely ended the idle ones of the same settings too, and
            # a look at their sockets can come before the end has arrived (the FATAL read, the close not yet).
            # So they are closed, and the one retry runs on a new connection.
            self.pool.close_idle(key)
            try:
                link, reused = self._take(key, fields, False, deadline, call.connection)
            except _Gone:
                raise network_timeout(call.timeout) from None
            return link, self._attempt(link, call, statements, reset, deadline)
        except QagError:
            raise
        except BaseException as exc:
            raise self._fail(key, link, exc, call, shift, deadline) from None

    def _attempt(self, link: _Link, call: Call, statements: list[str], reset: bool, deadline) -> tuple:
        """(the call's rows result or None, its column names) from the call's segment (raises the first error).
        A reset left pending by `_take` is on the wire first: its results are read first, and if it failed the
        call's are dropped."""
        deferred = link.pending
        link.pending = False        # read below, ahead of the call's reply; set again for a reset queued after it
        inline = self._inline_reset(link, call, statements, reset)
        want = send_call(link, call, statements, reset, deadline, inline)
        reset_ok = link.read_reset(deadline) if deferred else True
        result, names, error = link.pipe.outcome(deadline, want)
        if not reset_ok:
            link.bad = True
            raise _ResetFailed("the connection's reset failed")
        if error is not None:
            # A failure after the call's rows came (a failure aborts the rest of a segment) is the inline reset's:
            # the call ran and ended; only its connection can't be pooled.
            if not (inline and result is not None):
                raise _ServerError(error[0], error[1] or _REFUSED)
            self._reset_refused(link, error)
        return result, names

    def run(self, fields: dict, call: Call) -> Result:
        key = pool_key(fields, call.read_only)
        started = perf_counter()
        statements = (page_statements(call.sql, call.skip, call.fetch) if call.cursor else [call.sql])
        link, (result, columns) = self._exchange(key, fields, call, statements)
        body, count = None, 0
        try:
            if result is None:
                columns, rows = [], []
            else:
                skip = 0 if call.cursor else call.skip
                end = min(result.ntuples, skip + call.fetch)
                # The page's JSON straight from libpq's values when the compiled pipe can write it (no rows made).
                if call.json_rows and end > skip:
                    body = link.pipe.json(result, link.tx, skip, min(end, skip + call.json_rows), columns)
                if body is None:
                    rows = _read_rows(link, result, skip, end) if end > skip else []
                else:
                    rows, count = None, end - skip
        except BaseException as exc:
            raise self._fail(key, link, exc, call) from None
        self._give_back(key, link, call.sql)
        return Result(columns, rows, (perf_counter() - started) * 1000.0, body, count)

    def stream(self, fields: dict, call: Call, batch: int, cap: int | None):
        key = pool_key(fields, True)
        read = Call(call.sql, call.args, True, call.timeout, 0, schema=call.schema, tables=call.tables,
                    identity=call.identity)
        batch = max(1, int(batch))
        first_n = batch if cap is None else max(0, min(batch, cap))
        deadline = deadline_of(call.timeout)
        try:
            link, reused = self._take(key, fields, False, deadline, call.connection)
        except _Gone:
            raise network_timeout(call.timeout) from None
        try:
            declare, fetch = stream_statements(call.sql, first_n)
            # A cursor outlives a Sync only in an explicit transaction.
            setting = settings_statement(read.timeout, read.schema, link.forced, read.identity)
            link.pipe.put([_BEGIN[True], setting, link.bound(declare, call.args), fetch.encode(), None], deadline)
            results = link.segment(deadline)
            error = _first_error(results)
            if error is not None:
                raise error
            result = results[-1]
            columns = _columns(result)
            first = _read_rows(link, result, 0, result.ntuples)
        except BaseException as exc:
            raise self._fail(key, link, exc, read, 1, deadline) from None
        return columns, _Batches(self, key, link, first, first_n, batch, cap, read)

    def test(self, fields: dict) -> float:
        """A new connection (not pooled: it proves the settings work now) and SELECT 1 read-only."""
        started = perf_counter()
        link = self.connect(fields)
        call = Call("SELECT 1", (), True, self.settings.query_timeout or 10.0, 1)
        try:
            deadline = deadline_of(call.timeout)
            send_call(link, call, ["SELECT 1"], False, deadline)
            error = _first_error(link.segment(deadline))
            if error is not None:
                raise error
        except BaseException as exc:
            raise mapped(exc, call.timeout, 0, deadline) from None
        finally:
            link.close()
        return (perf_counter() - started) * 1000.0

    def query_all(self, fields: dict, sql: str, args: tuple = ()) -> Result:
        """Every row of a read-only catalog query ($n parameters only), on the read-only pool."""
        return self.run(fields, Call(sql, args, True, self.settings.query_timeout or None, 1 << 62))

    def databases(self, fields: dict) -> list[str]:
        result = self.query_all(fields, "SELECT datname FROM pg_catalog.pg_database WHERE NOT datistemplate "
                                        "ORDER BY datname")
        return [row[0] for row in result.rows]

    # --- schema --------------------------------------------------------------------------------------------
    def schema(self, fields: dict, database: str | None = None) -> dict:
        """Tables, views and their columns from the catalog; cached per settings and database (treat as
        read-only), served stale for up to SCHEMA_TTL while a background thread reads it again."""
        if database is not None:
            fields = dict(fields, database=database)
        return self._cached(pool_key(fields, True), lambda: read_schema(self, fields))

    def fresh_schema(self, fields: dict, database: str | None = None) -> dict:
        """schema(), read now (see Backend.fresh_schema)."""
        return read_schema(self, dict(fields, database=database) if database is not None else fields)

    def functions(self, fields: dict, schema: str):
        """The function names a restricted or masked call's pinned search_path (pg_catalog, "<schema>",
        pg_temp) can resolve to, and the database's types that are no relation's row type (sql.functions.Catalog),
        kept with the schemas: read once per connection settings and schema, refreshed in the background like them."""
        return self._cached(("functions", schema, pool_key(fields, True)),
                            lambda: read_functions(self, fields, schema))

    def _cached(self, key, load):
        now = monotonic()
        with self._schema_lock:
            entry = self._schemas.get(key)
            generation = self._generation
            if entry is not None:
                age = now - entry[0]
                if age < SCHEMA_TTL:
                    if age >= SCHEMA_REFRESH and key not in self._refreshing:
                        self._refreshing.add(key)
                        threading.Thread(target=self._refresh, args=(key, load, generation), daemon=True,
                                         name="qag-pg-schema").start()
                    return entry[1]
        value = load()
        self._remember(key, value, now, generation)
        return value

    def _refresh(self, key, load, generation: int) -> None:
        try:
            started = monotonic()
            value = load()
            self._remember(key, value, started, generation)
        except Exception:  # the stale entry stays until it expires; the next reader then sees the error
            pass
        finally:
            with self._schema_lock:
                self._refreshing.discard(key)

    def _remember(self, key, schema: dict, read_at: float, generation: int) -> None:
        with self._schema_lock:
            if generation != self._generation:
                return
            self._schemas[key] = (read_at, schema)
            self._schemas.move_to_end(key)
            while len(self._schemas) > SCHEMA_CACHE_SIZE:
                self._schemas.popitem(last=False)

    def close_idle(self) -> None:
        self.pool.close_idle()
        with self._schema_lock:
            self._generation += 1
            self._schemas.clear()


class _Batches:
    """The row batches of a stream after the first; the connection goes back to the pool when they end.

    A failure mid-stream closes the connection and raises the mapped error: the status line has gone out, so
    the body ends incomplete and the run is recorded as failed.
    Closed early (the client went away) → ROLLBACK, the reset, and the connection is reused; dropped without ever
    being iterated or closed → the connection is closed when this object is collected.
    """

    def __init__(self, backend: PostgresBackend, key, link: _Link, first: list, first_n: int, batch: int,
                 cap: int | None, call: Call):
        self._backend, self._key, self._link, self._call = backend, key, link, call
        self._first = first
        self._batch = batch
        self._left = None if cap is None else cap - len(first)
        self._more = len(first) == first_n
        self._done = False

    def __iter__(self):
        return self

    def _deadline(self) -> float | None:
        timeout = self._call.timeout
        return deadline_of(timeout)

    def __next__(self) -> list:
        if self._done:
            raise StopIteration
        first = self._first
        if first:
            self._first = None
            return first
        left = self._left
        if self._more and (left is None or left > 0):
            n = self._batch if left is None else min(self._batch, left)
            link = self._link
            try:
                deadline = self._deadline()
                link.send(fetch_statement(n))
                link.sync()
                link.flush(deadline)
                results = link.segment(deadline)
                error = _first_error(results)
                if error is not None:
                    raise error
                rows = _read_rows(link, results[-1], 0, results[-1].ntuples)
            except BaseException as exc:
                # Raised, not swallowed: the run is recorded as failed and the server ends the chunked body
                # without its terminator, so the client can tell the export is incomplete.
                self._done = True
                raise self._backend._fail(self._key, link, exc, self._call, 0, deadline) from None
            if left is not None:
                self._left = left - len(rows)
            self._more = len(rows) == n
            if rows:
                return rows
        self.close()
        raise StopIteration

    def close(self) -> None:
        """End the transaction (ROLLBACK), queue the reset and give the connection back; closed if that fails."""
        if self._done:
            return
        self._done = True
        link = self._link
        backend = self._backend
        try:
            deadline = self._deadline()
            link.send(_END[True])
            link.sync()
            if backend.pool.idle_limit > 0:
                link.send_reset()
            link.flush(deadline)
            if _first_error(link.segment(deadline)) is not None:
                link.bad = True
        except BaseException:
            link.bad = True
        if link.bad:
            backend.pool.release(self._key, link, False)
        else:
            backend._give_back(self._key, link, self._call.sql)

    def __del__(self):
        # Never iterated nor closed. The pool's lock is taken on another thread: a collection may run this
        # while the current thread holds it.
        if not self._done:
            self._done = True
            try:
                threading.Thread(target=self._backend.pool.release, args=(self._key, self._link, False),
                                 daemon=True).start()
            except RuntimeError:  # interpreter shutting down
                pass
