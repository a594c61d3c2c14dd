"""MySQL 8 and MariaDB connections on mysqlclient: pooled per worker, one round trip to the server per call.

What one call costs on the wire, and why it is safe:

* Read-only connections are opened with `SET SESSION TRANSACTION READ ONLY`, and each read-only call runs as a
  read-only transaction:
  - MariaDB: the statement carries its access mode (`SET STATEMENT tx_read_only = 1 FOR ...`, beside its time
    limit) and commits on its own (autocommit): one statement, one round trip, nothing to end afterwards. SET
    STATEMENT restores the mode when the statement ends, so a stored function that runs `SET SESSION
    TRANSACTION READ WRITE` changes nothing for later calls.
  - MySQL (no SET STATEMENT): the call runs inside a read-only transaction already open on the pooled
    connection (`START TRANSACTION READ ONLY` when it is opened). When the call ends, `ROLLBACK AND CHAIN` is
    *sent* (`send_query`), which ends the transaction - releasing its snapshot and metadata locks - and starts
    the next one with the same read-only access mode, also when a stored function changed the session's; its
    reply is read (`read_query_result`) when the connection is next taken. The pool prefers an idle connection
    whose reply has already arrived (a zero-timeout poll on its socket) and, while fewer than QAG_POOL_SIZE are
    open, opens another rather than wait for one that hasn't; so a caller calling back to back waits for its
    own statement only.
* The time limit rides on the statement (see _mysql_sql): MariaDB `SET STATEMENT max_statement_time = s FOR`,
  MySQL the MAX_EXECUTION_TIME hint, so nothing a query sets for its session outlives it.
* Read-write calls use autocommit connections: the statement commits in its own round trip.
* A call never waits on the network past its time limit + watchdog.NETWORK_MARGIN: the pool wait and the connect
  timeout are cut to what is left of it, and the watchdog shuts the socket of a call still blocked at its
  deadline (a black-holed path: the server's own limit can't help when its answer never arrives), answers 504,
  drops the idle connections of the same settings (same path) and sends KILL QUERY from a fresh connection.
* A connection that raised is closed, never reused. An idle connection whose socket turns readable without a
  pending reply has been closed by the server (restart, KILL, wait_timeout) and is discarded when taken: no
  ping, no extra round trip.

mysqlclient releases the interpreter lock while it waits on the network; nothing here adds a lock, a ping or a
log line to the per-call path (the pool's own lock guards list operations only).
"""

from __future__ import annotations

import copy
import math
from os import urandom
import re
import select
from time import monotonic, perf_counter
import weakref

import MySQLdb
import MySQLdb.converters
import MySQLdb.cursors
from MySQLdb.constants import FIELD_TYPE

from .. import _speedups
from ..errors import QagError
from ..sql.names import mysql_lower
from . import _mysql_schema as schema_reader
from . import _mysql_sql as statements
from .base import (Backend, Call, Result, connection_failed, network_timeout, opening_failed, other_text_reading,
                   query_failed, sent_write_error, timeout_error, write_refused, database_read_only, STALE_WINDOW)
from .pool import Pool, settings_key
from .watchdog import WATCHDOG, deadline_of, tcp_keepalive

CONNECT_TIMEOUT = 10

_RENEW = b"ROLLBACK AND CHAIN"
_TIMEOUT_CODES = frozenset((3024, 1969))   # MySQL ER_QUERY_TIMEOUT, MariaDB ER_STATEMENT_TIMEOUT
# Can't reach / lost the server: CR_CONNECTION_ERROR, CR_CONN_HOST_ERROR, CR_UNKNOWN_HOST, CR_SERVER_GONE_ERROR,
# CR_SERVER_LOST, CR_SSL_CONNECTION_ERROR, CR_SERVER_LOST_EXTENDED.
_UNREACHABLE_CODES = frozenset((2002, 2003, 2005, 2006, 2013, 2026, 2055))
_UNREACHABLE_TEXT = ("could not connect", "connection refused", "timeout expired", "unknown mysql server host",
                     "lost connection to mysql server", "server closed the connection unexpectedly",
                     "server has gone away")
