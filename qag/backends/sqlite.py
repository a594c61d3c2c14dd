"""SQLite connections: a file handle per call, the engine's authorizer as reader of record, bounded values.

Read-only calls open the file with mode=ro; the time limit is a progress handler; SQLite's length limits bound
what one value (and so one built-in call) can cost.
"""

from __future__ import annotations

import os
import sqlite3
import time
from urllib.parse import quote

from ..errors import QagError
from ..sql.functions import GENERATORS, SQLITE_CHANGING, sqlite_library_builtins
from ..sql.names import ascii_lower
from ..sql.writes import write_op_not_allowed_message
from . import _sqlite_schema as schema
from ._sqlite_schema import EXTENSION_READS as _EXTENSION_READS, quoted as _quoted
from .base import Backend, Call, Result, connection_failed, query_failed, refused_write_of, timeout_error

# The time limit is checked every this many VM steps: a step can be one whole built-in call over a large value,
# so fewer steps bound the overrun better (a check costs one Python call per ~20-50 us of VM work).
_PROGRESS_STEPS = 1_000

# SQLite's own bounds, set on every connection. A built-in runs to its end between two progress-handler
# checks, and a few are quadratic in their arguments' lengths (instr, replace, two-argument trim; LIKE/GLOB in
# value x pattern): measured on this machine, instr() over two values of 1 MiB and 0.5 MiB takes ~5 s, over
# 4 MiB and 2 MiB ~270 s. So the value bound is what bounds one call's time, not only its memory; 1 MiB (the
# default request-body limit; the demo's largest value is under 200 bytes) keeps the worst single call to a few
# seconds. The pattern bound keeps value x pattern to ~1 s.
LENGTH_LIMIT = 1 << 20
SQL_LENGTH_LIMIT = 16 << 20
LIKE_PATTERN_LIMIT = 1000
_LIMITS = ((sqlite3.SQLITE_LIMIT_LENGTH, LENGTH_LIMIT), (sqlite3.SQLITE_LIMIT_SQL_LENGTH, SQL_LENGTH_LIMIT),
           (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, LIKE_PATTERN_LIMIT), (sqlite3.SQLITE_LIMIT_ATTACHED, 0))

# _EXTENSION_READS: functions of compiled-in extensions (FTS3/4/5, R*Tree) that only read the virtual table they
# are called on. Any other function that is not a built-in of the running library is refused on a read-only call:
# it is unknown, so it may write (FTS3's optimize() does).
_BUILTINS: frozenset | None = None


def builtin_functions() -> frozenset:
    """The running library's built-ins (qag.sql.functions.sqlite_library_builtins), kept here for the authorizer."""
    global _BUILTINS
    if _BUILTINS is None:
        _BUILTINS = sqlite_library_builtins()
    return _BUILTINS


# Actions a read-only statement may report: its reading, and the engine's own registration of an eponymous
# virtual table (json_each, pragma_*), which SQLite reports as an UPDATE of its schema table. A user's UPDATE
# of the schema table is refused by SQLite itself (no writable_schema: setting it is a write pragma).
_READ_ACTIONS = frozenset({sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                           sqlite3.SQLITE_RECURSIVE})
_SCHEMA_TABLES = frozenset(("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"))
# Pragmas whose argument names an object to describe, not a value to set. Any other pragma is a read only in its
# query form (no argument).
_DESCRIBING_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_info", "index_xinfo", "index_list",
                                 "foreign_key_list", "foreign_key_check", "integrity_check", "quick_check",
                                 "table_list"})
# Pragmas that act when queried without an argument.
_ACTING_PRAGMAS = frozenset({"optimize", "shrink_memory", "incremental_vacuum", "wal_checkpoint"})
# Pragmas whose value is the library's, not the connection's (SQLite's pragma docs): setting one changes every
# connection of the worker, the store's included (hard_heap_limit=200000 made each later call a MemoryError), so
# no caller may set one, an administrator included. Querying them only reads.
_PROCESS_PRAGMAS = frozenset({"hard_heap_limit", "soft_heap_limit", "temp_store_directory", "data_store_directory"})
# Actions that change the schema (a call's facts read after them may roll back: not kept), and pragmas that change
# it without SQLite counting it in schema_version (the file's kept facts are dropped after the call).
_UNCOUNTED_PRAGMAS = frozenset({"schema_version", "writable_schema"})
_SCHEMA_ACTIONS = frozenset(getattr(sqlite3, "SQLITE_" + name) for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TRIGGER", "CREATE_VIEW", "CREATE_VTABLE", "DROP_INDEX", "DROP_TABLE",
    "DROP_TRIGGER", "DROP_VIEW", "DROP_VTABLE", "ALTER_TABLE", "ANALYZE"))
_ACTION_NAMES = {getattr(sqlite3, "SQLITE_" + name): name.replace("_", " ") for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX",
    "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "INSERT", "PRAGMA",
    "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH", "ALTER_TABLE", "REINDEX", "ANALYZE",
    "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT", "RECURSIVE")}

_TABLE_ACTIONS = {sqlite3.SQLITE_READ, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}
_ROW_WRITES = frozenset({sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE})

