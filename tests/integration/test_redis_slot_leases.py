"""max_concurrent leases in Redis never outlive their holders: a release Redis missed (it stalled, then its
connections dropped) is given back once Redis answers again, and the master gives back the leases of a worker
killed while it held them (gunicorn_conf.child_exit → redislimits.sweep), with its unsettled quota reservations.

Found by a fault drill: with max_concurrent 2 and two calls in flight across a Redis stall, the failed ZREMs were
dropped and the key got 429 too_many_concurrent for ~25 s after Redis came back (until the leases ran out; an hour
without a time limit); a worker SIGKILLed holding slots left its leases for their whole length (12 refusals over
~36 s after the respawn), though the host table, without Redis, was swept.
"""

from __future__ import annotations

import http.client
import os
import signal
import threading
import time
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest
import redis

from qag.policy import redislimits
from qag.policy.hostlimits import HostTable
from qag.policy.quotas import period
from qag.policy.redislimits import LimitStats, SlotPool, holder_host, holder_index, reserved_index
from qag.redisconn import SharedRedis
from qag.testing import Relay
from tests.server import Server, q, wait_for
from tests.services import dead_redis_url, redis_url

_SLOW = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {n}) SELECT count(*) AS c FROM n"


def _direct() -> redis.Redis:
    return redis.Redis.from_url(redis_url(), socket_timeout=2, socket_connect_timeout=2)


def _via(relay: Relay) -> str:
    parts = urlsplit(redis_url())
    return parts._replace(netloc=f"127.0.0.1:{relay.port}").geturl()


def test_a_release_redis_missed_is_given_back_once_redis_answers(uniq):
    name = uniq("lease")
    key = f"qag:running:{name}"
    direct = _direct()
    parts = urlsplit(redis_url())
    with Relay(parts.hostname, parts.port or 6379) as relay:
        pool = SlotPool(SharedRedis(_via(relay)), LimitStats())
        try:
            held = [pool.acquire(name, 2, 5.0), pool.acquire(name, 2, None)]   # leases of 35 s and of an hour
            assert None not in held and pool.acquire(name, 2, 5.0) is None
            assert key.encode() in direct.smembers(holder_index(holder_host(), os.getpid()))
            relay.blackhole()                  # Redis stalls: each release gives up after the socket timeout
            for slot in held:
                slot.release()
            relay.cut()                        # ... and its connections drop, the ZREMs held in them with them
            relay.restore()
            assert direct.zcard(key) == 2
            started = time.monotonic()
            wait_for(lambda: direct.zcard(key) == 0 or None, "the failed releases tried again", 5.0)
            assert time.monotonic() - started < 3.0
            wait_for(lambda: not pool._retrying or None, "the retrying thread ended", 5.0)
            assert pool._unreleased == {}
        finally:
            direct.delete(key, holder_index(holder_host(), os.getpid()))


@contextmanager
def _pool_behind_a_relay(key: str):
    """(relay, SlotPool): a worker's max_concurrent slots whose Redis is reached through a relay the test drives,
    with a host table to fall back to; the set `key`, this process's index and the set's tombstones removed after."""
    table = HostTable.create(64)
    parts = urlsplit(redis_url())
    with Relay(parts.hostname, parts.port or 6379) as relay:
        try:
            yield relay, SlotPool(SharedRedis(_via(relay)), LimitStats(), table=table)
        finally:
            direct = _direct()
            direct.delete(key, holder_index(holder_host(), os.getpid()), *direct.scan_iter(f"{key}:gone:*"))
            table.close()


def test_an_acquire_whose_reply_is_lost_leaves_no_lease_behind(uniq):
    """Found by a fault drill: an ACQUIRE that reached Redis but whose reply never came back (the call went on with
    the host's count) left its lease in the set, so once Redis answered again every call of a max_concurrent=1 key
    was refused 429 too_many_concurrent until the lease ran out (an hour without a time limit)."""
    name = uniq("lost")
    key = f"qag:running:{name}"
    direct = _direct()
    with _pool_behind_a_relay(key) as (relay, pool):
        pool.acquire(name, 1, None).release()          # connected: the relay holds replies on a live connection
        assert direct.zcard(key) == 0
        relay.hold_replies()                           # Redis runs the commands; their replies never come
        slot = pool.acquire(name, 1, None)
        assert isinstance(slot, redislimits._HostSlot) and pool.stats.fallbacks == 1   # the host's count
        assert direct.zcard(key) == 1                  # ... but Redis took the lease
        slot.release()
        relay.restore()
        wait_for(lambda: direct.zcard(key) == 0 or None, "the lease of the lost reply given back", 10.0)
        wait_for(lambda: not pool._retrying or None, "the retrying thread ended", 5.0)


