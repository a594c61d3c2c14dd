"""qag/policy/quotas.py's counters in a real Redis: seeded from the store, exact across workers, flushed to it."""

from __future__ import annotations

import time

from qag.policy.quotas import Quotas, period
from qag.redisconn import SharedRedis
from qag.store.sqlite import SqliteStore
from tests.services import redis_url


def _cleanup(shared: SharedRedis, q: Quotas, name: str) -> None:
    for per in ("day", "month"):
        shared.client().delete(q.redis_key(("default", name, per, period(per, time.time())[0])))


def test_redis_counter_is_seeded_from_the_store_and_exact(tmp_path, uniq):
    shared = SharedRedis(redis_url())
    name = uniq("quota")
    store = SqliteStore(str(tmp_path))
    key = ("default", name, "day", period("day", time.time())[0])
    store.add_quota_usage([(*key, 2, 7)], at=int(time.time()))
    a, b = Quotas(store, shared, interval=60), Quotas(SqliteStore(str(tmp_path)), shared, interval=60)
    quota = {"calls": 4, "per": "day"}
    try:
        t = a.begin(name, quota, reserve=True)
        assert t.remote and t.calls == 3 and t.rows == 7    # seeded with the stored 2 calls and 7 rows
        t.settle(True, 3)
        assert b.begin(name, quota, reserve=False).calls == 3  # no flush needed: Redis is shared at once
        t = b.begin(name, quota, reserve=True)
        assert t.calls == 4
        t.settle(True, 1)
        assert a.begin(name, quota, reserve=True).refused == "calls"
        assert shared.client().hgetall(a.redis_key(key))[b"rows"] == b"11"
        assert 0 < shared.client().ttl(a.redis_key(key)) <= 40 * 86400
        a.flush(), b.flush()                                 # the store still gets every count
        assert store.quota_counts([key])[key] == (4, 11)
        items = [u for u in a.usage() if u["caller"] == name]
        assert [(u["per"], u["calls"], u["rows"]) for u in items] == [("day", 4, 11)]
    finally:
        _cleanup(shared, a, name)
