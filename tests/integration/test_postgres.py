"""PostgreSQL connections against the real server on this machine (contract 10.2, 10.4, 10.5, B10.7, B10.8).

Connection behaviour is driven through PostgresBackend directly; HTTP behaviour through a real qag server.
Round trips are counted by qag/testing.py's Relay (turns per call), never timed in an assertion.
"""

from __future__ import annotations

import socket
import statistics
import threading
import time

import psycopg
import psycopg2
import pytest

from qag import settings as qag_settings
from qag.backends import postgres as pg
from qag.backends.base import Call
from qag.errors import QagError
from qag.sql.prepare import prepare, render
from qag.testing import Relay
from tests.server import q
from tests.services import pg_admin

ITEMS = 40


def _connect(fields: dict):
    conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                            password=fields["password"], dbname=fields["database"], connect_timeout=5)
    conn.autocommit = True
    return conn


@pytest.fixture(scope="module")
def db(pg_db):
    """pg_db with the tables these tests use, created as the database's owner."""
    conn = _connect(pg_db)
    cur = conn.cursor()
    cur.execute("""
        CREATE TABLE pgt_items (id integer PRIMARY KEY, name text NOT NULL, price numeric(10, 2),
                                added timestamp DEFAULT '2024-01-02 03:04:05');
        INSERT INTO pgt_items (id, name, price) SELECT i, 'item ' || i, i * 1.5 FROM generate_series(1, %s) i;
        INSERT INTO pgt_items (id, name) VALUES (1000, 'O''Reilly; --'), (1001, '50%% off');
        CREATE TABLE pgt_orders (id serial PRIMARY KEY, item_id integer REFERENCES pgt_items (id), qty int);
        CREATE VIEW pgt_cheap AS SELECT id, name FROM pgt_items WHERE price < 10;
        CREATE TABLE pgt_notes (id serial PRIMARY KEY, body text);
        CREATE TABLE pgt_big AS SELECT i AS n, md5(i::text) AS h FROM generate_series(1, 5000) i;
        CREATE FUNCTION pgt_lift() RETURNS int LANGUAGE plpgsql AS $$
        BEGIN
          PERFORM set_config('default_transaction_read_only', 'off', false);
          PERFORM set_config('statement_timeout', '0', false);
          PERFORM set_config('search_path', 'pg_catalog', false);
          RETURN 1;
        END $$;
    """, (ITEMS,))
    conn.close()
    return pg_db


@pytest.fixture
def backend():
    made = []

    def make(kind=pg.PostgresBackend, **env):
        b = kind(qag_settings.load({"QAG_POOL_SIZE": "4", **env}))
        made.append(b)
        return b

    yield make
    for b in made:
        b.close_idle()


def read(backend, fields, sql, params=None, timeout=None, size=10, page=1, read_only=True):
    """A paged call as api/run.py makes it: render, then Call."""
    prepared = prepare(sql, "postgres")
    rendered = render(prepared, params or {}, backend.style, size + 1, (page - 1) * size)
    return backend.run(fields, Call(rendered.sql, rendered.args, read_only, timeout, size + 1,
                                    0 if rendered.windowed else (page - 1) * size))


def pid(backend, fields, **kw) -> int:
    return read(backend, fields, "SELECT pg_backend_pid() AS pid", **kw).rows[0][0]


def wait_gone(pids, deadline=10.0):
    admin = pg_admin()
    try:
        cur = admin.cursor()
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (list(pids),))
            if cur.fetchone()[0] == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"backends {pids} still present")
    finally:
        admin.close()


def terminate(pids):
    admin = pg_admin()
    try:
        cur = admin.cursor()
        cur.execute("SELECT pg_terminate_backend(p) FROM unnest(%s::int[]) p", (list(pids),))
        assert all(r[0] for r in cur.fetchall())
    finally:
        admin.close()
    wait_gone(pids)


# ---------------------------------------------------------------- B10.7 on the backend


def test_four_pooled_calls_share_one_backend(backend, db):
    b = backend()
    assert len({pid(b, db) for _ in range(4)}) == 1
    assert b.pool.stats()["idle"] == 1


def test_pool_size_zero_opens_a_connection_per_call(backend, db):
    b = backend(QAG_POOL_SIZE="0")
    assert len({pid(b, db) for _ in range(3)}) == 3
    assert b.pool.stats() == {"idle": 0, "active": 0, "waits": 0, "waiting": {}}


def test_read_and_write_calls_use_separate_connections(backend, db):
    b = backend()
    assert pid(b, db) != pid(b, db, read_only=False)
    assert read(b, db, "SELECT current_setting('transaction_read_only') AS ro").rows == [("on",)]
    assert read(b, db, "SELECT current_setting('transaction_read_only') AS ro", read_only=False).rows == [("off",)]