def test_an_acquire_delivered_after_its_give_back_adds_no_lease(uniq):
    """Found by a review with a TCP relay: an ACQUIRE whose reply never came was given back over a new connection
    while the old one still held the command; delivered late, after the give-back (which then removed nothing), it
    added a lease nobody would remove, and the key was refused 429 too_many_concurrent on every instance until the
    lease ran out (an hour without a time limit). The give-back leaves a tombstone the late ACQUIRE respects."""
    name = uniq("late")
    key = f"qag:running:{name}"
    direct = _direct()
    with _pool_behind_a_relay(key) as (relay, pool):
        pool.acquire(name, 1, None).release()          # connected: the relay holds a live connection
        relay.hold_old()                               # it keeps the ACQUIRE; new connections pass
        slot = pool.acquire(name, 1, None)
        assert isinstance(slot, redislimits._HostSlot) and pool.stats.fallbacks == 1   # the host's count
        assert direct.zcard(key) == 0                  # the ACQUIRE has not reached Redis yet
        wait_for(lambda: not pool._retrying or None, "the give-back taken over a new connection", 10.0)
        relay.restore()                                # ... and now it does, late
        wait_for(lambda: relay.held_open() == 0 or None, "Redis ran what the old connection held", 10.0)
        assert direct.zcard(key) == 0                  # no lease left behind
        slot.release()
        pool.redis._down_until = 0.0                   # past the back-off (not waited for)
        again = pool.acquire(name, 1, None)            # the key's slot is free in Redis
        assert isinstance(again, redislimits._RedisSlot)
        again.release()
        assert direct.zcard(key) == 0


def test_failed_releases_are_kept_only_until_their_lease_runs_out(monkeypatch):
    monkeypatch.setattr(redislimits, "RELEASE_RETRY", 0.05)
    monkeypatch.setattr(redislimits, "RELEASES_KEPT", 3)
    pool = SlotPool(SharedRedis(dead_redis_url()), LimitStats())
    now = time.monotonic()
    for i in range(5):
        pool._keep("qag:running:gone", f"m{i}", now + (0.3 if i else 60.0))
    assert len(pool._unreleased) == 3                       # bounded
    time.sleep(0.6)
    assert list(pool._unreleased) == [("qag:running:gone", "m0")]   # the others' leases ran out: dropped
    assert pool._retrying
    pool._unreleased[("qag:running:gone", "m0")] = (time.monotonic(), 0)
    wait_for(lambda: not pool._retrying or None, "the thread ending with nothing left", 2.0)


def test_sweep_removes_a_dead_process_leases_only(uniq):
    direct = _direct()
    names = [uniq("swept"), uniq("swept")]
    keys = [f"qag:running:{n}" for n in names]
    host, dead = os.uname().nodename, 2 ** 22 + os.getpid()     # a pid no process of this host has
    index = holder_index(host, dead)
    try:
        for key in keys:
            direct.zadd(key, {f"{host}:{dead}:aa": time.time() + 60, f"{host}:{dead}1:bb": time.time() + 60,
                              f"other:{dead}:cc": time.time() + 60})
        direct.sadd(index, *keys)
        assert redislimits.sweep(redis_url(), dead, host) == 2
        for key in keys:          # another pid starting with the same digits, and another host's pid, stay
            assert set(direct.zrange(key, 0, -1)) == {f"{host}:{dead}1:bb".encode(), f"other:{dead}:cc".encode()}
        assert not direct.exists(index)
        assert redislimits.sweep(redis_url(), dead, host) == 0   # nothing left: nothing to do
    finally:
        direct.delete(*keys, index)


def test_a_sweep_gives_back_only_its_own_instances_leases(uniq, monkeypatch):
    """Two gunicorn instances on one Redis whose host names and worker pids are the same (containers): a master's
    sweep of its dead worker leaves the other instance's live worker's leases alone."""
    name = uniq("twin")
    key = f"qag:running:{name}"
    direct = _direct()
    held = {}
    try:
        for tag in ("aaaaaa", "bbbbbb"):
            monkeypatch.setattr(redislimits, "_instance", tag)   # as each master's start_instance() left it
            held[tag] = SlotPool(SharedRedis(redis_url()), LimitStats()).acquire(name, 2, 5.0)
        assert None not in held.values() and direct.zcard(key) == 2
        hosts = {tag: f"{os.uname().nodename}/{tag}" for tag in held}
        assert redislimits.sweep(redis_url(), os.getpid()) == 1          # instance bbbbbb's master, same pid
        assert [m.decode().split(":")[0] for m in direct.zrange(key, 0, -1)] == [hosts["aaaaaa"]]
        assert direct.exists(holder_index(hosts["aaaaaa"], os.getpid()))
        assert not direct.exists(holder_index(hosts["bbbbbb"], os.getpid()))
    finally:
        direct.delete(key, *(holder_index(f"{os.uname().nodename}/{tag}", os.getpid()) for tag in held))


