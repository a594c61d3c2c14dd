"""The document formats of contract 3.7 (xml, yaml, xlsx, parquet): rows to bytes, with the optional libraries.

Cell values follow the same rules as the other formats (qag/_speedups/rowjson.py), as QueryAPIGate 0.43 was
observed to write them:

- xml: each value as its CSV field text (`True`, `1.5`, `2024-01-02 03:04:05.123456`, JSON text for json/arrays,
  bytes as UTF-8 with U+FFFD), `&`, `<` and `>` escaped; NULL and the empty string as an empty element `<c />`;
  column names with every character outside `[\\w.-]` replaced by `_`, and `_` put first when a name does not
  start with a letter or `_`. No declaration, no line breaks.
- yaml: PyYAML's block style, keys in column order, Unicode kept; booleans, numbers (Decimal as a float: NaN as
  `.nan`), timestamps and dates as YAML scalars; a time of day as its ISO text (QueryAPIGate failed with a 500);
  json/arrays as their JSON text; bytes as UTF-8 text.
- xlsx: one sheet named `Sheet`, a header row, then numbers, booleans, dates, times and datetimes (an aware one
  in UTC, its zone dropped: Excel has none) as typed cells and everything else as text. Text is always written
  as text, never read as a formula or a link. NaN and infinities, which Excel cannot hold, are empty cells.
- parquet: one column per result column, typed by its values (bool, int64, double, decimal128(38, s), timestamp
  [us] with UTC for aware ones, date32, time64[us], strings; bytes as lower-case hex text as QueryAPIGate wrote
  them); integers with decimals are decimal, numbers with floats double; a column whose values mix other types,
  holds only NULLs, or has a decimal over decimal128's 38 digits is text (never NULL or rounded: a decimal in a
  text column is its exact text, not the float the other formats write). A stream writes one row group per
  `row_group` rows, so a stream's memory is bounded by its row group, not by its length; its first row group fixes
  the column types, and a later value they can't hold as it is ends the stream with 400 invalid_stream
  (ParquetStream).

The libraries are the `formats` extra (PyYAML, XlsxWriter, pyarrow). Without the one a format needs, asking for
it is `500 format_unavailable`, checked before the database is touched.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import io
import math
import re
from decimal import Context, Decimal

from ._speedups import rowjson as cells   # the pure twin's cell rules: one definition for every format
from .errors import QagError

CONTENT_TYPES = {
    "xml": "application/xml; charset=utf-8",
    "yaml": "application/x-yaml",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "parquet": "application/vnd.apache.parquet",
}
ATTACHED = {"xlsx": "attachment;filename=result.xlsx", "parquet": "attachment;filename=result.parquet"}
_LIBRARY = {"yaml": ("yaml", "PyYAML"), "xlsx": ("xlsxwriter", "XlsxWriter"), "parquet": ("pyarrow.parquet", "pyarrow")}
_BINARY = (bytes, bytearray, memoryview)


def check_available(fmt: str) -> None:
    """500 format_unavailable when the library `fmt` needs is not installed (xml needs none)."""
    needed = _LIBRARY.get(fmt)
    if needed is None:
        return
    try:
        importlib.import_module(needed[0])
    except ImportError:
        raise QagError("format_unavailable", f"The {fmt} format needs the {needed[1]} package: "
                       "pip install 'qag[formats]'") from None


def encode(fmt: str, columns: list[str], rows: list) -> bytes:
    """A whole page in one of CONTENT_TYPES' formats."""
    columns = cells.unique_columns(columns)
    if fmt == "xml":
        return encode_xml(columns, rows)
    if fmt == "yaml":
        return encode_yaml(columns, rows)
    if fmt == "xlsx":
        return encode_xlsx(columns, rows)
    writer = ParquetStream(columns, row_group=max(1, len(rows)))
    return writer.chunk(rows) + writer.finish()


