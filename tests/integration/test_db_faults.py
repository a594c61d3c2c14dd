"""A database that goes away mid-call (restart, network cut) on MySQL/MariaDB and PostgreSQL.

The relay between qag and the server breaks every connection at once, as a restart does for its clients:
calls in flight fail with a clear code, the worker keeps running, and later calls succeed on new connections —
no dead pooled connection is handed out.
"""

from __future__ import annotations

import threading
import time

import pytest

from qag.testing import Relay
from tests.server import q

pytestmark = pytest.mark.e2e

SLEEP = {"mysql": "SELECT SLEEP(3) AS s", "postgres": "SELECT pg_sleep(3) AS s"}


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_connections_broken_mid_call_then_service_recovers(request, server, uniq, db):
    fields = dict(request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db"))
    with Relay(fields["host"], int(fields["port"]), 0.0) as relay:
        name, slow, fast = uniq("via"), uniq("slow"), uniq("fast")
        server.post("/api/v1/connections", {"name": name, "db": db, **fields, "host": "127.0.0.1",
                                            "port": relay.port})
        server.query(slow, SLEEP[db], name)
        server.query(fast, "SELECT 1 AS v", name)
        # Warm the pool of both workers so idle connections exist when the cut comes.
        for _ in range(6):
            assert server.get(q(fast)).json == [{"v": 1}]
        replies = []
        callers = [threading.Thread(target=lambda: replies.append(server.get(q(slow) + "?timeout=10")))
                   for _ in range(2)]
        for t in callers:
            t.start()
        time.sleep(1.0)   # both slow calls are now waiting on the server (they take 3 s)
        relay.cut()
        for t in callers:
            t.join(20)
        assert len(replies) == 2
        for r in replies:
            # Either a clear 502 without the password, or (a call that can't write, interrupted on a pooled
            # connection, runs again once on a fresh one) the right answer: never a 500, never a hang.
            if r.status == 502:
                assert r.json["code"] == "connection_failed" and fields["password"] not in r.body.decode()
            else:
                assert r.status == 200 and r.json[0]["s"] in ("", 0), r
        # Later calls succeed at once: idle connections broken by the cut are never handed out.
        for _ in range(6):
            r = server.get(q(fast))
            assert r.status == 200 and r.json == [{"v": 1}], r
