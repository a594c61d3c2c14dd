"""Row encoding (qag._speedups rowjson twins): exact bytes and twin agreement."""

from __future__ import annotations

import csv
import enum
import io
import json
import math
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag import _speedups
from tests.speedups.conftest import Twins

PLUS2 = timezone(timedelta(hours=2))

# ---------------------------------------------------------------------------------------------
# The contract's examples (shared/spec/http-contract.md 3.7)


def test_contract_json_example(speedups):
    assert speedups.rowjson.encode_json(["film_id", "title"], [(1, "Film 1")]) == b'[{"film_id":1,"title":"Film 1"}]\n'


def test_contract_csv_example(speedups):
    rows = [(1, "a,b", 1.0), (2, None, 2.5)]
    assert speedups.rowjson.encode_delimited(["id", "v", "d"], rows, ",") == b'id,v,d\r\n1,"a,b",1.0\r\n2,,2.5\r\n'


def test_contract_ndjson_example(speedups):
    rows = [(1, "a,b", 1.0), (2, None, 2.5)]
    assert speedups.rowjson.encode_ndjson(["id", "v", "d"], rows) == (
        b'{"id": 1, "v": "a,b", "d": 1.0}\n{"id": 2, "v": null, "d": 2.5}\n')


def test_tsv_same_rows(speedups):
    rows = [(1, "a,b", 1.0), (2, None, 2.5)]
    assert speedups.rowjson.encode_delimited(["id", "v", "d"], rows, "\t") == b'id\tv\td\r\n1\ta,b\t1.0\r\n2\t\t2.5\r\n'


# ---------------------------------------------------------------------------------------------
# Column names


@pytest.mark.parametrize(("names", "expected"), [
    ([], []),
    (["id", "name"], ["id", "name"]),
    (["id", "id"], ["id", "id_2"]),
    (["id", "id", "id"], ["id", "id_2", "id_3"]),
    (["id", "id", "id_2"], ["id", "id_3", "id_2"]),
    (["id_2", "id", "id"], ["id_2", "id", "id_3"]),
    (["a", "b", "a", "b", "a"], ["a", "b", "a_2", "b_2", "a_3"]),
    (["a", "a", "a_2", "a_2"], ["a", "a_3", "a_2", "a_2_2"]),
    (["", ""], ["", "_2"]),
    ([1, "1"], ["1", "1_2"]),
])
def test_unique_columns(speedups, names, expected):
    original = list(names)
    result = speedups.rowjson.unique_columns(names)
    assert result == expected
    assert names == original
    assert result is not names


def test_encoders_make_columns_unique(speedups):
    rowjson = speedups.rowjson
    assert rowjson.encode_json(["id", "id"], [(1, 2)]) == b'[{"id":1,"id_2":2}]\n'
    assert rowjson.encode_ndjson(["id", "id", "id_2"], [(1, 2, 3)]) == b'{"id": 1, "id_3": 2, "id_2": 3}\n'
    assert rowjson.encode_delimited(["id", "id"], [(1, 2)], ",") == b"id,id_2\r\n1,2\r\n"


class Name(str):
    """A column name that is a str subclass: written by its text like any other."""


