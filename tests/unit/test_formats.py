"""The document formats (qag/formats.py) on their edges: names, types that mix, values beyond a column's type,
parquet streams in row groups, and a missing library refused as 500 format_unavailable before anything runs."""

from __future__ import annotations

import datetime as dt
import importlib
import io
from decimal import Decimal

import pytest

from qag import encode, formats
from qag.errors import QagError


def _needs(module: str):
    """`module` of the formats extra (PyYAML, pyarrow), which a format's test writes or reads back with."""
    return pytest.importorskip(module, reason="the formats extra (pip install 'qag[formats]')")


@pytest.mark.parametrize("column, tag", [("1 id", "_1_id"), ("a b<c>", "a_b_c_"), ("é.x-y", "é.x-y"),
                                         ("_ok", "_ok"), ("-x", "_-x"), ("", "_"),
                                         # \w takes these, XML names don't
                                         ("a²", "a_"), ("ª", "_"), ("µs", "_s"), ("x:y", "x_y")])
def test_xml_names(column, tag):
    assert formats.xml_name(column) == tag


def test_xml_repeated_columns_keep_every_value():
    assert encode.encode("xml", ["id", "id"], [(1, 2)]) == b"<data><item><id>1</id><id_2>2</id_2></item></data>"


def test_xml_is_well_formed_whatever_the_names_and_values():
    """Control characters, U+FFFE and lone surrogates can't be in an XML document even escaped, and names that
    sanitise alike must stay apart: the document parses and every value keeps its own element."""
    import xml.etree.ElementTree as ElementTree
    columns = ["a:b", "a b", "a²", "ª", "v"]
    values = ("a\x01b", "x\ufffey", "\ud800", "tab\tnl\ncr\r", "<&>\x00")
    root = ElementTree.fromstring(encode.encode("xml", columns, [values]))
    item = root.find("item")
    assert [child.tag for child in item] == ["a_b", "a_b_2", "a_", "_", "v"]
    assert [child.text for child in item] == ["a\ufffdb", "x\ufffdy", "\ufffd", "tab\tnl\ncr\n", "<&>\ufffd"]


def test_yaml_writes_a_time_of_day_as_text_and_decimal_nan_as_nan():
    _needs("yaml")
    body = encode.encode("yaml", ["t", "n", "d"], [(dt.time(3, 4, 5), Decimal("NaN"), Decimal("2.50"))])
    assert body == b"- t: 03:04:05\n  n: .nan\n  d: 2.5\n"


def _read(body: bytes):
    return _needs("pyarrow.parquet").read_table(io.BytesIO(body))


def test_parquet_columns_that_mix_types_are_text_and_numbers_widen():
    _needs("pyarrow.parquet")
    body = encode.encode("parquet", ["mixed", "num", "nulls"], [(1, 1, None), ("a", 2.5, None), (None, Decimal("3"), None)])
    table = _read(body)
    assert [str(f.type) for f in table.schema] == ["string", "double", "string"]
    assert table.to_pylist() == [{"mixed": "1", "num": 1.0, "nulls": None}, {"mixed": "a", "num": 2.5, "nulls": None},
                                 {"mixed": None, "num": 3.0, "nulls": None}]


