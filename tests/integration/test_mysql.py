"""MySQL/MariaDB connections against the real server on this machine (contract 10.2, 10.3, 10.5, B10.7).

HTTP behaviour goes through a real gunicorn-served qag; connection behaviour (pooling, renewal, dead
connections, round trips) through MysqlBackend directly. The round-trip test counts the relay's request turns
per call (deterministic) and prints the single-caller latencies it measured; it asserts no timing.
"""

from __future__ import annotations

import datetime as dt
import socket
import statistics
import threading
import time
from types import SimpleNamespace

import pytest

from qag.backends.base import Call
from qag.errors import QagError
from qag.testing import Relay
from tests.server import Server, q
from tests.services import MYSQL, mysql_admin

MySQLdb = pytest.importorskip("MySQLdb")
from qag.backends.mysql import MysqlBackend  # noqa: E402  (needs the driver)

INJECTIONS = ["x' OR '1'='1", "'; DROP TABLE items; -- ", "\\'; DROP TABLE items; -- ", '" OR ""="', "%' OR 1=1 #",
              "ünï'cödé\\\\", "') UNION SELECT user, password FROM mysql.user -- ", "\x00\x1a'\n\r"]


def settings(pool_size: int = 8, **kw) -> SimpleNamespace:
    values = {"pool_size": pool_size, "pool_idle_timeout": 300.0, "pool_max": None, "pool_wait": 5.0, "spin_us": 200}
    values.update(kw)
    return SimpleNamespace(**values)


def read(sql: str, timeout: float | None = 10.0, fetch: int = 11) -> Call:
    return Call(sql, (), True, timeout, fetch)


def write(sql: str, args: tuple = (), timeout: float | None = 10.0) -> Call:
    return Call(sql, args, False, timeout, 11)


def admin_rows(sql: str, args=None) -> list:
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        cur.execute(sql, args)
        return list(cur.fetchall())
    finally:
        admin.close()


def server_is_mariadb() -> bool:
    return "mariadb" in admin_rows("SELECT VERSION()")[0][0].lower()


def session_read_only(backend: MysqlBackend) -> int:
    """@@session.tx_read_only of the one idle pooled connection, asked outside any statement qag prepares."""
    (link,) = backend.pool.idle()
    if link.pending:                       # MySQL: the renewal's reply first
        link.conn.read_query_result()
        link.pending = False
    link.conn.query("SELECT @@session.tx_read_only")
    return link.conn.store_result().fetch_row()[0][0]


def wait_gone(connection_id: int) -> None:
    """Until the server has finished closing a killed connection (a deadline, not a timing assertion)."""
    deadline = time.monotonic() + 10
    while admin_rows("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = %s", (connection_id,))[0][0]:
        assert time.monotonic() < deadline, "the killed connection never went away"
        time.sleep(0.02)


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def db(mysql_db):
    """The session database with this module's tables and functions, plus a second database it may read."""
    name = mysql_db["database"]
    other = name + "_orders"
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"USE `{name}`")
    cur.execute("CREATE TABLE items (id INT PRIMARY KEY, name VARCHAR(200) NOT NULL) ENGINE=InnoDB")
    cur.executemany("INSERT INTO items VALUES (%s, %s)", [(i, f"item {i}") for i in range(1, 6)])
    cur.execute("CREATE TABLE notes (id INT PRIMARY KEY, item_id INT, body TEXT, "
                "FOREIGN KEY (item_id) REFERENCES items(id)) ENGINE=InnoDB")
    cur.execute("CREATE VIEW item_names AS SELECT name FROM items")
    cur.execute("CREATE TABLE big (n INT PRIMARY KEY) ENGINE=InnoDB")
    cur.executemany("INSERT INTO big VALUES (%s)", [(i,) for i in range(1, 3001)])
    cur.execute("CREATE TABLE ddl_target (id INT PRIMARY KEY) ENGINE=InnoDB")
    cur.execute("CREATE TABLE customer (id INT PRIMARY KEY, name VARCHAR(50)) ENGINE=InnoDB")
    cur.executemany("INSERT INTO customer VALUES (%s, %s)", [(1, "Ada"), (2, "Grace")])
    # Stored functions a query might call to loosen its session for whoever runs next on the connection.
    cur.execute("CREATE FUNCTION make_writable() RETURNS INT NOT DETERMINISTIC "
                "BEGIN SET SESSION TRANSACTION READ WRITE; RETURN 1; END")
    cur.execute("CREATE FUNCTION lift_limit() RETURNS INT NOT DETERMINISTIC "
                "BEGIN SET SESSION max_statement_time = 0; RETURN 1; END")
    cur.execute(f"CREATE DATABASE `{other}`")
    cur.execute(f"CREATE TABLE `{other}`.orders (id INT PRIMARY KEY, customer_id INT, total DECIMAL(10, 2))")
    cur.executemany(f"INSERT INTO `{other}`.orders VALUES (%s, %s, %s)", [(10, 1, "9.50"), (11, 2, "20.00"),
                                                                          (12, 1, "1.25")])
    cur.execute(f"GRANT SELECT ON `{other}`.* TO '{mysql_db['user']}'@'%'")
    yield SimpleNamespace(fields=dict(mysql_db), name=name, other=other)
    cur.execute("SET SESSION lock_wait_timeout = 60")   # a leaked transaction fails the teardown, never hangs it
    cur.execute(f"DROP DATABASE IF EXISTS `{other}`")
    for table in ("notes", "big", "ddl_target", "customer", "items"):
        cur.execute(f"DROP TABLE IF EXISTS `{name}`.{table}")
    cur.execute(f"DROP VIEW IF EXISTS `{name}`.item_names")
    for function in ("make_writable", "lift_limit"):
        cur.execute(f"DROP FUNCTION IF EXISTS `{name}`.{function}")
    admin.close()


