"""The store as the gateway sees it: the three per-call reads cached host-wide, every configuration change invalidating.

`MetadataStore` wraps whatever Store the gateway built. It caches rows, never decisions (contract 7.3): the key
row found by a secret's hash (`key_by_hash`), a saved query with the version a run uses (`get_query_for_run`)
and a connection row (`get_connection`); active, expiry, IP allow-list and rotation grace are judged on every
call by qag/auth.py and the run handlers against the (possibly cached) row. Reads inside a transaction, and every
other read (management views, history, ...), go to the store. Cached values are shared by every thread: callers
treat them as read-only, as they already must the store's shared version bodies.

Invalidation, from the closest to the farthest change:
- a change through this process (the API, the CLI: every store write but log appends - history, events, audit,
  usage stamps) bumps the segment's generation right after its commit, so every worker of the host drops
  everything on its next call; inside the same transaction it also bumps `config_generation` in the store's
  meta table;
- other instances on the store, other hosts, the CLI elsewhere: one worker per host (elected through the
  segment) reads `config_generation` about once a second and drops everything when it moved; the SQLite
  store's triggers move it for edits made straight in the store file too (qag/store/sqlite.py);
- with Redis, each change is also PUBLISHed on `qag:<deployment>:invalidate` and a subscriber thread in every worker drops
  everything at once; Redis down means polling only, and the subscriber reconnects by itself.
The gateway's management handlers use `fresh()`, the same store whose reads all go to the store.
A subscriber per worker rather than per host: no election, nothing to hand over when a worker dies, and
messages are deduplicated through the segment, so N workers cost N idle connections and one drop per change.

The TTL (`QAG_METADATA_CACHE_TTL`) is the backstop for a change nothing announced (a poll that failed): no row is used longer than that after it was read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
import time
import weakref
from typing import Any, Callable, Iterator

from .shm import MISS, Cache, Segment

log = logging.getLogger("qag")

CHANNEL = "invalidate"   # after the deployment's prefix (SharedRedis.prefix)
CONFIG_KEY = "config_generation"
POLL_INTERVAL = 1.0        # seconds between polls of the store's config generation, per host
_TICK = 0.2                # how often each worker checks whether the poll is due
_LOG_EVERY = 60.0

# Store methods that change configuration (and so invalidate). Not listed, hence not invalidating: log appends
# (add_runs, prune_runs, name_ids), audit, touch_key (last_used_at), set_meta.
WRITES = ("put_connection", "delete_connection", "create_query", "add_version", "update_version", "delete_version",
          "set_published", "set_collection", "delete_query", "put_key", "delete_key", "put_role", "delete_role")


def _as_tuple(value):
    return tuple(value)


def _query_and_version_found(result) -> bool:
    return result[0] is not None and result[1] is not None


def config_number(text: str | None) -> int:
    """The store's config_generation as a number (0 when never set)."""
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


class _Local(threading.local):
    depth = 0
    dirty = False


class _Reads:
    """The cached reads and the state they look at. A base of its own so that, in the compiled build, this state is
    C fields of an extension type (qag/cache/metadata.pxd): a read of MetadataStore's own attributes goes through
    its __getattr__ hook, about 280 instructions each, and a call made 9 of them."""

    def __init__(self, inner, cache) -> None:
        self.inner = inner
        # A Cache, or a function making one on the first cached read (a private segment costs a descriptor and a
        # mapping, which a process that only administers, like the CLI, never needs), or None (cache off).
        self._cache = cache if cache is None or isinstance(cache, Cache) else None
        self._make_cache = None if cache is None or isinstance(cache, Cache) else cache
        self._tx = _Local()
        # Outermost transactions open in this process, on any thread: while none is, a cached read skips the
        # thread-local depth (a thread's own transaction is counted before its first read inside it).
        self._open_transactions = 0
        self._threads_started = False      # reset in a forked child: threads don't survive a fork

    # --- cached reads ----------------------------------------------------------------------------------
    # `read` names the store's method, looked up only on a miss: a hit makes no bound method.
    def key_by_hash(self, secret_hash: str):
        return self._cached("k" + secret_hash, "key_by_hash", (secret_hash,), _as_tuple, None)

    def get_query_for_run(self, name: str, version: int | None):
        # The published version (None, most calls) by a concatenation: the same key as the f-string makes.
        key = "qNone\x00" + name if version is None else f"q{version}\x00{name}"
        return self._cached(key, "get_query_for_run", (name, version), _as_tuple, _query_and_version_found)

    def get_connection(self, name: str):
        return self._cached("c" + name, "get_connection", (name,), None, None)

    def get_role(self, name: str):
        # A signed-in user's role is read on each bearer call (qag/auth.py): cached like a key row.
        return self._cached("r" + name, "get_role", (name,), None, None)

    def _cached(self, key: str, read: str, args: tuple, convert, cacheable):
        if self._open_transactions and self._tx.depth:
            return getattr(self.inner, read)(*args)
        cache = self._cache or self.cache   # the property only until the cache exists
        if cache is None:
            return getattr(self.inner, read)(*args)
        if not self._threads_started:
            self._start_threads()
        value = cache.get(key, convert)
        if value is not MISS:
            return value
        generation = cache.generation()  # before the read: a change committed meanwhile keeps it out
        value = getattr(self.inner, read)(*args)
        # Unknown keys, queries and connections are not cached: anyone could fill the table with them.
        if value is not None and (cacheable is None or cacheable(value)):
            cache.put(key, value, generation)
        return value