def test_data_committed_elsewhere_is_visible_to_a_pooled_connection(backend, db):
    b = backend()
    sql = "SELECT count(*) FROM pgt_notes WHERE body = :b"
    before = pid(b, db)
    assert read(b, db, sql, {"b": "elsewhere"}).rows == [(0,)]
    other = _connect(db)
    other.cursor().execute("INSERT INTO pgt_notes (body) VALUES ('elsewhere')")
    other.close()
    assert read(b, db, sql, {"b": "elsewhere"}).rows == [(1,)]
    assert pid(b, db) == before


def test_a_short_time_limit_does_not_outlive_its_call(backend, db):
    b = backend()
    first = pid(b, db, timeout=1)
    # Same pooled connection, which last ran with statement_timeout = 1000 ms.
    r = read(b, db, "SELECT pg_backend_pid(), (SELECT 1 FROM pg_sleep(2)), current_setting('statement_timeout')",
             timeout=5)
    assert r.rows == [(first, 1, "5s")]
    # A call that timed out: 504, its connection closed; the next 2 s call on a fresh one is not cut short.
    with pytest.raises(QagError) as info:
        read(b, db, "SELECT pg_sleep(9)", timeout=1)
    assert info.value.code == "query_timeout" and info.value.status == 504 and info.value.extras["timeout"] == 1
    assert read(b, db, "SELECT 1 FROM pg_sleep(2)", timeout=3).rows == [(1,)]
    assert read(b, db, "SELECT current_setting('statement_timeout')").rows == [("0",)]


def test_session_settings_changed_by_a_query_do_not_reach_the_next_call(backend, db):
    b = backend()
    first = pid(b, db)
    read(b, db, "SELECT set_config('search_path', 'pg_catalog', false), set_config('TimeZone', 'Pacific/Chatham', "
                "false), set_config('DateStyle', 'SQL, DMY', false), set_config('statement_timeout', '0', false)")
    r = read(b, db, "SELECT pg_backend_pid(), current_setting('search_path'), current_setting('TimeZone'), "
                    "current_setting('DateStyle'), (SELECT count(*) FROM pgt_items) > 0, "
                    "DATE '2024-03-04', TIMESTAMP '2024-03-04 05:06:07', current_setting('statement_timeout')",
             timeout=7)
    row = r.rows[0]
    assert row[0] == first
    assert row[1] == '"$user", public' and row[2] != "Pacific/Chatham" and row[3].startswith("ISO")
    assert row[4] is True and str(row[5]) == "2024-03-04" and str(row[6]) == "2024-03-04 05:06:07"
    assert row[7] == "7s"


def test_a_function_cannot_make_the_pooled_connection_writable_or_unlimited(backend, db):
    b = backend()
    first = pid(b, db)
    assert read(b, db, "SELECT pgt_lift()").rows == [(1,)]
    # SET SESSION CHARACTERISTICS is the same setting as default_transaction_read_only.
    read(b, db, "SELECT set_config('default_transaction_read_only', 'off', false)")
    r = read(b, db, "SELECT pg_backend_pid(), current_setting('transaction_read_only'), "
                    "current_setting('statement_timeout'), current_setting('search_path')", timeout=2)
    assert r.rows == [(first, "on", "2s", '"$user", public')]
    with pytest.raises(QagError) as info:
        b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ('sneaky')", (), True, None, 2))
    # The engine refuses the write in the read-only transaction; qag answers it as the guard would.
    assert info.value.code == "read_only" and info.value.status == 403
    assert "read-only transaction" in info.value.extras["detail"]
    read(b, db, "SELECT pgt_lift()")
    with pytest.raises(QagError) as info:
        read(b, db, "SELECT pg_sleep(5)", timeout=1)
    assert info.value.code == "query_timeout"
    check = _connect(db)
    cur = check.cursor()
    cur.execute("SELECT count(*) FROM pgt_notes WHERE body = 'sneaky'")
    assert cur.fetchone() == (0,)
    check.close()


def test_results_windows_and_types(backend, db):
    b = backend()
    r = read(b, db, "SELECT id, name, price, added FROM pgt_items ORDER BY id", size=5, page=2)
    assert r.columns == ["id", "name", "price", "added"]
    assert [row[0] for row in r.rows] == [6, 7, 8, 9, 10, 11]
    assert str(r.rows[0][2]) == "9.00" and r.rows[0][3].isoformat() == "2024-01-02T03:04:05"
    # A statement the window can't go into is skipped and sliced client-side.
    r = read(b, db, "SELECT id FROM pgt_items ORDER BY id FOR SHARE", size=5, page=3, read_only=False)
    assert [row[0] for row in r.rows] == [11, 12, 13, 14, 15, 16]
    r = read(b, db, "SELECT id FROM pgt_items ORDER BY id FOR SHARE", size=5, page=100, read_only=False)
    assert r.rows == []


