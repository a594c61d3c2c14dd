"""Best-effort outline for the management routes: tables(), flow()."""

import pytest

from qag.sql.flow import flow, tables

DIALECTS = ("sqlite", "mysql", "postgres")


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql,expected", [
    ("SELECT * FROM film", ["film"]),
    ("SELECT * FROM Film f JOIN Actor a ON a.id = f.actor_id WHERE f.id = :id", ["actor", "film"]),
    ("SELECT * FROM crm.Customer", ["crm.customer"]),
    ("WITH x AS (SELECT * FROM orders) SELECT * FROM x", ["orders"]),
    ("WITH secret AS (SELECT * FROM secret) SELECT * FROM secret", ["secret"]),
    ("WITH customer AS (SELECT 1) SELECT * FROM customer, billing.customer", ["billing.customer"]),
    ("WITH a AS (SELECT 1), b AS (SELECT * FROM a) SELECT * FROM b", []),
    ("WITH b AS (SELECT * FROM a), a AS (SELECT 1) SELECT * FROM b", ["a"]),
    ("WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL SELECT n + 1 FROM r) SELECT * FROM r", []),
    ("SELECT * FROM (SELECT * FROM x) s JOIN y ON s.id = y.id", ["x", "y"]),
    ("SELECT * FROM t WHERE id IN (SELECT id FROM u) UNION SELECT * FROM v", ["t", "u", "v"]),
    ("DELETE FROM t WHERE id IN (SELECT id FROM u)", ["t", "u"]),
    ("INSERT INTO t SELECT * FROM u", ["t", "u"]),
    ("SELECT * FROM t WHERE x = {x}", ["t"]),
    ("SELECT 1", []),
])
def test_tables(dialect, sql, expected):
    assert tables(sql, dialect) == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tables_none_when_unparseable(dialect):
    assert tables("SELECT FROM WHERE (", dialect) is None
    assert tables("SELECT 'abc", dialect) is None


def test_flow_joins_and_format():
    out = flow("SELECT * FROM a JOIN b ON a.id = b.aid LEFT JOIN c AS cc USING (x) CROSS JOIN d "
               "JOIN e ON e.id = b.id WHERE a.x = {x} AND b.y = :y", "postgres")
    assert out["tables"] == ["a", "b", "c", "d", "e"]
    assert out["joins"] == [
        {"left": "a", "right": "b", "type": "INNER JOIN", "on": "a.id = b.aid"},
        {"left": "b", "right": "c", "type": "LEFT JOIN", "on": "USING (x)"},
        {"left": "c", "right": "d", "type": "CROSS JOIN", "on": None},
        {"left": "b", "right": "e", "type": "INNER JOIN", "on": "e.id = b.id"},
    ]
    assert out["error"] is None
    # Placeholders are printed as written, not in the driver's %(name)s form.
    assert "a.x = {x} AND b.y = :y" in out["formatted"]
    assert out["formatted"].startswith("SELECT\n")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_flow_never_raises(dialect):
    for sql in ("SELECT FROM WHERE (", "SELECT 'abc", "", "-- nothing", "\x00\x01"):
        out = flow(sql, dialect)
        assert set(out) == {"tables", "joins", "formatted", "error"}
        assert out["formatted"] is None and out["tables"] == [] and isinstance(out["error"], str)
    out = flow("SELECT FROM WHERE (", dialect)
    assert "<Token" not in out["error"] and "line 1" in out["error"]
    assert flow("SELECT 1", "oracle")["error"]
