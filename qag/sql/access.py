"""What a statement uses: its tables, table functions and functions, per dialect (contract 6.2's reading)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from qag.sql import functions, lexer, writes
from qag.sql.names import fold
from qag.sql.lexer import (BAD, COMMENT, NUMBER, PARAM, PUNCT, QIDENT, SEMI, STRING, TEXT, WORD, WS, XCOMMENT,
                           foreign_spaces, user_variable_at)

DIALECTS = ("mysql", "postgres", "sqlite")
_SQLGLOT = {"mysql": "mysql", "postgres": "postgres", "sqlite": "sqlite"}

# Past these a statement is refused unread (table_check_failed) rather than parsed: parse time and memory
# grow with them, and no saved query a person writes comes near.
MAX_SQL_CHARS = 100_000
MAX_TOKENS = 8_000         # significant tokens (a 200-line report is about 2,000)
MAX_PARENS = 64            # parentheses open at once
MAX_NODES = 50_000
MAX_DEPTH = 1_000          # levels of the parsed tree (a long AND chain or UNION is one level per arm)

# Schemas (and PostgreSQL schema prefixes) that hold the server's catalog and metadata: refused for a
# table-restricted key whatever it was granted, since they describe (or are) every other table.
_CATALOG_SCHEMAS = {
    "postgres": frozenset(("information_schema", "pg_catalog", "pg_toast")),
    "mysql": frozenset(("information_schema", "mysql", "performance_schema", "sys")),
    "sqlite": frozenset(),
}
_SQLITE_CATALOG = frozenset(("sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"))

# Nodes that make a statement uncheckable wherever they appear (statements the contract lists as refused).
_REFUSED_NODES = tuple(getattr(exp, name) for name in (
    "Command", "Show", "Set", "Use", "Pragma", "Attach", "Detach", "Describe", "Create", "Drop", "Alter",
    "TruncateTable", "Into", "LoadData", "Grant", "Revoke", "Comment", "Transaction", "Commit", "Rollback",
    "Kill", "Declare", "Execute", "Analyze", "Refresh", "Install", "Cache", "Uncache",
) if hasattr(exp, name))
# The statement kind the project's tokenizer reads → the sqlglot root types that agree with it.
_ROOTS = {
    "select": (exp.Query, exp.Subquery), "values": (exp.Values, exp.Query), "insert": (exp.Insert,),
    "replace": (exp.Insert,), "update": (exp.Update,), "delete": (exp.Delete,), "merge": (exp.Merge,),
    "copy": (exp.Copy,),
}
# Typed sqlglot table functions that only turn their arguments into rows (like functions.GENERATORS).
_GENERATOR_TYPES = tuple(getattr(exp, name) for name in (
    "Unnest", "GenerateSeries", "ExplodingGenerateSeries", "Explode", "Posexplode", "JSONTable",
) if hasattr(exp, name))
# DML statements whose target (args["this"]) is always a real table, even when a CTE has its name.
_DML = (exp.Insert, exp.Update, exp.Delete, exp.Merge, exp.Copy)


class ExactSchema(str):
    """A MySQL/MariaDB default schema on a server with lower_case_table_names=0: database and table names are
    compared exactly, as that server compares them, not lower-cased (docs/compatibility.md). It never equals
    (nor hashes like) the plain lower-case schema of the same text, so every cache keyed by the default schema
    (the analysis LRU, the prepared statement's plans, the qualified grants) keeps the two readings apart."""

    __slots__ = ()

    def __eq__(self, other):
        return type(other) is ExactSchema and str.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash(("exact names", str(self)))



def is_exact(default_schema) -> bool:
    """Whether default_schema is an ExactSchema: names on that MySQL/MariaDB server compare exactly."""
    return type(default_schema) is ExactSchema


class _Uncheckable(Exception):
    """The statement can't be checked (contract 6.2's table_check_failed)."""


CATALOG = "a catalog table"   # Access.failure of a statement that reads the engine's catalog (its tables listed)


@dataclass(frozen=True, slots=True)
class Access:
    """What one statement uses, for one dialect and default schema. Build it with access()."""

    failure: str | None               # why it can't be checked (internal; callers show CHECK_FAILED)
    tables: tuple[str, ...]           # real tables, qualified and lower-case, sorted (CATALOG: the catalog's)
    table_functions: tuple[str, ...]  # table functions that aren't pure generators (lower-case, as written)
    denied: tuple[str, ...]           # functions no restricted key may call
    user_functions: tuple[str, ...]   # functions that are not known built-ins (lower-case, qualified if written so)
    # Calls whose verdict depends on what the engine resolves them to (issue 18), judged against the
    # connection's functions.Catalog by verdict(): PostgreSQL: (schema, name) of calls unqualified or
    # qualified pg_catalog; MySQL/MariaDB: ('', name) of every name written as a call, unqualified (any stored
    # function of that name in the connection's database could answer it).
    calls: tuple[tuple[str, str], ...] = ()
    side: tuple[str, ...] = ()        # side-channel built-ins and MySQL @@variables read (functions.side_channel)
    explain: bool = False             # EXPLAIN: the engine's estimates come from its statistics
    describes: bool = False           # only describes tables' shapes (DESCRIBE t, SHOW TABLES, SHOW COLUMNS)
    # PostgreSQL: names read as a field of a row (pgread.Reading.fields), each a call f(x) if x has no column f;
    # verdict() judges those its catalog lists as one-argument functions (functions.Catalog.projections).
    fields: tuple[str, ...] = ()
    # PostgreSQL: the name-resolving types the statement casts to (functions.RESOLVING_TYPES: regclass, ...), a side
    # channel; and every other type it names that is not the engine's own, qualified like a table (a table's row
    # type has the table's name), judged against a key's allowed_tables as tables are; for each of those, how it
    # was written: (qualified as in types, schema as written or '' when unqualified, name), the schema None for a
    # name with a database part. verdict() lets through those the connection's catalog lists as its own types that
    # no relation's row type is (functions.Catalog.plain_type), by the spelling: an unqualified name resolves
    # along the call's search_path, where pg_catalog's row types come first.
    casts: tuple[str, ...] = ()
    types: tuple[str, ...] = ()
    type_names: tuple[tuple[str, str | None, str], ...] = ()
    # PostgreSQL: the operators the statement names, (schema as written or '', name); verdict() refuses one that
    # resolves to a function of the database's own (functions.Catalog.operators): an operator is a function call.
    operators: tuple[tuple[str, str], ...] = ()
    # PostgreSQL: SQL/JSON constructs of the parser's grammar that a server older than the version given reads as
    # a call of a function of that name (pgread.Reading.grammar_calls; functions.grammar_calls).
    grammar_calls: tuple[tuple[str, int], ...] = ()


# ------------------------------------------------------------------------------------------ statement text

def _ident(token_text: str, dialect: str) -> str:
    """A quoted identifier re-quoted the one way sqlglot reads for the dialect (no escapes to disagree on)."""
    open_, body = token_text[0], token_text[1:-1]
    if open_ == "[":
        name = body
    else:
        name = body.replace(open_ * 2, open_)
    if dialect == "mysql":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def _parse_text(text: str, tokens: list, start: int, dialect: str) -> str:
    """The statement as sqlglot should read it, built from the project's own tokens so both read the same
    boundaries: comments dropped, every string literal '0', quoted names re-quoted, parameters a literal."""
    out: list[str] = []
    prev = None
    for k, t in enumerate(tokens):
        if t.end <= start:
            continue
        kind = t.kind
        if kind in (WS, COMMENT):
            out.append(" ")
        elif kind == STRING:
            out.append("'0'")
        elif kind == QIDENT:
            out.append(_ident(text[t.start:t.end], dialect))
        elif kind in (PARAM, TEXT):
            out.append(" 0 ")
        elif kind == PUNCT:
            # Two '-' the tokenizer kept apart (MySQL "5--1") must not become a comment for sqlglot.
            if t.value == "-" and prev is not None and prev.kind == PUNCT and prev.value == "-":
                out.append(" ")
            out.append(t.value)
        elif kind == NUMBER:
            # The space keeps a number apart from a name written against it: MySQL reads "1e1from" as 1e1 FROM,
            # sqlglot as one name, so it gets "1e1 from".
            out.append(text[t.start:t.end] + " ")
        elif kind == WORD and user_variable_at(tokens, k):
            # A MySQL user variable's name runs over '.' and non-ASCII (`@x. from t`): any plain name reads the same.
            out.append("v")
        elif kind == WORD and ("0" <= t.value[:1] <= "9" or foreign_spaces(t.value)):
            # A name the server reads as one though it starts with digits (MySQL's 1abc, 0x1g, t.1e1from) or holds
            # what sqlglot takes for a space (U+00A0): quoted, so sqlglot reads the same one name.
            out.append(_ident("`" + text[t.start:t.end] + "`", dialect))
        elif kind == WORD:
            out.append(text[t.start:t.end])
        else:                                     # BAD, SEMI, XCOMMENT: refused before this is called
            raise _Uncheckable(kind)
        prev = t if kind != WS else prev
    return "".join(out)


# ------------------------------------------------------------------------------------------ walking the tree

def _part(node) -> tuple[str, bool] | None:
    if node is None:
        return None
    if not isinstance(node, exp.Identifier):
        raise _Uncheckable("a table name part that is not a name")
    return node.this, bool(node.args.get("quoted"))


def _cte_matches(cte: tuple[str, bool], ref: tuple[str, bool], dialect: str) -> bool:
    """Whether the engine reads the bare reference as this CTE. When unsure it says no, so the name counts
    as a table (refused unless granted) rather than hiding one."""
    name, quoted = cte
    ref_name, ref_quoted = ref
    lower = fold(dialect)          # SQLite, PostgreSQL: ASCII letters alone (a CTE ärger is never the table Ärger)
    if dialect == "postgres":      # unquoted names fold to lower case, quoted ones are exact
        return (name if quoted else lower(name)) == (ref_name if ref_quoted else lower(ref_name))
    # MySQL/MariaDB and SQLite match CTE names case-insensitively; a quoted CTE name is matched exactly
    # (contract 6.2), which is never wider than what the engine does.
    return name == ref_name if quoted else lower(name) == lower(ref_name)


def _function_name(node: exp.Func) -> tuple[str, tuple[str, ...]]:
    """(name as written, lower-case; every name sqlglot knows it by) of a function node."""
    if isinstance(node, exp.Anonymous) or type(node).__name__.startswith("Anonymous"):
        name = node.name.lower() if isinstance(node.this, str) or isinstance(node.this, exp.Identifier) else ""
        if not name:
            raise _Uncheckable("a function whose name can't be read")
        return name, (name,)
    names = tuple(n.lower() for n in getattr(type(node), "_sql_names", ()) or ()) or (node.sql_name().lower(),)
    return names[0], names


def _qualifier(dot: exp.Dot) -> str:
    parts = []
    node = dot.this
    while isinstance(node, exp.Dot):
        parts.append(node.expression)
        node = node.this
    parts.append(node)
    names = []
    for p in reversed(parts):
        if isinstance(p, (exp.Identifier, exp.Column)) and p.name:
            names.append(p.name.lower())
        else:
            raise _Uncheckable("a function qualifier that is not a name")
    return ".".join(names)


class _Walk:
    """One pass over a parsed statement: table references (with their CTE scope) and functions."""

    def __init__(self, dialect: str, exact: bool = False):
        self.dialect = dialect
        self.exact = exact                        # MySQL lower_case_table_names=0: names kept as written
        self.fold = fold(dialect)                 # else lower-cased as the engine folds them (SQLite: ASCII)
        self.refs: set[tuple] = set()             # (catalog, schema, name), lower-case; '' when not written
        self.table_functions: set[str] = set()
        self.functions: set[str] = set()          # lower-case, 'schema.name' when qualified, not typed built-ins
        self.denied: set[str] = set()
        self.side: set[str] = set()               # side-channel built-ins, @@variables
        self.calls: set[tuple[str, str]] = set()  # MySQL: every name written as an unqualified call
        self.explain = False
        self.nodes = 0

    def run(self, root) -> None:
        stack = [(root, (), 0)]
        pop, push = stack.pop, stack.append
        while stack:
            node, scope, depth = pop()
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise _Uncheckable("too many nodes")
            if depth > MAX_DEPTH:
                raise _Uncheckable("nested too deep")
            if isinstance(node, _REFUSED_NODES):
                raise _Uncheckable(type(node).__name__)
            depth += 1
            args = node.args
            with_ = args.get("with_") or args.get("with")
            if with_ is not None:
                # CTE bodies see the CTEs before them (and themselves with RECURSIVE); the rest sees all.
                recursive = bool(with_.args.get("recursive"))
                inner = scope
                for cte in with_.expressions:
                    alias = cte.args.get("alias")
                    ident = alias.this if alias is not None else None
                    if not isinstance(ident, exp.Identifier):
                        raise _Uncheckable("a CTE without a plain name")
                    name = (ident.this, bool(ident.args.get("quoted")))
                    push((cte.this, inner + (name,) if recursive else inner, depth))
                    inner = inner + (name,)
                    for key, value in cte.args.items():
                        if key not in ("this", "alias"):
                            self._push_value(value, inner, depth, push)
                scope = inner
            if isinstance(node, _DML):
                target = args.get("this")
                if isinstance(node, exp.Copy):
                    self._copy(node)
                self._push_value(target, (), depth, push)   # a DML target is never a CTE
                for key in ("tables",):                     # MySQL multi-table DELETE targets
                    self._push_value(args.get(key), (), depth, push)
                skip = ("this", "tables", "with_", "with")
            else:
                skip = ("with_", "with")
            if isinstance(node, exp.Table):
                self._table(node, scope, depth, push)
                continue
            if isinstance(node, exp.Lateral) and isinstance(node.this, exp.Func):
                self._table_function(node.this, None)
                for key, value in node.this.args.items():
                    self._push_value(value, scope, depth, push)
                skip = skip + ("this",)
            elif isinstance(node, exp.Func):
                self._function(node)
            for key, value in args.items():
                if key not in skip:
                    self._push_value(value, scope, depth, push)

    @staticmethod
    def _push_value(value, scope, depth, push) -> None:
        if isinstance(value, exp.Expression):
            push((value, scope, depth))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, exp.Expression):
                    push((item, scope, depth))

    def _copy(self, node: exp.Copy) -> None:
        # COPY to or from a file or program reaches outside the database: only STDIN/STDOUT can be checked.
        for f in node.args.get("files") or ():
            if not (isinstance(f, (exp.Var, exp.Identifier, exp.Column)) and f.name.lower() in ("stdin", "stdout")):
                raise _Uncheckable("COPY with a file")

    def _table(self, node: exp.Table, scope, depth, push) -> None:
        this = node.this
        rows_from = node.args.get("rows_from")
        for key, value in node.args.items():
            if key not in ("this", "db", "catalog", "rows_from"):
                self._push_value(value, scope, depth, push)   # alias, joins, pivots, sample, ...
        if rows_from:
            for item in rows_from:
                self._push_value(item, scope, depth, push)
            if this is None:
                return
        if isinstance(this, exp.Func):
            schema = _part(node.args.get("db"))
            self._table_function(this, schema[0].lower() if schema else None)
            for value in this.args.values():                 # its arguments are walked like any expression
                self._push_value(value, scope, depth, push)
            return
        name = _part(this)
        if name is None:
            raise _Uncheckable("a table without a name")
        schema = _part(node.args.get("db"))
        catalog = _part(node.args.get("catalog"))
        if schema is None and catalog is None and any(_cte_matches(c, name, self.dialect) for c in scope):
            return
        if self.dialect == "mysql" and schema is None and catalog is None and not name[1] and name[0].lower() == "dual":
            return          # MySQL's DUAL: a reserved word, not a table (a table named dual must be quoted)
        if self.exact:
            self.refs.add(((catalog[0] if catalog else ""), (schema[0] if schema else ""), name[0]))
        else:
            lower = self.fold
            self.refs.add(((lower(catalog[0]) if catalog else ""), (lower(schema[0]) if schema else ""),
                           lower(name[0])))

    def _table_function(self, func: exp.Func, schema: str | None) -> None:
        name, names = _function_name(func)
        if any(functions.denied(n, self.dialect) for n in names):
            self.denied.add(name)
        if schema is None and any(n.startswith("pragma_") for n in names) and self.dialect == "sqlite":
            # An eponymous virtual table of the catalog, with its arguments: read as the catalog table it is.
            self.refs.add(("", "", name.lower()))
            return
        if schema is None and (isinstance(func, _GENERATOR_TYPES) or any(n in functions.GENERATORS for n in names)):
            return
        self.table_functions.add(f"{schema}.{name}" if schema else name)

    def _function(self, node: exp.Func) -> None:
        name, names = _function_name(node)
        if any(functions.denied(n, self.dialect) for n in names):
            self.denied.add(name)
            return
        if any(functions.side_channel(n, self.dialect) for n in names):
            self.side.add(name)
        parent = node.parent
        if isinstance(parent, exp.Dot) and parent.expression is node:
            qualifier = _qualifier(parent)
            # pg_catalog.f is the built-in f itself (search_path puts pg_catalog first anyway).
            if not (self.dialect == "postgres" and qualifier == "pg_catalog" and functions.builtin(name, self.dialect)):
                self.functions.add(qualifier + "." + name)
            return
        if isinstance(node, exp.Anonymous) or type(node).__name__.startswith("Anonymous"):
            if not functions.builtin(name, self.dialect):
                self.functions.add(name)


