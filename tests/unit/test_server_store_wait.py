"""A worker restarted while the instance serves waits out a store outage (server.open_store_when_up), but not a
store that is wrong: a newer schema or a missing database fails it at once, as at first start."""

from __future__ import annotations

import logging

import pytest

from qag import server, store
from qag.store import StoreOpenError


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


def test_which_failures_to_open_a_postgres_store_are_an_outage():
    pytest.importorskip("psycopg2", reason="the postgres extra")
    from qag.settings import load
    refused = load({"QAG_DATABASE_URL": "postgresql://qag@127.0.0.1:1/qag", "QAG_STORE_TIMEOUT": "1"})
    with pytest.raises(StoreOpenError) as caught:
        store.open_store(refused)
    assert caught.value.transient