def test_object_keys_follow_the_names_of_each_call(speedups):
    """The compiled twin remembers the keys of recent column lists: each call still gets its own names, a list
    changed in place gets its new names, and past the table's size (it starts over) nothing changes."""
    rowjson = speedups.rowjson
    columns = ["id", "name"]
    assert rowjson.encode_json(columns, [(1, "a")]) == b'[{"id":1,"name":"a"}]\n'
    assert rowjson.encode_ndjson(columns, [(1, "a")]) == b'{"id": 1, "name": "a"}\n'
    columns[1] = "title"
    assert rowjson.encode_json(columns, [(1, "a")]) == b'[{"id":1,"title":"a"}]\n'
    assert rowjson.encode_json(("id", "id"), [(1, 2)]) == b'[{"id":1,"id_2":2}]\n'
    assert rowjson.encode_json([Name("id"), "id"], [(1, 2)]) == b'[{"id":1,"id_2":2}]\n'
    assert rowjson.encode_json(iter(["x"]), [(1,)]) == b'[{"x":1}]\n'
    for n in range(1200):
        assert rowjson.encode_json([f"c{n}", "id"], [(n, 1)]) == f'[{{"c{n}":{n},"id":1}}]\n'.encode()
    wide = [f"c{n}" for n in range(300)] + ["c0"]
    expected = "[{" + ",".join(f'"c{n}":{n}' for n in range(300)) + ',"c0_2":300}]\n'
    assert rowjson.encode_json(wide, [tuple(range(301))]) == expected.encode()
    assert rowjson.encode_json(["id", "name"], [(2, "b")]) == b'[{"id":2,"name":"b"}]\n'


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@given(names=st.lists(st.sampled_from(["id", "id_2", "id_3", "a", "a_2", "", "_2", "é"]), max_size=12))
def test_unique_columns_are_unique_and_keep_first_names(kind, names):
    result = Twins(kind).rowjson.unique_columns(names)
    assert len(result) == len(names)
    assert len(set(result)) == len(result)
    for i, name in enumerate(names):
        if name not in names[:i]:
            assert result[i] == name
        else:
            assert result[i].startswith(name + "_")


# ---------------------------------------------------------------------------------------------
# JSON and NDJSON values


TRICKY_TEXT = ["", "plain", "é", "€", "😀", "\x00\x1f\x7f", '"\\/\n\r\t\b\f', "\u2028\u2029", "\ud800", "a\udfffb",
               "😀\ud83d"]


@pytest.mark.parametrize("text", TRICKY_TEXT)
def test_json_strings_escape_like_json_dumps(speedups, text):
    expected = json.dumps(text)  # ensure_ascii=True is the default
    assert speedups.rowjson.encode_json(["s"], [(text,)]) == f'[{{"s":{expected}}}]\n'.encode()
    assert speedups.rowjson.encode_ndjson(["s"], [(text,)]) == f'{{"s": {expected}}}\n'.encode()


# The compiled twin copies eight plain code units at a time: a character that needs escaping, put at every place
# of a longer text (every offset within an eight-unit block, and in the tail after the last block), must still be
# escaped, and plain text around it copied intact.
ESCAPED_AMONG_PLAIN = ["\x00", "\x1f", " ", "\x7f", "\x80", "\xff", '"', "\\", "é", "~", "!", "#", "[", "]"]


@pytest.mark.parametrize("special", ESCAPED_AMONG_PLAIN)
def test_json_strings_escape_at_every_offset(speedups, special):
    for length in (7, 8, 9, 16, 17, 40):
        for at in range(length):
            text = "".join(special if i == at else "abcdefgh"[i % 8] for i in range(length))
            expected = json.dumps(text)
            assert speedups.rowjson.encode_json(["s"], [(text,)]) == f'[{{"s":{expected}}}]\n'.encode(), (length, at)


def test_json_exact_escapes(speedups):
    out = speedups.rowjson.encode_json(["é"], [("é€😀\x01\x7f\"\\\n",)])
    assert out == b'[{"\\u00e9":"\\u00e9\\u20ac\\ud83d\\ude00\\u0001\\u007f\\"\\\\\\n"}]\n'


