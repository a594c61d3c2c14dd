"""Rate limits and concurrency slots (contract 6.6, 6.7) counted in one process, sans-IO: the caller passes
identities and limits, an injectable monotonic clock gives the time. The host table (hostlimits.py) counts for
every worker; these count a worker's calls alone, for an identity the host table has no room for
(redislimits.py)."""

from __future__ import annotations

import math
import threading
import time
from typing import Callable

from qag.settings import PERIOD_SECONDS, parse_rate_limit

__all__ = ["Buckets", "Slots", "parse_rate_limit", "PERIOD_SECONDS", "MAX_ADDRESSES"]

MAX_ADDRESSES = 100_000  # addresses (or key names) remembered at most per limiter


class Buckets:
    """Token buckets by identity: capacity `count`, refilled continuously at `count` per `period` seconds.

    take() costs one dict pop and insert and a little arithmetic under a lock. Entries are kept in order of
    last use, so the least recently used is first: a bucket idle for a full period is full again and is
    forgotten (a couple per call, from the front), and beyond `max_entries` the least recently used goes.
    """

    __slots__ = ("_buckets", "_lock", "_clock", "max_entries")

    def __init__(self, max_entries: int = MAX_ADDRESSES, clock: Callable[[], float] = time.monotonic):
        # identity → [tokens, last refill time, count, period]
        self._buckets: dict[object, list] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self.max_entries = max_entries

    def take(self, ident, count: int, period: float) -> tuple[int, int]:
        """Spend one token of ident's bucket: (whole tokens left, 0) when allowed, (0, retry_after) when not.

        retry_after = max(1, ceil((1 - tokens) * period / count)) seconds; a refused call spends nothing.
        """
        rate = count / period
        with self._lock:
            now = self._clock()
            buckets = self._buckets
            entry = buckets.pop(ident, None)
            if entry is None:
                entry = [float(count), now, count, period]
            else:
                # A changed limit (a PATCHed key) keeps what was used, within the new capacity.
                entry[0] = min(float(count), entry[0] + (now - entry[1]) * rate)
                entry[1], entry[2], entry[3] = now, count, period
            buckets[ident] = entry
            if entry[0] >= 1.0:
                entry[0] -= 1.0
                result = (int(entry[0]), 0)
            else:
                result = (0, max(1, math.ceil((1.0 - entry[0]) * period / count)))
            self._forget(now)
        return result

    def _forget(self, now: float) -> None:
        buckets = self._buckets
        while len(buckets) > self.max_entries:
            del buckets[next(iter(buckets))]
        for _ in range(2):
            first = next(iter(buckets))
            entry = buckets[first]
            if now - entry[1] < entry[3]:
                return
            del buckets[first]

    def __len__(self) -> int:
        return len(self._buckets)


class Slots:
    """Queries running at once per key name in this process (max_concurrent): acquire before, release after."""

    __slots__ = ("_held", "_lock")

    def __init__(self):
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, name: str, limit: int) -> bool:
        """Take one of name's `limit` slots; False when all are held."""
        with self._lock:
            held = self._held.get(name, 0)
            if held >= limit:
                return False
            self._held[name] = held + 1
            return True

    def release(self, name: str) -> None:
        with self._lock:
            held = self._held.get(name, 0) - 1
            if held > 0:
                self._held[name] = held
            else:
                self._held.pop(name, None)

    def held(self, name: str) -> int:
        return self._held.get(name, 0)


class Slot:
    """One held slot, released at most once (a stream's body and the call that started it may both try)."""

    __slots__ = ("slots", "name")

    def __init__(self, slots: Slots, name: str):
        self.slots, self.name = slots, name

    def release(self) -> None:
        slots, self.slots = self.slots, None
        if slots is not None:
            slots.release(self.name)
