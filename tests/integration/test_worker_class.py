"""qag's gunicorn worker class under real gunicorn: WSGI conformance, streams, slow clients, graceful shutdown,
max_requests recycling, the timeout heartbeat and reload; the lifecycle tests run on gthread too, as the
reference."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.server import terminate

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QAG = "qag.worker.QagWorker"
FALLBACK = "tests.worker_app.SelectorWorker"   # the same worker on the selectors fallback
_LISTENING = re.compile(r"Listening at: http://([\d.]+):(\d+)")


class Gunicorn:
    """gunicorn serving tests/worker_app.py with the given worker class and options."""

    def __init__(self, worker: str, *args: str, env: dict | None = None):
        self.log_path = tempfile.mktemp(prefix="qag-worker-app-")
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("QAG_")}
        full_env.update({"WORKER_APP_LOG": self.log_path, "PYTHONPATH": str(ROOT)}, **(env or {}))
        self.proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-k", worker, "-b", "127.0.0.1:0",
                                      "--threads", "2", "-w", "1", "--no-control-socket", *args, "tests.worker_app:app"],
                                     env=full_env, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.lines: list[str] = []
        found = threading.Event()

        def pump():
            for line in self.proc.stderr:
                self.lines.append(line)
                m = _LISTENING.search(line)
                if m:
                    self.host, self.port = m.group(1), int(m.group(2))
                    found.set()
        threading.Thread(target=pump, daemon=True).start()
        if not found.wait(30):
            self.stop()
            raise RuntimeError("gunicorn did not start:\n" + "".join(self.lines))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:   # the worker has booted when it answers
            try:
                self.get("/pid")
                break
            except OSError:
                time.sleep(0.05)

    def get(self, path: str, method: str = "GET", body=None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
        finally:
            conn.close()

    def notes(self) -> list[str]:
        try:
            return Path(self.log_path).read_text().splitlines()
        except OSError:
            return []

    def stop(self) -> int:
        terminate(self.proc)
        try:
            os.unlink(self.log_path)
        except OSError:
            pass
        return self.proc.returncode


@pytest.fixture
def start():
    servers = []

    def make(worker: str = QAG, *args, **kw) -> Gunicorn:
        servers.append(Gunicorn(worker, *args, **kw))
        return servers[-1]
    yield make
    for s in servers:
        s.stop()


def raw(server: Gunicorn, data: bytes, wait: float = 3.0, read_for: float | None = None) -> bytes:
    with socket.create_connection((server.host, server.port), timeout=wait) as sock:
        sock.sendall(data)
        out = b""
        deadline = time.monotonic() + (read_for or wait)
        try:
            while time.monotonic() < deadline:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                out += chunk
        except socket.timeout:
            pass
    return out


# --- WSGI conformance ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_environ_and_bodies(start, worker):
    s = start(worker)
    status, _, body = s.get("/a%20b/c?x=1&y=%20", method="POST", body=b"hello",
                            headers={"Content-Type": "text/plain", "X-A": "1", "X_A": "smuggled"})
    env = json.loads(body)
    assert status == 200
    assert env["PATH_INFO"] == "/a b/c" and env["QUERY_STRING"] == "x=1&y=%20" and env["RAW_URI"] == "/a%20b/c?x=1&y=%20"
    assert env["SERVER_NAME"] == "127.0.0.1" and env["SERVER_PORT"] == str(s.port) and env["REMOTE_ADDR"] == "127.0.0.1"
    assert env["CONTENT_TYPE"] == "text/plain" and env["CONTENT_LENGTH"] == "5" and env["body"] == "hello"
    assert env["HTTP_X_A"] == "1"   # the underscore form is dropped, never merged
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1" and env["SCRIPT_NAME"] == "" and env["wsgi.url_scheme"] == "http"
    assert env["errors"]
    # chunked request body, with Expect: 100-continue answered before the body is sent
    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n"
                     b"Connection: close\r\n\r\n")
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200") and b'"body": "abcde"' in answer and b"Connection: close" in answer


def test_write_callable_exc_info_and_head(start):
    s = start()
    assert s.get("/write")[2] == b"one two three"
    status, _, body = s.get("/exc")
    assert status == 500 and body == b"handled"
    # an app that fails before its status line: the contract's envelope, no internal text, the usual headers
    status, headers, body = s.get("/raise")
    envelope = json.loads(body)
    assert status == 500 and list(envelope) == ["error", "code", "request_id"], body
    assert envelope["error"] == "An error occurred" and envelope["code"] == "internal_error"
    assert headers["x-request-id"] == envelope["request_id"] and headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store" and b"internal text" not in body
    assert s.get("/write")[2] == b"one two three"
    status, headers, body = s.get("/stream", method="HEAD")
    assert status == 200 and body == b""
    # HEAD never runs the stream: it is closed unread
    deadline = time.monotonic() + 5
    while "closed sent=0" not in s.notes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "closed sent=0" in s.notes()


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_a_refusal_mid_stream_cuts_the_body_and_logs_one_line(start, worker):
    s = start(worker)
    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        sock.sendall(b"GET /refused-mid-stream HTTP/1.1\r\nHost: h\r\n\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    # the body is cut (no last chunk), so the client can tell it from a whole one; the connection is closed
    assert answer.startswith(b"HTTP/1.1 200") and b"first\n" in answer and not answer.endswith(b"0\r\n\r\n")
    line = "GET /refused-mid-stream: the body ended early (502 connection_failed)"
    deadline = time.monotonic() + 5
    while not any(line in entry for entry in s.lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any(line in entry and "WARNING" in entry for entry in s.lines), s.lines
    assert not any("Traceback" in entry for entry in s.lines), "".join(s.lines)   # the app said what happened
    assert s.get("/write")[2] == b"one two three"


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_stream_is_chunked_and_closed_when_the_client_leaves(start, worker):
    s = start(worker)
    status, headers, body = s.get("/stream?n=3&pause=0")
    assert status == 200 and headers.get("transfer-encoding") == "chunked" and body == b"chunk 0\nchunk 1\nchunk 2\n"
    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        sock.sendall(b"GET /stream?n=100000&pause=0.01 HTTP/1.1\r\nHost: h\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")   # reset
    deadline = time.monotonic() + 10
    while not any(n.startswith("closed sent=") for n in s.notes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    sent = [int(n.split("=")[1]) for n in s.notes() if n.startswith("closed sent=")]
    assert sent and sent[0] < 100000


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_http10_and_keep_alive_rules(start, worker):
    s = start(worker)
    answer = raw(s, b"GET /pid HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer
    two = raw(s, b"GET /pid HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /pid HTTP/1.0\r\n\r\n")
    assert two.count(b"HTTP/1.1 200") == 2 and b"Connection: keep-alive" in two
    streamed = raw(s, b"GET /stream?n=2&pause=0 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert b"Transfer-Encoding" not in streamed and streamed.endswith(b"chunk 0\nchunk 1\n")   # ends by closing


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_slow_clients_hold_no_thread_and_time_out(start, worker):
    s = start(worker, "--keep-alive", "1", env={"QAG_CLIENT_TIMEOUT": "1"})
    slow = []
    for _ in range(6):   # more dribbling clients than the worker has threads (2)
        sock = socket.create_connection((s.host, s.port), timeout=5)
        sock.sendall(b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
        slow.append(sock)
    began = time.monotonic()
    assert s.get("/pid")[0] == 200
    assert time.monotonic() - began < 0.9   # not queued behind the slow ones
    for sock in slow:   # closed after the client timeout, without an answer
        assert sock.recv(100) == b""
        sock.close()
    idle = socket.create_connection((s.host, s.port), timeout=5)
    began = time.monotonic()
    assert idle.recv(100) == b"" and time.monotonic() - began < 3   # idle keep-alive: closed after --keep-alive
    idle.close()


def _bodies(sock: socket.socket, count: int, pause: float = 0.0) -> list[bytes]:
    """Read `count` whole responses (Content-Length framed) from a socket, sleeping `pause` after each read."""
    buf, bodies = b"", []
    while len(bodies) < count:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            length = int(re.search(rb"\r\nContent-Length: (\d+)\r\n", buf[:end + 2]).group(1))
            if len(buf) >= end + 4 + length:
                assert buf.startswith(b"HTTP/1.1 200 OK\r\n"), buf[:200]
                bodies.append(buf[end + 4:end + 4 + length])
                buf = buf[end + 4 + length:]
                continue
        chunk = sock.recv(65536)
        assert chunk, "closed before the answers were read"
        buf += chunk
        time.sleep(pause)
    return bodies


def _read_to_end(sock: socket.socket) -> int:
    """Read until the server closes (an end or a reset); how many bytes came."""
    total = 0
    try:
        while chunk := sock.recv(1 << 20):
            total += len(chunk)
    except ConnectionResetError:
        pass
    return total


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_clients_that_dont_read_their_answers_hold_no_thread(start, worker):
    """An answer the socket can't take at once is kept on the connection, not waited for in a pool thread: more
    clients than threads pipelining large answers and never reading don't stop the worker answering, and each is
    closed once the client timeout is over without progress; one that reads slowly but steadily is never cut; a
    reader that keeps up gets every byte of every answer it pipelined."""
    from tests.worker_app import big_body
    timeout, n = 3, 4_000_000
    s = start(worker, env={"QAG_CLIENT_TIMEOUT": str(timeout)})

    def pipelined(tags: list[str], small_buffer: bool = True) -> socket.socket:
        sock = socket.socket()
        if small_buffer:   # the kernel's buffers can't hold an answer: the server's send stalls
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10)
        sock.connect((s.host, s.port))
        sock.sendall(b"".join(f"GET /big?n={n}&tag={tag} HTTP/1.1\r\nHost: h\r\n\r\n".encode() for tag in tags))
        return sock

    began = time.monotonic()
    stuck = [pipelined([f"s{i}-{j}" for j in range(4)]) for i in range(6)]   # 2 threads
    trickle = pipelined(["t"])
    reader = pipelined(["r0", "r1", "r2"], small_buffer=False)
    time.sleep(0.3)
    for _ in range(3):
        asked = time.monotonic()
        assert s.get("/pid")[0] == 200
        assert time.monotonic() - asked < 1.0   # not behind the clients that don't read
    assert _bodies(reader, 3, pause=0.005) == [big_body(tag, n) for tag in ("r0", "r1", "r2")]
    # reads all the time, but would take a minute for one answer: never cut while it reads (then reads faster)
    got = b""
    while time.monotonic() < began + timeout + 1.5:
        got += trickle.recv(16384)
        time.sleep(0.2)
    while (end := got.find(b"\r\n\r\n")) < 0 or len(got) < end + 4 + n:
        chunk = trickle.recv(1 << 20)
        assert chunk, f"cut after {len(got)} bytes"
        got += chunk
    assert got[got.find(b"\r\n\r\n") + 4:] == big_body("t", n)
    # The first look past the deadline may still see the kernel move bytes into the client's own buffer (progress
    # to the server, which can't tell it from reading): a client that reads nothing is closed by the second.
    time.sleep(max(0.0, began + 2 * timeout + 1.5 - time.monotonic()))
    for sock in stuck:   # closed too: what the buffers held, then the end
        assert _read_to_end(sock) < 2 * n
        sock.close()
    trickle.close()
    reader.close()
    assert s.get("/pid")[0] == 200


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
@pytest.mark.parametrize("after", [
    b"GET /pid HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",     # the last request of the connection
    b"GET /pid HTTP/1.0\r\n\r\n",
    b"GET /pid HTTP/1.1\r\nHost: h\r\n\r\nGET /x HTTP/1.1\r\nContent-Length: zz\r\n\r\n",   # then a refusal
])
def test_what_is_pipelined_after_a_held_answer_is_answered_in_full(start, worker, after):
    """An answer held for room to write ends nothing: the requests after it, and a refusal after them, are all
    answered, in order and whole, before the connection closes (no reset losing the end of the first answer)."""
    from tests.worker_app import big_body
    n = 8_000_000
    s = start(worker)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(20)
        sock.connect((s.host, s.port))
        sock.sendall(f"GET /big?n={n}&tag=h HTTP/1.1\r\nHost: h\r\n\r\n".encode() + after)
        time.sleep(1.0)                       # the big answer is held: the server has parked it
        got, chunk = b"", b"x"
        try:
            while chunk:
                chunk = sock.recv(1 << 20)
                got += chunk
        except ConnectionResetError:
            pytest.fail(f"reset after {len(got)} bytes")
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and rest[:n] == big_body("h", n)
    tail = rest[n:]
    assert tail.count(b" 200 OK\r\n") == 1, tail[:300]        # /pid answered
    if b"zz" in after:
        assert b" 400 " in tail, tail[-300:]                  # and the refusal after it


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_a_request_waiting_for_a_busy_pool_is_answered_not_reset(start, worker):
    """A request that came while every pool thread was busy is answered when one frees up, even past the
    connection's keep-alive deadline; an idle connection is still closed at its own."""
    s = start(worker, "--keep-alive", "1")
    busy = [threading.Thread(target=s.get, args=("/sleep?s=3",)) for _ in range(2)]   # both threads
    for t in busy:
        t.start()
    time.sleep(0.5)
    idle = socket.create_connection((s.host, s.port), timeout=10)
    waiting = socket.create_connection((s.host, s.port), timeout=10)
    waiting.sendall(b"GET /pid HTTP/1.1\r\nHost: h\r\n\r\n")
    began = time.monotonic()
    assert idle.recv(100) == b"" and time.monotonic() - began < 2.0
    answer = waiting.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200") and time.monotonic() - began > 1.5
    for t in busy:
        t.join()
    idle.close()
    waiting.close()


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_a_pipelined_expect_continue_gets_its_100_after_the_answers_before_it(start, worker):
    s = start(worker)
    with socket.create_connection((s.host, s.port), timeout=5) as sock:
        sock.sendall(b"GET /pid HTTP/1.1\r\nHost: h\r\n\r\n"
                     b"POST /echo HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        got = b""
        while b"100 Continue" not in got:
            chunk = sock.recv(65536)
            assert chunk
            got += chunk
        assert got.startswith(b"HTTP/1.1 200") and got.endswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"hello")
        got = b""
        while b'"body": "hello"' not in got:
            chunk = sock.recv(65536)
            assert chunk
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")


