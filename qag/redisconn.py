"""One Redis client per worker process, shared by the limiters, the response cache and invalidation, that backs off
for a few seconds after a failure so a dead Redis costs a call one short timeout at most, never an error."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from typing import Callable, TypeVar

log = logging.getLogger("qag.redis")

T = TypeVar("T")

SOCKET_TIMEOUT = 0.25     # seconds: a call waits at most this long on a Redis that doesn't answer
RETRY_AFTER = 5.0         # seconds without trying Redis after a failure (contract 6.6)
_LOG_EVERY = 60.0         # at most one warning a minute while Redis stays down


class SharedRedis:
    """A lazily connected client (created in the process that uses it, so never shared across a fork).

    `call(fn, fallback)` runs `fn(client)`; when Redis is down, or was down less than RETRY_AFTER seconds ago,
    it returns `fallback()` instead, counts the fallback and logs about it once a minute. Callers decide what a
    fallback means (count in-process, a cache miss); nothing here raises a Redis error to a request."""

    def __init__(self, url: str, *, socket_timeout: float = SOCKET_TIMEOUT, retry_after: float = RETRY_AFTER,
                 clock: Callable[[], float] = time.monotonic, prefix: str = "qag:"):
        self.url = url
        # Every key and channel name starts with it: one deployment's (namespace_prefix), so two deployments with
        # stores of their own never read each other's cached bodies, counters or events through one Redis.
        self.prefix = prefix
        self.socket_timeout = socket_timeout
        self.retry_after = retry_after
        self.clock = clock
        self.fallbacks = 0          # calls answered by their fallback (a metric)
        self._client = None
        self._pid = None
        self._down_until = 0.0
        self._logged_at = -_LOG_EVERY
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        """False while backing off after a failure."""
        return self.clock() >= self._down_until

    def client(self):
        """The process's client, created on first use (and again in a forked child)."""
        if self._client is None or self._pid != os.getpid():
            with self._lock:
                if self._client is None or self._pid != os.getpid():
                    import redis
                    self._client = redis.Redis.from_url(
                        self.url, socket_timeout=self.socket_timeout, socket_connect_timeout=self.socket_timeout,
                        health_check_interval=0, retry_on_timeout=False)
                    self._pid = os.getpid()
        return self._client

    def call(self, fn: Callable[[object], T], fallback: Callable[[], T]) -> T:
        if not self.available:
            self.fallbacks += 1
            return fallback()
        import redis
        try:
            result = fn(self.client())
        except (redis.RedisError, OSError, ValueError) as error:  # ValueError: a reply or URL it can't read
            self.failed(error)
            self.fallbacks += 1
            return fallback()
        if self._down_until:
            self._down_until = 0.0
            log.warning("Redis is reachable again; shared counting and caching resume")
        return result

    def call_now(self, fn: Callable[[object], T], fallback: Callable[[], T]) -> T:
        """As call(), but tried even while backing off: for what must reach Redis if it can (giving back a
        max_concurrent lease, which would otherwise lock its key out until the lease runs out)."""
        import redis
        try:
            return fn(self.client())
        except (redis.RedisError, OSError, ValueError) as error:
            self.failed(error)
            self.fallbacks += 1
            return fallback()

    def failed(self, error: BaseException) -> None:
        """Back off from Redis for RETRY_AFTER seconds; warn at most once a minute (never with the URL's password)."""
        now = self.clock()
        self._down_until = now + self.retry_after
        if now - self._logged_at >= _LOG_EVERY:
            self._logged_at = now
            log.warning("Redis failed (%s); this worker counts and caches on its own, retrying Redis in %.0f s",
                        type(error).__name__, self.retry_after)


def namespace_prefix(server_secret: bytes) -> str:
    """The names' prefix of one deployment: a digest of the store's random server secret, the same for every
    worker and instance that shares the store, another for any other store (and never the secret itself)."""
    return "qag:" + hashlib.sha256(b"qag redis namespace\0" + server_secret).hexdigest()[:16] + ":"


def from_settings(settings, prefix: str = "qag:") -> SharedRedis | None:
    """The process's Redis, or None when QAG_REDIS_URL is unset."""
    url = getattr(settings, "redis_url", None)
    return SharedRedis(url, prefix=prefix) if url else None