def test_parquet_decimals_beyond_38_digits_make_a_text_column_not_nulls():
    """decimal128 holds 38 digits: a page's column with a wider value (MySQL DECIMAL(65,30), PostgreSQL numeric)
    is written as text, every value as JSON and csv give it; one within 38 digits stays decimal."""
    _needs("pyarrow.parquet")
    wide = Decimal("9" * 38 + ".5")
    table = _read(encode.encode("parquet", ["d", "ok"], [(Decimal("1.5"), Decimal("9" * 36 + ".5")), (wide, None),
                                                        (Decimal("9" * 40), Decimal("1"))]))
    assert [str(f.type) for f in table.schema] == ["string", "decimal128(38, 1)"]
    assert table.to_pylist() == [{"d": "1.5", "ok": Decimal("9" * 36 + ".5")}, {"d": "9" * 38 + ".5", "ok": None},
                                 {"d": "9" * 40, "ok": Decimal("1.0")}]
    # 38 digits in all, whichever side of the point: decimal; a value's scale is kept, never rounded
    table = _read(encode.encode("parquet", ["d"], [(Decimal("1E-38"),), (Decimal("0.5"),)]))
    assert str(table.schema[0].type) == "decimal128(38, 38)" and table.to_pylist()[0]["d"] == Decimal("1E-38")
    table = _read(encode.encode("parquet", ["d"], [(Decimal("1E-38"),), (Decimal("1.5"),)]))
    assert table.to_pylist() == [{"d": "1E-38"}, {"d": "1.5"}]


def test_parquet_integers_wider_than_64_bits_are_decimals_not_an_error():
    """MySQL's BIGINT UNSIGNED (18446744073709551615) and numeric arithmetic give integers int64 can't hold."""
    _needs("pyarrow.parquet")
    wide = 18446744073709551615
    table = _read(encode.encode("parquet", ["u", "m"], [(wide, -(10 ** 30)), (1, 2)]))
    assert [str(f.type) for f in table.schema] == ["decimal128(38, 0)", "decimal128(38, 0)"]
    assert table.to_pylist() == [{"u": Decimal(wide), "m": Decimal(-(10 ** 30))}, {"u": Decimal(1), "m": Decimal(2)}]
    # an int64 column that meets a wider integer later: the stream ends with an error, never a NULL
    stream = encode.StreamEncoder("parquet", ["i"], parquet_row_group=1)
    assert stream.chunk([(5,)])
    with pytest.raises(QagError) as raised:
        stream.chunk([(wide,)])
    assert raised.value.code == "invalid_stream" and "Column 'i'" in raised.value.message


def test_a_parquet_stream_keeps_its_first_types_for_later_batches():
    pq = _needs("pyarrow.parquet")
    stream = encode.StreamEncoder("parquet", ["id", "v"], parquet_row_group=2)
    parts = [stream.chunk([(1, "a")]), stream.chunk([(2, "b"), (3, 4)]), stream.chunk([(None, None)]), stream.finish()]
    assert parts[0] == b""                                  # one row held: not a row group yet
    table = pq.ParquetFile(io.BytesIO(b"".join(parts)))
    assert table.metadata.num_row_groups == 2                # four rows in groups of two
    assert table.read().to_pylist() == [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}, {"id": 3, "v": "4"},
                                        {"id": None, "v": None}]


def _streamed(columns: list, groups: list, row_group: int = 2) -> list:
    stream = encode.StreamEncoder("parquet", columns, parquet_row_group=row_group)
    body = b"".join([stream.chunk(rows) for rows in groups] + [stream.finish()])
    return _read(body).to_pylist()


