"""Column masking over HTTP against real SQLite, MariaDB and PostgreSQL (contract 6.3, B6.12-B6.14, B6.16, 8.1)."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import hmac
import io
import json
import os
import re
import sqlite3
import time

import psycopg2
import pytest

from tests.server import Server, q
from tests.services import mysql_admin

HEX16 = re.compile(r"^[0-9a-f]{16}$")
PEOPLE = [(1, "jane@example.com", "+44 7700 900123", "s3cret", "Jane"), (2, "bo@x.org", "555-0100", "hidden", "Bo")]
RULES = [{"column": "customers.email", "action": "hash"}, {"column": "*.phone", "action": "mask"},
         {"column": "customers.secret", "action": "drop"}]
B612_SQL = "SELECT id, email AS contact, phone, secret, name FROM customers ORDER BY id"
# A caller's own hash rules (/execute_sql's `mask`) are keyed with HMAC-SHA256(mask key, this label), not the mask key.
OWN_LABEL = b"qag mask key: the hash of a caller's own /execute_sql rules"


def hashed(key: bytes, text: str) -> str:
    """`hash` by an administrator's rule (a key's, a role's, a saved query's): keyed with the mask key."""
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:16]


def own_hashed(key: bytes, text: str) -> str:
    """`hash` by a caller's own rule: keyed with the key derived from the mask key."""
    return hashed(hmac.new(key, OWN_LABEL, hashlib.sha256).digest(), text)

