"""Issue 17 on the real PostgreSQL: the server reads and refuses a second statement, a read-only call changes
nothing, no session state reaches another caller, pages are bounded, and caller errors are 4xx.

qag's reading of a statement is PostgreSQL's own parser (pglast); the differential test here checks it against
the server itself on generated statements, so a grammar difference between the library and the server is seen.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("pglast")

from hypothesis import HealthCheck, given, settings as hsettings, strategies as st  # noqa: E402

from qag.backends import postgres as pg  # noqa: E402
from qag.backends.base import Call  # noqa: E402
from qag.errors import QagError  # noqa: E402
from qag.sql import pgread  # noqa: E402
from tests import state_cases  # noqa: E402
from tests.server import Server  # noqa: E402
from tests.state_cases import check_probe  # noqa: E402
from tests.services import make_pg_database  # noqa: E402

BIG = 100_000


def pool(size: int = 1) -> SimpleNamespace:
    return SimpleNamespace(pool_size=size, pool_idle_timeout=300.0, pool_max=None, pool_wait=5.0, query_timeout=10.0,
                           spin_us=200)


def owner_sql(fields: dict, *statements: str) -> list:
    """Run statements as the database's owner on a connection of the test's own; the last one's rows."""
    import psycopg
    with psycopg.connect(autocommit=True, **pg.connect_args(fields)) as conn:
        rows = []
        for statement in statements:
            cur = conn.execute(statement)
            rows = cur.fetchall() if cur.description else []
        return rows


@pytest.fixture(scope="module")
def db():
    fields, cleanup = make_pg_database()
    owner_sql(fields,
              "CREATE TABLE notes (id serial PRIMARY KEY, body text)",
              "CREATE TABLE typed (i int, d date, n numeric(4, 1))",
              f"CREATE TABLE big AS SELECT g AS n FROM generate_series(1, {BIG}) g",
              "CREATE SEQUENCE state_seq")
    yield fields
    cleanup()


@pytest.fixture
def backend():
    made = []

    def make(size: int = 1, kind=pg.PostgresBackend):
        b = kind(pool(size))
        made.append(b)
        return b

    yield make
    for b in made:
        b.close_idle()


def run(backend, fields, sql, args=(), read_only=True, fetch=11, **kw):
    return backend.run(fields, Call(sql, tuple(args), read_only, 10.0, fetch, **kw))


# ------------------------------------------------------------------------------------------- one statement


@pytest.mark.parametrize("statement", [
    "SELECT " + "1+" * 100_000 + "1",                    # 54001 stack depth limit exceeded
    "SELECT " + "(" * 100_000 + "1" + ")" * 100_000,     # 42601 'memory exhausted': the parser's own stack
    "SELECT " + ",".join(["1"] * 1700),                  # 54011 more target-list entries than the server takes
], ids=["stack-depth", "parser-stack", "target-list"])
def test_statements_past_the_servers_limits_are_value_too_large(backend, db, statement):
    """The statement's size, as SQLite's and MariaDB's limits are: 400 value_too_large, not a 500; the connection
    goes on serving."""
    b = backend()
    with pytest.raises(QagError) as info:
        run(b, db, statement)
    assert (info.value.code, info.value.status) == ("value_too_large", 400), info.value.extras
    assert run(b, db, "SELECT 7").rows == [(7,)]


@pytest.mark.parametrize("read_only", [True, False], ids=["read", "write"])
def test_the_server_refuses_a_second_statement_past_the_guard(backend, db, read_only):
    b = backend()
    second = "INSERT INTO notes (body) VALUES ('second statement ran')"
    for text in (f"SELECT 1; {second}", f"SELECT 'a\\'; {second}; --'", f"SELECT $$x$$; {second}",
                 f"SELECT 1 /* c */; {second}"):
        with pytest.raises(QagError) as info:
            run(b, db, text, read_only=read_only)
        assert info.value.code == "multiple_statements" and info.value.status == 400, text
    assert owner_sql(db, "SELECT count(*) FROM notes WHERE body = 'second statement ran'") == [(0,)]
    # The pool still serves the next call.
    assert run(b, db, "SELECT 7 AS v").rows == [(7,)]