def test_start_instance_tags_the_workers_it_forks(monkeypatch):
    monkeypatch.setattr(redislimits, "_instance", None)   # this test's master tag is undone after it
    redislimits.start_instance()
    tag = redislimits.holder_host()
    assert tag.startswith(os.uname().nodename + "/") and len(tag.rsplit("/", 1)[1]) == 12
    redislimits.start_instance()                      # once per master: a second call keeps the tag
    assert redislimits.holder_host() == tag
    read, write = os.pipe()
    child = os.fork()
    if child == 0:                                     # a worker forked afterwards names the same holder
        os.write(write, redislimits.holder_host().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    assert os.read(read, 200).decode() == tag
    os.close(read)


def test_sweep_is_bounded_when_redis_does_not_answer():
    parts = urlsplit(redis_url())
    with Relay(parts.hostname, parts.port or 6379) as relay:
        relay.blackhole()
        started = time.monotonic()
        with pytest.raises(redis.RedisError):
            redislimits.sweep(_via(relay), 12345, "nohost")
        assert time.monotonic() - started < 1.0


def _children(pid: int) -> set[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(p) for p in fh.read().split()}


@pytest.mark.e2e
def test_a_killed_worker_gives_back_its_redis_leases(uniq):
    s = Server(env={"QAG_REDIS_URL": redis_url(), "QAG_ACCESS_LOG": "on"}, workers=2)
    direct = _direct()
    name = uniq("killed")
    key = f"{s.redis_prefix()}running:{name}"
    host = os.uname().nodename
    counter = key     # the key's quota counter, once the server's prefix is known
    try:
        s.sqlite_db("lite.db", "CREATE TABLE t (id INTEGER PRIMARY KEY); INSERT INTO t VALUES (1);")
        s.connection("lite", "lite.db")
        s.query("ids", "SELECT id FROM t", "lite")
        s.query("endless", _SLOW.format(n=1_000_000_000), "lite")
        token = s.key(name, max_concurrent=2, quota={"calls": 100, "per": "day"})
        counter = f"{s.redis_prefix()}quota:default~{name}:day:{period('day', time.time())[0]}"
        workers = s.connections_per_worker(2, "/api/v1/connections")
        victim, other = sorted(workers)
        outcome: dict = {}

        def run(pid: int, timeout: int) -> None:
            try:
                outcome[pid] = workers[pid].get(q("endless") + f"?timeout={timeout}", key=token)
            except (OSError, http.client.HTTPException) as exc:
                outcome[pid] = exc
        callers = [threading.Thread(target=run, args=(victim, 60)), threading.Thread(target=run, args=(other, 6))]
        for t in callers:
            t.start()
        wait_for(lambda: direct.zcard(key) == 2 or None, "both calls holding a lease")
        members = [m.decode() for m in direct.zrange(key, 0, -1)]
        assert sorted(m.split(":")[1] for m in members) == sorted([str(victim), str(other)])
        # the workers' leases name the host and their master's instance tag, the same for both
        assert len({m.split(":")[0] for m in members}) == 1 and members[0].startswith(f"{host}/")
        host = members[0].split(":")[0]
        assert s.get(q("ids"), key=token).status == 429
        os.kill(victim, signal.SIGKILL)
        callers[0].join(30)
        assert isinstance(outcome[victim], Exception)
        master = s.proc.pid
        wait_for(lambda: victim not in _children(master) and len(_children(master)) == 2,
                 "the master replaced the killed worker")
        # Given back as the master reaped it, not when its lease (60 + 30 s) runs out.
        assert [m.decode().split(":")[1] for m in direct.zrange(key, 0, -1)] == [str(other)]
        assert not direct.exists(holder_index(host, victim))
        # ... and its reserved quota call too (found by a fault drill: it stayed counted for the period): only the
        # other call's reservation is left (the 429's was given back when it ended).
        assert direct.hget(counter, "calls") == b"1"
        assert not direct.exists(reserved_index(host, victim))
        r = s.get(q("ids"), key=token)
        assert r.status == 200, r
        callers[1].join(30)
        assert outcome[other].status == 504
        assert direct.zcard(key) == 0
        assert direct.hget(counter, "calls") == b"1"    # the 200 kept, the 504 given back
        pids = _children(master)
        s.stop()
        # A graceful stop sweeps every worker's index too, and never blocked the master.
        assert "Could not give back" not in "".join(s.log)
        assert not [k for k in direct.scan_iter(f"qag:holder:{host}:*", count=1000)
                    if int(k.decode().rsplit(":", 1)[1]) in pids | {victim}]
    finally:
        s.close()
        direct.delete(key, counter)
