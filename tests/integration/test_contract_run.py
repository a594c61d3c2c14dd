"""Contract section 3 (running saved queries) against a real server, one test per numbered behaviour."""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e


def test_b3_1_draft_only_query_is_not_published_even_for_admin(server, uniq):
    name = uniq("draft")
    server.query(name, "SELECT id FROM t WHERE id = 1", "lite", publish=False)
    r = server.get(q(name))
    assert r.status == 404 and r.json["code"] == "not_published"
    r = server.get(q(name) + "?version=1")
    assert r.status == 200 and r.json == [{"id": 1}]


def test_b3_2_versions_published_previous_and_draft(server, uniq):
    name, key_name = uniq("ver"), uniq("k")
    server.query(name, "SELECT 1 AS v", "lite")
    assert server.post(f"/api/v1/queries/{name}/versions", {"description": "v2", "sql": "SELECT 2 AS v",
                                                             "connection_name": "lite", "publish": True}).status == 201
    assert server.post(f"/api/v1/queries/{name}/versions", {"description": "v3", "sql": "SELECT 3 AS v",
                                                             "connection_name": "lite"}).status == 201
    key = server.key(key_name, queries=[name])
    assert server.get(q(name), key=key).json == [{"v": 2}]
    assert server.get(q(name) + "?version=1", key=key).json == [{"v": 1}]
    draft = server.get(q(name) + "?version=3", key=key)
    missing = server.get(q(name) + "?version=9", key=key)
    assert draft.status == 404 and draft.json["code"] == "version_not_found"
    assert draft.json["error"] == "Version 3 not found"
    # A draft is indistinguishable from a version that never existed, apart from the request id.
    assert {k: v for k, v in draft.json.items() if k != "request_id"} == \
        {k: v for k, v in missing.json.items() if k != "request_id"} | {"error": "Version 3 not found"}
    assert server.get(q(name) + "?version=3").json == [{"v": 3}]


def test_b3_3_unpublish(server, uniq):
    name = uniq("unpub")
    server.query(name, "SELECT 1 AS v", "lite")
    assert server.post(f"/api/v1/queries/{name}/unpublish").status == 200
    assert server.get(q(name)).json["code"] == "not_published"
    assert server.get(q(name) + "?version=1").json == [{"v": 1}]


def test_b3_4_query_string_wins_over_body(server, uniq):
    name = uniq("wins")
    server.query(name, "SELECT id FROM t ORDER BY id", "lite")
    r = server.post(q(name) + "?format=csv&version=1&timeout=5", {"format": "json", "version": 7, "timeout": -1,
                                                                  "connection_name": "nope"})
    # connection_name from the body would be 404: the saved one is used only when neither gives one.
    assert r.status == 404 and r.json["code"] == "connection_not_found"
    r = server.post(q(name) + "?format=csv&version=1&timeout=5&connection_name=lite",
                    {"format": "json", "version": 7, "timeout": -1, "connection_name": "nope"})
    assert r.status == 200 and r.headers["content-type"].startswith("text/csv")


def test_b3_5_params_then_placeholders_override_query_string(server, uniq):
    name = uniq("prec")
    server.query(name, "SELECT :a AS a, :b AS b, :c AS c", "lite")
    r = server.post(q(name) + "?a=qs&b=qs&c=qs", {"params": {"b": "params", "c": "params"},
                                                    "placeholders": {"c": "placeholders"}})
    assert r.json == [{"a": "qs", "b": "params", "c": "placeholders"}]


def test_b3_6_injection_text_is_data(writes_server, uniq):
    name = uniq("inj")
    writes_server.query(name, "SELECT :v AS v", "lite")
    evil = "x'); DROP TABLE t; --"
    assert writes_server.get(q(name), params={"v": evil}).json == [{"v": evil}]
    assert writes_server.get(q(uniq("none"))).status == 404
    count = writes_server.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM t", "connection_name": "lite"})
    assert count.json == [{"n": 25}]


