"""Contract 6.6 rate limits and 6.7 max_concurrent against real servers (B6.20, B6.21, B6.23, B9.7).

These run on one worker, the contract's own setting; the same behaviours over 4 workers (one host table, and Redis)
are in test_host_limits.py.
"""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time

import pytest

from tests.server import Server, q, wait_for

pytestmark = pytest.mark.e2e


def _from(address: str) -> dict:
    return {"X-Forwarded-For": address}


@pytest.fixture(scope="module")
def limited():
    """3/minute per address; one trusted proxy hop, so each test can be its own client address."""
    s = Server(env={"QAG_RATE_LIMIT": "3/minute", "QAG_TRUST_PROXY": "1"}, workers=1)
    yield s
    s.close()


@pytest.fixture(scope="module")
def keyed():
    """No server-wide limit; per-key limits and max_concurrent (one worker: slots and buckets are per worker)."""
    s = Server(workers=1)
    s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2), (3);")
    s.connection("lite", "lite.db")
    s.query("small", "SELECT id FROM t ORDER BY id", "lite")
    s.query("big", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) "
                   "SELECT i, 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' AS pad FROM n", "lite")
    s.query("broken", "SELECT no_such_column FROM t", "lite")
    yield s
    s.close()


# --- server-wide, per client address -------------------------------------------------------------------------------

def test_b6_20_three_per_minute(limited):
    client = _from("10.0.0.1")
    for _ in range(5):
        for path in ("/health", "/livez", "/readyz", "/metrics"):
            r = limited.get(path, headers=client)
            assert r.status == 200 and "x-ratelimit-limit" not in r.headers, (path, r)
    seen = []
    for _ in range(3):
        r = limited.get("/api/v1/connections", headers=client)
        assert r.status == 200 and r.headers["x-ratelimit-limit"] == "3"
        seen.append(r.headers["x-ratelimit-remaining"])
    assert seen == ["2", "1", "0"]
    r = limited.get("/api/v1/connections", headers=client)
    assert r.status == 429 and r.json["code"] == "rate_limited" and r.json["error"] == "Rate limit exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 20 and r.json["retry_after"] == int(r.headers["retry-after"])
    assert list(r.json) == ["error", "code", "retry_after", "request_id"]
    assert r.headers["x-ratelimit-limit"] == "3" and r.headers["x-ratelimit-remaining"] == "0"
    assert limited.get("/health", headers=client).status == 200  # never throttled
    # A plain OPTIONS is authenticated, so it can test keys: it is throttled like any other request (only
    # CORS preflights are exempt) - otherwise it would be a way around the limit for key guessing.
    assert limited.request("OPTIONS", "/api/v1/connections", headers=client, key=None).status == 429
    # Another address has its own budget.
    r = limited.get("/api/v1/connections", headers=_from("10.0.0.9"))
    assert r.status == 200 and r.headers["x-ratelimit-remaining"] == "2"


def test_b6_21_limit_comes_before_authentication(limited):
    client = _from("10.0.0.2")
    statuses = [limited.get("/api/v1/connections", key=f"wrong-{i}", headers=client).status for i in range(5)]
    assert statuses == [401, 401, 401, 429, 429]
    r = limited.get("/api/v1/connections", headers=client)  # the right key
    assert r.status == 429 and r.json["code"] == "rate_limited"


def test_the_console_paths_never_rate_limited_never_test_a_key(limited):
    # The contract exempts /console* from the server-wide limit; qag serves no Console, so those paths are 404 for
    # a right key, a wrong one and none alike: else they would be an unthrottled oracle for key guessing.
    client = _from("10.0.0.4")
    for i in range(8):
        for path in ("/console", "/console/", "/console/x"):
            r = limited.get(path, key=f"wrong-{i}", headers=client)
            assert r.status == 404 and r.json["code"] == "not_found" and "x-ratelimit-limit" not in r.headers, r
    for key in ("admin", None):
        assert limited.get("/console/x", key=key, headers=client).status == 404
    assert limited.get("/api/v1/connections", headers=client).status == 200   # the budget was never spent


