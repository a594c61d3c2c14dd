"""Parquet streams (contract 3.8) and parquet pages on a real gunicorn: a failure before the first byte is the
normal JSON error response, one after it cuts the body; a value is never written as something it isn't."""

from __future__ import annotations

import http.client
import io
from decimal import Decimal

import pyarrow.parquet as pq
import pytest

from tests.server import q

pytestmark = pytest.mark.e2e

_SLOW_AT_1500 = "SELECT g, CASE WHEN g = 1500 THEN pg_sleep(3)::text END AS s FROM generate_series(1, 3000) g"
_ZERO_AT_1500 = "SELECT g, 1 / (g - 1500) AS s FROM generate_series(1, 3000) g"


def _parquet(body: bytes) -> list[dict]:
    return pq.read_table(io.BytesIO(body)).to_pylist()


def _pg(server, pg_db, name: str = "pqpg") -> str:
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db}).status == 201
    return name


def _raw(server, path: str, body: str | None = None) -> tuple[int, dict, bytes, bool]:
    """(status, headers, the body read, whether it ended complete): a cut chunked body is not an exception."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        headers = {"X-API-Key": server.admin_key}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        response = conn.getresponse()
        try:
            return response.status, dict(response.getheaders()), response.read(), True
        except http.client.IncompleteRead as cut:
            return response.status, dict(response.getheaders()), cut.partial, False
    finally:
        conn.close()


@pytest.fixture(scope="module", params=["qag", "gthread"])
def pq_server(request, make_module_server):
    return make_module_server(env={"QAG_WORKER_CLASS": request.param})


@pytest.mark.parametrize("sql,status,code", [(_SLOW_AT_1500, 504, "query_timeout"),
                                             (_ZERO_AT_1500, 400, "value_invalid")])
def test_a_parquet_stream_failing_before_its_first_byte_is_the_normal_error_response(pq_server, pg_db, sql, status,
                                                                                       code):
    """The failure comes after the first 1,000-row batch but before the first row group (10,000 rows) is full:
    no byte has gone out, so the caller gets the JSON error with its request id and every header, not the
    worker's bare 500 (status, envelope and history as a csv stream failing on its first batch gets them)."""
    s = pq_server
    conn = _pg(s, pg_db)
    name = f"pq_fail_{code}"
    if s.get(f"/api/v1/queries/{name}").status == 404:
        s.query(name, sql, conn)
    rid = f"pq-{code}-1"
    r = s.get(q(name), params={"format": "parquet", "stream": "true", "timeout": "1"},
              headers={"X-Request-Id": rid})
    assert r.status == status, r
    assert r.headers["content-type"] == "application/json" and r.headers["x-request-id"] == rid
    assert r.json["code"] == code and r.json["request_id"] == rid
    assert r.body.startswith(b'{"error":"') and b'", "' not in r.body        # the envelope, compact
    assert r.headers["x-content-type-options"] == "nosniff" and r.headers["cache-control"] == "no-store"
    assert "content-disposition" not in r.headers
    runs = s.get(f"/api/v1/queries/{name}/history").json["items"]
    run = next(item for item in runs if item["request_id"] == rid)
    assert run["status"] == "error" and run["code"] == code
    # the same on /execute_sql
    r = s.post("/execute_sql?format=parquet&stream=true&timeout=1", {"sql": sql, "connection_name": conn})
    assert r.status == status and r.json["code"] == code and r.json["request_id"] == r.headers["x-request-id"]


def test_a_parquet_stream_failing_after_its_first_byte_is_cut(make_server, pg_db):
    """Once the first row group went out, a failure ends the chunked body without its terminator (as a csv
    stream's does) and the run is recorded as failed."""
    s = make_server(env={"QAG_PARQUET_ROW_GROUP": "1000"})
    conn = _pg(s, pg_db)
    status, headers, body, complete = _raw(s, "/execute_sql?format=parquet&stream=true",
                                           f'{{"sql": "{_ZERO_AT_1500}", "connection_name": "{conn}"}}')
    assert status == 200 and headers["Content-Type"] == "application/vnd.apache.parquet"
    assert not complete and body.startswith(b"PAR1")
    history = s.get("/api/v1/history", params={"limit": 5}).json["items"]
    assert history[0]["status"] == "error" and history[0]["code"] == "value_invalid"


