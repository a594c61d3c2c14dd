"""The store tests of tests/unit/test_store.py on a PostgreSQL store (a real server), then PostgreSQL's own:
concurrent migrations from several processes, a dropped connection, a fork, the pool's cap, COPY's escaping."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import threading
import time

import pytest

from qag.app import create_app
from qag.settings import load
from qag.store import open_store
from qag.store.schema import SCHEMA_VERSION
from qag.store.sqlite import SqliteStore
from tests.unit import test_store as unit
from tests.unit.test_store import _fields_of, make_store, raw_sql  # noqa: F401  (make_store: a fixture)
from tests.server import wait_for

# Every unit test that takes the store as a fixture, collected here again: here the store is PostgreSQL's.
globals().update({name: test for name, test in vars(unit).items() if name.startswith("test_")
                  and {"make_store", "store_env"} & set(inspect.signature(test).parameters)})


@pytest.fixture
def store_env(pg_store_url):
    """A fresh PostgreSQL store (a schema of the session's store database) for each test."""
    return {"QAG_DATABASE_URL": pg_store_url}


def _open_and_report(url: str, start, results) -> None:
    from qag.store.postgres import PostgresStore
    start.wait(30)
    try:
        store = PostgresStore(url)
        store.set_meta(f"opened-{os.getpid()}", "yes")
        store.close()
        results.put("ok")
    except Exception as exc:  # reported to the parent, which fails the test with it
        results.put(f"{type(exc).__name__}: {exc}")


def test_concurrent_migrations_from_two_processes(pg_store_url):
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_and_report, args=(pg_store_url, start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    start.set()
    outcomes = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert outcomes == ["ok"] * 3
    from qag.store.postgres import PostgresStore
    store = PostgresStore(pg_store_url)
    try:
        assert raw_sql(store, "SELECT version FROM qag_schema") == [(SCHEMA_VERSION,)]  # migrated once
        assert len([k for k in store._all("SELECT key FROM meta") if k["key"].startswith("opened-")]) == 3
    finally:
        store.close()


def test_a_dropped_connection_is_replaced(pg_store_url):
    from qag.store.postgres import PostgresStore
    from tests.services import pg_admin
    store = PostgresStore(pg_store_url, pool_size=2)
    try:
        store.set_meta("a", "1")
        def drop_connections():
            admin = pg_admin(_fields_of(pg_store_url)["database"])
            admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE application_name = 'qag-store' AND datname = current_database() "
                                   "AND pid <> pg_backend_pid()")
            admin.close()

        drop_connections()
        assert store.get_meta("a") == "1"  # the dead pooled connection is dropped, the read retried once
        drop_connections()
        with store.transaction():  # a transaction begins again on a new connection
            store.set_meta("a", "2")
        assert store.get_meta("a") == "2"
    finally:
        store.close()


def test_a_forked_child_opens_its_own_connections(pg_store_url):
    from qag.store.postgres import PostgresStore
    store = PostgresStore(pg_store_url)
    try:
        store.set_meta("parent", "1")
        backend = store._one("SELECT pg_backend_pid() AS p")["p"]
        pid = os.fork()
        if pid == 0:  # the child: uses the store, lets go of everything, then leaves
            import gc
            code = 0
            try:
                store.set_meta("child", store.get_meta("parent"))
                store.close()
                gc.collect()
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store.get_meta("child") == "1" and store.get_meta("parent") == "1"
        # The parent's pooled connection is the same session: the child never spoke on its socket.
        assert store._one("SELECT pg_backend_pid() AS p")["p"] == backend
    finally:
        store.close()


def test_the_pool_caps_connections_per_process(pg_store_url):
    from qag.store.postgres import PostgresStore
    store = PostgresStore(pg_store_url, pool_size=2)
    try:
        inside = threading.Barrier(5)
        errors = []

        def work():
            try:
                for _ in range(20):
                    with store.transaction():
                        store.set_meta(threading.current_thread().name, "x")
            except Exception as exc:
                errors.append(exc)
            inside.wait(30)

        threads = [threading.Thread(target=work, name=f"t{i}") for i in range(4)]
        for t in threads:
            t.start()
        inside.wait(30)
        for t in threads:
            t.join()
        assert not errors and store._pool._open <= 2  # four threads took turns on two connections
        assert store._all("SELECT count(*) AS n FROM meta WHERE key LIKE 't%'")[0]["n"] == 4
    finally:
        store.close()


def test_startup_warns_when_a_used_sqlite_home_meets_an_empty_postgresql_store(tmp_path, pg_store_url, capsys):
    from qag.server import check_startup
    lite = SqliteStore(str(tmp_path))
    lite.put_key({"name": "k", "secret_hash": "h", "previous_hash": None, "previous_expires_at": None, "grants": {},
                  "active": True, "expires_at": None, "created_at": "c", "created_from_role": None,
                  "last_used_at": None, "previous_last_used_at": None, "example": False}, create=True)
    lite.close()
    settings = load({"QAG_HOME": str(tmp_path), "QAG_DATABASE_URL": pg_store_url})
    check_startup(settings)
    assert "qag store copy" in capsys.readouterr().err
    pg = open_store(settings)
    pg.set_meta("server_secret", "x")  # the PostgreSQL store has been served from: no warning
    pg.close()
    check_startup(settings)
    assert "qag store copy" not in capsys.readouterr().err


def test_migration_text_with_question_marks_and_percents_runs_as_written(pg_store_url, monkeypatch):
    from qag.store import postgres, schema
    step = ("CREATE TABLE extra (\n  id INTEGER PRIMARY KEY,\n  note TEXT DEFAULT 'why? 100%'  -- really? 5%\n)",)
    monkeypatch.setattr(postgres, "MIGRATIONS", schema.MIGRATIONS + (step,))
    monkeypatch.setattr(postgres, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    store = postgres.PostgresStore(pg_store_url)
    try:
        store._run("INSERT INTO extra (note) VALUES (DEFAULT)")
        assert store._all("SELECT id, note FROM extra") == [{"id": 1, "note": "why? 100%"}]
    finally:
        store.close()


def test_runs_written_inside_an_administrative_transaction_still_take_the_runs_lock(pg_store_url):
    """A history read inside an admin transaction may write this worker's queue: other run writers must wait."""
    import psycopg2
    from qag.store.postgres import _LOCK_RUNS, PostgresStore
    store = PostgresStore(pg_store_url)
    other = psycopg2.connect(pg_store_url)
    other.autocommit = True
    try:
        ids = store.name_ids({"c", "k"})
        with store.transaction():
            store.set_meta("x", "1")
            store.add_runs([(1, 1, None, None, ids["c"], ids["k"], None, 1, None, 1, None, None, None, None, "s",
                             None, 1, None)], limit=5, adhoc_limit=5, by_count=True, events_since=0)
            with other.cursor() as cur:
                cur.execute("SELECT pg_try_advisory_xact_lock(%s)", (_LOCK_RUNS,))
                assert cur.fetchone()[0] is False  # held until the outer transaction ends
        with other.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_xact_lock(%s)", (_LOCK_RUNS,))
            assert cur.fetchone()[0] is True
        assert len(store.events(0, 10)) == 1
    finally:
        other.close()
        store.close()


def _open_in_thread(url: str) -> tuple[threading.Event, list]:
    """Open (and close) a PostgresStore on another thread: (set when it is done, [its error, if any])."""
    from qag.store.postgres import PostgresStore
    done, errors = threading.Event(), []

    def open_store_once():
        try:
            PostgresStore(url).close()
        except Exception as exc:  # reported to the test, which fails with it
            errors.append(exc)
        done.set()

    threading.Thread(target=open_store_once, daemon=True).start()
    return done, errors


@pytest.mark.parametrize("holder", ["reads", "writes"])
def test_opening_a_current_store_waits_for_no_table_lock(pg_store_url, holder):
    """A worker that starts while another session is inside a transaction on the configuration tables (a request
    of another worker or instance, a report) opens at once: opening a current store runs no DDL. Before, every
    open dropped and re-created the configuration triggers, so it waited for that session (for ever, under the
    migration lock) and made every later reader wait behind it, or deadlocked with a writer."""
    import psycopg2
    from qag.store.postgres import PostgresStore
    PostgresStore(pg_store_url).close()   # the first start: migrates and installs the triggers
    other = psycopg2.connect(pg_store_url)
    try:
        with other.cursor() as cur:
            if holder == "reads":
                cur.execute("SELECT count(*) FROM api_keys")
            else:
                cur.execute("INSERT INTO roles (name, grants, created_at) VALUES ('r', '{}', 'now')")
        done, errors = _open_in_thread(pg_store_url)
        assert done.wait(15), "opening the store waited for another session's table lock"
        assert errors == []
    finally:
        other.rollback()
        other.close()
    done.wait(30)


@pytest.mark.parametrize("damage", ["DROP TRIGGER qag_config_roles ON roles",
                                    "ALTER TABLE api_keys DISABLE TRIGGER qag_config_api_keys",
                                    "COMMENT ON FUNCTION qag_bump_config_generation() IS 'an older set'"])
def test_opening_the_store_puts_back_configuration_triggers_that_are_missing_or_older(pg_store_url, damage):
    import psycopg2
    from qag.store.postgres import PostgresStore
    PostgresStore(pg_store_url).close()
    other = psycopg2.connect(pg_store_url)
    other.autocommit = True
    try:
        with other.cursor() as cur:
            cur.execute(damage)
        store = PostgresStore(pg_store_url)
        try:
            for table in ("roles", "api_keys"):   # a change made straight in the database moves the generation
                before = int(store.get_meta("config_generation") or 0)
                with other.cursor() as cur:
                    if table == "roles":
                        cur.execute("INSERT INTO roles (name, grants, created_at) VALUES ('r', '{}', 'now')")
                    else:
                        cur.execute("UPDATE api_keys SET active = active")
                assert int(store.get_meta("config_generation") or 0) == before + 1, table
        finally:
            store.close()
    finally:
        other.close()


def _relayed(url: str, relay) -> str:
    from urllib.parse import urlsplit
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.replace(f":{parts.port}", f":{relay.port}")).geturl()


def test_a_stalled_store_answers_within_its_limit_and_a_held_commit_never_lands(pg_store_url):
    """The server accepts but never answers (a black-holed path: TCP still acknowledges). Every store call ends
    within QAG_STORE_TIMEOUT + the 1 s margin with StoreTimeout (503 unavailable), its connection discarded; a
    COMMIT that sat in the stall and reaches the server after the caller gave up finds its transaction ended by
    the server (idle_in_transaction_session_timeout), so it never lands behind the caller's back."""
    from urllib.parse import urlsplit
    from qag.store.postgres import PostgresStore, StoreTimeout
    from qag.testing import Relay
    parts = urlsplit(pg_store_url)
    with Relay(parts.hostname, parts.port) as relay:
        store = PostgresStore(_relayed(pg_store_url, relay), timeout=1.5)
        try:
            store.set_meta("before", "1")
            relay.blackhole()
            started = time.monotonic()
            with pytest.raises(StoreTimeout) as caught:
                store.get_meta("before")
            assert time.monotonic() - started < 1.5 + 1.0 + 0.5
            assert store.unavailable(caught.value)
            assert store._pool._open == 0 and store._pool._idle == []   # the cut connection is never pooled
            relay.restore()
            with pytest.raises(StoreTimeout):
                with store.transaction():
                    store.set_meta("held", "1")
                    relay.blackhole()   # the COMMIT goes into the stall
            relay.restore()             # ... and reaches the server now, after the caller was told it failed
            time.sleep(1.0)
            assert store.get_meta("held") is None and store.get_meta("before") == "1"
        finally:
            relay.restore()
            store.close()


def test_a_batch_whose_commit_reply_was_lost_is_not_written_twice(pg_store_url):
    """The COMMIT reaches the server and is applied, but the connection is reset before its reply arrives (made
    here with a deferred trigger that holds the COMMIT while the relay resets): the writer's second attempt, under
    the same id, is skipped. Before, history rows were duplicated and quota calls counted again."""
    import psycopg2
    from urllib.parse import urlsplit
    from qag.store.postgres import PostgresStore
    from qag.testing import Relay
    parts = urlsplit(pg_store_url)
    PostgresStore(pg_store_url).close()
    owner = psycopg2.connect(pg_store_url)
    owner.autocommit = True
    with owner.cursor() as cur:
        cur.execute("CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    "IF NEW.id LIKE 'slow%' THEN PERFORM pg_sleep(1.5); END IF; RETURN NULL; END $$")
        cur.execute("CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON applied_writes DEFERRABLE INITIALLY "
                    "DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()")
    owner.close()
    with Relay(parts.hostname, parts.port) as relay:
        store = PostgresStore(_relayed(pg_store_url, relay), timeout=10)
        try:
            ids = store.name_ids({"c", "k"})
            rows = [(100 + i, 1, None, None, ids["c"], ids["k"], f"rid{i}", 1, None, 1, 1, 1, None, None, "s", None,
                     i, None) for i in range(5)]
            key = ("default", "k", "day", "2026-01-01")
            writes = [lambda: store.add_runs(rows, limit=50, adhoc_limit=50, by_count=True, events_since=0,
                                             batch_id="slow-runs"),
                      lambda: store.add_quota_usage([(*key, 20, 3)], at=100, write_id="slow-quota")]
            for applied, write in enumerate(writes, 1):
                timer = threading.Timer(0.7, relay.reset_connections)   # while the COMMIT is held
                timer.start()
                with pytest.raises(Exception) as caught:
                    write()
                timer.join()
                assert store.unavailable(caught.value), caught.value   # a 503, and the writer holds the batch
                # ... though the COMMIT is applied (the server finishes it after the reset): its reply was what got
                # lost.
                wait_for(lambda: store._one("SELECT count(*) AS n FROM applied_writes WHERE id LIKE 'slow%'")["n"]
                         == applied, "the held COMMIT applied", deadline=10)
                write()                                                  # sent again: skipped
            assert sorted(r["rid"] for r in store.events(0, 100)) == [f"rid{i}" for i in range(5)]
            assert store.quota_counts([key]) == {key: (20, 3)}
        finally:
            store.close()


def _end_store_sessions(url: str) -> None:
    """pg_terminate_backend on every qag store session of the database (an operator's or a failover's), and wait
    until the server has ended them."""
    from tests.services import pg_admin
    admin = pg_admin(_fields_of(url)["database"])
    try:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'qag-store' "
                        "AND datname = current_database() AND pid <> pg_backend_pid()")

        def gone():
            with admin.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'qag-store' "
                            "AND datname = current_database()")
                return cur.fetchone()[0] == 0
        wait_for(gone, "the store's sessions ended", 10)
    finally:
        admin.close()