def _server(db, **kw) -> Server:
    server = Server(**kw)
    reply = server.post("/api/v1/connections", {"name": "my", "db": "mysql", **db.fields})
    assert reply.status == 201, reply
    return server


@pytest.fixture(scope="module")
def read_server(db):
    server = _server(db)
    yield server
    server.close()


@pytest.fixture(scope="module")
def writes_server(db):
    server = _server(db, env={"QAG_ALLOW_WRITES": "1"})
    yield server
    server.close()


def sql(server: Server, statement: str, **body):
    return server.post("/execute_sql", {"sql": statement, "connection_name": "my", **body})


# ------------------------------------------------------------------------------------------- pooling (B10.7)


@pytest.mark.e2e
def test_b10_7_pooled_calls_share_one_connection_and_a_change_closes_it(db):
    server = _server(db, env={"QAG_POOL_SIZE": "1"}, workers=1)
    try:
        ids = {sql(server, "SELECT CONNECTION_ID() AS id").json[0]["id"] for _ in range(4)}
        assert len(ids) == 1
        # Any change to a connection closes its idle pooled connections: the next call opens a new one.
        assert server.request("PATCH", "/api/v1/connections/my", body={"options": {"note": "changed"}}).status == 200
        after = sql(server, "SELECT CONNECTION_ID() AS id").json[0]["id"]
        assert after not in ids
    finally:
        server.close()


@pytest.mark.e2e
def test_b10_7_pool_size_zero_opens_a_connection_per_call(db):
    server = _server(db, env={"QAG_POOL_SIZE": "0"}, workers=1)
    try:
        ids = [sql(server, "SELECT CONNECTION_ID() AS id").json[0]["id"] for _ in range(3)]
        assert len(set(ids)) == 3
    finally:
        server.close()


def test_one_connect_and_one_cursor_for_pooled_calls(db, monkeypatch):
    import qag.backends.mysql as module
    connects = []
    real = module.MySQLdb.connect
    monkeypatch.setattr(module.MySQLdb, "connect", lambda **kw: (connects.append(kw), real(**kw))[1])
    backend = MysqlBackend(settings(pool_size=1))
    seen = set()
    for _ in range(3):
        seen.add(backend.run(db.fields, read("SELECT CONNECTION_ID()")).rows[0][0])
    assert len(connects) == 1 and len(seen) == 1
    assert backend.pool.stats()["idle"] == 1
    backend.close_idle()
    assert backend.pool.stats() == {"idle": 0, "active": 0, "waits": 0, "waiting": {}}


def test_b10_7_data_committed_elsewhere_is_visible_to_a_pooled_connection(db):
    backend = MysqlBackend(settings(pool_size=1))
    count = "SELECT CONNECTION_ID(), COUNT(*) FROM customer"
    first_id, before = backend.run(db.fields, read(count)).rows[0]
    admin_rows(f"INSERT INTO `{db.name}`.customer VALUES (99, 'Committed elsewhere')")
    try:
        second_id, after = backend.run(db.fields, read(count)).rows[0]
    finally:
        admin_rows(f"DELETE FROM `{db.name}`.customer WHERE id = 99")
    assert second_id == first_id and after == before + 1


