"""Run history and the event log (contract 8.1-8.4, 8.7) through the gateway in-process, on both stores (SQLite
and PostgreSQL): what is recorded, the read API's filters, paging and errors, retention, sampling, the ad-hoc SQL
policy, and the bytes a run costs."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time

import pytest

from tests.server import store_sql

from qag.app import create_app
from qag.settings import load
from qag.testing import Client

ADMIN = "unit-admin-key-0123456789"


class App:
    """A gateway on a fresh home with one SQLite connection `lite` (table t, 25 rows); calls through WSGI."""

    def __init__(self, home: str, store_env: dict | None = None, **env: str):
        data = os.path.join(home, "lite.db")
        conn = sqlite3.connect(data)
        conn.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT);"
                           "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25) "
                           "INSERT INTO t SELECT i, 'row ' || i FROM n;")
        conn.commit()
        conn.close()
        self.store_env = store_env or {}
        self.gateway = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN, **self.store_env, **env}))
        self.store_path = os.path.join(home, "qag.db")
        assert self.call("POST", "/api/v1/connections", {"name": "lite", "db": "sqlite", "database": "lite.db"})[0] == 201

    def call(self, method: str, path: str, body=None, query: str = "", key: str | None = ADMIN,
             headers: dict | None = None):
        reply = Client(gateway=self.gateway).request(method, path, body, query=query, key=key, headers=headers)
        raw, hdrs = reply.body, reply.headers
        return reply.status, hdrs, (reply.json if raw and hdrs.get("content-type") == "application/json" else raw)

    def query(self, name: str, sql: str = "SELECT id, name FROM t WHERE id <= :n", **extra):
        status, _, body = self.call("POST", "/api/v1/queries", {"name": name, "description": "d", "sql": sql,
                                                                 "connection_name": "lite", "publish": True, **extra})
        assert status == 201, body

    def run(self, name: str, query: str = "n=3", **kw):
        return self.call("GET", f"/q/{name}", query=query, **kw)

    def history(self, query: str = "", path: str = "/api/v1/history"):
        return self.call("GET", path, query=query)

    def db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.store_path)

    def sql(self, statement: str, args: tuple = ()) -> list:
        """A statement on the store's own database (SQLite file or PostgreSQL), outside the gateway."""
        return store_sql(self.store_path, self.store_env.get("QAG_DATABASE_URL"), statement, args)

    def stored_rid(self, rid: str):
        """A request id as the store keeps it: 6 bytes for 12 hex digits on SQLite, text on PostgreSQL."""
        if "QAG_DATABASE_URL" not in self.store_env and re.fullmatch(r"[0-9a-f]{12}", rid):
            return bytes.fromhex(rid)
        return rid


@pytest.fixture
def app(tmp_path, store_env):
    a = App(str(tmp_path), store_env)
    yield a
    a.gateway.close()


def test_saved_run_entry_has_the_contract_fields_in_order(app):
    app.query("films")
    status, headers, _ = app.run("films", headers={"X-Request-Id": "my-req.1"})
    assert status == 200
    status, _, body = app.history()
    assert status == 200 and body["next_cursor"] is None
    (item,) = body["items"]
    assert list(item) == ["query", "version", "kind", "executed_at", "connection_name", "request_id", "key_name",
                          "transport", "status", "rows", "duration_ms", "serialization_ms"]
    assert (item["query"], item["version"], item["kind"], item["connection_name"], item["request_id"],
            item["key_name"], item["transport"], item["status"], item["rows"]) == \
        ("films", 1, "saved", "lite", "my-req.1", "admin", "rest", "success", 3)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", item["executed_at"])
    assert isinstance(item["duration_ms"], int) and isinstance(item["serialization_ms"], float)


def test_b3_23_generated_request_id_and_scoped_key_name(app):
    app.query("films")
    _, _, key = app.call("POST", "/api/v1/api-keys", {"name": "partner"})
    status, headers, _ = app.run("films", key=key["secret"])
    assert status == 200
    item = app.history()[2]["items"][0]
    assert item["request_id"] == headers["x-request-id"] and item["key_name"] == "partner"


def test_b8_7_adhoc_entry_keeps_parameter_names_never_values(app):
    status, _, _ = app.call("POST", "/execute_sql", {"sql": "SELECT :code AS c", "connection_name": "lite",
                                                     "params": {"code": "s3"}})
    assert status == 200
    (item,) = app.history("kind=adhoc")[2]["items"]
    assert (item["kind"], item["query"], item["version"], item["sql"], item["params"]) == \
        ("adhoc", None, None, "SELECT :code AS c", ["code"])
    assert "s3" not in json.dumps(item)
    assert list(item)[-2:] == ["sql", "params"]


