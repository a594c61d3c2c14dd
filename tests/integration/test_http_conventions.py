"""HTTP conventions on a real server: RFC 9457 problem details on request, Allow on 405, WWW-Authenticate on 401,
and Accept choosing a run's format when no `format` is given (with Vary, and the response cache kept apart)."""

from __future__ import annotations

import csv
import io

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e

PROBLEM = "application/problem+json"
CHALLENGE = 'ApiKey realm="qag", name="X-API-Key", in="header"'
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
CSV_BODY = b"id,name\r\n1,row 1\r\n2,row 2\r\n"


def all_of(reply, name: str) -> list[str]:
    """Every value of a header (the Reply's dict keeps only the last of repeated ones)."""
    return [v for k, v in reply.header_list if k.lower() == name.lower()]


@pytest.fixture(scope="module")
def two(server):
    name = "conv_two"
    if server.get(f"/api/v1/queries/{name}").status == 404:
        server.query(name, "SELECT id, name FROM t WHERE id <= 2 ORDER BY id", "lite")
    return name


# --- problem details ----------------------------------------------------------------------------------------------

def test_problem_details_when_asked_by_name(server):
    r = server.get(q("conv_missing"), headers={"Accept": PROBLEM})
    assert r.status == 404 and r.headers["content-type"] == PROBLEM
    assert list(r.json.items()) == [
        ("type", "about:blank"), ("title", "Not Found"), ("status", 404),
        ("detail", "Saved query 'conv_missing' not found"), ("code", "query_not_found"),
        ("request_id", r.headers["x-request-id"])]
    assert r.body.endswith(b"}\n") and b", " not in r.body          # compact, like the envelope
    assert all_of(r, "Vary") == ["Accept"]
    # the headers every response carries are still there
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["cache-control"] == "no-store"


@pytest.mark.parametrize("accept", [None, "*/*", "application/json", "application/*", BROWSER,
                                    "application/problem+json;q=0", "application/json, application/problem+json;q=0.5",
                                    "text/csv", "application/problem+json;q=7"])
def test_envelope_byte_for_byte_otherwise(server, accept):
    r = server.get(q("conv_missing"), headers={"Accept": accept} if accept else None)
    rid = r.headers["x-request-id"]
    assert r.status == 404 and r.headers["content-type"] == "application/json"
    assert r.body == (b'{"error":"Saved query \'conv_missing\' not found","code":"query_not_found","request_id":"'
                      + rid.encode() + b'"}\n')
    assert all_of(r, "Vary") == ["Accept"]


def test_problem_keeps_the_errors_map(server):
    name = "conv_typed"
    if server.get(f"/api/v1/queries/{name}").status == 404:
        server.query(name, "SELECT id FROM t WHERE id = :id", "lite", parameters={"id": {"type": "int"}})
    plain = server.get(q(name), params={"id": "abc"})
    r = server.get(q(name), params={"id": "abc"}, headers={"Accept": f"{PROBLEM}, application/json"})
    assert r.status == 400 == plain.status and r.headers["content-type"] == PROBLEM
    assert r.json == {"type": "about:blank", "title": "Bad Request", "status": 400,
                      "detail": plain.json["error"], "code": "param_invalid",
                      "errors": {"id": "must be an integer"}, "request_id": r.headers["x-request-id"]}


def test_problem_renames_the_driver_detail(server):
    body = {"sql": "SELECT nope FROM conv_no_such_table", "connection_name": "lite"}
    plain = server.post("/execute_sql", body)
    r = server.post("/execute_sql", body, headers={"Accept": PROBLEM})
    assert r.status == plain.status >= 400 and "detail" in plain.json
    assert r.json["detail"] == plain.json["error"] and r.json["driver_detail"] == plain.json["detail"]
    assert r.json["code"] == plain.json["code"] and "error" not in r.json


def test_problem_on_router_errors_and_bad_input(server):
    r = server.get("/conv/no/such/route", headers={"Accept": PROBLEM})
    assert r.status == 404 and r.json["code"] == "not_found" and r.json["title"] == "Not Found"
    r = server.request("DELETE", q("conv_missing"), headers={"Accept": PROBLEM})
    assert r.status == 405 and r.json["code"] == "method_not_allowed" and r.json["title"] == "Method Not Allowed"
    assert r.headers["allow"] == "GET, HEAD, POST"
    r = server.get(q("conv_missing") + "?x=%zz", headers={"Accept": PROBLEM})
    assert r.status == 400 and r.headers["content-type"] == PROBLEM and r.json["code"] == "invalid_request"
    r = server.post("/execute_sql", raw=b"{not json", headers={"Accept": PROBLEM, "Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == "invalid_body" and r.json["status"] == 400


def test_success_is_not_changed_by_a_problem_accept(server, two):
    r = server.get(q(two), headers={"Accept": PROBLEM})
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json == [{"id": 1, "name": "row 1"}, {"id": 2, "name": "row 2"}]


# --- 405 Allow ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("method, path, allow", [
    ("DELETE", "/q/conv_anything", "GET, HEAD, POST"),
    ("PUT", "/q/conv_anything", "GET, HEAD, POST"),
    ("PATCH", "/execute_sql", "POST"),
    ("GET", "/execute_sql", "POST"),
    ("POST", "/health", "GET, HEAD"),
    ("DELETE", "/api/v1/connections", "GET, HEAD, POST"),
    # /connections/test is a route of its own and also a connection named "test"
    ("PUT", "/api/v1/connections/test", "GET, HEAD, POST, PATCH, DELETE"),
    ("GET", "/api/v1/api-keys/k/previous", "DELETE"),
])
def test_405_carries_allow(server, method, path, allow):
    r = server.request(method, path)
    assert r.status == 405 and r.json["code"] == "method_not_allowed", r
    assert all_of(r, "Allow") == [allow]
    # every method named answers something else than 405 (HEAD included: it is GET without a body)
    for named in allow.split(", "):
        assert server.request(named, path).status != 405, (named, path)