def test_a_json_page_is_rowjsons_bytes_of_its_rows(backend, db):
    """A call with json_rows (a page answered as JSON, unmasked): the compiled pipe writes the page's JSON from the
    driver's values (Result.json, no rows); the pure one gives rows. Either way the bytes are rowjson's, on every
    page, the last one and past it; a result with a value that is not its own JSON (a numeric, a quote) is rows."""
    from qag._speedups import get
    compiled = get("pgpipe").__name__.endswith("._pgpipe")
    encode_json = get("rowjson").encode_json
    b = backend()
    prepared = prepare("SELECT id, name FROM pgt_items WHERE id < 1000 ORDER BY id", "postgres")
    for page in (1, 4, 5, 6):
        rendered = render(prepared, {}, b.style, 11, (page - 1) * 10)
        plain = b.run(db, Call(rendered.sql, rendered.args, True, None, 11, 0))
        r = b.run(db, Call(rendered.sql, rendered.args, True, None, 11, 0, json_rows=10))
        assert r.count == plain.count == len(plain.rows) and r.columns == plain.columns == ["id", "name"]
        if compiled and plain.rows:
            assert r.rows is None and r.json == encode_json(plain.columns, plain.rows[:10])
        else:
            assert r.json is None and r.rows == plain.rows
    assert [r.count, plain.count] == [0, 0]                     # past the last page
    rendered = render(prepare("SELECT id, name, price FROM pgt_items WHERE id >= 1000 ORDER BY id", "postgres"),
                      {}, b.style, 11, 0)
    r = b.run(db, Call(rendered.sql, rendered.args, True, None, 11, 0, json_rows=10))
    assert r.json is None and r.rows == [(1000, "O'Reilly; --", None), (1001, "50% off", None)]


def test_sql_injection_values_are_data(backend, db):
    b = backend()
    sql = "SELECT id, name FROM pgt_items WHERE name = :name ORDER BY id"
    for evil in ["x'; DROP TABLE pgt_items; --", "' OR '1'='1", "x\\'; DELETE FROM pgt_items; --",
                 "$$; DROP TABLE pgt_items; $$", "%s%s", "%(name)s", "x' UNION SELECT 1, current_user --"]:
        assert read(b, db, sql, {"name": evil}).rows == []
    assert read(b, db, sql, {"name": "O'Reilly; --"}).rows == [(1000, "O'Reilly; --")]
    assert read(b, db, sql, {"name": "50% off"}).rows == [(1001, "50% off")]
    r = read(b, db, "SELECT name FROM pgt_items WHERE name LIKE '%' || :part || '%' ORDER BY id", {"part": "% o"})
    assert r.rows == [("50% off",)]
    assert read(b, db, "SELECT count(*) FROM pgt_items").rows == [(ITEMS + 2,)]
    with pytest.raises(QagError) as info:
        read(b, db, sql, {"name": "nul\x00byte"})
    assert info.value.code == "param_invalid" and info.value.status == 400
    assert read(b, db, "SELECT count(*) FROM pgt_items").rows == [(ITEMS + 2,)]


def test_writes_commit_with_their_own_message(backend, db):
    b = backend()
    r = b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ($1), ($2) RETURNING body", ("w1", "w2"), False, None,
                       11))
    assert r.columns == ["body"] and r.rows == [("w1",), ("w2",)]
    r = b.run(db, Call("UPDATE pgt_notes SET body = 'w3' WHERE body = 'w2'", (), False, 2.0, 11))
    assert r.columns == [] and r.rows == []
    check = _connect(db)
    cur = check.cursor()
    cur.execute("SELECT body FROM pgt_notes WHERE body IN ('w1', 'w2', 'w3') ORDER BY body")
    assert cur.fetchall() == [("w1",), ("w3",)]
    check.close()


def test_a_begin_cannot_leave_a_transaction_open(backend, db):
    """A write's BEGIN leaves a transaction block open at the Sync: the reset behind it (DISCARD ALL) is refused
    there, so the connection is closed, never handed to the next caller; whose write is committed."""
    b = backend()
    first = pid(b, db, read_only=False)
    b.run(db, Call("BEGIN", (), False, None, 2))
    assert pid(b, db, read_only=False) != first
    b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ('after begin')", (), False, None, 2))
    check = _connect(db)
    cur = check.cursor()
    cur.execute("SELECT count(*) FROM pgt_notes WHERE body = 'after begin'")
    assert cur.fetchone() == (1,)
    check.close()


def test_terminated_backends_are_never_handed_out(backend, db):
    b = backend()
    # Three idle pooled connections, all killed between calls.
    barrier = threading.Barrier(3)
    pids = []

    def hold():
        barrier.wait()
        pids.append(read(b, db, "SELECT pg_backend_pid(), pg_sleep(0.3)").rows[0][0])

    threads = [threading.Thread(target=hold) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(pids)) == 3 and b.pool.stats()["idle"] == 3
    terminate(pids)
    after = [pid(b, db) for _ in range(4)]
    assert not set(after) & set(pids) and len(set(after)) == 1
    # A write after its connection was killed works too: the dead one is noticed before anything is sent.
    wpid = pid(b, db, read_only=False)
    terminate([wpid])
    b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ('after kill')", (), False, None, 2))
    assert pid(b, db, read_only=False) != wpid