def test_serialization_ms_is_for_saved_queries_only(app):
    """Contract 8.1 and QueryAPIGate 0.43 (probed): an ad-hoc run's entry and event have no serialization_ms."""
    app.query("films")
    assert app.call("POST", "/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"})[0] == 200
    assert app.run("films")[0] == 200
    saved, adhoc = app.history()[2]["items"]
    assert "serialization_ms" in saved and "serialization_ms" not in adhoc
    assert list(adhoc) == ["query", "version", "kind", "executed_at", "connection_name", "request_id", "key_name",
                           "transport", "status", "rows", "duration_ms", "sql", "params"]
    from qag.observe.history import event
    events = [event(row)["entry"] for row in app.gateway.store.events(0, 10)]
    assert ["serialization_ms" in e for e in events] == [False, True]


@pytest.mark.parametrize("mode", ["hash", "none"])
def test_b8_8_adhoc_sql_hash_or_none(tmp_path, store_env, mode):
    a = App(str(tmp_path), store_env, QAG_HISTORY_ADHOC_SQL=mode)
    try:
        a.call("POST", "/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"})
        (item,) = a.history()[2]["items"]
        assert "sql" not in item
        if mode == "hash":
            assert re.fullmatch(r"[0-9a-f]{64}", item["sql_sha256"])
        else:
            assert "sql_sha256" not in item
    finally:
        a.gateway.close()


def test_b8_9_long_adhoc_statement_is_cut_at_4000(app):
    sql = "SELECT 1 AS one" + " " * 4990
    assert app.call("POST", "/execute_sql", {"sql": sql, "connection_name": "lite"})[0] == 200
    (item,) = app.history()[2]["items"]
    assert len(item["sql"]) == 4000 and item["sql_truncated"] is True


def test_b8_10_failed_runs_keep_their_code_and_refusals_before_the_database_are_not_runs(app):
    app.query("films")
    _, _, key = app.call("POST", "/api/v1/api-keys", {"name": "tables", "allowed_tables": ["t"]})
    assert app.call("POST", "/execute_sql", {"sql": "SHOW TABLES", "connection_name": "lite"},
                    key=key["secret"])[0] == 403
    assert app.call("POST", "/execute_sql", {"sql": "SELECT nope FROM t", "connection_name": "lite"})[0] == 500
    assert app.call("POST", "/execute_sql", {"sql": "DELETE FROM t", "connection_name": "lite"})[0] == 403
    # Refused before the database step: parameters, paging, format, unknown query, no key: not runs.
    assert app.run("films", "n=3&page=0")[0] == 400
    assert app.run("films", "n=3&format=toml")[0] == 400
    assert app.run("nope")[0] == 404
    assert app.run("films", key=None)[0] == 401
    items = app.history()[2]["items"]
    assert [(i["status"], i["code"]) for i in items] == [("error", "read_only"), ("error", "query_failed"),
                                                         ("error", "table_check_failed")]
    assert all(i["error"] and "rows" not in i for i in items)
    assert app.history("status=error")[2]["items"] == items


