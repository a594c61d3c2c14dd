"""SQLite as reader of record (issue 17): the authorizer's record and refusals, bounds and error codes, on real files.

The corpus is tests/cases/engine/sqlite_engine.json (families: boundary, second_statement, write_in_read,
function, tables, bounded); each case runs through qag.backends.sqlite on a real database file, without qag's
guard in front, so what is refused here is refused by the engine.
"""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from qag.backends import sqlite as backend
from qag.backends.base import Call
from qag.errors import QagError
from qag.sql.prepare import prepare

CASES = os.path.join(os.path.dirname(__file__), "..", "cases", "engine", "sqlite_engine.json")
SCHEMA = """
CREATE TABLE customer(id INTEGER PRIMARY KEY, name TEXT);
CREATE TABLE orders(id INTEGER PRIMARY KEY, cid INTEGER);
CREATE TABLE secret(id INTEGER PRIMARY KEY, s TEXT);
CREATE VIEW pub AS SELECT id, name FROM customer;
CREATE VIEW pubsecret AS SELECT s, id FROM secret WHERE id > 0;
CREATE VIEW outer_view AS SELECT s FROM pubsecret;
CREATE VIRTUAL TABLE ft USING fts5(body);
INSERT INTO customer VALUES (1, 'Ana'), (2, 'Bo');
INSERT INTO orders VALUES (1, 1);
INSERT INTO secret VALUES (1, 'hidden');
INSERT INTO ft VALUES ('hello world');
CREATE TRIGGER audit AFTER INSERT ON orders BEGIN INSERT INTO secret(s) VALUES ('audit'); END;
"""


def _database(path: str, script: str) -> str:
    """A SQLite file at path made by script."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
    finally:
        conn.close()
    return path


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("sqlite-engine") / "engine.db")
    _database(path, SCHEMA)
    return path


def _snapshot(path):
    conn = sqlite3.connect(path)
    try:
        return [conn.execute(f"SELECT * FROM {t} ORDER BY 1").fetchall() for t in ("customer", "orders", "secret")] + \
            [conn.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY name").fetchall()]
    finally:
        conn.close()


def _arg(value):
    if isinstance(value, dict) and "hex" in value:
        return bytes.fromhex(value["hex"])
    if isinstance(value, dict) and "repeat" in value:
        return value["repeat"] * value["times"]
    return value


def _load():
    with open(CASES, encoding="utf-8") as handle:
        cases = json.load(handle)
    for case in cases:
        assert set(case) <= {"family", "sql", "tables", "read_only", "expect", "why", "args"}, case
        assert case["family"] in {"boundary", "second_statement", "write_in_read", "function", "tables", "bounded"}
        assert case["why"]
    return cases


CORPUS = _load()


def run(path, sql, tables=None, read_only=True, args=(), timeout=5.0):
    grants = None if tables is None else frozenset(tables)
    return backend.run(path, Call(sql, tuple(args), read_only, timeout, 10, tables=grants))


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c['family']}-{i:03d}" for i, c in enumerate(CORPUS)])
def test_engine_corpus(db, case):
    before = _snapshot(db)
    expect = case["expect"]
    try:
        run(db, case["sql"], case["tables"], case["read_only"], [_arg(a) for a in case.get("args", [])])
        got = "ok"
    except QagError as error:
        got = error.code
        assert error.status < 500 or got == "query_failed", (error.status, error.message)
    assert got in (expect if isinstance(expect, list) else [expect]), (case["why"], got)
    if case["read_only"] or got != "ok":
        assert _snapshot(db) == before, case["why"]
    assert not os.path.exists("/tmp/qag-vacuum-copy.db") and not os.path.exists("/tmp/qag-attach.db")


# ------------------------------------------------------------------ how SQLite reports what a statement reads

def record(path, sql):
    """The authorizer's record of preparing `sql` (EXPLAIN compiles without running): every reported action."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    events = []
    conn.set_authorizer(lambda *event: events.append(event) or sqlite3.SQLITE_OK)
    try:
        conn.execute("EXPLAIN " + sql).fetchall()
    finally:
        conn.close()
    return events


def reads(events):
    return {(e[1], e[2], e[3], e[4]) for e in events if e[0] == sqlite3.SQLITE_READ}


def test_cte_body_reads_carry_the_cte_name_as_source(db):
    assert reads(record(db, "WITH x AS (SELECT s FROM secret) SELECT * FROM x")) == {("secret", "s", "main", "x")}
    # A CTE is not a table: no read of "x" itself.
    assert not any(e[1] == "x" for e in record(db, "WITH x AS (SELECT s FROM secret) SELECT * FROM x"))


def test_view_reads_carry_the_view_name_and_the_view_is_read_itself(db):
    got = reads(record(db, "SELECT * FROM outer_view"))
    assert ("secret", "s", "main", "pubsecret") in got and ("secret", "id", "main", "pubsecret") in got
    assert ("pubsecret", "s", "main", "outer_view") in got and ("outer_view", "s", "main", None) in got


