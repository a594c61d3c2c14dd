"""Rate limits and max_concurrent slots (contract 6.6, 6.7, 7.4): shared through Redis by every instance when
configured, else (and while Redis fails) by every worker of the host through the host table (hostlimits.py), and
counted by the worker alone (limits.py) only when the host table has no room.

Each limiter costs a call one Redis round trip at most (EVALSHA of a small Lua script that reads Redis's own clock,
so every worker and instance agrees on the time). When Redis fails, the process's `SharedRedis` backs off for 5 s
and logs; meanwhile the host's workers count together in the host table and every such call is counted in
`LimitStats.fallbacks` (`queryapigate_rate_limit_fallbacks_total`). It goes back to Redis by itself. A call the
host table has no room for is counted in `fallbacks` too, and in `LimitStats.table_full`.
"""

from __future__ import annotations

import math
import os
import threading
import time

from .hostlimits import HostTable
from .limits import Buckets, Slot, Slots

# A token bucket on Redis's clock: hash fields tokens and seen (seconds, fractional). Refills continuously at
# count per period, capped at count; takes one token when there is one. The hash expires once it would be full
# again, so idle identities cost nothing. Returns {1 or 0, tokens left as text}.
_BUCKET = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local count = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local h = redis.call('HMGET', KEYS[1], 'tokens', 'seen')
local tokens = tonumber(h[1])
if tokens == nil then
  tokens = count
else
  local elapsed = now - (tonumber(h[2]) or now)
  if elapsed < 0 then elapsed = 0 end
  tokens = math.min(count, tokens + elapsed * count / period)
end
local ok = 0
if tokens >= 1 then
  tokens = tokens - 1
  ok = 1
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'seen', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], math.ceil(period) + 1)
return {ok, string.format('%.17g', tokens)}
"""

# max_concurrent: a sorted set of leases scored by their expiry on Redis's clock. Expired leases go first, so a
# worker that died holding a slot frees it when its lease ends. ARGV: limit, lease seconds, member.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
local ttl = math.ceil(tonumber(ARGV[2])) + 1
if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return 1
"""

