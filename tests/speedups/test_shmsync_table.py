"""The host table's operations (qag._speedups shmsync twins' `Table`, used by qag/policy/hostlimits.py): the pure and
the compiled twin give the same answers and leave the same bytes for any sequence of operations, with the same
clocks; and each twin on its own keeps the rules (buckets, slots held by processes, quota reservations)."""

from __future__ import annotations

import math
import mmap
import os
import struct
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag.policy import hostlimits

ENTRIES = 64
MODULUS = ENTRIES - 8 + 1          # places a window may start at: h1 % MODULUS
SIZE = hostlimits.HEADER + ENTRIES * (8 + hostlimits.ENTRY)


class Clock:
    def __init__(self, at: float):
        self.now = at

    def __call__(self) -> float:
        return self.now


def _mapping():
    fd = os.memfd_create("qag-test-table")
    os.ftruncate(fd, SIZE)
    return mmap.mmap(fd, SIZE), fd


def _dead_pid() -> int:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


DEAD = _dead_pid()
PIDS = [os.getpid(), DEAD, 1]


class Side:
    """One twin's table on a mapping of its own, with its own clocks (moved together with the other side's)."""

    def __init__(self, module):
        self.mm, self.fd = _mapping()
        self.clock, self.wall = Clock(1000.0), Clock(1_800_000_000.0)
        self.sync = module.Sync(self.mm, self.fd)
        self.table = module.Table(self.sync, ENTRIES, self.clock, self.wall)

    def close(self) -> None:
        self.sync.release()
        self.mm.close()
        os.close(self.fd)


@pytest.fixture
def sides(twin_pair):
    pure, compiled = twin_pair("shmsync")
    made = [Side(pure), Side(compiled)]
    yield made
    for side in made:
        side.close()


def test_layout_constants_agree(twin_pair):
    for module in twin_pair("shmsync"):
        assert (module.TABLE_HEADER, module.TABLE_LOCK, module.TABLE_FULL, module.TABLE_EVICTIONS) == (
            hostlimits.HEADER, hostlimits.LOCK, hostlimits.FULL, hostlimits.EVICTIONS)
        assert (module.TABLE_ENTRY, module.TABLE_PROBE, module.SLOT_PIDS, module.QUOTA_PIDS) == (
            hostlimits.ENTRY, hostlimits.PROBE, hostlimits.SLOT_PIDS, hostlimits.QUOTA_PIDS)
        assert (module.BUCKET, module.SLOTS, module.QUOTA, module.ADDRESS, module.FLUSH_GRACE) == (
            hostlimits.BUCKET, hostlimits.SLOTS, hostlimits.QUOTA, hostlimits.ADDRESS, hostlimits.FLUSH_GRACE)


def _ident(kind: int, n: int) -> tuple[int, int]:
    """Identities of one kind (1 key buckets, 2 slots, 3 quota counters, 4 address buckets); many share a window
    (h1 % MODULUS), so windows fill and entries get evicted."""
    return (MODULUS * (3 * n + kind) + 5 if n % 2 else 7919 * (n + 1) * (kind + 2) + 1), 0x9E3779B97F4A7C15 ^ (n << 8) ^ kind


_n = st.integers(0, 5)
_pid = st.sampled_from(PIDS)
OPS = st.one_of(
    st.tuples(st.just("take"), _n, st.integers(1, 5), st.sampled_from([0.5, 1.0, 60.0, 3600.0]), st.booleans()),
    st.tuples(st.just("acquire"), _n, st.integers(0, 3), _pid),
    st.tuples(st.just("release"), _n, _pid, st.booleans()),
    st.tuples(st.just("held"), _n),
    st.tuples(st.just("quota"), _n, st.integers(0, 4), st.integers(0, 30), st.booleans(),
              st.sampled_from([0.0, 1.0, 60.0]), _pid),
    st.tuples(st.just("admit"), _n, st.integers(1, 4), st.sampled_from([1.0, 60.0]), _n, st.integers(0, 4),
              st.integers(0, 30), st.booleans(), st.sampled_from([0.0, 1.0]), _pid),
    st.tuples(st.just("seed"), _n, st.integers(0, 5), st.integers(0, 20), st.sampled_from([-100.0, 50.0, 1e6])),
    st.tuples(st.just("reread"), _n, st.integers(0, 5), st.integers(0, 20), st.integers(0, 9), st.integers(0, 40)),
    st.tuples(st.just("add"), _n, st.integers(-1, 1), st.integers(0, 7), st.booleans(), _pid),
    st.tuples(st.just("peek"), _n),
    st.tuples(st.just("writing"), st.lists(_n, max_size=3),
              st.one_of(st.none(), st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 9))),
                                            min_size=3, max_size=3))),
    st.tuples(st.just("sweep"), _pid, st.sampled_from([1, 7, 512])),
    st.tuples(st.just("tick"), st.sampled_from([0.0, 0.01, 0.3, 1.7, 31.0, 400.0]),
              st.sampled_from([0.0, 1.0, 200.0])),
)