# The write operations (qag/sql/writes.py's names, which a key's allowed_write_ops lists) each write action may
# stand for: a call allowed any one of them may do the action. SQLite reports REPLACE INTO as an INSERT.
_ACTION_OPS = {sqlite3.SQLITE_INSERT: frozenset({"insert", "replace"}),
               sqlite3.SQLITE_UPDATE: frozenset({"update"}), sqlite3.SQLITE_DELETE: frozenset({"delete"}),
               sqlite3.SQLITE_ALTER_TABLE: frozenset({"alter"}), sqlite3.SQLITE_ANALYZE: frozenset({"analyze"}),
               sqlite3.SQLITE_REINDEX: frozenset({"reindex"}), sqlite3.SQLITE_PRAGMA: frozenset({"pragma"})}
_ACTION_OPS.update({getattr(sqlite3, "SQLITE_" + name): frozenset({name.split("_")[0].lower()}) for name in (
    "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
    "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "CREATE_VTABLE", "DROP_INDEX", "DROP_TABLE",
    "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW",
    "DROP_VTABLE")})
# TRANSACTION and SAVEPOINT name their operation in their first argument.
_TRANSACTION_OPS = {"begin": "begin", "commit": "commit", "rollback": "rollback"}
# A row write that deletes or changes rows besides its own (check()): into a table whose PRIMARY KEY or UNIQUE
# constraint is declared ON CONFLICT REPLACE, a plain INSERT or UPDATE deletes the row it conflicts with; an
# INSERT naming a virtual table's column named like the table is a command (FTS3/4/5: 'delete-all', 'delete',
# 'rebuild', 'optimize', 'merge', ('rank', ...) settings), whose value may be any of them.
_REPLACING_OPS = frozenset({"delete", "replace"})
_COMMAND_OPS = frozenset({"delete", "update"})
_SAVEPOINT_OPS = {"begin": "savepoint", "release": "release", "rollback": "rollback"}
# Virtual table modules whose table holds only its own content (an FTS table without `content=`, an R*Tree): what a
# masked call reads through it is what was written into it, under its own name, which mask rules can name. Any
# other module's table may show another table's values under its own (fts5vocab and fts4aux list an FTS table's
# words; an unknown module anything), so a masked call reading one is refused.
_OWN_CONTENT_MODULES = frozenset({"fts3", "fts4", "fts5", "rtree", "rtree_i32", "geopoly"})


def _needed_ops(action, arg1, arg2, source) -> frozenset | None:
    """The write operations of which one allows this action, or None when it writes nothing."""
    if action == sqlite3.SQLITE_TRANSACTION:
        return frozenset({_TRANSACTION_OPS.get((arg1 or "").lower(), "begin")})
    if action == sqlite3.SQLITE_SAVEPOINT:
        return frozenset({_SAVEPOINT_OPS.get((arg1 or "").lower(), "savepoint")})
    if action == sqlite3.SQLITE_PRAGMA and _read_only_refusal(action, arg1, arg2, source) is None:
        return None                     # a pragma queried, which writes nothing
    return _ACTION_OPS.get(action)


def _read_only_refusal(action, arg1, arg2, source) -> str | None:
    """Why a read-only call may not do this action, or None."""
    if action in _READ_ACTIONS:
        return None
    if action == sqlite3.SQLITE_UPDATE and arg1 and ascii_lower(arg1) in _SCHEMA_TABLES and source is None:
        return None
    if action == sqlite3.SQLITE_PRAGMA:
        name = (arg1 or "").lower()
        if name in _DESCRIBING_PRAGMAS or (arg2 is None and name not in _ACTING_PRAGMAS):
            return None
        return f"PRAGMA {name}" + ("" if arg2 is None else f" = {arg2}")
    return _ACTION_NAMES.get(action, f"action {action}")


