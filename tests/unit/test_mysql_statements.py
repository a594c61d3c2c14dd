"""The exact SQL qag sends to MySQL 8 and MariaDB (contract 10.3, B10.4-B10.6 as adapted), and the driver fields.

The statement builders are pure functions of the rendered statement; the sequence tests run MysqlBackend over a
recording stand-in for mysqlclient's connection, because this machine's server is MariaDB and the MySQL 8
forms (hint placement, WITH, the session-variable fallback) must be pinned all the same.
"""

from __future__ import annotations

import re
import socket
from types import SimpleNamespace

import pytest

MySQLdb = pytest.importorskip("MySQLdb", reason="the mysql extra (pip install 'qag[mysql]')")

from qag.backends import _mysql_sql as s  # noqa: E402  (after the skip: qag.backends.mysql imports MySQLdb)
from qag.backends import mysql as mysql_backend  # noqa: E402
from qag.backends.base import Call, refused_write_of  # noqa: E402
from qag.backends.mysql import MysqlBackend, connect_args, mapped  # noqa: E402
from qag.errors import QagError  # noqa: E402
from qag.sql.prepare import prepare, render  # noqa: E402


def rendered(sql: str, values: dict | None = None, fetch: int | None = 6, offset: int = 0) -> str:
    return render(prepare(sql, "mysql"), values or {}, "format", fetch, offset).sql


# ---------------------------------------------------------------------------------------------- MySQL 8 hint


def test_paged_select_gets_the_hint_after_select_b10_paged_sql():
    assert rendered("SELECT 1") == "SELECT 1\nLIMIT 6 OFFSET 0"
    assert s.mysql_statement(rendered("SELECT 1"), 2) == ("SELECT /*+ MAX_EXECUTION_TIME(2000) */ 1\nLIMIT 6 OFFSET 0",
                                                          None)


@pytest.mark.parametrize("sql,expected", [
    ("/* lead */ SELECT a FROM t", "/* lead */ SELECT /*+ MAX_EXECUTION_TIME(1500) */ a FROM t"),
    ("-- note\n# other\n  select*from t", "-- note\n# other\n  select /*+ MAX_EXECUTION_TIME(1500) */*from t"),
    ("/* a */\n/* b -- SELECT */\tSeLeCt\nx", "/* a */\n/* b -- SELECT */\tSeLeCt /*+ MAX_EXECUTION_TIME(1500) */\nx"),
    # A leading /*+ ... */ before SELECT is a plain comment to MySQL.
    ("/*+ not a hint */ SELECT 1", "/*+ not a hint */ SELECT /*+ MAX_EXECUTION_TIME(1500) */ 1"),
    # One hint comment per query block: ours goes first inside the statement's own, which MySQL then obeys.
    ("SELECT /*+ BKA(t) */ a FROM t", "SELECT /*+ MAX_EXECUTION_TIME(1500) BKA(t) */ a FROM t"),
    ("SELECT\n  /*+ MAX_EXECUTION_TIME(99999) */ a FROM t",
     "SELECT\n  /*+ MAX_EXECUTION_TIME(1500) MAX_EXECUTION_TIME(99999) */ a FROM t"),
])
def test_hint_goes_after_leading_comments_right_after_select(sql, expected):
    assert s.mysql_statement(sql, 1.5) == (expected, None)


def test_hint_with_bound_parameters_and_doubled_percent():
    sql = rendered("/* 100% */ SELECT a FROM t WHERE b LIKE 'x%' AND c = :c", {"c": 1})
    assert sql == "/* 100%% */ SELECT a FROM t WHERE b LIKE 'x%%' AND c = %s\nLIMIT 6 OFFSET 0"
    assert s.mysql_statement(sql, 3).sql == ("/* 100%% */ SELECT /*+ MAX_EXECUTION_TIME(3000) */ a FROM t "
                                             "WHERE b LIKE 'x%%' AND c = %s\nLIMIT 6 OFFSET 0")


