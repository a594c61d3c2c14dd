"""Contract 8.4/8.5: GET /events on a real gunicorn with several workers - live runs from every worker reach every
stream that may see them (a key its own runs, an administrator all), the contract's headers, filters and their
400, the per-worker stream cap with Retry-After, keepalives, a client that never reads holding up nothing, and a
graceful stop that does not wait for open streams."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.conftest import SEED
from tests.server import q, wait_for

pytestmark = pytest.mark.e2e


class Subscriber:
    """One /events client on its own connection, collecting the events it is sent on a thread."""

    def __init__(self, server, key="admin", params: str = ""):
        self.conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
        headers = {} if key is None else {"X-API-Key": server.admin_key if key == "admin" else key}
        self.conn.request("GET", "/events" + params, headers=headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.events: list[dict] = []
        self.comments: list[str] = []
        self.body = b""
        self.done = threading.Event()           # the server ended the stream (or the connection)
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.response.read()

    def _read(self) -> None:
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                line = line.decode().rstrip("\n")
                if line.startswith("data: "):
                    self.events.append(json.loads(line[len("data: "):]))
                elif line.startswith(":"):
                    self.comments.append(line)
        except Exception:   # noqa: BLE001 - closed under the reader (http.client raises several kinds then)
            return
        finally:
            self.done.set()

    def request_ids(self) -> set[str]:
        return {e["entry"]["request_id"] for e in self.events}

    def close(self) -> None:
        try:
            self.conn.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, AttributeError):
            pass
        self.conn.close()


def _open(server, count: int, key="admin", params: str = "") -> list[Subscriber]:
    """`count` streams, retrying the 503 of a worker already at its cap (another worker takes the next one, or a
    stream an earlier test closed is given back once its worker notices, within a keepalive)."""
    streams: list[Subscriber] = []
    for _ in range(count * 40):
        if len(streams) == count:
            return streams
        s = Subscriber(server, key, params)
        if s.status == 200:
            streams.append(s)
        else:
            assert s.status == 503 and s.headers["retry-after"] == "5", s.body
            s.close()
            time.sleep(0.05)
    raise AssertionError(f"opened only {len(streams)} of {count} streams")


@pytest.fixture(scope="module")
def ev(make_module_server):
    s = make_module_server(env={"QAG_ACCESS_LOG": "on", "QAG_EVENTS_MAX_STREAMS": "4", "QAG_THREADS": "8",
                                "QAG_EVENTS_KEEPALIVE": "0.5"})
    s.query("ev_films", "SELECT id, name FROM t WHERE id <= :n ORDER BY id", "lite",
            parameters={"n": {"type": "int", "default": 2}})
    s.query("ev_other", "SELECT 1 AS one", "lite")
    return s


def _calls(server, n: int, key="admin", name="ev_films") -> list:
    """n runs on fresh connections, from a few threads at once (so several workers serve them)."""
    replies: list = [None] * n

    def call(i: int) -> None:
        replies[i] = server.get(q(name), params={"n": 1 + i % 3}, key=key)
    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status == 200 for r in replies), replies
    return replies


def test_events_need_a_key(ev):
    s = Subscriber(ev, key=None)
    assert s.status == 401
    assert Subscriber(ev, key="wrong").status == 401


def test_every_workers_runs_reach_every_stream_with_the_contracts_headers(ev):
    streams = _open(ev, 6)                       # 6 streams, at most 4 per worker: both workers hold some
    try:
        s = streams[0]
        assert s.headers["content-type"] == "text/event-stream; charset=utf-8"     # as QueryAPIGate's (probed)
        assert s.headers["cache-control"] == "no-cache" and s.headers["x-accel-buffering"] == "no"
        replies = _calls(ev, 24)
        assert len(ev.workers_of(replies)) == 2
        wanted = {r.headers["x-request-id"] for r in replies}
        for stream in streams:
            wait_for(lambda: wanted <= stream.request_ids(), "every run on every stream")
        event = next(e for e in streams[0].events if e["entry"]["request_id"] == replies[0].headers["x-request-id"])
        assert set(event) == {"type", "source", "occurred_at", "kind", "query", "version", "connection_name", "entry"}
        assert (event["type"], event["source"], event["kind"], event["query"], event["version"],
                event["connection_name"]) == ("query.run", "rest", "saved", "ev_films", 1, "lite")
        entry = event["entry"]
        assert entry["status"] == "success" and entry["key_name"] == "admin" and entry["rows"] in (1, 2, 3)
        assert "query" not in entry and entry["executed_at"] == event["occurred_at"]
        # The history agrees: the same runs, the same request ids.
        history = ev.get("/api/v1/queries/ev_films/history", params={"limit": 100}).json["items"]
        assert wanted <= {i["request_id"] for i in history}
    finally:
        for stream in streams:
            stream.close()
    # Both workers held streams: their access-log lines (written when a stream ends) name two pids.
    wait_for(lambda: len({int(line.split("pid=<")[1].split(">")[0]) for line in list(ev.log)
                          if '"GET /events' in line and " 200 " in line}) == 2, "streams on both workers")


def test_a_key_sees_only_its_own_runs_and_an_administrator_sees_all(ev, uniq):
    alice_name, bob_name = uniq("alice"), uniq("bob")
    alice = ev.key(alice_name, connections=["lite"])
    bob = ev.key(bob_name, connections=["lite"])
    (admin_s,), (alice_s,), (bob_s,) = _open(ev, 1), _open(ev, 1, alice), _open(ev, 1, bob)
    try:
        by_alice = {r.headers["x-request-id"] for r in _calls(ev, 5, alice)}
        by_bob = {r.headers["x-request-id"] for r in _calls(ev, 3, bob)}
        wait_for(lambda: by_alice | by_bob <= admin_s.request_ids(), "the administrator sees both")
        wait_for(lambda: by_alice <= alice_s.request_ids() and by_bob <= bob_s.request_ids(), "each its own")
        time.sleep(0.3)                           # a stray event would have arrived by now
        assert not (alice_s.request_ids() & by_bob) and not (bob_s.request_ids() & by_alice)
        assert {e["entry"]["key_name"] for e in alice_s.events} == {alice_name}
    finally:
        for s in (admin_s, alice_s, bob_s):
            s.close()


@pytest.mark.parametrize("change", ["delete", "rotate", "deactivate"])
def test_a_stream_ends_when_its_key_stops_naming_its_caller(ev, uniq, change):
    """A stream follows a key name: one opened with a key that is then revoked, rotated away or deactivated
    went on receiving that name's runs, those of a new key created under the same name included."""
    name = uniq("gone")
    old = ev.key(name, connections=["lite"])
    (stream,) = _open(ev, 1, old)
    try:
        before = {r.headers["x-request-id"] for r in _calls(ev, 2, old)}
        wait_for(lambda: before <= stream.request_ids(), "the key's own runs")
        if change == "delete":
            assert ev.request("DELETE", f"/api/v1/api-keys/{name}").status == 204
            new = ev.key(name, connections=["lite"])                 # the name taken by a new key
        elif change == "rotate":
            r = ev.request("POST", f"/api/v1/api-keys/{name}/rotate", body={"grace_minutes": 0})
            assert r.status in (200, 201), r
            new = r.json.get("key") or r.json.get("secret")
            assert new, r.json
        else:
            assert ev.request("PATCH", f"/api/v1/api-keys/{name}", body={"active": False}).status == 200
            new = None
        assert stream.done.wait(10), "the stream was not ended"
        if new is not None:
            after = {r.headers["x-request-id"] for r in _calls(ev, 2, new)}
            time.sleep(0.5)
            assert not (stream.request_ids() & after)
    finally:
        stream.close()


