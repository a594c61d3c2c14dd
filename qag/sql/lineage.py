"""Column lineage (for masking): each result column, by position, traced to the source table columns it reads.

Build it through the prepared statement (Prepared.lineage), which gives sqlglot the statement as qag reads it.
sqlglot parses the statement in the connection's dialect, qualifies every column against the connection's schema
(expanding `*`), and the scope tree is walked: aliases, expressions, CTEs (recursive ones too), derived tables,
LATERAL subqueries, set operations and scalar subqueries in the select list. Anything that can't be followed with
certainty raises Unresolvable: the caller is refused rather than shown a column nobody could check (contract 6.3).
"""

from __future__ import annotations

from typing import NamedTuple

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, build_scope

# sqlglot dialect per connection dialect. MySQL column names are case-insensitive: compare them lower-cased.
DIALECTS = {"sqlite": "sqlite", "mysql": "mysql, normalization_strategy=lowercase", "postgres": "postgres"}

_SELF = ("", "", "", "self")  # a recursive CTE's reference to itself (resolved after its arms are traced)

# A result column read from no source column is a constant only when built from these (contract 6.3: literals,
# count(*), VALUES literals, ranking functions over no column). Anything else (version(), current_user, @@vars,
# unknown functions) can't be traced.
_CONSTANT_NODES = (exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Neg, exp.Not, exp.Binary, exp.Alias,
                   exp.Identifier, exp.Cast, exp.TryCast, exp.DataType, exp.DataTypeParam, exp.AggFunc, exp.Star,
                   exp.Window, exp.WindowSpec, exp.RowNumber, exp.Rank, exp.DenseRank, exp.PercentRank,
                   exp.CumeDist, exp.Ntile, exp.Ordered, exp.Order, exp.Tuple, exp.Case, exp.If, exp.Coalesce,
                   exp.Concat, exp.DPipe, exp.Interval, exp.Placeholder, exp.Exists, exp.Subquery)


class Unresolvable(Exception):
    """The statement's result can't be traced to source columns; the message says why (safe to show)."""


class Source(NamedTuple):
    schema: str    # lower-cased; '' when the statement and the connection name none
    table: str     # lower-cased
    column: str    # lower-cased
    view: bool     # the schema lists the table as a view


class Output(NamedTuple):
    name: str
    sources: frozenset   # of Source
    unknown: bool        # holds an expression that is neither a column nor a constant


class Schema:
    """A connection's schema compiled for qualification: built once per schema read, shared read-only."""

    __slots__ = ("mapping", "views", "default", "dialect", "generation", "columns", "exact", "listed")

    def __init__(self, raw: dict, dialect: str, default: str | None, exact: bool = False):
        from sqlglot.schema import MappingSchema  # noqa: PLC0415 - import cost only where masking is used
        nested: dict = {}
        views = set()
        # (schema, table) lower-case → [(column, declared type)], for masking at the source (policy/_source_mask)
        self.columns: dict[tuple[str, str], list[tuple[str, str]]] = {}
        written: dict[tuple[str, str], tuple[str, str]] = {}
        listed = set()
        clashing = set()
        for table in raw.get("tables", ()):
            schema = str(table.get("schema") or default or "")
            name = str(table["name"])
            columns = {str(c["name"]): "TEXT" for c in table.get("columns", ())}
            if not columns:
                continue
            key = (schema.lower(), name.lower())
            if written.setdefault(key, (schema, name)) != (schema, name):
                clashing.add(key)
            nested.setdefault(schema, {})[name] = columns
            listed.add((schema, name))
            self.columns[key] = [(str(c["name"]), str(c.get("type") or "")) for c in table.get("columns", ())]
            if table.get("type") == "view":
                views.add(key)
        # Two tables whose names differ only in case (`Billing.contacts` and `billing.contacts` on a server that
        # compares names exactly) would share one entry here, and the trace reads names case-blind: neither is
        # known, so a masked caller's statement naming either is refused rather than traced with the other's
        # columns.
        for key in clashing:
            del self.columns[key]
            views.discard(key)
        for schema, tables in nested.items():
            for name in [name for name in tables if (schema.lower(), name.lower()) in clashing]:
                del tables[name]
        nested = {schema: tables for schema, tables in nested.items() if tables}   # sqlglot refuses an empty one
        self.dialect = DIALECTS[dialect]
        self.mapping = MappingSchema(nested, dialect=self.dialect) if nested else None
        self.views = frozenset(views)
        self.default = default
        # A MySQL/MariaDB server with lower_case_table_names=0 compares database and table names exactly: there a
        # table is known only as the server lists it (`Customers` is no table of a database holding `customers`).
        self.exact = exact
        self.listed = frozenset(key for key in listed if (key[0].lower(), key[1].lower()) not in clashing)
        self.generation = 0   # set by the cache that read it: traced plans are kept per generation

    def lists(self, schema: str, table: str) -> bool:
        """Whether the schema lists this table (with columns), its names compared as the server compares them."""
        if self.exact:
            return (schema, table) in self.listed
        return (schema.lower(), table.lower()) in self.columns


