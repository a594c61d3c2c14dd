"""Contract 8.6: `qag events`, the standalone SSE server, beside a real gunicorn with two workers on the same
store - every worker's runs with their event ids, resume with Last-Event-ID with no gap or repeat, a key's own
runs only and none from before the key, filters, the connection cap, /health, /metrics, 404 and 405; judged as the
main server judges a request: open mode for this machine only, QAG_TRUST_PROXY's client address, QAG_RATE_LIMIT on
connection attempts, CORS."""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from types import SimpleNamespace

import pytest

from tests.server import q, terminate, wait_for
from tests.services import redis_url

pytestmark = pytest.mark.e2e

_LISTENING = re.compile(r"qag events: listening at http://([\d.]+):(\d+)")


class EventsProcess:
    """`qag events` on a server's home (and store), on a free port; `host`: its --host (default loopback)."""

    def __init__(self, server, host: str | None = None, **env):
        full = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
        full.update({"QAG_HOME": server.home, "QAG_EVENTS_POLL_INTERVAL": "0.1"})
        if server.admin_key is not None:   # None: open mode, when the store holds no key either
            full["QAG_API_KEY"] = server.admin_key
        if server.database_url:
            full["QAG_DATABASE_URL"] = server.database_url
        if "QAG_SPEEDUPS" in os.environ:
            full["QAG_SPEEDUPS"] = os.environ["QAG_SPEEDUPS"]
        full.update(env)
        self.proc = subprocess.Popen([sys.executable, "-m", "qag", "events", "--port", "0"]
                                     + (["--host", host] if host else []), env=full,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=server.home)
        line = self.proc.stdout.readline()
        m = _LISTENING.search(line)
        assert m, line + self.proc.stdout.read()
        self.host, self.port = m.group(1), int(m.group(2))
        if self.host == "0.0.0.0":
            self.host = "127.0.0.1"   # every address: reached on loopback unless a test names another
        self.admin_key = server.admin_key

    def request(self, method: str, path: str, key="admin", headers=None, address: str | None = None):
        conn = http.client.HTTPConnection(address or self.host, self.port, timeout=10)
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
    """Contract 8.6 and QueryAPIGate 0.43 (probed): every error body has its code, and every answer but a stream
    says Cache-Control: no-store."""
    _, events = pair
    status, headers, body = events.request("GET", "/health", key=None)
    assert status == 200 and set(json.loads(body)) == {"status", "connections", "delivered"}
    assert headers["cache-control"] == "no-store"
    status, headers, body = events.request("GET", "/nope")
    assert (status, json.loads(body), headers["cache-control"]) == \
        (404, {"error": "Not found", "code": "not_found"}, "no-store")
    status, headers, body = events.request("POST", "/events")
    assert status == 405 and headers["allow"] == "GET" and headers["cache-control"] == "no-store"
    assert json.loads(body) == {"error": "Method not allowed", "code": "method_not_allowed"}
    challenge = 'ApiKey realm="qag", name="X-API-Key", in="header"'
    status, headers, body = events.request("GET", "/events", key=None)
    assert status == 401 and json.loads(body) == {"error": "Unauthorized", "code": "unauthorized"}
    assert headers["www-authenticate"] == challenge and headers["cache-control"] == "no-store"
    status, headers, _ = events.request("GET", "/events", key="wrong")
    assert status == 401 and headers["www-authenticate"] == challenge
    status, headers, body = events.request("GET", "/events?status=failed")
    assert status == 400 and json.loads(body)["code"] == "invalid_filter" and headers["cache-control"] == "no-store"
    status, headers, body = events.request("GET", "/metrics", key=None)
    assert status == 200 and b"queryapigate_events_streams" in body and headers["cache-control"] == "no-store"


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
    if reply:
        assert json.loads(reply.partition(b"\r\n\r\n")[2])["code"] == "malformed_http"
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


