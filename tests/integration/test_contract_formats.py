"""Contract 3.7/3.8: the xml, yaml, xlsx and parquet formats on a real gunicorn, on /q, /execute_sql, cached
responses and streams, on SQLite, MariaDB and PostgreSQL; the binary bodies read back with openpyxl and
pyarrow, not compared as bytes."""

from __future__ import annotations

import datetime as dt
import io
from decimal import Decimal

import openpyxl
import pyarrow.parquet as pq
import pytest
import yaml

from tests.server import q

pytestmark = pytest.mark.e2e

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
_ODD = "SELECT i AS \"1 id\", s AS \"a b<c>\", n, f FROM types"


def _xlsx(body: bytes) -> list[tuple]:
    return list(openpyxl.load_workbook(io.BytesIO(body)).active.iter_rows(values_only=True))


def _parquet(body: bytes) -> list[dict]:
    return pq.read_table(io.BytesIO(body)).to_pylist()


@pytest.fixture(scope="module")
def odd(server):
    name = "formats_odd"
    if server.get(f"/api/v1/queries/{name}").status == 404:
        server.query(name, _ODD, "lite")
    return name


def test_xml_is_the_contracts_shape_with_names_sanitised_and_null_empty(server, odd):
    r = server.get(q(odd), params={"format": "xml"})
    assert r.status == 200 and r.headers["content-type"] == "application/xml; charset=utf-8"
    assert r.body == ("<data><item><_1_id>42</_1_id><a_b_c_>héllo \"q\", ok</a_b_c_><n /><f>2.5</f></item>"
                      "</data>").encode()
    assert (r.headers["x-row-count"], r.headers["x-has-more"]) == ("1", "false")


def test_xml_escapes_markup_in_values(server):
    r = server.post("/execute_sql", {"sql": "SELECT '<a>&amp;' AS v, '' AS e", "connection_name": "lite",
                                     "format": "xml"})
    assert r.status == 200 and r.body == b"<data><item><v>&lt;a&gt;&amp;amp;</v><e /></item></data>"


def test_yaml_is_block_style_in_column_order_with_unicode(server, odd):
    r = server.get(q(odd), params={"format": "yaml"})
    assert r.status == 200 and r.headers["content-type"] == "application/x-yaml"
    assert r.body.decode() == "- 1 id: 42\n  a b<c>: héllo \"q\", ok\n  n: null\n  f: 2.5\n"
    page = server.get(q("formats_page"), params={"format": "yaml", "page_size": 3, "page": 2})
    assert yaml.safe_load(page.body) == [{"id": i, "name": f"row {i}"} for i in (4, 5, 6)]
    assert (page.headers["x-page"], page.headers["x-has-more"]) == ("2", "true")


@pytest.fixture(scope="module", autouse=True)
def paged(server):
    if server.get("/api/v1/queries/formats_page").status == 404:
        server.query("formats_page", "SELECT id, name FROM t ORDER BY id", "lite")


def test_xlsx_is_one_sheet_with_a_header_row_and_typed_cells(server, odd):
    r = server.get(q(odd), params={"format": "xlsx"})
    assert r.status == 200 and r.headers["content-type"] == XLSX
    assert r.headers["content-disposition"] == "attachment;filename=result.xlsx"
    assert _xlsx(r.body) == [("1 id", "a b<c>", "n", "f"), (42, 'héllo "q", ok', None, 2.5)]


def test_xlsx_text_is_never_a_formula(server):
    r = server.post("/execute_sql", {"sql": "SELECT '=1+1' AS f, 'http://x.example' AS u, '007' AS z",
                                     "connection_name": "lite", "format": "xlsx"})
    assert r.status == 200
    book = openpyxl.load_workbook(io.BytesIO(r.body))
    cells = list(book.active.iter_rows(min_row=2, values_only=True))[0]
    assert cells == ("=1+1", "http://x.example", "007")
    assert all(c.data_type == "s" for c in list(book.active.iter_rows(min_row=2))[0])


