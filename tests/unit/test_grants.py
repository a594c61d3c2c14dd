"""Per-call grant decisions for API keys (qag.policy.grants)."""

from __future__ import annotations

import json
from datetime import date

import pytest
from hypothesis import given, strategies as st

from qag.errors import QagError
from qag.policy.grants import (
    GRANT_FIELDS, Grants, IpAllowList, allowed_write_ops, check_connection, check_run_query, compile_ips,
    effective_limits, expired, grants_from_json, ip_allowed, key_grant_defaults, listable, may_run_query,
    may_use_connection, may_write, parse_rate_limit,
)
from qag.policy.keyfields import normalise_key_create


def key(**fields) -> Grants:
    """Grants of a key created through the management API with these fields."""
    stored = normalise_key_create({"name": "k", **fields}, existing_collections={"finance", "sales"})["grants"]
    return Grants.from_stored(stored)


def run(grants, name="q", collection=None, saved="a", chosen=None):
    return may_run_query(grants, query_name=name, collection=collection, saved_connection=saved,
                         chosen_connection=saved if chosen is None else chosen)


# ---------------------------------------------------------------------------------------------- shape

def test_grant_fields_and_defaults_agree():
    defaults = key_grant_defaults()
    assert tuple(defaults) == GRANT_FIELDS
    assert defaults["connections"] == "*" and defaults["queries"] == [] and defaults["allow_writes"] is False
    defaults["queries"].append("x")
    assert key_grant_defaults()["queries"] == []  # a fresh dict each time


@pytest.mark.parametrize("text, parsed", [
    ("60/minute", (60, 60)), ("1/second", (1, 1)), (" 5 / Minutes ", (5, 60)), ("100/HOURS", (100, 3600)),
    ("3/day", (3, 86400)), ("2/days\n", (2, 86400)),
])
def test_parse_rate_limit(text, parsed):
    assert parse_rate_limit(text) == parsed


@pytest.mark.parametrize("text", ["0/minute", "5 per minute", "10/week", "", "-1/second", "1.5/minute", None, 5])
def test_parse_rate_limit_refuses(text):
    with pytest.raises(ValueError):
        parse_rate_limit(text)


# ---------------------------------------------------------------------------------------------- connections

def test_no_connections_field_means_every_connection():  # B5.13
    grants = key()
    assert may_use_connection(grants, "lite") and may_use_connection(grants, "anything")
    check_connection(grants, "lite")


def test_empty_connections_means_none():  # B5.13
    grants = key(connections=[])
    assert not may_use_connection(grants, "lite")
    with pytest.raises(QagError) as info:
        check_connection(grants, "lite")
    assert info.value.code == "connection_forbidden" and info.value.status == 403
    assert info.value.message == "This API key is not permitted to use the connection 'lite'"


def test_listed_connections():
    grants = key(connections=["b", "a"])
    assert may_use_connection(grants, "a") and may_use_connection(grants, "b")
    assert not may_use_connection(grants, "c") and not may_use_connection(grants, None)
    assert not may_use_connection(key(connections=["*", "a"]), "c")  # "*" inside a list is only a name


# ---------------------------------------------------------------------------------------------- reachability

def test_query_scoped_key():  # B6.1
    grants = key(connections=[], queries=["monthly_revenue"])
    assert run(grants, "monthly_revenue")
    assert not run(grants, "internal_only")
    assert not may_use_connection(grants, "a")  # so ad-hoc SQL on the same connection is refused


@pytest.mark.parametrize("fields", [{"queries": ["q"]}, {"collections": ["sales"]}, {"queries": "*"}])
def test_query_and_collection_grants_cover_only_the_saved_connection(fields):  # B6.2
    grants = key(connections=[], **fields)
    assert run(grants, "q", "sales", saved="a", chosen="a")
    assert not run(grants, "q", "sales", saved="a", chosen="b")
    assert not run(grants, "q", "sales", saved=None, chosen="a")  # no saved connection → a connection grant
    with pytest.raises(QagError) as info:
        check_run_query(grants, query_name="q", collection="sales", saved_connection="a", chosen_connection="b")
    assert info.value.code == "connection_forbidden"
    assert info.value.message == "This API key is not permitted to use the connection 'b'"
    check_run_query(grants, query_name="q", collection="sales", saved_connection="a", chosen_connection="a")


def test_chosen_connection_granted():  # B6.2: holding the chosen connection is enough
    grants = key(connections=["b"], queries=["q"])
    assert run(grants, "q", saved="a", chosen="b")
    assert run(grants, "other", saved="a", chosen="b")
    assert run(grants, "q", saved=None, chosen="b")
    assert not run(grants, "other", saved="a", chosen="a")
    assert not run(grants, "other", saved=None, chosen="a")


def test_collection_grant():
    grants = key(connections=[], collections=["sales"])
    assert run(grants, "q", "sales") and not run(grants, "q", "finance") and not run(grants, "q", None)


