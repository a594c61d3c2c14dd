"""POST /mcp: the Model Context Protocol over Streamable HTTP; saved queries as tools, run through /q's pipeline."""

from __future__ import annotations

import json
import logging

from ..version import __version__
from ..errors import QagError
from ..http.request import refuse_constant, refuse_lone_surrogates
from ..http.response import Response, json_bytes
from ..policy import grants as policy
from .mcp_oauth import ProtectedResource
from .openapi import params_schema

log = logging.getLogger("qag")

# Revisions reached through the initialize handshake, newest first. The SDK's newer per-request revision starts
# with a server/discover probe; answering it "method not found" makes a client fall back to this handshake.
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LATEST = PROTOCOL_VERSIONS[0]
TRANSPORT_MCP = 1          # history's `tr` for a run through MCP (qag/observe/history.py)

# JSON-RPC 2.0's own codes, and qag's in the implementation-defined band (-32000 and -32001 are the SDK's own,
# -32002 is retired by the protocol). Each error also carries qag's error code as data.code.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REFUSED = -32003           # 401/403 before the message was read: no key, a bad key, an address not allowed
LIMITED = -32004           # 429 before the message was read: a rate limit
UNAVAILABLE = -32010       # anything else the gateway refused before the message was read (503, 405, ...)

FIXED_TOOLS = ("list_tables", "execute_sql")
# qag codes that mean "the arguments are wrong": a JSON-RPC invalid-params error, not a tool's failure.
_ARGUMENT_CODES = frozenset({"param_required", "param_invalid", "invalid_body", "invalid_request", "invalid_timeout",
                             "invalid_paging"})

_ROWS_OUTPUT = {"type": "object", "properties": {
    "rows": {"type": "array", "items": {"type": "object"}},
    "truncated": {"type": "boolean"},
    "note": {"type": "string", "description": "Present when the result was cut at the row cap."}},
    "required": ["rows", "truncated"]}
_CONNECTION = {"type": "string", "description": "The name of a connection this key may use."}


class RpcError(Exception):
    """A JSON-RPC error answering one request: numeric code, message, qag's error code in data."""

    def __init__(self, code: int, message: str, qag_code: str, **data):
        super().__init__(message)
        self.code, self.message, self.data = code, message, {"code": qag_code, **data}


class ToolCall:
    """What RunHandlers reads of a request, for one tools/call: the arguments as a POST body's `params`, the
    MCP row cap as page_size, read-only, and the transport history records."""

    __slots__ = ("environ", "method", "args", "request_id", "segments", "page_ceiling", "_body")
    transport = TRANSPORT_MCP
    read_only = True

    def __init__(self, request, name: str, body: dict, page_size: int):
        self.environ = request.environ
        self.method = "POST"
        # json whatever the HTTP request's Accept says: the tool's result is the rows as JSON.
        self.args = {"page_size": str(page_size), "format": "json"}
        self.page_ceiling = page_size   # MCP_MAX_ROWS is a ceiling of its own, not QAG_MAX_PAGE_SIZE's
        self.request_id = request.request_id
        self.segments = [name]
        self._body = body

    def json_object(self, **_ignored) -> dict:
        return self._body

    @staticmethod
    def header(_name: str) -> None:
        return None   # no If-None-Match: a tool always gets the rows


