"""The MySQL date/time text twins (qag._speedups mysqltime): the compiled twin gives mysqlclient's own values.

The pure twin is mysqlclient's parsers themselves, so agreement on generated text near MySQL's canonical forms
(and on any text) shows the compiled one changes no value a MySQL call returns."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag import _speedups
from tests.speedups.conftest import call_outcome, compiled_or_skip, required


@pytest.fixture(scope="module")
def twins():
    return _speedups.twin("mysqltime", "pure"), compiled_or_skip("mysqltime")


def test_examples(speedups):
    # Text that isn't MySQL's canonical form goes to mysqlclient's parsers (the pure twin is those): the mysql extra.
    pytest.importorskip("MySQLdb", reason="the examples need mysqlclient's parsers (pip install 'qag[mysql]')")
    parse, date = speedups.mysqltime.datetime_or_none, speedups.mysqltime.date_or_none
    assert parse("2024-02-29 23:59:58") == dt.datetime(2024, 2, 29, 23, 59, 58)
    assert parse("2024-02-29 23:59:58.5") == dt.datetime(2024, 2, 29, 23, 59, 58, 500000)
    assert parse("1999-12-31 00:00:00.000123") == dt.datetime(1999, 12, 31, 0, 0, 0, 123)
    assert parse("2024-02-29 23:59:58.") == dt.datetime(2024, 2, 29, 23, 59, 58)   # mysqlclient's reading
    assert parse("2024-02-29 23:59:58.1234567") is None                         # more than microseconds
    assert parse("0000-00-00 00:00:00") is None and parse("2023-02-29 00:00:00") is None
    assert parse("2024-02-29") == dt.date(2024, 2, 29)                           # short text: a date
    assert date("2024-02-29") == dt.date(2024, 2, 29)
    assert date("0000-00-00") is None and date("2024-13-01") is None


# Text built from the canonical layout with each part sometimes off: digits, separators, lengths, fractions.
DIGITS = st.text(alphabet="0123456789", min_size=1, max_size=5)
PART = st.one_of(st.text(alphabet="0123456789", min_size=2, max_size=2), DIGITS, st.sampled_from(["00", "01", "12", "13", "29", "31", "59", "60", "99", " 1", "1_0", "+1",
                                          "-1", "٣", "a"]))
SEP = st.sampled_from(["-", ":", " ", ".", "T", "/", "", "é"])


@st.composite
def near_canonical(draw):
    def sep(canonical):   # mostly the canonical separator, so the parts after it are reached
        return draw(st.one_of(st.just(canonical), SEP))
    year = draw(st.one_of(st.sampled_from(["0000", "0001", "1970", "2024", "9999"]), DIGITS))
    parts = [year, sep("-"), draw(PART), sep("-"), draw(PART)]
    if draw(st.booleans()):
        parts += [sep(" "), draw(PART), sep(":"), draw(PART), sep(":"), draw(PART)]
        if draw(st.booleans()):
            parts += [sep("."), draw(st.one_of(st.text(alphabet="0123456789", max_size=8), PART))]
    return "".join(parts)


# Parts that int() reads but that aren't two digits: mysqlclient accepts them, so the compiled twin must hand
# them to it rather than refuse them itself.
ODD = ["2024-02-29 23:59: 8", "2024-02-29 23: 9:08", "2024-02-29  1:09:08", "2024-02-29 23:59:+8", "2024-0 -29",
       "2024-02-29 23:59:08.+5", "2024-02-29 23:59:08. 5", "+024-02-29 23:59:08", "2024-02-29T23:59:08",
       "2024-02-29 23:59:08.1_2", "2024-1_-29", "٢٠٢٤-02-29 23:59:08", "2024-02-29 23:59:08\n", "2024-02-29 "]


@pytest.mark.parametrize("text", ODD)
def test_twins_agree_on_text_int_reads_oddly(twins, text):
    pure, compiled = twins
    assert call_outcome(compiled.datetime_or_none, text) == call_outcome(pure.datetime_or_none, text)
    assert call_outcome(compiled.date_or_none, text) == call_outcome(pure.date_or_none, text)


@settings(max_examples=800, deadline=None)
@given(text=st.one_of(near_canonical(), st.text(max_size=30)))
def test_twins_agree(twins, text):
    pure, compiled = twins
    assert call_outcome(compiled.datetime_or_none, text) == call_outcome(pure.datetime_or_none, text)
    assert call_outcome(compiled.date_or_none, text) == call_outcome(pure.date_or_none, text)


@settings(max_examples=300, deadline=None)
@given(moment=st.datetimes(min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59)),
       digits=st.integers(min_value=0, max_value=6))
def test_every_canonical_value_reads_back(twins, moment, digits):
    """What MySQL sends for a DATETIME(digits) value (fraction truncated to its digits) reads back as that value."""
    _, compiled = twins
    micros = moment.microsecond // 10 ** (6 - digits) * 10 ** (6 - digits) if digits else 0
    text = f"{moment.year:04d}-{moment:%m-%d %H:%M:%S}"
    if digits:
        text += "." + f"{moment.microsecond:06d}"[:digits]
    assert compiled.datetime_or_none(text) == moment.replace(microsecond=micros)
    assert compiled.date_or_none(text[:10]) == moment.date()


def test_bad_argument_types_fail_as_mysqlclient_does(twins):
    pure, compiled = twins
    for value in (None, 20240229, b"2024-02-29 00:00:00", bytearray(b"2024-02-29")):
        assert call_outcome(compiled.datetime_or_none, value) == call_outcome(pure.datetime_or_none, value)
        assert call_outcome(compiled.date_or_none, value) == call_outcome(pure.date_or_none, value)


def test_the_speedups_load_without_mysqlclient():
    """mysqlclient is the `mysql` extra: without it both twins still import (a SQLite- or PostgreSQL-only install
    under QAG_SPEEDUPS=require must start), and their parsers say why they can't be used."""
    script = ("import sys; sys.modules['MySQLdb'] = None; sys.modules['MySQLdb.times'] = None\n"
              "from qag import _speedups\n"
              "pure = _speedups.twin('mysqltime', 'pure')\n"
              "try:\n    pure.datetime_or_none('2024-01-02 00:00:00')\nexcept RuntimeError as exc:\n"
              "    print('pure:', exc)\n"
              "try:\n    compiled = _speedups.twin('mysqltime', 'compiled')\nexcept ImportError as exc:\n"
              "    print('compiled: not built', exc)\nelse:\n"
              "    print('compiled:', compiled.datetime_or_none('2024-01-02 03:04:05'))\n"
              "    try:\n        print('loaded:', _speedups.choices()['mysqltime'])\n"
              "    except _speedups.SpeedupsError as exc:\n        print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, QAG_SPEEDUPS="require"))
    assert out.returncode == 0, out.stderr
    assert "pure: mysqlclient is not installed" in out.stdout
    if "compiled: not built" in out.stdout:
        compiled_or_skip("mysqltime")   # fails under QAG_SPEEDUPS=require, skips otherwise
    # The compiled twin reads canonical text without mysqlclient at all.
    assert "compiled: 2024-01-02 03:04:05" in out.stdout, out.stdout
    if "refused:" in out.stdout and not required():
        pytest.skip(f"this tree's other builds can't run (rebuild): {out.stdout}")
    assert "loaded: compiled" in out.stdout, out.stdout
