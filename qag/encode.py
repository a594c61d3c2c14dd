"""Rows → response bytes per output format (JSON, NDJSON, CSV, TSV) through the selected rowjson twin."""

from __future__ import annotations

from . import _speedups
from .errors import QagError

EMPTY_BODY = b'{"message":"No results returned"}\n'
CONTENT_TYPES = {
    "json": "application/json",
    "ndjson": "application/x-ndjson",
    "csv": "text/csv; charset=utf-8",
    "tsv": "text/tab-separated-values; charset=utf-8",
}
FORMATS = tuple(CONTENT_TYPES)
STREAM_FORMATS = ("csv", "ndjson", "tsv")


def check_format(value) -> str:
    """The lower-cased format name, or 400 invalid_format listing what this server supports."""
    name = value.lower() if isinstance(value, str) else None
    if name not in CONTENT_TYPES:
        raise QagError("invalid_format", f"Unsupported format '{value}'. Supported formats: {', '.join(FORMATS)}")
    return name


def encode(fmt: str, columns: list[str], rows: list[tuple]) -> bytes:
    rowjson = _speedups.get("rowjson")
    if fmt == "json":
        return rowjson.encode_json(columns, rows)
    if fmt == "ndjson":
        return rowjson.encode_ndjson(columns, rows)
    return rowjson.encode_delimited(columns, rows, "," if fmt == "csv" else "\t")


def encode_chunk(fmt: str, columns: list[str], rows: list[tuple], first: bool) -> bytes:
    """One chunk of a stream: csv/tsv carry the header row only in the first chunk."""
    rowjson = _speedups.get("rowjson")
    if fmt == "ndjson":
        return rowjson.encode_ndjson(columns, rows) if rows else b""
    delimiter = "," if fmt == "csv" else "\t"
    body = rowjson.encode_delimited(columns, rows, delimiter)
    if first:
        return body
    # The header is a deterministic prefix; cut exactly it (a column name may itself hold a line break).
    header = rowjson.encode_delimited(columns, [], delimiter)
    return body[len(header):]