def test_a_commit_inside_a_read_only_call_cannot_open_a_writable_one(backend, db):
    b = backend()
    # A read-only call is one statement in a BEGIN READ ONLY block: whatever transaction control it runs, nothing
    # of the caller's runs after it, and a chained transaction keeps the block's READ ONLY.
    for text in ("COMMIT", "BEGIN", "ROLLBACK", "COMMIT AND CHAIN", "ROLLBACK AND CHAIN"):
        assert run(b, db, text).rows == [], text
        assert run(b, db, "SELECT current_setting('transaction_read_only') AS ro").rows == [("on",)]
    with pytest.raises(QagError) as info:
        run(b, db, "INSERT INTO notes (body) VALUES ('after commit')")
    assert info.value.code == "read_only"
    # BEGIN READ ONLY is the call's only read-only switch: the call's settings statement is its transaction's
    # first query, after which the server refuses to turn the mode off, by statement or by function.
    for text in ("SET TRANSACTION READ WRITE", "SELECT set_config('transaction_read_only', 'off', true) AS v"):
        with pytest.raises(QagError) as info:
            run(b, db, text)
        said = f"{info.value.message} {info.value.extras.get('detail', '')}"
        assert "read-write mode must be set before any query" in said, (text, said)
    assert owner_sql(db, "SELECT count(*) FROM notes WHERE body = 'after commit'") == [(0,)]


# ------------------------------------------------------------------------------------------- writes in functions


def test_what_postgresql_lets_through_a_read_only_transaction_is_rolled_back(backend, db):
    """Past the guard (straight to the backend): large-object writes, notifications and session settings that
    PostgreSQL 15 allows in a read-only transaction are undone, since a read-only call ends with ROLLBACK."""
    b = backend()
    before = owner_sql(db, "SELECT count(*) FROM pg_largeobject_metadata")
    assert run(b, db, "SELECT lo_from_bytea(0, 'x') IS NOT NULL AS made").rows == [(True,)]
    assert owner_sql(db, "SELECT count(*) FROM pg_largeobject_metadata") == before
    import psycopg
    with psycopg.connect(autocommit=True, **pg.connect_args(db)) as listener:
        listener.execute("LISTEN qag_issue17")
        run(b, db, "SELECT pg_notify('qag_issue17', 'from a read')")
        time.sleep(0.2)
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    with pytest.raises(QagError) as info:
        run(b, db, "SELECT nextval('state_seq')")
    assert info.value.code == "read_only"


def test_writing_functions_are_refused_for_a_read_only_key_and_run_for_a_writer(http, db):
    server, keys = http
    for statement in ("SELECT lo_import('/etc/hostname')", "SELECT lo_from_bytea(0, 'x')",
                      "SELECT pg_catalog.nextval('state_seq')", "SELECT pg_advisory_lock(1)",
                      "SELECT pg_notify('c', 'x')", "SELECT * FROM notes WHERE id = setval('state_seq', 5)",
                      # an xid assigned is not given back by the read-only call's ROLLBACK
                      "SELECT txid_current()", "SELECT pg_current_xact_id()",
                      "SELECT pg_catalog.txid_current()", "SELECT pg_catalog.pg_current_xact_id()"):
        r = sql(server, statement, key=keys["read"][0])
        assert r.status == 403 and r.json["code"] == "read_only", (statement, r)
    r = sql(server, "SELECT nextval('state_seq') > 0 AS advanced", key=keys["write"][0])
    assert r.status == 200 and r.json == [{"advanced": True}], r


# ------------------------------------------------------------------------------------------- session state


def sql(server: Server, statement: str, key="admin", **body):
    return server.post("/execute_sql", {"sql": statement, "connection_name": "pg", **body}, key=key)


@pytest.fixture(scope="module")
def http(db):
    server = Server(env={"QAG_POOL_SIZE": "1", "QAG_ALLOW_WRITES": "1"}, workers=1)
    reply = server.post("/api/v1/connections", {"name": "pg", "db": "postgres", **db})
    assert reply.status == 201, reply
    keys = {}
    for kind in ("read", "write"):
        keys[kind] = []
        for i in (1, 2):
            reply = server.post("/api/v1/api-keys", {"name": f"state-{kind}-{i}", "connections": ["pg"],
                                                     "allow_writes": kind == "write"})
            assert reply.status == 201, reply
            keys[kind].append(reply.json["secret"])
    state_cases.assert_one_connection(keys, lambda key: sql(server, "SELECT pg_backend_pid() AS pid", key=key).json)
    yield server, keys
    server.close()