@pytest.mark.parametrize("value", ["1 OR 1=1; --", "x' OR '1'='1", "3 -- "])
def test_b3_7_text_placeholder_refuses_sql(server, uniq, value):
    name = uniq("txt")
    server.query(name, "SELECT id FROM t WHERE id = {id}", "lite")
    r = server.get(q(name), params={"id": value})
    assert r.status == 400 and r.json["code"] == "param_invalid"
    r = server.post(q(name), {"params": {"id": [1]}})
    assert r.status == 400


def test_b3_7_text_placeholder_valid_value_runs_as_a_bound_value(server, uniq):
    name = uniq("txtok")
    server.query(name, "SELECT id FROM t WHERE id = {id}", "lite")
    assert server.get(q(name) + "?id=4").json == [{"id": 4}]
    r = server.get(q(name))
    assert r.status == 400 and r.json["code"] == "param_required"


def test_b3_8_declared_int_rule(server, uniq):
    name = uniq("rule")
    server.query(name, "SELECT :min_id AS v", "lite",
                 parameters={"min_id": {"type": "int", "min": 1, "max": 25, "default": 1}})
    assert server.get(q(name)).json == [{"v": 1}]
    r = server.get(q(name) + "?min_id=0")
    assert r.status == 400 and r.json["errors"] == {"min_id": "must be at least 1"}
    assert server.get(q(name) + "?min_id=abc").json["errors"] == {"min_id": "must be an integer"}
    assert server.get(q(name) + "?min_id=26").status == 400
    r = server.get(q(name) + "?min_id=")
    assert r.json["errors"] == {"min_id": "must be an integer"}


def test_b3_9_all_failures_in_one_response(server, uniq):
    name = uniq("many")
    server.query(name, "SELECT :a AS a, :b AS b, :c AS c", "lite",
                 parameters={"a": "int", "b": {"type": "int", "max": 3}, "c": {"type": "str", "required": True}})
    r = server.get(q(name) + "?a=x&b=9")
    assert r.status == 400 and r.json["code"] == "param_invalid"
    assert r.json["errors"] == {"a": "must be an integer", "b": "must be at most 3", "c": "is required"}
    assert r.json["error"] == "Invalid parameters: a must be an integer; b must be at most 3; c is required"


def test_b3_10_only_missing_is_param_required(server, uniq):
    name = uniq("req")
    server.query(name, "SELECT :c AS c", "lite", parameters={"c": {"type": "str", "required": True}})
    r = server.get(q(name))
    assert r.status == 400 and r.json["code"] == "param_required"


def test_b3_11_post_body_value_coerced(server, uniq):
    name = uniq("post")
    server.query(name, "SELECT :min_id AS v", "lite", parameters={"min_id": "int"})
    r = server.post(q(name), {"params": {"min_id": "x"}})
    assert r.status == 400 and r.json["errors"] == {"min_id": "must be an integer"}
    assert server.post(q(name), {"params": {"min_id": 7}}).json == [{"v": 7}]


@pytest.mark.parametrize("rule,value", [("int", True), ("bool", 1), ("str", 5)])
def test_b3_12_json_type_confusion_refused(server, uniq, rule, value):
    name = uniq("conf")
    server.query(name, "SELECT :p AS p", "lite", parameters={"p": rule})
    r = server.post(q(name), {"params": {"p": value}})
    assert r.status == 400 and r.json["code"] == "param_invalid"


def test_b3_13_int_out_of_64_bits(server, uniq):
    name = uniq("big")
    server.query(name, "SELECT :p AS p", "lite", parameters={"p": "int"})
    r = server.get(q(name) + "?p=9223372036854775808")
    assert r.json["errors"] == {"p": "must be a 64-bit integer"}


def test_b3_14_paging_headers(server, uniq):
    name = uniq("page")
    server.query(name, "SELECT id FROM t ORDER BY id", "lite")
    r = server.get(q(name) + "?page=3&page_size=10")
    assert [row["id"] for row in r.json] == [21, 22, 23, 24, 25]
    assert (r.headers["x-page"], r.headers["x-page-size"], r.headers["x-row-count"], r.headers["x-has-more"]) == \
        ("3", "10", "5", "false")
    r = server.get(q(name) + "?page_size=25")
    assert len(r.json) == 25 and r.headers["x-has-more"] == "false"
    r = server.get(q(name) + "?page_size=24")
    assert r.headers["x-has-more"] == "true"


