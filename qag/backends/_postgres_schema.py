"""A PostgreSQL connection's tables, views and columns from pg_catalog (contract 5.2), through its backend."""

from __future__ import annotations

from ..sql.functions import Catalog

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


def read_functions(backend, fields: dict, schema: str):
    """functions.Catalog for calls whose search_path is pg_catalog, "<schema>", pg_temp."""
    rows = backend.query_all(fields, _FUNCTIONS_SQL, (schema,)).rows
    return Catalog(frozenset(name for name, own, _ in rows if own),
                   frozenset(name for name, own, _ in rows if not own),
                   frozenset(name for name, _, one in rows if one))
