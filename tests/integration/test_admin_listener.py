"""QAG_ADMIN_BIND: /metrics only on the operators' listener, which serves nothing but the operator routes."""

from __future__ import annotations

import http.client
import re

import pytest

from tests.server import q, wait_for

pytestmark = pytest.mark.e2e


def _get(port: int, path: str, key: str | None = None) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"X-API-Key": key} if key else {})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("worker_class", ["qag", "gthread"])
def test_metrics_move_to_the_admin_listener(make_server, worker_class):
    server = make_server(env={"QAG_ADMIN_BIND": "127.0.0.1:0", "QAG_WORKER_CLASS": worker_class})
    line = wait_for(lambda: next((l for l in server.log if l.startswith("qag: listening on")), None), "the line")
    m = re.match(r"qag: listening on http://127\.0\.0\.1:(\d+); operator routes \(QAG_ADMIN_BIND\) on "
                 r"http://127\.0\.0\.1:(\d+)$", line.strip())
    assert m, line
    api, admin = int(m.group(1)), int(m.group(2))
    assert api == server.port and admin != api
    # The API listener: everything but /metrics (public there by the contract's default, so it moves).
    assert _get(api, "/metrics") == 404
    assert _get(api, "/metrics", server.admin_key) == 404
    assert [_get(api, p) for p in ("/health", "/livez", "/readyz")] == [200, 200, 200]
    assert server.get(q("customers")).status in (200, 404)
    # The admin listener: the operator routes, nothing else.
    assert _get(admin, "/metrics") == 200
    assert [_get(admin, p) for p in ("/health", "/livez", "/readyz")] == [200, 200, 200]
    for path in ("/api/v1/queries", "/q/customers", "/openapi.json", "/docs", "/"):
        assert _get(admin, path, server.admin_key) == 404, path


def test_without_admin_bind_metrics_stay_on_the_api_port(server):
    assert server.get("/metrics", key=None).status == 200


@pytest.mark.parametrize("worker_class", ["qag", "gthread"])
def test_no_spelling_of_metrics_reaches_it_on_the_api_listener(make_server, worker_class):
    """The router reads //metrics and /%6Detrics as /metrics (it read /metrics/ and /metrics%2F so too): the API
    listener refused only the one spelling, and the others answered every key's and connection's series to anyone."""
    server = make_server(env={"QAG_ADMIN_BIND": "127.0.0.1:0", "QAG_WORKER_CLASS": worker_class})
    line = wait_for(lambda: next((l for l in server.log if l.startswith("qag: listening on")), None), "the line")
    admin = int(re.search(r"QAG_ADMIN_BIND\) on http://127\.0\.0\.1:(\d+)", line).group(1))
    for path in ("/metrics", "//metrics", "/%6Detrics"):
        assert _get(server.port, path) == 404, path
        assert _get(admin, path) == 200, path
    # A trailing slash names no route (as in QueryAPIGate): those spellings reach /metrics on neither listener.
    for path in ("/metrics/", "/metrics%2F", "/metrics//"):
        assert _get(server.port, path) == 401 and _get(admin, path) == 404, path


def _free_port_on_both(*hosts: str) -> int:
    import socket
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((hosts[0], 0))
            port = probe.getsockname()[1]
        try:
            held = []
            for host in hosts:
                s = socket.socket()
                held.append(s)
                s.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise AssertionError("no port free on every host")


def test_an_admin_listener_on_another_address_with_the_same_port(make_server):
    """The admin listener was told apart by port alone: bound to 127.0.0.2 on the API's port, it made the API
    listener the operators' (/metrics public there, every API route 404)."""
    port = _free_port_on_both("127.0.0.1", "127.0.0.2")
    server = make_server(env={"QAG_BIND": f"127.0.0.1:{port}", "QAG_ADMIN_BIND": f"127.0.0.2:{port}"})
    assert server.port == port
    assert _get(port, "/metrics") == 404
    assert server.get(q("customers")).status in (200, 404) and server.get("/api/v1/me").status == 200
    conn = http.client.HTTPConnection("127.0.0.2", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