@pytest.mark.parametrize("timeout", [None, 0])
def test_no_limit_no_hint(timeout):
    sql = rendered("SELECT 1")
    assert s.mysql_statement(sql, timeout) == (sql, None)
    assert s.mariadb_statement(sql, timeout) == f"SET STATEMENT {s.NO_TRACE} FOR {sql}"   # never traced
    with_sql = rendered("WITH x AS (SELECT 1 AS a) SELECT a FROM x")
    assert s.mysql_statement(with_sql, timeout) == (with_sql, None)


@pytest.mark.parametrize("timeout,ms", [(2, 2000), (1.5, 1500), (0.0004, 1), (0.0015, 2), (30.0, 30000),
                                        (4294967.295, 4294967295), (1e12, 4294967295), (1e308, 4294967295)])
def test_milliseconds_never_zero_nor_past_what_mysql_takes(timeout, ms):
    assert s.milliseconds(timeout) == ms


# ---------------------------------------------------------------------------------------------- WITH on MySQL 8


def test_with_statement_hint_goes_on_the_top_level_select_not_the_cte():
    sql = rendered("WITH x AS (SELECT 1 AS a) SELECT a FROM x")
    assert s.mysql_statement(sql, 1.5) == (
        "WITH x AS (SELECT 1 AS a) SELECT /*+ MAX_EXECUTION_TIME(1500) */ a FROM x\nLIMIT 6 OFFSET 0", None)


def test_with_recursive_strings_and_parentheses_are_not_the_top_level():
    sql = ("-- lead\nWITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5), "
           "m AS (SELECT ')select(' AS p) SELECT `select`, i FROM n, m")
    assert s.mysql_statement(sql, 2).sql == (
        "-- lead\nWITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5), "
        "m AS (SELECT ')select(' AS p) SELECT /*+ MAX_EXECUTION_TIME(2000) */ `select`, i FROM n, m")


def test_with_statement_where_the_hint_is_not_known_to_work_sets_the_session_limit_b10_6():
    sql = "WITH x AS (SELECT 1 AS a) SELECT a FROM x"
    assert s.mysql_statement(sql, 1.5, with_hint_ok=False) == (sql, 1500)


@pytest.mark.parametrize("sql", ["(SELECT 1) UNION (SELECT 2)", "TABLE t", "VALUES ROW(1)",
                                 "WITH x AS (SELECT 1) (SELECT * FROM x) UNION (SELECT 2)"])
def test_query_expressions_without_a_top_level_select_use_the_session_limit(sql):
    assert s.mysql_statement(sql, 1.5) == (sql, 1500)


@pytest.mark.parametrize("sql", ["INSERT INTO t VALUES (1)", "UPDATE t SET a = 1",
                                 "WITH x AS (SELECT 1 AS a) UPDATE t, x SET t.a = x.a", "SHOW TABLES",
                                 "CALL p()", "/*!50000 SELECT */ 1", "/* unterminated SELECT 1"])
def test_statements_mysql_cannot_limit_are_sent_unchanged(sql):
    # MySQL's max_execution_time governs SELECT only; a session variable would be a wasted round trip.
    assert s.mysql_statement(sql, 1.5) == (sql, None)


# ---------------------------------------------------------------------------------------------- MariaDB


def test_mariadb_wraps_the_statement_b10_5():
    sql = rendered("SELECT SLEEP(9)")
    assert s.mariadb_statement(sql, 2) == "SET STATEMENT max_statement_time = 2, optimizer_trace = 'enabled=off' FOR SELECT SLEEP(9)\nLIMIT 6 OFFSET 0"


@pytest.mark.parametrize("sql", ["/* c */ WITH x AS (SELECT 1) SELECT * FROM x", "INSERT INTO t VALUES (%s)",
                                 "(SELECT 1) UNION (SELECT 2)"])
def test_mariadb_wraps_any_statement(sql):
    assert s.mariadb_statement(sql, 1.5) == f"SET STATEMENT max_statement_time = 1.5, {s.NO_TRACE} FOR {sql}"


@pytest.mark.parametrize("timeout,prefix", [(None, f"SET STATEMENT tx_read_only = 1, {s.NO_TRACE} FOR "),
                                            (0, f"SET STATEMENT tx_read_only = 1, {s.NO_TRACE} FOR "),
                                            (1.5, f"SET STATEMENT max_statement_time = 1.5, tx_read_only = 1, {s.NO_TRACE} FOR ")])