class McpHandlers:
    """JSON-RPC over one POST per message (JSON responses, no SSE, no sessions: any worker answers any call)."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.run = gateway.run
        self.settings = gateway.settings
        # OAuth 2.1 resource server (with QAG_JWT_*): `resource.target` is what the gateway's authentication
        # checks a bearer token at /mcp against; None without bearer tokens.
        self.resource = ProtectedResource(gateway.settings)

    def register(self, router) -> None:
        router.add("POST", "/mcp", self.post, "api.mcp")
        self.resource.register(router)

    def refusal(self, error: QagError, request, challenges) -> Response:
        """A refusal made before post() read the message, as gateway_error() gives it, its Bearer challenges naming
        the protected-resource metadata and the scopes /mcp needs."""
        response = gateway_error(error, request.request_id, challenges)
        response.headers = self.resource.challenges(response.headers, request)
        return response

    # --- the transport ------------------------------------------------------------------------------------
    def post(self, request, caller):
        try:
            raw = request.body()
        except QagError as error:   # too large (413, before reading), or unreadable: the message was never seen
            return _error_response(error.status, None, RpcError(INVALID_REQUEST, error.message, error.code))
        try:
            message = json.loads(raw, parse_constant=refuse_constant)
            refuse_lone_surrogates(message)
        except QagError as error:
            return _error_response(400, None, RpcError(PARSE_ERROR, error.message, "parse_error"))
        except (ValueError, RecursionError):
            return _error_response(400, None, RpcError(PARSE_ERROR, "The request body is not valid JSON",
                                                       "parse_error"))
        if isinstance(message, list):
            return _error_response(400, None, RpcError(INVALID_REQUEST, "JSON-RPC batches are not supported: send "
                                                       "one message per request", "batch_unsupported"))
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return _error_response(400, None, RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message",
                                                       "invalid_request"))
        has_id = "id" in message
        ident = message.get("id")
        if "method" not in message:
            if has_id and ("result" in message or "error" in message):
                return Response(202)   # a client's answer: this server sends no requests, so nothing waits
            return _error_response(400, None, RpcError(INVALID_REQUEST, "Not a JSON-RPC 2.0 message",
                                                       "invalid_request"))
        if has_id and (isinstance(ident, bool) or not isinstance(ident, (str, int))):
            return _error_response(400, None, RpcError(INVALID_REQUEST, "id must be a string or an integer",
                                                       "invalid_request"))
        method = message["method"]
        params = message.get("params")
        if not isinstance(method, str) or (params is not None and not isinstance(params, dict)):
            return _error_response(400, ident, RpcError(INVALID_REQUEST, "method must be text and params an object",
                                                        "invalid_request"))
        if not has_id:
            return Response(202)   # a notification (notifications/initialized, cancelled, ...): nothing to answer
        try:
            self._check_version_header(request, method)
        except RpcError as error:
            return _error_response(400, ident, error)   # the transport says 400 for a revision it doesn't speak
        try:
            result = self._dispatch(request, caller, method, params or {})
        except RpcError as error:
            return _error_response(200, ident, error)
        except Exception as exc:   # a JSON-RPC error, never a 500: the next message must still be answered
            reason = self.gateway.store_unavailable(exc)
            if reason is None:
                log.exception("unexpected error in MCP %s (request %s)", method, request.request_id,
                              extra={"request_id": request.request_id, "key": caller.label})
            return _error_response(200, ident, RpcError(INTERNAL_ERROR, "Internal error" if reason is None else
                                                        "The metadata store is unavailable - try again shortly",
                                                        "internal_error" if reason is None else "unavailable",
                                                        request_id=request.request_id))
        return Response(200, json_bytes({"jsonrpc": "2.0", "id": ident, "result": result}), [],
                        "application/json")

    @staticmethod
    def _check_version_header(request, method: str) -> None:
        """After initialize, a client names the negotiated revision in MCP-Protocol-Version; one we don't speak is
        refused (a missing header reads as the oldest, as the protocol says)."""
        if method in ("initialize", "server/discover"):
            return
        asked = request.header("MCP-Protocol-Version")
        if asked is not None and asked not in PROTOCOL_VERSIONS:
            raise RpcError(INVALID_REQUEST, f"Unsupported MCP-Protocol-Version {asked!r}",
                           "unsupported_protocol_version", supported=list(PROTOCOL_VERSIONS))

    def _dispatch(self, request, caller, method: str, params: dict) -> dict:
        if method == "initialize":
            asked = params.get("protocolVersion")
            return {"protocolVersion": asked if asked in PROTOCOL_VERSIONS else LATEST,
                    "capabilities": {"tools": {"listChanged": False}},
                    "serverInfo": {"name": "qag", "version": __version__},
                    "instructions": "Each tool runs a saved SQL query (or, where allowed, read-only SQL) through "
                                    "the gateway, with this key's grants, masking and limits."}
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": self.tools(caller)}
        if method == "tools/call":
            return self._call(request, caller, params)
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}", "method_not_found")

    # --- tools --------------------------------------------------------------------------------------------
    def tools(self, caller) -> list[dict]:
        """The caller's tools: /catalog's queries (the one reachability rule) whose version has mcp on, then the
        ad-hoc tools for a caller that may use some connection."""
        out = []
        for listed in self.run.listable_queries(caller):
            version = listed["version"]
            if not version.get("mcp", True) or listed["name"] in FIXED_TOOLS:
                continue
            name = listed["name"]
            out.append({"name": name, "description": version.get("description") or f"Runs the saved query '{name}'",
                        "inputSchema": params_schema(listed), "outputSchema": _ROWS_OUTPUT,
                        "annotations": {"readOnlyHint": True}})
        if _adhoc_allowed(caller):
            out.append({"name": "list_tables", "description": "The tables and columns of a connection this key may "
                        "use (only the tables it may read).",
                        "inputSchema": {"type": "object", "properties": {"connection_name": _CONNECTION},
                                        "required": ["connection_name"]},
                        "annotations": {"readOnlyHint": True, "idempotentHint": True}})
            out.append({"name": "execute_sql", "description": "Run one read-only SQL statement on a connection this "
                        f"key may use; at most {self.row_cap(caller)} rows are returned.",
                        "inputSchema": {"type": "object", "properties": {
                            "connection_name": _CONNECTION,
                            "sql": {"type": "string", "description": "One SELECT (or WITH ... SELECT) statement; "
                                    ":name placeholders take their values from params."},
                            "params": {"type": "object", "description": "Values for the :name placeholders."}},
                            "required": ["connection_name", "sql"]},
                        "outputSchema": _ROWS_OUTPUT, "annotations": {"readOnlyHint": True}})
        return out

    def row_cap(self, caller) -> int:
        """MCP_MAX_ROWS narrowed by the key's max_rows (contract 6.7's effective_limits.max_rows.mcp); independent of
        QAG_MAX_PAGE_SIZE, as QueryAPIGate's is."""
        cap = self.settings.mcp_max_rows
        if not caller.admin and caller.grants.max_rows:
            cap = min(cap, int(caller.grants.max_rows))
        return cap

    def _call(self, request, caller, params: dict) -> dict:
        name = params.get("name")
        arguments = params.get("arguments")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call needs the tool's name", "invalid_params")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "arguments must be a JSON object", "invalid_arguments")
        if name in FIXED_TOOLS and _adhoc_allowed(caller):
            if name == "list_tables":
                return self._list_tables(caller, arguments)
            return self._execute_sql(request, caller, arguments)
        if name in FIXED_TOOLS or not self._is_tool(caller, name):
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}", "unknown_tool")
        call = ToolCall(request, name, {"params": arguments}, self.row_cap(caller))
        return self._data_call(request, caller, lambda: self.run.run_named(call, caller, name))

    def _is_tool(self, caller, name: str) -> bool:
        """tools/list's rule for one name: published, mcp on, reachable (an unreachable query is no tool: its
        existence isn't told). A name the store can't hold (a NUL: PostgreSQL's invalid_text) names none."""
        store = self.run.store
        try:
            head, version = store.get_query_for_run(name, None)
        except QagError as error:
            if error.code != "invalid_text":
                raise
            return False
        if head is None or head["published"] is None or version is None or not version.get("mcp", True):
            return False
        return caller.admin or policy.listable(caller.grants, name, head["collection"],
                                               version.get("connection_name"))

    def _list_tables(self, caller, arguments: dict) -> dict:
        connection = _text_argument(arguments, "connection_name")
        _refuse_unknown(arguments, ("connection_name",))
        try:
            schema = self.gateway.manage.connections.schema_for(caller, connection, None)
        except QagError as error:
            return _tool_error(error)
        return {"content": [{"type": "text", "text": json.dumps(schema, ensure_ascii=False, default=str)}],
                "structuredContent": schema}

    def _execute_sql(self, request, caller, arguments: dict) -> dict:
        sql = _text_argument(arguments, "sql")
        connection = _text_argument(arguments, "connection_name")
        values = arguments.get("params")
        if values is not None and not isinstance(values, dict):
            raise RpcError(INVALID_PARAMS, "params must be a JSON object", "invalid_arguments")
        _refuse_unknown(arguments, ("sql", "connection_name", "params"))
        call = ToolCall(request, connection, {"sql": sql, "connection_name": connection, "params": values or {}},
                        self.row_cap(caller))
        return self._data_call(request, caller, lambda: self.run.execute_sql(call, caller))

    def _data_call(self, request, caller, run) -> dict:
        """One run through RunHandlers, counted by the caller's quota as a /q call is (checked first, one call
        plus its rows on success, given back on failure); its refusals are the tool's errors."""
        ticket = None
        quota = None if caller.admin or caller.grants is None else caller.grants.quota
        if quota is not None:
            ticket = self.gateway.quotas.begin(caller.name, quota, reserve=True)
            if ticket is not None:
                request.environ["qag.quota"] = ticket   # the response's X-Quota-* headers: after this call
                if ticket.refused:
                    return _tool_error(ticket.error())
        try:
            response = run()
        except QagError as error:
            if ticket is not None:
                ticket.settle(False)
            if error.code in _ARGUMENT_CODES:
                raise RpcError(INVALID_PARAMS, error.message, error.code,
                               **{k: v for k, v in error.extras.items() if k != "detail"}) from None
            return _tool_error(error)
        except BaseException:
            if ticket is not None:
                ticket.settle(False)
            raise
        headers = dict(response.headers)
        rows = [] if headers.get("X-Row-Count", "0") == "0" else json.loads(response.body)
        if ticket is not None:
            ticket.settle(True, len(rows))
        structured: dict = {"rows": rows, "truncated": headers.get("X-Has-More") == "true"}
        if structured["truncated"]:
            structured["note"] = (f"Only the first {len(rows)} rows are shown: narrow the query (parameters, "
                                  f"filters) or aggregate to see the rest.")
        return {"content": [{"type": "text", "text": json.dumps(structured, ensure_ascii=False)}],
                "structuredContent": structured}