def test_filters_and_their_refusals(ev):
    for params in ("?kind=other", "?status=failed"):
        s = Subscriber(ev, params=params)
        assert s.status == 400 and json.loads(s.body)["code"] == "invalid_filter"
    (adhoc,), (errors,) = _open(ev, 1, params="?kind=adhoc"), _open(ev, 1, params="?status=error&query=ev_films")
    (other,) = _open(ev, 1, params="?type=schema.change")
    try:
        _calls(ev, 2)
        bad = ev.get(q("ev_films"), params={"n": "x"})               # refused before the database: not a run
        assert bad.status == 400
        ran = ev.post("/execute_sql", {"sql": "SELECT nope FROM t", "connection_name": "lite"})
        ok = ev.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"})
        # Refused at its inactive connection: a failed run (contract 10.1 step 1, as QueryAPIGate records it); at
        # a connection that doesn't exist: not recorded (its name is the caller's text: docs/compatibility.md).
        lite = ev.get("/api/v1/connections/lite").json
        assert ev.post("/api/v1/connections", {"name": "ev_off", "db": "sqlite", "database": lite["database"],
                                               "active": False}).status == 201
        off = ev.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "ev_off"})
        missing = ev.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "ev_nosuch"})
        assert ran.status == 500 and ok.status == 200 and off.status == 403 and missing.status == 404
        wait_for(lambda: {ran.headers["x-request-id"], ok.headers["x-request-id"],
                          off.headers["x-request-id"]} <= adhoc.request_ids(), "ad-hoc runs on the adhoc stream")
        refused = next(e for e in adhoc.events if e["entry"]["request_id"] == off.headers["x-request-id"])
        assert (refused["connection_name"], refused["entry"]["status"], refused["entry"]["code"]) == \
            ("ev_off", "error", "connection_inactive")
        # No database was reached: no run metrics name the connection.
        assert b"ev_off" not in ev.get("/metrics").body
        assert all(e["kind"] == "adhoc" for e in adhoc.events)
        adhoc_error = next(e for e in adhoc.events if e["entry"]["request_id"] == ran.headers["x-request-id"])
        assert adhoc_error["entry"]["status"] == "error" and adhoc_error["entry"]["code"] == "query_failed"
        assert adhoc_error["query"] is None and adhoc_error["entry"]["sql"] == "SELECT nope FROM t"
        time.sleep(0.3)
        assert errors.events == [] and other.events == []
        assert missing.headers["x-request-id"] not in adhoc.request_ids()
    finally:
        for s in (adhoc, errors, other):
            s.close()