class MetadataStore(_Reads):
    """A Store that caches the per-call reads in `cache` (None = cache off) and announces every change."""

    def __init__(self, inner, cache: Cache | Callable[[], Cache] | None, *, redis=None,
                 poll_interval: float = POLL_INTERVAL):
        _Reads.__init__(self, inner, cache)
        self.redis = redis                  # qag/redisconn.SharedRedis or None
        self.poll_interval = poll_interval
        _all.add(self)
        self._stop = threading.Event()
        self._logged_at = -_LOG_EVERY

    @property
    def cache(self) -> Cache | None:
        if self._cache is None and self._make_cache is not None:
            with _start_lock:
                if self._cache is None:
                    self._cache = self._make_cache()
        return self._cache

    def fresh(self) -> "FreshView":
        """The same store (same transactions, same invalidation) with every read going to the store: for the
        management API, whose reads are always fresh (contract 7.3)."""
        return FreshView(self)

    def __getattr__(self, name: str) -> Any:
        # Everything not cached or invalidating is the store's own method.
        return getattr(self.inner, name)

    # --- changes -----------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        tx = self._tx
        if tx.depth:
            tx.depth += 1
            try:
                yield
            finally:
                tx.depth -= 1
            return
        tx.depth, tx.dirty = 1, False
        with _open_lock:
            self._open_transactions += 1
        config = None
        try:
            with self.inner.transaction():
                yield
                if tx.dirty:
                    # In the change's own transaction, so other instances can't see the one without the other.
                    config = config_number(self.inner.get_meta(CONFIG_KEY)) + 1
                    self.inner.set_meta(CONFIG_KEY, str(config))
        finally:
            tx.depth = 0
            with _open_lock:
                self._open_transactions -= 1
            if tx.dirty:
                tx.dirty = False
                self.changed(config)

    def changed(self, config: int | None = None) -> None:
        """After a commit (or a rollback: dropping too much is harmless): every worker of this host drops its
        entries now, other hosts at once through Redis, or at their next poll."""
        token = secrets.randbits(63) | 1
        if self._cache is not None:  # (a private cache not made yet holds nothing)
            self._cache.segment.invalidate(config=config, message=token)
        if self.redis is not None:
            channel = self.redis.prefix + CHANNEL
            self.redis.call(lambda client: _publish(client, channel, f"{token:x}"), lambda: None)

    # --- background: the poll and the Redis subscriber (one of each per worker) ----------------------------
    def _start_threads(self) -> None:
        """Started on the first cached read in each process (threads do not survive a fork)."""
        with _start_lock:
            if self._threads_started:
                return
            self._threads_started = True
            self._stop = threading.Event()
            # The threads hold the store weakly: a gateway dropped without close() still lets them end.
            ref = weakref.ref(self)
            if self.poll_interval > 0:
                threading.Thread(target=_poll_loop, args=(ref, self._stop), name="qag-metadata-poll",
                                 daemon=True).start()
            if self.redis is not None:
                threading.Thread(target=_subscribe_loop, args=(ref, self._stop, self.redis.url, self.redis.prefix + CHANNEL),
                                 name="qag-metadata-redis", daemon=True).start()

    def stop(self) -> None:
        """End this process's poll and subscriber threads (a worker exiting)."""
        self._stop.set()

    def close(self) -> None:
        self.stop()
        self.inner.close()

    def poll_once(self) -> bool:
        """If this worker wins the host's election for this interval, read the store's config generation and
        drop every entry when it moved. True when it dropped them."""
        cache = self.cache
        if not cache.segment.claim_poll(cache.clock(), int(self.poll_interval * 1e9), cache.worker):
            return False
        return cache.segment.note_config(config_number(self.inner.get_meta(CONFIG_KEY)))

    def _warn(self, message: str, *args) -> None:
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY:
            self._logged_at = now
            log.warning(message, *args)

    # --- metrics ------------------------------------------------------------------------------------------
    def cache_stats(self) -> tuple[dict, dict]:
        """({counters}, {gauges}) for /metrics: hits and misses of this worker, the host's generation."""
        cache = self._cache
        if cache is None:
            return {}, {}
        hits, misses = cache.counts()
        return ({"metadata": {"hits": hits, "misses": misses}},
                {"metadata_generation": {os.getpid(): cache.generation()}})


