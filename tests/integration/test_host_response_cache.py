"""One response cache per host (issue 19): against a real gunicorn with 4 workers, every worker answering some
calls (told by the access log), the contract's 7.1/7.2 behaviours meet one cache - without Redis (the host's
shared-memory segment) and with Redis; a worker SIGKILLed while others store entries wedges and tears nothing."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import SEED
from tests.server import Server, q, wait_for
from tests.services import redis_url

pytestmark = pytest.mark.e2e

WORKERS = 4


def _start(env: dict | None = None) -> Server:
    s = Server(env={"QAG_ACCESS_LOG": "on", "QAG_HISTORY_FLUSH_INTERVAL": "0.1", **(env or {})}, workers=WORKERS)
    s.sqlite_db("lite.db", SEED)
    s.connection("lite", "lite.db")
    return s


@pytest.fixture(scope="module", params=["host", "redis"])
def four(request):
    """4 workers: the host's segment (no Redis), or Redis."""
    s = _start({"QAG_REDIS_URL": redis_url()} if request.param == "redis" else None)
    s.kind = request.param
    yield s
    s.close()


@pytest.fixture(scope="module")
def host():
    s = _start()
    yield s
    s.close()


def everywhere(s: Server, call, batch: int = 16, most: int = 30) -> list:
    """Replies of `call()` made concurrently on new connections, in batches, until every worker answered one."""
    replies: list = []
    with ThreadPoolExecutor(8) as pool:
        for _ in range(most):
            replies += list(pool.map(lambda _: call(), range(batch)))
            if len(s.workers_of(replies)) == WORKERS:
                return replies
    raise AssertionError(f"only workers {s.workers_of(replies)} answered {len(replies)} calls")


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest() + '"'


def items_of(s: Server, name: str, reply) -> list:
    return [i for i in reply.json["items"] if i["meta"]["name"] == name]