SQLITE_SEED = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT, phone TEXT, secret TEXT, name TEXT);
INSERT INTO customers VALUES (1, 'jane@example.com', '+44 7700 900123', 's3cret', 'Jane'),
                             (2, 'bo@x.org', '555-0100', 'hidden', 'Bo');
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, total INTEGER);
INSERT INTO orders VALUES (10, 1, 5), (11, 2, 7);
CREATE VIEW customer_emails AS SELECT id, email FROM customers;
"""


def _seed_mysql(fields):
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"USE `{fields['database']}`")
    cur.execute("CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(100), phone VARCHAR(40), "
                "secret VARCHAR(40), name VARCHAR(40))")
    cur.executemany("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", PEOPLE)
    cur.execute("CREATE TABLE orders (id INT PRIMARY KEY, customer_id INT, total INT)")
    cur.execute("INSERT INTO orders VALUES (10, 1, 5), (11, 2, 7)")
    cur.execute("CREATE VIEW customer_emails AS SELECT id, email FROM customers")
    admin.commit()
    admin.close()


def _pg_owner(fields):
    """An autocommit connection to the test database as its owner (to create and drop what a test reads)."""
    conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                            password=fields["password"], dbname=fields["database"], connect_timeout=5)
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def _pg_scratch_table(fields, table: str, columns: str, values: str):
    """A table of the shared PostgreSQL test database for one test, with one row; dropped after it, so the session's
    other PostgreSQL tests find the database as it was."""
    conn = _pg_owner(fields)
    cur = conn.cursor()
    try:
        cur.execute(f"CREATE TABLE {table} ({columns})")
        cur.execute(f"INSERT INTO {table} VALUES ({values})")
        yield
    finally:
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


def _pg_masking_server(make_server, fields, mask_key: str, connection: str):
    """A server with this mask key and a PostgreSQL connection of this name to the test database."""
    s = make_server(env={"QAG_MASK_KEY": mask_key})
    assert s.post("/api/v1/connections", {"name": connection, "db": "postgres", **fields}).status == 201
    return s


def _seed_pg(fields):
    conn = _pg_owner(fields)
    cur = conn.cursor()
    cur.execute("CREATE TABLE customers (id int PRIMARY KEY, email text, phone text, secret text, name text)")
    cur.executemany("INSERT INTO customers VALUES (%s, %s, %s, %s, %s)", PEOPLE)
    cur.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, total int)")
    cur.execute("INSERT INTO orders VALUES (10, 1, 5), (11, 2, 7)")
    cur.execute("CREATE VIEW customer_emails AS SELECT id, email FROM customers")
    conn.close()


@pytest.fixture(scope="module")
def srv(mysql_db, pg_db):
    """One server with the same customers data on a SQLite, a MariaDB and a PostgreSQL connection."""
    _seed_mysql(mysql_db)
    _seed_pg(pg_db)
    s = Server()
    s.sqlite_db("mask.db", SQLITE_SEED)
    s.connection("sqlite", "mask.db")
    for name, fields in (("mysql", mysql_db), ("postgres", pg_db)):
        reply = s.post("/api/v1/connections", {"name": name, "db": name, **fields})
        assert reply.status == 201, reply
    s.masked = s.key("masked", connections="*", mask=RULES)
    s.plain = s.key("plain", connections="*")
    yield s
    s.close()


DIALECTS = ["sqlite", "mysql", "postgres"]


def adhoc(s, conn, sql, key="masked", **extra):
    k = s.masked if key == "masked" else s.plain if key == "plain" else key
    return s.post("/execute_sql", {"sql": sql, "connection_name": conn, **extra}, key=k)


# --- B6.12 -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("conn", DIALECTS)
def test_b6_12_rules_from_the_key(srv, uniq, conn):
    name = uniq("b612")
    srv.query(name, B612_SQL, conn)
    masked = srv.get(q(name), key=srv.masked)
    assert masked.status == 200, masked
    rows = masked.json
    assert [list(r) for r in rows] == [["id", "contact", "phone", "name"]] * 2
    assert all(HEX16.match(r["contact"]) for r in rows)
    assert rows[0]["contact"] != rows[1]["contact"]
    assert rows[0]["phone"] == "+**************" and rows[1]["phone"] == "5*******"
    assert [r["name"] for r in rows] == ["Jane", "Bo"]
    for key in ("admin", srv.plain):
        raw = srv.get(q(name), key=key)
        assert raw.status == 200
        assert raw.json[0] == {"id": 1, "contact": "jane@example.com", "phone": "+44 7700 900123",
                               "secret": "s3cret", "name": "Jane"}
    # Equal inputs give equal outputs, across dialects and routes.
    again = adhoc(srv, conn, "SELECT email FROM customers WHERE id = 1")
    assert again.json == [{"email": rows[0]["contact"]}]


@pytest.mark.parametrize("conn", DIALECTS)
def test_a_standard_window_the_engine_lacks_is_masked_like_any_statement(srv, conn):
    """Contract 3.6's windows run on every engine (SQLite has no LIMIT ALL nor FETCH): a masked caller's too, its
    columns traced without the window (it named a column `all` to sqlglot's SQLite reading: 403)."""
    plain = adhoc(srv, conn, "SELECT id, email FROM customers ORDER BY id")
    for window in ("LIMIT ALL", "OFFSET 1 ROWS FETCH FIRST 1 ROWS ONLY", "OFFSET 1"):
        r = adhoc(srv, conn, f"SELECT id, email FROM customers ORDER BY id {window}")
        assert r.status == 200, (window, r)
        expected = plain.json if window == "LIMIT ALL" else plain.json[1:]
        assert r.json == expected and HEX16.match(r.json[0]["email"]), (window, r)


def test_hash_is_the_same_on_every_dialect(srv):
    values = {conn: adhoc(srv, conn, "SELECT email FROM customers WHERE id = 1").json[0]["email"] for conn in DIALECTS}
    assert len(set(values.values())) == 1 and HEX16.match(values["sqlite"])


# --- B6.13 -------------------------------------------------------------------------------------------------------
ESCAPES = {
    "alias": "SELECT email AS e FROM customers WHERE id = 1",
    "lower": "SELECT lower(email) AS e FROM customers WHERE id = 1",
    "cte": "WITH x AS (SELECT id, email AS addr FROM customers) SELECT addr AS e FROM x WHERE id = 1",
    "union": "SELECT name AS e FROM customers WHERE 1 = 0 UNION ALL SELECT email FROM customers WHERE id = 1",
    "subquery": "SELECT s.e FROM (SELECT email AS e, id FROM customers) s WHERE s.id = 1",
    "scalar": "SELECT (SELECT email FROM customers WHERE id = 1) AS e",
    "join": "SELECT c.email AS e FROM orders o JOIN customers c ON c.id = o.customer_id WHERE o.id = 10",
    "concat": "SELECT COALESCE(email, name) AS e FROM customers WHERE id = 1",
}


@pytest.mark.parametrize("conn", DIALECTS)
@pytest.mark.parametrize("how", sorted(ESCAPES))
def test_b6_13_renaming_cannot_escape(srv, conn, how):
    r = adhoc(srv, conn, ESCAPES[how])
    assert r.status == 200, r
    value = r.json[0]["e"]
    assert HEX16.match(value), (how, value)
    raw = adhoc(srv, conn, ESCAPES[how], key="plain").json[0]["e"]
    assert raw in ("jane@example.com",) and value != raw


@pytest.mark.parametrize("conn", DIALECTS)
def test_star_is_expanded_from_the_schema(srv, conn):
    r = adhoc(srv, conn, "SELECT * FROM customers ORDER BY id")
    assert r.status == 200, r
    assert list(r.json[0]) == ["id", "email", "phone", "name"]
    assert HEX16.match(r.json[0]["email"]) and r.json[0]["phone"] == "+**************"
    r = adhoc(srv, conn, "SELECT c.*, o.total FROM customers c JOIN orders o ON o.customer_id = c.id ORDER BY c.id")
    assert r.status == 200, r
    assert list(r.json[0]) == ["id", "email", "phone", "name", "total"]


# --- B6.14 and the other fail-closed cases ----------------------------------------------------------------------
@pytest.mark.parametrize("conn,sql", [("mysql", "SELECT version() AS v"), ("postgres", "SELECT version() AS v"),
                                      ("sqlite", "SELECT sqlite_version() AS v")])
def test_b6_14_untraceable_column(srv, conn, sql):
    r = adhoc(srv, conn, sql)
    assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
    assert adhoc(srv, conn, sql, key="plain").status == 200


REFUSED = {
    "whole_row": ("postgres", "SELECT c FROM customers c"),
    "whole_row_fn": ("postgres", "SELECT row_to_json(c) AS j FROM customers c"),
    "table_function": ("postgres", "SELECT * FROM generate_series(1, 3) g"),
    "unknown_star": ("sqlite", "SELECT * FROM sqlite_master"),
    "alias_columns": ("postgres", "SELECT a, b FROM customers AS c(a, b)"),
    "using": ("sqlite", "SELECT * FROM customers JOIN orders USING (id)"),
    "natural": ("mysql", "SELECT * FROM customers NATURAL JOIN orders"),
    "star_subquery_join": ("sqlite", "SELECT * FROM (SELECT 1 AS one) s, customers"),
    "star_values_join": ("postgres", "SELECT * FROM (VALUES (1)) v(x), customers"),
    "star_lateral": ("postgres", "SELECT * FROM customers c, LATERAL (SELECT c.email AS e) l"),
    "view_named_like_rule": ("sqlite", "SELECT email FROM customer_emails"),
    "view_mysql": ("mysql", "SELECT id, email FROM customer_emails"),
    "unparseable": ("sqlite", "SELECT FROM WHERE"),
    "current_user": ("postgres", "SELECT current_user AS u"),
}


@pytest.mark.parametrize("conn", DIALECTS)
def test_a_column_named_with_its_schema_is_refused_clearly(srv, mysql_db, conn):
    """Found by an attacker review: `SELECT main.customers.email FROM customers` was a 500 for a masked caller (the
    derived table that reads the table masked is named by the table alone, so the engine refused the name). It is
    a valid statement: the plain key's answer shows it; the masked caller's is a clear 403."""
    schema = {"sqlite": "main", "mysql": mysql_db["database"], "postgres": "public"}[conn]
    for sql in (f"SELECT {schema}.customers.email FROM customers",
                f"SELECT id FROM customers WHERE {schema}.customers.email LIKE 'j%'"):
        assert adhoc(srv, conn, sql, key="plain").status == 200, sql
        r = adhoc(srv, conn, sql)
        assert r.status == 403 and r.json["code"] == "mask_unresolvable" and "schema" in r.json["error"], r
    r = adhoc(srv, conn, "SELECT customers.id, c.name FROM customers JOIN customers c ON c.id = customers.id")
    assert r.status == 200, r                                  # two-part names are the derived table's own


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_fail_closed(srv, case):
    conn, sql = REFUSED[case]
    r = adhoc(srv, conn, sql)
    assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
    assert "detail" not in r.json


@pytest.fixture(scope="module")
def other_mysql_database(mysql_db):
    """A second database on the MariaDB server, readable by the mysql connection's user (one gateway in front of a
    server's several service databases); one the user may not read; and two readable ones whose names differ only
    in case (the server compares names exactly), the capitalised one holding the `mobile` column."""
    from tests.services import _name
    admin = mysql_admin()
    cur = admin.cursor()
    other, closed = _name("qag_o"), _name("qag_c")
    upper = _name("Qag_U")
    lower = upper.lower()
    for name in (other, closed, upper):
        cur.execute(f"CREATE DATABASE `{name}`")
        cur.execute(f"CREATE TABLE `{name}`.contacts (id INT PRIMARY KEY, mobile VARCHAR(40), note VARCHAR(40))")
        cur.execute(f"INSERT INTO `{name}`.contacts VALUES (1, '07700 900123', 'call after six'), (2, '555-0199', 'ok')")
    cur.execute(f"CREATE DATABASE `{lower}`")
    cur.execute(f"CREATE TABLE `{lower}`.contacts (id INT PRIMARY KEY, note VARCHAR(40))")
    cur.execute(f"INSERT INTO `{lower}`.contacts VALUES (1, 'lower')")
    for name in (other, upper, lower):
        cur.execute(f"GRANT SELECT ON `{name}`.* TO '{mysql_db['user']}'@'%'")
    yield other, closed, upper
    for name in (other, closed, upper, lower):
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    admin.close()


def test_mysql_tables_of_another_database_trace_like_the_connections_own(srv, other_mysql_database):
    """A statement naming another database's table (`other.contacts` from a connection to its own database) is
    traced with that database's columns: unqualified columns resolve, rules on them apply. Before, they could not
    be traced and every such call of a masked key was refused."""
    other, closed, _upper = other_mysql_database
    rules = [{"column": "contacts.mobile", "action": "mask"}, {"column": "contacts.note", "action": "drop"},
             {"column": "customers.email", "action": "hash"}]
    r = adhoc(srv, "mysql", f"SELECT id, mobile, note FROM {other}.contacts ORDER BY id", mask=rules)
    assert r.status == 200, r
    assert r.json == [{"id": 1, "mobile": "0***********"}, {"id": 2, "mobile": "5*******"}]
    # Across the two databases, unqualified: each column traced to its own table.
    r = adhoc(srv, "mysql", f"SELECT name, email, mobile AS m FROM customers JOIN {other}.contacts k "
                            f"ON k.id = customers.id ORDER BY customers.id", mask=rules)
    assert r.status == 200, r
    assert [row["name"] for row in r.json] == ["Jane", "Bo"]
    assert all(HEX16.match(row["email"]) for row in r.json) and r.json[0]["m"] == "0***********"
    # The same statements through a key without rules are untouched.
    assert adhoc(srv, "mysql", f"SELECT mobile FROM {other}.contacts WHERE id = 1", key="plain").json == \
        [{"mobile": "07700 900123"}]
    # A database the connection's user can't read shows no columns: still refused, before anything runs, its
    # columns qualified or not (a qualified one would otherwise escape its rule: no table to mask at the source).
    for sql in (f"SELECT mobile FROM {closed}.contacts", f"SELECT c.mobile FROM {closed}.contacts c",
                f"SELECT c.id FROM {closed}.contacts c WHERE c.mobile LIKE '07700%'",
                f"SELECT c.mobile, customers.name FROM {closed}.contacts c JOIN customers ON customers.id = c.id"):
        r = adhoc(srv, "mysql", sql, mask=rules)
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", (sql, r)
    # The engine's catalogs stay refused to a masked caller, however the statement names them.
    for sql in ("SELECT table_name FROM information_schema.tables", "SELECT user FROM mysql.user",
                f"SELECT c.id, t.table_name FROM {other}.contacts c JOIN information_schema.tables t"):
        r = adhoc(srv, "mysql", sql, mask=rules)
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", (sql, r)


def test_mysql_databases_differing_only_in_case_are_never_traced_with_each_others_columns(srv, other_mysql_database):
    """`Qag_U….contacts` (id, mobile, note) beside `qag_u….contacts` (id, note): the trace reads names case-blind,
    so it must not expand the capitalised one's `*` from the other's columns (mobile would come back raw)."""
    _other, _closed, upper = other_mysql_database
    rules = [{"column": "contacts.mobile", "action": "mask"}]
    alone = adhoc(srv, "mysql", f"SELECT * FROM {upper}.contacts ORDER BY id", mask=rules)
    assert alone.status == 200 and alone.json[0] == {"id": 1, "mobile": "0***********", "note": "call after six"}, alone
    both = f"SELECT * FROM {upper}.contacts u JOIN {upper.lower()}.contacts l ON l.id = u.id"
    r = adhoc(srv, "mysql", both, mask=rules)
    assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
    assert adhoc(srv, "mysql", both, key="plain").status == 200


def test_mysql_a_table_named_in_another_case_than_the_servers_is_refused_before_it_runs(srv, mysql_db):
    """On a server that compares names exactly (lower_case_table_names=0, Linux's default), `Customers` is no table
    of a database holding `customers`: the masked caller's statement is refused as one naming a table the schema
    doesn't list (403), before it runs, as docs/masking.md says; it reached the server and came back 500
    query_failed. The plain key still gets the server's own refusal."""
    database = mysql_db["database"]
    for sql in ("SELECT name FROM Customers", "SELECT c.name FROM CUSTOMERS c",
                f"SELECT name FROM `{database}`.Customers", f"SELECT name FROM `{database.upper()}`.customers",
                "SELECT name FROM customers WHERE id IN (SELECT customer_id FROM Orders)"):
        r = adhoc(srv, "mysql", sql)
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", (sql, r)
        assert "detail" not in r.json
        plain = adhoc(srv, "mysql", sql, key="plain")
        assert plain.status == 500 and plain.json["code"] == "query_failed", (sql, plain)
    # Named as the server lists them, the same statements run, masked.
    r = adhoc(srv, "mysql", f"SELECT email FROM `{database}`.customers c WHERE id IN (SELECT customer_id FROM orders) "
                            f"ORDER BY id")
    assert r.status == 200 and r.json and all(HEX16.match(row["email"]) for row in r.json), r


def test_mysql_dual_and_ctes_need_no_table(srv):
    rules = [{"column": "customers.email", "action": "hash"}]
    assert adhoc(srv, "mysql", "SELECT 1 AS one FROM DUAL", mask=rules).json == [{"one": 1}]
    r = adhoc(srv, "mysql", "WITH x AS (SELECT 2 AS two) SELECT two FROM x", mask=rules)
    assert r.status == 200 and r.json == [{"two": 2}], r


def test_postgres_text_arrays_are_masked_whole(srv, pg_db, uniq):
    """A text array is masked NULL, as the value rule masks a list: the e-mail rule applied to its text would keep
    everything after the first '@', the other addresses included."""
    table = uniq("arrays")
    conn = _pg_owner(pg_db)
    cur = conn.cursor()
    try:
        cur.execute(f"CREATE TABLE {table} (id int, mails varchar(40)[], codes char(16)[])")
        cur.execute(f"INSERT INTO {table} VALUES (1, ARRAY['alice@corp.com', 'bob.secret@corp.com'], "
                    f"ARRAY['alice@corp.com', 'bob@corp.com'])")
        name = uniq("pga")     # a connection of its own: the shared one's schema was read before the table existed
        assert srv.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db}).status == 201
        r = adhoc(srv, name, f"SELECT id, mails, codes FROM {table}",
                  mask=[{"column": f"{table}.mails", "action": "mask"}, {"column": f"{table}.codes", "action": "mask"}])
        assert r.status == 200 and r.json == [{"id": 1, "mails": None, "codes": None}], r
    finally:   # the database is shared by the session's PostgreSQL tests: leave it as it was
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        conn.close()