# --- gunicorn lifecycle: the same on gthread and qag's worker ----------------------------------------------------
@pytest.mark.parametrize("worker", ["gthread", QAG, FALLBACK])
def test_graceful_shutdown_finishes_the_request_in_flight(start, worker):
    s = start(worker, "--graceful-timeout", "20")
    result = {}

    def slow():
        result["reply"] = s.get("/sleep?s=2")
    t = threading.Thread(target=slow)
    t.start()
    time.sleep(0.7)
    idle = socket.create_connection((s.host, s.port), timeout=10)   # an idle connection is closed, not served
    time.sleep(0.2)
    s.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert result["reply"][0] == 200 and result["reply"][2] == b"slept"
    assert s.proc.wait(30) == 0
    assert idle.recv(100) == b""
    idle.close()


@pytest.mark.parametrize("worker", ["gthread", QAG, FALLBACK])
def test_max_requests_recycles_the_worker(start, worker):
    s = start(worker, "--max-requests", "5")
    pids = []
    for _ in range(16):
        for _attempt in range(50):   # a recycled worker's replacement may take a moment to boot
            try:
                status, _, body = s.get("/pid")
                break
            except (ConnectionError, http.client.RemoteDisconnected):
                time.sleep(0.1)
        assert status == 200
        pids.append(int(body))
    assert len(set(pids)) >= 3, pids


