"""qag/policy/quotas.py's counters in a real Redis: seeded from the store, exact across workers, flushed to it."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

import redis

from qag.policy import redislimits
from qag.policy.hostlimits import HostTable
from qag.policy.quotas import Quotas, period
from qag.policy.redislimits import LimitStats, holder_host, reserved_index
from qag.redisconn import SharedRedis
from qag.store.sqlite import SqliteStore
from qag.testing import Relay
from tests.server import wait_for
from tests.services import redis_url


def redis_shared() -> SharedRedis:
    return SharedRedis(redis_url())


def _cleanup(shared: SharedRedis, q: Quotas, name: str) -> None:
    for per in ("day", "month"):
        shared.client().delete(q.redis_key(("default", name, per, period(per, time.time())[0])))


def test_redis_counter_is_seeded_from_the_store_and_exact(tmp_path, uniq):
    shared = SharedRedis(redis_url())
    name = uniq("quota")
    store = SqliteStore(str(tmp_path))
    key = ("default", name, "day", period("day", time.time())[0])
    store.add_quota_usage([(*key, 2, 7)], at=int(time.time()))
    a, b = Quotas(store, shared, interval=60), Quotas(SqliteStore(str(tmp_path)), shared, interval=60)
    quota = {"calls": 4, "per": "day"}
    try:
        t = a.begin(name, quota, reserve=True)
        assert t.remote and t.calls == 3 and t.rows == 7    # seeded with the stored 2 calls and 7 rows
        t.settle(True, 3)
        assert b.begin(name, quota, reserve=False).calls == 3  # no flush needed: Redis is shared at once
        t = b.begin(name, quota, reserve=True)
        assert t.calls == 4
        t.settle(True, 1)
        assert a.begin(name, quota, reserve=True).refused == "calls"
        assert shared.client().hgetall(a.redis_key(key))[b"rows"] == b"11"
        assert 0 < shared.client().ttl(a.redis_key(key)) <= 40 * 86400
        a.flush(), b.flush()                                 # the store still gets every count
        assert store.quota_counts([key])[key] == (4, 11)
        items = [u for u in a.usage() if u["caller"] == name]
        assert [(u["per"], u["calls"], u["rows"]) for u in items] == [("day", 4, 11)]
    finally:
        _cleanup(shared, a, name)


# --- reservations that never settled (found by a fault drill with a TCP relay in front of Redis) ------------------
def _via(relay: Relay) -> str:
    parts = urlsplit(redis_url())
    return parts._replace(netloc=f"127.0.0.1:{relay.port}").geturl()


def _calls(q: Quotas, name: str) -> int | None:
    found = redis.Redis.from_url(redis_url()).hget(q.redis_key(("default", name, "day", period("day", time.time())[0])),
                                                    "calls")
    return None if found is None else int(found)


def _held(q: Quotas, name: str) -> int:
    """This process's reservations in Redis not settled yet, of name's counter."""
    counter = q.redis_key(("default", name, "day", period("day", time.time())[0])).encode()
    held = redis.Redis.from_url(redis_url()).hgetall(reserved_index(holder_host(), os.getpid()))
    return sum(1 for c in held.values() if c == counter)


@contextmanager
def _quotas_behind_a_relay(tmp_path, name: str):
    """(relay, Quotas, host table): a worker's quotas whose Redis is reached through a relay the test drives; what
    they left in Redis (the counter, this process's reservations and their tombstones) removed after."""
    table = HostTable.create(64)
    parts = urlsplit(redis_url())
    with Relay(parts.hostname, parts.port or 6379) as relay:
        q = Quotas(SqliteStore(str(tmp_path)), SharedRedis(_via(relay)), LimitStats(), interval=60, table=table)
        try:
            yield relay, q, table
        finally:
            _cleanup(redis_shared(), q, name)
            direct = redis.Redis.from_url(redis_url())
            gone = [*direct.scan_iter(reserved_index(holder_host(), os.getpid()) + ":gone:*")]
            if gone:
                direct.delete(*gone)
            q.close()
            table.close()


def test_a_give_back_redis_missed_is_sent_again_once(tmp_path, uniq):
    """A call that ended non-200 while Redis was unreachable kept its reserved call counted in Redis for the rest
    of the period; now the give-back is sent again once Redis answers, and a give-back whose reply was lost is
    not applied twice."""
    name = uniq("giveback")
    quota = {"calls": 5, "per": "day"}
    with _quotas_behind_a_relay(tmp_path, name) as (relay, q, table):
        t = q.begin(name, quota, reserve=True)
        assert t.remote and _calls(q, name) == 1 and _held(q, name) == 1
        relay.down()                            # Redis unreachable as the call ends
        t.settle(False)
        assert _calls(q, name) == 1             # the give-back did not reach Redis
        relay.up()
        wait_for(lambda: _calls(q, name) == 0 or None, "the give-back sent again", 10.0)
        wait_for(lambda: not q._settling or None, "the retrying thread ended", 5.0)
        assert _held(q, name) == 0

        q.redis._down_until = 0.0                # past the back-off (not waited for)
        t = q.begin(name, quota, reserve=True)
        assert t.remote and _calls(q, name) == 1
        relay.hold_replies()                    # the give-back is done, but its reply never comes
        t.settle(False)
        assert _calls(q, name) == 0 and q._unsettled
        relay.restore()
        wait_for(lambda: not q._settling or None, "the give-back sent again", 10.0)
        assert _calls(q, name) == 0 and _held(q, name) == 0   # applied once: its reservation was already let go


def test_a_reservation_whose_reply_is_lost_is_given_back_in_redis(tmp_path, uniq):
    """A reservation that reached Redis but whose reply never came counted there AND in the host table the call
    fell back to; now the one in Redis is given back once it answers."""
    name = uniq("lostreserve")
    quota = {"calls": 5, "per": "day"}
    with _quotas_behind_a_relay(tmp_path, name) as (relay, q, table):
        assert q.begin(name, quota, reserve=False).remote and _calls(q, name) == 0   # the counter, seeded
        relay.hold_replies()
        t = q.begin(name, quota, reserve=True)
        assert t.host and not t.remote and t.calls == 1      # counted by the host table
        assert _calls(q, name) == 1                          # ... and reserved in Redis, unknown to the worker
        relay.restore()
        wait_for(lambda: _calls(q, name) == 0 or None, "the lost reservation given back", 10.0)
        t.settle(True, 3)
        assert table.quota_peek(t.host_key) == (1, 3) and _held(q, name) == 0


def test_a_reservation_delivered_after_its_give_back_counts_nothing(tmp_path, uniq):
    """Found by a review with a TCP relay: a RESERVE whose reply never came was given back over a new connection
    while the old one still held the command; delivered late, after the give-back (which then found nothing), it
    counted the call and left its token in the live worker's hash, counted until that worker died. The give-back
    leaves a tombstone the late RESERVE respects."""
    name = uniq("latereserve")
    quota = {"calls": 5, "per": "day"}
    with _quotas_behind_a_relay(tmp_path, name) as (relay, q, table):
        assert q.begin(name, quota, reserve=False).remote and _calls(q, name) == 0   # seeded, connected
        relay.hold_old()                                     # the connection keeps the RESERVE; new ones pass
        t = q.begin(name, quota, reserve=True)
        assert t.host and not t.remote and t.calls == 1      # counted by the host table
        assert _calls(q, name) == 0                          # the RESERVE has not reached Redis yet
        wait_for(lambda: not q._settling or None, "the give-back taken over a new connection", 10.0)
        relay.restore()                                      # ... and now it does, late
        wait_for(lambda: relay.held_open() == 0 or None, "Redis ran what the old connection held", 10.0)
        assert _calls(q, name) == 0 and _held(q, name) == 0  # nothing counted, nothing held
        t.settle(True, 3)
        assert table.quota_peek(t.host_key) == (1, 3)


def test_the_master_gives_back_a_dead_workers_reservations(tmp_path, uniq):
    """A worker killed mid-call (SIGKILL) left its reserved call counted in Redis for good; the master's sweep
    (gunicorn_conf.child_exit -> redislimits.sweep) gives it back, once: a settle after it changes nothing."""
    name = uniq("swept")
    shared = redis_shared()
    q = Quotas(SqliteStore(str(tmp_path)), shared, interval=60)
    quota = {"calls": 5, "per": "day"}
    shared.client().delete(reserved_index(holder_host(), os.getpid()))   # nothing an earlier test left is swept
    try:
        kept, lost = (q.begin(name, quota, reserve=True) for _ in range(2))
        kept.settle(True, 2)
        assert _calls(q, name) == 2 and _held(q, name) == 1
        assert redislimits.sweep(redis_url(), os.getpid()) == 1   # as if this process were the dead worker
        assert _calls(q, name) == 1 and _held(q, name) == 0
        lost.settle(False)                                          # already given back: not again
        assert _calls(q, name) == 1
    finally:
        _cleanup(shared, q, name)
        q.close()


def test_what_the_host_table_counted_while_redis_failed_is_added_to_redis(tmp_path, uniq):
    """Fault drill (CLIENT PAUSE): calls counted in the host table while Redis failed were never added to Redis's
    counter, so once Redis answered again the caller got them back (14 calls on a quota of 12). Now they are
    added before Redis decides again, once; and not to a counter seeded after them (from the store, which may
    hold them already)."""
    name = uniq("stall")
    quota = {"calls": 10, "per": "day"}
    with _quotas_behind_a_relay(tmp_path, name) as (relay, q, table):
        assert q.begin(name, quota, reserve=False).remote and _calls(q, name) == 0   # seeded before the stall
        relay.down()
        for rows in (3, 4):
            t = q.begin(name, quota, reserve=True)
            assert t.host and not t.remote
            t.settle(True, rows)
        assert _calls(q, name) == 0
        relay.up()
        q.redis._down_until = 0.0                            # past the back-off (not waited for)
        t = q.begin(name, quota, reserve=True)
        assert t.remote and (t.calls, t.rows) == (3, 7)      # the stall's two calls and their rows, then this one
        t.settle(True, 1)
        assert (_calls(q, name), q._owed) == (3, {})
        t = q.begin(name, quota, reserve=True)               # added once
        assert t.remote and t.calls == 4
        t.settle(False)

        # Redis loses the counter (a restart) after a stall: the counter seeded again from the store and this
        # worker's unwritten counts holds the stall's calls already; they are not added a second time.
        relay.down()
        t = q.begin(name, quota, reserve=True)
        assert t.host
        t.settle(True, 2)
        redis.Redis.from_url(redis_url()).delete(q.redis_key(("default", name, "day", period("day", time.time())[0])))
        time.sleep(1.1)                                      # the new counter is born a second later
        relay.up()
        q.redis._down_until = 0.0
        t = q.begin(name, quota, reserve=True)
        assert t.remote and t.calls == 5                     # 3 + the stall's 1 (seeded) + this one
        t.settle(False)


def test_a_counter_seeded_before_the_upgrade_takes_the_stall_counts_too(tmp_path, uniq):
    """A counter an earlier qag seeded has no `born`: it was seeded before any count of this one, so a stall's
    counts are added to it (found by a code review: they were dropped, the very bug, until the period ended)."""
    name = uniq("oldcounter")
    quota = {"calls": 10, "per": "day"}
    with _quotas_behind_a_relay(tmp_path, name) as (relay, q, table):
        assert q.begin(name, quota, reserve=False).remote
        redis.Redis.from_url(redis_url()).hdel(q.redis_key(("default", name, "day", period("day", time.time())[0])),
                                               "born")
        relay.down()
        t = q.begin(name, quota, reserve=True)
        assert t.host
        t.settle(True, 2)
        relay.up()
        q.redis._down_until = 0.0
        t = q.begin(name, quota, reserve=True)
        assert t.remote and (t.calls, t.rows) == (2, 2)
        t.settle(False)
