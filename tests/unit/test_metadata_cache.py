"""The shared-memory metadata cache: the segment with several workers, forked writers and readers, the store
wrapper (rows cached, changes invalidating, zero store reads when warm), in-process through the gateway."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import sqlite3
import threading
import time

import msgspec
import pytest

from qag import _speedups
from qag.cache import shm
from qag.cache.metadata import CONFIG_KEY, MetadataStore
from qag.cache.shm import HEADER, MISS, Cache, Segment
from qag.store.sqlite import SqliteStore
from tests.speedups.conftest import compiled_or_skip
from tests.unit.test_observe_history import ADMIN, App


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


class Clock:
    def __init__(self):
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def segment(twin):
    s = Segment.create(1 << 20, twin=twin)
    yield s
    s.close()


def workers(segment, n=3, ttl=60.0, clock=None):
    """n "workers" in this process: views of one segment, each with its own identity and decoded entries."""
    return [Cache(segment, ttl, worker=1000 + i, clock=clock or time.monotonic_ns) for i in range(n)]


# --- the segment, several workers in one process ------------------------------------------------------------
def test_a_row_read_by_one_worker_serves_the_others(segment):
    a, b, c = workers(segment)
    g = a.generation()
    assert a.get("kabc") is MISS
    row = {"name": "k1", "active": True, "grants_json": "{}", "expires_at": None}
    assert a.put("kabc", [row, False], g) is True
    got = b.get("kabc", tuple)
    assert got == (row, False)
    # b's second hit is its own decoded object: no copy, no decoding.
    assert b.get("kabc", tuple) is got
    assert c.get("kxyz") is MISS
    assert b.counts() == (2, 0) and a.counts() == (0, 1)


def test_invalidation_by_one_worker_drops_every_workers_entries(segment):
    a, b, c = workers(segment)
    g = a.generation()
    a.put("c1", {"name": "one"}, g)
    assert b.get("c1") == {"name": "one"}
    segment.invalidate()
    assert a.get("c1") is MISS and b.get("c1") is MISS and c.get("c1") is MISS


def test_a_read_overlapping_an_invalidation_is_not_stored(segment):
    a, b, _ = workers(segment)
    before = a.generation()          # taken before the store read
    segment.invalidate()             # a change commits while the read is under way
    assert a.put("q1", ["stale"], before) is False
    assert a.get("q1") is MISS and b.get("q1") is MISS


def test_entries_expire_after_the_ttl(segment):
    clock = Clock()
    a, b, _ = workers(segment, ttl=5.0, clock=clock)
    a.put("c1", {"v": 1}, a.generation())
    clock.now += 4_900_000_000
    assert a.get("c1") == {"v": 1} and b.get("c1") == {"v": 1}
    clock.now += 200_000_000
    assert a.get("c1") is MISS and b.get("c1") is MISS


def test_a_full_table_evicts_and_never_fails(twin):
    segment = Segment.create(64 * 1024, slot_bytes=1024, twin=twin)  # the minimum: 16 slots
    try:
        (a,) = workers(segment, 1)
        assert segment.nslots == 63
        fresh = Cache(segment, 60.0, worker=2)
        for i in range(500):
            assert a.put(f"k{i}", {"i": i, "pad": "x" * 100}, a.generation()) is True
        assert segment.header()["evictions"] > 0
        found = sum(fresh.get(f"k{i}") is not MISS for i in range(500))
        assert 0 < found <= segment.nslots
        assert fresh.get("k499") == {"i": 499, "pad": "x" * 100}  # the newest always has a place
    finally:
        segment.close()


def test_a_row_too_big_for_a_slot_stays_with_its_worker(segment):
    a, b, _ = workers(segment)
    big = {"sql": "SELECT 1 -- " + "x" * (segment.capacity + 10)}
    assert a.put("qbig", big, a.generation()) is False
    assert a.get("qbig") == big          # kept by the worker that read it, still under the generation
    assert b.get("qbig") is MISS
    segment.invalidate()
    assert a.get("qbig") is MISS


def _slot_of(segment, key: str) -> int:
    return HEADER + (shm.key_hash(key.encode()) % segment.nslots) * segment.slot_bytes


def test_torn_or_corrupt_entries_are_never_returned(segment):
    a, b, c = workers(segment)
    a.put("c1", {"name": "one", "fields": {"database": "x.db"}}, a.generation())
    base = _slot_of(segment, "c1")
    mm = segment._mm
    assert c.get("c1") == {"name": "one", "fields": {"database": "x.db"}}
    # A writer in the middle of the slot (odd sequence): not read.
    seq = segment.sync.load(base)
    segment.sync.store(base, seq + 1)
    assert b.get("c1") is MISS
    segment.sync.store(base, seq)
    # Payload bytes changed under an unchanged sequence (what a weakly ordered read could see): CRC refuses.
    at = mm.find(b"x.db", base, base + segment.slot_bytes)
    assert at > 0
    mm[at] = ord("y")
    assert b.get("c1") is MISS
    mm[at] = ord("x")
    # A length beyond the slot (a torn header): refused by the bounds check, nothing read past the slot.
    length_at = base + 32
    good = mm[length_at:length_at + 4]
    mm[length_at:length_at + 4] = (segment.capacity + 1).to_bytes(4, "little")
    assert b.get("c1") is MISS
    mm[length_at:length_at + 4] = good
    assert b.get("c1") == {"name": "one", "fields": {"database": "x.db"}}


def test_a_hash_collision_never_returns_another_keys_row(segment, monkeypatch):
    a, b, _ = workers(segment)
    monkeypatch.setattr(shm, "key_hash", lambda key: 7 | 1 << 32)
    a.put("cone", {"name": "one"}, a.generation())
    assert b.get("ctwo") is MISS
    assert b.get("cone") == {"name": "one"}


def test_one_poll_per_interval_per_host(segment):
    clock = Clock()
    a, b, c = workers(segment, clock=clock)
    second = 1_000_000_000
    winners = [w.worker for w in (a, b, c) if segment.claim_poll(clock(), second, w.worker)]
    assert winners == [1000]
    assert segment.header()["poll_by"] == 1000
    clock.now += second // 2
    assert not any(segment.claim_poll(clock(), second, w.worker) for w in (a, b, c))
    clock.now += second
    assert [w.worker for w in (c, b, a) if segment.claim_poll(clock(), second, w.worker)] == [1002]
    assert segment.header()["poll_by"] == 1002


def test_config_generation_and_redis_messages_drop_entries_once(segment):
    (a,) = workers(segment, 1)
    a.put("c1", {"v": 1}, a.generation())
    assert segment.note_config(5) is True          # moved: dropped
    assert a.get("c1") is MISS
    a.put("c1", {"v": 1}, a.generation())
    assert segment.note_config(5) is False         # the other workers' polls of the same value change nothing
    assert a.get("c1") == {"v": 1}
    assert segment.note_message(77) is True and segment.note_message(77) is False
    # A local change records its own config generation and token: this host's poll and subscriber skip them.
    segment.invalidate(config=6, message=99)
    assert segment.note_config(6) is False and segment.note_message(99) is False


# --- real processes ---------------------------------------------------------------------------------------------
def _value(i: int, salt: int) -> dict:
    rng = random.Random(i * 7919 + salt)
    body = "".join(rng.choices("abcdefgh", k=rng.randint(10, 3000)))
    return {"i": i, "salt": salt, "body": body, "sha": hashlib.sha256(f"{i}:{salt}:{body}".encode()).hexdigest()}


def _hammer(segment, worker: int, seconds: float, writer: bool, results) -> None:
    cache = Cache(segment, 60.0, worker=worker)
    rng = random.Random(worker)
    checked = bad = stored = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        i = rng.randrange(64)
        key = f"q{i}"
        if writer:
            g = cache.generation()
            if cache.put(key, _value(i, rng.randrange(1 << 30)), g):
                stored += 1
            if rng.random() < 0.01:
                segment.invalidate()
            # Forget own decoded entries now and then, so this process reads the segment too.
            cache._local.clear()
        else:
            cache._local.clear()  # every read goes to shared memory
        got = cache.get(key)
        if got is not MISS:
            checked += 1
            text = f"{got['i']}:{got['salt']}:{got['body']}"
            if got["i"] != i or hashlib.sha256(text.encode()).hexdigest() != got["sha"]:
                bad += 1
    results.put((worker, checked, bad, stored))


def test_forked_writers_and_readers_never_see_a_torn_entry(twin):
    """4 processes (2 writing and reading, 2 reading) for 3 s on one segment: every row read is checked."""
    segment = Segment.create(64 * 4096, twin=twin)   # 63 slots for 64 keys: constant eviction as well
    try:
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=_hammer, args=(segment, 1 + n, 3.0, n < 2, results)) for n in range(4)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
    finally:
        segment.close()
    assert all(bad == 0 for _, _, bad, _ in got), got
    assert all(checked > 100 for _, checked, _, _ in got), got
    assert sum(stored for *_, stored in got) > 100, got


# --- the store wrapper --------------------------------------------------------------------------------------
class Counting:
    """A store wrapper counting the reads made on one thread (the calling one)."""

    READS = ("key_by_hash", "get_query_for_run", "get_connection", "get_query", "get_query_head", "get_key",
             "get_version", "list_queries", "list_keys", "list_connections", "count_keys", "get_meta")

    def __init__(self, inner):
        self.inner = inner
        self.thread = None
        self.reads: list[str] = []

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name not in self.READS:
            return attr

        def counted(*args, **kwargs):
            if threading.get_ident() == self.thread:
                self.reads.append(name)
            return attr(*args, **kwargs)
        return counted


def test_a_warm_saved_query_call_reads_the_store_zero_times(tmp_path):
    app = App(str(tmp_path), QAG_METADATA_POLL_INTERVAL="0")
    counting = Counting(SqliteStore(str(tmp_path)))
    from qag.app import create_app
    from qag.settings import load
    app.gateway = create_app(load({"QAG_HOME": str(tmp_path), "QAG_API_KEY": ADMIN}), counting)
    app.query("films")
    secret = app.call("POST", "/api/v1/api-keys", {"name": "reader"})[2]["secret"]
    counting.thread = threading.get_ident()
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200
    cold = list(counting.reads)
    assert {"key_by_hash", "get_query_for_run", "get_connection"} <= set(cold)
    for _ in range(5):
        counting.reads.clear()
        status, _, body = app.call("GET", "/q/films", query="n=2", key=secret)
        assert status == 200 and len(body) == 2
        assert counting.reads == []
    # Off: every call reads the three rows again.
    app.gateway = create_app(load({"QAG_HOME": str(tmp_path), "QAG_API_KEY": ADMIN,
                                   "QAG_METADATA_CACHE_TTL": "0"}), counting)
    for _ in range(2):
        counting.reads.clear()
        assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200
        assert {"key_by_hash", "get_query_for_run", "get_connection"} <= set(counting.reads)


def test_changes_through_the_api_are_seen_on_the_next_call(tmp_path):
    app = App(str(tmp_path))
    app.query("films")
    secret = app.call("POST", "/api/v1/api-keys", {"name": "reader"})[2]["secret"]
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200
    # Revoking a key
    assert app.call("PATCH", "/api/v1/api-keys/reader", {"active": False})[0] == 200
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 401
    assert app.call("PATCH", "/api/v1/api-keys/reader", {"active": True})[0] == 200
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200
    # Deactivating a connection
    assert app.call("PATCH", "/api/v1/connections/lite", {"active": False})[0] == 200
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 403
    assert app.call("PATCH", "/api/v1/connections/lite", {"active": True})[0] == 200
    # A new published version
    status, _, body = app.call("POST", "/api/v1/queries/films/versions",
                               {"description": "v2", "sql": "SELECT id FROM t WHERE id <= :n", "connection_name": "lite",
                                "publish": True})
    assert status in (200, 201), body
    status, _, rows = app.call("GET", "/q/films", query="n=2", key=secret)
    assert status == 200 and rows == [{"id": 1}, {"id": 2}], rows
    # Every change moved the store's config generation too (other instances poll it).
    assert int(app.gateway.store.get_meta(CONFIG_KEY)) >= 5


def test_decisions_are_made_on_every_call_against_the_cached_row(tmp_path):
    app = App(str(tmp_path))
    app.query("films")
    secret = app.call("POST", "/api/v1/api-keys", {"name": "office", "allowed_ips": ["10.0.0.0/8"]})[2]["secret"]

    def call(peer):
        environ_app = app.gateway
        import io
        got = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/q/films", "QUERY_STRING": "n=1", "REMOTE_ADDR": peer,
                   "RAW_URI": "/q/films?n=1", "wsgi.input": io.BytesIO(b""), "HTTP_X_API_KEY": secret}
        b"".join(environ_app(environ, lambda s, h: got.append(s)))
        return int(got[0].split()[0])

    assert call("10.1.2.3") == 200
    assert call("192.0.2.1") == 401   # same cached row, judged again
    assert call("10.1.2.3") == 200
    hits, _ = app.gateway.metadata.cache.counts()
    assert hits >= 4


def test_a_direct_edit_of_the_store_is_seen_through_the_poll(tmp_path):
    """B7.9 as qag does it: an UPDATE made by another program moves config_generation (store triggers), which one
    worker polls about once a second."""
    app = App(str(tmp_path))
    app.query("films")
    secret = app.call("POST", "/api/v1/api-keys", {"name": "reader"})[2]["secret"]
    assert app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200
    conn = sqlite3.connect(app.store_path)
    conn.execute("UPDATE api_keys SET active = 0 WHERE name = 'reader'")
    conn.commit()
    conn.close()
    start = time.monotonic()
    while app.call("GET", "/q/films", query="n=2", key=secret)[0] == 200:
        # A bound far under the cache's TTL (60 s): what saw the edit is the poll (every second), however loaded
        # the machine is; how soon is measured by no test.
        assert time.monotonic() - start < 10, "a direct edit was not seen through the poll"
        time.sleep(0.05)
    # A usage stamp is not a change: it does not move the generation.
    before = app.gateway.store.get_meta(CONFIG_KEY)
    app.gateway.store.touch_key("reader", False, "2030-01-01 00:00:00")
    assert app.gateway.store.get_meta(CONFIG_KEY) == before


_LITE = {"name": "lite", "db": "sqlite", "active": True, "fields": {}, "example": False, "created_at": "x",
         "updated_at": "x"}


def _cached_store_with_lite(tmp_path):
    """(store on SQLite, the MetadataStore over it with a 60 s cache, the segment): connection 'lite' stored."""
    inner = SqliteStore(str(tmp_path))
    segment = Segment.create(1 << 20)
    store = MetadataStore(inner, Cache(segment, 60.0), poll_interval=0)
    store.put_connection(dict(_LITE), create=True)
    return inner, store, segment


def test_a_store_read_overlapping_a_change_is_not_cached(tmp_path):
    inner, store, segment = _cached_store_with_lite(tmp_path)
    row = _LITE
    try:
        real = inner.get_connection

        def slow_read(name):
            found = real(name)
            # Another thread changes the connection after this read and before it is cached.
            t = threading.Thread(target=store.put_connection, args=(dict(row, active=False),), kwargs={"create": False})
            t.start()
            t.join()
            return found

        inner.get_connection = slow_read
        assert store.get_connection("lite")["active"] is True   # what the read saw
        inner.get_connection = real
        assert store.get_connection("lite")["active"] is False  # not the stale row
    finally:
        segment.close()


def _deactivate_behind_the_cache(inner, store) -> None:
    """The connection row cached, then set inactive straight in the store file (no change announced)."""
    assert store.get_connection("lite")["active"] is True      # cached now
    other = sqlite3.connect(inner.path)
    other.execute("UPDATE connections SET active = 0")
    other.commit()
    other.close()


def test_reads_inside_a_transaction_are_fresh(tmp_path):
    inner, store, segment = _cached_store_with_lite(tmp_path)
    try:
        _deactivate_behind_the_cache(inner, store)
        assert store.get_connection("lite")["active"] is True      # cached (no poll here)
        with store.transaction():
            assert store.get_connection("lite")["active"] is False  # a read-modify-write sees the store
        assert store.fresh().get_connection("lite")["active"] is False  # management reads are fresh
    finally:
        segment.close()


def test_another_threads_transaction_leaves_this_threads_reads_cached(tmp_path):
    """Reads skip the thread-local depth while no transaction is open in the process: a transaction open on one
    thread makes that thread's reads fresh and nobody else's, and the count of open ones returns to zero, also
    when the transaction's body raises."""
    inner, store, segment = _cached_store_with_lite(tmp_path)
    try:
        _deactivate_behind_the_cache(inner, store)
        opened, release, seen = threading.Event(), threading.Event(), []

        def hold():
            with store.transaction():
                seen.append(store.get_connection("lite")["active"])   # fresh inside its own transaction
                opened.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        assert opened.wait(10)
        assert store._open_transactions == 1
        assert store.get_connection("lite")["active"] is True      # this thread: still the cached row
        release.set()
        holder.join(10)
        assert seen == [False]
        with pytest.raises(RuntimeError):
            with store.transaction():
                with store.transaction():
                    assert store._open_transactions == 1           # nested: one outermost transaction
                    raise RuntimeError("rolled back")
        assert store._open_transactions == 0
        assert store.get_connection("lite")["active"] is True
    finally:
        segment.close()