def test_a_parquet_stream_never_rounds_a_later_decimal(make_server, pg_db):
    """The first row group fixes a numeric column's scale (0 here); 101.5 comes after it. It is never written
    as 102: the stream ends cut, the run failed with a message naming the column."""
    s = make_server(env={"QAG_PARQUET_ROW_GROUP": "100"})
    conn = _pg(s, pg_db)
    sql = ("SELECT g, CASE WHEN g <= 100 THEN g::numeric ELSE g::numeric + 0.5 END AS n "
           "FROM generate_series(1, 105) g")
    status, _, body, complete = _raw(s, "/execute_sql?format=parquet&stream=true",
                                     f'{{"sql": "{sql}", "connection_name": "{conn}"}}')
    assert status == 200 and not complete and body.startswith(b"PAR1")
    run = s.get("/api/v1/history", params={"limit": 5}).json["items"][0]
    assert run["status"] == "error" and run["code"] == "invalid_stream" and "'n'" in run["error"], run
    # Values that fit the scale fixed so far go on: 101.0 at scale 0 is 101, the same number.
    fits = ("SELECT g, CASE WHEN g <= 100 THEN g::numeric ELSE g::numeric + 0.0 END AS n "
            "FROM generate_series(1, 105) g")
    status, _, body, complete = _raw(s, "/execute_sql?format=parquet&stream=true",
                                     f'{{"sql": "{fits}", "connection_name": "{conn}"}}')
    assert status == 200 and complete
    rows = _parquet(body)
    assert len(rows) == 105 and rows[-1] == {"g": 105, "n": Decimal(105)}


def test_a_parquet_stream_never_nulls_a_later_value_of_another_type(make_server):
    """SQLite: a column of integers for the first row group, then a float, then text. Never NULL: the stream
    ends cut with a failed run; a page of the same rows writes the mixed column as text."""
    s = make_server(env={"QAG_PARQUET_ROW_GROUP": "100"})
    s.sqlite_db("mixed.db", "CREATE TABLE m (id INTEGER, v); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                            "SELECT i + 1 FROM n WHERE i < 103) INSERT INTO m SELECT i, CASE WHEN i <= 100 "
                            "THEN i WHEN i = 101 THEN 1.5 ELSE 'x' || i END FROM n;")
    s.connection("mixed", "mixed.db")
    s.query("mixed_all", "SELECT id, v FROM m ORDER BY id", "mixed")
    status, _, body, complete = _raw(s, q("mixed_all") + "?format=parquet&stream=true")
    assert status == 200 and not complete
    run = s.get("/api/v1/queries/mixed_all/history").json["items"][0]
    assert run["status"] == "error" and run["code"] == "invalid_stream" and "'v'" in run["error"], run
    page = s.get(q("mixed_all"), params={"format": "parquet", "page_size": 200})
    rows = _parquet(page.body)
    assert rows[99] == {"id": 100, "v": "100"} and rows[100] == {"id": 101, "v": "1.5"}
    assert rows[102] == {"id": 103, "v": "x103"}


def test_a_parquet_page_writes_a_decimal_over_38_digits_as_text(server, pg_db, mysql_db):
    """decimal128 holds 38 digits: a page (all of it known) with a wider one writes that column as text, the
    value JSON gives, never NULL."""
    conn = _pg(server, pg_db)
    wide = "99999999999999999999999999999999999999.5"
    r = server.post("/execute_sql", {"sql": f"SELECT {wide}::numeric AS n, 1.5::numeric AS m",
                                     "connection_name": conn, "format": "parquet"})
    assert r.status == 200 and _parquet(r.body) == [{"n": wide, "m": Decimal("1.5")}]
    name = f"pqmy_{mysql_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "mysql", **mysql_db}).status == 201
    r = server.post("/execute_sql", {"sql": "SELECT CAST(12345678901234567890123456789012345 AS DECIMAL(65,30)) AS d",
                                     "connection_name": name, "format": "parquet"})
    assert r.status == 200
    assert _parquet(r.body) == [{"d": "12345678901234567890123456789012345.000000000000000000000000000000"}]