@pytest.mark.parametrize(("value", "text"), [
    (None, "null"),
    (True, "true"),
    (False, "false"),
    (0, "0"),
    (-7, "-7"),
    (2**63 - 1, "9223372036854775807"),
    (-(2**63), "-9223372036854775808"),
    (2**64, "18446744073709551616"),
    (10**30, "1000000000000000000000000000000"),
    (-(10**40) - 1, "-10000000000000000000000000000000000000001"),
    (1.0, "1.0"),
    (2.5, "2.5"),
    (-0.0, "-0.0"),
    (0.1, "0.1"),
    (12.99, "12.99"),
    (1e16, "1e+16"),
    (1e15, "1000000000000000.0"),
    (123456789012345.67, "123456789012345.67"),
    (0.0001, "0.0001"),
    (0.00009, "9e-05"),
    (1 / 3, "0.3333333333333333"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (float("nan"), "null"),
    (float("inf"), "null"),
    (float("-inf"), "null"),
    (Decimal("1.10"), "1.1"),
    (Decimal("-0"), "-0.0"),
    (Decimal("12345678901234567890.123"), "1.2345678901234567e+19"),
    (Decimal("NaN"), "null"),
    (Decimal("-sNaN"), "null"),
    (Decimal("Infinity"), "null"),
    (Decimal("1E+400"), "null"),
    (datetime(2024, 1, 2, 3, 4, 5, 123456), '"2024-01-02 03:04:05"'),
    (datetime(2024, 1, 2, 3, 4, 5, 999999, tzinfo=PLUS2), '"2024-01-02 03:04:05"'),
    (datetime(2024, 12, 31, 23, 59, 59, tzinfo=timezone.utc), '"2024-12-31 23:59:59"'),
    (datetime(1, 1, 1), '"0001-01-01 00:00:00"'),
    (date(2024, 1, 2), '"2024-01-02"'),
    (date(9, 2, 3), '"0009-02-03"'),
    (time(3, 4, 5), '"03:04:05"'),
    (time(3, 4, 5, 6), '"03:04:05.000006"'),
    (time(3, 4, tzinfo=PLUS2), '"03:04:00+02:00"'),
    (b"h\xc3\xa9", '"h\\u00e9"'),
    (b"\xff\xfeok", '"\\ufffd\\ufffdok"'),
    (bytearray(b"ab"), '"ab"'),
    (memoryview(b"cd"), '"cd"'),
    ([1, "a", date(2020, 1, 1)], '"[1, \\"a\\", \\"2020-01-01\\"]"'),
    ({"k": "é", "n": None}, '"{\\"k\\": \\"\\\\u00e9\\", \\"n\\": null}"'),
    ({"t": datetime(1, 2, 3, 4, 5, 6, 7), "d": Decimal("2.5"), "b": b"\xff"},
     '"{\\"t\\": \\"0001-02-03 04:05:06\\", \\"d\\": 2.5, \\"b\\": \\"\\\\ufffd\\"}"'),
    ([float("nan")], '"[NaN]"'),
    (timedelta(days=1, seconds=5), '"1 day, 0:00:05"'),
    (uuid.UUID("12345678-1234-5678-1234-567812345678"), '"12345678-1234-5678-1234-567812345678"'),
    ((1, 2), '"(1, 2)"'),
])
def test_json_value_conversion(speedups, value, text):
    assert speedups.rowjson.encode_json(["v"], [(value,)]) == f'[{{"v":{text}}}]\n'.encode()
    assert speedups.rowjson.encode_ndjson(["v"], [(value,)]) == f'{{"v": {text}}}\n'.encode()


class Colour(enum.IntEnum):
    RED = 1


class Money(float):
    def __repr__(self):
        return "Money!"


class Shouty(str):
    def __str__(self):
        return "SHOUT"


class MyDatetime(datetime):
    pass


class Thing:
    def __str__(self):
        return "thing é"


def test_ints_at_every_digit_count(speedups):
    """The compiled twin counts an int's digits before it writes them two at a time: each boundary, both signs."""
    values = sorted({v for k in range(20) for v in (10 ** k - 1, 10 ** k, 10 ** k + 1, 5 * 10 ** k) if v < 2 ** 63})
    values += [-v for v in values] + [2 ** 63 - 1, -(2 ** 63)]
    out = speedups.rowjson.encode_json(["n"], [(v,) for v in values])
    assert out == ("[" + ",".join(f'{{"n":{v}}}' for v in values) + "]\n").encode()
    assert speedups.rowjson.encode_delimited(["n"], [(v,) for v in values], ",") == \
        ("n\r\n" + "".join(f"{v}\r\n" for v in values)).encode()


def test_json_subclasses_and_unknown_types(speedups):
    row = (Colour.RED, Money(2.5), Shouty("quiet"), MyDatetime(2024, 1, 2, 3, 4, 5), Thing(), True)
    out = speedups.rowjson.encode_json(["a", "b", "c", "d", "e", "f"], [row])
    assert out == b'[{"a":1,"b":2.5,"c":"SHOUT","d":"2024-01-02 03:04:05","e":"thing \\u00e9","f":true}]\n'


def test_json_row_shapes(speedups):
    rowjson = speedups.rowjson
    assert rowjson.encode_json(["a", "b"], []) == b"[]\n"
    assert rowjson.encode_ndjson(["a", "b"], []) == b""
    assert rowjson.encode_json([], [()]) == b"[{}]\n"
    assert rowjson.encode_ndjson(["a"], [()]) == b"{}\n"
    # zip() semantics: a short row gives fewer keys, a long row loses its extra values.
    assert rowjson.encode_json(["a", "b"], [(1,), (1, 2, 3)]) == b'[{"a":1},{"a":1,"b":2}]\n'
    assert rowjson.encode_ndjson(["a", "b"], [(1,), (1, 2, 3)]) == b'{"a": 1}\n{"a": 1, "b": 2}\n'
    # Any iterable of rows, rows as lists or any iterable.
    rows = ((i, str(i)) for i in range(2))
    assert rowjson.encode_json(["a", "b"], rows) == b'[{"a":0,"b":"0"},{"a":1,"b":"1"}]\n'
    assert rowjson.encode_json(["a", "b"], [[1, None], iter((2, 3))]) == b'[{"a":1,"b":null},{"a":2,"b":3}]\n'


def test_json_many_rows(speedups):
    rows = [(i, f"name {i}", i / 4, None) for i in range(1000)]
    out = speedups.rowjson.encode_json(["id", "name", "q", "n"], rows)
    assert json.loads(out) == [{"id": i, "name": f"name {i}", "q": i / 4, "n": None} for i in range(1000)]
    assert out.endswith(b"}]\n") and out.count(b"\n") == 1


# ---------------------------------------------------------------------------------------------
# CSV and TSV


@pytest.mark.parametrize(("value", "field"), [
    (None, b""),
    ("", b""),
    ("plain text", b"plain text"),
    (" padded ", b" padded "),
    ("a,b", b'"a,b"'),
    ('say "hi"', b'"say ""hi"""'),
    ('"', b'""""'),
    ("line\nbreak", b'"line\nbreak"'),
    ("cr\rhere", b'"cr\rhere"'),
    ("crlf\r\n", b'"crlf\r\n"'),
    ("tab\there", b"tab\there"),
    ("nul\x00", b"nul\x00"),
    ("é€😀", "é€😀".encode()),
    ("lone \ud800 surrogate", b"lone ? surrogate"),
    (True, b"True"),
    (False, b"False"),
    (42, b"42"),
    (-(10**30), b"-1000000000000000000000000000000"),
    (1.0, b"1.0"),
    (1e16, b"1e+16"),
    (-0.0, b"-0.0"),
    (float("nan"), b"nan"),
    (float("inf"), b"inf"),
    (float("-inf"), b"-inf"),
    (Decimal("1.10"), b"1.1"),
    (Decimal("NaN"), b"nan"),
    (Decimal("sNaN"), b"nan"),
    (Decimal("1E+400"), b"inf"),
    (datetime(2024, 1, 2, 3, 4, 5), b"2024-01-02 03:04:05"),
    (datetime(2024, 1, 2, 3, 4, 5, 123456), b"2024-01-02 03:04:05.123456"),
    (datetime(2024, 1, 2, 3, 4, 5, 7, tzinfo=PLUS2), b"2024-01-02 03:04:05.000007"),
    (datetime(1, 1, 1), b"0001-01-01 00:00:00"),
    (MyDatetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=PLUS2), b"2024-01-02 03:04:05.000006"),
    (date(2024, 1, 2), b"2024-01-02"),
    (time(3, 4, 5), b"03:04:05"),
    (time(3, 4, 5, 60), b"03:04:05.000060"),
    (time(3, 4, tzinfo=PLUS2), b"03:04:00+02:00"),
    (b"h\xc3\xa9", "hé".encode()),
    (b"\xff\xfeok", "\ufffd\ufffdok".encode()),
    (memoryview(b"x,y"), b'"x,y"'),
    ([1, "a"], b'"[1, ""a""]"'),
    ({"k": "é"}, b'"{""k"": ""\\u00e9""}"'),
    (Colour.RED, b"1"),
    (Money(2.5), b"2.5"),
    (Thing(), "thing é".encode()),
])
def test_csv_fields(speedups, value, field):
    out = speedups.rowjson.encode_delimited(["x", "v"], [(1, value)], ",")
    assert out == b"x,v\r\n1," + field + b"\r\n"


