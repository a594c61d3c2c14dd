"""qag/policy/redislimits.py against the real Redis: the Lua token bucket on Redis's clock (keys as contract 7.4
names them), leases for max_concurrent, and the in-process fallback with its counter when Redis is unreachable."""

from __future__ import annotations

import time

from qag.policy.redislimits import LimitStats, RateLimiter, SlotPool
from qag.redisconn import SharedRedis
from tests.services import dead_redis_url, redis_url


def test_bucket_in_redis_is_shared_and_keyed_as_the_contract_says(uniq):
    shared = SharedRedis(redis_url())
    ident = uniq("10.0.0.")
    a = RateLimiter("client", shared, LimitStats())
    b = RateLimiter("client", SharedRedis(redis_url()), LimitStats())   # another worker (or instance)
    key = f"qag:ratelimit:client:{ident}"
    try:
        assert [a.take(ident, 3, 60)[0], b.take(ident, 3, 60)[0], a.take(ident, 3, 60)[0]] == [2, 1, 0]
        left, retry = b.take(ident, 3, 60)
        assert left == 0 and 1 <= retry <= 20
        assert a.stats.rejections == 0 and b.stats.rejections == 1
        stored = shared.client().hgetall(key)
        assert set(stored) == {b"tokens", b"seen"} and 0 <= float(stored[b"tokens"]) < 1
        assert 0 < shared.client().ttl(key) <= 61
        # Another identity, or a key of the same name, has its own bucket.
        assert a.take(ident + "x", 3, 60) == (2, 0)
        assert RateLimiter("key", shared, LimitStats()).take(ident, 3, 60) == (2, 0)
    finally:
        shared.client().delete(key, f"qag:ratelimit:client:{ident}x", f"qag:ratelimit:key:{ident}")


def test_a_changed_limit_keeps_what_the_bucket_used(uniq):
    """An administrator who lowers (or raises) a key's limit doesn't hand it a fresh, full bucket: what it used
    stays used, within the new capacity, on every worker and instance (each reads the limit from the key row)."""
    shared = SharedRedis(redis_url())
    ident = uniq("k")
    limiter = RateLimiter("key", shared, LimitStats())
    try:
        assert [limiter.take(ident, 10, 60)[0] for _ in range(10)] == list(range(9, -1, -1))
        assert limiter.take(ident, 10, 60)[0:1] == (0,) and limiter.stats.rejections == 1
        for count in (8, 9, 10, 600):   # lowered, raised again, and raised past what a minute refills
            left, retry = limiter.take(ident, count, 60)
            assert left == 0 and retry >= 1, (count, left, retry)
        assert limiter.stats.rejections == 5
        stored = shared.client().hgetall(f"qag:ratelimit:key:{ident}")
        assert 0 <= float(stored[b"tokens"]) < 1
        # a limit lowered below what is left caps it there
        other = ident + "y"
        assert limiter.take(other, 10, 60) == (9, 0)
        assert limiter.take(other, 3, 60) == (2, 0)
    finally:
        shared.client().delete(f"qag:ratelimit:key:{ident}", f"qag:ratelimit:key:{ident}y")


def test_bucket_refills_on_redis_clock(uniq):
    shared = SharedRedis(redis_url())
    ident = uniq("k")
    limiter = RateLimiter("key", shared, LimitStats())
    try:
        assert limiter.take(ident, 2, 1) == (1, 0)
        assert limiter.take(ident, 2, 1) == (0, 0)
        assert limiter.take(ident, 2, 1)[1] == 1
        time.sleep(0.6)                      # 2 per second: one token back after half a second
        assert limiter.take(ident, 2, 1) == (0, 0)
    finally:
        shared.client().delete(f"qag:ratelimit:key:{ident}")


def test_bucket_falls_back_in_process_and_counts_it():
    stats = LimitStats()
    limiter = RateLimiter("client", SharedRedis(dead_redis_url()), stats)
    assert [limiter.take("a", 2, 60) for _ in range(3)] == [(1, 0), (0, 0), (0, 30)]
    assert stats.fallbacks == 3 and stats.rejections == 1


def test_slots_are_leases_in_a_sorted_set(uniq):
    shared = SharedRedis(redis_url())
    name = uniq("key")
    key = f"qag:running:{name}"
    a, b = SlotPool(shared, LimitStats()), SlotPool(SharedRedis(redis_url()), LimitStats())
    try:
        first = a.acquire(name, 2, 5.0)
        second = b.acquire(name, 2, None)
        assert first is not None and second is not None
        assert a.acquire(name, 2, 5.0) is None and b.acquire(name, 2, 5.0) is None   # shared across pools
        scores = sorted(score for _m, score in shared.client().zrange(key, 0, -1, withscores=True))
        seconds, micros = shared.client().time()
        now = seconds + micros / 1e6
        assert 30 < scores[0] - now <= 35.5 and 3620 < scores[1] - now <= 3630.5   # time limit + 30 s; 3630 s
        first.release()
        first.release()                                  # once only
        third = b.acquire(name, 2, 5.0)
        assert third is not None
        second.release(), third.release()
        assert shared.client().zcard(key) == 0
    finally:
        shared.client().delete(key)


def test_an_expired_lease_frees_its_slot_and_renew_extends(uniq):
    shared = SharedRedis(redis_url())
    name = uniq("key")
    key = f"qag:running:{name}"
    pool = SlotPool(shared, LimitStats())
    try:
        held = pool.acquire(name, 1, 1.0)
        member = held.member
        # A worker that died holding it: its lease ends and the slot is free again (made short here).
        shared.client().zadd(key, {member: float(shared.client().time()[0]) - 1})
        again = pool.acquire(name, 1, 1.0)
        assert again is not None
        before = shared.client().zscore(key, again.member)
        again._renewed -= 60                              # as if a third of the lease had passed
        again.renew()
        assert shared.client().zscore(key, again.member) >= before
        again.release()
    finally:
        shared.client().delete(key)


def test_slots_fall_back_in_process():
    stats = LimitStats()
    pool = SlotPool(SharedRedis(dead_redis_url()), stats)
    slot = pool.acquire("k", 1, None)
    assert slot is not None and pool.acquire("k", 1, None) is None
    slot.release()
    assert pool.acquire("k", 1, None) is not None and stats.fallbacks == 3