def metric(s: Server, name: str) -> float:
    for line in s.get("/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


# --- the contract's behaviours, any worker answering -----------------------------------------------------------
def test_one_miss_then_hits_and_304s_from_every_worker(four, uniq):
    name = uniq("c")
    four.query(name, "SELECT id, name FROM t WHERE id <= 3", "lite", cache_ttl=60)
    first = four.get(q(name))
    assert first.status == 200 and first.headers["x-cache"] == "MISS"
    assert first.headers["etag"] == etag_of(first.body)
    assert first.headers["cache-control"] == "private, max-age=60"
    hits = everywhere(four, lambda: four.get(q(name)))
    for r in hits:
        assert r.status == 200 and r.headers["x-cache"] == "HIT" and r.body == first.body
        assert r.headers["etag"] == first.headers["etag"] and r.headers["cache-control"] == "private, max-age=60"
        for h in ("x-page", "x-page-size", "x-row-count", "x-has-more", "content-type"):
            assert r.headers[h] == first.headers[h]
    etag = first.headers["etag"]
    for r in everywhere(four, lambda: four.get(q(name), headers={"If-None-Match": etag})):
        assert r.status == 304 and r.body == b"" and r.headers["etag"] == etag and r.headers["x-cache"] == "HIT"
    history = four.get(f"/api/v1/queries/{name}/history", params={"limit": 100}).json["items"]
    assert len(history) == 1                      # one run for all those calls: hits are not runs


def test_hits_and_misses_are_counted_host_wide(host, uniq):
    name = uniq("c")
    host.query(name, "SELECT 7 AS seven", "lite", cache_ttl=60)
    time.sleep(0.6)  # every worker's latest counts are in its snapshot (written every 0.25 s)
    hits, misses = metric(host, "queryapigate_cache_hits_total"), metric(host, "queryapigate_cache_misses_total")
    assert host.get(q(name)).headers["x-cache"] == "MISS"
    replies = everywhere(host, lambda: host.get(q(name)))
    assert all(r.headers["x-cache"] == "HIT" for r in replies)
    wait_for(lambda: metric(host, "queryapigate_cache_hits_total") == hits + len(replies), "every hit counted")
    assert metric(host, "queryapigate_cache_misses_total") == misses + 1
    entries = len(host.get("/api/v1/cache/entries").json["items"])
    wait_for(lambda: metric(host, "queryapigate_cache_entries") == entries, "the host's entries, counted once")


def test_entries_expire_for_every_worker(host, uniq):
    name = uniq("c")
    host.query(name, "SELECT 1 AS one", "lite", cache_ttl=2)
    assert host.get(q(name)).headers["x-cache"] == "MISS"
    started = time.monotonic()
    replies = everywhere(host, lambda: host.get(q(name)), batch=8, most=6)
    if time.monotonic() - started < 1.8:          # (a slow machine may reach the TTL while spreading)
        assert all(r.headers["x-cache"] == "HIT" for r in replies)
    time.sleep(max(0.0, started + 2.2 - time.monotonic()))
    assert host.get(q(name)).headers["x-cache"] == "MISS"
    assert all(r.headers["x-cache"] == "HIT" for r in everywhere(host, lambda: host.get(q(name))))


def test_every_worker_lists_reads_and_evicts_the_same_entries(four, uniq):
    name, other = uniq("c"), uniq("c")
    four.query(name, "SELECT id FROM t WHERE id <= 2", "lite", cache_ttl=60)
    four.query(other, "SELECT 2 AS two", "lite", cache_ttl=60)
    live = four.get(q(name))
    assert four.get(q(other)).headers["x-cache"] == "MISS"
    listings = everywhere(four, lambda: four.get("/api/v1/cache/entries"))
    (item,) = items_of(four, name, listings[0])
    assert item["size_bytes"] == len(live.body) and item["meta"]["version"] == 1
    for r in listings:
        assert [i["key"] for i in items_of(four, name, r)] == [item["key"]]
    path = "/api/v1/cache/entries/" + item["key"]
    for r in everywhere(four, lambda: four.get(path)):
        assert r.status == 200 and r.body == live.body and r.headers["content-type"] == live.headers["content-type"]
    assert four.request("DELETE", path).status == 204          # one worker evicts it...
    for r in everywhere(four, lambda: four.get(path)):          # ...for every worker
        assert r.status == 404 and r.json["code"] == "cache_entry_not_found"
    for r in everywhere(four, lambda: four.get("/api/v1/cache/entries")):
        assert items_of(four, name, r) == [] and len(items_of(four, other, r)) == 1
    assert four.get(q(name)).headers["x-cache"] == "MISS"
    assert all(r.headers["x-cache"] == "HIT" for r in everywhere(four, lambda: four.get(q(name))))


def test_clearing_on_one_worker_clears_every_worker(host, uniq):
    names = [uniq("c"), uniq("c")]
    for name in names:
        host.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
        assert host.get(q(name)).headers["x-cache"] == "MISS"
    assert host.request("DELETE", "/api/v1/cache/entries").status == 204
    for r in everywhere(host, lambda: host.get("/api/v1/cache/entries")):
        assert r.json == {"items": []}
    for name in names:
        assert host.get(q(name)).headers["x-cache"] == "MISS"


def test_changes_to_the_query_or_its_connection_are_never_answered_from_old_entries(four, uniq):
    name, conn, path = uniq("c"), uniq("conn"), uniq("db") + ".db"
    four.sqlite_db(path, "CREATE TABLE v (x INTEGER); INSERT INTO v VALUES (1);")
    four.sqlite_db("other-" + path, "CREATE TABLE v (x INTEGER); INSERT INTO v VALUES (2);")
    four.connection(conn, path)
    four.query(name, "SELECT x FROM v", conn, cache_ttl=60)
    assert four.get(q(name)).json == [{"x": 1}]
    assert all(r.json == [{"x": 1}] and r.headers["x-cache"] == "HIT"
               for r in everywhere(four, lambda: four.get(q(name))))
    # A new published version is a new key, on every worker.
    assert four.post(f"/api/v1/queries/{name}/versions", {"description": "v2", "sql": "SELECT x + 10 AS x FROM v",
                                                          "connection_name": conn,
                                                          "publish": True, "cache_ttl": 60}).status == 201
    assert four.get(q(name)).json == [{"x": 11}]
    assert all(r.json == [{"x": 11}] for r in everywhere(four, lambda: four.get(q(name))))
    # The connection pointed at another database: the old entries are never replayed.
    assert four.request("PATCH", f"/api/v1/connections/{conn}", body={"database": "other-" + path}).status == 200
    assert all(r.json == [{"x": 12}] for r in everywhere(four, lambda: four.get(q(name))))
    # The query deleted and made again under the same name (version 1 again, other SQL).
    assert four.request("DELETE", f"/api/v1/queries/{name}").status in (200, 204)
    four.query(name, "SELECT x * 100 AS x FROM v", conn, cache_ttl=60)
    assert all(r.json == [{"x": 200}] for r in everywhere(four, lambda: four.get(q(name))))
    # TTL to 0: no worker uses the cache any more.
    assert four.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"cache_ttl": 0}).status == 200
    for r in everywhere(four, lambda: four.get(q(name))):
        assert "x-cache" not in r.headers and r.headers["cache-control"] == "no-store"


