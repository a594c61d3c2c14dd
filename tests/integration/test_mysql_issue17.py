"""Issue 17 on the real MariaDB/MySQL: names compared as the server compares them, one statement enforced by the
driver, no session state between callers, writes hidden in functions, bounded pages, caller errors as 4xx."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from qag.backends.base import Call
from qag.errors import QagError
from qag.sql.prepare import prepare, render
from tests import state_cases
from tests.server import Server
from tests.state_cases import check_probe
from tests.services import make_mysql_database, mysql_admin

MySQLdb = pytest.importorskip("MySQLdb")
from MySQLdb.constants import CLIENT  # noqa: E402

from qag.backends import _mysql_schema  # noqa: E402
from qag.backends.mysql import MysqlBackend, mapped  # noqa: E402

BIG = 100_000


def settings(pool_size: int = 1) -> SimpleNamespace:
    return SimpleNamespace(pool_size=pool_size, pool_idle_timeout=300.0, pool_max=None, pool_wait=5.0, spin_us=200)


@pytest.fixture(scope="module")
def db():
    fields, cleanup = make_mysql_database()
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"USE `{fields['database']}`")
    # Two distinct tables whose names differ in case only (lower_case_table_names=0 keeps them apart).
    cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, what VARCHAR(20))")
    cur.execute("CREATE TABLE ORDERS (id INT PRIMARY KEY, what VARCHAR(20))")
    cur.execute("INSERT INTO orders VALUES (1, 'lower')")
    cur.execute("INSERT INTO ORDERS VALUES (1, 'UPPER secret')")
    cur.execute("CREATE TABLE state_seven (n INT PRIMARY KEY)")
    cur.executemany("INSERT INTO state_seven VALUES (%s)", [(i,) for i in range(1, 8)])
    cur.execute("CREATE TABLE state_rows (v INT)")
    cur.execute("CREATE TABLE state_auto (id INT AUTO_INCREMENT PRIMARY KEY, v INT)")
    cur.execute("CREATE TABLE typed (i INT, d DATE, v VARCHAR(5), t TEXT, u VARCHAR(10) CHARACTER SET utf8mb3)")
    cur.execute("CREATE TABLE big (n INT PRIMARY KEY)")
    # A stored function that leaves tracing on for its session: the trace then holds the next callers' statements.
    cur.execute("CREATE FUNCTION trace_on() RETURNS INT NOT DETERMINISTIC "
                "BEGIN SET SESSION optimizer_trace = 'enabled=on'; RETURN 1; END")
    # ... and one that reads the trace without naming it in the caller's statement
    cur.execute("CREATE FUNCTION last_trace() RETURNS TEXT NOT DETERMINISTIC READS SQL DATA "
                "RETURN (SELECT QUERY FROM information_schema.OPTIMIZER_TRACE LIMIT 1)")
    cur.execute(f"INSERT INTO big SELECT seq FROM seq_1_to_{BIG}")
    mariadb = "mariadb" in admin.get_server_info().lower()
    if mariadb:
        cur.execute("CREATE SEQUENCE state_seq")
        cur.execute("CREATE SEQUENCE seq17")
    lctn = admin_value("SELECT @@lower_case_table_names")
    yield SimpleNamespace(fields=fields, name=fields["database"], mariadb=mariadb, lctn=int(lctn))
    admin.close()
    cleanup()


def admin_value(sql: str, args=None):
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        cur.execute(sql, args)
        return cur.fetchone()[0]
    finally:
        admin.close()


def _server(db, **env) -> Server:
    server = Server(env={"QAG_POOL_SIZE": "1", **env}, workers=1)
    reply = server.post("/api/v1/connections", {"name": "my", "db": "mysql", **db.fields})
    assert reply.status == 201, reply
    return server


def _key(server: Server, name: str, **grants) -> str:
    reply = server.post("/api/v1/api-keys", {"name": name, "connections": ["my"], **grants})
    assert reply.status == 201, reply
    return reply.json["secret"]


def sql(server: Server, statement: str, key="admin", **body):
    return server.post("/execute_sql", {"sql": statement, "connection_name": "my", **body}, key=key)


@pytest.fixture(scope="module")
def server(db):
    server = _server(db, QAG_ALLOW_WRITES="1")
    yield server
    server.close()


# ------------------------------------------------------------------------------------------- names (goal 2)


def test_server_facts_are_read_once_per_connection(db):
    backend = MysqlBackend(settings())
    try:
        assert backend.run(db.fields, Call("SELECT 1", (), True, 10.0, 2)).rows == [(1,)]
        (idle,) = backend.pool.idle()
        assert idle.names.lower_case_table_names == db.lctn
        assert _mysql_schema.server_names(db.fields) == idle.names
        admin_sql_mode = admin_value("SELECT @@GLOBAL.sql_mode")
        assert idle.names.sql_mode == frozenset(m for m in admin_sql_mode.split(",") if m)
    finally:
        backend.close_idle()



def _reading_ansi_quotes(link) -> None:
    """Turn a pooled connection's session into one opened while the server's mode had ANSI_QUOTES: its session
    mode, and its facts as _open reads them."""
    cur = link.conn.cursor()
    cur.execute("SET SESSION sql_mode = CONCAT(@@session.sql_mode, ',ANSI_QUOTES')")
    cur.execute(_mysql_schema.FACTS_QUERY)
    link.names = _mysql_schema.parse_facts(cur.fetchone())
    cur.close()
    assert not link.names.text_read_by_default


# `'a' "b"`: two strings run together ('ab') in MySQL's default reading, 'a' named b under ANSI_QUOTES.
_READING = "SELECT 'a' \"b\""


def _masked(sql: str) -> Call:
    call = Call(sql, (), True, 10.0, 2)
    call.default_text = True      # what the run path sets for a masked call (masking traced the default reading)
    return call


def test_the_run_path_marks_masked_mysql_calls_only():
    from qag.api.run import _pin_names
    for dialect, mask, marked in (("mysql", object(), True), ("mysql", None, False), ("postgres", object(), False)):
        call = Call("SELECT 1", (), True, 10.0, 2)
        _pin_names(call, SimpleNamespace(mask=mask, prepared=SimpleNamespace(dialect=dialect), database=None), None, {})
        assert call.default_text is marked, (dialect, mask)


def test_a_masked_call_never_runs_on_a_session_that_reads_text_otherwise(db):
    """Masking decides by the server's mode as the last connection opened reported it; a pooled connection opened
    before an administrator changed the mode still reads quotes its own way, so a masked call checks the session it
    is given: an older one is closed and the call runs on a connection that reads text as the trace did."""
    backend = MysqlBackend(settings())
    try:
        backend.run(db.fields, Call("SELECT 1", (), True, 10.0, 2))
        (stale,) = backend.pool.idle()
        _reading_ansi_quotes(stale)
        assert backend.run(db.fields, Call(_READING, (), True, 10.0, 2)).rows == [("a",)]   # unmasked: served there
        assert backend.run(db.fields, _masked(_READING)).rows == [("ab",)]
        (fresh,) = backend.pool.idle()
        assert fresh is not stale and fresh.names.text_read_by_default and not stale.conn.open
    finally:
        backend.close_idle()


def test_a_masked_call_is_refused_when_the_servers_mode_reads_text_otherwise_now(db):
    class OpensInAnsiQuotes(MysqlBackend):       # every new session as the server's mode would open it now
        def _open(self, fields, read_only, deadline=None):
            link = super()._open(fields, read_only, deadline)
            _reading_ansi_quotes(link)
            return link

    backend = OpensInAnsiQuotes(settings())
    try:
        with pytest.raises(QagError) as refused:
            backend.run(db.fields, _masked(_READING))
        assert refused.value.code == "mask_unresolvable" and "sql_mode" in refused.value.message
        (kept,) = backend.pool.idle()       # the server's mode as it is: fine for a caller without rules
        assert backend.run(db.fields, Call(_READING, (), True, 10.0, 2)).rows == [("a",)]
        assert backend.pool.idle() == [kept]
        with pytest.raises(QagError) as streamed:
            backend.stream(db.fields, _masked(_READING), 10, None)
        assert streamed.value.code == "mask_unresolvable"
    finally:
        backend.close_idle()


def test_under_sql_mode_oracle_a_table_restricted_call_is_refused_and_a_sequence_never_moves(db):
    """MariaDB's sql_mode=ORACLE parses another grammar: `seq.nextval` is a sequence call there, a column to qag's
    reading (no table, no write). A table-restricted or masked call is refused on such a session before anything
    runs; a caller without rules is served on it (the server's mode as the administrator set it)."""
    if not db.mariadb:
        pytest.skip("sql_mode=ORACLE is MariaDB's")

    class OpensInOracleMode(MysqlBackend):
        def _open(self, fields, read_only, deadline=None):
            link = super()._open(fields, read_only, deadline)
            cur = link.conn.cursor()
            cur.execute("SET SESSION sql_mode = 'ORACLE'")
            cur.execute(_mysql_schema.FACTS_QUERY)
            link.names = _mysql_schema.parse_facts(cur.fetchone())
            cur.close()
            return link

    backend = OpensInOracleMode(settings())
    admin = mysql_admin()
    admin.cursor().execute(f"CREATE SEQUENCE `{db.name}`.oracle_probe")
    try:
        for read_only in (True, False):
            restricted = Call("SELECT oracle_probe.nextval", (), read_only, 10.0, 2)
            restricted.schema, restricted.tables = db.name, frozenset({f"{db.name}.orders"})
            with pytest.raises(QagError) as refused:
                backend.run(db.fields, restricted)
            assert (refused.value.code, refused.value.status) == ("table_check_failed", 403)
            assert "ORACLE" in refused.value.message
        with pytest.raises(QagError) as streamed:
            backend.stream(db.fields, restricted, 10, None)
        assert streamed.value.code == "table_check_failed"
        with pytest.raises(QagError) as masked:
            backend.run(db.fields, _masked("SELECT 1 FROM DUAL"))
        assert masked.value.code == "mask_unresolvable" and "ORACLE" in masked.value.message
        assert backend.run(db.fields, Call("SELECT 7 FROM DUAL", (), True, 10.0, 2)).rows == [(7,)]
        assert admin_value(f"SELECT next_not_cached_value FROM `{db.name}`.oracle_probe") == 1   # never moved
    finally:
        backend.close_idle()
        admin.cursor().execute(f"DROP SEQUENCE IF EXISTS `{db.name}`.oracle_probe")
        admin.close()


@pytest.mark.e2e
def test_a_grant_for_orders_does_not_cover_ORDERS(server, db):
    if db.lctn != 0:
        pytest.skip("the server compares table names case-insensitively (lower_case_table_names != 0)")
    lower = _key(server, "names-lower", allowed_tables=["orders"])
    # Grants are stored lower-case (contract 6.2): one written `ORDERS` is `orders`, and never reads ORDERS.
    upper = _key(server, "names-upper", allowed_tables=["ORDERS"])
    r = sql(server, "SELECT what FROM orders", key=lower)
    assert r.status == 200 and r.json == [{"what": "lower"}], r
    for statement in ("SELECT what FROM ORDERS", "SELECT what FROM Orders", f"SELECT what FROM `{db.name}`.ORDERS",
                      "SELECT o.what FROM orders o JOIN ORDERS u ON u.id = o.id",
                      "WITH x AS (SELECT 1 AS id) SELECT what FROM ORDERS"):
        r = sql(server, statement, key=lower)
        assert r.status == 403 and r.json["code"] == "table_not_allowed" and b"UPPER" not in r.body, (statement, r)
    assert sql(server, "SELECT what FROM ORDERS", key=upper).status == 403
    assert sql(server, "SELECT what FROM orders", key=upper).status == 200
    # Database names are case-sensitive too: the default database spelled otherwise is another database.
    r = sql(server, f"SELECT what FROM `{db.name.upper()}`.orders", key=lower)
    assert r.status == 403 and r.json["code"] == "table_not_allowed", r
    # The schema route lists what the key may read, names compared the same way: orders, never ORDERS.
    listed = server.get("/connections/my/schema", key=lower).json["tables"]
    assert [t["name"] for t in listed] == ["orders"], listed
    # A CTE name matches case-insensitively on the server, as qag reads it.
    r = sql(server, "WITH ORDERS AS (SELECT 1 AS what) SELECT what FROM orders", key=lower)
    assert r.status == 200 and r.json == [{"what": 1}], r


# ------------------------------------------------------------------------------------------- one statement (goal 3)


@pytest.mark.parametrize("read_only", [True, False], ids=["read", "write"])
def test_the_driver_refuses_a_second_statement_past_the_guard(db, read_only):
    backend = MysqlBackend(settings())
    try:
        backend.run(db.fields, Call("SELECT 1", (), read_only, 10.0, 2))
        (idle,) = backend.pool.idle()
        assert not idle.conn.client_flag & CLIENT.MULTI_STATEMENTS
        second = "INSERT INTO state_rows VALUES (171717)"
        for text in (f"SELECT 1; {second}", f"SELECT '\\''; {second} -- '", f"SELECT 1 /*!; {second} */"):
            with pytest.raises(QagError) as info:
                backend.run(db.fields, Call(text, (), read_only, 10.0, 2))
            assert info.value.code == "query_failed" and "1064" in info.value.extras["detail"], text
        assert admin_value(f"SELECT COUNT(*) FROM `{db.name}`.state_rows WHERE v = 171717") == 0
    finally:
        backend.close_idle()


@pytest.mark.parametrize("statement", [
    "SELECT 1 FROM (" * 70 + "SELECT 1" + ") t" * 70,          # 1473: subqueries nested past the server's limit
    "SELECT " + "(" * 100_000 + "1" + ")" * 100_000,           # 1064 'memory exhausted': the parser's own stack
], ids=["nested-selects", "parser-stack"])
def test_statements_past_the_servers_nesting_limits_are_value_too_large(db, statement):
    """The statement's size, as MariaDB's thread-stack overrun (1436) already was: 400 value_too_large, not a
    500; the connection goes on serving."""
    backend = MysqlBackend(settings())
    try:
        with pytest.raises(QagError) as info:
            backend.run(db.fields, Call(statement, (), True, 10.0, 2))
        assert (info.value.code, info.value.status) == ("value_too_large", 400), info.value.extras
        assert backend.run(db.fields, Call("SELECT 7", (), True, 10.0, 2)).rows == [(7,)]
    finally:
        backend.close_idle()


# ------------------------------------------------------------------------------------------- session state (goal 4)


@pytest.fixture(scope="module", params=["uncapped", "capped"])
def state_server(request, db):
    # capped: QAG_POOL_MAX equal to the pool's size, its steady state: a statement that must have a session of its
    # own found the cap reached by the idle connection and was handed that one (an earlier caller's warnings,
    # LAST_INSERT_ID, FOUND_ROWS, sequence values).
    cap = {"QAG_POOL_MAX": "1"} if request.param == "capped" else {}
    server = _server(db, QAG_ALLOW_WRITES="1", **cap)
    keys = {kind: [_key(server, f"state-{kind}-{i}", allow_writes=kind == "write") for i in (1, 2)]
            for kind in ("read", "write")}
    state_cases.assert_one_connection(keys, lambda key: sql(server, "SELECT CONNECTION_ID() AS id", key=key).json)
    yield server, keys
    server.close()


@pytest.mark.e2e
@pytest.mark.parametrize("setter_kind,setter,probe_kind,probe,expect", state_cases.cases("mysql"))
def test_session_state_never_reaches_another_caller(state_server, db, setter_kind, setter, probe_kind, probe,
                                                    expect):
    if "seq" in setter and not db.mariadb:
        pytest.skip("sequences are MariaDB's")
    server, keys = state_server
    r = sql(server, setter, key=keys[setter_kind][0])
    assert r.status == 200, r
    check_probe(sql(server, probe, key=keys[probe_kind][1]), expect)
    assert admin_value("SELECT IS_USED_LOCK('qag_state_lock')") is None


@pytest.mark.e2e
def test_the_optimizer_trace_shows_a_caller_its_own_session_only(state_server, db):
    """A stored function (or a trigger) can leave optimizer tracing on in a pooled session, and the trace holds the
    statements that follow with their values (MySQL's: inline; MariaDB's masking pads among them): reading it is
    reading session state, so it runs on a connection of its own; and on MariaDB no statement is ever traced
    (SET STATEMENT optimizer_trace = 'enabled=off'), so a stored function that reads it finds nothing either."""
    server, keys = state_server
    spy, victim = keys["read"]
    assert sql(server, "SELECT trace_on() AS v", key=spy).json == [{"v": 1}]
    r = sql(server, "SELECT n FROM state_seven WHERE n = :n", key=victim, params={"n": 5})   # the same session
    assert r.json == [{"n": 5}]
    trace = sql(server, "SELECT QUERY AS q FROM information_schema.OPTIMIZER_TRACE", key=spy)
    assert trace.status == 200 and "state_seven" not in trace.body.decode(), trace
    backquoted = sql(server, "SELECT `QUERY` FROM information_schema.`OPTIMIZER_TRACE`", key=spy)
    assert backquoted.status == 200 and "state_seven" not in backquoted.body.decode(), backquoted
    if db.mariadb:
        assert sql(server, "SELECT trace_on() AS v", key=spy).json == [{"v": 1}]
        assert sql(server, "SELECT n FROM state_seven WHERE n = :n", key=victim, params={"n": 6}).json == [{"n": 6}]
        hidden = sql(server, "SELECT last_trace() AS q", key=spy)
        assert hidden.status == 200 and "state_seven" not in hidden.body.decode(), hidden


_RAND_MAX = 0x3FFFFFFF   # the server's my_rnd: seed1 = (3 * seed1 + seed2) % max, seed2 = (seed1 + seed2 + 33) % max


def _rand_after(first: float, second: float, count: int) -> list[float]:
    """The next `count` values of a session's RAND() after two consecutive ones (each gives seed1 away)."""
    seed1, earlier = round(second * _RAND_MAX), round(first * _RAND_MAX)
    seed2 = (seed1 - 3 * earlier) % _RAND_MAX
    out = []
    for _ in range(count):
        seed2 = (seed1 + seed2 + 33) % _RAND_MAX
        seed1 = (3 * seed1 + seed2) % _RAND_MAX
        out.append(seed1 / _RAND_MAX)
    return out


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["read", "write"])
def test_rand_values_are_nobody_elses_to_predict_or_recover(state_server, db, kind):
    """RAND() draws from its session's generator, and two of its values give the generator away: a caller who
    read two on a pooled connection would know the next caller's. Each statement calling RAND() is seeded for
    itself (MariaDB: SET STATEMENT, which restores the session's generator after; MySQL: closed after)."""
    server, keys = state_server
    spy, victim = keys[kind]
    rand = "SELECT RAND() AS a, RAND() AS b, RAND() AS c, CONNECTION_ID() AS id"
    # the premise: within one statement the generator is the server's, and the formula reads it
    own = sql(server, rand, key=spy).json[0]
    assert _rand_after(own["a"], own["b"], 1)[0] == pytest.approx(own["c"], abs=1e-9)
    predicted = _rand_after(own["b"], own["c"], 3)
    theirs = sql(server, "SELECT RAND() AS a, RAND() AS b, RAND() AS c, CONNECTION_ID() AS id", key=victim).json[0]
    if db.mariadb:
        assert theirs["id"] == own["id"]   # the same pooled connection (a pool of one): MySQL closes it instead
    assert [theirs["a"], theirs["b"], theirs["c"]] != pytest.approx(predicted, abs=1e-9)
    # and what the victim drew leaves nothing behind for the spy's next values
    again = sql(server, "SELECT RAND() AS a, RAND() AS b, RAND() AS c", key=spy).json[0]
    assert [again["a"], again["b"], again["c"]] != pytest.approx(_rand_after(theirs["b"], theirs["c"], 3), abs=1e-9)
    # a column named like it is no call: no seeds, the statement text kept
    assert sql(server, "SELECT 'brand' AS operand, 1 AS `rand_x`", key=spy).json == [{"operand": "brand", "rand_x": 1}]


