"""Contract section 7.1/7.2 (the response cache) against real gunicorn servers: every behaviour B7.1-B7.8 with the
host's shared-memory cache (four workers sharing it) and with Redis (two workers sharing it); the Redis key
layout, two instances sharing entries, and a failing Redis costing misses, never errors. Every worker answering
some calls of each behaviour: tests/integration/test_host_response_cache.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import time
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import SEED
from qag.testing import Relay
from tests.server import Server, q, wait_for
from tests.services import pg_admin, redis_url

pytestmark = pytest.mark.e2e

_ENV = {"QAG_ALLOW_WRITES": "1", "QAG_HISTORY_FLUSH_INTERVAL": "0.1"}


def _start(env: dict | None = None, workers: int = 1) -> Server:
    s = Server(env={**_ENV, **(env or {})}, workers=workers)
    s.sqlite_db("lite.db", SEED)
    s.connection("lite", "lite.db")
    return s


@pytest.fixture(scope="module", params=["local", "redis"])
def cached(request):
    """A server with writes on: the host's cache shared by four workers, or Redis shared by two workers."""
    if request.param == "redis":
        s = _start({"QAG_REDIS_URL": redis_url()}, workers=2)
    else:
        s = _start(workers=4)
    s.kind = request.param
    yield s
    s.close()



def metric(s: Server, name: str) -> float:
    for line in s.get("/metrics").body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest() + '"'


def entry_of(s: Server, name: str) -> dict:
    items = [i for i in s.get("/api/v1/cache/entries").json["items"] if i["meta"]["name"] == name]
    assert len(items) == 1, items
    return items[0]


def uncached(r) -> bool:
    return "x-cache" not in r.headers and "etag" not in r.headers and r.headers["cache-control"] == "no-store"