# --- xml -----------------------------------------------------------------------------------------------------
# XML 1.0's NameStartChar and NameChar (section 2.3) without ":" (a namespace prefix): `\w` alone lets in "²", "ª"
# or "µ", which no XML parser takes in a name.
_NAME_START = ("A-Z_a-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d"
               "\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff")
_NOT_NAME = re.compile(f"[^{_NAME_START}\\-.0-9\u00b7\u0300-\u036f\u203f-\u2040]")
_NAME_STARTS = re.compile(f"[{_NAME_START}]")
# Characters XML 1.0 can't hold at all, not even escaped (section 2.2): control characters but tab, LF and CR,
# U+FFFE/U+FFFF, lone surrogates. Shown as U+FFFD, as an undecodable byte is.
_NOT_XML_CHAR = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_name(column: str) -> str:
    name = _NOT_NAME.sub("_", column)
    return name if _NAME_STARTS.match(name) else "_" + name


def _xml_tags(columns: list[str]) -> list[str]:
    """Each column's element name; names that become alike (`a:b` and `a b` are both `a_b`) get `_2`, `_3`, ...
    as duplicate columns do, so every value keeps an element of its own."""
    tags: list[str] = []
    taken: set[str] = set()
    for column in columns:
        tag = base = xml_name(column)
        n = 2
        while tag in taken:
            tag, n = f"{base}_{n}", n + 1
        taken.add(tag)
        tags.append(tag)
    return tags


def _xml_text(value) -> str:
    if value is None:
        return ""
    text = _NOT_XML_CHAR.sub("\ufffd", cells.field_text(value))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def encode_xml(columns: list[str], rows: list) -> bytes:
    tags = _xml_tags(columns)
    out = ["<data>"]
    for row in rows:
        out.append("<item>")
        for tag, value in zip(tags, row):
            text = _xml_text(value)
            out.append(f"<{tag}>{text}</{tag}>" if text else f"<{tag} />")
        out.append("</item>")
    out.append("</data>")
    return "".join(out).encode("utf-8", "replace")


# --- yaml ----------------------------------------------------------------------------------------------------
def _yaml_value(value):
    kind = type(value)
    if kind is _dt.datetime and value.tzinfo is not None:
        return value.replace(tzinfo=None)   # the wall-clock time, its zone dropped, as in JSON (contract 0.2)
    if value is None or kind in (str, int, float, bool, _dt.datetime, _dt.date):
        return value
    if isinstance(value, Decimal):
        return math.nan if value.is_nan() else float(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, (int, float)):
        return int(value) if isinstance(value, int) else float(value)
    return cells.field_text(value)   # time, bytes, json, arrays, uuid, intervals: their text


# Plain scalars a YAML 1.2 reader (the core schema) takes for a number, boolean or null, where PyYAML's YAML 1.1
# rules see text and leave them unquoted: 1e3, 0o17, .5e1, TRUE...
_YAML12_NOT_TEXT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+|[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)"
                              r"(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)|null|Null|NULL|~|"
                              r"true|True|TRUE|false|False|FALSE")
# Characters YAML reads as line breaks: inside a quoted scalar they fold into a space unless escaped.
_YAML_BREAKS = re.compile("[\x85\u2028\u2029]")
_yaml_dumper = None


def _dumper():
    """PyYAML's safe dumper, writing text so that a YAML 1.1 or 1.2 reader gets the same text back: double-quoted
    (escaped) when it holds a line break of YAML's own (U+0085, U+2028, U+2029), single-quoted when a 1.2 reader
    would take it for a number, boolean or null."""
    global _yaml_dumper
    if _yaml_dumper is None:
        import yaml

        class Dumper(yaml.SafeDumper):
            pass

        def text(dumper, value: str):
            if _YAML_BREAKS.search(value):
                return dumper.represent_scalar("tag:yaml.org,2002:str", value, style='"')
            if _YAML12_NOT_TEXT.fullmatch(value):
                return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="'")
            return dumper.represent_str(value)

        Dumper.add_representer(str, text)
        _yaml_dumper = Dumper
    return _yaml_dumper


