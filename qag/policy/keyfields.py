"""Management-API body normalisation for API keys and roles: validate, default and convert to the stored shape."""

from __future__ import annotations

import ipaddress
import unicodedata
from datetime import date
from typing import Collection, Mapping

from qag import shapes
from qag.errors import QagError
from qag.sql.names import ascii_lower
from qag.policy.grants import ALL, GRANT_FIELDS, key_grant_defaults, parse_rate_limit

KEY_NAME_MESSAGE = "An API key name is 1-100 letters, digits, spaces, '.', '_' or '-'"
ROLE_NAME_MESSAGE = "A role name is 1-100 letters, digits, spaces, '.', '_' or '-'"
COLLECTION_NAME_MESSAGE = ("A collection name must be 1-63 characters: lowercase letters, digits, '.', '_' and '-', "
                           "starting with a letter or digit")
# The names logs, run history, events and metrics give callers that are not keys (the admin key and named
# administrators, the command line, open mode). A key of such a name would see those callers' runs as its own
# (a scoped key sees the runs and events whose key_name is its name), so no key may have one, in any case.
RESERVED_KEY_NAMES = frozenset(("admin", "cli", "-"))
RESERVED_KEY_NAME_MESSAGE = ("'admin', 'cli' and '-' name the administrator, the command line and open mode in logs "
                             "and run history: choose another API key name")


def reserved_key_name(name: str) -> bool:
    """Whether a key name is, or reads in a log line like, one of RESERVED_KEY_NAMES: in any case, in full-width
    or other compatibility forms, with spaces or dots around it."""
    folded = unicodedata.normalize("NFKC", name).casefold().strip()
    return folded in RESERVED_KEY_NAMES or folded.strip(" .") in RESERVED_KEY_NAMES
CLAIM_BINDING_MESSAGE = ("A role with require_claim_binding reaches saved queries by name or collection only - give it "
                         "connections: [] (its users run only queries that bind their token)")

# fullmatch everywhere: `$` would let a trailing newline into a name. The patterns, ranges and choices are
# qag/shapes.py's, which /openapi.json publishes.
_NAME_RE = shapes.KEY_NAME
_COLLECTION_RE = shapes.COLLECTION_NAME
_MASK_COLUMN_RE = shapes.MASK_COLUMN
_DATE_RE = shapes.DATE

MASK_ACTIONS = shapes.MASK_ACTIONS  # strictest first (contract 6.3)
QUOTA_PERIODS = shapes.QUOTA_PERIODS
QUOTA_MAX = shapes.QUOTA_MAX

_KEY_CREATE_FIELDS = frozenset({"name", "role", "expires_at", *GRANT_FIELDS})
_KEY_PATCH_FIELDS = frozenset({"active", "expires_at", *GRANT_FIELDS})
_ROLE_CREATE_FIELDS = frozenset({"name", "require_claim_binding", *GRANT_FIELDS})
_ROLE_PATCH_FIELDS = frozenset({"require_claim_binding", *GRANT_FIELDS})

# On PATCH an explicit null clears these; for the other grant fields null means "leave unchanged".
NULL_CLEARS = frozenset({
    "rate_limit", "allowed_ips", "allowed_write_ops", "allowed_tables", "allowed_functions", "mask",
    "max_concurrent", "query_timeout", "max_rows", "quota",
})

# The order QueryAPIGate 0.43 checks fields in, so the same bad body names the same field first.
_CHECK_ORDER = (
    "collections", "connections", "queries", "allow_writes", "rate_limit", "allowed_ips", "allowed_write_ops",
    "allowed_tables", "allowed_functions", "mask", "max_concurrent", "query_timeout", "max_rows", "quota",
)
# The order QueryAPIGate 0.43 lists grant fields in its "Cannot combine 'role' ..." message.
_ROLE_CONFLICT_ORDER = (
    "connections", "allow_writes", "queries", "collections", "rate_limit", "allowed_ips", "allowed_write_ops",
    "allowed_tables", "allowed_functions", "mask", "max_concurrent", "query_timeout", "max_rows", "quota",
)


def _bad(message: str) -> QagError:
    return QagError("invalid_body", message)


def _is_int(value) -> bool:
    # JSON true/false arrive as bool, a subclass of int; a limit of `true` is a mistake, not 1. A whole float (2.0)
    # is the integer JSON Schema says it is.
    return shapes.whole(value) is not None


