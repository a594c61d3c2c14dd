"""Contract 8.6: `qag events`, the standalone SSE server, beside a real gunicorn with two workers on the same
store - every worker's runs with their event ids, resume with Last-Event-ID with no gap or repeat, a key's own
runs only and none from before the key, filters, the connection cap, /health, /metrics, 404 and 405."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from tests.server import q, terminate, wait_for

pytestmark = pytest.mark.e2e

_LISTENING = re.compile(r"qag events: listening at http://([\d.]+):(\d+)")


class EventsProcess:
    """`qag events` on a server's home (and store), on a free port."""

    def __init__(self, server, **env):
        full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
        full.update({"QAG_HOME": server.home, "QAG_API_KEY": server.admin_key, "QAG_EVENTS_POLL_INTERVAL": "0.1"})
        if server.database_url:
            full["QAG_DATABASE_URL"] = server.database_url
        if "QAG_SPEEDUPS" in os.environ:
            full["QAG_SPEEDUPS"] = os.environ["QAG_SPEEDUPS"]
        full.update(env)
        self.proc = subprocess.Popen([sys.executable, "-m", "qag", "events", "--port", "0"], env=full,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=server.home)
        line = self.proc.stdout.readline()
        m = _LISTENING.search(line)
        assert m, line + self.proc.stdout.read()
        self.host, self.port = m.group(1), int(m.group(2))
        self.admin_key = server.admin_key

    def request(self, method: str, path: str, key="admin", headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["X-API-Key"] = self.admin_key if key == "admin" else key
        conn.request(method, path, headers=all_headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def close(self) -> None:
        terminate(self.proc)


class Stream:
    """A client of `qag events`: (id, event) pairs and comment lines, read on a thread."""

    def __init__(self, events: EventsProcess, key="admin", path="/events", headers=None):
        self.conn = http.client.HTTPConnection(events.host, events.port, timeout=60)
        all_headers = dict(headers or {})
        if key is not None:
            all_headers["X-API-Key"] = events.admin_key if key == "admin" else key
        self.conn.request("GET", path, headers=all_headers)
        self.response = self.conn.getresponse()
        self.status = self.response.status
        self.headers = {k.lower(): v for k, v in self.response.getheaders()}
        self.items: list[tuple[int, dict]] = []
        self.lines: list[str] = []
        if self.status == 200:
            threading.Thread(target=self._read, daemon=True).start()
        else:
            self.body = self.response.read()

    def _read(self) -> None:
        current = None
        try:
            for raw in iter(self.response.readline, b""):
                line = raw.decode().rstrip("\n")
                self.lines.append(line)
                if line.startswith("id: "):
                    current = int(line[4:])
                elif line.startswith("data: "):
                    self.items.append((current, json.loads(line[6:])))
        except Exception:   # noqa: BLE001 - closed under the reader
            pass

    def request_ids(self) -> list[str]:
        return [e["entry"]["request_id"] for _, e in self.items]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def pair(make_module_server):
    server = make_module_server(env={"QAG_HISTORY_FLUSH_INTERVAL": "0.05"})
    server.query("es_q", "SELECT id FROM t WHERE id = :n", "lite", parameters={"n": {"type": "int"}})
    events = EventsProcess(server)
    yield server, events
    events.close()


def _runs(server, n: int, key="admin") -> list[str]:
    ids = []
    for i in range(n):
        r = server.get(q("es_q"), params={"n": 1 + i % 5}, key=key)
        assert r.status == 200, r
        ids.append(r.headers["x-request-id"])
    return ids


def test_routes_health_and_refusals(pair):
    _, events = pair
    status, _, body = events.request("GET", "/health", key=None)
    assert status == 200 and set(json.loads(body)) == {"status", "connections", "delivered"}
    assert events.request("GET", "/nope")[0] == 404 and json.loads(events.request("GET", "/nope")[2]) == \
        {"error": "Not found"}
    status, headers, _ = events.request("POST", "/events")
    assert status == 405 and headers["allow"] == "GET"
    challenge = 'ApiKey realm="qag", name="X-API-Key", in="header"'
    status, headers, body = events.request("GET", "/events", key=None)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
    assert headers["www-authenticate"] == challenge
    status, headers, _ = events.request("GET", "/events", key="wrong")
    assert status == 401 and headers["www-authenticate"] == challenge
    status, _, body = events.request("GET", "/events?status=failed")
    assert status == 400 and json.loads(body)["code"] == "invalid_filter"
    status, headers, body = events.request("GET", "/metrics", key=None)
    assert status == 200 and b"queryapigate_events_streams" in body


def test_every_workers_runs_arrive_once_in_id_order_with_retry_first(pair):
    server, events = pair
    stream = Stream(events)
    try:
        assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        assert stream.headers["cache-control"] == "no-cache" and stream.headers["x-accel-buffering"] == "no"
        wait_for(lambda: stream.lines[:1] == ["retry: 3000"], "the retry line first")
        ids = _runs(server, 12)
        wait_for(lambda: set(ids) <= set(stream.request_ids()), "every run on the stream")
        mine = [(i, e) for i, e in stream.items if e["entry"]["request_id"] in ids]
        assert sorted(e["entry"]["request_id"] for _, e in mine) == sorted(ids)   # each exactly once
        assert [i for i, _ in mine] == sorted(i for i, _ in mine)     # in event-id order (the order written)
        assert mine[0][1]["type"] == "query.run" and mine[0][1]["query"] == "es_q"
    finally:
        stream.close()


def test_resume_with_last_event_id_has_no_gap_and_no_repeat(pair):
    server, events = pair
    first = Stream(events)
    try:
        before = _runs(server, 5)
        wait_for(lambda: set(before) <= set(first.request_ids()), "the first runs")
        resume_after = next(i for i, e in first.items if e["entry"]["request_id"] == before[1])
        writer = threading.Thread(target=_runs, args=(server, 20))
        writer.start()                                      # runs go on while the client resumes
        resumed = Stream(events, headers={"Last-Event-ID": str(resume_after)})
        writer.join()
        after = _runs(server, 3)
        wait_for(lambda: set(after) <= set(resumed.request_ids()), "live after the replay")
        ids = [i for i, _ in resumed.items]
        assert len(ids) == len(set(ids)), "an event came twice"
        assert ids == sorted(ids) and ids[0] == resume_after + 1
        assert ids == list(range(resume_after + 1, ids[-1] + 1)), "a gap"   # every id: one admin sees all
        query_param = Stream(events, path=f"/events?last_event_id={resume_after}")
        wait_for(lambda: len(query_param.items) >= len(ids), "the same replay by ?last_event_id")
        assert [i for i, _ in query_param.items][:len(ids)] == ids
        query_param.close()
        resumed.close()
    finally:
        first.close()


def test_a_key_sees_its_own_runs_and_none_from_before_it_was_created(pair, uniq):
    server, events = pair
    name = uniq("evkey")
    old = server.key(name, connections=["lite"])
    old_runs = _runs(server, 3, old)
    assert server.request("DELETE", f"/api/v1/api-keys/{name}").status in (200, 204)
    time.sleep(1.1)                                        # created_at has one-second resolution
    new = server.key(name, connections=["lite"])
    other = server.key(uniq("evother"), connections=["lite"])
    stream = Stream(events, key=new, headers={"Last-Event-ID": "0"})   # everything it may see, from the start
    admin = Stream(events, headers={"Last-Event-ID": "0"})
    try:
        new_runs = _runs(server, 3, new)
        other_runs = _runs(server, 2, other)
        wait_for(lambda: set(new_runs) <= set(stream.request_ids()), "the key's own runs")
        wait_for(lambda: set(old_runs + new_runs + other_runs) <= set(admin.request_ids()), "all runs, admin")
        time.sleep(0.3)
        seen = set(stream.request_ids())
        assert not seen & set(old_runs), "a re-created key inherited the old key's runs"
        assert not seen & set(other_runs)
        assert {e["entry"]["key_name"] for _, e in stream.items} == {name}
    finally:
        stream.close()
        admin.close()


def test_filters_narrow_the_stream(pair):
    server, events = pair
    adhoc = Stream(events, path="/events?kind=adhoc")
    try:
        saved = _runs(server, 2)
        r = server.post("/execute_sql", {"sql": "SELECT 7 AS seven", "connection_name": "lite"})
        wait_for(lambda: r.headers["x-request-id"] in adhoc.request_ids(), "the ad-hoc run")
        time.sleep(0.3)
        assert not set(saved) & set(adhoc.request_ids())
        assert all(e["kind"] == "adhoc" for _, e in adhoc.items)
    finally:
        adhoc.close()


def test_the_connection_cap_answers_503(make_module_server):
    server = make_module_server()
    events = EventsProcess(server, QAG_EVENTS_MAX_CONNECTIONS="2")
    streams = [Stream(events), Stream(events)]
    try:
        assert all(s.status == 200 for s in streams)
        third = Stream(events)
        assert third.status == 503 and third.headers["retry-after"] == "5"
        assert json.loads(third.body)["code"] == "too_many_streams"
        status, _, body = events.request("GET", "/health")
        assert json.loads(body)["connections"] == 2
    finally:
        for s in streams:
            s.close()
        events.close()


@pytest.mark.parametrize("head", [b"GARBAGE\r\n\r\n", b"GET /events HTTP/9\r\n\r\n", b"GET /events HTTP/1.1\r\nNo colon\r\n\r\n",
                                  b"GET /" + b"x" * 20000 + b" HTTP/1.1\r\n\r\n", b"\xff\xfe\r\n\r\n"])
def test_a_malformed_request_is_refused_and_the_server_goes_on(pair, head):
    _, events = pair
    import socket
    with socket.create_connection((events.host, events.port), timeout=10) as sock:
        sock.sendall(head)
        reply = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    assert reply == b"" or reply.startswith(b"HTTP/1.1 400 "), reply[:100]
    assert events.request("GET", "/health", key=None)[0] == 200


def test_signed_in_users_stream_their_own_runs(make_module_server, uniq):
    """Issue 23: `qag events` takes bearer tokens as the gateway does; a user sees only its own runs."""
    import jwt as pyjwt
    secret = "e" * 40
    env = {"QAG_JWT_SECRET": secret, "QAG_JWT_ROLE": "ev_reader", "QAG_HISTORY_FLUSH_INTERVAL": "0.05"}
    server = make_module_server(env=env)
    assert server.post("/api/v1/roles", {"name": "ev_reader", "connections": ["lite"]}).status == 201
    server.query("es_jwt", "SELECT 1 AS one", "lite")
    events = EventsProcess(server, QAG_JWT_SECRET=secret, QAG_JWT_ROLE="ev_reader")
    alice, bob = uniq("alice"), uniq("bob")

    def bearer(sub, exp=300):
        token = pyjwt.encode({"sub": sub, "exp": int(time.time()) + exp}, secret, algorithm="HS256")
        return {"Authorization": f"Bearer {token}"}

    try:
        status, headers, body = events.request("GET", "/events", key=None, headers=bearer(alice, exp=-600))
        assert status == 401 and json.loads(body)["code"] == "token_expired"
        assert 'error="invalid_token"' in headers["www-authenticate"]
        stream = Stream(events, key=None, headers=bearer(alice))
        assert stream.status == 200
        try:
            mine = [server.get(q("es_jwt"), key=None, headers=bearer(alice)).headers["x-request-id"] for _ in range(2)]
            theirs = server.get(q("es_jwt"), key=None, headers=bearer(bob)).headers["x-request-id"]
            wait_for(lambda: set(mine) <= set(stream.request_ids()), "alice's runs")
            time.sleep(0.3)
            assert theirs not in stream.request_ids()
            assert {e["entry"]["key_name"] for _, e in stream.items} == {f"jwt:{alice}"}
        finally:
            stream.close()
    finally:
        events.close()