def test_view_column_named_by_a_rule_is_served(srv, uniq):
    rule = [{"column": "customer_emails.email", "action": "hash"}]
    r = adhoc(srv, "sqlite", "SELECT email FROM customer_emails WHERE id = 1", mask=rule)
    assert r.status == 200 and HEX16.match(r.json[0]["email"]), r
    # An administrator's *.email keep names the view column: its one matching rule (customers.email is another
    # table, still hashed).
    kept = srv.key(uniq("kept"), connections="*", mask=[*RULES, {"column": "*.email", "action": "keep"}])
    for conn in ("postgres", "sqlite"):
        r = adhoc(srv, conn, "SELECT email FROM customer_emails WHERE id = 1", key=kept)
        assert r.status == 200 and r.json == [{"email": "jane@example.com"}], r
        r = adhoc(srv, conn, "SELECT email FROM customers WHERE id = 1", key=kept)
        assert r.status == 200 and HEX16.match(r.json[0]["email"]), r


@pytest.mark.parametrize("conn", DIALECTS)
def test_a_callers_own_keep_rule_names_no_view_column(srv, conn):
    """The caller's own rules only add masking: its keep would open every view over a masked column at once."""
    for rules in ([{"column": "*.*", "action": "keep"}], [{"column": "customer_emails.email", "action": "keep"}]):
        r = adhoc(srv, conn, "SELECT * FROM customer_emails WHERE id = 1", mask=rules)
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
        assert "jane" not in r.body.decode()
    # the same call without the view: the key's own rules, as if no ad-hoc rule were given
    r = adhoc(srv, conn, "SELECT email FROM customers WHERE id = 1", mask=[{"column": "*.*", "action": "keep"}])
    assert r.status == 200 and HEX16.match(r.json[0]["email"]), r


