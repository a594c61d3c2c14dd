"""The MySQL reply readers (qag._speedups myresult): both twins give mysqlclient's own columns, rows and errors.

Differential, on the real MariaDB: a table with a column of every type (integers at their extremes, decimals,
floats, BIT, YEAR, dates with zero dates, TIME, ENUM/SET, JSON, text in utf8mb4, latin1 and binary, blobs),
filled by hypothesis with NULLs, empty strings, binary data and extreme numbers, is read by each twin's Reader
and by mysqlclient's own cursor (the reference: its description names and fetchall rows, sliced by skip and
count) on connections opened as qag opens them (qag's converter map). Compared by repr, so a value's type, a
Decimal's exponent and a float's bits count. Also: connection encodings other than utf8, raw text that can't be
decoded, a converter map entry the compiled twin can't table, CALL's further result sets, and the errors a
reply can fail with while it is read (a server error mid-reply, a connection cut mid-reply)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import secrets
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag import _speedups
from tests.services import MYSQL, mysql_admin
from tests.speedups.conftest import call_outcome, compiled_or_skip, other_thread_steps

MySQLdb = pytest.importorskip("MySQLdb")
from MySQLdb.constants import FIELD_TYPE, FLAG  # noqa: E402

from qag.backends.mysql import conversions, connect_args, mapped  # noqa: E402

# (column, definition, values): every column is nullable, so each strategy also draws NULL.
_TEXT = st.text(max_size=20)
_LATIN = st.text(st.characters(max_codepoint=255, exclude_categories=("Cs",)), max_size=20)


def _time_text(seconds: int, micros: int) -> str:
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    return f"{sign}{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}.{micros:06d}"


def _datetime_text(moment: dt.datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f").rjust(26, "0")


_ZERO_DATES = st.sampled_from(["0000-00-00", "2020-00-10", "2020-05-00"])
COLUMNS = [
    ("c_tiny", "TINYINT", st.integers(-128, 127)),
    ("c_utiny", "TINYINT UNSIGNED", st.integers(0, 255)),
    ("c_small", "SMALLINT", st.integers(-(2 ** 15), 2 ** 15 - 1)),
    ("c_medium", "MEDIUMINT", st.integers(-(2 ** 23), 2 ** 23 - 1)),
    ("c_int", "INT", st.integers(-(2 ** 31), 2 ** 31 - 1)),
    ("c_big", "BIGINT", st.integers(-(2 ** 63), 2 ** 63 - 1)),
    ("c_ubig", "BIGINT UNSIGNED", st.integers(0, 2 ** 64 - 1)),
    ("c_dec", "DECIMAL(20,6)", st.decimals(-(10 ** 14) + 1, 10 ** 14 - 1, places=6)),
    ("c_dec65", "DECIMAL(65,30)", st.decimals(-(10 ** 35) + 1, 10 ** 35 - 1, places=30)),
    ("c_float", "FLOAT", st.floats(allow_nan=False, allow_infinity=False, width=32)),
    ("c_double", "DOUBLE", st.floats(allow_nan=False, allow_infinity=False)),
    ("c_bit1", "BIT(1)", st.integers(0, 1)),
    ("c_bit64", "BIT(64)", st.integers(0, 2 ** 64 - 1)),
    ("c_year", "YEAR", st.one_of(st.just(0), st.integers(1901, 2155))),
    ("c_date", "DATE", st.one_of(st.dates(dt.date(1000, 1, 1)).map(str), _ZERO_DATES)),
    ("c_datetime", "DATETIME(6)", st.one_of(
        st.datetimes(dt.datetime(1000, 1, 1)).map(_datetime_text), _ZERO_DATES.map(lambda d: d + " 00:00:00"))),
    ("c_datetime0", "DATETIME", st.datetimes(dt.datetime(1000, 1, 1)).map(lambda m: m.strftime("%Y-%m-%d %H:%M:%S"))),
    ("c_stamp", "TIMESTAMP(6) NULL", st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 18)).map(
        _datetime_text)),
    ("c_time", "TIME(6)", st.builds(_time_text, st.integers(-838 * 3600 - 3599, 838 * 3600 + 3598),
                                    st.integers(0, 999999))),
    ("c_char", "CHAR(20) CHARACTER SET utf8mb4", _TEXT),
    ("c_varchar", "VARCHAR(40) CHARACTER SET utf8mb4", _TEXT),
    ("c_varchar_bin", "VARCHAR(40) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin", _TEXT),
    ("c_latin", "VARCHAR(40) CHARACTER SET latin1", _LATIN),
    ("c_text", "TEXT CHARACTER SET utf8mb4", _TEXT),
    ("c_binary", "BINARY(8)", st.binary(max_size=8)),
    ("c_varbinary", "VARBINARY(40)", st.binary(max_size=40)),
    ("c_blob", "BLOB", st.binary(max_size=60)),
    ("c_tinyblob", "TINYBLOB", st.binary(max_size=30)),
    ("c_enum", "ENUM('a','b','é','')", st.sampled_from(["a", "b", "é", ""])),
    ("c_set", "SET('x','y','z')", st.sets(st.sampled_from(["x", "y", "z"])).map(",".join)),
    ("c_json", "JSON", st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                                    lambda inner: st.lists(inner, max_size=3), max_leaves=5).map(json.dumps)),
]
ROWS = st.lists(st.tuples(*[st.one_of(st.none(), values) for _, _, values in COLUMNS]), max_size=5)


@pytest.fixture(scope="module")
def database():
    pytest.importorskip("MySQLdb")
    admin = mysql_admin()
    name = "qag_t_myresult_" + secrets.token_hex(4)
    cur = admin.cursor()
    cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    cur.execute(f"CREATE TABLE `{name}`.t (id INT PRIMARY KEY, "
                + ", ".join(f"{column} {definition}" for column, definition, _ in COLUMNS) + ")")
    cur.execute(f"CREATE PROCEDURE `{name}`.two() BEGIN SELECT 1 AS one; SELECT 'two' AS two; END")
    cur.execute("SET SESSION sql_mode = '', time_zone = '+00:00'")   # zero dates and out-of-charset text stored
    try:
        yield admin, name
    finally:
        admin.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        admin.close()


def _connect(database: str):
    """A connection opened as qag opens one (its connect arguments and converter map)."""
    fields = {"host": MYSQL["host"], "port": MYSQL["port"], "user": MYSQL["user"], "password": MYSQL["password"],
              "database": database}
    return MySQLdb.connect(**connect_args(fields, True), conv=conversions())


@contextlib.contextmanager
def _latin_bytes_as_they_are(database, values: dict[int, str]):
    """Rows of t's latin1 column (id -> its SQL value), and a connection with character_set_results NULL, so the
    server sends their bytes as they are (no conversion to the connection's utf8); rows and connection gone after."""
    admin, name = database
    admin.cursor().execute(f"INSERT INTO `{name}`.t (id, c_latin) VALUES "
                           + ", ".join(f"({i}, {value})" for i, value in values.items())
                           + " ON DUPLICATE KEY UPDATE c_latin = VALUES(c_latin)")
    c = _connect(name)
    try:
        c.query(b"SET character_set_results = NULL")
        yield c
    finally:
        c.close()
        admin.cursor().execute(f"DELETE FROM `{name}`.t WHERE id IN ({', '.join(map(str, values))})")


@pytest.fixture(scope="module")
def conn(database):
    c = _connect(database[1])
    c.query(b"SET SESSION time_zone = '+00:00'")
    yield c
    c.close()


@pytest.fixture(scope="module")
def readers():
    """(pure Reader class, compiled Reader class)."""
    return _speedups.twin("myresult", "pure").Reader, compiled_or_skip("myresult").Reader


def _reference(conn, sql: bytes, skip: int, count: int):
    """mysqlclient's own reading: its cursor's description names and rows."""
    cursor = conn.cursor()
    cursor.execute(sql)
    columns = [d[0] for d in cursor.description] if cursor.description else []
    rows = list(cursor.fetchall())
    cursor.close()
    return columns, rows[skip:skip + count] if count else rows[skip:]


def _each(conn, readers, sql: bytes, skip: int, count: int) -> list:
    """What each twin's Reader gives (or raises) for the statement, then mysqlclient's cursor."""
    outcomes = []
    for reader in readers:
        def read():
            conn.query(sql)
            return reader(conn).read(skip, count)
        outcomes.append(repr(call_outcome(read)))
    return outcomes


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=ROWS, skip=st.integers(0, 6), count=st.integers(0, 6))
def test_every_column_type_as_mysqlclient_reads_it(database, conn, readers, rows, skip, count):
    admin, name = database
    cur = admin.cursor()
    cur.execute(f"DELETE FROM `{name}`.t")
    if rows:
        holes = ", ".join(["%s"] * (len(COLUMNS) + 1))
        cur.executemany(f"INSERT INTO `{name}`.t VALUES ({holes})", [(i, *row) for i, row in enumerate(rows)])
    sql = b"SELECT * FROM t ORDER BY id"
    pure, compiled = _each(conn, readers, sql, skip, count)
    assert compiled == pure
    assert pure == repr(("ok", _reference(conn, sql, skip, count)))