# ------------------------------------------------------------------------------------------ analysis

def _statement_start(sig: list, dialect: str) -> int:
    """Offset index into sig where the checked statement starts (past EXPLAIN and its options)."""
    k = writes.first_word_index(sig, 0)
    if k < 0:
        raise _Uncheckable("no leading keyword")
    first = sig[k].value
    if first in ("describe", "desc") and dialect != "mysql":
        raise _Uncheckable("DESCRIBE")          # no such statement there: never read as one
    if first not in ("explain", "describe", "desc"):
        return 0                                # MySQL's DESCRIBE and DESC of a statement are its EXPLAIN
    target = writes.explain_target(sig, k)
    if target >= len(sig):
        raise _Uncheckable("EXPLAIN of nothing")
    if writes.word_at(sig, target) in ("explain", "describe", "desc"):
        raise _Uncheckable("EXPLAIN EXPLAIN")
    if dialect == "mysql" and writes.is_table_description(sig, target):
        raise _Uncheckable("EXPLAIN table")
    return target


def sqlite_in_table(sig: list) -> bool:
    """SQLite's `expr IN table` (and `IN schema.table`, `IN table_function(...)`): `IN` followed by a name rather
    than a parenthesis. The engine reads the table's rows where sqlglot reads a column."""
    return bool(_sqlite_in_sources(sig))


