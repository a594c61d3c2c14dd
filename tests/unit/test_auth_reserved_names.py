"""A stored API key named like a caller that is no key (the admin, the command line, open mode) authenticates
nothing: it would see that caller's runs and events as its own (key names are refused at creation too)."""

from __future__ import annotations

import logging
from hashlib import sha256

import pytest

from qag.auth import Authenticator
from qag.settings import load
from qag.store import open_store


def _key_row(name: str, secret: str) -> dict:
    return {"name": name, "secret_hash": sha256(secret.encode()).hexdigest(), "previous_hash": None,
            "previous_expires_at": None, "grants": {"connections": ["*"]}, "active": True, "expires_at": None,
            "created_at": "2026-12-06 10:00:00", "created_from_role": None, "last_used_at": None,
            "previous_last_used_at": None, "example": False}


@pytest.fixture
def store(tmp_path):
    opened = open_store(load({"QAG_HOME": str(tmp_path)}))
    yield opened
    opened.close()


@pytest.mark.parametrize("name", ["admin", "Admin", "cli", "-"])
def test_a_stored_key_with_a_reserved_name_authenticates_nothing(store, name, caplog):
    store.put_key(_key_row(name, "sk_reserved"), create=True)
    store.put_key(_key_row(name + "-2", "sk_other"), create=True)
    auth = Authenticator(store, "the-admin-secret")
    with caplog.at_level(logging.WARNING, logger="qag"):
        assert auth.authenticate("sk_reserved", "127.0.0.1") is None
        assert auth.authenticate("sk_reserved", "127.0.0.1") is None
    said = [r.getMessage() for r in caplog.records if "is refused: its name" in r.getMessage()]
    assert len(said) == 1 and repr(name) in said[0] and "sk_reserved" not in said[0]   # once, never the secret
    other = auth.authenticate("sk_other", "127.0.0.1")
    assert other is not None and other.name == name + "-2" and not other.admin
    admin = auth.authenticate("the-admin-secret", "127.0.0.1")
    assert admin is not None and admin.admin and admin.name == "admin"
