"""The error-code table (code → HTTP status, default message), QagError, and the error envelope."""

from __future__ import annotations

from http import HTTPStatus

# code: (status, default message, when it is used). docs/errors.md is generated from this table.
ERRORS: dict[str, tuple[int, str, str]] = {
    "invalid_request": (400, "Invalid request", "generic 400 (page or version not an integer, ...)"),
    "invalid_body": (400, "Request body must be a JSON object", "body not a JSON object, malformed JSON, bad field values"),
    "unknown_field": (400, "Unknown field(s)", "a management body has fields the resource does not accept"),
    "invalid_name": (400, "Invalid name", "bad connection, query, key or role name"),
    "invalid_text": (400, "Text can't contain a NUL character", "a name, body text or query-string value the store would keep or look up holds U+0000, which a PostgreSQL store (QAG_DATABASE_URL) can't hold"),
    "sql_required": (400, "SQL query is missing", "missing or blank `sql`"),
    "connection_required": (400, "Connection name is missing", "no `connection_name` anywhere"),
    "multiple_statements": (400, "Only a single SQL statement can be executed at a time", "more than one statement"),
    "param_required": (400, "Missing parameters", "only missing parameters"),
    "param_invalid": (400, "Invalid parameters", "a parameter violates a rule, bad value type, bad LIMIT/OFFSET parameter"),
    "value_too_large": (400, "A value is larger than the database allows", "SQLite: a value, LIKE/GLOB pattern or statement over SQLite's length or depth limits (docs/security.md); MariaDB/MySQL: a statement nested deeper than the server's thread stack, its subquery nesting limit or its parser's stack; PostgreSQL: a statement past a limit of the server (SQLSTATE class 54: stack depth, target-list entries, arguments) or its parser's stack"),
    "value_invalid": (400, "The database can't use a value of this statement", "the database refused a value for its type or range (bad input syntax, out of range, too long, division by zero), invalid text (SQLite), or a NUL character in the statement (any database: the guard refuses it before anything runs)"),
    "param_from_claim": (400, "A parameter comes from the sign-in token and can't be set by the request", "the request sends a `from_claim` parameter"),
    "invalid_paging": (400, "page and page_size must be positive", "`page`/`page_size` < 1 or `page_size` > max"),
    "invalid_format": (400, "Unsupported format", "unknown `format`"),
    "invalid_timeout": (400, "timeout must be a positive number of seconds", "`timeout` not a positive finite number"),
    "invalid_stream": (400, "Invalid stream request", "`stream=true` with a non-streamable format, or with paging"),
    "table_required": (400, "table is required", "`/connections/<name>/table_ddl` without `table`"),
    "invalid_filter": (400, "Invalid filter", "bad list filter"),
    "reason_required": (400, "A reason is required to delete a connection", "deleting a connection without `reason`"),
    "unsupported_database": (400, "Unsupported database", "connection `db` not supported at run time"),
    "unsupported_operation": (400, "Unsupported operation", "for example listing databases on SQLite"),
    "connection_misconfigured": (400, "The connection is misconfigured", "missing file path or a SQLite file that is not a database (400); unresolvable `${VAR}` (500)"),
    "malformed_http": (400, "Malformed HTTP request", "refused by qag's worker before the app: bad request line, header or body framing (incl. Content-Length with Transfer-Encoding); the connection is closed"),
    "unauthorized": (401, "Unauthorized", "no or invalid credential"),
    "token_malformed": (401, "The bearer token is not a well-formed JWT", "`Authorization: Bearer` value that is not a compact JWS (or is over 16 KiB)"),
    "token_algorithm": (401, "The bearer token's algorithm is not accepted", "`alg` outside QAG_JWT_ALGORITHMS (`none`, HS with signing keys, RS/ES/EdDSA with a secret) or not its key's `alg`"),
    "token_signature": (401, "The bearer token's signature does not verify", "wrong signature, or a key that can't verify this algorithm"),
    "token_unknown_key": (401, "The bearer token was signed with a key this API does not know", "`kid` missing, or not in the issuer's keys even after fetching them again"),
    "token_expired": (401, "The bearer token has expired", "`exp` passed (beyond QAG_JWT_LEEWAY)"),
    "token_not_yet_valid": (401, "The bearer token is not valid yet", "`nbf` or `iat` in the future (beyond QAG_JWT_LEEWAY)"),
    "token_issuer": (401, "The bearer token was not issued by the configured issuer", "`iss` is not QAG_JWT_ISSUER"),
    "token_audience": (401, "The bearer token was not issued for this API", "`aud` names none of QAG_JWT_AUDIENCE"),
    "token_claims": (401, "The bearer token lacks a required claim", "no `exp`, or no usable user claim (QAG_JWT_USER_CLAIM)"),
    "open_access_remote": (403, "This server has no API key configured and only answers local callers", "open server, remote caller"),
    "admin_only": (403, "This API key is not authorized to manage the server configuration", "non-administrator on `/api/v1`"),
    "connection_forbidden": (403, "This API key is not permitted to use this connection", "key not granted the connection"),
    "connection_inactive": (403, "The connection is currently not active", "connection `active: false`"),
    "read_only": (403, "Only read-only statements are allowed", "statement writes and writes are not allowed"),
    "write_op_not_allowed": (403, "This API key may not perform this write operation", "write keyword outside `allowed_write_ops`"),
    "pragma_not_allowed": (403, "The gateway never sets this pragma", "SQLite: setting a pragma whose value is the whole process's, not the connection's (`hard_heap_limit`, `soft_heap_limit`, `temp_store_directory`, `data_store_directory`), for any caller, an administrator included (docs/security.md)"),
    "table_not_allowed": (403, "This API key may not query this table", "statement touches a table outside `allowed_tables` (on PostgreSQL also names a type that isn't the engine's own nor one the connection's catalog lists as the database's and no relation's row type: a table's row type has its name); any API key's statement that reads other sessions' activity (the process list, `performance_schema`, `pg_stat_activity`: docs/security.md)"),
    "table_check_failed": (403, "The tables of this statement cannot be checked", "table-restricted key, statement whose tables can't be determined"),
    "function_not_allowed": (403, "This API key may not call this function", "table-restricted or masked key calling a denied function, a side-channel one (settings, statistics, activity, `@@variables`, PostgreSQL's catalog lookups such as `to_regclass`) or one that isn't the engine's own built-in, or casting to a type that looks names up (`::regclass`), outside `allowed_functions`; a key narrowed by `allowed_write_ops` whose write calls a function that isn't the engine's own, or whose calls can't all be read"),
    "table_check_unsupported": (403, "Table checks are not supported for this database", "table-restricted key on a connection whose dialect can't be checked"),
    "mask_unresolvable": (403, "The result columns cannot be traced for masking", "caller has mask rules and the result can't be traced, or the statement reads the engine's catalogs, statistics, settings, diagnostics or activity, or is an EXPLAIN"),
    "store_not_allowed": (403, "A connection may not point at the server's own store", "a connection pointing at the store file"),
    "token_role": (403, "The bearer token names no role of this server", "a valid token whose QAG_JWT_ROLE_CLAIM (and QAG_JWT_ROLE) names no existing role"),
    "token_scope": (403, "The bearer token lacks a scope this endpoint requires", "a bearer token at `/mcp` without every scope of QAG_MCP_SCOPE (`WWW-Authenticate: Bearer error=\"insufficient_scope\", scope=...`)"),
    "claim_binding_required": (403, "This role runs only saved queries that take a parameter from the sign-in token", "a `require_claim_binding` role runs ad-hoc SQL or a saved query without a `from_claim` parameter"),
    "sign_in_required": (403, "This query takes parameters from a signed-in user's token", "a scoped API key runs a saved query with `from_claim` parameters (the admin key supplies them itself)"),
    "claim_missing": (403, "The sign-in token has no usable claim for a parameter", "a `from_claim` parameter's claim is missing, or an object or list"),
    "row_security_saved_only": (403, "Signed-in users run only saved queries on a connection with row security", "a bearer caller's `/execute_sql` on a `row_security` connection (its own statement could set the claims or role itself)"),
    "row_security_unmapped": (403, "This role has no database role on this connection", "a bearer caller whose role is missing from the `row_security` connection's `db_roles`"),
    "forbidden": (403, "Only .json files inside the saved_sql folder can be accessed", "`/q/<name>` with an invalid saved-query name"),
    "query_not_found": (404, "Saved query not found", "saved query does not exist"),
    "version_not_found": (404, "Version not found", "version does not exist (or is a draft, for non-admins)"),
    "not_published": (404, "This query has no published version", "query has no published version and no `version` asked"),
    "connection_not_found": (404, "Connection not found", "connection does not exist"),
    "table_not_found": (404, "Table not found", "`table_ddl` of a table the connection does not have, or one a table-restricted key may not read"),
    "database_file_not_found": (404, "SQLite database file not found", "SQLite file missing"),
    "key_not_found": (404, "API key not found", "API key does not exist"),
    "role_not_found": (404, "Role not found", "role does not exist"),
    "cache_entry_not_found": (404, "Cache entry not found (missing, expired, or already evicted)", "`/api/v1/cache/entries/<key>` for a key with no live entry"),
    "previous_secret_not_found": (404, "This API key has no old secret still working", "no previous secret to end"),
    "not_found": (404, "The requested URL was not found on the server. If you entered the URL manually please check your spelling and try again.", "unknown route"),
    "method_not_allowed": (405, "The method is not allowed for the requested URL.", "wrong method for the route"),
    "query_exists": (409, "A saved query with this name already exists", "name taken"),
    "connection_exists": (409, "A connection with this name already exists", "name taken"),
    "key_exists": (409, "An API key with this name already exists", "name taken"),
    "role_exists": (409, "A role with this name already exists", "name taken"),
    "key_rotation_pending": (409, "The previous secret of this API key is still valid", "rotate while the previous secret is still valid"),
    "conflict": (409, "Conflict", "generic 409"),
    "precondition_failed": (412, "The resource changed since you loaded it - reload it and try again", "`If-Match` mismatch"),
    "payload_too_large": (413, "Request body too large", "body over `QAG_MAX_BODY_BYTES`"),
    "request_line_too_long": (414, "Request line too long", "qag's worker: request line over gunicorn's limit_request_line"),
    "unsupported_media_type": (415, "Unsupported media type", "generic 415"),
    "expectation_failed": (417, "Unsupported Expect", "qag's worker: an Expect other than 100-continue"),
    "rate_limited": (429, "Rate limit exceeded", "server-wide or per-key rate limit"),
    "quota_exceeded": (429, "This caller's quota is used up", "quota used up"),
    "too_many_concurrent": (429, "Too many queries running at once for this API key", "key's `max_concurrent` reached"),
    "header_fields_too_large": (431, "Request header fields too large", "qag's worker: a header over limit_request_field_size, more than limit_request_fields, or a head too large"),
    "query_failed": (500, "An error occurred while executing the SQL query", "the database rejected the query, or another session cancelled it before its time limit (KILL QUERY, pg_cancel_backend)"),
    "driver_missing": (500, "The driver for this database is not installed", "driver package not installed"),
    "internal_error": (500, "An error occurred", "unexpected"),
    "format_unavailable": (500, "This format is not available on this server", "an optional package for the format is missing"),
    "connection_failed": (502, "Could not connect to the database", "database unreachable, down, or refusing the login, or lost mid-call (`Retry-After: 2`); a write's connection lost once its statement was sent: `outcome: \"unknown\"`, no `Retry-After` (it may have been applied: check before retrying)"),
    "upstream_failed": (502, "Upstream failed", "generic 502"),
    "unavailable": (503, "Service unavailable", "the metadata store is down, unreachable or locked past its 5 s wait, or every connection a worker may open to a database (`QAG_POOL_MAX`) stayed busy, or a SQLite database stayed locked by another call past its wait (the call's time limit, at most 10 s), or a database refused a write call because it takes no writes now (a standby, a read-only server or file) (`Retry-After`); a change whose store reply never came (none within `QAG_STORE_TIMEOUT`, or the connection lost once its `COMMIT` was sent) has `\"outcome\": \"unknown\"` and no `Retry-After` (it may have been applied); also `/readyz` when not ready"),
    "jwks_unavailable": (503, "The bearer-token signing keys could not be read - try again shortly", "the issuer's discovery document or JWKS unreachable and no key known yet (`Retry-After: 5`)"),
    "too_many_streams": (503, "Too many open streams", "`GET /events` beyond `QAG_EVENTS_MAX_STREAMS` open streams in the worker, or a `stream=true` export beyond `QAG_MAX_STREAMS` (`Retry-After: 5`)"),
    "query_timeout": (504, "The query exceeded the time limit and was cancelled", "statement time limit exceeded; with `Retry-After: 2` when the reply never came by the limit + 1 s (the path to the database stopped answering), but for a write whose statement was sent: `outcome: \"unknown\"`, no `Retry-After` (it may have been applied: check before retrying)"),
}