def trace(sql: str, schema: Schema) -> tuple[Output, ...]:
    """The result columns of sql in order, each with the source columns it is computed from.

    Raises Unresolvable. A statement without a result (a write without RETURNING) has no columns."""
    try:
        return _trace(sql, schema)
    except Unresolvable:
        raise
    except RecursionError:
        raise Unresolvable("the statement is nested too deeply to trace its columns") from None
    except Exception as exc:  # noqa: BLE001 - a parser or optimizer failure refuses, never shows data
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise Unresolvable(f"its columns can't be traced ({text})") from None


def _trace(sql: str, schema: Schema) -> tuple[Output, ...]:
    trees = [t for t in sqlglot.parse(sql, read=schema.dialect) if t is not None]
    if len(trees) != 1:
        raise Unresolvable("it isn't a single statement")
    tree = trees[0]
    if isinstance(tree, (exp.Insert, exp.Update, exp.Delete)):
        if tree.args.get("returning") is not None:
            raise Unresolvable("the columns a write returns (RETURNING) can't be traced")
        if tree.find(exp.Returning) is not None:
            raise Unresolvable("the columns a write returns (RETURNING) can't be traced")
        return ()
    if isinstance(tree, exp.Values):
        return _values(tree)
    if not isinstance(tree, exp.Query):
        raise Unresolvable("it isn't a query whose columns can be traced")
    _check_raw(tree)
    if schema.dialect == DIALECTS["mysql"]:
        for table in tree.find_all(exp.Table):
            # MySQL's DUAL is the unquoted word, unqualified (a quoted `dual` is a real table's name); marked before
            # qualify() gives it the default database.
            if not table.db and isinstance(table.this, exp.Identifier) and not table.this.quoted \
                    and table.name.lower() == "dual":
                table.meta["dual"] = True
    if schema.mapping is None:
        tree = qualify(tree, dialect=schema.dialect, db=schema.default, expand_stars=True,
                       validate_qualify_columns=True, quote_identifiers=False, identify=False)
    else:
        tree = qualify(tree, schema=schema.mapping, dialect=schema.dialect, db=schema.default, expand_stars=True,
                       validate_qualify_columns=True, quote_identifiers=False, identify=False)
    root = build_scope(tree)
    if root is None:
        raise Unresolvable("its columns can't be traced")
    _check_tables_listed(root, schema)
    outputs = tuple(_Tracer(root, schema).outputs(root))
    if any(_SELF in o.sources for o in outputs):
        raise Unresolvable("a recursive CTE's columns can't be traced")
    for o in outputs:
        if o.unknown and not o.sources:
            raise Unresolvable(f"the column {o.name} is neither read from a table nor a constant")
    return outputs