def test_lateral_and_values_trace(srv):
    r = adhoc(srv, "postgres", "SELECT l.e FROM customers c, LATERAL (SELECT c.email AS e) l WHERE c.id = 1")
    assert r.status == 200 and HEX16.match(r.json[0]["e"]), r
    r = adhoc(srv, "postgres", "SELECT * FROM (VALUES (1, 'a')) AS v(x, y)")
    assert r.status == 200 and r.json == [{"x": 1, "y": "a"}], r
    r = adhoc(srv, "sqlite", "SELECT 1 AS one, 'x' AS s, count(*) AS n FROM customers")
    assert r.status == 200 and r.json == [{"one": 1, "s": "x", "n": 2}], r


def test_recursive_cte_moves_values_between_columns(srv):
    sql = ("WITH RECURSIVE r(a, b, n) AS (SELECT email, 'x', 1 FROM customers WHERE id = 1 "
           "UNION ALL SELECT b, a, n + 1 FROM r WHERE n < 2) SELECT b FROM r WHERE n = 2")
    r = adhoc(srv, "sqlite", sql)
    assert r.status == 200 and HEX16.match(r.json[0]["b"]), r
    assert adhoc(srv, "sqlite", sql, key="plain").json == [{"b": "jane@example.com"}]


@pytest.mark.parametrize("sql", [
    # WITH RECURSIVE: `guess` sees the later CTE `customers`, so the derived table masking put around `customers`
    # in it read the caller's candidates, hashed with the mask key; joined to the real table, a candidate's
    # plain text sat next to the customer whose hash it matched.
    "WITH RECURSIVE guess AS (SELECT id AS candidate, email FROM customers), customers AS ("
    "SELECT g AS id, 'bo@x.org' AS email, NULL::text AS phone, NULL::text AS secret, NULL::text AS name "
    "FROM generate_series(1, 3) g) "
    "SELECT r.id AS customer, guess.candidate FROM guess JOIN public.customers r ON r.email = guess.email",
    # the single-candidate form: the key's hash of a value of the caller's choosing
    "WITH RECURSIVE a AS (SELECT email FROM customers), customers AS (SELECT 1 AS id, 'bo@x.org'::text AS email, "
    "NULL::text AS phone, NULL::text AS secret, NULL::text AS name) SELECT email FROM a",
    # a CTE named like the masked table anywhere in the statement, as on MySQL and SQLite
    "WITH customers AS (SELECT 1 AS id) SELECT email FROM public.customers",
])
def test_postgres_a_cte_named_like_a_masked_table_never_feeds_its_masking(srv, sql):
    r = adhoc(srv, "postgres", sql)
    assert r.status == 403 and r.json["code"] == "mask_unresolvable", r


def test_postgres_recursive_ctes_see_later_ones_as_the_server_does():
    from qag.sql import pgread
    # every CTE of a WITH RECURSIVE is in scope in every body: `a` reads the CTE c, not a table
    assert pgread.read("WITH RECURSIVE a AS (SELECT * FROM c), c AS (SELECT 1) SELECT * FROM a").tables == ()
    # without RECURSIVE a body sees only the CTEs before it
    assert pgread.read("WITH a AS (SELECT * FROM c), c AS (SELECT 1) SELECT * FROM a").tables == (("", "", "c"),)