def test_a_page_refused_for_its_connection_is_an_error_run_a_stream_is_not(app):
    """Contract 10.1 step 1 and QueryAPIGate 0.43 (probed): a run whose connection is inactive is recorded as a
    failed run (history and event log) naming the connection; a stream refused there leaves nothing; neither counts
    against a quota. A connection that doesn't exist is not recorded: its name is the caller's own text, which
    history would intern for good (a 1 MB name a request grew the store by 3 MB: found by an attacker's look)."""
    app.query("films")
    assert app.call("POST", "/api/v1/connections", {"name": "off", "db": "sqlite", "database": "lite.db",
                                                    "active": False})[0] == 201
    _, _, key = app.call("POST", "/api/v1/api-keys", {"name": "partner", "quota": {"calls": 1, "per": "day"}})
    secret = key["secret"]
    status, headers, body = app.run("films", "n=3&connection_name=nosuch", key=secret,
                                    headers={"X-Request-Id": "missing"})
    assert (status, body["code"], headers["x-quota-remaining-calls"]) == (404, "connection_not_found", "1")
    assert app.run("films", "n=3&connection_name=off", key=secret, headers={"X-Request-Id": "inactive"})[0] == 403
    assert app.call("POST", "/execute_sql", {"sql": "SELECT :b, :a", "connection_name": "nosuch", "database": "x",
                                             "params": {"b": 1, "a": 2}}, headers={"X-Request-Id": "adhoc"})[0] == 404
    assert app.run("films", "n=3&connection_name=nosuch&stream=true&format=csv")[0] == 404
    assert app.call("POST", "/execute_sql", {"sql": "SELECT 1", "connection_name": "off"},
                    query="stream=true&format=csv")[0] == 403
    items = app.history()[2]["items"]
    assert app.call("POST", "/execute_sql", {"sql": "SELECT :b, :a", "connection_name": "off", "database": "x",
                                             "params": {"b": 1, "a": 2}}, headers={"X-Request-Id": "adhoc"})[0] == 403
    assert app.call("POST", "/execute_sql", {"sql": "SELECT 1", "connection_name": "off", "database": "d" * 65},
                    headers={"X-Request-Id": "long"})[0] == 403
    items = app.history()[2]["items"]
    assert [(i["request_id"], i["kind"], i["query"], i["version"], i["connection_name"], i["status"], i["code"])
            for i in items] == [("long", "adhoc", None, None, "off", "error", "connection_inactive"),
                                ("adhoc", "adhoc", None, None, "off", "error", "connection_inactive"),
                                ("inactive", "saved", "films", 1, "off", "error", "connection_inactive")]
    long, adhoc, inactive = items
    assert list(inactive) == ["query", "version", "kind", "executed_at", "connection_name", "request_id", "key_name",
                              "transport", "status", "error", "code"]
    assert inactive["key_name"] == "partner" and "'off' is currently not active" in inactive["error"]
    assert (adhoc["database"], adhoc["sql"], adhoc["params"], adhoc["key_name"]) == ("x", "SELECT :b, :a",
                                                                                       ["a", "b"], "admin")
    assert "database" not in long    # no database name could be that long: not kept
    from qag.observe.history import event
    events = [event(row) for row in app.gateway.store.events(0, 10)]
    assert [(e["connection_name"], e["entry"]["code"]) for e in events] == [("off", "connection_inactive")] * 3
    store = app.gateway.store.name_ids.__self__      # the store itself, past the metadata cache's wrapper
    assert store._ids_of(["nosuch", "off"]).keys() == {"off"}     # the made-up name was never interned
    # The refusals were not counted: the key's one call a day is still there.
    status, headers, _ = app.run("films", key=secret)
    assert (status, headers["x-quota-remaining-calls"]) == (200, "0")


def test_b8_1_query_history_pages_with_a_cursor(app):
    app.query("q1")
    for _ in range(3):
        app.run("q1")
    status, _, page = app.history("limit=2", "/api/v1/queries/q1/history")
    assert status == 200 and len(page["items"]) == 2 and all(i["query"] == "q1" for i in page["items"])
    assert page["next_cursor"]
    _, _, rest = app.history(f"limit=2&cursor={page['next_cursor']}", "/api/v1/queries/q1/history")
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None
    assert app.history("", "/api/v1/queries/missing/history")[0] == 404


def test_b8_2_every_run_exactly_once_newest_first(app):
    app.query("a")
    app.query("b")
    ids = []
    for i in range(5):
        ids.append(app.run("a" if i % 2 else "b", headers={"X-Request-Id": f"r{i}"})[1]["x-request-id"])
    seen, cursor = [], None
    while True:
        _, _, page = app.history("limit=2" + (f"&cursor={cursor}" if cursor else ""))
        seen += [i["request_id"] for i in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]