def test_every_idle_connection_ended_at_once_costs_no_call(pg_store_url):
    """Fault drill: after pg_terminate_backend of the store's idle pooled sessions (the store up), 2 of 120 reads
    answered 503: the retry took the next pooled connection, dead too. A connection the server ended while idle
    is seen before anything is sent on it (its socket is readable) and replaced; a retried read takes a new one.
    So reads, writes (never retried) and transactions all go through."""
    from qag.store.postgres import PostgresStore
    store = PostgresStore(pg_store_url, pool_size=4)
    try:
        store.set_meta("a", "1")

        def fill_pool():   # four idle pooled connections, as a worker has after a burst of requests
            conns = [store._pool.get() for _ in range(4)]
            for conn in conns:
                store._pool.put(conn)
            assert len(store._pool._idle) == 4

        for step in range(4):
            fill_pool()
            _end_store_sessions(pg_store_url)
            if step == 0:
                assert store.get_meta("a") == "1"
            elif step == 1:
                store.set_meta("a", "2")          # a write is never sent down a connection known dead
            elif step == 2:
                with store.transaction():
                    store.set_meta("a", store.get_meta("a") + "3")
            else:
                assert store.list_connections() == []
        assert store.get_meta("a") == "23"
    finally:
        store.close()


def _slow_commits(url: str, table: str, column: str) -> None:
    """A deferred trigger that holds the COMMIT of a row whose `column` starts with 'slow' for 1.5 s (its
    transaction is applied: the server finishes it even when the client's connection is gone meanwhile)."""
    import psycopg2
    owner = psycopg2.connect(url)
    owner.autocommit = True
    with owner.cursor() as cur:
        cur.execute(f"CREATE OR REPLACE FUNCTION slow_commit_{table}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                    f"IF NEW.{column} LIKE 'slow%' THEN PERFORM pg_sleep(1.5); END IF; RETURN NULL; END $$")
        cur.execute(f"CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON {table} DEFERRABLE INITIALLY DEFERRED "
                    f"FOR EACH ROW EXECUTE FUNCTION slow_commit_{table}()")
    owner.close()


def test_a_change_whose_connection_is_reset_after_its_commit_has_an_unknown_outcome(pg_store_url):
    """Fault drill: a store write whose connection was reset right after its COMMIT was sent answered like a
    refused one (503 with Retry-After), though it was committed. Lost with the COMMIT sent (a transaction's, or
    an autocommit write's), it is StoreUnanswered: its outcome unknown, as when the reply is held past the
    deadline. Lost before the COMMIT, the server rolled it back: still a plain, retryable failure."""
    from urllib.parse import urlsplit
    from qag.store.base import StoreUnanswered
    from qag.store.postgres import PostgresStore
    from qag.testing import Relay
    parts = urlsplit(pg_store_url)
    PostgresStore(pg_store_url).close()
    _slow_commits(pg_store_url, "meta", "key")
    with Relay(parts.hostname, parts.port) as relay:
        store = PostgresStore(_relayed(pg_store_url, relay), timeout=10)
        try:
            def in_transaction():
                with store.transaction():
                    store.set_meta("slow-tx", "1")

            for key, write in (("slow-tx", in_transaction), ("slow-auto", lambda: store.set_meta("slow-auto", "1"))):
                timer = threading.Timer(0.7, relay.reset_connections)   # while the COMMIT is held
                timer.start()
                with pytest.raises(StoreUnanswered) as caught:
                    write()
                timer.join()
                assert store.unavailable(caught.value)   # a writer thread holds its batch and resends it
                wait_for(lambda: store.get_meta(key) == "1", f"{key} committed after all", 10)
            # Lost before the COMMIT: rolled back, so no doubt about it.
            with pytest.raises(Exception) as caught:
                with store.transaction():
                    store.set_meta("never", "1")
                    relay.reset_connections()
                    store.get_meta("never")
            assert not isinstance(caught.value, StoreUnanswered) and store.unavailable(caught.value)
            assert store.get_meta("never") is None
        finally:
            store.close()


def test_a_store_that_takes_no_changes_or_lost_its_tables_is_503_and_holds_history(pg_store_url, tmp_path):
    """A store failed over onto a standby (read-only), or whose tables are gone (the wrong database, a restore half
    done), is a store fault: 503 unavailable with Retry-After, never a 500 with a traceback for every caller; and
    `unavailable` says so, which makes the history writer hold its batch instead of dropping it as lost."""
    import psycopg2
    from qag.store.postgres import PostgresStore
    from tests.unit.test_observe_history import ADMIN, App
    home = str(tmp_path)
    app = App(home, {"QAG_DATABASE_URL": pg_store_url})
    app.query("q1")
    app.gateway.close()
    read_only = App.__new__(App)
    read_only.gateway = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN, "QAG_DATABASE_URL":
                                         pg_store_url + "%20-cdefault_transaction_read_only%3Don"}))
    try:
        status, headers, body = read_only.call("POST", "/api/v1/queries", {
            "name": "q2", "description": "d", "sql": "SELECT 1 AS a", "connection_name": "lite"})
        assert status == 503 and body["code"] == "unavailable", body
        assert int(dict((k.lower(), v) for k, v in headers.items())["retry-after"]) > 0
        status, _, body = read_only.call("GET", "/q/q1", query="n=2")
        assert status == 200 and len(body) == 2, body      # reads go on
    finally:
        read_only.gateway.close()
    gone = App.__new__(App)
    gone.gateway = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN, "QAG_DATABASE_URL": pg_store_url}))
    assert gone.call("GET", "/api/v1/api-keys")[0] == 200
    store = PostgresStore(pg_store_url)
    conn = psycopg2.connect(pg_store_url)
    try:
        cur = conn.cursor()
        for statement in ("SET TRANSACTION READ ONLY; INSERT INTO meta VALUES ('k', 'v')",
                          "SELECT * FROM no_such_table"):
            with pytest.raises(psycopg2.Error) as caught:
                cur.execute(statement)
            conn.rollback()
            assert store.unavailable(caught.value), caught.value
        with pytest.raises(psycopg2.Error) as caught:
            cur.execute("SELECT 1 / 0")                              # a fault of the statement, not of the store
        conn.rollback()
        assert store.unavailable(caught.value) is None
        cur.execute("DROP TABLE api_keys CASCADE")
        conn.commit()
    finally:
        conn.close()
        store.close()
    try:                                                             # the tables gone while it serves
        status, headers, body = gone.call("GET", "/api/v1/api-keys")
        assert status == 503 and body["code"] == "unavailable", body
    finally:
        gone.gateway.close()


