"""Pooled data connections per worker: idle ones most recently used first, bounded, with an optional open cap."""

from __future__ import annotations

import itertools
import threading
from time import monotonic
from typing import Any, Callable, Hashable

from ..errors import QagError


_KEYS: dict = {}                  # a connection's resolved fields (as items) -> their number
_KEYS_MAX = 4096                  # distinct settings a worker numbers; beyond, the key is the sorted items
_key_numbers = itertools.count()  # never reused, so a number can't come to stand for other settings
_FIXED: dict = {}                 # id(fields) -> (fields, key): dicts never changed in place (fix_key)


def settings_key(fields: dict) -> Hashable:
    """The identity of a connection's resolved fields (password included): what pools, and what is cached of a
    server, are keyed by. A number, given to each distinct set the first time it is seen: a pool looks its key
    up twice a call, and a tuple of the fields would be hashed anew each time (~1,500 instructions; an int's
    hash is free). A call looks its fields up in the order they came in (a connection's resolve in the same
    order every call); a new order is numbered by the sorted fields, so the same settings in any order share
    one number. Fields holding a list or an object are keyed by their repr, unnumbered."""
    fixed = _FIXED.get(id(fields))
    if fixed is not None and fixed[0] is fields:   # held in the entry, so its id can't be another dict's
        return fixed[1]
    items = tuple(fields.items())
    try:
        key = _KEYS.get(items)
    except TypeError:
        return repr(sorted((name, repr(value)) for name, value in fields.items()))
    if key is None:
        canonical = tuple(sorted(items))          # field names are unique: their values are never compared
        if len(_KEYS) >= _KEYS_MAX - 1:
            return canonical
        key = _KEYS.setdefault(canonical, next(_key_numbers))
        _KEYS[items] = key
    return key


def fix_key(fields: dict) -> None:
    """Number `fields` now, for a dict its owner never changes in place (backends/base.resolved): settings_key
    then finds it by identity, without hashing its items each call."""
    if len(_FIXED) >= _KEYS_MAX:
        _FIXED.clear()
    _FIXED[id(fields)] = (fields, settings_key(fields))