# --- read_page: a page's JSON written from the reply's text (the compiled twin) or by rowjson from the rows ---------
# The columns whose kinds the compiled twin writes itself, with values around each kind's edges: text with quotes,
# backslashes, control and non-ASCII characters, ZEROFILL and YEAR 0000 integers, zero dates and impossible days,
# decimals at their precision. Every value the twin can't write as its text sends the page to rowjson.
_ASCII = st.text(st.characters(min_codepoint=0, max_codepoint=127, exclude_categories=("Cs",)), max_size=12)
DIRECT = [
    ("d_tiny", "TINYINT", st.integers(-128, 127)),
    ("d_int", "INT", st.integers(-(2 ** 31), 2 ** 31 - 1)),
    ("d_big", "BIGINT", st.integers(-(2 ** 63), 2 ** 63 - 1)),
    ("d_ubig", "BIGINT UNSIGNED", st.integers(0, 2 ** 64 - 1)),
    ("d_zero", "INT(5) ZEROFILL", st.integers(0, 99999)),
    ("d_year", "YEAR", st.one_of(st.just(0), st.integers(1901, 2155))),
    ("d_dec", "DECIMAL(12,2)", st.decimals(-(10 ** 10) + 1, 10 ** 10 - 1, places=2)),
    ("d_dec4", "DECIMAL(4,4)", st.decimals(-1, 1, places=4).filter(lambda d: abs(d) < 1)),
    ("d_dec65", "DECIMAL(65,30)", st.decimals(-(10 ** 35) + 1, 10 ** 35 - 1, places=30)),
    ("d_date", "DATE", st.one_of(st.dates(dt.date(1000, 1, 1)).map(str), _ZERO_DATES)),
    ("d_datetime", "DATETIME", st.one_of(st.datetimes(dt.datetime(1000, 1, 1)).map(
        lambda m: m.strftime("%Y-%m-%d %H:%M:%S")), _ZERO_DATES.map(lambda d: d + " 12:00:00"))),
    ("d_datetime3", "DATETIME(3)", st.datetimes(dt.datetime(1000, 1, 1)).map(lambda m: _datetime_text(m)[:23])),
    ("d_stamp", "TIMESTAMP(6) NULL", st.datetimes(dt.datetime(1970, 1, 2), dt.datetime(2038, 1, 18)).map(
        _datetime_text)),
    ("d_char", "CHAR(12) CHARACTER SET utf8mb4", st.one_of(_ASCII, _TEXT)),
    ("d_varchar", "VARCHAR(40) CHARACTER SET utf8mb4", st.one_of(_ASCII, _TEXT)),
    ("d_latin", "VARCHAR(20) CHARACTER SET latin1", st.one_of(_ASCII, _LATIN)),
]
# A row of values every direct kind writes as its text.
PLAIN_ROW = (7, -2147483648, 9223372036854775807, 18446744073709551615, None, 2024, "-12.50", "0.0001",
             "123456789012345678901234567890.000000000000000000000000000001", "2024-02-29", "1999-12-31 23:59:59",
             "2000-01-01 00:00:00.125", "2020-06-01 12:30:45.000001", "a 'b' ~", "", "Zz09 !#$%&()*+,-./:;<=>?@[]^_`{|}")