def test_queries_star_runs_any_saved_query_but_no_sql_and_no_write():  # B6.3
    grants = key(connections=[], queries="*")
    assert run(grants, "anything") and run(grants, "other", "finance", saved="z")
    assert not may_use_connection(grants, "a")
    assert not may_write(grants, query_name="anything")
    assert not may_write(grants, query_name=None)


def test_queries_star_entry_in_a_list_is_only_a_name():
    grants = Grants.from_stored({**key_grant_defaults(), "connections": [],
                                 "queries": ["*", {"name": "*", "allow_writes": True}]})
    assert not run(grants, "q")
    assert not may_write(grants, query_name="q") and not may_write(grants, query_name="*")


def test_listable_is_the_one_rule():  # B6.5: /openapi.json lists exactly what /q runs on its saved connection
    grants = key(connections=["a"], queries=["named"], collections=["sales"])
    assert listable(grants, "named", None, None)
    assert listable(grants, "q", "sales", "z")
    assert listable(grants, "q", None, "a")
    assert not listable(grants, "q", "finance", "z")
    assert not listable(grants, "q", None, None)


names = st.sampled_from(["a", "b", "q", "r", "sales", "finance"])
maybe_names = st.none() | names


@given(connections=st.just("*") | st.lists(names, max_size=3),
       queries=st.just("*") | st.lists(names, max_size=3, unique=True),
       collections=st.lists(st.sampled_from(["sales", "finance"]), max_size=2, unique=True),
       query=names, collection=st.none() | st.sampled_from(["sales", "finance"]), saved=maybe_names,
       chosen=maybe_names)
def test_run_rule_properties(connections, queries, collections, query, collection, saved, chosen):
    grants = key(connections=connections, queries=queries, collections=collections)
    allowed = may_run_query(grants, query_name=query, collection=collection, saved_connection=saved,
                            chosen_connection=chosen)
    if chosen is not None and chosen == saved:
        assert allowed == listable(grants, query, collection, saved)  # one rule on the default connection
    else:
        assert allowed == may_use_connection(grants, chosen)  # anywhere else only the connection grant counts


# ---------------------------------------------------------------------------------------------- writes

def test_write_curated_query():  # B6.4 (server flag is the caller's)
    grants = key(connections=[], allow_writes=False, queries=[{"name": "submit_order", "allow_writes": True}])
    assert run(grants, "submit_order")
    assert may_write(grants, query_name="submit_order")
    assert not may_write(grants, query_name="other")
    assert not may_write(grants, query_name=None)  # never for ad-hoc SQL


def test_plain_query_entry_does_not_write():  # B6.4
    grants = key(connections=[], queries=["submit_order"])
    assert run(grants, "submit_order") and not may_write(grants, query_name="submit_order")
    assert not may_write(key(queries=[{"name": "submit_order", "allow_writes": False}]), query_name="submit_order")


def test_key_wide_allow_writes():
    grants = key(allow_writes=True)
    assert may_write(grants, query_name=None) and may_write(grants, query_name="any")
    assert not may_write(key(), query_name=None)


@pytest.mark.parametrize("fields, ops", [
    ({}, None), ({"allowed_write_ops": ["INSERT", "update"]}, frozenset({"insert", "update"})),
    ({"allowed_write_ops": []}, frozenset()),
])
def test_allowed_write_ops(fields, ops):
    assert allowed_write_ops(key(**fields)) == ops


# ---------------------------------------------------------------------------------------------- IP allow-lists

@pytest.mark.parametrize("allowed, peer, ok", [
    (None, "1.2.3.4", True),
    (None, None, True),
    ([], "127.0.0.1", False),                                 # B1.8
    (["1.2.3.4"], "1.2.3.4", True),
    (["1.2.3.4"], "1.2.3.5", False),
    (["10.0.0.1/8"], "10.200.3.4", True),                     # host bits allowed in the entry
    (["10.0.0.0/8"], "11.0.0.1", False),
    (["2001:db8::/32"], "2001:db8::42", True),
    (["2001:db8::/32"], "2001:db9::1", False),
    (["::1"], "::1", True),
    (["1.2.3.0/24", "::1"], "::1", True),                     # mixed families
    (["1.2.3.0/24", "::1"], "1.2.3.77", True),
    (["1.2.3.0/24"], "::ffff:1.2.3.4", True),                 # IPv4-mapped peer matches an IPv4 entry
    (["1.2.3.0/24"], "::ffff:1.2.4.4", False),
    (["::ffff:1.2.3.4"], "1.2.3.4", True),                    # and a mapped entry matches the IPv4 peer
    (["::ffff:1.2.3.0/120"], "1.2.3.9", True),
    (["::/0"], "1.2.3.4", False),
    (["1.2.3.4"], "garbage", False),                          # unparseable peer fails a restricted key
    (["1.2.3.4"], "", False),
    (["1.2.3.4"], None, False),
    (["1.2.3.4"], " 1.2.3.4", False),
    (["1.2.3.4"], "1.2.3.4:8080", False),
    (["fe80::/10"], "fe80::1%eth0", True),
])
def test_ip_allowed(allowed, peer, ok):
    assert ip_allowed(allowed, peer) is ok
    assert ip_allowed(compile_ips(allowed), peer) is ok


