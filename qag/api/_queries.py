"""Management of saved queries and their versions: /api/v1/queries (contract 5.3)."""

from __future__ import annotations

import uuid

from ..auth import now_text
from ..errors import QagError
from ..http.response import json_response
from ..policy.keyfields import normalise_mask
from ..sql import params as param_rules
from ..sql.flow import flow, tables
from ..sql.prepare import prepare
from ..sql.writes import read_only_message
from .. import shapes
from ._common import (COLLECTION_NAME, audit, body_object, check_if_match, no_content, refuse_unknown,
                      valid_query_name, with_etag)

VERSION_FIELDS = ("description", "author", "tags", "query_type", "sql", "connection_name", "parameters",
                  "cache_ttl", "columns", "mask", "mcp", "publish", "agent_writes", "max_affected_rows")
CREATE_FIELDS = VERSION_FIELDS + ("name", "collection")
_NAME_MESSAGE = "Filename may only contain letters, digits, spaces, '.', '_' and '-'"
_STATUSES = shapes.LIST_STATUSES


def _status(number: int, published: int | None) -> str:
    if published is None or number > published:
        return "draft"
    return "published" if number == published else "previous"


def _check_cache_ttl(value):
    if value is None:
        return None
    if not shapes.fits(shapes.CACHE_TTL, value):
        raise QagError("invalid_body", "cache_ttl must be null or a whole number of seconds >= 0")
    return shapes.whole(value) or None


def _check_mcp(value) -> bool:
    if not isinstance(value, bool):
        raise QagError("invalid_body", "mcp must be true or false")
    return value


def _check_collection(value):
    if value is None:
        return None
    if not isinstance(value, str) or not COLLECTION_NAME.fullmatch(value):
        raise QagError("invalid_name", "A collection name is 1-63 lower-case letters, digits, '.', '_' or '-', "
                                       "starting with a letter or digit")
    return value


