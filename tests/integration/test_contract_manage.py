"""Contract section 5 (management API) against a real server, one test per numbered behaviour."""

from __future__ import annotations


import pytest

from tests.server import q

pytestmark = pytest.mark.e2e


def _audit(server, action, target):
    return [row[0] for row in server.store_sql("SELECT changes FROM audit_log WHERE action = ? AND target = ?",
                                               (action, target))]


def test_b5_1_create_without_publish_is_a_draft(server, uniq):
    name = uniq("b51")
    r = server.query(name, "SELECT 1", "lite", publish=False)
    body = r.json
    assert body["published_version"] is None and body["latest_version"] == 1 and body["has_draft"] is True
    assert body["versions"][0]["status"] == "draft" and body["endpoint"] == f"/q/{name}"
    assert r.headers["etag"].startswith('"') and len(r.headers["etag"]) == 34


def test_endpoint_is_the_name_as_is(server, uniq):
    # Contract 5.3 and QueryAPIGate: "/q/<name>" with the name as stored, not percent-encoded.
    from urllib.parse import quote
    for name in (uniq("sp ace "), uniq("café-")):
        assert server.query(name, "SELECT 1", "lite").json["endpoint"] == f"/q/{name}"
        assert server.get(f"/api/v1/queries/{quote(name)}").json["endpoint"] == f"/q/{name}"
        items = server.get("/api/v1/queries", params={"search": name}).json["items"]
        assert [i["endpoint"] for i in items] == [f"/q/{name}"]


def test_b5_2_statuses_follow_publishing(server, uniq):
    name = uniq("b52")
    server.query(name, "SELECT 1", "lite")
    r = server.post(f"/api/v1/queries/{name}/versions", {"description": "two", "sql": "SELECT 2"})
    assert [v["status"] for v in r.json["versions"]] == ["published", "draft"]
    r = server.post(f"/api/v1/queries/{name}/publish", {"version": 2})
    assert [v["status"] for v in r.json["versions"]] == ["previous", "published"]
    r = server.post(f"/api/v1/queries/{name}/publish", {"version": 1})
    assert [v["status"] for v in r.json["versions"]] == ["published", "draft"]
    assert server.post(f"/api/v1/queries/{name}/publish", {"version": "1"}).json["code"] == "invalid_body"
    assert server.post(f"/api/v1/queries/{name}/publish", {"version": 9}).json["code"] == "version_not_found"


def test_b5_3_etag_if_match(server, uniq):
    name = uniq("b53")
    etag = server.query(name, "SELECT 1", "lite").headers["etag"]
    body = {"description": "two", "sql": "SELECT 2"}
    assert server.post(f"/api/v1/queries/{name}/versions", body, headers={"If-Match": etag}).status == 201
    r = server.post(f"/api/v1/queries/{name}/versions", body, headers={"If-Match": etag})
    assert r.status == 412 and r.json["code"] == "precondition_failed"
    # A change behind the API (another process writing the store) also changes the ETag.
    etag = server.get(f"/api/v1/queries/{name}").headers["etag"]
    server.store_sql("UPDATE queries SET collection = 'moved' WHERE name = ?", (name,))
    assert server.post(f"/api/v1/queries/{name}/unpublish", headers={"If-Match": etag}).status == 412
    assert server.post(f"/api/v1/queries/{name}/unpublish", headers={"If-Match": "*"}).status == 200


def test_if_match_is_compared_whole(server, uniq):
    # Contract 5.1: a value that is neither * nor the current ETag is a 412; QueryAPIGate reads no list in it.
    name = uniq("im")
    etag = server.query(name, "SELECT 1", "lite").headers["etag"]
    path = f"/api/v1/queries/{name}/unpublish"
    for value in (f'"{"0" * 32}", {etag}', f"{etag}, {etag}", '"x", *', f"W/{etag}", etag.strip('"'), ""):
        r = server.post(path, headers={"If-Match": value})
        assert r.status == 412 and r.json["code"] == "precondition_failed", (value, r)
    assert server.post(path, headers={"If-Match": f" {etag}\t"}).status == 200


