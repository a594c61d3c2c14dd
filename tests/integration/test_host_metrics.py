"""Summed counters on a host of four workers never go back: scrapes answered by every worker in turn, under
load, and across a worker killed with SIGKILL (counts it published stay; the master's replacement adds on). The
management API's usage counters ride on the same snapshots: every worker shows the instance's, across a reload."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.integration.test_observability import metric
from tests.server import Server, q, wait_for

pytestmark = pytest.mark.e2e

_LINE = 'queryapigate_requests_total{method="GET",endpoint="api.run_named_query",status="200",key="admin"}'


def test_scrapes_never_decrease_under_load_and_across_a_killed_worker(uniq):
    s = Server(workers=4, threads=4, env={"QAG_ACCESS_LOG": "on"})
    stop = threading.Event()
    try:
        s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1);")
        s.connection("lite", "lite.db")
        name = uniq("count")
        s.query(name, "SELECT id FROM t", "lite")
        served = []

        def load():
            while not stop.is_set():
                try:
                    if s.get(q(name)).status == 200:
                        served.append(1)
                except OSError:
                    pass   # the call the killed worker held: no answer

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        seen, scrapes = [], []
        for i in range(120):
            if i == 60:
                victim = s.worker_of(scrapes[-1])
                os.kill(victim, signal.SIGKILL)
            reply = s.get("/metrics", key=None)
            assert reply.status == 200
            scrapes.append(reply)
            seen.append(metric(reply.body.decode(), _LINE) or 0)
        stop.set()
        for t in threads:
            t.join()
        drops = [(i, a, b) for i, (a, b) in enumerate(zip(seen, seen[1:])) if b < a]
        assert not drops, f"the counter went back: {drops[:5]}"
        assert seen[-1] > seen[0] and len(s.workers_of(scrapes)) >= 3
    finally:
        stop.set()
        s.close()


def test_usage_of_a_key_and_its_connection_is_the_instances_whichever_worker_answers(uniq):
    """GET /api/v1/api-keys/<name> and /connections/<name> count every worker's runs: once the workers' snapshots
    are published (a quarter second), every read shows the same figures, and a reload's retired workers keep theirs."""
    workers = 3
    s = Server(workers=workers, threads=4, env={"QAG_ACCESS_LOG": "on"})
    try:
        s.sqlite_db("counted.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2);")
        s.connection("counted", "counted.db")
        ok, failing = uniq("ok"), uniq("fails")
        s.query(ok, "SELECT id FROM t", "counted")
        s.query(failing, "SELECT abs(-9223372036854775807 - 1) AS n", "counted")   # SQLite: integer overflow
        key_name = uniq("k")
        key = s.key(key_name)
        kept = s.connections_per_worker(workers, "/api/v1/connections")   # no run: nothing counted yet
        calls = errors = 0
        for conn in kept.values():   # every worker runs some of the calls...
            for _ in range(4):
                assert conn.get(q(ok), key=key).status == 200
                calls += 1
            assert conn.get(q(failing), key=key).status == 500
            calls += 1
            errors += 1
        for _ in range(12):          # ...and calls on new connections land on whichever worker the kernel picks
            assert s.get(q(ok), key=key, headers={"Connection": "close"}).status == 200
            calls += 1
        want_key = {"queries": calls, "errors": errors, "rows": 2 * (calls - errors)}
        key_path, conn_path = f"/api/v1/api-keys/{key_name}", "/api/v1/connections/counted"

        def every_worker_shows_every_call():
            by_key = [conn.get(key_path).json["usage"] for conn in kept.values()]
            by_connection = [conn.get(conn_path).json["usage"] for conn in kept.values()]
            settled = all(u == want_key for u in by_key) and all(u == by_connection[0] for u in by_connection)
            return by_connection[0] if settled and by_connection[0]["queries"] == calls else None

        want_connection = wait_for(every_worker_shows_every_call, "each worker to show every worker's calls")
        assert want_connection["errors"] == errors and want_connection["rows"] == 2 * (calls - errors)
        assert want_connection["avg_duration_ms"] > 0
        # Settled: consecutive reads on new connections, answered by whichever worker, all show the same.
        fresh = {"Connection": "close"}
        assert [s.get(key_path, headers=fresh).json["usage"] for _ in range(10)] == [want_key] * 10
        assert [s.get(conn_path, headers=fresh).json["usage"] for _ in range(10)] == [want_connection] * 10
        listed = s.get("/api/v1/api-keys").json["items"]
        assert [k["usage"] for k in listed if k["name"] == key_name] == [want_key]

        # A reload replaces every worker: the master folds each one's counts into retired.m as it goes.
        for conn in kept.values():
            conn.close()
        booted = sum("Booting worker" in line for line in s.log)
        s.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: sum("Booting worker" in line for line in s.log) >= booted + workers, "new workers")
        wait_for(lambda: sum("Worker exiting" in line for line in s.log) >= workers, "old workers to exit")
        for _ in range(6):
            assert s.get(key_path, headers=fresh).json["usage"] == want_key
            after = s.get(conn_path, headers=fresh).json["usage"]
            assert {k: v for k, v in after.items() if k != "avg_duration_ms"} == \
                {k: v for k, v in want_connection.items() if k != "avg_duration_ms"}
            assert after["avg_duration_ms"] == pytest.approx(want_connection["avg_duration_ms"], abs=0.002)
    finally:
        s.close()
