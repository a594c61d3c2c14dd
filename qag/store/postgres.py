"""The PostgreSQL store (QAG_DATABASE_URL): the SQLite store's schema and SQL on a pool of psycopg2 connections.

Several instances may share one database. Migrations run under a transaction-scoped advisory lock, so concurrent
starts apply each step once; a newer schema is refused as on SQLite. Opening a current store runs no DDL, so a
worker's start never locks a table that requests are reading or writing. Every `transaction()` takes another
advisory lock for its duration, which serialises read-modify-write sections across threads, workers and instances
the way SQLite's BEGIN IMMEDIATE does. Outside a transaction each statement runs in autocommit on a pooled
connection.

Run rows go in with COPY FROM STDIN (one round trip per batch, no statement text to parse per row); history trims
and retention sweeps of all writers are serialised by a third advisory lock (no deadlock between workers trimming
the same version). Request ids are stored as text (12-hex ids too: the SQLite store packs those into 6 bytes).

Every round trip has a deadline (QAG_STORE_TIMEOUT): the server ends a statement, or a transaction left waiting,
at the limit itself (statement_timeout, idle_in_transaction_session_timeout), and a reply still missing a second
later (a stalled server or path, which TCP keepalive and TCP_USER_TIMEOUT can't see while the peer acknowledges)
has the watchdog shut the socket down: the blocked read returns, the connection is discarded and the caller gets
StoreTimeout, which `unavailable` reports (503 with Retry-After; the writer threads keep their batch).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import os
import re
import select
import threading
import time
from typing import Callable, Iterator
from urllib.parse import quote, unquote

from ..backends.watchdog import NETWORK_MARGIN, Watchdog
from ..errors import QagError
from .base import PAUSE_ROWS, StoreError, StoreTimeout, StoreUnanswered
from .schema import MIGRATIONS, RUN_COLUMNS, SCHEMA_VERSION, statements
from .sqlite import _CONFIGURATION, SqliteStore, _dump, _row

# Advisory lock keys (64-bit, database-wide): "qag" + a purpose byte, unlikely to meet another application's.
_LOCK_MIGRATE = 0x71616700_00000001
_LOCK_WRITE = 0x71616700_00000002
_LOCK_RUNS = 0x71616700_00000003

CONNECT_TIMEOUT = 5       # seconds to open a store connection
LOCK_TIMEOUT_MS = 5000   # longest wait for a row or advisory lock
POOL_WAIT = 10.0          # seconds a thread waits for a free connection when the pool is at its cap
STORE_TIMEOUT = 10.0      # QAG_STORE_TIMEOUT's default: seconds a round trip may take
_SCHEMA_TABLE = "qag_schema"

# The store's own watchdog (not the data connections'): its cuts are no data call's, and it runs no cancel
# (psycopg2's cancel() would use the connection's cancel handle while its owner closes it; statement_timeout
# makes the server cancel the statement anyway).
_WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=_WATCHDOG.after_fork)


def _driver():
    try:
        import psycopg2
        import psycopg2.extensions
    except ImportError:
        raise StoreError("QAG_DATABASE_URL names a PostgreSQL store but psycopg2 is not installed: "
                         "pip install 'qag[postgres]'") from None
    return psycopg2


_UNREADABLE = ("libpq can't read this URL (percent-encode characters such as @ : / ? # % in the user name and "
               "password)")


def _libpq_fields(url: str) -> dict | None:
    """The URL as libpq itself reads it (the reading that decides what the password is: an unencoded `#` or `?`
    in it, a percent-encoded `pass%77ord=` keyword), {} without psycopg2, None when libpq can't read it."""
    try:
        from psycopg2.extensions import parse_dsn
    except ImportError:
        return {}
    try:
        return parse_dsn(url)
    except Exception:   # psycopg2.ProgrammingError: libpq's own refusal
        return None


def _secrets(url: str, fields: dict) -> set:
    """Every spelling of the URL's credentials, as libpq reads them and as a reader of the text would (what stands
    between the scheme's `//` and the last `@` after a `:`, a `password=` value), decoded and encoded."""
    found = {fields.get("password"), fields.get("sslpassword"), _written_password(url)}
    for match in re.findall(r"(?i)pass(?:word|%77ord)=([^&]*)", url) + re.findall(r"(?i)%70assword=([^&]*)", url):
        found.add(match)
    found.update([unquote(secret) for secret in found if secret])
    return {form for secret in filter(None, found) for form in (secret, quote(secret, safe=""), quote(secret))}


