"""PostgreSQL connections on psycopg2: one simple-query message per call on pooled autocommit connections.

Every paged call is one Query message (contract 10.4), which PostgreSQL runs as one implicit transaction:

    RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; [SET TRANSACTION READ ONLY; ]
    [SET LOCAL statement_timeout = <ms>; ][SET LOCAL search_path = pg_catalog, "<schema>", pg_temp; ]
    SELECT pg_advisory_unlock_all(); <sql>

(the search_path only for a table-restricted call: contract 6.2, qag/policy/tables.py)

`RESET ALL` first, so nothing a previous call did to the session (search_path, TimeZone, DateStyle,
default_transaction_read_only, statement_timeout set with set_config(..., false)) reaches this one; the access
mode and the time limit are transaction-local, so they end with the message. psycopg2 interpolates the
parameters client-side (literals quoted by libpq) and sends the whole string with PQexec; the cursor holds the
last statement's result. The prefix holds no '%', so psycopg2's interpolation leaves it alone; a call without
parameters is executed without an argument tuple, so its SQL is never %-formatted (qag.sql.prepare doubles '%'
exactly when there are parameters). Writes are committed by the implicit transaction: no COMMIT message.

Dead pooled connections, without a round trip (a deliberate departure from contract 10.2's "SELECT 1 after 5 s
idle", which would cost a second wait on every call after a pause):
  1. A reused connection is checked with a zero-timeout poll() on its socket. An idle autocommit connection has
     nothing to read, so anything readable (EOF after the server closed it, a FATAL from pg_terminate_backend or
     a shutdown) means it is replaced by a fresh connection before anything is sent. This catches the common
     cases (server restart, terminated backend) for reads and writes alike, with one system call.
  2. A connection that died silently (no FIN: a dropped NAT entry, a host gone) passes the check; its first
     statement then fails with OperationalError/InterfaceError and the connection marked closed. A read-only call
     is retried once on a fresh connection (harmless: the transaction was read-only). A write is never retried
     (it may have committed): it answers 502 connection_failed. A read whose backend was killed mid-statement is
     retried once too, bounded by its time limit.
A connection that raised, was cancelled, or was left inside a transaction block is closed, not pooled.

Streams (contract 3.8/10.4) use one explicit transaction and a named server-side cursor in one message,
`BEGIN; <prefix>DECLARE qag_stream NO SCROLL CURSOR FOR <sql>\\n; FETCH FORWARD <n> FROM qag_stream`, so the
first batch costs one round trip; each further batch is one FETCH (each under the statement time limit); the
stream ends with ROLLBACK and the connection, still in autocommit mode, goes back to the pool.
"""

from __future__ import annotations

import select
import threading
import time
from collections import OrderedDict

import psycopg2
import psycopg2.extensions

from ..errors import QagError
from .base import Backend, Call, Result, connection_failed, query_failed, timeout_error
from .pool import Pool