def test_a_connection_that_died_silently_is_retried_for_reads_only(backend, db, monkeypatch):
    """When the idle check can't see the death (no FIN yet), a read is retried once; a write is not."""
    b = backend()
    monkeypatch.setattr(pg._Link, "readable", lambda link: link.pending)
    first = pid(b, db)
    terminate([first])
    assert pid(b, db) != first
    wfirst = pid(b, db, read_only=False)
    terminate([wfirst])
    with pytest.raises(QagError) as info:
        b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ('maybe')", (), False, None, 2))
    assert info.value.code == "connection_failed" and info.value.status == 502
    b.run(db, Call("INSERT INTO pgt_notes (body) VALUES ('surely')", (), False, None, 2))


def test_unreachable_server_is_connection_failed_without_the_password(backend, db):
    b = backend()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fields = dict(db, port=port, password="Sup3r-S3cret-pw")
    for call in (lambda: b.run(fields, Call("SELECT 1", (), True, None, 2)), lambda: b.test(fields),
                 lambda: b.databases(fields), lambda: b.schema(fields)):
        with pytest.raises(QagError) as info:
            call()
        assert info.value.code == "connection_failed" and info.value.status == 502
        assert "Sup3r-S3cret-pw" not in repr(info.value.extras) + str(info.value)
    assert b.pool.stats()["active"] == 0


def test_stream_batches_cap_and_reuse(backend, db):
    b = backend()
    columns, batches = b.stream(db, Call("SELECT n, h FROM pgt_big ORDER BY n", (), True, 30.0, 0), 1000, None)
    sizes = [len(rows) for rows in batches]
    assert columns == ["n", "h"] and sizes == [1000] * 5
    used = pid(b, db)
    columns, batches = b.stream(db, Call("SELECT n FROM pgt_big ORDER BY n", (), True, None, 0), 1000, 2500)
    rows = [r for chunk in batches for r in chunk]
    assert [r[0] for r in rows] == list(range(1, 2501))
    # Closed early (a client that went away): rolled back, and the connection serves the next call.
    columns, batches = b.stream(db, Call("SELECT n FROM pgt_big WHERE n > $1", (10,), True, None, 0), 100, None)
    assert len(next(batches)) == 100
    batches.close()
    assert pid(b, db) == used and b.pool.stats()["active"] == 0
    with pytest.raises(QagError) as info:
        b.stream(db, Call("SELECT nope FROM pgt_big", (), True, None, 0), 1000, None)
    assert info.value.code == "query_failed"
    with pytest.raises(QagError) as info:
        b.stream(db, Call("SELECT pg_sleep(5) FROM pgt_big", (), True, 1.0, 0), 1000, None)
    assert info.value.code == "query_timeout"
    assert b.pool.stats()["active"] == 0


def test_schema_and_databases(backend, db):
    b = backend()
    schema = b.schema(db)
    assert schema["truncated"] is False
    tables = {t["name"]: t for t in schema["tables"]}
    assert {"pgt_items", "pgt_orders", "pgt_cheap", "pgt_notes", "pgt_big"} <= set(tables)
    assert all(t["schema"] == "public" for t in schema["tables"])
    items = tables["pgt_items"]
    assert items["type"] == "table" and tables["pgt_cheap"]["type"] == "view"
    assert items["columns"][0] == {"name": "id", "type": "integer", "nullable": False, "position": 1,
                                   "primary_key": True, "foreign_key": None}
    assert items["columns"][2]["type"] == "numeric(10,2)" and items["columns"][2]["nullable"] is True
    item_id = next(c for c in tables["pgt_orders"]["columns"] if c["name"] == "item_id")
    assert item_id["foreign_key"] == {"table": "pgt_items", "column": "id"} and not item_id["primary_key"]
    assert b.schema(db) is schema                                     # cached
    assert b.schema(db, database=db["database"]) == schema            # the same database named explicitly
    b.close_idle()
    assert b.schema(db) is not schema                                 # dropped with the idle connections
    assert db["database"] in b.databases(db) and "template0" not in b.databases(db)
    assert b.test(db) > 0


def test_schema_is_refreshed_in_the_background_before_it_expires(backend, db, monkeypatch):
    b = backend()
    first = b.schema(db)
    key = pg.pool_key(db, True)
    with b._schema_lock:
        read_at, cached = b._schemas[key]
        b._schemas[key] = (read_at - pg.SCHEMA_REFRESH - 1, cached)
    assert b.schema(db) is first                                      # served stale, refresh started
    deadline = time.monotonic() + 10
    while b.schema(db) is first and time.monotonic() < deadline:
        time.sleep(0.02)
    assert b.schema(db) is not first and b.schema(db) == first