def test_a_new_key_whose_commit_reply_was_lost_is_answered_as_unknown(pg_store_url, tmp_path):
    """POST /api/v1/api-keys whose store connection is reset once its COMMIT was sent: the key exists, its secret
    was never shown; the answer is 503 with outcome "unknown" and no Retry-After (before: Retry-After: 2, and a
    client that followed it made a second key)."""
    from urllib.parse import urlsplit
    from qag.store.postgres import PostgresStore
    from qag.testing import Relay
    from tests.unit.test_observe_history import App
    parts = urlsplit(pg_store_url)
    PostgresStore(pg_store_url).close()
    _slow_commits(pg_store_url, "api_keys", "name")
    with Relay(parts.hostname, parts.port) as relay:
        app = App(str(tmp_path), {"QAG_DATABASE_URL": _relayed(pg_store_url, relay)})
        try:
            timer = threading.Timer(0.7, relay.reset_connections)
            timer.start()
            status, headers, body = app.call("POST", "/api/v1/api-keys", {"name": "slow-key"})
            timer.join()
            assert status == 503 and body["code"] == "unavailable" and body["outcome"] == "unknown", body
            assert "retry-after" not in {h.lower() for h in headers} and "read it back" in body["error"]
            wait_for(lambda: app.call("GET", "/api/v1/api-keys/slow-key")[0] == 200, "the key, committed", 10)
        finally:
            app.gateway.close()