def test_metrics_is_no_way_around_the_limit_for_guessing_keys():
    """/metrics is exempt from the limit and takes the admin key: its 401 or 200 tested admin keys at any rate.
    A refused credential there spends the address's budget; once it is spent, no credential is looked at."""
    token = "metrics-token-" + "x" * 20
    s = Server(env={"QAG_RATE_LIMIT": "3/minute", "QAG_TRUST_PROXY": "1", "QAG_METRICS_TOKEN": token}, workers=1)
    try:
        scraper, guesser = _from("10.0.1.1"), _from("10.0.1.2")
        bearer = {"Authorization": f"Bearer {token}"}
        for _ in range(6):   # a scraper with its token (or the admin key) spends nothing
            assert s.get("/metrics", key=None, headers={**scraper, **bearer}).status == 200
            assert s.get("/metrics", headers=scraper).status == 200
        statuses = [s.get("/metrics", key=f"wrong-{i}", headers=guesser).status for i in range(5)]
        assert statuses == [401, 401, 401, 429, 429]
        r = s.get("/metrics", headers=guesser)                           # the right admin key: not looked at
        assert r.status == 429 and r.json["code"] == "rate_limited" and int(r.headers["retry-after"]) >= 1
        assert s.get("/metrics", key=None, headers={**guesser, **bearer}).status == 429
        assert s.get("/api/v1/connections", headers=guesser).status == 429   # one budget for the address
        assert s.get("/metrics", key=None, headers={**scraper, **bearer}).status == 200
    finally:
        s.close()


def test_a_forwarded_address_is_one_client_however_the_proxy_spells_it(limited, uniq):
    """Some proxies append the client's source port to X-Forwarded-For: each connection was a fresh budget for key
    guessing (and an allowed_ips key never matched). The address is read as the address it names."""
    spellings = ["203.0.113.77:40001", "203.0.113.77:40002", "[203.0.113.77]:40003", "::ffff:203.0.113.77",
                 "::ffff:cb00:714d", "203.0.113.77"]
    statuses = [limited.get("/api/v1/connections", key=f"wrong-{i}", headers=_from(spelling)).status
                for i, spelling in enumerate(spellings)]
    assert statuses == [401, 401, 401, 429, 429, 429]
    key = limited.key(uniq("ip"), allowed_ips=["198.51.100.0/24", "2001:db8::/32"])
    for spelling in ("198.51.100.7:5555", "[198.51.100.8]", "::ffff:198.51.100.9", "[2001:DB8::1]:443",
                     "2001:db8::2%eth0"):
        r = limited.get("/api/v1/connections", key=key, headers=_from(spelling))   # the key is known: the route's 403
        assert r.status == 403 and r.json["code"] == "admin_only", (spelling, r)
    for spelling in ("198.51.101.7:5555", "unknown", "2001:db9::1"):
        r = limited.get("/api/v1/connections", key=key, headers=_from(spelling))
        assert r.status == 401, (spelling, r)


@pytest.mark.parametrize("worker_class", ["qag", "gthread"])
def test_a_fragment_in_the_target_is_read_as_the_router_reads_it(worker_class):
    """The servers drop a target's #fragment from PATH_INFO; the router read it from the raw target. So
    `/health#/x` was exempt from the limit by one reading and an unknown route, answered 401 or 404 by key, by the
    other: an unthrottled key-guessing oracle. Both readings drop it now."""
    s = Server(env={"QAG_RATE_LIMIT": "3/minute", "QAG_TRUST_PROXY": "1", "QAG_WORKER_CLASS": worker_class},
               workers=1)
    try:
        client = _from("10.0.0.6")
        for i in range(6):
            for target in ("/health#/x", "/health#", "/livez#/api/v1/connections"):
                r = s.get(target, key=f"wrong-{i}", headers=client)
                assert r.status == 200 and "x-ratelimit-limit" not in r.headers, (target, r)
        statuses = [s.get("/api/v1/connections#frag", key=f"wrong-{i}", headers=client).status for i in range(5)]
        assert statuses == [401, 401, 401, 429, 429]
        other = _from("10.0.0.7")
        r = s.get("/api/v1/connections#/x?y=1", headers=other)   # the fragment's text is neither path nor query
        assert r.status == 200 and "items" in r.json and r.headers["x-ratelimit-remaining"] == "2"
    finally:
        s.close()