def _apply(side: Side, op: tuple, slots: dict):
    t = side.table
    name = op[0]
    if name == "take":   # op[4]: a client address's bucket
        return t.take(*_ident(4 if op[4] else 1, op[1]), op[2], op[3], op[4])
    if name == "acquire":
        at = t.acquire(*_ident(2, op[1]), op[2], op[3])
        if at is not None and at is not False:
            slots.setdefault((op[1], op[3]), []).append(at)
        return at
    if name == "release":
        held = slots.get((op[1], op[2]))
        at = held.pop() if held and op[3] else -1
        return t.release(*_ident(2, op[1]), op[2], at)
    if name == "held":
        return t.held(*_ident(2, op[1]))
    if name == "quota":
        return t.quota(*_ident(3, op[1]), *op[2:])
    if name == "admit":
        return t.admit(*_ident(1, op[1]), op[2], op[3], *_ident(3, op[4]), *op[5:])
    if name == "seed":
        return t.quota_seed(*_ident(3, op[1]), op[2], op[3], side.wall.now + op[4])
    if name == "reread":
        return t.quota_reread(*_ident(3, op[1]), *op[2:])
    if name == "add":
        return t.quota_add(*_ident(3, op[1]), *op[2:])
    if name == "peek":
        return t.quota_peek(*_ident(3, op[1]))
    if name == "writing":
        idents = [_ident(3, n) for n in op[1]]
        return t.quota_writing(idents, None if op[2] is None else op[2][:len(idents)])
    if name == "sweep":
        return t.sweep(op[1], op[2])
    side.clock.now += op[1]
    side.wall.now += op[2]
    return None


def test_twins_agree_on_any_sequence(twin_pair):
    pure, compiled = twin_pair("shmsync")

    @settings(max_examples=150, deadline=None)
    @given(st.lists(OPS, min_size=20, max_size=150))
    def check(ops):
        sides = [Side(pure), Side(compiled)]
        try:
            slots = [{}, {}]
            for op in ops:
                results = [_apply(side, op, held) for side, held in zip(sides, slots)]
                assert results[0] == results[1], op
                assert type(results[0]) is type(results[1]), op
                assert sides[0].mm[:] == sides[1].mm[:], op
            assert sides[0].table.used() == sides[1].table.used()
        finally:
            for side in sides:
                side.close()
    check()