def test_csv_lone_empty_field_is_quoted(speedups):
    rowjson = speedups.rowjson
    assert rowjson.encode_delimited(["v"], [(None,), ("",), ("a",)], ",") == b'v\r\n""\r\n""\r\na\r\n'
    assert rowjson.encode_delimited([""], [(None, None)], ",") == b'""\r\n,\r\n'
    assert rowjson.encode_delimited([], [()], ",") == b"\r\n\r\n"


def test_csv_row_shapes(speedups):
    rowjson = speedups.rowjson
    assert rowjson.encode_delimited(["id", "v"], [], ",") == b"id,v\r\n"
    # Every value of a row is written, whatever the number of columns.
    assert rowjson.encode_delimited(["a"], [(1, 2), ()], ",") == b"a\r\n1,2\r\n\r\n"
    assert rowjson.encode_delimited(["a", "b"], ((i, None) for i in range(2)), ",") == b"a,b\r\n0,\r\n1,\r\n"


def test_tsv_quotes_tabs_not_commas(speedups):
    out = speedups.rowjson.encode_delimited(["a,b", "c\td"], [("x,y", "p\tq"), ('"', None)], "\t")
    assert out == b'a,b\t"c\td"\r\nx,y\t"p\tq"\r\n""""\t\r\n'