def _written_userinfo(url: str) -> tuple[str, str] | None:
    """What a reader of the URL takes for its user and password: the two sides of the first `:` between `//` and
    the last `@`; None without both."""
    head = url.split("://", 1)[1] if "://" in url else ""
    userinfo = head.rsplit("@", 1)[0] if "@" in head else ""
    user, colon, password = userinfo.partition(":")
    return (user, password) if colon else None


def _written_password(url: str) -> str | None:
    written = _written_userinfo(url)
    return written[1] if written else None


def _reads_a_secret(text: str, secrets: set) -> bool:
    decoded = unquote(text)
    return any(secret in text or secret in decoded for secret in secrets)


def _without_secret_parameters(query: str) -> str:
    """A URL's query with the values of password parameters (however their names are percent-encoded) as ***."""
    def one(parameter: str) -> str:
        name, equals, _ = parameter.partition("=")
        return f"{name}=***" if equals and unquote(name).lower() in ("password", "sslpassword") else parameter
    return "&".join(one(p) for p in query.split("&"))


def redact(url: str) -> str:
    """The URL without its password, for log lines and messages: the user information before the last `@` shown
    as `user:***`, password parameters as `***`; and where some spelling of a credential (libpq's own reading of
    the URL among them) would still show, only the scheme."""
    scheme, sep, head = url.partition("://")
    if not sep:
        return url if "password" not in url.lower() else "postgresql://***"
    shown_head = head
    if "@" in head:
        userinfo, rest = head.rsplit("@", 1)
        shown_head = f"{userinfo.split(':', 1)[0]}:***@{rest}" if ":" in userinfo else head
    where, question, query = shown_head.partition("?")
    shown = f"{scheme}://{where}" + (f"?{_without_secret_parameters(query)}" if question else "")
    fields = _libpq_fields(url) or {}
    if _reads_a_secret(shown, _secrets(url, fields)):
        return f"{scheme}://***"
    return shown


def driver_text(exc: BaseException, url: str) -> str:
    """The driver's message with every form of the URL's password taken out: libpq quotes the part of a URL it
    can't parse, which can be the password (a `%` in it, say), so for a URL libpq can't read nothing of its
    message is shown."""
    fields = _libpq_fields(url)
    written = _written_userinfo(url)
    if fields is None or (written and unquote(written[0]) != fields.get("user")):
        # libpq reads the URL otherwise than it looks (`u:pw/x@h`: host u, port "pw"), so its message may quote a
        # piece of what was meant as the password, which no replacement of the whole would catch.
        return _UNREADABLE
    text = str(exc).strip()
    for secret in sorted(_secrets(url, fields), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


@functools.lru_cache(maxsize=1024)
def _pg(sql: str) -> str:
    """SQLite-style SQL to psycopg2's: `?` placeholders become %s (the store's SQL has no `?` in literals)."""
    return sql.replace("%", "%%").replace("?", "%s")


def _copy_lines(rows: list[tuple], pause: Callable[[], None] | None = None) -> str:
    """Rows as COPY's text format, with `pause` every PAUSE_ROWS rows when given (Store.add_runs)."""
    lines = []
    for start in range(0, len(rows), PAUSE_ROWS):
        if start and pause is not None:
            pause()
        lines.extend("\t".join(map(_copy_text, row)) + "\n" for row in rows[start:start + PAUSE_ROWS])
    return "".join(lines)


def _copy_text(value) -> str:
    """One field of COPY's text format."""
    if value is None:
        return "\\N"
    if isinstance(value, bytes):
        value = value.hex()
    elif not isinstance(value, str):
        return str(int(value)) if isinstance(value, bool) else str(value)
    # PostgreSQL text cannot hold NUL: one in an ad-hoc statement or an error message must not fail the batch.
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
            .replace("\x00", "\ufffd"))


