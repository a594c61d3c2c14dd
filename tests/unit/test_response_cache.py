"""The response cache without a server: the key function, the entries kept in a private host segment (entries,
bytes, TTL on an injected clock; the layout itself: tests/unit/test_hostentries.py), and the HTTP semantics of a
lookup (MISS marking, ETag, 304 only on an exact If-None-Match)."""

from __future__ import annotations

import hashlib

from qag.cache.hostentries import BLOCK, Segment
from qag.cache.response import Entry, ResponseCache, SharedEntries, cache_key, etag_of
from qag.http.response import Response


class Clock:
    """Seconds in `now`; the segment reads CLOCK_MONOTONIC-like nanoseconds."""

    def __init__(self):
        self.now = 500.0

    def __call__(self):
        return int(self.now * 1_000_000_000)


def private_entries(max_bytes: int, max_entries: int = 10_000, clock=None) -> SharedEntries:
    """The entries of a private segment (what an in-process Gateway gets)."""
    return SharedEntries(Segment.create(max_bytes, max_entries, clock=clock or Clock()))


BASE = dict(name="films", version=1, connection="lite", values={"id": 1}, fmt="json", page=1, size=10,
            mask_fingerprint="", read_only=True)


def entry(body: bytes = b"[]\n", workspace: str = "default") -> Entry:
    return Entry(body, "application/json", etag_of(body), (("X-Page", "1"),), {"name": "q", "workspace": workspace})


# --- the key ---------------------------------------------------------------------------------------------------
def test_key_is_sha256_hex_and_stable():
    key = cache_key(**BASE)
    assert len(key) == 64 and int(key, 16) >= 0
    assert cache_key(**BASE) == key
    # dict order of the values does not matter
    assert cache_key(**dict(BASE, values={"a": 1, "b": 2})) == cache_key(**dict(BASE, values={"b": 2, "a": 1}))


def test_mask_fingerprints_make_different_keys():
    plain = cache_key(**BASE)
    masked = cache_key(**dict(BASE, mask_fingerprint="f1"))
    other = cache_key(**dict(BASE, mask_fingerprint="f2"))
    assert len({plain, masked, other}) == 3
    assert cache_key(**dict(BASE, mask_fingerprint="f1")) == masked  # same rules share entries


def test_every_component_is_in_the_key():
    base = cache_key(**BASE)
    changes = [{"name": "films.json"}, {"version": 2}, {"connection": "other"}, {"values": {"id": 2}},
               {"fmt": "csv"}, {"page": 2}, {"size": 11}, {"workspace": "w2"},
               {"source": ("SELECT 2", None, "sqlite", {"path": "lite.db"})}, {"read_only": False}]
    keys = {cache_key(**dict(BASE, **change)) for change in changes}
    assert base not in keys and len(keys) == len(changes)


def test_values_of_different_types_never_share_a_key():
    keys = {cache_key(**dict(BASE, values={"id": v})) for v in (1, "1", 1.0, True, None, [1])}
    assert len(keys) == 6


def test_a_non_json_value_is_keyed_by_type_and_repr_not_refused():
    import decimal
    a = cache_key(**dict(BASE, values={"id": decimal.Decimal("1.5")}))
    assert a == cache_key(**dict(BASE, values={"id": decimal.Decimal("1.5")}))
    assert a != cache_key(**dict(BASE, values={"id": 1.5}))


# --- the LRU -----------------------------------------------------------------------------------------------------
def test_lru_evicts_the_least_recently_used_by_entries():
    lru = private_entries(max_bytes=1 << 20, max_entries=3, clock=Clock())
    for k in "abc":
        lru.put(k, entry(), 60)
    assert lru.get("a") is not None       # a becomes the most recently used
    lru.put("d", entry(), 60)
    assert lru.get("b") is None            # b was the least recently used
    assert all(lru.get(k) is not None for k in "acd") and len(lru) == 3


def test_lru_evicts_by_bytes_and_accounts_exactly():
    # Bytes are counted in whole blocks of the shared area (this body and its head take two).
    one = entry(b"x" * 1000)
    lru = private_entries(max_bytes=4 * BLOCK, max_entries=100, clock=Clock())
    lru.put("a", one, 60)
    lru.put("b", one, 60)
    assert lru.bytes == 4 * BLOCK and len(lru) == 2
    lru.put("c", one, 60)
    assert lru.get("a") is None and lru.get("b") is not None and lru.get("c") is not None
    assert lru.bytes == 4 * BLOCK
    lru.put("c", entry(b"y"), 60)           # replacing an entry gives its bytes back
    assert lru.bytes == 3 * BLOCK
    lru.remove("b")
    lru.remove("nope")
    assert lru.bytes == BLOCK and len(lru) == 1


