"""A PostgreSQL connection's tables, views and columns from pg_catalog (contract 5.2), through its backend."""

from __future__ import annotations

from ..sql.functions import RESOLVING_TYPES, Catalog

SCHEMA_MAX_TABLES = 1000

# Relations the connecting role has some privilege on, as information_schema.tables lists them.
_TABLES_SQL = """WITH t AS (
  SELECT c.oid, n.nspname, c.relname, c.relkind
  FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
  WHERE c.relkind::text = ANY($1) AND n.nspname <> $2 AND n.nspname NOT LIKE $3
    AND (pg_catalog.pg_has_role(c.relowner, 'USAGE')
         OR pg_catalog.has_table_privilege(c.oid, 'SELECT, INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')
         OR pg_catalog.has_any_column_privilege(c.oid, 'SELECT, INSERT, UPDATE, REFERENCES'))
  ORDER BY n.nspname, c.relname
  LIMIT $4)
SELECT t.oid, t.nspname, t.relname, t.relkind, a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod),
       NOT a.attnotnull, a.attnum
FROM t LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY t.nspname, t.relname, a.attnum"""

_KEYS_SQL = """SELECT con.conrelid, con.contype, a.attname, fn.nspname, fc.relname, fa.attname
FROM pg_catalog.pg_constraint con
CROSS JOIN LATERAL unnest(con.conkey, COALESCE(con.confkey, con.conkey)) AS k(col, fcol)
JOIN pg_catalog.pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.col
LEFT JOIN pg_catalog.pg_class fc ON fc.oid = con.confrelid
LEFT JOIN pg_catalog.pg_namespace fn ON fn.oid = fc.relnamespace
LEFT JOIN pg_catalog.pg_attribute fa ON fa.attrelid = con.confrelid AND fa.attnum = k.fcol
WHERE con.conrelid = ANY($1::oid[]) AND con.contype::text = ANY($2)
ORDER BY con.conrelid, con.contype, con.conname, k.col"""


def read_schema(backend, fields: dict, max_tables: int = SCHEMA_MAX_TABLES) -> dict:
    """{"tables": [...], "truncated": bool} (contract 5.2) from pg_catalog; system schemas skipped."""
    rows = backend.query_all(fields, _TABLES_SQL, (["r", "p", "v", "m", "f"], "information_schema", "pg\\_%",
                                                   max_tables + 1)).rows
    tables: list[dict] = []
    by_oid: dict = {}
    for oid, nspname, relname, relkind, attname, ctype, nullable, attnum in rows:
        table = by_oid.get(oid)
        if table is None:
            if len(by_oid) == max_tables:
                continue                     # the one past the limit only says "truncated"
            table = {"name": relname, "schema": nspname, "type": "view" if relkind in ("v", "m") else "table",
                     "columns": []}
            by_oid[oid] = table
            tables.append(table)
        if attname is not None:
            table["columns"].append({"name": attname, "type": ctype, "nullable": bool(nullable),
                                     "position": int(attnum), "primary_key": False, "foreign_key": None})
    truncated = len({row[0] for row in rows}) > max_tables
    if by_oid:
        keys = backend.query_all(fields, _KEYS_SQL, ([int(o) for o in by_oid], ["p", "f"])).rows
        for conrelid, contype, attname, fschema, ftable, fcolumn in keys:
            table = by_oid.get(conrelid)
            if table is None:
                continue
            column = next((c for c in table["columns"] if c["name"] == attname), None)
            if column is None:
                continue
            if contype == "p":
                column["primary_key"] = True
            elif column["foreign_key"] is None and ftable is not None:
                name = ftable if fschema == table["schema"] else f"{fschema}.{ftable}"
                column["foreign_key"] = {"table": name, "column": fcolumn}
    return {"tables": tables, "truncated": truncated}


# Function names (issue 18): the built-ins initdb created in pg_catalog (oid below FirstNormalObjectId, 16384, so
# never a function a user added to pg_catalog later), and the names of functions in the one other schema a
# restricted or masked call's search_path holds (pg_catalog, "<schema>", pg_temp; PostgreSQL never searches
# pg_temp for functions).
# A function's name, whether it is the server's own (from initdb), and whether it can be called with one argument
# (so as a field: `x.f` is f(x), PostgreSQL's attribute notation).
_FUNCTIONS_SQL = """SELECT p.proname, n.nspname = 'pg_catalog' AND p.oid < 16384,
       bool_or(p.pronargs - p.pronargdefaults <= 1 AND (p.pronargs >= 1 OR p.provariadic <> 0))
FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'pg_catalog' OR n.nspname = $1
GROUP BY 1, 2"""

# Operators a call's search_path (pg_catalog, "<schema>") can reach whose function is the database's own code
# (functions.Catalog.operators): not C or internal (the engine's and its extensions', which only a superuser adds).
_OPERATORS_SQL = """SELECT DISTINCT o.oprname FROM pg_catalog.pg_operator o
JOIN pg_catalog.pg_namespace n ON n.oid = o.oprnamespace
JOIN pg_catalog.pg_proc p ON p.oid = o.oprcode
JOIN pg_catalog.pg_language l ON l.oid = p.prolang
WHERE (n.nspname = $1 OR (n.nspname = 'pg_catalog' AND o.oid >= 16384)) AND l.lanname NOT IN ('c', 'internal')"""