class _Pool:
    """A small thread-safe pool of autocommit connections, per process: a forked child starts empty and never
    touches (nor closes) its parent's sockets."""

    def __init__(self, url: str, size: int, timeout: float | None = STORE_TIMEOUT):
        self.url = url
        self.size = max(1, size)
        self.timeout = timeout
        self._reset()

    def _reset(self) -> None:
        # Connections inherited across a fork are dropped, never closed: close() would send libpq's Terminate down
        # the parent's socket (psycopg2 itself skips that when it frees a connection of another process).
        self._pid = os.getpid()
        self._cond = threading.Condition(threading.Lock())
        self._idle: list = []
        self._open = 0

    def connect(self, timeout: float = CONNECT_TIMEOUT):
        psycopg2 = _driver()
        limit_ms = int(self.timeout * 1000) if self.timeout else 0
        options = {"tcp_user_timeout": max(limit_ms, 1000)} if limit_ms else {}
        try:
            # connect_timeout bounds the whole start-up (TCP, TLS, authentication), a stalled server's too.
            conn = psycopg2.connect(self.url, connect_timeout=max(1, int(timeout + 0.999)),
                                    application_name="qag-store", keepalives=1, keepalives_idle=30,
                                    keepalives_interval=10, keepalives_count=3, **options)
        except psycopg2.Error as exc:
            raise StoreError(f"cannot open the store {redact(self.url)}: {driver_text(exc, self.url)}") from None
        conn.autocommit = True
        try:
            with bounded(conn, self.timeout), conn.cursor() as cur:
                # As SQLite's 5 s busy timeout (at most the store's limit): a statement (or transaction())
                # waiting longer for a lock fails with a transient error instead of hanging a request or the
                # history writer. The server ends a statement at the store's limit, and a transaction its client
                # left waiting that long (a COMMIT held up in a stalled path must not land after the caller has
                # been told it failed); the client's deadline is a second later, so a slow server's own error
                # normally comes first and the connection stays usable.
                lock_ms = min(LOCK_TIMEOUT_MS, limit_ms) if limit_ms else LOCK_TIMEOUT_MS
                cur.execute("SET lock_timeout = %s; SET statement_timeout = %s; "
                            "SET idle_in_transaction_session_timeout = %s", (lock_ms, limit_ms, limit_ms))
        except (psycopg2.Error, StoreTimeout) as exc:
            conn.close()
            raise StoreError(f"cannot prepare a store connection to {redact(self.url)}: "
                             f"{driver_text(exc, self.url)}") from None
        return conn

    def get(self, fresh: bool = False):
        """A connection: an idle one the server has not ended meanwhile, else a new one. fresh: a new one (in the
        place of an idle one when the pool is full): a retry after a pooled connection turned out dead, whose
        idle siblings (ended by the same restart or pg_terminate_backend) may be dead too."""
        if self._pid != os.getpid():
            self._reset()
        deadline = time.monotonic() + POOL_WAIT
        stale: list = []
        try:
            with self._cond:
                while True:
                    while self._idle and not fresh:
                        conn = self._idle.pop()
                        if not _ended(conn):
                            return conn
                        stale.append(conn)
                        self._open -= 1
                    if fresh and self._idle and self._open >= self.size:
                        stale.append(self._idle.pop(0))   # the one idle longest
                        self._open -= 1
                    if self._open < self.size:
                        self._open += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._cond.wait(left):
                        if not self._idle and self._open >= self.size:
                            raise StoreError(f"no store connection free within {POOL_WAIT:g} s "
                                             f"({self.size} in use by this process)")
        finally:
            for conn in stale:
                with contextlib.suppress(Exception):
                    conn.close()
        try:
            return self.connect(min(CONNECT_TIMEOUT, self.timeout or CONNECT_TIMEOUT))
        except BaseException:
            with self._cond:
                self._open -= 1
                self._cond.notify()
            raise

    def put(self, conn, broken: bool = False) -> None:
        if self._pid != os.getpid():
            return  # a connection of the parent process: forget it
        if not broken and conn.closed:
            broken = True
        if broken:
            with contextlib.suppress(Exception):
                conn.close()
        with self._cond:
            if broken:
                self._open -= 1
            else:
                self._idle.append(conn)
            self._cond.notify()

    def close(self) -> None:
        if self._pid != os.getpid():
            self._reset()
            return
        with self._cond:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            with contextlib.suppress(Exception):
                conn.close()


def _ended(conn) -> bool:
    """Whether the server ended an idle pooled connection meanwhile (a restart, pg_terminate_backend, an idle
    timeout): its socket is readable (the server's last message, or the end of the stream) where an idle
    session's never is. A look, nothing sent: a statement is never sent down a connection already known dead,
    so a write that fails on one is not one whose outcome is in doubt."""
    if conn.closed:
        return True
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, TypeError):
        return True


