"""The malformed-HTTP corpus (tests/cases/http) against real servers on gunicorn's gthread worker and qag's worker."""

from __future__ import annotations

import codecs
import json
import os
import re
import socket
import threading
import time
from pathlib import Path

import pytest

from qag.errors import ERRORS
from tests.server import Server

pytestmark = pytest.mark.e2e

CASES = Path(__file__).resolve().parents[1] / "cases" / "http" / "requests.tsv"
_STATUS = re.compile(rb"HTTP/1\.[01] (\d{3}) ")


def _cases():
    for line in CASES.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, expect, raw = line.split("\t")
        data = codecs.decode(raw, "unicode_escape").encode("latin-1")
        data = re.sub(rb"\[\[(.)\*(\d+)\]\]", lambda m: m.group(1) * int(m.group(2)), data)
        yield pytest.param(expect, data, id=name)


def worker_pids(server: Server) -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == server.proc.pid:
                pids.add(int(entry))
    return pids


def exchange(server: Server, data: bytes, wait: float = 3.0) -> bytes:
    """Send raw bytes on a fresh socket; what came back until the server closed (or `wait` passed)."""
    with socket.create_connection((server.host, server.port), timeout=wait) as sock:
        try:
            sock.sendall(data)
        except OSError:
            pass   # the server may refuse and close before reading it all
        chunks = []
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        except (socket.timeout, ConnectionResetError):
            pass
    return b"".join(chunks)


def _refusal(code: int) -> bool:
    return 400 <= code < 500


@pytest.fixture(scope="module", params=["gthread", "qag"])
def http_server(request):
    s = Server(env={"QAG_WORKER_CLASS": request.param}, workers=1, threads=4)
    s.pids = worker_pids(s)
    s.worker_class = request.param
    assert len(s.pids) == 1
    yield s
    s.close()


@pytest.mark.parametrize("expect,data", list(_cases()))
def test_corpus(http_server, expect, data):
    answer = exchange(http_server, data)
    statuses = [int(code) for code in _STATUS.findall(answer)]
    assert not any(code >= 500 for code in statuses), answer[:300]
    if expect == "refuse":
        assert all(_refusal(code) for code in statuses), answer[:300]
    elif expect.startswith("ok:"):
        assert len(statuses) == int(expect[3:]) and all(200 <= c < 300 for c in statuses), answer[:300]
    elif expect.startswith("answered:"):
        assert len(statuses) == int(expect[9:]), answer[:300]
    elif expect == "ok-then-refuse":
        assert statuses[:1] == [200] and all(_refusal(c) for c in statuses[1:]), answer[:300]
    else:
        assert expect == "ok-or-refuse"
    if statuses and statuses[0] >= 400 and expect == "refuse":
        # both worker classes refuse in qag's error envelope, with a stable code (docs/errors.md), not gunicorn's
        # HTML page
        head, body = answer.split(b"\r\n\r\n", 1)
        envelope = json.loads(body)
        # the envelope's request id is the response's X-Request-Id (contract 0.4), with the security headers (0.5)
        assert b"\r\nX-Request-Id: %s\r\n" % envelope["request_id"].encode() in head, answer
        assert b"\r\nX-Content-Type-Options: nosniff\r\n" in head, answer
        if http_server.worker_class == "qag":   # refused by the worker itself, before the app
            assert envelope["code"] in ("malformed_http", "request_line_too_long", "header_fields_too_large",
                                        "expectation_failed", "method_not_allowed", "payload_too_large"), answer
        else:   # gunicorn passes some of these to the app (a CONNECT, a body it reads later): the app's code
            assert envelope["code"] in ERRORS, answer
    # never a crash: the same worker process, and a new connection is served
    assert worker_pids(http_server) == http_server.pids
    assert http_server.get("/health").status == 200


@pytest.mark.parametrize("worker_class", ["gthread", "qag"])
def test_clients_that_send_half_a_request_hold_no_thread_for_long(worker_class):
    """More half-sent heads and bodies than the worker has threads: the server still answers a new client, and
    closes the silent ones once QAG_CLIENT_TIMEOUT passes (gthread read them in its pool threads with no limit:
    16 such sockets stopped a 2-worker server for as long as they stayed open)."""
    s = Server(env={"QAG_WORKER_CLASS": worker_class, "QAG_CLIENT_TIMEOUT": "2"}, workers=1, threads=2)
    silent = []
    try:
        for i in range(6):
            sock = socket.create_connection((s.host, s.port), timeout=15)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" if i % 2 else
                         b"POST /api/v1/queries HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{\"name\":")
            silent.append(sock)
        started = time.monotonic()
        assert s.get("/health").status == 200
        for sock in silent:                    # each is closed by the server, with or without a refusal first
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            assert answer == b"" or re.match(rb"HTTP/1\.1 4\d\d ", answer), answer[:200]
        assert time.monotonic() - started < 15
        assert s.get("/health").status == 200
    finally:
        for sock in silent:
            sock.close()
        s.close()


@pytest.mark.parametrize("worker_class", ["gthread", "qag"])
def test_clients_that_trickle_a_request_hold_no_thread_for_long(worker_class):
    """More clients than threads sending a body a byte at a time (each byte well within QAG_CLIENT_TIMEOUT): a
    request has the client timeout in all, so they are cut and a new client is answered. gthread read each byte
    with its own timeout, and drained a body the app had not read the same way."""
    s = Server(env={"QAG_WORKER_CLASS": worker_class, "QAG_CLIENT_TIMEOUT": "2"}, workers=1, threads=2)
    socks, stop = [], threading.Event()

    def trickle(sock: socket.socket) -> None:
        try:
            while not stop.is_set():
                sock.sendall(b"x")
                stop.wait(0.5)
        except OSError:
            return   # cut by the server
    try:
        for path in ("/health", "/api/v1/queries", "/health", "/api/v1/queries"):
            sock = socket.create_connection((s.host, s.port), timeout=15)
            sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nX-API-Key: %s\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100000\r\n\r\n" % (path.encode(), s.admin_key.encode()))
            socks.append(sock)
            threading.Thread(target=trickle, args=(sock,), daemon=True).start()
        started = time.monotonic()
        assert s.get("/health").status == 200
        for sock in socks:      # each cut: answered (a 4xx, or the route's refusal) and closed, or just closed
            answer = b""
            try:
                while chunk := sock.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                pass
            assert answer == b"" or re.match(rb"HTTP/1\.1 4\d\d ", answer), answer[:200]
        assert time.monotonic() - started < 15
        assert s.get("/health").status == 200
    finally:
        stop.set()
        for sock in socks:
            sock.close()
        s.close()


@pytest.mark.parametrize("worker_class", ["gthread", "qag"])
def test_clients_that_keep_a_closed_connection_open_hold_up_no_one(worker_class):
    """After an answer with Connection: close the server lingers a moment for the client to read it (gunicorn: 2 s,
    on gthread's main thread); a client that keeps its end open must not stretch that to QAG_CLIENT_TIMEOUT, which
    held the whole worker (no accepts, no keep-alive) meanwhile."""
    s = Server(env={"QAG_WORKER_CLASS": worker_class, "QAG_CLIENT_TIMEOUT": "30"}, workers=1, threads=4)
    held = []
    try:
        for _ in range(3):
            sock = socket.create_connection((s.host, s.port), timeout=15)
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
            held.append(sock)                      # read, never closed
        started = time.monotonic()
        for _ in range(3):
            assert s.get("/health").status == 200
        assert time.monotonic() - started < 10     # each lingering close ends within seconds, not 30
    finally:
        for sock in held:
            sock.close()
        s.close()
