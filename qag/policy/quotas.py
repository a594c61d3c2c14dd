"""Quotas (contract 6.8): calls and rows per caller and calendar period (server-local day or month), checked before
each data call, counted after it: exact for every worker of a host through the host table (hostlimits.py), across
instances through Redis when configured; the store keeps every count (the durable record).

A data call *reserves* its call before it runs (so concurrent calls can't all pass the last free one) and settles
after the response: a 200 keeps the call and adds the page's rows, anything else gives the call back. A stream's
rows are added as they leave; the call that crosses the row quota completes. A reservation is held by its process:
if the worker dies before settling (SIGKILL), the call is given back (hostlimits.py).

Without Redis the host table holds each caller's count of the period: seeded from the store when first needed
(or again after it was evicted, which only happens once the store holds all of it), then counted there by every
worker. Each worker writes the calls it settled and the rows it served to the store (its writer thread, every
QAG_HISTORY_FLUSH_INTERVAL seconds, one transaction) and tells the table, which then knows how much of its count
the store holds. Once a second one worker re-reads the store's counts: what they hold beyond that is other
instances' (sharing the store without Redis), added to what a check sees. So one host is exact; several instances
without Redis exceed a quota by at most what the others serve in QAG_HISTORY_FLUSH_INTERVAL + 1 s after it ran out
(never refuse early). A counter the host table has no room for is checked by the worker alone: the store's counts
(re-read at most once a second) plus its own.

With Redis the counter is the hash `qag:<deployment>:quota:<workspace>~<caller>:<day:YYYY-MM-DD|month:YYYY-MM>` (fields calls,
rows, at; 40-day expiry), checked and reserved atomically by one Lua script and seeded from the store when missing,
so the limit is exact across instances. While Redis fails, the host table decides, as without Redis; what a worker
counted there meanwhile is added to the Redis counter by its next call that reaches Redis (_OWED), unless the
counter was seeded after them (from the store, which may hold them already). A reservation
in Redis is held by its process like a slot lease: the script records it under a random token in the process's
`qag:reserved:<host>/<instance>:<pid>` hash (redislimits.reserved_index), the settle removes it and applies the
call's outcome only when it was still there (so a settle is applied once however often it is sent), and the master
gives back what a dead worker left there (redislimits.sweep). A settle Redis did not take, and a reservation whose
reply was lost (the call then counts in the host table), are sent again by a thread until Redis answers or the
period ends; the latter leaves a tombstone of its token, so its RESERVE, if Redis gets it only later (held in the old
connection), reserves nothing.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import threading
import time
import weakref
from typing import Callable

from ..errors import QagError
from .hostlimits import HostTable
from .redislimits import gone_key, holder_host, reserved_index

log = logging.getLogger("qag")

WORKSPACE = "default"
RETENTION_DAYS = 400          # stored counts are kept this long (contract 6.8)
REDIS_EXPIRY = 40 * 86400     # seconds a Redis counter lives after its last change
VIEW_MAX_AGE = 1.0            # seconds: a worker re-reads a caller's stored counts at most this often
SETTLE_RETRY = 1.0            # seconds between two tries at the Redis settles that failed
SETTLES_KEPT = 1024           # failed settles a process keeps to try again; beyond them a reservation stays counted
_PRUNE_EVERY = 3600.0
_LOG_EVERY = 60.0

# Check (and with ARGV[6] = 1 reserve one call of) a counter; seed it from ARGV[3..4] when it is missing, or
# answer {-1} when no seed was given so the caller can read the store and ask again. ARGV[1..2]: limits, 0 = none.
# A reservation is recorded in the process's hash KEYS[2] (token ARGV[7] -> the counter) until it is settled; one
# whose token has a tombstone KEYS[3] (see SETTLE) was given back already - its worker gave up on it, and it reached
# Redis late, over the connection it was sent on - and changes nothing ({0, 0, 0}, as a refusal: nobody waits for
# its reply). Returns {1 allowed / 0 refused, calls, rows} after the reservation.
_RESERVE = """
if ARGV[6] == '1' and redis.call('EXISTS', KEYS[3]) == 1 then return {0, 0, 0} end
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then
  if ARGV[3] == '' then return {-1, 0, 0} end
  redis.call('HSET', k, 'calls', ARGV[3], 'rows', ARGV[4], 'born', redis.call('TIME')[1])