def test_plain_options_is_405_without_options_in_allow(server):
    r = server.request("OPTIONS", "/api/v1/connections")
    assert r.status == 405 and all_of(r, "Allow") == ["GET, HEAD, POST"]


def test_no_allow_for_an_anonymous_caller_or_an_unknown_path(server):
    r = server.request("DELETE", "/q/conv_anything", key=None)
    assert r.status == 401 and all_of(r, "Allow") == []     # an anonymous caller learns nothing about routes
    r = server.request("DELETE", "/conv/unknown")
    assert r.status == 404 and all_of(r, "Allow") == []


@pytest.mark.parametrize("method,path", [
    ("GET", "/api/v1/connections/"), ("GET", "/api/v1/api-keys/"), ("GET", "/api/v1/queries/"),
    ("GET", "/api/v1/roles/"), ("GET", "/api/v1/me/"), ("GET", "/api/v1/connections/lite/"),
    ("GET", "/api/v1/connections/lite/schema/"), ("GET", "/api/v1/usage/quotas/"), ("GET", "/api/v1/connections%2F"),
    ("POST", "/api/v1/queries/"), ("POST", "/execute_sql/"), ("GET", "/catalog/"), ("GET", "/health/"),
    ("GET", "/openapi.json/"), ("GET", "/q/conv_two/"), ("GET", "/api/v1/connections//")])
def test_a_trailing_slash_is_no_route(server, two, method, path):
    # QueryAPIGate's routes take no trailing slash: 404 not_found for a caller, 401 for anyone else, as for any path
    # that names no route (qag's router used to read /api/v1/connections/ as /api/v1/connections).
    r = server.request(method, path, body={} if method == "POST" else None)
    assert r.status == 404 and r.json["code"] == "not_found", r
    assert server.request(method, path, key=None).status == 401
    assert server.get("//api/v1/connections").status == 200   # leading slashes are still one


# --- 401 WWW-Authenticate -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, path", [(None, "/api/v1/connections"), ("wrong-key", "/api/v1/connections"),
                                       (None, "/q/conv_anything"), (None, "/conv/unknown"),
                                       ("wrong-key", "/execute_sql")])
def test_401_carries_www_authenticate(server, key, path):
    r = server.get(path, key=key)
    assert r.status == 401 and r.json["code"] == "unauthorized"
    assert all_of(r, "WWW-Authenticate") == [CHALLENGE]
    p = server.get(path, key=key, headers={"Accept": PROBLEM})
    assert p.status == 401 and p.json["title"] == "Unauthorized" and all_of(p, "WWW-Authenticate") == [CHALLENGE]


def test_no_challenge_on_other_refusals(server, uniq):
    scoped = server.key(uniq("conv_k"))
    r = server.get("/api/v1/connections", key=scoped)
    assert r.status == 403 and r.json["code"] == "admin_only" and all_of(r, "WWW-Authenticate") == []
    assert all_of(server.get("/health", key=None), "WWW-Authenticate") == []
    assert all_of(server.get("/api/v1/connections"), "WWW-Authenticate") == []


# --- Accept chooses the format ------------------------------------------------------------------------------------

def test_accept_text_csv_selects_csv(server, two):
    r = server.get(q(two), headers={"Accept": "text/csv"})
    assert r.status == 200 and r.headers["content-type"] == "text/csv; charset=utf-8"
    assert r.body == CSV_BODY and all_of(r, "Vary") == ["Accept"]
    assert (r.headers["x-page"], r.headers["x-row-count"]) == ("1", "2")
    explicit = server.get(q(two), params={"format": "csv"})
    assert explicit.body == r.body and all_of(explicit, "Vary") == []   # named: nothing to vary on


@pytest.mark.parametrize("accept, content_type", [
    ("text/tab-separated-values", "text/tab-separated-values; charset=utf-8"),
    ("application/x-ndjson", "application/x-ndjson"),
    ("application/xml", "application/xml; charset=utf-8"),
    ("text/csv;q=0.5, application/json;q=0.4", "text/csv; charset=utf-8"),
    ("TEXT/CSV; charset=utf-8", "text/csv; charset=utf-8"),
])
def test_other_formats_by_media_type(server, two, accept, content_type):
    r = server.get(q(two), headers={"Accept": accept})
    assert r.status == 200 and r.headers["content-type"] == content_type and all_of(r, "Vary") == ["Accept"]


