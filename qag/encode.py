"""Rows → response bytes per output format: JSON, NDJSON, CSV and TSV through the selected rowjson twin, the
document formats (xml, yaml, xlsx, parquet) through qag/formats.py."""

from __future__ import annotations

from . import _speedups, formats
from .errors import QagError

EMPTY_BODY = b'{"message":"No results returned"}\n'
CONTENT_TYPES = {
    "json": "application/json",
    "ndjson": "application/x-ndjson",
    "csv": "text/csv; charset=utf-8",
    "tsv": "text/tab-separated-values; charset=utf-8",
    **formats.CONTENT_TYPES,
}
FORMATS = tuple(CONTENT_TYPES)
STREAM_FORMATS = ("csv", "ndjson", "parquet", "tsv")
ATTACHED = formats.ATTACHED     # a paged body's Content-Disposition, for the two binary formats


def check_format(value) -> str:
    """The lower-cased format name: 400 invalid_format listing what this server supports, or 500
    format_unavailable when the format's optional package is missing (before anything runs)."""
    name = value.lower() if isinstance(value, str) else None
    if name not in CONTENT_TYPES:
        raise QagError("invalid_format", f"Unsupported format '{value}'. Supported formats: {', '.join(FORMATS)}")
    formats.check_available(name)
    return name


def writable(fmt: str) -> bool:
    """Whether this server can write `fmt` (a known format whose optional package is installed)."""
    try:
        check_format(fmt)
    except QagError:
        return False
    return True


# The selected rowjson twin, taken on first use: the selection is made once per process (_speedups.select), and
# _speedups.get is an interpreted call that every response body would otherwise pay.
_rowjson = None


def _encoder():
    global _rowjson
    if _rowjson is None:
        _rowjson = _speedups.get("rowjson")
    return _rowjson


def encode(fmt: str, columns: list[str], rows: list[tuple]) -> bytes:
    rowjson = _encoder()
    if fmt == "json":
        return rowjson.encode_json(columns, rows)
    if fmt == "ndjson":
        return rowjson.encode_ndjson(columns, rows)
    if fmt in formats.CONTENT_TYPES:
        return formats.encode(fmt, columns, rows)
    return rowjson.encode_delimited(columns, rows, "," if fmt == "csv" else "\t")


def encode_chunk(fmt: str, columns: list[str], rows: list[tuple], first: bool) -> bytes:
    """One chunk of a csv, tsv or ndjson stream: csv/tsv carry the header row only in the first chunk."""
    rowjson = _encoder()
    if fmt == "ndjson":
        return rowjson.encode_ndjson(columns, rows) if rows else b""
    delimiter = "," if fmt == "csv" else "\t"
    body = rowjson.encode_delimited(columns, rows, delimiter)
    if first:
        return body
    # The header is a deterministic prefix; cut exactly it (a column name may itself hold a line break).
    header = rowjson.encode_delimited(columns, [], delimiter)
    return body[len(header):]


class StreamEncoder:
    """A stream's body in pieces: `chunk(rows)` for each batch, `finish()` at the end (b"" when nothing is due).
    An empty result is the header row (csv/tsv), nothing (ndjson) or a file of no rows (parquet)."""

    __slots__ = ("fmt", "columns", "first", "parquet")

    def __init__(self, fmt: str, columns: list[str], parquet_row_group: int = 10_000):
        self.fmt, self.columns, self.first = fmt, columns, True
        self.parquet = (formats.ParquetStream(_encoder().unique_columns(columns), parquet_row_group)
                        if fmt == "parquet" else None)

    def chunk(self, rows: list) -> bytes:
        if self.parquet is not None:
            return self.parquet.chunk(rows)
        body = encode_chunk(self.fmt, self.columns, rows, self.first)
        self.first = False
        return body

    def finish(self) -> bytes:
        if self.parquet is not None:
            return self.parquet.finish()
        if self.first and self.fmt != "ndjson":
            return encode_chunk(self.fmt, self.columns, [], True)
        return b""