def test_mariadb_read_only_statement_carries_its_access_mode(timeout, prefix):
    sql = rendered("SELECT 1")
    assert s.mariadb_statement(sql, timeout, "tx_read_only") == prefix + sql


@pytest.mark.parametrize("timeout,read_only,prefix", [
    (None, None, f"SET STATEMENT rand_seed1 = 7, rand_seed2 = 9, {s.NO_TRACE} FOR "),
    (2, None, f"SET STATEMENT max_statement_time = 2, rand_seed1 = 7, rand_seed2 = 9, {s.NO_TRACE} FOR "),
    (None, "tx_read_only", f"SET STATEMENT tx_read_only = 1, rand_seed1 = 7, rand_seed2 = 9, {s.NO_TRACE} FOR "),
    (1.5, "tx_read_only",
     f"SET STATEMENT max_statement_time = 1.5, tx_read_only = 1, rand_seed1 = 7, rand_seed2 = 9, {s.NO_TRACE} FOR "),
])
def test_mariadb_rand_seeds_go_on_the_statement_and_are_never_kept(timeout, read_only, prefix):
    sql = rendered("SELECT RAND()")
    assert s.mariadb_statement(sql, timeout, read_only, (7, 9)) == prefix + sql
    # the unseeded text of the same statement is its own, kept as before
    assert "rand_seed" not in s.mariadb_statement(sql, timeout, read_only)
    assert "rand_seed1 = 8," in s.mariadb_statement(sql, timeout, read_only, (8, 9))


@pytest.mark.parametrize("info,variable", [
    ("10.11.19-MariaDB-0+deb12u1", "tx_read_only"), ("10.6.16-MariaDB", "tx_read_only"),
    ("11.0.2-MariaDB", "tx_read_only"), ("11.1.0-MariaDB", "transaction_read_only"),
    ("11.4.2-MariaDB-ubu2404", "transaction_read_only"), ("12.0.1-MariaDB", "transaction_read_only"),
    ("5.5.5-10.11.6-MariaDB", "tx_read_only"), ("MariaDB", "tx_read_only"), ("", "tx_read_only")])
def test_mariadb_read_only_variable_by_version(info, variable):
    assert s.read_only_variable(info) == variable


@pytest.mark.parametrize("timeout,text", [(2, "2"), (2.0, "2"), (1.5, "1.5"), (0.25, "0.25"), (1 / 3, "0.333333"),
                                          (1e-9, "0.000001"), (1e-5, "0.00001")])
def test_mariadb_seconds_text(timeout, text):
    assert s.seconds_text(timeout) == text


# ---------------------------------------------------------------------------------------------- scanning


@pytest.mark.parametrize("sql,end", [("SELECT 1", 0), ("  \n\tSELECT", 4), ("/* x */SELECT", 7), ("-- x\nSELECT", 5),
                                     ("--x", 0), ("# x", 3), ("/*! SELECT */", 0), ("/*M! SELECT */", 0),
                                     ("/* open", -1), ("-- only", 7),
                                     # "--" then any control character or DEL starts a comment, as the server reads it
                                     ("--\x01\nSHOW", 4), ("--\x7f\nSHOW", 4), ("--\x1f x\nSHOW", 6),
                                     ("--\x80\nSHOW", 0)])
def test_lead_end(sql, end):
    assert s.lead_end(sql) == end


@pytest.mark.parametrize("sql,word", [("select 1", "select"), ("/* c */ INSERT INTO t", "insert"), ("( SELECT 1)", "("),
                                      ("SET @a = 1", "set"), ("", ""), ("--\x01\nSHOW WARNINGS", "show")])
def test_first_word(sql, word):
    assert s.first_word(sql) == word


# ---------------------------------------------------------------------------------------------- driver fields


def test_connect_args_plain():
    args = connect_args({"host": "db", "port": "3307", "user": "u", "password": "p", "database": "crm"}, True)
    assert args == {"host": "db", "port": 3307, "user": "u", "password": "p", "database": "crm",
                    "connect_timeout": 10, "charset": "utf8mb4", "multi_statements": False, "local_infile": 0,
                    "autocommit": None}
    assert connect_args({}, False)["autocommit"] is True
    assert connect_args({"port": 3306}, True)["port"] == 3306