# One value at a time that isn't its JSON's text, each in a column whose kind the twin writes.
NOT_AS_TEXT = [("d_zero", 42), ("d_year", 0), ("d_date", "0000-00-00"), ("d_date", "2021-02-29"),
               ("d_datetime", "2020-00-10 12:00:00")]
# Text to escape, which the twin writes itself on a UTF-8 connection.
ESCAPED = [("d_char", 'say "hi"'), ("d_varchar", "back\\slash"), ("d_varchar", "tab\there\r\n\b\f"),
           ("d_varchar", "\x00\x01\x1f\x7f"), ("d_varchar", "é€\u2028"), ("d_latin", "ÿ\x80"), ("d_varchar", "😀x😀")]


@pytest.fixture(scope="module")
def direct_table(database):
    admin, name = database
    admin.cursor().execute(f"CREATE TABLE `{name}`.d (id INT PRIMARY KEY, "
                           + ", ".join(f"{column} {definition}" for column, definition, _ in DIRECT) + ")")
    return admin, name


def _fill(admin, name: str, rows) -> None:
    cur = admin.cursor()
    cur.execute(f"DELETE FROM `{name}`.d")
    if rows:
        holes = ", ".join(["%s"] * (len(DIRECT) + 1))
        cur.executemany(f"INSERT INTO `{name}`.d VALUES ({holes})", [(i, *row) for i, row in enumerate(rows)])


def _pages(conn, readers, sql: bytes, skip: int, count: int, json_rows: int) -> list:
    """Each twin's read_page, then mysqlclient's cursor as the reference: (columns, page bytes, rows fetched), the
    page bytes rowjson's encoding of the first json_rows rows where a twin gave rows."""
    from qag._speedups import rowjson     # the pure encoder: the reference of both twins' pages
    outcomes = []
    for reader in readers:
        conn.query(sql)
        columns, rows, page, fetched = reader(conn).read_page(skip, count, json_rows)
        assert (rows is None) == (page is not None)
        outcomes.append((columns, page if page is not None else rowjson.encode_json(columns, rows[:json_rows]),
                         fetched, page is not None))
    columns, rows = _reference(conn, sql, skip, count)
    outcomes.append((columns, rowjson.encode_json(columns, rows[:json_rows]), len(rows)))
    return outcomes


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(*[st.one_of(st.none(), values) for _, _, values in DIRECT]), max_size=5),
       skip=st.integers(0, 6), count=st.integers(0, 6), json_rows=st.integers(1, 6))
