"""The exact PostgreSQL messages qag sends (contract 10.4, B10.2, B10.3), checked on the pure builders and on a
recording stand-in for psycopg2's connection; no server needed."""

from __future__ import annotations

import socket

import psycopg2
import pytest

from qag import settings as qag_settings
from qag.backends import postgres as pg
from qag.backends.base import Call
from qag.errors import QagError
from qag.sql.prepare import prepare, render

READ_PREFIX = "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SET TRANSACTION READ ONLY; "


def test_contract_example_message():
    sql = render(prepare("SELECT pg_sleep(9)", "postgres"), {}, "format", 6, 0).sql
    assert sql == "SELECT pg_sleep(9)\nLIMIT 6 OFFSET 0"
    assert pg.message(sql, True, 1.5) == ("RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SET TRANSACTION READ ONLY; "
                                          "SET LOCAL statement_timeout = 1500; SELECT pg_advisory_unlock_all(); SELECT pg_sleep(9)\nLIMIT 6 OFFSET 0")


@pytest.mark.parametrize("read_only, timeout, expected", [
    (True, None, "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SET TRANSACTION READ ONLY; SELECT pg_advisory_unlock_all(); SELECT 1"),
    (False, None, "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SELECT pg_advisory_unlock_all(); SELECT 1"),
    (False, 2, "RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SET LOCAL statement_timeout = 2000; SELECT pg_advisory_unlock_all(); SELECT 1"),
    (True, 0.0004, READ_PREFIX + "SET LOCAL statement_timeout = 1; SELECT pg_advisory_unlock_all(); SELECT 1"),   # never 0 (= no limit)
    (True, 0, READ_PREFIX + "SELECT pg_advisory_unlock_all(); SELECT 1"),                                        # no limit configured
])
def test_message_parts(read_only, timeout, expected):
    assert pg.message("SELECT 1", read_only, timeout) == expected


def test_prefix_has_no_percent_for_psycopg2_interpolation():
    for read_only in (True, False):
        for timeout in (None, 1.5, 30):
            assert "%" not in pg.prefix(read_only, timeout)
            assert "%" not in pg.stream_message("SELECT 1", timeout, 1000).replace("SELECT 1", "")


def test_stream_message_declares_and_fetches_in_one_message():
    text = pg.stream_message("SELECT * FROM t -- trailing comment", 30, 1000)
    assert text == ("BEGIN; " + READ_PREFIX + "SET LOCAL statement_timeout = 30000; SELECT pg_advisory_unlock_all(); DECLARE qag_stream NO SCROLL "
                    "CURSOR FOR SELECT * FROM t -- trailing comment\n; FETCH FORWARD 1000 FROM qag_stream")
    assert pg.fetch_message(250) == "FETCH FORWARD 250 FROM qag_stream"


def test_connect_args_pass_only_driver_fields():
    fields = {"host": "db", "port": 5433, "user": "u", "password": "pw", "database": "app", "schema": "sales",
              "sslmode": "verify-full", "sslrootcert": "/ca.pem", "sslcert": "/c.pem", "sslkey": "/k.pem",
              "sslcrl": "/crl.pem", "options": "-c statement_timeout=0", "unknown": "x", "user_empty": ""}
    assert pg.connect_args(fields) == {
        "host": "db", "port": "5433", "user": "u", "password": "pw", "dbname": "app", "sslmode": "verify-full",
        "sslrootcert": "/ca.pem", "sslcert": "/c.pem", "sslkey": "/k.pem", "sslcrl": "/crl.pem",
        "connect_timeout": 10, "client_encoding": "UTF8"}


def test_pool_key_covers_every_field_and_the_access_mode():
    a = {"host": "h", "user": "u", "password": "one", "database": "d"}
    assert pg.pool_key(a, True) == pg.pool_key(dict(reversed(list(a.items()))), True)
    assert pg.pool_key(a, True) != pg.pool_key(a, False)
    assert pg.pool_key(a, True) != pg.pool_key(dict(a, password="two"), True)
    assert pg.pool_key(a, True) != pg.pool_key(dict(a, schema="s"), True)
    hash(pg.pool_key(dict(a, extra=["unhashable"]), True))


def test_errors_never_show_the_password():
    fields = {"password": "s3cret-pw"}
    exc = psycopg2.OperationalError('connection to server at "h" failed: could not connect (password s3cret-pw)')
    err = pg.mapped(exc, fields, None)
    assert err.code == "connection_failed" and err.status == 502
    assert "s3cret-pw" not in str(err.extras) and "********" in err.extras["detail"]


class FakeCursor:
    def __init__(self, conn):
        self.conn = conn
        self.description = [("x",)]
        self.rowcount = 1

    def execute(self, sql, args=None):
        self.conn.log.append((sql, args))
        if self.conn.fail is not None:
            raise self.conn.fail

    def fetchmany(self, n):
        return [(1,)][:n]