def test_a_wrong_method_on_an_exempt_route_tests_no_key(limited):
    """POST /health (and the other routes exempt from the limit) was authenticated on its way to the 405: 401 for a
    wrong key, 405 for a right one, at any rate. It is 405 for any credential, unread; without one it is an
    anonymous caller's 401, as QueryAPIGate 0.43 answers it (probed: it also says 401 to a wrong key)."""
    client = _from("10.0.0.8")
    for path in ("/health", "/livez", "/readyz", "/metrics"):
        for method in ("POST", "DELETE", "OPTIONS"):
            answers = [limited.request(method, path, key=key, headers=client)
                       for key in ("wrong-1", "wrong-2", "admin")]
            answers.append(limited.request(method, path, key=None, headers={**client, "Authorization": "Bearer x"}))
            assert {r.status for r in answers} == {405}, (path, method, [r.status for r in answers])
            assert all(r.json["code"] == "method_not_allowed" for r in answers)
            r = limited.request(method, path, key=None, headers=client)
            assert r.status == 401 and r.json["code"] == "unauthorized" and "x-ratelimit-limit" not in r.headers, r
    assert limited.get("/api/v1/connections", headers=client).headers["x-ratelimit-remaining"] == "2"


def test_every_counted_route_carries_the_headers(limited):
    client = _from("10.0.0.3")
    for path, status in (("/openapi.json", 200), ("/no/such/route", 404), ("/q/nothing", 404)):
        r = limited.get(path, headers=client)
        assert r.status == status and "x-ratelimit-remaining" in r.headers, (path, r)
    assert limited.get("/", headers=client).status == 429