# The database's own types that show no relation's columns (functions.Catalog.types). A relation's row type has
# its name and columns (NULL::vault, (NULL::vault).*), so `shows` holds every relation's row type but a
# free-standing composite type's (relkind 'c', CREATE TYPE ... AS), every type built on one (`parts`: a domain's
# base type, an array's element, a range's subtype, a multirange's range, a composite type's fields:
# ((NULL::wrap).p).*), a domain whose CHECK depends on anything not from initdb but the domain itself (oid 16384
# on: a function, an operator, a cast, another type; a cast to the domain runs it), a type with a cast of the
# database's own code (CREATE CAST ... WITH FUNCTION in SQL or a procedural language: a cast runs it), and the
# name-resolving types (functions.RESOLVING_TYPES: a domain over regclass reads its text as a name), each with what
# is built on it. Shell types and schemas the role may not use (the search_path skips them) are left out too.
# With each, whether pg_catalog has a type of its name: the call's search_path looks there first, so an
# unqualified name is pg_catalog's then. (A multirange's range is read through to_jsonb: the
# column is PostgreSQL 14's, and an older server has no multiranges.)
_TYPES_SQL = """WITH RECURSIVE parts(oid, part) AS (
  SELECT t.oid, t.typbasetype FROM pg_catalog.pg_type t WHERE t.typbasetype <> 0
  UNION ALL SELECT t.oid, t.typelem FROM pg_catalog.pg_type t WHERE t.typelem <> 0
  UNION ALL SELECT r.rngtypid, r.rngsubtype FROM pg_catalog.pg_range r
  UNION ALL SELECT (pg_catalog.to_jsonb(r) ->> 'rngmultitypid')::pg_catalog.oid, r.rngtypid FROM pg_catalog.pg_range r
            WHERE pg_catalog.to_jsonb(r) ? 'rngmultitypid'
  UNION ALL SELECT t.oid, a.atttypid FROM pg_catalog.pg_type t
            JOIN pg_catalog.pg_attribute a ON a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped),
shows(oid) AS (
  SELECT t.oid FROM pg_catalog.pg_type t JOIN pg_catalog.pg_class c ON c.oid = t.typrelid WHERE c.relkind <> 'c'
  UNION
  SELECT t.oid FROM pg_catalog.pg_type t WHERE t.typnamespace = 11 AND t.typname = ANY($4)
  UNION
  SELECT u.oid FROM pg_catalog.pg_cast c JOIN pg_catalog.pg_proc p ON p.oid = c.castfunc
  JOIN pg_catalog.pg_language l ON l.oid = p.prolang
  CROSS JOIN LATERAL (VALUES (c.castsource), (c.casttarget)) AS u(oid)
  WHERE l.lanname NOT IN ('c', 'internal') AND u.oid >= 16384
  UNION
  SELECT con.contypid FROM pg_catalog.pg_constraint con
  JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND d.objid = con.oid
  WHERE con.contypid <> 0 AND d.refobjid >= 16384
    AND NOT (d.refclassid = 'pg_catalog.pg_type'::pg_catalog.regclass AND d.refobjid = con.contypid)
  UNION
  SELECT p.oid FROM parts p JOIN shows s ON s.oid = p.part)
SELECT n.nspname, t.typname,
       EXISTS (SELECT FROM pg_catalog.pg_type b WHERE b.typname = t.typname AND b.typnamespace = 11)
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE t.typisdefined AND n.nspname <> ALL($1) AND n.nspname NOT LIKE $2 AND n.nspname NOT LIKE $3
  AND pg_catalog.has_schema_privilege(n.oid, 'USAGE') AND NOT EXISTS (SELECT FROM shows s WHERE s.oid = t.oid)"""


def read_functions(backend, fields: dict, schema: str):
    """functions.Catalog for calls whose search_path is pg_catalog, "<schema>", pg_temp: function names, the
    types that show no relation's columns (pg_catalog's own are functions.PG_TYPES), the operators of the
    database's own code and the server's major version."""
    rows = backend.query_all(fields, _FUNCTIONS_SQL, (schema,)).rows
    operators = backend.query_all(fields, _OPERATORS_SQL, (schema,)).rows
    types = backend.query_all(fields, _TYPES_SQL, (["pg_catalog", "information_schema"], "pg\\_toast%",
                                                   "pg\\_temp\\_%", sorted(RESOLVING_TYPES))).rows
    (major,), = backend.query_all(fields, "SELECT current_setting('server_version_num')::int / 10000", ()).rows
    return Catalog(frozenset(name for name, own, _ in rows if own),
                   frozenset(name for name, own, _ in rows if not own),
                   frozenset(name for name, _, one in rows if one),
                   frozenset((nspname, typname) for nspname, typname, _ in types),
                   frozenset(typname for nspname, typname, in_catalog in types
                             if nspname == schema and not in_catalog),
                   frozenset(name for (name,) in operators), major)
