"""Summed counters on a host of four workers never go back: scrapes answered by every worker in turn, under
load, and across a worker killed with SIGKILL (counts it published stay; the master's replacement adds on)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from tests.integration.test_observability import metric
from tests.server import Server, q

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
