"""Masking at the source: every table with a masked column is read through a derived table of masked values.

For a caller with mask rules, each reference to a table that has a masked column is replaced, in the statement's
own text, by `(SELECT <masked expressions> AS <original names> FROM <the reference>) <alias>`: no predicate, join,
grouping, ordering, function, CTE, set operation, subquery or window of the statement can see the raw value,
because the engine never gives it one. The rest of the text is left byte for byte as written.

Where a reference starts and ends comes from the engine's reading, through the prepared statement
(qag/sql/references.py: PostgreSQL's own parser on PostgreSQL; sqlglot on MySQL/MariaDB and SQLite, cross-checked
against qag's tokenizer, differential-tested against the server). The rewritten text is read again and every reference to a masked table must be one of the
derived tables' own; anything that can't be shown to be covered is refused (Unresolvable: 403 mask_unresolvable).

The masked values are computed by the engine as the contract defines them (docs/masking.md): `hash` is
HMAC-SHA256 of the value's text, keyed like the post-processing hash — the key's two padded forms travel as bound
values (`:qag_mask_ipad`, `:qag_mask_opad`, in hex), never in the statement's text; on SQLite the values go through the
same Python functions, registered on the call's connection. A caller's own `hash` rules (/execute_sql's `mask`,
OWN_HASH) are keyed apart, with a key derived from the mask key (masking.own_key): their pads are bound as
`:qag_mask_own_ipad`/`:qag_mask_own_opad`, their SQLite function is `qag_mask_own_hash`, so no value a caller hashes
by its own rule can be compared with one an administrator's rule hashed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..sql import lexer
from ..sql.lineage import Unresolvable
from ..sql.prepare import MAX_STATEMENT_CHARS, prepare

IPAD = "qag_mask_ipad"
OPAD = "qag_mask_opad"
OWN_IPAD = "qag_mask_own_ipad"     # the pads of the key of a caller's own hash rules (masking.own_key)
OWN_OPAD = "qag_mask_own_opad"
PADS = (IPAD, OPAD, OWN_IPAD, OWN_OPAD)
SQLITE_HASH = "qag_mask_hash"
SQLITE_OWN_HASH = "qag_mask_own_hash"
SQLITE_MASK = "qag_mask_text"
FUNCTIONS = (SQLITE_HASH, SQLITE_OWN_HASH, SQLITE_MASK)
# `hash` by a caller's own rule (/execute_sql's `mask`): keyed with the derived key, never the administrators'. Only
# masking.own_rules makes it (a stored rule's action is one of MASK_ACTIONS); it ranks just below `hash`, so where an
# administrator's rule and the caller's both hash a column, the administrator's key is the one used.
OWN_HASH = "own_hash"
CHANGING = frozenset(("drop", "null", "mask", "hash", OWN_HASH))
_TEXT_TYPES = {
    "postgres": ("text", "character varying", "character", "varchar", "char", "bpchar", "citext", "name"),
    "mysql": ("char", "varchar", "text", "tinytext", "mediumtext", "longtext", "enum", "set"),
}
_PADDED_TEXT = frozenset(("character", "char", "bpchar"))   # PostgreSQL's blank-padded character(n)
_SQLGLOT = {"mysql": "mysql", "sqlite": "sqlite"}


@dataclass(frozen=True, slots=True)
class SourceMask:
    """A statement whose masked tables are read through masked derived tables."""

    sql: str                        # to prepare and render in place of the caller's statement
    hashes: bool                    # it computes `hash`: the key's pads are bound as IPAD/OPAD (SQLite: functions)
    tables: tuple[str, ...]         # schema.table of the tables read masked
    own_hashes: bool = False        # it computes OWN_HASH: the own key's pads are bound as OWN_IPAD/OWN_OPAD


def rewrite(prepared, table_columns, rules_action, default_schema: str | None) -> SourceMask | None:
    """The prepared statement with each masked table read through a derived table of masked values; None when it
    reads no table with a masked column. `table_columns(schema, table)` gives [(name, type)] (None: unknown
    table); `rules_action(schema, table, column)` the strictest action of the rules for a column (None: no rule)."""
    sql, dialect = prepared.sql, prepared.dialect
    spans = prepared.table_references()
    plans = []
    for start, end, schema, table, aliased, cte_named in spans:
        real_schema = (schema or default_schema or "")
        columns = table_columns(real_schema, table)
        if columns is None:
            if cte_named or (dialect == "mysql" and not schema and sql[start:end].lower() == "dual"):
                continue             # the statement's CTE (the trace has checked its scope), or MySQL's DUAL
            # A table the schema doesn't list (another database it didn't read, one made since it was read, one
            # past the read's limit, or two names that differ only in case) has no columns to mask: refused, or a
            # rule on it would go unapplied to the values read through a qualified column.
            raise Unresolvable(f"{table} is not a table of the connection's schema: its columns can't be masked")
        actions = [(name, ctype, rules_action(real_schema.lower(), table.lower(), name.lower()))
                   for name, ctype in columns]
        if not any(action in CHANGING for _, _, action in actions):
            continue
        if cte_named:
            # A CTE named like a masked table is refused on every engine: sqlglot doesn't scope CTEs as the engines do,
            # and the derived table's own FROM would be read in the CTE's scope (WITH RECURSIVE sees later CTEs too).
            raise Unresolvable(f"a CTE is named like the masked table {table}")
        plans.append((start, end, real_schema, table, aliased, actions))
    if not plans:
        return None
    _refuse_schema_named_columns(sql, dialect, {table.lower() for _, _, _, table, _, _ in plans})
    out = []
    position = 0
    hashes = own_hashes = False
    for start, end, schema, table, aliased, actions in sorted(plans):
        if start < position:
            raise Unresolvable("two table references overlap")
        expressions = []
        for name, ctype, action in actions:
            expressions.append(_masked(dialect, _quote(dialect, name), ctype, action) + " AS " + _quote(dialect, name))
            hashes = hashes or action == "hash"
            own_hashes = own_hashes or action == OWN_HASH
        derived = "(SELECT " + ", ".join(expressions) + " FROM " + sql[start:end] + ")"
        if not aliased:
            derived += " AS " + _quote(dialect, table)
        out.append(sql[position:start])
        out.append(derived)
        position = end
    out.append(sql[position:])
    text = "".join(out)
    if len(text) > MAX_STATEMENT_CHARS:
        # Refused here, as masking's own limit: prepared again, the text would be an unreadable statement, and
        # the call a 400 that blames the caller's SQL for what the masked tables' columns added to it.
        raise Unresolvable(f"with its masked tables read through masked values the statement would be longer "
                           f"than {MAX_STATEMENT_CHARS} characters")
    masked = {(schema.lower(), table.lower()) for _, _, schema, table, _, _ in plans}
    _verify(text, dialect, masked, len(plans), default_schema)
    return SourceMask(text, hashes, tuple(sorted(f"{s}.{t}" for s, t in masked)), own_hashes)


def _refuse_schema_named_columns(sql: str, dialect: str, tables: set) -> None:
    """A column written with its table's schema (`main.pub.email`, `public.customers.ssn`) where the table is read
    masked: the derived table that replaces the table is named by the table alone, so the engine refused the name
    and the call was a 500. Refused here, clearly (any name . <masked table> . name or *: stricter only)."""
    sig = lexer.significant(lexer.tokenize(sql, dialect))
    names = (lexer.WORD, lexer.QIDENT)
    for i in range(2, len(sig) - 2):
        before, dot, middle, dot2, after = sig[i - 2], sig[i - 1], sig[i], sig[i + 1], sig[i + 2]
        if (middle.kind in names and before.kind in names and dot.kind == dot2.kind == lexer.PUNCT
                and dot.value == dot2.value == "." and (after.kind in names or after.value == "*")):
            text = sql[middle.start:middle.end]
            if (text[1:-1] if middle.kind == lexer.QIDENT else text).lower() in tables:
                raise Unresolvable(f"a column of the masked table {text} is named with its schema: name it "
                                   f"{text}.<column>, or give the table an alias")


def _verify(text: str, dialect: str, masked: set, derived: int, default_schema: str | None) -> None:
    """Read the rewritten text again: every reference to a masked table must be a derived table's own."""
    found = 0
    for _start, _end, schema, table, _aliased, cte_named in prepare(text, dialect).table_references():
        if not cte_named and ((schema or default_schema or "").lower(), table.lower()) in masked:
            found += 1
    if found != derived:
        raise Unresolvable("a masked table is read where masking can't be shown to cover it")