def test_b10_7_a_time_limit_does_not_outlive_its_call(db):
    backend = MysqlBackend(settings(pool_size=1))
    first = backend.run(db.fields, read("SELECT CONNECTION_ID()", timeout=1)).rows[0][0]
    # A 1.5 s statement under a 2 s limit on the same connection: an outliving 1 s limit would cut it short.
    connection, slept = backend.run(db.fields, read("SELECT CONNECTION_ID(), SLEEP(1.5)", timeout=2)).rows[0]
    assert (connection, slept) == (first, 0)
    with pytest.raises(QagError) as info:
        backend.run(db.fields, read("SELECT SLEEP(5)", timeout=1))
    assert info.value.code == "query_timeout" and info.value.extras["timeout"] == 1
    assert backend.run(db.fields, read("SELECT SLEEP(1.2)", timeout=2)).rows == [(0,)]


def test_a_function_that_answers_its_interruption_is_a_timeout_not_a_result(db):
    """Fault drill: MariaDB's BENCHMARK() gives 0 (and SLEEP() 1, under the watchdog's KILL QUERY) when its time
    limit stops it, with no error: the call answered 200 with that value. Past its limit, a call that can't write
    is answered as the limit says."""
    backend = MysqlBackend(settings(pool_size=1))
    with pytest.raises(QagError) as info:
        backend.run(db.fields, read("SELECT BENCHMARK(2000000000, md5('a')) AS b", timeout=0.3))
    assert info.value.code == "query_timeout" and info.value.extras["timeout"] == 0.3
    assert backend.run(db.fields, read("SELECT BENCHMARK(1000, md5('a')) AS b", timeout=2)).rows == [(0,)]


def test_b10_7_stored_function_cannot_make_the_next_call_writable(db):
    backend = MysqlBackend(settings(pool_size=1))
    connection = backend.run(db.fields, read("SELECT CONNECTION_ID(), make_writable()")).rows[0][0]
    # MariaDB: the statement's SET STATEMENT put the access mode back when it ended. MySQL: the function did
    # change the session's default access mode, but the pooled connection's transaction (renewed by ROLLBACK
    # AND CHAIN) stays read-only.
    assert session_read_only(backend) == (1 if server_is_mariadb() else 0)
    with pytest.raises(QagError) as info:
        backend.run(db.fields, read("INSERT INTO customer VALUES (50, 'should not be written')"))
    assert info.value.code == "read_only" and "1792" in info.value.extras["detail"]   # the engine's refusal: 403
    assert admin_rows(f"SELECT COUNT(*) FROM `{db.name}`.customer WHERE id = 50") == [(0,)]


def test_b10_7_stored_function_cannot_lift_the_next_calls_limit(db):
    backend = MysqlBackend(settings(pool_size=1))
    connection = backend.run(db.fields, read("SELECT CONNECTION_ID(), lift_limit()", timeout=5)).rows[0][0]
    assert backend.run(db.fields, read("SELECT CONNECTION_ID()")).rows == [(connection,)]
    with pytest.raises(QagError) as info:
        backend.run(db.fields, read("SELECT SLEEP(4)", timeout=1))
    assert info.value.code == "query_timeout"


def test_idle_pooled_connection_holds_no_metadata_lock(db):
    backend = MysqlBackend(settings(pool_size=1))
    backend.run(db.fields, read("SELECT COUNT(*) FROM ddl_target"))
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        cur.execute("SET SESSION lock_wait_timeout = 10")
        # Blocks (and fails after 10 s) if the idle connection's transaction still held ddl_target.
        cur.execute(f"ALTER TABLE `{db.name}`.ddl_target ADD COLUMN extra INT")
        cur.execute(f"ALTER TABLE `{db.name}`.ddl_target DROP COLUMN extra")
    finally:
        admin.close()
    assert backend.pool.stats()["idle"] == 1


def test_the_driver_runs_one_statement_per_call(db):
    # The multi-statements client flag is off: a second statement is a syntax error at the server, whatever
    # the guard decided before it.
    backend = MysqlBackend(settings())
    with pytest.raises(QagError) as info:
        backend.run(db.fields, write("UPDATE customer SET name = 'x' WHERE id = 1; DELETE FROM customer"))
    assert info.value.code == "query_failed" and "1064" in info.value.extras["detail"]
    assert admin_rows(f"SELECT name FROM `{db.name}`.customer ORDER BY id") == [("Ada",), ("Grace",)]


