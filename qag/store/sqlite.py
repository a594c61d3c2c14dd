"""The default store: one SQLite file (WAL) in QAG_HOME, a connection per thread, migrated at open."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import threading
import time
from typing import Any, Callable, Iterator
from urllib.parse import quote

from .base import PAUSE_ROWS, Store, StoreError
from .schema import MIGRATIONS, RUN_COLUMNS, SCHEMA_VERSION, statements

STORE_FILE = "qag.db"
_SIDE_FILES = ("", "-wal", "-shm", "-journal")

_KEY_COLUMNS = ("name", "secret_hash", "previous_hash", "previous_expires_at", "grants", "active", "expires_at",
                "created_at", "created_from_role", "last_used_at", "previous_last_used_at", "example")
_ROLE_COLUMNS = ("name", "grants", "require_claim_binding", "keys_created", "example", "created_at")
_CONNECTION_COLUMNS = ("name", "db", "active", "fields", "example", "created_at", "updated_at")
_JSON_COLUMNS = frozenset({"grants", "fields", "body", "changes"})
_BOOL_COLUMNS = frozenset({"active", "example", "require_claim_binding"})


def store_paths(home: str) -> tuple[str, ...]:
    """The store file and its SQLite side files: a data connection may never point at them."""
    base = os.path.realpath(os.path.join(home, STORE_FILE))
    return tuple(base + suffix for suffix in _SIDE_FILES)


def _row(cursor: sqlite3.Cursor, values: tuple) -> dict:
    out = {}
    for (name, *_), value in zip(cursor.description, values):
        if name in _JSON_COLUMNS and value is not None:
            value = json.loads(value)
        elif name in _BOOL_COLUMNS:
            value = bool(value)
        out[name] = value
    return out


@functools.lru_cache(maxsize=2048)
def _shared_body(text: str) -> dict:
    """A version body decoded once per distinct text (versions are immutable but for cache_ttl/mcp, which change
    the text): content-keyed, so no invalidation is needed; the dict is shared and must not be changed."""
    return json.loads(text)


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class SqliteStore(Store):
    """Store on a SQLite file; safe across threads (one connection each) and processes (WAL + IMMEDIATE).

    Its SQL is written to run on PostgreSQL too (`?` placeholders aside): store/postgres.py reuses every method
    that is not plumbing. Keep new methods portable, or override them there."""

    _UNLIMITED = "-1"  # LIMIT with no limit (PostgreSQL: ALL)

    def __init__(self, home: str, audit_limit: int = 500, create: bool = True):
        """`create=False` (a `qag serve` worker: the master created the store) opens only an existing file."""
        self.audit_limit = audit_limit
        self.path = os.path.join(home, STORE_FILE)
        if create:
            os.makedirs(home, mode=0o700, exist_ok=True)
            # Owner-only from the first byte: the store holds connection passwords. SQLite gives its -wal and
            # -shm files the database file's mode. Only a missing file is opened here: closing any descriptor of
            # a file drops every POSIX lock this process holds on it, so opening an existing store beside a SQLite
            # connection already using it would silently take that connection's locks away.
            try:
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            except FileExistsError:
                pass
        elif not os.path.exists(self.path):
            raise StoreError(f"the store {self.path} is gone since the server started (moved or deleted); restore "
                             f"it, or restart the server to begin an empty store")
        self._local = threading.local()
        self._migrate()

    # --- plumbing --------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "pid", None) != os.getpid():
            # A connection opened before fork is never used after it: each process opens its own. mode=rw: a
            # store file that vanished (moved, deleted) is an open error here (503), never a new empty file at
            # the path, beside the old file's -wal and -shm, that later openers would take for the store.
            try:
                conn = sqlite3.connect(f"file:{quote(self.path)}?mode=rw", uri=True, timeout=5.0,
                                       isolation_level=None, check_same_thread=True)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the store {self.path}: {exc}") from None
            conn.row_factory = _row
            self._local.ident = _identity(self.path) or (-1, -1)   # the file this connection writes
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
            self._local.pid = os.getpid()
            self._local.depth = 0
        return conn

    def _on_the_store(self, conn: sqlite3.Connection) -> sqlite3.Connection:
        """This thread's connection for a write, if it is on the file at the store's path now; else a StoreError
        (503): a connection to a file deleted since writes where nothing will ever read it (a change acknowledged,
        then lost at the next restart), and one replaced under the server (a restore) shares the old file's -wal
        and -shm with it, mixing the two. A file put back (the same inode) is written again. One stat() a write."""
        if _identity(self.path) != self._local.ident:
            raise StoreError(f"the store {self.path} was moved, deleted or replaced since the server opened it; put "
                             f"it back, or restart the server (restore a store with the server stopped)")
        return conn

    def describe(self) -> str:
        return self.path

    # What SQLite says when the file is locked past the busy timeout, can't be opened or written, or the disk
    # failed: the store is unavailable, not broken.
    _UNAVAILABLE_TEXT = ("locked", "busy", "unable to open", "disk i/o", "readonly database", "disk is full")

    def unavailable(self, exc: BaseException) -> str | None:
        if isinstance(exc, sqlite3.OperationalError):
            text = str(exc)
            return text if any(part in text.lower() for part in self._UNAVAILABLE_TEXT) else None
        return super().unavailable(exc)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        conn = self._conn()
        if self._local.depth:
            self._local.depth += 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        conn = self._on_the_store(conn)
        conn.execute("BEGIN IMMEDIATE")
        self._local.depth = 1
        try:
            yield
            conn.execute("COMMIT")
        except BaseException:
            # Also when COMMIT itself failed: a transaction left open would hold the write lock for good.
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            self._local.depth = 0

    def _all(self, sql: str, args: tuple = ()) -> list[dict]:
        return self._conn().execute(sql, args).fetchall()

    def _one(self, sql: str, args: tuple = ()) -> dict | None:
        return self._conn().execute(sql, args).fetchone()

    def _run(self, sql: str, args: tuple = ()) -> int:
        conn = self._conn()
        if not self._local.depth:
            conn = self._on_the_store(conn)     # a write of its own (autocommit)
        return conn.execute(sql, args).rowcount

    def _migrate(self) -> None:
        conn = self._conn()
        with self.transaction():
            found = conn.execute("PRAGMA user_version").fetchone()["user_version"]
            if found > SCHEMA_VERSION:
                raise StoreError(f"the store {self.path} has schema version {found}, newer than this qag knows "
                                 f"({SCHEMA_VERSION}); upgrade qag or use another QAG_HOME")
            for step in MIGRATIONS[found:]:
                for statement in statements(step, "sqlite"):
                    conn.execute(statement)
            if found != SCHEMA_VERSION:
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            for statement in _config_triggers():
                conn.execute(statement)

    def ping(self, timeout: float) -> None:
        conn = sqlite3.connect(f"file:{quote(self.path)}?mode=ro", uri=True, timeout=timeout)
        try:
            conn.execute("SELECT count(*) FROM meta").fetchone()
        finally:
            conn.close()

    # --- meta ------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return row["value"] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._run("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                  (key, value))

    # --- connections -----------------------------------------------------------------------
    def list_connections(self) -> list[dict]:
        return self._all("SELECT * FROM connections ORDER BY name")

    def get_connection(self, name: str) -> dict | None:
        return self._one("SELECT * FROM connections WHERE name = ?", (name,))

    def put_connection(self, row: dict, *, create: bool) -> None:
        self._put("connections", _CONNECTION_COLUMNS, row, create)

    def delete_connection(self, name: str) -> bool:
        return self._run("DELETE FROM connections WHERE name = ?", (name,)) > 0

    def _put(self, table: str, columns: tuple[str, ...], row: dict, create: bool) -> None:
        values = tuple(_dump(row[c]) if c in _JSON_COLUMNS else row[c] for c in columns)
        if create:
            marks = ", ".join("?" * len(columns))
            self._run(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", values)
        else:
            sets = ", ".join(f"{c} = ?" for c in columns[1:])
            self._run(f"UPDATE {table} SET {sets} WHERE name = ?", values[1:] + values[:1])

    # --- saved queries ---------------------------------------------------------------------
    def _versions(self, name: str | None = None) -> dict[str, list[dict]]:
        where, args = ("WHERE query_name = ?", (name,)) if name is not None else ("", ())
        out: dict[str, list[dict]] = {}
        for row in self._all(f"SELECT * FROM query_versions {where} ORDER BY query_name, version", args):
            out.setdefault(row.pop("query_name"), []).append(_flatten_version(row))
        return out

    def list_queries(self) -> list[dict]:
        versions = self._versions()
        queries = self._all("SELECT * FROM queries ORDER BY name")
        for q in queries:
            q["versions"] = versions.get(q["name"], [])
        return queries

    def get_query(self, name: str) -> dict | None:
        q = self._one("SELECT * FROM queries WHERE name = ?", (name,))
        if q is not None:
            q["versions"] = self._versions(name).get(name, [])
        return q

    def get_query_head(self, name: str) -> dict | None:
        return self._one("SELECT q.name, q.collection, q.published, (SELECT max(version) FROM query_versions v "
                         "WHERE v.query_name = q.name) AS latest FROM queries q WHERE q.name = ?", (name,))

    def get_version(self, name: str, version: int) -> dict | None:
        row = self._one("SELECT * FROM query_versions WHERE query_name = ? AND version = ?", (name, version))
        if row is None:
            return None
        row.pop("query_name")
        return _flatten_version(row)

    def get_query_for_run(self, name: str, version: int | None) -> tuple[dict | None, dict | None]:
        """The hot path's read: the version body comes back shared (decoded once per distinct text) - callers
        must treat it as read-only."""
        row = self._one("SELECT q.name, q.collection, q.published, v.version, v.uuid, v.body AS body_json, "
                        "v.created_at, "
                        "v.last_modified_at FROM queries q LEFT JOIN query_versions v ON v.query_name = q.name "
                        "AND v.version = coalesce(?, q.published) WHERE q.name = ?", (version, name))
        if row is None:
            return None, None
        head = {"name": row["name"], "collection": row["collection"], "published": row["published"]}
        if row["version"] is None:
            return head, None
        body = _shared_body(row.pop("body_json"))
        return head, {"version": row["version"], "uuid": row["uuid"], **body, "created_at": row["created_at"],
                      "last_modified_at": row["last_modified_at"]}

    def create_query(self, name: str, collection: str | None, version: dict, publish: bool) -> None:
        with self.transaction():
            self._run("INSERT INTO queries (name, collection, published, example, created_at) VALUES (?, ?, ?, ?, ?)",
                      (name, collection, 1 if publish else None, int(version.get("example", False)),
                       version["created_at"]))
            self._insert_version(name, 1, version)

    def add_version(self, name: str, version: dict, publish: bool) -> int:
        with self.transaction():
            number = self._one("SELECT coalesce(max(version), 0) + 1 AS n FROM query_versions WHERE query_name = ?",
                               (name,))["n"]
            self._insert_version(name, number, version)
            if publish:
                self.set_published(name, number)
            return number

    def _insert_version(self, name: str, number: int, version: dict) -> None:
        body = {k: v for k, v in version.items() if k not in ("uuid", "created_at", "last_modified_at", "version")}
        self._run("INSERT INTO query_versions (query_name, version, uuid, body, created_at, last_modified_at) "
                  "VALUES (?, ?, ?, ?, ?, ?)",
                  (name, number, version["uuid"], _dump(body), version["created_at"], version["last_modified_at"]))

    def update_version(self, name: str, number: int, changes: dict) -> None:
        with self.transaction():
            row = self._one("SELECT body FROM query_versions WHERE query_name = ? AND version = ?", (name, number))
            body = row["body"]
            modified = changes.pop("last_modified_at")
            body.update(changes)
            self._run("UPDATE query_versions SET body = ?, last_modified_at = ? WHERE query_name = ? AND version = ?",
                      (_dump(body), modified, name, number))

    def delete_version(self, name: str, number: int) -> None:
        self._run("DELETE FROM query_versions WHERE query_name = ? AND version = ?", (name, number))
        # Its history goes with it; its runs stay events until the event log sweeps them.
        self._run("UPDATE runs SET h = 0 WHERE h = 1 AND q = (SELECT id FROM names WHERE name = ?) AND v = ?",
                  (name, number))

    def set_published(self, name: str, version: int | None) -> None:
        self._run("UPDATE queries SET published = ? WHERE name = ?", (version, name))

    def set_collection(self, name: str, collection: str | None) -> None:
        self._run("UPDATE queries SET collection = ? WHERE name = ?", (collection, name))

    def delete_query(self, name: str) -> bool:
        with self.transaction():
            self._run("UPDATE runs SET h = 0 WHERE h = 1 AND q = (SELECT id FROM names WHERE name = ?)", (name,))
            return self._run("DELETE FROM queries WHERE name = ?", (name,)) > 0

    def collections(self) -> set[str]:
        return {r["collection"] for r in self._all("SELECT DISTINCT collection FROM queries WHERE collection IS NOT NULL")}

    # --- API keys and roles ----------------------------------------------------------------
    def count_keys(self) -> int:
        return self._one("SELECT count(*) AS n FROM api_keys")["n"]

    def list_keys(self) -> list[dict]:
        return self._all("SELECT * FROM api_keys ORDER BY name")

    def get_key(self, name: str) -> dict | None:
        return self._one("SELECT * FROM api_keys WHERE name = ?", (name,))

    def key_by_hash(self, secret_hash: str) -> tuple[dict, bool] | None:
        # grants_json: the stored text as well, so callers can cache what they compile from it.
        # Only what authentication reads; grants stay JSON text (grants_json), compiled once per distinct text by
        # the caller, so no call decodes them.
        row = self._one("SELECT name, active, expires_at, previous_expires_at, grants AS grants_json, "
                        "previous_hash = ? AS is_previous FROM api_keys WHERE secret_hash = ? OR previous_hash = ?",
                        (secret_hash, secret_hash, secret_hash))
        return (row, bool(row.pop("is_previous"))) if row is not None else None

    def put_key(self, row: dict, *, create: bool) -> None:
        self._put("api_keys", _KEY_COLUMNS, row, create)

    def delete_key(self, name: str) -> bool:
        return self._run("DELETE FROM api_keys WHERE name = ?", (name,)) > 0

    def touch_key(self, name: str, previous: bool, at: str) -> None:
        column = "previous_last_used_at" if previous else "last_used_at"
        self._run(f"UPDATE api_keys SET {column} = ? WHERE name = ?", (at, name))

    def list_roles(self) -> list[dict]:
        return self._all("SELECT * FROM roles ORDER BY name")

    def get_role(self, name: str) -> dict | None:
        return self._one("SELECT * FROM roles WHERE name = ?", (name,))

    def put_role(self, row: dict, *, create: bool) -> None:
        self._put("roles", _ROLE_COLUMNS, row, create)

    def delete_role(self, name: str) -> bool:
        return self._run("DELETE FROM roles WHERE name = ?", (name,)) > 0

    # --- audit -----------------------------------------------------------------------------
    def audit(self, at: str, actor: str, via: str, action: str, target: str, changes: dict[str, Any]) -> None:
        with self.transaction():
            entry = self._conn().execute(
                "INSERT INTO audit_log (at, actor, via, action, target, changes) VALUES (?, ?, ?, ?, ?, ?)",
                (at, actor, via, action, target, _dump(changes))).lastrowid
            # Keep the newest entries only: ids never repeat (AUTOINCREMENT), so a cut by id is a cut by age.
            self._run("DELETE FROM audit_log WHERE id <= ?", (entry - self.audit_limit,))

    def audit_entries(self, action: str | None = None) -> Iterator[dict]:
        if action is None:
            return iter(self._all("SELECT * FROM audit_log ORDER BY id DESC"))
        return iter(self._all("SELECT * FROM audit_log WHERE action = ? ORDER BY id DESC", (action,)))

    # --- run history and the event log -------------------------------------------------------
    def name_ids(self, names: set[str]) -> dict[str, int]:
        if not names:
            return {}
        found = self._ids_of(sorted(names))
        missing = [n for n in sorted(names) if n not in found]
        if missing:
            self._intern(missing)
            found.update(self._ids_of(missing))
        return found

    def _ids_of(self, names: list[str]) -> dict[str, int]:
        marks = ", ".join("?" * len(names))
        return {r["name"]: r["id"] for r in self._all(f"SELECT id, name FROM names WHERE name IN ({marks})",
                                                      tuple(names))}

    def _intern(self, names: list[str]) -> None:
        with self.transaction():
            for name in names:
                self._run("INSERT INTO names (name) VALUES (?) ON CONFLICT (name) DO NOTHING", (name,))

    def version_uuids(self, pairs: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        out = {}
        for name, number in pairs:
            row = self._one("SELECT uuid FROM query_versions WHERE query_name = ? AND version = ?", (name, number))
            if row is not None:
                out[(name, number)] = row["uuid"]
        return out

    def add_runs(self, rows: list[tuple], *, limit: int, adhoc_limit: int, by_count: bool, events_since: int,
                 pause: Callable[[], None] | None = None, batch_id: str | None = None) -> None:
        if not rows:
            return
        segments = _run_segments(rows, pause)
        conn = self._conn()
        with self.transaction():
            if batch_id is not None and not self._first_write(batch_id):
                return
            for filled, values in segments:
                width = sum(filled)
                left, at = len(values) // width, 0
                for size in _RUN_CHUNKS:
                    while left >= size:
                        conn.execute(_insert_runs(filled, size), values[at * width:(at + size) * width])
                        at += size
                        left -= size
            if by_count:
                self._trim_after(rows, limit, adhoc_limit, events_since)

    def _trim_after(self, rows: list[tuple], limit: int, adhoc_limit: int, events_since: int) -> None:
        """After a batch (inside its transaction): each saved-query version it touched, and the ad-hoc runs if it
        held any, back to their count limits. Sorted, so concurrent writers take row locks in one order."""
        versions = {(row[2], row[3]) for row in rows if row[1] and row[2] is not None}
        for q, v in sorted(versions):
            self._trim("q = ? AND v = ?", (q, v), limit, events_since)
        if any(row[1] and row[2] is None for row in rows):
            self._trim("q IS NULL", (), adhoc_limit, events_since)

    def _trim(self, where: str, args: tuple, keep: int, events_since: int) -> None:
        """History beyond the newest `keep` of a version (or of ad-hoc runs) leaves history; a run that is
        also past the event retention goes altogether."""
        beyond = (f"SELECT id FROM runs WHERE h = 1 AND {where} ORDER BY seq DESC, id DESC "
                  f"LIMIT {self._UNLIMITED} OFFSET {int(keep)}")
        self._run(f"DELETE FROM runs WHERE id IN ({beyond}) AND at < ?", args + (events_since,))
        self._run(f"UPDATE runs SET h = 0 WHERE id IN ({beyond})", args)

    def prune_runs(self, *, events_since: int, history_since: int | None, batch: int) -> int:
        changed = 0
        with self.transaction():
            changed += self._run("DELETE FROM runs WHERE id IN (SELECT id FROM runs WHERE at < ? AND h = 0 "
                                 f"LIMIT {int(batch)})", (events_since,))
            if history_since is not None:
                changed += self._run("UPDATE runs SET h = 0 WHERE id IN (SELECT id FROM runs WHERE h = 1 AND "
                                     f"at < ? LIMIT {int(batch)})", (history_since,))
        return changed

    def history(self, where: dict, before: tuple[int, int] | None, limit: int) -> list[dict]:
        clauses, args = ["r.h = 1"], []
        if where.get("kind") == "saved":
            clauses.append("r.q IS NOT NULL")
        elif where.get("kind") == "adhoc":
            clauses.append("r.q IS NULL")
        for column, key in (("r.q", "query"), ("r.k", "key")):
            if where.get(key) is not None:
                clauses.append(f"{column} = (SELECT id FROM names WHERE name = ?)")
                args.append(where[key])
        if where.get("version") is not None:
            clauses.append("r.v = ?")
            args.append(where["version"])
        if where.get("ok") is not None:
            clauses.append("r.ok = ?")
            args.append(1 if where["ok"] else 0)
        if where.get("since") is not None:
            clauses.append("r.at >= ?")
            args.append(where["since"])
        if where.get("until") is not None:
            clauses.append("r.at < ?")
            args.append(where["until"])
        if before is not None:
            clauses.append("(r.seq, r.id) < (?, ?)")
            args.extend(before)
        return self._all(f"{_RUN_SELECT} WHERE {' AND '.join(clauses)} ORDER BY r.seq DESC, r.id DESC LIMIT ?",
                         tuple(args) + (int(limit),))

    def events_after(self, after_id: int, limit: int) -> list[dict]:
        """Event-log rows (every run, in history or not) with an id above `after_id`, lowest id first: the
        standalone events server's tail and a client's resume (contract 8.6)."""
        return self._all(f"{_RUN_SELECT} WHERE r.id > ? ORDER BY r.id LIMIT ?", (int(after_id), int(limit)))

    def last_event_id(self) -> int:
        """The highest event id so far (0 for none)."""
        rows = self._all("SELECT COALESCE(MAX(id), 0) AS last FROM runs")
        return int(rows[0]["last"])

    def run_stats(self, query: str | None = None) -> dict:
        where, args = ("AND q = (SELECT id FROM names WHERE name = ?)", (query,)) if query is not None else ("", ())
        out: dict = {}
        for row in self._all(f"SELECT (SELECT name FROM names WHERE id = q) AS name, v, count(*) AS n, "
                             f"max(at) AS last FROM runs WHERE h = 1 AND q IS NOT NULL {where} GROUP BY q, v",
                             args):
            last, counts = out.get(row["name"], (None, {}))
            counts[row["v"]] = row["n"]
            out[row["name"]] = (max(last, row["last"]) if last is not None else row["last"], counts)
        return out

    def events(self, after: int, limit: int) -> list[dict]:
        return self._all(f"{_RUN_SELECT} WHERE r.id > ? ORDER BY r.id LIMIT ?", (int(after), int(limit)))

    def _first_write(self, write_id: str) -> bool:
        """Inside a batch's transaction: record its id; False when it is there already (the batch was applied, and
        is being sent again because the reply to its commit was lost)."""
        return self._run("INSERT INTO applied_writes (id, at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING",
                         (write_id, int(time.time()))) == 1

    def prune_writes(self, before: int) -> int:
        return self._run("DELETE FROM applied_writes WHERE at < ?", (before,))

    # --- quota counts ------------------------------------------------------------------------
    def add_quota_usage(self, increments: list[tuple[str, str, str, str, int, int]], at: int,
                        write_id: str | None = None) -> None:
        # One statement per caller and period (a handful per flush), through _run so the PostgreSQL store that
        # inherits this SQL runs it too.
        if not increments:
            return
        with self.transaction():
            if write_id is not None and not self._first_write(write_id):
                return
            for w, c, p, d, calls, rows in increments:
                self._run("INSERT INTO quota_usage (workspace, caller, per, period, calls, row_count, updated_at) "
                          "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (workspace, caller, per, period) DO UPDATE SET "
                          "calls = quota_usage.calls + excluded.calls, "
                          "row_count = quota_usage.row_count + excluded.row_count, updated_at = excluded.updated_at",
                          (w, c, p, d, calls, rows, at))

    def quota_counts(self, keys: list[tuple[str, str, str, str]]) -> dict[tuple[str, str, str, str], tuple[int, int]]:
        out = {}
        for key in keys:
            row = self._one("SELECT calls, row_count FROM quota_usage WHERE workspace = ? AND caller = ? AND per = ? "
                            "AND period = ?", key)
            if row is not None:
                out[key] = (row["calls"], row["row_count"])
        return out

    def quota_usage_in(self, periods: list[tuple[str, str]]) -> list[dict]:
        out = []
        for per, period in periods:
            out += self._all("SELECT workspace, caller, per, period, calls, row_count AS rows, updated_at "
                             "FROM quota_usage WHERE per = ? AND period = ?", (per, period))
        out.sort(key=lambda r: (r["workspace"], r["caller"], r["per"]))
        return out

    def prune_quota_usage(self, before: int) -> int:
        with self.transaction():
            return self._run("DELETE FROM quota_usage WHERE updated_at < ?", (before,))

    # --- raw table access (qag store copy) -------------------------------------------------------
    def raw_rows(self, table: str) -> tuple[list[str], list[tuple]]:
        """Every row of a table as stored (JSON as text), with the column names."""
        cur = self._conn().cursor()
        cur.row_factory = None
        cur.execute(f'SELECT * FROM "{table}"')
        return [d[0] for d in cur.description], cur.fetchall()

    def insert_raw(self, table: str, columns: list[str], rows: list[tuple]) -> None:
        """Rows as raw_rows gives them, inside a transaction(); a 12-hex text request id packed as on write."""
        if "rid" in columns:
            at = columns.index("rid")
            rows = [row[:at] + (_pack_rid(row[at]),) + row[at + 1:] for row in rows]
        marks = ", ".join("?" * len(columns))
        self._conn().executemany(f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({marks})', rows)

    def after_copy(self, tables: list[str]) -> None:
        """Nothing to do: AUTOINCREMENT moves past explicitly inserted ids by itself."""


def _pack_rid(value):
    if isinstance(value, str) and len(value) == 12 and all(c in "0123456789abcdef" for c in value):
        return bytes.fromhex(value)
    return value


# Rows per INSERT of runs: a batch goes in as a sum of these, so a handful of statement texts serve every batch
# size and stay in the connection's statement cache (a new multi-row text costs a prepare of about 27k
# instructions per row). 256 rows of 16 values stay far below SQLite's variable limit.
_RUN_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
def _identity(path: str) -> tuple[int, int] | None:
    """(device, inode) of the file at `path`, None when there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _run_segments(rows: list[tuple], pause: Callable[[], None] | None = None) -> list[tuple[tuple[bool, ...], list]]:
    """Consecutive runs that fill the same columns (so ids keep the batch's order), as (filled, their values
    flattened). A run leaves most columns NULL, their default: leaving them out of the INSERT keeps them off
    Python's sqlite3 adapter lookup (about 3k instructions per value), which it takes for None and bytes but not
    for int, float, str or bytearray. So a binary request id (or trace id) goes in as a bytearray: the same BLOB.
    One plain loop per row (no groupby, map or compress): about a tenth of their cost, compiled. Made before the
    batch's transaction, with `pause` every PAUSE_ROWS rows (Store.add_runs)."""
    segments: list = []
    filled: tuple = ()
    values: list = []
    since_pause = 0
    for row in rows:
        if pause is not None:
            since_pause += 1
            if since_pause == PAUSE_ROWS:
                since_pause = 0
                pause()
        pattern = tuple([value is not None for value in row])
        if pattern != filled:
            if values:
                segments.append((filled, values))
            filled, values = pattern, []
        for value in row:
            if value is not None:
                values.append(bytearray(value) if type(value) is bytes else value)
    if values:
        segments.append((filled, values))
    return segments