def test_an_entry_too_large_for_the_area_is_not_cached_never_an_error(make_server, uniq):
    s = make_server(env={"QAG_ACCESS_LOG": "on", "QAG_RESPONSE_CACHE_MAX_BYTES": "4096"}, workers=2)
    name, small = uniq("big"), uniq("small")
    s.query(name, "SELECT id, hex(zeroblob(200)) AS pad FROM t", "lite", cache_ttl=60)
    s.query(small, "SELECT 1 AS one", "lite", cache_ttl=60)
    first = s.get(q(name) + "?page_size=1000")
    assert len(first.body) > 4096
    for r in [s.get(q(name) + "?page_size=1000") for _ in range(4)]:
        assert r.status == 200 and r.body == first.body and r.headers["x-cache"] == "MISS"
        assert r.headers["etag"] == etag_of(r.body)
    assert s.get(q(small)).headers["x-cache"] == "MISS" and s.get(q(small)).headers["x-cache"] == "HIT"


# --- a worker killed while others store ---------------------------------------------------------------------------
def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(p) for p in fh.read().split()}


def test_a_worker_killed_while_others_store_leaves_the_cache_working(make_server, uniq):
    # A small area (64 KiB): the stores below evict all the time, so writers hold the lock often.
    s = make_server(env={"QAG_ACCESS_LOG": "on", "QAG_RESPONSE_CACHE_MAX_BYTES": "65536"}, workers=WORKERS)
    name = uniq("c")
    s.query(name, "SELECT :n AS n, name FROM t WHERE id <= 20", "lite", cache_ttl=60)
    expected = {}
    stop = threading.Event()
    bad: list = []
    calls = [0]

    def hammer(seed: int):
        n = seed
        while not stop.is_set():
            n = (n * 7 + 3) % 200
            try:
                r = s.get(q(name), params={"n": n, "page_size": 20})
            except OSError:
                continue  # the connection was the killed worker's
            calls[0] += 1
            if r.status != 200 or any(row["n"] != str(n) and row["n"] != n for row in r.json):
                bad.append((n, r.status, r.body[:200]))
            elif r.headers.get("etag") != etag_of(r.body):
                bad.append((n, "etag", r.headers.get("etag")))
            else:
                expected.setdefault(n, r.body)
                if r.body != expected[n]:
                    bad.append((n, "changed", r.body[:200]))

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    master = s.proc.pid
    try:
        for _ in range(3):
            time.sleep(1.0)
            victim = sorted(_children(master))[0]
            os.kill(victim, signal.SIGKILL)
            wait_for(lambda: len(_children(master)) == WORKERS and victim not in _children(master),
                     "the master replacing the killed worker", 30)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not bad, bad[:5]
    assert calls[0] > 100
    # Still one working cache for every worker (the replacements included): store, hit, list, evict.
    after = uniq("c")
    s.query(after, "SELECT 3 AS three", "lite", cache_ttl=60)
    assert s.get(q(after)).headers["x-cache"] == "MISS"
    assert all(r.headers["x-cache"] == "HIT" for r in everywhere(s, lambda: s.get(q(after))))
    (item,) = items_of(s, after, s.get("/api/v1/cache/entries"))
    assert s.request("DELETE", "/api/v1/cache/entries/" + item["key"]).status == 204
    for r in everywhere(s, lambda: s.get("/api/v1/cache/entries")):
        assert items_of(s, after, r) == []