def test_flattened_count_of_a_view_reports_the_table_under_it_without_source(db):
    got = reads(record(db, "SELECT count(*) FROM pub"))
    assert ("customer", "", None, None) in got and not any(r[0] == "pub" for r in got)


def test_subqueries_are_reported_as_plain_reads(db):
    got = reads(record(db, "SELECT (SELECT s FROM secret), name FROM customer WHERE id IN (SELECT cid FROM orders)"))
    assert {("secret", "s", "main", None), ("orders", "cid", "main", None)} <= got
    # EXISTS reads no column: the table is reported with column '' and no schema.
    assert ("secret", "", None, None) in reads(record(db, "SELECT 1 WHERE EXISTS (SELECT 1 FROM secret)"))


def test_functions_and_eponymous_tables(db):
    events = record(db, "SELECT upper(name), count(*) FROM customer, json_each('[1]')")
    assert {e[2] for e in events if e[0] == sqlite3.SQLITE_FUNCTION} == {"upper", "count"}
    # Preparing an eponymous virtual table is reported as an UPDATE of the schema table and a read of its ROWID.
    assert any(e[0] == sqlite3.SQLITE_UPDATE and e[1] == "sqlite_master" for e in events)
    assert ("sqlite_master", "ROWID", "main", None) in reads(events)
    # A pragma table function's PRAGMA is reported when it runs (its cursor prepares it), not when prepared.
    events = []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.set_authorizer(lambda *event: events.append(event) or sqlite3.SQLITE_OK)
    conn.execute("SELECT * FROM pragma_table_info('secret')").fetchall()
    conn.close()
    assert (sqlite3.SQLITE_PRAGMA, "table_info", "secret", None, None) in events


def test_builtins_come_from_the_library_and_exclude_what_changes_something():
    names = backend.builtin_functions()
    assert {"upper", "json_extract", "printf", "count", "row_number", "->>"} <= names
    assert not names & {"load_extension", "sqlite_log", "fts3_tokenizer", "match", "highlight"}


def test_a_refused_write_call_leaves_nothing(db):
    before = _snapshot(db)
    with pytest.raises(QagError) as raised:
        run(db, "INSERT INTO customer SELECT id + 100, s FROM secret", ["main.customer"], read_only=False)
    assert raised.value.code == "table_not_allowed"
    # A trigger's write on behalf of a granted write is the trigger's (the key can't create one).
    run(db, "INSERT INTO orders VALUES (50, 1)", ["main.orders"], read_only=False)
    run(db, "DELETE FROM orders WHERE id = 50", ["main.orders"], read_only=False)
    after = _snapshot(db)
    assert after[0] == before[0] and after[1] == before[1]


def test_stream_is_judged_like_run(db):
    with pytest.raises(QagError) as raised:
        backend.stream(db, Call("WITH x AS (SELECT s FROM secret) SELECT * FROM x", (), True, 5.0, 0,
                                tables=frozenset({"main.customer"})), 100, None)
    assert raised.value.code == "table_not_allowed"
    with pytest.raises(QagError) as raised:
        backend.stream(db, Call("SELECT zeroblob(2000000000)", (), True, 5.0, 0), 100, None)
    assert raised.value.code == "value_too_large"
    columns, batches = backend.stream(db, Call("SELECT name FROM pub ORDER BY id", (), True, 5.0, 0,
                                               tables=frozenset({"main.pub"})), 100, None)
    assert [row for batch in batches for row in batch] == [("Ana",), ("Bo",)]


# ------------------------------------------------------------------ bounded cost

def test_limits_are_set_on_every_connection(db):
    conn, _ = backend._open(db, True)
    try:
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == backend.LENGTH_LIMIT
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH) == backend.LIKE_PATTERN_LIMIT
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH) == backend.SQL_LENGTH_LIMIT
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED) == 0
    finally:
        conn.close()


def test_time_limit_holds_for_long_queries(db):
    started = time.monotonic()
    with pytest.raises(QagError) as raised:
        run(db, "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
            timeout=0.5)
    assert raised.value.code == "query_timeout" and time.monotonic() - started < 3
    # Each row a long built-in call (a 1 MB value): the handler still fires between calls.
    started = time.monotonic()
    with pytest.raises(QagError) as raised:
        run(db, "SELECT sum(length(randomblob(1000000 + n % 2))) "
                "FROM (WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT n FROM r)",
            timeout=0.5)
    assert raised.value.code == "query_timeout" and time.monotonic() - started < 5


# ------------------------------------------------------------------ differential: qag's reading vs the engine's

TABLES = ("customer", "orders", "secret", "pub", "pubsecret")
GRANTS = frozenset({"main.customer", "main.pub"})


def _source():
    table = st.sampled_from(TABLES + ("CUSTOMER", '"secret"', "main.orders", "[secret]"))
    leaf = st.one_of(table, st.builds(lambda t: f"(SELECT * FROM {t})", table))
    return leaf