def _sqlite_in_sources(sig: list) -> list[tuple[int, int]]:
    """Where each SQLite `IN <table>` names its table: (first, end) character offsets of the name, with a table
    function's parenthesised arguments; a name that doesn't follow the grammar's shape ends at `IN` (unreadable)."""
    found = []
    n = len(sig)
    for i, token in enumerate(sig):
        if token.kind != WORD or token.value != "in" or (i + 1 < n and sig[i + 1].kind == PUNCT
                                                           and sig[i + 1].value == "("):
            continue
        j = i + 1
        if j < n and sig[j].kind in (WORD, QIDENT):
            j += 1
            if j + 1 < n and sig[j].kind == PUNCT and sig[j].value == "." and sig[j + 1].kind in (WORD, QIDENT):
                j += 2
            if j < n and sig[j].kind == PUNCT and sig[j].value == "(":
                depth = 0
                while j < n:
                    if sig[j].kind == PUNCT and sig[j].value in "()":
                        depth += 1 if sig[j].value == "(" else -1
                    j += 1
                    if depth == 0:
                        break
        found.append((sig[i + 1].start if i + 1 < n else token.end, sig[j - 1].end if j > i + 1 else token.end))
    return found


def _walk_sqlite_in(text: str, tokens: list, sig: list, walk: _Walk) -> None:
    """Each SQLite `IN <table>` is a read of that table (or table function), checked as `FROM` would check it."""
    for first, end in _sqlite_in_sources(sig):
        if first >= end:
            raise _Uncheckable("SQLite's IN with no table after it")
        _walk_read_of(text, [t for t in tokens if first <= t.start and t.end <= end], "sqlite", walk)