def _check_tables_listed(root: Scope, schema: Schema) -> None:
    """Every table the statement reads, in any scope (a predicate's, a subquery's, a CTE's), is one the schema
    lists. A table it doesn't list has no columns to mask at the source, so a rule on it would go unapplied.
    Which names are tables and which are CTEs is sqlglot's scoping, the engine's: a name that is a CTE in one
    scope is the real table in another (a CTE defined inside a subquery, or later in a non-recursive WITH)."""
    for scope in root.traverse():
        for source in scope.sources.values():
            if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
                continue          # a CTE, a derived table, or a table function (refused when traced)
            if source.meta.get("dual"):
                continue
            key = ((source.db or schema.default or "").lower(), source.name.lower())
            if key not in schema.columns:
                raise Unresolvable(f"{source.name} is not a table of the connection's schema: its columns can't "
                                   f"be masked")


def _values(tree: exp.Values) -> tuple[Output, ...]:
    """A bare VALUES statement: constants only (a column or function in it can't be traced here)."""
    widths = {len(row.expressions) if isinstance(row, exp.Tuple) else 1 for row in tree.expressions}
    if len(widths) != 1:
        raise Unresolvable("a VALUES list can't be traced")
    for node in tree.walk():
        if node is not tree and not isinstance(node, _CONSTANT_NODES) or isinstance(node, (exp.Anonymous,
                                                                                           exp.AggFunc)):
            raise Unresolvable("a VALUES list holds something other than constants")
    return tuple(Output(f"column{i + 1}", frozenset(), False) for i in range(widths.pop()))


def _check_raw(tree: exp.Expression) -> None:
    """Shapes refused before qualification (sqlglot would quietly rewrite some of them)."""
    for alias in tree.find_all(exp.TableAlias):
        if alias.args.get("columns") and isinstance(alias.parent, exp.Table):
            raise Unresolvable(f"the table alias {alias.name} renames its columns")
    for select in tree.find_all(exp.Select):
        starred = any(isinstance(e, exp.Star) or (isinstance(e, exp.Column) and isinstance(e.this, exp.Star))
                      for e in select.expressions)
        if not starred:
            continue
        joins = select.args.get("joins") or []
        if any(j.args.get("using") or (j.method or "").upper() == "NATURAL" for j in joins):
            raise Unresolvable("SELECT * over a NATURAL or USING join can't be traced")
        from_ = select.args.get("from_") or select.args.get("from")
        items = ([from_.this] if from_ is not None else []) + [j.this for j in joins]
        if len(items) > 1 and any(not isinstance(i, exp.Table) for i in items):
            raise Unresolvable("SELECT * over a subquery, VALUES or LATERAL joined with other tables can't be traced")


