"""qag/policy/quotas.py with a real SQLite store and an injected clock: calendar periods in server-local time,
reservation and settling, the store shared by several Quotas (workers), the fallback when Redis is unreachable (the
counters in a real Redis: tests/integration/test_quotas_redis.py)."""

from __future__ import annotations

import os
import time

import pytest

from qag.policy.quotas import Quotas, local_text, period
from qag.policy.redislimits import LimitStats
from qag.redisconn import SharedRedis
from qag.store.sqlite import SqliteStore
from tests.services import dead_redis_url



def _at(text: str) -> float:
    """A server-local wall-clock time as a Unix time."""
    return time.mktime(time.strptime(text, "%Y-%m-%d %H:%M:%S"))


class Clock:
    def __init__(self, at: float):
        self.now = at

    def __call__(self) -> float:
        return self.now


def test_day_and_month_periods_are_server_local(tz):
    tz("Pacific/Auckland")  # UTC+13 in January: the local date is a day ahead of UTC's for half of it
    now = _at("2026-01-31 08:30:00")
    assert time.gmtime(now).tm_mday == 30           # still the 30th in UTC
    text, start, reset = period("day", now)
    assert text == "2026-01-31" and local_text(start) == "2026-01-31 00:00:00"
    assert local_text(reset) == "2026-02-01 00:00:00" and reset - now == 15.5 * 3600
    text, start, reset = period("month", now)
    assert text == "2026-01" and local_text(start) == "2026-01-01 00:00:00"
    assert local_text(reset) == "2026-02-01 00:00:00"
    assert period("month", _at("2026-12-15 12:00:00"))[0] == "2026-12"
    assert local_text(period("month", _at("2026-12-15 12:00:00"))[2]) == "2027-01-01 00:00:00"


def test_a_dst_day_resets_at_the_next_local_midnight(tz):
    tz("Europe/Berlin")  # 2026-03-29 has 23 hours there
    now = _at("2026-03-29 00:00:00")
    _text, start, reset = period("day", now)
    assert start == now and reset - start == 23 * 3600 and local_text(reset) == "2026-03-30 00:00:00"


def test_retry_after_and_reset_follow_the_injected_clock(tmp_path, tz):
    tz("UTC")
    clock = Clock(_at("2026-11-30 23:59:30"))
    q = Quotas(SqliteStore(str(tmp_path)), clock=clock)
    quota = {"calls": 2, "per": "month"}
    for left in ("1", "0"):
        t = q.begin("k", quota, reserve=True)
        assert t.refused is None
        t.settle(True, 5)
        assert dict(t.headers()) == {"X-Quota-Reset": "2026-12-01 00:00:00", "X-Quota-Remaining-Calls": left}
    t = q.begin("k", quota, reserve=True)
    assert t.refused == "calls"
    error = t.error()
    assert error.status == 429 and error.code == "quota_exceeded"
    assert error.envelope("rid") == {
        "error": "This caller's monthly quota of 2 calls is used up - it resets at 2026-12-01 00:00:00",
        "code": "quota_exceeded", "quota": "calls", "limit": 2, "resets_at": "2026-12-01 00:00:00",
        "retry_after": 30, "request_id": "rid"}
    clock.now += 31  # a new month: a fresh count
    t = q.begin("k", quota, reserve=True)
    assert t.refused is None and t.calls == 1 and t.reset_text == "2027-01-01 00:00:00"


def test_refused_calls_are_given_back_and_the_row_crossing_call_completes(tmp_path):
    q = Quotas(SqliteStore(str(tmp_path)))
    quota = {"rows": 15, "per": "day"}
    t = q.begin("k", quota, reserve=True)
    t.settle(False)                                      # a 404 or 400: nothing counted
    assert (t.calls, t.rows) == (0, 0)
    t = q.begin("k", quota, reserve=True)
    t.settle(True, 10)
    assert dict(t.headers())["X-Quota-Remaining-Rows"] == "5"
    t = q.begin("k", quota, reserve=True)                # 10 more rows: crosses 15, still allowed
    assert t.refused is None
    t.settle(True, 10)
    assert dict(t.headers())["X-Quota-Remaining-Rows"] == "0" and t.rows == 20
    t = q.begin("k", quota, reserve=True)
    assert t.refused == "rows" and "daily quota of 15 rows" in t.error().message
    assert "X-Quota-Remaining-Calls" not in dict(t.headers())   # only the limits that are set


