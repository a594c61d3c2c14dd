"""The response cache (contract 7.1, 7.2): rendered /q responses per saved-query version's `cache_ttl`, kept in
the host's shared-memory LRU for every worker (qag/cache/hostentries.py), or in Redis (hash `qag:<deployment>:cache:<key>`)
when QAG_REDIS_URL is set.

The data plane asks `ResponseCache.lookup()` once the call has passed every check before the database and, on a
miss, hands the rendered 200 to `ResponseCache.store()`. A hit is replayed from here: no store read, no database
call, no run-history entry or event. With Redis, Redis replaces the host's segment entirely; a Redis failure is a
miss (and a skipped write), never an error on a run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Callable

import msgspec

from . import hostentries
from ..errors import QagError
from ..http.response import Response

MAX_ENTRIES = 10_000          # contract 7.1: at most 10,000 entries (per host here, where the contract has per process)
WORKSPACE = "default"         # the only workspace this server has (contract: the key includes it)
REDIS_PREFIX = "cache:"   # after the deployment's prefix (SharedRedis.prefix)
_SCAN_BATCH = 500
_KEPT_MAX_SECONDS = 10 * 366 * 86400   # an entry's longest life, whatever its version's cache_ttl
# Vary is the call's own: the key holds the format, but whether Accept chose it (and so whether the answer varies
# with Accept) differs between calls that share the entry (`?format=csv` and `Accept: text/csv`).
_NOT_STORED = frozenset({"content-type", "content-length", "vary"})
_encode_head = msgspec.msgpack.Encoder().encode


def cache_key(name: str, version: int, connection: str, values: dict, fmt: str, page: int, size: int,
              mask_fingerprint: str, workspace: str = WORKSPACE, source=None, *, read_only: bool) -> str:
    """SHA-256 hex of everything that decides a cached body (contract 7.1), never the API key.

    `values` are the RESOLVED parameter values, so `?id=1` and `{"params":{"id":1}}` meet when `id` is a declared
    int; JSON keeps 1, 1.0, "1" and true apart, so values that may bind differently never share an entry.
    `source` is what the body is made from besides (source_of: the version's SQL and output columns, the
    connection's database): a query deleted and made again with other SQL, or a connection pointed elsewhere,
    never meets the entries of the old one. (Deployments with stores of their own never share entries: their
    Redis names differ, qag/redisconn.namespace_prefix.) `read_only`: False for a call that runs read-write a
    statement that may write (a function that isn't one of the engine's own built-ins can): its body never
    answers a read-only caller, whom the database would have refused. Every other call is True, so callers of a
    plain read share entries whatever they may write."""
    canonical = json.dumps([name, version, connection, values, fmt, page, size, mask_fingerprint, workspace, source,
                            read_only],
                           sort_keys=True, separators=(",", ":"), default=_tagged)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _tagged(value) -> dict:
    # Resolved values are JSON types today; anything else keeps its type in the key rather than failing the call.
    return {"\x00type": type(value).__name__, "repr": repr(value)}


_SOURCES: dict[tuple[int, int, int], tuple[dict, object, object, str]] = {}
_SOURCES_MAX = 4096


def source_of(version: dict, connection: dict | None, fields: dict | None) -> str:
    """What a cached body is made from besides the call's inputs - the version's SQL and output columns, the
    connection's database and its fields as this process resolves them (`${VAR}` filled from the environment:
    an instance restarted with another value never meets the entries the old one made) - as a digest for
    cache_key's `source`.

    The rows come from the metadata cache, which hands every call the same objects while they are unchanged
    (and never changes them in place), and backends.base.resolved hands out the same fields while the variables
    they read keep their values, so the digest is worked out once per triple: the memo holds the objects
    themselves, so an id is never taken for another's."""
    memo = (id(version), id(connection), id(fields))
    known = _SOURCES.get(memo)
    if known is not None and known[0] is version and known[1] is connection and known[2] is fields:
        return known[3]
    text = json.dumps([version.get("sql"), version.get("columns"), connection and connection.get("db"), fields],
                      sort_keys=True, separators=(",", ":"), default=_tagged)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    if len(_SOURCES) >= _SOURCES_MAX:
        _SOURCES.clear()  # bounded: start over
    _SOURCES[memo] = (version, connection, fields, digest)
    return digest


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