def test_b3_15_statement_own_window_is_respected(server, uniq):
    a, b = uniq("lim"), uniq("limoff")
    server.query(a, "SELECT id FROM t ORDER BY id LIMIT 2;", "lite")
    server.query(b, "SELECT id FROM t ORDER BY id LIMIT 3 OFFSET 1", "lite")
    assert server.get(q(a) + "?page_size=4").json == [{"id": 1}, {"id": 2}]
    r = server.get(q(b) + "?page_size=4")
    assert r.json == [{"id": 2}, {"id": 3}, {"id": 4}] and r.headers["x-has-more"] == "false"
    r = server.get(q(b) + "?page_size=2")
    assert r.json == [{"id": 2}, {"id": 3}] and r.headers["x-has-more"] == "true"
    assert server.get(q(b) + "?page=2&page_size=2").json == [{"id": 4}]


def test_b3_15_standard_window_forms_on_sqlite(server, uniq):
    """Contract 3.6's standard forms are respected on every engine, SQLite's too (its grammar has none of them:
    they were sent as written, a 500): qag replaces the window with the engine's LIMIT/OFFSET."""
    every = [row["id"] for row in server.get(q(_saved(server, uniq, "SELECT id FROM t ORDER BY id"))
                                             + "?page_size=1000").json]
    for window, page_size, expected, more, whole in (
            ("OFFSET 2 ROWS FETCH FIRST 2 ROWS ONLY", 5, every[2:4], "false", every[2:4]),
            ("OFFSET 3", 4, every[3:7], "true", every[3:]), ("OFFSET 3 ROWS", 1000, every[3:], "false", every[3:]),
            ("FETCH NEXT ROW ONLY", 5, every[:1], "false", every[:1]), ("LIMIT ALL", 2, every[:2], "true", every),
            ("LIMIT ALL OFFSET 1", 2, every[1:3], "true", every[1:])):
        name = _saved(server, uniq, f"SELECT id FROM t ORDER BY id {window}")
        r = server.get(q(name) + f"?page_size={page_size}")
        assert r.status == 200 and [row["id"] for row in r.json] == expected, (window, r)
        assert r.headers["x-has-more"] == more, window
        r = server.post("/execute_sql", {"sql": f"SELECT id FROM t ORDER BY id {window}", "connection_name": "lite"})
        assert r.status == 200, (window, r)
        # A stream reads the window whole: replaced by SQLite's own LIMIT/OFFSET too (it was sent as written: 500).
        r = server.get(q(name) + "?stream=true&format=csv")
        assert r.status == 200 and r.body.decode().split() == ["id", *map(str, whole)], (window, r)


def _saved(server, uniq, sql):
    name = uniq("win")
    server.query(name, sql, "lite")
    return name


def test_b3_16_empty_result_is_json_even_for_csv(server, uniq):
    name = uniq("empty")
    server.query(name, "SELECT id FROM t WHERE id < 0", "lite")
    r = server.get(q(name) + "?format=csv")
    assert r.status == 200 and r.body == b'{"message":"No results returned"}\n'
    assert r.headers["content-type"] == "application/json"
    assert r.headers["x-row-count"] == "0" and r.headers["x-has-more"] == "false"


def test_b3_17_format_is_case_insensitive(server, uniq):
    name = uniq("fmt")
    server.query(name, "SELECT 1 AS id, 'a,b' AS v, 1.0 AS d UNION ALL SELECT 2, NULL, 2.5", "lite")
    r = server.get(q(name) + "?format=CSV")
    assert r.body == b'id,v,d\r\n1,"a,b",1.0\r\n2,,2.5\r\n'
    r = server.get(q(name) + "?format=ndjson")
    assert r.body == b'{"id": 1, "v": "a,b", "d": 1.0}\n{"id": 2, "v": null, "d": 2.5}\n'
    assert r.headers["content-type"] == "application/x-ndjson"
    r = server.get(q(name) + "?format=tsv")
    assert r.body == b"id\tv\td\r\n1\ta,b\t1.0\r\n2\t\t2.5\r\n"
    r = server.get(q(name) + "?format=pdf")
    assert r.status == 400 and r.json["code"] == "invalid_format"


