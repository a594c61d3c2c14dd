"""Reading a MySQL/MariaDB database's tables and columns from information_schema, and the cache in front of it.

Names are always bound values, never interpolated. The cache serves a read for TTL seconds and has a background
thread read it again after REFRESH_AFTER, so a steady reader (masking, the schema routes) never waits for
information_schema once warm.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import NamedTuple

from ..sql.functions import Catalog
from .pool import settings_key

MAX_TABLES = 1000
TTL = 60.0             # seconds a read is served from the cache
REFRESH_AFTER = 45.0   # ... and after this many a background thread reads it again
ENTRIES = 64           # (settings, database) pairs kept per backend


def _nameable(*names: str) -> bool:
    """Whether each could name a database or table: MySQL/MariaDB hold names in utf8mb3, so a character past U+FFFF
    names nothing, and comparing one with the catalog's utf8mb3 columns is an error ("Illegal mix of
    collations") rather than no match."""
    return all(max(name, default="\0") <= "\uffff" for name in names)


def read(cursor, database: str) -> dict:
    """{"tables": [...], "truncated": bool} as contract 5.2's schema route, on a buffered qag cursor."""
    if not _nameable(database):
        return {"tables": [], "truncated": False}
    cursor.execute("SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                   "ORDER BY TABLE_NAME LIMIT %s", (database, MAX_TABLES + 1))
    objects = cursor.page(0, 0)
    cursor.finish()
    truncated = len(objects) > MAX_TABLES
    objects = objects[:MAX_TABLES]
    columns: dict[str, list] = {t[0]: [] for t in objects}
    if objects:
        cursor.execute("SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, ORDINAL_POSITION, COLUMN_KEY "
                       "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME <= %s "
                       "ORDER BY TABLE_NAME, ORDINAL_POSITION", (database, objects[-1][0]))
        column_rows = cursor.page(0, 0)
        cursor.finish()
        cursor.execute("SELECT TABLE_NAME, COLUMN_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, "
                       "REFERENCED_COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                       "WHERE TABLE_SCHEMA = %s AND REFERENCED_TABLE_NAME IS NOT NULL", (database,))
        foreign = {(t, c): {"table": rt if rs == database else f"{rs}.{rt}", "column": rc}
                   for t, c, rs, rt, rc in cursor.page(0, 0)}
        cursor.finish()
        for table, column, ctype, nullable, position, ckey in column_rows:
            if table in columns:
                columns[table].append({"name": column, "type": ctype, "nullable": nullable == "YES",
                                       "position": int(position), "primary_key": ckey == "PRI",
                                       "foreign_key": foreign.get((table, column))})
    tables = [{"name": name, "schema": database, "type": "view" if kind == "VIEW" else "table",
               "columns": columns[name]} for name, kind in objects]
    return {"tables": tables, "truncated": truncated}


def read_ddl(cursor, database: str, table: str) -> str | None:
    """SHOW CREATE of one table or view of `database`, None when there is none. The caller's name is only ever a
    bound value: the catalog finds the table (exactly, or as the server folds names when lower_case_table_names
    is set), and the statement names the table as the catalog spells it, quoted."""
    if not _nameable(database, table):
        return None
    cursor.execute("SELECT TABLE_NAME, @@lower_case_table_names FROM information_schema.TABLES "
                   "WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s", (database, table))
    rows = cursor.page(0, 0)
    cursor.finish()
    names = [r[0] for r in rows if r[0] == table]
    if not names and rows and int(rows[0][1]) != 0:
        names = [r[0] for r in rows if r[0].lower() == table.lower()]
    if len(names) != 1:
        return None
    cursor.execute(f"SHOW CREATE TABLE {_quoted(database)}.{_quoted(names[0])}")
    found = cursor.page(0, 0)
    cursor.finish()
    return found[0][1] if found else None


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def read_functions(cursor, database: str):
    """functions.Catalog (issue 18) on a buffered qag cursor: stored functions of `database` and loadable
    functions (mysql.func, when the connection's user may read it), lower-case. MySQL/MariaDB list no native
    functions, so `builtins` is None (the hand-written list decides which names are built-ins)."""
    names: set[str] = set()
    if database and _nameable(database):
        cursor.execute("SELECT ROUTINE_NAME FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s "
                       "AND ROUTINE_TYPE = 'FUNCTION'", (database,))
        names.update(str(row[0]).lower() for row in cursor.page(0, 0))
        cursor.finish()
    try:
        cursor.execute("SELECT name FROM mysql.func")
        names.update(str(row[0]).lower() for row in cursor.page(0, 0))
        cursor.finish()
    except Exception as exc:  # no SELECT on mysql.func: only an administrator can add loadable functions
        if type(exc).__module__.split(".")[0] not in ("MySQLdb", "_mysql"):
            raise
    return Catalog(None, frozenset(names))


class SchemaCache:
    """Schema reads by (settings, database): bounded, served for `ttl` seconds, read again in the background
    after `refresh_after`; clear() forgets everything (a connection changed)."""

    def __init__(self, ttl: float = TTL, refresh_after: float = REFRESH_AFTER, entries: int = ENTRIES):
        self.ttl = ttl
        self.refresh_after = refresh_after
        self.entries = entries
        self._lock = threading.Lock()
        self._items: OrderedDict = OrderedDict()   # key → [value, read at, refreshing]
        self._generation = 0

    def get(self, key, load):
        now = time.monotonic()
        refresh = False
        with self._lock:
            item = self._items.get(key)
            if item is not None and now - item[1] < self.ttl:
                self._items.move_to_end(key)
                if now - item[1] >= self.refresh_after and not item[2]:
                    item[2] = refresh = True
                value = item[0]
            else:
                value = None
            generation = self._generation
        if value is not None:
            if refresh:
                threading.Thread(target=self._refresh, args=(key, load, generation), daemon=True,
                                 name="qag-mysql-schema").start()
            return value
        value = load()
        self._put(key, value, generation)
        return value

    def _refresh(self, key, load, generation: int) -> None:
        try:
            value = load()
        except Exception:  # the entry expires and the next reader sees the error itself
            with self._lock:
                item = self._items.get(key)
                if item is not None:
                    item[2] = False
            return
        self._put(key, value, generation)

    def _put(self, key, value, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return      # cleared meanwhile: this read may be of the old settings
            self._items[key] = [value, time.monotonic(), False]
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._generation += 1


# ------------------------------------------------------------------------------------------- server facts


class ServerNames(NamedTuple):
    """How a server reads names and text, read once per connection when it is opened (never per call)."""

    lower_case_table_names: int     # 0: table and database names are case-sensitive (Linux default)
    sql_mode: frozenset             # e.g. {"ANSI_QUOTES", "NO_BACKSLASH_ESCAPES"}

    @property
    def names_exact(self) -> bool:
        return self.lower_case_table_names == 0

    @property
    def text_read_by_default(self) -> bool:
        """Quotes and backslashes read as sqlglot's MySQL reading does (masking's trace and rewrite): not under
        ANSI_QUOTES, where "x" is a name, nor NO_BACKSLASH_ESCAPES, where '\\' ends a string."""
        return not (self.sql_mode & _OTHER_READINGS)

    @property
    def grammar_otherwise(self) -> bool:
        """MariaDB's sql_mode=ORACLE switches the server to another parser (sequences as `seq.nextval`, PL/SQL
        forms): no reading of qag's follows it."""
        return "ORACLE" in self.sql_mode


_OTHER_READINGS = frozenset(("ANSI_QUOTES", "NO_BACKSLASH_ESCAPES", "ORACLE"))


# The query that reads them (one round trip when a connection is opened).
FACTS_QUERY = "SELECT @@lower_case_table_names, @@session.sql_mode"
_FACTS: dict = {}            # settings_key(fields) -> ServerNames, as the last opened connection reported
_FACTS_MAX = 1024
_PROBE: list = []            # [callable(fields)]: opens (and pools) a connection so its facts are known


def parse_facts(row) -> ServerNames:
    """The facts from FACTS_QUERY's row; anything unreadable reads names exactly (the stricter way)."""
    try:
        lctn, mode = row
    except (TypeError, ValueError):
        lctn, mode = None, ""
    if isinstance(mode, bytes):
        mode = mode.decode("utf8", "replace")
    try:
        lctn = int(lctn)
    except (TypeError, ValueError):
        lctn = 0      # unknown: read names exactly, the stricter comparison
    return ServerNames(lctn, frozenset(m.strip().upper() for m in str(mode or "").split(",") if m.strip()))


def remember(ident, facts: ServerNames) -> None:
    if len(_FACTS) >= _FACTS_MAX and ident not in _FACTS:
        _FACTS.clear()
    _FACTS[ident] = facts


def set_probe(probe) -> None:
    """The backend that can open a connection to learn its facts (the worker's MysqlBackend)."""
    _PROBE[:] = [probe]


def server_names(fields: dict) -> ServerNames | None:
    """The facts of the server behind these fields: cached from the last connection opened with them, else
    learned by opening one through the backend (which pools it for the call that asked); None when no backend
    can tell (the caller then reads names exactly, the stricter way)."""
    ident = settings_key(fields)
    facts = _FACTS.get(ident)
    if facts is None and _PROBE:
        _PROBE[0](fields)
        facts = _FACTS.get(ident)
    return facts