# The database refused a value for its column or function type, or text it can't store: the caller's 400
# (value_invalid, as on every dialect), never a 500. ER_WARN_DATA_OUT_OF_RANGE, WARN_DATA_TRUNCATED, ER_TRUNCATED_WRONG_VALUE,
# ER_INVALID_CHARACTER_STRING, ER_TRUNCATED_WRONG_VALUE_FOR_FIELD, ER_ILLEGAL_VALUE_FOR_TYPE, ER_DATA_TOO_LONG,
# ER_WRONG_VALUE_FOR_TYPE, ER_CANT_CREATE_GEOMETRY_OBJECT, ER_DATA_OUT_OF_RANGE, ER_BAD_DATA (MariaDB),
# ER_BAD_NULL_ERROR, ER_INVALID_JSON_TEXT (MySQL), ER_INVALID_JSON_TEXT_IN_PARAM, CONSTRAINT ... failed (MariaDB).
_VALUE_CODES = frozenset((1264, 1265, 1292, 1300, 1366, 1367, 1406, 1411, 1416, 1690, 1918, 1048, 3140, 3141, 4025))
# ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION: a stored function that writes, called in a read-only call.
_READ_ONLY_TRANSACTION = 1792
# ER_STACK_OVERRUN_NEED_MORE: an expression nested deeper than the server's thread stack holds, and
# ER_TOO_HIGH_LEVEL_OF_NESTING_FOR_SELECT: subqueries nested past the server's limit (the statement's size, as
# SQLite's expression depth limit is: 400 value_too_large); also the parser's own "memory exhausted" (1064).
_TOO_DEEP = frozenset((1436, 1473))
_PARSER_EXHAUSTED = "memory exhausted"
# ER_OPTION_PREVENTS_STATEMENT ('running with the --read-only option', also --super-read-only, and other options
# such as --secure-file-priv: told apart by the text) and MySQL's ER_READ_ONLY_MODE: the server takes no writes.
_OPTION_REFUSED = frozenset((1290, 1836))
# No "(see detail)": a masked caller, and every caller under the error-detail rule, gets no detail.
_VALUE_MESSAGE = "The database refused a value for its type"
_ENCODING_MESSAGE = "The statement or a parameter holds text that is not valid Unicode (a lone surrogate)"
# What qag itself puts into a MySQL statement (the time-limit hint), taken out of an error's detail.
_OWN_HINT = re.compile(r" ?/\*\+ MAX_EXECUTION_TIME\(\d+\) \*/|MAX_EXECUTION_TIME\(\d+\) ")
# Read-write statements after which the connection can go back to the pool (anything else - SET, CALL, BEGIN,
# ... - may leave session state or an open transaction behind, so its connection is closed instead).
_REUSABLE_AFTER_WRITE = frozenset(("select", "insert", "update", "delete", "replace", "with", "values", "table", "do"))
_TRUE_TEXT = ("1", "true", "yes", "on")


# ------------------------------------------------------------------------------------------- connect arguments