def _described_table(sig: list, dialect: str) -> tuple[int, int] | None:
    """MySQL's {DESCRIBE|DESC|EXPLAIN} tbl [col|'wild']: the slice of sig that names the table, else None."""
    if dialect != "mysql":
        return None
    k = writes.first_word_index(sig, 0)
    if k < 0 or sig[k].value not in ("describe", "desc", "explain") or not writes.is_table_description(sig, k + 1):
        return None
    dotted = k + 2 < len(sig) and sig[k + 2].kind == PUNCT and sig[k + 2].value == "."
    return (k + 1, k + 4) if dotted else (k + 1, k + 2)


def _walk_read_of(text: str, source: list, dialect: str, walk: _Walk) -> None:
    """The tokens of a table reference (a described table, SQLite's `IN <table>`) checked as a read of it: read
    by sqlglot in a query of it, so the name is qualified, folded and matched exactly as a table a statement reads,
    and a table function is judged as one in `FROM`."""
    try:
        tree = sqlglot.parse_one("SELECT 1 FROM " + _parse_text(text, source, 0, dialect), read=_SQLGLOT[dialect])
    except Exception:  # noqa: BLE001 - sqlglot's ParseError and anything else: refused as unreadable
        raise _Uncheckable("unparseable") from None
    if not isinstance(tree, exp.Select):
        raise _Uncheckable("sqlglot reads a different kind of statement")
    walk.run(tree)