@pytest.mark.e2e
@pytest.mark.parametrize("setter_kind,setter,probe_kind,probe,expect", state_cases.cases("postgres"))
def test_session_state_never_reaches_another_caller(http, setter_kind, setter, probe_kind, probe, expect):
    server, keys = http
    pid = sql(server, "SELECT pg_backend_pid() AS pid", key=keys[setter_kind][0]).json[0]["pid"]
    r = sql(server, setter, key=keys[setter_kind][0])
    assert r.status == 200, r
    # The state is undone on the same pooled connection (the reset), unless the case closes it.
    after = sql(server, "SELECT pg_backend_pid() AS pid", key=keys[probe_kind][1]).json[0]["pid"]
    assert (after != pid) if expect.get("closed") else (after == pid)
    check_probe(sql(server, probe, key=keys[probe_kind][1]), expect)


# ------------------------------------------------------------------------------------------- bounded pages


def test_a_page_of_a_compound_query_is_all_the_driver_receives(backend, db):
    received = []

    class Watched(pg.PostgresBackend):   # a subclass: the compiled backend's type can't be patched
        def _attempt(self, *args):
            # The segment's one result with rows (every other statement of a page, MOVE included, returns none).
            result, names = super()._attempt(*args)
            received.append(0 if result is None else result.ntuples)
            return result, names

    b = backend(kind=Watched)
    statement = "SELECT n FROM big UNION ALL SELECT n FROM big ORDER BY 1"
    result = run(b, db, statement, fetch=11, skip=20, cursor=True)
    assert [row[0] for row in result.rows] == [11, 11, 12, 12, 13, 13, 14, 14, 15, 15, 16]
    assert max(received) == 11
    received.clear()
    assert run(b, db, "(SELECT n FROM big ORDER BY n DESC)", fetch=3, cursor=True).rows == [(BIG,), (BIG - 1,), (BIG - 2,)]
    assert max(received) == 3


@pytest.mark.e2e
def test_http_pages_of_a_compound_query(http):
    server, _ = http
    # A query that starts with a parenthesis gets no window in its SQL on PostgreSQL: the engine pages it.
    r = server.post("/execute_sql?page=3&page_size=4", {"sql": "(SELECT n FROM big) UNION (SELECT 0) ORDER BY 1",
                                                        "connection_name": "pg"})
    assert r.status == 200 and [row["n"] for row in r.json] == [8, 9, 10, 11], r
    assert r.headers["x-has-more"] == "true"


@pytest.mark.e2e
def test_a_quoted_name_is_a_table_of_its_own_for_the_allow_list(http, db):
    """PostgreSQL compares names as folded: a grant for notes covers notes, never a quoted "Notes"."""
    server, _ = http
    owner_sql(db, 'CREATE TABLE IF NOT EXISTS "Notes" (secret text)', """INSERT INTO "Notes" VALUES ('upper')""")
    reply = server.post("/api/v1/api-keys", {"name": "notes-only", "connections": ["pg"], "allowed_tables": ["notes"]})
    key = reply.json["secret"]
    assert sql(server, "SELECT count(*) AS n FROM notes", key=key).status == 200
    r = sql(server, 'SELECT secret FROM "Notes"', key=key)
    assert r.status == 403 and r.json["code"] == "table_not_allowed" and b"upper" not in r.body, r
    listed = [t["name"] for t in server.get("/connections/pg/schema", key=key).json["tables"]]
    assert listed == ["notes"], listed


# ------------------------------------------------------------------------------------------- caller errors


def test_caller_errors_are_4xx_with_the_callers_own_text(backend, db):
    b = backend()
    cases = [("SELECT 'abc'::int", (), "value_invalid", 400), ("SELECT 1 / 0", (), "value_invalid", 400),
             ("INSERT INTO typed (d) VALUES ($1)", ("2024-02-31",), "value_invalid", 400),
             ("INSERT INTO typed (n) VALUES ($1)", (12345.5,), "value_invalid", 400),
             ("SELECT $1::text", ("nul\x00byte",), "param_invalid", 400),
             ("SELECT $1::text", ("\ud800",), "param_invalid", 400)]
    for statement, args, code, status in cases:
        with pytest.raises(QagError) as info:
            run(b, db, statement, args, read_only=False)
        assert (info.value.code, info.value.status) == (code, status), statement
    with pytest.raises(QagError) as info:
        run(b, db, "SELECT 1\nFRM notes", cursor=True)
    detail = info.value.extras["detail"]
    assert "LINE 2: FRM notes" in detail and "DECLARE" not in detail and "set_config" not in detail
    assert run(b, db, "SELECT 3 AS ok").rows == [(3,)]