CONNECT_TIMEOUT = 10
# Passed to the driver as named; `database` becomes `dbname`. Anything else (`schema`, unknown options) is not.
DRIVER_FIELDS = ("host", "port", "user", "password", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslcrl")
STREAM_CURSOR = "qag_stream"
MASK = "********"
SCHEMA_TTL = 60.0           # a schema older than this is read again before it is served
SCHEMA_REFRESH = 45.0       # ... and one older than this is served while a background thread reads it again
SCHEMA_CACHE_SIZE = 64      # schemas kept per backend (per connection settings and database)
SCHEMA_MAX_TABLES = 1000

# RESET ALL leaves role and session authorization alone (and a SELECT set_config('role', ...) survives the
# implicit transaction), and session advisory locks outlive it: reset and release them too, in the same message.
_BASE = "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; "
_UNLOCK = "SELECT pg_advisory_unlock_all(); "
_READ_ONLY = "SET TRANSACTION READ ONLY; "
_UNREACHABLE = ("could not connect", "connection refused", "timeout expired",
                "server closed the connection unexpectedly", "connection already closed",
                "could not receive data from server", "could not send data to server", "no connection to the server",
                "terminating connection")
_IDLE = psycopg2.extensions.TRANSACTION_STATUS_IDLE
_CONNECTION_ERRORS = (psycopg2.OperationalError, psycopg2.InterfaceError)


# ---------------------------------------------------------------- statements (pure)


def timeout_ms(timeout: float | None) -> int | None:
    """statement_timeout in whole milliseconds; never 0 for a limit that applies (0 would mean none)."""
    if not timeout:
        return None
    return max(1, int(round(timeout * 1000)))


def search_path(schema: str) -> str:
    """SET LOCAL search_path for a table-restricted call (contract 6.2): unqualified names resolve in the schema
    its tables were checked with. pg_catalog goes first so built-in functions can't be shadowed by same-named
    ones in that schema (catalog relations all start with pg_, which the check refuses unqualified), and pg_temp
    last so no temporary table shadows a checked name. Refuses a schema name it can't put in the message."""
    if "%" in schema or "\x00" in schema:
        raise QagError("table_check_failed", "This API key may only query its allowed tables, and the "
                                             "connection's schema can't be pinned for the check")
    return 'SET LOCAL search_path = pg_catalog, "' + schema.replace('"', '""') + '", pg_temp; '


def prefix(read_only: bool, timeout: float | None, schema: str | None = None) -> str:
    """What goes before the statement in every message (contract 10.4). Contains no '%'."""
    text = _BASE + _READ_ONLY if read_only else _BASE
    ms = timeout_ms(timeout)
    if ms is not None:
        text += f"SET LOCAL statement_timeout = {ms}; "
    if schema is not None:
        text += search_path(schema)
    return text + _UNLOCK


_PREFIXES: dict = {}


def message(sql: str, read_only: bool, timeout: float | None, schema: str | None = None) -> str:
    """The one message of a paged call: the prefix, then the rendered statement (with its LIMIT window)."""
    key = (read_only, timeout, schema)
    text = _PREFIXES.get(key)
    if text is None:
        if len(_PREFIXES) > 256:        # time limits and schemas are a handful of values; bound it all the same
            _PREFIXES.clear()
        text = _PREFIXES[key] = prefix(read_only, timeout, schema)
    return text + sql


def stream_message(sql: str, timeout: float | None, first: int, schema: str | None = None) -> str:
    """One message that opens a read-only transaction, declares the stream's cursor and fetches the first batch.

    The newline before ';' ends a trailing line comment of the statement.
    """
    return (f"BEGIN; {prefix(True, timeout, schema)}DECLARE {STREAM_CURSOR} NO SCROLL CURSOR FOR {sql}\n; "
            f"FETCH FORWARD {int(first)} FROM {STREAM_CURSOR}")


def fetch_message(n: int) -> str:
    return f"FETCH FORWARD {int(n)} FROM {STREAM_CURSOR}"


def connect_args(fields: dict) -> dict:
    """psycopg2.connect keyword arguments for a connection's resolved fields (no `schema`, no unknown options).

    client_encoding goes in the startup packet, so RESET ALL keeps UTF8 (the value psycopg2 decodes with).
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
    return args


def pool_key(fields: dict, read_only: bool):
    """Connections are interchangeable only with the same resolved fields (password included) and access mode."""
    key = (read_only, tuple(sorted(fields.items())))
    try:
        hash(key)
    except TypeError:  # an option holding a list or an object
        key = (read_only, repr(sorted((k, repr(v)) for k, v in fields.items())))
    return key


def scrub(text: str, fields: dict) -> str:
    """Driver text with the password replaced by ********."""
    password = fields.get("password")
    if password is not None and password != "":
        text = text.replace(str(password), MASK)
    return text


# ---------------------------------------------------------------- errors


def _driver_text(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__


def mapped(exc: BaseException, fields: dict, timeout: float | None, conn=None) -> QagError:
    """The contract's error for a driver failure: cancelled 504, unreachable 502, bad value 400, else 500."""
    if isinstance(exc, psycopg2.errors.QueryCanceled):
        if timeout:
            return timeout_error(timeout)
        return query_failed(scrub(_driver_text(exc), fields))
    if isinstance(exc, ValueError) and (isinstance(exc, UnicodeError) or "NUL" in str(exc)):
        # A parameter value PostgreSQL can't hold: a NUL character or a lone surrogate.
        return QagError("param_invalid", "A parameter value can't be sent to PostgreSQL: "
                                         "text may not contain NUL characters or unpaired surrogates")
    text = scrub(_driver_text(exc), fields)
    lowered = text.lower()
    closed = conn is not None and conn.closed
    if closed or (isinstance(exc, _CONNECTION_ERRORS) and any(m in lowered for m in _UNREACHABLE)):
        return connection_failed(text)
    return query_failed(text)


# ---------------------------------------------------------------- the backend


class _Connection(psycopg2.extensions.connection):
    """psycopg2's connection, able to carry the cursor and the poll object qag keeps with it."""


def _has_input(conn) -> bool:
    """Whether an idle connection has something to read (EOF or a message): then it can't be trusted."""
    if conn.closed:
        return True
    try:
        return bool(conn.qag_poll.poll(0))
    except (OSError, ValueError, AttributeError):
        return True


class PostgresBackend(Backend):
    """psycopg2 connections pooled per worker (created after fork) by resolved fields and access mode."""

    dialect = "postgres"
    style = "format"

    def __init__(self, settings):
        self.settings = settings
        self.pool = Pool.from_settings(settings)
        self._schemas: OrderedDict = OrderedDict()      # key → (read at, schema)
        self._refreshing: set = set()
        self._schema_lock = threading.Lock()
        self._generation = 0                            # bumped by close_idle: a refresh in flight is dropped

    # --- connections -------------------------------------------------------------------------------------
    @staticmethod
    def connect(fields: dict):
        """A new autocommit connection; any failure to open one is 502 connection_failed (password scrubbed)."""
        try:
            conn = psycopg2.connect(connection_factory=_Connection, **connect_args(fields))
        except Exception as exc:  # OperationalError, or a driver refusal of the options (ProgrammingError)
            raise connection_failed(scrub(_driver_text(exc), fields)) from None
        try:
            conn.autocommit = True
            # One cursor per connection, reused by every call; the poll object for the idle check.
            conn.qag_cursor = conn.cursor()
            conn.qag_poll = select.poll()
            conn.qag_poll.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        except (psycopg2.Error, OSError) as exc:
            conn.close()
            raise connection_failed(scrub(_driver_text(exc), fields)) from None
        return conn

    def _checkout(self, key, fields: dict):
        """(connection, reused): a pooled connection that shows no sign of being closed, or a new one."""
        conn, reused = self.pool.acquire(key, lambda: self.connect(fields))
        if reused and _has_input(conn):
            conn = self._replace(key, conn, fields)
            reused = False
        return conn, reused

    def _replace(self, key, conn, fields: dict):
        """Close a dead connection and open a fresh one in its place in the pool's count."""
        try:
            conn.close()
        except Exception:
            pass
        try:
            return self.connect(fields)
        except BaseException:
            self.pool.release(key, conn, False)
            raise

    def _failed(self, key, conn, exc: BaseException, fields: dict, timeout: float | None) -> BaseException:
        """The error to raise for a call that failed (judged while the connection still shows its state); the
        connection is closed, never pooled again."""
        error = mapped(exc, fields, timeout, conn) if isinstance(exc, (psycopg2.Error, ValueError)) else exc
        self.pool.release(key, conn, False)
        return error

    def _execute(self, key, fields: dict, call: Call, text: str):
        """(connection, cursor) after the one message ran; retries a read once on a fresh connection when a
        reused connection turns out to be dead. On error the connection has been given back (closed)."""
        args = call.args or None
        conn, reused = self._checkout(key, fields)
        try:
            cur = conn.qag_cursor
            try:
                cur.execute(text, args)
            except _CONNECTION_ERRORS:
                if not (reused and call.read_only and conn.closed):
                    raise
                conn = self._replace(key, conn, fields)
                cur = conn.qag_cursor
                cur.execute(text, args)
        except QagError:
            raise                            # _replace could not open a connection and gave the slot back
        except BaseException as exc:
            raise self._failed(key, conn, exc, fields, call.timeout) from None
        return conn, cur

    # --- calls ---------------------------------------------------------------------------------------------
    def run(self, fields: dict, call: Call) -> Result:
        key = pool_key(fields, call.read_only)
        started = time.perf_counter()
        conn, cur = self._execute(key, fields, call, message(call.sql, call.read_only, call.timeout, call.schema))
        try:
            description = cur.description
            if description is None:
                columns, rows = [], []
            else:
                columns = [d[0] for d in description]
                skip = call.skip
                if skip:
                    if skip >= cur.rowcount:
                        rows = []
                    else:
                        cur.scroll(skip)
                        rows = cur.fetchmany(call.fetch)
                else:
                    rows = cur.fetchmany(call.fetch)
        except BaseException as exc:
            raise self._failed(key, conn, exc, fields, call.timeout) from None
        # A statement that left a transaction open (BEGIN as a write) doesn't leave it to the next call.
        self.pool.release(key, conn, conn.get_transaction_status() == _IDLE)
        return Result(columns, rows, (time.perf_counter() - started) * 1000.0)

    def stream(self, fields: dict, call: Call, batch: int, cap: int | None):
        key = pool_key(fields, True)
        read = Call(call.sql, call.args, True, call.timeout, 0)
        batch = max(1, int(batch))
        first_n = batch if cap is None else max(0, min(batch, cap))
        conn, cur = self._execute(key, fields, read, stream_message(call.sql, call.timeout, first_n, call.schema))
        try:
            columns = [d[0] for d in cur.description] if cur.description else []
            first = cur.fetchall() if cur.description else []
        except BaseException as exc:
            raise self._failed(key, conn, exc, fields, call.timeout) from None
        return columns, _Batches(self.pool, key, conn, cur, first, first_n, batch, cap, fields, call.timeout)

    def test(self, fields: dict) -> float:
        """A new connection (not pooled: it proves the settings work now) and SELECT 1 read-only."""
        started = time.perf_counter()
        conn = self.connect(fields)
        try:
            conn.qag_cursor.execute(message("SELECT 1", True, self.settings.query_timeout or 10.0))
        except psycopg2.Error as exc:
            raise mapped(exc, fields, self.settings.query_timeout or 10.0, conn) from None
        finally:
            conn.close()
        return (time.perf_counter() - started) * 1000.0

    def query_all(self, fields: dict, sql: str, args: tuple = ()) -> Result:
        """Every row of a read-only catalog query (bound parameters only), on the read-only pool."""
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
        key = pool_key(fields, True)
        now = time.monotonic()
        with self._schema_lock:
            entry = self._schemas.get(key)
            generation = self._generation
            if entry is not None:
                age = now - entry[0]
                if age < SCHEMA_TTL:
                    if age >= SCHEMA_REFRESH and key not in self._refreshing:
                        self._refreshing.add(key)
                        threading.Thread(target=self._refresh, args=(key, fields, generation), daemon=True,
                                         name="qag-pg-schema").start()
                    return entry[1]
        schema = read_schema(self, fields)
        self._remember(key, schema, now, generation)
        return schema

    def _refresh(self, key, fields: dict, generation: int) -> None:
        try:
            started = time.monotonic()
            schema = read_schema(self, fields)
            self._remember(key, schema, started, generation)
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
    Closed early (the client went away) → ROLLBACK and the connection is reused; dropped without ever being
    iterated or closed → the connection is closed when this object is collected.
    """

    def __init__(self, pool: Pool, key, conn, cur, first: list, first_n: int, batch: int, cap: int | None,
                 fields: dict, timeout: float | None):
        self._pool, self._key, self._conn, self._cur = pool, key, conn, cur
        self._fields, self._timeout = fields, timeout  # to map a failure mid-stream (password scrubbed)
        self._first = first
        self._batch = batch
        self._left = None if cap is None else cap - len(first)
        self._more = len(first) == first_n
        self._done = False

    def __iter__(self):
        return self

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
            try:
                self._cur.execute(fetch_message(n))
                rows = self._cur.fetchall()
            except psycopg2.Error as exc:
                # Raised, not swallowed: the run is recorded as failed and the server ends the chunked body
                # without its terminator, so the client can tell the export is incomplete.
                self._finish(False)
                raise mapped(exc, self._fields, self._timeout) from None
            if left is not None:
                self._left = left - len(rows)
            self._more = len(rows) == n
            if rows:
                return rows
        self.close()
        raise StopIteration

    def close(self) -> None:
        """End the transaction (ROLLBACK) and give the connection back; closes it if that fails."""
        if self._done:
            return
        reusable = False
        try:
            self._cur.execute("ROLLBACK")
            reusable = self._conn.get_transaction_status() == _IDLE
        except psycopg2.Error:
            pass
        self._finish(reusable)

    def _finish(self, reusable: bool) -> None:
        if not self._done:
            self._done = True
            self._pool.release(self._key, self._conn, reusable)

    def __del__(self):
        # Never iterated nor closed. The pool's lock is taken on another thread: a collection may run this
        # while the current thread holds it.
        if not self._done:
            self._done = True
            try:
                threading.Thread(target=self._pool.release, args=(self._key, self._conn, False), daemon=True).start()
            except RuntimeError:  # interpreter shutting down
                pass


# Relations the connecting role has some privilege on, as information_schema.tables lists them.
_TABLES_SQL = """WITH t AS (
  SELECT c.oid, n.nspname, c.relname, c.relkind
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind::text = ANY(%s) AND n.nspname <> %s AND n.nspname NOT LIKE %s
    AND (pg_catalog.pg_has_role(c.relowner, 'USAGE')
         OR pg_catalog.has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
         OR pg_catalog.has_any_column_privilege(c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))
  ORDER BY n.nspname, c.relname
  LIMIT %s)
SELECT t.oid, t.nspname, t.relname, t.relkind, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
       NOT a.attnotnull, a.attnum
FROM t LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY t.nspname, t.relname, a.attnum"""

_KEYS_SQL = """SELECT con.conrelid, con.contype, a.attname, fn.nspname, fc.relname, fa.attname
FROM pg_catalog.pg_constraint con
CROSS JOIN LATERAL unnest(con.conkey, COALESCE(con.confkey, con.conkey)) AS k(col, fcol)
JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.col
LEFT JOIN pg_catalog.pg_class fc ON fc.oid = con.confrelid
LEFT JOIN pg_catalog.pg_namespace fn ON fn.oid = fc.relnamespace
LEFT JOIN pg_catalog.pg_attribute fa ON fa.attrelid = con.confrelid AND fa.attnum = k.fcol
WHERE con.conrelid = ANY(%s::oid[]) AND con.contype::text = ANY(%s)
ORDER BY con.conrelid, con.contype, con.conname, k.col"""


def read_schema(backend: PostgresBackend, fields: dict, max_tables: int = SCHEMA_MAX_TABLES) -> dict:
    """{"tables": [...], "truncated": bool} (contract 5.2) from pg_catalog; system schemas skipped."""
    rows = backend.query_all(fields, _TABLES_SQL, (["r", "p", "v", "m", "f"], "information_schema", "pg\\_%",
                                                   max_tables + 1)).rows
    tables: list[dict] = []
    by_oid: dict = {}
    for oid, nspname, relname, relkind, attname, ctype, nullable, attnum in rows:
        table = by_oid.get(oid)
        if table is None:
            if len(by_oid) == max_tables:
                continue                     # the one past the limit only says "truncated"
            table = {"name": relname, "schema": nspname, "type": "view" if relkind in ("v", "m") else "table",
                     "columns": []}
            by_oid[oid] = table
            tables.append(table)
        if attname is not None:
            table["columns"].append({"name": attname, "type": ctype, "nullable": bool(nullable),
                                     "position": int(attnum), "primary_key": False, "foreign_key": None})
    truncated = len({row[0] for row in rows}) > max_tables
    if by_oid:
        keys = backend.query_all(fields, _KEYS_SQL, ([int(o) for o in by_oid], ["p", "f"])).rows
        for conrelid, contype, attname, fschema, ftable, fcolumn in keys:
            table = by_oid.get(conrelid)
            if table is None:
                continue
            column = next((c for c in table["columns"] if c["name"] == attname), None)
            if column is None:
                continue
            if contype == "p":
                column["primary_key"] = True
            elif column["foreign_key"] is None and ftable is not None:
                name = ftable if fschema == table["schema"] else f"{fschema}.{ftable}"
                column["foreign_key"] = {"table": name, "column": fcolumn}
    return {"tables": tables, "truncated": truncated}