def _analyse_reading(text: str, tokens: list, dialect: str, walk: _Walk) -> None:
    for t in tokens:
        if t.kind in (BAD, SEMI, XCOMMENT):
            raise _Uncheckable(t.kind)
    sig = lexer.significant(tokens)
    if len(sig) > MAX_TOKENS:
        raise _Uncheckable("too many tokens")
    depth = 0
    for t in sig:
        if t.kind == PUNCT:
            if t.value == "(":
                depth += 1
                if depth > MAX_PARENS:
                    raise _Uncheckable("nested too deep")
            elif t.value == ")":
                depth -= 1
    if dialect == "sqlite":
        _walk_sqlite_in(text, tokens, sig, walk)
    described = _described_table(sig, dialect)
    if described:
        # contract 6.2 lists DESCRIBE (MySQL's `EXPLAIN table` too) among the statements whose tables are checked
        _walk_read_of(text, sig[described[0]:described[1]], dialect, walk)
        return
    start = _statement_start(sig, dialect)
    if start:
        walk.explain = True
    if dialect == "mysql":
        _mysql_calls(text, sig, walk)
    k = writes.first_word_index(sig, start)
    if k < 0:
        raise _Uncheckable("no statement after EXPLAIN")
    kind = writes.main_keyword(sig, k)
    if kind == "with":
        kind = ""
    roots = _ROOTS.get(kind)
    if roots is None:
        raise _Uncheckable(f"statement kind {kind!r}")
    source = _parse_text(text, tokens, sig[start].start, dialect)
    try:
        trees = sqlglot.parse(source, read=_SQLGLOT[dialect])
    except RecursionError:
        raise _Uncheckable("nested too deep") from None
    except Exception:  # sqlglot's ParseError/TokenError and anything else it raises on odd input
        raise _Uncheckable("unparseable") from None
    trees = [t for t in trees if t is not None]
    if len(trees) != 1:
        raise _Uncheckable("sqlglot reads a different number of statements")
    tree = trees[0]
    if not isinstance(tree, roots) or (kind == "values" and not isinstance(tree, (exp.Values, exp.Query))):
        raise _Uncheckable("sqlglot reads a different kind of statement")
    try:
        walk.run(tree)
    except RecursionError:
        raise _Uncheckable("nested too deep") from None


