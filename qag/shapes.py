"""One description of what requests may carry: the JSON Schema that /openapi.json publishes and the limits,
names and patterns the validators check, so the two cannot drift apart.

The validators keep their own error codes and messages (the contract's tests pin them); what a value may be -
its type, range, pattern, enumeration - is read from here. `fits` checks a value against one of these fragments
with JSON Schema's meaning, except that an integer is a JSON number without a fraction part *in JSON*: `3.0` in a
body is the integer 3 (JSON Schema says so, and so does qag), while query-string text stays as the contract reads
it (`3.0` there is not an integer; a client serialises 3 as `3`)."""

from __future__ import annotations

import re
from typing import Any

# --- JSON readings ----------------------------------------------------------------------------------------------

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
MAX_OFFSET = INT64_MAX   # what every engine's OFFSET takes


def whole(value) -> int | None:
    """A JSON value as an integer: an int (never a bool) or a float with no fraction part (`2.0`); else None."""
    if type(value) is int:
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return None


def anchored(body: str) -> str:
    """A pattern matching the whole value, read alike by ECMA-262 and Python: `$(?!\\n)`, because Python's `$`
    also matches before a final newline, which the server's fullmatch refuses."""
    return f"^(?:{body})$(?!\\n)"


def _pattern(body: str) -> tuple[re.Pattern, str]:
    return re.compile(body), anchored(body)


# --- Names -----------------------------------------------------------------------------------------------------

QUERY_NAME, QUERY_NAME_PATTERN = _pattern(r"[\w .\-]{1,100}")
CONNECTION_NAME, CONNECTION_NAME_PATTERN = _pattern(r"[A-Za-z0-9][A-Za-z0-9 ._-]{0,99}")
COLLECTION_NAME, COLLECTION_NAME_PATTERN = _pattern(r"[a-z0-9][a-z0-9._-]{0,62}")
KEY_NAME, KEY_NAME_PATTERN = _pattern(r"[\w .\-]{1,100}")          # API keys and roles
MASK_PART = r"[A-Za-z0-9_*$]+"
MASK_COLUMN, MASK_COLUMN_PATTERN = _pattern(rf"{MASK_PART}\.{MASK_PART}(?:\.{MASK_PART})?")
DATE, DATE_PATTERN = _pattern(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
RATE_LIMIT_PATTERN = r"^\s*0*[1-9][0-9]{0,17}\s*/\s*([Ss][Ee][Cc][Oo][Nn][Dd]|[Mm][Ii][Nn][Uu][Tt][Ee]|[Hh][Oo][Uu][Rr]|" \
                     r"[Dd][Aa][Yy])[Ss]?\s*$(?!\n)"
NOT_BLANK = r"\S"          # somewhere a character that is not white space ("   " is blank)

QUERY_NAME_SCHEMA = {"type": "string", "pattern": QUERY_NAME_PATTERN, "not": {"pattern": r"^\."}}
CONNECTION_NAME_SCHEMA = {"type": "string", "pattern": CONNECTION_NAME_PATTERN}
COLLECTION_NAME_SCHEMA = {"type": "string", "pattern": COLLECTION_NAME_PATTERN}
KEY_NAME_SCHEMA = {"type": "string", "pattern": KEY_NAME_PATTERN}

# --- Values ----------------------------------------------------------------------------------------------------

MASK_ACTIONS = ("drop", "null", "mask", "hash", "keep")  # strictest first (contract 6.3)
QUOTA_PERIODS = ("day", "month")
QUOTA_MAX = 10 ** 12
SUPPORTED_DB = ("mysql", "postgres", "sqlite")
DIRECT_FIELDS = ("host", "port", "database", "user", "password")   # a connection's own fields, never options
HISTORY_KINDS = ("saved", "adhoc")
RUN_STATUSES = ("success", "error")
LIST_STATUSES = ("published", "unpublished", "draft")
STREAM_WORDS = ("1", "true", "yes", "on")
STREAM_FORMATS = ("csv", "ndjson", "parquet", "tsv")

GRACE_MINUTES = {"type": "integer", "minimum": 0, "maximum": 10080, "default": 60}
MAX_CONCURRENT = {"type": "integer", "minimum": 1, "maximum": 1000}
MAX_ROWS = {"type": "integer", "minimum": 1, "maximum": 10_000_000}
QUERY_TIMEOUT = {"type": "number", "minimum": 0.1, "maximum": 86400}
QUOTA_COUNT = {"type": "integer", "minimum": 1, "maximum": QUOTA_MAX}
CACHE_TTL = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
VERSION_NUMBER = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}
HISTORY_LIMIT = {"type": "integer", "minimum": 1, "maximum": 1000}
HISTORY_VERSION = {"type": "integer", "minimum": -(10 ** 18 - 1), "maximum": 10 ** 18 - 1}
TIMEOUT = {"type": "number", "exclusiveMinimum": 0}
MASK_RULE = {"type": "object", "properties": {
    "column": {"type": "string", "pattern": MASK_COLUMN_PATTERN,
               "description": "table.column or schema.table.column; * wildcard"},
    "action": {"enum": list(MASK_ACTIONS)}}, "required": ["column", "action"], "additionalProperties": False}
QUOTA = {"type": "object", "properties": {"calls": QUOTA_COUNT, "rows": QUOTA_COUNT, "per": {"enum": list(QUOTA_PERIODS)}},
         "required": ["per"], "additionalProperties": False,
         "anyOf": [{"required": ["calls"]}, {"required": ["rows"]}]}

# An allowed_ips entry: an IPv4 or IPv6 address, or a CIDR range (host bits allowed).
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IP_ENTRY = {"anyOf": [{"type": "string", "format": "ipv4"}, {"type": "string", "format": "ipv6"},
                      {"type": "string", "pattern": anchored(rf"{_OCTET}(?:\.{_OCTET}){{3}}/(?:3[0-2]|[12]?[0-9])")}]}


# --- Run arguments (contract 3.1, 3.6-3.8) ---------------------------------------------------------------------

def page_size(max_page_size: int) -> dict:
    return {"type": "integer", "minimum": 1, "maximum": max_page_size, "default": 10}


def page(max_page_size: int) -> dict:
    # (page - 1) * page_size must stay an OFFSET every engine takes, whatever page_size the caller picks.
    return {"type": "integer", "minimum": 1, "maximum": MAX_OFFSET // max_page_size + 1, "default": 1}


# --- A small JSON Schema reader for the fragments above ---------------------------------------------------------

_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: whole(v) is not None,
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
}


def fits(schema: dict, value: Any) -> bool:
    """Whether `value` (parsed JSON) is valid against `schema`: the keywords this module's fragments use."""
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES[k](value) for k in kinds):
            return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "const" in schema and value != schema["const"]:
        return False
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value != value:   # NaN compares false with every bound
            return False
        if "minimum" in schema and value < schema["minimum"]:
            return False
        if "maximum" in schema and value > schema["maximum"]:
            return False
        if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
            return False
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            return False
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return False
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return False
    if isinstance(value, list):
        if "items" in schema and not all(fits(schema["items"], v) for v in value):
            return False
        if schema.get("uniqueItems") and len({repr(v) for v in value}) != len(value):
            return False
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", ())):
            return False
        for name, item in value.items():
            if name in properties:
                if not fits(properties[name], item):
                    return False
            elif schema.get("additionalProperties") is False:
                return False
    if "anyOf" in schema and not any(fits(s, value) for s in schema["anyOf"]):
        return False
    if "not" in schema and fits(schema["not"], value):
        return False
    return True