def _write(name: str):
    def method(self, *args, **kwargs):
        with self.transaction():
            self._tx.dirty = True
            return getattr(self.inner, name)(*args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"The store's {name}, announced as a configuration change."
    return method


# Set on the class after it is made (not through the class body's locals(), which a compiled build lacks).
for _name in WRITES:
    setattr(MetadataStore, _name, _write(_name))
del _name


_start_lock = threading.RLock()
_open_lock = threading.Lock()   # MetadataStore._open_transactions
_all: "weakref.WeakSet[MetadataStore]" = weakref.WeakSet()


def _after_fork() -> None:
    global _start_lock, _open_lock
    _start_lock = threading.RLock()
    _open_lock = threading.Lock()
    for store in list(_all):
        store._threads_started = False


os.register_at_fork(after_in_child=_after_fork)


def _publish(client, channel: str, message: str) -> None:
    """PUBLISH, once more on a fresh connection when the pooled one was cut while idle (Redis restarted): else the
    first change after a Redis restart would go unannounced and make this worker back off from Redis."""
    import redis as redis_lib
    try:
        client.publish(channel, message)
    except redis_lib.ConnectionError:
        client.publish(channel, message)


class FreshView:
    """A MetadataStore whose cached reads go to the store too; everything else is the MetadataStore's."""

    def __init__(self, store: MetadataStore):
        self._store = store

    def key_by_hash(self, secret_hash: str):
        return self._store.inner.key_by_hash(secret_hash)

    def get_query_for_run(self, name: str, version: int | None):
        return self._store.inner.get_query_for_run(name, version)

    def get_connection(self, name: str):
        return self._store.inner.get_connection(name)

    def get_role(self, name: str):
        return self._store.inner.get_role(name)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def _poll_loop(ref: "weakref.ref[MetadataStore]", stop: threading.Event) -> None:
    while not stop.wait(_TICK):
        store = ref()
        if store is None:
            return
        try:
            store.poll_once()
        except Exception as error:  # a busy or unreachable store: the TTL still bounds staleness
            store._warn("could not poll the store's config generation (%s); cached rows live up to the "
                        "metadata TTL", type(error).__name__)
        del store


def _subscribe_loop(ref: "weakref.ref[MetadataStore]", stop: threading.Event, url: str, channel: str) -> None:
    import redis as redis_lib
    delay = 0.5
    while not stop.is_set() and ref() is not None:
        pubsub = None
        try:
            client = redis_lib.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=5.0,
                                              health_check_interval=5, retry_on_timeout=False)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe(channel)
            store = ref()
            if store is None:
                return
            # Subscribed (again): changes published while nobody listened are unknown, so drop everything.
            segment = store.cache.segment
            del store
            segment.invalidate()
            delay = 0.5
            while not stop.is_set() and ref() is not None:
                message = pubsub.get_message(timeout=1.0)
                if message is not None and message.get("type") == "message":
                    try:
                        token = int(message["data"], 16)
                    except (TypeError, ValueError):
                        continue
                    segment.note_message(token)
        except Exception as error:
            store = ref()
            if store is not None:
                store._warn("Redis invalidation subscriber failed (%s); polling the store until it is back",
                            type(error).__name__)
            del store
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        finally:
            if pubsub is not None:
                try:
                    pubsub.close()
                except Exception:
                    pass


def build(inner, settings, redis=None) -> MetadataStore:
    """The gateway's store: `inner` wrapped, cached in the master's segment (a worker) or a private one."""
    from . import shm
    ttl = settings.metadata_cache_ttl
    cache = None
    if ttl > 0:
        segment = shm.shared()
        if segment is not None:
            cache = Cache(segment, ttl)
        else:
            size = settings.metadata_cache_bytes
            cache = lambda: Cache(Segment.create(size), ttl)  # noqa: E731
    return MetadataStore(inner, cache, redis=redis, poll_interval=settings.metadata_poll_interval)