# ---------------------------------------------------------------- HTTP through a real qag server


@pytest.fixture(scope="module")
def conn_name(db, server, writes_server):
    name = f"pg_{id(db) % 100000}"
    for s in (server, writes_server):
        r = s.post("/api/v1/connections", {"name": name, "db": "postgres", **db})
        assert r.status == 201, r
    return name


def test_infinite_dates_and_times_are_read_as_psycopg2_reads_them(server, conn_name):
    """PostgreSQL's 'infinity' has no Python date: read as the latest (earliest) one, as QueryAPIGate's psycopg2
    reads it, where psycopg's own loaders made the row unreadable (a 400 blaming a parameter there was none of)."""
    sql = ("SELECT 'infinity'::date AS d, '-infinity'::date AS e, 'infinity'::timestamp AS t, "
           "'-infinity'::timestamptz AS z, '2020-01-02'::date AS plain")
    r = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name})
    assert r.status == 200, r
    row = r.json[0]
    assert row["d"].startswith("9999-12-31") and row["e"].startswith("0001-01-01"), row
    assert row["t"].startswith("9999-12-31") and row["z"].startswith("0001-01-01") and row["plain"].startswith("2020-01-02")
    csv = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name, "format": "csv"})
    assert csv.status == 200 and b"9999-12-31" in csv.body, csv
    streamed = server.post("/execute_sql?stream=true&format=ndjson", {"sql": sql, "connection_name": conn_name})
    assert streamed.status == 200 and b"9999-12-31" in streamed.body, streamed


def test_values_python_cant_hold_are_read_as_postgresqls_own_text(server, conn_name):
    """A date BC or after 9999, the time 24:00:00, a timestamp in year 294276, an interval over timedelta's range:
    the value as PostgreSQL wrote it (psycopg's loaders refused the row, and the refusal was blamed on a parameter
    though none was sent). 178000000 years is not the 545490560 days psycopg's C loader would make of it."""
    sql = ("SELECT '4713-01-01 BC'::date AS bc, '10000-01-01'::date AS far, '24:00:00'::time AS midnight, "
           "'24:00:00+02'::timetz AS midnight_tz, '294276-01-01'::timestamp AS ts, "
           "'294276-01-01 00:00:00+00'::timestamptz AS tz, '178000000 years'::interval AS years, "
           "'1000000000 days'::interval AS days, ARRAY['4713-01-01 BC'::date] AS dates, "
           "'2020-01-02'::date AS plain, '03:04:05'::time AS t")
    r = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name})
    assert r.status == 200, r
    assert r.json == [{"bc": "4713-01-01 BC", "far": "10000-01-01", "midnight": "24:00:00", "midnight_tz": "24:00:00+02",
                       "ts": "294276-01-01 00:00:00", "tz": "294276-01-01 00:00:00+00", "years": "178000000 years",
                       "days": "1000000000 days", "dates": '["4713-01-01 BC"]', "plain": "2020-01-02",
                       "t": "03:04:05"}]
    csv = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name, "format": "csv"})
    assert csv.status == 200 and b"4713-01-01 BC,10000-01-01,24:00:00," in csv.body, csv
    streamed = server.post("/execute_sql?stream=true&format=ndjson", {"sql": sql, "connection_name": conn_name})
    assert streamed.status == 200 and b'"bc": "4713-01-01 BC"' in streamed.body, streamed


def test_records_and_multiranges_are_postgresqls_own_text(server, conn_name):
    """An anonymous record and a multirange, with their arrays, as PostgreSQL writes them (and psycopg2,
    QueryAPIGate's driver, gives them): psycopg 3 made a tuple of texts ("('1', 'a', None)") and ranges printed
    with spaces between."""
    sql = ("SELECT ROW(1, 'a', NULL) AS r, ROW('a b', 'c\"d', NULL, '') AS q, ARRAY[ROW(1, 'a')] AS rs, "
           "'{[1,2],[5,6]}'::int4multirange AS m, '{[2024-01-01,2024-01-03)}'::datemultirange AS dm, "
           "ARRAY['{[1,2]}'::int4multirange] AS ms, '[1,3)'::int4range AS plain_range")
    expected = {"r": "(1,a,)", "q": '("a b","c""d",,"")', "rs": '{"(1,a)"}', "m": "{[1,3),[5,7)}",
                "dm": "{[2024-01-01,2024-01-03)}", "ms": '{"{[1,3)}"}', "plain_range": "[1, 3)"}
    r = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name})
    assert r.status == 200 and r.json == [expected], r
    csv = server.post("/execute_sql", {"sql": sql, "connection_name": conn_name, "format": "csv"})
    assert csv.status == 200 and b'"(1,a,)","(""a b"",""c""""d"",,"""")"' in csv.body, csv
    streamed = server.post("/execute_sql?stream=true&format=ndjson", {"sql": sql, "connection_name": conn_name})
    assert streamed.status == 200 and b'"m": "{[1,3),[5,7)}"' in streamed.body, streamed