def test_show_tables_and_describe_are_not_masked_explain_is_refused(srv):
    assert adhoc(srv, "mysql", "SHOW TABLES").status == 200
    assert adhoc(srv, "mysql", "DESCRIBE customers").status == 200
    # EXPLAIN's estimates come from the statistics of the raw values (issue 18: no side channels).
    r = adhoc(srv, "postgres", "EXPLAIN SELECT email FROM customers")
    assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
    assert adhoc(srv, "postgres", "EXPLAIN SELECT email FROM customers", key="plain").status == 200


def test_column_count_differs_from_the_trace(make_server, uniq):
    s = make_server(workers=1)
    s.sqlite_db("wide.db", "CREATE TABLE customers (id INTEGER, email TEXT); INSERT INTO customers VALUES (1, 'a@b.c');"
                           "CREATE TABLE items (id INTEGER, label TEXT); INSERT INTO items VALUES (1, 'x');")
    s.connection("wide", "wide.db")
    key = s.key("k", connections="*", mask=[{"column": "customers.email", "action": "hash"}])
    for table, header in (("customers", ["id", "email"]), ("items", ["id", "label"])):
        first = s.post("/execute_sql", {"sql": f"SELECT * FROM {table}", "connection_name": "wide"}, key=key)
        assert first.status == 200 and list(first.json[0]) == header
    conn = sqlite3.connect(os.path.join(s.home, "wide.db"))
    conn.execute("ALTER TABLE customers ADD COLUMN phone TEXT")
    conn.execute("ALTER TABLE items ADD COLUMN extra TEXT")
    conn.commit()
    conn.close()
    # The schema is cached (60 s): the trace still says two columns, the database now returns three.
    second = s.post("/execute_sql", {"sql": "SELECT * FROM items", "connection_name": "wide"}, key=key)
    assert second.status == 403 and second.json["code"] == "mask_unresolvable", second
    # A table with a masked column is read through the columns the schema lists: the new one isn't seen at all.
    second = s.post("/execute_sql", {"sql": "SELECT * FROM customers", "connection_name": "wide"}, key=key)
    assert second.status == 200 and list(second.json[0]) == ["id", "email"] and second.json[0]["email"] != "a@b.c"


# --- formats, streams, errors, history --------------------------------------------------------------------------
@pytest.mark.parametrize("conn", DIALECTS)
def test_every_format_and_stream(srv, uniq, conn):
    name = uniq("fmt")
    srv.query(name, B612_SQL, conn)
    expected = srv.get(q(name), key=srv.masked).json
    header = ["id", "contact", "phone", "name"]
    for fmt in ("ndjson", "csv", "tsv"):
        for stream in (False, True):
            params = {"format": fmt, **({"stream": "true"} if stream else {})}
            r = srv.get(q(name), key=srv.masked, params=params)
            assert r.status == 200, r
            text = r.body.decode()
            assert "s3cret" not in text and "jane@example.com" not in text and "secret" not in text
            if fmt == "ndjson":
                got = [json.loads(line) for line in text.splitlines() if line]
                assert got == expected
            else:
                table = list(csv.reader(io.StringIO(text), delimiter="," if fmt == "csv" else "\t"))
                assert table[0] == header
                assert [row[1] for row in table[1:]] == [e["contact"] for e in expected]
                assert [row[2] for row in table[1:]] == [e["phone"] for e in expected]


def test_masked_caller_never_sees_detail(srv):
    bad = "SELECT email FROM customers WHERE id = json('{bad')"
    plain = adhoc(srv, "sqlite", bad, key="plain")
    assert plain.status == 500 and "detail" in plain.json, plain
    masked = adhoc(srv, "sqlite", bad)
    assert masked.status == 500 and "detail" not in masked.json, masked
    admin = adhoc(srv, "sqlite", bad, key="admin", mask=[{"column": "customers.phone", "action": "null"}])
    assert admin.status == 500 and "detail" not in admin.json, admin


def test_invalid_adhoc_mask_is_400(srv):
    r = adhoc(srv, "sqlite", "SELECT 1", key="admin", mask=[{"column": "email", "action": "hash"}])
    assert r.status == 400 and r.json["code"] == "invalid_body", r


def test_history_records_what_was_masked(srv, uniq):
    name = uniq("hist")
    srv.query(name, B612_SQL, "sqlite")
    assert srv.get(q(name), key=srv.masked).status == 200
    assert srv.get(q(name), key=srv.plain).status == 200
    deadline = time.monotonic() + 15   # the other worker writes its run within its flush interval (1 s)
    while True:
        items = srv.get(f"/api/v1/queries/{name}/history").json["items"]
        by_key = {i["key_name"]: i for i in items}
        if len(by_key) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert by_key["masked"]["masked"] == [
        {"column": "contact", "action": "hash", "source": "customers.email"},
        {"column": "phone", "action": "mask", "source": "customers.phone"},
        {"column": "secret", "action": "drop", "source": "customers.secret"}]
    assert "masked" not in by_key["plain"]
    keys = list(by_key["masked"])
    assert keys.index("masked") == keys.index("serialization_ms") + 1


# --- B6.16 and the key ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("conn", DIALECTS)
def test_b6_16_query_mask_applies_to_the_admin(srv, uniq, conn):
    name = uniq("b616")
    srv.query(name, "SELECT id, email FROM customers ORDER BY id", conn,
              mask=[{"column": "customers.email", "action": "hash"}])
    r = srv.get(q(name))
    assert r.status == 200 and all(HEX16.match(row["email"]) for row in r.json), r
    # Unioned with the key's rules: the strictest wins per column.
    strict = srv.key(uniq("strict"), connections="*", mask=[{"column": "*.email", "action": "null"}])
    assert srv.get(q(name), key=strict).json[0] == {"id": 1, "email": None}


