"""The /openapi.json document (OpenAPI 3.1), per caller: what this caller may call on this server, with request
shapes taken from qag/shapes.py (the validators' own limits), plus one path per saved query it may run."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from qag.auth import API_KEY_CHALLENGE
from qag.sql.params import normalise

from .. import shapes

__all__ = ["build_openapi", "params_schema", "View", "OPENAPI_VERSION", "FORMATS"]

OPENAPI_VERSION = "3.1.0"
FORMATS = ["json", "ndjson", "csv", "tsv", "xml", "yaml", "xlsx", "parquet"]
# Names the /q route reads itself (contract 3.1): a placeholder with one of these names can't come from the
# query string, so it is documented only in the POST body.
_RESERVED = frozenset({"format", "page", "page_size", "connection_name", "version", "timeout", "stream"})
_NON_WORD = re.compile(r"\W")


# --- Schema shorthands ---

def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict, required: tuple | list = (), extra: bool | dict | None = None, **more: Any) -> dict:
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    if extra is not None:
        schema["additionalProperties"] = extra
    schema.update(more)
    return schema


def _arr(items: dict) -> dict:
    return {"type": "array", "items": items}


def _null(schema: dict) -> dict:
    """The schema or JSON null (3.1 has no `nullable`: a type list, or anyOf for a reference)."""
    if isinstance(schema.get("type"), str):
        return {**schema, "type": [schema["type"], "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_TIME = {"type": "string", "description": "Server-local time, YYYY-MM-DD HH:MM:SS (see /health for the zone)",
         "pattern": r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"}
_NAMES_OR_ALL = {"oneOf": [{"const": "*"}, _arr(_STR)]}
# What a management body may store (api/_common.body_object refuses an integer outside 64 bits anywhere in it).
_NUM64 = {"anyOf": [{"type": "number", "not": {"type": "integer"}},
                    {"type": "integer", "minimum": shapes.INT64_MIN, "maximum": shapes.INT64_MAX}]}
_SCALAR64 = {"anyOf": [{"type": ["string", "boolean", "null"]}, *_NUM64["anyOf"]]}
_COUNT64 = {"type": "integer", "minimum": 0, "maximum": shapes.INT64_MAX}
_OUTCOME = {"const": "unknown", "description": "A write's reply was lost after its statement was sent: it may have "
                                               "been applied, so check before retrying (no Retry-After)"}


# --- Components ---

def _schemas() -> dict:
    rule_properties = {
        "type": {"enum": ["integer", "number", "string", "boolean", None]}, "required": _BOOL, "default": {},
        "enum": _arr({}), "min": _NUM, "max": _NUM, "min_length": _INT, "max_length": _INT, "pattern": _STR,
        "description": _STR,
    }
    rule_input = dict(rule_properties, type=_null({"type": "string", "description": "int, float, str or bool "
                                                   "(or integer, number, string, boolean); case-insensitive"}),
                      default=_SCALAR64, enum=_arr(_SCALAR64), min=_NUM64, max=_NUM64,
                      min_length=_COUNT64, max_length=_COUNT64, example=_SCALAR64)
    grants = {
        "connections": _NAMES_OR_ALL,
        "queries": {"oneOf": [{"const": "*"}, _arr({"oneOf": [_STR, _obj(
            {"name": _STR, "allow_writes": _BOOL}, ["name"], False)]})]},
        "collections": _arr(_STR), "allow_writes": _BOOL, "allowed_write_ops": _null(_arr(_STR)),
        "allowed_tables": _null(_arr(_STR)), "allowed_functions": _null(_arr(_STR)), "rate_limit": _null({"type": "string", "examples": ["100/minute"]}),
        "allowed_ips": _null(_arr(_STR)), "mask": _null(_arr(_ref("MaskRule"))),
        "max_concurrent": _null({"type": "integer", "minimum": 1, "maximum": 1000}),
        "query_timeout": _null({"type": "number", "minimum": 0.1, "maximum": 86400}),
        "max_rows": _null({"type": "integer", "minimum": 1, "maximum": 10_000_000}),
        "quota": _null(_ref("Quota")),
    }
    usage = _obj({"queries": _INT, "errors": _INT, "rows": _INT})
    connection = {
        "name": _STR, "db": _STR, "active": _BOOL, "host": _null(_STR), "port": _null({"type": ["integer", "string"]}),
        "database": _null(_STR), "user": _null(_STR), "example": _BOOL, "created_at": _TIME, "updated_at": _TIME,
        "usage": _obj({"queries": _INT, "errors": _INT, "rows": _INT, "avg_duration_ms": _null(_NUM)}),
    }
    version = {
        "version": _INT, "status": {"enum": ["published", "draft", "previous"]}, "uuid": _null(_STR),
        "author": _null(_STR), "description": _STR, "tags": _arr(_STR), "query_type": {"enum": ["sql", "mongo"]},
        "sql": _null(_STR), "mongo": _null({"type": "object"}), "connection_name": _null(_STR),
        "parameters": _obj({}, extra=_ref("ParameterRule")), "placeholders": _arr(_STR),
        "cache_ttl": _null(_INT), "columns": _obj({}, extra=_STR), "agent_writes": {}, "max_affected_rows": {},
        "mask": _arr(_ref("MaskRule")), "mcp": _BOOL, "created_at": _TIME, "last_modified_at": _TIME,
        "run_count": {"type": "integer", "description": "In a query detail only"},
    }
    summary = {
        "name": _STR, "description": _STR, "query_type": _STR, "connection_name": _null(_STR),
        "collection": _null(_STR), "tags": _arr(_STR), "published_version": _null(_INT), "latest_version": _INT,
        "has_draft": _BOOL, "version_count": _INT, "example": _BOOL, "endpoint": _STR, "updated_at": _TIME,
        "created_at": _TIME, "last_used_at": _null(_TIME), "cache_ttl": _null(_INT),
    }
    key_fields = {
        "name": _STR, **grants, "active": _BOOL, "expires_at": _null({"type": "string", "format": "date"}),
        "expired": _BOOL, "created_at": _TIME, "created_from_role": _null(_STR), "last_used_at": _null(_TIME),
        "previous_expires_at": _null(_TIME), "previous_last_used_at": _null(_TIME), "example": _BOOL,
        "usage": usage, "effective_limits": {"type": "object"}, "usage_this_period": _null({"type": "object"}),
        "secret": {"type": "string", "description": "Only in the answer to a create or a rotate: shown once"},
    }
    return {
        "Error": _obj({"error": _STR, "code": _STR, "errors": _obj({}, extra=_STR), "detail": _STR,
                       "retry_after": _NUM, "outcome": _OUTCOME, "request_id": _STR},
                      ["error", "code", "request_id"]),
        # RFC 9457, for a request with Accept: application/problem+json; the same members but error (= detail).
        "Problem": _obj({"type": {"const": "about:blank"}, "title": _STR, "status": _INT, "detail": _STR,
                         "code": _STR, "errors": _obj({}, extra=_STR), "driver_detail": _STR, "retry_after": _NUM,
                         "outcome": _OUTCOME, "request_id": _STR},
                        ["type", "title", "status", "detail", "code", "request_id"]),
        "Empty": _obj({"message": {"const": "No results returned"}}, ["message"]),
        "Rows": _arr({"type": "object"}),
        "ParameterRule": _obj(rule_properties, ["type", "required"]),
        "ParameterRuleInput": {"anyOf": [{"type": "string", "description": "A type name such as int"},
                                         _obj(rule_input, extra=False)]},
        "MaskRule": shapes.MASK_RULE,
        "Quota": shapes.QUOTA,
        "Connection": _obj(connection),
        "ConnectionDetail": {"allOf": [_ref("Connection"), _obj({"password": _null(_STR),
                                                                  "options": {"type": "object"}})]},
        "QueryVersion": _obj(version),
        "QuerySummary": _obj(summary),
        "Query": {"allOf": [_ref("QuerySummary"), _obj({"versions": _arr(_ref("QueryVersion"))})]},
        "Validation": _obj({"valid": _BOOL, "errors": _arr(_obj({"message": _STR, "field": _STR,
                                                                  "parameters": _obj({}, extra=_STR)})),
                            "placeholders": _arr(_STR), "tables": _arr(_STR)}),
        # What a management body may hold where its route ignores fields (publish): any JSON whose integers fit 64
        # bits, as api/_common.body_object refuses a wider one anywhere in a body.
        "Json64": {"anyOf": [_SCALAR64, _arr(_ref("Json64")), _obj({}, extra=_ref("Json64"))]},
        "Flow": _obj({"tables": _arr(_STR), "joins": _arr(_obj({"left": _STR, "right": _STR, "type": _STR,
                                                               "on": _STR})),
                      "formatted": _null(_STR), "error": _null(_STR)}),
        "HistoryEntry": _obj({"query": _null(_STR), "version": _null(_INT), "kind": {"enum": ["saved", "adhoc"]},
                              "executed_at": _TIME, "connection_name": _STR, "request_id": _null(_STR),
                              "key_name": _STR, "transport": _STR, "status": {"enum": ["success", "error"]},
                              "rows": _INT, "duration_ms": _INT, "serialization_ms": _NUM, "error": _STR,
                              "code": _STR}),
        "HistoryPage": _obj({"items": _arr(_ref("HistoryEntry")), "next_cursor": _null(_STR)}),
        "ApiKey": _obj(key_fields),
        "Role": _obj({"name": _STR, **grants, "created_at": _TIME, "example": _BOOL, "keys_created": _INT,
                      "require_claim_binding": _BOOL}),
        "Me": _obj({"name": _null(_STR), "role": _null(_STR), "via": _STR, "capabilities": _arr(_STR),
                    "data_access": _BOOL, "workspace": {}, "server_wide": {}, "workspaces": {"type": "object"}}),
        "Health": _obj({"status": {"const": "ok"}, "version": _STR, "time_zone": _null(_STR),
                        "utc_offset": {"type": "string", "examples": ["+05:30"]}}, ["status", "version"]),
        "CacheEntry": _obj({"key": _STR, "meta": {"type": "object"}, "content_type": _STR, "size_bytes": _INT,
                            "ttl_remaining_s": _NUM}),
        "QuotaUsage": _obj({"caller": _STR, "per": {"enum": ["day", "month"]}, "period": _STR, "calls": _INT,
                            "rows": _INT, "updated_at": _TIME}),
    }


@dataclass(frozen=True)
class View:
    """What one caller may call on this server: the document lists that and nothing else (issue 22.4).

    admin: every route (the admin key, a named administrator, open mode); anonymous: the public routes only;
    otherwise a scoped key or signed-in user: its data plane. `connections` are the existing connections the
    caller may use (the schema routes' names), `ddl_connections` those whose database shows a table's DDL;
    `collections` and `roles` the existing ones (what a key or role body may name); `formats` the output
    formats this server can write; `page_size` QAG_MAX_PAGE_SIZE."""

    admin: bool = True
    anonymous: bool = False
    adhoc: bool = True
    connections: tuple | None = None      # None: any name (the unit tests' document)
    ddl_connections: tuple | None = None
    switchable: tuple | None = None      # connections whose server has other databases (not SQLite)
    collections: tuple | None = None
    roles: tuple | None = None
    formats: tuple = tuple(FORMATS)
    page_size: int = 1000
    metrics: bool = True
    events: bool = True


FULL = View()


def _components(view: View) -> dict:
    content = {"application/json": {"schema": _ref("Error")},
               "application/problem+json": {"schema": _ref("Problem")}}
    errors = {"Error": {"description": "Error (RFC 9457 problem details with Accept: application/problem+json)",
                        "content": content},
              "Unauthorized": {"description": "No valid credential", "content": content,
                               "headers": {"WWW-Authenticate": {"schema": _STR, "description": API_KEY_CHALLENGE}}}}
    path_names = {
        "Name": "Saved-query name (URL-encoded)", "ConnectionName": "Connection name", "KeyName": "API key name",
        "RoleName": "Role name",
    }
    parameters = {key: {"name": "name", "in": "path", "required": True, "schema": _STR, "description": text}
                  for key, text in path_names.items()}
    parameters.update({
        "Version": {"name": "n", "in": "path", "required": True, "schema": shapes.VERSION_NUMBER},
        "CacheKey": {"name": "key", "in": "path", "required": True, "schema": _STR},
        "IfMatch": {"name": "If-Match", "in": "header", "required": False, "schema": _STR,
                    "description": "The ETag of an earlier read (or *): the change is refused with 412 when the "
                                   "resource changed since. Only a value this server sent in ETag can match"},
    })
    parameters.update(_run_parameter_table(view))
    return {
        "securitySchemes": {"ApiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"}},
        "schemas": _schemas(),
        "responses": errors,
        "parameters": parameters,
    }


_RUN_KEYS = ("Format", "Page", "PageSize", "Timeout", "Stream")


def _run_parameters(view: View) -> list[dict]:
    """References to the run's query-string arguments (components.parameters, _run_parameter_table)."""
    return [_p(key) for key in _RUN_KEYS]


def _run_parameter_table(view: View) -> dict:
    """Query-string arguments of a run (contract 3.1, 3.6-3.8, 10.5), shared by /q and /execute_sql, with this
    server's limits."""
    streamable = [f for f in shapes.STREAM_FORMATS if f in view.formats]
    return dict(zip(_RUN_KEYS, [
        {"name": "format", "in": "query", "description": "Output format (case-insensitive); wins over the body's. "
         "Without it, Accept chooses by media type (text/csv, ...), else json. Only the formats this server can "
         "write are listed", "schema": {"type": "string", "enum": list(view.formats), "default": "json"}},
        {"name": "page", "in": "query", "description": "Not with stream", "schema": shapes.page(view.page_size)},
        {"name": "page_size", "in": "query", "description": f"At most {view.page_size} (QAG_MAX_PAGE_SIZE); a key's "
         "max_rows lowers it without refusing. Not with stream", "schema": shapes.page_size(view.page_size)},
        {"name": "timeout", "in": "query", "description": "Seconds the statement may run; can only lower the "
         "server's limit", "schema": shapes.TIMEOUT},
        {"name": "stream", "in": "query", "description": "1, true, yes or on (case-insensitive): the whole result "
         "as one streamed body, which needs format " + ", ".join(streamable) + " and takes no page or page_size "
         "(400 invalid_stream otherwise, see x-qag-dependencies); any other value: a page",
         "schema": {"type": "string", "examples": ["true"]}},
    ]))


def _stream_rule(view: View) -> list[dict]:
    """The one dependency between run arguments, machine-readable: what stream=true needs of the others."""
    return [{"if": {"parameter": "stream", "in": list(shapes.STREAM_WORDS)},
             "then": {"format": [f for f in shapes.STREAM_FORMATS if f in view.formats], "page": None,
                      "page_size": None}}]


# --- Responses ---

def _errors(*statuses: str) -> dict:
    return {status: {"$ref": "#/components/responses/" + ("Unauthorized" if status == "401" else "Error")}
            for status in statuses}


def _json(description: str, schema: dict, headers: dict | None = None) -> dict:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


_ETAG = {"ETag": {"schema": _STR, "description": "Send it back in If-Match to change only what you read"}}
_NO_STORE = {"Cache-Control": {"schema": {"const": "no-store"}}}
_NO_CONTENT = {"description": "Done; no body"}
_PAGE_HEADERS = {
    "X-Page": {"schema": _INT}, "X-Page-Size": {"schema": _INT, "description": "Effective page size"},
    "X-Row-Count": {"schema": _INT}, "X-Has-More": {"schema": {"type": "string", "enum": ["true", "false"]}},
}
_MEDIA = {"json": "application/json", "ndjson": "application/x-ndjson", "csv": "text/csv",
          "tsv": "text/tab-separated-values", "xml": "application/xml", "yaml": "application/x-yaml",
          "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
          "parquet": "application/vnd.apache.parquet"}


def _rows_response(view: View) -> dict:
    content = {"application/json": {"schema": {"oneOf": [_ref("Rows"), _ref("Empty")]}}}
    for fmt in view.formats:
        if fmt == "yaml":   # a YAML reader reads the rows back as JSON would
            content[_MEDIA[fmt]] = {"schema": _ref("Rows")}
        elif fmt != "json":
            content[_MEDIA[fmt]] = {"schema": _STR}
    return {"description": "One page of rows (X-Has-More says whether another follows), or {\"message\": \"No "
                           "results returned\"} as JSON whatever the format when the page is empty; with stream, the "
                           "whole result", "headers": _PAGE_HEADERS, "content": content}


# Every answer may also come from qag's worker before the application (414, 431) or from a store that is down (503).
_ALWAYS = ("414", "431")
_RUN_STATUSES = ("400", "401", "403", "404", "413", "429", "500", "502", "503", "504")
_MANAGE_ERRORS = ("400", "401", "403", "429", "503")


def _op(op_id: str, summary: str, tag: str, responses: dict, *, params: list | None = None,
        body: dict | None = None, body_required: bool = True, errors: tuple = _MANAGE_ERRORS,
        description: str | None = None, **extensions) -> dict:
    operation: dict[str, Any] = {"operationId": op_id, "summary": summary, "tags": [tag]}
    if description:
        operation["description"] = description
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = {"required": body_required, "content": {"application/json": {"schema": body}}}
        if "413" not in errors:
            errors = (*errors, "413")
    operation["responses"] = {**responses, **_errors(*sorted({*errors, *_ALWAYS}))}
    for name, value in extensions.items():
        operation["x-qag-" + name.replace("_", "-")] = value
    return operation


def _p(key: str) -> dict:
    return {"$ref": f"#/components/parameters/{key}"}


def _items(schema: dict) -> dict:
    """A `{"items": [...]}` list answer."""
    return _obj({"items": _arr(schema)}, ["items"])


def _query_filter(name: str, description: str, schema: dict | None = None) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema or _STR, "description": description}