@pytest.mark.parametrize("options,ssl,mode", [
    ({"ssl_ca": "/ca.pem"}, {"ca": "/ca.pem"}, "REQUIRED"),
    ({"ssl_ca": "/ca.pem", "ssl_cert": "/c.pem", "ssl_key": "/k.pem", "ssl_verify_cert": True},
     {"ca": "/ca.pem", "cert": "/c.pem", "key": "/k.pem"}, "VERIFY_CA"),
    ({"ssl_ca": "/ca.pem", "ssl_verify_identity": "true"}, {"ca": "/ca.pem"}, "VERIFY_IDENTITY"),
    ({"ssl_verify_cert": "1"}, None, "VERIFY_CA"),
    ({"ssl_ca": "/ca.pem", "ssl_disabled": True}, None, "DISABLED"),
    ({"ssl_disabled": "false", "ssl_verify_cert": "no"}, None, None),
])
def test_connect_args_tls(options, ssl, mode):
    args = connect_args(options, True)
    assert args.get("ssl") == ssl
    assert args.get("ssl_mode") == mode


def test_connect_args_auth_plugin_and_nothing_else():
    args = connect_args({"auth_plugin": "mysql_native_password", "schema": "x", "init_command": "SET x=1",
                         "unix_socket": "/tmp/s", "client_flag": 65536}, True)
    assert args["auth_plugin"] == "mysql_native_password"
    assert not {"schema", "init_command", "unix_socket", "client_flag"} & set(args)


@pytest.mark.parametrize("port", ["x", "0", 70000, True, "3306.5"])
def test_bad_port(port):
    with pytest.raises(QagError) as info:
        connect_args({"port": port}, True)
    assert info.value.code == "connection_misconfigured"


# ---------------------------------------------------------------------------------------------- errors


def test_errors_map_to_the_contract():
    e = mapped(MySQLdb.OperationalError(1969, "Query execution was interrupted (max_statement_time exceeded)"), 2.0)
    assert (e.code, e.extras["timeout"]) == ("query_timeout", 2)
    e = mapped(MySQLdb.OperationalError(3024, "maximum statement execution time exceeded"), 1.5)
    assert (e.code, e.extras["timeout"]) == ("query_timeout", 1.5)
    # A statement's error is shown as the server wrote it (the caller's own text, never a substitution in it).
    e = mapped(MySQLdb.ProgrammingError(1146, "Table 'db.x|hunter2|y' doesn't exist"), None)
    assert e.extras["detail"] == "1146 (Table 'db.x|hunter2|y' doesn't exist)"
    for code in (2002, 2005, 2006, 2013):
        assert mapped(MySQLdb.OperationalError(code, "x"), None).code == "connection_failed"
    e = mapped(MySQLdb.ProgrammingError(1064, "You have an error in your SQL syntax"), 2.0)
    assert e.code == "query_failed" and e.extras["detail"] == "1064 (You have an error in your SQL syntax)"
    assert mapped(MySQLdb.OperationalError(1045, "Access denied"), None).code == "query_failed"
    # A server that takes no writes (--read-only): its state, not the caller's right (503); --secure-file-priv is
    # another option's, the statement's own fault; a read-only transaction's refusal is the call's own access mode
    e = mapped(MySQLdb.OperationalError(1290, "The MariaDB server is running with the --read-only option so it "
                                              "cannot execute this statement"), None)
    assert (e.code, e.status, e.extras["retry_after"]) == ("unavailable", 503, 5)
    e = mapped(MySQLdb.OperationalError(1436, "Thread stack overrun:  1234 bytes used of a 299008 byte stack"), None)
    assert (e.code, e.status) == ("value_too_large", 400)
    e = mapped(MySQLdb.OperationalError(1792, "Cannot execute statement in a READ ONLY transaction"), None)
    assert e.code == "read_only" and refused_write_of(e, read_only=True).code == "read_only"
    e = mapped(MySQLdb.OperationalError(1290, "The MariaDB server is running with the --secure-file-priv option so "
                                              "it cannot execute this statement"), None)
    assert e.code == "query_failed"


