"""Faults under a steady load: a database path that black-holes, resets, slows down or goes away; a store that
stops or is locked; pool pressure. Real gunicorn (two workers), real MariaDB/PostgreSQL behind qag.testing.Relay.

For each fault the suite checks what docs/deployment.md's fault table promises: the statuses and codes of every
failed call (each with Retry-After), the longest call against its time limit + the documented margin, the time to
recover once the fault ends, the same worker pids before and after (nothing crashed), and for writes that none
was lost or applied twice, and none refused with Retry-After was applied.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time

import pytest

from qag.backends.watchdog import NETWORK_MARGIN
from qag.testing import Relay
from tests.server import Server, q, wait_for

pytestmark = pytest.mark.e2e

LIMIT = 2            # the calls' time limit (?timeout=) in seconds
# Slack on top of limit + margin for the watchdog's tick, a connect timeout rounded up to whole seconds and a
# loaded test machine.
SLACK = 1.0
LOAD_THREADS = 4


def worker_pids(server: Server) -> set[int]:
    pid = server.proc.pid
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return {int(p) for p in fh.read().split()}


class Load:
    """LOAD_THREADS callers calling `path` back to back; every reply kept as (started, seconds, status, code,
    Retry-After)."""

    def __init__(self, server: Server, path: str, threads: int = LOAD_THREADS, method: str = "GET", body=None):
        self.server, self.path, self.method, self.body = server, path, method, body
        self.replies: list[tuple[float, float, int, str | None, str | None]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._call, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Load":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(30)

    def _call(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            r = self.server.request(self.method, self.path, body=self.body)
            code = r.json.get("code") if r.status >= 400 and r.body.startswith(b"{") else None
            self.replies.append((started, time.monotonic() - started, r.status, code, r.headers.get("retry-after")))

    def failures(self) -> list[tuple]:
        return [r for r in self.replies if r[2] != 200]

    def after(self, moment: float) -> list[tuple]:
        return [r for r in self.replies if r[0] >= moment]


def recovery(load: Load, restored: float) -> float:
    """Seconds from the end of the fault to the first call (started after it) of an unbroken run of successes."""
    later = sorted(load.after(restored))
    assert later, "no call after the fault ended"
    first_good = None
    for started, _, status, _, _ in later:
        if status == 200 and first_good is None:
            first_good = started
        elif status != 200:
            first_good = None
    assert first_good is not None, f"calls still failing after the fault: {later[-5:]}"
    return first_good - restored


def report(fault: str, db: str, load: Load, longest: float, recovered: float) -> None:
    """What docs/deployment.md's fault table is made from (shown with pytest -s)."""
    seen = sorted({(r[2], r[3]) for r in load.failures()}, key=str)
    print(f"\n{fault} [{db}]: {len(load.replies)} calls, {len(load.failures())} refused {seen}, "
          f"longest {longest:.2f} s, recovered {recovered * 1000:.0f} ms after the fault ended")


def assert_clean_refusals(failures: list[tuple], codes: set[str]) -> None:
    for started, seconds, status, code, retry_after in failures:
        assert status in (502, 503, 504) and code in codes, (status, code)
        assert retry_after is not None and int(retry_after) > 0, (status, code)


@pytest.fixture(scope="module")
def fault_server():
    s = Server(env={"QAG_ALLOW_WRITES": "1"}, workers=2, threads=4)
    yield s
    s.close()