def test_the_admins_database_override_runs_the_call_there(server, conn_name, db):
    """Contract 10.1: a `database` override (admin) replaces the connection's database for this call."""
    def run(**body):
        return server.post("/execute_sql", {"sql": "SELECT current_database() AS d", "connection_name": conn_name,
                                            **body})
    assert run(database="postgres").json == [{"d": "postgres"}]
    assert run().json == [{"d": db["database"]}]
    assert run(database=None).json == [{"d": db["database"]}]
    r = run(database=7)
    assert r.status == 400 and r.json["code"] == "invalid_body", r


def test_http_connection_test_and_databases(server, db):
    r = server.post("/api/v1/connections/test", {"db": "postgres", **db})
    assert r.status == 200 and r.json["elapsed_ms"] > 0
    r = server.post("/api/v1/connections/databases", {"db": "postgres", **db})
    assert r.status == 200 and db["database"] in r.json["databases"]


def test_b10_8_unreachable_postgres_is_502_without_password(server, db):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    password = "Very-Secret-Passw0rd"
    r = server.post("/api/v1/connections/test", {"db": "postgres", **dict(db, port=port, password=password)})
    assert r.status == 502 and r.json["code"] == "connection_failed", r
    assert r.json["error"] == "Could not connect to the database" and r.json["detail"]
    assert password.encode() not in r.body
    assert not any(password in line for line in server.log)


def test_http_timeout_is_504_and_the_statement_is_gone(server, conn_name, db):
    marker = "pg_sleep(30.5)"
    r = server.post("/execute_sql", {"sql": f"SELECT {marker}", "connection_name": conn_name, "timeout": 1})
    assert r.status == 504 and r.json["code"] == "query_timeout" and r.json["timeout"] == 1, r
    admin = pg_admin()
    try:
        cur = admin.cursor()
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND state = 'active' "
                    "AND query LIKE %s", (db["database"], f"%{marker}%"))
        assert cur.fetchone() == (0,)
        deadline = time.monotonic() + 10
        while True:     # the connection that timed out is closed, so its backend leaves
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s",
                        (db["database"], f"%{marker}%"))
            if cur.fetchone() == (0,) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND query LIKE %s",
                    (db["database"], f"%{marker}%"))
        assert cur.fetchone() == (0,)
    finally:
        admin.close()
    r = server.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": conn_name})
    assert r.status == 200 and r.json == [{"one": 1}]


def test_http_saved_query_pages_and_injection(server, conn_name, uniq):
    name = uniq("pgitems")
    server.query(name, "SELECT id, name FROM pgt_items WHERE name <> :skip ORDER BY id", conn_name)
    r = server.get(q(name), params={"skip": "x'; DROP TABLE pgt_items; --", "page": "2", "page_size": "3"})
    assert r.status == 200 and [row["id"] for row in r.json] == [4, 5, 6], r
    assert r.headers["x-has-more"] == "true"
    r = server.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM pgt_items", "connection_name": conn_name})
    assert r.json == [{"n": ITEMS + 2}]
    r = server.post("/execute_sql", {"sql": "SELECT nope FROM pgt_items", "connection_name": conn_name})
    assert r.status == 500 and r.json["code"] == "query_failed" and "nope" in r.json["detail"]
    r = server.post("/execute_sql", {"sql": "DELETE FROM pgt_items", "connection_name": conn_name})
    assert r.status == 403 and r.json["code"] == "read_only"


def test_http_json_pages_written_by_the_driver(server, conn_name, uniq):
    """Pages of plain values (which the compiled pipe writes from the driver's values), a page with a value that
    needs escaping, and the same query as CSV: the same rows, counts and has-more as the rows make."""
    name = uniq("pgjson")
    server.query(name, "SELECT id, name, id % 2 = 0 AS even FROM pgt_items ORDER BY id", conn_name)
    seen = []
    for page in range(1, 6):
        r = server.get(q(name), params={"page": str(page), "page_size": "10"})
        assert r.status == 200 and r.headers["x-row-count"] == str(len(r.json)), r
        assert r.headers["x-has-more"] == ("true" if page < 5 else "false")
        seen += r.json
    assert seen == [{"id": i, "name": f"item {i}", "even": i % 2 == 0} for i in range(1, ITEMS + 1)] + [
        {"id": 1000, "name": "O'Reilly; --", "even": True}, {"id": 1001, "name": "50% off", "even": False}]
    r = server.get(q(name), params={"page": "6", "page_size": "10"})
    assert r.status == 200 and r.json == {"message": "No results returned"} and r.headers["x-row-count"] == "0"
    r = server.get(q(name), params={"page": "1", "page_size": "3", "format": "csv"})
    assert r.status == 200 and r.body == b"id,name,even\r\n1,item 1,False\r\n2,item 2,True\r\n3,item 3,False\r\n"