def test_a_connection_that_cant_be_opened_never_shows_the_password(monkeypatch):
    def refuse(**args):
        raise MySQLdb.OperationalError(1045, f"Access denied for user '{args['user']}'@'10.0.0.7' (using password: "
                                             f"YES)")
    monkeypatch.setattr(mysql_backend.MySQLdb, "connect", refuse)
    backend = MysqlBackend.__new__(MysqlBackend)
    shown = {}
    for user, password in (("alice", "alice"), ("alice", "hunter2"), ("alicex", "alice")):
        with pytest.raises(QagError) as info:
            backend._open({"host": "db.example", "user": user, "password": password}, True)
        err = info.value
        assert err.code == "connection_failed" and password not in str(err.extras) and "*" not in str(err.extras)
        shown[(user, password)] = err.extras["detail"]
    # A password equal to (or part of) the user name reads as any other: the detail is the same.
    assert set(shown.values()) == {"1045 (Access denied for user '<user>'@'10.0.0.7' (using password: YES))"}


# ---------------------------------------------------------------------------------------------- sequences


class _FakeResult:
    def __init__(self, rows):
        self.rows = list(rows)
        self.pos = 0

    def describe(self):
        return (("c", 253, 0, 0, 0, 0, 1),)

    def field_flags(self):
        return (0,)

    def data_seek(self, n):
        self.pos = n

    def fetch_row(self, n=1, how=0):
        end = None if n == 0 else self.pos + n
        out = self.rows[self.pos:end]
        self.pos += len(out)
        return tuple(out)

    def discard(self):
        pass


class _FakeConn:
    """Records what mysqlclient would send. send_query's reply "arrives" at once on a real socket pair, so the
    backend's readiness poll works as with a server."""

    encoding = "utf8"

    def __init__(self, log: list, version: str, probe_warnings: int, kwargs: dict):
        self.log = log
        self.version = version
        self.probe_warnings = probe_warnings
        self.kwargs = kwargs
        self.ours, self.theirs = socket.socketpair()
        self.warnings = 0
        self.result = None

    def thread_id(self):
        return 7

    def get_server_info(self):
        return self.version

    def cursor(self):
        return MySQLdb.cursors.Cursor(self)

    def literal(self, value):
        return repr(value).encode()

    def query(self, q):
        text = q.decode()
        self.log.append(text)
        self.warnings = self.probe_warnings if text == s.WITH_HINT_PROBE else 0
        self.result = _FakeResult([(1,)]) if "SELECT" in text or "WITH" in text else None

    def store_result(self):
        result, self.result = self.result, None
        return result

    def next_result(self):
        return -1

    def warning_count(self):
        return self.warnings

    def affected_rows(self):
        return 0

    def insert_id(self):
        return 0

    def send_query(self, q):
        self.log.append(f"send {q.decode()}")
        self.theirs.send(b"x")

    def read_query_result(self):
        self.ours.recv(1)
        self.log.append("read")

    def fileno(self):
        return self.ours.fileno()

    def get_autocommit(self):
        return bool(self.kwargs.get("autocommit"))

    def autocommit(self, on):
        self.log.append(f"autocommit {on}")
        self.kwargs["autocommit"] = on

    def close(self):
        self.log.append("close")
        self.ours.close()
        self.theirs.close()


@pytest.fixture
def fake(monkeypatch):
    """(make_backend, log, connects): MysqlBackend over recording connections."""
    log: list[str] = []
    connects: list[dict] = []
    state = {"version": "8.0.36", "probe_warnings": 0}
    made: list[_FakeConn] = []

    def connect(**kwargs):
        connects.append(kwargs)
        log.append("connect")
        made.append(_FakeConn(log, state["version"], state["probe_warnings"], kwargs))
        return made[-1]

    monkeypatch.setattr(mysql_backend.MySQLdb, "connect", connect)

    def make(version="8.0.36", probe_warnings=0, pool_size=1):
        state.update(version=version, probe_warnings=probe_warnings)
        return MysqlBackend(SimpleNamespace(pool_size=pool_size, pool_idle_timeout=300.0, pool_max=None,
                                            pool_wait=5.0, spin_us=0))

    yield make, log, connects
    for conn in made:   # the pools are never closed here: their socket pairs are (a warning is an error)
        conn.ours.close()
        conn.theirs.close()