def test_hash_key_is_kept_in_the_store_and_shared(make_server):
    one = make_server()
    one.sqlite_db("k.db", SQLITE_SEED)
    one.connection("k", "k.db")
    body = {"sql": "SELECT email FROM customers WHERE id = 1", "connection_name": "k",
            "mask": [{"column": "customers.email", "action": "hash"}]}
    first = one.post("/execute_sql", body).json[0]["email"]
    key = one.key("hashed", connections="*", mask=[{"column": "customers.email", "action": "hash"}])
    keyed = one.post("/execute_sql", {"sql": body["sql"], "connection_name": "k"}, key=key).json[0]["email"]
    two = make_server(seed=False, env={"QAG_HOME": one.home})
    assert two.post("/execute_sql", body).json[0]["email"] == first
    assert two.post("/execute_sql", {"sql": body["sql"], "connection_name": "k"}, key=key).json[0]["email"] == keyed
    [(stored,)] = one.store_sql("SELECT value FROM meta WHERE key = 'mask_key'")
    assert re.fullmatch(r"[0-9a-f]{64}", stored)
    # The key's rule hashes with the stored key; the caller's own rule with the key derived from it.
    assert keyed == hashed(stored.encode(), "jane@example.com")
    assert first == own_hashed(stored.encode(), "jane@example.com") != keyed


def test_configured_mask_key(make_server):
    s = make_server(env={"QAG_MASK_KEY": "my masking key"})
    s.sqlite_db("k.db", SQLITE_SEED)
    s.connection("k", "k.db")
    r = s.post("/execute_sql", {"sql": "SELECT id, email FROM customers WHERE id = 1", "connection_name": "k",
                                "mask": [{"column": "customers.email", "action": "hash"}]})
    assert r.json == [{"id": 1, "email": own_hashed(b"my masking key", "jane@example.com")}]
    key = s.key("hashed", connections="*", mask=[{"column": "customers.email", "action": "hash"}])
    r = s.post("/execute_sql", {"sql": "SELECT id, email FROM customers WHERE id = 1", "connection_name": "k"}, key=key)
    assert r.json == [{"id": 1, "email": hashed(b"my masking key", "jane@example.com")}]


def test_postgres_masked_call_reads_the_schema_it_was_traced_in(srv, pg_db, uniq):
    """Masked calls pin search_path to the schema the columns were traced in: with the connection's schema
    `sales`, `people` is sales.people for the trace and for the database alike, so a rule on public.people.ssn
    neither matches nor is needed - and public.people's values never come back under the name."""
    schema, public = uniq("sales"), uniq("people")
    conn = _pg_owner(pg_db)
    cur = conn.cursor()
    try:
        cur.execute(f"CREATE SCHEMA {schema}")
        cur.execute(f"CREATE TABLE {schema}.{public} (ssn text)")
        cur.execute(f"INSERT INTO {schema}.{public} VALUES ('sales-row')")
        cur.execute(f"CREATE TABLE public.{public} (ssn text)")
        cur.execute(f"INSERT INTO public.{public} VALUES ('public-secret')")
        name = uniq("pgs")
        assert srv.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db, "schema": schema}).status == 201
        key = srv.key(uniq("k"), connections="*", mask=[{"column": f"public.{public}.ssn", "action": "null"}])
        r = srv.post("/execute_sql", {"sql": f"SELECT ssn FROM {public}", "connection_name": name}, key=key)
        assert r.status == 200 and r.json == [{"ssn": "sales-row"}], r
    finally:   # the database is shared by the session's PostgreSQL tests: leave it as it was
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        cur.execute(f"DROP TABLE IF EXISTS public.{public}")
        conn.close()


def test_postgres_blank_padded_text_is_masked_and_hashed_as_the_driver_reads_it(make_server, pg_db, uniq):
    """A character(n) value comes to a client blank-padded ('ab    '): mask and hash see that text, as the contract's
    str() of the driver's value does. (Its cast to text drops the padding: it gave 'a***', NULL for an all-blank
    value, and the hash of 'ab', where the contract's rules give 'a*****', ' ***' and the hash of 'ab    ', and
    QueryAPIGate masks pgbench's all-blank `filler` as ' ' and 83 stars.)"""
    table = uniq("padded")
    with _pg_scratch_table(pg_db, table, "id int, code char(6), blank char(4), name varchar(10)", "1, 'ab', '', 'Bo'"):
        s = _pg_masking_server(make_server, pg_db, "padding key", "pgpad")
        sql = f"SELECT code, blank, name FROM {table}"
        masked = s.post("/execute_sql", {"sql": sql, "connection_name": "pgpad",
                                         "mask": [{"column": f"{table}.*", "action": "mask"}]})
        assert masked.status == 200 and masked.json == [{"code": "a*****", "blank": " ***", "name": "B***"}], masked
        hashed = s.post("/execute_sql", {"sql": sql, "connection_name": "pgpad",
                                         "mask": [{"column": f"{table}.*", "action": "hash"}]})
        expected = {column: own_hashed(b"padding key", text)      # the caller's own rule: the derived key
                    for column, text in (("code", "ab    "), ("blank", "    "), ("name", "Bo"))}
        assert hashed.status == 200 and hashed.json == [expected], hashed
        raw = s.post("/execute_sql", {"sql": sql, "connection_name": "pgpad"})
        assert raw.json == [{"code": "ab    ", "blank": "    ", "name": "Bo"}]


def test_postgres_a_positional_parameter_never_reads_the_hash_pads(make_server, pg_db, uniq):
    """masking binds the hash key's two pads as values of its own ($1 and $2 when the caller has none): a caller's
    `$1` read them, and from them the key (an attacker's review found `id::text || $1::text` passed the trace).
    Refused before anything runs, for every caller; the hashed value itself still comes back."""
    table = uniq("padsafe")
    with _pg_scratch_table(pg_db, table, "id int, ssn text", "1, '123-45-6789'"):
        s = _pg_masking_server(make_server, pg_db, "pad key", "pgpads")
        mask = [{"column": f"{table}.ssn", "action": "hash"}]
        pads = (hmac.new(b"pad key", b"", hashlib.sha256).digest(),)      # anything of the key: never in a reply
        for sql in (f"SELECT id::text || $1::text AS a, id::text || $2::text AS b, ssn FROM {table}",
                    f"SELECT ssn FROM {table} WHERE left($1::text, 1) = 'a'"):
            r = s.post("/execute_sql", {"sql": sql, "connection_name": "pgpads", "mask": mask})
            assert r.status == 400 and r.json["code"] == "invalid_request" and "$1" in r.json["error"], r
            assert b"5c5c5c5c" not in r.body and b"36363636" not in r.body and pads[0].hex().encode() not in r.body
        ok = s.post("/execute_sql", {"sql": f"SELECT ssn FROM {table}", "connection_name": "pgpads", "mask": mask})
        expected = own_hashed(b"pad key", "123-45-6789")
        assert ok.status == 200 and ok.json == [{"ssn": expected}], ok


