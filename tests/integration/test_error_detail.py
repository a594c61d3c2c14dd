"""What an error's `detail` may show (contract 0.3, docs/security.md "Error details").

A statement's error is shown as the server wrote it: substituting the connection's password in it (as qag once
did) made the caller's own text an oracle, the place of `********` telling which of its guesses was the password.
A failure to open a connection is cleaned so that nothing in it tells where, or whether, the password equals a part
of it. And a caller with mask rules never gets `detail`, whichever step of any route failed.
"""

from __future__ import annotations

import socket

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e

RULES = [{"column": "customers.email", "action": "hash"}]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connection(server, name: str, db: str, fields: dict) -> None:
    reply = server.post("/api/v1/connections", {"name": name, "db": db, **fields})
    assert reply.status == 201, reply


def _execute(server, connection: str, sql: str, key: str = "admin", **body):
    return server.post("/execute_sql", {"sql": sql, "connection_name": connection, **body}, key=key)


# --- a statement's error: the caller's own text, unchanged ------------------------------------------------------
def test_postgres_a_guessing_statement_shows_its_own_text_unchanged(server, uniq, pg_db):
    name = uniq("pgguess")
    _connection(server, name, "postgres", pg_db)
    password = pg_db["password"]
    guesses = ["guess_a", password, "guess_b"]
    values = ", ".join(f"('{g}')" for g in guesses)
    sql = f"SELECT CAST((SELECT string_agg(g, '|') FROM (VALUES {values}) v(g)) AS INT) AS n"
    r = _execute(server, name, sql)
    assert r.status == 400 and r.json["code"] == "value_invalid", r
    assert r.json["detail"] == f'invalid input syntax for type integer: "{"|".join(guesses)}"', r
    assert b"********" not in r.body
    # A scoped key that wrote the statement sees the same (it keeps `detail` on /execute_sql).
    plain = server.key(uniq("plainguess"), connections=[name])
    r = _execute(server, name, sql, key=plain)
    assert r.status == 400 and "|".join(guesses) in r.json["detail"] and b"********" not in r.body, r


def test_mysql_a_guessing_statement_shows_its_own_text_unchanged(server, uniq, mysql_db):
    name = uniq("myguess")
    _connection(server, name, "mysql", mysql_db)
    table = f"x|{mysql_db['password']}|y"
    r = _execute(server, name, f"SELECT * FROM `{table}`")
    assert r.status == 500 and r.json["code"] == "query_failed", r
    assert r.json["detail"] == f"1146 (Table '{mysql_db['database']}.{table}' doesn't exist)", r
    assert b"********" not in r.body


# --- a connection that can't be opened: nothing tells the password --------------------------------------------
@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_a_password_equal_to_the_user_name_is_not_told(request, server, uniq, db):
    """A login refused (MariaDB: access denied; PostgreSQL: no such role) for a user whose password is its own
    name reads exactly as for any other password, and shows neither."""
    fields = dict(request.getfixturevalue("mysql_db" if db == "mysql" else "pg_db"))
    user = uniq("qag_same")
    details = []
    for password in (user, "an-other-password-5c1"):
        attempt = {**fields, "user": user, "password": password}
        r = server.post("/api/v1/connections/test", {"db": db, **attempt})
        assert r.status == 502 and r.json["code"] == "connection_failed", r
        assert user.encode() not in r.body and b"********" not in r.body, r
        details.append(r.json["detail"])
        # A saved connection run by a scoped key (which keeps `detail` on /execute_sql): the same.
        name = uniq("same")
        _connection(server, name, db, attempt)
        r = _execute(server, name, "SELECT 1", key=server.key(uniq("samekey"), connections=[name]))
        assert r.status == 502 and r.json["detail"] == details[-1], r
        assert user.encode() not in r.body and b"********" not in r.body, r
    assert details[0] == details[1] and "<user>" in details[0], details


def test_a_wrong_password_never_shows_it(server, uniq, mysql_db):
    password = "wrong-" + uniq("pw")
    r = server.post("/api/v1/connections/test", {"db": "mysql", **mysql_db, "password": password})
    assert r.status == 502 and r.json["code"] == "connection_failed" and r.json["detail"], r
    assert password.encode() not in r.body and b"********" not in r.body
    assert not any(password in line for line in server.log)


# --- a caller with mask rules: no `detail` on any route ----------------------------------------------------------
@pytest.fixture(scope="module")
def down(server, pg_db, mysql_db):
    """Connections that can't be opened (a port nothing listens on; MariaDB also a wrong password), keys for them."""
    port = _closed_port()
    names = {"pg": "maskdown_pg", "my": "maskdown_my", "mypw": "maskdown_mypw"}
    _connection(server, names["pg"], "postgres", {**pg_db, "port": port})
    _connection(server, names["my"], "mysql", {**mysql_db, "port": port})
    _connection(server, names["mypw"], "mysql", {**mysql_db, "password": "not-the-password-3e"})
    names["masked"] = server.key("maskdown_masked", connections="*", mask=RULES)
    names["plain"] = server.key("maskdown_plain", connections="*")
    return names


def _no_detail(r):
    assert r.status == 502 and r.json["code"] == "connection_failed", r
    assert "detail" not in r.json, r


def _has_detail(r):
    assert r.status == 502 and r.json["code"] == "connection_failed" and r.json["detail"], r


def test_masked_postgres_function_catalog_read(server, down):
    """The function-catalog read of a masked call (it calls lower()) fails before the statement runs."""
    sql = "SELECT lower(name) AS n FROM customers"
    _no_detail(_execute(server, down["pg"], sql, key=down["masked"]))
    r = server.post("/execute_sql", {"sql": sql, "connection_name": down["pg"]}, key=down["masked"],
                    headers={"Accept": "application/problem+json"})
    assert r.status == 502 and r.json["code"] == "connection_failed" and "driver_detail" not in r.json, r
    _has_detail(_execute(server, down["pg"], sql, key=down["plain"]))


def test_masked_postgres_function_catalog_read_of_a_saved_query(server, uniq, down):
    name = uniq("maskfn")
    server.query(name, "SELECT lower(name) AS n FROM customers", down["pg"])
    _no_detail(server.get(q(name), key=down["masked"]))
    # The same for a scoped key without rules (contract 0.3: /q shows `detail` to administrators only) ...
    _no_detail(server.get(q(name), key=down["plain"]))
    # ... and for the administrator running a saved query that has a mask of its own.
    masked_query = uniq("maskfnv")
    server.query(masked_query, "SELECT lower(name) AS n FROM customers", down["pg"], mask=RULES)
    _no_detail(server.get(q(masked_query)))


@pytest.mark.parametrize("which", ["my", "mypw"])
def test_masked_mysql_server_names_read(server, down, which):
    """The read of the server's sql_mode and name rules (masking, the table check) fails before anything runs."""
    sql = "SELECT name FROM customers"
    _no_detail(_execute(server, down[which], sql, key=down["masked"]))
    _no_detail(_execute(server, down[which], sql, mask=RULES))            # the administrator's own rules
    _has_detail(_execute(server, down[which], sql, key=down["plain"]))
    _has_detail(_execute(server, down[which], sql))


@pytest.mark.parametrize("route", ["schema", "table_ddl"])
def test_masked_schema_and_table_ddl_routes(server, down, route):
    path = {"schema": f"/connections/{down['pg']}/schema",
            "table_ddl": f"/connections/{down['my']}/table_ddl?table=customers"}[route]
    _no_detail(server.get(path, key=down["masked"]))
    _has_detail(server.get(path, key=down["plain"]))
