"""Quotas.admit with Redis (qag/policy/quotas.py): the key's bucket and the quota both in Redis, one after the
other as take() then begin() (the host table's single step is for counts kept on this host)."""

from __future__ import annotations

import time

from qag.policy.hostlimits import HostTable
from qag.policy.quotas import Quotas, period
from qag.policy.redislimits import LimitStats, RateLimiter
from qag.redisconn import SharedRedis
from qag.store.sqlite import SqliteStore
from tests.services import redis_url


def test_admit_with_redis_is_take_then_begin(tmp_path, uniq):
    shared = SharedRedis(redis_url())
    name = uniq("admit")
    stats = LimitStats()
    table = HostTable.create(64)
    buckets = RateLimiter("key", shared, stats, table=table)
    quotas = Quotas(SqliteStore(str(tmp_path)), shared, stats, interval=60, table=table)
    quota = {"calls": 2, "per": "day"}
    try:
        results = [quotas.admit(name, quota, True, buckets, 3, 60.0) for _ in range(4)]
        assert [r[1][0] for r in results] == [2, 1, 0, 0] and results[3][1][1] > 0   # Redis's bucket
        assert [r[0].refused for r in results] == [None, None, "calls", None]        # the 4th: rate-limited
        assert all(r[0].remote for r in results) and results[3][0].calls == 2
        assert stats.rejections == 1 and table.stats()["used"] == 0   # nothing counted on this host
    finally:
        key = ("default", name, "day", period("day", time.time())[0])
        shared.client().delete(quotas.redis_key(key), f"qag:ratelimit:key:{name}")
        quotas.close()
        table.close()
