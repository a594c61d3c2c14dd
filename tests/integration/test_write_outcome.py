"""A write whose reply is lost, on MariaDB and PostgreSQL behind qag.testing.Relay: the reply held past the call's
deadline, or the connection cut once the statement was forwarded. The server commits the write either way, so qag
answers its 504/502 with `outcome: "unknown"` and no Retry-After (a client that followed one would apply the write
twice). A read that fails the same way, and a write that never reached the server, keep their Retry-After.

Found by a fault drill: `INSERT ... VALUES (:v)` with the reply held answered `504 query_timeout` with
`retry_after: 2`, and with the connection cut `502 connection_failed` with `Retry-After: 2`; the row was stored
both times.
"""

from __future__ import annotations

import threading
import time

import pytest

from qag.testing import Relay
from tests.server import Server, q, wait_for

pytestmark = pytest.mark.e2e

LIMIT = 2
HELD = 60.0   # a relay delay no call waits out: the reply is held


@pytest.fixture(scope="module")
def write_server():
    # One worker: the warm-up call's connection is the one the next call takes.
    s = Server(env={"QAG_ALLOW_WRITES": "1"}, workers=1, threads=4)
    yield s
    s.close()


class Drill:
    """A table, an INSERT and a read through the relay, and a count read straight from the database."""

    def __init__(self, request, server: Server, uniq, db: str, relay: Relay):
        fields = dict(request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db"))
        self.server, self.relay, self.password = server, relay, fields["password"]
        via, direct = uniq("via"), uniq("direct")
        assert server.post("/api/v1/connections", {"name": via, "db": db, **fields, "host": "127.0.0.1",
                                                    "port": relay.port}).status == 201
        assert server.post("/api/v1/connections", {"name": direct, "db": db, **fields}).status == 201
        table = uniq("w")
        created = server.post("/execute_sql", {"sql": f"CREATE TABLE {table} (v INTEGER NOT NULL)",
                                               "connection_name": direct})
        assert created.status == 200, created
        self.insert, self.read, self.count = uniq("ins"), uniq("read"), uniq("cnt")
        # A function that writes, called by a plain SELECT (nothing in the statement says it writes)
        function = uniq("f")
        body = (f"CREATE FUNCTION {function}(x INTEGER) RETURNS INTEGER MODIFIES SQL DATA "
                f"BEGIN INSERT INTO {table} (v) VALUES (x); RETURN x; END" if db == "mysql" else
                f"CREATE FUNCTION {function}(x integer) RETURNS integer LANGUAGE sql "
                f"AS $$ INSERT INTO {table} (v) VALUES (x) RETURNING v $$")
        if db == "mysql":      # a body of several statements: qag's one-statement rule refuses it, so directly
            from tests.services import mysql_admin
            admin = mysql_admin()
            try:
                admin.cursor().execute(f"CREATE FUNCTION `{fields['database']}`.{body[len('CREATE FUNCTION '):]}")
            finally:
                admin.close()
        else:
            made = server.post("/execute_sql", {"sql": body, "connection_name": direct})
            assert made.status == 200, made
        self.call = uniq("call")
        server.query(self.call, f"SELECT {function}(:v) AS r", via)
        server.query(self.insert, f"INSERT INTO {table} (v) VALUES (:v)", via)
        server.query(self.read, f"SELECT COUNT(*) AS n FROM {table}", via)
        server.query(self.count, f"SELECT COUNT(*) AS n FROM {table} WHERE v = :v", direct)

    def write(self, v: int, timeout: float = LIMIT):
        return self.server.post(q(self.insert) + f"?timeout={timeout}", {"params": {"v": v}})

    def stored(self, v: int) -> int:
        reply = self.server.post(q(self.count), {"params": {"v": v}})
        assert reply.status == 200, reply
        return int(reply.json[0]["n"])

    def warm(self, call) -> None:
        """A call that succeeds through the relay, so the next one runs on its pooled connection (whose reset's reply
        has arrived before the relay holds anything)."""
        self.relay.delay = 0.0
        reply = call()
        assert reply.status == 200, reply
        time.sleep(0.3)   # PostgreSQL: the reset queued behind the call is answered before the relay holds replies

    def held(self, warm, call):
        """`warm` through the relay, then `call`'s reply held past its deadline: the call's answer."""
        self.warm(warm)
        self.relay.delay = HELD
        try:
            return call()
        finally:
            self.relay.delay = 0.0


def _unknown(reply, status: int, code: str) -> None:
    assert reply.status == status and reply.json["code"] == code, reply
    assert reply.json["outcome"] == "unknown", reply
    assert "retry_after" not in reply.json and "retry-after" not in reply.headers, reply
    assert "may have been applied" in reply.json["error"] and "check before retrying" in reply.json["error"]


def _retryable(reply, status: int, code: str) -> None:
    assert reply.status == status and reply.json["code"] == code, reply
    assert "outcome" not in reply.json, reply
    assert reply.json["retry_after"] == 2 and reply.headers["retry-after"] == "2", reply


def _in_thread(call):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_a_write_whose_reply_is_held_past_its_deadline_has_an_unknown_outcome(request, write_server, uniq, db):
    host, port = _upstream(request, db)
    with Relay(host, port) as relay:
        drill = Drill(request, write_server, uniq, db, relay)
        reply = drill.held(lambda: drill.write(0), lambda: drill.write(1))
        _unknown(reply, 504, "query_timeout")
        assert reply.json["timeout"] == LIMIT and f"time limit of {LIMIT} seconds" in reply.json["error"]
        assert drill.stored(1) == 1            # what the answer warns about: the server committed it

        def select(v: int):
            return write_server.post(q(drill.call) + f"?timeout={LIMIT}", {"params": {"v": v}})
        # A SELECT whose function writes: the same unknown outcome, and the row is there
        _unknown(drill.held(lambda: select(5), lambda: select(6)), 504, "query_timeout")
        assert drill.stored(6) == 1
        # A read through the same writable caller (it runs read-write too) is only a read: retryable as before.
        reply = drill.held(lambda: write_server.get(q(drill.read)),
                           lambda: write_server.get(q(drill.read) + f"?timeout={LIMIT}"))
        _retryable(reply, 504, "query_timeout")


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_a_write_whose_connection_is_cut_after_the_statement_has_an_unknown_outcome(request, write_server, uniq, db):
    host, port = _upstream(request, db)
    with Relay(host, port) as relay:
        drill = Drill(request, write_server, uniq, db, relay)
        drill.warm(lambda: drill.write(0))
        relay.delay = HELD
        thread, out = _in_thread(lambda: drill.write(1, timeout=20))
        wait_for(lambda: drill.stored(1) == 1 or None, "the INSERT committed on the server, its reply held")
        relay.cut()
        thread.join(30)
        relay.delay = 0.0
        _unknown(out[0], 502, "connection_failed")
        assert out[0].json["detail"] and drill.password not in out[0].body.decode()
        assert drill.stored(1) == 1
        # A read cut the same way: retryable.
        drill.warm(lambda: write_server.get(q(drill.read)))
        relay.delay = HELD
        turns = relay.turns
        thread, out = _in_thread(lambda: write_server.get(q(drill.read) + "?timeout=20"))
        wait_for(lambda: relay.turns > turns or None, "the read forwarded")
        relay.cut()
        thread.join(30)
        relay.delay = 0.0
        _retryable(out[0], 502, "connection_failed")


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_a_write_that_never_reached_the_server_stays_retryable(request, write_server, uniq, db):
    host, port = _upstream(request, db)
    with Relay(host, port) as relay:
        drill = Drill(request, write_server, uniq, db, relay)
        drill.warm(lambda: drill.write(0))
        relay.down()          # open connections broken, new ones refused: nothing can reach the server
        try:
            wait_for(lambda: _refused(drill.write(1)) or None, "the write refused before it was sent", 10.0)
        finally:
            relay.up()
        assert drill.stored(1) == 0
        assert drill.write(2).status == 200 and drill.stored(2) == 1


def _refused(reply) -> bool:
    # The pooled connection broken by down() may be seen dead only as the call starts on it: that call has sent
    # its statement (unknown outcome, nothing stored); the next one can't connect at all.
    if reply.json.get("outcome") == "unknown":
        return False
    _retryable(reply, 502, "connection_failed")
    return True


def _upstream(request, db: str) -> tuple[str, int]:
    fields = request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db")
    return fields["host"], int(fields["port"])


def test_a_database_that_takes_no_writes_is_unavailable_not_forbidden(write_server, uniq, tmp_path):
    """Fault drill: a write call the database itself refused because it takes no writes now (a PostgreSQL standby
    or default_transaction_read_only, a SQLite file that can't be written) was 403 read_only, which tells a client
    its call is not allowed. It is the database's state: 503 unavailable with Retry-After, nothing written; a
    read goes on."""
    from tests.services import make_pg_database, pg_admin
    fields, cleanup = make_pg_database()
    try:
        name = uniq("ro")
        assert write_server.post("/api/v1/connections", {"name": name, "db": "postgres", **fields}).status == 201
        made = write_server.post("/execute_sql", {"sql": "CREATE TABLE w (v integer)", "connection_name": name})
        assert made.status == 200, made
        admin = pg_admin()
        try:
            admin.cursor().execute(f'ALTER DATABASE "{fields["database"]}" SET default_transaction_read_only = on')
            admin.cursor().execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                                   (fields["database"],))
        finally:
            admin.close()
        for _ in range(3):      # the pooled connections the terminate ended are replaced first (502 at most)
            reply = write_server.post("/execute_sql", {"sql": "INSERT INTO w VALUES (1)", "connection_name": name})
            if reply.status != 502:
                break
        assert reply.status == 503 and reply.json["code"] == "unavailable", reply
        assert int(reply.headers["retry-after"]) > 0 and "outcome" not in reply.json
        read = write_server.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM w", "connection_name": name})
        assert read.status == 200 and read.json == [{"n": 0}], read
    finally:
        cleanup()


def test_a_sqlite_file_that_takes_no_writes_is_unavailable_not_forbidden(write_server, uniq, tmp_path):
    """The same for a SQLite file that can't be written (immutable: root can't write it either)."""
    import sqlite3
    import subprocess
    path = tmp_path / "frozen.db"
    sqlite3.connect(path).executescript("CREATE TABLE w (v INTEGER);")
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("no immutable files here (not root, or a filesystem without them)")
    try:
        lite = uniq("frozen")
        assert write_server.post("/api/v1/connections", {"name": lite, "db": "sqlite",
                                                         "database": str(path)}).status == 201
        reply = write_server.post("/execute_sql", {"sql": "INSERT INTO w VALUES (1)", "connection_name": lite})
        assert reply.status == 503 and reply.json["code"] == "unavailable", reply
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
