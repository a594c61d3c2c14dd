"""SQLite engine refusals through the HTTP API (issue 17): caller-caused value errors are 4xx, never 500."""

from __future__ import annotations


def sql(server, statement, key=None):
    body = {"sql": statement, "connection_name": "lite"}
    return server.post("/execute_sql", body) if key is None else server.post("/execute_sql", body, key=key)


def test_values_over_sqlites_limits_are_400(server):
    r = sql(server, "SELECT randomblob(2000000000) AS b")
    assert r.status == 400 and r.json["code"] == "value_too_large"
    r = sql(server, "WITH RECURSIVE r(n, s) AS (SELECT 1, 'x' UNION ALL SELECT n + 1, s || s FROM r) "
                    "SELECT length(s) AS n FROM r ORDER BY n DESC LIMIT 1")
    assert r.status == 400 and r.json["code"] == "value_too_large"
    r = sql(server, "SELECT 1 AS one LIMIT 'x'")
    assert r.status == 400 and r.json["code"] == "value_invalid"
    assert sql(server, "SELECT count(*) AS n FROM t").json == [{"n": 25}]   # the next good request succeeds


def test_restricted_key_engine_refusals(server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    assert sql(server, "SELECT upper(name) AS n FROM t LIMIT 1", key).status == 200
    r = sql(server, "WITH x AS (SELECT email FROM secret) SELECT * FROM x", key)
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