class _Authorizer:
    """The engine as reader of record: records every action, table and function SQLite reports while it
    prepares the call's statement, and refuses there what the call may never do, whatever qag's guard read.

    - every call: ATTACH/DETACH, functions that change something (`SQLITE_CHANGING`), and setting a pragma
      whose value is the process's (`pragma_not_allowed`);
    - a read-only call: any action other than reading (`read_only`), and functions not built into the library
      except the read-only extension functions;
    - a write call with `write_ops` (the key's allowed_write_ops): any write action of the statement itself
      outside them (`write_op_not_allowed`); a trigger's are the schema's. A row write that may be a virtual
      table's own statements on its shadow tables (an R*Tree prepares them when opened) is held back for check(),
      which allows it only on a shadow table of a virtual table the statement uses; a row write its operations
      allow on a shadow table is refused when the statement itself writes that table (not its virtual table's
      module on its behalf): SQLite's defensive mode would, and a write there corrupts or reconfigures the index;
    - a table-restricted call (`grants`: its qualified tables): any function that is not a built-in
      (`function_not_allowed`), and any table outside the grants read or written by the statement itself
      (`table_not_allowed`). Access on behalf of a view or trigger (`source` set) is judged after the prepare,
      from the whole record (`check`): SQLite names a CTE the same way, so a CTE named like a view is not the
      view, nor one named like a trigger the trigger. A table named like a generator is only passed when it
      is the eponymous virtual table, not a table of the file.
    """

    __slots__ = ("read_only", "grants", "own", "tables", "functions", "actions", "expanded", "via", "refused",
                 "refusal", "write_ops", "statement", "named", "shadow", "rows", "masked", "own_via", "path",
                 "schema_changed", "_facts", "written")

    def __init__(self, read_only: bool, grants: frozenset | None, own: frozenset = frozenset(),
                 masked: bool = False):
        self.read_only = read_only
        self.masked = masked                    # the result is masked: no table holding values masking can't see
        self.grants = grants
        self.own = own                          # qag's own functions registered for the call (masking)
        self.tables: set[str] = set()           # qualified tables read or written, directly or not
        self.functions: set[str] = set()
        self.actions: set[int] = set()
        self.expanded: set[str] = set()         # views and CTEs expanded (a SELECT reported on their behalf)
        self.via: list[tuple] = []              # (qualified table, column, source) read on behalf of `source`
        self.refused: list[str] = []            # forbidden tables (table_not_allowed)
        self.refusal: QagError | None = None    # the first other refusal
        # A write call's allowed operations (None = any), set once the call's own BEGIN has run.
        self.write_ops: frozenset | None = None
        self.statement: tuple | None = None     # (sql, args) of the call, for check()'s trigger-free reading
        self.named: list[tuple] = []            # (qualified table, column, source) named like a generator
        self.shadow: list[tuple] = []           # (qualified table, refusal) written as a virtual table's own
        self.rows: set[tuple] = set()           # (action, table of main) inserted or updated by the statement
        self.written: set[str] = set()          # main's tables a narrowed write call's row writes reach
        self.own_via: list[str] = []            # sources (a view's, a trigger's, a CTE's) calling qag's functions
        self.path: str | None = None            # the file, keying its schema's facts (_sqlite_schema)
        self.schema_changed = False             # the statement may change the schema: its facts are not kept
        self._facts = None

    def reset(self) -> None:
        self.tables.clear(), self.functions.clear(), self.actions.clear(), self.expanded.clear()
        self.via.clear(), self.named.clear(), self.shadow.clear(), self.rows.clear(), self.written.clear()
        self.refused.clear(), self.own_via.clear()
        self.refusal = None
        self.schema_changed, self._facts = False, None

    def facts(self, conn) -> schema.Facts:
        """The file's schema as the judgements below need it: found by its schema_version, read once per call."""
        if self._facts is None:
            conn.set_authorizer(None)     # qag's own reading of the schema, not the caller's
            try:
                self._facts = schema.facts(conn, self.path, not self.schema_changed)
            finally:
                conn.set_authorizer(self)
        return self._facts

    def _deny(self, code: str, message: str) -> int:
        if self.refusal is None:
            self.refusal = QagError(code, message)
        return sqlite3.SQLITE_DENY

    def __call__(self, action, arg1, arg2, dbname, source):
        self.actions.add(action)
        if action in _SCHEMA_ACTIONS or (action == sqlite3.SQLITE_PRAGMA and arg2 is not None
                                         and (arg1 or "").lower() in _UNCOUNTED_PRAGMAS):
            self.schema_changed = True
        if action == sqlite3.SQLITE_PRAGMA and arg2 is not None and (arg1 or "").lower() in _PROCESS_PRAGMAS:
            # Before any other judgement: the same refusal for every caller, whatever its key may write.
            return self._deny("pragma_not_allowed", f"The gateway never sets PRAGMA {arg1.lower()} on SQLite: it "
                              "applies to the whole worker process, not to this call's connection")
        refusal = None
        if self.read_only:
            refused = _read_only_refusal(action, arg1, arg2, source)
            if refused is not None:
                refusal = ("read_only", f"A read-only call may not run {refused} (refused by SQLite's authorizer)")
        elif self.write_ops is not None and source is None:
            # A write on behalf of a source is a trigger's (a view or CTE never writes): the schema's own.
            needed = _needed_ops(action, arg1, arg2, source)
            if needed is not None and not needed & self.write_ops:
                refusal = ("write_op_not_allowed", write_op_not_allowed_message(self.write_ops)[:-1]
                           + f" (SQLite's authorizer refused {_ACTION_NAMES.get(action, action)}).")
            elif action in _ROW_WRITES and arg1 and (dbname or "main") == "main":
                self.written.add(f"main.{ascii_lower(arg1)}")   # a shadow table's? judged in check()
                if action != sqlite3.SQLITE_DELETE:
                    self.rows.add((action, ascii_lower(arg1)))     # what else it does is judged in check()
        if refusal is not None:
            table = ascii_lower(arg1 or "")
            if action in _ROW_WRITES and table in _SCHEMA_TABLES and not self.read_only:
                pass    # the engine's own record of a granted CREATE/DROP, or of an eponymous virtual table
            elif action in _ROW_WRITES and source is None and "_" in table and (dbname or "main") == "main":
                # Maybe a virtual table's own statements on its shadow tables (an R*Tree prepares its writes
                # when opened): judged in check(), which knows the schema. A read-only call can't write the file
                # anyway (mode=ro).
                self.shadow.append((f"main.{table}", refusal))
            else:
                return self._deny(*refusal)
        if action in _TABLE_ACTIONS and arg1:
            # Folded as SQLite compares names, ASCII letters alone: Python's lower() would make the table Ärger
            # the granted ärger (and the Kelvin sign's \u212Aeys the granted keys).
            table = ascii_lower(arg1)
            # No schema is given for a read of no column (count(*), EXISTS): this connection has only main
            # (ATTACH refused) and an empty temp (creating anything refused), so it is main.
            name = f"{ascii_lower(dbname or 'main')}.{table}"
            self.tables.add(name)
            grants = self.grants
            if grants is not None and name not in grants:
                if table in _SCHEMA_TABLES:
                    # The engine's own access reads only the ROWID (registering an eponymous virtual table).
                    if action == sqlite3.SQLITE_READ and arg2 != "ROWID":
                        self.refused.append(name)
                        return sqlite3.SQLITE_DENY
                elif table in GENERATORS:
                    # An eponymous virtual table (json_each) is the engine's; a table of the file named so is
                    # not: check() tells them apart from the schema.
                    self.named.append((name, arg2, source))
                elif source is None and arg2:
                    self.refused.append(name)
                    return sqlite3.SQLITE_DENY
                else:
                    # On behalf of a view, trigger or CTE; or a read of no column, which SQLite also reports
                    # for the tables under a view it flattened (count(*) of a view): judged in check().
                    self.via.append((name, arg2, source))
        elif action == sqlite3.SQLITE_FUNCTION and arg2:
            name = arg2.lower()
            self.functions.add(name)
            if name in self.own:
                if source is not None:
                    self.own_via.append(source)   # masking's own are top-level or in the statement's CTEs
                return sqlite3.SQLITE_OK
            if name in SQLITE_CHANGING:
                return self._deny("function_not_allowed" if self.grants is not None else "forbidden",
                                  f"The gateway never runs {name}() on SQLite")
            if self.grants is not None:
                if name not in (_BUILTINS or builtin_functions()):
                    return self._deny("function_not_allowed", f"This API key may not call {name}(): only "
                                      "SQLite's built-in functions are allowed for a table-restricted key")
            elif self.read_only and name not in _EXTENSION_READS and name not in (_BUILTINS or builtin_functions()):
                return self._deny("read_only", f"A read-only call may not run {name}(): it is not one of "
                                  "SQLite's built-in functions, so it may change something")
        elif action == sqlite3.SQLITE_SELECT and source is not None:
            self.expanded.add(ascii_lower(source))
        elif action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
            return self._deny("forbidden", "The gateway never attaches or detaches databases on SQLite")
        return sqlite3.SQLITE_OK

    def check(self, conn) -> QagError | None:
        """After the prepare: the refusal recorded, or one judged from the whole record; for a masked call then
        (tables before masking, contract 3.10) the tables masking can't see (_masked_refusal)."""
        refusal = self._check(conn)
        if refusal is None and self.masked:
            refusal = self._masked_refusal(conn)
        return refusal

    def _own_via_refusal(self, conn) -> QagError | None:
        """qag's masking functions (registered on a masked call's connection, keyed with the mask key) called by a
        view or trigger of the file: a view `SELECT qag_mask_hash(value) ... FROM json_each(<guesses>)` would hash
        any value a caller chose with the mask key (an oracle for hashed columns). Masking puts them in the
        statement itself, at its top level or inside its own CTEs; a CTE named like a view or trigger is refused
        too (SQLite reports both under the name)."""
        names = self.facts(conn).kinds
        for source in self.own_via:
            if ascii_lower(source) in names:
                return QagError("forbidden", f"The view or trigger {source} calls one of the gateway's masking "
                                             "functions, which run only where masking puts them")
        return None

    def _check(self, conn) -> QagError | None:
        """The refusal recorded, or one judged from the whole record. A table read on behalf
        of a view is allowed only when a granted view read by this statement reads that column itself (the
        engine's own record of `SELECT * FROM <view>`); on behalf of a trigger only in a write call, and only
        when the statement compiled without triggers names no source of that name (a CTE's, a view's)."""
        if self.refusal is not None and self.refusal.code in ("pragma_not_allowed", "read_only",
                                                              "write_op_not_allowed"):
            return self.refusal              # the guard's order: read_only, write ops, tables, functions
        if self.own_via:
            refusal = self._own_via_refusal(conn)
            if refusal is not None:
                return refusal
        if self.shadow:
            refusal = self._shadow_refusal(conn)
            if refusal is not None:
                return refusal
        if self.rows and self.write_ops is not None:
            refusal = self._rows_refusal(conn)
            if refusal is not None:
                return refusal
        if self.written and self.write_ops is not None:
            refusal = self._shadow_write_refusal(conn)
            if refusal is not None:
                return refusal
        if self.named:
            self._named_tables(conn)
        if self.refused:
            return _table_refusal(self.refused, self.grants)
        if self.refusal is not None:
            return self.refusal
        if not self.via:
            return None
        kinds = self.facts(conn).kinds
        # A CTE (or a view) named like a trigger reports its reads under the trigger's name: a source is a
        # trigger's only when the statement, compiled with no trigger at all, names no such source itself.
        expanded = None
        if not self.read_only and any(source is not None and kinds.get(ascii_lower(source)) == "trigger"
                                      for _, _, source in self.via):
            expanded = _sources_without_triggers(self.facts(conn), self.statement)
        closures: dict[str, set] = {}

        def reads(view):
            if view not in closures:
                closures[view] = _view_reads(conn, view, self)
            return closures[view]

        def covers(view, name, column):
            # A read of no column (count(*), EXISTS) is reported with the column ''.
            pairs = reads(view)
            return (name, column) in pairs or (not column and any(table == name for table, _ in pairs))

        # The granted views this statement reads itself. A CTE is never reported as read, so a CTE named like a
        # granted view doesn't count, unless the statement also reads that view.
        granted = [view for view, kind in kinds.items() if kind == "view" and f"main.{view}" in self.tables
                   and f"main.{view}" in self.grants]
        forbidden = []
        for name, column, source in self.via:
            if source is not None:
                source = ascii_lower(source)
                if (kinds.get(source) == "trigger" and not self.read_only and expanded is not None
                        and source not in expanded):
                    continue
            behalf = source is None or (kinds.get(source) == "view" and source in self.expanded)
            if not (behalf and any(covers(view, name, column) for view in granted)):
                forbidden.append(name)
        return _table_refusal(forbidden, self.grants) if forbidden else None

    def _shadow_refusal(self, conn) -> QagError | None:
        """A write recorded as maybe a virtual table's own: allowed only on a shadow table of a virtual table
        this statement uses (SQLite's own record: pragma table_list), else the refusal it was held back for."""
        facts = self.facts(conn)
        shadows = facts.shadows or frozenset()
        used = [f"main.{name}_" for name in facts.listed if f"main.{name}" in self.tables]
        for table, (code, message) in self.shadow:
            if table not in shadows or not any(table.startswith(prefix) for prefix in used):
                return QagError(code, message)
        return None

    def _shadow_write_refusal(self, conn) -> QagError | None:
        """A narrowed write call's row write on a virtual table's own (shadow) table, written by the statement itself:
        `INSERT INTO notes_config ...` sets an FTS table's options, `INSERT INTO rt_node ...` corrupts an R*Tree,
        where `INSERT INTO notes(notes, rank) ...` needs delete and update. The module's own statements on its
        shadow tables (reported alike) are told apart by compiling the statement where every virtual table is a
        plain table (_writes_any). SQLite before 3.37 doesn't say which tables are shadow tables: there every table
        named like a virtual table and a suffix (`notes_config`) is taken for one."""
        if not any("_" in table for table in self.written):
            return None                 # every shadow table's name is its virtual table's and a suffix after "_"
        facts = self.facts(conn)
        shadows = facts.shadows
        if shadows is None:             # SQLite before 3.37: every <virtual table>_<suffix> may be one
            shadows = frozenset(t for t in self.written if any(t.startswith(f"main.{v}_") for v in facts.virtual))
        written = self.written & shadows
        if written and _writes_any(facts, self.statement, written, self.own):
            return QagError("write_op_not_allowed", write_op_not_allowed_message(self.write_ops)[:-1]
                            + ", and a virtual table's own (shadow) tables are written through that table only.")
        return None

    def _masked_refusal(self, conn) -> QagError | None:
        """A masked call reads a table masking wraps, never what holds that table's values elsewhere: an FTS table
        over another table's content (`content=`: it shows that table's values through its own columns) and a
        virtual table's shadow tables (`notes_content` holds an FTS table's text), and a virtual table of any
        module but those holding only their own content (_OWN_CONTENT_MODULES). Reading a virtual table reads
        its shadow tables on its behalf, reported alike; so the statement's own reads (a view's included) are
        SQLite's compile of it on an in-memory copy where every virtual table is a plain table."""
        facts = self.facts(conn)
        if not facts.virtual:
            return None
        over = sorted(name for name in facts.content if f"main.{name}" in self.tables)
        if over:
            return QagError("mask_unresolvable", f"This result can't be masked safely: {over[0]} is a full-text "
                            "table over another table's content, whose values masking can't see there")
        other = sorted(name for name in facts.virtual if facts.modules[name] not in _OWN_CONTENT_MODULES
                       and f"main.{name}" in self.tables)
        if other:
            return QagError("mask_unresolvable", f"This result can't be masked safely: {other[0]} is a virtual "
                            f"table of the module {facts.modules[other[0]] or '(unknown)'}, which may show another "
                            "table's values (fts5vocab and fts4aux show an FTS table's words) where masking can't "
                            "see them")
        shadows = facts.shadows         # None: SQLite before 3.37 doesn't say which tables are shadow tables
        if shadows is None or shadows & self.tables and _reads_any(facts, self.statement, shadows, self.own):
            return QagError("mask_unresolvable", "This result can't be masked safely: the statement reads a virtual "
                            "table's own (shadow) table, which holds that table's values where masking can't see "
                            "them")
        return None

    def _rows_refusal(self, conn) -> QagError | None:
        """A row write counted as what it does (_REPLACING_OPS, _COMMAND_OPS), from the schema: refused when the
        call's operations don't cover it. An INSERT into a table declared ON CONFLICT REPLACE that overrides it
        (OR ABORT/FAIL/IGNORE/ROLLBACK, ON CONFLICT DO NOTHING) deletes nothing: SQLite's compiled program,
        which holds the REPLACE's delete of the conflicting row, says (_program_deletes)."""
        ops = self.write_ops
        replaces = not ops & _REPLACING_OPS
        commands = not _COMMAND_OPS <= ops
        if not (replaces or commands):
            return None
        facts = self.facts(conn)
        for action, table in sorted(self.rows):
            if (replaces and table in facts.replacing
                    and ((sqlite3.SQLITE_UPDATE, table) in self.rows or _program_deletes(conn, self.statement, self))):
                return QagError("write_op_not_allowed", write_op_not_allowed_message(ops)[:-1] + f" (the table "
                                f"{table} is declared ON CONFLICT REPLACE: a row written into it deletes the row it "
                                "conflicts with, so it needs delete or replace).")
            if commands and table in facts.virtual and _names_command_column(facts, self.statement, table, self.own):
                return QagError("write_op_not_allowed", write_op_not_allowed_message(ops)[:-1] + f" (a write "
                                f"naming the column {table} of the virtual table {table} is a command, such as "
                                "FTS's 'delete-all', 'rebuild' or 'optimize', so it needs delete and update).")
        return None

    def _named_tables(self, conn) -> None:
        """Tables named like a generator: the file's own (a table or view of its schema, which SQLite reads
        instead of the eponymous virtual table) are judged like any table."""
        own = self.facts(conn).own
        for name, column, source in self.named:
            schema, _, table = name.partition(".")
            if schema != "main" or table in own:
                if source is None and column:
                    self.refused.append(name)
                else:
                    self.via.append((name, column, source))