def test_workers_share_counts_through_the_store_within_one_flush(tmp_path):
    """Two Quotas on one store are two workers: each sees the other's flushed counts at its next re-read."""
    a, b = Quotas(SqliteStore(str(tmp_path)), interval=60), Quotas(SqliteStore(str(tmp_path)), interval=60)
    quota = {"calls": 5, "per": "day"}
    for _ in range(3):
        a.begin("k", quota, reserve=True).settle(True, 1)
    assert b.begin("k", quota, reserve=False).calls == 0      # a has written nothing yet
    assert a.flush()
    time.sleep(1.05)                                          # b's view may be a second old
    assert b.begin("k", quota, reserve=False).calls == 3
    b.begin("k", quota, reserve=True).settle(True, 1)
    b.begin("k", quota, reserve=True).settle(True, 1)
    assert b.begin("k", quota, reserve=True).refused == "calls"   # 3 stored + 2 of b's own
    b.flush()
    usage = {(u["caller"], u["per"]): u for u in a.usage()}
    assert usage[("k", "day")]["calls"] == 5 and usage[("k", "day")]["rows"] == 5
    assert a.begin("k", quota, reserve=False).calls == 5     # a moved its written counts into its view


def _counted(tmp_path, calls: int, rows: int = 2):
    """A store, its quota writer with one call of `rows` counted for key k (quota `calls` a day), and the store's
    own add_quota_usage, for a test that replaces it."""
    store = SqliteStore(str(tmp_path))
    q = Quotas(store, interval=60)
    quota = {"calls": calls, "per": "day"}
    q.begin("k", quota, reserve=True).settle(True, rows)
    return store, q, quota, store.add_quota_usage


def test_a_write_whose_commit_reply_was_lost_is_not_counted_twice(tmp_path):
    """The store applied a flush but the reply never came (the connection broke after the COMMIT left): the flush
    is sent again as it was, under its id, and the store skips it; calls counted since go in a flush of their own."""
    store, q, quota, real = _counted(tmp_path, 30)

    def applied_then_lost(*args, **kw):
        real(*args, **kw)
        raise RuntimeError("server closed the connection unexpectedly")

    store.add_quota_usage = applied_then_lost
    assert not q.flush() and not q.flush()
    store.add_quota_usage = real
    q.begin("k", quota, reserve=True).settle(True, 3)
    assert q.flush()
    key = ("default", "k", "day", period("day", time.time())[0])
    assert store.quota_counts([key]) == {key: (2, 5)}
    assert q.begin("k", quota, reserve=False).calls == 2


def test_a_failed_write_keeps_the_counts(tmp_path):
    store, q, quota, real = _counted(tmp_path, 3)

    def busy(*args, **kw):
        raise RuntimeError("store busy")

    store.add_quota_usage = busy
    assert not q.flush()
    assert q.begin("k", quota, reserve=False).calls == 1      # still counted here
    store.add_quota_usage = real
    assert q.flush()
    assert store.quota_counts([("default", "k", "day", period("day", time.time())[0])]) == {
        ("default", "k", "day", period("day", time.time())[0]): (1, 2)}


def test_old_counts_are_pruned(tmp_path):
    store = SqliteStore(str(tmp_path))
    store.add_quota_usage([("default", "old", "day", "2020-01-01", 1, 1)], at=100)
    store.add_quota_usage([("default", "new", "day", "2026-01-01", 1, 1)], at=int(time.time()))
    assert store.prune_quota_usage(int(time.time()) - 400 * 86400) == 1
    assert [r["caller"] for r in store.quota_usage_in([("day", "2020-01-01"), ("day", "2026-01-01")])] == ["new"]


# --- Redis ---------------------------------------------------------------------------------------------------------

def test_redis_failure_falls_back_to_the_store_view(tmp_path, uniq):
    pytest.importorskip("redis", reason="the redis extra (pip install 'qag[redis]'); no server is needed")
    stats = LimitStats()
    q = Quotas(SqliteStore(str(tmp_path)), SharedRedis(dead_redis_url()), stats, interval=60)
    quota = {"calls": 2, "per": "day"}
    name = uniq("quota")
    t = q.begin(name, quota, reserve=True)
    assert not t.remote and t.refused is None
    t.settle(True, 1)
    q.begin(name, quota, reserve=True).settle(True, 1)
    assert q.begin(name, quota, reserve=True).refused == "calls"
    assert stats.fallbacks >= 3