def test_b9_7_invalid_rate_limit_stops_startup(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update({"QAG_HOME": str(tmp_path), "QUERYAPIGATE_RATE_LIMIT": "10/week"})
    r = subprocess.run([sys.executable, "-m", "qag", "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "QUERYAPIGATE_RATE_LIMIT must look like '60/minute'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# --- per key ------------------------------------------------------------------------------------------------------

def test_per_key_limit_counts_403s_and_is_per_key(keyed, uniq):
    name = uniq("rl")
    key = keyed.key(name, rate_limit="2/minute", connections=["lite"])
    twin = keyed.key(uniq("rl"), rate_limit="2/minute", connections=["lite"])
    r = keyed.get(q("small"), key=key)
    assert r.status == 200 and (r.headers["x-ratelimit-key-limit"], r.headers["x-ratelimit-key-remaining"]) == ("2", "1")
    assert "x-ratelimit-limit" not in r.headers  # no server-wide limit configured
    r = keyed.get("/api/v1/connections", key=key)  # refused by the route: still counted
    assert r.status == 403 and r.headers["x-ratelimit-key-remaining"] == "0"
    r = keyed.get(q("small"), key=key)
    assert r.status == 429 and r.json["code"] == "rate_limited"
    assert r.json["error"] == "Rate limit exceeded for this API key"
    assert 1 <= int(r.headers["retry-after"]) <= 30 and r.json["retry_after"] == int(r.headers["retry-after"])
    assert r.headers["x-ratelimit-key-remaining"] == "0"
    # Two keys with the same limit have independent budgets; the admin key has none.
    assert keyed.get(q("small"), key=twin).status == 200
    r = keyed.get(q("small"))
    assert r.status == 200 and "x-ratelimit-key-limit" not in r.headers


def test_the_exempt_routes_tell_no_key_from_another(keyed, uniq):
    """/readyz and /metrics are exempt from the address's limit; a key's X-Quota-* and X-RateLimit-Key-* headers
    there told a right key from a wrong one at any rate. They answer a key as they answer anyone, and spend none of
    its budget."""
    key = keyed.key(uniq("ex"), rate_limit="2/hour", quota={"calls": 5, "per": "day"}, connections=["lite"])
    for path in ("/readyz", "/metrics", "/health", "/livez"):
        right, wrong = keyed.get(path, key=key), keyed.get(path, key="sk_wrong")
        assert right.status == wrong.status == 200, (path, right, wrong)
        for name in ("x-quota-reset", "x-quota-remaining-calls", "x-ratelimit-key-limit", "x-ratelimit-key-remaining"):
            assert name not in right.headers, (path, name)
        assert right.body == wrong.body or path == "/metrics", path
    r = keyed.get(q("small"), key=key)     # nothing spent above: the key's first call
    assert r.status == 200 and r.headers["x-ratelimit-key-remaining"] == "1"
    assert r.headers["x-quota-remaining-calls"] == "4"


def test_public_pages_carry_a_keys_quota_headers(keyed, uniq):
    """Contract 6.8: every response to a caller with a quota (any route) carries X-Quota-*: the public pages that
    the address's limit covers (/, /docs, /favicon.ico) read the key for them, without counting a call."""
    key = keyed.key(uniq("pub"), rate_limit="50/hour", quota={"calls": 5, "per": "day"}, connections=["lite"])
    for path in ("/", "/docs", "/favicon.ico"):
        r = keyed.get(path, key=key)
        assert r.status in (200, 204, 302), (path, r)
        assert r.headers["x-quota-remaining-calls"] == "5" and r.headers["x-quota-reset"], path
        assert "x-ratelimit-key-remaining" in r.headers, path
        wrong = keyed.get(path, key="sk_wrong")      # answered as for anyone
        assert wrong.status == r.status and "x-quota-reset" not in wrong.headers, path
    # The files a year-long public cache keeps carry no caller's headers (a CDN would hand them to everyone).
    from qag.api.docs import FILES, PREFIX
    r = keyed.get(PREFIX + sorted(FILES)[0], key=key)
    assert r.status == 200 and "public" in r.headers["cache-control"], r
    assert not [name for name in r.headers if name.startswith(("x-quota", "x-ratelimit-key"))], r.headers
    assert keyed.get(q("small"), key=key).headers["x-quota-remaining-calls"] == "4"


def test_per_key_limit_follows_a_patch(keyed, uniq):
    name = uniq("rl")
    key = keyed.key(name, rate_limit="1/hour", connections=["lite"])
    assert keyed.get(q("small"), key=key).status == 200
    assert keyed.get(q("small"), key=key).status == 429
    assert keyed.request("PATCH", f"/api/v1/api-keys/{name}", body={"rate_limit": None}).status == 200
    r = keyed.get(q("small"), key=key)
    assert r.status == 200 and "x-ratelimit-key-limit" not in r.headers


# --- max_concurrent -----------------------------------------------------------------------------------------------

def _open_stream(server, key):
    """Start a big stream and read only its first bytes: the server blocks writing it, holding the slot."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    conn.request("GET", q("big") + "?stream=true&format=csv", headers={"X-API-Key": key})
    response = conn.getresponse()
    assert response.status == 200
    assert response.read(100)
    return conn


def _eventually_ok(server, key, path=None, deadline=10.0):
    end = time.monotonic() + deadline
    while True:
        r = server.get(path or q("small"), key=key)
        if r.status == 200 or time.monotonic() > end:
            return r
        time.sleep(0.05)


def test_b6_23_open_stream_holds_the_slot(keyed, uniq):
    key = keyed.key(uniq("mc"), max_concurrent=1, connections=["lite"])
    other = keyed.key(uniq("mc"), max_concurrent=1, connections=["lite"])
    conn = _open_stream(keyed, key)
    try:
        r = keyed.get(q("small"), key=key)
        assert r.status == 429 and r.json["code"] == "too_many_concurrent"
        assert r.headers["retry-after"] == "1" and r.json["retry_after"] == 1 and r.json["max_concurrent"] == 1
        assert keyed.get(q("small"), key=other).status == 200  # slots are per key
        assert keyed.get(q("small")).status == 200  # administrators have no limit
    finally:
        conn.close()  # the client goes away mid-stream: the server closes the body and frees the slot
    assert _eventually_ok(keyed, key).status == 200


def test_b6_23_slot_freed_after_a_stream_is_read_or_a_query_fails(keyed, uniq):
    key = keyed.key(uniq("mc"), max_concurrent=1, connections=["lite"])
    r = keyed.get(q("small") + "?stream=true&format=csv", key=key)
    assert r.status == 200 and r.body == b"id\r\n1\r\n2\r\n3\r\n"
    assert keyed.get(q("small"), key=key).status == 200
    assert keyed.get(q("broken"), key=key).status == 500  # a failing query releases its slot
    assert keyed.get(q("small"), key=key).status == 200
    for _ in range(3):  # sequential calls never pile up
        assert keyed.get(q("small"), key=key).status == 200


# --- streams per worker (QAG_MAX_STREAMS) ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_stream():
    """One worker of four threads sending at most one stream at once."""
    s = Server(workers=1, threads=4, env={"QAG_MAX_STREAMS": "1"})
    s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1), (2), (3);")
    s.connection("lite", "lite.db")
    s.query("small", "SELECT id FROM t ORDER BY id", "lite")
    s.query("big", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 50000000) "
                   "SELECT i, 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' AS pad FROM n", "lite")
    yield s
    s.close()


def test_a_worker_sends_at_most_qag_max_streams_streams_and_calls_go_on(one_stream, uniq):
    """A client that never reads its stream holds a request thread; past the worker's QAG_MAX_STREAMS a stream
    is refused (503 too_many_streams, Retry-After 5, not a run), any key's, the administrator's too, while plain
    calls are still answered; the slot comes back when the stream's client goes away."""
    name = uniq("st")
    key = one_stream.key(name, connections=["lite"])
    held = _open_stream(one_stream, key)
    try:
        for caller in (key, "admin"):
            r = one_stream.get(q("small") + "?stream=true&format=csv", key=caller)
            assert (r.status, r.json["code"]) == (503, "too_many_streams"), r
            assert r.headers["retry-after"] == "5" and r.json["retry_after"] == 5
        small = one_stream.get(q("small"), key=key)
        assert small.status == 200 and small.json == [{"id": 1}, {"id": 2}, {"id": 3}]
    finally:
        held.close()
    r = _eventually_ok(one_stream, key, q("small") + "?stream=true&format=csv")
    assert r.status == 200 and r.body == b"id\r\n1\r\n2\r\n3\r\n"
    # Refused streams are not runs: the key's runs of `small` are the plain call and the stream that went through.
    runs = lambda: one_stream.get(f"/api/v1/history?query=small&key={name}").json["items"]  # noqa: E731
    wait_for(lambda: len(runs()) >= 2, "the key's two runs of small in the history")
    assert len(runs()) == 2, runs()


def test_max_streams_zero_turns_streams_off(tmp_path):
    s = Server(workers=1, env={"QAG_MAX_STREAMS": "0"})
    try:
        s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1);")
        s.connection("lite", "lite.db")
        s.query("small", "SELECT id FROM t", "lite")
        r = s.get(q("small") + "?stream=true&format=csv")
        assert (r.status, r.json["code"]) == (503, "too_many_streams") and "turned off" in r.json["error"], r
        assert s.get(q("small")).json == [{"id": 1}]
    finally:
        s.close()