# ------------------------------------------------------------------------------------------- functions (goal 5)


@pytest.mark.e2e
@pytest.mark.parametrize("statement", [
    "SELECT GET_LOCK('qag17', 0) AS l", "SELECT `get_lock` ('qag17', 0) AS l", "SELECT RELEASE_LOCK('qag17') AS l",
    "SELECT RELEASE_ALL_LOCKS() AS l", "SELECT 1 FROM state_seven WHERE GET_LOCK('qag17', 0) = 1",
    "SELECT NEXTVAL(seq17) AS v", "SELECT NEXT VALUE FOR seq17 AS v", "SELECT SETVAL(seq17, 100) AS v",
    "SELECT LASTVAL(seq17) AS v", "SELECT PREVIOUS VALUE FOR seq17 AS v",
])
def test_functions_that_write_are_read_only_refusals_for_every_key(server, db, statement):
    if "seq17" in statement and not db.mariadb:
        pytest.skip("sequences are MariaDB's")
    plain = _key(server, f"fn-{abs(hash(statement)) % 10**8}")     # unrestricted, no writes
    r = sql(server, statement, key=plain)
    assert r.status == 403 and r.json["code"] == "read_only", r
    assert admin_value("SELECT IS_USED_LOCK('qag17')") is None
    if db.mariadb:
        assert admin_value(f"SELECT next_not_cached_value FROM `{db.name}`.seq17") == 1