def test_b3_18_json_suffix_alias(server, uniq):
    name = uniq("alias")
    server.query(name, "SELECT 1 AS v", "lite")
    assert server.get(q(name) + ".json").json == [{"v": 1}]
    assert server.get(f"/q/saved_sql/{name}.json").json == [{"v": 1}]


def test_b3_19_malformed_json_body(server, uniq):
    name = uniq("badjson")
    server.query(name, "SELECT 1 AS v", "lite")
    r = server.request("POST", q(name), raw=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json == {"error": "Request body is not valid JSON", "code": "invalid_body",
                                          "request_id": r.headers["x-request-id"]}
    r = server.request("POST", q(name), raw=b"", headers={"Content-Type": "application/json"})
    assert r.status == 200 and r.json == [{"v": 1}]
    r = server.request("POST", q(name), raw=b"[1]", headers={"Content-Type": "application/json"})
    assert r.status == 400 and r.json["error"] == "Request body must be a JSON object"
    # A form-encoded POST runs with no parameters.
    r = server.request("POST", q(name), raw=b"a=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status == 200


def test_b3_20_stream_whole_result(server, uniq):
    name = uniq("stream")
    server.query(name, "SELECT id FROM t ORDER BY id", "lite")
    r = server.get(q(name) + "?stream=true&format=csv")
    lines = r.body.split(b"\r\n")
    assert r.status == 200 and lines[0] == b"id" and len(lines) == 27 and lines[-1] == b""
    assert r.headers["content-disposition"] == f'attachment; filename="{name}.csv"'
    assert "x-page" not in r.headers
    r = server.get(q(name) + "?stream=true")
    assert r.status == 400 and r.json["code"] == "invalid_stream" and "csv" in r.json["error"]
    r = server.get(q(name) + "?stream=true&format=csv&page=2")
    assert r.status == 400 and r.json["code"] == "invalid_stream"


def test_b3_20_stream_empty_result_is_header_only(server, uniq):
    name = uniq("streamempty")
    server.query(name, "SELECT id, name FROM t WHERE id < 0", "lite")
    assert server.get(q(name) + "?stream=1&format=csv").body == b"id,name\r\n"
    assert server.get(q(name) + "?stream=1&format=ndjson").body == b""


def test_b3_21_write_query_returns_200_and_commits(writes_server, uniq):
    name = uniq("write")
    writes_server.query(name, "INSERT INTO notes (body) VALUES (:body)", "lite")
    r = writes_server.post(q(name), {"params": {"body": name}})
    assert r.status == 200 and r.json == {"message": "No results returned"}
    check = writes_server.post("/execute_sql", {"sql": "SELECT body FROM notes WHERE body = :b",
                                                "connection_name": "lite", "params": {"b": name}})
    assert check.json == [{"body": name}]


def test_b3_21_write_query_refused_without_server_flag(server, uniq):
    name = uniq("write")
    server.query(name, "INSERT INTO notes (body) VALUES ('x')", "lite")
    r = server.post(q(name))
    assert r.status == 403 and r.json["code"] == "read_only"


def test_b3_22_timeout_is_not_a_parameter(server, uniq):
    name = uniq("tmo")
    server.query(name, "SELECT :id AS id", "lite")
    assert server.get(q(name) + "?id=4&timeout=5").json == [{"id": "4"}]


def test_undeclared_query_string_parameter_binds_as_text(server, uniq):
    name = uniq("echo")
    server.query(name, "SELECT :x AS x", "lite")
    assert server.get(q(name) + "?x=5").json == [{"x": "5"}]
    assert server.post(q(name), {"params": {"x": None}}).json == [{"x": None}]


def test_name_resolution_errors(server, uniq):
    r = server.get("/q/..%2Fx")
    assert r.status == 404
    r = server.get("/q/.hidden")
    assert r.status == 403 and r.json["code"] == "forbidden"
    r = server.get(q(uniq("missing")))
    assert r.status == 404 and r.json["code"] == "query_not_found"


def test_connection_required_and_forbidden(server, uniq):
    name, other = uniq("noconn"), uniq("granted")
    server.query(name, "SELECT 1 AS v", None)
    r = server.get(q(name))
    assert r.status == 400 and r.json["code"] == "connection_required"
    assert server.get(q(name) + "?connection_name=lite").json == [{"v": 1}]
    key = server.key(uniq("k"), connections=[], queries=[name, other])
    r = server.get(q(name) + "?connection_name=lite", key=key)
    assert r.status == 403 and r.json["code"] == "connection_forbidden" and "'lite'" in r.json["error"]


def test_paging_validation(server, uniq):
    name = uniq("pv")
    server.query(name, "SELECT id FROM t", "lite")
    for query, code in [("page=abc", "invalid_request"), ("page=0", "invalid_paging"),
                        ("page_size=-1", "invalid_paging"), ("page_size=100000", "invalid_paging"),
                        ("version=x", "invalid_request"), ("timeout=nan", "invalid_timeout"),
                        ("timeout=0", "invalid_timeout"), ("timeout=inf", "invalid_timeout"),
                        # float() reads these; the contract's number doesn't (found by a fault drill)
                        ("timeout=%EF%BC%91", "invalid_timeout"), ("timeout=1_0", "invalid_timeout"),
                        ("timeout=%205", "invalid_timeout"), ("timeout=-1", "invalid_timeout")]:
        r = server.get(q(name) + "?" + query)
        assert r.status == 400 and r.json["code"] == code, (query, r)


def test_empty_reserved_arguments_are_absent(server, uniq):
    """A form's empty field (`?page=`) or a client's unset optional field (`"format": null`) is no value, as
    QueryAPIGate reads them: the default applies, or the body's value when the query string's is empty."""
    name = uniq("empty")
    server.query(name, "SELECT id FROM t ORDER BY id", "lite")
    first = server.get(q(name) + "?page_size=2")
    assert first.status == 200 and len(first.json) == 2
    for query in ("page=&page_size=2", "page_size=2&format=", "page_size=2&version=", "page_size=2&timeout="):
        r = server.get(q(name) + "?" + query)
        assert r.status == 200 and r.json == first.json and r.headers["x-page"] == "1", (query, r)
    assert server.get(q(name) + "?page_size=").headers["x-page-size"] == "10"
    for body in ({"format": None}, {"format": ""}, {"version": ""}, {"timeout": ""}, {"timeout": None}):
        r = server.post(q(name) + "?page_size=2", body)
        assert r.status == 200 and r.json == first.json, (body, r)
    r = server.post(q(name) + "?format=&page_size=1", {"format": "csv"})
    assert r.status == 200 and r.headers["content-type"].startswith("text/csv") and r.body == b"id\r\n1\r\n"
    server.post(f"/api/v1/queries/{name}/versions", {"description": "v2", "sql": "SELECT 2 AS v",
                                                      "connection_name": "lite", "publish": True})
    assert server.post(q(name) + "?version=", {"version": 1}).json[0] == {"id": 1}
    assert server.post(q(name) + "?version=", {}).json == [{"v": 2}]


def test_value_conversions_in_json(server, uniq):
    name = uniq("types")
    server.query(name, "SELECT i, f, s, b, n FROM types", "lite")
    r = server.get(q(name))
    assert r.body == b'[{"i":42,"f":2.5,"s":"h\\u00e9llo \\"q\\", ok","b":"abc","n":null}]\n'


def test_duplicate_column_names_made_unique(server, uniq):
    name = uniq("dup")
    server.query(name, "SELECT a.id, b.id FROM t a JOIN t b ON b.id = a.id + 1 WHERE a.id = 1", "lite")
    assert server.get(q(name)).json == [{"id": 1, "id_2": 2}]


def test_query_timeout_504_then_next_call_works(server, uniq):
    slow = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c")
    r = server.post("/execute_sql?timeout=0.5", {"sql": slow, "connection_name": "lite"})
    assert r.status == 504 and r.json["code"] == "query_timeout" and "time limit" in r.json["error"]
    assert r.json["timeout"] == 0.5
    assert server.post("/execute_sql", {"sql": "SELECT 1 AS v", "connection_name": "lite"}).json == [{"v": 1}]


def test_scoped_key_gets_no_driver_detail_on_q(server, uniq):
    name = uniq("bad")
    server.query(name, "SELECT nope FROM t", "lite")
    key = server.key(uniq("k"), queries=[name], connections=[])
    r = server.get(q(name), key=key)
    assert r.status == 500 and r.json["code"] == "query_failed" and "detail" not in r.json
    r = server.get(q(name))
    assert "no such column" in r.json["detail"]


def test_b6_1_query_grant_without_connection_grant(server, uniq):
    granted, other = uniq("monthly"), uniq("internal")
    server.query(granted, "SELECT 1 AS v", "lite")
    server.query(other, "SELECT 2 AS v", "lite")
    key = server.key(uniq("k"), connections=[], queries=[granted])
    assert server.get(q(granted), key=key).status == 200
    r = server.get(q(other), key=key)
    assert r.status == 403 and r.json["code"] == "connection_forbidden"
    assert server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "lite"}, key=key).status == 403