def test_an_entry_larger_than_the_cache_is_not_stored_and_evicts_nothing():
    small = entry(b"s")
    lru = private_entries(max_bytes=3 * BLOCK, clock=Clock())
    lru.put("small", small, 60)
    lru.put("huge", entry(b"h" * (3 * BLOCK)), 60)
    assert lru.get("huge") is None and lru.get("small") is not None


def test_ttl_on_the_injected_clock():
    clock = Clock()
    lru = private_entries(max_bytes=1 << 20, clock=clock)
    lru.put("a", entry(), 10)
    clock.now += 9.99
    assert lru.get("a") is not None
    assert [(k, round(left, 2)) for k, _, _, _, left in lru.live()] == [("a", 0.01)]
    clock.now += 0.01                       # dead at store time + TTL (its blocks are reused by the next store)
    assert lru.get("a") is None and lru.live() == []
    lru.put("b", entry(), 5)
    clock.now += 6
    assert lru.live() == [] and lru.peek("b") is None


def test_a_changed_ttl_applies_to_entries_stored_from_then_on():
    clock = Clock()
    cache = ResponseCache(private_entries(1 << 20, clock=clock))
    key = cache_key(**BASE)
    cache.store(key, Response(200, b"[1]\n", [], "application/json"), 10, {"name": "films"})
    clock.now += 5
    hit = cache.lookup(key, 100, None)      # the version's TTL is now 100: advertised in full...
    assert ("Cache-Control", "private, max-age=100") in hit.headers
    clock.now += 5                          # ...but the entry keeps its own expiry
    assert cache.lookup(key, 100, None) is None


def test_clear_is_per_workspace():
    lru = private_entries(max_bytes=1 << 20, clock=Clock())
    lru.put("a", entry(workspace="default"), 60)
    lru.put("b", entry(workspace="other"), 60)
    lru.clear("default")
    assert lru.get("a") is None and lru.get("b") is not None


# --- HTTP semantics -------------------------------------------------------------------------------------------
def test_store_marks_a_miss_and_lookup_replays_a_hit_or_304():
    seen = []
    cache = ResponseCache(private_entries(1 << 20, clock=Clock()), seen.append)
    key = cache_key(**BASE)
    assert cache.lookup(key, 60, None) is None
    body = b'[{"id":1}]\n'
    response = Response(200, body, [("X-Page", "1"), ("X-Has-More", "false")], "application/json")
    cache.store(key, response, 60, {"name": "films", "version": 1})
    etag = '"' + hashlib.sha256(body).hexdigest() + '"'
    assert ("X-Cache", "MISS") in response.headers and ("ETag", etag) in response.headers
    assert ("Cache-Control", "private, max-age=60") in response.headers
    hit = cache.lookup(key, 60, None)
    assert hit.status == 200 and hit.body == body
    assert dict(hit.headers) == {"X-Page": "1", "X-Has-More": "false", "X-Cache": "HIT", "ETag": etag,
                                 "Cache-Control": "private, max-age=60", "Content-Type": "application/json"}
    not_modified = cache.lookup(key, 60, etag)
    assert not_modified.status == 304 and not_modified.body == b""
    assert dict(not_modified.headers) == {"ETag": etag, "Cache-Control": "private, max-age=60", "X-Cache": "HIT"}
    for near in (etag.strip('"'), "W/" + etag, etag + ", " + etag, "*"):
        assert cache.lookup(key, 60, near).status == 200   # only the exact quoted ETag
    assert seen == [False, True, True, True, True, True, True]


def test_only_complete_200_bodies_are_stored():
    cache = ResponseCache(private_entries(1 << 20, clock=Clock()))
    cache.store("k1", Response(500, b"{}", [], "application/json"), 60, {})
    cache.store("k2", Response(200, iter([b"a"]), [], "text/csv"), 60, {})
    assert cache.lookup("k1", 60, None) is None and cache.lookup("k2", 60, None) is None
    assert cache.list() == []


def test_the_source_is_the_connection_as_this_process_resolves_it():
    # A `${VAR}` field read from the environment: an instance restarted with another value (or another instance
    # of the deployment with its own) reaches another database, so it must never meet the entries the old value
    # made through Redis. The same value gives the same source (and the same memo entry) call after call.
    from qag.backends.base import resolved
    from qag.cache.response import source_of
    version = {"sql": "SELECT 1", "columns": None}
    row = {"db": "mysql", "fields": {"host": "127.0.0.1", "database": "${SHOP_DATABASE_NAME}"}}
    eu, us = {"SHOP_DATABASE_NAME": "shop_eu"}, {"SHOP_DATABASE_NAME": "shop_us"}
    first = source_of(version, row, resolved(row["fields"], eu))
    again = source_of(version, row, resolved(row["fields"], eu))
    other = source_of(version, row, resolved(row["fields"], us))
    assert first == again and first != other
    assert source_of({"sql": "SELECT 2", "columns": None}, row, resolved(row["fields"], eu)) != first
