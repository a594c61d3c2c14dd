"""Contract 9.1 /health, 9.3 /openapi.json and friends, 9.5 the CLI, against real servers and processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qag import __version__
from tests.server import check_demo, q

pytestmark = pytest.mark.e2e


def qag_cli(*args, env=None, home=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    full.update(env or {})
    if home:
        full["QAG_HOME"] = home
    return subprocess.run([sys.executable, "-m", "qag", *args], env=full, capture_output=True, text=True, timeout=60)


def test_b9_1_health_public(server):
    r = server.get("/health", key=None)
    assert r.status == 200 and r.json["status"] == "ok" and r.json["version"] == __version__
    assert set(r.json) == {"status", "version", "time_zone", "utc_offset"}
    assert server.get("/docs", key=None).status == 200
    spec = server.get("/openapi.json", key=None).json
    # Issue 22.4 (docs/compatibility.md): an anonymous caller's document lists what it may call, the public routes.
    assert spec["openapi"].startswith("3.1") and "/health" in spec["paths"] and "/q/{name}" not in spec["paths"]
    assert "/q/{name}" in server.get("/openapi.json").json["paths"]
    assert server.get("/api/v1/connections", key=None).status == 401


def test_b9_2_root_favicon_unknown(server):
    r = server.get("/", key=None)
    assert r.status == 302 and r.headers["location"].endswith("/docs")
    assert server.get("/favicon.ico", key=None).status == 204
    # Contract 0.1 and 9.3: /ui is public and redirects to the Console (qag has none: /console/ is a 404), for a right
    # key, a wrong one and none alike, as QueryAPIGate 0.43 (probed); a path under it is no route.
    for key in (None, "wrong", "admin"):
        for method in ("GET", "HEAD"):
            r = server.request(method, "/ui", key=key)
            assert r.status == 301 and r.headers["location"] == "/console/", (key, method, r)
    assert server.request("POST", "/ui", key=None).status == 401 and server.request("POST", "/ui").status == 405
    assert server.get("/ui/x", key=None).status == 401 and server.get("/ui/x").status == 404
    r = server.get("/definitely/not/here")
    assert r.status == 404 and "error" in r.json


def test_b9_9_headers_on_docs_and_keys(server, uniq):
    docs = server.get("/docs", key=None)
    assert docs.headers["x-content-type-options"] == "nosniff"
    assert "script-src 'self';" in docs.headers["content-security-policy"]   # the page's own (api/docs), not the API's
    assert server.post("/api/v1/api-keys", {"name": uniq("k")}).headers["cache-control"] == "no-store"


def test_b6_5_openapi_lists_only_reachable_queries(server, uniq):
    mine, other = uniq("mine"), uniq("other")
    server.query(mine, "SELECT :id AS id", "lite", parameters={"id": {"type": "int", "min": 1}})
    server.query(other, "SELECT 1", "lite")
    key = server.key(uniq("k"), connections=[], queries=[mine])
    paths = server.get("/openapi.json", key=key).json["paths"]
    assert q(mine) in paths and q(other) not in paths
    param = next(p for p in paths[q(mine)]["get"]["parameters"] if p["name"] == "id")
    assert param["schema"]["type"] == "integer" and param["schema"]["minimum"] == 1
    assert "SELECT" not in json.dumps(paths[q(mine)])
    anonymous = server.get("/openapi.json", key=None).json["paths"]
    assert not any(p.startswith("/q/") for p in anonymous)
    assert q(other) in server.get("/openapi.json").json["paths"]


def test_cli_version_reports_speedups():
    r = qag_cli("version")
    assert r.returncode == 0 and r.stdout.startswith(f"qag {__version__}") and "rowjson=" in r.stdout


def test_b9_5_invalid_settings_exit_2_with_one_line(tmp_path):
    for env, needle in [({"QAG_THREADS": "eight"}, "QAG_THREADS"), ({"QUERYAPIGATE_THREADS": "0"}, "QUERYAPIGATE_THREADS"),
                        ({"QAG_ACCESS_LOG": "maybe"}, "QAG_ACCESS_LOG"), ({"QAG_SPEEDUPS": "fast"}, "QAG_SPEEDUPS")]:
        r = qag_cli("serve", env=env, home=str(tmp_path))
        assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_b9_8_leftover_sql2api_variable_refused():
    r = qag_cli("version", env={"SQL2API_API_KEY": "super-secret-value"})
    assert r.returncode == 2 and "SQL2API_API_KEY -> QUERYAPIGATE_API_KEY" in r.stderr
    assert "super-secret-value" not in r.stderr


def test_admin_key_file_form(tmp_path):
    keyfile = tmp_path / "key"
    keyfile.write_text("from-a-file\n")
    r = qag_cli("version", env={"QAG_API_KEY_FILE": str(keyfile), "QAG_API_KEY": "x"})
    assert r.returncode == 2 and "more than once" in r.stderr
    keyfile.write_text("")
    r = qag_cli("version", env={"QAG_API_KEY_FILE": str(keyfile)})
    assert r.returncode == 2 and "empty" in r.stderr


def test_admin_key_file_serves(make_server, tmp_path):
    keyfile = tmp_path / "key"
    keyfile.write_text("key-from-file\r\n")
    s = make_server(admin_key=None, seed=False, env={"QAG_API_KEY_FILE": str(keyfile)})
    assert s.get("/api/v1/me", key="key-from-file").status == 200
    assert s.get("/api/v1/me", key=None).status == 401


def test_cli_admin_commands(tmp_path):
    home = str(tmp_path)
    import sqlite3
    sqlite3.connect(os.path.join(home, "data.db")).executescript("CREATE TABLE t (id INTEGER); INSERT INTO t VALUES (1);")
    assert qag_cli("init", home=home).returncode == 0
    assert qag_cli("connections", "add", "data", "--db", "sqlite", "--database", "data.db", home=home).returncode == 0
    r = qag_cli("queries", "add", "one", "--sql", "SELECT id FROM t WHERE id = :id", "--description", "d",
                "--connection", "data", "--parameters", '{"id": "int"}', "--publish", home=home)
    assert r.returncode == 0, r.stderr
    r = qag_cli("keys", "add", "partner", "--queries", "one", "--connections", "", home=home)
    assert r.returncode == 0 and r.stdout.strip().startswith("sk_")
    secret = r.stdout.strip()
    assert qag_cli("keys", "list", home=home).stdout.split() == ["partner"]
    shown = qag_cli("keys", "show", "partner", home=home)
    assert secret not in shown.stdout and json.loads(shown.stdout)["queries"] == ["one"]
    bad = qag_cli("queries", "add", "two", "--sql", "SELECT 1", "--description", "d", "--parameters",
                  '{"nope": "int"}', home=home)
    assert bad.returncode == 1 and "nope" in bad.stderr
    assert qag_cli("connections", "remove", "data", "--reason", "done", home=home).returncode == 0
    assert "data" not in qag_cli("connections", "list", home=home).stdout.split()
    assert qag_cli("keys", "remove", "ghost", home=home).returncode == 1


def test_cli_help_everywhere():
    for args in (["--help"], ["serve", "--help"], ["demo", "--help"], ["keys", "add", "--help"]):
        r = qag_cli(*args)
        assert r.returncode == 0 and "usage: qag" in r.stdout


def test_demo_serves_and_printed_curl_lines_work(tmp_path):
    """`qag demo` prepares its home, prints keys and curl lines, and those lines return rows."""
    check_demo([sys.executable, "-m", "qag"], str(tmp_path / "demo"))


def test_init_seeds_inactive_templates_once(tmp_path):
    home = str(tmp_path)
    assert qag_cli("init", home=home).returncode == 0
    names = qag_cli("connections", "list", "--home", home).stdout.split()
    assert names == ["example-mysql", "example-postgres", "example-sqlite"]
    shown = json.loads(qag_cli("connections", "show", "example-postgres", "--home", home).stdout)
    assert shown["active"] is False and shown["password"] == "${POSTGRES_PASSWORD}"
    again = qag_cli("init", home=home)
    assert again.returncode == 0 and "left untouched" in again.stderr


def test_serve_host_and_port_flags_and_aliases():
    from qag.settings import load
    assert load({"QUERYAPIGATE_HOST": "0.0.0.0", "QUERYAPIGATE_PORT": "5002"}).bind == "0.0.0.0:5002"
    assert load({"QUERYAPIGATE_PORT": "5002", "QAG_BIND": "127.0.0.1:7000"}).bind == "127.0.0.1:7000"
    r = qag_cli("serve", "--host", "127.0.0.1", "--port", "notaport")
    assert r.returncode == 2 and "--port" in r.stderr
    for command in ("serve", "events"):      # out of range: one line, never bind()'s traceback
        for port in ("99999", "65536", "-1"):
            r = qag_cli(command, "--port", port)
            assert r.returncode == 2 and "a port is from 0 to 65535" in r.stderr and "Traceback" not in r.stderr, r


def test_qag_size_through_the_cli():
    r = qag_cli("size", "--rate", "500", "--query-ms", "2", "--cpu-us", "800")
    assert r.returncode == 0 and "QAG_WORKERS=" in r.stdout and "waiting-bound" in r.stdout
    assert qag_cli("size", "--rate", "-1", "--query-ms", "2", "--cpu-us", "800").returncode != 0