def _names(names: tuple | None, base: dict) -> dict:
    """A name that must be one of `names` (existing ones), or any name of the shape when unknown."""
    if names is None:
        return base
    return {"type": "string", "enum": list(names)}


# --- Request bodies (from shapes: what the validators check) ---

def _grants(view: View) -> dict:
    names = {"type": "array", "items": {"type": "string", "pattern": shapes.NOT_BLANK}}
    collections: dict = {"type": "array", "uniqueItems": True, "items": shapes.COLLECTION_NAME_SCHEMA,
                         "description": "Existing collections only (a collection exists while a query is in it)"}
    if view.collections is not None:
        collections = {"type": "array", "uniqueItems": True, "items": {"enum": list(view.collections)},
                       "description": collections["description"]}
        if not view.collections:
            collections["maxItems"] = 0
    query_entry = {"anyOf": [{"type": "string", "minLength": 1},
                             _obj({"name": {"type": "string", "minLength": 1}, "allow_writes": _null(_BOOL)},
                                  ["name"], False)]}
    return {
        "connections": _null({"anyOf": [{"const": "*"}, _arr({"type": "string", "minLength": 1})]}),
        "queries": _null({"anyOf": [{"const": "*"}, {"type": "array", "uniqueItems": True, "items": query_entry,
                                                     "description": "Each name once"}]}),
        "collections": _null(collections), "allow_writes": _null(_BOOL),
        "allowed_write_ops": _null(names), "allowed_tables": _null(names), "allowed_functions": _null(names),
        "rate_limit": _null({"type": "string", "pattern": shapes.RATE_LIMIT_PATTERN, "examples": ["100/minute"]}),
        "allowed_ips": _null(_arr(shapes.IP_ENTRY)), "mask": _null(_arr(_ref("MaskRule"))),
        "max_concurrent": _null(shapes.MAX_CONCURRENT), "query_timeout": _null(shapes.QUERY_TIMEOUT),
        "max_rows": _null(shapes.MAX_ROWS), "quota": _null(_ref("Quota")),
    }


