"""The host's shared-memory response-cache segment on both shmsync twins: eviction order, byte and entry bounds,
TTL, torn and reused entries never returned, a writer SIGKILLed holding the lock, forked writers and readers."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import time

import pytest

from qag import _speedups
from qag.cache import hostentries
from qag.cache.hostentries import BLOCK, RECORD, Segment
from qag.cache.response import Entry, SharedEntries, etag_of
from tests.speedups.conftest import compiled_or_skip


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


class Clock:
    def __init__(self):
        self.now = 10**12

    def __call__(self) -> int:
        return self.now


def entry(body: bytes, workspace: str = "default") -> Entry:
    return Entry(body, "application/json", etag_of(body), (("X-Page", "1"),), {"name": "q", "workspace": workspace})


def make(twin, max_bytes=1 << 20, max_entries=10_000, clock=None):
    segment = Segment.create(max_bytes, max_entries, twin=twin, clock=clock or Clock())
    return segment, SharedEntries(segment)


def consistent(segment: Segment) -> None:
    """The counters agree with the records, and every block is either an entry's or free (none leaked)."""
    live = {k for k, *_ in segment.live()}
    counts = segment.counts()
    assert counts["entries"] == len(live)
    sync = segment.sync
    free, b = 0, sync.load(hostentries.FREE)
    while b:
        free += 1
        b = sync.load(segment._next + 8 * (b - 1))
    assert free + counts["blocks"] == sync.load(hostentries.FRESH)
    assert sync.load(hostentries.DIRTY) == 0 and sync.load(hostentries.LOCK) == 0


# --- bounds, order, TTL ------------------------------------------------------------------------------------------
def test_least_recently_used_goes_first_at_the_entry_bound(twin):
    segment, entries = make(twin, max_entries=3)
    for k in "abc":
        entries.put(k, entry(k.encode()), 60)
    assert entries.get("a") is not None          # a becomes the most recently used
    entries.put("d", entry(b"d"), 60)
    assert entries.get("b") is None              # b was the least recently used
    assert all(entries.get(k).body == k.encode() for k in "acd") and len(entries) == 3   # used: a, c, d
    assert entries.peek("a") is not None          # an administrator looking is not a use...
    entries.put("e", entry(b"e"), 60)
    assert entries.peek("a") is None              # ...so a, the least recently used, went next
    assert all(entries.peek(k) is not None for k in "cde")
    assert segment.counts()["evictions"] == 2
    consistent(segment)


def test_the_byte_bound_counts_whole_blocks(twin):
    segment, entries = make(twin, max_bytes=4 * BLOCK)
    two_blocks = b"x" * (BLOCK + 100)               # head + body spill into a second block
    entries.put("a", entry(two_blocks), 60)
    entries.put("b", entry(two_blocks), 60)
    assert entries.bytes == 4 * BLOCK and len(entries) == 2
    entries.put("c", entry(two_blocks), 60)          # needs 2 blocks: a (least recently used) makes way
    assert entries.get("a") is None and entries.get("b") is not None and entries.get("c") is not None
    entries.put("c", entry(b"y"), 60)                # replacing gives the old blocks back
    assert entries.bytes == 3 * BLOCK and entries.get("c").body == b"y"
    entries.put("d", entry(b"z"), 60)                # fits in the free block: nothing evicted
    assert {k for k, *_ in entries.live()} == {"b", "c", "d"}
    entries.remove("b")
    entries.remove("nope")
    assert entries.bytes == 2 * BLOCK and len(entries) == 2
    consistent(segment)


def test_an_entry_larger_than_the_area_is_not_stored_and_evicts_nothing(twin):
    segment, entries = make(twin, max_bytes=3 * BLOCK)
    entries.put("small", entry(b"s"), 60)
    entries.put("huge", entry(b"h" * 3 * BLOCK), 60)
    assert entries.get("huge") is None and entries.get("small") is not None
    assert segment.counts()["too_big"] == 1
    empty, none = make(twin, max_bytes=BLOCK - 1)     # an area smaller than one block caches nothing, never fails
    none.put("k", entry(b"1"), 60)
    assert none.get("k") is None and empty.counts()["too_big"] == 1


def test_a_large_entry_spans_many_blocks_and_reads_back_exactly(twin):
    segment, entries = make(twin, max_bytes=600 * BLOCK)
    rng = random.Random(7)
    bodies = {f"k{i}": rng.randbytes(rng.randrange(1, 40 * BLOCK)) for i in range(40)}
    for key, body in bodies.items():   # churn: freed chains are reused out of order, entries are not contiguous
        entries.put(key, entry(body), 60)
        if rng.random() < 0.4:
            entries.remove(rng.choice(list(bodies)))
    for key, body in bodies.items():
        got = entries.get(key)
        assert got is None or got.body == body
    assert sum(entries.get(k) is not None for k in bodies) >= 10
    consistent(segment)