def _program_deletes(conn, statement, authorizer) -> bool:
    """Whether SQLite's program for the statement deletes a row itself (a Delete or IdxDelete opcode of its main
    program: an ON CONFLICT REPLACE's delete of the row it meets; a trigger's deletes are subprograms). Only an
    INSERT's reading: an UPDATE's program deletes the index entries it rewrites. True when it can't tell."""
    if statement is None:
        return True
    conn.set_authorizer(None)     # qag's own compile of the statement the authorizer already judged
    try:
        # EXPLAIN compiles the statement without running it.
        return any(op in ("Delete", "IdxDelete") for _, op, *_ in conn.execute("EXPLAIN " + statement[0],
                                                                                statement[1]))
    except (sqlite3.Error, OverflowError, ValueError):
        return True
    finally:
        conn.set_authorizer(authorizer)


def _reads_any(facts, statement, tables, own: frozenset) -> bool:
    """Whether the statement itself reads any of `tables` (qualified), directly or through a view. True when it
    can't tell."""
    seen = _own_actions(facts, statement, own, lambda action, source: action == sqlite3.SQLITE_READ)
    return seen is None or bool(seen & tables)


def _writes_any(facts, statement, tables, own: frozenset) -> bool:
    """Whether the statement itself writes rows of any of `tables` (qualified; a trigger's writes are the
    schema's). True when it can't tell."""
    seen = _own_actions(facts, statement, own, lambda action, source: action in _ROW_WRITES and source is None,
                        hidden=" ANY AS (NULL)")
    return seen is None or bool(seen & tables)