def _key_create(view: View) -> dict:
    grants = _grants(view)
    expires = _null({"type": "string", "format": "date"})
    own = _obj({"name": shapes.KEY_NAME_SCHEMA, "expires_at": expires, **grants}, ["name"], False)
    if view.roles is not None and not view.roles:
        return own
    role = _names(view.roles, {"type": "string"})
    from_role = _obj({"name": shapes.KEY_NAME_SCHEMA, "role": dict(role, description="Copy this role's grants "
                                                                                      "(no grant fields then)"),
                      "expires_at": expires}, ["name", "role"], False)
    return {"anyOf": [own, from_role]}


def _role_create(view: View, create: bool) -> dict:
    properties = {"require_claim_binding": _null(_BOOL), **_grants(view)}
    if create:
        properties = {"name": shapes.KEY_NAME_SCHEMA, **properties}
    schema = _obj(properties, ["name"] if create else [], False,
                  description="With require_claim_binding, connections must be [] (also the role's current "
                              "connections, on a change)")
    # A claim-bound role reaches queries by name or collection only.
    schema["anyOf"] = [{"properties": {"require_claim_binding": {"enum": [False, None]}}},
                       {"properties": {"connections": {"type": "array", "maxItems": 0}}}]
    return schema


def _connection_input(create: bool) -> dict:
    text = {"type": "string", "pattern": r"^[^\u0000]*$"}
    options = {"type": "object", "description": "Driver options (row_security and db_roles: PostgreSQL only)",
               "propertyNames": {"not": {"enum": [*shapes.DIRECT_FIELDS, "db", "active", "name", "row_security",
                                                  "db_roles"]}},
               "additionalProperties": _SCALAR64}   # published as scalars
    properties = {"name": shapes.CONNECTION_NAME_SCHEMA if create else _STR,
                  "db": {"enum": list(shapes.SUPPORTED_DB)}, "host": _null(text),
                  "port": _null({"anyOf": [{"type": "integer", "minimum": 1, "maximum": 65535}, {"type": "string"}]}),
                  "database": _null(text),
                  "user": _null(text), "password": _null(_STR), "active": _BOOL, "options": _null(options)}
    if not create:
        del properties["name"]
    return _obj(properties, ["name", "db"] if create else [], False,
                description="Fields not listed here are read as options" if create else
                "Fields not given are kept; null removes one")


