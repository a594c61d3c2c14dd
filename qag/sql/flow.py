"""Best-effort statement outline for the management routes: tables read, joins, pretty-printed SQL."""

from __future__ import annotations

import functools
import re

import sqlglot
from sqlglot import exp

from qag.sql.prepare import prepare

_SQLGLOT_DIALECT = {"sqlite": "sqlite", "mysql": "mysql", "postgres": "postgres"}
_TEXT_MARK = "__qag_text_"    # {name} is parsed as the placeholder :__qag_text_name and printed back
_TOKEN_REPR_RE = re.compile(r"<Token token_type: [^,]*, text: (.*?), line: .*?>")


def _placeholder_as_written(node: exp.Expression) -> exp.Expression:
    """Print :name and {name} as written: sqlglot would print %(name)s for PostgreSQL."""
    if isinstance(node, exp.Placeholder) and node.name:
        if node.name.startswith(_TEXT_MARK):
            return exp.Var(this="{" + node.name[len(_TEXT_MARK):] + "}")
        return exp.Var(this=":" + node.name)
    return node


def _parse(sql: str, dialect: str) -> list[exp.Expression]:
    """sqlglot trees of the statement, {name} written as a placeholder sqlglot reads; raises on failure."""
    p = prepare(sql, dialect)
    if p.unreadable is not None:
        raise ValueError(p.unreadable)
    text = p.text_placeholders_written(lambda name: ":" + _TEXT_MARK + name)
    trees = [t for t in sqlglot.parse(text, read=_SQLGLOT_DIALECT[p.dialect]) if t is not None]
    if not trees:
        raise ValueError("no statement")
    return trees


def _table_name(table: exp.Table) -> str | None:
    """Lower-cased name as written (schema/catalog kept), None for a table function."""
    if not isinstance(table.this, exp.Identifier):
        return None
    parts = [part.name for part in (table.args.get("catalog"), table.args.get("db")) if part is not None]
    parts.append(table.name)
    return ".".join(parts).lower()


def _collect(node: exp.Expression, ctes: frozenset[str], out: set[str]) -> None:
    """Add the real tables under node to out; names in ctes are CTEs in scope there."""
    with_ = node.args.get("with_") or node.args.get("with")
    if isinstance(with_, exp.With):
        recursive = bool(with_.args.get("recursive"))
        scope = set(ctes)
        for cte in with_.expressions:
            name = cte.alias_or_name.lower()
            # A CTE sees the ones before it, and itself only WITH RECURSIVE.
            body_scope = frozenset(scope | {name}) if recursive else frozenset(scope)
            _collect(cte.this, body_scope, out)
            scope.add(name)
        ctes = frozenset(scope)
    for child in node.iter_expressions():
        if child is with_:
            continue
        if isinstance(child, exp.Table):
            name = _table_name(child)
            if name is not None and not (child.args.get("db") is None and name in ctes):
                out.add(name)
        _collect(child, ctes, out)


@functools.lru_cache(maxsize=256)
def _tables(sql: str, dialect: str) -> tuple[str, ...] | None:
    try:
        trees = _parse(sql, dialect)
        out: set[str] = set()
        for tree in trees:
            if isinstance(tree, exp.Table):
                name = _table_name(tree)
                if name:
                    out.add(name)
            _collect(tree, frozenset(), out)
    except Exception:  # parse errors, RecursionError on deep nesting: "can't tell"
        return None
    return tuple(sorted(out))


def tables(sql: str, dialect: str) -> list[str] | None:
    """Real tables the statement names (CTEs excluded), lower-cased, sorted; None if it can't be parsed."""
    found = _tables(sql, dialect)
    return None if found is None else list(found)


def _source_name(node: exp.Expression) -> str:
    if isinstance(node, exp.Table):
        return _table_name(node) or node.alias_or_name.lower()
    return (node.alias_or_name or node.sql()).lower()


def _join_type(join: exp.Join) -> str:
    words = [w for w in (join.method, join.side, join.kind) if w]
    if not words:
        words.append("INNER" if join.args.get("on") is not None or join.args.get("using") else "CROSS")
    return " ".join(words + ["JOIN"]).upper()


def _joins(tree: exp.Expression, dialect: str) -> list[dict]:
    out = []
    for select in tree.find_all(exp.Select):
        from_ = select.args.get("from_") or select.args.get("from")
        if from_ is None:
            continue
        aliases: dict[str, str] = {}
        first = from_.this
        aliases[first.alias_or_name.lower()] = _source_name(first)
        previous = _source_name(first)
        for join in select.args.get("joins") or []:
            right_node = join.this
            right = _source_name(right_node)
            right_alias = right_node.alias_or_name.lower()
            aliases[right_alias] = right
            on = join.args.get("on")
            using = join.args.get("using")
            left = previous
            if on is not None:
                # The left side is the other source the condition names, if it names one.
                for column in on.find_all(exp.Column):
                    qualifier = column.table.lower()
                    if qualifier and qualifier != right_alias and qualifier in aliases:
                        left = aliases[qualifier]
                        break
                condition = on.sql(dialect=_SQLGLOT_DIALECT[dialect])
            elif using:
                condition = "USING (" + ", ".join(u.sql(dialect=_SQLGLOT_DIALECT[dialect]) for u in using) + ")"
            else:
                condition = None
            out.append({"left": left, "right": right, "type": _join_type(join), "on": condition})
            previous = right
    return out


def flow(sql: str, dialect: str) -> dict:
    """{"tables", "joins": [{"left", "right", "type", "on"}], "formatted", "error"}; never raises."""
    try:
        prepared = prepare(sql, dialect)
        if prepared.unreadable is not None:
            return {"tables": [], "joins": [], "formatted": None,
                    "error": f"The SQL statement can't be read: {prepared.unreadable}"}
        canonical = prepared.dialect
        trees = _parse(sql, dialect)
        joins: list[dict] = []
        for tree in trees:
            joins.extend(_joins(tree, canonical))
        formatted = ";\n\n".join(
            t.transform(_placeholder_as_written).sql(dialect=_SQLGLOT_DIALECT[canonical], pretty=True)
            for t in trees)
        found = tables(sql, dialect)
        return {"tables": found or [], "joins": joins, "formatted": formatted, "error": None}
    except sqlglot.errors.ParseError as e:
        first = e.errors[0] if e.errors else {}
        description = _TOKEN_REPR_RE.sub(r"'\1'", str(first.get("description") or "The SQL could not be parsed"))
        where = f" (line {first.get('line')}, column {first.get('col')})" if first.get("line") else ""
        return {"tables": [], "joins": [], "formatted": None, "error": description + where}
    except Exception as e:  # the outline is best effort: any other failure is reported, not raised
        return {"tables": [], "joins": [], "formatted": None, "error": f"The SQL could not be analysed: {e}"}