@pytest.mark.e2e
def test_a_nul_in_the_statement_is_400_before_anything_runs(http, db):
    """The server (and pglast) end the statement at a NUL, while qag's tokenizer read on and bound the :names after
    it: `... WHERE id = :v \0 AND id = 2` ran as `... WHERE id = $1`. Refused as SQLite refuses it."""
    server, keys = http
    owner_sql(db, "INSERT INTO notes (id, body) VALUES (1017, 'nul')")
    try:
        for statement in ("SELECT id FROM notes WHERE id = :v \x00 AND id = 2", "SELECT id FROM notes -- \x00",
                          "SELECT id FROM notes WHERE id = :v\x00"):
            for key in ("admin", keys["read"][0], keys["write"][0]):
                r = sql(server, statement, key=key, params={"v": 1017})
                assert r.status == 400 and r.json["code"] == "value_invalid" and "NUL" in r.json["error"], (key, r)
        r = sql(server, "SELECT id FROM notes WHERE id = :v", params={"v": 1017})
        assert r.status == 200 and r.json == [{"id": 1017}], r
    finally:
        owner_sql(db, "DELETE FROM notes WHERE id = 1017")


@pytest.mark.parametrize("read_only", [True, False], ids=["read", "write"])
def test_a_cancel_by_someone_else_is_query_failed_not_a_timeout(backend, db, read_only):
    """pg_cancel_backend from another session (an operator's) 0.5 s into a call with a 20 s limit: answered as
    MariaDB's KILL QUERY is, 500 query_failed with the server's text, never 504 "exceeded the time limit of 20
    seconds". The statement was rolled back, so a write's outcome is known (no outcome: unknown)."""
    import threading
    b = backend()
    marker = f"cancel_me_{'read' if read_only else 'write'}"
    statement = (f"SELECT pg_sleep(3) AS {marker}" if read_only
                 else f"INSERT INTO notes (body) SELECT '{marker}' FROM pg_sleep(3)")
    call = Call(statement, (), read_only, 20.0, 11)
    call.writes = not read_only
    outcome = {}

    def call_it():
        try:
            b.run(db, call)
        except QagError as error:
            outcome["error"] = error

    worker = threading.Thread(target=call_it)
    started = time.monotonic()
    worker.start()
    try:
        pids = []
        while not pids and time.monotonic() < started + 2.5:
            time.sleep(0.05)
            pids = owner_sql(db, "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE "
                                 f"'%{marker}%' AND pid <> pg_backend_pid()")
        assert len(pids) == 1, pids
        assert owner_sql(db, f"SELECT pg_cancel_backend({pids[0][0]})") == [(True,)]
    finally:
        worker.join(10)
    error = outcome["error"]
    assert time.monotonic() - started < 3
    assert (error.code, error.status) == ("query_failed", 500), error
    assert "canceling statement due to user request" in error.extras["detail"], error.extras
    assert "outcome" not in error.extras and "timeout" not in error.extras
    assert owner_sql(db, f"SELECT count(*) FROM notes WHERE body = '{marker}'") == [(0,)]
    # The time limit itself is still a timeout.
    with pytest.raises(QagError) as info:
        b.run(db, Call("SELECT pg_sleep(3)", (), read_only, 0.5, 11))
    assert (info.value.code, info.value.status, info.value.extras["timeout"]) == ("query_timeout", 504, 0.5)


def test_a_login_the_server_refuses_is_connection_failed(backend, db):
    b = backend()
    # (A wrong password can't be shown here: this server trusts loopback logins.)
    for fields in (dict(db, database=db["database"] + "_missing", password="pw-in-the-fields"),
                   dict(db, user="qag_no_such_role", password="pw-in-the-fields")):
        with pytest.raises(QagError) as info:
            run(b, fields, "SELECT 1")
        assert info.value.code == "connection_failed" and info.value.status == 502
        assert "pw-in-the-fields" not in json.dumps(info.value.extras)


# ------------------------------------------------------------------------------------------- the parser vs the server

