"""PostgreSQL statements read by PostgreSQL's own parser (pglast, libpg_query): count, kind, writes, names used.

qag reads a PostgreSQL statement the way the server will: the text is the one sent (placeholders as $n), and
libpg_query is the server's grammar compiled as a library, so where a comment, a string, a dollar quote or a
quoted name ends is decided as the server decides it, and names arrive folded as the server folds them
(unquoted lower-cased, quoted exact). What this module reports feeds the guard (statement count, write
operations) and the table policy (tables, table functions, functions); the server still enforces the one
statement (extended protocol) and the read-only transaction behind it (qag/backends/postgres.py).

The walk is over the parser's JSON form (twenty times faster to produce than pglast's node objects), kept with
the statement's prepared form, so a warm call reads nothing.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple

import msgspec

CACHE_SIZE = 2048
MAX_NODES = 50_000
MAX_DEPTH = 1_000

# Statement nodes that only read; every other statement kind is a write operation named after its node.
_READS = frozenset(("SelectStmt", "VariableShowStmt", "ExplainStmt"))
_DML_OPS = {"InsertStmt": "insert", "UpdateStmt": "update", "DeleteStmt": "delete", "MergeStmt": "merge"}
# Operation names for other statements, where the node's name would not say it the way the guard's keyword
# rule does (qag/sql/writes.py); anything else becomes its node name without "Stmt", lower-cased.
_STATEMENT_OPS = {
    "CopyStmt": "copy", "CreateStmt": "create", "CreateTableAsStmt": "create", "ViewStmt": "create",
    "IndexStmt": "create", "CreateFunctionStmt": "create", "CreateSchemaStmt": "create", "CreateSeqStmt": "create",
    "DropStmt": "drop", "TruncateStmt": "truncate", "VariableSetStmt": "set", "TransactionStmt": "transaction",
    "VacuumStmt": "vacuum", "LockStmt": "lock", "GrantStmt": "grant", "GrantRoleStmt": "grant", "CallStmt": "call",
    "DoStmt": "do", "PrepareStmt": "prepare", "ExecuteStmt": "execute", "DeallocateStmt": "deallocate",
    "DeclareCursorStmt": "declare", "FetchStmt": "fetch", "ClosePortalStmt": "close", "ListenStmt": "listen",
    "NotifyStmt": "notify", "UnlistenStmt": "unlisten", "DiscardStmt": "discard", "RefreshMatViewStmt": "refresh",
    "ReindexStmt": "reindex", "ClusterStmt": "cluster", "CheckPointStmt": "checkpoint", "LoadStmt": "load",
    "CommentStmt": "comment", "SecLabelStmt": "security label", "AlterTableStmt": "alter",
}
# Functions that change state outside the statement's result, whatever the transaction's access mode lets
# through (large objects, sequences, advisory locks, other servers, notifications, other sessions, server
# files and state): a write operation for every caller (403 read_only unless writes are allowed), matched by
# the function's own name, qualified or not. Read-only calls are also rolled back, which undoes most of them.
WRITING_PREFIXES = ("pg_advisory_", "pg_try_advisory_", "dblink", "pg_terminate_", "pg_cancel_",
                    "pg_reload_", "pg_rotate_", "pg_switch_", "pg_create_", "pg_drop_", "pg_replication_",
                    "pg_logical_", "pg_wal_replay_", "pg_backup_", "pg_stat_reset", "pg_import_system_",
                    "pg_file_", "pg_log_backend_", "pg_copy_", "binary_upgrade_")
# The functions that run SQL text of their own (query_to_xml's query, ts_stat's and ts_rewrite's select) count as
# writing too: no reader of the statement sees what that text calls (pg_terminate_backend, an advisory lock).
WRITING_NAMES = frozenset(("lo_create", "lo_creat", "lo_import", "lo_export", "lo_unlink", "lo_put", "lo_from_bytea",
                           "lo_truncate", "lo_truncate64", "lowrite", "nextval", "setval", "pg_notify", "pg_promote", "pg_start_backup",
                           "pg_stop_backup", "pg_stop_making_pinned_objects", "query_to_xml", "query_to_xmlschema",
                           "query_to_xml_and_xmlschema",
                           "ts_stat", "ts_rewrite",
                           # index maintenance: a ROLLBACK keeps what it did to the index (a range left
                           # unsummarized makes the BRIN index useless until someone summarizes it again)
                           "brin_summarize_new_values", "brin_summarize_range", "brin_desummarize_range",
                           "gin_clean_pending_list",
                           # pg_stat_statements' counters, which a rollback doesn't restore either
                           "pg_stat_statements_reset",
                           # assign the transaction an xid, which the rollback doesn't give back: a read-only
                           # caller's loop would bring the server nearer wraparound (the *_if_assigned variants
                           # assign none)
                           "txid_current", "pg_current_xact_id"))
_UNAVAILABLE = "pglast is not installed"


@dataclass(frozen=True, slots=True)
class Reading:
    """What PostgreSQL's parser reads in one text. Build it with read()."""

    failure: str | None               # the parser's refusal (the server refuses the same text), or why unread
    count: int                        # statements in the text
    kind: str                         # the node of the one statement ('' unless count == 1)
    query: bool                       # a query a cursor can page: SELECT/VALUES, no INTO, no locking, no writes
    write_ops: frozenset[str]         # empty for a read
    kind_op: str                      # a top-level statement that is not a query or DML: its kind ('' otherwise)
    tables: tuple[tuple[str, str, str], ...]      # (catalog, schema, name) as folded, '' where not written
    table_functions: tuple[tuple[str, str], ...]  # (schema, name) of functions in FROM
    functions: tuple[tuple[str, str], ...]        # (schema, name) of every other function call
    syntax_functions: tuple[str, ...] = ()        # functions the grammar itself names (EXTRACT, TRIM, ...):
                                                  # written pg_catalog.<name> by the parser, so built-ins
    names: frozenset = frozenset()                # every name the parser read (String nodes, relnames), as folded
    # Names read as a field of a row value (`x.f`, `t.c.f`, `(x).f`): PostgreSQL calls a function f(x) there when
    # no column has the name (its attribute notation), so each may be a function call nobody wrote as one.
    fields: frozenset = frozenset()
    # Every type the statement names (casts, column definition lists, RETURNING types), each as its name parts as
    # folded: the server looks each up in its catalog, as it looks up a table.
    types: tuple[tuple[str, ...], ...] = ()
    # Every operator the statement names (`a + b`, `x = ANY (...)`, `ORDER BY x USING <`, `OPERATOR(s.+)`), as
    # (schema as written or '', name): the server resolves each along the search_path to a function.
    operators: tuple[tuple[str, str], ...] = ()
    # SQL/JSON constructs the parser's grammar has and older servers' don't, as (name, the server's major version
    # that made the name grammar): a server below it reads each as a call of a function of that name
    # (functions.grammar_calls).
    grammar_calls: tuple[tuple[str, int], ...] = ()