def test_parquet_page_reads_back_with_its_types(server, odd):
    r = server.get(q(odd), params={"format": "parquet"})
    assert r.status == 200 and r.headers["content-type"] == "application/vnd.apache.parquet"
    assert r.headers["content-disposition"] == "attachment;filename=result.parquet"
    assert _parquet(r.body) == [{"1 id": 42, "a b<c>": 'héllo "q", ok', "n": None, "f": 2.5}]


@pytest.mark.parametrize("fmt", ["xml", "yaml", "xlsx", "parquet"])
def test_an_empty_page_is_the_json_object_whatever_the_format(server, fmt):
    r = server.get(q("formats_page"), params={"format": fmt, "page": 99})
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json == {"message": "No results returned"} and r.headers["x-row-count"] == "0"
    assert "content-disposition" not in r.headers


def test_unknown_format_lists_all_eight(server):
    r = server.get(q("formats_page"), params={"format": "pdf"})
    assert r.status == 400 and r.json["code"] == "invalid_format"
    assert r.json["error"] == ("Unsupported format 'pdf'. Supported formats: json, ndjson, csv, tsv, xml, yaml, "
                               "xlsx, parquet")


@pytest.mark.parametrize("fmt", ["xml", "yaml", "xlsx", "json"])
def test_only_csv_ndjson_parquet_and_tsv_stream(server, fmt):
    r = server.get(q("formats_page"), params={"format": fmt, "stream": "true"})
    assert r.status == 400 and r.json["code"] == "invalid_stream"
    assert r.json["error"] == "stream=true only supports these formats: csv, ndjson, parquet, tsv"


def test_a_parquet_stream_is_the_whole_result_in_row_groups(make_server):
    s = make_server(env={"QAG_PARQUET_ROW_GROUP": "100"})
    s.sqlite_db("many.db", "CREATE TABLE m (id INTEGER, v TEXT); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL "
                           "SELECT i + 1 FROM n WHERE i < 1050) INSERT INTO m SELECT i, 'v' || i FROM n;")
    s.connection("many", "many.db")
    s.query("everything", "SELECT id, v FROM m ORDER BY id", "many")
    r = s.get(q("everything"), params={"format": "parquet", "stream": "true"})
    assert r.status == 200 and r.headers["content-type"] == "application/vnd.apache.parquet"
    assert r.headers["content-disposition"] == 'attachment; filename="everything.parquet"'
    assert r.headers.get("transfer-encoding") == "chunked" and "x-row-count" not in r.headers
    meta = pq.ParquetFile(io.BytesIO(r.body))
    assert meta.metadata.num_row_groups == 11 and meta.metadata.num_rows == 1050
    assert _parquet(r.body) == [{"id": i, "v": f"v{i}"} for i in range(1, 1051)]
    s.query("nothing", "SELECT id, v FROM m WHERE id < 0", "many")
    none = s.get(q("nothing"), params={"format": "parquet", "stream": "true"})
    assert none.status == 200 and _parquet(none.body) == []
    history = s.get("/api/v1/queries/everything/history").json["items"]
    assert history[0]["rows"] == 1050 and history[0]["status"] == "success"


def test_cached_responses_keep_the_format_and_its_headers(make_server):
    s = make_server()
    s.query("cached_x", "SELECT id, name FROM t WHERE id <= 2 ORDER BY id", "lite", cache_ttl=60)
    first = s.get(q("cached_x"), params={"format": "xlsx"})
    second = s.get(q("cached_x"), params={"format": "xlsx"})
    assert first.status == second.status == 200
    assert second.headers.get("x-cache") == "HIT" and second.body == first.body
    assert second.headers["content-disposition"] == "attachment;filename=result.xlsx"
    assert second.headers["content-type"] == XLSX
    assert _xlsx(second.body) == [("id", "name"), (1, "row 1"), (2, "row 2")]
    yaml_reply = s.get(q("cached_x"), params={"format": "yaml"})
    assert yaml_reply.headers.get("x-cache") == "MISS" and yaml.safe_load(yaml_reply.body)[0] == {"id": 1, "name": "row 1"}