_PIECES = st.sampled_from([
    "'m'", "'a;b'", "'it''s'", "E'e\\'s;'", "$$d;'$$", "$q$ $$ ; $q$", "U&'\\0041'", "'\\'", "/* c ; */",
    "/* a /* nested ; */ b */", "-- line ;\n", '"Q;id"', ",", ";", "1", "x", "AS", "'--'", "E'\\\\'", "\n",
])


@pytest.fixture(scope="module")
def differential(db):
    b = pg.PostgresBackend(pool(1))
    yield b
    b.close_idle()


@hsettings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(pieces=st.lists(_PIECES, min_size=1, max_size=8))
def test_the_parser_reads_statements_as_the_server_does(differential, db, pieces):
    """Statement count and which literal is which: what pglast reads is what the server runs."""
    text = "SELECT " + " ".join(pieces)
    reading = pgread.read(text)
    try:
        result = differential.run(db, Call(text, (), True, 5.0, 2))
        outcome = ("ran", [tuple(result.columns), result.rows])
    except QagError as error:
        outcome = (error.code, None)
    if reading.failure is not None:
        assert outcome[0] != "ran", (text, reading.failure, outcome)
    elif reading.count > 1:
        assert outcome[0] == "multiple_statements", (text, outcome)
    elif outcome[0] == "ran":
        expected = _constants(text)
        if expected is not None:
            assert list(outcome[1][1][0]) == expected, (text, outcome)


def _constants(text: str):
    """The values of a one-statement SELECT list made only of constants, as the parser reads them; else None."""
    from pglast import parser
    tree = json.loads(parser.parse_sql_json(text))
    targets = tree["stmts"][0]["stmt"].get("SelectStmt", {}).get("targetList") or []
    values = []
    for target in targets:
        const = target["ResTarget"]["val"].get("A_Const")
        if const is None or "sval" not in const:
            return None
        values.append(const["sval"]["sval"])
    return values or None


# ------------------------------------------------------------------------------- the reset in the call's reply


def advisory_locks(fields: dict, key: int) -> int:
    return owner_sql(fields, f"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = {key}")[0][0]


def test_a_read_only_call_is_pooled_reset_with_nothing_left_to_read(backend, db, monkeypatch):
    """A read-only call's reset runs in the call's own segment, after its ROLLBACK: when the call returns, the
    session lock it took is already released, and its connection goes back to the pool with no reply left to
    read, so the next call on it reads no reset first."""
    b = backend(1)
    reads = []
    real = pg._Link.read_reset
    monkeypatch.setattr(pg._Link, "read_reset", lambda self, deadline: reads.append(1) or real(self, deadline))
    first = run(b, db, "SELECT pg_backend_pid() AS pid, pg_advisory_lock(4343) IS NOT NULL AS locked").rows[0]
    assert first[1] is True
    assert advisory_locks(db, 4343) == 0          # released before the response, not when the connection is next used
    second = run(b, db, "SELECT pg_backend_pid() AS pid, count(*) AS locks FROM pg_locks "
                        "WHERE locktype = 'advisory' AND pid = pg_backend_pid()").rows[0]
    assert second == (first[0], 0) and reads == []


def test_a_server_that_refuses_the_reset_in_the_call_segment(backend, db, monkeypatch, caplog):
    """If the server refuses the reset after the call's transaction (as PostgreSQL refuses DISCARD ALL where it
    can't run), the call, which ran and ended, still answers; its connection is closed, never pooled unreset; the
    refusal is logged once, and that server's calls then reset in a segment of their own, pooled again."""
    b = backend(1)
    monkeypatch.setattr(pg, "_DISCARD", b"DISCARD ALL REFUSED")   # a reset the server refuses there
    with caplog.at_level("WARNING", logger="qag"):
        first = run(b, db, "SELECT pg_backend_pid() AS pid, pg_advisory_lock(4444) IS NOT NULL AS n").rows[0]
        second = run(b, db, "SELECT pg_backend_pid() AS pid, pg_advisory_lock(4444) IS NOT NULL AS n").rows[0]
        third = run(b, db, "SELECT pg_backend_pid() AS pid, count(*) AS locks FROM pg_locks "
                           "WHERE locktype = 'advisory' AND pid = pg_backend_pid()").rows[0]
    assert first[1] is True and second[1] is True
    assert second[0] != first[0]                  # the connection the failed reset left was closed
    assert third == (second[0], 0)                # the reset in its own segment ran, and pooled its connection
    assert caplog.text.count("refused DISCARD ALL") == 1 and "42601" in caplog.text


