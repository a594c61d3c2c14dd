"""Management of connections: /api/v1/connections (contract 5.2)."""

from __future__ import annotations

import os
import re

from ..auth import now_text
from ..backends.base import connection_failed, default_schema, is_secret_field, resolve_fields
from ..errors import QagError
from ..http.response import json_response
from ..policy import tables as table_policy
from ..policy.grants import check_connection
from ..sql import lexer
from ..sql.names import fold
from ..sql.prepare import prepare
from ._common import CONNECTION_NAME, audit, body_object, check_if_match, keyed_digest, no_content, with_etag
from ._usage import UsageFigures
from .. import shapes
from ..shapes import DIRECT_FIELDS, SUPPORTED_DB
SERVER_OWNED = ("name", "created_at", "updated_at", "usage", "example")
MASKED_PASSWORD = "********"


def _is_reference(value) -> bool:
    return isinstance(value, str) and value.startswith("${") and value.endswith("}")


def _shown_password(value):
    if value is None or value == "":
        return None
    return value if _is_reference(value) else MASKED_PASSWORD


def _fields_from_body(body: dict) -> dict:
    """Top-level fields plus `options` flattened into one dict of stored fields."""
    options = body.get("options", {})
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise QagError("invalid_body", "options must be a JSON object")
    fields = {k: v for k, v in body.items() if k not in SERVER_OWNED + ("db", "active", "options")}
    for key, value in options.items():
        if key in fields or key in DIRECT_FIELDS + ("db", "active", "name"):
            raise QagError("invalid_body", f"Set {key} directly, not inside options")
        fields[key] = value
    for key in ("host", "database", "user"):
        if key in fields and fields[key] is not None and not isinstance(fields[key], str):
            raise QagError("invalid_body", f"{key} must be text")
        if isinstance(fields.get(key), str) and "\x00" in fields[key]:
            raise QagError("invalid_body", f"{key} must not contain a NUL character")
    port = fields.get("port")
    if isinstance(port, float) and shapes.whole(port) is not None:
        port = fields["port"] = shapes.whole(port)   # 5432.0 is the integer 5432, as JSON Schema reads it
    if port is not None and (isinstance(port, bool) or not isinstance(port, (int, str))):
        raise QagError("invalid_body", "port must be a number or text")
    if type(port) is int and not 0 < port < 65536:
        raise QagError("invalid_body", "port must be from 1 to 65535")
    if "password" in fields and fields["password"] is not None and not isinstance(fields["password"], str):
        raise QagError("invalid_body", "password must be text")
    return fields


_DB_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_$-]{0,62}")


def _check_row_security(db: str, fields: dict) -> None:
    """The `row_security` and `db_roles` options (signed-in users' claims and database role, run.row_security):
    PostgreSQL only, since only it can take them per transaction; refused elsewhere rather than ignored."""
    if "row_security" not in fields and "db_roles" not in fields:
        return
    if db != "postgres":
        raise QagError("invalid_body", "row_security and db_roles are PostgreSQL options (docs/security.md says "
                                       "what MariaDB/MySQL can do instead)")
    if not isinstance(fields.get("row_security", False), bool):
        raise QagError("invalid_body", "row_security must be true or false")
    roles = fields.get("db_roles")
    if roles is not None:
        if not isinstance(roles, dict) or not all(isinstance(k, str) and isinstance(v, str) and _DB_ROLE.fullmatch(v)
                                                  for k, v in roles.items()):
            raise QagError("invalid_body", "db_roles must map qag role names to database role names")


def _check_db(db) -> str:
    if db is None:
        raise QagError("invalid_body", f"db is required - one of: {', '.join(SUPPORTED_DB)}")
    if db not in SUPPORTED_DB:
        raise QagError("invalid_body", f"db must be one of: {', '.join(SUPPORTED_DB)} (not {db!r})")
    return db


def _check_active(active) -> bool:
    if not isinstance(active, bool):
        raise QagError("invalid_body", "active must be true or false")
    return active