class FakeConn:
    """Records every message; its socket is one end of a quiet socketpair, so it looks alive when idle."""

    made: list["FakeConn"] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.log: list = []
        self.autocommit_sets: list = []
        self.closed = 0
        self.fail = None
        self._a, self._b = socket.socketpair()
        FakeConn.made.append(self)

    @property
    def autocommit(self):
        return self.autocommit_sets[-1] if self.autocommit_sets else False

    @autocommit.setter
    def autocommit(self, value):
        self.autocommit_sets.append(value)

    def fileno(self):
        return self._a.fileno()

    def cursor(self, *a, **k):
        return FakeCursor(self)

    def get_transaction_status(self):
        return psycopg2.extensions.TRANSACTION_STATUS_IDLE

    def rollback(self):
        self.log.append(("<rollback>", None))

    def commit(self):
        self.log.append(("<commit>", None))

    def close(self):
        self.closed = 1
        self._a.close()
        self._b.close()


@pytest.fixture
def backend(monkeypatch):
    FakeConn.made = []
    monkeypatch.setattr(pg.psycopg2, "connect", lambda **kw: FakeConn(**kw))
    return pg.PostgresBackend(qag_settings.load({"QAG_POOL_SIZE": "4"}))


FIELDS = {"host": "h", "user": "u", "password": "pw", "database": "d"}


def test_b10_2_two_pooled_reads_one_connect_identical_messages(backend):
    sql = "SELECT 1\nLIMIT 6 OFFSET 0"
    for _ in range(2):
        backend.run(FIELDS, Call(sql, (), True, 2.0, 6))
    assert len(FakeConn.made) == 1
    conn = FakeConn.made[0]
    assert conn.autocommit_sets == [True]
    assert conn.log == [(READ_PREFIX + "SET LOCAL statement_timeout = 2000; SELECT pg_advisory_unlock_all(); " + sql, None)] * 2
    assert all(not text.startswith("<") for text, _ in conn.log)          # no rollback, no commit


def test_b10_3_write_message_without_read_only_and_without_commit(backend):
    backend.run(FIELDS, Call("INSERT INTO t VALUES (%s)", (5,), False, None, 11))
    conn = FakeConn.made[0]
    assert conn.log == [("RESET ALL; RESET ROLE; RESET SESSION AUTHORIZATION; SET LOCAL DateStyle = ISO; SELECT pg_advisory_unlock_all(); INSERT INTO t VALUES (%s)", (5,))]
    # reads and writes never share a connection
    backend.run(FIELDS, Call("SELECT 1", (), True, None, 11))
    assert len(FakeConn.made) == 2 and FakeConn.made[1].log[0][0].startswith(READ_PREFIX)


def test_a_call_that_raised_closes_its_connection(backend):
    backend.run(FIELDS, Call("SELECT 1", (), True, None, 2))
    conn = FakeConn.made[0]
    conn.fail = psycopg2.errors.lookup("42601")("syntax error")     # SyntaxError: not connection-level
    with pytest.raises(QagError) as info:
        backend.run(FIELDS, Call("SELEC 1", (), True, None, 2))
    assert info.value.code == "query_failed" and conn.closed
    backend.run(FIELDS, Call("SELECT 1", (), True, None, 2))
    assert len(FakeConn.made) == 2


def test_dead_reused_connection_is_retried_once_for_reads_only(backend):
    for read_only in (True, False):
        FakeConn.made = []
        backend.close_idle()
        backend.run(FIELDS, Call("SELECT 1", (), read_only, None, 2))
        dead = FakeConn.made[0]

        class Gone(psycopg2.OperationalError):
            pass

        def die(sql, args=None, conn=dead):
            conn.log.append((sql, args))
            conn.closed = 2
            raise Gone("server closed the connection unexpectedly")

        dead.qag_cursor = type("C", (), {"execute": staticmethod(die)})()
        if read_only:
            result = backend.run(FIELDS, Call("SELECT 1", (), True, None, 2))
            assert result.rows == [(1,)] and len(FakeConn.made) == 2 and len(dead.log) == 2
        else:
            with pytest.raises(QagError) as info:
                backend.run(FIELDS, Call("DELETE FROM t", (), False, None, 2))
            assert info.value.code == "connection_failed" and len(FakeConn.made) == 1 and len(dead.log) == 2


def test_idle_connection_with_something_to_read_is_replaced_before_use(backend):
    backend.run(FIELDS, Call("DELETE FROM t", (), False, None, 2))
    first = FakeConn.made[0]
    first._b.close()                       # the server side went away: EOF is readable
    backend.run(FIELDS, Call("DELETE FROM t", (), False, None, 2))
    assert len(FakeConn.made) == 2 and first.closed and len(first.log) == 1