def test_mysql_masked_calls_are_refused_where_the_server_reads_quotes_or_backslashes_otherwise(srv, mysql_db, uniq):
    """Under ANSI_QUOTES or NO_BACKSLASH_ESCAPES the server can read a subquery where the trace (sqlglot's default
    MySQL reading) reads a string: `SELECT CONCAT('\\', (SELECT phone FROM customers LIMIT 1), '#'<newline>)` is a
    constant to the trace. A masked caller is refused there; a caller without rules is served as before. The
    server's global mode is set for a connection of a user of its own (its facts are read when it first opens)
    and restored."""
    from tests.services import _name
    admin = mysql_admin()
    cur = admin.cursor()
    user, password = _name("qag_m"), "pw-" + uniq("m")
    cur.execute("SELECT @@GLOBAL.sql_mode")
    (before,) = cur.fetchone()
    try:
        cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
        cur.execute(f"GRANT SELECT ON `{mysql_db['database']}`.* TO '{user}'@'%'")
        cur.execute("SET GLOBAL sql_mode = CONCAT(@@GLOBAL.sql_mode, ',ANSI_QUOTES')")
        name = uniq("ansi")
        fields = dict(mysql_db, user=user, password=password)
        assert srv.post("/api/v1/connections", {"name": name, "db": "mysql", **fields}).status == 201
        r = adhoc(srv, name, "SELECT name FROM customers WHERE id = 1")
        assert r.status == 403 and r.json["code"] == "mask_unresolvable" and "sql_mode" in r.json["error"], r
        assert adhoc(srv, name, "SELECT name FROM customers WHERE id = 1", key="plain").json == [{"name": "Jane"}]
    finally:
        cur.execute("SET GLOBAL sql_mode = %s", (before,))
        cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
        admin.close()


def test_mysql_an_unlisted_table_behind_a_decoy_cte_is_refused(srv, mysql_db, uniq):
    """`t` and `T` (a server that compares names exactly) are both left out of the trace's schema; a CTE named `t`
    elsewhere in the statement must not let the real `t` be read raw from a set operation's ORDER BY, where sqlglot
    builds no scope (the engine answered one yes/no about a masked value per call)."""
    name = uniq("secret")
    admin = mysql_admin()
    cur = admin.cursor()
    try:
        for table in (name, name.upper()):
            cur.execute(f"CREATE TABLE `{mysql_db['database']}`.`{table}` (id INT PRIMARY KEY, phone VARCHAR(20))")
            cur.execute(f"INSERT INTO `{mysql_db['database']}`.`{table}` VALUES (1, '5551234')")
        conn = uniq("decoy")     # a connection of its own: its schema is read with both tables in it
        assert srv.post("/api/v1/connections", {"name": conn, "db": "mysql", **mysql_db}).status == 201
        sql = (f"SELECT id FROM orders UNION SELECT d.one FROM (WITH {name} AS (SELECT 1 AS one) SELECT one FROM "
               f"{name}) d ORDER BY (SELECT s.phone FROM {name} s WHERE s.id = 1)")
        r = adhoc(srv, conn, sql, mask=[{"column": "*.phone", "action": "mask"}])
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
        assert adhoc(srv, conn, sql, key="plain").status == 200
    finally:
        for table in (name, name.upper()):
            cur.execute(f"DROP TABLE IF EXISTS `{mysql_db['database']}`.`{table}`")
        admin.close()


# --- no hash oracle: values a caller chooses never come back hashed with the administrators' key ---------------
ORACLE_KEY = b"oracle key"
SSN = "123-45-6789"


@contextlib.contextmanager
def _oracle(make_server, conn: str, mysql_db, pg_db, uniq):
    """A writable server with the mask key ORACLE_KEY and a connection of its own to `conn`'s database, holding
    `people` (id, ssn) with a real SSN, `notes` (id, body, ssn) and `log` (id, body), empty, and `nv`, a view over
    notes that renames ssn. Yields (server, connection, {role: table name}); the tables are dropped after."""
    names = {role: uniq(f"o{role[0]}") for role in ("people", "notes", "log", "nv")}
    text = "VARCHAR(40)"
    create = [f"CREATE TABLE {names['people']} (id INT PRIMARY KEY, ssn {text})",
              f"INSERT INTO {names['people']} VALUES (1, '{SSN}'), (2, '987-65-4321')",
              f"CREATE TABLE {names['notes']} (id INT PRIMARY KEY, body {text}, ssn {text})",
              f"CREATE TABLE {names['log']} (id INT PRIMARY KEY, body {text})",
              f"CREATE VIEW {names['nv']} AS SELECT id, ssn AS s FROM {names['notes']}"]
    drop = [f"DROP VIEW IF EXISTS {names['nv']}",
            *(f"DROP TABLE IF EXISTS {names[role]}" for role in ("people", "notes", "log"))]
    s = make_server(env={"QAG_ALLOW_WRITES": "1", "QAG_MASK_KEY": ORACLE_KEY.decode()}, workers=1)
    if conn == "sqlite":
        s.sqlite_db("oracle.db", ";\n".join(create) + ";")
        s.connection("oracle", "oracle.db")
        yield s, "oracle", names
        return
    if conn == "mysql":
        admin = mysql_admin()
        cur = admin.cursor()
        cur.execute(f"USE `{mysql_db['database']}`")
        fields = mysql_db
    else:
        admin = _pg_owner(pg_db)
        cur = admin.cursor()
        fields = pg_db
    try:
        for statement in create:
            cur.execute(statement)
        reply = s.post("/api/v1/connections", {"name": "oracle", "db": conn, **fields})
        assert reply.status == 201, reply
        yield s, "oracle", names
    finally:   # the database is shared by the session's tests: leave it as it was
        for statement in drop:
            cur.execute(statement)
        admin.close()