_VARIABLE_SCOPES = frozenset(("global", "session", "local"))


def _mysql_calls(text: str, sig: list, walk: _Walk) -> None:
    """From the significant tokens: every name written as an unqualified call (a name, `quoted` or, under
    ANSI_QUOTES, "quoted", then '(' - whatever the whitespace or comments between, as a stored function is
    called), and every @@variable (server settings and diagnostics: @@version, @@global.x, @@warning_count).
    Names that are keywords or tables in front of '(' only ever meet a stored function of the same name."""
    n = len(sig)
    for j, t in enumerate(sig):
        kind = t.kind
        if kind == PUNCT:
            if t.value == "@" and j + 2 < n and sig[j + 1].kind == PUNCT and sig[j + 1].value == "@":
                k = j + 2
                if sig[k].kind == WORD and sig[k].value in _VARIABLE_SCOPES and k + 2 < n and \
                        sig[k + 1].kind == PUNCT and sig[k + 1].value == ".":
                    k += 2
                part = sig[k]
                name = part.value if part.kind == WORD else text[part.start + 1:part.end - 1].lower() \
                    if part.kind in (QIDENT, STRING) else "?"
                walk.side.add("@@" + name)
            continue
        if kind == WORD:
            name = t.value
        elif kind == QIDENT or (kind == STRING and text[t.start] == '"'):
            name = text[t.start + 1:t.end - 1].lower()
        else:
            continue
        if j + 1 < n and sig[j + 1].kind == PUNCT and sig[j + 1].value == "(" and \
                not (j and sig[j - 1].kind == PUNCT and sig[j - 1].value == "."):
            walk.calls.add(("", name))