def test_ttl_on_the_monotonic_clock(twin):
    clock = Clock()
    segment, entries = make(twin, clock=clock)
    entries.put("a", entry(b"1"), 10)
    clock.now += 9_990_000_000
    assert entries.get("a") is not None
    assert [(k, round(left, 2)) for k, _, _, _, left in entries.live()] == [("a", 0.01)]
    clock.now += 10_000_000                        # dead at store time + TTL
    assert entries.get("a") is None and entries.peek("a") is None and entries.live() == []


def test_expired_entries_make_room_before_live_ones(twin):
    clock = Clock()
    segment, entries = make(twin, max_entries=3, clock=clock)
    entries.put("old", entry(b"1"), 60)
    entries.put("short", entry(b"2"), 1)
    entries.put("new", entry(b"3"), 60)
    clock.now += 2_000_000_000
    entries.put("more", entry(b"4"), 60)           # "short" is dead: it goes, not "old" (least recently used)
    assert entries.get("old") is not None and entries.get("more") is not None
    assert segment.counts()["evictions"] == 0


def test_clear_is_per_workspace(twin):
    segment, entries = make(twin)
    entries.put("a", entry(b"1", "default"), 60)
    entries.put("b", entry(b"2", "other"), 60)
    entries.clear("default")
    assert entries.get("a") is None and entries.get("b") is not None
    consistent(segment)


def test_a_hash_collision_never_returns_another_keys_entry(twin, monkeypatch):
    monkeypatch.setattr(hostentries, "key_hash", lambda key: 12345)
    segment, entries = make(twin)
    entries.put("one", entry(b"1"), 60)
    entries.put("two", entry(b"2"), 60)
    assert entries.get("one").body == b"1" and entries.get("two").body == b"2"
    assert entries.get("three") is None
    entries.remove("one")
    assert entries.get("one") is None and entries.get("two").body == b"2"


# --- never torn ----------------------------------------------------------------------------------------------------
def _slot_of(segment: Segment, key: str) -> int:
    h = hostentries.key_hash(key)
    start = segment._window(h)
    return next(i for i in range(start, start + hostentries.WINDOW)
                if segment.sync.load(segment._hash + 8 * i) == h)


def test_torn_reused_or_corrupt_entries_are_never_returned(twin):
    segment, entries = make(twin)
    entries.put("k", entry(b"v" * 3000), 60)
    i = _slot_of(segment, "k")
    record = segment._records + RECORD * i
    sync = segment.sync
    seq = sync.load(record)
    sync.store(record, seq + 1)                   # a writer in the slot (odd sequence): not read
    assert segment.find("k") is None
    sync.store(record, seq)
    assert entries.get("k").body == b"v" * 3000
    first = sync.load(record + 24) - 1            # one byte of the body changed under the record: the CRC
    segment._view[segment._data + first * BLOCK + 2000] ^= 1
    segment._local.clear()
    assert segment.find("k") is None
    segment._view[segment._data + first * BLOCK + 2000] ^= 1
    assert segment.find("k").body == b"v" * 3000
    # The worker's decoded copy is dropped as soon as the slot changes (another worker replaced the entry).
    other = Segment(segment._mm, os.dup(segment.fd), twin, segment.clock)
    SharedEntries(other).put("k", entry(b"w"), 60)
    assert entries.get("k").body == b"w"
    SharedEntries(other).remove("k")
    assert entries.get("k") is None


def _changer(segment: Segment, seconds: float, seed: int, results) -> None:
    """Keep replacing and evicting a few keys with bodies that say what they are (every byte = the digest's)."""
    entries, rng = SharedEntries(segment), random.Random(seed)
    end, writes = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        key = f"k{rng.randrange(6)}"
        fill = rng.randrange(256)
        entries.put(key, Entry(bytes([fill]) * rng.randrange(1, 5 * BLOCK), "text/plain", key, (), {"fill": fill}), 60)
        if rng.random() < 0.2:
            entries.remove(f"k{rng.randrange(6)}")
        writes += 1
    results.put(("writer", writes, 0))


def _reader(segment: Segment, seconds: float, results) -> None:
    entries = SharedEntries(segment)
    end, seen, bad = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        key = f"k{random.randrange(6)}"
        got = entries.get(key)
        if got is not None:
            seen += 1
            if got.etag != key or set(got.body) != {got.meta["fill"]}:
                bad += 1
    results.put(("reader", seen, bad))