# Extend a held lease (a stream still sending); a lease that already expired is not brought back.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ok = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
local ttl = math.ceil(tonumber(ARGV[1])) + 1
if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
return ok
"""

LEASE_MARGIN = 30.0        # a slot's lease: the call's time limit + this (contract 6.7)
LEASE_UNLIMITED = 3630.0   # ... or this without a time limit


class LimitStats:
    """Counters of the limiters of one worker: rejections (429 rate_limited), calls not counted in Redis (which
    failed) or in the host table (`fallbacks`), and of those the ones the host table had no room for."""

    __slots__ = ("rejections", "fallbacks", "table_full", "_lock")

    def __init__(self):
        self.rejections = 0
        self.fallbacks = 0
        self.table_full = 0
        self._lock = threading.Lock()

    def rejected(self) -> None:
        with self._lock:
            self.rejections += 1

    def fell_back(self) -> None:
        with self._lock:
            self.fallbacks += 1

    def no_room(self) -> None:
        with self._lock:
            self.fallbacks += 1
            self.table_full += 1


class RateLimiter:
    """Token buckets of one kind (`client` by address, `key` by key name): in Redis when configured, else (and
    while Redis fails) in the host table, or in this process without one (or when it has no room). `take()` has
    the signature and results of `Buckets.take`."""

    def __init__(self, kind: str, redis, stats: LimitStats, local: Buckets | None = None,
                 table: HostTable | None = None):
        self.kind = kind
        self.redis = redis
        self.stats = stats
        self.local = local if local is not None else Buckets()
        self.table = table
        self._script = None

    def take(self, ident, count: int, period: float) -> tuple[int, int]:
        redis = self.redis
        if redis is None:
            result = self._host(ident, count, period)
        else:
            key = f"qag:ratelimit:{self.kind}:{count}/{int(period)}:{ident}"
            result = redis.call(lambda r: self._remote(r, key, count, period),
                                lambda: self._fallback(ident, count, period))
        if result[1]:
            self.stats.rejected()
        return result

    def _remote(self, client, key: str, count: int, period: float) -> tuple[int, int]:
        if self._script is None:
            self._script = client.register_script(_BUCKET)
        ok, tokens = self._script(keys=[key], args=[count, period], client=client)
        tokens = float(tokens)
        if int(ok):
            return int(tokens), 0
        return 0, max(1, math.ceil((1.0 - tokens) * period / count))

    def _host(self, ident, count: int, period: float) -> tuple[int, int]:
        table = self.table
        if table is not None:
            result = table.take(self.kind, ident, count, period)
            if result is not None:
                return result
            self.stats.no_room()
        return self.local.take(ident, count, period)

    def _fallback(self, ident, count: int, period: float) -> tuple[int, int]:
        self.stats.fell_back()
        return self._host(ident, count, period)


class _RedisSlot:
    """A lease in `qag:running:<key name>`: released once; renewed (at most every third of its length) while a
    stream is still sending."""

    __slots__ = ("pool", "key", "member", "lease", "_renewed")

    def __init__(self, pool: "SlotPool", key: str, member: str, lease: float):
        self.pool, self.key, self.member, self.lease = pool, key, member, lease
        self._renewed = time.monotonic()

    def renew(self) -> None:
        pool = self.pool
        now = time.monotonic()
        if pool is None or now - self._renewed < self.lease / 3:
            return
        self._renewed = now
        # On failure the lease simply runs its course; counting goes on in-process for new calls meanwhile.
        pool.redis.call(lambda r: pool._renew_script(r)(keys=[self.key], args=[self.lease, self.member], client=r),
                        lambda: None)

    def release(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            # Tried even while this worker backs off from Redis after a hiccup: a lease left behind would refuse
            # the key's calls until it runs out (up to an hour without a time limit).
            pool.redis.call_now(lambda r: r.zrem(self.key, self.member), lambda: None)


class _LocalSlot(Slot):
    __slots__ = ()

    def renew(self) -> None:
        pass  # an in-process slot lives exactly as long as its request


class _HostSlot:
    """One slot in the host table, held by this process (given back by the master if the process dies)."""

    __slots__ = ("table", "name", "at")

    def __init__(self, table: HostTable, name: str, at: tuple):
        self.table, self.name, self.at = table, name, at

    def renew(self) -> None:
        pass  # a host slot lives as long as its request, or its process

    def release(self) -> None:
        table, self.table = self.table, None
        if table is not None:
            table.release(self.name, self.at)


class SlotPool:
    """max_concurrent slots per key name: leases in Redis when configured, else (and while Redis fails) in the
    host table, or in this process without one (or when it has no room). `acquire()` returns a slot to release,
    or None when every slot is held."""

    def __init__(self, redis, stats: LimitStats, local: Slots | None = None, table: HostTable | None = None):
        self.redis = redis
        self.stats = stats
        self.local = local if local is not None else Slots()
        self.table = table
        self._acquire = None
        self._renew = None
        self._host = os.uname().nodename

    def acquire(self, name: str, limit: int, timeout: float | None):
        if self.redis is None:
            return self._local(name, limit)
        lease = (timeout + LEASE_MARGIN) if timeout else LEASE_UNLIMITED
        key = f"qag:running:{name}"
        member = f"{self._host}:{os.getpid()}:{os.urandom(6).hex()}"  # unique per lease, and says whose it is
        return self.redis.call(lambda r: self._remote(r, key, limit, lease, member),
                               lambda: self._fallback(name, limit))

    def _remote(self, client, key: str, limit: int, lease: float, member: str):
        if self._acquire is None:
            self._acquire = client.register_script(_ACQUIRE)
        if not int(self._acquire(keys=[key], args=[limit, lease, member], client=client)):
            return None
        return _RedisSlot(self, key, member, lease)

    def _renew_script(self, client):
        if self._renew is None:
            self._renew = client.register_script(_RENEW)
        return self._renew

    def _local(self, name: str, limit: int):
        table = self.table
        if table is not None:
            took = table.acquire_at(name, limit)
            if took is not None:
                return _HostSlot(table, name, took) if took else None
            self.stats.no_room()
        return _LocalSlot(self.local, name) if self.local.acquire(name, limit) else None

    def _fallback(self, name: str, limit: int):
        self.stats.fell_back()
        return self._local(name, limit)
