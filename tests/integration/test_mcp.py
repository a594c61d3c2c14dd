"""The MCP server (/mcp, issue 24) end to end: the official MCP SDK's client against a real gunicorn qag."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from tests.server import q

pytestmark = pytest.mark.e2e

CAP = 5   # QAG_MCP_MAX_ROWS of this module's server
MASK = [{"column": "secret.email", "action": "mask"}]


@pytest.fixture(scope="module")
def srv(make_module_server):
    s = make_module_server(env={"QAG_MCP_MAX_ROWS": str(CAP), "QAG_HISTORY_FLUSH_INTERVAL": "0",
                                "QAG_MAX_BODY_BYTES": "4096"})
    s.query("by_id", "SELECT id, name FROM t WHERE id = :id", "lite",
            parameters={"id": {"type": "integer", "min": 1, "description": "the row"}})
    s.query("all_rows", "SELECT id FROM t ORDER BY id", "lite")
    s.query("emails", "SELECT id, email FROM secret ORDER BY id", "lite")
    s.query("hidden", "SELECT 1 AS v", "lite", mcp=False)
    s.query("draft", "SELECT 1 AS v", "lite", publish=False)
    return s


def run(coro):
    return asyncio.run(coro)


async def _with_client(srv, key, work):
    http = create_mcp_http_client(headers={"X-API-Key": key} if key else {})
    async with Client(streamable_http_client(f"http://{srv.host}:{srv.port}/mcp", http_client=http)) as client:
        return await work(client)


def tool_names(srv, key) -> list[str]:
    async def work(client):
        return sorted(t.name for t in (await client.list_tools()).tools)
    return run(_with_client(srv, key, work))


def call(srv, key, name, arguments):
    """The tool's result, or the MCPError the client raised (caught inside: the client's task group would wrap it)."""
    async def work(client):
        try:
            return await client.call_tool(name, arguments)
        except MCPError as error:
            return error
    return run(_with_client(srv, key, work))


def rpc_error(srv, key, name, arguments) -> MCPError:
    error = call(srv, key, name, arguments)
    assert isinstance(error, MCPError), error
    return error


def rpc(srv, message, key="admin", headers=None, raw=None):
    """One JSON-RPC message posted by hand (what a broken client might send)."""
    body = raw if raw is not None else json.dumps(message).encode()
    return srv.request("POST", "/mcp", raw=body, key=key,
                       headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                                **(headers or {})})


def history(srv, name):
    r = srv.get(f"/api/v1/queries/{name}/history")
    assert r.status == 200, r
    return r.json["items"] if isinstance(r.json, dict) else r.json


# --- tools per key ----------------------------------------------------------------------------------------------

def test_two_keys_see_their_own_tools(srv, uniq):
    one = srv.key(uniq("one"), connections=[], queries=["by_id"])
    two = srv.key(uniq("two"), connections=[], queries=["all_rows", "hidden", "draft"])
    assert tool_names(srv, one) == ["by_id"]
    # mcp:false and draft-only queries are no tools, and no ad-hoc tools without a connection grant.
    assert tool_names(srv, two) == ["all_rows"]
    adhoc = srv.key(uniq("adhoc"), connections=["lite"])
    names = tool_names(srv, adhoc)
    assert {"execute_sql", "list_tables", "by_id", "all_rows", "emails"} <= set(names)
    assert "hidden" not in names and "draft" not in names


def test_tool_schema_is_the_openapi_params_schema(srv):
    async def work(client):
        return {t.name: t for t in (await client.list_tools()).tools}
    tools = run(_with_client(srv, srv.admin_key, work))
    doc = srv.get("/openapi.json").json
    body = doc["paths"]["/q/by_id"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert tools["by_id"].input_schema == body["properties"]["params"]
    assert tools["by_id"].input_schema["properties"]["id"]["type"] == "integer"
    assert tools["by_id"].description == "test query by_id"
    assert tools["by_id"].annotations.read_only_hint is True


# --- calls --------------------------------------------------------------------------------------------------------

def test_call_a_tool_and_its_history_entry(srv, uniq):
    name = uniq("caller")
    key = srv.key(name, connections=[], queries=["by_id"])
    result = call(srv, key, "by_id", {"id": 3})
    assert not result.is_error
    assert result.structured_content == {"rows": [{"id": 3, "name": "row 3"}], "truncated": False}
    assert json.loads(result.content[0].text) == result.structured_content
    entry = next(e for e in history(srv, "by_id") if e["key_name"] == name)
    assert entry["transport"] == "mcp" and entry["status"] == "success" and entry["rows"] == 1
    # The same query over REST is recorded as rest.
    assert srv.get(q("by_id") + "?id=4", key=key).status == 200
    entries = [e for e in history(srv, "by_id") if e["key_name"] == name]
    assert sorted(e["transport"] for e in entries) == ["mcp", "rest"]


def test_results_are_capped_by_mcp_max_rows_and_key_max_rows(srv, uniq):
    result = call(srv, srv.admin_key, "all_rows", {})
    assert result.structured_content["rows"] == [{"id": i} for i in range(1, CAP + 1)]
    assert result.structured_content["truncated"] is True and "first 5 rows" in result.structured_content["note"]
    key = srv.key(uniq("few"), connections=[], queries=["all_rows"], max_rows=2)
    result = call(srv, key, "all_rows", {})
    assert result.structured_content["rows"] == [{"id": 1}, {"id": 2}]
    assert result.structured_content["truncated"] is True
    listed = srv.get("/api/v1/api-keys/" + key_name_of(srv, key)).json["effective_limits"]["max_rows"]["mcp"]
    assert listed == 2


def test_mcp_max_rows_is_independent_of_the_rest_page_ceiling(make_server):
    s = make_server(env={"QAG_MCP_MAX_ROWS": "12", "QAG_MAX_PAGE_SIZE": "4"})
    s.query("ids", "SELECT id FROM t ORDER BY id", "lite")
    assert s.get(q("ids") + "?page_size=12").json["code"] == "invalid_paging"
    result = call(s, s.admin_key, "ids", {})
    assert result.structured_content["rows"] == [{"id": i} for i in range(1, 13)]
    sql = call(s, s.admin_key, "execute_sql", {"connection_name": "lite", "sql": "SELECT id FROM t ORDER BY id"})
    assert len(sql.structured_content["rows"]) == 12 and sql.structured_content["truncated"] is True


def key_name_of(srv, secret):
    return srv.get("/catalog", key=secret).json["caller"]["name"]


def test_masked_result_matches_rest(srv, uniq):
    key = srv.key(uniq("masked"), connections=[], queries=["emails"], mask=MASK)
    result = call(srv, key, "emails", {})
    rest = srv.get(q("emails"), key=key)
    assert rest.status == 200
    assert result.structured_content["rows"] == rest.json
    assert result.structured_content["rows"][0]["email"] != "jane@example.com"
    assert call(srv, srv.admin_key, "emails", {}).structured_content["rows"][0]["email"] == "jane@example.com"
    entries = {e["transport"]: e for e in history(srv, "emails") if e["key_name"] == key_name_of(srv, key)}
    assert sorted(entries) == ["mcp", "rest"] and entries["mcp"]["masked"] == entries["rest"]["masked"]
    assert entries["mcp"]["masked"][0]["column"] == "email"


def test_refused_table_is_the_tools_error(srv, uniq):
    key = srv.key(uniq("narrow"), connections=["lite"], allowed_tables=["t"])
    ok = call(srv, key, "execute_sql", {"connection_name": "lite", "sql": "SELECT count(*) AS n FROM t"})
    assert ok.structured_content == {"rows": [{"n": 25}], "truncated": False}
    refused = call(srv, key, "execute_sql", {"connection_name": "lite", "sql": "SELECT email FROM secret"})
    rest = srv.post("/execute_sql", {"connection_name": "lite", "sql": "SELECT email FROM secret"}, key=key)
    assert rest.status == 403
    assert refused.is_error and refused.structured_content["code"] == rest.json["code"]
    assert "jane" not in refused.content[0].text
    # The saved query over the same table is refused the same way.
    saved = call(srv, key, "emails", {})
    assert saved.is_error and saved.structured_content["code"] == rest.json["code"]
    tables = call(srv, key, "list_tables", {"connection_name": "lite"})
    assert [t["name"] for t in tables.structured_content["tables"]] == ["t"]


def test_execute_sql_is_read_only_and_in_history(make_server, uniq):
    s = make_server(env={"QAG_ALLOW_WRITES": "1", "QAG_HISTORY_FLUSH_INTERVAL": "0"})
    key = s.key(uniq("writer"), connections=["lite"], allow_writes=True)
    assert s.post("/execute_sql", {"connection_name": "lite", "sql": "DELETE FROM notes"}, key=key).status == 200
    refused = call(s, key, "execute_sql", {"connection_name": "lite", "sql": "DELETE FROM notes"})
    assert refused.is_error and refused.structured_content["code"] == "read_only"
    r = s.get("/api/v1/history")
    assert r.status == 200
    mcp_runs = [e for e in r.json["items"] if e["transport"] == "mcp"]
    assert len(mcp_runs) == 1 and mcp_runs[0]["status"] == "error" and mcp_runs[0]["kind"] == "adhoc"


def test_rate_limited_call(srv, uniq):
    key = srv.key(uniq("slow"), connections=[], queries=["by_id"], rate_limit="6/minute")

    async def work(client):
        for done in range(10):
            try:
                await client.call_tool("by_id", {"id": 1})
            except MCPError as refused:
                return done, refused
        raise AssertionError("never rate-limited")
    done, error = run(_with_client(srv, key, work))
    # Every request to /mcp spends a token (as every /q request does); connecting took some of the six.
    assert 1 <= done < 6
    assert error.code == -32004 and error.error.data["code"] == "rate_limited"
    raw = rpc(srv, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, key=key)
    assert raw.status == 429 and int(raw.headers["retry-after"]) >= 1
    assert raw.json["error"]["code"] == -32004 and raw.json["id"] is None
    # Another key is not limited.
    assert not call(srv, srv.admin_key, "by_id", {"id": 1}).is_error


def test_quota_counts_tool_calls(srv, uniq):
    key = srv.key(uniq("quota"), connections=[], queries=["by_id"], quota={"calls": 2, "per": "day"})
    assert not call(srv, key, "by_id", {"id": 1}).is_error
    # A refused call (bad argument) gives its call back; tools/list never counts.
    assert rpc_error(srv, key, "by_id", {"id": "x"}).error.data["code"] == "param_invalid"
    assert not call(srv, key, "by_id", {"id": 2}).is_error
    third = call(srv, key, "by_id", {"id": 3})
    assert third.is_error and third.structured_content["code"] == "quota_exceeded"
    usage = srv.get("/api/v1/api-keys/" + key_name_of(srv, key)).json["usage_this_period"]
    assert usage["calls"] == 2 and usage["rows"] == 2


# --- bad input ----------------------------------------------------------------------------------------------------

def test_a_tool_name_the_store_cant_hold_is_an_unknown_tool(make_server, pg_store_url):
    """A NUL in a tool's name: the PostgreSQL store refuses the text (invalid_text), which tools/call let out as an
    internal error with a traceback; it is no tool of anyone's, as every other unknown name."""
    s = make_server(env={"QAG_DATABASE_URL": pg_store_url})
    for name in ("x\u0000", "by_id\u0000"):
        r = rpc(s, {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": name, "arguments": {}}})
        assert r.status == 200 and r.json["error"]["code"] == -32602, r
        assert r.json["error"]["data"]["code"] == "unknown_tool", r
    r = rpc(s, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
    assert r.status == 200 and "tools" in r.json["result"], r           # the next good request succeeds


def test_unknown_tool_and_wrong_arguments_are_invalid_params(srv, uniq):
    key = srv.key(uniq("bad"), connections=[], queries=["by_id", "hidden"])
    for name, arguments, code in (("nope", {}, "unknown_tool"), ("hidden", {}, "unknown_tool"),
                                  ("all_rows", {}, "unknown_tool"),
                                  ("execute_sql", {"sql": "SELECT 1"}, "unknown_tool"),
                                  ("by_id", {"id": "x"}, "param_invalid"), ("by_id", {"id": 0}, "param_invalid"),
                                  ("by_id", {}, "param_required")):
        error = rpc_error(srv, key, name, arguments)
        assert error.code == -32602 and error.error.data["code"] == code, (name, arguments)
    r = rpc(srv, {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "by_id", "arguments": [1]}},
            key=key)
    assert r.status == 200 and r.json["id"] == 7
    assert r.json["error"]["code"] == -32602 and r.json["error"]["data"]["code"] == "invalid_arguments"
    r = rpc(srv, {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"arguments": {}}}, key=key)
    assert r.json["error"]["code"] == -32602
    for name, arguments in (("execute_sql", {"connection_name": "lite", "sql": "SELECT 1", "page": 2}),
                            ("execute_sql", {"connection_name": "lite", "sql": 1}),
                            ("execute_sql", {"connection_name": "lite", "sql": "SELECT :a", "params": [1]}),
                            ("list_tables", {"connection_name": "lite", "database": "other"}),
                            ("list_tables", {})):
        error = rpc_error(srv, srv.admin_key, name, arguments)
        assert error.code == -32602 and error.error.data["code"] == "invalid_arguments", (name, arguments)


@pytest.mark.parametrize("raw, status, code, data_code", [
    (b"{not json", 400, -32700, "parse_error"),
    (b'"\\ud800"', 400, -32700, "parse_error"),
    (b"[" * 5000 + b"]" * 5000, 413, -32600, "payload_too_large"),
    (b"[1]" + b" " * 10, 400, -32600, "batch_unsupported"),
    (b"[]", 400, -32600, "batch_unsupported"),
    (b"42", 400, -32600, "invalid_request"),
    (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', 400, -32600, "invalid_request"),
    (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}', 400, -32600, "invalid_request"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": 5}', 400, -32600, "invalid_request"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": [1]}', 400, -32600, "invalid_request"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list"}', 200, -32601, "method_not_found"),
    (b'{"jsonrpc": "2.0", "id": 1, "method": "server/discover"}', 200, -32601, "method_not_found"),
    (b"x" * 5000, 413, -32600, "payload_too_large"),
])
def test_malformed_messages_are_json_rpc_errors(srv, raw, status, code, data_code):
    r = rpc(srv, None, raw=raw)
    assert r.status == status, r
    assert r.headers["content-type"] == "application/json"
    assert r.json["jsonrpc"] == "2.0" and r.json["error"]["code"] == code
    assert r.json["error"]["data"]["code"] == data_code
    # The next good message is answered.
    ok = rpc(srv, {"jsonrpc": "2.0", "id": "next", "method": "ping"})
    assert ok.status == 200 and ok.json == {"jsonrpc": "2.0", "id": "next", "result": {}}


def test_transport_edges(srv):
    note = rpc(srv, {"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert note.status == 202 and note.body == b""
    answer = rpc(srv, {"jsonrpc": "2.0", "id": 3, "result": {}})
    assert answer.status == 202
    r = rpc(srv, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers={"MCP-Protocol-Version": "1999-01-01"})
    assert r.status == 400 and r.json["error"]["data"]["code"] == "unsupported_protocol_version"
    for asked, got in (("2025-06-18", "2025-06-18"), ("2025-03-26", "2025-03-26"), ("1999-01-01", "2025-11-25")):
        r = rpc(srv, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": asked, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        assert r.status == 200 and r.json["result"]["protocolVersion"] == got
        assert r.json["result"]["capabilities"] == {"tools": {"listChanged": False}}
    get = srv.get("/mcp")
    assert get.status == 405 and "POST" in get.headers["allow"] and get.json["error"]["code"] == -32010
    nokey = rpc(srv, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key=None)
    assert nokey.status == 401 and nokey.json["error"]["code"] == -32003
    assert nokey.json["error"]["data"]["code"] == "unauthorized" and "www-authenticate" in nokey.headers
    bad = rpc(srv, {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, key="sk_wrong")
    assert bad.status == 401 and bad.json["error"]["code"] == -32003


def test_a_tool_answers_json_rows_whatever_the_http_accept(srv, uniq):
    """A tools/call followed the HTTP request's Accept: `text/csv` gave an internal error after the query had run,
    counted against the quota and recorded as a success."""
    key = srv.key(uniq("acc"), connections=[], queries=["by_id"], quota={"calls": 3, "per": "day"})
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "by_id", "arguments": {"id": 2}}}
    for accept in ("text/csv", "application/x-ndjson", "application/json;q=0.5, text/csv"):
        r = rpc(srv, message, key=key, headers={"Accept": accept})
        assert r.status == 200 and r.json["result"]["structuredContent"]["rows"] == [{"id": 2, "name": "row 2"}], r
    third = rpc(srv, message, key=key)
    assert third.json["result"]["isError"] and third.json["result"]["structuredContent"]["code"] == "quota_exceeded"


def test_a_tool_named_like_a_url_alias_runs_itself(srv, uniq):
    """/q/<name>.json runs <name> (B3.18), but a tool's name is its query's own: a query named `x.json` ran `x`
    over MCP, another query's SQL under its own description, `mcp: false` or not."""
    base = uniq("alias")
    srv.query(base, "SELECT 'base' AS v", "lite", mcp=False)
    srv.query(base + ".json", "SELECT 'dotted' AS v", "lite")
    assert base + ".json" in tool_names(srv, srv.admin_key) and base not in tool_names(srv, srv.admin_key)
    assert call(srv, srv.admin_key, base + ".json", {}).structured_content["rows"] == [{"v": "dotted"}]
    assert rpc_error(srv, srv.admin_key, base, {}).error.data["code"] == "unknown_tool"


@pytest.mark.parametrize("path", ["/mcp", "//mcp"])
def test_a_refusal_at_any_spelling_of_mcp_is_json_rpc(srv, path):
    r = srv.request("POST", path, raw=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}', key=None,
                    headers={"Content-Type": "application/json"})
    assert r.status == 401 and r.json["jsonrpc"] == "2.0" and r.json["error"]["code"] == -32003, r


@pytest.mark.parametrize("path", ["/mcp/", "/mcp%2F"])
def test_a_trailing_slash_is_not_mcp(srv, path):
    # No route takes a trailing slash (QueryAPIGate's rule, kept for every route): the plain 404 or 401.
    body = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}'
    r = srv.request("POST", path, raw=body, headers={"Content-Type": "application/json"})
    assert r.status == 404 and r.json["code"] == "not_found", r
    assert srv.request("POST", path, raw=body, key=None, headers={"Content-Type": "application/json"}).status == 401


def test_no_internal_errors_logged(srv):
    assert not [line for line in srv.log if "unexpected error" in line or "Traceback" in line]


# --- qag mcp (stdio) ----------------------------------------------------------------------------------------------

def test_stdio_serves_the_keys_tools_through_the_same_pipeline(srv, uniq):
    import os
    import sys

    from mcp import StdioServerParameters
    name = uniq("stdio")
    key = srv.key(name, connections=[], queries=["by_id"], mask=MASK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update({"QAG_HOME": srv.home, "QAG_API_KEY": srv.admin_key, "QAG_MCP_API_KEY": key,
                "QAG_MCP_MAX_ROWS": str(CAP), "QAG_HISTORY_FLUSH_INTERVAL": "0"})
    if srv.database_url:
        env["QAG_DATABASE_URL"] = srv.database_url
    params = StdioServerParameters(command=sys.executable, args=["-m", "qag", "mcp"], env=env, cwd=srv.home)

    async def work(client):
        names = sorted(t.name for t in (await client.list_tools()).tools)
        result = await client.call_tool("by_id", {"id": 2})
        try:
            await client.call_tool("by_id", {"id": "two"})
            bad = None
        except MCPError as error:
            bad = error
        return names, result, bad
    async def main():
        async with Client(params) as client:
            return await work(client)
    names, result, bad = run(main())
    assert names == ["by_id"]
    assert result.structured_content == {"rows": [{"id": 2, "name": "row 2"}], "truncated": False}
    assert bad is not None and bad.code == -32602 and bad.error.data["code"] == "param_invalid"
    entry = next(e for e in history(srv, "by_id") if e["key_name"] == name)
    assert entry["transport"] == "mcp" and entry["status"] == "success"


def test_metrics_and_live_events_see_mcp_runs(srv, uniq):
    import time

    from tests.integration.test_contract_events import Subscriber
    name = uniq("watched")
    key = srv.key(name, connections=[], queries=["by_id"])
    stream = Subscriber(srv, params="?query=by_id")
    try:
        assert stream.status == 200, stream.body
        time.sleep(0.3)   # the stream is registered before the run
        assert not call(srv, key, "by_id", {"id": 5}).is_error
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(e["entry"]["key_name"] == name for e in stream.events):
            time.sleep(0.05)
        event = next(e for e in stream.events if e["entry"]["key_name"] == name)
        assert event["source"] == "mcp" and event["entry"]["transport"] == "mcp"
        assert event["entry"]["status"] == "success" and event["entry"]["rows"] == 1
    finally:
        stream.close()

    def counted() -> bool:   # each worker publishes its counts a little after its requests
        lines = srv.get("/metrics").body.decode().splitlines()
        return (any('endpoint="api.mcp"' in line and f'key="{name}"' in line and 'status="200"' in line
                    for line in lines if line.startswith("queryapigate_requests_total"))
                and any(f'key="{name}"' in line and 'status="success"' in line
                        for line in lines if line.startswith("queryapigate_queries_total")))
    deadline = time.monotonic() + 10
    while not counted():
        assert time.monotonic() < deadline, "the MCP request and run never reached /metrics"
        time.sleep(0.2)


# --- MariaDB and PostgreSQL ---------------------------------------------------------------------------------------

def _seed_server_db(dialect, fields, table):
    """A table of three people in the session's MariaDB or PostgreSQL database (shared: the name is this test's)."""
    rows = [(1, "ann@example.com", "Ann"), (2, "bob@example.com", "Bob"), (3, "cy@example.com", "Cy")]
    if dialect == "mysql":
        from tests.services import mysql_admin
        conn = mysql_admin()
        cur = conn.cursor()
        cur.execute(f"USE `{fields['database']}`")
        cur.execute(f"CREATE TABLE {table} (id INT PRIMARY KEY, email VARCHAR(100), name VARCHAR(40))")
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)", rows)
        conn.commit()
    else:
        import psycopg2
        conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                                password=fields["password"], dbname=fields["database"], connect_timeout=5)
        conn.autocommit = True
        cur = conn.cursor()
        cur.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, email text, name text)")
        cur.executemany(f"INSERT INTO {table} VALUES (%s, %s, %s)", rows)
    conn.close()