def test_forked_writers_and_readers_never_see_a_torn_entry(twin):
    """2 processes replacing and evicting 6 keys (entries of 1-5 blocks in a 12-block area: constant eviction),
    2 reading them, for 2 s: every entry read is whole and is the key's."""
    segment = Segment.create(12 * BLOCK, 5, twin=twin)
    try:
        ctx = multiprocessing.get_context("fork")
        results = ctx.Queue()
        procs = [ctx.Process(target=_changer, args=(segment, 2.0, n, results)) for n in range(2)]
        procs += [ctx.Process(target=_reader, args=(segment, 2.0, results)) for _ in range(2)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert all(bad == 0 for _, _, bad in got), got
        assert all(n > 50 for _, n, _ in got), got
        consistent(segment)
        assert segment.counts()["entries"] <= 5 and segment.counts()["blocks"] <= 12
    finally:
        segment.close()


# --- a writer killed in the middle ------------------------------------------------------------------------------
class _DiesAt:
    """The segment's Sync, but the process is SIGKILLed (no cleanup, the lock held) before its n-th change."""

    def __init__(self, sync, n: int):
        self._sync, self._left = sync, n

    def __getattr__(self, name):
        return getattr(self._sync, name)

    def _step(self):
        self._left -= 1
        if self._left == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def store(self, off, value):
        self._step()
        return self._sync.store(off, value)

    def write(self, seq_off, data_off, data):
        self._step()
        return self._sync.write(seq_off, data_off, data)


def _die_mid_store(segment: Segment, n: int) -> None:
    segment.sync = _DiesAt(segment.sync, n)
    SharedEntries(segment).put("doomed", entry(b"d" * 5000), 60)   # replaces "doomed", evicts, allocates


# Every point of a store that replaces an entry, evicts the least recently used and allocates 5 blocks (40
# changes: the last is clearing the dirty mark).
@pytest.mark.parametrize("n", range(1, 41))
def test_a_writer_killed_holding_the_lock_wedges_nothing_and_leaks_nothing(twin, n):
    segment = Segment.create(24 * BLOCK, 100, twin=twin)
    try:
        entries = SharedEntries(segment)
        entries.put("doomed", entry(b"old"), 60)
        for i in range(7):
            entries.put(f"k{i}", entry(bytes([i]) * 3000), 60)      # 21 + 1 of 24 blocks: the store must evict
        ctx = multiprocessing.get_context("fork")
        proc = ctx.Process(target=_die_mid_store, args=(segment, n))
        proc.start()
        proc.join(30)
        assert proc.exitcode == -signal.SIGKILL
        died_mid_change = segment.sync.load(hostentries.DIRTY) == proc.pid
        assert died_mid_change == (n > 1)            # the first change is marking the segment dirty
        helper = ctx.Process(target=lambda: SharedEntries(segment).put("after", entry(b"a" * 2000), 60))
        helper.start()
        helper.join(30)
        assert helper.exitcode == 0, "the lock stayed wedged"
        assert segment.counts()["repairs"] == int(died_mid_change)
        consistent(segment)
        for key in [f"k{i}" for i in range(7)] + ["doomed"]:     # whatever is there is whole
            got = entries.get(key)
            assert got is None or got.body in (bytes([int(key[1:])]) * 3000 if key != "doomed"
                                               else b"old", b"d" * 5000)
        assert entries.get("after").body == b"a" * 2000
        entries.put("more", entry(b"m" * 9000), 60)     # the free list is whole: the area is usable in full
        assert entries.get("more").body == b"m" * 9000
        consistent(segment)
    finally:
        segment.close()


def test_the_entries_gauge_is_reported_by_one_live_worker(twin):
    segment, entries = make(twin)
    entries.put("a", entry(b"1"), 60)
    assert segment.reported_entries() == 1            # this process reports...
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=lambda: out.put(segment.reported_entries()))
    child.start()
    child.join(30)
    assert out.get(timeout=10) == 0                   # ...so another worker reports 0 (the gauges are summed)
    segment.sync.store(hostentries.REPORTER, child.pid)   # a reporter that ended: the next asker takes over
    assert segment.reported_entries() == 1


def test_the_masters_segment_is_the_one_workers_use(tmp_path):
    hostentries.start_instance(1 << 20)
    try:
        assert SharedEntries.for_host(1 << 20).segment is hostentries.shared()
    finally:
        hostentries.stop_instance()
    assert hostentries.shared() is None
    private = SharedEntries.for_host(1 << 20)
    assert private.segment is not None and private.segment is not SharedEntries.for_host(1 << 20).segment


def test_keys_hash_apart():
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    assert len({hostentries.key_hash(k) for k in keys}) == 2000 and all(hostentries.key_hash(k) & 1 for k in keys)