def _own_actions(facts, statement, own: frozenset, wanted, hidden: str = "") -> set | None:
    """The tables (qualified) of the actions `wanted(action, source)` takes that the statement takes itself: SQLite
    compiles it on an in-memory copy of the file's tables and views where each virtual table is a plain table of
    its columns (so no module reads or writes anything on its behalf), its hidden columns declared with `hidden`
    (a write's: generated, so left out of an INSERT's implicit column list as the virtual table's are; one the
    statement names, FTS4's docid, is made plain and the statement compiled again). None when it can't tell."""
    if statement is None or any(facts.columns.get(name) is None for name in facts.virtual):
        return None
    seen: set = set()

    def record(action, arg1, arg2, dbname, source):
        if arg1 and wanted(action, source):
            seen.add(f"{ascii_lower(dbname or 'main')}.{ascii_lower(arg1)}")
        return sqlite3.SQLITE_OK

    named: set[str] = set()             # hidden columns the statement names, made plain
    for _ in range(sum(len(columns) for columns in facts.columns.values()) + 1):
        plain = {name: "(" + ", ".join(_quoted(column) + (hidden if is_hidden and column not in named else "")
                                       for column, is_hidden in facts.columns[name]) + ")"
                 for name in facts.virtual}
        seen.clear()
        refused = facts.compile(plain, statement, record, own)
        if refused is None:
            return seen
        if hidden and refused.startswith("cannot modify ") and refused.endswith(" because it is a view"):
            return seen     # a write of a view (the copy has no INSTEAD OF trigger): its target is the view alone
        found = next((column for name in facts.virtual for column, is_hidden in facts.columns[name]
                      if hidden and is_hidden and column not in named
                      and refused in (f'cannot INSERT into generated column "{column}"',
                                      f'cannot UPDATE generated column "{column}"')), None)
        if found is None:
            return None
        named.add(found)
    return None


