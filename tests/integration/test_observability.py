"""Run history, events, metrics, logs, health and Server-Timing against real gunicorn servers (several workers):
totals across workers, the bearer token, nothing lost on SIGTERM or reload, a slow store costing drops (counted
exactly) rather than latency, readiness, and log lines."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.server import ServerExited, q, wait_for

pytestmark = pytest.mark.e2e

TOKEN = "metrics-token-0123456789abcdef01"


def metric(text: str, line_start: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    return None



def store_rows(server) -> list[tuple]:
    return server.store_sql("SELECT rid, h FROM runs")


def test_metrics_totals_equal_the_calls_made_across_4_workers(make_server, uniq):
    s = make_server(workers=4, threads=4)
    name = uniq("m")
    s.query(name, "SELECT id FROM t WHERE id <= 3", "lite")
    calls = 400

    def call(i):
        r = s.get(q(name))
        assert r.status == 200, r
        return r

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(calls)))
        # The kernel decides which worker accepts a connection; keep calling until a scrape shows that more than
        # one worker has counted something, so the totals below really are summed across workers.
        for _ in range(20):
            if (metric(s.get("/metrics").body.decode(), "qag_workers") or 0) >= 2:
                break
            list(pool.map(call, range(100)))
            calls += 100
    run_line = ('queryapigate_requests_total{method="GET",endpoint="api.run_named_query",status="200",key="admin"}')
    query_line = 'queryapigate_queries_total{connection="lite",dialect="sqlite",status="success",key="admin"}'

    def settled():
        text = s.get("/metrics").body.decode()
        return text if metric(text, run_line) == calls and metric(text, query_line) == calls else None

    text = wait_for(settled, "metrics to reach the number of calls")
    assert metric(text, 'queryapigate_request_duration_seconds_count{method="GET",endpoint="api.run_named_query"}') \
        == calls
    assert metric(text, 'queryapigate_rows_returned_total{connection="lite",dialect="sqlite",key="admin"}') == 3 * calls
    assert metric(text, "qag_workers") >= 2  # figures came from more than the worker answering
    # Whichever worker answers, the totals are the same - once every worker's latest snapshot is written (other
    # workers' figures may lag by one snapshot interval, 0.25 s).
    wait_for(lambda: all(metric(s.get("/metrics").body.decode(), run_line) == calls for _ in range(8)) or None,
             "every worker to report the same totals")


def test_b9_3_metrics_token(make_server, uniq):
    s = make_server(env={"QAG_METRICS_TOKEN": TOKEN})
    scoped = s.key(uniq("k"))
    for headers, key in [({}, None), ({}, scoped), ({"Authorization": "Bearer wrong"}, None),
                         ({"Authorization": f"Basic {TOKEN}"}, None)]:
        r = s.get("/metrics", key=key, headers=headers)
        assert r.status == 401 and r.headers["www-authenticate"] == 'Bearer realm="metrics"', r
        assert r.json["code"] == "unauthorized" and "QUERYAPIGATE_METRICS_TOKEN" in r.json["error"]
        assert b"queryapigate_requests_total" not in r.body
    for headers, key in [({"Authorization": f"Bearer {TOKEN}"}, None), ({"Authorization": f"bearer {TOKEN}"}, None),
                         ({}, "admin")]:
        r = s.get("/metrics", key=key, headers=headers)
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")


def test_b9_3_short_metrics_token_stops_startup(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update({"QUERYAPIGATE_METRICS_TOKEN": "too-short", "QAG_HOME": str(tmp_path)})
    r = subprocess.run([sys.executable, "-m", "qag", "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "at least 16 characters" in r.stderr and "too-short" not in r.stderr


def test_b9_4_execute_sql_by_admin_is_counted(server):
    assert server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "lite"}).status == 200
    line = 'queryapigate_requests_total{method="POST",endpoint="api.execute_sql_endpoint",status="200",key="admin"}'
    wait_for(lambda: (metric(server.get("/metrics", key=None).body.decode(), line) or 0) >= 1, "the counted call")


# Contract 9.2: dashboards key on QueryAPIGate 0.43's route names (probed), which qag's own names differed from here.
_ROUTE_NAMES = [("GET", "/api/v1/connections/deleted", "v1.deleted_connections"),
                ("POST", "/api/v1/connections/databases", "v1.connection_databases"),
                ("POST", "/api/v1/queries/obs_nope/versions", "v1.add_version"),
                ("GET", "/api/v1/queries/obs_nope/versions/1", "v1.get_version"),
                ("PATCH", "/api/v1/queries/obs_nope/versions/1", "v1.update_version"),
                ("DELETE", "/api/v1/queries/obs_nope/versions/1", "v1.delete_version"),
                ("GET", "/api/v1/queries/obs_nope/versions/1/flow", "v1.version_flow"),
                ("POST", "/api/v1/queries/obs_nope/publish", "v1.publish"),
                ("POST", "/api/v1/queries/obs_nope/unpublish", "v1.unpublish"),
                ("DELETE", "/api/v1/cache/entries/obs_nope", "v1.delete_cache_entry"),
                ("GET", "/api/v1/history", "v1.search_history")]


def test_9_2_endpoint_labels_are_queryapigates_route_names(server):
    for method, path, _ in _ROUTE_NAMES:
        server.request(method, path, body={} if method in ("POST", "PATCH") else None)

    def labelled():
        text = server.get("/metrics").body.decode()
        missing = [(m, name) for m, _, name in _ROUTE_NAMES
                   if f'queryapigate_requests_total{{method="{m}",endpoint="{name}",' not in text]
        return None if missing else text

    text = wait_for(labelled, "a requests_total line per route, by QueryAPIGate's route name")
    assert "v1.list_deleted_connections" not in text and "v1.list_history" not in text


def test_every_answered_call_is_recorded_across_sigterm(make_server, uniq, store_env):
    s = make_server(workers=3, threads=4, env={"QAG_HISTORY_FLUSH_INTERVAL": "60", "QAG_HISTORY_LIMIT": "100000",
                                               **store_env})
    name = uniq("steady")
    s.query(name, "SELECT id FROM t WHERE id <= 2", "lite")
    answered: list[str] = []
    stop = threading.Event()
    counter = iter(range(10 ** 9))

    def load():
        while not stop.is_set():
            rid = f"sig-{next(counter)}"
            try:
                r = s.get(q(name), headers={"X-Request-Id": rid})
            except ServerExited:
                return    # the server has gone after its SIGTERM: no more calls to make
            except OSError:
                continue  # the listener is closing: this call got no answer
            if r.status == 200:
                answered.append(rid)

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: len(answered) >= 150, "steady load")
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(60) == 0
    stop.set()
    for t in threads:
        t.join()
    rows = {(rid.decode() if isinstance(rid, bytes) else rid): h for rid, h in store_rows(s)}
    missing = [rid for rid in answered if rid not in rows]
    assert not missing, f"{len(missing)} of {len(answered)} answered calls have no event"
    assert all(rows[rid] == 1 for rid in answered)  # and each one its history entry


def test_reload_keeps_history_and_metric_totals(make_server, uniq):
    s = make_server(workers=2, threads=4, env={"QAG_HISTORY_FLUSH_INTERVAL": "60"})
    name = uniq("reload")
    s.query(name, "SELECT 1 AS one", "lite")
    for i in range(20):
        assert s.get(q(name), headers={"X-Request-Id": f"before-{i}"}).status == 200
    line = 'queryapigate_queries_total{connection="lite",dialect="sqlite",status="success",key="admin"}'
    wait_for(lambda: metric(s.get("/metrics").body.decode(), line) == 20, "the calls counted")
    booted = sum("Booting worker" in line for line in s.log)
    s.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: sum("Booting worker" in line for line in s.log) >= booted + 2, "new workers")
    wait_for(lambda: sum("Worker exiting" in line for line in s.log) >= 2, "old workers to exit")
    history = s.get(f"/api/v1/queries/{name}/history", params={"limit": 100}).json["items"]
    assert sorted(i["request_id"] for i in history) == sorted(f"before-{i}" for i in range(20))
    assert metric(s.get("/metrics").body.decode(), line) == 20  # retired workers' counts are kept


class _StoreLock:
    """Holds the store so no run can be written: SQLite's write lock, or PostgreSQL's lock on the runs table."""

    def __init__(self, server):
        if server.database_url is None:
            self.conn = sqlite3.connect(os.path.join(server.home, "qag.db"), isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            import psycopg2
            self.conn = psycopg2.connect(server.database_url)
            self.conn.cursor().execute("LOCK TABLE runs IN EXCLUSIVE MODE")  # reads go on, writes wait

    def release(self):
        self.conn.commit() if self.conn.__class__.__module__.startswith("psycopg2") else self.conn.execute("COMMIT")
        self.conn.close()


def test_a_slow_store_costs_dropped_runs_never_the_calls(make_server, uniq, store_env):
    s = make_server(workers=1, threads=4, env={"QAG_HISTORY_BUFFER": "20", "QAG_HISTORY_FLUSH_INTERVAL": "0.1",
                                               **store_env})
    name = uniq("slow")
    s.query(name, "SELECT 1 AS one", "lite")
    lock = _StoreLock(s)  # every run write now waits (and the writer's busy/lock timeout is 5 s)
    held = time.monotonic()
    calls = 120
    try:
        # Every call succeeds while the store can take no write at all (a call that needed one would fail after
        # the 5 s busy timeout): recording never sits in a call's path.
        for i in range(calls):
            assert s.get(q(name), headers={"X-Request-Id": f"locked-{i}"}).status == 200
        wait_for(lambda: time.monotonic() - held > 6, "the writer to hit its busy timeout")
    finally:
        lock.release()
    for i in range(5):
        assert s.get(q(name), headers={"X-Request-Id": f"after-{i}"}).status == 200

    def settled():
        # history_pending counts the queue and the held batch, not a batch the writer is writing, so it reads 0
        # a moment before that batch is in the store: settled once every run is either stored or counted dropped.
        text = s.get("/metrics").body.decode()
        if metric(text, "queryapigate_history_pending") != 0:
            return None
        dropped = metric(text, 'queryapigate_history_runs_total{outcome="dropped"}')
        return (text, dropped) if len(store_rows(s)) + dropped == calls + 5 else None

    text, dropped = wait_for(settled, "every run stored or counted as dropped")
    failed = metric(text, 'queryapigate_history_runs_total{outcome="failed"}')
    assert dropped > 0 and failed == 0
    items = s.get(f"/api/v1/queries/{name}/history", params={"limit": 100}).json["items"]
    assert [i["request_id"] for i in items[:5]] == [f"after-{i}" for i in range(4, -1, -1)]  # recording resumed
    assert any("buffer full" in line for line in s.log)


def test_readyz_on_the_postgresql_store(make_server, pg_store_url):
    s = make_server(seed=False, env={"QAG_DATABASE_URL": pg_store_url})
    r = s.get("/readyz", key=None)
    assert r.status == 200 and r.json["checks"]["store"] == "ok"
    (schema,) = s.store_sql("SELECT current_schema()")[0]
    s.store_sql(f'ALTER SCHEMA "{schema}" RENAME TO "{schema}_moved"')  # the store's tables are gone
    try:
        r = s.get("/readyz", key=None)
        assert r.status == 503 and r.json["code"] == "unavailable" and r.json["failed"] == {"store": "unavailable"}
        admin = s.get("/readyz")                 # an administrator is told what went wrong, never the password
        assert admin.status == 503 and admin.json["failed"]["store"] != "unavailable", admin
        from urllib.parse import unquote, urlsplit
        assert unquote(urlsplit(pg_store_url).password) not in r.body.decode() + admin.body.decode()
        assert s.get("/livez", key=None).status == 200
    finally:
        import psycopg2
        conn = psycopg2.connect(pg_store_url)
        with conn, conn.cursor() as cur:
            cur.execute(f'ALTER SCHEMA "{schema}_moved" RENAME TO "{schema}"')
        conn.close()
    assert s.get("/readyz", key=None).status == 200


def test_livez_and_readyz(make_server):
    # The SQLite store (PostgreSQL: the test above). One worker: /health answering means it has opened the store,
    # so the file moves under a running worker; a second one still booting would open a fresh store at the path.
    s = make_server(seed=False, workers=1, env={"QAG_DATABASE_URL": ""})
    assert s.get("/livez", key=None).json == {"status": "ok"}
    r = s.get("/readyz", key=None)
    assert r.status == 200 and r.json["checks"]["store"] == "ok"
    os.rename(os.path.join(s.home, "qag.db"), os.path.join(s.home, "moved.db"))
    try:
        r = s.get("/readyz", key=None)
        assert r.status == 503 and r.json["code"] == "unavailable" and "store" in r.json["failed"], r
        assert s.get("/livez", key=None).status == 200
    finally:
        os.rename(os.path.join(s.home, "moved.db"), os.path.join(s.home, "qag.db"))


def test_a_worker_started_after_the_store_file_went_stops_the_server(make_server):
    """A worker (re)started after the SQLite store file was moved away fails to boot, and gunicorn stops with a
    line naming the store, rather than that worker serving from a new empty store of its own."""
    s = make_server(seed=False, workers=1, env={"QAG_DATABASE_URL": "", "QAG_ACCESS_LOG": "on"})
    (worker,) = s.answered_by_every_worker("/health", 1)
    store = os.path.join(s.home, "qag.db")
    os.rename(store, store + ".moved")
    try:
        os.kill(worker, signal.SIGKILL)
        assert s.proc.wait(60) != 0
        wait_for(lambda: any("is gone since the server started" in line for line in s.log), "the worker's reason")
        assert not os.path.exists(store)
    finally:
        os.rename(store + ".moved", store)


def test_server_timing_header(make_server, server, uniq):
    s = make_server(env={"QAG_SERVER_TIMING": "1"})
    name = uniq("timed")
    s.query(name, "SELECT :id AS id", "lite")
    r = s.get(q(name), params={"id": 3})
    stages = dict(re.findall(r"(\w+);dur=([\d.]+)", r.headers["server-timing"]))
    assert set(stages) == {"auth", "bind", "policy", "query", "encode"}
    server.query(name, "SELECT 1 AS one", "lite")
    assert "server-timing" not in server.get(q(name)).headers  # off by default


def test_json_log_lines_carry_the_request_id(make_server, uniq):
    s = make_server(env={"QAG_JSON_LOGS": "1", "QAG_LOG_STATEMENTS": "1"})
    name = uniq("logged")
    s.query(name, "SELECT 1 AS one", "lite")
    s.get(q(name), headers={"X-Request-Id": "json-line-1"})

    def found():
        lines = [json.loads(line) for line in list(s.log) if line.startswith("{") and "json-line-1" in line]
        return lines if len(lines) >= 2 else None

    lines = wait_for(found, "the request's log lines")
    messages = [line["message"] for line in lines]
    assert any(m.startswith(f"GET /q/{name} -> 200 in ") for m in messages)
    assert any(m.startswith("Executing on lite (sqlite)") for m in messages)
    assert all(line["key"] == "admin" and line["logger"] == "qag" for line in lines)


def test_access_log_query_setting():
    def fmt(env):
        full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
        full.update(env)
        return subprocess.run([sys.executable, "-c", "import qag.gunicorn_conf as c; print(c.access_log_format)"],
                              env=full, capture_output=True, text=True, timeout=60).stdout
    assert "%(U)s" in fmt({}) and "%(r)s" not in fmt({})
    assert "%(r)s" in fmt({"QUERYAPIGATE_ACCESS_LOG_QUERY": "1"})


def test_history_cursor_beyond_64_bits_is_a_filter_error(make_server):
    import base64
    s = make_server(seed=False)
    for raw in (b"1.9999999999999999999", b"c2.9999999999999999999.1", b"c2.1.9999999999999999999",
                b"1700000000.5"):   # the last: a cursor of the order by start second, before completion order
        cursor = base64.urlsafe_b64encode(raw).decode().rstrip("=")
        r = s.get(f"/api/v1/history?cursor={cursor}")
        assert r.status == 400 and r.json["code"] == "invalid_filter", (raw, r)
