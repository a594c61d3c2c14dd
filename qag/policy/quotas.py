"""Quotas (contract 6.8): calls and rows per caller and calendar period (server-local day or month), checked before
each data call, counted after it, and shared by every worker and instance through the store, or through Redis.

A data call *reserves* its call before it runs (so concurrent calls can't all pass the last free one) and settles
after the response: a 200 keeps the call and adds the page's rows, anything else gives the call back. A stream's
rows are added as they leave; the call that crosses the row quota completes.

Without Redis every worker keeps its own unwritten counts and a view of the store's counts. The view of a caller is
re-read from the store at most once a second (when the caller is next seen); a writer thread per worker adds the
unwritten counts to the store every QAG_HISTORY_FLUSH_INTERVAL seconds in one transaction. A check sees
`view + this worker's unwritten counts`, exact for this worker's own calls; another worker's calls reach it within
its flush interval plus one second. So the workers (and instances) sharing a store together exceed a quota by at
most what the *other* workers serve in QAG_HISTORY_FLUSH_INTERVAL + 1 s after the quota ran out; never refuse early.

With Redis the counter is the hash `qag:quota:<workspace>~<caller>:<day:YYYY-MM-DD|month:YYYY-MM>` (fields calls,
rows, at; 40-day expiry), checked and reserved atomically by one Lua script and seeded from the store when missing,
so the limit is exact across instances. The store still gets every count (the fallback and the durable record).
While Redis fails, the store's view plus this worker's counts decide, as without Redis.
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

log = logging.getLogger("qag")

WORKSPACE = "default"
RETENTION_DAYS = 400          # stored counts are kept this long (contract 6.8)
REDIS_EXPIRY = 40 * 86400     # seconds a Redis counter lives after its last change
VIEW_MAX_AGE = 1.0            # seconds: a worker re-reads a caller's stored counts at most this often
_PRUNE_EVERY = 3600.0
_LOG_EVERY = 60.0

# Check (and with ARGV[6] = 1 reserve one call of) a counter; seed it from ARGV[3..4] when it is missing, or
# answer {-1} when no seed was given so the caller can read the store and ask again. ARGV[1..2]: limits, 0 = none.
# Returns {1 allowed / 0 refused, calls, rows} after the reservation.
_RESERVE = """
local k = KEYS[1]
if redis.call('EXISTS', k) == 0 then
  if ARGV[3] == '' then return {-1, 0, 0} end
  redis.call('HSET', k, 'calls', ARGV[3], 'rows', ARGV[4])
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
  end
end
redis.call('EXPIRE', k, ARGV[5])
return {ok, c, r}
"""

# Add to a counter (a refunded call is -1); returns {calls, rows}.
_ADD = """
local k = KEYS[1]
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

    __slots__ = ("quotas", "key", "per", "calls_limit", "rows_limit", "reset_at", "reset_text", "start_at",
                 "calls", "rows", "refused", "reserved", "remote", "now")

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
        self.quotas._add(self, 0 if ok else -1, rows if ok else 0)

    def add_rows(self, rows: int) -> None:
        """A stream's rows, counted as they leave."""
        if rows:
            self.quotas._add(self, 0, rows)

    def usage(self) -> dict:
        """`usage_this_period` of a key (contract 5.4)."""
        return {"per": self.per, "period_start": local_text(self.start_at), "resets_at": self.reset_text,
                "calls": self.calls, "rows": self.rows, "calls_limit": self.calls_limit,
                "rows_limit": self.rows_limit}


_open: "weakref.WeakSet[Quotas]" = weakref.WeakSet()