def test_http_writes_are_committed(writes_server, conn_name, db, uniq):
    body = uniq("note'; --")
    r = writes_server.post("/execute_sql", {"sql": "INSERT INTO pgt_notes (body) VALUES (:b)",
                                            "connection_name": conn_name, "params": {"b": body}})
    assert r.status == 200 and r.json == {"message": "No results returned"}, r
    r = writes_server.post("/execute_sql", {"sql": "UPDATE pgt_notes SET body = body || '!' WHERE body = :b "
                                                   "RETURNING body", "connection_name": conn_name,
                                            "params": {"b": body}})
    assert r.status == 200 and r.json == [{"body": body + "!"}]
    check = _connect(db)
    cur = check.cursor()
    cur.execute("SELECT count(*) FROM pgt_notes WHERE body = %s", (body + "!",))
    assert cur.fetchone() == (1,)
    check.close()


def test_http_stream_csv(server, conn_name):
    r = server.post("/execute_sql?stream=true&format=csv", {"sql": "SELECT n, h FROM pgt_big ORDER BY n",
                                                            "connection_name": conn_name})
    assert r.status == 200, r
    lines = r.body.decode().split("\r\n")
    assert lines[0] == "n,h" and lines[-1] == "" and len(lines) == 5002
    assert lines[1].startswith("1,") and lines[5000].startswith("5000,")
    r = server.post("/execute_sql?stream=true&format=csv", {"sql": "SELECT n FROM pgt_big WHERE n < 0",
                                                            "connection_name": conn_name})
    assert r.status == 200 and r.body == b"n\r\n"
    r = server.post("/execute_sql?stream=true&format=csv", {"sql": "SELECT pg_sleep(5)", "timeout": 1,
                                                            "connection_name": conn_name})
    assert r.status == 504 and r.json["code"] == "query_timeout"


def test_http_schema(server, conn_name, db):
    r = server.get(f"/api/v1/connections/{conn_name}/schema")
    assert r.status == 200, r
    tables = {t["name"]: t for t in r.json["tables"]}
    assert tables["pgt_items"]["columns"][0]["primary_key"] is True
    assert r.json["truncated"] is False
    r = server.get(f"/api/v1/connections/{conn_name}/schema", params={"database": "qag_no_such_db"})
    assert r.status == 502 and r.json["code"] == "connection_failed"
    assert db["password"].encode() not in r.body


# ---------------------------------------------------------------- round trips


def test_one_round_trip_per_call_through_a_delaying_relay(backend, db, capsys):
    """Request turns per call are counted and asserted (1 for a paged read and for a write, back to back).

    Single-caller latency without and with a 10 ms delay on every server reply gives the waits on the database
    per call as the slope, calibrated by the same statement sent directly with psycopg through the same relay.
    Latencies are printed, never asserted.
    """
    delay = 0.010
    prepared = prepare("SELECT id, name FROM pgt_items WHERE id > :after ORDER BY id", "postgres")
    paged = render(prepared, {"after": 3}, "numeric", 11, 10)
    direct_paged = render(prepared, {"after": 3}, "format", 11, 10)     # psycopg's own cursor takes %s
    read_call = Call(paged.sql, paged.args, True, 5.0, 11)
    write_call = Call("UPDATE pgt_notes SET body = body WHERE id = $1", (1,), False, 5.0, 11)
    direct_write = "UPDATE pgt_notes SET body = body WHERE id = %s"
    measured: dict[str, dict[float, tuple]] = {}
    for d in (0.0, delay):
        with Relay(db["host"], db["port"], delay=d) as relay:
            fields = dict(db, host="127.0.0.1", port=relay.port)
            b = backend()
            direct = psycopg.connect(autocommit=True, **pg.connect_args(fields))
            dcur = direct.cursor()

            def measure(fn, n=30):
                for _ in range(8):                     # warm-up: the pool opens up to its size (QAG_POOL_SIZE=4)
                    fn()
                turns, times = [], []
                for _ in range(n):
                    relay.reset()
                    started = time.perf_counter()
                    fn()
                    times.append((time.perf_counter() - started) * 1000.0)
                    turns.append(relay.turns)
                return turns, statistics.median(times), min(times), max(times)

            for name, fn in (("direct psycopg, same read", lambda: (dcur.execute(direct_paged.sql, direct_paged.args),
                                                                    dcur.fetchall())),
                             ("direct psycopg, same write", lambda: dcur.execute(direct_write, write_call.args)),
                             ("qag paged read", lambda: b.run(fields, read_call)),
                             ("qag write", lambda: b.run(fields, write_call))):
                measured.setdefault(name, {})[d] = measure(fn)
            direct.close()
            b.close_idle()
    with capsys.disabled():
        print(f"\nPostgreSQL single caller, back to back, through qag/testing.py's Relay (median of 30, min-max), "
              f"delay 0 vs {delay * 1000:.0f} ms per server reply:")
        for name, by_delay in measured.items():
            (_, m0, _, _), (t1, m1, low, high) = by_delay[0.0], by_delay[delay]
            print(f"  {name:28s} turns/call {sorted(set(t1))}  {m0:6.2f} ms -> {m1:6.2f} ms "
                  f"({low:.2f}-{high:.2f})  waits/call {(m1 - m0) / (delay * 1000):.2f}")
    for name, by_delay in measured.items():
        if name.startswith("direct"):
            continue          # the calibration: psycopg's own cursor may write a message in two sends
        for d, (turns, *_rest) in by_delay.items():
            assert set(turns) == {1}, (name, d, turns)