@st.composite
def statements(draw):
    cte_name = draw(st.sampled_from(("x", "customer", "pub", "secret")))
    cte_body = draw(_source())
    outer = draw(_source())
    shape = draw(st.integers(0, 5))
    if shape == 0:
        return f"SELECT count(*) FROM {outer}"
    if shape == 1:
        return f"WITH {cte_name} AS (SELECT * FROM {cte_body}) SELECT count(*) FROM {cte_name}"
    if shape == 2:
        return f"WITH {cte_name} AS (SELECT * FROM {cte_body}) SELECT 1 FROM {outer}"
    if shape == 3:
        return f"SELECT 1 FROM {outer} WHERE EXISTS (SELECT 1 FROM {cte_body})"
    if shape == 4:
        return f"SELECT (SELECT count(*) FROM {cte_body}) FROM {outer}"
    return f"SELECT 1 FROM {outer} UNION SELECT 2 FROM {cte_body}"


def _engine_tables(path, sql):
    """Tables the engine reads for `sql`, directly or through views (qualified), or None if it can't prepare it."""
    events = []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    conn.set_authorizer(lambda *event: events.append(event) or sqlite3.SQLITE_OK)
    try:
        conn.execute("EXPLAIN " + sql).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    views = {"pub", "pubsecret", "outer_view"}
    return {f"{(e[3] or 'main').lower()}.{e[1].lower()}" for e in events
            if e[0] == sqlite3.SQLITE_READ and e[1] and not e[1].startswith("sqlite_")
            and (e[4] is None or e[4].lower() not in views)}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(statements())
def test_engine_reading_within_qags(db, sql):
    engine = _engine_tables(db, sql)
    if engine is None:
        return
    acc = prepare(sql, "sqlite").uses("main")
    # None: uncheckable for qag, so refused (table_check_failed) before the engine is asked.
    qag_tables = None if acc.failure is not None else set(acc.tables)
    missed = engine - qag_tables if qag_tables is not None else set()
    outcome = None
    try:
        run(db, sql, sorted(GRANTS))
    except QagError as error:
        outcome = error.code
    if qag_tables is not None:
        # What the engine reads directly (not on behalf of a view) is a subset of what qag reads, or a table
        # qag missed (SQLite reports the table under a flattened view) is refused by the engine.
        assert not (missed - GRANTS) or outcome == "table_not_allowed", (sql, missed)
        # A key granted exactly what qag read: whatever else the engine reads directly, it refuses.
        try:
            run(db, sql, sorted(qag_tables))
        except QagError as error:
            assert error.code in ("table_not_allowed", "query_failed"), (sql, error.code)
        else:
            # Allowed: every table qag missed lies under a granted view the statement reads.
            under = set()
            for view in qag_tables:
                under |= {f"{(r[2] or 'main')}.{r[0]}" for r in reads(record(db, f"SELECT * FROM {view}"))}
            assert missed <= under, (sql, missed)
    # The engine's own verdict: anything read outside the grants (directly) is refused by it.
    direct = engine - GRANTS
    if direct:
        assert outcome == "table_not_allowed", (sql, direct)



# ------------------------------------------------------------------ the engine alone: write ops, names, R*Tree

GUARDED = """
CREATE TABLE t(a);
CREATE TABLE log(msg);
CREATE TABLE other(y);
CREATE TABLE secret(token);
CREATE TABLE audit(x);
CREATE TABLE numbers(n);
CREATE VIRTUAL TABLE rt USING rtree(id, x0, x1);
INSERT INTO t VALUES (1);
INSERT INTO secret VALUES ('s3cret');
INSERT INTO numbers VALUES (42);
INSERT INTO rt VALUES (1, 0, 5);
CREATE TRIGGER pub_ins AFTER INSERT ON other BEGIN INSERT INTO audit SELECT token FROM secret; END;
CREATE TRIGGER log_ins AFTER INSERT ON log BEGIN INSERT INTO audit SELECT token FROM secret; END;
"""


@pytest.fixture
def guarded(tmp_path):
    path = str(tmp_path / "guarded.db")
    _database(path, GUARDED)
    return path


def write(path, sql, ops=None, tables=None):
    call = Call(sql, (), False, 5.0, 10, tables=None if tables is None else frozenset(tables))
    call.write_ops = None if ops is None else frozenset(ops)
    return backend.run(path, call)


def refused(code, fn, *args, **kw):
    with pytest.raises(QagError) as raised:
        fn(*args, **kw)
    assert raised.value.code == code, raised.value.message
    return raised.value


def count(path, table):
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