@pytest.mark.e2e
def test_writing_functions_are_refused_for_the_admin_on_a_read_only_server(db):
    server = _server(db)
    try:
        for statement in ("SELECT GET_LOCK('qag17', 0) AS l", "SELECT NEXTVAL(seq17) AS v"):
            if "seq17" in statement and not db.mariadb:
                continue
            r = sql(server, statement)
            assert r.status == 403 and r.json["code"] == "read_only", r
    finally:
        server.close()


# ------------------------------------------------------------------------------------------- bounded pages (goal 6)


@pytest.mark.parametrize("statement", [
    "(SELECT n FROM big) UNION ALL (SELECT n FROM big WHERE n < 0)",
    "(SELECT n FROM big ORDER BY n)",
    "SELECT n FROM big UNION ALL SELECT n FROM big WHERE n < 0",
])
def test_a_union_page_buffers_the_page_only(db, statement):
    p = prepare(statement, "mysql")
    rendered = render(p, {}, "format", 11, 20)
    assert rendered.windowed and rendered.sql.endswith("\nLIMIT 11 OFFSET 20"), rendered
    backend = MysqlBackend(settings())
    try:
        backend.run(db.fields, Call("SELECT 1", (), True, 10.0, 2))
        (link,) = backend.pool.idle()

        def rows_sent() -> int:
            link.conn.query(b"SHOW SESSION STATUS LIKE 'Rows_sent'")
            return int(link.conn.store_result().fetch_row()[0][1])

        before = rows_sent()
        result = backend.run(db.fields, Call(rendered.sql, rendered.args, True, 10.0, 11))
        sent = rows_sent() - before
        assert [r[0] for r in result.rows][:1] and len(result.rows) == 11
        assert sent <= 11 + 2, f"the server sent {sent} rows for a page of 11"
    finally:
        backend.close_idle()