def _random_op(rnd) -> tuple:
    """One operation as OPS draws them, from a seeded generator: long runs reach the states short ones don't
    (several reservations of a dead process at a quota's limit, writes in flight, spent buckets refilling)."""
    n, pid = rnd.randrange(6), rnd.choice(PIDS)
    name = rnd.choice(["take", "acquire", "acquire", "release", "release", "held", "quota", "quota", "admit",
                       "admit", "seed", "reread", "add", "add", "peek", "writing", "sweep", "tick", "tick"])
    if name == "take":
        return name, n, rnd.randint(1, 5), rnd.choice([0.5, 1.0, 60.0, 3600.0]), rnd.random() < 0.4
    if name == "acquire":
        return name, n, rnd.randint(0, 3), pid
    if name == "release":
        return name, n, pid, rnd.random() < 0.7
    if name in ("held", "peek"):
        return name, n
    if name == "quota":
        return name, n, rnd.randint(0, 4), rnd.randint(0, 30), rnd.random() < 0.7, rnd.choice([0.0, 1.0, 60.0]), pid
    if name == "admit":
        return (name, n, rnd.randint(1, 4), rnd.choice([1.0, 60.0]), rnd.randrange(6), rnd.randint(0, 4),
                rnd.randint(0, 30), rnd.random() < 0.7, rnd.choice([0.0, 1.0]), pid)
    if name == "seed":
        return name, n, rnd.randint(0, 5), rnd.randint(0, 20), rnd.choice([-100.0, -60.5, 50.0, 1e6])
    if name == "reread":
        return name, n, rnd.randint(0, 5), rnd.randint(0, 20), rnd.randint(0, 9), rnd.randint(0, 40)
    if name == "add":
        return name, n, rnd.randint(-1, 1), rnd.randint(0, 7), rnd.random() < 0.8, pid
    if name == "writing":
        written = None if rnd.random() < 0.5 else [
            None if rnd.random() < 0.3 else (rnd.randint(0, 3), rnd.randint(0, 9)) for _ in range(3)]
        return name, [rnd.randrange(6) for _ in range(rnd.randint(0, 3))], written
    if name == "sweep":
        return name, pid, rnd.choice([1, 7, 512])
    return name, rnd.choice([0.0, 0.01, 0.3, 1.7, 31.0, 400.0]), rnd.choice([0.0, 1.0, 30.0, 200.0])


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_twins_agree_on_long_runs(twin_pair, seed):
    import random
    pure, compiled = twin_pair("shmsync")
    rnd = random.Random(seed)
    sides = [Side(pure), Side(compiled)]
    seen = set()
    try:
        slots = [{}, {}]
        for _ in range(4000):
            op = _random_op(rnd)
            results = [_apply(side, op, held) for side, held in zip(sides, slots)]
            assert results[0] == results[1] and type(results[0]) is type(results[1]), op
            assert sides[0].mm[:] == sides[1].mm[:], op
            seen.add((op[0], repr(results[0])[:12]))
    finally:
        for side in sides:
            side.close()
    assert len(seen) > 40     # the run went through many different answers


def test_twins_agree_when_every_window_fills(sides):
    """Hundreds of identities on a 64-place table: no room, evictions of what may go, the same on both."""
    for i in range(400):
        for side in sides:
            side.clock.now += 0.37
            side.wall.now += 0.37
        ident = (i * 2654435761 % 2**63) | 1, i
        results = [side.table.take(*ident, 3, 60.0) for side in sides]
        assert results[0] == results[1]
        results = [side.table.acquire(ident[0] ^ 2, i, 1, os.getpid()) for side in sides]
        assert results[0] == results[1]
        results = [side.table.quota_seed(ident[0] ^ 4, i, 1, 2, side.wall.now + (5.0 if i % 3 else -100.0))
                   for side in sides]
        assert results[0] == results[1]
        assert sides[0].mm[:] == sides[1].mm[:]
    assert struct.unpack_from("<QQ", sides[0].mm, hostlimits.FULL) == struct.unpack_from("<QQ", sides[1].mm,
                                                                                         hostlimits.FULL)
    assert struct.unpack_from("<Q", sides[0].mm, hostlimits.FULL)[0] > 0      # some found no room
    assert struct.unpack_from("<Q", sides[0].mm, hostlimits.EVICTIONS)[0] > 0  # and some places were reused