def _describes(tokens: list) -> bool:
    """Whether a statement only describes tables' shapes, the way a masked key may run it (issue 18): DESCRIBE /
    DESC / MySQL's EXPLAIN of a table, SHOW [FULL] TABLES, SHOW [FULL] COLUMNS|FIELDS, with names and at most a
    LIKE pattern - no parenthesis, operator or WHERE (SHOW ... WHERE takes any expression, a subquery too)."""
    if any(t.kind in (BAD, SEMI, XCOMMENT) for t in tokens):
        return False
    sig = lexer.significant(tokens)
    if not sig or sig[0].kind != WORD:
        return False
    first = sig[0].value
    rest = sig[1:]
    for t in rest:
        if t.kind == PUNCT and t.value == ".":
            continue
        if t.kind not in (WORD, QIDENT, STRING):
            return False
    words = [t.value for t in rest if t.kind == WORD]
    if first in ("describe", "desc", "explain"):
        return 1 <= len(rest) <= 5 and not any(w in ("select", "with", "format", "extended", "partitions",
                                                    "analyze", "for") for w in words)
    if first != "show":
        return False
    if not words or words[0] not in ("tables", "columns", "fields", "full"):
        return False
    head = words[1] if words[0] == "full" and len(words) > 1 else words[0]
    return head in ("tables", "columns", "fields") and not any(w in _NOT_DESCRIBING for w in words)


# Words that make a SHOW more than a table's shape (a name spelled like one is refused too: stricter only).
_NOT_DESCRIBING = frozenset(("where", "status", "index", "indexes", "keys", "variables", "warnings", "errors",
                             "processlist", "grants", "create", "events", "triggers", "open", "engine", "engines",
                             "profile", "profiles", "master", "slave", "binlog", "relaylog", "global", "session",
                             "count", "plugins", "privileges", "table", "function", "procedure"))


def _qualify(ref: tuple, default_schema: str) -> str:
    catalog, schema, name = ref
    if catalog:
        return f"{catalog}.{schema or default_schema}.{name}"
    return f"{schema or default_schema}.{name}"


def _catalog_tables(refs, dialect: str, default_schema: str) -> tuple[str, ...]:
    """The catalog tables among `refs`, qualified as their engine resolves them (an unqualified pg_* name is
    pg_catalog's), sorted: shown in the refusal as any table outside the allow-list is."""
    found = set()
    for ref in refs:
        if _catalog_reference(ref, dialect, default_schema):
            if dialect == "postgres" and not ref[1] and ref[2].lower().startswith("pg_"):
                ref = (ref[0], "pg_catalog", ref[2])
            found.add(_qualify(ref, default_schema).lower())
    return tuple(sorted(found))


def _catalog_reference(ref: tuple, dialect: str, default_schema: str) -> bool:
    catalog, schema, name = ref
    schema = (schema or default_schema).lower()   # catalogs are refused in any spelling
    name = name.lower()
    if schema in _CATALOG_SCHEMAS[dialect]:
        return True
    if dialect == "postgres":
        # pg_catalog (every name in it starts with pg_) is searched before any schema for unqualified names.
        return schema.startswith("pg_") or (not ref[1] and name.startswith("pg_"))
    if dialect == "sqlite":
        # pragma_* are eponymous virtual tables: readable without the parentheses of a table function; dbstat
        # shows every table's pages and payload sizes.
        return name in _SQLITE_CATALOG or name.startswith(("sqlite_", "pragma_")) or name == "dbstat"
    return False



def uncheckable(why: str) -> Access:
    """The Access of a statement that can't be checked (callers show contract 6.2's table_check_failed)."""
    return Access(why, (), (), (), ())


def from_tokens(text: str, readings: list, dialect: str, default_schema) -> Access:
    """What a MySQL/MariaDB or SQLite statement uses, tables qualified with default_schema. readings: the
    statement's token readings from qag.sql.prepare (the dialect's own first, then each other way a server may
    read its backslashes and quotes), each read again by sqlglot over text rebuilt from those tokens. Never
    raises for bad SQL: an uncheckable statement has `failure` set."""
    exact_names = dialect == "mysql" and is_exact(default_schema)
    default_schema = str(default_schema or "")
    if not exact_names:
        default_schema = fold(dialect)(default_schema)
    tokens = readings[0] if readings else None
    try:
        if not readings:
            raise _Uncheckable("no statement")
        walk = _Walk(dialect, exact_names)
        # A server may read backslashes differently (NO_BACKSLASH_ESCAPES, ANSI_QUOTES, PostgreSQL's
        # standard_conforming_strings=off): every reading the guard considers must be checkable, and all
        # their tables count.
        for reading in readings:
            _analyse_reading(text, reading, dialect, walk)
        catalogs = _catalog_tables(walk.refs, dialect, default_schema)
        if catalogs:
            return Access(CATALOG, catalogs, (), (), (), describes=_describes(tokens))
    except _Uncheckable as why:
        return Access(str(why), (), (), (), (), describes=_describes(tokens) if tokens else False)
    except RecursionError:
        return Access("nested too deep", (), (), (), ())
    tables = tuple(sorted({_qualify(r, default_schema) for r in walk.refs}))
    return Access(None, tables, tuple(sorted(walk.table_functions)), tuple(sorted(walk.denied)),
                  tuple(sorted(walk.functions)), tuple(sorted(walk.calls)), tuple(sorted(walk.side)), walk.explain)