def _adhoc_allowed(caller) -> bool:
    """execute_sql and list_tables are listed for a caller that may use some connection (/execute_sql's grant)."""
    return caller.admin or caller.grants.all_connections or bool(caller.grants.connections)


def _text_argument(arguments: dict, name: str) -> str:
    value = arguments.get(name)
    if not isinstance(value, str) or not value.strip():
        raise RpcError(INVALID_PARAMS, f"{name} must be non-empty text", "invalid_arguments")
    return value


def _refuse_unknown(arguments: dict, known: tuple) -> None:
    unknown = sorted(set(arguments) - set(known))
    if unknown:
        raise RpcError(INVALID_PARAMS, f"Unknown argument(s): {', '.join(unknown)}", "invalid_arguments")


def _tool_error(error: QagError) -> dict:
    """A refused or failed run as the tool's result (isError), so the agent reads why: the message, and in
    structuredContent the same stable code and extras as the HTTP error envelope."""
    structured = {"error": error.message, "code": error.code}
    structured.update((k, v) for k, v in error.extras.items() if k != "detail")
    return {"isError": True, "content": [{"type": "text", "text": error.message}], "structuredContent": structured}


def _error_response(status: int, ident, error: RpcError) -> Response:
    body = {"jsonrpc": "2.0", "id": ident, "error": {"code": error.code, "message": error.message,
                                                    "data": error.data}}
    return Response(status, json_bytes(body), [], "application/json")


def gateway_error(error: QagError, request_id: str, challenges=()) -> Response:
    """A refusal the gateway made before /mcp read the message (auth, rate limit, size, method) as a JSON-RPC error
    at the same HTTP status, so an MCP client reports it instead of a bare status; headers kept."""
    code = {401: REFUSED, 403: REFUSED, 413: INVALID_REQUEST, 429: LIMITED}.get(error.status, UNAVAILABLE)
    data = error.envelope(request_id)
    data.pop("error")
    data.pop("detail", None)
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": error.message, "data": data}}
    headers = list(error.headers)
    if "retry_after" in error.extras:
        headers.append(("Retry-After", str(error.extras["retry_after"])))
    if error.status == 401 and not any(name == "WWW-Authenticate" for name, _ in headers):
        headers += challenges   # where an OAuth client learns how to authenticate
    return Response(error.status, json_bytes(body), headers, "application/json")
