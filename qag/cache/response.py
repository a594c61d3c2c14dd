"""The response cache (contract 7.1, 7.2): rendered /q responses per saved-query version's `cache_ttl`, kept in a
per-process LRU bounded by entries and bytes, or in Redis (hash `qag:cache:<key>`) when QAG_REDIS_URL is set.

The data plane asks `ResponseCache.lookup()` once the call has passed every check before the database and, on a
miss, hands the rendered 200 to `ResponseCache.store()`. A hit is replayed from here: no store read, no database
call, no run-history entry or event. With Redis, Redis replaces the local LRU entirely; a Redis failure is a miss
(and a skipped write), never an error on a run.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ..errors import QagError
from ..http.response import Response

MAX_ENTRIES = 10_000          # contract 7.1: at most 10,000 entries per process
WORKSPACE = "default"         # the only workspace this server has (contract: the key includes it)
REDIS_PREFIX = "qag:cache:"
_SCAN_BATCH = 500
_OVERHEAD = 256               # bytes counted per entry besides its body and headers (key, meta, bookkeeping)
_NOT_STORED = frozenset({"content-type", "content-length"})


def cache_key(name: str, version: int, connection: str, values: dict, fmt: str, page: int, size: int,
              mask_fingerprint: str, workspace: str = WORKSPACE) -> str:
    """SHA-256 hex of everything that decides a cached body (contract 7.1), never the API key.

    `values` are the RESOLVED parameter values, so `?id=1` and `{"params":{"id":1}}` meet when `id` is a declared
    int; JSON keeps 1, 1.0, "1" and true apart, so values that may bind differently never share an entry."""
    canonical = json.dumps([name, version, connection, values, fmt, page, size, mask_fingerprint, workspace],
                           sort_keys=True, separators=(",", ":"), default=_tagged)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _tagged(value) -> dict:
    # Resolved values are JSON types today; anything else keeps its type in the key rather than failing the call.
    return {"\x00type": type(value).__name__, "repr": repr(value)}


def etag_of(body: bytes) -> str:
    """The quoted SHA-256 hex of the body (contract 7.1)."""
    return '"' + hashlib.sha256(body).hexdigest() + '"'


@dataclass(frozen=True, slots=True)
class Entry:
    """One cached response: what a hit replays, and what the admin routes show."""

    body: bytes
    content_type: str
    etag: str                              # quoted
    headers: tuple[tuple[str, str], ...]   # X-Page, X-Page-Size, X-Row-Count, X-Has-More (not Content-Type/-Length)
    meta: dict                             # name, version, connection, format, page, workspace
    expires: float = 0.0                   # monotonic deadline (local cache only; Redis expires by itself)

    @property
    def size(self) -> int:
        """Bytes this entry holds against QAG_RESPONSE_CACHE_MAX_BYTES."""
        return (len(self.body) + len(self.content_type) + len(self.etag) + _OVERHEAD
                + sum(len(h) + len(v) for h, v in self.headers))


class LocalEntries:
    """The per-process LRU: at most `max_entries` and `max_bytes`, least recently used evicted first; an entry is
    dead at store time + TTL on `clock` (monotonic). One short lock around each dict operation."""

    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES, clock: Callable[[], float] = time.monotonic):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.clock = clock
        self.bytes = 0
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires <= self.clock():
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: Entry, ttl: int) -> None:
        size = entry.size
        if size > self.max_bytes:
            return  # one response larger than the whole cache would only evict everything else
        with self._lock:
            now = self.clock()
            if key in self._entries:
                self._drop(key)
            entries = self._entries
            entries[key] = _with_expiry(entry, now + ttl)
            self.bytes += size
            while len(entries) > self.max_entries or self.bytes > self.max_bytes:
                self._drop(next(iter(entries)))

    def live(self) -> list[tuple[str, dict, str, int, float]]:
        """(key, meta, content type, body bytes, seconds left) of every live entry."""
        with self._lock:
            now = self.clock()
            return [(k, e.meta, e.content_type, len(e.body), e.expires - now)
                    for k, e in self._entries.items() if e.expires > now]

    def peek(self, key: str) -> Entry | None:
        """A live entry without making it recently used (an administrator looking is not a use)."""
        with self._lock:
            entry = self._entries.get(key)
        return entry if entry is not None and entry.expires > self.clock() else None

    def remove(self, key: str) -> None:
        with self._lock:
            if key in self._entries:
                self._drop(key)

    def clear(self, workspace: str) -> None:
        with self._lock:
            for key in [k for k, e in self._entries.items() if e.meta.get("workspace") == workspace]:
                self._drop(key)

    def _drop(self, key: str) -> None:
        self.bytes -= self._entries.pop(key).size


def _with_expiry(entry: Entry, expires: float) -> Entry:
    return Entry(entry.body, entry.content_type, entry.etag, entry.headers, entry.meta, expires)


class RedisEntries:
    """The same operations on Redis through the worker's SharedRedis: a failure reads as a miss and skips a write
    (SharedRedis backs off for a few seconds, so a dead Redis costs one short timeout, not one per call)."""

    def __init__(self, shared):
        self.shared = shared

    def get(self, key: str) -> Entry | None:
        fields = self.shared.call(lambda r: r.hgetall(REDIS_PREFIX + key), dict)
        return _entry_from_redis(fields) if fields else None

    def put(self, key: str, entry: Entry, ttl: int) -> None:
        mapping = {"body": entry.body, "content_type": entry.content_type, "etag": entry.etag,
                   "headers": json.dumps(entry.headers), "meta": json.dumps(entry.meta)}

        def write(r):
            # One MULTI/EXEC: an entry never exists without its expiry.
            pipe = r.pipeline(transaction=True)
            pipe.hset(REDIS_PREFIX + key, mapping=mapping)
            pipe.expire(REDIS_PREFIX + key, ttl)
            pipe.execute()

        self.shared.call(write, lambda: None)

    def live(self) -> list[tuple[str, dict, str, int, float]]:
        def read(r):
            names = list(r.scan_iter(match=REDIS_PREFIX + "*", count=_SCAN_BATCH))
            pipe = r.pipeline(transaction=False)
            for name in names:
                pipe.hmget(name, "content_type", "meta")
                pipe.hstrlen(name, "body")
                pipe.pttl(name)
            replies = pipe.execute() if names else []
            out = []
            for i, name in enumerate(names):
                (content_type, meta), size, pttl = replies[3 * i:3 * i + 3]
                if content_type is None or meta is None or pttl is None or pttl <= 0:
                    continue  # expired between SCAN and read, or not a cache entry
                try:
                    meta = json.loads(meta)
                    out.append((name.decode()[len(REDIS_PREFIX):], meta, content_type.decode(), size, pttl / 1000.0))
                except (ValueError, UnicodeDecodeError):
                    continue
            return out

        return self.shared.call(read, _unavailable)

    def peek(self, key: str) -> Entry | None:
        fields = self.shared.call(lambda r: r.hgetall(REDIS_PREFIX + key), _unavailable)
        return _entry_from_redis(fields) if fields else None

    def remove(self, key: str) -> None:
        self.shared.call(lambda r: r.delete(REDIS_PREFIX + key), _unavailable)

    def clear(self, workspace: str) -> None:
        def clear(r):
            names = list(r.scan_iter(match=REDIS_PREFIX + "*", count=_SCAN_BATCH))
            pipe = r.pipeline(transaction=False)
            for name in names:
                pipe.hget(name, "meta")
            metas = pipe.execute() if names else []
            doomed = [n for n, m in zip(names, metas) if m is not None and _workspace_of(m) == workspace]
            for start in range(0, len(doomed), _SCAN_BATCH):
                r.delete(*doomed[start:start + _SCAN_BATCH])

        self.shared.call(clear, _unavailable)


def _workspace_of(meta: bytes) -> str | None:
    try:
        return json.loads(meta).get("workspace")
    except (ValueError, AttributeError):
        return None


def _entry_from_redis(fields: dict) -> Entry | None:
    try:
        return Entry(fields[b"body"], fields[b"content_type"].decode(), fields[b"etag"].decode(),
                     tuple(tuple(pair) for pair in json.loads(fields[b"headers"])), json.loads(fields[b"meta"]))
    except (KeyError, ValueError, TypeError, UnicodeDecodeError):
        return None  # a partial or foreign hash is a miss, never an error


def _unavailable():
    raise QagError("unavailable", "The response cache is kept in Redis, and Redis is not reachable right now")


class ResponseCache:
    """One per worker: the entries (local or Redis), the hit/miss hook for metrics, and the HTTP semantics."""

    def __init__(self, entries, on_lookup: Callable[[bool], None] | None = None):
        self.entries = entries
        self.on_lookup = on_lookup

    @classmethod
    def from_settings(cls, settings, redis=None, on_lookup: Callable[[bool], None] | None = None) -> "ResponseCache":
        entries = RedisEntries(redis) if redis is not None else LocalEntries(settings.response_cache_max_bytes)
        return cls(entries, on_lookup)

    @property
    def local_count(self) -> int:
        """Entries held in this process (0 with Redis: those are counted nowhere per process)."""
        return len(self.entries) if isinstance(self.entries, LocalEntries) else 0

    # --- the data plane ---------------------------------------------------------------------------------------
    def lookup(self, key: str, ttl: int, if_none_match: str | None) -> Response | None:
        """A live entry's replay (200, or 304 when If-None-Match is its ETag), or None for a miss."""
        entry = self.entries.get(key)
        if self.on_lookup is not None:
            self.on_lookup(entry is not None)
        if entry is None:
            return None
        control = ("Cache-Control", f"private, max-age={ttl}")  # the version's current TTL, in full
        if if_none_match is not None and if_none_match == entry.etag:
            return Response(304, b"", [("ETag", entry.etag), control, ("X-Cache", "HIT")])
        return Response(200, entry.body, [*entry.headers, ("X-Cache", "HIT"), ("ETag", entry.etag), control],
                        entry.content_type)

    def store(self, key: str, response: Response, ttl: int, meta: dict) -> None:
        """Keep a rendered 200 and mark it a MISS (its ETag is sent even when the write is skipped)."""
        body = response.body
        if response.status != 200 or not isinstance(body, bytes):
            return
        content_type = ""
        kept = []
        for name, value in response.headers:
            lower = name.lower()
            if lower == "content-type":
                content_type = value
            elif lower not in _NOT_STORED:
                kept.append((name, value))
        etag = etag_of(body)
        response.headers += [("X-Cache", "MISS"), ("ETag", etag), ("Cache-Control", f"private, max-age={ttl}")]
        self.entries.put(key, Entry(body, content_type, etag, tuple(kept), dict(meta, workspace=WORKSPACE)), ttl)

    # --- administration (contract 7.2) --------------------------------------------------------------------------
    def list(self, workspace: str = WORKSPACE) -> list[dict]:
        items = []
        for key, meta, content_type, size, remaining in self.entries.live():
            if not isinstance(meta, dict) or meta.get("workspace") != workspace:
                continue
            items.append({"key": key, "meta": {f: meta.get(f) for f in
                                               ("name", "version", "connection", "format", "page", "workspace")},
                          "content_type": content_type, "size_bytes": size, "ttl_remaining_s": max(round(remaining, 3), 0.001)})
        items.sort(key=lambda item: item["ttl_remaining_s"])
        return items

    def get(self, key: str, workspace: str = WORKSPACE) -> Entry | None:
        entry = self.entries.peek(key)
        if entry is None or entry.meta.get("workspace") != workspace:
            return None
        return entry

    def evict(self, key: str) -> None:
        self.entries.remove(key)

    def clear(self, workspace: str = WORKSPACE) -> None:
        self.entries.clear(workspace)