@pytest.mark.parametrize("dialect", ["mysql", "postgres"])
def test_tools_on_mariadb_and_postgresql(srv, dialect, request, uniq):
    fields = request.getfixturevalue("mysql_db" if dialect == "mysql" else "pg_db")
    table = uniq("mcp_people_").replace("-", "_")
    _seed_server_db(dialect, fields, table)
    connection = uniq(f"mcp_{dialect}")
    assert srv.post("/api/v1/connections", {"name": connection, "db": dialect, **fields}).status == 201
    query = uniq("people")
    srv.query(query, f"SELECT id, email, name FROM {table} WHERE id >= :low ORDER BY id", connection,
              parameters={"low": {"type": "integer"}})
    masked = srv.key(uniq("m"), connections=[], queries=[query], mask=[{"column": f"{table}.email", "action": "mask"}])
    result = call(srv, masked, query, {"low": 2})
    rest = srv.get(q(query) + "?low=2", key=masked)
    assert rest.status == 200 and result.structured_content == {"rows": rest.json, "truncated": False}
    assert [r["name"] for r in rest.json] == ["Bob", "Cy"] and rest.json[0]["email"] != "bob@example.com"
    narrow = srv.key(uniq("n"), connections=[connection], allowed_tables=["nothing_here"])
    refused = call(srv, narrow, "execute_sql", {"connection_name": connection, "sql": f"SELECT * FROM {table}"})
    assert refused.is_error and refused.structured_content["code"] == "table_not_allowed"
    wide = srv.key(uniq("w"), connections=[connection])
    ok = call(srv, wide, "execute_sql", {"connection_name": connection,
                                         "sql": f"SELECT name FROM {table} WHERE id = :id", "params": {"id": 3}})
    assert ok.structured_content == {"rows": [{"name": "Cy"}], "truncated": False}