# ---------------------------------------------------------------------------------------------- one field each
# Each takes a non-null value and returns it in stored form, or raises QagError.

def _connections(value):
    message = 'connections must be a list of connection names, or "*" for all'
    if value == ALL:
        return ALL
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise _bad(message)
    return sorted(set(value))


def _query_entry(entry) -> tuple[str, bool]:
    shape = 'Each queries entry must be a saved-query name, or an object like {"name": "...", "allow_writes": true}'
    if isinstance(entry, str):
        if not entry:
            raise _bad(shape)
        return entry, False
    if not isinstance(entry, dict):
        raise _bad(shape)
    extra = sorted(str(k) for k in entry if k not in ("name", "allow_writes"))
    if extra:
        raise _bad(f"Unexpected field(s) in a queries entry: {', '.join(extra)}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise _bad(shape)
    writes = entry.get("allow_writes")
    if writes is None:
        return name, False
    if not isinstance(writes, bool):
        raise _bad(f'allow_writes in the queries entry "{name}" must be true or false')
    return name, writes


def _queries(value):
    if value == ALL:
        return ALL
    if not isinstance(value, list):
        raise _bad('queries must be a list of saved-query names, or "*" for all')
    entries: dict[str, bool] = {}
    for raw in value:
        name, writes = _query_entry(raw)
        if name in entries:
            raise _bad(f'queries lists "{name}" more than once')
        entries[name] = writes
    # allow_writes false is the plain name; "*" inside a list is only a name and never carries write access.
    return [{"name": n, "allow_writes": True} if entries[n] and n != ALL else n for n in sorted(entries)]


def _collections(value, existing: Collection[str], already: Collection[str]):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("collections must be a list of collection names")
    seen: set[str] = set()
    for name in value:
        if not _COLLECTION_RE.fullmatch(name):
            raise QagError("invalid_name", COLLECTION_NAME_MESSAGE)
        if name in seen:
            raise _bad(f'collections lists "{name}" more than once')
        seen.add(name)
    # A collection exists only while a query is in it; a grant the key already holds survives it emptying.
    missing = sorted(n for n in seen if n not in already and n not in existing)
    if missing:
        known = ", ".join(sorted(existing)) or "none yet"
        raise _bad(f"No such collection: {', '.join(missing)}. Existing collections: {known}")
    return sorted(seen)


def _bool(field: str):
    def check(value):
        if not isinstance(value, bool):
            raise _bad(f"{field} must be true or false")
        return value
    return check


def _lowered_names(message: str, lower=str.lower):
    def check(value):
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise _bad(message)
        return sorted({lower(v) for v in value})
    return check


def _rate_limit(value):
    if not isinstance(value, str):
        raise _bad("rate_limit must be a string like '100/minute', or null for none")
    try:
        parse_rate_limit(value)
    except ValueError:
        raise _bad("rate_limit must look like '60/minute' (a positive count, then second, minute, hour or day), "
                   f"not {value!r}") from None
    return value  # stored as written; parse_rate_limit reads it back


def _allowed_ips(value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _bad("allowed_ips must be a list of IP addresses or CIDR ranges, or null for no restriction")
    for entry in value:
        try:
            ipaddress.ip_network(entry, strict=False)  # host bits allowed: 10.0.0.1/8 means 10.0.0.0/8
        except ValueError:
            raise _bad(f"{entry!r} is not a valid IP address or CIDR range") from None
    return sorted(set(value))


def normalise_mask(value):
    """A mask rule list (contract 6.3 syntax) in stored form; shared by keys, roles and saved-query versions."""
    if not isinstance(value, list):
        raise _bad('mask must be a list of {"column": "table.column", "action": "hash|mask|null|drop"}')
    rules = []
    for rule in value:
        if not isinstance(rule, dict) or set(rule) != {"column", "action"}:
            raise _bad('Each mask rule is {"column": "table.column", "action": ...} - and nothing else')
        column, action = rule["column"], rule["action"]
        if not isinstance(column, str) or not _MASK_COLUMN_RE.fullmatch(column):
            raise _bad(f"mask column '{column}' must be table.column (or schema.table.column), with * as a "
                       "wildcard: customers.email, *.phone")
        if not isinstance(action, str) or action not in MASK_ACTIONS:
            raise _bad(f"mask action '{action}' must be one of: {', '.join(MASK_ACTIONS)}")
        rules.append({"column": column.lower(), "action": action})
    return rules


def _whole(field: str, low: int, high: int):
    message = f"{field} must be a whole number from {low:,} to {high:,}, or null for none"

    def check(value):
        if not _is_int(value) or not low <= value <= high:
            raise _bad(message)
        return shapes.whole(value)
    return check


def _query_timeout(value):
    # NaN fails the range test too, so no separate finiteness check.
    if not shapes.fits(shapes.QUERY_TIMEOUT, value):
        raise _bad("query_timeout must be a number of seconds from 0.1 to 86,400, or null for none")
    return value


def _quota(value):
    if not isinstance(value, dict) or not set(value) <= {"calls", "rows", "per"}:
        raise _bad('quota is an object with calls and/or rows, and per ("day" or "month"), or null for none')
    per = value.get("per")
    if not isinstance(per, str) or per not in QUOTA_PERIODS:
        raise _bad('quota.per must be "day" or "month"')
    stored = {}
    for part in ("calls", "rows"):
        amount = value.get(part)
        if amount is None:
            continue
        if not shapes.fits(shapes.QUOTA_COUNT, amount):
            raise _bad(f"quota.{part} must be a whole number from 1 to {QUOTA_MAX:,}")
        stored[part] = shapes.whole(amount)
    if not stored:
        raise _bad("quota needs calls, rows or both")
    stored["per"] = per
    return stored


def _expires_at(value):
    if not isinstance(value, str) or not _DATE_RE.fullmatch(value):
        raise _bad("expires_at must be a date in YYYY-MM-DD format, or null for no expiry")
    try:
        date.fromisoformat(value)
    except ValueError:
        raise _bad("expires_at must be a valid calendar date") from None
    return value


_CHECKS = {
    "connections": _connections,
    "queries": _queries,
    "allow_writes": _bool("allow_writes"),
    "rate_limit": _rate_limit,
    "allowed_ips": _allowed_ips,
    "allowed_write_ops": _lowered_names(
        'allowed_write_ops must be a list of SQL keywords (e.g. "insert", "update"), or null for no restriction'),
    # Table names keep all but their ASCII case: each engine folds the rest its own way when it compares them
    # (qag.policy.tables.qualified_grants); SQLite's ärger and Ärger are two tables.
    "allowed_tables": _lowered_names("allowed_tables must be a list of table names, or null for no restriction",
                                     ascii_lower),
    "allowed_functions": _lowered_names("allowed_functions must be a list of function names a table-restricted key "
                                        "may call besides the built-in ones, or null for none"),
    "mask": normalise_mask,
    "max_concurrent": _whole("max_concurrent", shapes.MAX_CONCURRENT["minimum"], shapes.MAX_CONCURRENT["maximum"]),
    "query_timeout": _query_timeout,
    "max_rows": _whole("max_rows", shapes.MAX_ROWS["minimum"], shapes.MAX_ROWS["maximum"]),
    "quota": _quota,
}


# ---------------------------------------------------------------------------------------------- whole bodies

def _require_object(body) -> None:
    if not isinstance(body, dict):
        raise QagError("invalid_body")


def _reject_unknown(body: dict, accepted: frozenset) -> None:
    unknown = sorted(str(k) for k in body if k not in accepted)
    if unknown:
        raise QagError("unknown_field", f"Unknown field(s): {', '.join(unknown)}")


def _name(value, message: str) -> str:
    # "." and ".." match the pattern but no URL can name them: clients resolve those path segments away.
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value) or value in (".", ".."):
        raise QagError("invalid_name", message)
    return value


def _grants(body: dict, *, create: bool, existing: Collection[str], already: Collection[str]) -> dict:
    """The grant fields of body in stored form: complete with defaults on create, only the changes on patch."""
    out = {}
    for field in _CHECK_ORDER:
        if field not in body:
            continue
        value = body[field]
        if value is None:
            if not create and field in NULL_CLEARS:
                out[field] = None
            continue
        if field == "collections":
            out[field] = _collections(value, existing, already)
        else:
            out[field] = _CHECKS[field](value)
    if create:
        return {**key_grant_defaults(), **out}
    return {field: out[field] for field in GRANT_FIELDS if field in out}


def _current_collections(current: Mapping) -> frozenset:
    held = current.get("collections") if isinstance(current, Mapping) else None
    return frozenset(c for c in held if isinstance(c, str)) if isinstance(held, (list, tuple)) else frozenset()


def normalise_key_create(body, *, existing_collections: Collection[str],
                         roles: Collection[str] | None = None) -> dict:
    """POST /api/v1/api-keys body → {"name", "role", "expires_at", "grants"}.

    "grants" is the complete stored grants dict, or None when "role" names a role: the caller copies that
    role's grants (and answers 404 role_not_found for an unknown one). Passing `roles` (the existing role
    names) makes an unknown role fail here, before field checks, as QueryAPIGate orders it.
    """
    _require_object(body)
    _reject_unknown(body, _KEY_CREATE_FIELDS)
    name = _name(body.get("name"), KEY_NAME_MESSAGE)
    if reserved_key_name(name):
        raise QagError("invalid_name", RESERVED_KEY_NAME_MESSAGE)
    role = body.get("role")
    grants = None
    if role is not None:
        if not isinstance(role, str) or (roles is not None and role not in roles):
            raise QagError("role_not_found", f"Role '{role}' not found")
        explicit = [f for f in _ROLE_CONFLICT_ORDER if body.get(f) is not None]
        if explicit:
            raise _bad(f"Cannot combine 'role' with explicit {', '.join(explicit)} - create the key from the role, "
                       "then update it afterward to customize.")
    else:
        grants = _grants(body, create=True, existing=existing_collections, already=())
    expires_at = body.get("expires_at")
    if expires_at is not None:
        expires_at = _expires_at(expires_at)
    return {"name": name, "role": role, "expires_at": expires_at, "grants": grants}


def normalise_key_patch(body, *, current: Mapping, existing_collections: Collection[str]) -> dict:
    """PATCH /api/v1/api-keys/<name> body → the changes in stored form.

    Returns {"grants": {changed grant fields}} plus "active" and/or "expires_at" when they change. `current`
    is the key's stored grants (only its "collections" is read: names already held need not exist).
    """
    _require_object(body)
    _reject_unknown(body, _KEY_PATCH_FIELDS)
    changes: dict = {
        "grants": _grants(body, create=False, existing=existing_collections, already=_current_collections(current)),
    }
    if "expires_at" in body:
        value = body["expires_at"]
        changes["expires_at"] = None if value is None else _expires_at(value)  # null un-expires
    if body.get("active") is not None:
        changes["active"] = _bool("active")(body["active"])
    return changes


def _claim_binding(value):
    if not isinstance(value, bool):
        raise _bad("require_claim_binding must be true or false")
    return value


def normalise_role_create(body, *, existing_collections: Collection[str]) -> dict:
    """POST /api/v1/roles body → {"name", "require_claim_binding", "grants"} (grants complete, stored form)."""
    _require_object(body)
    _reject_unknown(body, _ROLE_CREATE_FIELDS)
    name = _name(body.get("name"), ROLE_NAME_MESSAGE)
    binding = body.get("require_claim_binding")
    binding = False if binding is None else _claim_binding(binding)
    grants = _grants(body, create=True, existing=existing_collections, already=())
    if binding:
        # A claim-bound role reaches queries only by name or collection, so it defaults to no connections.
        if body.get("connections") is None:
            grants["connections"] = []
        elif grants["connections"] != []:
            raise _bad(CLAIM_BINDING_MESSAGE)
    return {"name": name, "require_claim_binding": binding, "grants": grants}


def normalise_role_patch(body, *, current: Mapping, existing_collections: Collection[str]) -> dict:
    """PATCH /api/v1/roles/<name> body → {"grants": {changed grant fields}} [+ "require_claim_binding"].

    `current` is the role's stored grants plus its "require_claim_binding"; the claim-binding rule is
    checked against the role as it will be after the patch.
    """
    _require_object(body)
    _reject_unknown(body, _ROLE_PATCH_FIELDS)
    binding = body.get("require_claim_binding")
    if binding is not None:
        binding = _claim_binding(binding)
    grants = _grants(body, create=False, existing=existing_collections, already=_current_collections(current))
    changes: dict = {"grants": grants}
    if binding is not None:
        changes["require_claim_binding"] = binding
    bound = binding if binding is not None else current.get("require_claim_binding") is True
    connections = grants.get("connections", current.get("connections"))
    if bound and connections != []:
        raise _bad(CLAIM_BINDING_MESSAGE)
    return changes