# ------------------------------------------------------------------------------------------- masked values

def _quote(dialect: str, name: str) -> str:
    if dialect == "mysql":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def _textual(dialect: str, ctype: str) -> bool:
    if (ctype or "").rstrip().endswith("]"):
        return False     # a PostgreSQL array of text: masked NULL as the value rule masks a list
    base = (ctype or "").lower().split("(")[0].strip()
    return base in _TEXT_TYPES.get(dialect, ())


def _masked(dialect: str, column: str, ctype: str, action: str | None) -> str:
    """The engine's expression for one column under one action (docs/masking.md's definitions)."""
    if action not in CHANGING:
        return column
    if dialect == "sqlite":
        if action == "hash":
            return f"{SQLITE_HASH}({column})"
        if action == OWN_HASH:
            return f"{SQLITE_OWN_HASH}({column})"
        return f"{SQLITE_MASK}({column})" if action == "mask" else "NULL"
    # The pads of the key the hash is computed with: the administrators' or, for a caller's own rule, the own key.
    pads = (OWN_IPAD, OWN_OPAD) if action == OWN_HASH else (IPAD, OPAD)
    if dialect == "postgres":
        return _postgres_masked(column, ctype, action, pads)
    return _mysql_masked(column, ctype, action, pads)


def _postgres_text(c: str, ctype: str) -> str:
    """The column's value as text, as the driver gives it to a client: a blank-padded `character(n)` keeps its
    padding (its cast to text drops it, which would hash and measure 'ab' where the contract's str() sees 'ab    ');
    concat() writes it through the type's output function, as the server sends it."""
    if (ctype or "").lower().split("(")[0].strip() in _PADDED_TEXT:
        return f"pg_catalog.concat({c})"
    return f"{c}::text"


