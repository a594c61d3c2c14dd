"""Where each table reference of a statement starts and ends, as the engine reads it (masking at the source).

PostgreSQL's own parser (qag/sql/pgread) on PostgreSQL; sqlglot on MySQL/MariaDB and SQLite, cross-checked against
qag's tokens (differential-tested against the server). Build it through the prepared statement
(Prepared.table_references). What can't be located for certain raises Unresolvable.
"""

from __future__ import annotations

import sqlglot
from sqlglot import exp

from qag.sql import lexer, pgread
from qag.sql.lineage import Unresolvable

_SQLGLOT = {"mysql": "mysql", "sqlite": "sqlite"}


def _placeholders_blanked(sql: str, tokens: list, dialect: str, blank_comments: bool) -> str:
    """The text with every placeholder (and, for sqlglot, every comment) replaced by text of the same length, so
    positions found in it are positions in `sql`."""
    out = []
    for k, token in enumerate(tokens):
        piece = sql[token.start:token.end]
        if token.kind in (lexer.PARAM, lexer.TEXT):
            out.append(("$1" if dialect == "postgres" else "0").ljust(len(piece)))
        elif token.kind == lexer.COMMENT and blank_comments:
            out.append("".join(c if c == "\n" else " " for c in piece))
        elif token.kind in (lexer.XCOMMENT, lexer.BAD):
            raise Unresolvable("the statement can't be read the way the engine runs it")
        elif token.kind == lexer.NUMBER and dialect != "postgres":
            # A number is never a table: written as 0 and spaces, it can't run into a name written against it
            # (MySQL reads "1e1from t" as 1e1 FROM t; sqlglot would read one name and hide the table).
            out.append("0".ljust(len(piece)))
        elif dialect != "postgres" and lexer.user_variable_at(tokens, k):
            out.append("v".ljust(len(piece)))     # a MySQL user variable (`@x. from t`): never a table either
        elif token.kind == lexer.WORD and dialect != "postgres" and lexer.foreign_spaces(piece):
            # What sqlglot would take for spaces inside one name (U+00A0): it can't be located as one name.
            raise Unresolvable("a name holds a character the parser reads as a space")
        else:
            out.append(piece)
    return "".join(out)


def find(sql: str, tokens: list, dialect: str) -> list[tuple[int, int, str, str, bool, bool]]:
    """(start, end, schema as written or '', table, has an alias, named like a CTE of the statement) of every
    table reference in sql, as the engine reads it (PostgreSQL: CTEs in scope are not table references at all).
    tokens: qag's reading of sql (the prepared statement's). Raises Unresolvable."""
    if dialect == "postgres":
        return _postgres_references(sql, tokens)
    return _sqlglot_references(sql, tokens, dialect)


def _postgres_references(sql: str, tokens: list) -> list:
    text = _placeholders_blanked(sql, tokens, "postgres", blank_comments=False)
    read = pgread.references(text)
    if read is None:
        raise Unresolvable("the statement can't be read as one statement")
    refs, cte_names = read
    encoded = text.encode("utf-8")
    out = []
    for ref in refs:
        if ref.location < 0:
            raise Unresolvable("a table reference without a position")
        start = len(encoded[:ref.location].decode("utf-8", "strict"))
        end = _name_end(text, start, [p for p in (ref.catalog, ref.schema, ref.name) if p])
        # Named like a CTE of the statement (wherever it is in scope): masking refuses such a masked table, as on
        # the other engines, so no reading of CTE scope decides where a masked table's values come from.
        out.append((start, end, ref.schema, ref.name, ref.aliased, ref.name in cte_names))
    return out


def _name_end(text: str, start: int, parts: list[str]) -> int:
    """The end of the dotted name at `start` whose parts fold to `parts` (PostgreSQL's folding), or Unresolvable."""
    position = start
    for i, part in enumerate(parts):
        if i:
            while position < len(text) and text[position] in " \t\r\n":
                position += 1
            if text[position:position + 1] != ".":
                raise Unresolvable("a table name that isn't where the parser put it")
            position += 1
            while position < len(text) and text[position] in " \t\r\n":
                position += 1
        if text[position:position + 1] == '"':
            close = position + 1
            while True:
                close = text.find('"', close)
                if close < 0:
                    raise Unresolvable("an unterminated quoted name")
                if text[close + 1:close + 2] == '"':
                    close += 2
                    continue
                break
            word = text[position + 1:close].replace('""', '"')
            position = close + 1
        else:
            end = position
            while end < len(text) and (text[end].isalnum() or text[end] in "_$"):
                end += 1
            word = text[position:end].lower()
            position = end
        if word != part:
            raise Unresolvable("a table name that isn't where the parser put it")
    return position


def _sqlglot_references(sql: str, tokens: list, dialect: str) -> list:
    text = _placeholders_blanked(sql, tokens, dialect, blank_comments=True)
    try:
        trees = [t for t in sqlglot.parse(text, read=_SQLGLOT[dialect]) if t is not None]
    except Exception:  # noqa: BLE001 - sqlglot's ParseError/TokenError: a text it can't read is refused
        raise Unresolvable("the statement can't be read") from None
    if len(trees) != 1:
        raise Unresolvable("it isn't a single statement")
    tree = trees[0]
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    tokens = {t.start: t for t in tokens}
    out = []
    for table in tree.find_all(exp.Table):
        name = table.this
        if not isinstance(name, exp.Identifier):
            continue                 # a table function: the trace refuses those for masked callers
        cte_named = table.args.get("db") is None and name.name.lower() in ctes
        parts = [table.args.get(k) for k in ("catalog", "db")] + [name]
        parts = [p for p in parts if p is not None]
        if not all(isinstance(p, exp.Identifier) and "start" in p.meta for p in parts):
            raise Unresolvable("a table name without a position")
        start, end = parts[0].meta["start"], parts[-1].meta["end"] + 1
        # qag's tokenizer must see the same name there: words, quoted names and dots only, token-aligned.
        position = start
        while position < end:
            token = tokens.get(position)
            if token is None or token.kind not in (lexer.WORD, lexer.QIDENT, lexer.PUNCT, lexer.WS) or \
                    (token.kind == lexer.PUNCT and token.value != "."):
                raise Unresolvable("a table name the readers don't agree on")
            position = token.end
        if position != end:
            raise Unresolvable("a table name the readers don't agree on")
        schema = table.args.get("db")
        out.append((start, end, schema.name if schema is not None else "", name.name, bool(table.alias), cte_named))
    return out
