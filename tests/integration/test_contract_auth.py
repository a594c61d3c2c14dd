"""Contract sections 0 (conventions) and 1 (authentication) against a real server."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e


def test_b1_1_no_key_is_401(server):
    r = server.get("/api/v1/connections", key=None)
    assert r.status == 401 and r.json == {"error": "Unauthorized", "code": "unauthorized",
                                          "request_id": r.headers["x-request-id"]}


def test_b1_2_wrong_inactive_expired_ip_all_look_the_same(server, uniq):
    name = uniq("q")
    server.query(name, "SELECT 1 AS v", "lite")
    inactive, expired, far_ip = uniq("inactive"), uniq("expired"), uniq("farip")
    k_inactive = server.key(inactive, queries=[name])
    server.request("PATCH", f"/api/v1/api-keys/{inactive}", body={"active": False})
    yesterday = (dt.date.today() - dt.timedelta(days=1)).isoformat()
    k_expired = server.key(expired, queries=[name], expires_at=yesterday)
    k_far = server.key(far_ip, queries=[name], allowed_ips=["10.9.8.0/24"])
    bodies = []
    for key in ("sk_wrong", k_inactive, k_expired, k_far):
        r = server.get(q(name), key=key)
        assert r.status == 401
        bodies.append({k: v for k, v in r.json.items() if k != "request_id"})
    assert all(b == bodies[0] for b in bodies)


def test_b1_3_bearer_and_query_string_keys_are_refused(server):
    r = server.get("/api/v1/connections", key=None, headers={"Authorization": f"Bearer {server.admin_key}"})
    assert r.status == 401
    assert server.get(f"/api/v1/connections?api_key={server.admin_key}", key=None).status == 401


def test_b1_4_open_mode_local_yes_remote_no(make_server):
    s = make_server(admin_key=None)
    assert s.get("/api/v1/connections", key=None).status == 200
    assert s.get("/api/v1/me", key=None).json["via"] == "open"


def test_open_mode_refuses_a_request_a_proxy_on_this_machine_relays_for_another(make_server):
    """Open mode behind a proxy on the same machine: every request arrives from 127.0.0.1 (nginx's default
    proxy_pass also sends Host: 127.0.0.1), so a forwarding header naming a client elsewhere is that client's request:
    refused, with QAG_TRUST_PROXY or without. The headers only take access away: a loopback client named stays
    local, and a remote peer naming 127.0.0.1 stays remote (the in-process test below)."""
    for trust in ("0", "1"):
        s = make_server(admin_key=None, env={"QAG_TRUST_PROXY": trust})
        for headers in ({"X-Forwarded-For": "203.0.113.9"}, {"X-Forwarded-For": "127.0.0.1, 203.0.113.9"},
                        {"Forwarded": 'for="[2001:db8::1]:4711";proto=https'}, {"Forwarded": "for=unknown"},
                        {"X-Real-IP": "203.0.113.9"}, {"True-Client-IP": "203.0.113.9"},
                        {"CF-Connecting-IP": "2001:db8::9"}):
            r = s.get("/api/v1/connections", key=None, headers=headers)
            assert r.status == 403 and r.json["code"] == "open_access_remote", (trust, headers, r)
        for headers in ({"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-For": "127.0.0.1:5123, ::1"},
                        {"Forwarded": "for=127.0.0.1;proto=http"}, {"Forwarded": "proto=https"}):
            r = s.get("/api/v1/connections", key=None, headers=headers)
            assert r.status == 200, (trust, headers, r)
        assert s.get("/health", key=None, headers={"X-Forwarded-For": "203.0.113.9"}).status == 200
        # Public routes answer a relayed caller as anyone, not as the administrator open mode makes a local one
        relayed = s.get("/openapi.json", key=None, headers={"X-Forwarded-For": "203.0.113.9"})
        local = s.get("/openapi.json", key=None)
        assert relayed.status == 200 and local.status == 200, (relayed, local)
        assert not any(p.startswith("/api/v1") for p in relayed.json["paths"]), sorted(relayed.json["paths"])
        assert any(p.startswith("/api/v1") for p in local.json["paths"])


def test_b1_4_open_mode_remote_refused_in_process(tmp_path):
    """The remote half of B1.4 needs a non-loopback peer: judged by the WSGI app on REMOTE_ADDR."""
    import io
    
    from qag.app import create_app
    from qag.settings import load

    app = create_app(load({"QAG_HOME": str(tmp_path)}))

    def call(path, peer, forwarded=None, method="GET", key=None):
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": peer,
                   "wsgi.input": io.BytesIO(b"")}
        if forwarded:
            environ["HTTP_X_FORWARDED_FOR"] = forwarded
        if key:
            environ["HTTP_X_API_KEY"] = key
        seen = {}
        body = b"".join(app(environ, lambda status, headers: seen.update(status=status)))
        return int(seen["status"].split()[0]), body

    status, body = call("/api/v1/connections", "10.0.0.5")
    assert status == 403 and json.loads(body)["code"] == "open_access_remote"
    assert call("/health", "10.0.0.5")[0] == 200
    assert call("/api/v1/connections", "10.0.0.5", forwarded="127.0.0.1")[0] == 403
    assert call("/api/v1/connections", "")[0] == 403
    assert call("/api/v1/connections", "127.0.0.1")[0] == 200
    # a public route answers the remote peer as anyone: /openapi.json without the administrator's routes
    status, body = call("/openapi.json", "10.0.0.5")
    assert status == 200 and not any(p.startswith("/api/v1") for p in json.loads(body)["paths"])
    # A path no route takes, or a method it doesn't, answers the remote peer as every other path does (QueryAPIGate
    # 0.43, probed): a 404 or 405 would tell it which routes exist.
    for path, method in (("/nope", "GET"), ("/api/v1/nope", "GET"), ("/q/x/y", "POST"), ("/execute_sql", "GET")):
        status, body = call(path, "10.0.0.5", method=method)
        assert status == 403 and json.loads(body)["code"] == "open_access_remote", (path, method)
    assert call("/nope", "127.0.0.1")[0] == 404 and call("/execute_sql", "127.0.0.1")[0] == 405
    status, body = call("/health", "10.0.0.5", method="POST")   # no credential: an anonymous caller, as anywhere
    assert status == 403 and json.loads(body)["code"] == "open_access_remote"
    assert call("/health", "127.0.0.1", method="POST")[0] == 405
    # A credential changes nothing there: open mode has no key to test, and the route stays hidden from elsewhere.
    assert call("/health", "10.0.0.5", method="POST", key="x")[0] == 401   # a wrong key, as on any path
    assert call("/metrics", "10.0.0.5", method="DELETE", key="x")[0] == 401


def test_b1_4_first_scoped_key_ends_open_mode(make_server):
    s = make_server(admin_key=None)
    secret = s.key("first")
    assert s.get("/api/v1/connections", key=None).status == 401
    r = s.get("/api/v1/connections", key=secret)
    assert r.status == 403 and r.json["code"] == "admin_only"


def test_b1_5_scoped_key_on_management_api(server, uniq):
    key = server.key(uniq("k"))
    r = server.get("/api/v1/api-keys", key=key)
    assert r.status == 403 and r.json["code"] == "admin_only"
    assert r.json["error"] == "This API key is not authorized to manage the server configuration"
    assert server.post("/api/v1/roles", {"name": "x"}, key=key).status == 403


def test_b1_6_request_id_is_never_an_identity(server):
    r = server.get("/api/v1/connections", key=None, headers={"X-Request-Id": server.admin_key})
    assert r.status == 401


def test_b1_7_key_expiring_today_works(server, uniq):
    name = uniq("q")
    server.query(name, "SELECT 1 AS v", "lite")
    key = server.key(uniq("today"), queries=[name], expires_at=dt.date.today().isoformat())
    assert server.get(q(name), key=key).status == 200


def test_b1_8_empty_ip_list_allows_nobody(server, uniq):
    name = uniq("q")
    server.query(name, "SELECT 1 AS v", "lite")
    key = server.key(uniq("noip"), queries=[name], allowed_ips=[])
    assert server.get(q(name), key=key).status == 401
    key = server.key(uniq("local"), queries=[name], allowed_ips=["127.0.0.0/8"])
    assert server.get(q(name), key=key).status == 200


def test_admin_key_non_ascii_never_matches(server):
    r = server.request("GET", "/api/v1/connections", key=None,
                       headers={"X-API-Key": server.admin_key + "\u00e9"})
    assert r.status == 401


def test_0_3_error_envelope_for_router_errors(server):
    r = server.get("/nope")
    assert r.status == 404 and list(r.json) == ["error", "code", "request_id"] and r.json["code"] == "not_found"
    r = server.request("DELETE", "/health")
    assert r.status == 405 and r.json["code"] == "method_not_allowed"
    assert server.get("/nope", key=None).status == 401


def test_0_4_request_id_reuse_rules(server):
    assert server.get("/health", headers={"X-Request-Id": "abc.DEF:1-2_3"}).headers["x-request-id"] == "abc.DEF:1-2_3"
    for bad in ("has space", "x" * 65, "semi;colon"):
        rid = server.get("/health", headers={"X-Request-Id": bad}).headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{12}", rid)
    r = server.get("/api/v1/connections", key=None, headers={"X-Request-Id": "mine-1"})
    assert r.json["request_id"] == "mine-1" == r.headers["x-request-id"]


def test_0_5_security_headers_everywhere(server):
    for r in (server.get("/health"), server.get("/api/v1/connections"), server.get("/nope", key=None)):
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["content-security-policy"] == "default-src 'none'; frame-ancestors 'none'"
        assert r.headers["referrer-policy"] == "no-referrer"
        assert r.headers["cache-control"] == "no-store"
        assert "strict-transport-security" not in r.headers


def test_0_5_hsts_only_over_https_behind_trusted_proxy(make_server):
    s = make_server(env={"QAG_HSTS_MAX_AGE": "3600", "QAG_TRUST_PROXY": "1"})
    assert "strict-transport-security" not in s.get("/health").headers
    r = s.get("/health", headers={"X-Forwarded-Proto": "https"})
    assert r.headers["strict-transport-security"] == "max-age=3600"


def test_0_6_cors(make_server):
    s = make_server(env={"QAG_CORS_ORIGINS": "https://app.example.com/"})
    origin = {"Origin": "https://App.example.com"}
    r = s.request("OPTIONS", "/api/v1/connections", key=None,
                  headers={**origin, "Access-Control-Request-Method": "GET"})
    assert r.status == 204
    assert r.headers["access-control-allow-origin"] == "https://App.example.com"
    assert r.headers["access-control-allow-methods"] == "GET, POST, PATCH, DELETE, OPTIONS"
    assert r.headers["access-control-max-age"] == "600" and r.headers["vary"] == "Origin"
    other = s.request("OPTIONS", "/api/v1/connections", key=None,
                      headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"})
    assert other.status == 204 and "access-control-allow-origin" not in other.headers
    unauth = s.get("/api/v1/connections", key=None, headers=origin)
    assert unauth.status == 401 and "X-Request-Id" in unauth.headers["access-control-expose-headers"]
    # Contract 0.6's list exactly, plus X-Row-Count (a deliberate addition: docs/compatibility.md).
    exposed = unauth.headers["access-control-expose-headers"].split(", ")
    assert exposed == ["X-Page", "X-Page-Size", "X-Has-More", "X-Row-Count", "X-RateLimit-Limit",
                       "X-RateLimit-Remaining", "X-RateLimit-Key-Limit", "X-RateLimit-Key-Remaining", "Retry-After",
                       "X-Request-Id", "X-Cache", "ETag", "Deprecation", "Link"]
    plain = s.request("OPTIONS", "/api/v1/connections", key=None, headers=origin)
    assert plain.status == 401