def _names_command_column(facts, statement, table: str, own: frozenset) -> bool:
    """Whether the statement writes the column named like the virtual table `table` (FTS's command column).
    SQLite compiles the statement on an in-memory copy of the file's tables and views where that table is a plain
    table with its hidden columns generated (left out of an INSERT's implicit column list, as the virtual
    table's are, and refused when named); a hidden column other than the command column that the statement names
    (FTS4's docid) is made plain, and the statement compiled again. True when it can't tell."""
    columns = facts.columns.get(table)
    if statement is None or columns is None:
        return True
    named: set[str] = set()             # hidden columns the statement names, made plain
    for _ in range(len(columns) + 1):
        definition = ", ".join(_quoted(name) + ("" if not hidden or name in named else " ANY AS (NULL)")
                               for name, hidden in columns)
        refused = facts.compile({table: f"({definition})"}, statement, own=own)
        if refused is None:
            return False
        found = next((name for name, hidden in columns if hidden and ascii_lower(name) != table
                      and name not in named and refused in (f'cannot INSERT into generated column "{name}"',
                                                            f'cannot UPDATE generated column "{name}"')), None)
        if found is None:
            return True                 # the command column, or an error that doesn't say
        named.add(found)
    return True


def _sources_without_triggers(facts, statement) -> set | None:
    """The sources (CTEs, views) SQLite names while compiling the statement on a copy of the file's tables and
    views that has no trigger: any of them named like a trigger is not that trigger. None when it can't tell."""
    if statement is None:
        return None
    seen: set = set()

    def record(action, arg1, arg2, dbname, source):
        if source is not None:
            seen.add(ascii_lower(source))
        return sqlite3.SQLITE_OK

    return seen if facts.compile({}, statement, record) is None else None


