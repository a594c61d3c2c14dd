"""SQLite connections: a fresh file handle per call, read-only in mode=ro, time limit by progress handler."""

from __future__ import annotations

import os
import sqlite3
import time
from urllib.parse import quote

from ..errors import QagError
from ..policy.functions import GENERATORS
from .base import Backend, Call, Result, connection_failed, query_failed, timeout_error

_PROGRESS_STEPS = 10_000
# Refused whatever the SQL guard decided: attaching other files escapes the connection's one database,
# and extensions run native code.
_DENIED_ACTIONS = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH}
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"})


def _authorizer(action, arg1, arg2, dbname, source):
    if action in _DENIED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and arg2 and arg2.lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


_TABLE_ACTIONS = {sqlite3.SQLITE_READ, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
# SQLite itself reads and updates its schema table while preparing some statements (an eponymous virtual
# table such as json_each); a key's statement naming one is refused before this (qag/policy/tables), so the
# authorizer lets the engine's own access by, and the pure generators the check allows are read as tables.
_ENGINE_TABLES = frozenset(("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema")) | GENERATORS


class _TablesAuthorizer:
    """The authorizer of a table-restricted call (contract 6.2's second line): the usual refusals, plus any
    read or write of a table outside the key's qualified grants. Access on behalf of a view or trigger
    (`source` set) is allowed: the statement that reached it was checked, and the key can't create either."""

    __slots__ = ("grants", "refused")

    def __init__(self, grants: frozenset):
        self.grants = grants
        self.refused: list[str] = []

    def __call__(self, action, arg1, arg2, dbname, source):
        if action in _TABLE_ACTIONS and source is None and arg1 and arg1.lower() not in _ENGINE_TABLES:
            name = f"{(dbname or 'main').lower()}.{arg1.lower()}"
            if name not in self.grants:
                self.refused.append(name)
                return sqlite3.SQLITE_DENY
        return _authorizer(action, arg1, arg2, dbname, source)


def _table_refusal(authorizer, grants: frozenset) -> QagError | None:
    if authorizer is None or not authorizer.refused:
        return None
    return QagError("table_not_allowed", "This API key may only query these tables: " + ", ".join(sorted(grants))
                    + ". Forbidden: " + ", ".join(sorted(set(authorizer.refused))) + ".")


def resolve_path(database: str | None, home: str, store_files: tuple[str, ...]) -> str:
    """The absolute file path of a SQLite connection, refusing a missing path, a missing file and the store."""
    if not database or not str(database).strip():
        raise QagError("connection_misconfigured", "Database file path not provided")
    path = os.path.realpath(os.path.join(home, str(database)))
    if path in store_files:
        raise QagError("store_not_allowed", "A connection may not point at the server's own store")
    if not os.path.isfile(path):
        raise QagError("database_file_not_found", "SQLite database file not found")
    return path


def _open(path: str, read_only: bool, tables: frozenset | None = None):
    if read_only:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=10.0, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
    authorizer = None if tables is None else _TablesAuthorizer(tables)
    conn.set_authorizer(_authorizer if authorizer is None else authorizer)
    return conn, authorizer


_SKIP_CHUNK = 1000


def skip_rows(cursor, count: int) -> None:
    """Discard rows before the page in bounded chunks: a huge page number costs time (bounded by the time
    limit), never memory."""
    while count > 0:
        got = len(cursor.fetchmany(min(count, _SKIP_CHUNK)))
        if not got:
            return
        count -= got


def _mapped(exc: Exception, deadline: float | None, timeout: float | None) -> QagError:
    """The contract's error for a driver failure: timeout 504, refusals 403, unreachable 502, else 500."""
    text = str(exc)
    if deadline is not None and text == "interrupted" and time.monotonic() >= deadline:
        return timeout_error(timeout)
    if "not authorized" in text:
        return QagError("forbidden", "This statement uses something the gateway refuses on SQLite "
                                     "(ATTACH, DETACH or an extension function)")
    if "readonly database" in text:
        return QagError("read_only", "The database refused a write on a read-only call")
    if "unable to open database file" in text:
        return connection_failed(text)
    return query_failed(text)


def run(path: str, call: Call) -> Result:
    """Run one statement; read-only calls can't write even if the guard were bypassed (mode=ro)."""
    try:
        conn, authorizer = _open(path, call.read_only, call.tables)
    except sqlite3.Error as exc:
        raise connection_failed(str(exc)) from None
    deadline = None
    if call.timeout:
        deadline = time.monotonic() + call.timeout
        conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
    started = time.perf_counter()
    try:
        if not call.read_only:
            conn.execute("BEGIN")
        cursor = conn.execute(call.sql, call.args)
        if cursor.description is None:
            columns, rows = [], []
        else:
            columns = [d[0] for d in cursor.description]
            skip_rows(cursor, call.skip)
            rows = cursor.fetchmany(call.fetch)
        if not call.read_only:
            conn.set_authorizer(_authorizer)   # the key's tables limit its statement, not the COMMIT
            conn.execute("COMMIT")
    except (sqlite3.Error, OverflowError, ValueError) as exc:
        # OverflowError/ValueError: a value the driver can't bind; the binder refuses most before this.
        raise _table_refusal(authorizer, call.tables) or _mapped(exc, deadline, call.timeout) from None
    finally:
        conn.close()
    return Result(columns, rows, (time.perf_counter() - started) * 1000.0)




def read_schema(path: str, max_tables: int = 1000) -> dict:
    """Tables and views with their columns, primary and foreign keys (GET .../schema)."""
    try:
        conn, _ = _open(path, True)
    except sqlite3.Error as exc:
        raise connection_failed(str(exc)) from None
    try:
        objects = conn.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
                               "AND name NOT LIKE 'sqlite_%' ORDER BY name").fetchall()
        tables = []
        for name, kind in objects[:max_tables]:
            # Table names come from sqlite_master, never from the caller, and are passed as a bound value.
            foreign = {row[3]: {"table": row[2], "column": row[4]}
                       for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,))}
            columns = [{"name": col, "type": ctype or None, "nullable": not notnull, "position": cid + 1,
                        "primary_key": pk > 0, "foreign_key": foreign.get(col)}
                       for cid, col, ctype, notnull, _default, pk in
                       conn.execute("SELECT cid, name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?)", (name,))]
            tables.append({"name": name, "schema": "main", "type": "view" if kind == "view" else "table",
                           "columns": columns})
    except sqlite3.Error as exc:
        raise query_failed(str(exc)) from None
    finally:
        conn.close()
    return {"tables": tables, "truncated": len(objects) > max_tables}