def test_the_per_worker_cap_answers_503_with_retry_after(ev):
    streams = _open(ev, 8)                        # both workers full (4 each)
    try:
        extra = Subscriber(ev)
        assert extra.status == 503 and extra.headers["retry-after"] == "5"
        body = json.loads(extra.body)
        assert body["code"] == "too_many_streams" and body["retry_after"] == 5
        # Contract 8.5: the message names QueryAPIGate's standalone server; qag's own command as well.
        assert "`queryapigate events`" in body["error"] and "`qag events`" in body["error"]
        assert ev.get(q("ev_other")).status == 200          # calls still answered
    finally:
        for s in streams:
            s.close()
    _open(ev, 1)[0].close()                       # a stream again once the others are given back


def test_a_cap_of_zero_refuses_every_stream_with_503(make_server):
    """Contract 8.5 and QueryAPIGate 0.43 (probed): QAG_EVENTS_MAX_STREAMS=0 turns streams off with the cap's
    503 too_many_streams and Retry-After: 5 (was a 404); a filter that can never match is still a 400 first."""
    s = make_server(env={"QAG_EVENTS_MAX_STREAMS": "0"})
    refused = Subscriber(s)
    body = json.loads(refused.body)
    assert (refused.status, refused.headers["retry-after"], body["code"], body["retry_after"]) == \
        (503, "5", "too_many_streams", 5)
    assert "`queryapigate events`" in body["error"] and "`qag events`" in body["error"]
    bad = Subscriber(s, params="?status=failed")
    assert bad.status == 400 and json.loads(bad.body)["code"] == "invalid_filter"
    assert Subscriber(s, key=None).status == 401