def _version_input(create: bool, validate: bool = False) -> dict:
    properties: dict[str, Any] = {
        "description": {"type": "string", "minLength": 1, "pattern": shapes.NOT_BLANK},
        "author": _STR, "tags": {"anyOf": [_arr(_STR), _STR]}, "query_type": {"enum": ["sql"]},
        "sql": {"type": "string", "minLength": 1, "pattern": shapes.NOT_BLANK},
        "connection_name": _null(_STR),
        "parameters": _null(_obj({}, extra=_ref("ParameterRuleInput"), propertyNames={"pattern": shapes.anchored(
            r"[A-Za-z_]\w*")}, description="Every name must be a placeholder (:name) of sql")),
        "cache_ttl": _null(shapes.CACHE_TTL), "columns": _null(_obj({}, extra=_STR)),
        "mask": _null(_arr(_ref("MaskRule"))), "mcp": _BOOL, "publish": {"type": "boolean", "default": False},
        "agent_writes": {"type": "null"}, "max_affected_rows": {"type": "null"},
    }
    if create or validate:
        properties = {"name": shapes.QUERY_NAME_SCHEMA if create else _STR,
                      "collection": _null(shapes.COLLECTION_NAME_SCHEMA), **properties}
    return _obj(properties, (["name"] if create else []) + ([] if validate else ["description", "sql"]), False)


_PLACEHOLDER_RULE = [{"keys-of": "parameters", "placeholders-of": "sql"}]


# --- Paths ---

def _public_paths(view: View) -> dict:
    """What anyone may call: health, probes, this document (and /metrics while it needs no token)."""
    paths = {
        "/health": {"get": _op("health", "Liveness and the server's time zone", "Operations",
                               {"200": _json("Up", _ref("Health"))}, errors=())},
        "/livez": {"get": _op("livez", "The process answers (touches nothing else)", "Operations",
                              {"200": _json("Up", _obj({"status": {"const": "ok"}}, ["status"]))}, errors=())},
        "/readyz": {"get": _op("readyz", "Ready: the store answers within 2 s", "Operations",
                               {"200": _json("Ready", _obj({"status": {"const": "ok"}, "checks": {"type": "object"}},
                                                           ["status"]))}, errors=("503",))},
        "/openapi.json": {"get": _op("openapi", "This document: what the caller may call", "Operations",
                                     {"200": _json("OpenAPI document", {"type": "object"})}, errors=("503",))},
    }
    if view.metrics:
        paths["/metrics"] = {"get": _op("metrics", "Prometheus metrics", "Operations",
                                        {"200": {"description": "Prometheus text format",
                                                 "content": {"text/plain": {"schema": _STR}}}},
                                        errors=("401",))}
    return paths