def test_twins_agree_when_addresses_flood_every_window(sides):
    """Spent address buckets in every place, then keys' buckets, slots and quota counters taking the least recently
    used ones' places, and more addresses finding none: the same answers and bytes on both."""
    pid = os.getpid()
    for i in range(300):
        for side in sides:
            side.clock.now += 0.01
        ident = (i * 2654435761 % 2**63) | 1, i
        results = [side.table.take(*ident, 4, 60.0, True) for side in sides]
        assert results[0] == results[1]
        if i % 7 == 0:   # an older address comes back: no longer the least recently used
            results = [side.table.take((i // 2 * 2654435761 % 2**63) | 1, i // 2, 4, 60.0, True) for side in sides]
            assert results[0] == results[1]
    assert sides[0].mm[:] == sides[1].mm[:] and sides[0].table.used() == ENTRIES
    for i in range(40):
        key = (i * 40503 % 2**63) | 1, 1000 + i
        for side in sides:
            side.clock.now += 0.01
        ops = [lambda t: t.take(*key, 3, 3600.0),
               lambda t: t.acquire(key[0] ^ 2, key[1], 1, pid),
               lambda t: t.quota_seed(key[0] ^ 4, key[1], 0, 0, 2e9),
               lambda t: t.admit(key[0] ^ 8, key[1], 3, 3600.0, key[0] ^ 4, key[1], 5, 0, True, 60.0, pid),
               lambda t: t.take(key[0] ^ 16, key[1], 3, 3600.0, True)]
        for op in ops:
            results = [op(side.table) for side in sides]
            assert results[0] == results[1] and type(results[0]) is type(results[1])
            assert sides[0].mm[:] == sides[1].mm[:]
    assert struct.unpack_from("<QQ", sides[0].mm, hostlimits.FULL) == struct.unpack_from("<QQ", sides[1].mm,
                                                                                         hostlimits.FULL)


def test_a_keys_entry_evicts_the_least_recently_used_address_bucket(speedups):
    """A window of spent address buckets: a key's bucket, slots and quota counter each take the place of the one
    used longest ago (its address starts over); an address bucket takes none, nor a key's entry's."""
    side = Side(speedups.shmsync)
    try:
        t, clock, pid = side.table, side.clock, os.getpid()
        window = [(MODULUS * k + 5, 0xA000 + k) for k in range(1, 9)]     # all start at place 5
        for ident in window:
            clock.now += 1.0
            assert t.take(*ident, 2, 60.0, True) == (1, 0)
        clock.now += 1.0
        assert t.take(*window[0], 2, 60.0, True) == (0, 0)                 # the oldest is used again
        stranger = (MODULUS * 20 + 5, 0xB000)
        assert t.take(*stranger, 2, 60.0, True) is None                     # an address evicts no spent address
        assert struct.unpack_from("<QQ", side.mm, hostlimits.FULL) == (1, 0)
        key, slots, counter = (MODULUS * 21 + 5, 0xC001), (MODULUS * 22 + 5, 0xC002), (MODULUS * 23 + 5, 0xC003)
        data = hostlimits.HEADER + ENTRIES * 8
        assert t.take(*key, 3, 3600.0) == (2, 0)                            # in window[1]'s place (6)
        assert t.acquire(*slots, 1, pid) == data + 7 * hostlimits.ENTRY     # in window[2]'s
        assert t.quota_seed(*counter, 0, 0, side.wall.now + 3600)           # in window[3]'s
        assert t.quota(*counter, 5, 0, True, 3600.0, pid)[:3] == (1, 1, 0)   # a reserved call: it may not go
        assert struct.unpack_from("<Q", side.mm, hostlimits.HEADER + 8 * 8)[0] == counter[0]
        assert struct.unpack_from("<QQ", side.mm, hostlimits.FULL) == (1, 3)   # no room once, 3 evictions
        # The three least recently used addresses are gone (now without a place: each worker counts them); the
        # others keep their spent buckets.
        again = [t.take(*ident, 2, 60.0, True) for ident in window]
        assert [r is None for r in again] == [False, True, True, True, False, False, False, False]
        assert again[0][1] > 0 and all(r == (0, 0) for r in again[4:])
        # No address takes a key's place: a spent key bucket, a held slot, an unwritten count stay.
        for k in range(30, 60):
            assert t.take(MODULUS * k + 5, 0xD000 + k, 2, 60.0, True) is None
        assert t.take(*key, 3, 3600.0) == (1, 0) and t.held(*slots) == 1 and t.quota_peek(*counter) == (1, 0)
    finally:
        side.close()


@pytest.mark.parametrize("kind", ["pure", "compiled"])
def test_admit_is_take_then_quota(twin_pair, kind):
    """admit() answers what take() then quota() would, reserving only a call the bucket let through."""
    module = twin_pair("shmsync")[kind == "compiled"]
    a, b = Side(module), Side(module)
    try:
        bucket, counter = _ident(1, 0), _ident(3, 0)
        for side in (a, b):
            assert side.table.quota_seed(*counter, 0, 0, side.wall.now + 3600)
        pid = os.getpid()
        for i in range(8):
            got = a.table.admit(*bucket, 3, 60.0, *counter, 5, 0, True, 60.0, pid)
            left, retry = b.table.take(*bucket, 3, 60.0)
            assert got == (left, retry, b.table.quota(*counter, 5, 0, not retry, 60.0, pid))
            assert a.mm[:] == b.mm[:]
        assert got[:2] == (0, 20) and got[2][:3] == (1, 3, 0)   # 3 tokens: 3 calls reserved, the rest refused
        assert a.table.quota_peek(*counter) == (3, 0)
    finally:
        a.close()
        b.close()


def test_bucket_arithmetic_matches_the_contract(speedups):
    """retry_after = max(1, ceil((1 - tokens) * period / count)), tokens refilled continuously, capped at count."""
    side = Side(speedups.shmsync)
    try:
        t, ident = side.table, _ident(1, 1)
        assert [t.take(*ident, 2, 10.0) for _ in range(3)] == [(1, 0), (0, 0), (0, 5)]
        side.clock.now += 2.5                        # half a token back
        assert t.take(*ident, 2, 10.0) == (0, math.ceil(0.5 * 10.0 / 2))
        side.clock.now += 1000.0                     # full again, never more than count
        assert t.take(*ident, 2, 10.0) == (1, 0)
    finally:
        side.close()


def test_release_at_a_stale_place_looks_the_entry_up(speedups):
    side = Side(speedups.shmsync)
    try:
        t, pid = side.table, os.getpid()
        ident = _ident(2, 3)
        at = t.acquire(*ident, 2, pid)
        assert isinstance(at, int) and t.held(*ident) == 1
        t.release(*ident, pid, at + 1)               # not a place's start: looked up instead
        assert t.held(*ident) == 0
        assert t.acquire(*ident, 2, pid) == at
        t.release(*ident, pid, 10 ** 9)              # outside the table: looked up
        t.release(*ident, pid, -1)                   # nothing held any more: nothing changes
        assert t.held(*ident) == 0
    finally:
        side.close()


def test_a_dead_holder_is_given_back_at_the_limit(speedups):
    side = Side(speedups.shmsync)
    try:
        t, me = side.table, os.getpid()
        ident, counter = _ident(2, 5), _ident(3, 5)
        assert t.acquire(*ident, 2, DEAD) and t.acquire(*ident, 2, me)
        assert t.held(*ident) == 2
        assert t.acquire(*ident, 2, me) is not False   # at the limit: the dead holder's slot comes back
        assert t.held(*ident) == 2
        assert t.acquire(*ident, 2, me) is False
        assert t.quota_seed(*counter, 0, 0, side.wall.now + 60)
        assert t.quota(*counter, 1, 0, True, 60.0, DEAD)[:3] == (1, 1, 0)
        assert t.quota(*counter, 1, 0, True, 60.0, me)[:3] == (1, 1, 0)   # the dead reservation given back
        assert t.sweep(me) == 3 and t.held(*ident) == 0 and t.quota_peek(*counter) == (0, 0)
    finally:
        side.close()


def test_a_worker_killed_inside_the_table_lock_does_not_stop_the_others(speedups):
    """The table's lock word is shmsync's mutex: a holder that died (SIGKILL) is taken over, and its slot is given
    back to the next caller at the limit."""
    import signal
    import threading

    side = Side(speedups.shmsync)
    try:
        ident = _ident(2, 4)
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            side.table.acquire(*ident, 1, os.getpid())
            side.sync.lock(hostlimits.LOCK)     # killed while holding the table's lock
            os.write(ready_w, b"x")
            time.sleep(60)
            os._exit(0)
        os.read(ready_r, 1)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        got = []
        worker = threading.Thread(target=lambda: got.append(side.table.acquire(*ident, 1, os.getpid())))
        worker.start()
        worker.join(30)
        assert not worker.is_alive() and isinstance(got[0], int)   # the lock taken over, the dead slot given back
        assert side.table.held(*ident) == 1
    finally:
        side.close()