class SharedEntries:
    """The entries in the host's shared-memory segment (qag/cache/hostentries.py): every worker sees and evicts
    the same ones; bounded by the segment's bytes and 10,000 entries, least recently used evicted first."""

    def __init__(self, segment: "hostentries.Segment"):
        self.segment = segment
        # A hit is the segment's own lookup: what it returns has Entry's fields (body, content_type, etag,
        # headers, meta), so nothing is built per hit.
        self.get: Callable[[str], "hostentries.Found | None"] = segment.find

    @classmethod
    def for_host(cls, max_bytes: int) -> "SharedEntries":
        """The gunicorn master's segment in a worker it forked, else a private one for this process."""
        segment = hostentries.shared()
        return cls(segment if segment is not None else hostentries.Segment.create(max_bytes, MAX_ENTRIES))

    def __len__(self) -> int:
        return self.segment.counts()["entries"]

    @property
    def bytes(self) -> int:
        """Bytes of the segment's data area in use (whole blocks)."""
        return self.segment.counts()["bytes"]

    def put(self, key: str, entry: Entry, ttl: int) -> None:
        head = _encode_head([key, entry.content_type, entry.etag, entry.headers, entry.meta])
        self.segment.put(key, head, entry.body, int(ttl * 1_000_000_000))  # too big: counted, not stored

    def live(self) -> list[tuple[str, dict, str, int, float]]:
        """(key, meta, content type, body bytes, seconds left) of every live entry."""
        return self.segment.live()

    def peek(self, key: str) -> "hostentries.Found | None":
        """A live entry without making it recently used (an administrator looking is not a use)."""
        return self.segment.find(key, recent=False)

    def remove(self, key: str) -> None:
        self.segment.remove(key)

    def clear(self, workspace: str) -> None:
        self.segment.clear(lambda meta: not isinstance(meta, dict) or meta.get("workspace") != workspace)


class RedisEntries:
    """The same operations on Redis through the worker's SharedRedis: a failure reads as a miss and skips a write
    (SharedRedis backs off for a few seconds, so a dead Redis costs one short timeout, not one per call)."""

    def __init__(self, shared):
        self.shared = shared
        self.prefix = shared.prefix + REDIS_PREFIX

    def get(self, key: str) -> Entry | None:
        fields = self.shared.call(lambda r: r.hgetall(self.prefix + key), dict)
        return _entry_from_redis(fields) if fields else None

    def put(self, key: str, entry: Entry, ttl: int) -> None:
        mapping = {"body": entry.body, "content_type": entry.content_type, "etag": entry.etag,
                   "headers": json.dumps(entry.headers), "meta": json.dumps(entry.meta)}

        def write(r):
            # One MULTI/EXEC: an entry never exists without its expiry.
            pipe = r.pipeline(transaction=True)
            pipe.hset(self.prefix + key, mapping=mapping)
            pipe.expire(self.prefix + key, ttl)
            pipe.execute()

        self.shared.call(write, lambda: None)

    def live(self) -> list[tuple[str, dict, str, int, float]]:
        def read(r):
            names = list(r.scan_iter(match=self.prefix + "*", count=_SCAN_BATCH))
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
                    out.append((name.decode()[len(self.prefix):], meta, content_type.decode(), size, pttl / 1000.0))
                except (ValueError, UnicodeDecodeError):
                    continue
            return out

        return self.shared.call(read, _unavailable)

    def peek(self, key: str) -> Entry | None:
        fields = self.shared.call(lambda r: r.hgetall(self.prefix + key), _unavailable)
        return _entry_from_redis(fields) if fields else None

    def remove(self, key: str) -> None:
        self.shared.call(lambda r: r.delete(self.prefix + key), _unavailable)

    def clear(self, workspace: str) -> None:
        def clear(r):
            names = list(r.scan_iter(match=self.prefix + "*", count=_SCAN_BATCH))
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
    """One per worker: the entries (the host's segment, or Redis), the hit/miss hook for metrics, and the HTTP
    semantics."""

    def __init__(self, entries, on_lookup: Callable[[bool], None] | None = None):
        self.entries = entries
        self.on_lookup = on_lookup

    @classmethod
    def from_settings(cls, settings, redis=None, on_lookup: Callable[[bool], None] | None = None) -> "ResponseCache":
        entries = (RedisEntries(redis) if redis is not None
                   else SharedEntries.for_host(settings.response_cache_max_bytes))
        return cls(entries, on_lookup)

    @property
    def local_count(self) -> int:
        """For the entries gauge, which /metrics sums over the workers: the host's count from one worker, 0 from
        the others (and 0 with Redis: those are counted nowhere on this host)."""
        return self.entries.segment.reported_entries() if isinstance(self.entries, SharedEntries) else 0

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
        # Kept at most ten years whatever the TTL (any integer may be saved): an expiry in nanoseconds fits 64 bits
        entry = Entry(body, content_type, etag, tuple(kept), dict(meta, workspace=WORKSPACE))
        self.entries.put(key, entry, min(ttl, _KEPT_MAX_SECONDS))

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