def test_b8_3_filters(app):
    app.query("q")
    app.query("other")
    _, _, key = app.call("POST", "/api/v1/api-keys", {"name": "partner"})
    app.run("q", headers={"X-Request-Id": "old"})
    app.run("q", key=key["secret"], headers={"X-Request-Id": "partner-ok"})
    app.call("POST", "/api/v1/queries/q/versions", {"description": "v2", "sql": "SELECT nope FROM t",
                                                    "connection_name": "lite", "publish": True})
    app.run("q", headers={"X-Request-Id": "v2-error"})
    app.run("other", headers={"X-Request-Id": "other"})
    app.gateway.observe.history.writer.flush()
    moments = {"old": "2026-02-01 00:01:00", "partner-ok": "2026-02-01 00:03:00", "v2-error": "2026-02-02 00:00:00",
               "other": "2026-02-03 12:00:00"}
    for rid, text in moments.items():
        at = int(time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S")))
        app.sql("UPDATE runs SET at = ? WHERE rid = ?", (at, app.stored_rid(rid)))

    def ids(query):
        status, _, body = app.history(query)
        assert status == 200, body
        return [i["request_id"] for i in body["items"]]

    assert ids("") == ["other", "v2-error", "partner-ok", "old"]
    assert ids("status=error") == ["v2-error"]
    assert ids("key=partner&status=success") == ["partner-ok"]
    assert ids("query=other") == ["other"]
    assert ids("query=q&version=1") == ["partner-ok", "old"]
    assert ids("since=2026-02-02") == ["other", "v2-error"]
    assert ids("until=2026-02-01%2000:03:00") == ["old"]
    assert ids("since=2026-02-01T00:01:00&until=2026-02-02") == ["partner-ok", "old"]
    assert ids("kind=adhoc") == []
    assert [i["executed_at"] for i in app.history("query=other")[2]["items"]] == ["2026-02-03 12:00:00"]


@pytest.mark.parametrize("query,code", [("status=failed", "invalid_filter"), ("since=2026-13-01", "invalid_filter"),
                                        ("until=yesterday", "invalid_filter"), ("limit=0", "invalid_filter"),
                                        ("limit=1001", "invalid_filter"), ("limit=ten", "invalid_filter"),
                                        ("cursor=not-a-cursor", "invalid_filter"), ("kind=other", "invalid_filter"),
                                        ("version=one", "invalid_request")])
def test_b8_4_bad_filters(app, query, code):
    status, _, body = app.history(query)
    assert (status, body["code"]) == (400, code)


@pytest.mark.parametrize("name", ["status", "kind", "limit", "since", "until", "cursor", "version", "key", "query"])
def test_an_empty_filter_is_no_filter(app, name):
    """Contract 8.3 and QueryAPIGate 0.43 (probed): `?status=` and the like are absent, on both routes."""
    app.query("films")
    app.run("films")
    app.call("POST", "/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"})
    for path, count in (("/api/v1/history", 2), ("/api/v1/queries/films/history", 1)):
        status, _, body = app.history(f"{name}=", path)
        assert status == 200, body
        assert (len(body["items"]), body["next_cursor"]) == (count, None)


def test_history_is_for_administrators(app):
    _, _, key = app.call("POST", "/api/v1/api-keys", {"name": "k"})
    assert app.history()[0] == 200
    assert app.call("GET", "/api/v1/history", key=key["secret"])[0] == 403
    assert app.call("GET", "/api/v1/history", key=None)[0] == 401


def test_b8_5_newest_50_kept_per_version_and_older_runs_stay_events(app):
    app.query("busy")
    for i in range(55):
        app.run("busy", headers={"X-Request-Id": f"run-{i}"})
    _, _, body = app.history("limit=1000", "/api/v1/queries/busy/history")
    assert [i["request_id"] for i in body["items"]] == [f"run-{i}" for i in range(54, 4, -1)]
    events = app.gateway.store.events(0, 1000)
    assert len(events) == 55  # every run is an event for QAG_EVENTS_RETENTION_HOURS


def test_adhoc_limit_and_events_swept_after_retention(tmp_path, store_env):
    a = App(str(tmp_path), store_env, QAG_HISTORY_ADHOC_LIMIT="3")
    try:
        for i in range(5):
            a.call("POST", "/execute_sql", {"sql": f"SELECT {i} AS i", "connection_name": "lite"})
        assert [i["sql"] for i in a.history()[2]["items"]] == ["SELECT 4 AS i", "SELECT 3 AS i", "SELECT 2 AS i"]
        a.sql("UPDATE runs SET at = at - 25 * 3600")
        a.gateway.observe.history.prune()
        assert a.sql("SELECT count(*) FROM runs")[0][0] == 3  # history stays; events went
        assert len(a.history()[2]["items"]) == 3
    finally:
        a.gateway.close()


