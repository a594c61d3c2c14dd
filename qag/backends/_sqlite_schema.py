"""What qag judges from a SQLite file's schema (qag/backends/sqlite.py's authorizer), read once per schema version.

A masked call and a write call with restricted operations are judged partly on the file's schema: which tables
are virtual, which FTS table reads another table's content, which are shadow tables, which declare ON CONFLICT
REPLACE, the views and triggers; and partly on SQLite's compile of the statement on an in-memory copy of the
file's tables and views (`Facts.compile`). All of it depends only on the schema, so it is read once and kept,
keyed on the file (path, device, inode) and its `PRAGMA schema_version`, which SQLite increments on every change
of the schema, by any connection or process. A warm call reads that pragma alone: no schema read, no tokenizing,
no copy built (the copies are kept too, a few per schema, each used by one call at a time).

What the key can't see, and so what is never cached: facts read inside a call that changed the schema itself (its
transaction may roll back, and another change would then bring the same version with another schema), and a
change made with `writable_schema`, which SQLite doesn't count (run() forgets the file after a call setting it or
`schema_version`). A file replaced in place (same inode) by another of the same schema_version is read as the
old one until its schema changes: replace a connection's file by renaming a new one over it.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections import OrderedDict

from ..sql import lexer
from ..sql.names import ascii_lower

# Functions of compiled-in extensions (FTS3/4/5, R*Tree) that only read the virtual table they are called on
# (its reads are reported to the authorizer as table reads); the copies answer them with nothing.
EXTENSION_READS = frozenset({"match", "bm25", "highlight", "snippet", "offsets", "matchinfo", "rtreecheck",
                             "rtreedepth", "rtreenode", "fts5_source_id"})

ENTRIES = 32            # schema versions kept (files x versions), least recently used dropped first
COPIES = 4              # idle in-memory copies kept per schema version, over all its variants

# What compiling a statement reports without leaving state on the copy: a copy that reported anything else (a
# pragma, which SQLite may apply while compiling) is closed, not reused.
_INERT = frozenset({sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
                    sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})


class Facts:
    """One schema version of one file, as the authorizer judges it (names ASCII-folded, as SQLite compares them).

    - ddl: (name, sql) of the tables and views, in creation order (the copies' schema);
    - kinds: view or trigger, by name; own: the tables' and views' names;
    - virtual: the virtual tables' names; modules: their modules, by name (folded; None when the statement doesn't
      say); content: those over another table's content (FTS `content=`);
    - replacing: the plain tables declaring ON CONFLICT REPLACE on a PRIMARY KEY or UNIQUE constraint;
    - shadows: the shadow tables, qualified (None: SQLite before 3.37 doesn't say); listed: the virtual tables
      pragma table_list names;
    - columns: a virtual table's (name, hidden) columns (None: the library can't open it).
    """

    __slots__ = ("ddl", "kinds", "own", "virtual", "modules", "content", "replacing", "shadows", "listed", "columns",
                 "_idle", "_lock")

    def __init__(self, conn):
        rows = conn.execute("SELECT type, name, sql FROM main.sqlite_schema ORDER BY rowid").fetchall()
        self.ddl = tuple((name, sql) for kind, name, sql in rows if kind in ("table", "view") and sql is not None
                         and not ascii_lower(name).startswith("sqlite_"))
        self.kinds = {ascii_lower(name): kind for kind, name, _ in rows if kind in ("view", "trigger")}
        self.own = frozenset(ascii_lower(name) for kind, name, _ in rows if kind in ("table", "view"))
        tables = {ascii_lower(name): sql for kind, name, sql in rows if kind == "table" and sql is not None}
        self.virtual = frozenset(name for name, sql in tables.items() if is_virtual(sql))
        self.modules = {name: module_of(tables[name]) for name in self.virtual}
        self.content = frozenset(name for name in self.virtual if reads_content(tables[name]))
        self.replacing = frozenset(name for name, sql in tables.items()
                                   if name not in self.virtual and declares_replace(sql))
        try:
            listed = conn.execute("SELECT lower(name), type FROM pragma_table_list WHERE schema = 'main' AND type "
                                  "IN ('shadow', 'virtual')").fetchall()
            self.shadows = frozenset(f"main.{name}" for name, kind in listed if kind == "shadow")
            self.listed = frozenset(name for name, kind in listed if kind == "virtual")
        except sqlite3.Error:
            self.shadows, self.listed = None, frozenset()
        self.columns = {}
        for name in self.virtual:
            try:
                self.columns[name] = tuple(conn.execute("SELECT name, hidden FROM pragma_table_xinfo(?)", (name,)))
            except sqlite3.Error:
                self.columns[name] = None
        self._idle: list = []             # (variant, copy) not in use
        self._lock = threading.Lock()

    def compile(self, plain: dict, statement, record=None, own: frozenset = frozenset()) -> str | None:
        """SQLite's error compiling the statement on an in-memory copy of the tables and views, each table named in
        `plain` (folded) made a plain table of its definition; None when it compiles. `record`: the copy's
        authorizer while it compiles. The FTS and R*Tree query functions and qag's own functions of the call
        (`own`: masking's) are there, answering nothing: a plain table can stand for a virtual one in MATCH."""
        variant = tuple(sorted(plain.items()))
        copy = self._borrow(variant)
        inert = [True]

        def watch(action, arg1, arg2, dbname, source):
            if action not in _INERT:
                inert[0] = False
            return sqlite3.SQLITE_OK if record is None else record(action, arg1, arg2, dbname, source)

        try:
            for name in own:
                copy.create_function(name, -1, _nothing)
            copy.set_authorizer(watch)
            # EXPLAIN compiles the statement without running it.
            copy.execute("EXPLAIN " + statement[0], statement[1]).fetchall()
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            return str(exc)
        finally:
            copy.set_authorizer(None)
            self._give_back(variant, copy, inert[0])
        return None

    def _borrow(self, variant: tuple):
        with self._lock:
            for i, (kept, copy) in enumerate(self._idle):
                if kept == variant:
                    del self._idle[i]
                    return copy
        plain = dict(variant)
        copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        for name in EXTENSION_READS:
            copy.create_function(name, -1, _nothing)
        for name, text in self.ddl:
            definition = plain.get(ascii_lower(name))
            if definition is not None:
                text = f"CREATE TABLE {quoted(name)}{definition}"
            try:
                copy.execute(text)
            except sqlite3.Error:
                pass    # a virtual table's shadow table, made with it
        return copy

    def _give_back(self, variant: tuple, copy, reusable: bool) -> None:
        with self._lock:
            if reusable and len(self._idle) < COPIES:
                self._idle.append((variant, copy))
                return
        copy.close()


_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def facts(conn, path: str, cacheable: bool = True) -> Facts:
    """The facts of the connection's file as it stands in the connection's transaction; its authorizer must be off
    (qag's own reading). `cacheable` False: read and not kept (the call changed the schema itself)."""
    version = conn.execute("PRAGMA main.schema_version").fetchone()[0]
    try:
        stat = os.stat(path)
        key = (path, stat.st_dev, stat.st_ino, version)
    except OSError:
        key = None
    if key is not None:
        with _cache_lock:
            found = _cache.get(key)
            if found is not None:
                _cache.move_to_end(key)
                return found
    found = Facts(conn)
    if key is not None and cacheable:
        with _cache_lock:
            _cache[key] = found
            while len(_cache) > ENTRIES:
                _cache.popitem(last=False)
    return found


def forget(path: str) -> None:
    """Drop every version kept for the file (its schema may have changed without SQLite counting it)."""
    with _cache_lock:
        for key in [key for key in _cache if key[0] == path]:
            del _cache[key]


def is_virtual(ddl: str) -> bool:
    words = [t.value.lower() for t in lexer.significant(lexer.tokenize(ddl, "sqlite"))[:3] if t.kind == lexer.WORD]
    return words[:2] == ["create", "virtual"]


def module_of(ddl: str) -> str | None:
    """The module a CREATE VIRTUAL TABLE statement names after USING (a name, quoted or not, folded as SQLite finds
    modules); None when there is none to read."""
    sig = lexer.significant(lexer.tokenize(ddl, "sqlite"))
    for i, t in enumerate(sig[:-1]):
        if t.kind == lexer.WORD and t.value == "using":
            name = sig[i + 1]
            text = ddl[name.start:name.end]
            if name.kind == lexer.WORD:
                return ascii_lower(text)
            if name.kind in (lexer.QIDENT, lexer.STRING) and len(text) >= 2:
                close = "]" if text[0] == "[" else text[0]
                return ascii_lower(text[1:-1].replace(close * 2, close) if close != "]" else text[1:-1])
            return None
    return None


def declares_replace(ddl: str) -> bool:
    """Whether a CREATE TABLE declares ON CONFLICT REPLACE on a PRIMARY KEY or UNIQUE constraint (the only other
    constraints that take it, NULL and NOT NULL, replace a value, not a row). Read from SQLite's own record of the
    table; a word sequence elsewhere that reads alike only makes the answer stricter."""
    words = [t.value.lower() for t in lexer.significant(lexer.tokenize(ddl, "sqlite")) if t.kind == lexer.WORD]
    return any(words[i:i + 3] == ["on", "conflict", "replace"] and (i == 0 or words[i - 1] != "null")
               for i in range(len(words)))


def reads_content(ddl: str) -> bool:
    """Whether a virtual table's CREATE statement names another table as its content (FTS4/FTS5 `content=`);
    `content=''` (contentless) holds none. FTS5 takes any prefix of an option's name (`c='src'`, `cont='src'`:
    content is the first option it tries that starts so), and a quoted name: every such spelling counts."""
    sig = lexer.significant(lexer.tokenize(ddl, "sqlite"))
    for i, t in enumerate(sig[:-2]):
        if t.kind == lexer.WORD:
            name = t.value.lower()
        elif t.kind in (lexer.QIDENT, lexer.STRING):
            name = ddl[t.start + 1:t.end - 1].lower()
        else:
            continue
        if name and "content".startswith(name) and sig[i + 1].value == "=":
            value = sig[i + 2]
            if not (value.kind == lexer.STRING and value.end - value.start <= 2):
                return True
    return False


def quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _nothing(*_args):
    return None