@pytest.mark.parametrize("first, later, what", [
    ([(1,), (2,)], (2.5,), "a floating-point number"),                    # SQLite: integers, then a float
    ([(1,), (2,)], ("x",), "text"),                                       # ... then text
    ([(1.5,), (2.5,)], ("x",), "text"),
    ([(Decimal("1"),), (Decimal("2"),)], (Decimal("2.5"),), "decimal(38, 0) can't hold as"),   # would round to 3
    ([(Decimal("1.5"),), (Decimal("2"),)], (Decimal("9" * 38),), "decimal(38, 1) can't hold as"),
    ([(Decimal("1.5"),), (Decimal("2"),)], (Decimal("NaN"),), "a floating-point number"),
    ([(True,), (False,)], (1,), "an integer"),
    ([(dt.date(2024, 1, 2),), (None,)], (dt.datetime(2024, 1, 2, 3, 4),), "a timestamp without a time zone"),
    ([(dt.datetime(2024, 1, 2),), (None,)], (dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc),), "time zone"),
    ([(dt.time(1, 2),), (None,)], ("24:00:00",), "text"),                # PostgreSQL's own text of a time
])
def test_a_later_value_its_streams_column_type_cant_hold_ends_the_stream(first, later, what):
    """The first row group fixes the column types. A later value they can't hold as it is is never written as a
    NULL or rounded: 400 invalid_stream naming the column, the row and what it was (the body is cut)."""
    _needs("pyarrow.parquet")
    stream = encode.StreamEncoder("parquet", ["id", "c"], parquet_row_group=2)
    assert stream.chunk([(i, v[0]) for i, v in enumerate(first, 1)])
    with pytest.raises(QagError) as raised:
        stream.chunk([(3, later[0]), (4, None)])
    assert raised.value.code == "invalid_stream"
    assert raised.value.message.startswith("Column 'c' of this parquet stream can't hold the value in row 3 (")
    assert what in raised.value.message and "first 2 rows" in raised.value.message


def test_a_later_value_its_streams_column_type_holds_is_written_as_it_is():
    _needs("pyarrow.parquet")
    # decimal(38, 1): 3 and 4.50 are the same numbers at scale 1
    assert _streamed(["d"], [[(Decimal("1.5"),), (Decimal("2"),)], [(3,), (Decimal("4.50"),)]]) == [
        {"d": Decimal("1.5")}, {"d": Decimal("2.0")}, {"d": Decimal("3.0")}, {"d": Decimal("4.5")}]
    # a double column takes integers and decimals as a page's mixed column does
    assert _streamed(["f"], [[(1.5,), (2,)], [(3,), (Decimal("4.5"),)]]) == [
        {"f": 1.5}, {"f": 2.0}, {"f": 3.0}, {"f": 4.5}]
    # a text column (mixed, or only NULLs in the first group) takes anything as its text
    assert _streamed(["t"], [[(None,), (None,)], [(3,), (dt.date(2024, 1, 2),)]]) == [
        {"t": None}, {"t": None}, {"t": "3"}, {"t": "2024-01-02"}]
    # an aware timestamp in any zone is the same instant in UTC
    east = dt.timezone(dt.timedelta(hours=2))
    rows = _streamed(["z"], [[(dt.datetime(2024, 1, 2, tzinfo=dt.timezone.utc),), (None,)],
                             [(dt.datetime(2024, 1, 2, 5, tzinfo=east),)]])
    assert rows[2]["z"] == dt.datetime(2024, 1, 2, 3, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("fmt, package", [("yaml", "yaml"), ("xlsx", "xlsxwriter"), ("parquet", "pyarrow.parquet")])
def test_a_missing_library_is_format_unavailable_when_the_format_is_asked(monkeypatch, fmt, package):
    real = importlib.import_module

    def refuse(name, *args):
        if name == package:
            raise ImportError(f"No module named {name!r}")
        return real(name, *args)
    monkeypatch.setattr(formats.importlib, "import_module", refuse)
    with pytest.raises(QagError) as raised:
        encode.check_format(fmt.upper())
    assert raised.value.code == "format_unavailable" and raised.value.status == 500
    assert encode.check_format("xml") == "xml" and encode.check_format("csv") == "csv"


def _sheet_numbers(body: bytes) -> list[float]:
    import re
    import zipfile
    xml = zipfile.ZipFile(io.BytesIO(body)).read("xl/worksheets/sheet1.xml").decode()
    return [float(v) for v in re.findall(r"<c r=\"A\d+\"[^>]*><v>([^<]*)</v>", xml)]


@pytest.mark.parametrize("value, serial", [
    (dt.datetime(2024, 1, 1), 45292.0), (dt.date(2024, 1, 1), 45292.0), (dt.datetime(1900, 3, 1), 61.0),
    # Excel's 1900 date system counts a 1900-02-29 that never was: a day less before 1900-03-01, times of day too
    (dt.datetime(1900, 2, 28, 12), 59.5), (dt.datetime(1900, 1, 1, 8), 1 + 8 / 24), (dt.date(1900, 2, 28), 59.0),
    (dt.datetime(1900, 1, 1, 8, tzinfo=dt.timezone(dt.timedelta(hours=-8))), 1 + 16 / 24),
    # before the epoch, counted back from 1899-12-30 as spreadsheet readers read it (and QueryAPIGate 0.43 writes it)
    (dt.date(1000, 1, 1), -328716.0), (dt.datetime(1899, 12, 31), 0.0),
])
def test_xlsx_dates_are_excels_day_numbers(value, serial):
    _needs("xlsxwriter")
    assert _sheet_numbers(formats.encode_xlsx(["d"], [(value,)])) == [pytest.approx(serial, abs=1e-9)]


def test_yaml_drops_a_datetimes_zone_as_json_does():
    yaml = _needs("yaml")
    aware = dt.datetime(2024, 2, 29, 10, 34, 56, 123456, tzinfo=dt.timezone.utc)
    body = formats.encode_yaml(["t"], [(aware,)])
    assert body == b"- t: 2024-02-29 10:34:56.123456\n"
    assert yaml.safe_load(body) == [{"t": dt.datetime(2024, 2, 29, 10, 34, 56, 123456)}]


@pytest.mark.parametrize("value, serial", [
    # whole milliseconds: a microsecond before midnight stays on its day when read back
    (dt.datetime(2024, 5, 5, 23, 59, 59, 999999), 45417 + 86_399_999 / 86_400_000),
    # never past Excel's last moment, 9999-12-31 23:59:59.999 (PostgreSQL's 'infinity' is Python's latest time)
    (dt.datetime.max, 2958465 + 86_399_999 / 86_400_000),
    # a zoned time whose UTC time Python has no date for is its latest or earliest time, never a failed page
    (dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5))), 2958465 + 86_399_999 / 86_400_000),
    (dt.datetime(1, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))), -693593.0),
])
def test_xlsx_dates_at_the_edges(value, serial):
    _needs("xlsxwriter")
    assert _sheet_numbers(formats.encode_xlsx(["d"], [(value,)])) == [pytest.approx(serial, abs=1e-9)]