# ------------------------------------------------------------------------------------------- dead connections


@pytest.mark.parametrize("read_only", [True, False], ids=["read", "write"])
def test_killed_pooled_connection_is_not_handed_out(db, read_only):
    # Pool size 3: with three open, the pool hands out an idle connection (dead or not) rather than open a fourth.
    backend = MysqlBackend(settings(pool_size=3))
    ask = Call("SELECT CONNECTION_ID()", (), read_only, 10.0, 11)
    # Three callers at once leave three idle connections; all of them are then killed.
    barrier = threading.Barrier(3)
    ids: list[int] = []

    def caller():
        barrier.wait()
        ids.append(backend.run(db.fields, Call("SELECT CONNECTION_ID(), SLEEP(0.2)", (), read_only, 10.0, 11))
                   .rows[0][0])

    threads = [threading.Thread(target=caller) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 3 and backend.pool.stats()["idle"] == 3
    for connection in ids:
        admin_rows(f"KILL {int(connection)}")
    for connection in ids:
        wait_gone(connection)
    after = {backend.run(db.fields, ask).rows[0][0] for _ in range(3)}
    assert not after & set(ids)
    assert backend.pool.stats()["active"] == 0


# ------------------------------------------------------------------------------------------- HTTP behaviour


@pytest.mark.e2e
def test_unreachable_database_is_502_without_the_password(read_server):
    secret = "pw-Sup3r-s3cret-%"
    fields = {"db": "mysql", "host": "127.0.0.1", "port": closed_port(), "user": "nobody", "password": secret,
              "database": "x"}
    r = read_server.post("/api/v1/connections/test", fields)
    assert r.status == 502 and r.json["code"] == "connection_failed", r
    assert secret.encode() not in r.body and b"Can't connect" in r.body
    assert read_server.post("/api/v1/connections", {"name": "gone", **fields}).status == 201
    r = read_server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "gone"})
    assert r.status == 502 and r.json["code"] == "connection_failed" and secret.encode() not in r.body
    r = read_server.post("/api/v1/connections/databases", {"name": "gone"})
    assert r.status == 502 and secret.encode() not in r.body


@pytest.mark.e2e
def test_query_past_its_limit_is_504_and_gone_from_the_server(read_server):
    marker = f"qag-limit-marker-{time.monotonic_ns()}"
    r = sql(read_server, f"SELECT SLEEP(60) AS s, '{marker}' AS m", timeout=1)
    assert r.status == 504 and r.json["code"] == "query_timeout" and r.json["timeout"] == 1, r
    running = admin_rows("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE %s "
                         "AND ID <> CONNECTION_ID()", (f"%{marker}%",))
    assert running == [(0,)]
    r = sql(read_server, "SELECT 1 AS one")
    assert r.status == 200 and r.json == [{"one": 1}]


@pytest.mark.e2e
def test_paged_reads_and_types(read_server):
    r = read_server.post("/execute_sql?page=2&page_size=2", {"sql": "SELECT id, name FROM items ORDER BY id",
                                                             "connection_name": "my"})
    assert r.status == 200 and r.json == [{"id": 3, "name": "item 3"}, {"id": 4, "name": "item 4"}]
    assert (r.headers["x-row-count"], r.headers["x-has-more"]) == ("2", "true")
    r = sql(read_server, "SELECT CAST(2.50 AS DECIMAL(5,2)) AS d, DATE('2024-01-02') AS day, NULL AS nothing, "
                         "'héllo' AS text")
    assert r.json == [{"d": 2.5, "day": "2024-01-02", "nothing": None, "text": "héllo"}]