def test_write_ops_outside_the_calls_allowed_ones_are_refused_by_the_engine(guarded):
    refused("write_op_not_allowed", write, guarded, "DELETE FROM t", ["insert"])
    refused("write_op_not_allowed", write, guarded, "UPDATE t SET a = 2", ["insert"])
    refused("write_op_not_allowed", write, guarded, "CREATE TABLE made(a)", ["insert"])
    refused("write_op_not_allowed", write, guarded, "DROP TABLE t", ["insert", "delete"])
    refused("write_op_not_allowed", write, guarded, "INSERT INTO t VALUES (2)", [])
    assert count(guarded, "t") == 1
    write(guarded, "INSERT INTO t VALUES (2)", ["insert"])
    write(guarded, "REPLACE INTO t VALUES (3)", ["replace"])
    write(guarded, "SELECT * FROM t, json_each('[1]')", ["insert"])     # the engine's own schema-table write
    # A trigger's own write (into audit) is the schema's, whatever the call's operations.
    write(guarded, "INSERT INTO other VALUES (1)", ["insert"])
    assert count(guarded, "audit") == 1
    write(guarded, "DELETE FROM t WHERE a > 1", ["delete"])
    write(guarded, "DELETE FROM t WHERE a > 1")                           # None: any operation
    assert count(guarded, "t") == 1


def test_a_table_named_like_a_generator_is_checked_like_any_table(guarded):
    refused("table_not_allowed", run, guarded, "SELECT * FROM numbers", ["main.t"])
    refused("table_not_allowed", run, guarded, "SELECT count(*) FROM numbers", ["main.t"])
    refused("table_not_allowed", run, guarded, "WITH x AS (SELECT n FROM numbers) SELECT * FROM x", ["main.t"])
    assert run(guarded, "SELECT * FROM numbers", ["main.numbers"]).rows == [(42,)]
    # The eponymous virtual table of a generator's name still passes.
    assert run(guarded, "SELECT value FROM json_each('[7]')", ["main.t"]).rows == [(7,)]


def test_a_cte_named_like_a_trigger_is_not_the_trigger(guarded):
    # The trigger pub_ins is on another table (it can't fire); log_ins on the very table written.
    for sql in ("WITH pub_ins AS (SELECT token FROM secret) INSERT INTO log(msg) SELECT * FROM pub_ins",
                "WITH log_ins AS (SELECT token FROM secret) INSERT INTO log(msg) SELECT * FROM log_ins"):
        refused("table_not_allowed", write, guarded, sql, tables=["main.log"])
    assert count(guarded, "log") == 0
    # The triggers' own reads and writes, on behalf of a granted write, still run.
    write(guarded, "INSERT INTO log(msg) VALUES ('m')", tables=["main.log"])
    write(guarded, "INSERT INTO other(y) VALUES (1)", tables=["main.other"])
    assert count(guarded, "log") == 1 and count(guarded, "audit") == 2


def test_rtree_reads_and_schema(guarded):
    assert run(guarded, "SELECT * FROM rt").rows == [(1, 0.0, 5.0)]
    assert run(guarded, "SELECT id FROM rt WHERE x0 < 1 AND x1 > 4").rows == [(1,)]
    assert "rt" in {t["name"] for t in backend.read_schema(guarded)["tables"]}
    # Its shadow tables are written only by the R*Tree itself: a read-only call writing one is still refused.
    refused("read_only", run, guarded, "INSERT INTO rt_node VALUES (9, x'00')")
    refused("read_only", run, guarded, "WITH x AS (SELECT * FROM rt) DELETE FROM rt_node")   # mode=ro
    # In a write call the R*Tree's own statements aren't the caller's operations; the caller's are.
    write(guarded, "INSERT INTO rt VALUES (2, 1, 2)", ["insert"])
    refused("write_op_not_allowed", write, guarded, "DELETE FROM rt_node WHERE nodeno = 99", ["insert"])
    refused("write_op_not_allowed", write, guarded, "DELETE FROM rt WHERE id = 2", ["insert"])
    assert run(guarded, "SELECT count(*) FROM rt").rows == [(2,)]


def test_a_file_that_is_not_a_database_is_the_connections_fault(tmp_path):
    path = tmp_path / "passwd"
    path.write_text("root:x:0:0:root:/root:/bin/bash\n" * 50)
    error = refused("connection_misconfigured", run, str(path), "SELECT * FROM sqlite_schema")
    assert error.status == 400
    refused("connection_misconfigured", backend.read_schema, str(path))
    refused("connection_misconfigured", write, str(path), "SELECT * FROM sqlite_schema")


# ------------------------------------------------------------------ pragmas whose value is the process's

def _process_pragma(name):
    conn = sqlite3.connect(":memory:")
    try:
        row = conn.execute(f"PRAGMA {name}").fetchone()
        return None if row is None else row[0]
    finally:
        conn.close()