class Quotas:
    """One per worker: the counts it has not written yet, its view of the store's counts, its writer thread, and
    the Redis counters when configured."""

    def __init__(self, store, redis=None, stats=None, *, interval: float = 1.0, workspace: str = WORKSPACE,
                 clock: Callable[[], float] = time.time):
        self.store = store
        self.redis = redis
        self.stats = stats           # LimitStats: Redis fallbacks are counted with the limiters'
        self.interval = interval
        self.workspace = workspace
        self.clock = clock
        self._lock = threading.Lock()        # the dicts below; held for dict operations only
        self._io = threading.Lock()          # store writes and view re-reads, one at a time
        self._view: dict[tuple, list] = {}       # key -> [calls, rows, read at (monotonic)]
        self._unwritten: dict[tuple, list] = {}  # key -> [calls, rows, last counted at (Unix)]
        self._in_flight: dict[tuple, list] = {}  # being written by flush()
        self._reserve = self._add_script = None
        self._thread_pid = None
        self._stop = threading.Event()
        self._closed = False
        self._logged_at = -_LOG_EVERY
        _open.add(self)

    # --- the request path ---------------------------------------------------------------------------------
    def begin(self, name: str, quota, *, reserve: bool) -> Ticket | None:
        """The caller's ticket (None when `quota` sets no limit). reserve=True (a data call): check and, when
        allowed, reserve one call; `ticket.refused` then names the exhausted quota ('calls'/'rows') or is None."""
        calls_limit, rows_limit = _limit(quota.get("calls")), _limit(quota.get("rows"))
        if calls_limit is None and rows_limit is None:
            return None
        per = "month" if quota.get("per") == "month" else "day"
        now = self.clock()
        text, start, reset = period(per, now)
        t = Ticket()
        t.quotas, t.key, t.per, t.now = self, (self.workspace, name, per, text), per, now
        t.calls_limit, t.rows_limit = calls_limit, rows_limit
        t.start_at, t.reset_at, t.reset_text = start, reset, local_text(reset)
        t.refused, t.reserved, t.remote = None, False, False
        result = None
        if self.redis is not None:
            result = self.redis.call(lambda r: self._remote_reserve(r, t, reserve), self._fell_back)
        if result is None:
            result = self._local_reserve(t, reserve)
        else:
            t.remote = True
            if result[0] and reserve:
                self._count_locally(t.key, 1, 0)  # the store keeps every count, Redis or not
        allowed, t.calls, t.rows = result
        if reserve:
            if allowed:
                t.reserved = True
            else:
                t.refused = "calls" if calls_limit is not None and t.calls >= calls_limit else "rows"
        return t

    def _fell_back(self):
        if self.stats is not None:
            self.stats.fell_back()
        return None

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
            self._bump(key, 1, 0)
        self._start()
        return 1, calls + 1, rows

    def _total(self, key: tuple) -> tuple[int, int]:
        calls = rows = 0
        for table in (self._view, self._in_flight, self._unwritten):
            v = table.get(key)
            if v is not None:
                calls += v[0]
                rows += v[1]
        return calls, rows

    def _bump(self, key: tuple, calls: int, rows: int) -> None:
        u = self._unwritten.get(key)
        if u is None:
            self._unwritten[key] = [calls, rows, self.clock()]
        else:
            u[0] += calls
            u[1] += rows
            u[2] = self.clock()

    def _count_locally(self, key: tuple, calls: int, rows: int) -> None:
        with self._lock:
            self._bump(key, calls, rows)
        self._start()

    def _add(self, t: Ticket, calls: int, rows: int) -> None:
        if not calls and not rows:
            return
        self._count_locally(t.key, calls, rows)
        totals = None
        if t.remote:
            totals = self.redis.call(lambda r: self._remote_add(r, t, calls, rows), self._fell_back)
        if totals is None:
            t.calls += calls
            t.rows += rows
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
        return f"qag:quota:{workspace}~{caller}:{per}:{text}"

    def _remote_reserve(self, client, t: Ticket, reserve: bool):
        if self._reserve is None:
            self._reserve = client.register_script(_RESERVE)
        rk = self.redis_key(t.key)
        args = [t.calls_limit or 0, t.rows_limit or 0, "", "", REDIS_EXPIRY, 1 if reserve else 0]
        found = self._reserve(keys=[rk], args=args, client=client)
        if int(found[0]) == -1:  # no counter yet for this period (new, expired, or Redis restarted): seed it
            args[2], args[3] = self._seed(t.key)
            found = self._reserve(keys=[rk], args=args, client=client)
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
        return int(found[0]), int(found[1])

    # --- /api/v1/usage/quotas -------------------------------------------------------------------------------
    def usage(self) -> list[dict]:
        """Every caller's counts for the current day and month: stored + this worker's unwritten counts, or
        Redis's counters where Redis has them."""
        now = self.clock()
        periods = [("day", period("day", now)[0]), ("month", period("month", now)[0])]
        wanted = set(periods)
        counts: dict[tuple, list] = {}
        for row in self.store.quota_usage_in(periods):
            counts[(row["workspace"], row["caller"], row["per"], row["period"])] = [
                row["calls"], row["rows"], row["updated_at"]]
        with self._lock:
            for table in (self._in_flight, self._unwritten):
                for key, (calls, rows, at) in table.items():
                    if (key[2], key[3]) not in wanted:
                        continue
                    c = counts.setdefault(key, [0, 0, None])
                    c[0] += calls
                    c[1] += rows
                    c[2] = at if c[2] is None else max(c[2], at)
        if self.redis is not None and counts:
            keys = sorted(counts)
            remote = self.redis.call(lambda r: self._remote_read(r, keys), self._fell_back)
            for key, found in zip(keys, remote or ()):
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
        if self._thread_pid == os.getpid() or self._closed:
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
        (still counted here) and are tried again at the next flush."""
        with self._io:
            with self._lock:
                batch, self._unwritten = self._unwritten, {}
                self._in_flight = batch
            items = [(*key, v[0], v[1]) for key, v in batch.items() if v[0] or v[1]]
            try:
                if items:
                    self.store.add_quota_usage(items, int(self.clock()))
            except Exception as exc:
                with self._lock:
                    for key, v in batch.items():
                        u = self._unwritten.get(key)
                        if u is None:
                            self._unwritten[key] = v
                        else:
                            u[0] += v[0]
                            u[1] += v[1]
                    self._in_flight = {}
                self._warn("could not write quota counts (%s); kept for the next write", exc)
                return False
            with self._lock:
                for key, v in batch.items():
                    view = self._view.get(key)
                    if view is not None:  # the store now holds them: move them into the view
                        view[0] += v[0]
                        view[1] += v[1]
                self._in_flight = {}
        return True

    def close(self) -> None:
        """Graceful end of the worker: stop the writer and write what is left."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._unwritten:
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


os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def _close_all() -> None:
    """Process exit without gunicorn's worker_exit (in-process use): write what is counted."""
    for quotas in list(_open):
        try:
            quotas.close()
        except Exception:
            pass