# Literal segments of /api/v1/connections/<word> routes: a connection so named couldn't be read at its URL.
_ROUTE_WORDS = frozenset({"deleted", "test", "databases"})


class ConnectionHandlers:
    """Create, read, change and delete connections; test them; read a SQLite connection's schema."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.store = gateway.store

    def register(self, router) -> None:
        add = router.add
        add("GET", "/api/v1/connections", self.list, "v1.list_connections", admin=True)
        add("POST", "/api/v1/connections", self.create, "v1.create_connection", admin=True)
        add("GET", "/api/v1/connections/deleted", self.deleted, "v1.deleted_connections", admin=True)
        add("POST", "/api/v1/connections/test", self.test, "v1.test_connection", admin=True)
        add("POST", "/api/v1/connections/databases", self.databases, "v1.connection_databases", admin=True)
        add("GET", "/api/v1/connections/<name>", self.get, "v1.get_connection", admin=True)
        add("PATCH", "/api/v1/connections/<name>", self.patch, "v1.update_connection", admin=True)
        add("DELETE", "/api/v1/connections/<name>", self.delete, "v1.delete_connection", admin=True)
        add("GET", "/api/v1/connections/<name>/schema", self.schema, "v1.connection_schema", admin=True)
        add("POST", "/api/v1/connections/<name>/test", self.test_saved, "v1.test_saved_connection", admin=True)
        # The data plane's schema route (contract 11): any caller granted the connection.
        add("GET", "/connections/<name>/schema", self.runtime_schema, "api.connection_schema")
        add("GET", "/connections/<name>/table_ddl", self.table_ddl, "api.connection_table_ddl")

    # --- views -----------------------------------------------------------------------------
    def _item(self, row: dict, usage: UsageFigures | None = None) -> dict:
        """A connection as lists show it; `usage`: one read of the instance's counters for a whole list."""
        if usage is None:
            usage = self.gateway.run.usage.read()
        f = row["fields"]
        return {"name": row["name"], "db": row["db"], "active": row["active"], "host": f.get("host") or None,
                "port": f.get("port") if f.get("port") not in ("", None) else None,
                "database": f.get("database") or None, "user": f.get("user") or None, "example": row["example"],
                "created_at": row["created_at"], "updated_at": row["updated_at"],
                "usage": usage.connection(row["name"])}

    def _detail(self, row: dict) -> dict:
        item = self._item(row)
        item["password"] = _shown_password(row["fields"].get("password"))
        item["options"] = {k: MASKED_PASSWORD if is_secret_field(k) and v is not None else v
                           for k, v in row["fields"].items() if k not in DIRECT_FIELDS}
        return item

    def _etag_state(self, row: dict) -> dict:
        """The row with credentials replaced by a keyed digest: an ETag must not let anyone test password guesses."""
        fields = {k: keyed_digest(self.gateway.secret, v) if k == "password" or is_secret_field(k) else v
                  for k, v in row["fields"].items()}
        return dict(row, fields=fields)

    def _existing(self, name: str) -> dict:
        row = self.store.get_connection(name)
        if row is None:
            raise QagError("connection_not_found", f"Connection '{name}' not found")
        return row

    def _usable(self, name: str) -> dict:
        """The row of a connection a route reads from (schema, DDL, databases): an inactive one is refused as a run
        refuses it (contract 10.1 step 1), in the run's words."""
        return self.gateway.run._connection(name, self._existing(name))

    def _check_target(self, db: str, fields: dict) -> None:
        _check_row_security(db, fields)
        if db == "sqlite" and fields.get("database"):
            path = os.path.realpath(os.path.join(self.gateway.settings.home, str(fields["database"])))
            if path in self.gateway.store_files:
                raise QagError("store_not_allowed", "A connection may not point at the server's own store")

    # --- routes ----------------------------------------------------------------------------
    def list(self, request, caller):
        usage = self.gateway.run.usage.read()
        return json_response({"items": [self._item(r, usage) for r in self.store.list_connections()]})

    def get(self, request, caller, name):
        row = self._existing(name)
        return with_etag(self._detail(row), self._etag_state(row))

    def create(self, request, caller):
        body = body_object(request)
        name = body.get("name")
        if not isinstance(name, str) or not CONNECTION_NAME.fullmatch(name):
            raise QagError("invalid_name", "A connection name is 1-100 letters, digits, spaces, '.', '_' or '-', "
                                           "starting with a letter or digit")
        if name in _ROUTE_WORDS:
            raise QagError("invalid_name", f"'{name}' names a route under /api/v1/connections/ and can't name a "
                                           f"connection")
        db = _check_db(body.get("db"))
        active = _check_active(body.get("active", True))
        fields = {k: v for k, v in _fields_from_body(body).items() if v is not None}
        self._check_target(db, fields)
        now = now_text()
        row = {"name": name, "db": db, "active": active, "fields": fields, "example": False,
               "created_at": now, "updated_at": now}
        with self.store.transaction():
            if self.store.get_connection(name) is not None:
                raise QagError("connection_exists", f"A connection named '{name}' already exists")
            self.store.put_connection(row, create=True)
            audit(self.store, caller, "create_connection", name, _audited(db, active, fields))
        self.gateway.backends.close_idle()
        return with_etag(self._detail(row), self._etag_state(row), 201)

    def patch(self, request, caller, name):
        # 404 and 412 before the body, as QueryAPIGate; again in the transaction, which the body is read outside of.
        check_if_match(request, self._etag_state(self._existing(name)), "connection")
        body = body_object(request)
        with self.store.transaction():
            row = self._existing(name)
            check_if_match(request, self._etag_state(row), "connection")
            db = _check_db(body["db"]) if "db" in body else row["db"]
            active = _check_active(body["active"]) if "active" in body else row["active"]
            changes = _fields_from_body(body)
            options = body.get("options") or {}
            fields = dict(row["fields"])
            for key, value in changes.items():
                if key == "password" and value == MASKED_PASSWORD:
                    continue
                if value is None:
                    fields.pop(key, None)
                else:
                    fields[key] = value
            self._check_target(db, fields)
            new = dict(row, db=db, active=active, fields=fields, updated_at=now_text())
            self.store.put_connection(new, create=False)
            audited = _audited(db, active, {k: v for k, v in changes.items() if k in body or k in options})
            if "password" in audited and changes.get("password") == MASKED_PASSWORD:
                del audited["password"]
            audit(self.store, caller, "update_connection", name, audited)
        self.gateway.backends.close_idle()
        return with_etag(self._detail(new), self._etag_state(new))

    def delete(self, request, caller, name):
        # 404 comes first, even without a reason; then a stale If-Match (QueryAPIGate's order)
        check_if_match(request, self._etag_state(self._existing(name)), "connection")
        body = body_object(request, required=False)
        reason = body.get("reason")
        if not isinstance(reason, str) or not reason.strip():
            raise QagError("reason_required", "Deleting a connection needs a reason: {\"reason\": \"...\"}")
        with self.store.transaction():
            row = self._existing(name)
            check_if_match(request, self._etag_state(row), "connection")
            self.store.delete_connection(name)
            f = row["fields"]
            audit(self.store, caller, "delete_connection", name,
                  {"db": row["db"], "host": f.get("host"), "port": f.get("port"), "database": f.get("database"),
                   "deleted_reason": reason.strip()})
        self.gateway.backends.close_idle()
        return no_content()

    def deleted(self, request, caller):
        items = []
        for entry in self.store.audit_entries("delete_connection"):
            c = entry["changes"]
            items.append({"name": entry["target"], "db": c.get("db"), "host": c.get("host"), "port": c.get("port"),
                          "database": c.get("database"), "deleted_at": entry["at"], "deleted_by": entry["actor"],
                          "reason": c.get("deleted_reason")})
        return json_response({"items": items})

    def _unsaved_or_saved(self, request, usable: bool = False) -> tuple[str, dict]:
        """A body's connection: its fields, or {"name": ...} of a saved one (`usable`: which must be active)."""
        body = body_object(request)
        if set(body) == {"name"}:
            if not isinstance(body["name"], str):
                raise QagError("invalid_body", "name must be text")
            row = (self._usable if usable else self._existing)(body["name"])
            return row["db"], row["fields"]
        return _check_db(body.get("db")), _fields_from_body(body)

    def test(self, request, caller):
        db, fields = self._unsaved_or_saved(request)
        self._check_target(db, fields)
        return self._tested(db, fields)

    def test_saved(self, request, caller, name):
        row = self._existing(name)
        return self._tested(row["db"], row["fields"])

    def _tested(self, db: str, fields: dict):
        """A connection test's answer. Contract 5.2: a test that can't open its database is 502 connection_failed,
        a SQLite file that is missing, unnamed or no database included (a run answers those 404 / 400)."""
        try:
            elapsed = self.gateway.backends.get(db).test(resolve_fields(fields, os.environ))
        except QagError as error:
            if error.code in ("database_file_not_found", "connection_misconfigured"):
                raise connection_failed(error.message) from None
            raise
        return json_response({"elapsed_ms": round(elapsed, 3)})

    def runtime_schema(self, request, caller, name):
        return json_response(self.schema_for(caller, name, _database_arg(request)))

    def schema_for(self, caller, name: str, database: str | None) -> dict:
        """A connection's tables and columns as this caller may see them (the schema route, MCP's list_tables)."""
        if not caller.admin:
            check_connection(caller.grants, name)
            if database is not None:
                raise QagError("admin_only", "Only the admin key may read another database on this connection")
        row = self._usable(name)
        backend = self.gateway.backends.get(row["db"])
        fields = resolve_fields(row["fields"], os.environ)
        schema = backend.schema(fields, database)
        if not caller.admin and caller.grants.allowed_tables is not None:
            schema = allowed_schema(schema, caller.grants.allowed_tables,
                                    default_schema(backend.dialect, fields), backend.dialect)
        return schema

    def table_ddl(self, request, caller, name):
        """One table's CREATE statement (contract 11): a table a restricted key may not read is as missing as one
        that does not exist."""
        if not caller.admin:
            check_connection(caller.grants, name)
        table = request.args.get("table")
        if not table:
            raise QagError("table_required", "table is required")
        row = self._usable(name)
        backend = self.gateway.backends.get(row["db"])
        fields = resolve_fields(row["fields"], os.environ)
        if not backend.has_table_ddl:
            raise QagError("unsupported_operation", f"Showing a table's DDL isn't supported for '{row['db']}' "
                                                    f"connections")
        ddl = None
        restricted = not caller.admin and caller.grants.allowed_tables is not None
        default = default_schema(backend.dialect, fields)
        if not restricted or granted_tables(caller.grants.allowed_tables, default,
                                            backend.dialect)(f"{default}.{table}"):
            ddl = backend.table_ddl(fields, table)
        if ddl is None:
            raise QagError("table_not_found", f"{table!r} is not a table on {name!r}")
        if restricted and not view_reads_granted(ddl, backend.dialect, default, caller.grants.allowed_tables):
            # A view's definition names the tables it reads, their columns and its filter's literals.
            raise QagError("table_not_allowed", f"{table!r} is a view whose definition reads tables this key "
                                                "may not read")
        if not caller.admin:
            ddl = without_definer(ddl, backend.dialect)   # MySQL's view owner: a user name and host of the server
        return json_response({"ddl": ddl})

    def databases(self, request, caller):
        # A saved connection must be active, as QueryAPIGate 0.43 has it; testing one needn't be (probed).
        db, fields = self._unsaved_or_saved(request, usable=True)
        names = self.gateway.backends.get(db).databases(resolve_fields(fields, os.environ))
        return json_response({"databases": names})

    def schema(self, request, caller, name):
        row = self._usable(name)
        backend = self.gateway.backends.get(row["db"])
        return json_response(backend.schema(resolve_fields(row["fields"], os.environ), _database_arg(request)))


