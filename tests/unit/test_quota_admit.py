"""Quotas.admit: a governed call's key bucket and quota in one step of the host table answer exactly what the
bucket's take() and then begin() answer (the counts, the refusals, the headers, the limiter's statistics); and a
caller's period, kept between calls, is the one period() gives at every instant. With Redis:
tests/integration/test_quota_admit_redis.py."""

from __future__ import annotations

import os
import random
import time

import pytest

from qag import _speedups
from qag.policy.hostlimits import HostTable
from qag.policy.quotas import Quotas, local_text, period
from qag.policy.redislimits import LimitStats, RateLimiter
from qag.store.sqlite import SqliteStore
from tests.speedups.conftest import compiled_or_skip


class Clock:
    def __init__(self, at: float):
        self.now = at

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


class Worker:
    """A worker's limiters on a host table of its own: the key bucket and the quotas, on the shared clocks."""

    def __init__(self, path, twin, mono: Clock, wall: Clock, redis=None):
        self.table = HostTable.create(256, twin=twin, clock=mono, wall=wall)
        self.stats = LimitStats()
        self.buckets = RateLimiter("key", redis, self.stats, table=self.table)
        self.quotas = Quotas(SqliteStore(str(path)), redis, self.stats, interval=60, clock=wall, table=self.table)

    def separately(self, name, quota, reserve, count, period):
        """What app._limits did before admit(): take, then begin (reserving only a call the bucket let through)."""
        taken = self.buckets.take(name, count, period)
        return self.quotas.begin(name, quota, reserve=reserve and not taken[1]), taken


def _seen(ticket, taken) -> tuple:
    if ticket is None:
        return None, taken
    return (ticket.calls, ticket.rows, ticket.refused, ticket.reserved, ticket.host, ticket.remote,
            tuple(ticket.headers()), ticket.reset_text, ticket.key), taken


def test_admit_answers_as_take_then_begin(tmp_path, twin):
    mono, wall = Clock(1000.0), Clock(time.time())
    a = Worker(tmp_path / "a", twin, mono, wall)
    b = Worker(tmp_path / "b", twin, mono, wall)
    rnd = random.Random(5)
    quotas = [{"calls": 6, "per": "day"}, {"rows": 9, "per": "month"}, {"calls": 4, "rows": 20, "per": "day"}, {}]
    outcomes = set()
    for _ in range(600):
        mono.now += rnd.choice((0.0, 0.05, 0.4, 2.0, 30.0))
        wall.now += rnd.choice((0.0, 0.05, 0.4, 2.0, 30.0, 5000.0))
        name = rnd.choice(("k1", "k2", "k3"))
        quota = quotas[int(name[1]) - 1] if rnd.random() < 0.9 else quotas[3]
        reserve = rnd.random() < 0.8
        count, per = rnd.choice(((3, 60.0), (5, 10.0)))
        one = a.quotas.admit(name, quota, reserve, a.buckets, count, per)
        other = b.separately(name, quota, reserve, count, per)
        assert _seen(*one) == _seen(*other)
        assert (a.stats.rejections, a.stats.fallbacks) == (b.stats.rejections, b.stats.fallbacks)
        ticket, taken = one
        outcomes.add((ticket is not None and ticket.refused, bool(taken[1])))
        if ticket is not None and ticket.reserved:
            ok, rows = rnd.random() < 0.7, rnd.randint(0, 4)
            ticket.settle(ok, rows)
            other[0].settle(ok, rows)
            assert _seen(*one) == _seen(*other)
        assert a.table.quota_peek(a.quotas.host_key(("default", name, "day", period("day", wall.now)[0]))) == \
            b.table.quota_peek(b.quotas.host_key(("default", name, "day", period("day", wall.now)[0])))
    # The run went through allowed calls, rate-limited ones, and both quotas refusing.
    assert {(None, False), (None, True), ("calls", False), ("rows", False)} <= outcomes


def test_admit_seeds_a_new_counter_from_the_store(tmp_path, twin):
    mono, wall = Clock(1000.0), Clock(time.time())
    w = Worker(tmp_path, twin, mono, wall)
    key = ("default", "k", "day", period("day", wall.now)[0])
    w.quotas.store.add_quota_usage([(*key, 2, 5)], at=int(wall.now))   # counted before this host started
    ticket, taken = w.quotas.admit("k", {"calls": 3, "per": "day"}, True, w.buckets, 5, 60.0)
    assert taken == (4, 0) and ticket.host and (ticket.calls, ticket.rows, ticket.refused) == (3, 5, None)
    ticket, taken = w.quotas.admit("k", {"calls": 3, "per": "day"}, True, w.buckets, 5, 60.0)
    assert taken == (3, 0) and ticket.refused == "calls"
    # No quota: the bucket alone, as take()
    assert w.quotas.admit("k", {"per": "day"}, True, w.buckets, 5, 60.0) == (None, (2, 0))



def test_a_callers_period_is_the_one_period_gives_at_every_instant(tmp_path, tz):
    tz("Europe/Berlin")
    start = time.mktime(time.strptime("2026-03-28 23:59:58", "%Y-%m-%d %H:%M:%S"))  # a 23-hour day next
    clock = Clock(start)
    q = Quotas(SqliteStore(str(tmp_path)), interval=60, clock=clock)
    quota = {"calls": 1000, "per": "day"}
    for step in [0.5, 1.0, 0.5, 3600.0, 23 * 3600.0 - 3601.0, 1.0, 0.25, -7200.0, 90000.0, 31 * 86400.0]:
        clock.now += step
        for per in ("day", "month"):
            t = q.begin("k", dict(quota, per=per), reserve=False)
            text, begun, reset = period(per, clock.now)
            assert (t.key[3], t.start_at, t.reset_at, t.reset_text) == (text, begun, reset, local_text(reset))
    tz("Pacific/Auckland")                     # a new zone: the next call's period is that zone's
    t = q.begin("k", quota, reserve=False)
    assert (t.key[3], t.reset_text) == (period("day", clock.now)[0], local_text(period("day", clock.now)[2]))
