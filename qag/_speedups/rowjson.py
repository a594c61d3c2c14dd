"""Result rows to JSON, NDJSON, CSV and TSV bytes: the pure-Python twin of the compiled _rowjson.

Both twins give the same bytes and raise the same exceptions; tests/speedups checks that they agree.
The rules follow QueryAPIGate 0.43 as observed (its formats.py feeding Flask's JSON provider and
Python's csv module), except where noted.

Column names: `unique_columns` keeps the first occurrence of every name and renames each later
duplicate to `<name>_<k>`, k = 2, 3, ..., skipping any name already present in the result or the
input. `["id", "id", "id_2"]` gives `["id", "id_3", "id_2"]` (QueryAPIGate gave `id, id_2, id_2`
and its JSON lost a value). The encoders apply it themselves.

JSON (compact, `[...]\\n`) and NDJSON (`", "`/`": "` separators, one object per line), ASCII-only:
    None → null; bool → true/false; int → digits (subclasses as int); float → repr (`1.0`, `1e+16`);
    Decimal → float repr; str → escaped like json.dumps(ensure_ascii=True);
    datetime → "YYYY-MM-DD HH:MM:SS" (fraction and zone dropped, year zero-padded; QueryAPIGate used
    strftime, which writes year 1 as "1-01-01 ..." on glibc); date/time → isoformat();
    bytes/bytearray/memoryview → UTF-8 text, invalid bytes replaced with U+FFFD;
    dict/list (PostgreSQL json/jsonb/arrays) → a string holding json.dumps(value) with the same
    conversions for nested values, as QueryAPIGate does; anything else → str(value).
    NaN and ±Infinity (float or Decimal, including Decimal too large for a float and sNaN) → null.
    QueryAPIGate wrote the bare tokens NaN/Infinity/-Infinity, which is not valid JSON.
    Object keys follow the column order; a row shorter or longer than the columns is cut to the
    shorter of the two, as zip() does.

CSV/TSV (`encode_delimited`), UTF-8, CRLF after every line, header line first. QueryAPIGate ran each
value through its cell coercion and then Python's csv module (QUOTE_MINIMAL); observed:
    None → empty field; bool → True/False; int → digits; float → repr, NaN/inf as nan/inf/-inf;
    Decimal → float repr (Decimal("1.10") → 1.1, NaN → nan); datetime → str() with the zone
    dropped and the fraction kept ("2024-01-02 03:04:05.123456"); date/time → str() (a time keeps
    its offset); bytes → UTF-8 text, invalid bytes replaced; dict/list → json.dumps text;
    anything else → str(value).
    A field is quoted only when it holds the delimiter, a double quote, CR or LF; quotes are doubled.
    A line made of one empty field is written `""` (so it is not a blank line). Every value of a row
    is written, whatever the number of columns. Lone surrogates, which UTF-8 cannot hold, become
    "?" (QueryAPIGate failed with a 500).
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import date, datetime, time
from decimal import Decimal
from itertools import chain

__all__ = ["unique_columns", "encode_json", "encode_ndjson", "encode_delimited"]

# Values of exactly these types are written by the C json encoder and csv writer as the rules say.
_NATIVE = frozenset((str, int, float, bool, type(None)))
_SEQUENCES = frozenset((tuple, list))
_BINARY = (bytes, bytearray, memoryview)

# allow_nan=False turns a NaN/Infinity into an exception so the fast path can fall back to the
# converting path, which writes null, instead of writing an invalid token.
_compact = json.JSONEncoder(ensure_ascii=True, allow_nan=False, check_circular=False,
                            separators=(",", ":")).encode
_spaced = json.JSONEncoder(ensure_ascii=True, allow_nan=False, check_circular=False,
                           separators=(", ", ": ")).encode


def unique_columns(names: list[str]) -> list[str]:
    """Result column names with later duplicates renamed `<name>_2`, `<name>_3`, ... (see module doc)."""
    out = [name if type(name) is str else str(name) for name in names]
    if len(set(out)) == len(out):
        return out
    taken = set(out)
    seen: set[str] = set()
    last: dict[str, int] = {}
    for i, name in enumerate(out):
        if name not in seen:
            seen.add(name)
            continue
        k = last.get(name, 1)
        while True:
            k += 1
            candidate = f"{name}_{k}"
            if candidate not in taken:
                break
        last[name] = k
        taken.add(candidate)
        out[i] = candidate
    return out


def _check_delimiter(delimiter: str) -> None:
    if type(delimiter) is not str or len(delimiter) != 1 or delimiter > "\x7f" or delimiter in '"\r\n':
        raise ValueError(f"delimiter must be one ASCII character other than '\"', CR and LF, not {delimiter!r}")


def _normalised(rows) -> tuple[list, bool]:
    """The rows as a list of tuples/lists, and whether every value has a natively written type."""
    if type(rows) is not list:
        rows = list(rows)
    if not set(map(type, rows)) <= _SEQUENCES:
        rows = [row if type(row) is tuple else tuple(row) for row in rows]
    return rows, set(map(type, chain.from_iterable(rows))) <= _NATIVE


def _nested_default(value):
    """json.dumps default= for values inside a dict/list cell."""
    if isinstance(value, datetime):
        return _datetime_text(value)
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return _decimal_float(value)
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _datetime_text(value: datetime) -> str:
    return "%04d-%02d-%02d %02d:%02d:%02d" % (value.year, value.month, value.day,
                                             value.hour, value.minute, value.second)


def _decimal_float(value: Decimal) -> float:
    # float() refuses a signalling NaN; it means NaN like the quiet one.
    return math.nan if value.is_nan() else float(value)


def _json_other(value):
    """A value whose type is not exactly str/int/float/bool/None, as str, int, finite float or None."""
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Decimal):
        value = _decimal_float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return _datetime_text(value)
    if isinstance(value, (date, time)):
        return value.isoformat()
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_nested_default)
    return str(value)


def _json_row(row) -> list:
    out = []
    for value in row:
        kind = type(value)
        if kind is str or kind is int or kind is bool or value is None:
            out.append(value)
        elif kind is float:
            out.append(value if math.isfinite(value) else None)
        else:
            out.append(_json_other(value))
    return out


def _objects(columns, rows, native: bool) -> list[dict]:
    if native:
        return [dict(zip(columns, row)) for row in rows]
    return [dict(zip(columns, _json_row(row))) for row in rows]


def encode_json(columns: list[str], rows: list[tuple]) -> bytes:
    """A compact JSON array of row objects, keys in column order, ASCII only, ending with one newline."""
    columns = unique_columns(columns)
    rows, native = _normalised(rows)
    if native:
        try:
            return (_compact(_objects(columns, rows, True)) + "\n").encode("ascii")
        except ValueError:
            pass  # NaN or Infinity somewhere: the converting path writes null for it
    return (_compact(_objects(columns, rows, False)) + "\n").encode("ascii")


def encode_ndjson(columns: list[str], rows: list[tuple]) -> bytes:
    """One JSON object per row with ", "/": " separators, each line ending with a newline; b"" for no rows."""
    columns = unique_columns(columns)
    rows, native = _normalised(rows)
    if not rows:
        return b""
    if native:
        try:
            return ("\n".join(map(_spaced, _objects(columns, rows, True))) + "\n").encode("ascii")
        except ValueError:
            pass  # NaN or Infinity somewhere: the converting path writes null for it
    return ("\n".join(map(_spaced, _objects(columns, rows, False))) + "\n").encode("ascii")


def _csv_other(value):
    """A value whose type is not exactly str/int/float/bool/None, as the text of its CSV field."""
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(float(value))
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Decimal):
        return repr(_decimal_float(value))
    if isinstance(value, _BINARY):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime):
        return str(value.replace(tzinfo=None) if value.tzinfo is not None else value)
    if isinstance(value, (date, time)):
        return str(value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=_nested_default)
    return str(value)


def field_text(value) -> str:
    """One value as the text of its CSV field (NULL as ""): also the cell text of the xml format (qag/formats.py).
    Pure-Python only: the compiled twin has no per-value API."""
    if value is None:
        return ""
    kind = type(value)
    if kind is str:
        return value
    if kind is bool:
        return "True" if value else "False"
    if kind is int or kind is float:
        return repr(value)
    return _csv_other(value)


def encode_delimited(columns: list[str], rows: list[tuple], delimiter: str) -> bytes:
    """Header line then one line per row, minimal quoting, CRLF line ends, NULL as an empty field, UTF-8."""
    _check_delimiter(delimiter)
    columns = unique_columns(columns)
    rows, native = _normalised(rows)
    if not native:
        rows = [[value if type(value) in _NATIVE else _csv_other(value) for value in row] for row in rows]
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, quotechar='"', doublequote=True, escapechar=None,
                        lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL, strict=False)
    writer.writerow(columns)
    writer.writerows(rows)
    return out.getvalue().encode("utf-8", "replace")