@pytest.mark.e2e
def test_bit_values_are_integers(read_server, db):
    # As QueryAPIGate 0.43 gives them (probed; contract 0.2 would make the bytes text: "\u0001", 8 x "\ufffd").
    # A SET stays the server's text "x,y" (QueryAPIGate: a Python set's repr; docs/compatibility.md).
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"CREATE TABLE `{db.name}`.bits (id INT, b1 BIT(1), b8 BIT(8), b10 BIT(10), b64 BIT(64), "
                f"s SET('x', 'y', 'z'))")
    cur.execute(f"INSERT INTO `{db.name}`.bits VALUES (1, b'1', b'10000001', b'1000000001', ~0, 'y,x'), "
                f"(2, b'0', 0, 0, 0, ''), (3, NULL, NULL, NULL, NULL, NULL)")
    try:
        r = sql(read_server, "SELECT id, b1, b8, b10, b64, s FROM bits ORDER BY id")
        assert r.status == 200 and r.json == [
            {"id": 1, "b1": 1, "b8": 129, "b10": 513, "b64": 18446744073709551615, "s": "x,y"},
            {"id": 2, "b1": 0, "b8": 0, "b10": 0, "b64": 0, "s": ""},
            {"id": 3, "b1": None, "b8": None, "b10": None, "b64": None, "s": None}]
        r = read_server.post("/execute_sql?stream=true&format=csv", {"sql": "SELECT b1, b64 FROM bits ORDER BY id",
                                                                     "connection_name": "my"})
        assert r.status == 200 and r.body.decode() == "b1,b64\r\n1,18446744073709551615\r\n0,0\r\n,\r\n"
        # A binary string literal is no BIT column: its bytes stay text, as in QueryAPIGate.
        assert sql(read_server, "SELECT b'1' AS lit").json == [{"lit": "\u0001"}]
    finally:
        cur.execute(f"DROP TABLE IF EXISTS `{db.name}`.bits")
        admin.close()


@pytest.mark.parametrize("kind", ["pure", "compiled"])
def test_date_and_time_values_are_mysqlclients_own(db, kind, monkeypatch):
    """DATETIME, TIMESTAMP and DATE values read by either mysqltime twin equal what mysqlclient's default
    conversions give for the same statement: fractions of any width, the zero date, NULL, leap days."""
    from qag import _speedups
    from tests.speedups.conftest import compiled_or_skip
    times = _speedups.twin("mysqltime", "pure") if kind == "pure" else compiled_or_skip("mysqltime")
    selected = _speedups.get
    monkeypatch.setattr(_speedups, "get", lambda name: times if name == "mysqltime" else selected(name))
    statement = ("SELECT CAST('2024-02-29 23:59:58' AS DATETIME) AS a, CAST('2024-02-29 23:59:58.5' AS DATETIME(1)) "
                 "AS b, CAST('1999-12-31 00:00:00.000123' AS DATETIME(6)) AS c, CAST(0 AS DATETIME) AS zero, "
                 "CAST(NULL AS DATETIME) AS nothing, DATE('2024-02-29') AS day, CAST(0 AS DATE) AS zero_day, "
                 "FROM_UNIXTIME(1700000000.25) AS stamp, TIMESTAMP('2001-02-03 04:05:06.7') AS ts")
    backend = MysqlBackend(settings())
    rows = backend.run(db.fields, read(statement)).rows
    assert rows == admin_rows(statement)
    (link,) = backend.pool.idle()
    assert link.conn.converter[MySQLdb.constants.FIELD_TYPE.DATETIME] is times.datetime_or_none
    assert rows[0][:3] == (dt.datetime(2024, 2, 29, 23, 59, 58), dt.datetime(2024, 2, 29, 23, 59, 58, 500000),
                           dt.datetime(1999, 12, 31, 0, 0, 0, 123)) and rows[0][3] is None
    assert rows[0][5] == dt.date(2024, 2, 29)


@pytest.mark.e2e
def test_read_only_call_cannot_write_at_the_database(read_server):
    # The guard refuses first; the database would refuse too (see the stored-function test).
    r = sql(read_server, "INSERT INTO customer VALUES (60, 'x')")
    assert r.status == 403 and r.json["code"] == "read_only"


@pytest.mark.e2e
def test_injection_strings_are_data(writes_server, db, uniq):
    name = uniq("mysql_find")
    writes_server.query(name, "SELECT id, name FROM items WHERE name = :name", "my")
    for i, text in enumerate(INJECTIONS):
        r = writes_server.get(q(name), params={"name": text})
        assert r.status == 200 and r.body == b'{"message":"No results returned"}\n', (text, r)
        r = sql(writes_server, "INSERT INTO items (id, name) VALUES (:id, :name)",
                params={"id": 1000 + i, "name": text})
        assert r.status == 200, (text, r)
        r = writes_server.get(q(name), params={"name": text})
        assert r.json == [{"id": 1000 + i, "name": text}], text
    # Committed (seen by another session), stored exactly, and nothing else happened to the table.
    stored = admin_rows(f"SELECT id, name FROM `{db.name}`.items WHERE id >= 1000 ORDER BY id")
    assert stored == [(1000 + i, text) for i, text in enumerate(INJECTIONS)]
    assert admin_rows(f"SELECT COUNT(*) FROM `{db.name}`.items WHERE id < 1000") == [(5,)]
    admin_rows(f"DELETE FROM `{db.name}`.items WHERE id >= 1000")


