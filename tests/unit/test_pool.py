"""The data-connection pool: most recently used first, bounded idle, idle timeout, and the open cap's 503."""

from __future__ import annotations

import threading
import time

import pytest

from qag.backends.pool import Pool
from qag.errors import QagError


class Conn:
    opened = 0

    def __init__(self):
        Conn.opened += 1
        self.id = Conn.opened
        self.closed = False

    def close(self):
        self.closed = True


def test_most_recently_used_first_and_idle_limit():
    pool = Pool(idle_limit=2, idle_timeout=60)
    a, _ = pool.acquire("k", Conn)
    b, _ = pool.acquire("k", Conn)
    c, _ = pool.acquire("k", Conn)
    for conn in (a, b, c):
        pool.release("k", conn)
    assert a.closed and not b.closed and not c.closed   # the oldest idle one is closed beyond the limit
    got, reused = pool.acquire("k", Conn)
    assert got is c and reused
    assert pool.stats() == {"idle": 1, "active": 1, "waits": 0, "waiting": {}}


def test_oldest_first_when_asked():
    pool = Pool(idle_limit=3, idle_timeout=60)
    conns = [pool.acquire("k", Conn)[0] for _ in range(3)]
    for conn in conns:
        pool.release("k", conn)
    assert pool.acquire("k", Conn, oldest=True) == (conns[0], True)
    assert pool.acquire("k", Conn) == (conns[2], True)      # the default stays most recent first
    assert pool.acquire("k", Conn, lambda conn: conn is conns[1], oldest=True) == (conns[1], True)
    assert pool.idle() == []
    for conn in conns:
        pool.release("k", conn)
    asked = []
    ready = lambda conn: asked.append(conn) or conn is not conns[0]     # noqa: E731
    assert pool.acquire("k", Conn, ready, oldest=True) == (conns[1], True) and asked == conns[:2]
    asked.clear()
    assert pool.acquire("k", Conn, ready) == (conns[2], True) and asked == [conns[2]]


def test_keys_do_not_share_connections():
    pool = Pool(idle_limit=4, idle_timeout=60)
    a, _ = pool.acquire(("db", True), Conn)
    pool.release(("db", True), a)
    b, reused = pool.acquire(("db", False), Conn)
    assert b is not a and not reused


def test_connection_that_raised_is_closed_not_pooled():
    pool = Pool(idle_limit=4, idle_timeout=60)
    a, _ = pool.acquire("k", Conn)
    pool.release("k", a, reusable=False)
    assert a.closed and pool.stats()["idle"] == 0


def test_idle_timeout_closes_instead_of_reusing():
    pool = Pool(idle_limit=4, idle_timeout=0.05)
    a, _ = pool.acquire("k", Conn)
    pool.release("k", a)
    time.sleep(0.1)
    b, reused = pool.acquire("k", Conn)
    assert a.closed and b is not a and not reused


def test_pool_size_zero_never_keeps_a_connection():
    pool = Pool(idle_limit=0, idle_timeout=60)
    a, _ = pool.acquire("k", Conn)
    pool.release("k", a)
    assert a.closed


def test_prefer_picks_a_ready_connection():
    pool = Pool(idle_limit=4, idle_timeout=60)
    a, _ = pool.acquire("k", Conn)
    b, _ = pool.acquire("k", Conn)
    pool.release("k", a)
    pool.release("k", b)
    got, _ = pool.acquire("k", Conn, prefer=lambda conn: conn is a)
    assert got is a


def test_open_cap_makes_callers_wait_then_503():
    pool = Pool(idle_limit=4, idle_timeout=60, max_open=1, wait=0.2)
    a, _ = pool.acquire("k", Conn)
    with pytest.raises(QagError) as raised:
        pool.acquire("k", Conn)
    assert raised.value.status == 503 and raised.value.extras["retry_after"] == 1
    # A caller that waits gets the connection released meanwhile.
    threading.Timer(0.05, pool.release, args=("k", a)).start()
    got, reused = pool.acquire("k", Conn)
    assert got is a and reused and pool.stats()["waits"] == 2


def test_a_release_wakes_a_waiting_caller():
    """A waiter is woken by the release, not by its own time limit (30 s here; the join is a deadline)."""
    pool = Pool(idle_limit=4, idle_timeout=60, max_open=1, wait=30)
    a, _ = pool.acquire("k", Conn)
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire("k", Conn)))
    waiter.start()
    deadline = time.monotonic() + 10
    while not pool._waiting:   # until it waits (a deadline, not a timing assertion)
        assert time.monotonic() < deadline and waiter.is_alive()
        time.sleep(0.005)
    pool.release("k", a)
    waiter.join(10)
    assert not waiter.is_alive() and got == [(a, True)]


def test_a_connection_freed_as_the_wait_runs_out_is_handed_out_not_lost():
    class FreedLate(Pool):
        def _wait_freed(self, seconds, label):
            self.release("k", a)   # freed at the last moment, after the wait timed out
            return False

    pool = FreedLate(idle_limit=4, idle_timeout=60, max_open=1, wait=30)
    a, _ = pool.acquire("k", Conn)
    assert pool.acquire("k", Conn) == (a, True)
    assert pool.stats() == {"idle": 0, "active": 1, "waits": 1, "waiting": {}}