def test_read_page_json_is_rowjsons_of_the_rows(direct_table, conn, readers, rows, skip, count, json_rows):
    admin, name = direct_table
    _fill(admin, name, rows)
    pure, compiled, reference = _pages(conn, readers, b"SELECT * FROM d ORDER BY id", skip, count, json_rows)
    assert not pure[3]                          # the pure twin leaves the JSON to rowjson
    assert pure[:3] == compiled[:3] == reference


def test_read_page_writes_text_of_every_direct_kind_and_hands_anything_else_to_rowjson(direct_table, conn, readers):
    admin, name = direct_table
    _fill(admin, name, [PLAIN_ROW, (None,) * len(DIRECT), PLAIN_ROW])
    sql = b"SELECT * FROM d ORDER BY id"
    for skip, count, json_rows in ((0, 0, 3), (0, 3, 2), (1, 2, 1), (2, 5, 5)):
        pure, compiled, reference = _pages(conn, readers, sql, skip, count, json_rows)
        assert compiled[3], "the compiled twin wrote this page itself"
        assert pure[:3] == compiled[:3] == reference
    names = [column for column, _, _ in DIRECT]
    for column, value in NOT_AS_TEXT + ESCAPED:
        row = list(PLAIN_ROW)
        row[names.index(column)] = value
        admin.cursor().execute("SET SESSION sql_mode = ''")
        _fill(admin, name, [PLAIN_ROW, tuple(row)])
        pure, compiled, reference = _pages(conn, readers, sql, 0, 0, 2)
        assert compiled[3] == ((column, value) in ESCAPED), f"{column}={value!r}"
        assert pure[:3] == compiled[:3] == reference
        # The value past the page (the look for has_more) is never written: the page still is.
        pure, compiled, reference = _pages(conn, readers, sql, 0, 2, 1)
        assert compiled[3] and pure[:3] == compiled[:3] == reference