def _flag(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in _TRUE_TEXT
    return bool(value)


def _port(value) -> int:
    if value is None or value == "":
        return 3306
    if isinstance(value, bool):
        value = None
    try:
        port = int(str(value).strip()) if value is not None else 0
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise QagError("connection_misconfigured", "The connection's port must be a whole number from 1 to 65535")
    return port


def connect_args(fields: dict, read_only: bool, timeout: float = CONNECT_TIMEOUT) -> dict:
    """mysqlclient's connect() arguments for a connection's fields (contract 10.3's driver fields only).

    TLS: ssl_ca/ssl_cert/ssl_key go in `ssl`; any of them requires TLS; ssl_verify_cert → VERIFY_CA,
    ssl_verify_identity → VERIFY_IDENTITY; ssl_disabled turns TLS off. Never the multi-statements flag, never
    LOCAL INFILE; utf8mb4; a connect timeout of `timeout` seconds, at most 10 (whole seconds: the driver's unit,
    rounded up). It also bounds the wait for the server's greeting.
    """
    args = {"host": str(fields.get("host") or "127.0.0.1"), "port": _port(fields.get("port")),
            "user": str(fields.get("user") or ""), "password": str(fields.get("password") or ""),
            "database": str(fields.get("database") or ""), "connect_timeout": max(1, math.ceil(min(timeout, CONNECT_TIMEOUT))),
            "charset": "utf8mb4", "multi_statements": False, "local_infile": 0,
            # Read-only connections live in explicit transactions; read-write ones commit each statement.
            "autocommit": None if read_only else True}
    ssl = {name: str(fields[f"ssl_{name}"]) for name in ("ca", "cert", "key") if fields.get(f"ssl_{name}")}
    mode = None
    if _flag(fields.get("ssl_disabled")):
        mode, ssl = "DISABLED", {}
    elif _flag(fields.get("ssl_verify_identity")):
        mode = "VERIFY_IDENTITY"
    elif _flag(fields.get("ssl_verify_cert")):
        mode = "VERIFY_CA"
    elif ssl:
        mode = "REQUIRED"
    if ssl:
        args["ssl"] = ssl
    if mode:
        args["ssl_mode"] = mode
    if fields.get("auth_plugin"):
        args["auth_plugin"] = str(fields["auth_plugin"])
    return args


def _bit(value: bytes) -> int:
    """A BIT column's value (its bytes, most significant first) as the integer QueryAPIGate 0.43 gives: mysqlclient
    has no converter for BIT, and its bytes would become text ("\\u0001" for b'1')."""
    return int.from_bytes(value, "big")


def conversions() -> dict:
    """mysqlclient's value conversions, with DATETIME, TIMESTAMP and DATE text read by the selected mysqltime
    twin: the values of mysqlclient's own parsers, without their Python cost per value; BIT values as integers.
    Both myresult twins convert by this map (the compiled one calls a BIT converter with the value's bytes, as
    mysqlclient does)."""
    times = _speedups.get("mysqltime")
    return {**MySQLdb.converters.conversions, FIELD_TYPE.DATETIME: times.datetime_or_none,
            FIELD_TYPE.TIMESTAMP: times.datetime_or_none, FIELD_TYPE.DATE: times.date_or_none, FIELD_TYPE.BIT: _bit}


_ident = settings_key   # the pool's identity of a connection's settings (password included)


# ------------------------------------------------------------------------------------------- errors


def _detail(exc: BaseException) -> str:
    """The driver's text as the server (or the client library) wrote it: a server's error about a statement never
    holds the password unless the caller wrote it there (caching_sha2/ed25519 servers never have it in clear), and
    substituting it would tell a caller which of its guesses it is. Only a failure to open a connection is
    cleaned (MysqlBackend._open, base.opening_detail)."""
    args = getattr(exc, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return f"{args[0]} ({args[1]})" if args[0] else str(args[1])
    return str(exc)


def _own_text_removed(detail: str, sent: str | None, own: str | None) -> str:
    """The detail without what qag added to the caller's statement (MariaDB's SET STATEMENT ... FOR prefix,
    MySQL's time-limit hint), so an error shows the caller's statement only."""
    if sent and own is not None and sent != own:
        if sent.endswith(own) and len(sent) > len(own):
            detail = detail.replace(sent, own).replace(sent[:len(sent) - len(own)], "")
        detail = _OWN_HINT.sub("", detail)
    return detail


def mapped(exc: BaseException, timeout: float | None, sent: str | None = None, own: str | None = None) -> QagError:
    """The contract's error for a driver failure: timeout 504, unreachable 502, a value the database refuses
    for its type 400 value_invalid, text that can't be encoded 400 param_invalid, anything else 500. `sent`/`own`: the
    statement as sent and as the caller wrote it (qag's additions are taken out of the detail)."""
    if isinstance(exc, UnicodeError):
        return QagError("param_invalid", _ENCODING_MESSAGE)
    args = getattr(exc, "args", ())
    code = args[0] if args and isinstance(args[0], int) else None
    if code in _TIMEOUT_CODES:
        if timeout:
            return timeout_error(timeout)
        return QagError("query_timeout", "The query exceeded the database server's own time limit and was cancelled")
    detail = _own_text_removed(_detail(exc), sent, own)
    if code in _VALUE_CODES:
        return QagError("value_invalid", _VALUE_MESSAGE, detail=detail)
    if code in _TOO_DEEP or (code == 1064 and detail.startswith(_PARSER_EXHAUSTED, len("1064 ("))):
        return QagError("value_too_large", "The statement is nested deeper than the database server can evaluate",
                        detail=detail)
    if code == _READ_ONLY_TRANSACTION:
        return write_refused(detail)        # the call's own access mode (a read-only call, or SET STATEMENT's)
    if code in _OPTION_REFUSED and ("read-only" in detail.lower() or "read_only" in detail.lower()):
        return database_read_only(detail)   # the server's: it takes no writes now
    lowered = detail.lower()
    if (code in _UNREACHABLE_CODES or isinstance(exc, (MySQLdb.InterfaceError, OSError))
            or any(text in lowered for text in _UNREACHABLE_TEXT)):
        return connection_failed(detail)
    return query_failed(detail)


_DRIVER_ERRORS = (MySQLdb.Error, OSError, TypeError, ValueError)


# ------------------------------------------------------------------------------------------- connections


class _Cursor(MySQLdb.cursors.BaseCursor):
    """A buffered cursor (the whole reply is read in the one round trip) that converts only the rows asked for."""

    def _get_result(self):
        return self._get_db().store_result()

    def page(self, skip: int, count: int) -> list:
        """`count` rows after `skip` (count 0: all); skipped rows are never converted to Python values."""
        result = self._result
        if result is None:
            return []
        if skip:
            result.data_seek(skip)
        return list(result.fetch_row(count, 0))

    def finish(self) -> None:
        """Free the result and read any further result sets (a CALL's), so the connection is ready again."""
        self._discard()


_ENCODED: dict = {}   # statement sent -> its UTF-8 (a saved query's text is the same str call after call)
_ENCODED_MAX = 1024


def _execute(link, sql: str, args, skip: int, count: int, deadline: float | None,
             json_rows: int = 0) -> tuple[list, list | None, bytes | None, int]:
    """Run one statement on the link's connection and read its page: (column names, `count` rows after `skip`
    (count 0: all), None, rows fetched), by the link's reader (the myresult twins: mysqlclient's values without its
    cursor's per-call Python, and in the compiled twin without its description tuples); skipped rows are never
    converted. With `json_rows`, the compiled reader may write the first `json_rows` rows' JSON itself from the
    reply's text: then (column names, None, that JSON, rows fetched) (Call.json_rows, Result.json).
    Arguments are bound as mysqlclient's cursor binds them (integers written directly, the rest by its
    literal())."""
    conn = link.conn
    query = _ENCODED.get(sql)
    if query is None:
        query = sql.encode("utf8")
        if len(sql) <= statements.KEPT_TEXT_MAX:
            if len(_ENCODED) >= _ENCODED_MAX:
                _ENCODED.clear()
            _ENCODED[sql] = query
    if args:
        literal = conn.literal
        query = query % tuple([b"%d" % a if type(a) is int else literal(a) for a in args])
    link.reader.query(query, deadline)
    if json_rows:
        return link.reader.read_page(skip, count, json_rows)
    columns, rows = link.reader.read(skip, count)
    return columns, rows, None, len(rows)


class _Link:
    """One pooled server connection and what qag knows about its state."""

    __slots__ = ("conn", "fd", "thread_id", "cursor", "reader", "poll", "pending", "arrived", "mariadb", "with_hint",
                 "session_ms", "renews", "read_only_variable", "names", "reused")

    def __init__(self, conn, mariadb: bool, with_hint: bool, renews: bool, read_only_variable: str | None,
                 names: schema_reader.ServerNames | None = None, spin: float = 0.0):
        self.conn = conn
        self.fd = conn.fileno()
        self.thread_id = conn.thread_id()   # the server's id of this session, for KILL QUERY
        self.cursor = _Cursor(conn)
        self.reader = _speedups.get("myresult").Reader(conn, spin)   # sends a call's statement, reads its reply
        self.poll = select.poll()
        self.poll.register(self.fd, select.POLLIN)
        self.pending = False        # a ROLLBACK AND CHAIN was sent and its reply not read yet
        self.arrived = False        # its socket was readable when the pool last looked (_preferred)
        self.mariadb = mariadb
        self.with_hint = with_hint  # MySQL: the hint works on a WITH statement's top-level SELECT
        self.session_ms = 0         # MySQL: the session max_execution_time qag last set
        self.renews = renews        # MySQL read-only: a transaction to renew with ROLLBACK AND CHAIN after each call
        self.read_only_variable = read_only_variable  # MariaDB read-only: the access mode each statement sets
        self.names = names          # lower_case_table_names and sql_mode, read when the connection was opened
        self.reused = False         # taken from the pool for this call (not opened for it)

    def readable(self) -> bool:
        return bool(self.poll.poll(0))


def _text_read_by_default(link: _Link) -> bool:
    # The session's own sql_mode, read when it was opened (a session can't change it: SET is a write, and a
    # connection that ran one is never pooled).
    return link.names is not None and link.names.text_read_by_default


def _hint_works_in_with(cursor) -> bool:
    """MySQL: whether the server obeys MAX_EXECUTION_TIME on a WITH statement's top-level SELECT (it warns when
    it ignores a hint); a server without WITH at all refuses the probe."""
    try:
        cursor.execute(statements.WITH_HINT_PROBE)
        cursor.fetchall()
    except MySQLdb.ProgrammingError:
        return False
    return cursor.connection.warning_count() == 0


def _preferred(link: _Link) -> bool:
    # A pending reply that has arrived (or, with none pending, a quiet socket: one that turned readable was
    # closed by the server).
    link.arrived = link.readable()
    return link.arrived == link.pending


_SESSION_STATE: dict[str, int] = {}   # statement text -> _session_use (saved queries repeat)
_SESSION_STATE_MAX = 1024
_LEAVES = 1      # may leave session state behind: the connection is closed after the call, never pooled
_READS = 2       # may read what earlier statements left on a session: runs on a connection opened for it
_RANDOM = 4      # calls RAND(): seeded for this statement alone (_prepare)
# RAND() draws from the session's generator, whose next values two of its outputs give away (and whose earlier
# ones they give back): a word of its own, so `brand` or `operand` is not a call. A call hidden in a view or a
# stored function isn't seen (docs/security.md, MySQL limits).
_RAND_CALL = re.compile(r"(?<![\w$])rand(?![\w$])")
# Text of statements that leave or read session state a ROLLBACK (or SET STATEMENT) keeps: user variables and
# @@session settings (also those a stored function set: reading @x needs "@"), named locks and LOCK TABLES,
# temporary tables, LAST_INSERT_ID, sequences (NEXTVAL, LASTVAL, PREVIOUS VALUE FOR), prepared statements,
# handlers, FOUND_ROWS()/SQL_CALC_FOUND_ROWS, ROW_COUNT(), @@warning_count / @@error_count / @@identity /
# @@insert_id, GET DIAGNOSTICS, information_schema.SESSION_STATUS, SHOW [SESSION] VARIABLES and SESSION_VARIABLES
# (they list last_insert_id, identity, warning_count); information_schema.OPTIMIZER_TRACE (the session's last
# statements with their values, once a stored function or trigger turned tracing on); EXECUTE [IMMEDIATE] (SQL
# built at run time, whose words no text shows); and for SHOW: SHOW WARNINGS / ERRORS / [SESSION] STATUS /
# PROFILE(S). The text is folded as the server folds information_schema's names (SESSİON_VARİABLES is one).
_SESSION_TEXT = ("@", "lock", "temporary", "last_insert_id", "nextval", "setval", "lastval",
                 "previous", "prepare", "handler", "found_rows", "row_count", "warning_count", "error_count",
                 "diagnostics", "identity", "insert_id", "session_status", "variables", "optimizer_trace",
                 "execute")
_SESSION_TEXT_AFTER_SHOW = ("warnings", "errors", "status", "profile")
# NEXT VALUE FOR: two words, which the server reads with any space or comment between them (`next  value`,
# `next/**/value`): looked for with those taken out (a false alarm, `SELECT next value`, only costs a connection).
_BETWEEN_WORDS = re.compile(r"\s+|/\*.*?\*/|--[^\n]*|#[^\n]*", re.S)


def _session_use(sql: str) -> int:
    """How a statement may use session state: _LEAVES | _READS, or 0, and _RANDOM for a call of RAND(). Judged on
    the text once per statement, erring towards a connection of its own: such a statement runs on a connection
    opened for it and closed after it, so it neither sees what an earlier caller left on a pooled session nor
    leaves anything for a later one (it costs what closing its connection cost before: one connect for the next
    call)."""
    use = _SESSION_STATE.get(sql)
    if use is None:
        use = _judge_session_use(sql)
        if len(_SESSION_STATE) >= _SESSION_STATE_MAX:
            _SESSION_STATE.clear()
        _SESSION_STATE[sql] = use
    return use


def _judge_session_use(sql: str) -> int:
    # Apart from _session_use: its generators would make a closure on every call, the remembered ones included.
    low = mysql_lower(sql)
    # A statement whose first word can't be read (an unterminated comment, a code comment first) counts as a SHOW.
    hit = any(word in low for word in _SESSION_TEXT) or (
        statements.first_word(sql) in ("show", "") and any(word in low for word in _SESSION_TEXT_AFTER_SHOW)) or (
        "next" in low and "nextvalue" in _BETWEEN_WORDS.sub("", low))
    return (_LEAVES | _READS if hit else 0) | (_RANDOM if _RAND_CALL.search(low) else 0)


def _rand_seeds() -> tuple[int, int]:
    """Two seeds for RAND() from the system's generator: nothing a caller sees (request ids come from Python's
    own generator) says anything about them."""
    bits = int.from_bytes(urandom(8), "big")
    return bits & 0x3FFFFFFF, (bits >> 32) & 0x3FFFFFFF


def _close(link: _Link) -> None:
    link.conn.close()


class MysqlBackend(Backend):
    """MySQL/MariaDB: a pool per worker keyed by (settings, read-only), one statement per round trip."""

    dialect = "mysql"
    style = "format"

    def __init__(self, settings):
        self.settings = settings
        self.pool = Pool.from_settings(settings, close=_close)
        self._grow = settings.pool_size
        self._spin = settings.spin_us / 1e6   # a lone wait for a reply spins this long first (myresult.Reader)
        self._with_hint: dict[str, bool] = {}   # server version → the WITH hint check's outcome
        self._schemas = schema_reader.SchemaCache()
        self.renewal_waits = 0   # taken connections whose renewal reply had not arrived yet (a metric)
        # The table check asks how this server reads names before the call's first connection is open.
        schema_reader.set_probe(_probe(weakref.ref(self)))

    def _learn(self, fields: dict) -> None:
        """Open (or take) a read-only connection for these fields, so their server facts are known; it goes back
        to the pool for the call that asked."""
        key = (_ident(fields), True)
        link = self._take(key, fields, True)
        self.pool.release(key, link, True)

    # --- connections ---------------------------------------------------------------------------------------
    def _open(self, fields: dict, read_only: bool, deadline: float | None = None) -> _Link:
        timeout = CONNECT_TIMEOUT if deadline is None else _left(deadline)
        try:
            conn = MySQLdb.connect(**connect_args(fields, read_only, timeout), conv=conversions())
        except _DRIVER_ERRORS as exc:
            # Whatever refused it (unreachable, login or database refused): qag could not connect. The client
            # library's text may describe its options: shown as opening_detail cleans it.
            raise opening_failed(_detail(exc), fields) from None
        fd = conn.fileno()
        tcp_keepalive(fd)
        token = WATCHDOG.arm(fd, deadline) if deadline is not None else 0
        try:
            version = conn.get_server_info()
            mariadb = "mariadb" in version.lower()
            cursor = conn.cursor()
            cursor.execute(schema_reader.FACTS_QUERY)
            names = schema_reader.parse_facts(cursor.fetchone())
            schema_reader.remember(_ident(fields), names)
            variable = None
            if read_only:
                cursor.execute("SET SESSION TRANSACTION READ ONLY")
                if mariadb:
                    # Each statement is a transaction of its own, whatever the server's default autocommit.
                    conn.autocommit(True)
                    variable = statements.read_only_variable(version)
                else:
                    cursor.execute("START TRANSACTION READ ONLY")
            with_hint = mariadb or self._with_hint.get(version)
            if with_hint is None:
                with_hint = self._with_hint[version] = _hint_works_in_with(cursor)
            cursor.close()
        except _DRIVER_ERRORS as exc:
            cut = token and WATCHDOG.disarm(token)
            conn.close()
            raise (_Overdue() if cut else mapped(exc, None)) from None
        if token and WATCHDOG.disarm(token):
            conn.close()
            raise _Overdue()
        return _Link(conn, mariadb, with_hint, read_only and not mariadb, variable, names, self._spin)

    def _take(self, key, fields: dict, read_only: bool, sql: str = "", deadline: float | None = None,
              label: str = "") -> _Link:
        """A connection ready for a statement: pooled (its renewal reply read, alive) or new, by the deadline.

        A statement that reads what earlier statements left on a session (FOUND_ROWS(), SHOW WARNINGS, ...: see
        _session_use) gets a connection opened for it, never a pooled one, so it sees only its own session's
        state; it is closed after the call (_LEAVES)."""
        opening = (fields, read_only, deadline)
        if sql and _session_use(sql) & _READS:
            return self.pool.acquire(key, self._open, None, 0, deadline, label, False, opening, True)[0]
        while True:
            link, reused = self.pool.acquire(key, self._open, _preferred, self._grow, deadline, label, False, opening)
            link.reused = reused
            if not reused:
                return link
            try:
                if link.pending:
                    link.pending = False
                    if not link.arrived:   # as the pool saw it a moment ago: no second poll for a metric
                        self.renewal_waits += 1
                        _read_renewal(link, deadline)
                    else:
                        link.conn.read_query_result()
                    if not link.readable():
                        return link
                elif not link.arrived:
                    return link   # nothing pending and its socket quiet when the pool looked (_preferred)
            except _DRIVER_ERRORS:
                pass
            except _Overdue:
                self.pool.release(key, link, False)
                raise
            # Dead (closed by the server) or its renewal failed: close it and take another.
            self.pool.release(key, link, False)

    def _take_reading_text_by_default(self, key, stale: _Link, fields: dict, read_only: bool, call: Call,
                                      deadline: float | None) -> _Link:
        """For a masked call (Call.default_text), in place of a connection whose session reads quotes or backslashes
        otherwise (opened before the server's sql_mode changed): that one closed and another taken; refused when
        it reads them otherwise too (the server's mode has changed since masking read it)."""
        self.pool.release(key, stale, False)
        link = self._take(key, fields, read_only, call.sql, deadline, call.connection)
        if not _text_read_by_default(link):
            self.pool.release(key, link, True)   # fine for unmasked calls: the server's mode as it is now
            raise other_text_reading()
        return link

    def _give_back(self, key, link: _Link, read_only: bool, sql: str) -> None:
        use = _session_use(sql)
        if use & _LEAVES or (use & _RANDOM and not link.mariadb):
            # A rollback keeps user variables and GET_LOCK locks, and MySQL's RAND() generator where the
            # statement left it (seeded by _prepare, it gives back what this caller drew): closed, never pooled.
            self.pool.release(key, link, False)
            return
        if read_only:
            if link.renews and self.pool.idle_limit > 0:
                try:
                    link.conn.send_query(_RENEW)
                except _DRIVER_ERRORS:
                    self.pool.release(key, link, False)
                    return
                link.pending = True
            self.pool.release(key, link, True)
        else:
            reusable = link.conn.get_autocommit() and statements.first_word(sql) in _REUSABLE_AFTER_WRITE
            self.pool.release(key, link, reusable)

    def _prepare(self, link: _Link, sql: str, timeout: float | None) -> str:
        """The statement to send; on MySQL, first the session time limit when the statement can't carry it, and
        RAND()'s seeds for a statement that calls it (MariaDB carries them on the statement)."""
        if link.mariadb:
            if _session_use(sql) & _RANDOM:
                return statements.mariadb_statement(sql, timeout, link.read_only_variable, _rand_seeds())
            return statements.mariadb_statement(sql, timeout, link.read_only_variable)
        if _session_use(sql) & _RANDOM:
            link.cursor.execute("SET rand_seed1 = %d, rand_seed2 = %d" % _rand_seeds())
        timed = statements.mysql_statement(sql, timeout, link.with_hint)
        wanted = timed.session_ms
        if wanted is None and not timeout and link.session_ms:
            wanted = 0      # an earlier call's session limit must not cut this unlimited one short
        if wanted is not None:
            link.cursor.execute(f"SET SESSION max_execution_time = {wanted}")
            link.session_ms = wanted
        return timed.sql

    # --- Backend -------------------------------------------------------------------------------------------
    def _link_for(self, key, fields: dict, call: Call, deadline, read_only: bool | None = None) -> _Link:
        """A connection for the call: for a masked call one whose session reads text by default; for a
        table-restricted call none whose session parses another grammar (sql_mode=ORACLE reads `seq.nextval`
        as a sequence call, which qag's reading takes for a column)."""
        read_only = call.read_only if read_only is None else read_only
        try:
            link = self._take(key, fields, read_only, call.sql, deadline, call.connection)
            if call.default_text and not _text_read_by_default(link):
                link = self._take_reading_text_by_default(key, link, fields, read_only, call, deadline)
        except _Overdue:
            raise network_timeout(call.timeout) from None
        if call.tables is not None and link.names is not None and link.names.grammar_otherwise:
            self.pool.release(key, link, True)    # fine for a caller without rules
            raise QagError("table_check_failed", "This statement's tables can't be checked: the server's sql_mode "
                                                 "(ORACLE) parses statements in a grammar qag doesn't read")
        return link

    def run(self, fields: dict, call: Call) -> Result:
        read_only = call.read_only
        key = (_ident(fields), read_only)
        deadline = deadline_of(call.timeout)
        link = self._link_for(key, fields, call, deadline)
        while True:
            started = perf_counter()
            sent = None     # the statement once it is being sent: from then on it may have run
            token = WATCHDOG.arm(link.fd, deadline, _kill_query, (fields, link.thread_id)) if deadline else 0
            try:
                statement = self._prepare(link, call.sql, call.timeout)
                sent = statement
                columns, rows, json, fetched = _execute(link, statement, call.args, call.skip, call.fetch, deadline,
                                                        call.json_rows)
            except BaseException as exc:
                if token and WATCHDOG.disarm(token):
                    self._cut(key, link)
                    error = network_timeout(call.timeout)
                else:
                    self.pool.release(key, link, False)
                    if not isinstance(exc, _DRIVER_ERRORS):
                        raise
                    if read_only and link.reused and _lost(exc) and perf_counter() - started < STALE_WINDOW:
                        # A pooled connection whose path died without a word (a NAT, firewall or VIP change), lost
                        # as soon as the statement was sent: the idle ones share that path. A read-only call runs
                        # again, once, on another connection, as PostgreSQL's does.
                        self.pool.close_idle(key)
                        link = self._link_for(key, fields, call, deadline)
                        link.reused = False
                        continue
                    error = mapped(exc, call.timeout, sent or call.sql, call.sql)
                # A write commits on its own (autocommit): a reply lost once it was sent leaves its outcome unknown.
                raise (sent_write_error(error) if sent is not None and call.writes else error) from None
            break
        elapsed = (perf_counter() - started) * 1000.0
        if token and WATCHDOG.disarm(token):
            self._cut(key, link)   # the reply was read whole just as its socket was cut: answered, not pooled
        else:
            self._give_back(key, link, read_only, call.sql)
        if call.timeout and elapsed >= call.timeout * 1000.0 and not call.writes:
            # Past its time limit, a reply may be a function's answer to being interrupted, not its result:
            # MariaDB's BENCHMARK() gives 0 and SLEEP() 1 when max_statement_time or the watchdog's KILL QUERY
            # stops them, with no error. A call that can't write is answered as the limit says; a write did what
            # its reply says.
            raise timeout_error(call.timeout)
        return Result(columns, rows, elapsed, json, fetched)

    def _cut(self, key, link: _Link) -> None:
        """A connection the watchdog cut: closed, and the idle ones of the same settings with it (they share the
        network path that stopped answering; a dead one would hold its next call until that call's deadline)."""
        self.pool.release(key, link, False)
        self.pool.close_idle(key)

    def stream(self, fields: dict, call: Call, batch: int, cap: int | None):
        """(columns, batches) from an unbuffered cursor on a read-only connection; the first batch is read now.

        The connection stays out of the pool until the last row: then it is renewed and given back; a stream
        that stops early (row cap, client gone, error) closes it instead of reading the rest.
        """
        key = (_ident(fields), True)
        deadline = deadline_of(call.timeout)
        link = self._link_for(key, fields, call, deadline, read_only=True)
        cursor = MySQLdb.cursors.SSCursor(link.conn)
        first_size = batch if cap is None else min(batch, cap)
        sent = call.sql
        token = WATCHDOG.arm(link.fd, deadline, _kill_query, (fields, link.thread_id)) if deadline else 0
        try:
            sent = self._prepare(link, call.sql, call.timeout)
            cursor.execute(sent, call.args or None)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            first = list(cursor.fetchmany(first_size)) if columns and first_size > 0 else []
        except BaseException as exc:
            if token and WATCHDOG.disarm(token):
                self._cut(key, link)
                raise network_timeout(call.timeout) from None
            self.pool.release(key, link, False)
            if isinstance(exc, _DRIVER_ERRORS):
                raise mapped(exc, call.timeout, sent, call.sql) from None
            raise
        if token and WATCHDOG.disarm(token):
            self._cut(key, link)
            raise network_timeout(call.timeout)
        done = not columns or len(first) < first_size
        return columns, _Batches(self, key, link, cursor, first, batch, cap, done, call.sql, call.timeout)

    def test(self, fields: dict) -> float:
        started = perf_counter()
        link = self._open(fields, True)
        try:
            link.cursor.execute("SELECT 1")
            link.cursor.finish()
        except _DRIVER_ERRORS as exc:
            raise mapped(exc, None) from None
        finally:
            _safe_close(link)
        return (perf_counter() - started) * 1000.0

    def databases(self, fields: dict) -> list[str]:
        link = self._open(fields, True)
        try:
            link.cursor.execute("SHOW DATABASES")
            names = [row[0] for row in link.cursor.page(0, 0)]
            link.cursor.finish()
        except _DRIVER_ERRORS as exc:
            raise mapped(exc, None) from None
        finally:
            _safe_close(link)
        return names     # as SHOW DATABASES lists them for this user, the server's own included (as QueryAPIGate)

    def schema(self, fields: dict, database: str | None = None) -> dict:
        name = database if database is not None else fields.get("database")
        if not name:
            raise QagError("invalid_request", "This connection names no database: choose one with ?database=")
        name = str(name)
        found = self._schemas.get((_ident(fields), name), lambda: self._read_schema(fields, name))
        return copy.deepcopy(found)

    has_table_ddl = True

    def table_ddl(self, fields: dict, table: str) -> str | None:
        database = fields.get("database")
        if not database:
            raise QagError("invalid_request", "This connection names no database")
        return self._read_catalog(fields, str(database),
                                  lambda cursor, name: schema_reader.read_ddl(cursor, name, table))

    def functions(self, fields: dict, schema=None):
        """sql.functions.Catalog for the connection's database (issue 18): the names of its stored functions
        and of the server's loadable functions, which could answer an unqualified call; kept in the schema cache
        (read once per connection settings, refreshed in the background)."""
        name = str(fields.get("database") or "")
        return self._schemas.get(("functions", _ident(fields), name), lambda: self._read_functions(fields, name))

    def _read_functions(self, fields: dict, database: str):
        return self._read_catalog(fields, database, schema_reader.read_functions)

    def close_idle(self) -> None:
        self.pool.close_idle()
        self._schemas.clear()

    # --- schema ----------------------------------------------------------------------------------------------
    def fresh_schema(self, fields: dict, database: str | None = None) -> dict:
        """schema(), read now (see Backend.fresh_schema); no tables when the connection names no database."""
        name = database if database is not None else fields.get("database")
        if not name:
            return {"tables": [], "truncated": False}
        return self._read_schema(fields, str(name))

    def _read_schema(self, fields: dict, database: str) -> dict:
        return self._read_catalog(fields, database, schema_reader.read)

    def _read_catalog(self, fields: dict, database: str, reader):
        """reader(cursor, database) on a read-only pooled connection; driver failures mapped."""
        key = (_ident(fields), True)
        link = self._take(key, fields, True)
        try:
            found = reader(link.cursor, database)
        except BaseException as exc:
            self.pool.release(key, link, False)
            if isinstance(exc, _DRIVER_ERRORS):
                raise mapped(exc, None) from None
            raise
        self._give_back(key, link, True, "")
        return found


class _Overdue(Exception):
    """The call's deadline passed while its connection was being opened or readied (answered 504)."""


def _left(deadline: float) -> float:
    """Seconds left before the deadline; _Overdue when none are."""
    left = deadline - monotonic()
    if left <= 0:
        raise _Overdue()
    return left


# CR_SERVER_GONE_ERROR, CR_SERVER_LOST, CR_SERVER_LOST_EXTENDED: a connection that was open is gone.
_LOST_CODES = frozenset((2006, 2013, 2055))


def _lost(exc: BaseException) -> bool:
    """Whether a driver error says the connection was lost (not that the statement failed)."""
    args = getattr(exc, "args", ())
    return isinstance(exc, MySQLdb.OperationalError) and bool(args) and args[0] in _LOST_CODES


def _read_renewal(link: _Link, deadline: float | None) -> None:
    """Read a renewal reply that had not arrived when the pool looked, bounded by the call's deadline (a cut
    makes the read fail: the connection is then dropped like any dead one)."""
    token = WATCHDOG.arm(link.fd, deadline) if deadline is not None else 0
    try:
        link.conn.read_query_result()
    finally:
        if token and WATCHDOG.disarm(token):
            raise _Overdue()


def _kill_query(fields: dict, thread_id: int) -> None:
    """Stop a statement whose call was cut (the watchdog's cancel): KILL QUERY from a fresh, short-lived
    connection. MariaDB's max_statement_time and MySQL's hint already stop most; this covers the rest (a MySQL
    write) where the server can still be reached."""
    conn = MySQLdb.connect(**connect_args(fields, False, 2))
    try:
        conn.query(b"KILL QUERY %d" % thread_id)
    finally:
        conn.close()


def _probe(backend_ref):
    def probe(fields: dict) -> None:
        backend = backend_ref()
        if backend is not None:
            backend._learn(fields)
    return probe


def _safe_close(link: _Link) -> None:
    try:
        link.conn.close()
    except _DRIVER_ERRORS:
        pass


class _Batches:
    """The rows of a stream after the first batch; gives its connection back exactly once (also if dropped)."""

    def __init__(self, backend: MysqlBackend, key, link: _Link, cursor, first: list, batch: int,
                 cap: int | None, done: bool, sql: str, timeout: float | None):
        self._timeout = timeout   # to map a failure mid-stream
        self._backend = backend
        self._key = key
        self._link = link
        self._cursor = cursor
        self._first = first
        self._batch = batch
        self._left = None if cap is None else cap - len(first)
        self._done = done          # the server has sent every row
        self._sql = sql

    def __iter__(self):
        return self

    def __next__(self) -> list:
        if self._link is None:
            raise StopIteration
        if self._first:
            rows, self._first = self._first, []
            return rows
        if self._done or (self._left is not None and self._left <= 0):
            self.close()
            raise StopIteration
        size = self._batch if self._left is None else min(self._batch, self._left)
        # Each batch's read is bounded like the call's first: a path that stops answering mid-stream is cut.
        deadline = deadline_of(self._timeout)
        token = WATCHDOG.arm(self._link.fd, deadline) if deadline else 0
        try:
            rows = list(self._cursor.fetchmany(size))
        except _DRIVER_ERRORS as exc:
            # Raised, not swallowed: the run is recorded as failed and the body ends incomplete.
            cut = token and WATCHDOG.disarm(token)
            self.close()
            raise (network_timeout(self._timeout) if cut else mapped(exc, self._timeout)) from None
        if token and WATCHDOG.disarm(token):
            self.close()
            raise network_timeout(self._timeout)
        if len(rows) < size:
            self._done = True
        if self._left is not None:
            self._left -= len(rows)
        if not rows:
            self.close()
            raise StopIteration
        return rows

    def close(self) -> None:
        link, self._link = self._link, None
        if link is None:
            return
        if self._done:
            try:
                self._cursor.close()
            except _DRIVER_ERRORS:
                self._backend.pool.release(self._key, link, False)
                return
            self._backend._give_back(self._key, link, True, self._sql)
        else:
            # Rows are still coming: reading them all could take long, so the connection is closed instead.
            self._backend.pool.release(self._key, link, False)

    def __del__(self):
        self.close()