@pytest.mark.parametrize("conn", DIALECTS)
def test_a_callers_own_hash_rule_is_no_oracle_for_the_administrators_hash(make_server, mysql_db, pg_db, uniq, conn):
    """The reviewer's attack 1: a writer whose key hashes people.ssn inserts candidate SSNs into notes.body (no
    masked column there: allowed) and joins the two with its own `hash` rule on notes.body. With one key for both,
    the join matched and the note's text was the person's real SSN. The caller's own rules now hash with a key
    derived from the mask key: the join matches nothing; the own hashes are still hashes, and the key's own rule
    still hashes with the mask key (where both hash a column, the administrators' key is the one used)."""
    with _oracle(make_server, conn, mysql_db, pg_db, uniq) as (s, name, t):
        key = s.key(uniq("w"), connections="*", allow_writes=True,
                    mask=[{"column": f"{t['people']}.ssn", "action": "hash"}])

        def run(sql, who=key, **extra):
            return s.post("/execute_sql", {"sql": sql, "connection_name": name, **extra}, key=who)

        candidates = ["000-00-0000", SSN, "555-55-5555"]
        values = ", ".join(f"({i}, '{c}')" for i, c in enumerate(candidates, 1))
        r = run(f"INSERT INTO {t['notes']} (id, body) VALUES {values}")
        assert r.status == 200, r
        own = [{"column": f"{t['notes']}.body", "action": "hash"}]
        join = f"SELECT n.id AS note, c.id AS person FROM {t['notes']} n JOIN {t['people']} c ON c.ssn = n.body"
        r = run(join, mask=own)
        assert r.status == 200 and r.headers["x-row-count"] == "0", r
        # Both sides are hashes, each of its own key:
        r = run(f"SELECT body FROM {t['notes']} WHERE id = 2", mask=own)
        assert r.status == 200 and r.json == [{"body": own_hashed(ORACLE_KEY, SSN)}], r
        r = run(f"SELECT ssn FROM {t['people']} WHERE id = 1")
        assert r.json == [{"ssn": hashed(ORACLE_KEY, SSN)}] and hashed(ORACLE_KEY, SSN) != own_hashed(ORACLE_KEY, SSN)
        # The caller's own hash of a column its key hashes too: the administrators' key, as before.
        r = run(f"SELECT ssn FROM {t['people']} WHERE id = 1",
                mask=[{"column": f"{t['people']}.ssn", "action": "hash"}])
        assert r.json == [{"ssn": hashed(ORACLE_KEY, SSN)}], r
        # A caller that reads ssn unmasked may hash both sides by its own rules: its own hashes join each other
        # (they hide nothing from it), and still aren't the administrators' hashes.
        plain = s.key(uniq("p"), connections="*")
        both = own + [{"column": f"{t['people']}.ssn", "action": "hash"}]
        r = run(join, who=plain, mask=both)
        assert r.status == 200 and r.json == [{"note": 2, "person": 1}], r


def _upserts(conn: str, t: dict) -> list[str]:
    notes = t["notes"]
    if conn == "sqlite":
        return [f"INSERT INTO {notes} (id, ssn) VALUES (1, '{SSN}') ON CONFLICT (id) DO UPDATE SET ssn = excluded.ssn",
                f"INSERT OR REPLACE INTO {notes} (id, ssn) VALUES (1, '{SSN}')",
                f"REPLACE INTO {notes} (id, ssn) VALUES (1, '{SSN}')"]
    if conn == "mysql":
        return [f"INSERT INTO {notes} (id, ssn) VALUES (1, '{SSN}') ON DUPLICATE KEY UPDATE ssn = '{SSN}'",
                f"INSERT INTO {notes} SET id = 1, ssn = '{SSN}'", f"REPLACE INTO {notes} (id, ssn) VALUES (1, '{SSN}')",
                f"UPDATE {notes} n JOIN {t['log']} l ON l.id = n.id SET n.ssn = l.body"]
    return [f"INSERT INTO {notes} AS n (id, ssn) VALUES (1, '{SSN}') ON CONFLICT (id) DO UPDATE SET ssn = EXCLUDED.ssn",
            f"MERGE INTO {notes} n USING {t['log']} l ON l.id = n.id WHEN MATCHED THEN UPDATE SET ssn = l.body "
            f"WHEN NOT MATCHED THEN INSERT (id, ssn) VALUES (l.id, l.body)",
            f"WITH w AS (INSERT INTO {notes} (id, ssn) VALUES (1, '{SSN}')) SELECT 1 AS one"]


@pytest.mark.parametrize("conn", DIALECTS)
def test_a_masked_callers_write_into_a_table_with_masked_columns_is_refused(make_server, mysql_db, pg_db, uniq, conn):
    """The reviewer's attack 2: a rule that hashes a column the caller can write (`*.ssn` covers notes.ssn as well
    as people.ssn): insert candidates, read them back hashed with the administrators' key, compare with
    people.ssn's hashes. A masked caller's write naming a table with a column any of its rules masks is refused
    before anything runs (403 mask_unresolvable), whatever the write; so is one naming a view, which writes into
    tables it doesn't name (`nv` renames notes.ssn: no rule matches its columns, the rows land in notes). Writes
    into a table without masked columns still run."""
    with _oracle(make_server, conn, mysql_db, pg_db, uniq) as (s, name, t):
        key = s.key(uniq("w"), connections="*", allow_writes=True, mask=[{"column": "*.ssn", "action": "hash"}])
        writer = s.key(uniq("o"), connections="*", allow_writes=True)   # no rules of its key: its own rules count

        def run(sql, who=key, **extra):
            return s.post("/execute_sql", {"sql": sql, "connection_name": name, **extra}, key=who)

        notes = t["notes"]
        writes = [f"INSERT INTO {notes} (id, ssn) VALUES (1, '{SSN}')",
                  f"INSERT INTO {notes} (id, body, ssn) SELECT 1, 'x', '{SSN}'",
                  f"INSERT INTO {t['nv']} (id, s) VALUES (1, '{SSN}')",
                  f"UPDATE {notes} SET ssn = '{SSN}' WHERE id = 1",
                  f"DELETE FROM {notes} WHERE id = 1",
                  *_upserts(conn, t)]
        assert run(f"INSERT INTO {t['log']} (id, body) VALUES (1, '{SSN}')").status == 200
        for sql in writes:
            r = run(sql)
            assert r.status == 403 and r.json["code"] == "mask_unresolvable", (sql, r)
        r = run(writes[0], who=writer, mask=[{"column": f"{notes}.ssn", "action": "hash"}])
        assert r.status == 403 and r.json["code"] == "mask_unresolvable", r
        # Nothing was written; the same write by a caller without rules runs.
        assert run(f"SELECT count(*) AS n FROM {notes}", who="admin").json == [{"n": 0}]
        assert run(writes[0], who=writer).status == 200
