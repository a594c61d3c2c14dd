"""qag/policy/hostlimits.py on both shmsync twins: token buckets as limits.Buckets counts them, slots and quota
reservations given back when their process dies, a full table (client addresses never keeping a key's entries
out), and several processes (fork) on one entry."""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from qag import _speedups
from qag.policy import hostlimits
from qag.policy.hostlimits import HostTable
from qag.policy.limits import Buckets
from qag.policy.quotas import Quotas, period
from qag.policy.redislimits import LimitStats, RateLimiter, SlotPool, _HostSlot
from qag.store.sqlite import SqliteStore
from tests.speedups.conftest import compiled_or_skip


class Clock:
    def __init__(self, at: float = 1000.0):
        self.now = at

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


def _child(work) -> int:
    """Fork a process that runs work() and exits 0 (1 on an exception); its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work()
            code = 0
        finally:
            os._exit(code)
    return pid


def _wait(pids) -> list[int]:
    return [os.waitpid(pid, 0)[1] for pid in pids]


def test_buckets_count_as_the_in_process_buckets(twin):
    """The same calls at the same times give the same results as limits.Buckets."""
    clock = Clock()
    table, mine = HostTable.create(256, twin=twin, clock=clock), Buckets(clock=clock)
    rnd = random.Random(7)
    limits = {"a": (3, 60.0), "b": (5, 1.0), "10.0.0.1": (2, 3600.0), "c": (7, 10.0)}
    seen = []
    for _ in range(2000):
        clock.now += rnd.choice((0.0, 0.01, 0.3, 1.7, 7.0))
        ident = rnd.choice(sorted(limits))
        got = table.take("key", ident, *limits[ident])
        assert got == mine.take(ident, *limits[ident])
        seen.append(got[1])
    assert 0 in seen and len(set(seen)) > 5      # allowed and refused, several Retry-After values
    # A changed limit (a PATCHed key) keeps what was used, within the new capacity, as Buckets does.
    for count, per in ((2, 60.0), (10, 60.0), (1, 60.0), (4, 1.0)):
        clock.now += 0.5
        assert table.take("key", "a", count, per) == mine.take("a", count, per)
    # kinds are separate: a client bucket of the same name is full
    assert table.take("client", "a", 3, 60.0) == (2, 0)


def test_slots_of_a_dead_process_come_back(twin):
    table = HostTable.create(64, twin=twin)
    assert table.acquire("k", 2) is True and table.held("k") == 1
    pid = _child(lambda: table.acquire("k", 2) or os._exit(3))   # takes the second slot and dies holding it
    assert _wait([pid]) == [0]
    assert table.held("k") == 2
    # At its limit, a call looks for holders that died: the child's slot is given back, this one is taken.
    assert table.acquire("k", 2) is True and table.held("k") == 2
    assert table.acquire("k", 2) is False
    table.release("k")
    table.release("k")
    assert table.held("k") == 0
    table.release("k")                      # one too many: nothing to give back, never negative
    assert table.held("k") == 0


def test_the_master_sweeps_a_dead_workers_holds(twin):
    table = HostTable.create(64, twin=twin)
    seed = table.quota_seed("q", 0, 0, time.time() + 3600)
    assert seed

    def hold():
        assert table.acquire("a", 5) and table.acquire("a", 5) and table.acquire("b", 1)
        assert table.quota("q", 10, 0, True, 60.0)[0] == 1
        os.kill(os.getpid(), signal.SIGKILL)
    pid = _child(hold)
    os.waitpid(pid, 0)
    assert (table.held("a"), table.held("b"), table.quota_peek("q")) == (2, 1, (1, 0))
    assert table.sweep(pid, chunk=7) == 4
    assert (table.held("a"), table.held("b"), table.quota_peek("q")) == (0, 0, (0, 0))


def test_quota_counter_seed_settle_give_back_and_reread(twin):
    table = HostTable.create(64, twin=twin)
    assert table.quota("u", 3, 0, True, 1.0) is None              # not counted here yet: seed first
    assert table.quota_seed("u", 1, 10, time.time() + 3600)
    assert table.quota_seed("u", 99, 99, time.time() + 3600)      # created meanwhile: the first seed stays
    assert table.quota("u", 3, 0, True, 1.0)[:3] == (1, 2, 10)
    assert table.quota_add("u", 0, 4, True) == (2, 14)               # a 200: the call stays, rows added
    assert table.quota("u", 3, 0, True, 1.0)[:3] == (1, 3, 14)
    assert table.quota_add("u", -1, 0, True) == (2, 14)              # anything else: the call is given back
    assert table.quota("u", 3, 20, False, 1.0)[:3] == (1, 2, 14)
    # The store (other instances) holds 5 calls more than this host wrote: a re-read adds them.
    table.quota_writing(["u"])
    table.quota_writing(["u"], {"u": (1, 4)})                         # this host's call and rows reached it
    time.sleep(1.01)
    found = table.quota("u", 10, 0, False, 1.0)
    assert found[3] == (2, 14)                                         # this caller re-reads; base = seed + written
    table.quota_reread("u", found[3], 2 + 5, 14)
    assert table.quota_peek("u") == (7, 14)


def test_a_reread_overlapping_a_write_is_not_applied(twin):
    table = HostTable.create(64, twin=twin)
    table.quota_seed("u", 0, 0, time.time() + 3600)
    table.quota("u", 0, 0, True, 60.0)
    table.quota_add("u", 0, 0, True)
    time.sleep(1.01)
    base = table.quota("u", 0, 0, False, 1.0)[3]
    table.quota_writing(["u"])                         # a worker writes meanwhile: the store already has it ...
    table.quota_reread("u", base, 1, 0)
    table.quota_writing(["u"], {"u": (1, 0)})          # ... and then tells the table
    assert table.quota_peek("u") == (1, 0)             # not counted twice


def test_a_full_table_evicts_only_what_loses_nothing(twin):
    clock = Clock()
    table = HostTable.create(64, twin=twin, clock=clock)
    placed = [i for i in range(200) if table.take("client", i, 5, 60.0) is not None]   # spent buckets
    assert table.stats()["full"] == 200 - len(placed) > 0   # some windows had nothing that may go
    assert table.stats()["used"] == len(placed) <= 64 and table.stats()["evictions"] == 0
    assert all(table.take("client", i, 5, 60.0) == (3, 0) for i in placed)   # none was forgotten
    clock.now += 60.0                                  # every bucket refilled: each may go now
    assert all(table.take("client", f"later{i}", 5, 60.0) == (4, 0) for i in range(16))
    assert table.stats()["evictions"] >= 16 - (64 - len(placed))


def test_limiters_fall_back_to_the_worker_when_the_table_is_full(twin):
    clock = Clock()
    table = HostTable.create(64, twin=twin, clock=clock)
    stats = LimitStats()
    limiter = RateLimiter("key", None, stats, Buckets(clock=clock), table=table)
    pool = SlotPool(None, stats, table=table)
    held = [pool.acquire(f"k{i}", 1, None) for i in range(100)]  # held slots: nothing may go
    assert all(s is not None for s in held)
    assert stats.table_full and stats.fallbacks == stats.table_full   # a few found no room: held by this worker
    assert pool.acquire("k99", 1, None) is None and pool.acquire("k0", 1, None) is None   # limited either way
    before = stats.table_full
    left = [limiter.take(f"busy{i}", 2, 60.0) for i in range(32)]
    assert all(r == (1, 0) for r in left)                         # limited all the same, here or per worker
    assert stats.table_full > before
    assert [limiter.take("busy0", 2, 60.0), limiter.take("busy0", 2, 60.0)] == [(0, 0), (0, 30)]
    for s in held:
        if s is not None:
            s.release()


@pytest.mark.parametrize("procs", [4])
def test_processes_hammering_one_bucket_get_exactly_its_count(twin, procs):
    table = HostTable.create(256, twin=twin)
    allowed = HostTable.create(64, twin=twin)      # a word per child to report through

    def work(i):
        def run():
            n = sum(1 for _ in range(400) if table.take("key", "hot", 500, 86400.0)[1] == 0)
            allowed.sync.store(8 * i, n)
        return run
    assert _wait([_child(work(i)) for i in range(procs)]) == [0] * procs
    total = sum(allowed.sync.load(8 * i) for i in range(procs))
    assert total == 500                            # 1600 tries on 500 tokens: exactly 500 pass
    assert table.take("key", "hot", 500, 86400.0)[1] > 0


def test_processes_hammering_slots_and_a_quota_stay_exact(twin):
    table = HostTable.create(256, twin=twin)
    table.quota_seed("hot", 0, 0, time.time() + 3600)
    report = HostTable.create(64, twin=twin)

    def work(i):
        def run():
            worst = got = 0
            for j in range(300):
                if table.acquire("slots", 3):
                    worst = max(worst, table.held("slots"))
                    table.release("slots")
                r = table.quota("hot", 100, 0, True, 3600.0)
                if r[0]:
                    ok = j % 3 != 0                # every third call fails and gives its call back
                    table.quota_add("hot", 0 if ok else -1, 2 if ok else 0, True)
                    got += ok
            report.sync.store(8 * i, worst)
            report.sync.store(8 * (i + 4), got)
        return run
    assert _wait([_child(work(i)) for i in range(4)]) == [0] * 4
    assert max(report.sync.load(8 * i) for i in range(4)) <= 3
    assert table.held("slots") == 0
    kept = sum(report.sync.load(8 * (i + 4)) for i in range(4))
    assert kept == 100 and table.quota_peek("hot") == (100, 200)


def test_workers_of_one_host_share_quota_counts_at_once(tmp_path):
    """Two Quotas on one table are two workers of one host: exact without any store write."""
    table = HostTable.create(256)
    store = SqliteStore(str(tmp_path))
    key = ("default", "k", "day", period("day", time.time())[0])
    store.add_quota_usage([(*key, 1, 3)], at=int(time.time()))    # yesterday's restart: the store has 1 call
    a = Quotas(store, interval=60, table=table)
    b = Quotas(SqliteStore(str(tmp_path)), interval=60, table=table)
    quota = {"calls": 4, "per": "day"}
    t = a.begin("k", quota, reserve=True)
    assert (t.calls, t.rows) == (2, 3)
    t.settle(True, 5)
    assert b.begin("k", quota, reserve=False).rows == 8
    b.begin("k", quota, reserve=True).settle(False)               # given back
    b.begin("k", quota, reserve=True).settle(True, 1)
    a.begin("k", quota, reserve=True).settle(True, 1)
    t = b.begin("k", quota, reserve=True)
    assert t.refused == "calls" and t.calls == 4
    assert a.flush() and b.flush()
    assert store.quota_counts([key])[key] == (4, 10)             # the store got every settled call
    time.sleep(1.05)                                              # a re-read finds nothing beyond this host's
    assert a.begin("k", quota, reserve=False).calls == 4
    assert {(u["caller"], u["calls"], u["rows"]) for u in b.usage()} == {("k", 4, 10)}


def test_without_a_master_each_gateway_has_a_private_table():
    assert hostlimits._instance is None
    a, b = hostlimits.shared(64), hostlimits.shared(64)
    assert a is not b
    a.take("key", "k", 1, 60.0)
    assert b.take("key", "k", 1, 60.0) == (0, 0)
    table = hostlimits.start_instance(64)
    try:
        assert hostlimits.shared() is table
    finally:
        hostlimits.stop_instance()
    assert hostlimits._instance is None


def test_client_addresses_never_keep_a_keys_entries_out(twin, tmp_path):
    """A flood of client addresses (one call each, none refilled: what an attacker with many addresses makes) fills
    every window of a small table. Two workers still count a key's rate limit, slots and quota for the host
    (a key's entry takes the place of the least recently used address bucket), never per worker; and an address
    bucket still finds no place rather than evict a key's entry."""
    clock = Clock()
    table = HostTable.create(hostlimits.MIN_ENTRIES, twin=twin, clock=clock)
    stats = [LimitStats(), LimitStats()]
    addresses = RateLimiter("client", None, stats[0], Buckets(clock=clock), table=table)
    for i in range(1000):
        clock.now += 0.001
        assert addresses.take(f"2001:db8::{i:x}", 5, 60.0) == (4, 0)    # each counted: host or worker
    assert table.stats()["used"] == hostlimits.MIN_ENTRIES                # every place a spent address bucket
    flooded = table.stats()["full"]
    assert flooded > 0 and stats[0].table_full == flooded                  # later addresses found no room
    stats[0] = LimitStats()

    # Two workers of the host: their own in-process limiters, the one table.
    keys = [RateLimiter("key", None, s, Buckets(clock=clock), table=table) for s in stats]
    pools = [SlotPool(None, s, table=table) for s in stats]
    store = SqliteStore(str(tmp_path))
    quotas = [Quotas(store, None, s, interval=60, table=table) for s in stats]
    try:
        # The key's rate limit, 3 an hour: 3 calls in all, not 3 per worker.
        assert [keys[i % 2].take("k", 3, 3600.0)[1] == 0 for i in range(8)] == [True] * 3 + [False] * 5
        # max_concurrent 1: one slot for the host, held in the table.
        held = pools[0].acquire("k", 1, None)
        assert isinstance(held, _HostSlot) and pools[1].acquire("k", 1, None) is None and table.held("k") == 1
        # A call quota of 3 a day: 3 calls in all, each counted in the table.
        quota = {"calls": 3, "per": "day"}
        tickets = [quotas[i % 2].begin("k", quota, reserve=True) for i in range(6)]
        assert all(t.host for t in tickets)
        assert [t.refused for t in tickets] == [None] * 3 + ["calls"] * 3
        for t in tickets:
            t.settle(t.refused is None, 0)
        # Both at once (Quotas.admit, one section of the table) for another key: 3 in all.
        quota2 = {"calls": 3, "per": "day"}
        admitted = [quotas[i % 2].admit("k2", quota2, True, keys[i % 2], 10, 3600.0) for i in range(6)]
        assert all(t.host for t, _taken in admitted)
        assert [t.refused for t, _taken in admitted] == [None] * 3 + ["calls"] * 3
        assert [taken for _t, taken in admitted] == [(9 - i, 0) for i in range(6)]
        for t, _taken in admitted:
            t.settle(t.refused is None, 0)
        assert stats[0].table_full == stats[1].table_full == 0                # never a fallback
        assert table.stats()["full"] == flooded and table.stats()["evictions"] >= 5   # address buckets made room

        # More addresses: none takes a key's place (its counts would start over).
        for i in range(1000, 2000):
            clock.now += 0.001
            addresses.take(f"2001:db8::{i:x}", 5, 60.0)
        assert table.stats()["full"] > flooded
        assert keys[1].take("k", 3, 3600.0)[1] > 0 and table.held("k") == 1
        again = quotas[0].begin("k", quota, reserve=False)
        assert again.host and again.calls == 3
        assert quotas[1].begin("k2", quota2, reserve=True).refused == "calls"
        assert stats[1].table_full == 0
        held.release()
        assert table.held("k") == 0
    finally:
        for writer in quotas:   # their writer threads, before the table they write to goes
            writer.close()