def test_a_client_that_closes_gives_its_stream_back_within_seconds(make_server):
    """A stream whose client closed its connection ends when the server looks at the socket (every second), not
    at the second keepalive write (30 s with the default keepalive): its slot and thread are back at once, so a
    caller opening and dropping streams can't hold a worker's slots."""
    s = make_server(workers=1, env={"QAG_EVENTS_MAX_STREAMS": "1", "QAG_EVENTS_KEEPALIVE": "15"})
    first = _open(s, 1)[0]
    assert Subscriber(s).status == 503                   # the one slot is held
    first.close()                                        # the client goes away without a word (FIN)
    deadline = time.monotonic() + 8.0                    # well before the 30 s two keepalives would take
    while True:
        again = Subscriber(s)
        if again.status == 200:
            again.close()
            break
        assert again.status == 503 and time.monotonic() < deadline, "the closed client's stream was never given back"
        again.close()
        time.sleep(0.1)


def test_a_client_that_half_closes_keeps_reading_its_stream(make_server):
    """A client that closes its sending side after the request (nc -N) and goes on reading keeps its stream: the
    server's look at the socket sees the end of its input, writes, and the write goes through."""
    s = make_server(workers=1, env={"QAG_EVENTS_KEEPALIVE": "15"})
    sock = socket.create_connection((s.host, s.port), timeout=10)
    try:
        sock.sendall(f"GET /events HTTP/1.1\r\nHost: localhost\r\nX-API-Key: {s.admin_key}\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        received, end = b"", time.monotonic() + 4.0
        while time.monotonic() < end:
            chunk = sock.recv(4096)
            assert chunk, "the server ended a stream whose client still reads"
            received += chunk
        assert received.startswith(b"HTTP/1.1 200") and b": keepalive" in received
    finally:
        sock.close()


def test_keepalive_comments_when_nothing_happens(ev):
    (s,) = _open(ev, 1, params="?query=nothing_runs_this")
    try:
        wait_for(lambda: ": keepalive" in s.comments, "a keepalive")
    finally:
        s.close()


def test_a_client_that_stops_reading_holds_up_no_run_and_no_other_stream_and_is_dropped(make_server):
    s = make_server(env={"QAG_EVENTS_MAX_STREAMS": "4", "QAG_EVENTS_RING_BYTES": "524288"})
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # before connecting: a small window
    stuck.connect((s.host, s.port))
    stuck.sendall(f"GET /events HTTP/1.1\r\nHost: x\r\nX-API-Key: {s.admin_key}\r\n\r\n".encode())
    (reader,) = _open(s, 1)
    try:
        # ~4 KB events: the 512 KiB ring holds ~120 of them; the stream's thread of the client that does not read
        # blocks after the stream's bounded send buffer (~35 of them): 400 runs put it more than a lap behind.
        filler = "SELECT 1 AS one -- " + "x" * 3500
        replies: list = []

        def calls() -> None:
            for _ in range(200):
                replies.append(s.post("/execute_sql", {"sql": filler, "connection_name": "lite"}))
        threads = [threading.Thread(target=calls) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(replies) == 400 and all(r.status == 200 for r in replies)
        wait_for(lambda: {r.headers["x-request-id"] for r in replies} <= reader.request_ids(),
                 "the client that reads has every run")
        # The stuck client reads again: its stream finds the ring went past it, and is ended.
        stuck.settimeout(20)
        received = b""
        while not received.endswith(b"0\r\n\r\n"):
            chunk = stuck.recv(65536)
            assert chunk, "the connection closed before the stream's end"
            received += chunk
        def dropped() -> float:
            metrics = s.get("/metrics").body.decode().splitlines()
            return next(float(line.split()[1]) for line in metrics
                        if line.startswith("qag_events_dropped_streams_total "))
        wait_for(lambda: dropped() == 1, "the dropped stream counted (workers publish their figures shortly)")
        assert not reader.done.is_set()                 # the one that kept up is still streaming
    finally:
        stuck.close()
        reader.close()


def test_a_graceful_stop_does_not_wait_for_open_streams(make_server):
    s = make_server(env={"QAG_GRACEFUL_TIMEOUT": "60", "QAG_EVENTS_MAX_STREAMS": "2"})
    streams = _open(s, 3)
    started = time.monotonic()
    s.proc.terminate()
    s.proc.wait(60)
    assert time.monotonic() - started < 30, "the workers waited for their streams"
    for stream in streams:
        assert stream.done.wait(5)
        stream.close()


def test_a_hundred_subscribers_on_two_workers_get_exactly_what_they_may_see(make_server, uniq):
    s = make_server(env={"QAG_THREADS": "64", "QAG_EVENTS_MAX_STREAMS": "60", "QAG_ACCESS_LOG": "on"})
    s.query("crowd", "SELECT id FROM t WHERE id = :n", "lite", parameters={"n": {"type": "int"}})
    alice, bob = s.key(uniq("alice"), connections=["lite"]), s.key(uniq("bob"), connections=["lite"])
    admins, alices, bobs = _open(s, 50), _open(s, 25, alice), _open(s, 25, bob)
    try:
        by_alice = {r.headers["x-request-id"] for r in _calls(s, 10, alice, "crowd")}
        by_bob = {r.headers["x-request-id"] for r in _calls(s, 10, bob, "crowd")}
        for stream in admins:
            wait_for(lambda: by_alice | by_bob <= stream.request_ids(), "an administrator's stream has every run")
        for stream in alices:
            wait_for(lambda: by_alice <= stream.request_ids(), "alice's stream has her runs")
        for stream in bobs:
            wait_for(lambda: by_bob <= stream.request_ids(), "bob's stream has his runs")
        assert all(not (st.request_ids() & by_bob) for st in alices)
        assert all(not (st.request_ids() & by_alice) for st in bobs)
        assert all(len(st.events) == 20 for st in admins)   # each run once, none twice
    finally:
        for stream in admins + alices + bobs:
            stream.close()


def test_with_redis_every_instances_runs_reach_every_instances_streams_once(make_server, pg_store_url):
    from tests.services import redis_url
    url = redis_url()
    deployment = {"QAG_REDIS_URL": url, "QAG_DATABASE_URL": pg_store_url}
    one = make_server(env=deployment)
    two = make_server(env=deployment, seed=False)   # the same store: `lite` resolves in its own home
    two.sqlite_db("lite.db", SEED)
    other = make_server(env={"QAG_REDIS_URL": url})  # another deployment (a store of its own) on the same Redis
    for s in (one, other):
        s.query("ev_films", "SELECT id, name FROM t WHERE id <= :n ORDER BY id", "lite",
                parameters={"n": {"type": "int", "default": 2}})
    (on_one,), (on_two,), (on_other,) = _open(one, 1), _open(two, 1), _open(other, 1)
    try:
        # The relays subscribe and announce themselves, and every worker looks at the announcement once a second:
        # until then a run stays on its own host (live only). Batches until one crosses whole, both ways.
        def a_batch_crosses() -> bool:
            batch = {r.headers["x-request-id"] for r in _calls(one, 4) + _calls(two, 4)}
            time.sleep(1.0)
            return batch <= on_one.request_ids() and batch <= on_two.request_ids()
        wait_for(a_batch_crosses, "the relays running", 40)
        from_one = {r.headers["x-request-id"] for r in _calls(one, 6)}
        from_two = {r.headers["x-request-id"] for r in _calls(two, 6)}
        for stream in (on_one, on_two):
            wait_for(lambda: from_one | from_two <= stream.request_ids(), "both instances' runs on each stream")
        time.sleep(0.5)
        for stream in (on_one, on_two):
            ids = [e["entry"]["request_id"] for e in stream.events if e["entry"]["request_id"] in from_one | from_two]
            assert len(ids) == len(set(ids)) == 12, "an event came twice"
        assert not (from_one | from_two) & on_other.request_ids(), "another deployment's runs reached a stream"
    finally:
        on_one.close()
        on_two.close()
        on_other.close()