def test_b6_2_collection_grant_covers_only_the_saved_connection(server, uniq):
    name, conn2 = uniq("coll"), uniq("c")
    collection = "c-" + name.lower().replace("_", "-")
    server.connection(conn2, "lite.db")
    server.query(name, "SELECT 1 AS v", "lite", collection=collection)
    key = server.key(uniq("k"), connections=[], collections=[collection])
    assert server.get(q(name), key=key).status == 200
    assert server.get(q(name) + "?connection_name=lite", key=key).status == 200
    r = server.get(q(name) + f"?connection_name={conn2}", key=key)
    assert r.status == 403 and conn2 in r.json["error"]


def test_b6_3_queries_star_never_adhoc_never_writes(writes_server, uniq):
    read, write = uniq("r"), uniq("w")
    writes_server.query(read, "SELECT 1 AS v", "lite")
    writes_server.query(write, "INSERT INTO notes (body) VALUES ('star')", "lite")
    key = writes_server.key(uniq("k"), connections=[], queries="*")
    assert writes_server.get(q(read), key=key).status == 200
    assert writes_server.post(q(write), key=key).json["code"] == "read_only"
    assert writes_server.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "lite"}, key=key).status == 403


def test_b6_4_write_curated_query_grant(writes_server, server, uniq):
    name = uniq("submit")
    writes_server.query(name, "INSERT INTO notes (body) VALUES (:b)", "lite")
    curated = writes_server.key(uniq("k"), connections=[], allow_writes=False,
                                queries=[{"name": name, "allow_writes": True}])
    plain = writes_server.key(uniq("k"), connections=[], queries=[name])
    assert writes_server.post(q(name), {"params": {"b": "ok"}}, key=curated).status == 200
    assert writes_server.post(q(name), {"params": {"b": "no"}}, key=plain).json["code"] == "read_only"
    # The same grant on a server whose writes are off is refused.
    server.query(name, "INSERT INTO notes (body) VALUES (:b)", "lite")
    key = server.key(uniq("k"), connections=[], queries=[{"name": name, "allow_writes": True}])
    assert server.post(q(name), {"params": {"b": "x"}}, key=key).json["code"] == "read_only"