# Default code by status when a raiser gives none (contract 0.3).
DEFAULT_CODE_BY_STATUS = {
    400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
    405: "method_not_allowed", 409: "conflict", 412: "precondition_failed", 413: "payload_too_large",
    415: "unsupported_media_type", 429: "rate_limited", 500: "internal_error", 502: "upstream_failed",
    503: "unavailable", 504: "query_timeout",
}


class QagError(Exception):
    """A refusal with a stable code; rendered as the contract's error envelope."""

    def __init__(self, code: str, message: str | None = None, *, status: int | None = None,
                 headers: list[tuple[str, str]] | None = None, **extras):
        default_status, default_message, _ = ERRORS[code]
        self.code = code
        self.status = status or default_status
        self.message = message if message is not None else default_message
        self.extras = extras
        self.headers = headers or []
        super().__init__(self.message)

    def envelope(self, request_id: str) -> dict:
        """The JSON body: error, code, extras, request_id — in that order."""
        body = {"error": self.message, "code": self.code}
        body.update(self.extras)
        body["request_id"] = request_id
        return body

    def problem(self, request_id: str) -> dict:
        """The RFC 9457 body (application/problem+json): type, title, status, detail, then the envelope's members
        but `error` (it is `detail`), in the envelope's order.

        qag has no public address to mint problem-type URIs under, so `type` is about:blank and `title` the
        status phrase (RFC 9457 4.2.1); the stable problem type is `code`, as in the envelope. No `instance`:
        `request_id` identifies the occurrence and is no URI. The envelope's `detail` (the driver's own text)
        would collide with the RFC's member and is `driver_detail` here."""
        # Made from the envelope, so a member the envelope gains is never missing here.
        envelope = self.envelope(request_id)
        body = {"type": "about:blank", "title": _phrase(self.status), "status": self.status,
                "detail": envelope.pop("error")}
        for name, value in envelope.items():
            body[_PROBLEM_RENAMED.get(name, name)] = value
        return body