@contextlib.contextmanager
def bounded(conn, timeout: float | None) -> Iterator[None]:
    """The round trips inside on `conn` must end within timeout + NETWORK_MARGIN seconds (None: no limit); past
    that the watchdog shuts its socket down and StoreTimeout is raised. The caller then discards `conn`."""
    if not timeout:
        yield
        return
    token = _WATCHDOG.arm(conn.fileno(), time.monotonic() + timeout + NETWORK_MARGIN)
    try:
        yield
    finally:
        if _WATCHDOG.disarm(token):
            raise StoreTimeout(f"the store did not answer within {timeout:g} s; its connection was closed")


def _rerunnable(sql: str) -> bool:
    """Whether a statement may be sent again after its connection broke: a read. A write may have run before the
    connection went (the reply lost, not the statement), and would then run twice."""
    return sql.lstrip()[:6].upper() == "SELECT"


# SQLSTATEs of a store that can't take qag's statements now, whatever the row (503 with Retry-After; the batch
# writers hold their batches): classes 53 (insufficient resources: disk full, too many connections), 57 (operator
# intervention: shutdown, cancelled), 40 (a serialization failure or deadlock: try again); and 25006 (a read-only
# transaction: a standby, or default_transaction_read_only), 42P01/42703/42P10/3F000 (qag's tables, columns,
# constraints or schema missing: the wrong database, a restore half done), 42501 (its rights revoked).
_STORE_FAULT_CLASSES = frozenset(("53", "57", "40"))
_STORE_FAULT_CODES = frozenset(("25006", "42P01", "42703", "42P10", "3F000", "42501"))


