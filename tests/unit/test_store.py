"""The SQLite store: migrations, a newer schema refused, the audit log bounded, transactions across threads."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from qag.store.base import StoreError
from qag.store.schema import SCHEMA_VERSION
from qag.store.sqlite import SqliteStore


def test_fresh_store_is_at_the_current_schema(tmp_path):
    store = SqliteStore(str(tmp_path))
    conn = sqlite3.connect(store.path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_newer_schema_is_refused_with_a_clear_message(tmp_path):
    SqliteStore(str(tmp_path)).close()
    conn = sqlite3.connect(str(tmp_path / "qag.db"))
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="newer than this qag knows"):
        SqliteStore(str(tmp_path))


def test_audit_log_keeps_the_newest_entries(tmp_path):
    store = SqliteStore(str(tmp_path), audit_limit=3)
    for i in range(5):
        store.audit("2026-01-01 00:00:00", "admin", "break-glass", "create_key", f"k{i}", {})
    assert [e["target"] for e in store.audit_entries()] == ["k4", "k3", "k2"]


def test_transactions_serialise_read_modify_write_across_threads(tmp_path):
    store = SqliteStore(str(tmp_path))
    store.set_meta("n", "0")

    def bump():
        for _ in range(50):
            with store.transaction():
                store.set_meta("n", str(int(store.get_meta("n")) + 1))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.get_meta("n") == "200"


def test_failed_transaction_rolls_back(tmp_path):
    store = SqliteStore(str(tmp_path))
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.set_meta("x", "1")
            raise RuntimeError("boom")
    assert store.get_meta("x") is None


def test_opening_an_existing_store_never_opens_its_file_outside_sqlite(tmp_path, monkeypatch):
    """Closing any descriptor of a file drops all of this process's POSIX locks on it, including those of a SQLite
    connection already using the store: only a missing store file may be opened (to create it 0600)."""
    import os
    first = SqliteStore(str(tmp_path))
    assert os.stat(first.path).st_mode & 0o777 == 0o600
    opened = []
    real_open = os.open

    def recording_open(path, *args, **kwargs):
        fd = real_open(path, *args, **kwargs)   # a refused O_EXCL open raises here: no descriptor, no close
        opened.append(path)
        return fd
    monkeypatch.setattr(os, "open", recording_open)
    second = SqliteStore(str(tmp_path))
    assert first.path not in opened and second.get_meta("nothing") is None
    first.close()
    second.close()