def test_b8_6_sampling_keeps_every_failure(tmp_path, store_env):
    a = App(str(tmp_path), store_env, QAG_HISTORY_SAMPLE_RATE="0.01")
    try:
        a.query("s")
        for _ in range(40):
            a.run("s")
            a.call("POST", "/execute_sql", {"sql": "SELECT nope", "connection_name": "lite"})
        items = a.history("limit=1000")[2]["items"]
        assert sum(i["status"] == "error" for i in items) == 40
        assert sum(i["status"] == "success" for i in items) < 20
        assert len(a.gateway.store.events(0, 1000)) == 80
    finally:
        a.gateway.close()


def test_deleting_a_version_or_query_deletes_its_history(app):
    app.query("gone")
    app.run("gone")
    app.call("POST", "/api/v1/queries/gone/versions", {"description": "v2", "sql": "SELECT 2 AS two",
                                                       "connection_name": "lite", "publish": True})
    app.run("gone", "")
    assert len(app.history("query=gone")[2]["items"]) == 2
    assert app.call("DELETE", "/api/v1/queries/gone/versions/1")[0] == 200
    assert [i["version"] for i in app.history("query=gone")[2]["items"]] == [2]
    assert app.call("DELETE", "/api/v1/queries/gone")[0] == 204
    assert app.history("query=gone")[2]["items"] == []
    app.query("gone")  # a new query of the same name starts with no history
    assert app.history("", "/api/v1/queries/gone/history")[2]["items"] == []


def test_run_of_a_version_deleted_before_the_write_is_an_event_only(app):
    app.query("fleeting")
    writer = app.gateway.observe.history.writer
    writer.interval = 3600  # keep the run queued
    app.run("fleeting")
    app.sql("DELETE FROM query_versions WHERE query_name = 'fleeting'")
    writer.flush()
    assert app.history()[2]["items"] == []
    assert len(app.gateway.store.events(0, 10)) == 1


def test_summaries_show_run_count_and_last_used_at(app):
    app.query("counted")
    _, _, detail = app.call("GET", "/api/v1/queries/counted")
    assert detail["last_used_at"] is None and detail["versions"][0]["run_count"] == 0
    for _ in range(3):
        app.run("counted")
    _, _, detail = app.call("GET", "/api/v1/queries/counted")
    assert detail["versions"][0]["run_count"] == 3
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", detail["last_used_at"])
    _, _, listing = app.call("GET", "/api/v1/queries")
    assert listing["items"][0]["last_used_at"] == detail["last_used_at"]


def test_stream_runs_are_recorded_with_rows_sent(app):
    app.query("all", "SELECT id FROM t")
    status, _, body = app.run("all", "stream=true&format=csv")
    assert status == 200 and body.count(b"\r\n") == 26
    (item,) = app.history()[2]["items"]
    assert (item["status"], item["rows"]) == ("success", 25) and "duration_ms" not in item


def test_event_payload(app):
    app.query("ev")
    app.run("ev")
    app.gateway.observe.history.writer.flush()
    from qag.observe.history import event
    (row,) = app.gateway.store.events(0, 10)
    e = event(row)
    assert list(e) == ["type", "source", "occurred_at", "kind", "query", "version", "connection_name", "entry"]
    assert (e["type"], e["source"], e["kind"], e["query"], e["version"]) == ("query.run", "rest", "saved", "ev", 1)
    assert e["entry"]["status"] == "success" and "query" not in e["entry"]


def test_bytes_per_run_on_disk_stay_small(tmp_path):
    """The compact layout: a saved-query run costs well under 300 bytes in the SQLite store (table and indexes)."""
    app = App(str(tmp_path))
    app.query("small")
    with app.db() as db:
        db.execute("VACUUM")
    before = os.path.getsize(app.store_path)
    calls = 2000
    for i in range(calls):
        app.run("small", f"n={i % 5}")
    app.gateway.observe.history.writer.flush()
    with app.db() as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == calls
    per_call = (os.path.getsize(app.store_path) - before) / calls
    app.gateway.close()
    assert per_call < 300, per_call


def test_b3_23_open_mode_runs_are_recorded_as_dash(tmp_path):
    home = str(tmp_path)
    conn = sqlite3.connect(os.path.join(home, "lite.db"))
    conn.execute("CREATE TABLE t (id INTEGER)")
    conn.commit()
    conn.close()
    a = App.__new__(App)
    a.gateway = create_app(load({"QAG_HOME": home}))
    a.store_path = os.path.join(home, "qag.db")
    try:
        assert a.call("POST", "/api/v1/connections", {"name": "lite", "db": "sqlite", "database": "lite.db"},
                      key=None)[0] == 201
        assert a.call("POST", "/execute_sql", {"sql": "SELECT 1", "connection_name": "lite"}, key=None,
                      headers={"X-Request-Id": "open-1"})[0] == 200
        (item,) = a.call("GET", "/api/v1/history", key=None)[2]["items"]
        assert (item["key_name"], item["request_id"]) == ("-", "open-1")
    finally:
        a.gateway.close()


