"""qag/policy/limits.py: token buckets and concurrency slots, with an injected clock; QAG_RATE_LIMIT parsing."""

from __future__ import annotations

import threading

import pytest

from qag.policy.limits import Buckets, Slot, Slots
from qag.settings import SettingsError, load


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_three_per_minute_then_refused_with_retry_after():  # B6.20
    clock = Clock()
    b = Buckets(clock=clock)
    assert [b.take("1.2.3.4", 3, 60) for _ in range(3)] == [(2, 0), (1, 0), (0, 0)]
    assert b.take("1.2.3.4", 3, 60) == (0, 20)  # (1 - 0) * 60 / 3
    clock.now += 5  # 0.25 token back: (1 - 0.25) * 20 = 15
    assert b.take("1.2.3.4", 3, 60) == (0, 15)
    clock.now += 15
    assert b.take("1.2.3.4", 3, 60) == (0, 0)


def test_refusal_spends_nothing_and_retry_after_is_at_least_one():
    clock = Clock()
    b = Buckets(clock=clock)
    assert b.take("a", 1, 1) == (0, 0)
    for _ in range(5):
        assert b.take("a", 1, 1) == (0, 1)
    clock.now += 0.999
    assert b.take("a", 1, 1) == (0, 1)  # max(1, ceil(0.001)) = 1
    clock.now += 0.001
    assert b.take("a", 1, 1) == (0, 0)


def test_refill_is_continuous_and_capped_at_capacity():
    clock = Clock()
    b = Buckets(clock=clock)
    for _ in range(10):
        b.take("a", 10, 10)
    clock.now += 3.5  # 3.5 tokens
    assert b.take("a", 10, 10) == (2, 0)
    clock.now += 1000
    assert b.take("a", 10, 10) == (9, 0)


def test_identities_have_independent_budgets():
    b = Buckets(clock=Clock())
    assert b.take("k1", 1, 60) == (0, 0)
    assert b.take("k1", 1, 60)[1] > 0
    assert b.take("k2", 1, 60) == (0, 0)


def test_a_changed_limit_keeps_what_was_used_within_the_new_capacity():
    clock = Clock()
    b = Buckets(clock=clock)
    for _ in range(5):
        b.take("k", 10, 60)  # 5 left
    assert b.take("k", 3, 60) == (2, 0)  # clamped to 3, one spent
    assert b.take("k", 100, 60) == (1, 0)  # raised: no free refill


def test_idle_buckets_are_forgotten_and_size_is_bounded():
    clock = Clock()
    b = Buckets(max_entries=1000, clock=clock)
    for i in range(10):
        b.take(i, 5, 60)
    assert len(b) == 10
    clock.now += 60  # everyone idle a full period: full again, so forgetting them changes nothing
    for _ in range(10):
        b.take("busy", 1000, 60)
    assert len(b) == 1
    small = Buckets(max_entries=3, clock=clock)
    for i in range(10):
        small.take(i, 5, 60)
    assert len(small) == 3
    assert small.take(9, 5, 60) == (3, 0)  # the most recent ones are kept


def test_buckets_are_thread_safe():
    b = Buckets(clock=Clock())
    allowed = []

    def hammer():
        for _ in range(500):
            allowed.append(b.take("x", 1000, 3600)[1] == 0)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert allowed.count(True) == 1000


def test_slots_acquire_release():
    s = Slots()
    assert s.acquire("k", 2) and s.acquire("k", 2)
    assert not s.acquire("k", 2)
    assert s.acquire("other", 1)
    s.release("k")
    assert s.held("k") == 1 and s.acquire("k", 2)
    s.release("k")
    s.release("k")
    assert s.held("k") == 0


def test_a_slot_is_released_once():
    s = Slots()
    assert s.acquire("k", 1)
    slot = Slot(s, "k")
    slot.release()
    slot.release()
    assert s.held("k") == 0
    assert s.acquire("k", 1) and not s.acquire("k", 1)


# QAG_RATE_LIMIT (B9.7) --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value,parsed", [("60/minute", (60, 60)), (" 5 / second ", (5, 1)),
                                          ("100/HOURS", (100, 3600)), ("1/day", (1, 86400)),
                                          ("7/Minutes", (7, 60))])
def test_rate_limit_setting_accepted(value, parsed):
    assert load({"QUERYAPIGATE_RATE_LIMIT": value}).rate_limit == parsed
    assert load({"QAG_RATE_LIMIT": value}).rate_limit == parsed


@pytest.mark.parametrize("value", ["fast", "0/minute", "10/week", "-5/second", "60", "/minute", "5 per minute"])
def test_rate_limit_setting_refused(value):
    with pytest.raises(SettingsError) as raised:
        load({"QUERYAPIGATE_RATE_LIMIT": value})
    message = str(raised.value)
    assert "QUERYAPIGATE_RATE_LIMIT must look like '60/minute'" in message and "\n" not in message


def test_rate_limit_off_by_default():
    assert load({}).rate_limit is None and load({"QAG_RATE_LIMIT": ""}).rate_limit is None