def test_parquet_takes_a_zoned_time_past_pythons_utc_range():
    _needs("pyarrow.parquet")
    import pyarrow.parquet as pq
    late = dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    soon = dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    table = pq.read_table(io.BytesIO(formats.encode("parquet", ["t"], [(late,), (soon,)])))
    got = [v.replace(tzinfo=None) for v in table.column("t").to_pylist()]
    assert got == [dt.datetime.max, dt.datetime(2024, 1, 2, 1, 4, 5)]


@pytest.mark.parametrize("text", ["a\x85b", "\u2028", "x\u2029y", "\x85"])
def test_yaml_text_holding_yamls_own_line_breaks_reads_back_the_same(text):
    """U+0085, U+2028 and U+2029 are line breaks to a YAML reader: PyYAML wrote them raw inside quotes, where they
    fold into a space; they are escaped instead."""
    yaml = _needs("yaml")
    body = formats.encode_yaml(["t"], [(text,)])
    assert yaml.safe_load(body) == [{"t": text}]


@pytest.mark.parametrize("text", ["1e3", "0o17", ".5e1", "TRUE", "Null", "+12", "-.inf", "0x1F", "~"])
def test_yaml_text_a_yaml_1_2_reader_would_take_for_a_value_is_quoted(text):
    yaml = _needs("yaml")
    body = formats.encode_yaml(["t"], [(text,)])
    assert f"t: '{text}'" in body.decode() and yaml.safe_load(body) == [{"t": text}]
    assert formats.encode_yaml(["t"], [("plain words",)]).decode() == "- t: plain words\n"
