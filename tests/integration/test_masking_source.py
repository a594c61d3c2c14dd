"""Masking at the source (issue 18): a masked column used but not returned gives away nothing about its values.

Every case of tests/cases/masking/used_not_returned.tsv runs, as a masked key, against two databases per dialect
that differ only in the masked columns' values (chosen so that their masked forms are equal). The responses must
be identical byte for byte; the administrator's responses differ, so each statement really depends on them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server import Server
from tests.services import make_mysql_database, make_pg_database, mysql_admin

psycopg = pytest.importorskip("psycopg")
from qag.backends.postgres import connect_args  # noqa: E402

CASES = Path(__file__).resolve().parents[1] / "cases" / "masking" / "used_not_returned.tsv"
RULES = [{"column": "customers.email", "action": "mask"}, {"column": "customers.secret", "action": "drop"}]
# The two databases: the same ids, names and orders; other e-mails and secrets, with equal masked e-mails.
PEOPLE = {"a": [(1, "alice@x.com", "s1"), (2, "bob@x.com", "s2"), (3, "carol@x.com", "s3")],
          "b": [(1, "amber@x.com", "s9"), (2, "bzzz@x.com", "s8"), (3, "cy@x.com", "s7")]}
ORDERS = [(10, "alice@x.com"), (11, "bob@x.com")]
DIALECTS = ("sqlite", "mysql", "postgres")


def cases():
    for line in CASES.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, dialects, sql = line.split("\t")
        for dialect in DIALECTS:
            if dialects == "all" or dialect in dialects.split(","):
                yield pytest.param(dialect, sql, id=f"{dialect}-{name}")


def _statements(people):
    yield "CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(100), secret VARCHAR(40), name VARCHAR(40))"
    yield "CREATE TABLE orders (id INT PRIMARY KEY, note VARCHAR(100))"
    for i, email, secret in people:
        yield f"INSERT INTO customers VALUES ({i}, '{email}', '{secret}', 'n{i}')"
    for i, note in ORDERS:
        yield f"INSERT INTO orders VALUES ({i}, '{note}')"


@pytest.fixture(scope="module")
def srv():
    cleanups = []
    s = Server()
    s.mysql_databases = {}
    try:
        for side, people in PEOPLE.items():
            s.sqlite_db(f"src_{side}.db", ";\n".join(_statements(people)) + ";")
            s.connection(f"sqlite_{side}", f"src_{side}.db")
            fields, cleanup = make_mysql_database()
            cleanups.append(cleanup)
            admin = mysql_admin()
            cur = admin.cursor()
            cur.execute(f"USE `{fields['database']}`")
            for statement in _statements(people):
                cur.execute(statement)
            admin.commit()
            admin.close()
            reply = s.post("/api/v1/connections", {"name": f"mysql_{side}", "db": "mysql", **fields})
            assert reply.status == 201, reply
            s.mysql_databases[side] = fields["database"]
            fields, cleanup = make_pg_database()
            cleanups.append(cleanup)
            with psycopg.connect(autocommit=True, **connect_args(fields)) as conn:
                for statement in _statements(people):
                    conn.execute(statement)
            reply = s.post("/api/v1/connections", {"name": f"postgres_{side}", "db": "postgres", **fields})
            assert reply.status == 201, reply
        s.masked = s.key("masked", connections="*", mask=RULES)
        yield s
    finally:
        s.close()
        for cleanup in cleanups:
            cleanup()


def _schema(srv, dialect: str, side: str) -> str:
    return {"sqlite": "main", "postgres": "public"}.get(dialect) or f"`{srv.mysql_databases[side]}`"


@pytest.mark.e2e
@pytest.mark.parametrize("dialect,sql", list(cases()))
def test_a_masked_column_used_but_not_returned_gives_nothing_away(srv, dialect, sql):
    replies = {}
    for side in PEOPLE:
        statement = sql.replace("{schema}", _schema(srv, dialect, side))
        for who, key in (("masked", srv.masked), ("admin", "admin")):
            replies[who, side] = srv.post("/execute_sql", {"sql": statement, "connection_name": f"{dialect}_{side}"},
                                          key=key)
    for side in PEOPLE:
        assert replies["masked", side].status == 200, replies["masked", side]
        assert replies["admin", side].status == 200, replies["admin", side]
    assert replies["admin", "a"].body != replies["admin", "b"].body, "the case doesn't depend on the masked values"
    assert replies["masked", "a"].body == replies["masked", "b"].body, (replies["masked", "a"], replies["masked", "b"])


@pytest.mark.e2e
def test_a_hashed_spatial_column_is_hashed_over_its_bytes(srv):
    """A fuzz finding: a hash rule on a MariaDB GEOMETRY column was a 500 (MariaDB can't CAST a geometry to CHAR,
    error 4079). It is hashed over the value's bytes: equal shapes hash alike, others not; NULL stays NULL."""
    fields, cleanup = make_mysql_database()
    try:
        admin = mysql_admin()
        cur = admin.cursor()
        cur.execute(f"USE `{fields['database']}`")
        cur.execute("CREATE TABLE places (id INT PRIMARY KEY, g GEOMETRY NULL, p POINT NULL)")
        cur.execute("INSERT INTO places VALUES (1, POINT(1, 2), POINT(1, 2)), (2, POINT(1, 2), POINT(3, 4)), "
                    "(3, NULL, NULL)")
        admin.commit()
        admin.close()
        assert srv.post("/api/v1/connections", {"name": "geo", "db": "mysql", **fields}).status == 201
        key = srv.key("geo_hashed", connections=["geo"], mask=[{"column": "places.g", "action": "hash"},
                                                                {"column": "places.p", "action": "hash"}])
        r = srv.post("/execute_sql", {"sql": "SELECT id, g, p FROM places ORDER BY id", "connection_name": "geo"},
                     key=key)
        assert r.status == 200, r
        rows = r.json
        assert all(len(rows[i][c]) == 16 for i in (0, 1) for c in ("g", "p")), rows
        assert rows[0]["g"] == rows[1]["g"] == rows[0]["p"] and rows[1]["p"] != rows[0]["p"], rows
        assert rows[2]["g"] is None and rows[2]["p"] is None
    finally:
        cleanup()