def test_b5_4_version_input_validation(server, uniq):
    r = server.post("/api/v1/queries", {"name": uniq("x"), "description": "d", "sql": "SELECT 1", "filename": "x"})
    assert r.status == 400 and r.json["code"] == "unknown_field"
    r = server.post("/api/v1/queries", {"name": uniq("x"), "description": "d"})
    assert r.json == {"error": "SQL query is missing", "code": "invalid_body", "request_id": r.json["request_id"]}
    r = server.post("/api/v1/queries", {"name": uniq("x"), "sql": "SELECT 1"})
    assert r.json["error"] == "Description is missing"
    assert server.post("/api/v1/queries", {"name": uniq("x"), "sql": "SELECT 1", "description": ""}).status == 400
    # "a non-empty string" (5.3), as QueryAPIGate reads it: blanks are one
    r = server.post("/api/v1/queries", {"name": uniq("x"), "sql": "SELECT 1", "description": "  "})
    assert r.status == 201 and r.json["versions"][0]["description"] == "  ", r
    r = server.post("/api/v1/queries", {"description": "d", "sql": "SELECT 1"})
    assert r.json["code"] == "invalid_name"
    r = server.post("/api/v1/queries", {"name": "a/b", "description": "d", "sql": "SELECT 1"})
    assert r.json["code"] == "invalid_name"


def test_b5_5_declared_parameter_must_be_used(server, uniq):
    r = server.post("/api/v1/queries", {"name": uniq("x"), "description": "d", "sql": "SELECT :id",
                                        "parameters": {"idd": "int"}})
    assert r.status == 400 and "idd" in r.json["error"] and "idd" in r.json["errors"]
    r = server.post("/api/v1/queries", {"name": uniq("x"), "description": "d", "sql": "SELECT {id}",
                                        "parameters": {"id": "int"}})
    assert r.status == 201


def test_b5_6_patch_version_cache_ttl(server, uniq):
    name = uniq("b56")
    server.query(name, "SELECT 1", "lite")
    r = server.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"cache_ttl": 60})
    assert r.status == 200 and r.json["version_count"] == 1 and r.json["versions"][0]["cache_ttl"] == 60
    for bad in ({"cache_ttl": -1}, {"cache_ttl": "60"}, {"cache_ttl": True}):
        assert server.request("PATCH", f"/api/v1/queries/{name}/versions/1", body=bad).json["code"] == "invalid_body"
    r = server.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"ttl": 60})
    assert r.status == 400 and r.json["code"] == "unknown_field"
    assert server.request("PATCH", f"/api/v1/queries/{name}/versions/99", body={"cache_ttl": 1}).status == 404


def test_b5_7_delete_versions(server, uniq):
    name = uniq("b57")
    server.query(name, "SELECT 1", "lite")
    server.post(f"/api/v1/queries/{name}/versions", {"description": "two", "sql": "SELECT 2", "publish": True})
    r = server.request("DELETE", f"/api/v1/queries/{name}/versions/2")
    assert r.status == 200 and r.json["version_count"] == 1 and r.json["published_version"] == 1
    assert server.request("DELETE", f"/api/v1/queries/{name}/versions/2").status == 404
    assert server.request("DELETE", f"/api/v1/queries/{name}/versions/1").status == 204
    assert server.get(f"/api/v1/queries/{name}").status == 404


def test_b5_8_fresh_store_lists_nothing(make_server):
    s = make_server(seed=False)
    assert s.get("/api/v1/queries").json == {"items": []}


def test_b5_9_connection_password_never_returned(server, uniq):
    name = uniq("pw")
    r = server.post("/api/v1/connections", {"name": name, "db": "sqlite", "database": "lite.db",
                                            "password": "hunter2-secret", "options": {"sslmode": "require"}})
    assert r.status == 201 and r.json["password"] == "********" and "hunter2" not in r.body.decode()
    assert r.json["options"] == {"sslmode": "require"}
    assert "hunter2" not in server.get(f"/api/v1/connections/{name}").body.decode()
    r = server.request("PATCH", f"/api/v1/connections/{name}", body={"password": "********", "host": "h"})
    assert r.status == 200
    r = server.request("PATCH", f"/api/v1/connections/{name}", body={"password": "new-secret-value"})
    assert r.status == 200
    audits = _audit(server, "update_connection", name) + _audit(server, "create_connection", name)
    assert audits and all("hunter2" not in a and "new-secret-value" not in a for a in audits)
    assert any('"password":"changed"' in a for a in audits)
    stored = server.store_sql("SELECT fields FROM connections WHERE name = ?", (name,))[0][0]
    assert "new-secret-value" in stored