def test_no_caller_sets_a_process_wide_pragma(guarded, tmp_path):
    # This test's own process is the worker here: what the refused statements would set, it puts back.
    soft, temp = _process_pragma("soft_heap_limit"), _process_pragma("temp_store_directory")
    directory = str(tmp_path).replace("'", "''")
    try:
        for sql in ("PRAGMA soft_heap_limit = 123456", "PRAGMA Soft_Heap_Limit(123456)",
                    "PRAGMA main.soft_heap_limit = 123456", f"PRAGMA temp_store_directory = '{directory}'",
                    f"PRAGMA TEMP_STORE_DIRECTORY('{directory}')", "PRAGMA data_store_directory = ''"):
            refused("pragma_not_allowed", write, guarded, sql)                  # any operation (an administrator)
            refused("pragma_not_allowed", write, guarded, sql, ["pragma"])
            refused("pragma_not_allowed", run, guarded, sql)                    # read-only: the same code
        assert _process_pragma("soft_heap_limit") == soft and _process_pragma("temp_store_directory") == temp
    finally:
        conn = sqlite3.connect(":memory:")
        conn.execute(f"PRAGMA soft_heap_limit = {int(soft)}")
        conn.execute("PRAGMA temp_store_directory = '" + (temp or "").replace("'", "''") + "'")
        conn.close()
    # hard_heap_limit can only be lowered once set, so it is judged without running it: the authorizer denies it.
    authorizer = backend._Authorizer(False, None)
    authorizer.write_ops = None
    assert authorizer(sqlite3.SQLITE_PRAGMA, "hard_heap_limit", "200000", "main", None) == sqlite3.SQLITE_DENY
    assert authorizer.refusal.code == "pragma_not_allowed" and authorizer.refusal.status == 403
    # Querying one only reads; a pragma of the connection alone is still the caller's to set.
    assert run(guarded, "PRAGMA soft_heap_limit").rows == [(soft,)]
    assert write(guarded, "PRAGMA cache_size = 100").columns == []


# ------------------------------------------------------------------ names compared as SQLite compares them

def test_the_engine_folds_ascii_letters_alone(tmp_path):
    path = str(tmp_path / "names.db")
    _database(path, 'CREATE TABLE "ärger"(v); CREATE TABLE "Ärger"(v); CREATE TABLE keys(v); '
                    'CREATE TABLE "\u212Aeys"(v); INSERT INTO "Ärger" VALUES (\'other\'); '
                    'INSERT INTO "\u212Aeys" VALUES (\'kelvin\');')
    grants = ["main.ärger", "main.keys"]
    for sql in ('SELECT * FROM "Ärger"', 'SELECT * FROM "\u212Aeys"', 'SELECT count(*) FROM "\u212Aeys"'):
        refused("table_not_allowed", run, path, sql, grants)
    assert run(path, 'SELECT count(*) FROM "ärger", KEYS', grants).rows == [(0,)]


# ------------------------------------------------------------------ writes counted as what they do

REPLACING = """
CREATE TABLE pk(id INTEGER PRIMARY KEY ON CONFLICT REPLACE, v);
CREATE TABLE uq(id INTEGER PRIMARY KEY, email TEXT, UNIQUE (email) ON CONFLICT REPLACE);
CREATE TABLE nn(id INTEGER PRIMARY KEY, v TEXT NOT NULL ON CONFLICT REPLACE DEFAULT 'd');
CREATE VIRTUAL TABLE ft USING fts5(body);
CREATE VIRTUAL TABLE cl USING fts5(body, content='');
CREATE VIRTUAL TABLE f4 USING fts4(body);
INSERT INTO pk VALUES (1, 'kept');
INSERT INTO uq VALUES (1, 'a@example.com');
INSERT INTO ft VALUES ('hello world');
INSERT INTO cl(rowid, body) VALUES (1, 'hello world');
INSERT INTO f4(docid, body) VALUES (1, 'hello world');
"""


@pytest.fixture
def replacing(tmp_path):
    path = str(tmp_path / "replacing.db")
    _database(path, REPLACING)
    return path


def _fts_rows(path):
    conn = sqlite3.connect(path)
    try:
        return [conn.execute(f"SELECT rowid FROM {t} WHERE {t} MATCH 'hello'").fetchall() for t in ("ft", "cl", "f4")] \
            + [conn.execute("SELECT * FROM pk").fetchall(), conn.execute("SELECT * FROM uq").fetchall(),
               conn.execute("SELECT * FROM ft_config").fetchall()]
    finally:
        conn.close()