end
local h = redis.call('HMGET', k, 'calls', 'rows')
local c = tonumber(h[1]) or 0
local r = tonumber(h[2]) or 0
local ok = 1
if ARGV[6] == '1' then
  local climit = tonumber(ARGV[1])
  local rlimit = tonumber(ARGV[2])
  if (climit > 0 and c >= climit) or (rlimit > 0 and r >= rlimit) then
    ok = 0
  else
    c = redis.call('HINCRBY', k, 'calls', 1)
    redis.call('HSET', k, 'at', redis.call('TIME')[1])
    redis.call('HSET', KEYS[2], ARGV[7], k)
    redis.call('EXPIRE', KEYS[2], ARGV[5])
  end
end
redis.call('EXPIRE', k, ARGV[5])
return {ok, c, r}
"""

# Add what a worker counted in the host table while Redis failed (ARGV[1] calls, ARGV[2] rows, the first of them
# counted at ARGV[3], Unix seconds) to the counter, when the counter was seeded before that ('born', RESERVE): a
# counter seeded later read the store, which may hold them already (a worker writes its counts every second), so
# they are left out rather than counted twice. A counter without 'born' was seeded by a qag before this one, so
# before them. Nothing is added to a counter that is gone. Returns 1 when added.
_OWED = """
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then return 0 end
local born = tonumber(redis.call('HGET', k, 'born'))
if born and born > tonumber(ARGV[3]) then return 0 end
redis.call('HINCRBY', k, 'calls', ARGV[1])
redis.call('HINCRBY', k, 'rows', ARGV[2])
redis.call('HSET', k, 'at', redis.call('TIME')[1])
redis.call('EXPIRE', k, ARGV[4])
return 1
"""

# Add a stream's rows to a counter; returns {calls, rows}, or nil when the counter is gone (Redis lost it: the next
# reservation seeds it again from the store, which gets these rows too, where adding them would make a counter
# without the store's counts).
_ADD = """
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then return false end
local c = redis.call('HINCRBY', k, 'calls', ARGV[1])
local r = redis.call('HINCRBY', k, 'rows', ARGV[2])
redis.call('HSET', k, 'at', redis.call('TIME')[1])
redis.call('EXPIRE', k, ARGV[3])
return {c, r}
"""

# Settle the reservation ARGV[4] held in KEYS[2] (a process's reserved_index): add ARGV[1] calls (0 keeps it, -1
# gives it back) and ARGV[2] rows to its counter KEYS[1], only when the reservation was still held, so sending it
# again after a lost reply (the retry thread), or the master's sweep after a settle, changes nothing. The give-back
# of a reservation whose RESERVE's outcome is unknown (its reply lost) also leaves the token's tombstone KEYS[3] for
# ARGV[5] seconds (until the period ends), so the RESERVE, if it is still on its way (TCP delivers what an old
# connection held late, after this ran over a new one), reserves nothing; without ARGV[5] (or 0) there is none.
# Returns {calls, rows}, or nil when nothing was done.
SETTLE = """
local gone = tonumber(ARGV[5])
if gone and gone > 0 then redis.call('SET', KEYS[3], '1', 'EX', gone) end
local k = KEYS[1]
if redis.call('HDEL', KEYS[2], ARGV[4]) == 0 or redis.call('EXISTS', k) == 0 then return false end
local c = redis.call('HINCRBY', k, 'calls', ARGV[1])
local r = redis.call('HINCRBY', k, 'rows', ARGV[2])
redis.call('HSET', k, 'at', redis.call('TIME')[1])
redis.call('EXPIRE', k, ARGV[3])
return {c, r}
"""


def period(per: str, now: float) -> tuple[str, float, float]:
    """(period text, start, reset) of the server-local calendar day ('YYYY-MM-DD') or month ('YYYY-MM') that
    holds `now`; start and reset are Unix times of local midnight (DST-aware through mktime)."""
    t = time.localtime(now)
    y, m, d = t.tm_year, t.tm_mon, t.tm_mday
    if per == "month":
        start = time.mktime((y, m, 1, 0, 0, 0, 0, 0, -1))
        reset = time.mktime((y + (m == 12), m % 12 + 1, 1, 0, 0, 0, 0, 0, -1))
        return f"{y:04d}-{m:02d}", start, reset
    start = time.mktime((y, m, d, 0, 0, 0, 0, 0, -1))
    reset = time.mktime((y, m, d + 1, 0, 0, 0, 0, 0, -1))  # mktime normalises the 32nd to the 1st
    return f"{y:04d}-{m:02d}-{d:02d}", start, reset


def local_text(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _limit(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class Ticket:
    """One request's view of its caller's quota: the period, the limits, the counts after this call (for the
    X-Quota-* headers) and, for a data call, the reserved call to settle once the response is known."""

    __slots__ = ("quotas", "key", "host_key", "per", "calls_limit", "rows_limit", "reset_at", "reset_text",
                 "start_at", "calls", "rows", "refused", "reserved", "remote", "host", "now", "token")

    def headers(self) -> list[tuple[str, str]]:
        out = [("X-Quota-Reset", self.reset_text)]
        if self.calls_limit is not None:
            out.append(("X-Quota-Remaining-Calls", str(max(0, self.calls_limit - self.calls))))
        if self.rows_limit is not None:
            out.append(("X-Quota-Remaining-Rows", str(max(0, self.rows_limit - self.rows))))
        return out

    def error(self) -> QagError:
        """429 quota_exceeded, exactly as contract 6.8 words it."""
        what = self.refused
        limit = self.calls_limit if what == "calls" else self.rows_limit
        word = "daily" if self.per == "day" else "monthly"
        return QagError("quota_exceeded", f"This caller's {word} quota of {limit} {what} is used up - it resets "
                        f"at {self.reset_text}", quota=what, limit=limit, resets_at=self.reset_text,
                        retry_after=max(1, math.ceil(self.reset_at - self.now)))

    def settle(self, ok: bool, rows: int = 0) -> None:
        """After the response: a 200 keeps the call and adds its rows; anything else gives the call back."""
        if not self.reserved:
            return
        self.reserved = False
        self.quotas._add(self, 0 if ok else -1, rows if ok else 0, stored=1 if ok else 0, settle=True)

    def add_rows(self, rows: int) -> None:
        """A stream's rows, counted as they leave."""
        if rows:
            self.quotas._add(self, 0, rows, stored=0, settle=False)

    def usage(self) -> dict:
        """`usage_this_period` of a key (contract 5.4)."""
        return {"per": self.per, "period_start": local_text(self.start_at), "resets_at": self.reset_text,
                "calls": self.calls, "rows": self.rows, "calls_limit": self.calls_limit,
                "rows_limit": self.rows_limit}


