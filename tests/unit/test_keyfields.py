"""Management-API body normalisation for API keys and roles (qag.policy.keyfields)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from qag.errors import QagError
from qag.policy.grants import GRANT_FIELDS, key_grant_defaults
from qag.policy.keyfields import (
    RESERVED_KEY_NAME_MESSAGE, normalise_key_create, normalise_key_patch, normalise_role_create, normalise_role_patch,
)

NO_COLLECTIONS: set[str] = set()


def create(**fields):
    return normalise_key_create({"name": "k", **fields}, existing_collections={"sales", "hr.v1"})


def grants_of(**fields):
    return create(**fields)["grants"]


def refused(call, code="invalid_body"):
    with pytest.raises(QagError) as info:
        call()
    assert info.value.code == code
    return info.value.message


def refused_create(code="invalid_body", **fields):
    return refused(lambda: create(**fields), code)


# ---------------------------------------------------------------------------------------------- shape & fields

def test_create_defaults_match_key_grant_defaults():
    result = normalise_key_create({"name": "plain"}, existing_collections=NO_COLLECTIONS)
    assert result == {"name": "plain", "role": None, "expires_at": None, "grants": key_grant_defaults()}
    assert list(result["grants"]) == list(GRANT_FIELDS)
    json.dumps(result)  # the stored shape is JSON


@pytest.mark.parametrize("body", [[], "x", None, 5, ["name"]])
def test_body_must_be_an_object(body):
    for call in (lambda: normalise_key_create(body, existing_collections=NO_COLLECTIONS),
                 lambda: normalise_key_patch(body, current={}, existing_collections=NO_COLLECTIONS),
                 lambda: normalise_role_create(body, existing_collections=NO_COLLECTIONS),
                 lambda: normalise_role_patch(body, current={}, existing_collections=NO_COLLECTIONS)):
        assert refused(call) == "Request body must be a JSON object"


@pytest.mark.parametrize("extra, message", [
    ({"secret": "sk_x"}, "Unknown field(s): secret"),
    ({"zeta": 1, "alpha": 2, "secret": "x"}, "Unknown field(s): alpha, secret, zeta"),
    ({"created_at": "x", "example": True, "usage": {}, "expired": True},
     "Unknown field(s): created_at, example, expired, usage"),
    ({"active": False}, "Unknown field(s): active"),  # active is PATCH-only (contract 5.4 routes)
    ({"require_claim_binding": True}, "Unknown field(s): require_claim_binding"),
    ({"created_from_role": "r", "last_used_at": None}, "Unknown field(s): created_from_role, last_used_at"),
])
def test_key_create_unknown_fields(extra, message):
    assert refused_create("unknown_field", **extra) == message


def test_unknown_fields_are_reported_before_a_bad_name():
    body = {"name": "bad/name", "zz": 1}
    assert refused(lambda: normalise_key_create(body, existing_collections=NO_COLLECTIONS),
                   "unknown_field") == "Unknown field(s): zz"


@pytest.mark.parametrize("body, message", [
    ({"name": "x", "role": "y"}, "Unknown field(s): name, role"),
    ({"secret": "x"}, "Unknown field(s): secret"),
    ({"require_claim_binding": True}, "Unknown field(s): require_claim_binding"),
])
def test_key_patch_unknown_fields(body, message):
    assert refused(lambda: normalise_key_patch(body, current={}, existing_collections=NO_COLLECTIONS),
                   "unknown_field") == message


@pytest.mark.parametrize("call, message", [
    (lambda: normalise_role_create({"name": "r", "expires_at": "2099-01-01", "active": True},
                                   existing_collections=NO_COLLECTIONS), "Unknown field(s): active, expires_at"),
    (lambda: normalise_role_create({"name": "r", "role": "x"}, existing_collections=NO_COLLECTIONS),
     "Unknown field(s): role"),
    (lambda: normalise_role_patch({"expires_at": None, "active": True}, current={},
                                  existing_collections=NO_COLLECTIONS), "Unknown field(s): active, expires_at"),
    (lambda: normalise_role_patch({"name": "z"}, current={}, existing_collections=NO_COLLECTIONS),
     "Unknown field(s): name"),
])
def test_role_unknown_fields(call, message):
    assert refused(call, "unknown_field") == message


@pytest.mark.parametrize("name", ["a", "a 2", "x.y-z_1", "naïve ü", "n" * 100])
def test_valid_names(name):
    assert normalise_key_create({"name": name}, existing_collections=NO_COLLECTIONS)["name"] == name
    assert normalise_role_create({"name": name}, existing_collections=NO_COLLECTIONS)["name"] == name


@pytest.mark.parametrize("body", [{}, {"name": ""}, {"name": None}, {"name": 123}, {"name": "a/3"},
                                  {"name": "n" * 101}, {"name": "x\n"}, {"name": "tab\there"}, {"name": ["a"]}])
def test_invalid_names(body):
    assert refused(lambda: normalise_key_create(body, existing_collections=NO_COLLECTIONS), "invalid_name") == \
        "An API key name is 1-100 letters, digits, spaces, '.', '_' or '-'"
    assert refused(lambda: normalise_role_create(body, existing_collections=NO_COLLECTIONS), "invalid_name") == \
        "A role name is 1-100 letters, digits, spaces, '.', '_' or '-'"


@pytest.mark.parametrize("name", ["admin", "Admin", "ADMIN", "cli", "CLI", "-",
                                  # what reads like them in a log line
                                  "admin ", " admin", "admin.", "\uff41\uff44\uff4d\uff49\uff4e", "cli ", "- ", " - "])
def test_names_of_callers_that_are_no_keys_are_refused_to_keys(name):
    """A scoped key sees the runs and events whose key_name is its own: named like the admin, it would see theirs."""
    assert refused(lambda: normalise_key_create({"name": name}, existing_collections=NO_COLLECTIONS),
                   "invalid_name") == RESERVED_KEY_NAME_MESSAGE
    # roles name no caller (a signed-in user is jwt:<subject>), so a role may be called anything valid
    assert normalise_role_create({"name": name}, existing_collections=NO_COLLECTIONS)["name"] == name


@pytest.mark.parametrize("name", ["admin2", "the admin", "cli-tool", "--", "_", "admin_", "-admin"])
def test_names_near_reserved_ones_are_keys_like_any_other(name):
    assert normalise_key_create({"name": name}, existing_collections=NO_COLLECTIONS)["name"] == name


# connections ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, stored", [
    ({}, "*"),                                   # B5.13: no connections → every connection
    ({"connections": None}, "*"),
    ({"connections": "*"}, "*"),
    ({"connections": []}, []),                   # B5.13: [] → none
    ({"connections": ["b", "a", "b"]}, ["a", "b"]),
    ({"connections": ["*", "a"]}, ["*", "a"]),   # a "*" inside a list is just a name, as in QueryAPIGate
])
def test_connections_stored(fields, stored):
    assert grants_of(**fields)["connections"] == stored


@pytest.mark.parametrize("value", ["x", 5, [1], {"a": 1}, [""], ["a", None], True, "**"])
def test_connections_refused(value):
    assert refused_create(connections=value) == 'connections must be a list of connection names, or "*" for all'


# queries ----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fields, stored", [
    ({}, []),
    ({"queries": None}, []),
    ({"queries": "*"}, "*"),
    ({"queries": ["z", "a"]}, ["a", "z"]),
    ({"queries": [{"name": "z", "allow_writes": False}, "b", {"name": "c", "allow_writes": True}]},
     ["b", {"name": "c", "allow_writes": True}, "z"]),
    ({"queries": [{"name": "x"}]}, ["x"]),
    ({"queries": [{"name": "x", "allow_writes": None}]}, ["x"]),
    ({"queries": ["*"]}, ["*"]),
    ({"queries": [{"name": "*", "allow_writes": True}]}, ["*"]),  # "*" never carries write access
])
def test_queries_stored(fields, stored):
    assert grants_of(**fields)["queries"] == stored


@pytest.mark.parametrize("value, message", [
    ("x", 'queries must be a list of saved-query names, or "*" for all'),
    ({"name": "x"}, 'queries must be a list of saved-query names, or "*" for all'),
    (5, 'queries must be a list of saved-query names, or "*" for all'),
    (["x", "x"], 'queries lists "x" more than once'),
    (["x", {"name": "x"}], 'queries lists "x" more than once'),
    ([{"name": "b", "allow_writes": True}, {"name": "b", "allow_writes": False}], 'queries lists "b" more than once'),
    ([{"allow_writes": True}], 'Each queries entry must be a saved-query name, or an object like '
                               '{"name": "...", "allow_writes": true}'),
    ([1], 'Each queries entry must be a saved-query name, or an object like {"name": "...", "allow_writes": true}'),
    ([""], 'Each queries entry must be a saved-query name, or an object like {"name": "...", "allow_writes": true}'),
    ([{"name": 1}], 'Each queries entry must be a saved-query name, or an object like '
                    '{"name": "...", "allow_writes": true}'),
    ([{"name": ""}], 'Each queries entry must be a saved-query name, or an object like '
                     '{"name": "...", "allow_writes": true}'),
    ([["x"]], 'Each queries entry must be a saved-query name, or an object like {"name": "...", "allow_writes": true}'),
    ([{"name": "x", "y": 1}], "Unexpected field(s) in a queries entry: y"),
    ([{"name": "x", "z": 1, "a": 2}], "Unexpected field(s) in a queries entry: a, z"),
    ([{"name": "x", "allow_writes": "yes"}], 'allow_writes in the queries entry "x" must be true or false'),
    ([{"name": "x", "allow_writes": 0}], 'allow_writes in the queries entry "x" must be true or false'),
])
def test_queries_refused(value, message):
    assert refused_create(queries=value) == message


# collections ------------------------------------------------------------------------------------------------------

def test_collections_stored_sorted():
    assert grants_of(collections=["sales", "hr.v1"])["collections"] == ["hr.v1", "sales"]
    assert grants_of(collections=[])["collections"] == []
    assert grants_of(collections=None)["collections"] == []


@pytest.mark.parametrize("existing, value, message", [
    (set(), ["x"], "No such collection: x. Existing collections: none yet"),
    ({"sales", "hr.v1"}, ["sales", "zz", "aa"], "No such collection: aa, zz. Existing collections: hr.v1, sales"),
])
def test_collections_must_exist(existing, value, message):
    assert refused(lambda: normalise_key_create({"name": "k", "collections": value},
                                                existing_collections=existing)) == message


@pytest.mark.parametrize("value, code, message", [
    ("x", "invalid_body", "collections must be a list of collection names"),
    ("*", "invalid_body", "collections must be a list of collection names"),
    ([1], "invalid_body", "collections must be a list of collection names"),
    (["sales", "sales"], "invalid_body", 'collections lists "sales" more than once'),
    (["X"], "invalid_name", "A collection name must be 1-63 characters: lowercase letters, digits, '.', '_' "
                            "and '-', starting with a letter or digit"),
    ([""], "invalid_name", None),
    (["-a"], "invalid_name", None),
    (["a" * 64], "invalid_name", None),
    (["sales\n"], "invalid_name", None),
])
def test_collections_refused(value, code, message):
    got = refused_create(code, collections=value)
    if message is not None:
        assert got == message


def test_collections_patch_exempts_names_already_held():
    current = {**key_grant_defaults(), "collections": ["hr.v1", "sales"]}
    # "sales" emptied out since it was granted: keeping it is fine, adding "bb" is not.
    changes = normalise_key_patch({"collections": ["sales", "hr.v1"]}, current=current,
                                  existing_collections={"hr.v1"})
    assert changes["grants"] == {"collections": ["hr.v1", "sales"]}
    assert refused(lambda: normalise_key_patch({"collections": ["sales", "bb"]}, current=current,
                                               existing_collections={"hr.v1"})) == \
        "No such collection: bb. Existing collections: hr.v1"


# allow_writes, allowed_write_ops, allowed_tables --------------------------------------------------------------------

@pytest.mark.parametrize("value, stored", [(True, True), (False, False), (None, False)])
def test_allow_writes(value, stored):
    assert grants_of(allow_writes=value)["allow_writes"] is stored


@pytest.mark.parametrize("value", ["yes", 1, 0, [], {}])
def test_allow_writes_refused(value):
    assert refused_create(allow_writes=value) == "allow_writes must be true or false"


@pytest.mark.parametrize("field", ["allowed_write_ops", "allowed_tables"])
@pytest.mark.parametrize("value, stored", [
    (["INSERT", "insert", "Delete"], ["delete", "insert"]),
    (["T", "main.Film", "t"], ["main.film", "t"]),
    ([], []),
    (None, None),
])
def test_lowered_lists(field, value, stored):
    assert grants_of(**{field: value})[field] == stored


@pytest.mark.parametrize("value", ["t", 123, [1, 2], [""], ["  "], ["t", None], {"t": 1}, True])  # B6.7
def test_allowed_tables_refused(value):
    assert refused_create(allowed_tables=value) == \
        "allowed_tables must be a list of table names, or null for no restriction"


@pytest.mark.parametrize("value", ["insert", 5, [""], [1], [["insert"]]])
def test_allowed_write_ops_refused(value):
    assert refused_create(allowed_write_ops=value) == \
        'allowed_write_ops must be a list of SQL keywords (e.g. "insert", "update"), or null for no restriction'


# rate_limit -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["60/minute", " 5 / Minutes ", "1/SECOND", "100/hours", "3/day", "5/minute\n"])
def test_rate_limit_stored_as_given(value):
    assert grants_of(rate_limit=value)["rate_limit"] == value


@pytest.mark.parametrize("value, message", [
    ("5 per minute", "rate_limit must look like '60/minute' (a positive count, then second, minute, hour or day), "
                     "not '5 per minute'"),
    ("0/minute", "rate_limit must look like '60/minute' (a positive count, then second, minute, hour or day), "
                 "not '0/minute'"),
    ("10/week", None), ("", None), ("-1/minute", None), ("1.5/minute", None), ("/minute", None),
    # the host's buckets hold 64-bit counts (a wider one failed every call of the key with a 500); ASCII digits
    ("1000000000000000000/second", None), ("99999999999999999999999999999/second", None), ("\u0661\u0660/minute", None),
    ("it's", "rate_limit must look like '60/minute' (a positive count, then second, minute, hour or day), "
             "not \"it's\""),
    (5, "rate_limit must be a string like '100/minute', or null for none"),
    (["5/minute"], "rate_limit must be a string like '100/minute', or null for none"),
])
def test_rate_limit_refused(value, message):
    got = refused_create(rate_limit=value)
    assert got.startswith("rate_limit must")
    if message is not None:
        assert got == message


# allowed_ips ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, stored", [
    (["10.0.0.1/8", "::1", "10.0.0.1", "10.0.0.1"], ["10.0.0.1", "10.0.0.1/8", "::1"]),  # host bits allowed
    ([], []),
    (None, None),
    (["2001:db8::/32", "192.168.1.0/24"], ["192.168.1.0/24", "2001:db8::/32"]),
])
def test_allowed_ips_stored(value, stored):
    assert grants_of(allowed_ips=value)["allowed_ips"] == stored


@pytest.mark.parametrize("value, message", [
    (["nope"], "'nope' is not a valid IP address or CIDR range"),
    (["10.1.1.1/33"], "'10.1.1.1/33' is not a valid IP address or CIDR range"),
    ([" 10.0.0.2 "], "' 10.0.0.2 ' is not a valid IP address or CIDR range"),
    (["1.2.3.4", ""], "'' is not a valid IP address or CIDR range"),
    ("10.0.0.1", "allowed_ips must be a list of IP addresses or CIDR ranges, or null for no restriction"),
    ([1], "allowed_ips must be a list of IP addresses or CIDR ranges, or null for no restriction"),
])
def test_allowed_ips_refused(value, message):
    assert refused_create(allowed_ips=value) == message


# mask -------------------------------------------------------------------------------------------------------------

COLUMN_MESSAGE = ("mask column '{}' must be table.column (or schema.table.column), with * as a wildcard: "
                  "customers.email, *.phone")


@pytest.mark.parametrize("value, stored", [
    ([{"column": "Customers.Email", "action": "hash"}], [{"column": "customers.email", "action": "hash"}]),
    ([{"column": "*.ph$ne", "action": "mask"}, {"column": "s.t.c", "action": "keep"}],
     [{"column": "*.ph$ne", "action": "mask"}, {"column": "s.t.c", "action": "keep"}]),
    ([{"column": "a.b", "action": a} for a in ("drop", "null")],
     [{"column": "a.b", "action": a} for a in ("drop", "null")]),
    ([], []),
    (None, None),
])
def test_mask_stored(value, stored):
    assert grants_of(mask=value)["mask"] == stored


@pytest.mark.parametrize("value, message", [
    ({"column": "a.b", "action": "hash"},
     'mask must be a list of {"column": "table.column", "action": "hash|mask|null|drop"}'),
    ([{"column": "email", "action": "hash"}], COLUMN_MESSAGE.format("email")),
    ([{"column": "a.b.c.d", "action": "hash"}], COLUMN_MESSAGE.format("a.b.c.d")),
    ([{"column": "a-x.b", "action": "hash"}], COLUMN_MESSAGE.format("a-x.b")),
    ([{"column": "a..b", "action": "hash"}], COLUMN_MESSAGE.format("a..b")),
    ([{"column": " a.b", "action": "hash"}], COLUMN_MESSAGE.format(" a.b")),
    ([{"column": 1, "action": "hash"}], COLUMN_MESSAGE.format("1")),
    ([{"column": "a.b", "action": "zap"}], "mask action 'zap' must be one of: drop, null, mask, hash, keep"),
    ([{"column": "a.b", "action": "HASH"}], "mask action 'HASH' must be one of: drop, null, mask, hash, keep"),
    ([{"column": "a.b", "action": 1}], "mask action '1' must be one of: drop, null, mask, hash, keep"),
    ([{"column": "a.b", "action": "hash", "x": 1}],
     'Each mask rule is {"column": "table.column", "action": ...} - and nothing else'),
    ([{"column": "a.b"}], 'Each mask rule is {"column": "table.column", "action": ...} - and nothing else'),
    (["a.b"], 'Each mask rule is {"column": "table.column", "action": ...} - and nothing else'),
])
def test_mask_refused(value, message):
    assert refused_create(mask=value) == message


# limits -----------------------------------------------------------------------------------------------------------

LIMIT_MESSAGES = {
    "max_concurrent": "max_concurrent must be a whole number from 1 to 1,000, or null for none",
    "query_timeout": "query_timeout must be a number of seconds from 0.1 to 86,400, or null for none",
    "max_rows": "max_rows must be a whole number from 1 to 10,000,000, or null for none",
}


@pytest.mark.parametrize("field, value", [
    ("max_concurrent", 1), ("max_concurrent", 1000), ("query_timeout", 0.1), ("query_timeout", 5),
    ("query_timeout", 86400), ("query_timeout", 2.5), ("max_rows", 1), ("max_rows", 10_000_000),
])
def test_limits_accepted(field, value):
    stored = grants_of(**{field: value})[field]
    assert stored == value and type(stored) is type(value)


@pytest.mark.parametrize("field, value", [
    ("max_concurrent", 0), ("max_concurrent", 1001), ("max_concurrent", True), ("max_concurrent", 2.5),
    ("max_concurrent", "2"), ("query_timeout", 0.05), ("query_timeout", 86401), ("query_timeout", "5"),
    ("query_timeout", False), ("query_timeout", float("nan")), ("query_timeout", float("inf")),
    ("query_timeout", 10 ** 400), ("max_rows", 0), ("max_rows", 10_000_001), ("max_rows", 1.5), ("max_rows", 5.5),
    ("max_rows", True), ("max_rows", [5]),
])
def test_limits_refused(field, value):
    assert refused_create(**{field: value}) == LIMIT_MESSAGES[field]


# quota ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, stored", [
    ({"calls": 100, "rows": 1000, "per": "day"}, {"calls": 100, "rows": 1000, "per": "day"}),
    ({"per": "month", "rows": 5, "calls": None}, {"rows": 5, "per": "month"}),
    ({"rows": 5, "calls": 3, "per": "day"}, {"calls": 3, "rows": 5, "per": "day"}),
    ({"calls": 10 ** 12, "per": "day"}, {"calls": 10 ** 12, "per": "day"}),
    (None, None),
])
def test_quota_stored(value, stored):
    result = grants_of(quota=value)["quota"]
    assert result == stored
    assert result is None or list(result) == list(stored)


SHAPE = 'quota is an object with calls and/or rows, and per ("day" or "month"), or null for none'


@pytest.mark.parametrize("value, message", [
    ("x", SHAPE), ([], SHAPE), ({"calls": 1, "per": "day", "x": 1}, SHAPE),
    ({"per": "day"}, "quota needs calls, rows or both"),
    ({"calls": None, "rows": None, "per": "day"}, "quota needs calls, rows or both"),
    ({"calls": 1, "per": "week"}, 'quota.per must be "day" or "month"'),
    ({"calls": 1}, 'quota.per must be "day" or "month"'),
    ({}, 'quota.per must be "day" or "month"'),
    ({"calls": 1, "per": ["day"]}, 'quota.per must be "day" or "month"'),
    ({"calls": 0, "per": "day"}, "quota.calls must be a whole number from 1 to 1,000,000,000,000"),
    ({"rows": 10 ** 12 + 1, "per": "day"}, "quota.rows must be a whole number from 1 to 1,000,000,000,000"),
    ({"rows": True, "per": "day"}, "quota.rows must be a whole number from 1 to 1,000,000,000,000"),
    ({"rows": 5.5, "per": "month"}, "quota.rows must be a whole number from 1 to 1,000,000,000,000"),
])
def test_quota_refused(value, message):
    assert refused_create(quota=value) == message


def test_whole_floats_are_integers():
    # JSON Schema's integer (what /openapi.json publishes) includes 2.0; stored as the int (docs/compatibility.md).
    assert grants_of(max_concurrent=2.0)["max_concurrent"] == 2 and type(grants_of(max_rows=5.0)["max_rows"]) is int
    assert grants_of(quota={"rows": 5.0, "per": "month"})["quota"] == {"rows": 5, "per": "month"}


# expires_at, active ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, message", [
    ("2026-02-30", "expires_at must be a valid calendar date"),
    ("0000-01-01", "expires_at must be a valid calendar date"),
    ("2026-2-3", "expires_at must be a date in YYYY-MM-DD format, or null for no expiry"),
    (20260101, "expires_at must be a date in YYYY-MM-DD format, or null for no expiry"),
    ("2026-01-01T00:00:00", "expires_at must be a date in YYYY-MM-DD format, or null for no expiry"),
    ("2026-01-01\n", "expires_at must be a date in YYYY-MM-DD format, or null for no expiry"),
    ("\uff12\uff10\uff12\uff16-01-01", "expires_at must be a date in YYYY-MM-DD format, or null for no expiry"),
])
def test_expires_at_refused(value, message):
    assert refused_create(expires_at=value) == message
    assert refused(lambda: normalise_key_patch({"expires_at": value}, current={},
                                               existing_collections=NO_COLLECTIONS)) == message


def test_expires_at_accepted():
    assert create(expires_at="2026-01-01")["expires_at"] == "2026-01-01"
    assert create(expires_at=None)["expires_at"] is None


@pytest.mark.parametrize("body, changes", [
    ({"active": False}, {"active": False}),
    ({"active": True}, {"active": True}),
    ({"active": None}, {}),                       # null = unchanged
    ({"expires_at": None}, {"expires_at": None}),  # null un-expires
    ({"expires_at": "2099-12-31"}, {"expires_at": "2099-12-31"}),
])
def test_key_patch_active_and_expiry(body, changes):
    assert normalise_key_patch(body, current={}, existing_collections=NO_COLLECTIONS) == {"grants": {}, **changes}


@pytest.mark.parametrize("value", ["no", 0, 1, []])
def test_key_patch_active_refused(value):
    assert refused(lambda: normalise_key_patch({"active": value}, current={},
                                               existing_collections=NO_COLLECTIONS)) == "active must be true or false"


# PATCH null semantics -----------------------------------------------------------------------------------------------

def test_patch_rate_limit_null_clears_only_it():  # B5.14
    current = {**key_grant_defaults(), "rate_limit": "5/minute", "allowed_ips": ["1.2.3.4"], "connections": ["a"]}
    changes = normalise_key_patch({"rate_limit": None}, current=current, existing_collections=NO_COLLECTIONS)
    assert changes == {"grants": {"rate_limit": None}}
    merged = {**current, **changes["grants"]}
    assert merged["allowed_ips"] == ["1.2.3.4"] and merged["connections"] == ["a"] and merged["rate_limit"] is None


@pytest.mark.parametrize("field", ["rate_limit", "allowed_ips", "allowed_write_ops", "allowed_tables", "mask",
                                   "max_concurrent", "query_timeout", "max_rows", "quota"])
def test_patch_null_clears(field):
    changes = normalise_key_patch({field: None}, current={}, existing_collections=NO_COLLECTIONS)
    assert changes == {"grants": {field: None}}


@pytest.mark.parametrize("field", ["connections", "queries", "collections", "allow_writes"])
def test_patch_null_leaves_unchanged(field):
    for patch in (normalise_key_patch, normalise_role_patch):
        assert patch({field: None}, current={}, existing_collections=NO_COLLECTIONS) == {"grants": {}}


def test_patch_returns_only_mentioned_fields_in_grant_order():
    changes = normalise_key_patch({"quota": {"calls": 3, "per": "day"}, "connections": "*", "max_rows": 7},
                                  current={}, existing_collections=NO_COLLECTIONS)
    assert list(changes["grants"]) == ["connections", "max_rows", "quota"]
    assert changes["grants"] == {"connections": "*", "max_rows": 7, "quota": {"calls": 3, "per": "day"}}


# check order (which field a bad body names first) -------------------------------------------------------------------

@pytest.mark.parametrize("fields, first", [
    ({"connections": 5, "collections": 5}, "collections"),
    ({"queries": 5, "connections": 5}, "connections"),
    ({"rate_limit": "x", "queries": 5}, "queries"),
    ({"allowed_write_ops": 5, "rate_limit": "x"}, "rate_limit"),
    ({"allowed_write_ops": 5, "allowed_ips": 5}, "allowed_ips"),
    ({"allowed_tables": 5, "allowed_write_ops": 5}, "allowed_write_ops"),
    ({"mask": 5, "allowed_tables": 5}, "allowed_tables"),
    ({"max_concurrent": 0, "mask": 5}, "mask"),
    ({"quota": 5, "max_rows": 0}, "max_rows"),
    ({"expires_at": "x", "quota": 5}, "quota"),
])
def test_check_order(fields, first):
    assert refused_create(**fields).startswith(first)


# role on key create (B5.17: copying is the caller's) -----------------------------------------------------------------

def test_role_create_returns_role_without_grants():
    result = normalise_key_create({"name": "k", "role": "analyst", "expires_at": "2099-01-01", "allowed_ips": None},
                                  existing_collections=NO_COLLECTIONS, roles={"analyst"})
    assert result == {"name": "k", "role": "analyst", "expires_at": "2099-01-01", "grants": None}


@pytest.mark.parametrize("fields, listed", [
    ({"connections": ["y"]}, "connections"),
    ({"connections": []}, "connections"),
    ({"allow_writes": False}, "allow_writes"),
    ({"max_rows": 5, "connections": ["y"]}, "connections, max_rows"),
    ({"quota": {"calls": 1, "per": "day"}, "max_rows": 1, "query_timeout": 1, "max_concurrent": 1, "mask": [],
      "allowed_ips": [], "rate_limit": "1/day", "allowed_tables": [], "allowed_write_ops": [], "allow_writes": True,
      "collections": [], "queries": [], "connections": []},
     "connections, allow_writes, queries, collections, rate_limit, allowed_ips, allowed_write_ops, allowed_tables, "
     "mask, max_concurrent, query_timeout, max_rows, quota"),
    ({"rate_limit": "bad"}, "rate_limit"),  # the combination is refused before the value is looked at
])
def test_role_with_explicit_grants_refused(fields, listed):
    body = {"name": "k", "role": "analyst", **fields}
    message = refused(lambda: normalise_key_create(body, existing_collections=NO_COLLECTIONS))
    assert message == (f"Cannot combine 'role' with explicit {listed} - create the key from the role, "
                       "then update it afterward to customize.")


@pytest.mark.parametrize("role, roles, message", [
    ("nope", {"analyst"}, "Role 'nope' not found"),
    ("", {"analyst"}, "Role '' not found"),
    (5, None, "Role '5' not found"),
])
def test_unknown_role(role, roles, message):
    body = {"name": "k", "role": role, "connections": ["x"]}  # an unknown role wins over the combination
    assert refused(lambda: normalise_key_create(body, existing_collections=NO_COLLECTIONS, roles=roles),
                   "role_not_found") == message


def test_role_null_means_no_role():
    assert create(role=None)["grants"] == key_grant_defaults()


# roles --------------------------------------------------------------------------------------------------------------

def test_role_create_defaults_and_grants():
    result = normalise_role_create({"name": "r", "rate_limit": "2/second", "queries": ["b", "a"]},
                                   existing_collections=NO_COLLECTIONS)
    assert result == {"name": "r", "require_claim_binding": False,
                      "grants": {**key_grant_defaults(), "rate_limit": "2/second", "queries": ["a", "b"]}}


def test_role_claim_binding():
    bound = normalise_role_create({"name": "r", "require_claim_binding": True}, existing_collections=NO_COLLECTIONS)
    assert bound["require_claim_binding"] is True and bound["grants"]["connections"] == []
    explicit = {"name": "r", "require_claim_binding": True, "connections": []}
    assert normalise_role_create(explicit, existing_collections=NO_COLLECTIONS)["grants"]["connections"] == []
    for connections in (["c"], "*"):
        body = {"name": "r", "require_claim_binding": True, "connections": connections}
        assert "require_claim_binding" in refused(lambda: normalise_role_create(body, existing_collections=set()))
    assert normalise_role_create({"name": "r", "require_claim_binding": None},
                                 existing_collections=NO_COLLECTIONS)["require_claim_binding"] is False
    assert refused(lambda: normalise_role_create({"name": "r", "require_claim_binding": "x"},
                                                 existing_collections=NO_COLLECTIONS)) == \
        "require_claim_binding must be true or false"


def test_role_patch_claim_binding_checks_the_result():
    open_role = {**key_grant_defaults(), "connections": ["a"], "require_claim_binding": False}
    assert "require_claim_binding" in refused(lambda: normalise_role_patch(
        {"require_claim_binding": True}, current=open_role, existing_collections=NO_COLLECTIONS))
    assert normalise_role_patch({"require_claim_binding": True, "connections": []}, current=open_role,
                                existing_collections=NO_COLLECTIONS) == \
        {"grants": {"connections": []}, "require_claim_binding": True}
    bound = {**open_role, "connections": [], "require_claim_binding": True}
    assert "require_claim_binding" in refused(lambda: normalise_role_patch(
        {"connections": "*"}, current=bound, existing_collections=NO_COLLECTIONS))
    assert normalise_role_patch({"require_claim_binding": False, "connections": "*"}, current=bound,
                                existing_collections=NO_COLLECTIONS)["grants"] == {"connections": "*"}
    assert normalise_role_patch({"require_claim_binding": None}, current=bound,
                                existing_collections=NO_COLLECTIONS) == {"grants": {}}


def test_role_patch_grants():
    changes = normalise_role_patch({"rate_limit": "1/day", "connections": None, "mask": None}, current={},
                                   existing_collections=NO_COLLECTIONS)
    assert changes == {"grants": {"rate_limit": "1/day", "mask": None}}


# properties ---------------------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    | st.sampled_from(["*", "1/minute", "10.0.0.0/8", "::1", "a.b", "hash", "day", "2026-01-01", "sales"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["name", "allow_writes", "column", "action", "calls", "rows", "per", "x"])
        | st.text(max_size=5),
        inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(
    [*GRANT_FIELDS, "name", "role", "active", "expires_at", "require_claim_binding", "secret"])
bodies = st.dictionaries(field_names, json_values, max_size=6) | json_values


@settings(max_examples=400, deadline=None)
@given(bodies, json_values)
def test_normalisation_only_ever_raises_qagerror(body, current):
    current = current if isinstance(current, dict) else {}
    calls = [
        lambda: normalise_key_create(body, existing_collections={"sales"}),
        lambda: normalise_key_create(body, existing_collections={"sales"}, roles={"r"}),
        lambda: normalise_key_patch(body, current=current, existing_collections={"sales"}),
        lambda: normalise_role_create(body, existing_collections={"sales"}),
        lambda: normalise_role_patch(body, current=current, existing_collections={"sales"}),
    ]
    for call in calls:
        try:
            result = call()
        except QagError as error:
            assert error.status in (400, 404)
        else:
            json.dumps(result, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(GRANT_FIELDS), json_values, max_size=6))
def test_stored_grants_normalise_to_themselves(fields):
    """Whatever normalisation accepts, it accepts again unchanged: the stored shape is a fixed point."""
    try:
        stored = normalise_key_create({"name": "k", **fields}, existing_collections={"sales"})["grants"]
    except QagError:
        return
    again = normalise_key_create({"name": "k", **stored}, existing_collections=set(stored["collections"]))
    assert again["grants"] == stored