@pytest.mark.e2e
def test_a_slot_another_sql_mode_would_read_elsewhere_never_runs(read_server, uniq):
    # On a server with NO_BACKSLASH_ESCAPES, 'a\\'' ends at the backslash and the :v slot sits inside the next
    # literal: the value spliced there would close it and run as SQL. Refused on every server, saved or ad hoc,
    # and the next call answers.
    statement = "SELECT 'a\\'' AS p, :v AS q -- '"
    name = uniq("mysql_nbe")
    read_server.query(name, statement, "my")
    r = read_server.get(q(name), params={"v": ", (SELECT 1) AS leaked, "})
    assert r.status == 403 and r.json["code"] == "read_only" and "NO_BACKSLASH_ESCAPES" in r.json["error"], r
    r = sql(read_server, statement, params={"v": "x"})
    assert r.status == 403 and r.json["code"] == "read_only", r
    r = sql(read_server, "SELECT 'a\\\\' AS p, :v AS q", params={"v": "it's"})
    assert r.status == 200 and r.json == [{"p": "a\\", "q": "it's"}], r


@pytest.mark.e2e
def test_writes_are_committed(writes_server, db):
    r = sql(writes_server, "UPDATE customer SET name = :name WHERE id = 2", params={"name": "Grace H."})
    assert r.status == 200, r
    r = sql(writes_server, "INSERT INTO customer VALUES (3, 'Edsger')")
    assert r.status == 200, r
    try:
        assert admin_rows(f"SELECT id, name FROM `{db.name}`.customer ORDER BY id") == \
            [(1, "Ada"), (2, "Grace H."), (3, "Edsger")]
    finally:
        admin_rows(f"DELETE FROM `{db.name}`.customer WHERE id = 3")
        admin_rows(f"UPDATE `{db.name}`.customer SET name = 'Grace' WHERE id = 2")


@pytest.mark.e2e
def test_the_admins_database_override_runs_the_call_there(read_server, db):
    """Contract 10.1: a `database` override (admin) replaces the connection's database for this call."""
    r = sql(read_server, "SELECT DATABASE() AS d, COUNT(*) AS n FROM orders", database=db.other)
    assert r.status == 200 and r.json == [{"d": db.other, "n": 3}], r
    assert sql(read_server, "SELECT DATABASE() AS d").json == [{"d": db.name}]    # the next call: its own again
    # An empty one is none (as an empty reserved argument is): the connection's own database.
    assert sql(read_server, "SELECT DATABASE() AS d", database="").json == [{"d": db.name}]
    for bad in (7, ["x"], {"a": 1}, True, "x" * 65, "a\u0000b"):
        r = sql(read_server, "SELECT 1 AS one", database=bad)
        assert r.status == 400 and r.json["code"] == "invalid_body", (bad, r)
    r = sql(read_server, "SELECT 1 AS one", database=db.name + "_missing")
    assert r.status in (403, 502) and r.json["code"] in ("connection_failed", "forbidden", "query_failed"), r


@pytest.mark.e2e
def test_cross_database_join_on_one_connection(read_server, db):
    r = sql(read_server, f"SELECT c.name, o.total FROM customer c JOIN `{db.other}`.orders o "
                         f"ON o.customer_id = c.id ORDER BY o.id")
    assert r.status == 200, r
    assert r.json == [{"name": "Ada", "total": 9.5}, {"name": "Grace", "total": 20.0},
                      {"name": "Ada", "total": 1.25}]


@pytest.mark.e2e
def test_streaming_csv(read_server):
    r = read_server.post("/execute_sql?stream=true&format=csv", {"sql": "SELECT n, CONCAT('row ', n) AS label "
                                                                        "FROM big ORDER BY n", "connection_name": "my"})
    assert r.status == 200 and r.headers["content-type"].startswith("text/csv")
    lines = r.body.decode().split("\r\n")
    assert lines[0] == "n,label" and lines[1] == "1,row 1" and lines[3000] == "3000,row 3000" and lines[3001] == ""
    assert len(lines) == 3002
    assert sql(read_server, "SELECT 1 AS one").json == [{"one": 1}]


