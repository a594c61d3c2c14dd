"""A key's write rules hold past the functions a statement calls, on the real MariaDB and PostgreSQL.

A key narrowed to some write operations (allowed_write_ops) writes only what the guard reads in its statement: a
user-defined function's own writes are not the statement's, so such a key's statement that writes nothing runs
read-only (the engine refuses the function's writes), and one that writes calls only the engine's built-ins and the
functions allowed_functions names. A read-only call that reaches a writing function is refused by the engine itself,
answered 403 read_only (not 500), as is an attempt to leave PostgreSQL's read-only mode.
"""

from __future__ import annotations

import pytest

from tests.server import Server
from tests.services import make_mysql_database, make_pg_database, mysql_admin

pytestmark = pytest.mark.e2e

_PG_SETUP = (
    "CREATE TABLE secret (id int PRIMARY KEY, token text)",
    "CREATE TABLE audit (note text)",
    "CREATE FUNCTION wipe_secret() RETURNS int LANGUAGE sql VOLATILE AS 'DELETE FROM secret RETURNING 1'",
    # named like a side channel (has_*): judged as the user function it is
    "CREATE FUNCTION has_wipe() RETURNS int LANGUAGE sql VOLATILE AS 'DELETE FROM secret RETURNING 1'",
    "CREATE FUNCTION shout(t text) RETURNS text LANGUAGE sql AS 'SELECT upper(t)'",
    # an operator is a call of its function
    "CREATE FUNCTION wipe_op(int, int) RETURNS int LANGUAGE sql VOLATILE AS 'DELETE FROM secret RETURNING 1'",
    "CREATE OPERATOR #@# (LEFTARG = int, RIGHTARG = int, FUNCTION = wipe_op)",
)
_MYSQL_SETUP = (
    "CREATE TABLE secret (id int PRIMARY KEY, token text)",
    "CREATE TABLE audit (note text)",
    "CREATE FUNCTION wipe_secret() RETURNS int MODIFIES SQL DATA BEGIN DELETE FROM secret; RETURN 1; END",
    "CREATE FUNCTION has_wipe() RETURNS int MODIFIES SQL DATA BEGIN DELETE FROM secret; RETURN 1; END",
    "CREATE FUNCTION shout(t text) RETURNS text DETERMINISTIC RETURN upper(t)",
)


def _pg(fields: dict, statements) -> list:
    import psycopg
    admin_fields = {"host": fields["host"], "port": fields["port"], "dbname": fields["database"],
                    "user": fields["user"], "password": fields["password"]}
    with psycopg.connect(autocommit=True, **admin_fields) as conn:
        rows = []
        for statement in statements:
            cur = conn.execute(statement)
            rows = cur.fetchall() if cur.description else []
        return rows


def _mysql(fields: dict, statements) -> list:
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        cur.execute(f"USE `{fields['database']}`")
        rows = []
        for statement in statements:
            cur.execute(statement)
            rows = list(cur.fetchall()) if cur.description else []
        admin.commit()
        return rows
    finally:
        admin.close()


_RUN = {"postgres": _pg, "mysql": _mysql}
_REFILL = ("DELETE FROM secret", "DELETE FROM audit", "INSERT INTO secret VALUES (1, 'a'), (2, 'b')")


@pytest.fixture(scope="module")
def srv():
    made = []
    s = Server(workers=1, env={"QAG_ALLOW_WRITES": "1"})
    try:
        for dialect, make, setup in (("postgres", make_pg_database, _PG_SETUP),
                                     ("mysql", make_mysql_database, _MYSQL_SETUP)):
            fields, cleanup = make()
            made.append(cleanup)
            _RUN[dialect](fields, setup)
            reply = s.post("/api/v1/connections", {"name": dialect, "db": dialect, **fields})
            assert reply.status == 201, reply
            s.fields = {**getattr(s, "fields", {}), dialect: fields}
        s.keys = {
            "insert_only": s.key("insert_only", connections="*", allow_writes=True, allowed_write_ops=["insert"]),
            "insert_granted": s.key("insert_granted", connections="*", allow_writes=True,
                                    allowed_write_ops=["insert"], allowed_functions=["wipe_secret"]),
            "read_only": s.key("read_only", connections="*"),
            "insert_create": s.key("insert_create", connections="*", allow_writes=True,
                                   allowed_write_ops=["insert", "create"]),
            "upsert": s.key("upsert", connections="*", allow_writes=True, allowed_write_ops=["insert", "update"]),
            "secret_writer": s.key("secret_writer", connections="*", allow_writes=True, allowed_tables=["secret"]),
        }
        yield s
    finally:
        s.close()
        for cleanup in made:
            cleanup()


def _secret_rows(srv, dialect) -> int:
    return _RUN[dialect](srv.fields[dialect], ("SELECT count(*) FROM secret",))[0][0]


def _call(srv, dialect, key, sql):
    _RUN[dialect](srv.fields[dialect], _REFILL)
    return srv.post("/execute_sql", {"sql": sql, "connection_name": dialect}, key=srv.keys[key])


