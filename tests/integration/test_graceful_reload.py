"""Graceful reloads (SIGHUP), stops (SIGTERM) and recycles (max_requests) under keep-alive load fail no request."""

from __future__ import annotations

import http.client
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.integration.test_worker_class import FALLBACK, QAG, Gunicorn
from tests.server import q, wait_for

pytestmark = pytest.mark.e2e

CLIENTS = 8
WORKERS = 2
# A saved query that runs ~1.5 s in SQLite: in flight when the signal arrives.
_SLOW_N = 8_000_000
_SLOW = (f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {_SLOW_N}) "
         f"SELECT count(*) AS c FROM n")


@dataclass
class Target:
    """A running gunicorn under test: where it listens, what the load calls, and a slow call with its answer."""

    host: str
    port: int
    proc: object
    paths: list[str]
    slow_path: str
    slow_answer: bytes                  # found in the body of every slow call's 200
    headers: dict = field(default_factory=dict)


class Load:
    """CLIENTS threads, each on one persistent keep-alive connection, calling in a closed loop (so the load is
    bounded by the threads). A client reconnects only where a well-behaved client (urllib3) would: after a
    response that said Connection: close, or when the socket shows the server closed it before it is reused.
    Every request sent is accounted for: answered 200, or a failure with what went wrong."""

    def __init__(self, target: Target):
        self.target = target
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.refused = 0                            # connect() refused: no request was sent
        # (when, on a fresh connection, reset by the server, what)
        self.failures: list[tuple[float, bool, bool, str]] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(60)

    def summary(self) -> str:
        return f"ok={self.ok} refused={self.refused} failures={len(self.failures)}: {self.failures[:10]}"

    def _run(self, index: int) -> None:
        target = self.target
        conn = None
        i = index
        while not self.stop.is_set():
            path = target.paths[i % len(target.paths)]
            i += 1
            if conn is not None and _dropped(conn):
                conn.close()
                conn = None
            fresh = conn is None
            if fresh:
                conn = http.client.HTTPConnection(target.host, target.port, timeout=30)
                try:
                    conn.connect()
                except ConnectionRefusedError:
                    with self.lock:
                        self.refused += 1
                    conn = None
                    time.sleep(0.02)
                    continue
                except OSError as exc:
                    self._fail(True, exc, f"connect: {exc!r}")
                    conn = None
                    continue
            try:
                conn.request("GET", path, headers=target.headers)
                response = conn.getresponse()
                body = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self._fail(fresh, exc, f"GET {path}: {exc!r}")
                conn.close()
                conn = None
                continue
            if response.status != 200:
                self._fail(fresh, None, f"GET {path}: {response.status} {body[:200]!r}")
            else:
                with self.lock:
                    self.ok += 1
            if response.will_close:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def _fail(self, fresh: bool, exc: Exception | None, what: str) -> None:
        with self.lock:
            self.failures.append((time.monotonic(), fresh, isinstance(exc, ConnectionResetError), what))


def _dropped(conn: http.client.HTTPConnection) -> bool:
    """urllib3's is_connection_dropped: a kept-alive socket that is readable between requests was closed by
    the server (or holds bytes nobody asked for); it is not reused."""
    return conn.sock is None or bool(select.select([conn.sock], [], [], 0)[0])


def _settled_workers(master: int) -> set[int]:
    """The master's workers once there are WORKERS of them (new ones booted, old ones exited)."""
    found: list = []

    def settled():
        found[:] = [_workers(master)]
        return len(found[0]) == WORKERS
    wait_for(settled, f"{WORKERS} workers")
    return found[0]