def test_ips_compile_once_per_key_row():
    grants = key(allowed_ips=["10.0.0.0/8"])
    assert isinstance(grants.ips, IpAllowList)
    assert ip_allowed(grants.ips, "10.1.1.1") and not ip_allowed(grants.ips, "192.168.0.1")
    assert key().ips is None and ip_allowed(key().ips, "anything")


def test_corrupt_stored_ips_fail_closed():
    assert not ip_allowed("10.0.0.1", "10.0.0.1")  # a string where a list belongs allows nobody
    assert not ip_allowed(["not-an-ip"], "10.0.0.1")
    assert not ip_allowed([167772161], "10.0.0.1")  # an int is not a stored entry, even if it reads as one


# ---------------------------------------------------------------------------------------------- expiry

TODAY = date(2026, 6, 15)


@pytest.mark.parametrize("expires_at, is_expired", [
    (None, False),
    ("2026-06-15", False),   # valid through the end of the day (B1.7)
    ("2026-06-16", False),
    ("2026-06-14", True),    # yesterday
    ("garbage", True),       # unreadable stored date counts as expired
    ("2026-02-30", True),
    ("2026-6-15", True),
    ("", True),
    (20260615, True),
])
def test_expired(expires_at, is_expired):
    assert expired(expires_at, TODAY) is is_expired


# ---------------------------------------------------------------------------------------------- limits

def test_effective_limits_without_key_limits():
    assert effective_limits(key(), server_timeout=30.0, max_page_size=1000, stream_max_rows=None) == {
        "max_concurrent": None, "query_timeout": 30.0,
        "max_rows": {"page": 1000, "stream": None, "mcp": 200},
    }


def test_effective_limits_narrow_never_widen():
    grants = key(max_rows=5, query_timeout=2.5, max_concurrent=3)
    assert effective_limits(grants, server_timeout=30.0, max_page_size=1000, stream_max_rows=None) == {
        "max_concurrent": 3, "query_timeout": 2.5, "max_rows": {"page": 5, "stream": 5, "mcp": 5},
    }
    big = key(max_rows=5_000_000, query_timeout=100)
    assert effective_limits(big, server_timeout=10.0, max_page_size=1000, stream_max_rows=100, mcp_max_rows=50) == {
        "max_concurrent": None, "query_timeout": 10.0, "max_rows": {"page": 1000, "stream": 100, "mcp": 50},
    }


@pytest.mark.parametrize("server_timeout", [0, None])
def test_effective_limits_server_without_time_limit(server_timeout):
    limits = effective_limits(key(query_timeout=100), server_timeout=server_timeout, max_page_size=1000,
                              stream_max_rows=None)
    assert limits["query_timeout"] == 100
    assert effective_limits(key(), server_timeout=server_timeout, max_page_size=1000,
                            stream_max_rows=None)["query_timeout"] is None


# ---------------------------------------------------------------------------------------------- compiled form

def test_compiled_fields():
    grants = key(rate_limit="5/minute", allowed_tables=["Film"], mask=[{"column": "C.Email", "action": "hash"}],
                 quota={"calls": 3, "per": "day"})
    assert grants.rate_limit == (5, 60)
    assert grants.allowed_tables == frozenset({"film"})
    assert grants.mask == (("c.email", "hash"),)
    assert grants.quota == {"calls": 3, "per": "day"}
    assert key().rate_limit is None and key().mask is None and key().allowed_tables is None


def test_missing_or_corrupt_stored_fields_read_narrowest():
    grants = Grants.from_stored({})
    assert not may_use_connection(grants, "a") and not run(grants, "q") and not may_write(grants, query_name="q")
    corrupt = Grants.from_stored({"connections": "all", "queries": 5, "allow_writes": "yes",
                                  "mask": "x", "allowed_tables": "t", "rate_limit": "lots"})
    assert not may_use_connection(corrupt, "a") and not run(corrupt, "q")
    assert not may_write(corrupt, query_name=None)
    assert corrupt.mask == (("*.*", "drop"),)
    assert corrupt.allowed_tables == frozenset()
    assert corrupt.rate_limit == (1, 86400)


def test_grants_from_json_is_cached():
    text = json.dumps({**key_grant_defaults(), "connections": ["a"]})
    first = grants_from_json(text)
    assert first is grants_from_json(text)
    assert may_use_connection(first, "a") and not may_use_connection(first, "b")
    assert not may_use_connection(grants_from_json("[]"), "a")