FACTS = mysql_backend.schema_reader.FACTS_QUERY
FIELDS = {"host": "db", "port": 3306, "user": "u", "password": "pw", "database": "crm"}


def _read(sql: str, timeout, fetch: int = 6) -> Call:
    return Call(rendered(sql), (), True, timeout, fetch)


def test_b10_4_mysql_pooled_read_sequence(fake, monkeypatch):
    make, log, connects = fake
    cursors = []
    original = mysql_backend._Cursor.__init__
    monkeypatch.setattr(mysql_backend._Cursor, "__init__",
                        lambda self, conn: (cursors.append(1), original(self, conn))[1])
    backend = make()
    for timeout in (2, 2, None):
        assert backend.run(FIELDS, _read("SELECT 1", timeout)).rows == [(1,)]
    select = "SELECT /*+ MAX_EXECUTION_TIME(2000) */ 1\nLIMIT 6 OFFSET 0"
    assert log == ["connect", FACTS, "SET SESSION TRANSACTION READ ONLY", "START TRANSACTION READ ONLY", s.WITH_HINT_PROBE,
                   select, "send ROLLBACK AND CHAIN",
                   "read", select, "send ROLLBACK AND CHAIN",
                   "read", "SELECT 1\nLIMIT 6 OFFSET 0", "send ROLLBACK AND CHAIN"]
    assert len(connects) == 1 and len(cursors) == 1
    assert connects[0]["multi_statements"] is False and connects[0]["autocommit"] is None


def test_a_statement_calling_rand_is_seeded_for_itself(fake):
    """MariaDB: the seeds travel on the statement (SET STATEMENT restores the session's generator), the connection
    stays pooled; MySQL: set before it, and the connection closed after (it holds what the caller drew)."""
    make, log, connects = fake
    backend = make(version="10.11.6-MariaDB-0+deb12u1")
    backend.run(FIELDS, _read("SELECT RAND()", None))
    backend.run(FIELDS, _read("SELECT RAND()", None))
    sent = [line for line in log if "RAND()" in line]
    assert len(sent) == 2 and sent[0] != sent[1] and len(connects) == 1 and "close" not in log
    for line in sent:
        assert re.fullmatch(r"SET STATEMENT tx_read_only = 1, rand_seed1 = \d+, rand_seed2 = \d+, optimizer_trace = 'enabled=off' "
                            r"FOR SELECT RAND\(\)"
                            r"\nLIMIT 6 OFFSET 0", line), line
    del log[:]
    mysql = make(version="8.0.36")
    mysql.run(FIELDS, _read("SELECT RAND()", None))
    seeds = [i for i, line in enumerate(log) if line.startswith("SET rand_seed1 = ")]
    statement = log.index("SELECT RAND()\nLIMIT 6 OFFSET 0")
    assert len(seeds) == 1 and seeds[0] < statement and log[-1] == "close"


@pytest.mark.parametrize("version,variable", [("10.11.6-MariaDB-0+deb12u1", "tx_read_only"),
                                              ("11.4.2-MariaDB", "transaction_read_only")])
def test_b10_5_mariadb_read_sequence(fake, version, variable):
    make, log, connects = fake
    backend = make(version=version)
    backend.run(FIELDS, _read("SELECT SLEEP(9)", 2))
    backend.run(FIELDS, _read("SELECT SLEEP(9)", None))
    # Each statement carries its own read-only mode and commits alone: no transaction to renew after it.
    assert log == ["connect", FACTS, "SET SESSION TRANSACTION READ ONLY", "autocommit True",
                   f"SET STATEMENT max_statement_time = 2, {variable} = 1, {s.NO_TRACE} FOR SELECT SLEEP(9)\nLIMIT 6 OFFSET 0",
                   f"SET STATEMENT {variable} = 1, {s.NO_TRACE} FOR SELECT SLEEP(9)\nLIMIT 6 OFFSET 0"]
    assert len(connects) == 1