_PG_TYPES = ("SELECT true AS b, 1.10::numeric AS num, timestamp '2024-01-02 03:04:05.123456' AS ts, "
             "timestamptz '2024-01-02 03:04:05+02' AS tz, date '2024-01-02' AS d, time '03:04:05' AS t, "
             "'{\"a\": [1]}'::jsonb AS j, '\\x00ff'::bytea AS by, NULL::int AS nothing")


def test_postgres_values_in_every_document_format(server, pg_db):
    name = f"pgfmt_{pg_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db}).status == 201
    body = {"sql": _PG_TYPES, "connection_name": name}
    xml = server.post("/execute_sql", dict(body, format="xml"))
    assert xml.status == 200 and xml.body.startswith(b"<data><item><b>True</b><num>1.1</num>"
                                                     b"<ts>2024-01-02 03:04:05.123456</ts>")
    assert b"<j>{\"a\": [1]}</j>" in xml.body and xml.body.endswith(b"<nothing /></item></data>")
    loaded = yaml.safe_load(server.post("/execute_sql", dict(body, format="yaml")).body)[0]
    assert loaded["b"] is True and loaded["num"] == 1.1 and loaded["t"] == "03:04:05" and loaded["nothing"] is None
    assert loaded["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456) and loaded["d"] == dt.date(2024, 1, 2)
    header, row = _xlsx(server.post("/execute_sql", dict(body, format="xlsx")).body)
    cells = dict(zip(header, row))
    assert cells["b"] is True and cells["num"] == 1.1 and cells["t"] == dt.time(3, 4, 5)
    assert cells["tz"] == dt.datetime(2024, 1, 2, 1, 4, 5) and cells["j"] == '{"a": [1]}'
    got = _parquet(server.post("/execute_sql", dict(body, format="parquet")).body)[0]
    assert got["num"] == Decimal("1.10") and got["ts"] == dt.datetime(2024, 1, 2, 3, 4, 5, 123456)
    assert got["tz"].utcoffset() == dt.timedelta(0) and got["tz"].replace(tzinfo=None) == dt.datetime(2024, 1, 2, 1, 4, 5)
    assert (got["d"], got["t"], got["by"], got["nothing"]) == (dt.date(2024, 1, 2), dt.time(3, 4, 5), "00ff", None)


def test_mariadb_values_in_the_binary_formats(server, mysql_db):
    name = f"myfmt_{mysql_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "mysql", **mysql_db}).status == 201
    body = {"sql": "SELECT CAST(1.25 AS DECIMAL(6,2)) AS num, TIMESTAMP('2024-01-02 03:04:05') AS ts, "
                   "DATE('2024-01-02') AS d, 'x' AS s, NULL AS nothing", "connection_name": name}
    got = _parquet(server.post("/execute_sql", dict(body, format="parquet")).body)[0]
    assert got == {"num": Decimal("1.25"), "ts": dt.datetime(2024, 1, 2, 3, 4, 5), "d": dt.date(2024, 1, 2),
                   "s": "x", "nothing": None}
    header, row = _xlsx(server.post("/execute_sql", dict(body, format="xlsx")).body)
    assert dict(zip(header, row)) == {"num": 1.25, "ts": dt.datetime(2024, 1, 2, 3, 4, 5),
                                      "d": dt.datetime(2024, 1, 2), "s": "x", "nothing": None}
    assert server.post("/execute_sql", dict(body, format="xml")).body == (
        b"<data><item><num>1.25</num><ts>2024-01-02 03:04:05</ts><d>2024-01-02</d><s>x</s><nothing /></item></data>")
