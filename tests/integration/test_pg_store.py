"""Several instances on one PostgreSQL store (two gunicorn masters, different homes), and `qag store copy` from a
SQLite store to PostgreSQL (and back): keys, saved queries, history and events carry over."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import SEED
from tests.server import q, wait_for

pytestmark = pytest.mark.e2e



def qag_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "qag", *args], env=full, capture_output=True, text=True, timeout=120)


def test_two_instances_share_keys_queries_history_and_events(make_server, pg_store_url, uniq):
    env = {"QAG_DATABASE_URL": pg_store_url}
    a = make_server(seed=False, env=env)
    b = make_server(seed=False, env=env)
    assert a.home != b.home
    for s in (a, b):
        s.sqlite_db("lite.db", SEED)  # the data file each instance's relative connection path points at
    a.connection("lite", "lite.db")
    name = uniq("shared")
    a.query(name, "SELECT id FROM t WHERE id <= 2", "lite")
    key_name = uniq("k")
    secret = a.key(key_name, queries=[name])
    # Made on one instance, used on the other (waiting allows for a metadata cache's refresh interval).
    wait_for(lambda: b.get(q(name), key=secret).status == 200, "the key and the query on the other instance")
    assert b.get(q(name), key=secret).json == a.get(q(name), key=secret).json
    # A new version published on b is what a runs.
    r = b.post(f"/api/v1/queries/{name}/versions", {"description": "v2", "sql": "SELECT id FROM t WHERE id <= 5",
                                                    "connection_name": "lite", "publish": True})
    assert r.status == 201, r
    wait_for(lambda: len(a.get(q(name), key=secret).json) == 5, "the version published on b, on a")
    for s, tag in ((a, "from-a"), (b, "from-b")):
        for i in range(3):
            assert s.get(q(name), key=secret, headers={"X-Request-Id": f"{tag}-{i}"}).status == 200
    expected = {f"from-{x}-{i}" for x in "ab" for i in range(3)}

    def both_seen(server):
        items = server.get("/api/v1/history", params={"query": name, "limit": 1000}).json["items"]
        return expected <= {i["request_id"] for i in items}

    # Each instance's writer flushes within QAG_HISTORY_FLUSH_INTERVAL (1 s): both instances read every run.
    wait_for(lambda: both_seen(a) and both_seen(b), "every run in history on both instances")
    rids = {r[0] for r in a.store_sql("SELECT rid FROM runs")}
    assert expected <= rids  # and each is an event
    (version,) = a.store_sql("SELECT max(version) FROM qag_schema")[0]
    from qag.store.schema import SCHEMA_VERSION
    assert version == SCHEMA_VERSION and a.store_sql("SELECT count(*) FROM qag_schema") == [(1,)]
    # Revoked on b: refused on a.
    assert b.request("PATCH", f"/api/v1/api-keys/{key_name}", body={"active": False}).status == 200
    wait_for(lambda: a.get(q(name), key=secret).status == 401, "the revoked key refused on a")


def test_store_copy_sqlite_to_postgresql_and_back(make_server, pg_store_url, uniq, tmp_path):
    source = make_server(env={"QAG_DATABASE_URL": ""})  # SQLite store in its home, connection `lite`
    name = uniq("copied")
    source.query(name, "SELECT id, name FROM t WHERE id <= :n", "lite",
                 parameters={"n": {"type": "integer", "required": True}})
    secret = source.key(uniq("k"), queries=[name])
    for i in range(3):
        assert source.get(q(name), key=secret, params={"n": 2}, headers={"X-Request-Id": f"0123456789a{i}"}).status == 200
    assert source.get(q(name), key=secret, params={"n": 1}, headers={"X-Request-Id": "not-hex"}).status == 200
    expected_rows = source.get(q(name), key=secret, params={"n": 2}).json
    wait_for(lambda: len(source.get("/api/v1/history", params={"query": name}).json["items"]) == 5, "history")
    etag = source.get(f"/api/v1/queries/{name}").headers.get("etag")
    source.stop()

    out = qag_cli("store", "copy", "--to", pg_store_url, env={"QAG_HOME": source.home})
    assert out.returncode == 0, out.stderr
    counts = dict(line.split("\t") for line in out.stdout.splitlines())
    assert int(counts["api_keys"]) == 1 and int(counts["query_versions"]) == 1 and int(counts["runs"]) == 5
    assert int(counts["meta"]) >= 1 and int(counts["audit_log"]) >= 3
    assert "***" in out.stderr and _password(pg_store_url) not in out.stderr + out.stdout

    # Run again: refused, nothing changed, and the same counts are still there.
    again = qag_cli("store", "copy", "--to", pg_store_url, env={"QAG_HOME": source.home})
    assert again.returncode == 1 and "not empty" in again.stderr, again.stderr

    target = make_server(seed=False, env={"QAG_DATABASE_URL": pg_store_url})
    target.sqlite_db("lite.db", SEED)
    assert target.get(q(name), key=secret, params={"n": 2}).json == expected_rows  # same key, same query
    items = target.get("/api/v1/history", params={"query": name}).json["items"]
    assert {i["request_id"] for i in items} >= {"0123456789a0", "0123456789a1", "0123456789a2", "not-hex"}
    assert etag and target.get(f"/api/v1/queries/{name}").headers.get("etag") == etag  # server_secret came along
    # New rows get new ids: the sequences moved past the copied ones.
    assert target.post("/api/v1/api-keys", {"name": uniq("new")}).status == 201
    assert target.store_sql("SELECT count(DISTINCT id) = count(*) FROM audit_log") == [(True,)]
    target.stop()

    # And back into an empty SQLite home: every table equal, row for row, to the PostgreSQL store.
    home = tmp_path / "back"
    back = qag_cli("store", "copy", "--from", pg_store_url, "--to", str(home))
    assert back.returncode == 0, back.stderr
    from qag.settings import load
    from qag.store import open_store
    from qag.store.schema import tables
    pg = open_store(load({"QAG_DATABASE_URL": pg_store_url}))
    lite = open_store(load({"QAG_HOME": str(home)}))
    try:
        for table in tables():
            pg_cols, pg_rows = pg.raw_rows(table)
            lite_cols, lite_rows = lite.raw_rows(table)
            norm = [tuple(v.hex() if isinstance(v, bytes) else v for v in r) for r in lite_rows]
            assert pg_cols == lite_cols and sorted(map(repr, pg_rows)) == sorted(map(repr, norm)), table
    finally:
        pg.close()
        lite.close()


def test_store_copy_refuses_a_missing_source_and_needs_a_target(tmp_path, pg_store_url):
    out = qag_cli("store", "copy", "--from", str(tmp_path / "nowhere"), "--to", pg_store_url)
    assert out.returncode == 1 and "no store at" in out.stderr
    assert not (tmp_path / "nowhere").exists()
    out = qag_cli("store", "copy", env={"QAG_HOME": str(tmp_path)})
    assert out.returncode == 2 and "--to" in out.stderr


def _password(url: str) -> str:
    from urllib.parse import unquote, urlsplit
    return unquote(urlsplit(url).password)


def test_text_with_a_nul_is_refused_by_a_postgresql_store(make_server, pg_store_url, uniq):
    """PostgreSQL text can't hold NUL, and its driver refuses to send one: a name or text with one, from a URL, a
    query string or a body, looked up or stored, was a 500 with a traceback in the log (a scoped key could fill
    the log that way). It is a 400 `invalid_text`, nothing is stored, and the next request is answered."""
    s = make_server(seed=False, env={"QAG_DATABASE_URL": pg_store_url})
    s.sqlite_db("lite.db", SEED)
    s.connection("lite", "lite.db")
    name = uniq("nul")
    s.query(name, "SELECT id FROM t WHERE id <= :n", "lite", parameters={"n": "int"})
    key = s.key(uniq("k"), connections="*")
    refused = [
        s.get(q(name) + "?n=1&connection_name=a%00b", key=key),
        s.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "a\u0000b"}, key=key),
        s.get("/connections/a%00b/schema", key=key),
        s.get("/api/v1/connections/a%00b"),
        s.get("/api/v1/api-keys/a%00b"),
        s.get("/api/v1/roles/a%00b"),
        s.get("/api/v1/queries/a%00b"),
        s.get("/api/v1/history?key=a%00b"),
        s.post("/api/v1/queries", {"name": uniq("d"), "connection_name": "a\u0000b", "sql": "SELECT 1",
                                   "description": "d"}),
    ]
    for r in refused:
        assert r.status == 400 and r.json["code"] == "invalid_text", r
    # Text kept inside a stored JSON document is escaped there, so a description keeps its NUL, as on SQLite.
    described = uniq("d")
    made = s.post("/api/v1/queries", {"name": described, "connection_name": "lite", "sql": "SELECT 1",
                                      "description": "a\u0000b"})
    assert made.status == 201 and s.get(f"/api/v1/queries/{described}").json["description"] == "a\u0000b"
    assert s.get(q(name) + "?n=2", key=key).json == [{"id": 1}, {"id": 2}]
    assert "Traceback" not in "".join(s.log)
