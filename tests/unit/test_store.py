"""The SQLite store: migrations, a newer schema refused, the audit log bounded, transactions across threads; the
PostgreSQL store's settings and errors that need no server (the same tests on a PostgreSQL store, and PostgreSQL's
own: tests/integration/test_store_postgres.py)."""

from __future__ import annotations

import os
import sqlite3
import threading

import pytest

from qag.settings import load
from qag.store import open_store
from qag.store.base import StoreError
from qag.store.schema import MIGRATIONS, SCHEMA_VERSION, statements, tables, translate
from qag.store.sqlite import SqliteStore


@pytest.fixture
def make_store(tmp_path, store_env):
    """Open (again) the store of this test: SQLite in tmp_path or a fresh PostgreSQL schema."""
    opened = []

    def make(**kw):
        store = open_store(load({"QAG_HOME": str(tmp_path), **store_env, **kw}))
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def raw_sql(store, sql: str, args: tuple = ()):
    """A statement on the store's database outside the store's own methods (what an operator could do)."""
    if isinstance(store, SqliteStore) and store.path is not None:
        conn = sqlite3.connect(store.path, isolation_level=None)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()
    import psycopg2
    conn = psycopg2.connect(store.url)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql.replace("?", "%s"), args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


def schema_version(store) -> int:
    if store.path is not None:
        return raw_sql(store, "PRAGMA user_version")[0][0]
    return raw_sql(store, "SELECT max(version) FROM qag_schema")[0][0]


def set_schema_version(store, version: int) -> None:
    if store.path is not None:
        raw_sql(store, f"PRAGMA user_version = {version}")
    else:
        raw_sql(store, "UPDATE qag_schema SET version = ?", (version,))