def test_cached_rows_survive_msgpack_exactly():
    row = {"name": "k", "active": True, "expires_at": None, "grants_json": '{"a":1}', "n": 1.5, "l": [1, "x"]}
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(["k", [row, True]])) == ["k", [row, True]]


def test_rotation_grace_ends_on_time_with_the_row_cached(tmp_path, monkeypatch):
    """Contract 7.3: expiry is a decision, judged on every call against the cached row, so it happens on time."""
    from qag import auth
    app = App(str(tmp_path))
    app.query("films")
    old = app.call("POST", "/api/v1/api-keys", {"name": "rot"})[2]["secret"]
    status, _, body = app.call("POST", "/api/v1/api-keys/rot/rotate", {"grace_minutes": 5})
    assert status == 200, body
    assert app.call("GET", "/q/films", query="n=1", key=old)[0] == 200   # the old secret, in its grace
    hits_before, misses_before = app.gateway.metadata.cache.counts()
    monkeypatch.setattr(auth, "now_text", lambda: "2999-01-01 00:00:00")  # the grace is over
    assert app.call("GET", "/q/films", query="n=1", key=old)[0] == 401
    monkeypatch.undo()
    assert app.call("GET", "/q/films", query="n=1", key=old)[0] == 200
    hits, misses = app.gateway.metadata.cache.counts()
    assert misses == misses_before and hits > hits_before  # the same cached row all along


def test_a_huge_ttl_is_the_longest_one_not_an_overflow(segment):
    # QAG_METADATA_CACHE_TTL=1e308 was OverflowError in every worker (int(ttl * 1e9)): the master stopped with
    # "Worker failed to boot". The setting is bounded now; the cache takes whatever it is given all the same.
    for ttl in (1e308, float("inf"), 1e10):
        cache = Cache(segment, ttl, worker=7)
        assert cache.ttl_ns == (shm.TTL_NS_MAX if ttl * 1e9 >= shm.TTL_NS_MAX else int(ttl * 1e9))
        cache.put("k1", {"v": 1}, cache.generation())
        assert Cache(segment, ttl, worker=8).get("k1") == {"v": 1}