# --- B7.1 - B7.8 on both caches -------------------------------------------------------------------------------
def test_b7_1_miss_then_hit_then_304(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT id, name FROM t WHERE id <= 3", "lite", cache_ttl=60)
    first = cached.get(q(name))
    assert first.status == 200 and first.headers["x-cache"] == "MISS"
    assert first.headers["etag"] == etag_of(first.body) and len(first.headers["etag"]) == 66
    assert first.headers["cache-control"] == "private, max-age=60"
    second = cached.get(q(name), headers={"X-Request-Id": "hit-request-1"})
    assert second.status == 200 and second.headers["x-cache"] == "HIT"
    assert second.body == first.body and second.headers["etag"] == first.headers["etag"]
    assert second.headers["cache-control"] == "private, max-age=60"
    assert second.headers["x-request-id"] == "hit-request-1"  # the new request's id, not the stored one
    for h in ("x-page", "x-page-size", "x-row-count", "x-has-more", "content-type", "content-length"):
        assert second.headers[h] == first.headers[h], h
    nm = cached.get(q(name), headers={"If-None-Match": first.headers["etag"]})
    assert nm.status == 304 and nm.body == b"" and "content-length" not in nm.headers
    assert nm.headers["etag"] == first.headers["etag"] and nm.headers["x-cache"] == "HIT"
    assert nm.headers["cache-control"] == "private, max-age=60"
    assert not {"x-page", "x-page-size", "x-row-count", "x-has-more"} & set(nm.headers)


def test_b7_1_if_none_match_is_ignored_on_a_miss(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
    etag = cached.get(q(name)).headers["etag"]
    assert cached.request("DELETE", "/api/v1/cache/entries/" + entry_of(cached, name)["key"]).status == 204
    r = cached.get(q(name), headers={"If-None-Match": etag})
    assert r.status == 200 and r.headers["x-cache"] == "MISS" and r.body == b'[{"one":1}]\n'


def test_b7_2_different_values_or_format_are_separate_entries(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT id FROM t WHERE id = :id", "lite", cache_ttl=60)
    assert cached.get(q(name) + "?id=1").headers["x-cache"] == "MISS"
    assert cached.get(q(name) + "?id=2").headers["x-cache"] == "MISS"
    csv = cached.get(q(name) + "?id=1&format=csv")
    assert csv.headers["x-cache"] == "MISS" and csv.headers["content-type"].startswith("text/csv")
    assert cached.get(q(name) + "?id=1&page_size=5").headers["x-cache"] == "MISS"   # effective page size
    assert cached.get(q(name) + "?id=1&page=2").headers["x-cache"] == "MISS"
    hit = cached.get(q(name) + "?id=2")
    assert hit.headers["x-cache"] == "HIT" and hit.json == [{"id": 2}]
    hit = cached.get(q(name) + "?id=1&format=csv")
    assert hit.headers["x-cache"] == "HIT" and hit.body == csv.body
    assert hit.headers["content-type"] == csv.headers["content-type"]
    # the name as written in the URL: /q/<name>.json is an entry of its own (meta.name stays canonical)
    assert cached.get(q(name) + ".json?id=1").headers["x-cache"] == "MISS"


def test_values_the_statement_does_not_bind_share_the_entry(cached, uniq):
    """An undeclared parameter the SQL never names changes nothing in the body: no entry of its own each time
    (which would let any caller push everyone's entries out of the cache)."""
    name = uniq("c")
    cached.query(name, "SELECT id FROM t WHERE id = :id", "lite", cache_ttl=60)
    assert cached.get(q(name) + "?id=1").headers["x-cache"] == "MISS"
    for junk in ("?id=1&junk=1", "?junk=2&id=1", "?id=1&other=x&more=y"):
        r = cached.get(q(name) + junk)
        assert r.status == 200 and r.headers["x-cache"] == "HIT" and r.json == [{"id": 1}], (junk, r)
    assert cached.get(q(name) + "?id=2").headers["x-cache"] == "MISS"    # a bound value still keys its entry
    assert len([i for i in cached.get("/api/v1/cache/entries").json["items"] if i["meta"]["name"] == name]) == 2


def test_b7_3_get_and_post_share_an_entry_through_resolved_values(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT id FROM t WHERE id = :id", "lite", cache_ttl=60, parameters={"id": {"type": "int"}})
    get = cached.get(q(name) + "?id=1")
    post = cached.post(q(name), {"params": {"id": 1}})
    assert get.headers["x-cache"] == "MISS" and post.headers["x-cache"] == "HIT" and post.body == get.body
    assert cached.post(q(name), {"params": {"id": "01"}}).headers["x-cache"] == "HIT"   # resolves to 1 as well


def test_b7_4_a_cached_write_runs_every_call(cached, uniq):
    name, marker = uniq("w"), uniq("note")
    cached.query(name, "INSERT INTO notes (body) VALUES (:b)", "lite", cache_ttl=60)
    for _ in range(2):
        r = cached.get(q(name), params={"b": marker})
        assert r.status == 200 and uncached(r), r.headers
    count = cached.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM notes WHERE body = :b",
                                         "connection_name": "lite", "params": {"b": marker}})
    assert count.json == [{"n": 2}] and "x-cache" not in count.headers


def test_b7_5_a_hit_is_not_a_run(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
    time.sleep(0.6)  # every worker's latest counts are in its snapshot (written every 0.25 s): a steady baseline
    hits, misses = metric(cached, "queryapigate_cache_hits_total"), metric(cached, "queryapigate_cache_misses_total")
    assert cached.get(q(name)).headers["x-cache"] == "MISS"
    for _ in range(3):
        assert cached.get(q(name)).headers["x-cache"] == "HIT"

    def history():
        return cached.get(f"/api/v1/queries/{name}/history", params={"limit": 100}).json["items"]

    wait_for(lambda: len(history()) == 1, "the miss in history")
    time.sleep(0.5)  # several flush intervals of every worker: nothing else arrives
    assert len(history()) == 1
    wait_for(lambda: metric(cached, "queryapigate_cache_hits_total") == hits + 3, "3 more hits counted")
    assert metric(cached, "queryapigate_cache_misses_total") == misses + 1


def test_a_hit_does_not_touch_the_database(cached, uniq):
    name, conn, path = uniq("c"), uniq("conn"), uniq("gone") + ".db"
    cached.sqlite_db(path, "CREATE TABLE v (x INTEGER); INSERT INTO v VALUES (7);")
    cached.connection(conn, path)
    cached.query(name, "SELECT x FROM v", conn, cache_ttl=60)
    assert cached.get(q(name)).headers["x-cache"] == "MISS"
    os.remove(os.path.join(cached.home, path))
    hit = cached.get(q(name))
    assert hit.status == 200 and hit.headers["x-cache"] == "HIT" and hit.json == [{"x": 7}]
    gone = cached.get(q(name) + "?page_size=3")   # another key: this one runs, and finds no database
    assert gone.status == 404 and gone.json["code"] == "database_file_not_found"


def test_b7_6_cache_ttl_validation(cached, uniq):
    for bad in (-1, "60", 1.5, True):
        r = cached.post("/api/v1/queries", {"name": uniq("bad"), "sql": "SELECT 1", "connection_name": "lite",
                                            "cache_ttl": bad})
        assert r.status == 400 and r.json["code"] == "invalid_body", (bad, r)
    name = uniq("zero")
    cached.query(name, "SELECT 1 AS one", "lite", cache_ttl=0)
    for _ in range(2):
        r = cached.get(q(name))
        assert r.status == 200 and uncached(r)


def test_b7_7_ttl_changes(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT 1 AS one", "lite")
    assert uncached(cached.get(q(name)))
    assert cached.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"cache_ttl": 60}).status == 200
    assert cached.get(q(name)).headers["x-cache"] == "MISS"
    assert cached.get(q(name)).headers["x-cache"] == "HIT"
    # A new TTL is advertised at once; the stored entry keeps its expiry (it is still a hit).
    assert cached.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"cache_ttl": 30}).status == 200
    r = cached.get(q(name))
    assert r.headers["x-cache"] == "HIT" and r.headers["cache-control"] == "private, max-age=30"
    assert cached.request("PATCH", f"/api/v1/queries/{name}/versions/1", body={"cache_ttl": 0}).status == 200
    assert uncached(cached.get(q(name)))