@functools.lru_cache(maxsize=256)
def _insert_runs(filled: tuple[bool, ...], count: int) -> str:
    columns = [name for name, on in zip(RUN_COLUMNS, filled) if on]
    one = "(" + ", ".join("?" * len(columns)) + ")"
    return f"INSERT INTO runs ({', '.join(columns)}) VALUES " + ", ".join([one] * count)


_RUN_SELECT = ("SELECT r.id, r.at, r.h, qn.name AS query, r.v, cn.name AS connection, kn.name AS key_name, r.rid, "
               "r.ok, r.tr, r.n, r.ms, r.ser, en.name AS code, r.err, r.sql, r.x, r.seq, r.trace FROM runs r "
               "LEFT JOIN names qn ON qn.id = r.q LEFT JOIN names cn ON cn.id = r.c LEFT JOIN names kn ON kn.id = r.k "
               "LEFT JOIN names en ON en.id = r.code")


# Any change to configuration rows moves meta.config_generation, also one made straight in the file by another
# program: the metadata cache polls it (qag/cache/metadata.py). Usage stamps (last_used_at) don't move it.
_CONFIGURATION = {"connections": "", "queries": "", "query_versions": "", "roles": "",
                  "api_keys": " OF name, secret_hash, previous_hash, previous_expires_at, grants, active, expires_at, "
                              "created_from_role"}


def _config_triggers() -> list[str]:
    bump = ("INSERT INTO meta (key, value) VALUES ('config_generation', '1') ON CONFLICT (key) DO UPDATE SET "
            "value = CAST(CAST(value AS INTEGER) + 1 AS TEXT)")
    return [f"CREATE TRIGGER IF NOT EXISTS qag_config_{table}_{op.lower()} AFTER {op}"
            f"{columns if op == 'UPDATE' else ''} ON {table} BEGIN {bump}; END"
            for table, columns in _CONFIGURATION.items() for op in ("INSERT", "UPDATE", "DELETE")]


def _flatten_version(row: dict) -> dict:
    body = row.pop("body")
    return {"version": row["version"], "uuid": row["uuid"], **body,
            "created_at": row["created_at"], "last_modified_at": row["last_modified_at"]}
