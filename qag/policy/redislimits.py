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
# count per period, capped at count; takes one token when there is one. The count and period come with each call,
# not in the bucket's name: a key whose limit an administrator changes keeps what it used, within the new
# capacity (as in the host table), instead of starting over with a full bucket. The hash expires once it would be full
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
# worker that died holding a slot frees it when its lease ends at the latest. KEYS[2], the holder's index
# (`qag:holder:<holder host>:<pid>`, see holder_host), names the sets the process holds leases in, kept as long as its longest lease: the
# master gives a dead worker's leases back at once (sweep) without scanning Redis. KEYS[3], the member's tombstone
# (`<set>:gone:<member>`, see _GIVE_BACK): an ACQUIRE that finds it was given back already - its worker gave up on
# it, and it reached Redis late, over the connection it was sent on - adds nothing (0, as a refusal: nobody waits for
# its reply). ARGV: limit, lease seconds, member.
_ACQUIRE = """
if redis.call('EXISTS', KEYS[3]) == 1 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
local ttl = math.ceil(tonumber(ARGV[2])) + 1
if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
redis.call('SADD', KEYS[2], KEYS[1])
if redis.call('TTL', KEYS[2]) < ttl then redis.call('EXPIRE', KEYS[2], ttl) end
return 1
"""

# Extend a held lease (a stream still sending), and its holder's index with it; a lease that already expired is not
# brought back.
_RENEW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ok = redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[2])
local ttl = math.ceil(tonumber(ARGV[1])) + 1
if redis.call('TTL', KEYS[1]) < ttl then redis.call('EXPIRE', KEYS[1], ttl) end
if redis.call('TTL', KEYS[2]) < ttl then redis.call('EXPIRE', KEYS[2], ttl) end
return ok
"""

# Give back a lease whose ACQUIRE's outcome is unknown (its reply was lost): remove the member if it is there, and
# leave its tombstone KEYS[2] for ARGV[2] seconds (the lease's length), so the ACQUIRE, if it is still on its way
# (TCP delivers what an old connection held late, after this ran over a new one), adds nothing. Removing alone left
# that late lease to refuse the key's calls on every instance until it ran out.
_GIVE_BACK = """
redis.call('SET', KEYS[2], '1', 'EX', ARGV[2])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""

# A dead process's leases in one set: its members start with ARGV[1] (`<host>:<pid>:`).
_SWEEP = """
local freed = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, 1, #ARGV[1]) == ARGV[1] then freed = freed + redis.call('ZREM', KEYS[1], member) end
end
return freed
"""