def _tags(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise QagError("invalid_body", "tags must be a list of strings or a comma-separated string")
    return [t.strip() for t in value if t.strip()]


class QueryHandlers:
    """Saved queries: create, add versions, publish and unpublish, move, delete; validate and flow."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.store = gateway.store

    def register(self, router) -> None:
        add = router.add
        add("GET", "/api/v1/queries", self.list, "v1.list_queries", admin=True)
        add("POST", "/api/v1/queries", self.create, "v1.create_query", admin=True)
        add("POST", "/api/v1/queries/validate", self.validate, "v1.validate_query", admin=True)
        add("GET", "/api/v1/queries/<name>", self.get, "v1.get_query", admin=True)
        add("PATCH", "/api/v1/queries/<name>", self.move, "v1.update_query", admin=True)
        add("DELETE", "/api/v1/queries/<name>", self.delete, "v1.delete_query", admin=True)
        add("POST", "/api/v1/queries/<name>/versions", self.add_version, "v1.add_version", admin=True)
        add("GET", "/api/v1/queries/<name>/versions/<int:number>", self.get_version, "v1.get_version", admin=True)
        add("PATCH", "/api/v1/queries/<name>/versions/<int:number>", self.patch_version, "v1.update_version",
            admin=True)
        add("DELETE", "/api/v1/queries/<name>/versions/<int:number>", self.delete_version,
            "v1.delete_version", admin=True)
        add("GET", "/api/v1/queries/<name>/versions/<int:number>/flow", self.flow, "v1.version_flow", admin=True)
        add("POST", "/api/v1/queries/<name>/publish", self.publish, "v1.publish", admin=True)
        add("POST", "/api/v1/queries/<name>/unpublish", self.unpublish, "v1.unpublish", admin=True)

    # --- views -----------------------------------------------------------------------------
    @staticmethod
    def version_view(v: dict, published: int | None) -> dict:
        return {
            "version": v["version"], "status": _status(v["version"], published), "uuid": v["uuid"],
            "author": v.get("author"), "description": v.get("description"), "tags": v.get("tags", []),
            "query_type": v.get("query_type", "sql"), "sql": v.get("sql"), "mongo": None,
            "connection_name": v.get("connection_name"), "parameters": param_rules.display(v.get("parameters")),
            "placeholders": v.get("placeholders", []), "cache_ttl": v.get("cache_ttl"),
            "columns": v.get("columns", {}), "agent_writes": None, "max_affected_rows": None,
            "mask": v.get("mask", []), "mcp": v.get("mcp", True),
            "created_at": v["created_at"], "last_modified_at": v["last_modified_at"],
        }

    def _runs(self, name: str | None = None) -> dict:
        """{query: (last_used_at, {version: run_count})} from run history (this worker's queue written first)."""
        return self.gateway.observe.history.stats(name)

    @staticmethod
    def summary(q: dict, runs: dict | None = None) -> dict:
        versions = q["versions"]
        published = q["published"]
        shown = next((v for v in versions if v["version"] == published), versions[-1] if versions else {})
        latest = versions[-1]["version"] if versions else None
        return {
            "name": q["name"], "description": shown.get("description"), "query_type": shown.get("query_type", "sql"),
            "connection_name": shown.get("connection_name"), "collection": q["collection"],
            "tags": shown.get("tags", []), "published_version": published, "latest_version": latest,
            "has_draft": latest is not None and (published is None or latest > published),
            "version_count": len(versions), "example": q["example"], "endpoint": "/q/" + q["name"],
            "updated_at": max((v["last_modified_at"] for v in versions), default=None),
            "created_at": min((v["created_at"] for v in versions), default=q["created_at"]),
            "last_used_at": (runs or {}).get(q["name"], (None, {}))[0], "cache_ttl": shown.get("cache_ttl"),
        }

    def detail(self, q: dict) -> dict:
        runs = self._runs(q["name"])
        counts = runs.get(q["name"], (None, {}))[1]
        out = self.summary(q, runs)
        out["versions"] = [dict(self.version_view(v, q["published"]), run_count=counts.get(v["version"], 0))
                           for v in q["versions"]]
        return out

    def _existing(self, name: str) -> dict:
        q = self.store.get_query(name)
        if q is None:
            raise QagError("query_not_found", f"Saved query '{name}' not found")
        return q

    def _unchanged(self, request, name: str) -> dict:
        """The query, after 404 and If-Match's 412: QueryAPIGate judges both before the body. Called again inside
        the transaction (the body is read outside it, so a slow client never holds the store's write lock)."""
        q = self._existing(name)
        check_if_match(request, q, "query")
        return q

    def _dialect_for(self, connection_name) -> str:
        row = self.store.get_connection(connection_name) if isinstance(connection_name, str) else None
        return row["db"] if row is not None else "sqlite"

    # --- version input ---------------------------------------------------------------------
    def _version_input(self, body: dict, caller) -> tuple[dict, bool]:
        """A validated version row (stored form) and the publish flag, from a create/add-version body."""
        description = body.get("description")
        if not isinstance(description, str) or not description:   # non-empty (5.3): blanks are a description
            raise QagError("invalid_body", "Description is missing")
        query_type = body.get("query_type", "sql")
        if query_type != "sql":
            raise QagError("invalid_body", "query_type must be 'sql' (MongoDB queries are not supported)")
        sql = body.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise QagError("invalid_body", "SQL query is missing")
        for unsupported in ("agent_writes", "max_affected_rows"):
            if body.get(unsupported) is not None:
                raise QagError("invalid_body", f"{unsupported} is not supported by this server")
        author = body.get("author")
        if author is not None and not isinstance(author, str):
            raise QagError("invalid_body", "author must be text")
        connection_name = body.get("connection_name")
        if connection_name is not None and not isinstance(connection_name, str):
            raise QagError("invalid_body", "connection_name must be text")
        columns = body.get("columns") or {}
        if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
            raise QagError("invalid_body", "columns must be an object of column name to description")
        publish = body.get("publish", False)
        if not isinstance(publish, bool):
            raise QagError("invalid_body", "publish must be true or false")
        prepared = prepare(sql, self._dialect_for(connection_name))
        placeholders = list(prepared.placeholders)
        parameters = param_rules.validate_definitions(body.get("parameters"), placeholders)
        now = now_text()
        row = {
            "uuid": str(uuid.uuid4()), "author": author if author is not None else (caller.name or "admin"),
            "description": description, "tags": _tags(body.get("tags")), "query_type": "sql", "sql": sql,
            "connection_name": connection_name, "parameters": parameters, "placeholders": placeholders,
            "cache_ttl": _check_cache_ttl(body.get("cache_ttl")), "columns": columns,
            "mask": normalise_mask(body["mask"]) if body.get("mask") is not None else [], "mcp": _check_mcp(body.get("mcp", True)),
            "created_at": now, "last_modified_at": now,
        }
        return row, publish

    # --- routes ----------------------------------------------------------------------------
    def list(self, request, caller):
        args = request.args
        status = args.get("status")
        if status is not None and status not in _STATUSES:
            raise QagError("invalid_filter", f"status must be one of: {', '.join(_STATUSES)}")
        search = (args.get("search") or "").lower()
        items = []
        runs = self._runs()
        for q in self.store.list_queries():
            s = self.summary(q, runs)
            if "collection" in args and s["collection"] != args["collection"]:
                continue
            if "connection" in args and s["connection_name"] != args["connection"]:
                continue
            if status == "published" and s["published_version"] is None:
                continue
            if status == "unpublished" and s["published_version"] is not None:
                continue
            if status == "draft" and not s["has_draft"]:
                continue
            if search and not (search in s["name"].lower() or search in (s["description"] or "").lower()
                               or any(search in t.lower() for t in s["tags"])):
                continue
            items.append(s)
        return json_response({"items": items})

    def get(self, request, caller, name):
        q = self._existing(name)
        return with_etag(self.detail(q), q)

    def create(self, request, caller):
        body = body_object(request)
        refuse_unknown(body, CREATE_FIELDS)
        name = body.get("name")
        if not valid_query_name(name):
            raise QagError("invalid_name", _NAME_MESSAGE)
        collection = _check_collection(body.get("collection"))
        version, publish = self._version_input(body, caller)
        with self.store.transaction():
            if self.store.get_query_head(name) is not None:
                raise QagError("query_exists", f"A saved query named '{name}' already exists - add a version to it instead")
            self.store.create_query(name, collection, version, publish)
            audit(self.store, caller, "save_query", name, {"version": 1, "collection": collection})
            if publish:
                audit(self.store, caller, "publish_query", name, {"version": 1})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q, 201)

    def add_version(self, request, caller, name):
        self._unchanged(request, name)
        body = body_object(request)
        if "name" in body or "collection" in body:
            raise QagError("invalid_body", "A new version can't change the query's name or collection - "
                                           "rename by creating a new query, move it with PATCH")
        refuse_unknown(body, VERSION_FIELDS)
        version, publish = self._version_input(body, caller)
        with self.store.transaction():
            self._unchanged(request, name)
            number = self.store.add_version(name, version, publish)
            audit(self.store, caller, "save_query", name, {"version": number})
            if publish:
                audit(self.store, caller, "publish_query", name, {"version": number})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q, 201)

    def move(self, request, caller, name):
        self._unchanged(request, name)
        body = body_object(request)
        refuse_unknown(body, ("collection",), "Only 'collection' can be changed on a query (unknown: {}) - "
                                              "change anything else by adding a version")
        collection = _check_collection(body.get("collection"))
        with self.store.transaction():
            self._unchanged(request, name)
            if "collection" in body:
                self.store.set_collection(name, collection)
                audit(self.store, caller, "move_query", name, {"collection": collection})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q)

    def delete(self, request, caller, name):
        with self.store.transaction():
            q = self._existing(name)
            check_if_match(request, q, "query")
            self.store.delete_query(name)
            audit(self.store, caller, "delete_query", name, {})
        return no_content()

    def _version_of(self, q: dict, number: int) -> dict:
        for v in q["versions"]:
            if v["version"] == number:
                return v
        raise QagError("version_not_found", f"Version {number} not found")

    def get_version(self, request, caller, name, number):
        q = self._existing(name)
        return json_response(self.version_view(self._version_of(q, number), q["published"]))

    def patch_version(self, request, caller, name, number):
        self._unchanged(request, name)
        body = body_object(request)
        refuse_unknown(body, ("cache_ttl", "mcp"), "Only 'cache_ttl' and 'mcp' can be changed on a version "
                                                   "(unknown: {})")
        changes = {}
        if "cache_ttl" in body:
            changes["cache_ttl"] = _check_cache_ttl(body["cache_ttl"])
        if "mcp" in body:
            changes["mcp"] = _check_mcp(body["mcp"])
        with self.store.transaction():
            q = self._unchanged(request, name)
            self._version_of(q, number)
            if changes:
                self.store.update_version(name, number, dict(changes, last_modified_at=now_text()))
                if "cache_ttl" in changes:
                    audit(self.store, caller, "set_cache_ttl", name, {"version": number, "cache_ttl": changes["cache_ttl"]})
                if "mcp" in changes:
                    audit(self.store, caller, "set_mcp", name, {"version": number, "mcp": changes["mcp"]})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q)

    def delete_version(self, request, caller, name, number):
        with self.store.transaction():
            q = self._unchanged(request, name)
            self._version_of(q, number)
            remaining = [v["version"] for v in q["versions"] if v["version"] != number]
            if not remaining:
                self.store.delete_query(name)
                audit(self.store, caller, "delete_query", name, {"version": number})
                return no_content()
            self.store.delete_version(name, number)
            if q["published"] == number:
                # The newest older version takes over; never a newer draft.
                older = [n for n in remaining if n < number]
                self.store.set_published(name, max(older) if older else None)
                if older:
                    audit(self.store, caller, "publish_query", name, {"version": max(older)})
            audit(self.store, caller, "delete_query", name, {"version": number})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q)

    def flow(self, request, caller, name, number):
        q = self._existing(name)
        v = self._version_of(q, number)
        return json_response(flow(v["sql"], self._dialect_for(v.get("connection_name"))))

    def publish(self, request, caller, name):
        self._unchanged(request, name)
        body = body_object(request)
        number = shapes.whole(body.get("version"))
        if number is None:
            raise QagError("invalid_body", "version must be an integer")
        with self.store.transaction():
            q = self._unchanged(request, name)
            self._version_of(q, number)
            if q["published"] != number:
                self.store.set_published(name, number)
                audit(self.store, caller, "publish_query", name, {"version": number})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q)

    def unpublish(self, request, caller, name):
        with self.store.transaction():
            q = self._existing(name)
            check_if_match(request, q, "query")
            if q["published"] is not None:
                self.store.set_published(name, None)
                audit(self.store, caller, "unpublish_query", name, {"version": q["published"]})
            q = self.store.get_query(name)
        return with_etag(self.detail(q), q)

    def validate(self, request, caller):
        """Check a version definition without saving it; problems are reported, never raised. QueryAPIGate's order:
        the definition's first problem, then an unknown connection, then the SQL's."""
        body = body_object(request)
        errors: list[dict] = []
        placeholders: list[str] = []
        found_tables = None
        probe = {k: v for k, v in body.items() if k != "name"}
        try:
            refuse_unknown(probe, VERSION_FIELDS + ("collection",))
            self._version_input(probe, caller)
        except QagError as problem:
            entry = {"message": problem.message}
            if "errors" in problem.extras:
                entry["parameters"] = problem.extras["errors"]
                entry["field"] = "parameters"
            errors.append(entry)
        connection_name = body.get("connection_name")
        named = isinstance(connection_name, str) and connection_name != ""
        row = self.store.get_connection(connection_name) if named else None
        if named and row is None:
            # Saving takes any name (contract 5.3), but a run would fail: validate says so.
            errors.append({"message": f"Connection '{connection_name}' not found", "field": "connection_name"})
        sql = body.get("sql")
        dialect = row["db"] if row is not None else "sqlite"
        if isinstance(sql, str) and sql.strip():
            prepared = prepare(sql, dialect)
            placeholders = list(prepared.placeholders)
            if prepared.multiple:
                errors.append({"message": "Only a single SQL statement can be executed at a time", "field": "sql"})
            elif prepared.write_ops and not self.gateway.settings.allow_writes:
                # The server-wide setting, as QueryAPIGate's check reads it: with writes on, a write is valid here.
                errors.append({"message": read_only_message(prepared.write_ops), "field": "sql"})
            if row is not None:
                # As QueryAPIGate: tables are read in the saved connection's dialect, and without one none are.
                found_tables = tables(sql, dialect)
        return json_response({"valid": not errors, "errors": errors, "placeholders": placeholders,
                              "tables": found_tables or []})