def _decode(text: str):
    try:
        from pglast import parser  # noqa: PLC0415 - the postgres extra; without it PostgreSQL isn't served
    except ImportError:
        return None, _UNAVAILABLE
    try:
        return msgspec.json.decode(parser.parse_sql_json(text)), None
    except parser.ParseError as exc:
        return None, str(exc) or "syntax error"
    except (RecursionError, MemoryError, ValueError):
        return None, "too deeply nested"


@functools.lru_cache(maxsize=CACHE_SIZE)
def read(text: str) -> Reading:
    """The parser's reading of `text` (the statement as sent: placeholders as $n). Never raises for bad SQL."""
    tree, failure = _decode(text)
    if tree is None:
        return Reading(failure, 0, "", False, frozenset(), "", (), (), ())
    statements = [s.get("stmt") or {} for s in tree.get("stmts") or ()]
    walk = _Walk()
    try:
        for stmt in statements:
            walk.run(stmt)
    except _TooBig as why:
        return Reading(str(why), len(statements), "", False, frozenset(), "", (), (), ())
    kind = next(iter(statements[0]), "") if len(statements) == 1 else ""
    query = (kind == "SelectStmt" and not walk.ops)
    kind_op = ", ".join(sorted(walk.kind_ops))
    return Reading(None, len(statements), kind, query, frozenset(walk.ops), kind_op, tuple(sorted(walk.tables)),
                   tuple(sorted(walk.table_functions)), tuple(sorted(walk.functions - walk.table_functions)),
                   tuple(sorted(walk.syntax)), frozenset(walk.names), frozenset(walk.fields), tuple(sorted(walk.types)),
                   tuple(sorted(walk.operators)), tuple(sorted(walk.grammar_calls)))