def test_csv_header_is_quoted_like_fields(speedups):
    out = speedups.rowjson.encode_delimited(['say "x"', "é", "a\nb"], [], ",")
    assert out == '"say ""x""",é,"a\nb"\r\n'.encode()


@pytest.mark.parametrize(("delimiter", "line"), [
    (".", b'"1.5".x\r\n'),
    ("1", b'"10"1x\r\n'),
    (";", b"1.5;x\r\n"),
    ("|", b"1.5|x\r\n"),
])
def test_unusual_delimiters_quote_numbers_that_hold_them(speedups, delimiter, line):
    value = 10 if delimiter == "1" else 1.5
    out = speedups.rowjson.encode_delimited(["a", "b"], [(value, "x")], delimiter)
    assert out.split(b"\r\n", 1)[1] == line


@pytest.mark.parametrize("delimiter", ["", ",,", '"', "\r", "\n", "é", 44, None])
def test_bad_delimiter(speedups, delimiter):
    with pytest.raises(ValueError) as info:
        speedups.rowjson.encode_delimited(["a"], [(1,)], delimiter)
    assert str(info.value) == f"delimiter must be one ASCII character other than '\"', CR and LF, not {delimiter!r}"


# ---------------------------------------------------------------------------------------------
# Errors: both twins raise the same exception with the same message


class Broken:
    def __str__(self):
        raise RuntimeError("no text for you")


def _circular():
    value = [1]
    value.append(value)
    return value


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as exc:  # the comparison is the point: any type, same message
        return (type(exc), str(exc))


ENCODERS = [
    ("json", lambda m, c, r: m.encode_json(c, r)),
    ("ndjson", lambda m, c, r: m.encode_ndjson(c, r)),
    ("csv", lambda m, c, r: m.encode_delimited(c, r, ",")),
    ("tsv", lambda m, c, r: m.encode_delimited(c, r, "\t")),
]


@pytest.mark.parametrize(("columns", "rows", "error"), [
    (["a"], None, TypeError),
    (["a"], 5, TypeError),
    (["a"], [(1,), 5], TypeError),
    (None, [], TypeError),
    (["a"], [(10**5000,)], ValueError),
    (["a"], [(Broken(),)], RuntimeError),
    (["a"], [(_circular(),)], ValueError),
])
@pytest.mark.parametrize(("fmt", "encode"), ENCODERS, ids=[e[0] for e in ENCODERS])
def test_errors_match(twin_pair, fmt, encode, columns, rows, error):
    pure, compiled = twin_pair("rowjson")
    expected = _outcome(lambda: encode(pure, columns, rows))
    assert expected[0] is error
    assert _outcome(lambda: encode(compiled, columns, rows)) == expected