# PostgreSQL statement kinds whose tables can be checked (EXPLAIN is read as the statement it explains).
_PG_CHECKABLE = frozenset(("SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "ExplainStmt"))


def from_pgread(reading, unreadable: str | None, default_schema) -> Access:
    """What a PostgreSQL statement uses, from PostgreSQL's own parser (the prepared statement's
    qag.sql.pgread.Reading): names exactly as the server folds them (unquoted lower-case, quoted as written), so
    a quoted "Orders" is never the granted orders."""
    default_schema = str(default_schema or "").lower()
    if unreadable is not None or reading is None or reading.failure is not None:
        return Access(unreadable or (reading.failure if reading else "unread"), (), (), (), ())
    if reading.count != 1 or reading.kind not in _PG_CHECKABLE or reading.kind_op or "select into" in reading.write_ops:
        return Access(f"statement kind {reading.kind or reading.count}", (), (), (), ())
    catalogs = _catalog_tables(reading.tables, "postgres", default_schema)
    if catalogs:
        return Access(CATALOG, catalogs, (), (), ())
    denied: set[str] = set()
    side: set[str] = set()
    table_functions: set[str] = set()
    # Calls unqualified or qualified pg_catalog are judged by what they resolve to (verdict(), against the
    # connection's catalog); a call qualified with any other schema is a user-defined function.
    calls: set[tuple[str, str]] = set()
    for schema, name in reading.table_functions:
        if functions.denied(name, "postgres"):
            denied.add(name)
        if schema in ("", "pg_catalog") and name in functions.GENERATORS:
            calls.add((schema, name))
        else:
            table_functions.add(f"{schema}.{name}" if schema else name)
    user: set[str] = set()
    for schema, name in reading.functions:
        if functions.denied(name, "postgres"):
            denied.add(name)
        elif schema not in ("", "pg_catalog"):
            user.add(f"{schema}.{name}")
        elif functions.side_channel(name, "postgres"):
            side.add(name)
        else:
            calls.add((schema, name))
    for name in reading.syntax_functions:   # written pg_catalog.<name> by the parser itself
        if functions.denied(name, "postgres"):
            denied.add(name)
        elif functions.side_channel(name, "postgres"):
            side.add(name)
    casts, written = _pg_types(reading.types, default_schema)
    tables = tuple(sorted({_qualify(ref, default_schema) for ref in reading.tables}))
    return Access(None, tables, tuple(sorted(table_functions)), tuple(sorted(denied)), tuple(sorted(user)),
                  tuple(sorted(calls)), tuple(sorted(side)), reading.kind == "ExplainStmt",
                  fields=tuple(sorted(reading.fields)), casts=casts,
                  types=tuple(sorted({qualified for qualified, _, _ in written})), type_names=written,
                  operators=reading.operators, grammar_calls=reading.grammar_calls)


def _pg_types(type_names, default_schema: str) -> tuple[tuple[str, ...], tuple[tuple[str, str | None, str], ...]]:
    """The name-resolving types among the types a PostgreSQL statement names (by the last part of each name,
    whatever its schema or quoting), and the others that are not the engine's own: (qualified like a table, schema
    as written or '', name; the schema None when a database part is written too)."""
    casts: set[str] = set()
    written: set[tuple[str, str | None, str]] = set()
    for parts in type_names:
        if not parts:
            continue
        resolving = functions.resolving_type(parts[-1])
        if resolving is not None:
            casts.add(resolving)
        elif not functions.pg_builtin_type(parts):
            padded = ("", "", *parts)[-3:]
            schema = parts[-2] if len(parts) == 2 else "" if len(parts) == 1 else None
            written.add((_qualify(padded, default_schema), schema, parts[-1]))
    order = sorted(written, key=lambda item: (item[0], item[1] is None, item[1] or "", item[2]))
    return tuple(sorted(casts)), tuple(order)