RAW_TEXT = [b"\xc3\xa9", b"\xf0\x9f\x98\x80", b"\xef\xbf\xbf", b"\xf4\x8f\xbf\xbf", b"\xe0\xa0\x80", b"a\x00b",
            b"\xc0\x80", b"\xc1\xbf", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf0\x8f\xbf\xbf",
            b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xe2\x82", b"\xe2\x82\x41", b"\x80", b"\xff", b"ok\xc3"]


@pytest.mark.parametrize("raw", RAW_TEXT)
def test_read_page_reads_text_bytes_as_pythons_strict_utf8_decoder(database, readers, raw):
    # character_set_results NULL: a latin1 column's bytes come as they are, so any byte sequence reaches the reader
    # as text of the UTF-8 connection: well-formed UTF-8 is written escaped; overlong forms, surrogates, code points
    # past U+10FFFF and cut sequences fail as Python's decoder fails (read() raises; so must the page).
    from qag._speedups import rowjson
    with _latin_bytes_as_they_are(database, {1003: f"x'{raw.hex()}'"}) as c:
        outcomes, written = [], []
        for reader in readers:
            def page():
                c.query(b"SELECT id, c_latin FROM t WHERE id = 1003")
                columns, rows, json, fetched = reader(c).read_page(0, 0, 1)
                written.append(json is not None)
                return json if json is not None else rowjson.encode_json(columns, rows)
            outcomes.append(repr(call_outcome(page)))
        assert outcomes[0] == outcomes[1]
        assert ("UnicodeDecodeError" in outcomes[0]) != _decodes(raw)
        # Each well-formed one the compiled twin wrote itself; none of the others made a page.
        assert written == ([False, True] if _decodes(raw) else [])


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("names", ["latin1", "koi8r"])
def test_read_page_on_a_connection_that_is_not_utf8(database, readers, names):
    # Text is decoded by another codec there: only plain ASCII is written; the rest goes to rowjson.
    c = _connect(database[1])
    try:
        c.set_character_set(names)
        for sql, written in ((b"SELECT 'plain' AS t, 1 AS n", True), (b"SELECT 'caf\xe9' AS t, 1 AS n", False)):
            pure, compiled, reference = _pages(c, readers, sql, 0, 0, 1)
            assert compiled[3] == written and pure[:3] == compiled[:3] == reference
    finally:
        c.close()


def test_read_page_fails_as_read_does_when_the_row_past_the_page_does_not_decode(database, readers):
    # character_set_results NULL: the server sends latin1 bytes as they are, which utf8 can't decode; the row
    # after the page is read for has_more, so both twins' pages fail as read() does.
    with _latin_bytes_as_they_are(database, {1001: "'abc'", 1002: "'é'"}) as c:
        outcomes = []
        for reader in readers:
            def read():
                c.query(b"SELECT id, c_latin FROM t WHERE id IN (1001, 1002) ORDER BY id")
                return reader(c).read_page(0, 2, 1)
            outcomes.append(repr(call_outcome(read)))
        assert outcomes[0] == outcomes[1] and "UnicodeDecodeError" in outcomes[0]


DECIMALS = ["0", "-0", "0.00", "-0.00", "12.50", "-12.50", "100.00", "0.0001", "0.00001", "-0.5", "10.05", "123",
            "999999999999999", "9999999999999999", "1000000000000000", "10000000000000000", "123456789012345.6",
            "0.1", "0.3", "2.675", "1.0000000000000002", "0.000123456789012345", "1e-30", "-99999999999999999.99"]


@pytest.mark.parametrize("places", [0, 2, 17, 30])
def test_read_page_decimals_as_rowjson_writes_their_floats(conn, readers, places):
    # Each value at each scale: the digits rowjson's repr(float(Decimal)) keeps, exponents, signed zeros, and
    # the values past 15 significant digits that go through CPython's strtod and repr.
    columns = ", ".join(f"CAST('{value}' AS DECIMAL(65,{places})) AS d{i}" for i, value in enumerate(DECIMALS))
    pure, compiled, reference = _pages(conn, readers, f"SELECT {columns}".encode(), 0, 0, 1)
    assert compiled[3] and pure[:3] == compiled[:3] == reference


@pytest.mark.parametrize("expression", [b"1.5e0", b"CAST(1.5 AS FLOAT)", b"b'101'", b"x'00ff'",
                                        b"CAST('01:02:03' AS TIME)", b"CAST('a' AS BINARY)"])
def test_read_page_of_columns_no_direct_kind_covers(database, conn, readers, expression):
    # A double, a float, bits, bytes, a TIME: rows, as read() makes them, for rowjson, beside a column it writes.
    sql = b"SELECT 1 AS one, " + expression + b" AS other"
    pure, compiled, reference = _pages(conn, readers, sql, 0, 0, 1)
    assert not compiled[3] and pure[:3] == compiled[:3] == reference


def test_read_page_column_names(conn, readers):
    # Duplicate names are made unique as rowjson makes them; a name that needs escaping goes to rowjson.
    for sql, written in ((b"SELECT 1 AS `dup`, 2 AS `dup`, 3 AS `dup_2`", True), (b'SELECT 1 AS `a"b`', False),
                         (b"SELECT 1 AS `\xc3\xa9`", False)):
        pure, compiled, reference = _pages(conn, readers, sql, 0, 0, 1)
        assert compiled[3] == written and pure[:3] == compiled[:3] == reference


def test_read_page_of_no_rows_and_no_result_set(conn, readers):
    for reader in readers:
        conn.query(b"SELECT 1 AS one FROM DUAL WHERE 1 = 0")
        assert reader(conn).read_page(0, 0, 5) == (["one"], [], None, 0)
        conn.query(b"DO 1")
        assert reader(conn).read_page(0, 0, 5) == ([], [], None, 0)
        conn.query(b"CALL two()")
        assert reader(conn).read_page(0, 0, 5)[::2] == (["one"], b'[{"one":1}]\n' if reader is readers[1] else None)
        conn.query(b"SELECT 3 AS three")
        assert reader(conn).read(0, 0) == (["three"], [(3,)])   # CALL's further result sets were read


EXPRESSIONS = (
    "SELECT 18446744073709551615 AS u, -9223372036854775808 AS s, 1e308 AS big, -1e-308 AS small, "
    "0.000000000000000000000000000001 AS tiny_dec, 99999999999999999999999999999999999.999999999999999999999999999999"
    " AS huge_dec, '' AS empty, CAST('' AS BINARY) AS empty_bytes, NULL AS nothing, _latin1 x'e9' AS latin, "
    "CONVERT('é' USING latin1) AS converted, x'00ff00' AS raw, b'1011' AS bits, ST_GeomFromText('POINT(1 2)') AS "
    "place, CAST('-838:59:59' AS TIME) AS t_min, CAST('0000-00-00' AS DATE) AS zero, 'x' AS `dup`, 'y' AS `dup`, "
    "'é€😀' AS `naïve name`, 007 AS lead_zero, -0 AS neg_zero, YEAR('2155-01-01') AS y"
).encode()   # in the connection charset: the same bytes for every reader


@pytest.mark.parametrize("names", ["utf8mb4", "latin1", "binary", "koi8r"])
def test_expressions_in_each_connection_charset(database, readers, names):
    c = _connect(database[1])
    try:
        c.query(b"SET sql_mode = ''")
        c.set_character_set(names) if names != "binary" else c.query(b"SET NAMES binary")
        pure, compiled = _each(c, readers, EXPRESSIONS, 0, 0)
        assert compiled == pure
        if names != "binary":   # SET NAMES binary: mysqlclient looks up a codec "binary" and raises LookupError
            assert pure == repr(("ok", _reference(c, EXPRESSIONS, 0, 0)))
    finally:
        c.close()


def test_raw_text_that_does_not_decode(database, readers):
    # The latin1 bytes as they are, which utf8 can't decode.
    with _latin_bytes_as_they_are(database, {1000: "'é'"}) as c:
        pure, compiled = _each(c, readers, b"SELECT c_latin FROM t WHERE id = 1000", 0, 0)
        assert compiled == pure and "UnicodeDecodeError" in pure


def test_a_converter_entry_resolved_per_column(database, readers):
    # An int mask other than BINARY_FLAG: the compiled twin can't table it and resolves it per column, by
    # mysqlclient's rule (NOT NULL columns as bytes, the others as str here).
    c = _connect(database[1])
    try:
        c.converter[FIELD_TYPE.VAR_STRING] = [(FLAG.NOT_NULL, bytes), "not a pair", (None, str)]
        sql = b"SELECT 'a' AS not_null, CAST(NULL AS CHAR) AS nullable, IF(RAND() < 2, 'b', NULL) AS maybe"
        pure, compiled = _each(c, readers, sql, 0, 0)
        assert compiled == pure and "b'a'" in pure
    finally:
        c.close()


def test_a_value_repeated_down_a_column_is_read_once_when_immutable(database, readers):
    """A join's rows repeat its parent's columns: the compiled twin gives the next row the same object when the text
    is the same and the value immutable (a Decimal, a datetime, a str), and a new one otherwise: a converter whose
    value could be changed (a list here) is called for each row, so no caller can tell rows apart by sharing."""
    sql = ("SELECT CAST(1.50 AS DECIMAL(10,2)) AS amount, 'same' AS label, CAST('2024-01-02 03:04:05' AS DATETIME) "
           "AS moment, IF(seq = 3, NULL, 'x') AS gap, IF(seq < 3, 'é', 'e') AS accent, seq FROM seq_1_to_5").encode()
    c = _connect(database[1])
    try:
        pure, compiled = _each(c, readers, sql, 0, 0)
        assert compiled == pure and pure.startswith("('ok'") and "Decimal('1.50')" in pure
        c.query(sql)
        _, rows = readers[1](c).read(0, 0)
        assert all(rows[0][i] is rows[4][i] for i in range(3))           # the same text: one object each
        assert rows[0][3] is rows[1][3] is rows[3][3] and rows[2][3] is None   # across a NULL too
        assert rows[1][4] == "é" and rows[2][4] == "e" and rows[2][4] is rows[4][4]
        c.converter[FIELD_TYPE.NEWDECIMAL] = lambda text: [text]
        pure, compiled = _each(c, readers, sql, 0, 0)
        assert compiled == pure and "['1.50']" in pure
        c.query(sql)
        _, rows = readers[1](c).read(0, 0)
        assert rows[0][0] == rows[1][0] and rows[0][0] is not rows[1][0]
    finally:
        c.close()


def test_call_reads_every_result_set_and_leaves_the_connection_ready(conn, readers):
    for reader in readers:
        conn.query(b"CALL two()")
        assert reader(conn).read(0, 0) == (["one"], [(1,)])
        conn.query(b"SELECT 3 AS three")
        assert reader(conn).read(0, 0) == (["three"], [(3,)])


def test_statements_without_a_result_set(database, conn, readers):
    for reader in readers:
        conn.query(b"DO 1")
        assert reader(conn).read(0, 0) == ([], [])
        conn.query(b"SELECT 1 FROM DUAL WHERE 1 = 0")
        assert reader(conn).read(0, 0) == (["1"], [])


@pytest.mark.parametrize("skip, count", [(2 ** 31, 0), (0, 2 ** 31), (-1, 0), (0, -1), (1.0, 0)])
def test_skip_and_count_outside_mysqlclients_int_range(conn, readers, skip, count):
    pure, compiled = _each(conn, readers, b"SELECT 1 UNION SELECT 2", skip, count)
    assert compiled == pure


def test_a_server_error_mid_reply(conn, readers):
    # The rows have started when the subquery returns a second row: the error comes while the reply is read.
    sql = b"SELECT seq, (SELECT 1 UNION SELECT seq = 3) AS x FROM seq_1_to_5"
    pure, compiled = _each(conn, readers, sql, 0, 0)
    assert compiled == pure and "1242" in pure
    conn.query(b"SELECT 1")
    assert readers[1](conn).read(0, 0) == (["1"], [(1,)])


def test_a_connection_cut_mid_reply(database, readers):
    # As the watchdog cuts a call: the socket shut while the rows are still coming. Same exception, same QagError.
    raised = []
    for reader in readers:
        c = _connect(database[1])
        try:
            c.query(b"SELECT REPEAT('x', 1000000) FROM seq_1_to_30")
            _shut(c.fileno())
            with pytest.raises(MySQLdb.OperationalError) as failure:
                reader(c).read(0, 0)
            raised.append(failure.value)
        finally:
            c.close()
    _same_cut_failure(raised)


@pytest.mark.parametrize("spin", [0.0, 0.05])
def test_a_connection_cut_while_the_reply_is_awaited(database, readers, spin):
    # As the watchdog cuts a call that waits for its first packet: the compiled twin's own poll() on the socket ends
    # with the cut, and its read fails as mysqlclient's read_query_result does. Same exception, same QagError.
    raised = []
    for reader_class in readers:
        c = _connect(database[1])
        try:
            reader = reader_class(c, spin)
            cut = threading.Timer(0.2, lambda fd=c.fileno(): _shut(fd))
            cut.start()
            started = time.monotonic()
            with pytest.raises(MySQLdb.OperationalError) as failure:
                reader.query(b"SELECT SLEEP(5) AS slept", time.monotonic() + 30)
            assert time.monotonic() - started < 3    # ended by the cut, not by the statement
            cut.join()
            raised.append(failure.value)
        finally:
            c.close()
    _same_cut_failure(raised)


def _shut(fd: int) -> None:
    """Shut a connection's socket both ways, as the watchdog does (its descriptor stays its owner's)."""
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    finally:
        sock.detach()


def _same_cut_failure(raised: list) -> None:
    """Both twins raised mysqlclient's error for a lost connection (2013), which qag maps alike."""
    pure, compiled = raised
    assert (type(compiled), compiled.args) == (type(pure), pure.args) and pure.args[0] == 2013
    assert mapped(compiled, None, None).__dict__ == mapped(pure, None, None).__dict__
    assert mapped(pure, None, None).code == "connection_failed"


@pytest.mark.parametrize("statement", [b"SELECT 1 AS one", "SELECT 'é' AS text"])
def test_a_query_on_a_closed_connection_and_a_text_statement(database, readers, statement):
    # The compiled twin sends with the client library only for bytes on an open connection; otherwise mysqlclient's
    # send_query decides, with its errors: both twins answer alike.
    for closed in (False, True):
        outcomes = []
        for reader_class in readers:
            c = _connect(database[1])
            reader = reader_class(c, 0.0)
            if closed:
                c.close()

            def one():
                reader.query(statement)
                return reader.read(0, 0)
            outcomes.append(call_outcome(one))
            if not closed:
                c.close()
        pure, compiled = outcomes
        assert compiled == pure
        assert pure[0] == ("raised" if closed else "ok")


# Statements whose replies repeat or differ from the one before in a name (same length), a type, a flag, a charset
# or a column count: one Reader reads a sequence of them (the compiled twin reuses the last reply's plan only
# when its fields are the same).
SEQUENCE = [b"SELECT 1 AS ab, 'x' AS cd", b"SELECT 1 AS ab, 'x' AS ce", b"SELECT 1 AS ab, x'78' AS cd",
            b"SELECT 1.5 AS ab, 'x' AS cd", b"SELECT 1 AS ab", b"SELECT 1 AS ab, 'x' AS cd, NULL AS ef",
            b"SELECT CAST(1 AS UNSIGNED) AS ab, 'x' AS cd", b"SELECT 1 AS ab, _latin1'x' COLLATE latin1_bin AS cd",
            b"SET NAMES latin1", b"SET NAMES utf8mb4", b"SELECT 1 AS `\xc3\xa9`, 'x' AS cd", b"DO 1"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.lists(st.sampled_from(SEQUENCE), min_size=1, max_size=12))
def test_one_reader_over_many_statements(database, readers, order):
    outcomes = []
    for reader_class in readers:
        c = _connect(database[1])
        try:
            reader, seen = reader_class(c), []
            for sql in order:
                c.query(sql)
                seen.append(repr(reader.read(0, 0)))
            outcomes.append(seen)
        finally:
            c.close()
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("spin", [0.0, 0.002, 1.0])
def test_query_sends_and_waits_as_mysqlclient_does(database, readers, spin):
    """Reader.query (spinning first in the compiled twin when told to; the pure twin ignores `spin`) leaves the reply
    as mysqlclient's query leaves it: the same rows, errors and CALL result sets, one statement after another."""
    statements = [b"SELECT seq, seq * 2 AS twice FROM seq_1_to_3000", b"SELECT SLEEP(0.01) AS slept",
                  b"CALL two()", b"SELECT no_such_column", b"DO 1", b"SELECT 'after' AS next"]
    outcomes = []
    for reader_class in readers:
        c = _connect(database[1])
        try:
            reader = reader_class(c, spin)

            def one(sql):
                reader.query(sql, time.monotonic() + 30)
                return reader.read(0, 0)
            outcomes.append([call_outcome(one, sql) for sql in statements])
        finally:
            c.close()
    pure, compiled = outcomes
    assert compiled == pure
    assert pure[0][0] == "ok" and pure[3][:2] == ("raised", MySQLdb.OperationalError) and pure[5][0] == "ok"


def test_a_spin_never_passes_the_deadline(database, readers):
    """A spin longer than what is left of the call's deadline stops at the deadline; the reply is then slept for,
    as mysqlclient waits (the watchdog, not the reader, ends a call past its deadline)."""
    c = _connect(database[1])
    try:
        reader = readers[1](c, 5.0)
        cpu = time.thread_time()
        reader.query(b"SELECT SLEEP(0.5) AS slept", time.monotonic() + 0.1)
        assert reader.read(0, 0) == (["slept"], [(0,)])
        assert time.thread_time() - cpu < 0.3                       # spun 0.1 s of the 0.5 s wait, not all of it
    finally:
        c.close()


def test_the_wait_lets_other_threads_run(database, readers):
    """The interpreter lock is free while a query spins and while it sleeps."""
    c = _connect(database[1])
    try:
        with other_thread_steps() as seen:
            reader = readers[1](c, 0.1)
            started = time.monotonic()
            reader.query(b"SELECT SLEEP(0.5) AS slept")
            assert reader.read(0, 0) == (["slept"], [(0,)])
    finally:
        c.close()
    assert any(started + 0.02 < t < started + 0.08 for t in seen)      # while it spun
    assert any(started + 0.15 < t < started + 0.45 for t in seen)      # while it slept


def test_after_a_spin_that_missed_slow_replies_are_slept_for(database, readers):
    """A reply slower than the spin (a write's, a long query's) makes the next waits sleep at once instead of
    spinning again; a reply that then comes within the spin turns spinning back on. Seen from outside as the
    process's CPU time over a wait of 0.3 s: a spin of 0.2 s would burn most of that, a sleep next to none."""
    c = _connect(database[1])
    try:
        reader = readers[1](c, 0.2)
        slow = b"SELECT SLEEP(0.3) AS slept"
        cpu = time.process_time()
        reader.query(slow)                                          # spun 0.2 s, missed
        assert reader.read(0, 0) == (["slept"], [(0,)])
        assert time.process_time() - cpu > 0.05
        cpu = time.process_time()
        reader.query(slow)
        assert reader.read(0, 0) == (["slept"], [(0,)])
        assert time.process_time() - cpu < 0.05                     # slept at once
        for _ in range(3):                                          # quick replies: spinning resumes
            reader.query(b"SELECT 41 + 1 AS answer")
            assert reader.read(0, 0) == (["answer"], [(42,)])
        cpu = time.process_time()
        reader.query(slow)
        assert reader.read(0, 0) == (["slept"], [(0,)])
        assert time.process_time() - cpu > 0.05                     # spinning again
    finally:
        c.close()


def test_a_thread_that_does_not_wait_alone_does_not_spin(database, readers):
    """While another thread of the process waits for a MySQL reply, a wait sleeps at once: two spinners would
    take the core from each other and from the threads with work to do."""
    slow = b"SELECT SLEEP(0.4) AS slept"
    first, second = _connect(database[1]), _connect(database[1])
    try:
        reader = readers[1](second, 0.3)
        reader.query(b"SELECT 1")                 # the socket and the client library warmed up
        reader.read(0, 0)
        lone = readers[1](first, 0.3)
        waiting = threading.Thread(target=lambda: (lone.query(slow), lone.read(0, 0)))
        waiting.start()
        time.sleep(0.1)                           # the other thread is inside its wait (spinning, then asleep)
        cpu = time.thread_time()
        reader.query(b"SELECT SLEEP(0.2) AS slept")
        assert reader.read(0, 0) == (["slept"], [(0,)])
        assert time.thread_time() - cpu < 0.05
        waiting.join()
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("broken", ["no _mysql extension", "a client library that can't load"])
def test_a_mysqlclient_that_cannot_load_leaves_nothing_to_drive(tmp_path, broken):
    """The compiled twin imports, bound to nothing, when mysqlclient itself can't load (qag's startup check names
    what to install); it is not a fallback to report."""
    import os
    import subprocess
    import sys
    compiled_or_skip("myresult")
    fake = tmp_path / "MySQLdb"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libmysqlclient.so.21: cannot open shared object file')\n")
    if broken != "no _mysql extension":
        import importlib.machinery
        (fake / ("_mysql" + importlib.machinery.EXTENSION_SUFFIXES[0])).write_bytes(b"not a shared object")
    code = ("import qag._speedups._myresult as m; from qag import _speedups; "
            "print(m.LIBRARY, 'myresult' in _speedups.fallbacks())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                              "QAG_SPEEDUPS": "require"})
    assert out.returncode == 0 and out.stdout.split() == ["None", "False"], out.stderr