def _database_arg(request) -> str | None:
    """?database=, refused when it holds a NUL: the drivers' connection strings end at one, so `a%00b` would read
    the schema of a database named `a`."""
    database = request.args.get("database")
    if database is not None and "\x00" in database:
        raise QagError("invalid_text", "database can't contain a NUL character")
    return database


def _audited(db: str, active: bool, fields: dict) -> dict:
    """Connection fields for the audit log: a password is only ever 'changed'."""
    out = {"db": db, "active": active}
    for key, value in fields.items():
        out[key] = "changed" if key == "password" or is_secret_field(key) else value
    return out


_DEFINER = re.compile(r"\bDEFINER=(?:`(?:[^`]|``)*`|'(?:[^']|'')*'|[^\s@]+)@(?:`(?:[^`]|``)*`|'(?:[^']|'')*'|\S+)\s*")


def without_definer(ddl: str, dialect: str) -> str:
    """The DDL without its DEFINER=user@host clause, looked for in the head only (before the word saying what it
    creates), never in the definition's literals or comments."""
    kinds = ("view", "table", "procedure", "function", "trigger", "event")
    head = next((t.start for t in lexer.tokenize(ddl, dialect) if t.kind == lexer.WORD and t.value in kinds), 0)
    return _DEFINER.sub("", ddl[:head]) + ddl[head:]