@pytest.mark.parametrize("accept", [None, "*/*", "application/json", BROWSER, "text/*", "text/csv;q=0",
                                    "application/json, text/csv", "text/csv;q=0.5, */*", "text/plain",
                                    "text/csv;q=abc"])
def test_json_kept(server, two, accept):
    r = server.get(q(two), headers={"Accept": accept} if accept else None)
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json == [{"id": 1, "name": "row 1"}, {"id": 2, "name": "row 2"}]
    assert all_of(r, "Vary") == ["Accept"]   # the answer would differ with another Accept


def test_explicit_format_always_wins(server, two):
    r = server.get(q(two), params={"format": "json"}, headers={"Accept": "text/csv"})
    assert r.headers["content-type"] == "application/json" and all_of(r, "Vary") == []
    r = server.post(q(two), {"format": "json"}, headers={"Accept": "text/csv"})
    assert r.headers["content-type"] == "application/json" and all_of(r, "Vary") == []
    r = server.get(q(two), params={"format": "pdf"}, headers={"Accept": "text/csv"})
    assert r.status == 400 and r.json["code"] == "invalid_format"


def test_execute_sql_and_streams(server):
    body = {"sql": "SELECT id, name FROM t WHERE id <= 2 ORDER BY id", "connection_name": "lite"}
    r = server.post("/execute_sql", body, headers={"Accept": "text/csv"})
    assert r.status == 200 and r.body == CSV_BODY and all_of(r, "Vary") == ["Accept"]
    r = server.post("/execute_sql", {**body, "format": "json"}, headers={"Accept": "text/csv"})
    assert r.headers["content-type"] == "application/json" and all_of(r, "Vary") == []
    r = server.post("/execute_sql?stream=true", body, headers={"Accept": "text/csv"})
    assert r.status == 200 and r.body == CSV_BODY
    assert r.headers["content-disposition"] == 'attachment; filename="lite.csv"'
    r = server.post("/execute_sql?stream=true", body)
    assert r.status == 400 and r.json["code"] == "invalid_stream"   # json can't stream, as before


def test_errors_and_empty_results_stay_json(server, two):
    r = server.get(q("conv_missing"), headers={"Accept": "text/csv"})
    assert r.status == 404 and r.headers["content-type"] == "application/json"
    r = server.post("/execute_sql", {"sql": "SELECT id FROM t WHERE id < 0", "connection_name": "lite"},
                    headers={"Accept": "text/csv"})
    assert r.status == 200 and r.body == b'{"message":"No results returned"}\n'
    assert r.headers["content-type"] == "application/json" and r.headers["x-row-count"] == "0"


def test_the_response_cache_keeps_json_and_csv_apart(server, uniq):
    name = uniq("conv_cached")
    server.query(name, "SELECT id, name FROM t WHERE id <= 2 ORDER BY id", "lite", cache_ttl=60)
    first_json = server.get(q(name))
    first_csv = server.get(q(name), headers={"Accept": "text/csv"})
    assert (first_json.headers["x-cache"], first_csv.headers["x-cache"]) == ("MISS", "MISS")
    assert first_csv.body == CSV_BODY and first_json.json[0] == {"id": 1, "name": "row 1"}
    for _ in range(2):
        hit_json = server.get(q(name), headers={"Accept": "*/*"})
        hit_csv = server.get(q(name), headers={"Accept": "text/csv"})
        assert hit_json.headers["x-cache"] == "HIT" and hit_json.body == first_json.body
        assert hit_json.headers["content-type"] == "application/json"
        assert hit_csv.headers["x-cache"] == "HIT" and hit_csv.body == CSV_BODY
        assert hit_csv.headers["content-type"] == "text/csv; charset=utf-8"
        assert all_of(hit_json, "Vary") == ["Accept"] == all_of(hit_csv, "Vary")
        assert hit_csv.headers["etag"] != hit_json.headers["etag"]
    # ?format=csv shares the CSV entry, without Vary; a negotiated hit never carries a stored one twice
    named = server.get(q(name), params={"format": "csv"})
    assert named.headers["x-cache"] == "HIT" and named.body == CSV_BODY and all_of(named, "Vary") == []
    again = server.get(q(name), headers={"Accept": "text/csv"})
    assert all_of(again, "Vary") == ["Accept"]
    # a 304 says what it varies on, as its 200 would
    not_modified = server.get(q(name), headers={"Accept": "text/csv", "If-None-Match": again.headers["etag"]})
    assert not_modified.status == 304 and all_of(not_modified, "Vary") == ["Accept"]
    wrong = server.get(q(name), headers={"If-None-Match": again.headers["etag"]})
    assert wrong.status == 200 and wrong.headers["content-type"] == "application/json"


def test_csv_body_reads_back(server, two):
    r = server.get(q(two), headers={"Accept": "text/csv"})
    assert list(csv.reader(io.StringIO(r.body.decode()))) == [["id", "name"], ["1", "row 1"], ["2", "row 2"]]