class _Tracer:
    def __init__(self, root: Scope, schema: Schema):
        self.schema = schema
        self.by_node = {id(s.expression): s for s in root.traverse()}
        self.done: dict[int, list[Output]] = {}
        self.busy: set[int] = set()

    def outputs(self, scope: Scope) -> list[Output]:
        key = id(scope.expression)  # a recursive CTE's self-reference is another Scope over the same node
        found = self.done.get(key)
        if found is not None:
            return found
        if key in self.busy:
            return []  # a recursive CTE reading itself: _resolve marks it _SELF
        self.busy.add(key)
        try:
            result = self._outputs(scope)
        finally:
            self.busy.discard(key)
        self.done[key] = result
        return result

    def _outputs(self, scope: Scope) -> list[Output]:
        node = scope.expression
        if isinstance(node, exp.SetOperation):
            arms = [self.outputs(s) for s in scope.set_operation_scopes]
            if len({len(a) for a in arms}) != 1:
                raise Unresolvable("the arms of a set operation have different numbers of columns")
            merged = [Output(arms[0][i].name, frozenset().union(*(a[i].sources for a in arms)),
                             any(a[i].unknown for a in arms)) for i in range(len(arms[0]))]
            if any(_SELF in o.sources for o in merged):
                # A recursive CTE moves values between its columns from one step to the next: each of its
                # columns may hold what any of them reads.
                everything = frozenset().union(*(o.sources for o in merged)) - {_SELF}
                unknown = any(o.unknown for o in merged)
                merged = [Output(o.name, everything, unknown) for o in merged]
            return merged
        if isinstance(node, exp.Select):
            out = []
            for projection in node.expressions:
                if isinstance(projection, exp.Star):
                    raise Unresolvable("a * could not be expanded from the connection's schema")
                sources, unknown = self._expr(projection, scope)
                out.append(Output(projection.alias_or_name.lower(), frozenset(sources), unknown))
            return out
        if isinstance(node, exp.Values):
            alias = node.args.get("alias")
            names = [c.name.lower() for c in alias.columns] if alias is not None else []
            width = {len(row.expressions) if isinstance(row, exp.Tuple) else 1 for row in node.expressions}
            if len(width) != 1 or (names and len(names) != width.pop()):
                raise Unresolvable("a VALUES list can't be traced")
            sources, unknown = set(), False
            for row in node.expressions:
                found, odd = self._expr(row, scope)
                sources |= found
                unknown |= odd
            return [Output(n, frozenset(sources), unknown) for n in names]
        if isinstance(node, exp.Lateral):
            inner = node.this
            child = self.by_node.get(id(inner.this if isinstance(inner, exp.Subquery) else inner))
            if child is None:
                raise Unresolvable("a table function's columns can't be traced")
            return self.outputs(child)
        raise Unresolvable(f"a {type(node).__name__.lower()} source can't be traced")

    def _expr(self, node: exp.Expression, scope: Scope) -> tuple[set, bool]:
        """Source columns under node (scalar subqueries included, with every column they read) and whether it
        holds anything that is neither a column nor a constant."""
        sources: set = set()
        unknown = False
        stack = [(node, scope)]
        while stack:
            item, where = stack.pop()
            if isinstance(item, exp.Column):
                if isinstance(item.this, exp.Star):
                    raise Unresolvable("a * could not be expanded from the connection's schema")
                sources |= self._resolve(item, where)
                continue
            if isinstance(item, exp.Subquery):
                stack.append((item.this, where))
                continue
            if item is not where.expression and isinstance(item, exp.Query):
                inner = self.by_node.get(id(item))
                if inner is None:
                    raise Unresolvable("a subquery can't be traced")
                for o in self.outputs(inner):
                    sources |= o.sources
                    unknown |= o.unknown
                stack.extend((child, inner) for child in item.iter_expressions())
                continue
            if isinstance(item, exp.Anonymous) or not isinstance(item, _CONSTANT_NODES + (exp.Values,)):
                unknown = True
            stack.extend((child, where) for child in item.iter_expressions())
        return sources, unknown

    def _resolve(self, column: exp.Column, scope: Scope) -> set:
        table = column.table
        if not table:
            raise Unresolvable(f"the column {column.name} can't be matched to a table")
        name = column.name.lower()
        where: Scope | None = scope
        while where is not None:
            source = where.sources.get(table)
            if source is not None:
                break
            where = where.parent
        else:
            raise Unresolvable(f"the column {table}.{column.name} can't be matched to a table")
        if isinstance(source, exp.Table):
            if not isinstance(source.this, exp.Identifier):
                raise Unresolvable("a table function's columns can't be traced")
            schema = (source.db or self.schema.default or "").lower()
            real = source.name.lower()
            return {Source(schema, real, name, (schema, real) in self.schema.views)}
        if id(source.expression) in self.busy:
            return {_SELF}
        found = [o for o in self.outputs(source) if o.name == name]
        if not found:
            raise Unresolvable(f"the column {table}.{column.name} can't be traced")
        out: set = set()
        for o in found:
            if o.unknown and not o.sources:
                raise Unresolvable(f"the column {table}.{column.name} can't be traced")
            out |= o.sources
        return out