def view_reads_granted(ddl: str, dialect: str, default: str, allowed_tables) -> bool:
    """Whether a CREATE VIEW statement's query reads only tables the grants name (a table's DDL: True); a query
    that can't be read counts as reading others."""
    tokens = [t for t in lexer.tokenize(ddl, dialect) if t.kind not in lexer.TRIVIA]
    words = [t.value if t.kind == lexer.WORD else None for t in tokens]
    if next((w for w in words if w in ("view", "table")), None) != "view":   # the first of them says which
        return True
    depth = 0
    for k in range(words.index("view") + 1, len(tokens)):
        token = tokens[k]
        if token.kind == lexer.PUNCT and token.value in "()":
            depth += 1 if token.value == "(" else -1
        elif depth == 0 and words[k] == "as" and k + 1 < len(tokens):
            end = len(ddl)
            if words[-2:] == ["check", "option"]:     # WITH [CASCADED | LOCAL] CHECK OPTION: the view's, not the query's
                w = len(words) - (4 if len(words) >= 4 and words[-4] == "with" else 3)
                if words[w] == "with":
                    end = tokens[w].start
            uses = prepare(ddl[tokens[k + 1].start:end], dialect).uses(default)
            granted = granted_tables(allowed_tables, default, dialect)
            return uses.failure is None and all(granted(t) for t in uses.tables)
    return False