@pytest.mark.parametrize("worker", ["gthread", QAG, FALLBACK])
def test_heartbeat_keeps_a_worker_busy_past_the_timeout_alive(start, worker):
    """gunicorn's timeout restarts a worker that stops signalling, not one whose app threads are busy: a request
    twice as long as the timeout finishes, the same worker answers the calls beside it, and it is never replaced."""
    s = start(worker, "--timeout", "2")
    first = int(s.get("/pid")[2])
    result = {}
    slow = threading.Thread(target=lambda: result.update(reply=s.get("/sleep?s=4.5")))
    slow.start()
    beside = []
    while slow.is_alive():
        status, _, body = s.get("/pid")
        beside.append((status, int(body)))
        time.sleep(0.5)
    slow.join()
    assert result["reply"][0] == 200 and result["reply"][2] == b"slept"
    assert len(beside) >= 5 and set(beside) == {(200, first)}, beside
    assert int(s.get("/pid")[2]) == first
    assert not any("WORKER TIMEOUT" in line for line in s.lines), "".join(s.lines)


@pytest.mark.parametrize("worker", ["gthread", QAG, FALLBACK])
def test_reload_replaces_the_worker_and_finishes_the_request_in_flight(start, worker):
    """SIGHUP: a new worker takes over, the old one finishes what it was answering, then exits."""
    s = start(worker, "--graceful-timeout", "20")
    first = int(s.get("/pid")[2])
    result = {}
    slow = threading.Thread(target=lambda: result.update(reply=s.get("/sleep?s=2")))
    slow.start()
    time.sleep(0.5)
    s.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    pid = first
    while pid == first and time.monotonic() < deadline:
        try:
            pid = int(s.get("/pid")[2])
        except (ConnectionError, http.client.RemoteDisconnected):
            pass
        time.sleep(0.1)
    slow.join(30)
    assert pid != first
    assert result["reply"][0] == 200 and result["reply"][2] == b"slept"
    for _ in range(50):          # the old worker exits once its request is answered
        if not _alive(first):
            break
        time.sleep(0.1)
    assert not _alive(first)
    assert s.proc.poll() is None   # the master is still serving


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("worker", ["gthread", "qag"])
def test_access_log_line_is_gunicorns(worker):
    from tests.server import Server
    s = Server(env={"QAG_WORKER_CLASS": worker, "QAG_ACCESS_LOG": "on"}, workers=1, threads=2)
    try:
        r = s.get("/health?secret=1", headers={"X-Request-Id": "rid-123", "User-Agent": "probe/1"})
        assert r.status == 200
        deadline = time.monotonic() + 10
        while not any("rid=rid-123" in line for line in s.log) and time.monotonic() < deadline:
            time.sleep(0.05)
        line = next(line for line in s.log if "rid=rid-123" in line)
        assert '"GET /health HTTP/1.1" 200 ' in line and '"probe/1"' in line and "secret" not in line, line
        assert line.startswith("127.0.0.1 - [")
    finally:
        s.close()


