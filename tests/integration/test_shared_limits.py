"""Rate limits, max_concurrent and quotas shared through Redis by two instances (two gunicorn masters with two
workers each, one store), and a Redis that stops mid-test (a relay in front of the shared Redis is cut: the real
server is never stopped): calls go on, counted by the host's workers together in the host table, the fallback
metric counts, and shared counting resumes by itself."""

from __future__ import annotations

import http.client
import os
import time

import pytest

from tests.integration.test_observability import metric
from qag.testing import Relay
from tests.server import Server, q
from tests.services import redis_url

pytestmark = pytest.mark.e2e

_SEED = ("CREATE TABLE t (id INTEGER PRIMARY KEY); "
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 30) INSERT INTO t SELECT i FROM n;")
# A server-wide limit no other test uses, so its Redis buckets (keyed by limit and address) are this module's.
_CLIENT_LIMIT = 50 + os.getpid() % 40


@pytest.fixture(scope="module")
def pair():
    """Two instances on one store (QAG_HOME) and one Redis: an API key created once exists for both."""
    env = {"QAG_REDIS_URL": redis_url(), "QAG_RATE_LIMIT": f"{_CLIENT_LIMIT}/minute", "QAG_TRUST_PROXY": "1"}
    a = Server(env=env, workers=2)
    b = Server(env={**env, "QAG_HOME": a.home}, workers=2)
    a.sqlite_db("lite.db", _SEED)
    a.connection("lite", "lite.db")
    a.query("ids", "SELECT id FROM t ORDER BY id", "lite")
    a.query("big", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) "
                   "SELECT i, 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' AS pad FROM n", "lite")
    yield a, b
    b.close()
    a.close()


def _address(uniq) -> dict:
    n = int(uniq("").split("_")[-1])
    return {"X-Forwarded-For": f"10.{os.getpid() % 250}.{n // 250 % 250}.{n % 250 + 1}"}


def test_client_rate_limit_is_shared_by_instances(pair, uniq):
    a, b = pair
    client = _address(uniq)
    seen = [(a if i % 2 else b).get("/api/v1/connections", headers=client) for i in range(_CLIENT_LIMIT)]
    assert [r.headers["x-ratelimit-remaining"] for r in seen] == [str(n) for n in range(_CLIENT_LIMIT - 1, -1, -1)]
    for s in (a, b):
        r = s.get("/api/v1/connections", headers=client)
        assert r.status == 429 and r.json["code"] == "rate_limited" and 1 <= r.json["retry_after"] <= 2


def test_key_rate_limit_and_quota_are_shared_by_instances(pair, uniq):
    a, b = pair
    key = a.key(uniq("shared"), rate_limit="5/day", quota={"calls": 4, "per": "day"})
    replies = [(a if i % 2 else b).get(q("ids"), key=key) for i in range(5)]
    assert [r.headers["x-ratelimit-key-remaining"] for r in replies] == ["4", "3", "2", "1", "0"]
    assert [r.status for r in replies] == [200, 200, 200, 200, 429]
    assert [r.headers["x-quota-remaining-calls"] for r in replies] == ["3", "2", "1", "0", "0"]
    assert replies[4].json["code"] == "quota_exceeded"
    r = b.get(q("ids"), key=key)
    assert r.json["code"] == "rate_limited" and r.headers["x-quota-remaining-calls"] == "0"  # headers on any reply


def test_max_concurrent_is_shared_by_instances(pair, uniq):
    a, b = pair
    key = a.key(uniq("mc"), max_concurrent=1)
    conn = http.client.HTTPConnection(a.host, a.port, timeout=30)
    conn.request("GET", q("big") + "?stream=true&format=csv", headers={"X-API-Key": key})
    response = conn.getresponse()
    try:
        assert response.status == 200 and response.read(100)
        r = b.get(q("ids"), key=key)                   # the other instance sees the lease
        assert r.status == 429 and r.json["code"] == "too_many_concurrent" and r.headers["retry-after"] == "1"
        assert a.get(q("ids"), key=key).status == 429
    finally:
        conn.close()
    deadline = time.monotonic() + 10
    while b.get(q("ids"), key=key).status != 200:
        assert time.monotonic() < deadline, "the slot was never given back"
        time.sleep(0.05)


def _fallbacks(s: Server) -> float:
    return metric(s.get("/metrics").body.decode(), "queryapigate_rate_limit_fallbacks_total") or 0


def test_redis_stops_and_comes_back(uniq):
    upstream = redis_url().split("//", 1)[1].split("/", 1)[0]
    host, port = upstream.rsplit(":", 1)
    with Relay(host, int(port)) as relay:
        s = Server(env={"QAG_REDIS_URL": f"redis://127.0.0.1:{relay.port}/0"}, workers=2)
        try:
            s.sqlite_db("lite.db", _SEED)
            s.connection("lite", "lite.db")
            s.query("ids", "SELECT id FROM t ORDER BY id", "lite")
            key = s.key(uniq("down"), rate_limit="50/day", quota={"calls": 40, "per": "day"})

            def call():
                r = s.get(q("ids"), key=key)
                assert r.status == 200, r
                return int(r.headers["x-ratelimit-key-remaining"]), int(r.headers["x-quota-remaining-calls"])

            assert [call() for _ in range(3)] == [(49, 39), (48, 38), (47, 37)]   # shared: one count
            assert _fallbacks(s) == 0
            time.sleep(1.5)                            # both workers have written their counts to the store
            relay.down()
            during = [call() for _ in range(6)]        # calls still succeed, both workers counting together
            # The host table's bucket starts full when Redis first fails (50 - 1 left), then one count for the
            # host whichever worker answers.
            assert [d[0] for d in during] == [49, 48, 47, 46, 45, 44]
            # Quotas: the host counter is seeded from the store (the 3 calls were written), then exact.
            assert [d[1] for d in during] == [36, 35, 34, 33, 32, 31]
            # Each worker's share reaches /metrics through its snapshot (at most 0.25 s old, later under load):
            # wait until two scrapes in a row, answered by either worker, count every fallback.
            deadline, seen = time.monotonic() + 10, []
            while not (len(seen) >= 2 and min(seen[-2:]) >= 6) and time.monotonic() < deadline:
                seen.append(_fallbacks(s))
                time.sleep(0.1)
            assert min(seen[-2:]) >= 6, seen
            relay.up()
            time.sleep(5.5)                            # each worker retries Redis 5 s after it failed
            after = [call() for _ in range(4)]
            # Shared again: Redis's bucket goes on from where it was (the outage's calls never reached it); its
            # quota counter took the outage's 6 calls once Redis answered (each worker sends what it counted).
            assert [d[0] for d in after] == [46, 45, 44, 43]
            assert [d[1] for d in after] == [30, 29, 28, 27]
            assert any("Redis failed" in line for line in s.log)
        finally:
            s.close()