def _workers(master: int) -> set[int]:
    """The pids of the master's live children (its workers)."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == master and fields[0] != "Z":
            pids.add(int(name))
    return pids


def _slow_call(target: Target, results: list) -> threading.Thread:
    """The slow call on a connection of its own, in a thread; (status, body, when it ended) or its error lands in
    results."""
    def call():
        conn = http.client.HTTPConnection(target.host, target.port, timeout=30)
        try:
            conn.request("GET", target.slow_path, headers=target.headers)
            response = conn.getresponse()
            results.append((response.status, response.read(), time.monotonic()))
        except (OSError, http.client.HTTPException) as exc:
            results.append((None, repr(exc).encode(), time.monotonic()))
        finally:
            conn.close()
    t = threading.Thread(target=call, daemon=True)
    t.start()
    return t


def _all_answered(results: list, expected: int, answer: bytes, signalled: float) -> bool:
    """Each slow call answered in full, and only after the signal: it was in flight when the signal came."""
    return len(results) == expected and all(status == 200 and answer in body and ended > signalled
                                            for status, body, ended in results)


@pytest.fixture(params=["qag", "gthread", "qag-selectors"])
def target(request, make_server):
    if request.param == "qag-selectors":
        # qag's worker on its selectors fallback (no epoll: the selector thread reads every request), serving
        # tests/worker_app.py, as `qag serve` cannot select it.
        g = Gunicorn(FALLBACK, "-w", str(WORKERS), "--threads", "4", "--graceful-timeout", "20")
        yield Target(g.host, g.port, g.proc, ["/pid", "/echo"], "/sleep?s=1.5", b"slept")
        g.stop()
        return
    s = make_server(env={"QAG_WORKER_CLASS": request.param, "QAG_GRACEFUL_TIMEOUT": "20"}, workers=WORKERS,
                    threads=4)
    s.query("fast", "SELECT id, name FROM t WHERE id <= 3", "lite")
    s.query("slow", _SLOW, "lite")
    # /health is cheap, so many requests cross each signal; the saved query goes through the whole app.
    yield Target(s.host, s.port, s.proc, ["/health", q("fast"), "/health", "/health"], q("slow"), b"%d" % _SLOW_N,
                 {"X-API-Key": s.admin_key})


def test_reload_under_load_fails_no_request(target):
    before = _settled_workers(target.proc.pid)
    slow: list[list] = [[], [], []]   # a slow call crossing each reload
    signalled = []
    callers = []
    with Load(target) as load:
        time.sleep(0.8)
        for results in slow:
            callers.append(_slow_call(target, results))
            time.sleep(0.4)   # the slow call is running when the reload stops its worker
            signalled.append(time.monotonic())
            target.proc.send_signal(signal.SIGHUP)
            time.sleep(1.2)
        time.sleep(0.5)
    for t in callers:
        t.join(60)
    print(f"\nreload: {load.summary()}")
    assert load.failures == [], load.summary()
    assert load.refused == 0, load.summary()   # the master keeps the listener open: never a gap
    assert load.ok >= 1000, load.summary()     # the load was real: requests crossed every reload
    assert all(_all_answered(results, 1, target.slow_answer, at) for results, at in zip(slow, signalled)), slow
    after = _settled_workers(target.proc.pid)   # the old workers exit once their connections are closed
    assert not (after & before), (before, after)
    assert target.proc.poll() is None


def test_stop_under_load_answers_every_request_sent(target):
    slow: list = []
    with Load(target) as load:
        time.sleep(1.0)
        callers = [_slow_call(target, slow) for _ in range(2)]
        time.sleep(0.4)
        stopped_at = time.monotonic()
        target.proc.send_signal(signal.SIGTERM)
        assert target.proc.wait(30) == 0
        for t in callers:
            t.join(30)
    print(f"\nstop: {load.summary()}")
    # A connection the kernel queued on the listener after the last worker stopped accepting is reset when that
    # worker closes the listener: its client sees a reset on a connection that never carried a response, where
    # a moment later it would be refused; no worker read its request. Any other failure (on a connection that
    # carried a response, before the stop, an EOF, a 5xx) is a request the server took and dropped.
    dropped = [f for f in load.failures if not (f[1] and f[2] and f[0] >= stopped_at)]
    assert dropped == [], load.summary()
    assert load.refused > 0, load.summary()   # the clients kept calling until the listener was gone
    assert load.ok >= 500, load.summary()
    assert _all_answered(slow, 2, target.slow_answer, stopped_at), slow


@pytest.mark.parametrize("worker", [QAG, FALLBACK])
def test_max_requests_recycling_under_load_fails_no_request(worker):
    """A worker's own graceful exit: each one stops after 100-130 requests while the other serves."""
    g = Gunicorn(worker, "-w", str(WORKERS), "--threads", "4", "--max-requests", "100", "--max-requests-jitter", "30")
    try:
        first = _settled_workers(g.proc.pid)
        target = Target(g.host, g.port, g.proc, ["/pid", "/echo"], "/sleep?s=1", b"slept")
        with Load(target) as load:
            time.sleep(2.0)
        print(f"\nmax_requests: {load.summary()}")
        assert load.failures == [], load.summary()
        assert load.refused == 0, load.summary()
        assert load.ok >= 1000, load.summary()
        assert not (_workers(g.proc.pid) & first)
    finally:
        g.stop()