LEASE_MARGIN = 30.0        # a slot's lease: the call's time limit + this (contract 6.7)
LEASE_UNLIMITED = 3630.0   # ... or this without a time limit
RELEASE_RETRY = 1.0        # seconds between two tries at giving back the leases whose release failed
RELEASES_KEPT = 1024       # failed releases a process keeps to try again; beyond them a lease runs its course
SWEEP_TIMEOUT = 0.25       # seconds the master waits on Redis for each step of a dead worker's sweep


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
            key = f"{redis.prefix}ratelimit:{self.kind}:{ident}"
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
    """A lease in `qag:<deployment>:running:<key name>`: released once; renewed (at most every third of its length) while a
    stream is still sending."""

    __slots__ = ("pool", "key", "member", "lease", "holder", "_renewed")

    def __init__(self, pool: "SlotPool", key: str, member: str, lease: float, holder: str):
        self.pool, self.key, self.member, self.lease, self.holder = pool, key, member, lease, holder
        self._renewed = time.monotonic()

    def renew(self) -> None:
        pool = self.pool
        now = time.monotonic()
        if pool is None or now - self._renewed < self.lease / 3:
            return
        self._renewed = now
        # On failure the lease simply runs its course; counting goes on in-process for new calls meanwhile.
        pool.redis.call(lambda r: pool._renew_script(r)(keys=[self.key, self.holder],
                                                        args=[self.lease, self.member], client=r),
                        lambda: None)

    def release(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            # Tried even while this worker backs off from Redis after a hiccup: a lease left behind would refuse
            # the key's calls until it runs out (up to an hour without a time limit). When it fails it is kept
            # and tried again until Redis answers.
            pool.redis.call_now(lambda r: r.zrem(self.key, self.member),
                                lambda: pool._keep(self.key, self.member, self._renewed + self.lease))


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
        self._give_back = None
        self._host = holder_host()
        # (set, member) → (when its lease runs out (monotonic), its tombstone's seconds: 0 for a lease held)
        self._unreleased: dict[tuple[str, str], tuple[float, int]] = {}
        self._retrying = False                                 # a thread is trying them again
        self._lock = threading.Lock()

    def acquire(self, name: str, limit: int, timeout: float | None):
        if self.redis is None:
            return self._local(name, limit)
        lease = (timeout + LEASE_MARGIN) if timeout else LEASE_UNLIMITED
        key = f"{self.redis.prefix}running:{name}"
        pid = os.getpid()
        member = f"{self._host}:{pid}:{os.urandom(6).hex()}"  # unique per lease, and says whose it is
        holder = holder_index(self._host, pid)
        return self.redis.call(lambda r: self._remote(r, key, limit, lease, member, holder),
                               lambda: self._fallback(name, limit))

    def _remote(self, client, key: str, limit: int, lease: float, member: str, holder: str):
        if self._acquire is None:
            self._acquire = client.register_script(_ACQUIRE)
        try:
            took = int(self._acquire(keys=[key, holder, gone_key(key, member)], args=[limit, lease, member],
                                     client=client))
        except BaseException:
            # The outcome is unknown (the script may have run and its reply been lost, or it may still be on its
            # way): the call goes on with the host's count, so a lease it may have added is given back as a failed
            # release is, with a tombstone that keeps the ACQUIRE from adding it later; otherwise nothing but a
            # refused call would remove it before it runs out (up to an hour). Removing a member that was never
            # added does nothing.
            self._keep(key, member, time.monotonic() + lease, math.ceil(lease) + 1)
            raise
        if not took:
            return None
        return _RedisSlot(self, key, member, lease, holder)

    def _keep(self, key: str, member: str, runs_out: float, gone: int = 0) -> None:
        """A release Redis did not take (down, or not answering), or an acquire whose outcome is unknown (`gone`:
        its tombstone's seconds): kept, and tried again every RELEASE_RETRY s by a thread of its own until Redis
        answers or the lease has run out by itself. Without it the key's calls would be refused on every instance
        until then (up to an hour without a time limit)."""
        with self._lock:
            if len(self._unreleased) < RELEASES_KEPT:
                self._unreleased[(key, member)] = (runs_out, gone)
            if self._retrying:
                return
            self._retrying = True
        threading.Thread(target=self._retry_releases, name="qag-slot-release", daemon=True).start()

    def _retry_releases(self) -> None:
        import redis
        while True:
            time.sleep(RELEASE_RETRY)
            with self._lock:
                now = time.monotonic()
                for item in [item for item, (runs_out, _) in self._unreleased.items() if runs_out <= now]:
                    del self._unreleased[item]
                pending = list(self._unreleased.items())
                if not pending:
                    self._retrying = False
                    return
            # Straight to the client, not through call(): a try in the background neither starts nor ends the
            # back-off the calls see.
            try:
                client = self.redis.client()
                if self._give_back is None:
                    self._give_back = client.register_script(_GIVE_BACK)
                pipe = client.pipeline(transaction=False)
                for (key, member), (_, gone) in pending:
                    if gone:
                        self._give_back(keys=[key, gone_key(key, member)], args=[member, gone], client=pipe)
                    else:
                        pipe.zrem(key, member)
                pipe.execute()
            except (redis.RedisError, OSError, ValueError):
                continue
            with self._lock:
                for item, _ in pending:
                    self._unreleased.pop(item, None)

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


_instance: str | None = None   # set by the master before it forks (start_instance); its workers inherit it


def start_instance() -> None:
    """Master, before any fork: a random tag of this gunicorn instance that its workers inherit, so that the leases
    and holder indexes of two instances whose host names and worker pids are the same (containers) stay apart
    though the master's sweep opens no store and so doesn't know the deployment's prefix."""
    global _instance
    if _instance is None:
        _instance = os.urandom(6).hex()


def holder_host() -> str:
    """Who holds a lease, before the pid: the host name, and the gunicorn instance's tag when there is one."""
    host = os.uname().nodename
    return host if _instance is None else f"{host}/{_instance}"


def gone_key(key: str, member: str) -> str:
    """The tombstone of a hold given back before the outcome of the script that took it was known: of a lease
    (`key` its set, `member` the lease) or of a quota reservation (`key` the reserved_index, `member` its token).
    A set or index named like a tombstone would need a caller's name (a bearer user's may hold ':') to end in
    `<set>:gone:` followed by a random member or token, which no name can know beforehand."""
    return f"{key}:gone:{member}"


def holder_index(host: str, pid: int) -> str:
    """The set naming the `qag:<deployment>:running:*` sets a process holds (or held) leases in."""
    return f"qag:holder:{host}:{pid}"


def reserved_index(host: str, pid: int) -> str:
    """The hash of the quota calls a process reserved in Redis and has not settled yet: a token per reservation
    -> the `qag:<deployment>:quota:*` counter it is counted in (quotas.py)."""
    return f"qag:reserved:{host}:{pid}"


def sweep(url: str, pid: int, host: str | None = None) -> int:
    """Master, a worker gone: give back the leases it held in Redis, which would otherwise refuse their keys' calls
    until they run out, and the quota calls it reserved and never settled, which would otherwise stay counted
    for the period. Best effort on a connection of its own, closed after: two round trips (its two indexes, then
    every set and counter they name), each waiting at most SWEEP_TIMEOUT, no retry; a lease left runs out by
    itself, a reservation left stays counted. Returns the leases and reservations given back."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from .quotas import REDIS_EXPIRY, SETTLE
    host = host if host is not None else holder_host()
    index, reserved = holder_index(host, pid), reserved_index(host, pid)
    client = redis.Redis.from_url(url, socket_timeout=SWEEP_TIMEOUT, socket_connect_timeout=SWEEP_TIMEOUT,
                                  health_check_interval=0, retry=Retry(NoBackoff(), 0))
    try:
        pipe = client.pipeline(transaction=False)
        pipe.smembers(index)
        pipe.hgetall(reserved)
        keys, held = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.eval(_SWEEP, 1, key, f"{host}:{pid}:")
        for token, counter in held.items():   # each given back as its worker would have (once, by its token)
            pipe.eval(SETTLE, 2, counter, reserved, -1, 0, REDIS_EXPIRY, token)
        pipe.delete(index, reserved)
        done = pipe.execute()[:-1]
        return sum(done[:len(keys)]) + sum(1 for given in done[len(keys):] if given is not None)
    finally:
        client.close()