def test_a_store_of_the_previous_schema_is_upgraded_in_place(tmp_path):
    from qag.store.schema import MIGRATIONS, SCHEMA_VERSION
    from qag.store.sqlite import SqliteStore
    path = tmp_path / "qag.db"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO meta VALUES ('kept', 'yes')")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    store = SqliteStore(str(tmp_path))
    assert store.get_meta("kept") == "yes" and store.history({}, None, 10) == []
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert "trace" in [column[1] for column in conn.execute("PRAGMA table_info(runs)")]   # step 5: trace ids
    assert conn.execute("SELECT count(*) FROM applied_writes").fetchone()[0] == 0   # step 6: batch ids
    conn.close()
    assert store.quota_usage_in([("day", "2026-01-01")]) == []   # step 3: quota counts


def test_runs_written_before_the_completion_order_keep_their_order_after_the_upgrade(tmp_path):
    """Step 4 gives every run already stored its start second as its completion sequence: they read back in
    the order they had (start second, then id), and after a run written since, which completed later."""
    from qag.store.schema import MIGRATIONS
    from qag.store.sqlite import SqliteStore
    path = tmp_path / "qag.db"
    conn = sqlite3.connect(path)
    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute("INSERT INTO names (id, name) VALUES (1, 'c'), (2, 'k')")
    for at in (1_700_000_002, 1_700_000_001, 1_700_000_002):
        conn.execute("INSERT INTO runs (at, h, c, k, ok) VALUES (?, 1, 1, 2, 1)", (at,))
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    store = SqliteStore(str(tmp_path))
    assert [(r["id"], r["seq"]) for r in store.history({}, None, 10)] == [
        (3, 1_700_000_002_000_000_000), (1, 1_700_000_002_000_000_000), (2, 1_700_000_001_000_000_000)]


def test_request_ids_packed_exactly_when_twelve_lowercase_hex_digits():
    """History keeps a request id as 6 bytes exactly when it is 12 lowercase hex digits (the regex it replaced)."""
    from qag.observe.history import _packed_id
    samples = ["0123456789ab", "abcdefabcdef", "000000000000", "0123456789AB", "0123456789aB", "0123 4567 89",
               "01234567 89a", " 0123456789a", "0123456789a ", "0123456789ag", "0123456789a\n", "０123456789ab",
               "my-req.1abcd", "0x0123456789", "+123456789ab", "0123456789abc", "0123456789a", ""]
    for rid in samples:
        expected = bytes.fromhex(rid) if re.fullmatch(r"[0-9a-f]{12}", rid) else rid
        assert _packed_id(rid) == expected, rid


def _in_store_transaction(store) -> bool:
    """Whether this thread is inside one of the store's own transactions (both stores count them per thread)."""
    return bool(getattr(store._local, "depth", 0))


def test_the_history_writer_pauses_for_request_threads_outside_the_store_transaction(app, monkeypatch):
    """A batch of 200 runs: the writer lets request threads in (qag.observe.events.pause) every 64 records while it
    prepares them, its own rows and then the store's values, never inside the store's transaction; every run is
    written as without pauses."""
    from qag.observe import history as history_module
    app.query("paced")
    history = app.gateway.observe.history
    writer = history.writer
    with writer._flush_lock:          # the writer thread can't write these meanwhile: taken off its queue below
        for _ in range(200):
            assert app.run("paced")[0] == 200
        batch = list(writer._queue)
        writer._queue.clear()
    assert len(batch) == 200
    pauses: list[bool] = []
    store = history.store.inner       # under the metadata cache's views
    monkeypatch.setattr(history_module, "pause", lambda: pauses.append(_in_store_transaction(store)))
    before = app.sql("SELECT count(*) FROM runs")[0][0]
    history._write(batch, "b1")
    # History._write's rows at records 64, 128 and 192, then the store's values at the same rows.
    assert pauses == [False] * 6
    assert app.sql("SELECT count(*) FROM runs")[0][0] == before + 200
    assert app.sql("SELECT count(*) FROM runs WHERE h = 1")[0][0] == 50     # trimmed as ever (contract 8.5)