def test_role_and_advisory_locks_do_not_reach_the_next_caller(backend, db):
    b = backend(QAG_POOL_SIZE="1")
    me = read(b, db, "SELECT current_user AS u").rows[0][0]
    first = pid(b, db)
    # A caller's query switches the session's role and takes a session advisory lock.
    read(b, db, "SELECT set_config('role', %s, false) AS r, pg_advisory_lock(987654) AS l" % f"'{me}'")
    assert pid(b, db) == first                               # the same pooled connection serves the next call
    assert read(b, db, "SELECT current_user AS u").rows[0][0] == me
    admin = pg_admin()
    try:
        cur = admin.cursor()
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = 987654")
        assert cur.fetchone()[0] == 0
    finally:
        admin.close()


def test_calls_draw_no_warning_from_the_server(backend, db):
    """No call makes the server warn: a warning is also a line in the server's own log, one per call under load
    (a read-only call's ROLLBACK outside an explicit block drew "there is no transaction in progress" every time)."""
    notices = []

    class Watched(pg.PostgresBackend):   # a subclass: the compiled backend's type can't be patched
        @staticmethod
        def connect(fields, deadline=None, spin=0.0):
            link = pg.PostgresBackend.connect(fields, deadline, spin)
            link.conn.add_notice_handler(lambda diag: notices.append((diag.severity, diag.message_primary)))
            return link

    b = backend(Watched)
    for _ in range(3):
        assert read(b, db, "SELECT 1 AS one").rows == [(1,)]
    assert read(b, db, "(SELECT n FROM pgt_big) UNION ALL (SELECT 0) ORDER BY 1", size=5, page=2).rows
    assert read(b, db, "SELECT 2 AS two", read_only=False).rows == [(2,)]
    columns, batches = b.stream(db, Call("SELECT n FROM pgt_big ORDER BY n", (), True, None, 0), 100, 250)
    assert sum(len(rows) for rows in batches) == 250
    assert notices == []



def test_the_longest_query_timeout_setting_works_on_every_call(backend, db, make_server):
    """QAG_QUERY_TIMEOUT=3000000 passed startup, then every call was refused by the server (400 value_invalid,
    "Value exceeds integer range" from statement_timeout); 1e308 was a 500 (OverflowError). The setting now stops at
    the longest limit every wait of a call takes, and that limit works."""
    b = backend()
    assert read(b, db, "SELECT current_setting('statement_timeout')", timeout=2147482).rows == [("2147482s",)]
    server = make_server(env={"QAG_QUERY_TIMEOUT": "2147482"})
    assert server.post("/api/v1/connections", {"name": "pg_long", "db": "postgres", **db}).status == 201
    r = server.post("/execute_sql", {"sql": "SELECT current_setting('statement_timeout') AS t",
                                     "connection_name": "pg_long"})
    assert r.status == 200 and r.json == [{"t": "2147482s"}], r


def test_a_callers_timeout_beyond_statement_timeouts_range_runs_with_the_longest(backend, db, make_server):
    """With no QAG_QUERY_TIMEOUT to lower it, a caller's ?timeout=1e12 runs with PostgreSQL's longest
    statement_timeout (timeout_ms clamps), where it was a 400 value_invalid."""
    b = backend()
    for seconds in (3_000_000, 1e12, 1e308):
        assert read(b, db, "SELECT current_setting('statement_timeout')", timeout=seconds).rows == [("2147483647ms",)]
    server = make_server(env={"QAG_QUERY_TIMEOUT": "0"})
    assert server.post("/api/v1/connections", {"name": "pg_long", "db": "postgres", **db}).status == 201
    sql = "SELECT current_setting('statement_timeout') AS t"
    for timeout in ("1e12", "3000000"):
        r = server.post(f"/execute_sql?timeout={timeout}", {"sql": sql, "connection_name": "pg_long"})
        assert r.status == 200 and r.json == [{"t": "2147483647ms"}], r