# ---------------------------------------------------------------------------------------------
# Generated data: the twins agree, and the output reads back as the rules say

FIXED_ZONES = st.builds(timezone, st.timedeltas(min_value=timedelta(hours=-23, minutes=-59),
                                                 max_value=timedelta(hours=23, minutes=59)))
SPECIAL_CHARS = list(',\t"\r\n\\/\x00\x1f\x7f\x80\xff\u2028\ud800\udbff\udfff é€😀\U0010ffff')
TEXT = st.text(st.one_of(st.characters(), st.sampled_from(SPECIAL_CHARS)), max_size=20)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(),
    st.integers(min_value=-(10**15), max_value=10**15).flatmap(
        lambda m: st.integers(min_value=0, max_value=18).map(lambda k: m / 10**k)),
    TEXT,
    st.binary(max_size=12),
    st.binary(max_size=12).map(bytearray),
    st.datetimes(timezones=st.none() | FIXED_ZONES),
    st.dates(),
    st.times(timezones=st.none() | FIXED_ZONES),
    st.decimals(),
    st.decimals(places=3, allow_nan=False, allow_infinity=False),
)
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=3), st.dictionaries(TEXT, SCALARS, max_size=2))
COLUMN_NAMES = st.lists(st.one_of(st.sampled_from(["id", "id_2", "v", "é", "", "a,b", 'q"', "x\ny"]), TEXT),
                        max_size=6)


@st.composite
def results(draw, values=VALUES):
    """Columns and rows as a driver returns them; now and then a row of another length."""
    columns = draw(COLUMN_NAMES)
    width = st.just(len(columns)) if draw(st.integers(0, 9)) else st.integers(0, 7)
    rows = draw(st.lists(width.flatmap(lambda n: st.tuples(*[values] * n)), max_size=6))
    return columns, rows


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(results())
def test_twins_agree(twin_pair, result):
    pure, compiled = twin_pair("rowjson")
    columns, rows = result
    for _, encode in ENCODERS:
        assert _outcome(lambda: encode(compiled, columns, rows)) == _outcome(lambda: encode(pure, columns, rows))
    assert compiled.unique_columns(columns) == pure.unique_columns(columns)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pool=st.lists(SCALARS, min_size=1, max_size=4), picks=st.lists(st.lists(st.integers(0, 3), min_size=3,
                                                                             max_size=3), max_size=8))
def test_twins_agree_when_rows_repeat_the_same_objects(twin_pair, pool, picks):
    """As a join's rows come from the MySQL reader: the same objects again in the next row's column, and a column
    that goes back to an object it had two rows before (the compiled twin copies an object's JSON written just
    above, per column)."""
    pure, compiled = twin_pair("rowjson")
    rows = [tuple(pool[i % len(pool)] for i in pick) for pick in picks]
    for _, encode in ENCODERS:
        assert _outcome(lambda: encode(compiled, ["a", "b", "a"], rows)) == \
            _outcome(lambda: encode(pure, ["a", "b", "a"], rows))


def test_repeated_objects_across_a_growing_buffer(speedups):
    """A value repeated row after row while the buffer grows (the copy is made from where the JSON now is), and no
    reference kept after the call."""
    import sys
    long_text, amount, moment = "x" * 5000 + "é\n", Decimal("12.50"), datetime(2024, 1, 2, 3, 4, 5)
    before = [sys.getrefcount(v) for v in (long_text, amount, moment)]
    rows = [(long_text, amount, moment, i) for i in range(300)] + [("y", Decimal("12.5"), moment, -1)]
    out = speedups.rowjson.encode_json(["t", "d", "m", "i"], rows)
    assert json.loads(out) == [{"t": t, "d": float(d), "m": str(m), "i": i} for t, d, m, i in rows]
    ndjson = speedups.rowjson.encode_ndjson(["t", "d", "m", "i"], rows)
    assert [json.loads(line) for line in ndjson.splitlines()] == json.loads(out)
    del rows
    assert [sys.getrefcount(v) for v in (long_text, amount, moment)] == before