def _view_reads(conn, view: str, authorizer) -> set:
    """(qualified table, column) pairs the engine reports for reading the whole view, its own views included."""
    seen: set = set()

    def record(action, arg1, arg2, dbname, source):
        if action == sqlite3.SQLITE_READ and arg1 and source is not None:
            seen.add((f"{ascii_lower(dbname or 'main')}.{ascii_lower(arg1)}", arg2))
        return sqlite3.SQLITE_OK

    conn.set_authorizer(record)
    try:
        # EXPLAIN compiles the view's reading without running it.
        conn.execute('EXPLAIN SELECT * FROM main."' + view.replace('"', '""') + '"').fetchall()
    finally:
        conn.set_authorizer(authorizer)
    return seen


def _table_refusal(forbidden, grants: frozenset) -> QagError:
    return QagError("table_not_allowed", "This API key may only query these tables: "
                    + (", ".join(sorted(grants)) or "(none)") + ". Forbidden: " + ", ".join(sorted(set(forbidden)))
                    + ".")


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


# Seconds a call waits for a lock another call or process holds on the file (SQLite's busy timeout), at most: a
# call with a time limit waits no longer than that limit (then 503 unavailable, Retry-After).
_BUSY_WAIT = 10.0


def _busy_wait(timeout: float | None) -> float:
    return min(_BUSY_WAIT, timeout) if timeout else _BUSY_WAIT


def _open(path: str, read_only: bool, tables: frozenset | None = None, functions: tuple = (), masked: bool = False,
          wait: float = _BUSY_WAIT):
    if read_only:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=wait, isolation_level=None,
                               check_same_thread=False)
    else:
        conn = sqlite3.connect(path, timeout=wait, isolation_level=None, check_same_thread=False)
    for limit, value in _LIMITS:
        conn.setlimit(limit, value)
    for name, function in functions:
        conn.create_function(name, 1, function, deterministic=True)
    authorizer = _Authorizer(read_only, tables, frozenset(name for name, _ in functions), masked)
    authorizer.path = path
    conn.set_authorizer(authorizer)
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
    """The contract's error for a driver failure: timeout 504, refusals 403, unreachable 502, what the caller's
    statement or values caused 400 (value_too_large, value_invalid, multiple_statements), else 500."""
    text = str(exc)
    name = getattr(exc, "sqlite_errorname", None)
    if deadline is not None and text == "interrupted" and time.monotonic() >= deadline:
        return timeout_error(timeout)
    if (name == "SQLITE_TOOBIG" or text in ("query string is too large", "LIKE or GLOB pattern too complex",
                                             "parser stack overflow")
            or text.startswith("Expression tree is too large")):
        return QagError("value_too_large", f"A value, pattern or statement is larger than SQLite allows here "
                        f"(values up to {LENGTH_LIMIT:,} bytes, LIKE/GLOB patterns up to {LIKE_PATTERN_LIMIT:,})",
                        detail=text)
    if (name == "SQLITE_MISMATCH" or isinstance(exc, (OverflowError, UnicodeError))
            or text == "the query contains a null character" or text.startswith("Could not decode to UTF-8")):
        return QagError("value_invalid", "SQLite can't use a value of this statement (invalid text, a NUL "
                        "character in the statement, a number out of range, or a type it refuses here)",
                        detail=text)
    if text.startswith("You can only execute one statement at a time"):
        return QagError("multiple_statements", "SQLite refused a second statement")
    if "not authorized" in text:
        return QagError("forbidden", "This statement uses something the gateway refuses on SQLite")
    if "readonly database" in text:
        return QagError("read_only", "The database refused a write on a read-only call")
    if "unable to open database file" in text:
        return connection_failed(text)
    if name in ("SQLITE_BUSY", "SQLITE_LOCKED") or text in ("database is locked", "database table is locked"):
        # Another call (or process) held the file's lock past the busy timeout: nothing was changed, and the same
        # call succeeds once the lock is let go - a moment's unavailability, not the statement's fault.
        return QagError("unavailable", "The SQLite database is locked by another call; try again shortly",
                        retry_after=1, detail=text)
    if text == "cannot VACUUM from within a transaction":
        return QagError("invalid_request", "VACUUM can't run through the gateway: each call runs in a transaction",
                        detail=text)
    return _file_error(exc) or query_failed(text)


def _file_error(exc: Exception) -> QagError | None:
    """The connection's own fault, not the statement's: its file is not a SQLite database (a saved path pointing
    at any other file). The connection's setup to fix, so 400 connection_misconfigured, never a 500."""
    if getattr(exc, "sqlite_errorname", None) == "SQLITE_NOTADB" or str(exc) == "file is not a database":
        return QagError("connection_misconfigured", "The connection's file is not a SQLite database",
                        detail=str(exc))
    return None


def _failure(exc: Exception, authorizer, conn, deadline, timeout) -> QagError:
    """The error for a failed call: what the authorizer refused if it did, else the driver's error mapped.

    The call's statement is over: its time limit no longer applies to qag's own reading of the schema here (armed
    past the deadline, it interrupted that reading, and the raw 'interrupted' escaped as a 500). A reading that
    fails anyway leaves the call's own error."""
    if authorizer is not None and (authorizer.refusal is not None or authorizer.refused or authorizer.shadow
                                   or authorizer.rows):
        conn.set_progress_handler(None, 0)
        try:
            refusal = authorizer.check(conn)
        except sqlite3.Error:
            refusal = authorizer.refusal
        if refusal is not None:
            return refusal
    return _mapped(exc, deadline, timeout)