def test_entries_expire_after_their_ttl(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT 1 AS one", "lite", cache_ttl=1)
    assert cached.get(q(name)).headers["x-cache"] == "MISS"
    assert cached.get(q(name)).headers["x-cache"] == "HIT"
    time.sleep(1.2)
    assert cached.get(q(name)).headers["x-cache"] == "MISS"


def test_a_new_published_version_is_a_new_key(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT 1 AS v", "lite", cache_ttl=60)
    assert cached.get(q(name)).json == [{"v": 1}]
    assert cached.post(f"/api/v1/queries/{name}/versions", {"description": "v2", "sql": "SELECT 2 AS v", "connection_name": "lite",
                                                             "publish": True, "cache_ttl": 60}).status == 201
    r = cached.get(q(name))
    assert r.headers["x-cache"] == "MISS" and r.json == [{"v": 2}]
    assert cached.get(q(name) + "?version=1").headers["x-cache"] == "HIT"


def test_b7_8_cache_entries_admin(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT id, name FROM t WHERE id <= 2", "lite", cache_ttl=60)
    live = cached.get(q(name))
    item = entry_of(cached, name)
    assert item["meta"] == {"name": name, "version": 1, "connection": "lite", "format": "json", "page": 1,
                            "workspace": "default"}
    assert item["content_type"] == "application/json" and item["size_bytes"] == len(live.body)
    assert 0 < item["ttl_remaining_s"] <= 60 and len(item["key"]) == 64
    got = cached.get("/api/v1/cache/entries/" + item["key"])
    assert got.status == 200 and got.body == live.body
    assert got.headers["content-type"] == live.headers["content-type"]
    assert cached.request("DELETE", "/api/v1/cache/entries/" + item["key"]).status == 204
    missing = cached.get("/api/v1/cache/entries/" + item["key"])
    assert missing.status == 404 and missing.json["code"] == "cache_entry_not_found"
    assert missing.json["error"] == "Cache entry not found (missing, expired, or already evicted)"
    assert cached.request("DELETE", "/api/v1/cache/entries/" + "0" * 64).status == 204   # unknown: no-op
    assert cached.get(q(name)).headers["x-cache"] == "MISS"


def test_cache_entries_sorted_soonest_to_expire_first(cached, uniq):
    long, short = uniq("long"), uniq("short")
    cached.query(long, "SELECT 1 AS one", "lite", cache_ttl=600)
    cached.query(short, "SELECT 2 AS two", "lite", cache_ttl=300)
    cached.get(q(long))
    cached.get(q(short))
    names = [i["meta"]["name"] for i in cached.get("/api/v1/cache/entries").json["items"]]
    assert names.index(short) < names.index(long)


def test_cache_admin_is_for_administrators_only(cached, uniq):
    scoped = cached.key(uniq("k"))
    for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/" + "a" * 64), ("DELETE", "/" + "a" * 64)):
        r = cached.request(method, "/api/v1/cache/entries" + path, key=scoped)
        assert r.status == 403 and r.json["code"] == "admin_only", (method, path)


def test_callers_with_the_same_rules_share_entries_masked_ones_get_their_own(cached, uniq):
    """B6.15: the cache key holds the mask fingerprint, never the API key."""
    name = uniq("c")
    cached.query(name, "SELECT id, name FROM t WHERE id = 1", "lite", cache_ttl=60)
    raw = cached.get(q(name))
    assert raw.headers["x-cache"] == "MISS" and raw.json == [{"id": 1, "name": "row 1"}]
    plain = cached.key(uniq("k"), queries=[name])
    r = cached.get(q(name), key=plain)
    assert r.status == 200 and r.headers["x-cache"] == "HIT"       # the API key is not part of the key
    rules = [{"column": "t.name", "action": "hash"}]
    masked = cached.key(uniq("k"), queries=[name], mask=rules)
    first = cached.get(q(name), key=masked)
    assert first.status == 200 and first.headers["x-cache"] == "MISS"   # never the admin's unmasked entry
    assert first.json[0]["id"] == 1 and re.fullmatch(r"[0-9a-f]{16}", first.json[0]["name"])
    again = cached.get(q(name), key=masked)
    assert again.headers["x-cache"] == "HIT" and again.body == first.body
    same_rules = cached.key(uniq("k"), queries=[name], mask=rules)
    assert cached.get(q(name), key=same_rules).body == first.body      # same rules: the same entry
    assert cached.get(q(name), key=plain).body == raw.body             # and the raw entry is still raw
    tables = cached.key(uniq("k"), queries=[name], allowed_tables=["secret"])
    r = cached.get(q(name), key=tables)
    assert r.status == 403 and "x-cache" not in r.headers


def test_an_api_keys_statement_checks_come_before_the_cache(cached, uniq, pg_db):
    """What an API key's statement is refused and the admin's isn't (other sessions' activity, for every key; a
    function outside the built-ins' plain ones, for a masked key) is refused before the cache: an entry the
    admin's run filled never answers a key the same checks refuse. The version's mask makes the masked key's
    rules the admin's, so the two would share an entry."""
    conn, table = uniq("pg"), uniq("secrets")
    admin = pg_admin(pg_db["database"])
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (id int, secret text)")
            cur.execute(f"INSERT INTO {table} VALUES (1, 'hunter2')")
            cur.execute(f"GRANT SELECT ON {table} TO \"{pg_db['user']}\"")
        admin.commit()
        assert cached.post("/api/v1/connections", {"name": conn, "db": "postgres", **pg_db}).status == 201
        activity, setting = uniq("c"), uniq("c")
        cached.query(activity, "SELECT count(*) AS n FROM pg_stat_activity", conn, cache_ttl=60)
        cached.query(setting, f"SELECT id, secret FROM {table} WHERE current_setting('server_version') <> ''",
                     conn, cache_ttl=60, mask=[{"column": f"{table}.secret", "action": "hash"}])
        for name, code in ((activity, "table_not_allowed"), (setting, "function_not_allowed")):
            key = cached.key(uniq("k"), queries=[name])
            before = cached.get(q(name), key=key)
            assert (before.status, before.json["code"]) == (403, code), before
            assert cached.get(q(name)).headers["x-cache"] == "MISS"
            assert cached.get(q(name)).headers["x-cache"] == "HIT"
            after = cached.get(q(name), key=key)
            assert after.status == 403 and "x-cache" not in after.headers, after   # never the admin's entry
            assert after.json["code"] == code
            # each refusal is a run, as on a query without a cache
            wait_for(lambda: len(cached.get(f"/api/v1/history?query={name}&status=error").json["items"]) == 2,
                     "both refusals in the run history")
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        admin.commit()
        admin.close()


def test_a_body_a_writing_call_made_never_answers_a_read_only_caller(cached, uniq, pg_db):
    """A saved query calling a function that writes: the admin (writes on) runs it and fills an entry; a key that
    may not write runs the same query read-only and the database refuses it (403 read_only), before and after the
    admin's entry exists - the entry is keyed by the call's read-only mode, so it never answers the key."""
    conn, table, bump = uniq("pg"), uniq("log"), uniq("bump")
    admin = pg_admin(pg_db["database"])
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE TABLE {table} (v text)")
            cur.execute(f"GRANT ALL ON {table} TO \"{pg_db['user']}\"")
            cur.execute(f"CREATE FUNCTION {bump}() RETURNS bigint LANGUAGE sql AS "
                        f"$$ INSERT INTO {table} VALUES ('bumped'); SELECT count(*) FROM {table} $$")
        admin.commit()
        assert cached.post("/api/v1/connections", {"name": conn, "db": "postgres", **pg_db}).status == 201
        name = uniq("c")
        cached.query(name, f"SELECT {bump}() AS n", conn, cache_ttl=60)
        key = cached.key(uniq("k"), queries=[name])
        before = cached.get(q(name), key=key)
        assert (before.status, before.json["code"]) == (403, "read_only"), before
        first = cached.get(q(name))
        assert (first.status, first.headers["x-cache"]) == (200, "MISS"), first
        assert cached.get(q(name)).headers["x-cache"] == "HIT"
        after = cached.get(q(name), key=key)
        assert (after.status, after.json["code"]) == (403, "read_only"), after   # never the admin's entry
        with admin.cursor() as cur:
            cur.execute(f"SELECT count(*) FROM {table}")
            assert cur.fetchone()[0] == 1          # the admin's one run wrote; the refused ones didn't
        admin.commit()
    finally:
        with admin.cursor() as cur:
            cur.execute(f"DROP FUNCTION IF EXISTS {bump}()")
            cur.execute(f"DROP TABLE IF EXISTS {table}")
        admin.commit()
        admin.close()


def test_checks_before_the_cache_still_win(cached, uniq):
    name, conn = uniq("c"), uniq("conn")
    cached.connection(conn, "lite.db")
    cached.query(name, "SELECT id FROM t WHERE id = :id", conn, cache_ttl=60,
                 parameters={"id": {"type": "int", "default": 1}})
    assert cached.get(q(name)).headers["x-cache"] == "MISS"
    assert cached.get(q(name) + "?id=abc").json["code"] == "param_invalid"
    assert cached.get(q(name) + "?page=0").json["code"] == "invalid_paging"
    other = cached.key(uniq("k"), queries=[uniq("other")], connections=[])
    assert cached.get(q(name), key=other).status == 403
    assert cached.request("PATCH", f"/api/v1/connections/{conn}", body={"active": False}).status == 200
    r = cached.get(q(name))
    assert r.status == 403 and r.json["code"] == "connection_inactive"


def test_never_for_streams_or_execute_sql(cached, uniq):
    name = uniq("c")
    cached.query(name, "SELECT id FROM t", "lite", cache_ttl=60)
    for _ in range(2):
        r = cached.get(q(name) + "?stream=true&format=csv")
        assert r.status == 200 and uncached(r)
        r = cached.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"})
        assert r.status == 200 and uncached(r)


# --- Redis only -------------------------------------------------------------------------------------------------
def _redis():
    import redis
    return redis.Redis.from_url(redis_url())


def test_redis_key_layout_and_expiry(make_server, uniq):
    s = make_server(env={"QAG_REDIS_URL": redis_url()})
    name = uniq("c")
    s.query(name, "SELECT id FROM t WHERE id <= 2", "lite", cache_ttl=60)
    live = s.get(q(name))
    key = entry_of(s, name)["key"]
    prefix = s.redis_prefix()
    fields = _redis().hgetall(prefix + "cache:" + key)
    assert set(fields) == {b"body", b"content_type", b"etag", b"headers", b"meta"}
    assert fields[b"body"] == live.body and fields[b"etag"].decode() == live.headers["etag"]
    assert fields[b"content_type"] == b"application/json"
    assert dict(json.loads(fields[b"headers"])) == {"X-Page": "1", "X-Page-Size": "10", "X-Row-Count": "2",
                                                    "X-Has-More": "false"}
    assert json.loads(fields[b"meta"])["name"] == name
    assert 0 < _redis().ttl(prefix + "cache:" + key) <= 60


def test_redis_cache_is_shared_by_every_worker_and_instance_of_a_store(make_server, uniq, pg_store_url):
    url = redis_url()
    store = {"QAG_REDIS_URL": url, "QAG_DATABASE_URL": pg_store_url}
    one = make_server(env=store, workers=4)
    two = make_server(env=store, workers=2, seed=False)   # another instance of the same deployment
    two.sqlite_db("lite.db", SEED)                        # (its `lite` resolves in its own home: the same rows)
    name = uniq("c")
    one.query(name, "SELECT id FROM t WHERE id <= 2", "lite", cache_ttl=60)
    first = one.get(q(name))
    assert first.headers["x-cache"] == "MISS"
    for _ in range(24):  # a new connection each call: gunicorn hands them to any of the 4 workers
        r = one.get(q(name))
        assert r.headers["x-cache"] == "HIT" and r.body == first.body
    r = two.get(q(name))
    assert r.headers["x-cache"] == "HIT" and r.headers["etag"] == first.headers["etag"]


def test_deployments_with_stores_of_their_own_share_nothing_through_redis(make_server, uniq):
    # Two deployments on one Redis, each with its own store and the same names: neither is served the other's
    # rows, nor refused for the other's calls, nor sees its entries.
    url = redis_url()
    one = make_server(env={"QAG_REDIS_URL": url}, workers=2)
    two = make_server(env={"QAG_REDIS_URL": url}, workers=2)
    with sqlite3.connect(os.path.join(two.home, "lite.db")) as db:
        db.execute("UPDATE t SET name = 'other deployment' WHERE id = 1")
    name = uniq("c")
    for s in (one, two):
        s.query(name, "SELECT id, name FROM t WHERE id = 1", "lite", cache_ttl=60)
    first = one.get(q(name))
    assert first.headers["x-cache"] == "MISS" and one.get(q(name)).headers["x-cache"] == "HIT"
    r = two.get(q(name))
    assert r.headers["x-cache"] == "MISS" and r.json == [{"id": 1, "name": "other deployment"}], r
    assert first.json != r.json
    assert [i["meta"]["name"] for i in two.get("/api/v1/cache/entries").json["items"]].count(name) == 1
    key_name = uniq("k")
    keys = [s.key(key_name, rate_limit="2/hour", quota={"calls": 2, "per": "day"}) for s in (one, two)]
    for _ in range(2):
        assert one.get(q(name), key=keys[0]).status == 200
    assert one.get(q(name), key=keys[0]).status == 429
    for _ in range(2):   # the other deployment's key of the same name still has all of its calls
        r = two.get(q(name), key=keys[1])
        assert r.status == 200, r
    assert one.redis_prefix() != two.redis_prefix()


def test_clear_all_on_redis(make_server, uniq):
    # A database of its own on the test Redis, so evicting "every entry" never touches entries of tests running
    # meanwhile (Redis is never flushed: only qag:cache:* hashes of this database are deleted).
    parts = urlsplit(redis_url())
    url = urlunsplit(parts._replace(path="/14"))
    s = make_server(env={"QAG_REDIS_URL": url})
    names = [uniq("c"), uniq("c")]
    for name in names:
        s.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
        assert s.get(q(name)).headers["x-cache"] == "MISS"
    assert {i["meta"]["name"] for i in s.get("/api/v1/cache/entries").json["items"]} >= set(names)
    assert s.request("DELETE", "/api/v1/cache/entries").status == 204
    assert not {i["meta"]["name"] for i in s.get("/api/v1/cache/entries").json["items"]} & set(names)
    assert all(s.get(q(name)).headers["x-cache"] == "MISS" for name in names)


def test_clear_all_locally(make_server, uniq):
    s = make_server(workers=2)
    name = uniq("c")
    s.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
    s.get(q(name))
    assert len(s.get("/api/v1/cache/entries").json["items"]) == 1
    # The host's count, from whichever worker reports it (a snapshot at most 0.25 s old), counted once.
    wait_for(lambda: metric(s, "queryapigate_cache_entries") == 1, "one entry in the gauge")
    assert s.request("DELETE", "/api/v1/cache/entries").status == 204
    assert s.get("/api/v1/cache/entries").json == {"items": []}
    assert s.get(q(name)).headers["x-cache"] == "MISS"


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_redis_unreachable_is_a_miss_never_an_error(make_server, uniq):
    s = make_server(env={"QAG_REDIS_URL": f"redis://127.0.0.1:{_dead_port()}/0"})
    name = uniq("c")
    s.query(name, "SELECT id FROM t WHERE id = 1", "lite", cache_ttl=60)
    for _ in range(3):
        r = s.get(q(name))
        assert r.status == 200 and r.json == [{"id": 1}]
        assert r.headers["x-cache"] == "MISS" and r.headers["etag"] == etag_of(r.body)
    listing = s.get("/api/v1/cache/entries")
    assert listing.status == 503 and listing.json["code"] == "unavailable"


def test_redis_cut_mid_run_degrades_to_misses(make_server, uniq):
    parts = urlsplit(redis_url())
    relay = Relay(parts.hostname or "127.0.0.1", parts.port or 6379)
    try:
        s = make_server(env={"QAG_REDIS_URL": urlunsplit(parts._replace(netloc=f"127.0.0.1:{relay.port}"))})
        name = uniq("c")
        s.query(name, "SELECT 1 AS one", "lite", cache_ttl=60)
        assert s.get(q(name)).headers["x-cache"] == "MISS"
        assert s.get(q(name)).headers["x-cache"] == "HIT"
        relay.close()   # stop listening and break the open connection: Redis is gone for this server
        for _ in range(3):
            r = s.get(q(name))
            assert r.status == 200 and r.json == [{"one": 1}] and r.headers["x-cache"] == "MISS"
            assert r.headers["etag"] == etag_of(r.body)
    finally:
        relay.close()