def encode_yaml(columns: list[str], rows: list) -> bytes:
    import yaml
    documents = [{column: _yaml_value(value) for column, value in zip(columns, row)} for row in rows]
    return yaml.dump(documents, Dumper=_dumper(), sort_keys=False, allow_unicode=True,
                     default_flow_style=False).encode("utf-8", "replace")


# --- xlsx ----------------------------------------------------------------------------------------------------
def encode_xlsx(columns: list[str], rows: list) -> bytes:
    import xlsxwriter
    out = io.BytesIO()
    # constant_memory: each row is written out as soon as the next begins (the page is bounded anyway).
    book = xlsxwriter.Workbook(out, {"in_memory": False, "constant_memory": True, "strings_to_formulas": False,
                                     "strings_to_urls": False, "strings_to_numbers": False})
    try:
        sheet = book.add_worksheet("Sheet")
        stamp = book.add_format({"num_format": "yyyy-mm-dd hh:mm:ss"})
        day = book.add_format({"num_format": "yyyy-mm-dd"})
        clock = book.add_format({"num_format": "hh:mm:ss"})
        for i, column in enumerate(columns):
            sheet.write_string(0, i, column)
        for r, row in enumerate(rows, start=1):
            for i, value in enumerate(row[:len(columns)]):
                _xlsx_cell(sheet, r, i, value, stamp, day, clock)
    finally:
        book.close()
    return out.getvalue()


def _utc(value: _dt.datetime) -> _dt.datetime:
    """A zoned time as UTC without its zone; one whose UTC time Python has no date for (within its zone's offset of
    the first or last day: PostgreSQL's 'infinity' in a zone west of UTC) is Python's earliest or latest time."""
    try:
        return value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    except OverflowError:
        return _dt.datetime.max if value.year > 1 else _dt.datetime.min


_EXCEL_EPOCH = _dt.datetime(1899, 12, 30)
_EXCEL_LAST = 2958465 + 86_399_999 / 86_400_000     # 9999-12-31 23:59:59.999, the last moment Excel shows