@pytest.mark.e2e
def test_schema_databases_and_test_routes(read_server, db):
    r = read_server.get("/api/v1/connections/my/schema")
    assert r.status == 200, r
    tables = {t["name"]: t for t in r.json["tables"]}
    assert r.json["truncated"] is False
    assert tables["items"]["type"] == "table" and tables["item_names"]["type"] == "view"
    assert tables["items"]["schema"] == db.name
    assert tables["items"]["columns"] == [
        {"name": "id", "type": "int(11)", "nullable": False, "position": 1, "primary_key": True, "foreign_key": None},
        {"name": "name", "type": "varchar(200)", "nullable": False, "position": 2, "primary_key": False,
         "foreign_key": None}]
    item_id = next(c for c in tables["notes"]["columns"] if c["name"] == "item_id")
    assert item_id["foreign_key"] == {"table": "items", "column": "id"} and item_id["nullable"] is True
    r = read_server.get("/api/v1/connections/my/schema", params={"database": db.other})
    assert [t["name"] for t in r.json["tables"]] == ["orders"]
    # a name no MySQL/MariaDB database can have (a character past U+FFFF: names are utf8mb3) names nothing, as an
    # unknown one does, on both routes (it was a 500: the catalog's comparison refused the mix of collations)
    for database in ("\U0001F600", "x\U00010000y", "nope_db"):
        for path in ("/api/v1/connections/my/schema", "/connections/my/schema"):
            r = read_server.get(path, params={"database": database})
            assert r.status == 200 and r.json == {"tables": [], "truncated": False}, (database, path, r)
    r = read_server.post("/api/v1/connections/databases", {"name": "my"})
    assert r.status == 200 and db.name in r.json["databases"] and db.other in r.json["databases"]
    assert "information_schema" in r.json["databases"]    # every database the server shows, as QueryAPIGate lists
    r = read_server.post("/api/v1/connections/test", {"name": "my"})
    assert r.status == 200 and r.json["elapsed_ms"] > 0


def test_schema_is_cached_and_dropped_with_idle_connections(db):
    backend = MysqlBackend(settings())
    first = backend.schema(db.fields)
    first["tables"].clear()             # callers get their own copy
    admin_rows(f"CREATE TABLE `{db.name}`.late (id INT)")
    try:
        cached = backend.schema(db.fields)
        assert "late" not in {t["name"] for t in cached["tables"]} and cached["tables"]
        backend.close_idle()
        assert "late" in {t["name"] for t in backend.schema(db.fields)["tables"]}
    finally:
        admin_rows(f"DROP TABLE `{db.name}`.late")


def test_stream_gives_its_connection_back_only_when_drained(db):
    backend = MysqlBackend(settings(pool_size=1))
    columns, batches = backend.stream(db.fields, read("SELECT n FROM big ORDER BY n", timeout=10, fetch=0), 1000, None)
    assert columns == ["n"] and backend.pool.stats()["active"] == 1
    sizes = [len(b) for b in batches]
    assert sizes == [1000, 1000, 1000] and backend.pool.stats() == {"idle": 1, "active": 0, "waits": 0, "waiting": {}}
    # A capped stream stops with rows unread: its connection (the pooled one) is closed, not pooled again.
    columns, batches = backend.stream(db.fields, read("SELECT n FROM big ORDER BY n", fetch=0), 1000, 1500)
    assert [len(b) for b in batches] == [1000, 500] and backend.pool.stats() == {"idle": 0, "active": 0, "waits": 0, "waiting": {}}
    # So does one the caller drops before the end (a client that went away).
    columns, batches = backend.stream(db.fields, read("SELECT n FROM big ORDER BY n", fetch=0), 1000, None)
    assert len(next(batches)) == 1000 and backend.pool.stats()["active"] == 1
    del batches
    assert backend.pool.stats() == {"idle": 0, "active": 0, "waits": 0, "waiting": {}}
    with pytest.raises(QagError) as info:
        backend.stream(db.fields, read("SELECT n FROM no_such_table", fetch=0), 1000, None)
    assert info.value.code == "query_failed"
    with pytest.raises(QagError) as info:
        backend.stream(db.fields, read("SELECT SLEEP(5)", timeout=1, fetch=0), 1000, None)
    assert info.value.code == "query_timeout"


# ------------------------------------------------------------------------------------------- round trips