def test_tls_configuration_is_refused_at_startup(tmp_path):
    import shutil
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=qag-test"], check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "gunicorn", "-k", QAG, "--certfile", str(cert), "--keyfile", str(key),
                           "-b", "127.0.0.1:0", "--no-control-socket", "tests.worker_app:app"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode != 0 and "does not terminate TLS" in done.stdout + done.stderr


def test_refused_body_does_not_destroy_the_413():
    # A client that sends its whole (too large) body before reading, as http.client does: the worker answers
    # 413 from Content-Length, half-closes and discards the rest, so the send completes and the 413 is read.
    from tests.server import Server
    s = Server(env={"QAG_MAX_BODY_BYTES": "1000"}, workers=1, threads=2)
    try:
        conn = http.client.HTTPConnection(s.host, s.port, timeout=30)
        conn.request("POST", "/execute_sql", body=b" " * 30_000_000,
                     headers={"Content-Type": "application/json", "X-API-Key": s.admin_key})
        r = conn.getresponse()
        assert r.status == 413 and json.loads(r.read())["code"] == "payload_too_large"
        conn.close()
        assert s.get("/health").status == 200
    finally:
        s.close()


@pytest.mark.parametrize("worker", ["gthread", QAG])
def test_request_hooks_from_the_config_run_around_each_request(start, tmp_path, worker):
    """pre_request sees the request before the app, post_request the response after it (gunicorn's contract)."""
    config = tmp_path / "hooks.py"
    config.write_text(
        "import os\n"
        "def _note(text):\n"
        "    with open(os.environ['WORKER_APP_LOG'], 'a') as f:\n"
        "        f.write(text + '\\n')\n"
        "def pre_request(worker, req):\n"
        "    _note(f'pre {req.method} {req.path}?{req.query}')\n"
        "def post_request(worker, req, environ, resp):\n"
        "    _note(f'post {req.method} {req.path}?{req.query} {resp.status}')\n")
    server = start(worker, "-c", str(config))
    status, _, _ = server.get("/pid?mine=1")
    assert status == 200
    deadline = time.monotonic() + 5
    while not any(n.startswith("post ") and "mine=1" in n for n in server.notes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    hooks = [n for n in server.notes() if n.startswith(("pre ", "post ")) and "mine=1" in n]
    assert hooks == ["pre GET /pid?mine=1", "post GET /pid?mine=1 200 OK"], server.notes()


def test_gunicorns_default_pre_request_still_logs_at_debug_level(start):
    """qag's worker skips gunicorn's default pre_request only when its debug line would not be written."""
    server = start(QAG, "--log-level", "debug")
    status, _, _ = server.get("/pid?x=1")
    assert status == 200
    deadline = time.monotonic() + 5
    while not any("GET /pid" in line for line in server.lines) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("[DEBUG] GET /pid" in line for line in server.lines), "".join(server.lines[-20:])