def test_a_write_that_deletes_or_changes_rows_needs_those_operations(replacing):
    before = _fts_rows(replacing)
    # A table declared ON CONFLICT REPLACE: a plain INSERT or UPDATE deletes the row it conflicts with.
    for sql, ops in (("INSERT INTO pk VALUES (1, 'new')", ["insert"]),
                     ("INSERT INTO uq(email) VALUES ('a@example.com')", ["insert"]),
                     ("INSERT INTO uq(id, email) VALUES (2, 'b@example.com')", ["insert", "update"]),
                     ("UPDATE uq SET email = 'a@example.com' WHERE id = 9", ["update"])):
        error = refused("write_op_not_allowed", write, replacing, sql, ops)
        assert "ON CONFLICT REPLACE" in error.message
    # FTS commands: the INSERT (or UPDATE) of the column named like the table, in any spelling.
    for sql, ops in (("INSERT INTO ft(ft) VALUES ('delete-all')", ["insert"]),
                     ("INSERT INTO cl(cl) VALUES ('delete-all')", ["insert"]),
                     ("INSERT INTO cl(cl, rowid, body) VALUES ('delete', 1, 'hello world')", ["insert", "delete"]),
                     ('INSERT INTO ft("FT") VALUES (\'rebuild\')', ["insert", "replace"]),
                     ("INSERT INTO ft(ft) VALUES ('optimize')", ["insert", "update"]),
                     ("INSERT INTO ft(ft, rank) VALUES ('rank', 'bm25(10.0)')", ["insert"]),
                     ("INSERT INTO ft(ft, rank) SELECT 'merge', 16", ["insert"]),
                     ("INSERT INTO f4(docid, f4) VALUES (2, 'optimize')", ["insert"]),
                     ("UPDATE ft SET ft = 'delete-all'", ["update"])):
        error = refused("write_op_not_allowed", write, replacing, sql, ops)
        assert "is a command" in error.message
    assert _fts_rows(replacing) == before
    # What only inserts (or updates) still runs: a NOT NULL's REPLACE changes no other row; FTS4's docid is a
    # column of its own; a key allowed to delete may replace.
    write(replacing, "INSERT INTO nn VALUES (1, NULL)", ["insert"])
    write(replacing, "INSERT INTO ft VALUES ('more')", ["insert"])
    write(replacing, "INSERT INTO ft(body) SELECT 'and more'", ["insert"])
    write(replacing, "INSERT INTO f4(docid, body) VALUES (3, 'more')", ["insert"])
    write(replacing, "UPDATE ft SET body = 'hello again' WHERE rowid = 1", ["update"])
    write(replacing, "INSERT INTO pk VALUES (1, 'replaced')", ["insert", "delete"])
    write(replacing, "INSERT INTO ft(ft) VALUES ('optimize')", ["insert", "update", "delete"])
    write(replacing, "INSERT INTO pk VALUES (1, 'again')")                                  # any operation
    assert count(replacing, "pk") == 1 and count(replacing, "ft") == 3


def test_a_view_calling_the_masking_functions_is_refused(tmp_path):
    """A view of the file calling qag's masking functions ran them, on a masked call's connection, with the mask
    key: the hash of any value the view chose (an oracle for hashed columns). Masking puts them only in the
    statement itself (its top level, its own CTEs); from a view or trigger they are refused."""
    path = str(tmp_path / "oracle.db")
    _database(path, "CREATE TABLE people(id INTEGER PRIMARY KEY, ssn TEXT); INSERT INTO people VALUES (1, '1');"
                    "CREATE VIEW oracle AS SELECT qag_mask_hash(value) AS h FROM json_each('[\"123\"]');")
    hashed = ("qag_mask_hash", lambda value: None if value is None else "h:" + str(value))

    def call(sql):
        c = Call(sql, (), True, None, 10)
        c.functions, c.masked = (hashed,), True
        return backend.run(path, c)

    with pytest.raises(QagError) as refused:
        call("SELECT h FROM oracle")
    assert (refused.value.code, refused.value.status) == ("forbidden", 403) and "oracle" in refused.value.message
    with pytest.raises(QagError):
        call("WITH x AS (SELECT h FROM oracle) SELECT h FROM x")
    # Where masking puts them: the statement's top level and its own CTEs.
    assert call("SELECT qag_mask_hash(ssn) AS s FROM people").rows == [("h:1",)]
    assert call("WITH x AS (SELECT qag_mask_hash(ssn) AS s FROM people) SELECT s FROM x").rows == [("h:1",)]


def test_a_locked_database_is_503_and_vacuum_a_clear_400(tmp_path):
    """Found by an attacker review: a call that met a lock held past the busy timeout (a long read holding the
    file) was a 500 query_failed; VACUUM, which can't run in the transaction every call runs in, a 500 too. The
    lock is a moment's unavailability (503, Retry-After; nothing was changed); VACUUM is refused clearly."""
    path = str(tmp_path / "locked.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t(x)")
    holder.execute("BEGIN EXCLUSIVE")
    waiter = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with pytest.raises(sqlite3.OperationalError) as locked:
            waiter.execute("SELECT * FROM t").fetchall()
        error = backend._mapped(locked.value, None, None)
        assert (error.code, error.status, error.extras["retry_after"]) == ("unavailable", 503, 1)
        holder.execute("ROLLBACK")
        waiter.execute("BEGIN")
        with pytest.raises(sqlite3.OperationalError) as vacuum:
            waiter.execute("VACUUM")
        error = backend._mapped(vacuum.value, None, None)
        assert (error.code, error.status) == ("invalid_request", 400) and "VACUUM" in error.message
    finally:
        waiter.close()
        holder.close()


