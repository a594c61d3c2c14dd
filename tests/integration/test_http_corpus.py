"""The malformed-HTTP corpus (tests/cases/http) against real servers on gunicorn's gthread worker and qag's worker."""

from __future__ import annotations

import codecs
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest

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
    # 501 is RFC 9112's answer to a transfer coding the server doesn't implement (gthread gives it)
    return 400 <= code < 500 or code == 501


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
    assert not any(code >= 500 and code != 501 for code in statuses), answer[:300]
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
    if http_server.worker_class == "qag" and statuses and statuses[0] >= 400 and expect == "refuse":
        # qag's worker refuses in qag's error envelope, with a stable code (docs/errors.md)
        head, body = answer.split(b"\r\n\r\n", 1)
        envelope = json.loads(body)
        # the envelope's request id is the response's X-Request-Id (contract 0.4), with the security headers (0.5)
        assert b"\r\nX-Request-Id: %s\r\n" % envelope["request_id"].encode() in head, answer
        assert b"\r\nX-Content-Type-Options: nosniff\r\n" in head, answer
        assert envelope["code"] in ("malformed_http", "request_line_too_long", "header_fields_too_large",
                                            "expectation_failed", "method_not_allowed", "payload_too_large"), answer
    # never a crash: the same worker process, and a new connection is served
    assert worker_pids(http_server) == http_server.pids
    assert http_server.get("/health").status == 200