class _TooBig(Exception):
    pass


class Reference(NamedTuple):
    """One reference to a table in the text: its name parts as folded, where it starts, whether it has an alias."""

    catalog: str
    schema: str
    name: str
    location: int          # in bytes of the UTF-8 text, as the parser counts (-1 when it gives none)
    aliased: bool


def references(text: str) -> tuple[list[Reference], frozenset[str]] | None:
    """Every reference to a table (not a CTE in scope) in a one-statement text, in no particular order, and the
    names of every CTE the statement defines (as the parser folds them); None when the parser refuses the text or
    it holds more than one statement. Not cached: masking keeps what it builds."""
    tree, _failure = _decode(text)
    if tree is None or len(tree.get("stmts") or ()) != 1:
        return None
    walk = _Walk()
    try:
        walk.run(tree["stmts"][0].get("stmt") or {})
    except _TooBig:
        return None
    return walk.references, frozenset(walk.cte_names)


# libpg_query is a newer PostgreSQL's grammar (pglast 8: PostgreSQL 18's) than many servers qag runs against. The
# names that became column-name keywords after PostgreSQL 15 (its pg_get_keywords() against pglast.keywords) are
# parsed into these SQL/JSON nodes, no function call; a server older than the version given reads the same text as
# an ordinary call of a function of that name, resolved along the search_path (json_value('x', 'y') runs a
# public.json_value), so such a call is judged as one (functions.grammar_calls). JSON_OBJECT's legacy form
# (json_object('a', 'b')) is parsed as pg_catalog.json_object since 16, where 15 resolves the bare name.
_GRAMMAR_CALLS = {
    "JsonArrayConstructor": ("json_array", 16), "JsonArrayQueryConstructor": ("json_array", 16),
    "JsonArrayAgg": ("json_arrayagg", 16), "JsonObjectConstructor": ("json_object", 16),
    "JsonObjectAgg": ("json_objectagg", 16), "JsonParseExpr": ("json", 17), "JsonScalarExpr": ("json_scalar", 17),
    "JsonSerializeExpr": ("json_serialize", 17), "MergeSupportFunc": ("merge_action", 17),
    "JsonTable": ("json_table", 17),
}
_JSON_FUNC_OPS = {"JSON_VALUE_OP": "json_value", "JSON_QUERY_OP": "json_query", "JSON_EXISTS_OP": "json_exists",
                  "JSON_TABLE_OP": "json_table"}
_LEGACY_JSON_OBJECT = ("pg_catalog", "json_object")

# The nodes that name an operator, and the field that holds its name (a list of strings: [schema,] name).
_OPERATOR_FIELDS = {"A_Expr": "name", "SubLink": "operName", "SortBy": "useOp"}
_COMPARISONS = ("<", "<=", ">", ">=")


def _names(items) -> tuple[str, ...]:
    return tuple(item.get("String", {}).get("sval", "") for item in items or ())