def _data_paths(view: View) -> dict:
    """The data plane a caller may reach: generic /q/{name} (administrators: any query), /execute_sql with a
    connection grant, /catalog, /events, the schema routes of the connections it may use."""
    run = _run_parameters(view)
    rows = _rows_response(view)
    fmt = {"type": "string", "enum": list(view.formats)}
    conn_names = ", ".join(view.connections) if view.connections else None
    paths: dict = {}
    if view.admin:
        run_body = _obj({
            "params": {"type": "object", "description": "Parameter values (JSON types kept)"},
            "placeholders": {"type": "object", "description": "Alias of params, merged after it"},
            "connection_name": {"type": "string", "minLength": 1}, "version": shapes.VERSION_NUMBER,
            "format": fmt, "timeout": shapes.TIMEOUT,
        })
        paths["/q/{name}"] = {
            "parameters": [_p("Name")],
            "get": _op("runSavedQuery", "Run a saved query; other query-string arguments are its parameters (text)",
                       "Saved queries", {"200": rows}, errors=_RUN_STATUSES,
                       params=[*run, _query_filter("version", "Version number (default: the published one)",
                                                   shapes.VERSION_NUMBER),
                               _query_filter("connection_name", "Run on this connection instead of the saved one",
                                             {"type": "string", "minLength": 1})],
                       dependencies=_stream_rule(view)),
            "post": _op("runSavedQueryPost", "Run a saved query with parameters in a JSON body", "Saved queries",
                        {"200": rows}, params=run, body=run_body, body_required=False, errors=_RUN_STATUSES,
                        dependencies=_stream_rule(view)),
        }
    if view.adhoc:
        body = {"sql": {"type": "string", "minLength": 1, "pattern": shapes.NOT_BLANK},
                "connection_name": {"type": "string", "minLength": 1,
                                    "description": "A connection this caller may use"
                                    + (f" ({conn_names})" if conn_names else "")},
                "params": {"type": "object", "description": "Values for :name parameters"},
                "format": fmt, "timeout": shapes.TIMEOUT, "mask": _arr(_ref("MaskRule"))}
        if view.admin:
            body["database"] = {"type": "string", "minLength": 1, "maxLength": 64,
                                "pattern": shapes.anchored("[^\\u0000]*"),
                                "description": "Another database on the same server (MySQL, PostgreSQL), for this "
                                               "call only"}
        paths["/execute_sql"] = {"post": _op(
            "executeSql", "Run one ad-hoc SQL statement", "Ad-hoc SQL", {"200": rows}, errors=_RUN_STATUSES,
            params=run, body=_obj(body, ["sql", "connection_name"]), dependencies=_stream_rule(view))}
    paths["/catalog"] = {"get": _op(
        "catalog", "The saved queries this caller may run, with their parameters, and the caller's grants",
        "Operations", {"200": _json("Catalog", _obj({"queries": _arr({"type": "object"}),
                                                     "caller": {"type": "object"}}, ["queries", "caller"]))},
        errors=("401", "429", "503"))}
    if view.events:
        paths["/events"] = {"get": _op(
            "events", "Live run events (Server-Sent Events): an administrator sees every run, a key its own",
            "Operations", {"200": {"description": "text/event-stream of `data: <event JSON>` frames",
                                   "content": {"text/event-stream": {"schema": _STR}}}},
            errors=("400", "401", "429", "503"),
            params=[_query_filter("type", "Only events of this type"),
                    _query_filter("kind", "Only events of this kind", {"enum": list(shapes.HISTORY_KINDS)}),
                    _query_filter("query", "Only events of this saved query"),
                    _query_filter("connection", "Only events on this connection"),
                    _query_filter("status", "Only events with this status", {"enum": list(shapes.RUN_STATUSES)})])}
    if view.connections is None or view.connections:
        name = {"name": "name", "in": "path", "required": True, "description": "A connection this caller may use",
                "schema": _names(view.connections, _STR)}
        params = [name]
        extensions = {}
        if view.admin and (view.switchable is None or view.switchable):
            params.append(_query_filter("database", "Administrators: another database on the same server (MySQL, "
                                                    "PostgreSQL connections only)"))
            if view.switchable is not None:
                extensions["dependencies"] = [{"if": {"parameter": "database"},
                                               "then": {"name": list(view.switchable)}}]
        paths["/connections/{name}/schema"] = {"get": _op(
            "connectionSchema", "Tables and columns of a connection the caller may use", "Operations",
            {"200": _json("Schema", _obj({"tables": _arr({"type": "object"}), "truncated": _BOOL}))},
            params=params, errors=("400", "401", "403", "404", "429", "502", "503"), **extensions)}
    if view.ddl_connections is None or view.ddl_connections:
        name = {"name": "name", "in": "path", "required": True, "description": "A MySQL/MariaDB or SQLite "
                "connection this caller may use", "schema": _names(view.ddl_connections, _STR)}
        paths["/connections/{name}/table_ddl"] = {"get": _op(
            "connectionTableDdl", "The CREATE statement of one table or view (MySQL/MariaDB and SQLite)",
            "Operations", {"200": _json("DDL", _obj({"ddl": _STR}, ["ddl"]))},
            params=[name, dict(_query_filter("table", "The table, as the database names it",
                                             {"type": "string", "minLength": 1}), required=True)],
            errors=("400", "401", "403", "404", "429", "502", "503"))}
    return paths