def test_a_querys_write_grant_holds_on_its_saved_connection_only(writes_server, uniq):
    """Contract 3.4: a query grant covers the query where its author saved it; on another connection the key runs
    it through that connection's own grant, which holds no write right, so the run is read-only there."""
    name, other = uniq("submit"), uniq("other")
    writes_server.sqlite_db(f"{other}.db", "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);")
    writes_server.connection(other, f"{other}.db")
    writes_server.query(name, "INSERT INTO notes (body) VALUES (:b)", "lite")
    key = writes_server.key(uniq("k"), connections=[other], queries=[{"name": name, "allow_writes": True}])
    elsewhere = writes_server.post(q(name), {"params": {"b": "elsewhere"}, "connection_name": other}, key=key)
    assert (elsewhere.status, elsewhere.json["code"]) == (403, "read_only"), elsewhere
    assert writes_server.post(q(name), {"params": {"b": "home"}}, key=key).status == 200
    rows = sqlite3.connect(os.path.join(writes_server.home, f"{other}.db")).execute("SELECT count(*) FROM notes")
    assert rows.fetchone()[0] == 0                         # nothing was written on the other connection
    # A key-wide write grant is the key's on every connection it may use.
    wide = writes_server.key(uniq("k"), connections=[other], allow_writes=True, queries=[name])
    assert writes_server.post(q(name), {"params": {"b": "wide"}, "connection_name": other}, key=wide).status == 200