def _function_name(funcname) -> tuple[str, str]:
    parts = _names(funcname)
    if not parts:
        return "", ""
    return (parts[-2] if len(parts) > 1 else ""), parts[-1]


def writing(name: str) -> bool:
    """Whether a function of this (unqualified, folded) name changes state a read-only call must not change."""
    return name in WRITING_NAMES or name.startswith(WRITING_PREFIXES)


class _Walk:
    """One pass over the parser's tree: statement kinds, table references (with CTE scope) and functions."""

    def __init__(self):
        self.ops: set[str] = set()
        self.kind_ops: set[str] = set()
        self.syntax: set[str] = set()
        self.references: list[Reference] = []
        self.tables: set[tuple[str, str, str]] = set()
        self.table_functions: set[tuple[str, str]] = set()
        self.functions: set[tuple[str, str]] = set()
        self.names: set[str] = set()
        self.fields: set[str] = set()
        self.types: set[tuple[str, ...]] = set()
        self.operators: set[tuple[str, str]] = set()
        self.grammar_calls: set[tuple[str, int]] = set()
        self.cte_names: set[str] = set()
        self.nodes = 0

    def run(self, root: dict) -> None:
        stack = [(root, (), 0)]
        pop, push = stack.pop, stack.append
        while stack:
            value, scope, depth = pop()
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise _TooBig("too many nodes")
            if depth > MAX_DEPTH:
                raise _TooBig("nested too deep")
            if isinstance(value, list):
                for item in value:
                    push((item, scope, depth + 1))
                continue
            if not isinstance(value, dict):
                continue
            node = next(iter(value), "")
            if node == "String" and len(value) == 1 and isinstance(value[node], dict):
                # A name (a column, a field, a function's, a type's), never a constant (those are A_Const): so
                # `(x).pg_stat_get_activity`, a call written as a field, is read too.
                self.names.add(str(value[node].get("sval", "")))
            if len(value) == 1 and node[:1].isupper() and isinstance(value[node], dict):
                fields = value[node]         # a node: {"SelectStmt": {...fields}}
            else:
                # A field whose type is one kind of node comes without the wrapper ({"relname": ...} for a
                # RangeVar): recognised by its fields, so no table, function or type is missed (of every node,
                # only a TypeName has "names").
                node, fields = ("RangeVar" if "relname" in value else "FuncCall" if "funcname" in value
                                else "TypeName" if "names" in value else ""), value
            scope = self._statement(node, fields, scope, depth, push)
            relation = fields.get("relation") if node.endswith("Stmt") else None
            if isinstance(relation, dict):
                # A statement's target is always a table, even where a CTE has its name.
                self._table(relation.get("RangeVar", relation), ())
            if node == "RangeVar":
                self.names.add(str(fields.get("relname", "")))
                self._table(fields, scope)
                continue
            if node == "FuncCall":
                schema, name = _function_name(fields.get("funcname"))
                if fields.get("funcformat") == "COERCE_SQL_SYNTAX" and schema == "pg_catalog":
                    self.syntax.add(name)
                else:
                    self.functions.add((schema, name))
                if writing(name):
                    self.ops.add(name + "()")
                if (schema, name) == _LEGACY_JSON_OBJECT:
                    self.grammar_calls.add(("json_object", 16))
            elif node in _GRAMMAR_CALLS:
                self.grammar_calls.add(_GRAMMAR_CALLS[node])
            elif node == "JsonFuncExpr":
                self.grammar_calls.add((_JSON_FUNC_OPS.get(fields.get("op"), "json_value"), 17))
            elif node == "ColumnRef" or node == "A_Indirection":
                # every part after the first of x.f.g, and each .f of (expr).f: a column, or a call f(x)
                parts = fields.get("fields") if node == "ColumnRef" else [None, *(fields.get("indirection") or ())]
                for part in (parts or ())[1:]:
                    if isinstance(part, dict) and isinstance(part.get("String"), dict):
                        name = str(part["String"].get("sval", ""))
                        self.fields.add(name)
                        if writing(name):      # (1).pg_cancel_backend is pg_cancel_backend(1)
                            self.ops.add(name + "()")
            elif node == "TypeName":
                self.types.add(_names(fields.get("names")))
            elif node in _OPERATOR_FIELDS:
                name = fields.get(_OPERATOR_FIELDS[node])
                if name:
                    schema, op = _function_name(name)
                    # BETWEEN is read as comparisons: its name is no operator's
                    self.operators.update(((schema, o) for o in _COMPARISONS) if "BETWEEN" in op else ((schema, op),))
            elif (node == "CaseExpr" and fields.get("arg")) or (node == "JoinExpr" and (fields.get("usingClause")
                                                                                        or fields.get("isNatural"))):
                self.operators.add(("", "="))     # CASE x WHEN v, JOIN ... USING / NATURAL: equality, unnamed
            elif node == "RangeFunction":
                for item in fields.get("functions") or ():
                    for call in ((item.get("List") or {}).get("items") or ())[:1]:
                        call = call.get("FuncCall")
                        if call is not None:
                            self.table_functions.add(_function_name(call.get("funcname")))
            for key, item in fields.items():
                if isinstance(item, (dict, list)) and key != "withClause" and not (key == "relation" and relation):
                    push((item, scope, depth + 1))

    def _statement(self, node: str, fields: dict, scope, depth: int, push):
        """Record what a statement node writes; return the CTE scope its body sees (its WITH pushed)."""
        if node.endswith("Stmt"):
            if node in _DML_OPS:
                self.ops.add(_DML_OPS[node])
            elif node == "SelectStmt":
                if fields.get("intoClause"):
                    self.ops.add("select into")
                if fields.get("lockingClause"):
                    self.ops.add("lock")
            elif node == "ExplainStmt":
                analyze = any((o.get("DefElem") or {}).get("defname") == "analyze" for o in fields.get("options") or ())
                if not analyze:
                    # EXPLAIN without ANALYZE doesn't run the statement: only its tables and functions count.
                    inner = _Walk()
                    inner.run(fields.get("query") or {})
                    self.tables |= inner.tables
                    self.table_functions |= inner.table_functions
                    self.functions |= inner.functions
                    self.fields |= inner.fields
                    self.types |= inner.types     # planning still looks each type up
                    self.operators |= inner.operators
                    self.nodes += inner.nodes
                    fields.pop("query", None)
            elif node not in _READS:
                op = _STATEMENT_OPS.get(node) or node[:-4].lower()
                (self.kind_ops if depth == 0 else self.ops).add(op)
        with_clause = fields.get("withClause")
        if not with_clause:
            return scope
        with_clause = with_clause.get("WithClause", with_clause)
        recursive = bool(with_clause.get("recursive"))
        ctes = [cte.get("CommonTableExpr") or {} for cte in with_clause.get("ctes") or ()]
        names = tuple(cte.get("ctename") or "" for cte in ctes)
        self.cte_names.update(names)
        # WITH RECURSIVE: every CTE of the list is in scope in every one's body, later ones too (the server orders
        # them by what refers to what); otherwise a body sees the CTEs before it only.
        inner = scope
        for cte, name in zip(ctes, names):
            push((cte.get("ctequery") or {}, scope + names if recursive else inner, depth + 1))
            inner = inner + (name,)
        return inner

    def _table(self, fields: dict, scope) -> None:
        catalog = fields.get("catalogname") or ""
        schema = fields.get("schemaname") or ""
        name = fields.get("relname") or ""
        if not catalog and not schema and name in scope:
            return                      # a CTE in scope: names compare as folded, exactly as the server does
        self.tables.add((catalog, schema, name))
        self.references.append(Reference(catalog, schema, name, fields.get("location", -1), bool(fields.get("alias"))))