class Pool:
    """Connections by key (resolved settings + access mode). One lock, held only for list operations.

    idle_limit: idle connections kept per key (0 = no pooling: every call opens and closes).
    idle_timeout: seconds an idle connection may wait before it is closed instead of reused.
    max_open: optional cap on connections (idle + in use) per key in this worker; callers beyond it wait up to
    `wait` seconds (or until their call's deadline, if sooner), then get 503 with Retry-After rather than hang.
    Callers waiting now are counted by label (the connection's name): a gauge that rises and falls.
    """

    def __init__(self, *, idle_limit: int, idle_timeout: float, max_open: int | None = None, wait: float = 5.0,
                 close: Callable[[Any], None] = lambda conn: conn.close()):
        self.idle_limit = idle_limit
        self.idle_timeout = idle_timeout
        self.max_open = max_open
        self.wait = wait
        self._close = close
        # Idle connections per key, oldest first, each a (connection, idle since) tuple: a tuple costs a third of
        # what an object with two slots does to make, once a call.
        self._idle: dict[Hashable, list[tuple[Any, float]]] = {}
        self._open: dict[Hashable, int] = {}
        # Re-entrant: a stream object collected by the garbage collector gives its connection back from __del__,
        # which can run on a thread that is inside the pool already.
        self._lock = threading.RLock()
        self._freed = threading.Condition(self._lock)
        self._waiting = 0       # callers waiting on _freed now: with none, a release has no one to notify
        self.waiting: dict[str, int] = {}   # the same, by label (connection name): the waiting gauge
        self.waits = 0          # callers that had to wait for the cap (a metric)

    @classmethod
    def from_settings(cls, settings, close: Callable[[Any], None] = lambda conn: conn.close()) -> "Pool":
        """The pool a backend keeps per worker, sized by QAG_POOL_SIZE/IDLE_TIMEOUT/MAX/WAIT."""
        return cls(idle_limit=settings.pool_size, idle_timeout=settings.pool_idle_timeout,
                   max_open=settings.pool_max, wait=settings.pool_wait, close=close)

    def acquire(self, key: Hashable, open_conn: Callable[[], Any],
                prefer: Callable[[Any], bool] | None = None, grow_below: int = 0,
                deadline: float | None = None, label: str = "", oldest: bool = False,
                open_args: tuple = (), fresh: bool = False) -> tuple[Any, bool]:
        """(connection, reused) — an idle one when there is one (preferring `prefer(conn)`), else a new one,
        `open_conn(*open_args)` (its arguments apart: a closure over them would be made on every call).

        grow_below: when no idle connection is preferred and fewer than this many are open for the key, open a
        new one instead of reusing one that isn't (MySQL: an idle connection whose renewal reply is still on
        its way would make the caller wait for it). Keep it at most idle_limit, or the extra ones are closed
        again on release. deadline: the call's (monotonic); a wait for the cap ends by then at the latest.
        oldest: the connections idle longest first, rather than the most recent (PostgreSQL: a reset sent on
        release has had the most time to be answered), both for `prefer` and without it.
        fresh: a new connection and never an idle one, also at the cap (MySQL: a statement that reads what an
        earlier caller left on a session); there an idle connection is closed to make room, or the caller waits.
        """
        stale: list[Any] = []
        try:
            with self._lock:
                if not fresh:
                    fallback = prefer is None or self._open.get(key, 0) >= grow_below
                    slot = self._take_idle(key, prefer, stale, fallback, oldest)
                    if slot is not None:
                        return slot[0], True
                if self.max_open is not None and self._open.get(key, 0) >= self.max_open:
                    self.waits += 1
                    until = monotonic() + self.wait
                    if deadline is not None and deadline < until:
                        until = deadline
                    while True:
                        if fresh:
                            self._close_one_idle(key, stale)
                        else:
                            slot = self._take_idle(key, prefer, stale)
                            if slot is not None:
                                return slot[0], True
                        if self._open.get(key, 0) < self.max_open:
                            break
                        left = until - monotonic()
                        if left <= 0 or not self._wait_freed(left, label):
                            if fresh:
                                self._close_one_idle(key, stale)   # freed as the wait ran out
                            else:
                                slot = self._take_idle(key, prefer, stale)   # freed as the wait ran out
                                if slot is not None:
                                    return slot[0], True
                            if self._open.get(key, 0) >= self.max_open:
                                raise QagError("unavailable", "Every connection this worker may open to this "
                                                              "database is busy - try again shortly", retry_after=1)
                self._open[key] = self._open.get(key, 0) + 1
        finally:
            for conn in stale:
                self._safe_close(conn)
        try:
            return open_conn(*open_args), False
        except BaseException:
            self._forget(key)
            raise

    def _close_one_idle(self, key: Hashable, stale: list) -> None:
        """At the cap, for a caller that needs a new connection: the oldest idle one is closed (after the lock is
        let go), which makes room for it."""
        idle = self._idle.get(key)
        if idle:
            stale.append(idle.pop(0)[0])
            self._open[key] -= 1

    def _wait_freed(self, seconds: float, label: str) -> bool:
        """Wait (holding the lock) until a connection is freed or `seconds` pass; False on timeout."""
        self._waiting += 1
        self.waiting[label] = self.waiting.get(label, 0) + 1
        try:
            return self._freed.wait(seconds)
        finally:
            self._waiting -= 1
            self.waiting[label] -= 1

    def _notify(self) -> None:
        # Condition.notify is Python code that costs about as much as the rest of a release: skipped when
        # nobody waits (both read under the lock, so a waiter is either counted or not yet waiting).
        if self._waiting:
            self._freed.notify()

    def _take_idle(self, key: Hashable, prefer, stale: list, fallback: bool = True,
                   oldest: bool = False) -> tuple[Any, float] | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        cutoff = monotonic() - self.idle_timeout
        while idle and idle[0][1] < cutoff:
            # Oldest first: anything idle past the timeout is closed, not reused.
            stale.append(idle.pop(0)[0])
            self._open[key] -= 1
        if not idle:
            return None
        if prefer is not None:
            for i in (range(len(idle)) if oldest else range(len(idle) - 1, -1, -1)):
                if prefer(idle[i][0]):
                    return idle.pop(i)
        if not fallback:
            return None
        return idle.pop(0) if oldest else idle.pop()

    def release(self, key: Hashable, conn: Any, reusable: bool = True) -> None:
        """Give a connection back; one that raised or can't be reset is closed instead (reusable=False)."""
        surplus = None
        with self._lock:
            if reusable and self.idle_limit > 0:
                idle = self._idle.setdefault(key, [])
                idle.append((conn, monotonic()))
                if len(idle) > self.idle_limit:
                    surplus = idle.pop(0)[0]
                    self._open[key] -= 1
                    self._notify()
                else:
                    self._notify()
                    return
            else:
                surplus = conn
                self._open[key] -= 1
                self._notify()
        self._safe_close(surplus)

    def _forget(self, key: Hashable) -> None:
        with self._lock:
            self._open[key] -= 1
            self._notify()

    def close_idle(self, key: Hashable | None = None) -> None:
        """Close every idle connection (a connection's settings changed: new calls must use the new ones), or
        those of one key (their network path stopped answering)."""
        with self._lock:
            keys = list(self._idle) if key is None else [key] if key in self._idle else []
            closing = []
            for each in keys:
                idle = self._idle.pop(each)
                closing += [slot[0] for slot in idle]
                self._open[each] -= len(idle)
            self._freed.notify_all()
        for conn in closing:
            self._safe_close(conn)

    def idle(self) -> list[Any]:
        """The idle connections of every key, oldest first per key (what a probe or a test looks at)."""
        with self._lock:
            return [slot[0] for slots in self._idle.values() for slot in slots]

    def stats(self) -> dict[str, int]:
        with self._lock:
            idle = sum(len(v) for v in self._idle.values())
            return {"idle": idle, "active": sum(self._open.values()) - idle, "waits": self.waits,
                    "waiting": {label: n for label, n in self.waiting.items() if label}}

    def _safe_close(self, conn: Any) -> None:
        try:
            self._close(conn)
        except Exception:  # a connection that is already broken is as closed as it gets
            pass