def test_open_cap_counts_a_failed_open_as_closed():
    pool = Pool(idle_limit=4, idle_timeout=60, max_open=1, wait=0.1)

    def broken():
        raise OSError("unreachable")

    with pytest.raises(OSError):
        pool.acquire("k", broken)
    conn, _ = pool.acquire("k", Conn)   # the failed open did not use up the cap
    assert conn is not None


def test_close_idle():
    pool = Pool(idle_limit=4, idle_timeout=60)
    a, _ = pool.acquire("k", Conn)
    pool.release("k", a)
    pool.close_idle()
    assert a.closed and pool.stats()["idle"] == 0


def test_settings_keys_are_never_reused_for_other_settings(monkeypatch):
    """Each distinct set of fields gets a number of its own, in any order of its fields; past the table's bound
    the key is the sorted fields themselves (no number), so no number handed out before can come to stand for
    other settings; fields holding an object are keyed by their repr."""
    from qag.backends import pool
    monkeypatch.setattr(pool, "_KEYS", {})
    monkeypatch.setattr(pool, "_KEYS_MAX", 6)
    first = pool.settings_key({"host": "a", "port": 1})
    assert first == pool.settings_key({"port": 1, "host": "a"}) == pool.settings_key({"host": "a", "port": 1})
    keys = [pool.settings_key({"host": name}) for name in "bcdef"]
    assert first not in keys and len(set(keys)) == 5
    assert keys[-1] == (("host", "f"),) == pool.settings_key({"host": "f"})
    assert pool.settings_key({"host": "a", "port": 2}) not in (first, *keys)
    assert pool.settings_key({"host": "x", "opt": ["a"]}) == pool.settings_key({"opt": ["a"], "host": "x"})


def test_fixed_fields_are_found_by_identity_and_a_changed_copy_is_not(monkeypatch):
    """fix_key numbers a dict once (its owner never changes it in place); any other dict, a copy that was changed
    included, is keyed by its own fields."""
    from qag.backends import pool
    monkeypatch.setattr(pool, "_FIXED", {})
    fields = {"host": "fixed-a", "port": 1}
    pool.fix_key(fields)
    assert pool._FIXED[id(fields)] == (fields, pool.settings_key(dict(fields)))
    assert pool.settings_key(fields) == pool.settings_key({"port": 1, "host": "fixed-a"})
    other = dict(fields, host="fixed-b")
    assert pool.settings_key(other) != pool.settings_key(fields)


def test_resolved_fields_are_kept_while_the_environment_agrees(monkeypatch):
    """backends.base.resolved: the same dict for the same stored fields while the ${VAR} it read keeps its value;
    a new value (or a variable gone) is read again, and the refusals are resolve_fields' own."""
    from qag.backends import base
    monkeypatch.setattr(base, "_RESOLVED", {})
    environ = {"QAGTEST_PG_PASSWORD": "one"}
    stored = {"host": "h", "password": "${QAGTEST_PG_PASSWORD}"}
    first = base.resolved(stored, environ)
    assert first == {"host": "h", "password": "one"} and base.resolved(stored, environ) is first
    assert base.resolved(dict(stored), environ) is not first          # another dict: resolved on its own
    environ["QAGTEST_PG_PASSWORD"] = "two"
    second = base.resolved(stored, environ)
    assert second == {"host": "h", "password": "two"}
    from qag.backends import pool
    assert pool.settings_key(second) != pool.settings_key(first)
    del environ["QAGTEST_PG_PASSWORD"]
    with pytest.raises(QagError) as info:
        base.resolved(stored, environ)
    assert info.value.code == "connection_misconfigured"
    with pytest.raises(QagError):
        base.resolved({"password": "${QAG_API_KEY}"}, {"QAG_API_KEY": "x"})


def test_a_new_connection_is_opened_with_the_arguments_given():
    opened = []
    pool = Pool(idle_limit=1, idle_timeout=60)
    conn, reused = pool.acquire("k", lambda *args: opened.append(args) or Conn(), None, 0, None, "", False, (1, "two"))
    assert opened == [(1, "two")] and not reused
    pool.release("k", conn)
    assert pool.acquire("k", lambda *args: opened.append(args) or Conn(), open_args=(3,)) == (conn, True)
    assert opened == [(1, "two")]


def test_a_fresh_connection_is_never_an_idle_one_also_at_the_cap():
    """MySQL's statements that read what a session keeps (warnings, LAST_INSERT_ID(), ...) ask for a new
    connection: at the cap, the idle one was handed out instead (an earlier caller's session). It is closed to
    make room; with every connection busy the caller waits, then gets the 503."""
    pool = Pool(idle_limit=1, idle_timeout=60, max_open=1, wait=0.2)
    first, _ = pool.acquire("k", Conn)
    pool.release("k", first)
    fresh, reused = pool.acquire("k", Conn, fresh=True)
    assert fresh is not first and not reused and first.closed
    assert pool.stats()["active"] == 1
    with pytest.raises(QagError) as caught:        # the one connection is busy: no idle one to make room with
        pool.acquire("k", Conn, fresh=True)
    assert caught.value.code == "unavailable"
    pool.release("k", fresh)
    again, reused = pool.acquire("k", Conn)        # an ordinary caller still reuses the idle connection
    assert again is fresh and reused