def test_key_limits_narrow_the_call(server, uniq):
    name = uniq("lim")
    server.query(name, "SELECT id FROM t ORDER BY id", "lite")
    key = server.key(uniq("k"), queries=[name], max_rows=7)
    r = server.get(q(name) + "?page_size=20", key=key)
    assert len(r.json) == 7 and r.headers["x-page-size"] == "7"
    assert server.get(q(name) + "?page=2&page_size=20", key=key).json[0] == {"id": 8}


def test_governance_tables_checked_and_masks_applied(server, uniq):
    name = uniq("gov")
    server.query(name, "SELECT id FROM t", "lite")
    tables = server.key(uniq("k"), queries=[name], allowed_tables=["t"])
    assert server.get(q(name), key=tables).status == 200
    other = server.key(uniq("k"), queries=[name], allowed_tables=["other"])
    r = server.get(q(name), key=other)
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
    assert r.json["error"] == "This API key may only query these tables: main.other. Forbidden: main.t."
    masked = server.key(uniq("k"), queries=[name], mask=[{"column": "t.name", "action": "hash"}])
    r = server.get(q(name), key=masked)
    assert r.status == 200 and r.json[0] == {"id": 1}


def test_graceful_shutdown_finishes_in_flight_calls(make_server):
    import threading
    s = make_server()
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    result = {}

    def call():
        result["reply"] = s.post("/execute_sql?timeout=1.5", {"sql": slow, "connection_name": "lite"})

    caller = threading.Thread(target=call)
    caller.start()
    import time
    time.sleep(0.5)
    assert s.stop() == 0
    caller.join(10)
    assert result["reply"].status == 504


def test_server_runs_the_twins_qag_speedups_selects(server):
    # `make test` runs these contract tests twice: with QAG_SPEEDUPS=require, then again with off (pure twins).
    import os
    import re

    from qag import _speedups
    mode = os.environ.get("QAG_SPEEDUPS", "auto").strip().lower()
    line = next(line for line in server.log if "speedups (" in line)
    twins = dict(re.findall(r"(\w+)=(\w+)", line.split("):", 1)[1]))
    assert line.startswith("qag: store ") and f"speedups ({mode})" in line, line
    assert set(twins) == {"request_path", *_speedups.MODULES, "http_parser"}, line
    if mode in ("off", "require"):
        assert set(twins.values()) == {"pure" if mode == "off" else "compiled"}, line
        # and the workers really run the build (or the source) the line names: the compiled request path is
        # mapped into every worker's memory, the source's never is
        assert server.get("/health", key=None).status == 200
        workers = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True).stdout.split()
        assert workers
        for pid in workers:
            with open(f"/proc/{pid}/maps") as fh:
                mapped = "/qag/app.cpython-" in fh.read()
            assert mapped == (mode == "require"), (pid, mode)