def separate_resets(b, fields: dict) -> None:
    """Make the backend reset read-only calls in a segment of their own (as after a server refused the reset in
    the call's), the shape whose reply is read when the connection is next taken."""
    version = owner_sql(fields, "SELECT current_setting('server_version_num')::int")[0][0]
    b._own_segment.add(version)


def test_a_read_taken_before_its_reset_reply_arrived_runs_behind_the_reset(backend, db, monkeypatch):
    """A read-only call on a connection whose reset reply has not arrived yet sends its own segment right behind
    the reset (one wait for both): the server runs the reset first, so a session lock the previous caller left
    is gone, on the same server connection."""
    b = backend(1)
    separate_resets(b, db)
    first = run(b, db, "SELECT pg_backend_pid() AS pid, pg_advisory_lock(4242) IS NOT NULL AS locked").rows[0]
    monkeypatch.setattr(pg._Link, "readable", lambda self: False)   # as if the reset reply were still on its way
    second = run(b, db, "SELECT pg_backend_pid() AS pid, count(*) AS locks FROM pg_locks "
                        "WHERE locktype = 'advisory' AND pid = pg_backend_pid()").rows[0]
    assert second == (first[0], 0)


def test_a_failed_reset_ahead_of_a_read_drops_its_results_and_runs_it_on_a_fresh_connection(backend, db, monkeypatch):
    b = backend(1)
    separate_resets(b, db)
    first_pid = run(b, db, "SELECT pg_backend_pid()").rows[0][0]
    monkeypatch.setattr(pg._Link, "readable", lambda self: False)
    failed = []
    real = pg._Link.read_reset

    def fail_once(self, deadline):
        ok = real(self, deadline)
        if not failed:
            failed.append(ok)
            return False
        return ok
    monkeypatch.setattr(pg._Link, "read_reset", fail_once)
    pid, n = run(b, db, "SELECT pg_backend_pid(), 7").rows[0]
    assert failed == [True] and n == 7 and pid != first_pid
    assert run(b, db, "SELECT pg_backend_pid()").rows[0][0] == pid   # the fresh one is pooled, the failed one gone


def test_a_write_waits_for_the_reset_reply_before_it_is_sent(backend, db, monkeypatch):
    seen = []

    class Watched(pg.PostgresBackend):   # a subclass: the compiled backend's type can't be patched
        def _attempt(self, link, call, *args):
            seen.append(link.pending)
            return super()._attempt(link, call, *args)

    b = backend(1, kind=Watched)
    separate_resets(b, db)
    run(b, db, "INSERT INTO notes (body) VALUES ('before a reset')", read_only=False)   # a write's reset: own segment
    run(b, db, "SELECT 1")
    monkeypatch.setattr(pg._Link, "readable", lambda self: False)
    seen.clear()
    run(b, db, "INSERT INTO notes (body) VALUES ('after a reset')", read_only=False)
    run(b, db, "SELECT 1")
    assert seen == [False, True]   # the write found its reset read; the read went behind its connection's reset


@pytest.mark.e2e
def test_dblink_connections_never_reach_another_caller(http, db):
    """dblink's connections live outside everything DISCARD ALL resets: one a caller opened stayed on the pooled
    session, and the next caller queried the remote database through it, with the first one's credentials. A
    statement naming dblink has its connection closed, not pooled."""
    from tests.services import pg_admin
    admin = pg_admin(db["database"])
    admin.cursor().execute("CREATE EXTENSION IF NOT EXISTS dblink")
    # dblink_connect refuses a password-less (trust) login to non-superusers; the _u variant, granted, doesn't.
    admin.cursor().execute(f'GRANT EXECUTE ON FUNCTION dblink_connect_u(text, text) TO "{db["user"]}"')
    admin.close()
    server, keys = http
    setter, probe = keys["write"]
    conninfo = (f"host={db['host']} port={db['port']} dbname={db['database']} user={db['user']} "
                f"password={db['password']}")
    r = sql(server, f"SELECT dblink_connect_u('qag_state_link', '{conninfo}') AS v", key=setter)
    assert r.status == 200 and r.json == [{"v": "OK"}], r
    r = sql(server, "SELECT dblink_get_connections() AS v", key=probe)
    assert r.status == 200 and r.json == [{"v": None}], r