def test_b10_6_with_statement_on_mysql(fake):
    make, log, _ = fake
    backend = make()
    backend.run(FIELDS, _read("WITH x AS (SELECT 1 AS a) SELECT a FROM x", 1.5))
    assert log[-2:] == ["WITH x AS (SELECT 1 AS a) SELECT /*+ MAX_EXECUTION_TIME(1500) */ a FROM x\nLIMIT 6 OFFSET 0",
                        "send ROLLBACK AND CHAIN"]
    assert not any(line.startswith("SET SESSION max_execution_time") for line in log)


def test_b10_6_with_statement_where_the_server_ignores_the_hint(fake):
    make, log, _ = fake
    backend = make(probe_warnings=1)
    with_sql = "WITH x AS (SELECT 1 AS a) SELECT a FROM x\nLIMIT 6 OFFSET 0"
    for _ in range(2):
        backend.run(FIELDS, _read("WITH x AS (SELECT 1 AS a) SELECT a FROM x", 1.5))
    backend.run(FIELDS, _read("SELECT 2", None))
    backend.run(FIELDS, _read("SELECT 3", None))
    assert log[log.index(s.WITH_HINT_PROBE) + 1:] == [
        "SET SESSION max_execution_time = 1500", with_sql, "send ROLLBACK AND CHAIN",
        "read", "SET SESSION max_execution_time = 1500", with_sql, "send ROLLBACK AND CHAIN",
        # An unlimited call first clears the limit the earlier ones left on the session, once.
        "read", "SET SESSION max_execution_time = 0", "SELECT 2\nLIMIT 6 OFFSET 0", "send ROLLBACK AND CHAIN",
        "read", "SELECT 3\nLIMIT 6 OFFSET 0", "send ROLLBACK AND CHAIN"]


@pytest.mark.parametrize("version,sent", [
    ("8.0.36", "INSERT INTO t VALUES (%s)"),
    ("10.6.16-MariaDB", f"SET STATEMENT max_statement_time = 2, {s.NO_TRACE} FOR INSERT INTO t VALUES (%s)"),
])
def test_write_sequence_autocommit_no_renewal(fake, version, sent):
    make, log, connects = fake
    backend = make(version=version)
    for _ in range(2):
        backend.run(FIELDS, Call("INSERT INTO t VALUES (%s)", (5,), False, 2, 6))
    statement = sent.replace("%s", "5")
    probe = [] if "MariaDB" in version else [s.WITH_HINT_PROBE]
    assert log == ["connect", FACTS, *probe, statement, statement]
    assert len(connects) == 1 and connects[0]["autocommit"] is True


def test_write_that_may_leave_session_state_closes_its_connection(fake):
    make, log, connects = fake
    backend = make(version="10.6.16-MariaDB")
    backend.run(FIELDS, Call("SET @x = 1", (), False, None, 6))
    backend.run(FIELDS, Call("INSERT INTO t VALUES (1)", (), False, None, 6))
    assert log == ["connect", FACTS, f"SET STATEMENT {s.NO_TRACE} FOR SET @x = 1", "close", "connect", FACTS,
                   f"SET STATEMENT {s.NO_TRACE} FOR INSERT INTO t VALUES (1)"]


def test_pool_key_has_every_field_and_the_access_mode(fake):
    make, log, connects = fake
    backend = make(version="10.6.16-MariaDB", pool_size=4)
    backend.run(FIELDS, _read("SELECT 1", None))
    backend.run(dict(FIELDS, password="other"), _read("SELECT 1", None))
    backend.run(FIELDS, Call("SELECT 1", (), False, None, 6))
    backend.run(dict(FIELDS, ssl_ca="/ca.pem"), _read("SELECT 1", None))
    assert len(connects) == 4
    backend.run(FIELDS, _read("SELECT 1", None))
    assert len(connects) == 4


def test_no_pool_no_renewal(fake):
    make, log, connects = fake
    backend = make(version="10.6.16-MariaDB", pool_size=0)
    for _ in range(3):
        backend.run(FIELDS, _read("SELECT 1", None))
    assert len(connects) == 3 and "send ROLLBACK AND CHAIN" not in log and log.count("close") == 3


