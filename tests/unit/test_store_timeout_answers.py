"""A store that didn't answer in time: a read is unavailable and retryable; a change may have been applied, so its
503 says the outcome is unknown and has no Retry-After (a client following it made a key twice, the first one's
secret never shown)."""

from __future__ import annotations

from qag.store.base import StoreTimeout
from tests.unit.test_observe_history import App


def test_a_change_the_store_did_not_answer_has_an_unknown_outcome(tmp_path, monkeypatch):
    app = App(str(tmp_path))
    try:
        store = app.gateway.store

        def stalled(*args, **kwargs):
            raise StoreTimeout("the store did not answer within 2 s; its connection was closed")

        for name in ("put_key", "list_connections"):
            monkeypatch.setattr(store, name, stalled, raising=True)
        status, headers, body = app.call("POST", "/api/v1/api-keys", {"name": "made-in-a-stall"})
        assert status == 503 and body["code"] == "unavailable" and body["outcome"] == "unknown", body
        assert "retry-after" not in {h.lower() for h in headers} and "read it back" in body["error"]
        status, headers, body = app.call("GET", "/api/v1/connections")
        assert status == 503 and "outcome" not in body and int(headers["retry-after"]) > 0, (headers, body)
    finally:
        app.gateway.close()