class PostgresStore(SqliteStore):
    """Store on a PostgreSQL database shared by any number of workers and instances."""

    _UNLIMITED = "ALL"

    def __init__(self, url: str, audit_limit: int = 500, pool_size: int = 8,
                 timeout: float | None = STORE_TIMEOUT):
        psycopg2 = _driver()
        self.audit_limit = audit_limit
        self.url = url
        self.path = None  # no file: the SQLite-only helpers must not be used
        self.timeout = timeout or None   # 0: no limit
        self._pool = _Pool(url, pool_size, self.timeout)
        self._local = threading.local()
        try:
            self._migrate()
        except psycopg2.Error as exc:
            raise StoreError(f"cannot prepare the store {self.describe()}: {driver_text(exc, url)}") from None

    def describe(self) -> str:
        return redact(self.url)

    def unavailable(self, exc: BaseException) -> str | None:
        psycopg2 = _driver()
        # OperationalError: the server is down or restarting, the connection was lost, a lock wait ran out.
        # InterfaceError: a connection psycopg2 already knows is closed. And what the server says of itself or of
        # the database, never of the row: read-only (a standby after a failover), qag's schema missing or half
        # there (the wrong database, a restore in progress), its rights revoked, out of resources, shut down.
        if isinstance(exc, (psycopg2.OperationalError, psycopg2.InterfaceError)) or (
                isinstance(exc, psycopg2.Error) and (getattr(exc, "pgcode", None) or "")[:2] in _STORE_FAULT_CLASSES
                or getattr(exc, "pgcode", None) in _STORE_FAULT_CODES):
            return driver_text(exc, self.url).splitlines()[0] if str(exc).strip() else type(exc).__name__
        return super().unavailable(exc)

    # --- plumbing --------------------------------------------------------------------------
    def _tx(self):
        """This thread's transaction connection, when it is inside transaction() in this process."""
        local = self._local
        if getattr(local, "depth", 0) and getattr(local, "pid", None) == os.getpid():
            return local.conn
        return None

    def _execute(self, sql: str, args: tuple, fetch):
        psycopg2 = _driver()
        for arg in args:
            if type(arg) is str and "\x00" in arg:
                # PostgreSQL text can't hold NUL, so nothing stored has one and the driver refuses to send it:
                # the caller's input is refused, as a 400, before anything is looked up or written.
                raise QagError("invalid_text")
        sql = _pg(sql)
        # SQLite stores Python booleans as 0/1 in INTEGER columns; PostgreSQL would call them boolean.
        args = tuple(int(a) if a is True or a is False else a for a in args)
        conn = self._tx()
        if conn is not None:
            with bounded(conn, self.timeout), conn.cursor() as cur:
                cur.execute(sql, args)
                return fetch(cur)
        for attempt in (0, 1):
            conn = self._pool.get(fresh=attempt == 1)
            try:
                with bounded(conn, self.timeout), conn.cursor() as cur:
                    cur.execute(sql, args)
                    result = fetch(cur)
            except StoreTimeout:
                self._pool.put(conn, broken=True)
                raise   # never again: the statement may be running, and the caller has waited long enough
            except psycopg2.Error as exc:
                broken = bool(conn.closed)
                self._pool.put(conn, broken=broken)
                # A pooled connection the server dropped (restart, idle timeout): a read once more on a new one
                # (not another pooled one: the same restart may have ended it too).
                if broken and attempt == 0 and _rerunnable(sql):
                    continue
                if broken and not _rerunnable(sql):
                    # Never a write: the connection may have broken after the server ran (in autocommit: committed)
                    # it, with only the reply lost. Its outcome is unknown, as at the deadline.
                    raise StoreUnanswered(_lost_reply(exc, self.url)) from exc
                raise
            self._pool.put(conn)
            return result
        raise AssertionError("unreachable")

    def _all(self, sql: str, args: tuple = ()) -> list[dict]:
        return self._execute(sql, args, lambda cur: [_row(cur, r) for r in cur.fetchall()])

    def _one(self, sql: str, args: tuple = ()) -> dict | None:
        def one(cur):
            r = cur.fetchone()
            return _row(cur, r) if r is not None else None
        return self._execute(sql, args, one)

    def _run(self, sql: str, args: tuple = ()) -> int:
        return self._execute(sql, args, lambda cur: cur.rowcount)

    def _conn(self):
        raise AssertionError("PostgresStore has no per-thread connection: use _execute or transaction()")

    def close(self) -> None:
        self._pool.close()

    @contextlib.contextmanager
    def transaction(self, lock: int = _LOCK_WRITE, wait_forever: bool = False) -> Iterator[None]:
        local = self._local
        outer = self._tx()
        if outer is not None:
            if lock not in local.locks:
                # Nested with another purpose (a history batch written from inside an administrative
                # transaction): take that lock too, so run writers stay serialised. Always after the write lock,
                # never before it, so no two transactions wait for each other.
                with bounded(outer, self.timeout), outer.cursor() as cur:
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
                local.locks.add(lock)
            local.depth += 1
            try:
                yield
            finally:
                local.depth -= 1
            return
        psycopg2 = _driver()
        for attempt in (0, 1):
            conn = self._pool.get(fresh=attempt == 1)
            broken = False
            try:
                # Waiting for another instance's migration has no limit (nor has the migration itself).
                with bounded(conn, None if wait_forever else self.timeout), conn.cursor() as cur:
                    cur.execute("BEGIN")
                    if wait_forever:
                        cur.execute("SET LOCAL lock_timeout = 0; SET LOCAL statement_timeout = 0; "
                                    "SET LOCAL idle_in_transaction_session_timeout = 0")
                    cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            except StoreTimeout:
                self._pool.put(conn, broken=True)
                raise
            except psycopg2.Error:
                dropped = bool(conn.closed)
                if not dropped:
                    with contextlib.suppress(psycopg2.Error):
                        conn.cursor().execute("ROLLBACK")
                self._pool.put(conn, broken=dropped)
                if dropped and attempt == 0:
                    continue  # a pooled connection the server dropped: begin again on a new one
                raise
            except BaseException:
                self._pool.put(conn, broken=True)
                raise
            break
        local.conn, local.pid, local.depth, local.locks = conn, os.getpid(), 1, {lock}
        committing = False
        try:
            yield
            committing = True
            with bounded(conn, self.timeout), conn.cursor() as cur:
                cur.execute("COMMIT")
        except BaseException as exc:
            if isinstance(exc, StoreTimeout) or conn.closed:
                broken = True   # cut, or lost: the server ends the transaction with the connection
                if committing and isinstance(exc, psycopg2.Error):
                    # Lost with the COMMIT sent: the server may have committed it before the connection went (a
                    # lost connection before the COMMIT rolls the transaction back: the caller may retry that).
                    raise StoreUnanswered(_lost_reply(exc, self.url)) from exc
            else:
                try:
                    with bounded(conn, self.timeout), conn.cursor() as cur:
                        cur.execute("ROLLBACK")
                except Exception:  # the connection is gone: so is the transaction
                    broken = True
            raise
        finally:
            local.depth = 0
            local.conn = None
            self._pool.put(conn, broken=broken)

    def _migrate(self) -> None:
        if self._current():
            return
        # Another instance may be migrating a big store: wait for it, however long.
        with self.transaction(lock=_LOCK_MIGRATE, wait_forever=True):
            self._run(f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} (version INTEGER NOT NULL)")
            row = self._one(f"SELECT max(version) AS v FROM {_SCHEMA_TABLE}")
            found = row["v"] if row["v"] is not None else 0
            if found > SCHEMA_VERSION:
                raise StoreError(f"the store {self.describe()} has schema version {found}, newer than this qag "
                                 f"knows ({SCHEMA_VERSION}); upgrade qag or use another QAG_DATABASE_URL")
            for step in MIGRATIONS[found:]:
                for statement in statements(step, "postgresql"):
                    with self._tx().cursor() as cur:
                        cur.execute(statement)  # as written: no placeholders, so a `?` or `%` in it is literal
            if found != SCHEMA_VERSION:
                self._run(f"DELETE FROM {_SCHEMA_TABLE}")
                self._run(f"INSERT INTO {_SCHEMA_TABLE} (version) VALUES (?)", (SCHEMA_VERSION,))
            triggers, mark = _config_triggers()
            if not self._config_triggers_in_place(mark):
                for statement in triggers:
                    with self._tx().cursor() as cur:
                        cur.execute(statement)

    def _current(self) -> bool:
        """Whether the store is at this schema version with its triggers in place, read without the migration
        lock: a worker starting (or restarting in an outage) then makes only bounded reads. The version only moves
        with the migration's commit, so a current one seen here stays current."""
        row = self._one(f"SELECT to_regclass('{_SCHEMA_TABLE}') IS NOT NULL AS found")
        if not row["found"]:
            return False
        found = self._one(f"SELECT max(version) AS v FROM {_SCHEMA_TABLE}")["v"]
        return found == SCHEMA_VERSION and self._config_triggers_in_place(_config_triggers()[1])

    def _config_triggers_in_place(self, mark: str) -> bool:
        """Whether this schema's configuration triggers are the ones `mark` names, all there and enabled. Only
        then may opening the store skip them: their DDL locks every configuration table until the migration's
        transaction ends, so a worker starting beside a reader (or a writer) would wait for it and make everyone
        after it wait, or deadlock with a writer that holds one of those tables and needs another."""
        row = self._one(
            "SELECT obj_description(p.oid, 'pg_proc') AS mark, "
            "(SELECT count(*) FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = n.oid "
            "AND t.tgname = 'qag_config_' || c.relname AND t.tgfoid = p.oid AND t.tgenabled = 'O') AS triggers "
            "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = current_schema() AND p.proname = 'qag_bump_config_generation'")
        return row is not None and row["mark"] == mark and row["triggers"] == len(_CONFIGURATION)

    def schema_version(self) -> int:
        return self._one(f"SELECT max(version) AS v FROM {_SCHEMA_TABLE}")["v"]

    def ping(self, timeout: float) -> None:
        conn = self._pool.connect(timeout)
        try:
            with bounded(conn, timeout), conn.cursor() as cur:
                cur.execute("SET statement_timeout = %s", (max(1, int(timeout * 1000)),))
                cur.execute("SELECT count(*) FROM meta")
                cur.fetchone()
        finally:
            conn.close()

    # --- dialect differences -----------------------------------------------------------------
    def audit(self, at, actor, via, action, target, changes) -> None:
        with self.transaction():
            entry = self._one("INSERT INTO audit_log (at, actor, via, action, target, changes) "
                              "VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
                              (at, actor, via, action, target, _dump(changes)))["id"]
            self._run("DELETE FROM audit_log WHERE id <= ?", (entry - self.audit_limit,))

    def _intern(self, names: list[str]) -> None:
        # One statement, no lock: a name another writer interns meanwhile is simply found.
        marks = ", ".join(["(?)"] * len(names))
        self._run(f"INSERT INTO names (name) VALUES {marks} ON CONFLICT (name) DO NOTHING", tuple(names))

    def version_uuids(self, pairs: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        if not pairs:
            return {}
        ordered = sorted(pairs)
        marks = ", ".join(["(?, ?)"] * len(ordered))
        rows = self._all(f"SELECT query_name, version, uuid FROM query_versions WHERE (query_name, version) IN "
                         f"({marks})", tuple(v for pair in ordered for v in pair))
        return {(r["query_name"], r["version"]): r["uuid"] for r in rows}

    def add_runs(self, rows: list[tuple], *, limit: int, adhoc_limit: int, by_count: bool, events_since: int,
                 pause: Callable[[], None] | None = None, batch_id: str | None = None) -> None:
        if not rows:
            return
        data = io.StringIO(_copy_lines(rows, pause))
        with self.transaction(lock=_LOCK_RUNS):
            if batch_id is not None and not self._first_write(batch_id):
                return
            # The runs lock (not the metadata one): batches of every worker and instance trim one at a time,
            # while administration goes on.
            with bounded(self._tx(), self.timeout), self._tx().cursor() as cur:
                cur.copy_expert(f"COPY runs ({', '.join(RUN_COLUMNS)}) FROM STDIN", data)
            if by_count:
                self._trim_after(rows, limit, adhoc_limit, events_since)

    def prune_runs(self, *, events_since: int, history_since: int | None, batch: int) -> int:
        changed = 0
        with self.transaction(lock=_LOCK_RUNS):  # one sweep at a time across instances, between batch writes
            changed += self._run("DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE at < ? AND h = 0 "
                                 f"LIMIT {int(batch)})", (events_since,))
            if history_since is not None:
                changed += self._run("UPDATE runs SET h = 0 WHERE id IN (SELECT id FROM runs WHERE h = 1 AND "
                                     f"at < ? LIMIT {int(batch)})", (history_since,))
        return changed

    # --- raw table access (qag store copy) -------------------------------------------------------
    def raw_rows(self, table: str) -> tuple[list[str], list[tuple]]:
        def fetch(cur):
            return [d[0] for d in cur.description], cur.fetchall()
        return self._execute(f"SELECT * FROM {_ident(table)}", (), fetch)

    def insert_raw(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        if not rows:
            return
        data = io.StringIO(_copy_lines(rows))
        with bounded(self._tx(), self.timeout), self._tx().cursor() as cur:
            cur.copy_expert(f"COPY {_ident(table)} ({', '.join(map(_ident, columns))}) FROM STDIN", data)

    def after_copy(self, tables: list[str]) -> None:
        """Move each id sequence past the copied ids, so new rows never reuse one."""
        for table in tables:
            seq = self._one("SELECT pg_get_serial_sequence(?, 'id') AS s", (table,)) if self._has_id(table) else None
            if seq and seq["s"]:
                self._one(f"SELECT setval(?, coalesce((SELECT max(id) FROM {_ident(table)}), 0) + 1, false) AS v",
                          (seq["s"],))

    def _has_id(self, table: str) -> bool:
        return self._one("SELECT count(*) AS n FROM information_schema.columns WHERE table_name = ? "
                         "AND column_name = 'id' AND table_schema = current_schema()", (table,))["n"] > 0


def _lost_reply(exc: BaseException, url: str) -> str:
    text = driver_text(exc, url).strip().splitlines()
    return ("the store's connection was lost before its reply came; the change may have been applied"
            + (f" ({text[0]})" if text else ""))


def _ident(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise StoreError(f"not a table or column name: {name!r}")
    return name


def _config_triggers() -> tuple[list[str], str]:
    """The SQLite store's configuration triggers (sqlite._CONFIGURATION) in PostgreSQL's terms: any change to a
    configuration row, also one made straight in the database, moves meta.config_generation, which the metadata
    cache polls. Statement-level, so a bulk edit moves it once.

    Returns (the statements that install them, their mark). The last statement writes the mark, a digest of the
    others, as the function's comment: a store whose function carries it has these very triggers (not meta, which
    `qag store copy` wants empty and copies from the source)."""
    statements = ["CREATE OR REPLACE FUNCTION qag_bump_config_generation() RETURNS trigger LANGUAGE plpgsql AS $$ "
                  "BEGIN INSERT INTO meta (key, value) VALUES ('config_generation', '1') ON CONFLICT (key) DO UPDATE "
                  "SET value = (meta.value::bigint + 1)::text; RETURN NULL; END $$"]
    for table, columns in _CONFIGURATION.items():
        name = f"qag_config_{table}"
        statements.append(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        statements.append(f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE{columns} OR DELETE ON {table} "
                          f"FOR EACH STATEMENT EXECUTE FUNCTION qag_bump_config_generation()")
    mark = "qag configuration triggers " + hashlib.sha256("\n".join(statements).encode()).hexdigest()[:16]
    statements.append(f"COMMENT ON FUNCTION qag_bump_config_generation() IS '{mark}'")
    return statements, mark