class _Period:
    """A caller's current period (Quotas._period): valid for start <= now < reset in the zone it was made in."""

    __slots__ = ("start", "reset", "zone", "start_at", "reset_text", "key", "host_key")


_PERIODS_MAX = 4096
_open: "weakref.WeakSet[Quotas]" = weakref.WeakSet()


class Quotas:
    """One per worker: the host table's counters (or Redis's), the counts it has not written to the store yet, its
    writer thread, and for a counter the host table has no room for, its own view of the store's counts."""

    def __init__(self, store, redis=None, stats=None, *, interval: float = 1.0, workspace: str = WORKSPACE,
                 clock: Callable[[], float] = time.time, table: HostTable | None = None):
        self.store = store
        self.redis = redis
        self.stats = stats           # LimitStats: Redis fallbacks are counted with the limiters'
        self.interval = interval
        self.workspace = workspace
        self.clock = clock
        # Without one given (a Quotas of its own, in tests), a private table: this Quotas is then a host.
        self.table = table if table is not None else HostTable.create(256)
        self._lock = threading.Lock()        # the dicts below; held for dict operations only
        self._io = threading.Lock()          # store writes and view re-reads, one at a time
        self._view: dict[tuple, list] = {}       # key -> [calls, rows, read at (monotonic)]: no room in the table
        self._reserved: dict[tuple, int] = {}    # key -> this worker's unsettled calls counted by itself alone
        # key -> [calls, rows, last counted at (Unix), calls and rows of those the host table counted]
        self._unwritten: dict[tuple, list] = {}
        self._in_flight: dict[tuple, list] = {}  # being written by flush(), or whose write failed
        self._in_flight_id = ""                  # ... and its id: sent again under it (Store.add_quota_usage)
        self._reserve = self._add_script = self._settle_script = self._owed_script = None
        # key -> [calls, rows, first counted at (Unix)]: counted in the host table while Redis failed, to add to
        # Redis's counter once it answers (_send_owed): without them a caller got its quota again after a stall
        self._owed: dict[tuple, list] = {}
        self._holder = (None, "")                # (pid, its reserved_index): the hash of its Redis reservations
        # token -> (counter, reserved_index, calls, rows, period's end, tombstone: the RESERVE's outcome unknown):
        # Redis settles that failed, tried again
        self._unsettled: dict[str, tuple] = {}
        self._settling = False                   # a thread is trying them again
        # (caller, per) -> _Period: the period's texts and times and the caller's keys, for calls within it
        self._periods: dict[tuple, _Period] = {}
        self._thread_pid = None
        self._stop = threading.Event()
        self._closed = False
        self._logged_at = -_LOG_EVERY
        _open.add(self)

    # --- the request path ---------------------------------------------------------------------------------
    def begin(self, name: str, quota, *, reserve: bool) -> Ticket | None:
        """The caller's ticket (None when `quota` sets no limit). reserve=True (a data call): check and, when
        allowed, reserve one call; `ticket.refused` then names the exhausted quota ('calls'/'rows') or is None."""
        t = self._ticket(name, quota)
        if t is None:
            return None
        self._decide(t, reserve, None)
        return t

    def admit(self, name: str, quota, reserve: bool, limiter, count: int, period: float):
        """A call's key bucket (`limiter`, a RateLimiter, at count per period) then its quota, as
        `limiter.take(name, count, period)` followed by `begin(name, quota, reserve=reserve and not refused)`:
        (ticket or None, (left, retry_after)). Counted in the host table, both are one critical section."""
        t = self._ticket(name, quota)
        if t is None:
            return None, limiter.take(name, count, period)
        taken = None
        if self.redis is None and limiter.redis is None and limiter.table is self.table:
            found = self.table.admit(limiter.kind, name, count, period, t.host_key, t.calls_limit or 0,
                                     t.rows_limit or 0, reserve, VIEW_MAX_AGE)
            if found is not None:
                left, retry, quota_found = found
                taken = (left, retry)
                if retry:
                    limiter.stats.rejected()
                if quota_found:      # else not counted here yet (seeded now) or no room: as begin() goes on
                    self._decide(t, reserve and not retry, quota_found)
                    return t, taken
        if taken is None:
            taken = limiter.take(name, count, period)
        self._decide(t, reserve and not taken[1], None)
        return t, taken

    def _ticket(self, name: str, quota) -> Ticket | None:
        calls_limit, rows_limit = _limit(quota.get("calls")), _limit(quota.get("rows"))
        if calls_limit is None and rows_limit is None:
            return None
        per = "month" if quota.get("per") == "month" else "day"
        now = self.clock()
        p = self._periods.get((name, per))
        if p is None or not p.start <= now < p.reset or p.zone is not time.tzname:
            p = self._period(name, per, now)
        t = Ticket()
        t.quotas, t.key, t.host_key, t.per, t.now = self, p.key, p.host_key, per, now
        t.calls_limit, t.rows_limit = calls_limit, rows_limit
        t.start_at, t.reset_at, t.reset_text = p.start_at, p.reset, p.reset_text
        t.refused, t.reserved, t.remote, t.host, t.token = None, False, False, False, None
        return t

    def _period(self, name: str, per: str, now: float) -> "_Period":
        """The caller's period holding `now`, kept for the calls up to its end: period() is a function of the local
        date alone, which stays the same from now until reset; a new zone (time.tzset()) starts over."""
        p = _Period()
        p.zone = time.tzname
        text, p.start_at, p.reset = period(per, now)
        p.start = now
        p.reset_text = local_text(p.reset)
        p.key = (self.workspace, name, per, text)
        p.host_key = self.host_key(p.key)
        periods = self._periods
        if len(periods) >= _PERIODS_MAX:
            periods.clear()   # many callers: start over rather than track recency
        periods[(name, per)] = p
        return p

    def _decide(self, t: Ticket, reserve: bool, found) -> None:
        """The counts and the verdict of a ticket: `found` is the host table's answer when already asked."""
        result = None
        if found is not None:
            result = self._host_result(t, reserve, found)
            t.host = True
        else:
            if self.redis is not None:
                result = self.redis.call(lambda r: self._remote_reserve(r, t, reserve), self._fell_back)
                t.remote = result is not None
            if result is None:
                result = self._host_reserve(t, reserve)
                t.host = result is not None
        if result is None:
            result = self._local_reserve(t, reserve)
        allowed, t.calls, t.rows = result
        if reserve:
            if allowed:
                t.reserved = True
            else:
                t.refused = "calls" if t.calls_limit is not None and t.calls >= t.calls_limit else "rows"

    def _fell_back(self):
        if self.stats is not None:
            self.stats.fell_back()
        return None

    # --- the host table -------------------------------------------------------------------------------------
    @staticmethod
    def host_key(key: tuple) -> str:
        workspace, caller, per, text = key
        return f"{workspace}~{caller}:{per}:{text}"

    def _host_reserve(self, t: Ticket, reserve: bool):
        """Check (and reserve) in the host table: (allowed, calls, rows), or None when it has no room for the
        counter (or the store could not be read to seed it)."""
        table, hk = self.table, t.host_key
        limits = (t.calls_limit or 0, t.rows_limit or 0)
        for _ in range(3):
            found = table.quota(hk, *limits, reserve, VIEW_MAX_AGE)
            if found is None:      # not counted on this host yet: seed it from the store
                seed = self._stored(t.key, pending=True)
                if seed is None:
                    return None
                if table.quota_seed(hk, seed[0], seed[1], t.reset_at):
                    continue
            elif found is not False:
                return self._host_result(t, reserve, found)
            break
        if self.stats is not None:
            self.stats.no_room()
        return None

    def _host_result(self, t: Ticket, reserve: bool, found: tuple):
        """(allowed, calls, rows) from the host table's answer, after re-reading the store when it asks for it."""
        allowed, calls, rows, reread = found
        if reread is not None:
            stored = self._stored(t.key, pending=False)
            if stored is not None:
                table = self.table
                table.quota_reread(t.host_key, reread, *stored)
                if not reserve:  # a view only: show what was just read
                    found = table.quota(t.host_key, t.calls_limit or 0, t.rows_limit or 0, False, VIEW_MAX_AGE)
                    if found:
                        allowed, calls, rows = found[:3]
        return allowed, calls, rows

    def _stored(self, key: tuple, pending: bool):
        """The store's counts of key (read without any lock held), with pending=True plus this worker's counts the
        host table did not count and the store does not hold yet (counted through Redis, or by this worker
        alone); None when the store can't be read."""
        try:
            calls, rows = self.store.quota_counts([key]).get(key, (0, 0))
        except Exception as exc:
            self._warn("could not read quota counts (%s); this worker counts alone meanwhile", exc)
            return None
        if pending:
            with self._lock:
                for table in (self._in_flight, self._unwritten):
                    v = table.get(key)
                    if v is not None:
                        calls += v[0] - v[3]
                        rows += v[1] - v[4]
        return calls, rows

    # --- a counter the host table has no room for -----------------------------------------------------------
    def _local_reserve(self, t: Ticket, reserve: bool) -> tuple[int, int, int]:
        key = t.key
        view = self._view.get(key)
        if view is None or time.monotonic() - view[2] >= VIEW_MAX_AGE:
            self._refresh(key, block=view is None)
        with self._lock:
            calls, rows = self._total(key)
            if not reserve:
                return 1, calls, rows
            if ((t.calls_limit is not None and calls >= t.calls_limit)
                    or (t.rows_limit is not None and rows >= t.rows_limit)):
                return 0, calls, rows
            self._reserved[key] = self._reserved.get(key, 0) + 1
        return 1, calls + 1, rows

    def _total(self, key: tuple) -> tuple[int, int]:
        calls, rows = self._reserved.get(key, 0), 0
        for table in (self._view, self._in_flight, self._unwritten):
            v = table.get(key)
            if v is not None:
                calls += v[0]
                rows += v[1]
        return calls, rows

    # --- counting -------------------------------------------------------------------------------------------
    def _count_stored(self, key: tuple, calls: int, rows: int, hosted: bool) -> None:
        """For the store: a settled call and rows served (hosted: the host table counted them too)."""
        with self._lock:
            u = self._unwritten.get(key)
            if u is None:
                u = self._unwritten[key] = [0, 0, 0.0, 0, 0]
            u[0] += calls
            u[1] += rows
            u[2] = self.clock()
            if hosted:
                u[3] += calls
                u[4] += rows
        self._start()

    def _add(self, t: Ticket, calls: int, rows: int, stored: int, settle: bool) -> None:
        """calls/rows: what the counter changes by (a given-back call is -1); stored: the calls the store gets."""
        if not t.remote and not t.host and settle:
            with self._lock:
                left = self._reserved.get(t.key, 0) - 1
                if left > 0:
                    self._reserved[t.key] = left
                else:
                    self._reserved.pop(t.key, None)
        if stored or rows:
            self._count_stored(t.key, stored, rows, t.host)
            if t.host and self.redis is not None:
                self._owe(t.key, stored, rows)
        totals = None
        if t.remote:
            if settle:   # even a kept call without rows: its reservation is let go
                totals = self.redis.call(lambda r: self._remote_settle(r, t, calls, rows),
                                         lambda: self._settle_failed(t, calls, rows))
            elif calls or rows:
                totals = self.redis.call(lambda r: self._remote_add(r, t, calls, rows), self._fell_back)
        elif t.host:
            totals = self.table.quota_add(t.host_key, calls, rows, settle)
        if totals is None:
            t.calls += calls
            t.rows += rows
        elif settle and not calls:
            # A kept call stays where its reservation put it in the count (so concurrent calls each show their
            # own X-Quota-Remaining-Calls); its rows are added to the count as it is now.
            t.rows = totals[1]
        else:
            t.calls, t.rows = totals

    def _refresh(self, key: tuple, block: bool) -> None:
        """Re-read a caller's stored counts; skipped when the writer is busy (it keeps the view up to date)."""
        if not self._io.acquire(blocking=block):
            return
        try:
            try:
                found = self.store.quota_counts([key]).get(key, (0, 0))
            except Exception as exc:  # a busy store: keep the older view, try again in a second
                self._warn("could not read quota counts (%s); using this worker's view", exc)
                with self._lock:
                    view = self._view.setdefault(key, [0, 0, 0.0])
                    view[2] = time.monotonic()
                return
            with self._lock:
                self._view[key] = [found[0], found[1], time.monotonic()]
        finally:
            self._io.release()

    # --- Redis ----------------------------------------------------------------------------------------------
    def redis_key(self, key: tuple) -> str:
        workspace, caller, per, text = key
        return f"{self.redis.prefix}quota:{workspace}~{caller}:{per}:{text}"

    def _reserved_index(self) -> str:
        pid = os.getpid()
        if self._holder[0] != pid:   # first use, or a forked child
            self._holder = (pid, reserved_index(holder_host(), pid))
        return self._holder[1]

    def _owe(self, key: tuple, calls: int, rows: int) -> None:
        """Count for Redis what the host table counted while Redis failed: sent by this worker's next call that
        reaches Redis, or by the retry thread within SETTLE_RETRY s of Redis answering (a worker that serves no
        call then would keep them from the count)."""
        with self._lock:
            owed = self._owed.get(key)
            if owed is None:
                if len(self._owed) >= _PERIODS_MAX:
                    return        # many callers in one outage: the rest are left to the store's count
                owed = self._owed[key] = [0, 0, self.clock()]
            owed[0] += calls
            owed[1] += rows
            if self._settling:
                return
            self._settling = True
        threading.Thread(target=self._retry_settles, name="qag-quota-settle", daemon=True).start()

    def _send_owed(self, client) -> None:
        """Add the counts the host table took while Redis failed to Redis's counters (_OWED), before Redis decides
        again; kept for the next try when Redis fails meanwhile."""
        with self._lock:
            owed, self._owed = self._owed, {}
        if self._owed_script is None:
            self._owed_script = client.register_script(_OWED)
        try:
            pipe = client.pipeline(transaction=False)
            for key, (calls, rows, since) in owed.items():
                self._owed_script(keys=[self.redis_key(key)], args=[calls, rows, int(since), REDIS_EXPIRY],
                                  client=pipe)
            pipe.execute()
        except BaseException:
            with self._lock:
                for key, (calls, rows, since) in owed.items():
                    now = self._owed.setdefault(key, [0, 0, since])
                    now[0], now[1], now[2] = now[0] + calls, now[1] + rows, min(now[2], since)
            raise

    def _remote_reserve(self, client, t: Ticket, reserve: bool):
        if self._owed:
            self._send_owed(client)
        if self._reserve is None:
            self._reserve = client.register_script(_RESERVE)
        rk = self.redis_key(t.key)
        held = self._reserved_index()
        token = t.token = os.urandom(6).hex() if reserve else ""
        args = [t.calls_limit or 0, t.rows_limit or 0, "", "", REDIS_EXPIRY, 1 if reserve else 0, token]
        keys = [rk, held, gone_key(held, token)]
        try:
            found = self._reserve(keys=keys, args=args, client=client)
            if int(found[0]) == -1:  # no counter yet for this period (new, expired, or Redis restarted): seed it
                args[2], args[3] = self._seed(t.key)
                found = self._reserve(keys=keys, args=args, client=client)
        except BaseException:
            if reserve:
                # The outcome is unknown (the script may have run and its reply been lost, or it may still be on
                # its way): the call is counted in the host table instead, so a reservation it may have made in
                # Redis is given back, as a failed settle is, with a tombstone that keeps the RESERVE from
                # reserving later. Giving back one never made does nothing (the token isn't held).
                self._keep_settle(rk, held, token, -1, 0, t.reset_at, unknown=True)
            raise
        return int(found[0]), int(found[1]), int(found[2])

    def _seed(self, key: tuple) -> tuple[int, int]:
        try:
            stored = self.store.quota_counts([key]).get(key, (0, 0))
        except Exception as exc:
            self._warn("could not read quota counts to seed Redis (%s)", exc)
            stored = (0, 0)
        with self._lock:
            pending = [0, 0]
            for table in (self._in_flight, self._unwritten):
                v = table.get(key)
                if v is not None:
                    pending[0] += v[0]
                    pending[1] += v[1]
        return stored[0] + pending[0], stored[1] + pending[1]

    def _remote_add(self, client, t: Ticket, calls: int, rows: int):
        if self._add_script is None:
            self._add_script = client.register_script(_ADD)
        found = self._add_script(keys=[self.redis_key(t.key)], args=[calls, rows, REDIS_EXPIRY], client=client)
        return None if found is None else (int(found[0]), int(found[1]))

    def _settle(self, client):
        if self._settle_script is None:
            self._settle_script = client.register_script(SETTLE)
        return self._settle_script

    def _remote_settle(self, client, t: Ticket, calls: int, rows: int):
        found = self._settle(client)(keys=[self.redis_key(t.key), self._reserved_index()],
                                     args=[calls, rows, REDIS_EXPIRY, t.token], client=client)
        return None if found is None else (int(found[0]), int(found[1]))

    def _settle_failed(self, t: Ticket, calls: int, rows: int):
        """A settle Redis did not take (down, backing off, or its reply lost): tried again later."""
        self._fell_back()
        self._keep_settle(self.redis_key(t.key), self._reserved_index(), t.token, calls, rows, t.reset_at)
        return None

    def _keep_settle(self, rk: str, held: str, token: str, calls: int, rows: int, until: float,
                     unknown: bool = False) -> None:
        """Keep a settle to send again every SETTLE_RETRY s, by a thread of its own, until Redis answers or the
        period ends (`until`, Unix; the counter then decides nothing any more). Without it a given-back call would
        stay counted in Redis for the whole period, refusing the caller's last calls. unknown: the give-back of a
        reservation whose outcome is unknown, sent with its tombstone (SETTLE)."""
        with self._lock:
            if len(self._unsettled) < SETTLES_KEPT:
                self._unsettled[token] = (rk, held, calls, rows, until, unknown)
            if self._settling:
                return
            self._settling = True
        threading.Thread(target=self._retry_settles, name="qag-quota-settle", daemon=True).start()

    def _retry_settles(self) -> None:
        while not self._closed:
            time.sleep(SETTLE_RETRY)
            if not self._send_settles():
                return

    def _send_settles(self) -> bool:
        """One try at the kept settles and the counts owed to Redis, straight to the client (a background try
        neither starts nor ends the back-off the calls see). False once none is left (the retrying thread then
        ends)."""
        import redis
        with self._lock:
            now = self.clock()
            for token in [token for token, v in self._unsettled.items() if v[4] <= now]:
                del self._unsettled[token]
            pending = list(self._unsettled.items())
            if not pending and not self._owed:
                self._settling = False
                return False
        try:
            client = self.redis.client()
            if self._owed:
                self._send_owed(client)
            script = self._settle(client)
            pipe = client.pipeline(transaction=False)
            for token, (rk, held, calls, rows, until, unknown) in pending:
                gone = max(1, math.ceil(until - now)) if unknown else 0   # the tombstone lasts the period out
                script(keys=[rk, held, gone_key(held, token)], args=[calls, rows, REDIS_EXPIRY, token, gone],
                       client=pipe)
            pipe.execute()
        except (redis.RedisError, OSError, ValueError):
            return True
        with self._lock:
            for token, _ in pending:
                self._unsettled.pop(token, None)
        return True

    # --- /api/v1/usage/quotas -------------------------------------------------------------------------------
    def usage(self) -> list[dict]:
        """Every caller's counts for the current day and month: stored + this worker's unwritten counts, or the
        host table's where it counts more (other workers' counts not written yet), or Redis's counters where Redis
        has them."""
        now = self.clock()
        periods = [("day", period("day", now)[0]), ("month", period("month", now)[0])]
        wanted = set(periods)
        counts: dict[tuple, list] = {}
        for row in self.store.quota_usage_in(periods):
            counts[(row["workspace"], row["caller"], row["per"], row["period"])] = [
                row["calls"], row["rows"], row["updated_at"]]
        with self._lock:
            for table in (self._in_flight, self._unwritten):
                for key, (calls, rows, at, _hc, _hr) in table.items():
                    if (key[2], key[3]) not in wanted:
                        continue
                    c = counts.setdefault(key, [0, 0, None])
                    c[0] += calls
                    c[1] += rows
                    c[2] = at if c[2] is None else max(c[2], at)
        remote = None
        if self.redis is not None and counts:
            keys = sorted(counts)
            remote = self.redis.call(lambda r: self._remote_read(r, keys), self._fell_back)
        if remote is None:
            for key, c in counts.items():
                host = self.table.quota_peek(self.host_key(key))
                if host is not None:
                    c[0], c[1] = max(c[0], host[0]), max(c[1], host[1])
        else:
            for key, found in zip(keys, remote):
                if found[0] is not None:
                    at = found[2]
                    counts[key] = [int(found[0]), int(found[1] or 0), int(at) if at else counts[key][2]]
        return [{"caller": caller, "per": per, "period": text, "calls": c[0], "rows": c[1],
                 "updated_at": local_text(c[2]) if c[2] is not None else None}
                for (workspace, caller, per, text), c in sorted(counts.items(), key=lambda kv: kv[0])]

    def _remote_read(self, client, keys: list[tuple]) -> list:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(self.redis_key(key), "calls", "rows", "at")
        return pipe.execute()

    # --- the writer thread ----------------------------------------------------------------------------------
    def _start(self) -> None:
        # _thread_pid is None until the writer starts, and again in a forked child (_after_fork): one test a call.
        if self._thread_pid is not None or self._closed:
            return
        with self._lock:
            if self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
            self._stop = threading.Event()
        threading.Thread(target=self._loop, name="qag-quota-writer", daemon=True).start()

    def _loop(self) -> None:
        next_prune = time.monotonic() + 5.0
        stop = self._stop
        while not stop.wait(self.interval if self.interval > 0 else 0.05):
            self.flush()
            if time.monotonic() >= next_prune:
                next_prune = time.monotonic() + _PRUNE_EVERY
                try:
                    self.store.prune_quota_usage(int(self.clock()) - RETENTION_DAYS * 86400)
                except Exception as exc:
                    self._warn("could not prune old quota counts (%s)", exc)

    def flush(self) -> bool:
        """Add this worker's unwritten counts to the store in one transaction; on failure they stay unwritten
        (still counted here) and are tried again at the next flush. The host table is told before (a re-read
        that overlaps is not applied) and after (how much of its count the store now holds)."""
        with self._io:
            if self._in_flight and not self._send():
                return False
            with self._lock:
                batch, self._unwritten = self._unwritten, {}
                self._in_flight = batch
            self._in_flight_id = os.urandom(12).hex()
            return self._send()

    def _send(self) -> bool:
        """Write the batch in flight (under self._io). A failed one stays in flight, with its id, and is sent
        again as it is before anything counted since: the failure may have come after its commit (the reply
        lost), and the store skips an id it has, where adding the counts again would count those calls twice
        (and could refuse a caller's quota wrongly)."""
        batch = self._in_flight
        items = [(*key, v[0], v[1]) for key, v in batch.items() if v[0] or v[1]]
        hosted = {self.host_key(key): (v[3], v[4]) for key, v in batch.items() if v[3] or v[4]}
        if hosted:
            self.table.quota_writing(list(hosted))
        try:
            if items:
                self.store.add_quota_usage(items, int(self.clock()), self._in_flight_id)
        except Exception as exc:
            if hosted:
                self.table.quota_writing(list(hosted), {})
            self._warn("could not write quota counts (%s); kept for the next write", exc)
            return False
        if hosted:
            self.table.quota_writing(list(hosted), hosted)
        with self._lock:
            for key, v in batch.items():
                view = self._view.get(key)
                if view is not None:  # the store now holds them: move them into the view
                    view[0] += v[0]
                    view[1] += v[1]
            self._in_flight = {}
        return True

    def close(self) -> None:
        """Graceful end of the worker: stop the writer and write what is left; one last try at the Redis settles
        that failed (what is still held then, the master's sweep gives back)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._unsettled:
            self._send_settles()
        if self._unwritten or self._in_flight:
            self.flush()

    def _warn(self, message: str, exc: BaseException) -> None:
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY:
            self._logged_at = now
            log.warning(message, exc)


def _after_fork() -> None:
    # The writer thread and the locks' states do not come along into a child: start afresh there.
    for quotas in list(_open):
        quotas._lock = threading.Lock()
        quotas._io = threading.Lock()
        quotas._thread_pid = None
        quotas._settling = False   # the retrying thread stayed behind too; the next failed settle starts one


os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def _close_all() -> None:
    """Process exit without gunicorn's worker_exit (in-process use): write what is counted."""
    for quotas in list(_open):
        try:
            quotas.close()
        except Exception:
            pass