def test_a_connection_that_raised_is_closed(fake, monkeypatch):
    make, log, connects = fake
    backend = make(version="10.6.16-MariaDB")
    backend.run(FIELDS, _read("SELECT 1", None))

    def fail(self, q):
        self.log.append(q.decode())
        raise MySQLdb.OperationalError(1969, "Query execution was interrupted (max_statement_time exceeded)")

    monkeypatch.setattr(_FakeConn, "query", fail)
    with pytest.raises(QagError) as info:
        backend.run(FIELDS, _read("SELECT 2", 1))
    assert info.value.code == "query_timeout" and log[-1] == "close"
    assert backend.pool.stats() == {"idle": 0, "active": 0, "waits": 0, "waiting": {}}


@pytest.mark.parametrize("sql,leaves", [
    ("SELECT 1", False), ("SELECT @x := 1", True), ("SELECT GET_LOCK('a', 0)", True),
    ("select get_lock('a', 0)", True), ("SELECT Release_Lock('a')", True), ("SELECT blocked FROM t", True),
    ("SELECT LOC\u212a FROM t", True),   # the Kelvin sign lower-cases to k: erring closed, as lower() did
    ("SELECT loc, k FROM t", False),
    # information_schema's names are folded by each character's simple lower case: İ (U+0130) is "i" there
    ("SELECT VARIABLE_VALUE FROM information_schema.SESS\u0130ON_VAR\u0130ABLES", True),
    ("SELECT * FROM information_schema.SESSION_STATUS", True),
    # SQL built at run time: no text shows what it reads or leaves
    ("EXECUTE IMMEDIATE CONCAT('SELECT 1 FROM information_schema.SESS', 'ION_VARIABLES')", True),
    ("PREPARE s FROM 'SELECT 4242'", True), ("EXECUTE s", True),   # the administrator's (API keys are refused them)
])
def test_statements_that_may_leave_session_state(sql, leaves):
    assert bool(mysql_backend._session_use(sql) & mysql_backend._LEAVES) is leaves
    assert bool(mysql_backend._session_use(sql) & mysql_backend._LEAVES) is leaves   # remembered, the same


@pytest.mark.parametrize("sql,calls", [
    ("SELECT RAND()", True), ("select rand ( ) AS r", True), ("SELECT /*!RAND()*/", True),
    ("SELECT * FROM t ORDER BY `RAND`()", True),    # erring towards seeds: a stored function of that name
    ("SELECT brand, operand, grand_total, rand_x, $rand FROM t", False), ("SELECT RANDOM_BYTES(4)", False),
])
def test_statements_that_call_rand(sql, calls):
    assert bool(mysql_backend._session_use(sql) & mysql_backend._RANDOM) is calls


def test_remembered_verdicts_stay_right_past_the_tables_size():
    for n in range(2500):
        sql = f"SELECT {n} FROM t" if n % 3 else f"SELECT GET_LOCK('{n}', 0)"
        assert bool(mysql_backend._session_use(sql) & mysql_backend._LEAVES) is (n % 3 == 0)
    assert len(mysql_backend._SESSION_STATE) <= mysql_backend._SESSION_STATE_MAX


def test_mariadb_statements_are_kept_per_text_and_limit_but_never_a_long_one():
    kept = s.mariadb_statement("SELECT 1", 2.0, "tx_read_only")
    assert kept == f"SET STATEMENT max_statement_time = 2, tx_read_only = 1, {s.NO_TRACE} FOR SELECT 1"
    assert s.mariadb_statement("SELECT 1", 2.0, "tx_read_only") is kept
    assert s.mariadb_statement("SELECT 1", 3.0, "tx_read_only").startswith("SET STATEMENT max_statement_time = 3,")
    long = "SELECT '" + "x" * s.KEPT_TEXT_MAX + "'"
    assert s.mariadb_statement(long, None, "tx_read_only") == f"SET STATEMENT tx_read_only = 1, {s.NO_TRACE} FOR {long}"
    assert (long, None, "tx_read_only") not in s._MARIADB