def run(path: str, call: Call) -> Result:
    """Run one statement; read-only calls can't write even if the guard were bypassed (mode=ro, authorizer)."""
    try:
        conn, authorizer = _open(path, call.read_only, call.tables, call.functions, call.masked,
                                 _busy_wait(call.timeout))
    except sqlite3.Error as exc:
        raise connection_failed(str(exc)) from None
    deadline = None
    if call.timeout:
        deadline = time.monotonic() + call.timeout
        conn.set_progress_handler(lambda: time.monotonic() > deadline, _PROGRESS_STEPS)
    started = time.perf_counter()
    try:
        authorizer.statement = (call.sql, call.args)
        if not call.read_only:
            conn.execute("BEGIN")
            authorizer.reset()
            authorizer.write_ops = call.write_ops   # from here on: the caller's statement, not the call's BEGIN
        cursor = conn.execute(call.sql, call.args)
        # Prepared (and its first row computed, nothing returned yet; a write call's changes are still in its
        # transaction): judged from the engine's whole record before any row leaves or anything is committed.
        refusal = authorizer.check(conn)
        if refusal is not None:
            # Reset now: a statement left stepping keeps its lock past close() while anything holds the cursor.
            cursor.close()
            raise refusal
        if cursor.description is None:
            columns, rows = [], []
        else:
            columns = [d[0] for d in cursor.description]
            skip_rows(cursor, call.skip)
            rows = cursor.fetchmany(call.fetch)
        if not call.read_only:
            conn.set_authorizer(None)   # the key's tables limit its statement, not the COMMIT
            conn.execute("COMMIT")
    except (sqlite3.Error, OverflowError, ValueError) as exc:
        # OverflowError/ValueError: a value the driver can't bind; the binder refuses most before this. A write
        # call's 'readonly database' is the file's state (not writable now), not the caller's right.
        raise refused_write_of(_failure(exc, authorizer, conn, deadline, call.timeout), call.read_only) from None
    finally:
        conn.close()
        if authorizer.schema_changed:
            schema.forget(path)     # writable_schema's changes aren't counted in the version keying its facts
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
            try:
                foreign = {row[3]: {"table": row[2], "column": row[4]}
                           for row in conn.execute("SELECT * FROM pragma_foreign_key_list(?)", (name,))}
                columns = [{"name": col, "type": ctype or None, "nullable": not notnull, "position": cid + 1,
                            "primary_key": pk > 0, "foreign_key": foreign.get(col)}
                           for cid, col, ctype, notnull, _default, pk in
                           conn.execute("SELECT cid, name, type, \"notnull\", dflt_value, pk FROM "
                                        "pragma_table_info(?)", (name,))]
            except sqlite3.OperationalError:
                if kind != "view":
                    raise
                # A view that doesn't compile (its table dropped, a function this connection lacks) has no
                # columns to show: left out, so a masked call reading it is refused as reading an unknown table,
                # rather than every masked call of the connection and this route answering 500.
                continue
            tables.append({"name": name, "schema": "main", "type": "view" if kind == "view" else "table",
                           "columns": columns})
    except sqlite3.Error as exc:
        raise _file_error(exc) or query_failed(str(exc)) from None
    finally:
        conn.close()
    return {"tables": tables, "truncated": len(objects) > max_tables}


def read_ddl(path: str, table: str) -> str | None:
    """The CREATE statement of one table or view, named exactly (`table` is only ever a bound value); None when
    the file has no such table."""
    try:
        conn, _ = _open(path, True)
    except sqlite3.Error as exc:
        raise connection_failed(str(exc)) from None
    try:
        row = conn.execute("SELECT sql FROM sqlite_master WHERE type IN ('table', 'view') AND name = ? "
                           "AND name NOT LIKE 'sqlite_%'", (table,)).fetchone()
    except sqlite3.Error as exc:
        raise _file_error(exc) or query_failed(str(exc)) from None
    finally:
        conn.close()
    return None if row is None else row[0]


def stream(path: str, call: Call, batch: int, cap: int | None):
    """(columns, batches): the first batch is read now, so errors before the first row are normal errors.

    The file stays open while the caller iterates; the time limit covers the whole export.
    """
    try:
        conn, authorizer = _open(path, True, call.tables, call.functions, call.masked, _busy_wait(call.timeout))
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
        refusal = authorizer.check(conn)
        if refusal is not None:
            cursor.close()
            conn.close()
            raise refusal
        columns = [d[0] for d in cursor.description] if cursor.description else []
        first = fetch(cursor, cap) if columns else []
    except (sqlite3.Error, OverflowError, ValueError) as exc:
        error = _failure(exc, authorizer, conn, deadline, timeout)
        conn.close()
        raise error from None

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
            # Raised, not swallowed: the run is recorded as failed and the body ends incomplete. The authorizer
            # stays: a virtual table (FTS) prepares its own statements while rows are read.
            raise _failure(exc, authorizer, conn, deadline, timeout) from None
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
        # The schema's row count reads the file's header: a file that is not a database fails here, as its calls do
        # (`SELECT 1` read nothing, so the test passed where every call was a 400).
        run(self.path(fields), Call("SELECT count(*) FROM sqlite_schema", (), True, 10.0, 1))
        return (time.perf_counter() - started) * 1000.0

    def schema(self, fields: dict, database: str | None = None) -> dict:
        if database is not None:
            raise QagError("unsupported_operation", "Switching databases isn't supported for 'sqlite' connections")
        return read_schema(self.path(fields))

    has_table_ddl = True

    def table_ddl(self, fields: dict, table: str) -> str | None:
        return read_ddl(self.path(fields), table)
