"""Contract 6.8 quotas against real servers (B6.17, B6.18, B6.19, headers on every route, streams, usage), once with
two workers and no Redis (the host table), once with two workers sharing Redis; then exactly the limit across a
4-worker gunicorn hammered by 8 threads, without Redis and with it.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time

import pytest

from tests.server import Server, q

pytestmark = pytest.mark.e2e

_SEED = ("CREATE TABLE t (id INTEGER PRIMARY KEY); "
         "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 25) INSERT INTO t SELECT i FROM n;")


def _setup(s: Server) -> Server:
    s.sqlite_db("lite.db", _SEED)
    s.connection("lite", "lite.db")
    s.query("ids", "SELECT id FROM t ORDER BY id", "lite")
    s.query("broken", "SELECT no_such_column FROM t", "lite")
    return s


@pytest.fixture(scope="module", params=["one-worker", "redis"])
def quota_server(request):
    if request.param == "redis":
        from tests.services import redis_url
        s = Server(env={"QAG_REDIS_URL": redis_url()}, workers=2)
    else:
        s = Server(workers=2)   # without Redis the host table counts for both workers
    yield _setup(s)
    s.close()


def _next_midnight() -> str:
    tomorrow = _dt.date.today() + _dt.timedelta(days=1)
    return f"{tomorrow.isoformat()} 00:00:00"


def test_b6_17_calls_quota(quota_server, uniq):
    s = quota_server
    name = uniq("qc")
    key = s.key(name, quota={"calls": 3, "per": "day"})
    seen = []
    for _ in range(3):
        r = s.get(q("ids"), key=key)
        assert r.status == 200 and r.headers["x-quota-reset"] == _next_midnight()
        assert "x-quota-remaining-rows" not in r.headers
        seen.append(r.headers["x-quota-remaining-calls"])
    assert seen == ["2", "1", "0"]
    r = s.get(q("ids"), key=key)
    assert r.status == 429 and r.json["code"] == "quota_exceeded"
    assert list(r.json) == ["error", "code", "quota", "limit", "resets_at", "retry_after", "request_id"]
    assert r.json["quota"] == "calls" and r.json["limit"] == 3 and r.json["resets_at"] == _next_midnight()
    assert r.json["error"] == f"This caller's daily quota of 3 calls is used up - it resets at {_next_midnight()}"
    assert r.headers["x-quota-reset"] == _next_midnight() and r.headers["x-quota-remaining-calls"] == "0"
    assert 1 <= int(r.headers["retry-after"]) <= 86400 and r.json["retry_after"] == int(r.headers["retry-after"])
    assert s.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "lite"}, key=key).status == 429
    admin = s.get(q("ids"))
    assert admin.status == 200 and "x-quota-reset" not in admin.headers   # the admin key has no quota
    view = s.get(f"/api/v1/api-keys/{name}").json["usage_this_period"]
    assert view == {"per": "day", "period_start": f"{_dt.date.today().isoformat()} 00:00:00",
                    "resets_at": _next_midnight(), "calls": 3, "rows": 30, "calls_limit": 3, "rows_limit": None}


def test_b6_17_cached_calls_count(quota_server, uniq):
    """B6.17, cached query: a response-cache hit counts toward the quota like a call that ran."""
    s = quota_server
    query = uniq("cached")
    s.query(query, "SELECT id FROM t WHERE id < 3 ORDER BY id", "lite", cache_ttl=60)
    key = s.key(uniq("qcc"), quota={"calls": 2, "per": "day"}, queries=[query])
    first = s.get(q(query), key=key)
    assert first.status == 200 and first.headers["x-cache"] == "MISS"
    assert first.headers["x-quota-remaining-calls"] == "1"
    second = s.get(q(query), key=key)
    assert second.status == 200 and second.headers["x-cache"] == "HIT"
    assert second.headers["x-quota-remaining-calls"] == "0"
    third = s.get(q(query), key=key)
    assert third.status == 429 and third.json["code"] == "quota_exceeded"
    assert third.json["quota"] == "calls" and third.json["limit"] == 2


def test_quota_headers_on_every_route(quota_server, uniq):
    s = quota_server
    key = s.key(uniq("qh"), quota={"calls": 5, "rows": 100, "per": "month"})
    today = _dt.date.today()
    first = _dt.date(today.year + (today.month == 12), today.month % 12 + 1, 1)
    for path, status in (("/api/v1/connections", 403), ("/no/such/route", 404), ("/openapi.json", 200),
                         (q("no_such_query"), 404)):
        r = s.get(path, key=key)
        assert r.status == status, (path, r)
        assert r.headers["x-quota-reset"] == f"{first.isoformat()} 00:00:00", path
        assert r.headers["x-quota-remaining-calls"] == "5" and r.headers["x-quota-remaining-rows"] == "100", path
    plain = s.key(uniq("qh"))
    assert "x-quota-reset" not in s.get(q("ids"), key=plain).headers


def test_b6_18_rows_quota(quota_server, uniq):
    s = quota_server
    key = s.key(uniq("qr"), quota={"rows": 15, "per": "day"})
    r = s.get(q("ids") + "?page_size=10", key=key)
    assert r.status == 200 and r.headers["x-row-count"] == "10" and r.headers["x-quota-remaining-rows"] == "5"
    assert "x-quota-remaining-calls" not in r.headers
    r = s.get(q("ids") + "?page=2&page_size=10", key=key)      # crosses the quota: completes
    assert r.status == 200 and r.headers["x-row-count"] == "10" and r.headers["x-quota-remaining-rows"] == "0"
    r = s.get(q("ids") + "?page_size=10", key=key)
    assert r.status == 429 and r.json["quota"] == "rows" and r.json["limit"] == 15
    assert r.json["error"].startswith("This caller's daily quota of 15 rows is used up")


def test_b6_19_refused_calls_do_not_count(quota_server, uniq):
    s = quota_server
    key = s.key(uniq("qe"), quota={"calls": 1, "per": "day"})
    assert s.get(q("no_such_query"), key=key).status == 404
    assert s.get(q("ids") + "?page=0", key=key).status == 400
    assert s.get(q("broken"), key=key).status == 500           # a failing query is a refused call too
    r = s.get(q("ids"), key=key)
    assert r.status == 200 and r.headers["x-quota-remaining-calls"] == "0"
    assert s.get(q("ids"), key=key).status == 429


def test_stream_rows_count_as_they_leave_and_usage_lists_them(quota_server, uniq):
    s = quota_server
    name = uniq("qs")
    key = s.key(name, quota={"calls": 10, "rows": 30, "per": "day"})
    r = s.get(q("ids") + "?stream=true&format=csv", key=key)
    assert r.status == 200 and r.body.count(b"\r\n") == 26
    assert r.headers["x-quota-remaining-calls"] == "9"             # the call; its rows follow the headers
    r = s.get(q("ids") + "?page_size=3", key=key)
    assert r.status == 200 and r.headers["x-quota-remaining-rows"] == "2"   # 30 - 25 streamed - 3
    deadline = time.monotonic() + 10
    while True:   # with several workers the store copy lags by a flush interval; Redis and one worker don't
        items = [i for i in s.get("/api/v1/usage/quotas").json["items"] if i["caller"] == name]
        if items and items[0]["rows"] == 28 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(items) == 1 and items[0]["per"] == "day" and items[0]["period"] == _dt.date.today().isoformat()
    assert items[0]["calls"] == 2 and items[0]["rows"] == 28 and items[0]["updated_at"].startswith(
        _dt.date.today().isoformat())
    assert s.get("/api/v1/usage/quotas", key=key).status == 403


# --- several workers ---------------------------------------------------------------------------------------------

def _hammer(s: Server, key: str, threads: int, seconds: float) -> list[tuple[float, float, int]]:
    """(start, end, status) of every call that `threads` clients make back to back for `seconds`."""
    out: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client():
        while time.monotonic() < stop:
            start = time.monotonic()
            status = s.get(q("ids") + "?page_size=1", key=key).status
            with lock:
                out.append((start, time.monotonic(), status))

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return out


FLUSH = 0.5   # QAG_HISTORY_FLUSH_INTERVAL of the 4-worker servers


def test_four_workers_without_redis_allow_exactly_the_limit(uniq):
    """Without Redis: the host table counts for every worker, so exactly the limit, and the store gets it."""
    s = _setup(Server(env={"QAG_HISTORY_FLUSH_INTERVAL": str(FLUSH)}, workers=4))
    try:
        limit = 20
        name = uniq("q4")
        key = s.key(name, quota={"calls": limit, "per": "day"})
        calls = _hammer(s, key, threads=8, seconds=2.0)
        ok = [c for c in calls if c[2] == 200]
        assert {c[2] for c in calls} == {200, 429}
        assert len(ok) == limit
        assert all(s.get(q("ids"), key=key).status == 429 for _ in range(8))
        time.sleep(FLUSH + 0.5)
        stored = [i for i in s.get("/api/v1/usage/quotas").json["items"] if i["caller"] == name]
        assert stored[0]["calls"] == len(ok)                         # the store's count is exact
    finally:
        s.close()


def test_four_workers_with_redis_allow_exactly_the_limit(uniq):
    from tests.services import redis_url
    s = _setup(Server(env={"QAG_REDIS_URL": redis_url(), "QAG_HISTORY_FLUSH_INTERVAL": str(FLUSH)}, workers=4))
    try:
        limit = 20
        key = s.key(uniq("q4r"), quota={"calls": limit, "per": "day"})
        calls = _hammer(s, key, threads=8, seconds=2.0)
        assert sum(1 for c in calls if c[2] == 200) == limit
        assert {c[2] for c in calls} == {200, 429}
    finally:
        s.close()