def _admin_paths(view: View) -> dict:
    """/api/v1: administrators only."""
    history_filters = [
        _query_filter("version", "Only runs of this version", shapes.HISTORY_VERSION),
        _query_filter("status", "success or error", {"enum": list(shapes.RUN_STATUSES)}),
        _query_filter("key", "Exact caller key name"),
        _query_filter("since", "Inclusive; YYYY-MM-DD (or YYYY-MM-DD HH:MM:SS)", {"type": "string",
                                                                                   "format": "date"}),
        _query_filter("until", "Exclusive; YYYY-MM-DD (or YYYY-MM-DD HH:MM:SS)", {"type": "string",
                                                                                   "format": "date"}),
        _query_filter("limit", "Page size", shapes.HISTORY_LIMIT),
        _query_filter("cursor", "next_cursor of the previous page (no other value: see the next link)"),
    ]
    next_page = {"links": {"next": {"operationId": "getHistory", "parameters": {
        "cursor": "$response.body#/next_cursor"}, "description": "The next page"}}}
    conn, query, key, role = _p("ConnectionName"), _p("Name"), _p("KeyName"), _p("RoleName")
    if_match = _p("IfMatch")
    detail_conn = _json("The connection", _ref("ConnectionDetail"), _ETAG)
    detail_query = _json("The saved query", _ref("Query"), _ETAG)
    detail_key = _json("The API key", _ref("ApiKey"), _ETAG)
    detail_role = _json("The role", _ref("Role"), _ETAG)
    C, Q, K, R = "Connections", "Saved queries (management)", "API keys", "Roles"
    etag_only = {"from_response": ["If-Match"]}   # its value is an ETag this server sent
    version_rules = {"dependencies": _PLACEHOLDER_RULE}

    return {
        # --- connections ---
        "/api/v1/connections": {
            "get": _op("listConnections", "List connections", C, {"200": _json("Connections",
                                                                               _items(_ref("Connection")))}),
            "post": _op("createConnection", "Create a connection", C, {"201": detail_conn},
                        body=_ref("ConnectionInput"), errors=(*_MANAGE_ERRORS, "409")),
        },
        "/api/v1/connections/deleted": {"get": _op(
            "listDeletedConnections", "Deleted connections, newest first", C,
            {"200": _json("Deleted connections", _items(_obj({
                "name": _STR, "db": _null(_STR), "host": _null(_STR), "port": _null({"type": ["integer", "string"]}),
                "database": _null(_STR), "deleted_at": _TIME, "deleted_by": _STR, "reason": _null(_STR)})))})},
        "/api/v1/connections/test": {"post": _op(
            "testConnection", "Try a connection (saved: {\"name\": ...}, or not) with SELECT 1", C,
            {"200": _json("Reachable", _obj({"elapsed_ms": _NUM}))},
            body={"anyOf": [_obj({"name": _STR}, ["name"], False), _ref("ConnectionTry")]},
            errors=(*_MANAGE_ERRORS, "404", "500", "502", "504"))},
        "/api/v1/connections/databases": {"post": _op(
            "listDatabases", "List the databases a connection's server has", C,
            {"200": _json("Databases", _obj({"databases": _arr(_STR)}))},
            body={"anyOf": [_obj({"name": _STR}, ["name"], False), _ref("ConnectionTry")]},
            errors=(*_MANAGE_ERRORS, "404", "500", "502", "504"))},
        "/api/v1/connections/{name}": {
            "parameters": [conn],
            "get": _op("getConnection", "A connection", C, {"200": detail_conn}, errors=(*_MANAGE_ERRORS, "404")),
            "patch": _op("updateConnection", "Change a connection (fields not given are kept; null removes one)",
                         C, {"200": detail_conn}, params=[if_match], body=_ref("ConnectionPatch"),
                         errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
            "delete": _op("deleteConnection", "Delete a connection (a reason is required)", C, {"204": _NO_CONTENT},
                          params=[if_match], body=_obj({"reason": {"type": "string", "pattern": shapes.NOT_BLANK}},
                                                       ["reason"]),
                          errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
        },
        "/api/v1/connections/{name}/test": {"post": _op(
            "testSavedConnection", "Try a saved connection with SELECT 1", C,
            {"200": _json("Reachable", _obj({"elapsed_ms": _NUM}))}, params=[conn],
            errors=(*_MANAGE_ERRORS, "404", "500", "502", "504"))},
        "/api/v1/connections/{name}/schema": {"get": _op(
            "getConnectionSchema", "Tables and columns of a connection's database", C,
            {"200": _json("Schema", _obj({"tables": _arr({"type": "object"}), "truncated": _BOOL}))},
            params=[conn, _query_filter("database", "Another database on the same server (MySQL, PostgreSQL)")],
            errors=(*_MANAGE_ERRORS, "404", "502"))},
        # --- saved queries ---
        "/api/v1/queries": {
            "get": _op("listQueries", "List saved queries", Q, {"200": _json("Saved queries",
                                                                             _items(_ref("QuerySummary")))},
                       params=[_query_filter("collection", "Exact collection"),
                               _query_filter("connection", "Exact connection name"),
                               _query_filter("search", "Substring of name, description or a tag"),
                               _query_filter("status", "published, unpublished or draft",
                                             {"enum": list(shapes.LIST_STATUSES)})]),
            "post": _op("createQuery", "Create a saved query (version 1; a draft unless publish is true)", Q,
                        {"201": detail_query}, body=_ref("QueryCreate"), errors=(*_MANAGE_ERRORS, "409"),
                        **version_rules),
        },
        "/api/v1/queries/validate": {"post": _op(
            "validateQuery", "Check a definition without saving it (problems are reported, not refused)", Q,
            {"200": _json("Every problem found", _ref("Validation"))}, body=_ref("QueryValidate"))},
        "/api/v1/queries/{name}": {
            "parameters": [query],
            "get": _op("getQuery", "A saved query with all its versions", Q, {"200": detail_query},
                       errors=(*_MANAGE_ERRORS, "404")),
            "patch": _op("moveQuery", "Move a saved query to another collection", Q, {"200": detail_query},
                         params=[if_match], body=_obj({"collection": _null(shapes.COLLECTION_NAME_SCHEMA)},
                                                      ["collection"], False),
                         errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
            "delete": _op("deleteQuery", "Delete a saved query, its versions and their history", Q,
                          {"204": _NO_CONTENT}, params=[if_match], errors=(*_MANAGE_ERRORS, "404", "412"),
                          **etag_only),
        },
        "/api/v1/queries/{name}/versions": {"post": _op(
            "addQueryVersion", "Add a version (a draft unless publish is true)", Q, {"201": detail_query},
            params=[query, if_match], body=_ref("QueryVersionInput"), errors=(*_MANAGE_ERRORS, "404", "412"),
            **etag_only, **version_rules)},
        "/api/v1/queries/{name}/versions/{n}": {
            "parameters": [query, _p("Version")],
            "get": _op("getQueryVersion", "One version", Q, {"200": _json("The version", _ref("QueryVersion"))},
                       errors=(*_MANAGE_ERRORS, "404")),
            "patch": _op("updateQueryVersion", "Change a version's cache_ttl or mcp flag in place", Q,
                         {"200": detail_query}, params=[if_match],
                         body=_obj({"cache_ttl": _null(shapes.CACHE_TTL), "mcp": _BOOL}, extra=False),
                         errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
            "delete": _op("deleteQueryVersion", "Delete a version (the query too when it was the last)", Q,
                          {"200": detail_query, "204": _NO_CONTENT}, params=[if_match],
                          errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
        },
        "/api/v1/queries/{name}/versions/{n}/flow": {"get": _op(
            "getQueryFlow", "Tables and joins of a version's SQL (best effort)", Q,
            {"200": _json("Flow", _ref("Flow"))}, params=[query, _p("Version")], errors=(*_MANAGE_ERRORS, "404"))},
        "/api/v1/queries/{name}/publish": {"post": _op(
            "publishQuery", "Serve this version (newer or older)", Q, {"200": detail_query},
            params=[query, if_match], body=_obj({"version": shapes.VERSION_NUMBER}, ["version"],
                                                extra=_ref("Json64")),
            errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only)},
        "/api/v1/queries/{name}/unpublish": {"post": _op(
            "unpublishQuery", "Serve no version (versions are kept)", Q, {"200": detail_query},
            params=[query, if_match], errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only)},
        "/api/v1/queries/{name}/history": {"get": _op(
            "getQueryHistory", "Runs of one saved query, newest first", Q,
            {"200": {**_json("Runs", _ref("HistoryPage")), "links": {"next": {
                "operationId": "getQueryHistory", "parameters": {"name": "$request.path.name",
                                                                 "cursor": "$response.body#/next_cursor"}}}}},
            params=[query, *history_filters], errors=(*_MANAGE_ERRORS, "404"), from_response=["cursor"])},
        # --- API keys ---
        "/api/v1/api-keys": {
            "get": _op("listApiKeys", "List API keys", K, {"200": _json("API keys", _items(_ref("ApiKey")))}),
            "post": _op("createApiKey", "Create an API key (grants, or a role to copy them from); the answer shows "
                        "its secret once", K,
                        {"201": _json("The key and its secret", _ref("ApiKey"), {**_ETAG, **_NO_STORE})},
                        body=_ref("ApiKeyInput"), errors=(*_MANAGE_ERRORS, "404", "409")),
        },
        "/api/v1/api-keys/{name}": {
            "parameters": [key],
            "get": _op("getApiKey", "An API key", K, {"200": detail_key}, errors=(*_MANAGE_ERRORS, "404")),
            "patch": _op("updateApiKey", "Change an API key", K, {"200": detail_key}, params=[if_match],
                         body=_ref("ApiKeyPatch"), errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
            "delete": _op("deleteApiKey", "Delete an API key (it stops working at once)", K, {"204": _NO_CONTENT},
                          params=[if_match], errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
        },
        "/api/v1/api-keys/{name}/rotate": {"post": _op(
            "rotateApiKey", "New secret; the old one works for grace_minutes more", K,
            {"200": _json("The key and its new secret", _ref("ApiKey"), {**_ETAG, **_NO_STORE})},
            params=[key, if_match], body=_obj({"grace_minutes": _null(shapes.GRACE_MINUTES)}, extra=False),
            body_required=False, errors=(*_MANAGE_ERRORS, "404", "409", "412"), **etag_only)},
        "/api/v1/api-keys/{name}/previous": {"delete": _op(
            "endPreviousSecret", "Stop the old secret of a rotation now", K, {"200": detail_key}, params=[key],
            errors=(*_MANAGE_ERRORS, "404"))},
        # --- roles ---
        "/api/v1/roles": {
            "get": _op("listRoles", "List roles", R, {"200": _json("Roles", _items(_ref("Role")))}),
            "post": _op("createRole", "Create a role (a template for keys)", R, {"201": detail_role},
                        body=_ref("RoleInput"), errors=(*_MANAGE_ERRORS, "409")),
        },
        "/api/v1/roles/{name}": {
            "parameters": [role],
            "get": _op("getRole", "A role", R, {"200": detail_role}, errors=(*_MANAGE_ERRORS, "404")),
            "patch": _op("updateRole", "Change a role's grants (keys made from it keep theirs)", R,
                         {"200": detail_role}, params=[if_match], body=_ref("RolePatch"),
                         errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
            "delete": _op("deleteRole", "Delete a role", R, {"204": _NO_CONTENT}, params=[if_match],
                          errors=(*_MANAGE_ERRORS, "404", "412"), **etag_only),
        },
        # --- cache, history, identity ---
        "/api/v1/cache/entries": {
            "get": _op("listCacheEntries", "Live response-cache entries, soonest to expire first", "Cache",
                       {"200": _json("Entries", _items(_ref("CacheEntry")))}),
            "delete": _op("clearCache", "Evict every entry", "Cache", {"204": _NO_CONTENT}),
        },
        "/api/v1/cache/entries/{key}": {
            "parameters": [_p("CacheKey")],
            "get": _op("getCacheEntry", "A cached body, with its own content type", "Cache",
                       {"200": {"description": "The cached body"}}, errors=(*_MANAGE_ERRORS, "404")),
            "delete": _op("evictCacheEntry", "Evict one entry (no-op when unknown)", "Cache", {"204": _NO_CONTENT}),
        },
        "/api/v1/history": {"get": _op(
            "getHistory", "All runs, newest first", "History", {"200": {**_json("Runs", _ref("HistoryPage")),
                                                                       **next_page}},
            params=[_query_filter("kind", "saved or adhoc", {"enum": list(shapes.HISTORY_KINDS)}),
                    _query_filter("query", "Saved-query name"), *history_filters], from_response=["cursor"])},
        "/api/v1/usage/quotas": {"get": _op(
            "getQuotaUsage", "Quota counts for the current day and month", "History",
            {"200": _json("Counts", _items(_ref("QuotaUsage")))})},
        "/api/v1/me": {"get": _op("me", "Who the caller is", "Identity", {"200": _json("The caller", _ref("Me"))})},
    }


def _inputs(view: View) -> dict:
    """The request-body schemas, with this server's existing collections and roles."""
    return {
        "ConnectionInput": _connection_input(True),
        "ConnectionPatch": _connection_input(False),
        "ConnectionTry": _obj(dict(_connection_input(False)["properties"], name=_STR), ["db"], False),
        "QueryCreate": _version_input(True),
        "QueryVersionInput": _version_input(False),
        "QueryValidate": _version_input(False, validate=True),
        "ApiKeyInput": _key_create(view),
        "ApiKeyPatch": _obj({"active": _null(_BOOL), "expires_at": _null({"type": "string", "format": "date"}),
                             **_grants(view)}, extra=False),
        "RoleInput": _role_create(view, True),
        "RolePatch": _role_create(view, False),
    }


@functools.lru_cache(maxsize=64)
def _static(version: str, view: View) -> dict:
    """Everything that does not depend on the saved queries, for one kind of caller."""
    paths = _public_paths(view)
    components = _components(view)
    if not view.anonymous:
        paths.update(_data_paths(view))
    if view.admin:
        paths.update(_admin_paths(view))
        components = dict(components, schemas={**components["schemas"], **_inputs(view)})
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "qag", "version": version,
                 "description": "Saved SQL queries as HTTP APIs (compatible with QueryAPIGate 0.43). This document "
                                "lists what its caller may call: an administrator everything, an API key its own "
                                "queries and data routes, an anonymous caller the public routes. Errors are JSON "
                                "objects (RFC 9457 problem details with Accept: application/problem+json); a method "
                                "a path does not take is 405 with an Allow header. x-qag-dependencies states what a "
                                "parameter needs of the others; x-qag-from-response names values only an earlier "
                                "answer can give."},
        "security": [{}, {"ApiKey": []}],
        "paths": paths,
        "components": components,
    }


def _operation_ids_of(paths: dict) -> set:
    return {op["operationId"] for item in paths.values() for key, op in item.items() if key != "parameters"}


# --- Saved-query paths ---

def _rule_schema(rule: dict, in_query: bool) -> dict:
    """A stored rule (normalised) as JSON Schema."""
    type_name = rule["type"]
    if type_name is not None:
        schema: dict[str, Any] = {"type": type_name}
    elif in_query:
        schema = {"type": "string"}  # the query string only carries text
    else:
        schema = {"type": ["string", "number", "boolean"]}
    if "enum" in rule:
        schema["enum"] = rule["enum"]
    for ours, theirs in (("min", "minimum"), ("max", "maximum"), ("min_length", "minLength"),
                         ("max_length", "maxLength")):
        if ours in rule:
            schema[theirs] = rule[ours]
    if type_name == "integer":
        # What a driver can bind: outside signed 64 bits a value is refused (must be a 64-bit integer).
        schema.setdefault("minimum", shapes.INT64_MIN)
        schema.setdefault("maximum", shapes.INT64_MAX)
    if "pattern" in rule:
        # qag matches the whole value (Python fullmatch); a JSON-schema pattern matches anywhere unless anchored.
        schema["pattern"] = shapes.anchored(rule["pattern"])
    for key in ("description", "default", "example"):
        if key in rule:
            schema[key] = rule[key]
    return schema


def _operation_ids(name: str, taken: set) -> tuple[str, str]:
    base = "run_" + _NON_WORD.sub("_", name)
    # Both ids must be free: query "a_post" and query "a" would otherwise both claim "run_a_post".
    while base in taken or base + "_post" in taken:
        base += "_"
    taken.add(base)
    taken.add(base + "_post")
    return base, base + "_post"


def params_schema(query: dict) -> dict:
    """The JSON Schema of a saved query's `params` object: its POST body's `params` here, its MCP tool's
    inputSchema (qag/api/mcp.py)."""
    properties, required, _ = _placeholder_schemas(query)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _placeholder_schemas(query: dict) -> tuple[dict, list, list]:
    """(JSON-body properties, required names, query-string parameters) of a saved query's placeholders."""
    declared = query.get("parameters") or {}
    if not isinstance(declared, dict):
        declared = {}
    query_params: list[dict] = []
    properties: dict[str, dict] = {}
    required: list[str] = []
    seen: set[str] = set()
    for placeholder in query.get("placeholders") or ():
        if placeholder in seen:
            continue
        seen.add(placeholder)
        spec = declared.get(placeholder)
        if isinstance(spec, dict) and spec.get("from_claim"):
            continue  # filled from the caller's bearer token; a request that sends it is refused
        if placeholder in declared:
            rule = normalise(declared[placeholder])
            must = rule["required"] and "default" not in rule
            properties[placeholder] = _rule_schema(rule, in_query=False)
            query_schema = _rule_schema(rule, in_query=True)
        else:
            rule, must = {}, True  # an undeclared placeholder: required text
            properties[placeholder] = {"type": "string"}
            query_schema = {"type": "string"}
        if must:
            required.append(placeholder)
        if placeholder in _RESERVED:
            continue
        entry: dict[str, Any] = {"name": placeholder, "in": "query", "required": must, "schema": query_schema}
        if "description" in rule:
            entry["description"] = rule["description"]
        if "example" in rule:
            entry["example"] = rule["example"]
        query_params.append(entry)
    return properties, required, query_params


def _saved_query_path(query: dict, taken: set, view: View) -> tuple[str, dict]:
    name = query["name"]
    default_connection = query.get("connection_name") or None
    summary = query.get("description") or f"Run the saved query {name}"
    get_id, post_id = _operation_ids(name, taken)
    properties, required, query_params = _placeholder_schemas(query)

    connection_schema: dict[str, Any] = {"type": "string", "minLength": 1}
    if default_connection:
        connection_schema["default"] = default_connection
    connection = {"name": "connection_name", "in": "query", "required": not default_connection,
                  "schema": connection_schema}
    version = {"name": "version", "in": "query", "required": False, "schema": shapes.VERSION_NUMBER,
               "description": "Version number (default: the published one)"}
    description = f"Runs the saved query '{name}'."
    params: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    body = {"type": "object", "properties": {
        "params": params, "connection_name": connection_schema, "version": shapes.VERSION_NUMBER,
        "format": {"type": "string", "enum": list(view.formats)}, "timeout": shapes.TIMEOUT}}
    if required or not default_connection:
        body["required"] = (["params"] if required else []) + ([] if default_connection else ["connection_name"])
    tags = ["Saved queries"]
    run = _run_parameters(view)
    rows = {"200": _rows_response(view), **_errors(*sorted({*_RUN_STATUSES, *_ALWAYS}))}
    dependencies = _stream_rule(view)
    item = {
        "get": {"operationId": get_id, "summary": summary, "description": description, "tags": tags,
                "parameters": [*query_params, connection, version, *run],
                "responses": rows, "x-qag-dependencies": dependencies},
        "post": {"operationId": post_id, "summary": summary, "description": description + " Parameters in a JSON "
                 "body.", "tags": tags, "parameters": run,
                 "requestBody": {"required": bool(body.get("required")),
                                 "content": {"application/json": {"schema": body}}},
                 "responses": rows, "x-qag-dependencies": dependencies},
    }
    return "/q/" + quote(name, safe=""), item


BEARER_SCHEME = {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                 "description": "A signed-in user's token (QAG_JWT_*); its role claim picks the grants"}


def build_openapi(version: str, queries: list[dict], bearer: bool = False, view: View = FULL) -> dict:
    """The OpenAPI 3.1 document for one caller: the routes `view` says it may call, plus one path per query in
    `queries` (already filtered to what it may run). Each query: name, description, connection_name, parameters
    (stored form) and placeholders (names the SQL uses, in order). Nested parts are shared with a cache: serialise,
    don't mutate. `bearer`: the server takes bearer tokens, so the BearerAuth scheme is declared beside ApiKey."""
    static = _static(version, view)
    document = dict(static)
    if bearer:
        components = dict(static["components"])
        components["securitySchemes"] = {**components["securitySchemes"], "BearerAuth": BEARER_SCHEME}
        document["components"] = components
        document["security"] = [*static["security"], {"BearerAuth": []}]
    if not queries:
        return document
    paths = dict(static["paths"])
    taken = _operation_ids_of(paths)
    for query in queries:
        path, item = _saved_query_path(query, taken, view)
        paths[path] = item
    document["paths"] = paths
    return document