def _via_relay(request, server: Server, uniq, db: str, relay: Relay) -> tuple[str, dict]:
    fields = dict(request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db"))
    name = uniq("via")
    reply = server.post("/api/v1/connections", {"name": name, "db": db, **fields, "host": "127.0.0.1",
                                                 "port": relay.port})
    assert reply.status == 201, reply
    return name, fields


def _fast_query_via(request, server: Server, uniq, db: str, relay: Relay) -> tuple[str, dict, str]:
    """(connection, its fields, a saved `SELECT 1`) through the relay: what every load drill calls."""
    connection, fields = _via_relay(request, server, uniq, db, relay)
    fast = uniq("fast")
    server.query(fast, "SELECT 1 AS v", connection)
    return connection, fields, fast


def _upstream(request, db: str) -> tuple[str, int]:
    fields = request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db")
    return fields["host"], int(fields["port"])


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_black_hole_bounds_every_call_and_the_pool_recovers(request, fault_server, uniq, db):
    server = fault_server
    with Relay(*_upstream(request, db)) as relay:
        connection, fields, fast = _fast_query_via(request, server, uniq, db, relay)
        pids = worker_pids(server)
        with Load(server, q(fast) + f"?timeout={LIMIT}") as load:
            time.sleep(1.0)
            relay.blackhole()
            time.sleep(LIMIT + NETWORK_MARGIN + 2.0)   # long enough for calls to run into their deadline
            relay.restore()
            restored = time.monotonic()
            time.sleep(2.5)
        failures = load.failures()
        assert failures, "the black hole refused no call"
        assert_clean_refusals(failures, {"query_timeout", "connection_failed", "unavailable"})
        longest = max(seconds for _, seconds, _, _, _ in load.replies)
        recovered = recovery(load, restored)
        report("black hole", db, load, longest, recovered)
        assert longest <= LIMIT + NETWORK_MARGIN + SLACK, longest
        assert recovered < 2.0
        assert worker_pids(server) == pids
    pattern = re.compile(rf"WARNING qag.database .*connection '{connection}' unavailable: 50[24]")
    wait_for(lambda: pattern.search("".join(server.log)), "the outage's warning in the log")
    log = "".join(server.log)
    assert "Traceback" not in log and fields["password"] not in log


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_pooled_connections_whose_path_died_silently_cost_no_read(request, fault_server, uniq, db):
    """Fault drill: the path of every idle pooled connection died without a word (a NAT, firewall or VIP change:
    nothing arrives until qag sends, then a RST). Each of MariaDB's then failed one read with 502 before the pool
    was clean; a read-only call lost as soon as it was sent now runs again, once, on another connection (as
    PostgreSQL's did). A key that may only read: an administrator's reads run read-write where writes are allowed."""
    server = fault_server
    with Relay(*_upstream(request, db)) as relay:
        connection, fields, fast = _fast_query_via(request, server, uniq, db, relay)
        key = server.key(uniq("reader"), connections=[connection], queries=[fast])
        for _ in range(3):             # the pools hold idle connections (several, for both workers' threads)
            replies = []
            threads = [threading.Thread(target=lambda: replies.append(server.get(q(fast), key=key)))
                       for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all(r.status == 200 for r in replies), replies
        time.sleep(0.3)                # PostgreSQL: the resets queued behind the calls are answered
        relay.stale()
        statuses = [server.get(q(fast), key=key).status for _ in range(12)]
        assert statuses == [200] * 12, statuses
    log = "".join(server.log)
    assert "Traceback" not in log and fields["password"] not in log


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_reset_slow_and_stopped_database_paths(request, fault_server, uniq, db):
    server = fault_server
    with Relay(*_upstream(request, db)) as relay:
        connection, fields, fast = _fast_query_via(request, server, uniq, db, relay)
        pids = worker_pids(server)
        with Load(server, q(fast) + f"?timeout={LIMIT}") as load:
            time.sleep(0.5)
            relay.reset_connections()           # RST on every open connection
            time.sleep(0.5)
            relay.delay = 0.3                   # a slow path: slower calls, none refused
            slow_from = time.monotonic()
            time.sleep(1.0)
            slow_to = time.monotonic()
            relay.delay = LIMIT + 3.0           # slower than the limit: refused by the deadline
            time.sleep(LIMIT + NETWORK_MARGIN + 1.0)
            relay.delay = 0.0
            relay.down()                        # the server stops: refused at once
            down_from = time.monotonic()
            time.sleep(1.5)
            relay.up()
            restored = time.monotonic()
            time.sleep(2.0)
        assert_clean_refusals(load.failures(), {"query_timeout", "connection_failed", "unavailable"})
        slow = [r for r in load.replies if slow_from + 0.5 <= r[0] and r[0] + r[1] <= slow_to]
        assert slow and all(r[2] == 200 and r[1] >= 0.3 for r in slow), slow
        refused_down = [r for r in load.replies if down_from + 0.2 <= r[0] < restored - 0.2]
        assert refused_down and all(r[2] == 502 and r[3] == "connection_failed" for r in refused_down)
        assert max(r[1] for r in refused_down) < 1.0
        longest = max(seconds for _, seconds, _, _, _ in load.replies)
        recovered = recovery(load, restored)
        report("reset, slow, stopped", db, load, longest, recovered)
        assert longest <= LIMIT + NETWORK_MARGIN + SLACK, longest
        assert recovered < 2.0
        assert worker_pids(server) == pids
    log = "".join(server.log)
    assert "Traceback" not in log and fields["password"] not in log
    # At most one warning a second per connection and worker, whatever the load.
    warned = re.findall(rf"WARNING qag.database .*connection '{connection}' unavailable", log)
    assert 1 <= len(warned) <= 2 * (LIMIT + NETWORK_MARGIN + 6), len(warned)


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_writes_are_never_lost_or_applied_twice_across_faults(request, fault_server, uniq, db):
    server = fault_server
    table = uniq("w")
    create = f"CREATE TABLE {table} (id INTEGER NOT NULL)"   # no key: a write applied twice would show
    with Relay(*_upstream(request, db)) as relay:
        connection, fields = _via_relay(request, server, uniq, db, relay)
        assert server.post("/execute_sql", {"sql": create, "connection_name": connection}).status == 200
        insert, count = uniq("ins"), uniq("cnt")
        server.query(insert, f"INSERT INTO {table} (id) VALUES (:id)", connection)
        server.query(count, f"SELECT id, COUNT(*) AS n FROM {table} GROUP BY id ORDER BY id", connection)
        answered: dict[int, int] = {}
        told: dict[int, tuple] = {}        # a refused write: (Retry-After, outcome)
        ids = iter(range(1, 1_000_000))
        lock = threading.Lock()
        stop = threading.Event()

        def writer():
            while not stop.is_set():
                with lock:
                    n = next(ids)
                r = server.post(q(insert) + f"?timeout={LIMIT}", {"params": {"id": n}})
                answered[n] = r.status
                if r.status != 200:
                    told[n] = (r.headers.get("retry-after"), r.json.get("outcome"))
        threads = [threading.Thread(target=writer) for _ in range(3)]
        for t in threads:
            t.start()
        for fault in (relay.cut, relay.reset_connections, relay.blackhole):
            time.sleep(0.7)
            fault()
            if fault == relay.blackhole:
                time.sleep(LIMIT + NETWORK_MARGIN + 0.5)
                relay.restore()
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(30)
        stored: dict[int, int] = {}
        for page in range(1, 1000):
            reply = server.get(q(count) + f"?page_size=1000&page={page}")
            assert reply.status == 200, reply
            stored.update((row["id"], row["n"]) for row in reply.json)
            if reply.headers["x-has-more"] == "false":
                break
        assert all(n == 1 for n in stored.values()), {i: n for i, n in stored.items() if n != 1}
        ok = {i for i, status in answered.items() if status == 200}
        assert ok and ok <= set(stored), sorted(ok - set(stored))[:10]
        assert all(status in (200, 502, 503, 504) for status in answered.values())
        # A refusal that says to retry (Retry-After) is one the server never applied; only a write whose statement
        # was sent when the fault came may have been, and its answer says so.
        assert all((retry_after is None) == (outcome == "unknown") for retry_after, outcome in told.values()), told
        retryable = {i for i, (retry_after, _) in told.items() if retry_after is not None}
        assert not retryable & set(stored), sorted(retryable & set(stored))[:10]


def test_pool_waiting_gauge_rises_and_falls(request, make_server, uniq):
    fields = request.getfixturevalue("mysql_db")
    server = make_server(env={"QAG_POOL_MAX": "1", "QAG_POOL_WAIT": "10"}, workers=1, threads=4)
    name = uniq("capped")
    assert server.post("/api/v1/connections", {"name": name, "db": "mysql", **fields}).status == 201
    slow = uniq("slow")
    server.query(slow, "SELECT SLEEP(1.5) AS s", name)

    def waiting() -> float | None:
        text = server.get("/metrics").body.decode()
        m = re.search(rf'^qag_pool_waiting_callers{{connection="{name}"}} (\S+)$', text, re.M)
        return float(m.group(1)) if m else None

    callers = [threading.Thread(target=server.get, args=(q(slow),)) for _ in range(3)]
    for t in callers:
        t.start()
    assert wait_for(lambda: waiting() == 2 or None, "two callers waiting", 5.0)
    for t in callers:
        t.join(30)
    assert waiting() == 0


@pytest.fixture
def store_relay(pg_store_db):
    from tests.services import pg_schema_url
    from urllib.parse import urlsplit
    url, cleanup = pg_schema_url(pg_store_db)
    parts = urlsplit(url)
    relay = Relay(parts.hostname, parts.port or 5432)
    yield relay, parts._replace(netloc=parts.netloc.replace(f":{parts.port}", f":{relay.port}")).geturl()
    relay.close()
    cleanup()


def test_store_down_answers_503_lets_known_keys_in_and_leaves_nothing_half_done(make_server, uniq, store_relay):
    relay, url = store_relay
    server = make_server(env={"QAG_DATABASE_URL": url, "QAG_ACCESS_LOG": "on"}, workers=2)
    name = uniq("k")
    key = server.key(name, queries=["one"])
    server.query("one", "SELECT 1 AS v", "lite")
    # Both workers answer before the outage; the key and the query are then in the host's metadata cache.
    answered = server.answered_by_every_worker(q("one"), 2, key=key)
    pids = worker_pids(server)
    assert answered == pids
    relay.down()
    try:
        unknown = server.get(q("one"), key="not-a-key-of-this-server")
        read = server.get("/api/v1/queries")
        refused_name = uniq("new")
        write = server.post("/api/v1/queries", {"name": refused_name, "description": "d", "sql": "SELECT 2 AS v",
                                                "connection_name": "lite", "publish": True})
        known = [server.get(q("one"), key=key) for _ in range(6)]
    finally:
        relay.up()
    for reply in (unknown, read, write):
        assert reply.status == 503 and reply.json["code"] == "unavailable", reply
        assert int(reply.headers["retry-after"]) > 0
    assert all(r.status == 200 for r in known), known
    # After the outage: the refused write left nothing, everything answers again, nothing crashed.
    wait_for(lambda: server.get("/api/v1/queries").status == 200 or None, "the store answering again", 10.0)
    assert server.get(f"/api/v1/queries/{refused_name}").status == 404
    assert server.get(q("one"), key="not-a-key-of-this-server").status == 401
    assert worker_pids(server) == pids
    wait_for(lambda: "WARNING qag.database" in "".join(server.log) or None, "the outage's warning in the log")
    log = "".join(server.log)
    assert "Traceback" not in log and "the store unavailable: 503 unavailable" in log


def test_run_history_outlives_a_store_outage_while_an_administrator_polls(make_server, uniq, store_relay):
    """Fault drill: with the store refused for 8 s while calls ran and an administrator polled GET /api/v1/queries,
    65 runs were answered and 25 reached history: every read has every worker's writer try its held batch once
    more, so the 30 tries meant to hold half a minute of outage were gone within a second. The hold is by time
    now: however often management views are read, the runs are written once the store is back."""
    relay, url = store_relay
    server = make_server(env={"QAG_DATABASE_URL": url, "QAG_ACCESS_LOG": "on"}, workers=2)
    key = server.key(uniq("k"), queries=["one"])
    server.query("one", "SELECT 1 AS v", "lite")
    server.answered_by_every_worker(q("one"), 2, key=key)   # the key and the query cached by both workers
    stop = threading.Event()
    polls: list[int] = []

    def poll():
        while not stop.is_set():
            polls.append(server.get("/api/v1/queries").status)

    relay.down()
    poller = threading.Thread(target=poll, daemon=True)
    try:
        poller.start()
        calls = [server.get(q("one"), key=key, headers={"X-Request-Id": f"held-{i}"}).status for i in range(20)]
        # Many more reads than the 30 tries of before, each asking both writers for one more (fast: refused).
        wait_for(lambda: len(polls) >= 80 or None, "80 reads of a management view during the outage", 30)
    finally:
        stop.set()
        poller.join(30)
        relay.up()
    assert calls == [200] * 20 and 503 in polls
    held = {f"held-{i}" for i in range(20)}

    def recorded():
        items = server.get("/api/v1/history", params={"query": "one", "limit": 100}).json["items"]
        return held <= {item["request_id"] for item in items}

    wait_for(recorded, "every run of the outage in history", 10)
    assert "are lost" not in "".join(server.log)


def test_locked_sqlite_store_answers_503_then_recovers(make_server, uniq):
    server = make_server(env={"QAG_ACCESS_LOG": "on"}, workers=2)
    server.answered_by_every_worker("/health", 2)      # no worker is still opening the store when it is locked
    holder = sqlite3.connect(os.path.join(server.home, "qag.db"), timeout=1, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        started = time.monotonic()
        refused = server.post("/api/v1/queries", {"name": uniq("locked"), "description": "d", "sql": "SELECT 1 AS v",
                                                  "connection_name": "lite"})
        waited = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert refused.status == 503 and refused.json["code"] == "unavailable", refused
    assert int(refused.headers["retry-after"]) > 0 and waited < 10
    assert server.post("/api/v1/queries", {"name": uniq("after"), "description": "d", "sql": "SELECT 1 AS v",
                                           "connection_name": "lite"}).status == 201
    assert "Traceback" not in "".join(server.log)


def test_a_stalled_store_is_answered_within_its_limit_and_nothing_stays_stuck(make_server, uniq, store_relay):
    """The store's server accepts but never answers (fault drill: request threads, the metadata poll and the
    history writer hung for minutes, and a POST committed long after its client had gone). Now each store call
    ends within QAG_STORE_TIMEOUT + 1 s: 503 unavailable with Retry-After; known keys keep being served from the
    metadata cache; the refused write never lands when the stall ends; the workers and their threads carry on."""
    relay, url = store_relay
    server = make_server(env={"QAG_DATABASE_URL": url, "QAG_ACCESS_LOG": "on", "QAG_STORE_TIMEOUT": "2"},
                         workers=2)
    key = server.key(uniq("k"), queries=["one"])
    server.query("one", "SELECT 1 AS v", "lite")
    assert server.answered_by_every_worker(q("one"), 2, key=key) == worker_pids(server)
    pids = worker_pids(server)
    relay.blackhole()
    try:
        refused_name = uniq("stalled")
        replies = []

        def call(method, path, body=None):
            started = time.monotonic()
            replies.append((server.request(method, path, body=body), time.monotonic() - started))

        # More store calls at once than a worker has threads: none may hold its thread past the limit.
        callers = [threading.Thread(target=call, args=("GET", "/api/v1/queries")) for _ in range(6)]
        callers.append(threading.Thread(target=call, args=("POST", "/api/v1/queries", {
            "name": refused_name, "description": "d", "sql": "SELECT 2 AS v", "connection_name": "lite",
            "publish": True})))
        for t in callers:
            t.start()
        known = [server.get(q("one"), key=key) for _ in range(4)]
        for t in callers:
            t.join(60)
        time.sleep(2.0)   # the stall outlasts the calls' limit
    finally:
        relay.restore()
    assert len(replies) == 7
    for reply, seconds in replies:
        assert reply.status == 503 and reply.json["code"] == "unavailable", reply
        if reply.json.get("outcome") == "unknown":
            # a change whose reply never came: it may have been applied, so no Retry-After (the POST only)
            assert "retry-after" not in reply.headers and "read it back" in reply.json["error"], reply
        else:
            assert int(reply.headers["retry-after"]) > 0
        # Limit + margin per store round trip, and a call makes a few (the run counts of /api/v1/queries first
        # have the history writers write: 2 s at most for the others): seconds, not the minutes of before.
        assert seconds < 15, seconds
    assert all(r.status == 200 for r in known), known
    wait_for(lambda: server.get("/api/v1/queries").status == 200 or None, "the store answering again", 15.0)
    time.sleep(1.0)
    assert server.get(f"/api/v1/queries/{refused_name}").status == 404   # the held COMMIT never landed
    doubted = [reply for reply, _ in replies if reply.json.get("outcome") == "unknown"]
    assert len(doubted) <= 1       # the POST's alone: a read has no outcome to doubt
    for _ in range(3):   # the history writer and the metadata poll survived: runs recorded after the stall
        assert server.get(q("one"), key=key, headers={"X-Request-Id": "after-stall"}).status == 200
    wait_for(lambda: server.get("/api/v1/history", params={"query": "one", "limit": 100}).json["items"][0]
             ["request_id"] == "after-stall" or None, "history written after the stall")
    assert worker_pids(server) == pids
    assert "Traceback" not in "".join(server.log)


@pytest.mark.parametrize("outage", ["refused", "stalled"])
def test_a_worker_restarted_during_a_store_outage_waits_for_the_store(make_server, uniq, store_relay, outage):
    """Fault drill: with the store unreachable, a worker killed (or recycled) failed to boot (exit 3) and gunicorn
    halted the master, taking the surviving worker down with it. Now the new worker waits for the store (a
    warning each attempt, heartbeat kept) while the other serves from the metadata cache, and serves once the
    store is back."""
    import signal
    relay, url = store_relay
    server = make_server(env={"QAG_DATABASE_URL": url, "QAG_ACCESS_LOG": "on", "QAG_STORE_TIMEOUT": "2"},
                         workers=2)
    key = server.key(uniq("k"), queries=["one"])
    server.query("one", "SELECT 1 AS v", "lite")
    server.answered_by_every_worker(q("one"), 2, key=key)
    victim, survivor = sorted(worker_pids(server))
    relay.down() if outage == "refused" else relay.blackhole()
    try:
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: "the store can't be opened" in "".join(server.log) or None, "the new worker's warning", 30)
        assert server.proc.poll() is None   # the master did not halt
        assert survivor in worker_pids(server)
        assert all(server.get(q("one"), key=key).status == 200 for _ in range(6))
    finally:
        relay.up()
        relay.restore()
    wait_for(lambda: len(server.answered_by_every_worker(q("one"), 2, key=key, deadline=60)) == 2,
             "both workers serving again", 60)
    log = "".join(server.log)
    assert "Worker failed to boot" not in log and "Traceback" not in log


def test_a_reload_during_a_store_outage_answers_meanwhile(make_server, uniq, store_relay):
    """Fault drill: a reload (SIGHUP) with the store unreachable replaced every worker with one that waited for the
    store inside gunicorn's load(): every connection, /livez included, hung until the store came back (an
    orchestrator would have killed the instance). Now the new workers answer at once, /livez 200 and the rest
    503 unavailable with Retry-After, and serve once the store is back."""
    import signal
    relay, url = store_relay
    server = make_server(env={"QAG_DATABASE_URL": url, "QAG_ACCESS_LOG": "on", "QAG_STORE_TIMEOUT": "2"},
                         workers=2)
    key = server.key(uniq("k"), queries=["one"])
    server.query("one", "SELECT 1 AS v", "lite")
    old = worker_pids(server)
    relay.down()
    try:
        os.kill(server.proc.pid, signal.SIGHUP)
        wait_for(lambda: "".join(server.log).count("answering 503 until it can") >= 2 or None,
                 "both new workers answering while they wait", 30)
        wait_for(lambda: not (worker_pids(server) & old) or None, "the old workers gone", 30)
        for _ in range(4):
            started = time.monotonic()
            live = server.get("/livez", key=None)
            ready = server.get("/readyz", key=None)
            call = server.get(q("one"), key=key)
            assert time.monotonic() - started < 5
            assert live.status == 200 and live.json == {"status": "ok"}, live
            assert ready.status == 503 and ready.json["code"] == "unavailable", ready
            assert call.status == 503 and call.json["code"] == "unavailable", call
            assert int(call.headers["retry-after"]) > 0
    finally:
        relay.up()
    _serving_again(server, key)
    assert server.get("/readyz", key=None).status == 200
    log = "".join(server.log)
    assert "Worker failed to boot" not in log and "Traceback" not in log


def _serving_again(server: Server, key: str) -> None:
    """Every worker serving `one` once the store is back: a worker that waited for it answers 503 until its next
    attempt to open it, which the first request asks for (storewait.RETRY_ASKED)."""
    wait_for(lambda: all(server.get(q("one"), key=key).status == 200 for _ in range(8)) or None,
             "the workers serving once the store is back", 60)
    assert len(server.answered_by_every_worker(q("one"), 2, key=key, deadline=60)) == 2