def granted_tables(allowed_tables, default_schema: str, dialect: str):
    """granted("schema.table") for a table-restricted key: names compared as the table policy compares them
    (contract 6.2)."""
    grants = table_policy.qualified_grants(frozenset(allowed_tables), default_schema, dialect)
    exact = table_policy.names_exact(dialect, default_schema)
    lower = fold(dialect)

    def granted(qualified: str) -> bool:
        return (qualified if exact else lower(qualified)) in grants

    return granted


def allowed_schema(schema: dict, allowed_tables, default_schema: str, dialect: str) -> dict:
    """The schema route's body for a table-restricted key (contract 6.2): only its allowed tables, names compared
    as the table policy compares them, and no foreign key pointing at a table outside them. A copy: backends
    cache and share the schema they return."""
    granted = granted_tables(allowed_tables, default_schema, dialect)
    tables = []
    for table in schema.get("tables", ()):
        own = table.get("schema") or default_schema
        if not granted(f"{own}.{table['name']}"):
            continue
        columns = []
        for column in table.get("columns", ()):
            fk = column.get("foreign_key")
            if fk is not None:
                target = fk["table"]      # "table" in the same schema, "schema.table" in another
                if not granted(target if "." in target else f"{own}.{target}"):
                    column = dict(column, foreign_key=None)
            columns.append(column)
        tables.append(dict(table, columns=columns))
    return dict(schema, tables=tables)
