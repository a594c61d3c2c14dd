"""A worker restarted while the instance serves waits out a store outage (server.open_store_when_up), but not a
store that is wrong: a newer schema or a missing database fails it at once, as at first start. A reload's workers,
started into an outage, answer while they wait (storewait.StoreWaiting): /livez 200, everything else 503."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from qag import server, store
from qag.settings import load
from qag.store import StoreOpenError
from qag.storewait import StoreWaiting


class _Worker:
    alive = True
    log = logging.getLogger("qag-test")

    def __init__(self):
        self.notified = 0

    def notify(self):
        self.notified += 1


def test_an_outage_is_waited_out_and_a_wrong_store_is_not(monkeypatch):
    attempts = []
    opened = object()

    def outage_then_up(settings, create=True):
        attempts.append(create)
        if len(attempts) < 3:
            raise StoreOpenError("QAG_DATABASE_URL: connection refused", transient=True)
        return opened

    monkeypatch.setattr(store, "open_store", outage_then_up)
    slept = []
    worker = _Worker()
    assert server.open_store_when_up(None, worker, sleep=slept.append) is opened
    assert attempts == [False, False, False] and slept and worker.notified   # waited, heartbeat kept

    def newer_schema(settings, create=True):
        raise StoreOpenError("QAG_DATABASE_URL: schema version 99, newer than this qag knows")

    monkeypatch.setattr(store, "open_store", newer_schema)
    with pytest.raises(StoreOpenError, match="newer"):
        server.open_store_when_up(None, _Worker(), sleep=slept.append)


def _get(app, path: str, **headers):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "RAW_URI": path, "QUERY_STRING": "",
               "REMOTE_ADDR": "127.0.0.1", **{f"HTTP_{k.upper()}": v for k, v in headers.items()}}
    seen = {}

    def start_response(status, headers):
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    return int(seen["status"].split()[0]), seen["headers"], body


class _Gateway:
    def __init__(self, opened):
        self.opened, self.calls, self.closed = opened, [], False

    def __call__(self, environ, start_response):
        self.calls.append(environ["PATH_INFO"])
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"gateway"]

    def close(self):
        self.closed = True


def test_a_worker_answers_while_it_waits_for_the_store_and_serves_once_it_opens():
    """Fault drill: a reload (SIGHUP) during a store outage replaced every worker with one that waited inside
    gunicorn's load(), so the instance answered nothing, /livez included, until the store came back."""
    attempts, ready = [], []
    up = threading.Event()
    opened = object()

    def open_store():
        attempts.append(1)
        if not up.is_set():
            raise StoreOpenError("QAG_DATABASE_URL: connection refused", transient=True)
        return opened

    waits = []

    def sleep(seconds):
        waits.append(seconds)
        threading.Event().wait(0.01)

    app = StoreWaiting(load({}), open_store, _Gateway, ready.append, sleep=sleep)
    try:
        status, headers, body = _get(app, "/livez")
        assert (status, json.loads(body)) == (200, {"status": "ok"})
        for path in ("/q/orders", "/api/v1/queries", "/readyz"):
            status, headers, body = _get(app, path, x_request_id="r-1")
            reply = json.loads(body)
            assert (status, reply["code"], reply["request_id"]) == (503, "unavailable", "r-1"), reply
            assert int(headers["Retry-After"]) > 0 and headers["X-Request-Id"] == "r-1"
            assert headers["X-Content-Type-Options"] == "nosniff"
        assert json.loads(_get(app, "/readyz")[2])["failed"] == {"store": "unavailable"}
        with pytest.raises(AttributeError):
            app.observe            # no gateway yet: the worker's hooks see none
        for _ in range(500):       # the waiting thread's first back-off (it runs on its own: a loaded machine is late)
            if waits:
                break
            threading.Event().wait(0.01)
        assert attempts and waits and waits[0] == 1.0
        up.set()
        for _ in range(500):
            if app.gateway is not None:
                break
            threading.Event().wait(0.01)
        assert isinstance(app.gateway, _Gateway) and app.gateway.opened is opened and ready == [app.gateway]
        assert _get(app, "/q/orders") == (200, {"Content-Type": "text/plain"}, b"gateway")
        assert app.gateway.calls == ["/q/orders"] and app.opened is opened   # attributes are the gateway's
    finally:
        app.close()
    assert app.gateway.closed


def test_a_store_found_wrong_while_waiting_is_waited_out_too():
    """A newer schema or a database gone, met by a worker restarted into an outage: a failed boot there would
    halt gunicorn's master and the workers still serving; it keeps answering 503 and trying."""
    attempts = []

    def wrong():
        attempts.append(1)
        raise StoreOpenError("QAG_DATABASE_URL: schema version 99, newer than this qag knows")

    app = StoreWaiting(load({}), wrong, _Gateway, sleep=lambda seconds: threading.Event().wait(0.01))
    try:
        for _ in range(500):
            if len(attempts) >= 2:
                break
            threading.Event().wait(0.01)
        assert len(attempts) >= 2 and app.gateway is None
        assert _get(app, "/q/x")[0] == 503 and _get(app, "/livez")[0] == 200
    finally:
        app.close()


def test_which_failures_to_open_a_postgres_store_are_an_outage():
    pytest.importorskip("psycopg2", reason="the postgres extra")
    from qag.settings import load
    refused = load({"QAG_DATABASE_URL": "postgresql://qag@127.0.0.1:1/qag", "QAG_STORE_TIMEOUT": "1"})
    with pytest.raises(StoreOpenError) as caught:
        store.open_store(refused)
    assert caught.value.transient


def test_a_store_that_drops_while_the_gateway_starts_is_tried_again():
    """Found by a code review: the gateway reads the store as it starts (its server secret); a store that dropped
    right after it opened raised out of the waiting thread, which ended, leaving the worker at 503 for good while
    /livez said it was alive. The store is closed and tried again."""
    builds, closed = [], []

    class _Store:
        def close(self):
            closed.append(1)

    def build(opened):
        builds.append(opened)
        if len(builds) == 1:
            raise ConnectionError("the store dropped")   # not a StoreOpenError
        return _Gateway(opened)

    app = StoreWaiting(load({}), _Store, build, sleep=lambda seconds: threading.Event().wait(0.01))
    try:
        for _ in range(500):
            if app.gateway is not None:
                break
            threading.Event().wait(0.01)
        assert isinstance(app.gateway, _Gateway) and len(builds) == 2 and closed == [1]
        assert _get(app, "/q/x") == (200, {"Content-Type": "text/plain"}, b"gateway")
    finally:
        app.close()


def test_a_store_that_drops_while_a_restarted_workers_gateway_starts_is_waited_out(monkeypatch):
    """Found by a fault drill in CI: the store opened, then dropped as the gateway read its server secret; the
    StoreError raised out of gunicorn's load() as a failed boot, which halts the master and every worker. A worker
    restarted alone closes that store and tries again, as for a store that can't be opened."""
    closed, builds = [], []

    class _Store:
        def close(self):
            closed.append(1)

    monkeypatch.setattr(store, "open_store", lambda settings, create=True: _Store())

    def build(opened):
        builds.append(opened)
        if len(builds) < 3:
            raise store.StoreError("cannot open the store: server closed the connection unexpectedly")
        return "gateway"

    slept = []
    assert server.open_store_when_up(None, _Worker(), sleep=slept.append, build=build) == "gateway"
    assert len(builds) == 3 and closed == [1, 1] and slept