def test_fresh_store_is_at_the_current_schema(make_store):
    store = make_store()
    assert schema_version(store) == SCHEMA_VERSION
    assert {t for t in tables()} <= {r[0] for r in raw_sql(
        store, "SELECT name FROM sqlite_master WHERE type = 'table'" if store.path else
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")}
    if store.path is not None:
        assert raw_sql(store, "PRAGMA journal_mode")[0][0] == "wal"


def test_newer_schema_is_refused_with_a_clear_message(make_store):
    store = make_store()
    set_schema_version(store, SCHEMA_VERSION + 1)
    store.close()
    with pytest.raises(StoreError, match="newer than this qag knows"):
        make_store()


def test_audit_log_keeps_the_newest_entries(make_store):
    store = make_store(QAG_AUDIT_LOG_LIMIT="3")
    for i in range(5):
        store.audit("2026-01-01 00:00:00", "admin", "break-glass", "create_key", f"k{i}", {})
    assert [e["target"] for e in store.audit_entries()] == ["k4", "k3", "k2"]


def test_transactions_serialise_read_modify_write_across_threads(make_store):
    store = make_store()
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


def test_failed_transaction_rolls_back(make_store):
    store = make_store()
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


def test_a_store_file_that_vanished_is_never_recreated_empty(tmp_path):
    """A thread opening its first connection after the store file was moved away gets an error (503), and no new
    empty file appears at the path for later openers to take for the store; once the file is back, it works."""
    store = SqliteStore(str(tmp_path))
    store.set_meta("kept", "yes")
    moved = os.path.join(str(tmp_path), "moved.db")
    os.rename(store.path, moved)
    outcome = []

    def first_use_on_a_new_thread():
        try:
            outcome.append(store.get_meta("kept"))
        except StoreError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=first_use_on_a_new_thread)
    thread.start()
    thread.join()
    assert isinstance(outcome[0], StoreError) and "cannot open the store" in str(outcome[0])
    assert not os.path.exists(store.path)
    with pytest.raises(sqlite3.OperationalError):
        store.ping(1.0)
    os.rename(moved, store.path)
    thread = threading.Thread(target=first_use_on_a_new_thread)
    thread.start()
    thread.join()
    assert outcome[1] == "yes"
    store.ping(1.0)
    store.close()


def test_run_rows_keep_awkward_text_and_request_ids(make_store):
    """COPY's text format on PostgreSQL: tabs, newlines, backslashes, \\N-looking text and non-ASCII survive."""
    store = make_store()
    ids = store.name_ids({"q", "c", "k", "code"})
    store.create_query("q", None, {"uuid": "u", "created_at": "c", "last_modified_at": "m", "sql": "x"}, True)
    awkward = "tab\there\nline\r\\N back\\slash é 😀 %s ?"
    trace = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
    rows = [(1000, 1, ids["q"], 1, ids["c"], ids["k"], bytes.fromhex("0123456789ab"), 0, None, None, 5, 12,
             ids["code"], awkward, None, None, 1000, trace),
            (1001, 1, None, None, ids["c"], ids["k"], "not-hex\tid", 1, 2, 7, None, None, None, None, awkward, "{}",
             1001, None)]
    store.add_runs(rows, limit=50, adhoc_limit=50, by_count=True, events_since=0)
    old, new = store.events(0, 10)
    assert (old["err"], old["code"], old["query"]) == (awkward, "code", "q")
    assert old["rid"] in (bytes.fromhex("0123456789ab"), "0123456789ab")
    assert old["trace"] in (trace, trace.hex()) and new["trace"] is None   # 16 bytes on SQLite, hex on PostgreSQL
    assert (new["sql"], new["rid"], new["tr"], new["x"], new["query"]) == (awkward, "not-hex\tid", 2, "{}", None)
    assert [r["id"] for r in store.history({}, None, 10)] == [new["id"], old["id"]]


@pytest.mark.parametrize("sizes", [(1,), (255, 1, 2), (257, 3, 300), (0, 511, 1)])
def test_run_batches_keep_every_value_in_order_whatever_their_size_and_empty_columns(make_store, sizes):
    """Segments of rows that leave different columns empty, each of a size that the SQLite store splits into
    several statements: every value lands in its column, and ids follow the batch's order."""
    store = make_store()
    ids = store.name_ids({"q", "c", "k", "code"})
    store.create_query("q", None, {"uuid": "u", "created_at": "c", "last_modified_at": "m", "sql": "x"}, True)
    shapes = [
        lambda at: (at, 1, ids["q"], 3, ids["c"], ids["k"], (at % 2**48).to_bytes(6, "big"), 1, None, at % 7,
                    at % 100, at % 10, None, None, None, None, at * 10**9, at.to_bytes(16, "big")),
        lambda at: (at, 0, ids["q"], 3, ids["c"], ids["k"], f"rid-{at}", 0, 1, None, None, None, ids["code"],
                    f"failed {at}", None, '{"p":[]}', at * 10**9, None),
        lambda at: (at, 1, None, None, ids["c"], ids["k"], None, 1, 2, 0, 4, None, None, None, f"SELECT {at}", "{}",
                    at * 10**9 + 1, (at * 7).to_bytes(16, "big")),
    ]
    rows, at = [], 1000
    for index, size in enumerate(sizes):
        rows += [shapes[index % 3](at + i) for i in range(size)]
        at += size
    store.add_runs(rows, limit=10_000, adhoc_limit=10_000, by_count=True, events_since=0)
    stored = store.events(0, 10_000)
    assert len(stored) == len(rows)
    assert [r["id"] for r in stored] == sorted(r["id"] for r in stored)
    names = {ids[name]: name for name in ids}
    for row, got in zip(rows, stored):
        at, h, q, v, c, k, rid, ok, tr, n, ms, ser, code, err, sql, x, seq, trace = row
        assert (got["at"], got["h"], got["v"], got["ok"], got["tr"], got["n"], got["ms"], got["ser"], got["seq"]) == \
            (at, h, v, ok, tr, n, ms, ser, seq)
        assert (got["query"], got["connection"], got["key_name"], got["code"]) == \
            (names.get(q), "c", "k", names.get(code))
        assert (got["err"], got["sql"], got["x"]) == (err, sql, x)
        assert got["rid"] == rid or (isinstance(rid, bytes) and got["rid"] == rid.hex())
        assert got["trace"] == trace or (trace is not None and got["trace"] == trace.hex())


def test_history_is_trimmed_per_version_and_sweeps_go_in_batches(make_store):
    store = make_store()
    ids = store.name_ids({"q", "c", "k"})
    store.create_query("q", None, {"uuid": "u", "created_at": "c", "last_modified_at": "m", "sql": "x"}, True)
    for start in range(0, 30, 10):
        rows = [(100 + i, 1, ids["q"], 1, ids["c"], ids["k"], None, 1, None, 1, 1, 1, None, None, None, None, i,
                 None) for i in range(start, start + 10)]
        store.add_runs(rows, limit=7, adhoc_limit=7, by_count=True, events_since=0)
    assert [r["at"] for r in store.history({"query": "q"}, None, 100)] == list(range(129, 122, -1))
    assert len(store.events(0, 100)) == 30
    swept = [store.prune_runs(events_since=10_000, history_since=None, batch=10) for _ in range(4)]
    assert swept == [10, 10, 3, 0] and len(store.events(0, 100)) == 7


def test_a_batch_sent_again_under_its_id_is_applied_once(make_store):
    """A history batch or quota flush sent again because the reply to its commit was lost (qag's writers resend
    it under the same id) is skipped: no duplicated run, no quota call counted twice. The ids go after an hour."""
    store = make_store()
    ids = store.name_ids({"c", "k"})
    rows = [(100 + i, 1, None, None, ids["c"], ids["k"], f"rid{i}", 1, None, 1, 1, 1, None, None, "s", None, i, None)
            for i in range(3)]
    for _ in range(2):
        store.add_runs(rows, limit=50, adhoc_limit=50, by_count=True, events_since=0, batch_id="batch-1")
    store.add_runs(rows[:1], limit=50, adhoc_limit=50, by_count=True, events_since=0, batch_id="batch-2")
    assert sorted(r["rid"] for r in store.events(0, 100)) == ["rid0", "rid0", "rid1", "rid2"]
    key = ("default", "k", "day", "2026-01-01")
    for _ in range(2):
        store.add_quota_usage([(*key, 20, 5)], at=100, write_id="flush-1")
    store.add_quota_usage([(*key, 1, 1)], at=100, write_id="flush-2")
    store.add_quota_usage([(*key, 1, 1)], at=100)
    assert store.quota_counts([key]) == {key: (22, 7)}
    raw_sql(store, "UPDATE applied_writes SET at = 1 WHERE id = 'batch-1'")
    assert store.prune_writes(2) == 1
    assert [r[0] for r in raw_sql(store, "SELECT id FROM applied_writes ORDER BY id")] == ["batch-2", "flush-1",
                                                                                          "flush-2"]


# --- schema translation --------------------------------------------------------------------------------------
def test_portable_ddl_is_translated_for_postgresql():
    ddl = ("CREATE TABLE t (\n  id INTEGER PRIMARY KEY AUTOINCREMENT,\n  n INTEGER NOT NULL,\n  b BLOB,\n"
           "  anything,\n  x TEXT\n)")
    pg = translate(ddl, "postgresql")
    assert "id BIGSERIAL PRIMARY KEY," in pg and "n BIGINT NOT NULL" in pg and "b BYTEA" in pg
    assert "anything TEXT," in pg and translate(ddl, "sqlite") == ddl
    assert translate({"sqlite": "A", "postgresql": "B"}, "postgresql") == "B"
    assert translate("CREATE INDEX i ON t (\n a,\n b)", "postgresql") == "CREATE INDEX i ON t (\n a,\n b)"


def test_every_migration_step_upgrades_a_store_in_place(make_store, tmp_path, store_env):
    """A store at each older version (built from the steps themselves) is brought up to date, data kept."""
    for version in range(1, SCHEMA_VERSION):
        if store_env:
            from tests.services import pg_schema_url
            import psycopg2
            url, cleanup = pg_schema_url(_fields_of(store_env["QAG_DATABASE_URL"]))
            conn = psycopg2.connect(url)
            with conn, conn.cursor() as cur:
                for step in MIGRATIONS[:version]:
                    for statement in statements(step, "postgresql"):
                        cur.execute(statement)
                cur.execute("CREATE TABLE qag_schema (version INTEGER NOT NULL)")
                cur.execute("INSERT INTO qag_schema VALUES (%s)", (version,))
                cur.execute("INSERT INTO meta VALUES ('kept', 'yes')")
            conn.close()
            env = {"QAG_DATABASE_URL": url}
        else:
            home = tmp_path / f"v{version}"
            home.mkdir()
            conn = sqlite3.connect(home / "qag.db")
            for step in MIGRATIONS[:version]:
                for statement in statements(step, "sqlite"):
                    conn.execute(statement)
            conn.execute("INSERT INTO meta VALUES ('kept', 'yes')")
            conn.execute(f"PRAGMA user_version = {version}")
            conn.commit()
            conn.close()
            env, cleanup = {"QAG_HOME": str(home)}, (lambda: None)
        try:
            store = open_store(load(env))
            assert store.get_meta("kept") == "yes" and store.history({}, None, 10) == []
            assert schema_version(store) == SCHEMA_VERSION
            store.close()
        finally:
            cleanup()


def _fields_of(url: str) -> dict:
    from urllib.parse import unquote, urlsplit
    parts = urlsplit(url)
    return {"user": unquote(parts.username), "password": unquote(parts.password), "host": parts.hostname,
            "port": parts.port, "database": unquote(parts.path.lstrip("/"))}


def test_database_url_settings(tmp_path):
    pytest.importorskip("psycopg2", reason="the postgres extra (pip install 'qag[postgres]'); no server is needed")
    from qag.settings import SettingsError
    with pytest.raises(SettingsError, match="QAG_DATABASE_URL must be"):
        load({"QAG_DATABASE_URL": "mysql://u:secret@h/db"})
    try:
        load({"QAG_DATABASE_URL": "mysql://u:secret@h/db"})
    except SettingsError as exc:
        assert "secret" not in str(exc)
    secret_file = tmp_path / "url"
    secret_file.write_text("postgresql://u:pw@127.0.0.1/db\n")
    assert load({"QUERYAPIGATE_DATABASE_URL_FILE": str(secret_file)}).database_url == "postgresql://u:pw@127.0.0.1/db"
    assert load({}).database_url is None


def test_an_unreachable_store_is_a_clear_error_without_the_password():
    pytest.importorskip("psycopg2", reason="the postgres extra (pip install 'qag[postgres]'); no server is needed")
    from qag.store.postgres import PostgresStore
    with pytest.raises(StoreError) as info:
        PostgresStore("postgresql://u:hunter2@127.0.0.1:1/db")
    assert "cannot open the store postgresql://u:***@127.0.0.1:1/db" in str(info.value)
    assert "hunter2" not in str(info.value)


def test_a_nul_character_never_costs_the_batch(make_store):
    store = make_store()
    ids = store.name_ids({"c", "k"})
    rows = [(1000 + i, 1, None, None, ids["c"], ids["k"], None, 1, None, 1, None, None, None, None, sql, None, i,
             None) for i, sql in enumerate(["SELECT 1\x00", "SELECT 2"])]
    store.add_runs(rows, limit=50, adhoc_limit=50, by_count=True, events_since=0)
    assert [r["sql"] for r in store.events(0, 10)] in (["SELECT 1\x00", "SELECT 2"], ["SELECT 1\ufffd", "SELECT 2"])


def test_urls_are_shown_without_passwords():
    from qag.store.postgres import redact
    assert redact("postgresql://u:s3cr%40t@h:5432/db?sslmode=require") == "postgresql://u:***@h:5432/db?sslmode=require"
    assert redact("postgres://u@h/db?password=s3cret&x=1") == "postgres://u@h/db?password=***&x=1"
    assert redact("postgresql:///db") == "postgresql:///db"


@pytest.mark.parametrize("url, shown", [
    # libpq reads the password up to the last @: an unencoded # or ? in it is no fragment or query
    ("postgresql://postgres:S3cret#PW@127.0.0.1:5432/db", "postgresql://postgres:***@127.0.0.1:5432/db"),
    ("postgresql://u:p?w@h/db", "postgresql://u:***@h/db"),
    ("postgresql://u:S3cret/x@h/db", "postgresql://u:***@h/db"),
    # libpq decodes a parameter's name: pass%77ord= and %70assword= are password=
    ("postgresql://u@h/db?pass%77ord=S3cretPW", "postgresql://u@h/db?pass%77ord=***"),
    ("postgresql://u@h/db?%70assword=S3cretPW&sslmode=require", "postgresql://u@h/db?%70assword=***&sslmode=require"),
    ("postgresql://u@h/db?sslpassword=S3cretPW", "postgresql://u@h/db?sslpassword=***"),
])
def test_every_spelling_of_a_password_libpq_reads_is_taken_out(url, shown):
    """Spellings urlsplit reads otherwise than libpq printed the password whole, in startup lines, `qag config`,
    outage warnings and /readyz."""
    from qag.store.postgres import redact
    assert redact(url) == shown
    assert "S3cret" not in redact(url) and "p?w" not in redact(url)


def test_libpq_text_about_a_url_it_cannot_read_is_not_shown():
    """libpq quotes the piece of a URL it can't parse, which can be part of the password (`u:S3cret/x@h`: host u,
    port "S3cret")."""
    pytest.importorskip("psycopg2")
    from qag.store.postgres import driver_text
    url = "postgresql://u:S3cret:x/y@h/db"
    try:
        import psycopg2
        psycopg2.connect(url, connect_timeout=1)
    except Exception as exc:
        assert "S3cret" not in driver_text(exc, url)
    else:
        raise AssertionError("libpq read a URL it should not")


def test_configuration_edits_made_outside_qag_move_the_config_generation(make_store):
    """The store's triggers (SQLite and PostgreSQL) move meta.config_generation, which the metadata cache polls,
    for any change to a configuration row, also one an operator makes by hand; usage stamps don't move it."""
    store = make_store()

    def generation() -> int:
        return int(store.get_meta("config_generation") or 0)

    start = generation()
    store.put_key({"name": "k", "secret_hash": "h", "previous_hash": None, "previous_expires_at": None, "grants": {},
                   "active": True, "expires_at": None, "created_at": "c", "created_from_role": None,
                   "last_used_at": None, "previous_last_used_at": None, "example": False}, create=True)
    assert generation() > start
    moved = generation()
    store.touch_key("k", False, "2026-11-30T00:00:00")
    assert generation() == moved, "a usage stamp is not a configuration change"
    raw_sql(store, "UPDATE api_keys SET active = 0 WHERE name = 'k'")
    assert generation() > moved


def test_a_url_libpq_cannot_read_never_shows_its_password():
    """libpq quotes the token it can't decode - here the password itself: refused at startup without echoing it,
    and scrubbed from the store's error if it gets that far."""
    pytest.importorskip("psycopg2", reason="the postgres extra (pip install 'qag[postgres]'); no server is needed")
    from qag.settings import SettingsError
    from qag.store.postgres import PostgresStore
    url = "postgresql://qag:s3cr%t!@127.0.0.1:1/qag"
    with pytest.raises(SettingsError) as refused:
        load({"QAG_DATABASE_URL": url})
    assert "s3cr" not in str(refused.value) and "QAG_DATABASE_URL" in str(refused.value)
    with pytest.raises(StoreError) as failed:
        PostgresStore(url)
    assert "s3cr" not in str(failed.value) and "***" in str(failed.value)


def test_a_write_after_the_store_file_vanished_or_was_replaced_is_never_lost(tmp_path):
    """Fault drill: the store file deleted while serving; a thread that already had a connection kept writing to
    the unlinked file, and each change was acknowledged (201) and gone at the next restart. A write finds the file
    at the store's path first: none there, or another one (a restore under the running server, which would share
    the old file's -wal), is a StoreError (503), nothing acknowledged; the file put back is written again."""
    store = SqliteStore(str(tmp_path))
    store.set_meta("before", "1")
    moved = os.path.join(str(tmp_path), "moved.db")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(store.path + suffix):
            os.rename(store.path + suffix, moved + suffix)
    with pytest.raises(StoreError):
        store.set_meta("lost", "1")                    # this thread's connection is on the moved file
    with pytest.raises(StoreError):
        with store.transaction():
            store.set_meta("lost", "2")
    assert not os.path.exists(store.path)
    check = sqlite3.connect(moved)
    assert check.execute("SELECT count(*) FROM meta WHERE key = 'lost'").fetchone() == (0,)
    check.close()
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(moved + suffix):
            os.rename(moved + suffix, store.path + suffix)
    store.set_meta("after", "1")
    assert store.get_meta("before") == "1" and store.get_meta("after") == "1"
    replacement = os.path.join(str(tmp_path), "restored.db")
    restored = sqlite3.connect(replacement)
    sqlite3.connect(store.path).backup(restored)
    restored.close()
    os.replace(replacement, store.path)                  # a restore under the running server
    with pytest.raises(StoreError):
        store.set_meta("into_the_old_file", "1")
    with pytest.raises(StoreError) as refused:
        with store.transaction():                        # the history writer's batch: held (503), never lost
            pass
    assert store.unavailable(refused.value)
    store.close()