def stream(path: str, call: Call, batch: int, cap: int | None):
    """(columns, batches): the first batch is read now, so errors before the first row are normal errors.

    The file stays open while the caller iterates; the time limit covers the whole export.
    """
    try:
        conn, authorizer = _open(path, True, call.tables)
    except sqlite3.Error as exc:
        raise connection_failed(str(exc)) from None
    timeout = call.timeout
    deadline = time.monotonic() + timeout if timeout else None
    if deadline is not None:
        conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)

    def fetch(cursor, left):
        return cursor.fetchmany(batch if left is None else min(batch, left))

    try:
        cursor = conn.execute(call.sql, call.args)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        first = fetch(cursor, cap) if columns else []
    except (sqlite3.Error, OverflowError, ValueError) as exc:
        conn.close()
        raise _table_refusal(authorizer, call.tables) or _mapped(exc, deadline, timeout) from None
    # The authorizer is consulted while a statement is prepared: cleared now that it is.
    conn.set_authorizer(_authorizer)

    def batches():
        left = None if cap is None else cap - len(first)
        try:
            if first:
                yield first
            while left is None or left > 0:
                rows = fetch(cursor, left)
                if not rows:
                    break
                if left is not None:
                    left -= len(rows)
                yield rows
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            # Raised, not swallowed: the run is recorded as failed and the body ends incomplete.
            raise _mapped(exc, deadline, timeout) from None
        finally:
            conn.close()

    return columns, batches()


class SqliteBackend(Backend):
    """SQLite connections: never pooled, the file opened per call; paths relative to QAG_HOME."""

    dialect = "sqlite"
    style = "qmark"

    def __init__(self, home: str, store_files: tuple[str, ...]):
        self.home = home
        self.store_files = store_files

    def path(self, fields: dict) -> str:
        return resolve_path(fields.get("database"), self.home, self.store_files)

    def run(self, fields: dict, call: Call) -> Result:
        return run(self.path(fields), call)

    def stream(self, fields: dict, call: Call, batch: int, cap: int | None):
        return stream(self.path(fields), call, batch, cap)

    def test(self, fields: dict) -> float:
        started = time.perf_counter()
        run(self.path(fields), Call("SELECT 1", (), True, 10.0, 1))
        return (time.perf_counter() - started) * 1000.0

    def schema(self, fields: dict, database: str | None = None) -> dict:
        if database is not None:
            raise QagError("invalid_request", "Switching databases isn't supported for 'sqlite' connections")
        return read_schema(self.path(fields))