def _postgres_masked(c: str, ctype: str, action: str, pads: tuple[str, str] = (IPAD, OPAD)) -> str:
    if action in ("null", "drop"):
        return f"CAST(NULL AS {ctype})" if ctype and ctype != "USER-DEFINED" else "NULL"
    t = _postgres_text(c, ctype)
    if action in ("hash", OWN_HASH):
        ipad, opad = pads
        inner = f"pg_catalog.sha256(pg_catalog.decode(:{ipad}, 'hex') || pg_catalog.convert_to({t}, 'UTF8'))"
        return (f"CASE WHEN {c} IS NULL THEN NULL ELSE pg_catalog.substr(pg_catalog.encode("
                f"pg_catalog.sha256(pg_catalog.decode(:{opad}, 'hex') || {inner}), 'hex'), 1, 16) END")
    if not _textual("postgres", ctype):
        return "CAST(NULL AS text)"
    return (f"CASE WHEN {c} IS NULL OR pg_catalog.length({t}) = 0 THEN NULL "
            f"WHEN pg_catalog.strpos({t}, '@') > 0 THEN pg_catalog.left(pg_catalog.split_part({t}, '@', 1), 1) "
            f"|| '***@' || pg_catalog.substr({t}, pg_catalog.strpos({t}, '@') + 1) "
            f"ELSE pg_catalog.left({t}, 1) || pg_catalog.repeat('*', GREATEST(3, pg_catalog.length({t}) - 1)) END")


# MariaDB/MySQL spatial types: no CAST to CHAR (MariaDB: error 4079), so hashed over their bytes (SRID and WKB).
_MYSQL_SPATIAL = frozenset(("geometry", "point", "linestring", "polygon", "multipoint", "multilinestring",
                            "multipolygon", "geometrycollection", "geomcollection"))


def _mysql_masked(c: str, ctype: str, action: str, pads: tuple[str, str] = (IPAD, OPAD)) -> str:
    if action in ("null", "drop"):
        return "NULL"
    if action in ("hash", OWN_HASH):
        ipad, opad = pads
        spatial = (ctype or "").lower().split("(")[0].strip() in _MYSQL_SPATIAL
        value = f"CAST({c} AS BINARY)" if spatial else f"CONVERT(CAST({c} AS CHAR) USING utf8mb4)"
        inner = f"UNHEX(SHA2(CONCAT(UNHEX(:{ipad}), {value}), 256))"
        return f"IF({c} IS NULL, NULL, LEFT(SHA2(CONCAT(UNHEX(:{opad}), {inner}), 256), 16))"
    if not _textual("mysql", ctype):
        return "NULL"
    return (f"CASE WHEN {c} IS NULL OR CHAR_LENGTH({c}) = 0 THEN NULL "
            f"WHEN LOCATE('@', {c}) > 0 THEN CONCAT(LEFT(SUBSTRING_INDEX({c}, '@', 1), 1), '***@', "
            f"SUBSTRING({c}, LOCATE('@', {c}) + 1)) "
            f"ELSE CONCAT(LEFT({c}, 1), REPEAT('*', GREATEST(3, CHAR_LENGTH({c}) - 1))) END")