def _this_machines_address() -> str:
    """An IPv4 address of this machine that is not loopback (a connection to it has a non-loopback peer)."""
    for target in ("192.0.2.1", "10.255.255.255", "198.51.100.1"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.connect((target, 9))   # a datagram socket sends nothing: this only picks the route's address
            except OSError:
                continue
            address = probe.getsockname()[0]
            if not address.startswith("127."):
                return address
    pytest.skip("this machine has no non-loopback IPv4 address to be a remote peer from")


def test_open_mode_serves_this_machine_only(tmp_path):
    """Contract 1.4 on `qag events` (no admin key, no key stored): a remote peer, a Host that is not loopback (DNS
    rebinding), a cross-origin browser request and one a proxy on this machine relays for a client elsewhere are
    refused 403 open_access_remote, as by the gateway."""
    address = _this_machines_address()
    events = EventsProcess(SimpleNamespace(home=str(tmp_path), admin_key=None, database_url=None), host="0.0.0.0")
    try:
        status, _, body = events.request("GET", "/events", key=None, address=address)
        assert status == 403 and json.loads(body)["code"] == "open_access_remote"
        assert events.request("GET", "/health", key=None, address=address)[0] == 200   # public, as the gateway's
        rebound = f"rebind.attacker.example:{events.port}"
        for headers in ({"Host": rebound, "Origin": f"http://{rebound}"}, {"Host": rebound},
                        {"Origin": "https://evil.example"}, {"X-Forwarded-For": "203.0.113.9"},
                        {"Forwarded": "for=203.0.113.9"}):
            status, _, body = events.request("GET", "/events", key=None, headers=headers)
            assert status == 403 and json.loads(body)["code"] == "open_access_remote", headers
        stream = Stream(events, key=None, headers={"Host": f"localhost:{events.port}"})
        try:
            assert stream.status == 200 and stream.headers["content-type"] == "text/event-stream"
        finally:
            stream.close()
    finally:
        events.close()


def test_allowed_ips_are_judged_on_the_trusted_proxy_hop(pair, uniq):
    """QAG_TRUST_PROXY: a key's allowed_ips are judged on X-Forwarded-For's trusted hop, as by the gateway."""
    server, untrusting = pair
    key = server.key(uniq("evproxy"), connections=["lite"], allowed_ips=["203.0.113.7"])
    forwarded = {"X-Forwarded-For": "203.0.113.7"}
    assert untrusting.request("GET", "/events", key=key, headers=forwarded)[0] == 401   # 0 hops: the socket peer
    events = EventsProcess(server, QAG_TRUST_PROXY="1")
    try:
        stream = Stream(events, key=key, headers=forwarded)
        try:
            assert stream.status == 200
        finally:
            stream.close()
        assert events.request("GET", "/events", key=key)[0] == 401   # no hop: the socket peer, 127.0.0.1
        # The last hop is the one the trusted proxy wrote; what the client put before it is not judged.
        assert events.request("GET", "/events", key=key,
                              headers={"X-Forwarded-For": "203.0.113.7, 198.51.100.9"})[0] == 401
    finally:
        events.close()


def test_connection_attempts_spend_the_server_wide_rate_limit(pair):
    """QAG_RATE_LIMIT: one token of the client address's bucket per attempt, before authentication (wrong keys
    count); /health and /metrics are exempt."""
    server, _ = pair
    events = EventsProcess(server, QAG_RATE_LIMIT="3/minute")
    try:
        replies = [events.request("GET", "/events", key=f"wrong-{i}") for i in range(6)]
        assert [status for status, _, _ in replies] == [401, 401, 401, 429, 429, 429]
        assert [headers["x-ratelimit-remaining"] for _, headers, _ in replies[:3]] == ["2", "1", "0"]
        status, headers, body = replies[3]
        refusal = json.loads(body)
        assert refusal["code"] == "rate_limited" and int(headers["retry-after"]) == refusal["retry_after"] >= 1
        assert headers["x-ratelimit-limit"] == "3"
        assert events.request("GET", "/events")[0] == 429    # the right key too: the address is out of tokens
        for path in ("/health", "/metrics"):
            assert events.request("GET", path, key=None)[0] == 200
    finally:
        events.close()


def test_metrics_with_a_token_spends_the_rate_limit_like_events(pair):
    """With QAG_METRICS_TOKEN, /metrics takes the admin key: each attempt spends the address's budget (it tested
    admin keys at any rate); without a token it stays open and exempt."""
    server, _ = pair
    token = "events-metrics-" + "t" * 20
    events = EventsProcess(server, QAG_RATE_LIMIT="3/minute", QAG_METRICS_TOKEN=token)
    try:
        replies = [events.request("GET", "/metrics", key=f"wrong-{i}") for i in range(5)]
        assert [status for status, _, _ in replies] == [401, 401, 401, 429, 429]
        assert json.loads(replies[0][2]) == {"error": "Unauthorized", "code": "unauthorized"}
        assert events.request("GET", "/metrics")[0] == 429                 # the right admin key: out of tokens
        assert events.request("GET", "/metrics", key=None, headers={"Authorization": f"Bearer {token}"})[0] == 429
        assert events.request("GET", "/health", key=None)[0] == 200
    finally:
        events.close()


def test_the_rate_limit_is_the_main_servers_bucket_in_redis(make_server):
    """With QAG_REDIS_URL the attempts spend the same bucket as the client's calls to the main server."""
    env = {"QAG_REDIS_URL": redis_url(), "QAG_RATE_LIMIT": "4/minute", "QAG_TRUST_PROXY": "1"}
    server = make_server(env=env, workers=1)
    events = EventsProcess(server, **env)
    client = {"X-Forwarded-For": "203.0.113.44"}
    try:
        assert [server.get("/api/v1/connections", headers=client).status for _ in range(3)] == [200, 200, 200]
        status, headers, _ = events.request("GET", "/events", key="wrong", headers=client)
        assert status == 401 and headers["x-ratelimit-remaining"] == "0"
        assert events.request("GET", "/events", headers=client)[0] == 429
        assert server.get("/api/v1/connections", headers=client).status == 429
        assert events.request("GET", "/events", key="wrong", headers={"X-Forwarded-For": "203.0.113.45"})[0] == 401
    finally:
        events.close()


def test_cors_when_configured(pair):
    """QAG_CORS_ORIGINS: an allowed origin's stream and refusals carry the gateway's CORS headers, and a preflight
    is answered 204 (it was 405)."""
    server, _ = pair
    events = EventsProcess(server, QAG_CORS_ORIGINS="https://app.example")
    origin = {"Origin": "https://app.example"}
    try:
        stream = Stream(events, headers=origin)
        try:
            assert stream.status == 200 and stream.headers["access-control-allow-origin"] == "https://app.example"
            assert stream.headers["vary"] == "Origin" and "access-control-expose-headers" in stream.headers
        finally:
            stream.close()
        status, headers, _ = events.request("GET", "/events", key="wrong", headers=origin)
        assert status == 401 and headers["access-control-allow-origin"] == "https://app.example"
        status, headers, _ = events.request("OPTIONS", "/events", key=None, headers={
            **origin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-api-key"})
        assert status == 204 and headers["access-control-allow-origin"] == "https://app.example"
        assert "X-API-Key" in headers["access-control-allow-headers"] and "GET" in headers["access-control-allow-methods"]
        status, headers, _ = events.request("GET", "/events", key="wrong", headers={"Origin": "https://evil.example"})
        assert status == 401 and "access-control-allow-origin" not in headers
        assert events.request("OPTIONS", "/events", key=None)[0] == 405   # no preflight: as any other method
    finally:
        events.close()


def test_a_last_event_id_that_is_no_ascii_number_means_live_only(pair):
    """Other scripts' digits ("²": str.isdigit takes it, int() does not; "٣": int() reads it), more digits than
    int() reads and an id beyond the store's 64 bits are non-numeric: the stream is live only (the handler crashed
    without an answer, or after its first chunk)."""
    server, events = pair
    reference = Stream(events)
    try:
        before = _runs(server, 6)   # handed out before each stream below opens: only a replay would send them
        wait_for(lambda: set(before) <= set(reference.request_ids()), "the runs before")
    finally:
        reference.close()
    header_values = ("²", "9" * 5000, "9" * 20)
    cases = [("header", v) for v in header_values] + [("query", v) for v in header_values + ("٣", "1²")]
    for where, value in cases:
        if where == "header":   # the value's bytes as sent (latin-1), read back as the same text by the server
            stream = Stream(events, headers={"Last-Event-ID": value.encode("latin-1")})
        else:
            stream = Stream(events, path="/events?last_event_id=" + urllib.parse.quote(value))
        try:
            assert stream.status == 200, (where, value[:10])
            ran = _runs(server, 1)
            wait_for(lambda: set(ran) <= set(stream.request_ids()), f"the run, live ({where}, {value[:10]})")
            assert not set(before) & set(stream.request_ids()), (where, value[:10])
        finally:
            stream.close()