# Decimals whose float() the compiled twin works out from the C fields (a coefficient of at most 2^53 and an
# exponent within ±22) and those just past either edge, where it takes float() of the value.
_DECIMAL_EDGES = st.one_of(
    st.decimals(allow_nan=True, allow_infinity=True),
    st.builds(lambda sign, coefficient, exponent: Decimal((sign, tuple(map(int, str(coefficient))), exponent)),
              st.integers(0, 1),
              st.one_of(st.integers(0, 2**53 + 2), st.integers(2**53 - 2, 10**19 + 2), st.integers(0, 10**40)),
              st.integers(-25, 25)),
)


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@settings(max_examples=400, deadline=None)
@given(value=_DECIMAL_EDGES)
def test_decimals_are_written_as_their_float(kind, value):
    rowjson = Twins(kind).rowjson
    number = math.nan if value.is_nan() else float(value)
    expected = repr(number).encode()
    written = expected if math.isfinite(number) else b"null"
    assert rowjson.encode_json(["d"], [(value,)]) == b'[{"d":' + written + b"}]\n"
    assert rowjson.encode_delimited(["d"], [(value,)], ",") == b"d\r\n" + expected + b"\r\n"


def test_compiled_twin_reads_decimals_from_their_fields():
    """The fast way is on in this interpreter: the differential test above then covers it, not only float()."""
    compiled = Twins("compiled").rowjson
    assert compiled.decimal_fields_known is True


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=False, allow_infinity=False),
                 st.integers(min_value=-(10**15), max_value=10**15).flatmap(
                     lambda m: st.integers(min_value=0, max_value=22).map(lambda k: m / 10**k))))
def test_floats_are_written_as_repr(kind, value):
    rowjson = Twins(kind).rowjson
    assert rowjson.encode_json(["f"], [(value,)]) == f'[{{"f":{value!r}}}]\n'.encode()
    assert rowjson.encode_delimited(["f"], [(value,)], ",")[3:-2] == repr(value).encode()


def _json_model(value):
    """What json.loads should give back for `value`, from the rules."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        number = math.nan if value.is_nan() else float(value)
        return number if math.isfinite(number) else None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value:%H:%M:%S}"
    return value.isoformat()


def _csv_model(value):
    """The CSV field text for `value`, from the rules."""
    if value is None:
        return ""
    if isinstance(value, (bool, int, float, str)):
        return value if isinstance(value, str) else repr(value)
    if isinstance(value, Decimal):
        return repr(math.nan if value.is_nan() else float(value))
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return str(value.replace(tzinfo=None))
    return str(value)


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=results(SCALARS))
def test_json_reads_back(kind, result):
    columns, rows = result
    names = _speedups.twin("rowjson", "pure").unique_columns(columns)
    expected = [{k: _json_model(v) for k, v in zip(names, row)} for row in rows]
    rowjson = Twins(kind).rowjson
    out = rowjson.encode_json(columns, rows)
    assert out.isascii() and out.endswith(b"\n") and out.count(b"\n") == 1
    parsed = json.loads(out)
    assert [list(obj) for obj in parsed] == [list(obj) for obj in expected]
    assert parsed == expected  # NaN reads back as None, so plain equality is exact
    lines = rowjson.encode_ndjson(columns, rows)
    assert lines.isascii() and (lines == b"" or lines.endswith(b"\n"))
    assert [json.loads(line) for line in lines.split(b"\n")[:-1]] == expected


@pytest.mark.parametrize("kind", ["pure", "compiled"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(result=results(SCALARS), delimiter=st.sampled_from([",", "\t", ";"]))
def test_csv_reads_back(kind, result, delimiter):
    columns, rows = result
    names = _speedups.twin("rowjson", "pure").unique_columns(columns)

    def clean(text):
        return text.encode("utf-8", "replace").decode("utf-8")

    expected = [[clean(n) for n in names]] + [[clean(_csv_model(v)) for v in row] for row in rows]
    out = Twins(kind).rowjson.encode_delimited(columns, rows, delimiter)
    assert out.endswith(b"\r\n")
    parsed = list(csv.reader(io.StringIO(out.decode("utf-8"), newline=""), delimiter=delimiter))
    assert parsed == expected