_CATALOG = {"postgres": "pg_catalog.pg_class", "mysql": "information_schema.schemata"}


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
@pytest.mark.parametrize("sql, code", [
    # writes nothing the guard reads: run read-only, so the engine refuses the function's writes
    ("SELECT wipe_secret() AS w", "read_only"),
    ("SELECT 1 AS v FROM secret WHERE wipe_secret() = 1", "read_only"),
    ("SELECT wipe_secret() AS w FROM {catalog} LIMIT 1", "read_only"),
    ("SELECT has_wipe() AS w", "read_only"),
    # writes: then it may call no function but the engine's own
    ("INSERT INTO audit (note) SELECT CAST(wipe_secret() AS char)", "function_not_allowed"),
    ("INSERT INTO audit (note) SELECT CAST(has_wipe() AS char)", "function_not_allowed"),
    # ... and a write whose calls can't all be read (it reads the catalog) is refused
    ("INSERT INTO audit (note) SELECT CAST(wipe_secret() AS char) FROM {catalog} LIMIT 1", "function_not_allowed"),
    ("INSERT INTO audit (note) VALUES ('x')  -- then: SELECT wipe_secret()", None),
    ("SELECT shout('a') AS s", None),
])
def test_an_insert_only_key_writes_nothing_through_a_function(srv, dialect, sql, code):
    r = _call(srv, dialect, "insert_only", sql.format(catalog=_CATALOG[dialect]))
    if code is None:
        assert r.status == 200, r
    else:
        assert r.status == 403 and r.json["code"] == code, r
    assert _secret_rows(srv, dialect) == 2
    # Nothing is lost: the next good request by the same key succeeds.
    follow = srv.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM secret", "connection_name": dialect},
                      key=srv.keys["insert_only"])
    assert follow.status == 200 and follow.json == [{"n": 2}], follow


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_allowed_functions_opens_a_function_to_an_insert_only_key(srv, dialect):
    # The administrator's own choice: a function it names runs in a write, with what it does.
    r = _call(srv, dialect, "insert_granted", "INSERT INTO audit (note) SELECT CAST(wipe_secret() AS char)")
    assert r.status == 200, r
    assert _secret_rows(srv, dialect) == 0


@pytest.mark.parametrize("key", ["upsert", "secret_writer"])
@pytest.mark.parametrize("sql", [
    "INSERT INTO secret (id, token) VALUES (1, 'z') ON DUPLICATE KEY UPDATE token = VALUES(token)",
    "INSERT INTO secret (id, token) VALUES (1, 'z') ON DUPLICATE KEY UPDATE token = VALUE(token)",
])
def test_a_mysql_upserts_values_is_no_function_call(srv, key, sql):
    # VALUES(col) / MariaDB's VALUE(col) in ON DUPLICATE KEY UPDATE is the grammar's, not a stored function: a key
    # narrowed to insert and update, or one whose allow-list grants the table, upserts (was 403 function_not_allowed).
    r = _call(srv, "mysql", key, sql)
    assert r.status == 200, r
    assert _RUN["mysql"](srv.fields["mysql"], ("SELECT token FROM secret WHERE id = 1",)) == [("z",)]


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_a_read_only_keys_writing_function_is_the_engines_403(srv, dialect):
    r = _call(srv, dialect, "read_only", "SELECT wipe_secret() AS w")
    assert r.status == 403 and r.json["code"] == "read_only", r
    assert _secret_rows(srv, dialect) == 2


@pytest.mark.parametrize("sql", [
    "SELECT set_config('transaction_read_only', 'off', true) AS v",
    "SELECT set_config('transaction_read_only', 'off', false) AS v",
])
def test_leaving_postgresqls_read_only_mode_is_403(srv, sql):
    r = _call(srv, "postgres", "read_only", sql)
    assert r.status == 403 and r.json["code"] == "read_only", r
    follow = srv.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM secret", "connection_name": "postgres"},
                      key=srv.keys["read_only"])
    assert follow.status == 200 and follow.json == [{"n": 2}], follow


@pytest.mark.parametrize("sql, code", [
    ("INSERT INTO audit (note) SELECT CAST(1 #@# 1 AS text)", "function_not_allowed"),
    ("INSERT INTO audit (note) SELECT 'x' WHERE 1 OPERATOR(public.#@#) 1 = 1", "function_not_allowed"),
    ("SELECT 1 #@# 1 AS w", "read_only"),
])
def test_an_insert_only_keys_operator_is_a_call_of_its_function(srv, sql, code):
    r = _call(srv, "postgres", "insert_only", sql)
    assert r.status == 403 and r.json["code"] == code, r
    assert _secret_rows(srv, "postgres") == 2


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_a_key_allowed_ddl_still_runs_it(srv, dialect):
    # DDL is never read for calls (no reading covers it): a key allowed CREATE creates, as before.
    r = _call(srv, dialect, "insert_create", "CREATE TABLE made_by_a_key (a int)")
    assert r.status == 200, r
    assert _RUN[dialect](srv.fields[dialect], ("SELECT count(*) FROM made_by_a_key",)) == [(0,)]