def excel_serial(value: _dt.datetime) -> float:
    """A date and time as a number of Excel's 1900 date system: days since 1899-12-30, the time of day as a
    fraction; before 1900-03-01 a day less, since Excel counts a 1900-02-29 that never was (1900-01-01 is 1,
    1900-02-28 is 59, 1900-03-01 is 61). Dates before 1899-12-30 count back from it, as spreadsheet readers read
    them. (XlsxWriter's own conversion is a day off before 1900 and for times of day in January and February 1900.)
    Whole milliseconds, as Excel keeps them (23:59:59.999999 would be read back as the next day), and never past
    Excel's last moment (PostgreSQL's 'infinity' is read as Python's latest time)."""
    delta = value - _EXCEL_EPOCH
    days = delta.days
    if 0 < days <= 60:
        days -= 1
    return min(days + (delta.seconds * 1000 + delta.microseconds // 1000) / 86_400_000, _EXCEL_LAST)


def _xlsx_cell(sheet, r: int, i: int, value, stamp, day, clock) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        sheet.write_boolean(r, i, value)
    elif isinstance(value, (int, float, Decimal)):
        number = float(value)
        if math.isfinite(number):
            sheet.write_number(r, i, number)
    elif isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = _utc(value)
        sheet.write_number(r, i, excel_serial(value), stamp)
    elif isinstance(value, _dt.date):
        sheet.write_number(r, i, excel_serial(_dt.datetime(value.year, value.month, value.day)), day)
    elif isinstance(value, _dt.time):
        sheet.write_datetime(r, i, value.replace(tzinfo=None), clock)
    else:
        text = value if type(value) is str else cells.field_text(value)
        if text:
            sheet.write_string(r, i, text)   # beyond Excel's 32,767 characters a cell is cut (XlsxWriter)


# --- parquet -------------------------------------------------------------------------------------------------
def _kind(value) -> str | None:
    """The parquet kind of one value (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        # parquet's int64 can't hold a wider integer (MySQL's BIGINT UNSIGNED, numeric arithmetic): decimal128
        # holds 38 digits
        return "int" if -(1 << 63) <= value < (1 << 63) else "decimal"
    if isinstance(value, float):
        return "float"
    if isinstance(value, Decimal):
        return "decimal" if value.is_finite() else "float"
    if isinstance(value, _dt.datetime):
        return "timestamptz" if value.tzinfo is not None else "timestamp"
    if isinstance(value, _dt.date):
        return "date"
    if isinstance(value, _dt.time):
        return "time" if value.tzinfo is None else "text"
    return "text"


def _column_kind(values: list) -> str:
    kinds = {_kind(v) for v in values} - {None}
    if len(kinds) == 1:
        kind = kinds.pop()
    elif kinds and kinds <= {"int", "float", "decimal"}:
        kind = "float" if "float" in kinds else "decimal"
    else:
        return "text"
    if kind == "decimal" and _decimal_scale(values) is None:
        return "text"   # over decimal128's 38 digits: the values as their text, never NULL or rounded
    return kind


def _text(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, _BINARY):
        return bytes(value).hex()
    if isinstance(value, Decimal):
        return str(value)   # the driver's exact text, not the float repr the other formats write (lossy)
    return value if type(value) is str else cells.field_text(value)


class ParquetStream:
    """A parquet file written in pieces: `chunk(rows)` gives the bytes ready so far, `finish()` the rest.

    A parquet file has one type per column, so the first rows written (the first row group) fix them. A later
    value is written only as that type holds it (an integer or a decimal in a double column as a page writes
    one, a decimal at the column's scale only when that keeps its value, anything as its text in a text
    column); any other value can't be written without changing it (never NULL or rounded instead): `chunk` or
    `finish` raises 400 invalid_stream naming the column and the row, and the stream's body ends cut."""

    def __init__(self, columns: list[str], row_group: int = 10_000):
        import pyarrow  # noqa: F401 - the format's library, refused up front by check_available
        self.columns = columns
        self.row_group = row_group
        self._sink = io.BytesIO()
        self._writer = None
        self._schema = None
        self._kinds: list[str] = []
        self._held: list = []
        self._written = 0   # rows in the row groups written so far

    def chunk(self, rows: list) -> bytes:
        self._held.extend(rows)
        while len(self._held) >= self.row_group:
            group, self._held = self._held[:self.row_group], self._held[self.row_group:]
            self._write(group)
        return self._drain()

    def finish(self) -> bytes:
        if self._held or self._writer is None:
            self._write(self._held)
            self._held = []
        self._writer.close()
        return self._drain()

    def _drain(self) -> bytes:
        data = self._sink.getvalue()
        self._sink.seek(0)
        self._sink.truncate()
        return data

    def _write(self, rows: list) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        width = len(self.columns)
        by_column = [[row[i] if i < len(row) else None for row in rows] for i in range(width)]
        if self._writer is None:
            self._kinds = [_column_kind(values) for values in by_column]
            fields = [pa.field(name, _arrow_type(kind, values)) for name, kind, values
                      in zip(self.columns, self._kinds, by_column)]
            self._schema = pa.schema(fields)
            self._writer = pq.ParquetWriter(self._sink, self._schema)
        arrays = []
        for name, kind, values, field in zip(self.columns, self._kinds, by_column, self._schema):
            try:
                arrays.append(_arrow_array(kind, values, field.type))
            except _Misfit as misfit:
                raise self._changed(name, kind, field.type, misfit) from None
        self._writer.write_table(pa.Table.from_arrays(arrays, schema=self._schema))
        self._written += len(rows)

    def _changed(self, name: str, kind: str, arrow_type, misfit: "_Misfit") -> QagError:
        was = f"decimal({arrow_type.precision}, {arrow_type.scale})" if kind == "decimal" else _KIND_NAMES[kind]
        return QagError("invalid_stream", f"Column '{name}' of this parquet stream can't hold the value in row "
                        f"{self._written + misfit.index + 1} ({misfit.what}): a parquet file has one type per "
                        f"column, and the stream's first {self._written} rows made this one {was}. Cast the "
                        "column to one type in the SQL, or ask for csv, tsv, ndjson or a page")


_KIND_NAMES = {"bool": "boolean", "int": "int64", "float": "double", "decimal": "decimal", "text": "text",
               "timestamp": "timestamp", "timestamptz": "timestamp with a time zone", "date": "date",
               "time": "time"}


class _Misfit(Exception):
    """A value its column's parquet type can't hold as it is (a stream's row group after the first)."""

    def __init__(self, index: int, what: str):
        super().__init__(what)
        self.index, self.what = index, what


def _decimal_digits(value) -> tuple[int, int] | None:
    """(digits before the point, digits after it) of an integer or a finite Decimal; None beyond 38 digits."""
    if isinstance(value, int):
        if -_TEN_38 < value < _TEN_38:
            return len(str(abs(value))), 0
        return None
    _, digits, exponent = value.as_tuple()
    return max(len(digits) + exponent, 0), max(-exponent, 0)


_TEN_38 = 10 ** 38


def _decimal_scale(values: list) -> int | None:
    """The scale of decimal128(38, s) that holds every one of `values` as it is, or None when none does (more
    than 38 digits in all: the column is written as text)."""
    before = after = 0
    for value in values:
        if value is None or not isinstance(value, (int, Decimal)):
            continue
        digits = _decimal_digits(value)
        if digits is None:
            return None
        before, after = max(before, digits[0]), max(after, digits[1])
    return after if before + after <= 38 else None


def _arrow_type(kind: str, values: list):
    import pyarrow as pa
    if kind == "decimal":
        return pa.decimal128(38, _decimal_scale(values))
    return {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "timestamp": pa.timestamp("us"),
            "timestamptz": pa.timestamp("us", tz="UTC"), "date": pa.date32(), "time": pa.time64("us")
            }.get(kind, pa.string())


def _fits(kind: str, value) -> bool:
    got = _kind(value)
    return got == kind or (kind == "float" and got in ("int", "decimal")) or (kind == "decimal" and got == "int")


_VALUE_NAMES = {"bool": "a boolean", "int": "an integer", "float": "a floating-point number", "decimal": "a decimal",
                "timestamp": "a timestamp without a time zone", "timestamptz": "a timestamp with a time zone",
                "date": "a date", "time": "a time of day", "text": "text"}


def _arrow_array(kind: str, values: list, arrow_type):
    """The column's values as `arrow_type` holds them; _Misfit for the first one it can't hold as it is."""
    import pyarrow as pa
    if kind == "text":
        return pa.array([_text(v) for v in values], type=arrow_type)
    for i, v in enumerate(values):
        if v is not None and not _fits(kind, v):
            raise _Misfit(i, _VALUE_NAMES[_kind(v)])
    if kind == "float":
        values = [float(v) if v is not None else None for v in values]
    elif kind == "decimal":
        values = [_scaled(i, v, arrow_type.scale) if v is not None else None for i, v in enumerate(values)]
    elif kind == "timestamptz":
        values = [_utc(v).replace(tzinfo=_dt.timezone.utc) if v is not None else None for v in values]
    return pa.array(values, type=arrow_type)


_DIGITS_38 = Context(prec=38)


def _scaled(index: int, value, scale: int) -> Decimal:
    """A Decimal at the column's scale, the same number (_Misfit when that would round it or take more than
    decimal128's 38 digits)."""
    try:
        # decimal128's 38 digits, not the default context's 28 (which made 29-38 digit values NULL)
        exact = Decimal(value).quantize(Decimal(1).scaleb(-scale), context=_DIGITS_38)
    except ArithmeticError:
        exact = None
    if exact is None or exact != value:
        raise _Misfit(index, f"a decimal that decimal(38, {scale}) can't hold as it is")
    return exact