@pytest.mark.e2e
def test_a_union_page_over_http(server):
    r = server.post("/execute_sql?page=3&page_size=10", {
        "sql": "(SELECT n FROM big) UNION ALL (SELECT n FROM big WHERE n < 0) ORDER BY n", "connection_name": "my"})
    assert r.status == 200 and [row["n"] for row in r.json] == list(range(21, 31)), r
    assert r.headers["x-has-more"] == "true"


# ------------------------------------------------------------------------------------------- errors (goal 7)


@pytest.mark.e2e
def test_a_refused_login_is_502(server, db):
    for name, fields in (("badpw", {**db.fields, "password": "wrong-password-17"}),
                         ("nodb", {**db.fields, "database": db.name + "_missing"})):
        assert server.post("/api/v1/connections", {"name": name, "db": "mysql", **fields}).status == 201
        r = server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": name})
        assert r.status == 502 and r.json["code"] == "connection_failed", r
        assert b"wrong-password-17" not in r.body
        r = server.post("/api/v1/connections/test", {"db": "mysql", **fields})
        assert r.status == 502 and r.json["code"] == "connection_failed", r


@pytest.mark.e2e
@pytest.mark.parametrize("statement,values", [
    ("INSERT INTO typed (i) VALUES (:v)", {"v": "not a number"}),
    ("INSERT INTO typed (i) VALUES (:v)", {"v": 10**15}),
    ("INSERT INTO typed (d) VALUES (:v)", {"v": "2021-13-45"}),
    ("INSERT INTO typed (v) VALUES (:v)", {"v": "far too long"}),
    ("INSERT INTO typed (u) VALUES (:v)", {"v": "\U0001F600"}),
    ("SELECT :v AS v", {"v": "\ud800"}),      # refused with the body (invalid_body) before any driver sees it
])
def test_a_value_the_database_refuses_is_400(server, db, statement, values):
    body = json.dumps({"sql": statement, "connection_name": "my", "params": values}, ensure_ascii=True)
    r = server.request("POST", "/execute_sql", raw=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["code"] == ("invalid_body" if values["v"] == "\ud800" else "value_invalid"), r
    assert b"SET STATEMENT" not in r.body and b"MAX_EXECUTION_TIME" not in r.body
    assert sql(server, "SELECT 1 AS one").json == [{"one": 1}]       # the next good request succeeds


@pytest.mark.e2e
def test_a_nul_byte_in_a_text_parameter_is_data(server, db):
    r = sql(server, "INSERT INTO typed (t) VALUES (:v)", params={"v": "a\x00b-17"})
    assert r.status == 200, r
    r = sql(server, "SELECT t FROM typed WHERE t = :v", params={"v": "a\x00b-17"})
    assert r.status == 200 and r.json == [{"t": "a\x00b-17"}], r


@pytest.mark.e2e
@pytest.mark.parametrize("statement", ["SELECT 1 AS one -- \x00\n, 2 AS two", "SELECT 'a\x00b' AS s",
                                       "SELECT 1 AS `a\x00b`", "SELECT 1 AS one WHERE 1 = :v \x00 AND 1 = 2"])
def test_a_nul_in_the_statement_is_400_before_anything_runs(server, db, statement):
    """mysqlclient sends a NUL and MariaDB reads it otherwise than qag's tokenizer (it ends a -- comment or a
    backquoted name there): refused as on PostgreSQL and SQLite. A NUL as data is a bound value."""
    r = sql(server, statement, params={"v": 1})
    assert r.status == 400 and r.json["code"] == "value_invalid" and "NUL" in r.json["error"], r
    assert sql(server, "SELECT :v AS s", params={"v": "a\x00b"}).json == [{"s": "a\x00b"}]


@pytest.mark.e2e
def test_an_error_detail_shows_the_callers_statement_only(server):
    r = sql(server, "SELECT * FROM no_such_table_17 WHERE", timeout=5)
    assert r.status == 500 and r.json["code"] == "query_failed", r
    assert b"SET STATEMENT" not in r.body and b"max_statement_time" not in r.body


def test_qags_prefix_and_hint_are_taken_out_of_a_detail():
    own = "SELECT x FROM t"
    sent = f"SET STATEMENT max_statement_time = 5, tx_read_only = 1 FOR {own}"
    e = mapped(MySQLdb.ProgrammingError(1064, f"near '{sent}' at line 1"), 5.0, sent, own)
    assert e.extras["detail"] == f"1064 (near '{own}' at line 1)"
    hinted = "SELECT /*+ MAX_EXECUTION_TIME(5000) */ x FROM t"
    e = mapped(MySQLdb.ProgrammingError(1064, f"near '{hinted}'"), 5.0, hinted, own)
    assert e.extras["detail"] == f"1064 (near '{own}')"


@pytest.mark.e2e
def test_a_key_that_may_write_creates_no_stored_program(state_server, db):
    """Found by an attacker review: a key that may write made `CREATE PROCEDURE p() EXECUTE IMMEDIATE
    CONCAT('SHOW PROC', 'ESSLIST')` (or `... SHOW GRANTS`) and `CALL p()` read the process list, with other
    callers' values and masking's pads, and the password hash, past the refusals of those statements themselves.
    API keys create no stored program, and SQL built at run time is refused wherever it is written; a procedure
    the database's administrators made is still called."""
    server, keys = state_server
    writer = keys["write"][0]
    for statement in ("CREATE PROCEDURE qag_state_p1() EXECUTE IMMEDIATE CONCAT('SHOW PROC', 'ESSLIST')",
                      "CREATE PROCEDURE qag_state_p2() SHOW GRANTS",
                      "CREATE FUNCTION qag_state_f() RETURNS INT RETURN 1"):
        r = sql(server, statement, key=writer)
        assert r.status == 403 and r.json["code"] == "table_check_failed", (statement, r)
    assert admin_value("SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = %s AND "
                       "ROUTINE_NAME LIKE 'qag_state_%%'", (db.name,)) == 0
    r = sql(server, "CALL qag_no_such_procedure()", key=writer)
    assert r.status == 500 and r.json["code"] == "query_failed", r    # CALL itself is the server's to judge


@pytest.mark.e2e
def test_an_executable_comment_holding_a_line_comment_hides_nothing(state_server, db):
    """Found by a second look: `SHOW /*! -- */` + a line feed + `GRANTS */` showed a key that may write the
    password hash (the server's `-- ` inside the executable comment runs past the `*/` qag took for its end)."""
    server, keys = state_server
    writer = keys["write"][0]
    for statement in ("SHOW /*! -- */\nGRANTS */",
                      "SELECT /*! -- */\n group_concat(info) AS i FROM information_schema.PROCESSLIST */"):
        r = sql(server, statement, key=writer)
        assert r.status == 400 and r.json["code"] == "invalid_request", (statement, r)
        assert "PASSWORD" not in r.body.decode()