def test_a_call_waits_for_a_lock_no_longer_than_its_time_limit(tmp_path):
    """Fault drill: a call met a lock another process held and waited the whole 10 s busy timeout, whatever its
    time limit (?timeout, the key's query_timeout), holding a request thread. It waits its limit at most."""
    path = str(tmp_path / "held.db")
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t(x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for call in (Call("SELECT * FROM t", (), True, 0.5, 10), Call("INSERT INTO t VALUES (1)", (), False, 0.5, 10)):
            started = time.monotonic()
            error = refused("unavailable", backend.run, path, call)
            assert time.monotonic() - started < 3 and error.extras["retry_after"] == 1
        started = time.monotonic()
        refused("unavailable", backend.stream, path, Call("SELECT * FROM t", (), True, 0.5, 0), 10, None)
        assert time.monotonic() - started < 3
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert backend.run(path, Call("SELECT count(*) FROM t", (), True, 0.5, 10)).rows == [(0,)]


def test_a_warm_masked_or_restricted_call_reads_no_schema(tmp_path, monkeypatch):
    """Review finding: each masked call read sqlite_schema, tokenized every table's DDL and rebuilt the schema in
    an in-memory database (0.36 ms -> 4.2 ms a call on 100 tables); each insert-only write too. What depends on
    the schema alone is kept per file and schema_version: a warm call reads the version alone, and a schema
    change (by any connection) is seen by the next call."""
    path = str(tmp_path / "warm.db")
    _database(path, "CREATE TABLE src(id INTEGER PRIMARY KEY, body TEXT); INSERT INTO src VALUES (1, 'x');"
                    "CREATE VIRTUAL TABLE notes USING fts5(body); INSERT INTO notes VALUES ('note');"
                    "CREATE TABLE log(x);")
    statements, copies = [], []
    connect = sqlite3.connect

    def traced(database, *args, **kwargs):
        opened = connect(database, *args, **kwargs)
        if database == ":memory:":
            copies.append(database)
        else:
            opened.set_trace_callback(statements.append)
        return opened

    masked = functools.partial(_masked_run, path)

    def calls():
        assert masked("SELECT qag_mask_hash(body) AS b FROM notes WHERE rowid = 1").rows == [("h",)]
        assert masked("SELECT qag_mask_hash(body) AS b FROM src").rows == [("h",)]
        write(path, "INSERT INTO notes VALUES ('more')", ["insert"])
        write(path, "INSERT INTO log VALUES (1)", ["insert"])

    monkeypatch.setattr(sqlite3, "connect", traced)
    calls()                                                         # cold: reads the schema once
    assert any("sqlite_schema" in s for s in statements) and copies
    statements.clear(), copies.clear()
    calls()                                                         # warm
    assert statements and copies == []
    assert not [s for s in statements if "sqlite_schema" in s or "pragma_table" in s], statements
    # Another connection's change is the next call's: an FTS table over src's content is refused at once.
    with connect(path) as conn:
        conn.execute("CREATE VIRTUAL TABLE ft USING fts5(body, content='src', content_rowid='id')")
    conn.close()
    with pytest.raises(QagError) as refused:
        masked("SELECT qag_mask_hash(body) AS b FROM ft")
    assert refused.value.code == "mask_unresolvable"
    # A plain call does no schema work at all.
    statements.clear()
    assert backend.run(path, Call("SELECT body FROM src", (), True, 5.0, 10)).rows == [("x",)]
    assert statements == ["SELECT body FROM src"]


def test_a_masked_call_reads_only_virtual_tables_holding_their_own_content(tmp_path):
    """Review finding: fts5vocab and fts4aux tables list a masked FTS table's words in clear. For a masked call a
    virtual table declared in the file is read only when its module holds its own content alone (an allow-list:
    FTS3/4/5 without content=, R*Tree, geopoly); eponymous table functions are judged as before."""
    path = str(tmp_path / "vocab.db")
    _database(path, "CREATE VIRTUAL TABLE notes USING fts5(body); INSERT INTO notes VALUES ('secret words');"
                    "CREATE VIRTUAL TABLE n4 USING fts4(body); INSERT INTO n4 VALUES ('secret words');"
                    "CREATE VIRTUAL TABLE v USING fts5vocab(notes, 'instance');"
                    "CREATE VIRTUAL TABLE \"V2\" USING \"FTS5VOCAB\"(notes, row);"
                    "CREATE VIRTUAL TABLE a4 USING fts4aux(n4);"
                    "CREATE VIEW vv AS SELECT term FROM v;"
                    "CREATE VIRTUAL TABLE box USING rtree(id, x0, x1);"
                    "INSERT INTO box VALUES (1, 0, 1);")

    masked = functools.partial(_masked_run, path)

    for sql in ("SELECT term FROM v", "SELECT term FROM v2", "SELECT term FROM a4", "SELECT term FROM vv",
                "WITH w AS (SELECT term FROM v) SELECT term FROM w", "SELECT (SELECT max(term) FROM a4) AS t"):
        error = refused("mask_unresolvable", masked, sql)
        assert "virtual table of the module" in error.message, (sql, error.message)
    # Without mask rules they read as before; masked, the tables holding their own content still read.
    assert backend.run(path, Call("SELECT term FROM v ORDER BY term", (), True, 5.0, 10)).rows == [("secret",),
                                                                                                ("words",)]
    assert masked("SELECT qag_mask_hash(body) AS b FROM notes").rows == [("h",)]
    assert masked("SELECT qag_mask_hash(body) AS b FROM n4").rows == [("h",)]
    assert masked("SELECT id FROM box").rows == [(1,)]
    assert masked("SELECT value FROM json_each('[1]')").rows == [(1,)]


def _masked_run(path: str, sql: str):
    """A masked call's run of `sql` on the file (its masking function hashes every value to "h")."""
    c = Call(sql, (), True, 5.0, 10)
    c.functions, c.masked = (("qag_mask_hash", lambda value: "h"),), True
    return backend.run(path, c)


def test_a_write_past_its_time_limit_is_a_timeout_whatever_qag_reads_after(tmp_path):
    """Review finding: a restricted write interrupted by its time limit escaped as a raw OperationalError
    ('interrupted', a 500): judging its refusal, qag read the schema on the connection whose progress handler was
    still armed past the deadline. qag's own reads aren't the caller's statement: the handler is off for them."""
    path = str(tmp_path / "slow.db")
    _database(path, "".join(f"CREATE TABLE t{i}(id INTEGER PRIMARY KEY, v TEXT);" for i in range(300))
                    + "CREATE TABLE log(x);")
    call = Call("INSERT INTO log(x) WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT n FROM r",
                (), False, 0.3, 10)
    call.write_ops = frozenset({"insert"})
    with pytest.raises(QagError) as raised:
        backend.run(path, call)
    assert (raised.value.code, raised.value.status) == ("query_timeout", 504)
    assert count(path, "log") == 0


def test_an_insert_overriding_on_conflict_replace_needs_insert_alone(replacing):
    """Review finding: INSERT OR ABORT/FAIL/IGNORE/ROLLBACK and ON CONFLICT DO NOTHING override a table's ON
    CONFLICT REPLACE and delete nothing, yet were refused for an insert-only key. SQLite's compiled program says
    whether the statement deletes the row it meets; an UPSERT naming another constraint still replaces."""
    for sql in ("INSERT OR ABORT INTO pk VALUES (5, 'a')", "INSERT OR FAIL INTO pk VALUES (6, 'b')",
                "INSERT OR IGNORE INTO pk VALUES (1, 'ignored')", "INSERT OR ROLLBACK INTO uq VALUES (7, 'c@x')",
                "INSERT INTO uq(email) VALUES ('a@example.com') ON CONFLICT DO NOTHING"):
        write(replacing, sql, ["insert"])
    assert _fts_rows(replacing)[3] == [(1, "kept"), (5, "a"), (6, "b")]
    assert count(replacing, "uq") == 2
    for sql in ("INSERT INTO pk VALUES (1, 'new')",
                "INSERT INTO uq(id, email) VALUES (1, 'b@x') ON CONFLICT(id) DO NOTHING"):
        error = refused("write_op_not_allowed", write, replacing, sql, ["insert"])
        assert "ON CONFLICT REPLACE" in error.message
    assert _fts_rows(replacing)[3][0] == (1, "kept") and count(replacing, "uq") == 2


def test_a_masked_call_reads_no_fts5_table_over_another_tables_content_however_the_option_is_spelled(tmp_path):
    """Found by a second look: FTS5 takes any prefix of an option's name, so `cont='src'` (or `c='src'`) made an
    external-content table the check missed, and a masked call read src.body through it in clear."""
    path = str(tmp_path / "prefix.db")
    _database(path, "CREATE TABLE src(id INTEGER PRIMARY KEY, body TEXT); INSERT INTO src VALUES (1, 'ssn 1');"
                    "CREATE VIRTUAL TABLE f1 USING fts5(body, cont='src', content_rowid='id');"
                    "CREATE VIRTUAL TABLE f2 USING fts5(body, c='src', content_rowid='id');"
                    "CREATE VIRTUAL TABLE own USING fts5(body, content=''); ")

    masked = functools.partial(_masked_run, path)

    for table in ("f1", "f2"):
        assert backend.run(path, Call(f"SELECT body FROM {table}", (), True, 5.0, 10)).rows == [("ssn 1",)]
        refused("mask_unresolvable", masked, f"SELECT body FROM {table}")
    assert masked("SELECT rowid FROM own").rows == []          # contentless: holds nothing of another table's