# Envelope extras whose names RFC 9457 gives another meaning, as problem details carry them.
_PROBLEM_RENAMED = {"detail": "driver_detail"}


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def generate_markdown() -> str:
    """docs/errors.md, generated from ERRORS; a test keeps the file in step."""
    lines = [
        "# Error codes",
        "",
        "Generated from `qag/errors.py` by `python -m qag.errors > docs/errors.md`; do not edit by hand.",
        "",
        "Every error is a JSON object `{\"error\": <message>, \"code\": <code>, ...extras, \"request_id\": <id>}`.",
        "The `code` is the stable contract; messages are human text.",
        "",
        "A request with `Accept: application/problem+json` (named, with q > 0, and liked at least as much as",
        "`application/json`) gets the error as RFC 9457 problem details instead, with that content type:",
        "`{\"type\": \"about:blank\", \"title\": <HTTP status phrase>, \"status\": <status>, \"detail\": <message>,",
        "\"code\": <code>, ...extras, \"request_id\": <id>}`; the extra `detail` (the database driver's text) is",
        "`driver_detail` there. `*/*` and `application/*` keep the object above, byte for byte. These errors carry",
        "`Vary: Accept`; a `401` carries `WWW-Authenticate: ApiKey realm=\"qag\", name=\"X-API-Key\", in=\"header\"`",
        "(`Bearer realm=\"metrics\"` on `/metrics`), a `405` an `Allow` header with the methods the path takes. The",
        "refusals of the worker before the app (either worker class: `malformed_http`, `request_line_too_long`, `expectation_failed`,",
        "`header_fields_too_large`, and `internal_error` when the app fails before its status line) are always the object",
        "above, with the `X-Request-Id` it names and the security headers of every response; the connection is closed",
        "after them.",
        "",
        "| code | status | default message | when |",
        "|---|---|---|---|",
    ]
    for code, (status, message, when) in ERRORS.items():
        lines.append(f"| `{code}` | {status} | {message} | {when} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(generate_markdown(), end="")
