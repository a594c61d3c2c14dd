"""Bad input gets a clear 4xx with a stable code, never a 500, and the next good request succeeds."""

from __future__ import annotations

import socket

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e


@pytest.fixture
def echo(server, uniq):
    name = uniq("echo")
    server.query(name, "SELECT :v AS v", "lite", parameters={"v": "int"})
    return name


def _good(server, name):
    r = server.get(q(name) + "?v=3")
    assert r.status == 200 and r.json == [{"v": 3}]


def raw_http(server, data: bytes, wait: float = 5.0) -> bytes:
    """Send raw bytes on a fresh socket; returns what the server sent until it closed (or `wait` passed)."""
    with socket.create_connection((server.host, server.port), timeout=wait) as sock:
        sock.sendall(data)
        chunks = []
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except socket.timeout:
            pass
    return b"".join(chunks)


@pytest.mark.parametrize("raw,code", [
    (b"{", "invalid_body"), (b"[1, 2]", "invalid_body"), (b'"text"', "invalid_body"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid_body"), (b"\xff\xfe", "invalid_body"),
    (b'{"params": [1]}', "invalid_body"), (b'{"params": {"v": [1]}}', "param_invalid"),
    (b'{"params": {"v": {"a": 1}}}', "param_invalid"), (b'{"params": {"v": 1e400}}', "param_invalid"),
    (b'{"params": {"v": 99999999999999999999999}}', "param_invalid"), (b'{"params": {"v": 1.5}}', "param_invalid"),
])
def test_bad_bodies_on_q(server, echo, raw, code):
    r = server.request("POST", q(echo), raw=raw, headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == code, r
    _good(server, echo)


@pytest.mark.parametrize("value", ["[1]", '{"a": 1}', "1e400", str(2 ** 70), "-1e999"])
def test_undeclared_parameter_type_confusion(server, uniq, value):
    name = uniq("und")
    server.query(name, "SELECT :v AS v", "lite")
    raw = ('{"params": {"v": %s}}' % value).encode()
    r = server.request("POST", q(name), raw=raw, headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == "param_invalid", r


def test_management_bodies(server, uniq):
    r = server.request("POST", "/api/v1/connections", raw=b"name=x&db=sqlite",
                       headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 400 and r.json["code"] == "invalid_body"
    r = server.request("POST", "/api/v1/api-keys", raw=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == "invalid_body"
    r = server.post("/api/v1/api-keys", {"name": uniq("k"), "secret": "mine"})
    assert r.status == 400 and r.json["code"] == "unknown_field"
    for bad in ("", "a/b", "x" * 101, "a\nb"):
        r = server.post("/api/v1/api-keys", {"name": bad})
        assert r.status == 400 and r.json["code"] == "invalid_name", bad
    assert server.get("/api/v1/me").status == 200


def test_oversize_body_is_413_before_reading(make_server):
    s = make_server(env={"QAG_MAX_BODY_BYTES": "1000"})
    r = s.request("POST", "/execute_sql", raw=b"{" + b" " * 5000 + b"}", headers={"Content-Type": "application/json"})
    assert r.status == 413 and r.json["code"] == "payload_too_large"
    # Declared length over the limit with no body sent at all: refused without waiting for it.
    answer = raw_http(s, b"POST /execute_sql HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 999999\r\nX-API-Key: " + s.admin_key.encode() + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413")
    assert s.post("/execute_sql", {"sql": "SELECT 1 AS v", "connection_name": "lite"}).json == [{"v": 1}]


@pytest.mark.parametrize("path", ["/q/%zz", "/q/%ff%fe", "/q/x?v=%zz", "/q/x?v=%ff", "/q/x?%e9=1"])
def test_bad_url_encoding(server, echo, path):
    r = server.get(path.replace("/q/x", q(echo)) if path.startswith("/q/x") else path)
    assert r.status == 400 and r.json["code"] == "invalid_request", r
    _good(server, echo)


def test_malformed_chunked_body(server, echo):
    request = (f"POST {q(echo)} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Transfer-Encoding: chunked\r\nX-API-Key: {server.admin_key}\r\n\r\nzz\r\n{{}}\r\n0\r\n\r\n").encode()
    answer = raw_http(server, request)
    assert answer == b"" or answer.split(b" ", 2)[1].startswith(b"4"), answer[:200]
    _good(server, echo)


def test_chunked_body_is_read(server, echo):
    body = b'{"params": {"v": 8}}'
    request = (f"POST {q(echo)} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               f"Transfer-Encoding: chunked\r\nX-API-Key: {server.admin_key}\r\n\r\n").encode()
    request += hex(len(body))[2:].encode() + b"\r\n" + body + b"\r\n0\r\n\r\n"
    answer = raw_http(server, request)
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'[{"v":8}]\n')


@pytest.mark.parametrize("raw,code", [
    (b'{"format": ["json"]}', "invalid_format"), (b'{"format": {}}', "invalid_format"),
    (b'{"timeout": ' + b"9" * 400 + b"}", "invalid_timeout"), (b'{"timeout": true}', "invalid_timeout"),
    (b'{"connection_name": "\\ud800"}', "invalid_body"), (b'{"params": {"v": "\\udfff"}}', "invalid_body"),
])
def test_type_confusion_in_run_arguments(server, echo, raw, code):
    r = server.request("POST", q(echo), raw=raw, headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == code, r
    _good(server, echo)


def test_huge_version_and_page_numbers(server, echo):
    for path, status, code in [(q(echo) + "?version=-99999999999999999999", 404, "version_not_found"),
                               (q(echo) + "?version=99999999999999999999", 404, "version_not_found"),
                               (q(echo) + "?v=1&page=99999999999999999999", 400, "invalid_paging"),
                               # contract 3.3/5.3: a version that doesn't exist, however large its number
                               (f"/api/v1/queries/{echo}/versions/{'9' * 30}", 404, "version_not_found"),
                               (f"/api/v1/queries/{echo}/versions/{'9' * 30}/flow", 404, "version_not_found"),
                               (f"/api/v1/queries/{echo}/versions/{'9' * 101}", 404, "not_found")]:
        r = server.get(path)
        assert r.status == status and r.json["code"] == code, (path, r)
    for method, body in (("DELETE", None), ("PATCH", {"cache_ttl": 5})):
        r = server.request(method, f"/api/v1/queries/{echo}/versions/{'9' * 25}", body=body)
        assert r.status == 404 and r.json["code"] == "version_not_found", (method, r)
    _good(server, echo)


def test_unwindowed_statement_with_a_far_page_stays_bounded(server):
    # "lock" as an alias keeps the window out of the SQL: rows before the page are discarded in chunks.
    sql = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x AS lock FROM c"
    r = server.post("/execute_sql?page=2000000&page_size=1000&timeout=1", {"sql": sql, "connection_name": "lite"})
    assert r.status == 504 and r.json["code"] == "query_timeout"


def test_management_refuses_surrogates_nul_and_non_json(server, uniq):
    r = server.request("POST", "/api/v1/queries", headers={"Content-Type": "application/json"},
                       raw=b'{"name": "x", "description": "\\ud800", "sql": "SELECT 1"}')
    assert r.status == 400 and r.json["code"] == "invalid_body"
    # the same surrogate encoded in the bytes (CESU-8), and a body in UTF-16: JSON is UTF-8, read strictly
    for raw in (b'{"name": "x", "description": "\xed\xa0\x80", "sql": "SELECT 1"}',
                '{"name": "x", "description": "d", "sql": "SELECT 1"}'.encode("utf-16")):
        for path in ("/api/v1/queries", "/api/v1/api-keys", "/api/v1/roles", "/api/v1/connections"):
            r = server.request("POST", path, headers={"Content-Type": "application/json"}, raw=raw)
            assert r.status == 400 and r.json["code"] == "invalid_body", (path, raw, r)
    r = server.request("POST", "/api/v1/api-keys", headers={"Content-Type": "application/json"},
                       raw=b'\xef\xbb\xbf{"name": "' + uniq("bom").encode() + b'"}')
    assert r.status == 201, r          # a UTF-8 byte order mark is still UTF-8
    r = server.post("/api/v1/connections", {"name": uniq("c"), "db": "sqlite", "database": "a\u0000b"})
    assert r.status == 400 and r.json["code"] == "invalid_body"
    r = server.request("POST", "/api/v1/api-keys", raw=b'{"name": "x"}', headers={"Content-Type": "text/plain"})
    assert r.status == 400 and r.json["code"] == "invalid_body"
    assert server.get("/api/v1/me").status == 200


def test_what_a_management_body_stores_fits_64_bits(server, uniq, echo):
    """An integer wider than 64 bits in a stored definition (a parameter's default or bounds, a port, an option)
    made every later call that read the row fail with a 500: refused when it is saved."""
    wide = 2 ** 64
    bodies = [
        ("/api/v1/queries", {"name": uniq("w"), "connection_name": "lite", "sql": "SELECT :a AS a",
                             "parameters": {"a": {"default": wide}}}),
        ("/api/v1/queries", {"name": uniq("w"), "connection_name": "lite", "sql": "SELECT :a AS a",
                             "parameters": {"a": {"enum": [1, wide]}}}),
        ("/api/v1/queries", {"name": uniq("w"), "connection_name": "lite", "sql": "SELECT :a AS a",
                             "parameters": {"a": {"type": "str", "min_length": wide}}}),
        ("/api/v1/queries", {"name": uniq("w"), "connection_name": "lite", "sql": "SELECT :a AS a",
                             "parameters": {"a": {"min": -(2 ** 70)}}}),
        ("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "port": wide}),
        ("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "port": -1}),
        ("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "port": 65536}),
        ("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "options": {"x": [1, {"y": -wide}]}}),
        ("/api/v1/api-keys", {"name": uniq("k"), "rate_limit": "99999999999999999999999999999/second"}),
    ]
    for path, body in bodies:
        r = server.post(path, body)
        assert r.status == 400 and r.json["code"] == "invalid_body", (path, body, r)
    # what fits is stored and runs: the widest 64-bit default, a port, the widest published rate limit
    name = uniq("w")
    server.query(name, "SELECT :a AS a", "lite", parameters={"a": {"type": "int", "default": 2 ** 63 - 1}})
    assert server.get(q(name)).json == [{"a": 2 ** 63 - 1}]
    assert server.post("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "port": 3306}).status == 201
    made = server.post("/api/v1/connections", {"name": uniq("c"), "db": "mysql", "host": "h", "port": 3306.0})
    assert made.status == 201 and made.json["port"] == 3306, made      # JSON Schema's integer: 3306.0 is 3306
    key = server.key(uniq("k"), connections="*", rate_limit="999999999999999999/second")
    assert server.get(q(echo) + "?v=1", key=key).json == [{"v": 1}]
    # a cache_ttl of any size is allowed (contract 7.1) and kept ten years at most, never a 500
    assert server.request("PATCH", f"/api/v1/queries/{echo}/versions/1", body={"cache_ttl": 2 ** 62}).status == 200
    assert [server.get(q(echo) + "?v=3").headers.get("x-cache") for _ in range(2)] == ["MISS", "HIT"]
    _good(server, echo)


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity"])
def test_non_json_numbers_are_refused_wherever_a_body_is_read(server, uniq, echo, constant):
    """NaN and the infinities are not JSON: taken, a connection's options kept them and every later read of it
    sent them back as bare words no strict client can parse."""
    bodies = [
        ("/api/v1/connections", b'{"name": "%s", "db": "sqlite", "database": "x.db", "options": {"x": %s}}'
         % (uniq("c").encode(), constant)),
        ("/api/v1/connections", b'{"name": "%s", "db": "sqlite", "database": "x.db", "x": %s}'
         % (uniq("c").encode(), constant)),
        ("/api/v1/api-keys", b'{"name": "%s", "max_rows": %s}' % (uniq("k").encode(), constant)),
        (q(echo), b'{"params": {"v": %s}}' % constant),
        ("/execute_sql", b'{"connection_name": "lite", "sql": "SELECT :v AS v", "params": {"v": %s}}' % constant),
    ]
    for path, raw in bodies:
        r = server.request("POST", path, raw=raw, headers={"Content-Type": "application/json"})
        assert r.status == 400 and r.json["code"] == "invalid_body", (path, r)
    r = server.request("POST", "/mcp", raw=b'{"jsonrpc": "2.0", "id": %s, "method": "ping"}' % constant,
                       headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["error"]["data"]["code"] == "parse_error", r
    assert not [c for c in server.get("/api/v1/connections").json if "NaN" in str(c) or "Infinity" in str(c)]
    _good(server, echo)


def test_names_no_url_can_reach_are_refused(server, uniq):
    """A connection named like a literal route under /api/v1/connections/ (GET .../deleted lists deleted ones),
    and a key or role named "." or ".." (clients resolve those segments away), could be made but not read."""
    for word in ("deleted", "test", "databases"):
        r = server.post("/api/v1/connections", {"name": word, "db": "sqlite", "database": "x.db"})
        assert r.status == 400 and r.json["code"] == "invalid_name", (word, r)
    for path in ("/api/v1/api-keys", "/api/v1/roles"):
        for name in (".", ".."):
            r = server.post(path, {"name": name, "connections": "*"})
            assert r.status == 400 and r.json["code"] == "invalid_name", (path, name, r)
    # names around them stay valid, and can be read back at their URL
    for name in (uniq("deleted"), uniq("test") + ".db"):
        assert server.post("/api/v1/connections", {"name": name, "db": "sqlite", "database": "x.db"}).status == 201
        assert server.get(f"/api/v1/connections/{name}").json["name"] == name
    made = server.post("/api/v1/api-keys", {"name": "...", "connections": "*"})
    assert made.status == 201 and server.get("/api/v1/api-keys/...").json["name"] == "..."


def test_stream_file_name_of_a_unicode_query(server):
    server.query("日本 q", "SELECT 1 AS v", "lite")
    r = server.get(q("日本 q") + "?stream=true&format=csv")
    assert r.status == 200 and r.body == b"v\r\n1\r\n"
    assert r.headers["content-disposition"] == \
        "attachment; filename=\"__ q.csv\"; filename*=UTF-8''%E6%97%A5%E6%9C%AC%20q.csv"


def test_open_mode_refuses_cross_origin_and_foreign_host(make_server):
    s = make_server(admin_key=None, seed=False)
    r = s.request("POST", "/api/v1/api-keys", body={"name": "x"}, key=None, headers={"Origin": "https://evil.example"})
    assert r.status == 403 and r.json["code"] == "open_access_remote"
    r = s.get("/api/v1/connections", key=None, headers={"Host": "attacker.example:5000"})
    assert r.status == 403 and r.json["code"] == "open_access_remote"
    assert s.get("/api/v1/connections", key=None, headers={"Host": "localhost:5000"}).status == 200
    assert s.get("/api/v1/api-keys", key=None).json == {"items": []}


def test_open_mode_with_cors_for_every_origin_still_refuses_pages_it_does_not_name(make_server):
    # QAG_CORS_ORIGINS=* let every page read answers; on a server without keys it let any page the local user
    # visits drive it (make keys, run SQL). Only origins the setting names may, there.
    s = make_server(admin_key=None, seed=False, env={"QAG_CORS_ORIGINS": "*, https://tool.example"})
    for origin in ("https://evil.example", "null", "http://localhost:1234"):
        r = s.request("POST", "/api/v1/api-keys", body={"name": "x"}, key=None, headers={"Origin": origin})
        assert r.status == 403 and r.json["code"] == "open_access_remote", (origin, r)
        r = s.get("/api/v1/connections", key=None, headers={"Origin": origin})
        assert r.status == 403 and r.json["code"] == "open_access_remote", (origin, r)
    assert s.get("/api/v1/api-keys", key=None).json == {"items": []}       # nothing was made
    r = s.get("/api/v1/connections", key=None, headers={"Origin": "https://TOOL.example/"})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == "*"


def test_open_mode_refuses_what_another_sites_page_makes_without_an_origin(make_server):
    """A page's <img src>, <script src> or link GET (no-cors) carries no Origin: on a server without keys, one
    another site's page made (Sec-Fetch-Site cross-site or same-site) is refused, writes above all; the browser's
    own navigation and same-origin requests, and clients that send no Sec-Fetch-Site, are served."""
    s = make_server(admin_key=None, env={"QAG_ALLOW_WRITES": "1"})
    s.query("drop_note", "INSERT INTO notes (body) VALUES ('driven')", "lite")
    for site in ("cross-site", "same-site", "Cross-Site"):
        r = s.get(q("drop_note"), key=None, headers={"Sec-Fetch-Site": site, "Sec-Fetch-Mode": "no-cors",
                                                     "Sec-Fetch-Dest": "image", "Referer": "http://evil.example/"})
        assert (r.status, r.json["code"]) == (403, "open_access_remote"), (site, r)
    assert s.get("/api/v1/connections", key=None, headers={"Sec-Fetch-Site": "cross-site"}).status == 403
    for site in ("same-origin", "none", None):
        headers = {} if site is None else {"Sec-Fetch-Site": site}
        assert s.get("/api/v1/connections", key=None, headers=headers).status == 200, site
    import os
    import sqlite3
    driven = sqlite3.connect(os.path.join(s.home, "lite.db")).execute("SELECT count(*) FROM notes WHERE body = 'driven'")
    assert driven.fetchone()[0] == 0
    assert s.post(q("drop_note"), key=None).status == 200     # a local client's call still writes


def test_store_is_owner_only(server):
    import os
    import stat
    if server.database_url:
        pytest.skip("the SQLite store's file mode; this server's store is on PostgreSQL")
    assert stat.S_IMODE(os.stat(os.path.join(server.home, "qag.db")).st_mode) == 0o600