def test_b5_10_delete_connection_needs_reason(server, uniq):
    name = uniq("del")
    server.connection(name, "lite.db")
    for raw in (None, b"{}", b'{"reason": ""}', b'{"reason": "   "}'):
        r = server.request("DELETE", f"/api/v1/connections/{name}", raw=raw,
                           headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.json["code"] == "reason_required"
    assert server.get(f"/api/v1/connections/{name}").status == 200
    assert server.request("DELETE", f"/api/v1/connections/{uniq('none')}").status == 404
    assert server.request("DELETE", f"/api/v1/connections/{name}", body={"reason": "gone"}).status == 204
    deleted = server.get("/api/v1/connections/deleted").json["items"]
    assert any(d["name"] == name and d["reason"] == "gone" and d["deleted_by"] == "admin" for d in deleted)


def test_b5_12_key_secret_shown_once(server, uniq):
    name = uniq("k")
    r = server.post("/api/v1/api-keys", {"name": name})
    assert r.status == 201 and r.json["secret"].startswith("sk_") and len(r.json["secret"]) == 46
    assert r.headers["cache-control"] == "no-store"
    secret = r.json["secret"]
    assert secret not in server.get("/api/v1/api-keys").body.decode()
    assert secret not in server.get(f"/api/v1/api-keys/{name}").body.decode()
    assert all(secret not in a for a in _audit(server, "create_key", name))


def test_b5_13_default_connections_grant(server, uniq):
    all_key = server.key(uniq("all"))
    none_key = server.key(uniq("none"), connections=[])
    assert server.post("/execute_sql", {"sql": "SELECT 1 AS v", "connection_name": "lite"}, key=all_key).status == 200
    r = server.post("/execute_sql", {"sql": "SELECT 1 AS v", "connection_name": "lite"}, key=none_key)
    assert r.status == 403 and r.json["code"] == "connection_forbidden"


def test_b5_14_patch_null_clears_rate_limit_only(server, uniq):
    name = uniq("k")
    server.key(name, rate_limit="5/minute", allowed_ips=["10.0.0.0/8"], connections=["lite"])
    r = server.request("PATCH", f"/api/v1/api-keys/{name}", body={"rate_limit": None, "connections": None})
    assert r.json["rate_limit"] is None and r.json["allowed_ips"] == ["10.0.0.0/8"]
    assert r.json["connections"] == ["lite"]


def test_b5_15_rotation(server, uniq):
    name, query = uniq("rot"), uniq("q")
    server.query(query, "SELECT 1 AS v", "lite")
    old = server.key(name, queries=[query])
    r = server.post(f"/api/v1/api-keys/{name}/rotate")
    new = r.json["secret"]
    assert r.status == 200 and r.headers["cache-control"] == "no-store" and r.json["previous_expires_at"]
    assert server.get(q(query), key=old).status == 200 and server.get(q(query), key=new).status == 200
    again = server.post(f"/api/v1/api-keys/{name}/rotate")
    assert again.status == 409 and again.json["code"] == "key_rotation_pending"
    assert again.json["previous_expires_at"] == r.json["previous_expires_at"]
    assert server.request("DELETE", f"/api/v1/api-keys/{name}/previous").status == 200
    assert server.get(q(query), key=old).status == 401
    assert server.request("DELETE", f"/api/v1/api-keys/{name}/previous").json["code"] == "previous_secret_not_found"
    for bad in (-1, 10081, "an hour", True, 1.5):
        assert server.post(f"/api/v1/api-keys/{name}/rotate", {"grace_minutes": bad}).status == 400
    zero = server.post(f"/api/v1/api-keys/{name}/rotate", {"grace_minutes": 0})
    assert zero.status == 200 and zero.json["previous_expires_at"] is None
    assert server.get(q(query), key=new).status == 401
    assert server.post(f"/api/v1/api-keys/{name}/rotate").status == 200


def test_rotation_grace_null_is_the_default(server, uniq):
    import datetime as dt
    name = uniq("rot")
    server.key(name)
    r = server.post(f"/api/v1/api-keys/{name}/rotate", {"grace_minutes": None})
    assert r.status == 200 and r.json["secret"].startswith("sk_"), r
    until = dt.datetime.strptime(r.json["previous_expires_at"], "%Y-%m-%d %H:%M:%S")
    assert abs((until - dt.datetime.now()).total_seconds() - 3600) < 120


def test_a_pending_rotation_is_409_before_a_stale_if_match(server, uniq):
    name = uniq("rot")
    server.key(name)
    etag = server.get(f"/api/v1/api-keys/{name}").headers["etag"]
    assert server.post(f"/api/v1/api-keys/{name}/rotate", headers={"If-Match": etag}).status == 200
    r = server.post(f"/api/v1/api-keys/{name}/rotate", headers={"If-Match": etag})   # stale now, as in QueryAPIGate
    assert r.status == 409 and r.json["code"] == "key_rotation_pending" and r.json["previous_expires_at"], r
    assert server.request("DELETE", f"/api/v1/api-keys/{name}/previous").status == 200
    r = server.post(f"/api/v1/api-keys/{name}/rotate", headers={"If-Match": etag})
    assert r.status == 412 and r.json["code"] == "precondition_failed", r


def test_b5_17_keys_from_roles(server, uniq):
    role, key = uniq("role"), uniq("k")
    assert server.post("/api/v1/roles", {"name": role, "connections": ["lite"], "max_rows": 5}).status == 201
    r = server.post("/api/v1/api-keys", {"name": key, "role": role})
    assert r.status == 201 and r.json["connections"] == ["lite"] and r.json["created_from_role"] == role
    assert server.request("PATCH", f"/api/v1/roles/{role}", body={"max_rows": 9}).json["keys_created"] == 1
    assert server.get(f"/api/v1/api-keys/{key}").json["max_rows"] == 5
    assert server.request("DELETE", f"/api/v1/roles/{role}").status == 204
    assert server.get(f"/api/v1/api-keys/{key}").json["connections"] == ["lite"]
    r = server.post("/api/v1/api-keys", {"name": uniq("k"), "role": role})
    assert r.status == 404 and r.json["code"] == "role_not_found"
    r = server.post("/api/v1/roles", {"name": uniq("r"), "expires_at": "2030-01-01"})
    assert r.json["code"] == "unknown_field"


def test_key_delete_stops_it_at_once(server, uniq):
    name, query = uniq("k"), uniq("q")
    server.query(query, "SELECT 1 AS v", "lite")
    secret = server.key(name, queries=[query])
    assert server.get(q(query), key=secret).status == 200
    assert server.request("DELETE", f"/api/v1/api-keys/{name}").status == 204
    assert server.get(q(query), key=secret).status == 401


def test_connection_object_and_errors(server, uniq):
    name = uniq("c")
    r = server.post("/api/v1/connections", {"name": name, "db": "sqlite", "database": "lite.db", "created_at": "x"})
    assert r.status == 201 and r.json["created_at"] != "x" and r.json["active"] is True
    assert server.post("/api/v1/connections", {"name": name, "db": "sqlite", "database": "x"}).status == 409
    assert server.post("/api/v1/connections", {"name": "-bad", "db": "sqlite"}).json["code"] == "invalid_name"
    assert "db is required" in server.post("/api/v1/connections", {"name": uniq("c")}).json["error"]
    assert server.post("/api/v1/connections", {"name": uniq("c"), "db": "oracle"}).json["code"] == "invalid_body"
    r = server.post("/api/v1/connections", {"name": uniq("c"), "db": "sqlite", "options": {"host": "x"}})
    assert r.json["error"] == "Set host directly, not inside options"
    r = server.post("/api/v1/connections", {"name": uniq("c"), "db": "sqlite", "database": "qag.db"})
    assert r.status == 403 and r.json["code"] == "store_not_allowed"
    assert server.request("PATCH", f"/api/v1/connections/{name}", body={"active": None}).status == 400
    assert server.post("/api/v1/connections/test", {"name": name}).json["elapsed_ms"] >= 0
    # A test that can't open its database is 502 connection_failed (contract 5.2, as QueryAPIGate answers it),
    # the SQLite file missing or not named included; a run answers those 404 and 400 (10.6).
    r = server.post("/api/v1/connections/test", {"db": "sqlite", "database": "missing.db"})
    assert r.status == 502 and r.json["code"] == "connection_failed", r
    assert r.json["detail"] == "SQLite database file not found"
    r = server.post("/api/v1/connections/test", {"db": "sqlite"})
    assert r.status == 502 and r.json["detail"] == "Database file path not provided", r
    r = server.post("/api/v1/connections/databases", {"name": name})
    assert r.status == 400 and r.json["code"] == "unsupported_operation"
    schema = server.get(f"/api/v1/connections/{name}/schema").json
    t = next(t for t in schema["tables"] if t["name"] == "t")
    assert [c["name"] for c in t["columns"]] == ["id", "name", "action"] and t["columns"][0]["primary_key"]


def test_inactive_connection(server, uniq):
    name, query = uniq("c"), uniq("q")
    server.connection(name, "lite.db")
    server.query(query, "SELECT 1 AS v", name)
    server.request("PATCH", f"/api/v1/connections/{name}", body={"active": False})
    r = server.get(q(query))
    assert r.status == 403 and r.json["code"] == "connection_inactive"


def test_an_inactive_connection_shows_no_schema_ddl_or_databases(server, uniq):
    # Contract 10.1 step 1, 11: QueryAPIGate 0.43 refuses these as it refuses a run (probed), for the admin too.
    name = uniq("off")
    server.connection(name, "lite.db")
    server.request("PATCH", f"/api/v1/connections/{name}", body={"active": False})
    granted = server.key(uniq("k"), connections=[name])
    message = f"The connection '{name}' is currently not active. To use it, it must be set to active."
    for key in ("admin", granted):
        for path in (f"/connections/{name}/schema", f"/connections/{name}/table_ddl?table=t"):
            r = server.get(path, key=key)
            assert (r.status, r.json["code"], r.json["error"]) == (403, "connection_inactive", message), (path, r)
        assert server.get(f"/connections/{name}/table_ddl", key=key).json["code"] == "table_required"
    assert server.get(f"/connections/{name}/schema?database=x").json["code"] == "connection_inactive"
    assert server.get(f"/connections/{name}/schema?database=x", key=granted).json["code"] == "admin_only"
    r = server.get(f"/api/v1/connections/{name}/schema")
    assert r.status == 403 and r.json["code"] == "connection_inactive"
    r = server.post("/api/v1/connections/databases", {"name": name})
    assert r.status == 403 and r.json["code"] == "connection_inactive"
    assert server.post("/api/v1/connections/test", {"name": name}).status == 200   # as QueryAPIGate: tests it
    # /openapi.json offers no route that would answer 403 for its caller.
    assert "/connections/{name}/schema" not in server.get("/openapi.json", key=granted).json["paths"]
    admin = server.get("/openapi.json").json["paths"]["/connections/{name}/schema"]["get"]["parameters"][0]
    assert "lite" in admin["schema"]["enum"] and name not in admin["schema"]["enum"]


def test_query_list_filters_and_move(server, uniq):
    name = uniq("listme")
    server.query(name, "SELECT 1", "lite", tags="alpha, beta", collection="coll-" + name.lower().replace("_", "-"))
    items = server.get("/api/v1/queries", params={"search": "BETA"}).json["items"]
    assert name in [i["name"] for i in items]
    assert server.get("/api/v1/queries?status=bogus").json["code"] == "invalid_filter"
    r = server.request("PATCH", f"/api/v1/queries/{name}", body={"collection": None})
    assert r.status == 200 and r.json["collection"] is None
    r = server.request("PATCH", f"/api/v1/queries/{name}", body={"sql": "SELECT 2"})
    assert r.status == 400 and r.json["code"] == "unknown_field"


def test_validate_and_flow(server, uniq):
    r = server.post("/api/v1/queries/validate", {"sql": "SELECT * FROM t WHERE id = :id; DELETE FROM t",
                                                 "description": "d"})
    assert r.status == 200 and r.json["valid"] is False and r.json["placeholders"] == ["id"]
    r = server.post("/api/v1/queries/validate", {"sql": "SELECT a.id FROM t a JOIN secret s ON s.id = a.id",
                                                 "description": "d", "connection_name": "lite"})
    assert r.json["valid"] is True and r.json["tables"] == ["secret", "t"]
    name = uniq("flow")
    server.query(name, "SELECT a.id FROM t a JOIN secret s ON s.id = a.id", "lite")
    flow = server.get(f"/api/v1/queries/{name}/versions/1/flow").json
    assert sorted(flow["tables"]) == ["secret", "t"] and flow["joins"]


def test_validate_judges_writes_by_the_server_setting(server, writes_server):
    # Contract 5.3: validate tells whether the definition would run here, so a write is fine where writes are on.
    body = {"description": "d", "sql": "DELETE FROM t", "connection_name": "lite"}
    r = writes_server.post("/api/v1/queries/validate", body)
    assert r.status == 200 and r.json["valid"] is True and r.json["errors"] == [], r.json
    r = server.post("/api/v1/queries/validate", body)
    assert r.json["valid"] is False and r.json["errors"][0]["field"] == "sql"
    assert "QUERYAPIGATE_ALLOW_WRITES=1" in r.json["errors"][0]["message"]



def test_validate_names_an_unknown_connection(server, uniq):
    missing = uniq("nope")
    r = server.post("/api/v1/queries/validate", {"description": "d", "sql": "SELECT 1", "connection_name": missing})
    assert r.status == 200 and r.json["valid"] is False
    assert r.json["errors"] == [{"message": f"Connection '{missing}' not found", "field": "connection_name"}]
    # QueryAPIGate's order: the definition's own problem, then the connection, then the SQL.
    r = server.post("/api/v1/queries/validate", {"sql": "SELECT 1; SELECT 2", "connection_name": missing})
    assert [e.get("field") for e in r.json["errors"]] == [None, "connection_name", "sql"], r.json
    assert r.json["errors"][0]["message"] == "Description is missing"



def test_validate_lists_tables_only_for_an_existing_connection(server, uniq):
    sql = "SELECT a.id FROM t a JOIN secret s ON s.id = a.id"
    for extra in ({}, {"connection_name": ""}, {"connection_name": uniq("nope")}):
        r = server.post("/api/v1/queries/validate", {"description": "d", "sql": sql, **extra})
        assert r.json["tables"] == [], (extra, r.json)
    r = server.post("/api/v1/queries/validate", {"description": "d", "sql": sql, "connection_name": "lite"})
    assert r.json["tables"] == ["secret", "t"]



def test_a_missing_resource_is_404_before_its_body_is_judged(server, uniq):
    # QueryAPIGate (and the contract's "404 checked first") looks the resource up before reading the body.
    none = uniq("none")
    cases = [("POST", f"/api/v1/queries/{none}/versions", {"description": "v"}, "query_not_found"),
             ("POST", f"/api/v1/queries/{none}/versions", {"name": "x"}, "query_not_found"),
             ("POST", f"/api/v1/queries/{none}/publish", {}, "query_not_found"),
             ("PATCH", f"/api/v1/queries/{none}/versions/1", {"ttl": 1}, "query_not_found"),
             ("PATCH", f"/api/v1/queries/{none}", {"zzz": 1}, "query_not_found"),
             ("PATCH", f"/api/v1/queries/{none}", {"collection": "NOT A NAME"}, "query_not_found"),
             ("POST", f"/api/v1/api-keys/{none}/rotate", {"grace_minutes": -1}, "key_not_found"),
             ("PATCH", f"/api/v1/api-keys/{none}", None, "key_not_found"),
             ("PATCH", f"/api/v1/roles/{none}", None, "role_not_found"),
             ("PATCH", f"/api/v1/connections/{none}", None, "connection_not_found")]
    for method, path, body, code in cases:
        r = server.request(method, path, body=body)
        assert r.status == 404 and r.json["code"] == code, (method, path, body, r)
    for path in (f"/api/v1/queries/{none}/versions", f"/api/v1/queries/{none}/publish"):
        r = server.request("POST", path, raw=b"[1]", headers={"Content-Type": "application/json"})
        assert r.status == 404 and r.json["code"] == "query_not_found", (path, r)


def test_a_stale_if_match_is_412_before_the_body_is_judged(server, uniq):
    query, key, role, conn = uniq("q"), uniq("k"), uniq("r"), uniq("c")
    server.query(query, "SELECT 1", "lite")
    server.key(key)
    assert server.post("/api/v1/roles", {"name": role}).status == 201
    server.connection(conn, "lite.db")
    stale = {"If-Match": '"' + "0" * 32 + '"'}
    cases = [("POST", f"/api/v1/queries/{query}/versions", {"zz": 1}),
             ("POST", f"/api/v1/queries/{query}/versions", None),
             ("POST", f"/api/v1/queries/{query}/publish", {}),
             ("POST", f"/api/v1/queries/{query}/publish", {"version": 9}),
             ("PATCH", f"/api/v1/queries/{query}/versions/1", {"ttl": 1}),
             ("PATCH", f"/api/v1/queries/{query}/versions/9", {"cache_ttl": 1}),
             ("DELETE", f"/api/v1/queries/{query}/versions/9", None), ("PATCH", f"/api/v1/queries/{query}", {"zzz": 1}),
             ("PATCH", f"/api/v1/api-keys/{key}", None), ("PATCH", f"/api/v1/roles/{role}", None),
             ("PATCH", f"/api/v1/connections/{conn}", None), ("DELETE", f"/api/v1/connections/{conn}", None)]
    for method, path, body in cases:
        r = server.request(method, path, body=body, headers=stale)
        assert r.status == 412 and r.json["code"] == "precondition_failed", (method, path, body, r)
    # Without If-Match the body is judged before the version is looked up.
    r = server.request("PATCH", f"/api/v1/queries/{query}/versions/9", body={"ttl": 1})
    assert r.status == 400 and r.json["code"] == "unknown_field"


# QueryAPIGate 0.43's owner, in its order (probed): the admin key and an open server alike.
OWNER_CAPABILITIES = ["access.read", "access.write", "admins.read", "admins.write", "cache.read", "cache.write",
                      "config.apply", "connections.read", "connections.write", "destinations.write", "examples.write",
                      "exports.read", "exports.run", "exports.write", "history.forget", "observe", "queries.read",
                      "queries.write", "secrets.rotate", "self", "settings.read", "workspaces.read",
                      "workspaces.write", "writes.approve"]


def test_me(server):
    me = server.get("/api/v1/me").json
    assert (me["name"], me["role"], me["via"]) == ("admin", "owner", "break-glass")
    assert me["data_access"] is True and me["capabilities"] == OWNER_CAPABILITIES


def test_me_in_open_mode(make_server):
    me = make_server(admin_key=None, seed=False).get("/api/v1/me", key=None).json
    assert (me["name"], me["role"], me["via"]) == (None, "owner", "open")
    assert me["data_access"] is True and me["capabilities"] == OWNER_CAPABILITIES


def test_runtime_schema_route_needs_the_connection_grant(server, uniq):
    granted = server.key(uniq("k"), connections=["lite"])
    other = server.key(uniq("k"), connections=[])
    tables = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    r = server.get("/connections/lite/schema", key=granted)
    assert r.status == 200 and "t" in [t["name"] for t in r.json["tables"]]
    r = server.get("/connections/lite/schema", key=other)
    assert r.status == 403 and r.json["code"] == "connection_forbidden"
    assert server.get("/connections/lite/schema?database=x", key=granted).json["code"] == "admin_only"
    assert [t["name"] for t in server.get("/connections/lite/schema", key=tables).json["tables"]] == ["t"]
    for path in ("/connections/lite/schema?database=x", "/api/v1/connections/lite/schema?database=x"):
        r = server.get(path)   # as QueryAPIGate 0.43 (probed), and as /execute_sql's `database` on SQLite
        assert (r.status, r.json["code"]) == (400, "unsupported_operation"), (path, r)
        assert r.json["error"] == "Switching databases isn't supported for 'sqlite' connections"
    assert server.get("/connections/lite/schema", key=None).status == 401


def test_saved_connection_test_route(server, uniq):
    assert server.post("/api/v1/connections/lite/test").json["elapsed_ms"] >= 0
    assert server.post(f"/api/v1/connections/{uniq('none')}/test").json["code"] == "connection_not_found"