def _settle(backend: MysqlBackend) -> None:
    """Wait until every renewal sent so far has been answered. The relay counts a turn before it forwards the
    bytes, so a renewal whose reply has reached qag has been counted (its send returns before that)."""
    deadline = time.monotonic() + 10
    while any(link.pending and not link.readable() for link in backend.pool.idle()):
        assert time.monotonic() < deadline, "a renewal was never answered"
        time.sleep(0.001)


def _per_call(relay: Relay, backend: MysqlBackend | None, fn, calls: int = 20) -> tuple[float, float, int]:
    """(median ms, relay turns per call, connections opened) over back-to-back calls."""
    if backend is not None:
        _settle(backend)
    relay.reset()
    opened = relay.connections
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000.0)
    if backend is not None:
        _settle(backend)
    return statistics.median(times), relay.turns / calls, relay.connections - opened


def test_one_round_trip_per_call_through_a_delaying_relay(db, capsys):
    delay = 0.010
    report = {}
    with Relay(MYSQL["host"], MYSQL["port"], delay=delay) as relay:
        fields = dict(db.fields, host="127.0.0.1", port=relay.port)
        backend = MysqlBackend(settings(pool_size=8))
        try:
            _measure(relay, backend, fields, db, report)
        finally:
            # Before the relay goes: its close() can leave the server's side of a connection open.
            backend.close_idle()
    with capsys.disabled():
        print(f"\n[mysql round trips, relay delay {delay * 1000:.0f} ms, median of 20 back-to-back calls] "
              + ", ".join(f"{k}: {v:.2f} ms" for k, v in report.items()))


def _measure(relay: Relay, backend: MysqlBackend, fields: dict, db, report: dict) -> None:
    page = Call("SELECT id, name FROM items ORDER BY id\nLIMIT 6 OFFSET 0", (), True, 10.0, 6)
    change = Call("UPDATE customer SET name = %s WHERE id = %s", ("Ada", 1), False, 10.0, 6)
    # Warm-up: five callers at once leave five read-only connections, so that when one caller then calls
    # back to back, some idle connection's renewal reply has always arrived - with slack for a loaded machine,
    # where a reply can take a few milliseconds longer than the relay's delay.
    threads = [threading.Thread(target=backend.run, args=(fields, Call("SELECT SLEEP(0.1)", (), True, 10.0, 2)))
               for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    backend.run(fields, page)
    backend.run(fields, change)
    waits_before = backend.renewal_waits

    ms, turns, opened = _per_call(relay, backend, lambda: backend.run(fields, page))
    report["paged read"] = ms
    # Each read is one request the caller waits for. MariaDB: that is all (the statement carries its read-only
    # mode). MySQL: plus the ROLLBACK AND CHAIN sent as it returns the connection - a turn of its own that
    # nobody waits for: the next call takes a connection whose reply has already arrived.
    per_read = 1 if server_is_mariadb() else 2
    assert (turns, opened, backend.renewal_waits - waits_before) == (per_read, 0, 0)

    ms, turns, opened = _per_call(relay, backend, lambda: backend.run(fields, change))
    report["write"] = ms
    assert (turns, opened) == (1, 0)

    direct = MySQLdb.connect(host="127.0.0.1", port=relay.port, user=db.fields["user"],
                             password=db.fields["password"], database=db.fields["database"], autocommit=True)
    cursor = direct.cursor()

    def direct_call():
        cursor.execute("SELECT id, name FROM items ORDER BY id LIMIT 6")
        cursor.fetchall()

    try:
        direct_call()
        ms, turns, opened = _per_call(relay, None, direct_call)
    finally:
        direct.close()
    report["direct driver call"] = ms
    assert (turns, opened) == (1, 0)


def test_user_variables_and_named_locks_never_reach_the_next_caller(db):
    backend = MysqlBackend(settings(pool_size=1))
    try:
        first = backend.run(db.fields, read("SELECT CONNECTION_ID() AS id")).rows[0][0]
        backend.run(db.fields, read("SELECT GET_LOCK('qag_test_lock', 0) AS l, @qag_a := 42 AS a"))
        rows = backend.run(db.fields, read("SELECT CONNECTION_ID() AS id, @qag_a AS a")).rows
        assert rows[0][1] is None and rows[0][0] != first      # that connection was closed, not pooled
        assert admin_rows("SELECT IS_USED_LOCK('qag_test_lock')") == [(None,)]
    finally:
        backend.close_idle()
