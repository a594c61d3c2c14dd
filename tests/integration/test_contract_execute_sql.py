"""Contract section 4 (POST /execute_sql and the SQL guard) against a real server."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.e2e


def run(server, sql, key="admin", **extra):
    return server.post("/execute_sql", {"sql": sql, "connection_name": "lite", **extra}, key=key)


@pytest.mark.parametrize("sql", ["DELETE FROM t", "DROP TABLE t", "INSERT INTO notes (body) VALUES ('x')",
                                 "/* hi */ UPDATE t SET name = 'x'", "SELECT 1 /*! DROP TABLE t */",
                                 "WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d",
                                 "EXPLAIN ANALYZE DELETE FROM t", "SELECT * INTO new_table FROM t",
                                 "PRAGMA journal_mode = DELETE", "ATTACH DATABASE 'x.db' AS x", "VACUUM"])
def test_b4_1_and_b4_2_writes_refused_read_only(server, sql):
    r = run(server, sql)
    assert r.status == 403 and r.json["code"] == "read_only", r
    assert r.json["error"].startswith("Only read-only statements (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) are allowed")
    assert run(server, "SELECT count(*) AS n FROM t").json == [{"n": 25}]


def test_b4_1_read_only_message_names_the_operation(server):
    assert "(delete)" in run(server, "DELETE FROM t").json["error"]
    assert "(an executable comment)" in run(server, "SELECT 1 /*! DROP TABLE t */").json["error"]


def test_b4_1_multiple_statements(server):
    r = run(server, "SELECT 1; DELETE FROM t")
    assert r.status == 400 and r.json == {"error": "Only a single SQL statement can be executed at a time",
                                          "code": "multiple_statements", "request_id": r.json["request_id"]}
    assert run(server, "SELECT ';' AS v;").json == [{"v": ";"}]


@pytest.mark.parametrize("sql,status", [("SELECT * FROM t WHERE action = 'delete'", 200),
                                        ('SELECT "update" FROM t', 200),
                                        # A locking read is not read-only (issue 4; docs/compatibility.md).
                                        ("SELECT * FROM t FOR UPDATE", 403),
                                        ("SELECT * FROM t FOR SHARE", 403),
                                        ("SELECT replace(name,'a','b') FROM t", 200),
                                        ("EXPLAIN QUERY PLAN SELECT * FROM t", 200)])
def test_b4_3_reads_that_look_like_writes_are_allowed(server, sql, status):
    r = run(server, sql)
    assert r.status == status, r
    if status == 403:
        assert r.json["code"] == "read_only" and "(lock)" in r.json["error"], r


def test_b4_4_admin_insert_with_writes(writes_server, uniq):
    body = uniq("note")
    r = writes_server.post("/execute_sql", {"sql": "INSERT INTO notes (body) VALUES (:b)", "connection_name": "lite",
                                            "params": {"b": body}})
    assert r.status == 200 and r.json == {"message": "No results returned"}
    r = writes_server.post("/execute_sql", {"sql": "SELECT body FROM notes WHERE body = :b",
                                            "connection_name": "lite", "params": {"b": body}})
    assert r.json == [{"body": body}]


def test_b4_5_key_allow_writes_capped_by_server(server, uniq):
    key = server.key(uniq("w"), allow_writes=True)
    r = run(server, "INSERT INTO notes (body) VALUES ('x')", key=key)
    assert r.status == 403 and r.json["code"] == "read_only"


def test_b4_6_allowed_write_ops(writes_server, uniq):
    key = writes_server.key(uniq("ops"), allow_writes=True, allowed_write_ops=["INSERT", "update"])
    assert run(writes_server, "insert into notes (body) values ('ops')", key=key).status == 200
    r = run(writes_server, "DELETE FROM notes WHERE body = 'never'", key=key)
    assert r.status == 403 and r.json["code"] == "write_op_not_allowed"
    assert "insert, update" in r.json["error"]
    assert run(writes_server, "SELECT 1 AS v", key=key).status == 200


def test_sqlite_variables_hide_no_statement_from_the_checks(writes_server, uniq):
    # SQLite reads $x::t(:p,') as one variable (its suffix runs to ')' through the quote), so a reading that saw a
    # string open there would miss the DELETE after it. Refused whatever the key, and nothing is deleted.
    key = writes_server.key(uniq("ins"), allow_writes=True, allowed_write_ops=["insert"])
    assert run(writes_server, "insert into notes (body) values ('kept')", key=key).status == 200
    before = run(writes_server, "SELECT count(*) AS n FROM notes").json
    trick = "WITH x AS (SELECT $x::t(:p,')) DELETE FROM notes --')) INSERT INTO notes (body) VALUES ('a')"
    for caller in (key, "admin"):
        r = run(writes_server, trick, params={"p": 1}, key=caller)
        assert r.status == 400 and r.json["code"] == "invalid_request" and "SQLite's own variables" in r.json["error"]
    assert run(writes_server, "SELECT count(*) AS n FROM notes").json == before


def test_b4_7_params_validation(server):
    assert run(server, "SELECT :a AS a", params={"a": [1]}).json["code"] == "param_invalid"
    r = run(server, "SELECT :a AS a", params={})
    assert r.status == 400 and r.json["code"] == "param_required"
    assert run(server, "SELECT :a AS a", params="nope").status == 400
    assert run(server, "SELECT :a AS a", params={"a": {"x": 1}}).status == 400


def test_b4_8_bad_sql_keeps_detail(server, uniq):
    r = run(server, "SELECT nope FROM t")
    assert r.status == 500 and r.json["code"] == "query_failed" and "no such column: nope" in r.json["detail"]
    key = server.key(uniq("k"))
    assert "no such column" in run(server, "SELECT nope FROM t", key=key).json["detail"]


def test_b4_9_unknown_and_inactive_connection(server, uniq):
    r = server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": uniq("none")})
    assert r.status == 404 and r.json["code"] == "connection_not_found"
    name = uniq("off")
    server.connection(name, "lite.db", active=False)
    r = server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": name})
    assert r.status == 403 and r.json["code"] == "connection_inactive"


def test_b4_10_body_and_paging_validation(server):
    r = server.request("POST", "/execute_sql", raw=b"nope", headers={"Content-Type": "text/plain"})
    assert r.status == 400 and r.json["error"] == "Request body must be a JSON object"
    for query in ("page=abc", "page=0", "page_size=-1", "page_size=100000"):
        assert server.post("/execute_sql?" + query, {"sql": "SELECT 1", "connection_name": "lite"}).status == 400
    assert server.post("/execute_sql", {"connection_name": "lite"}).json["code"] == "sql_required"
    assert server.post("/execute_sql", {"sql": "SELECT 1"}).json["code"] == "connection_required"


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_b4_11_bad_timeouts(server, value):
    r = server.post(f"/execute_sql?timeout={value}", {"sql": "SELECT 1", "connection_name": "lite"})
    assert r.status == 400 and r.json["code"] == "invalid_timeout"


def test_empty_reserved_arguments_are_absent(server):
    body = {"sql": "SELECT id FROM t ORDER BY id", "connection_name": "lite"}
    for query, more in (("?page=&page_size=2", {}), ("?format=&page_size=2", {"format": None}),
                        ("?timeout=&page_size=2", {"timeout": ""}), ("?page_size=2", {"database": ""})):
        r = server.post("/execute_sql" + query, {**body, **more})
        assert r.status == 200 and len(r.json) == 2 and r.headers["content-type"].startswith("application/json"), \
            (query, more, r)


def test_b4_11_body_timeout_accepted(server):
    assert run(server, "SELECT 1 AS v", timeout=5).json == [{"v": 1}]


def test_b4_12_recursive_cte_times_out(server):
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    r = server.post("/execute_sql?timeout=0.5", {"sql": slow, "connection_name": "lite"})
    assert r.status == 504 and "time limit" in r.json["error"] and r.json["timeout"] == 0.5
    assert run(server, "SELECT 1 AS v").json == [{"v": 1}]


def test_query_grants_cannot_run_adhoc_sql(server, uniq):
    key = server.key(uniq("k"), connections=[], queries="*")
    assert run(server, "SELECT 1", key=key).status == 403


def test_database_override_is_admin_only(server, uniq):
    key = server.key(uniq("k"))
    r = run(server, "SELECT 1", key=key, database="other")
    assert r.status == 403 and r.json["code"] == "admin_only"
    r = run(server, "SELECT 1", database="other")
    assert r.status == 400 and r.json["code"] == "unsupported_operation"


def test_sqlite_refuses_attach_and_extensions_even_with_writes(writes_server):
    r = run(writes_server, "ATTACH DATABASE 'other.db' AS o")
    assert r.status == 403
    r = run(writes_server, "SELECT load_extension('x')")
    assert r.status == 403


def test_read_only_at_driver_level(server):
    """B10.1: a read-only call can't write even if the guard were bypassed (mode=ro)."""
    import os
    from qag.backends import sqlite as backend
    from qag.backends.base import Call
    from qag.errors import QagError
    path = os.path.join(server.home, "lite.db")
    with pytest.raises(QagError) as raised:
        backend.run(path, Call("DELETE FROM t", (), True, 5.0, 10))
    assert raised.value.code == "read_only"
    assert backend.run(path, Call("SELECT count(*) FROM t", (), True, 5.0, 10)).rows == [(25,)]


def test_stream_failing_after_its_first_rows_raises(server):
    """A failure mid-stream is an error (recorded as a failed run; the body ends incomplete), never a silent end."""
    import os
    from qag.backends import sqlite as backend
    from qag.backends.base import Call
    from qag.errors import QagError
    slow_after = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                  "SELECT x FROM c")
    columns, batches = backend.stream(os.path.join(server.home, "lite.db"), Call(slow_after, (), True, 0.5, 0),
                                      1000, None)
    assert columns == ["x"]
    with pytest.raises(QagError) as raised:
        for _ in batches:
            pass
    assert raised.value.code == "query_timeout"
