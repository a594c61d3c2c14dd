"""Grant decisions for API keys and roles: the stored grant shape, its compiled form, and the per-call checks."""

from __future__ import annotations

import ipaddress
import json
import re
from datetime import date
from functools import lru_cache
from typing import Mapping

from qag.errors import QagError
from qag.sql.names import ascii_lower
from qag.settings import parse_rate_limit

ALL = "*"

# The grant fields shared by keys and roles, in the order the API shows them (contract 5.4).
GRANT_FIELDS: tuple[str, ...] = (
    "connections", "queries", "collections", "allow_writes", "allowed_write_ops", "allowed_tables",
    "allowed_functions", "rate_limit", "allowed_ips", "mask", "max_concurrent", "query_timeout", "max_rows", "quota",
)


def key_grant_defaults() -> dict:
    """The stored grants of a key or role created without any grant field (a fresh dict each call)."""
    return {
        "connections": ALL, "queries": [], "collections": [], "allow_writes": False,
        "allowed_write_ops": None, "allowed_tables": None, "allowed_functions": None, "rate_limit": None, "allowed_ips": None,
        "mask": None, "max_concurrent": None, "query_timeout": None, "max_rows": None, "quota": None,
    }


# ---------------------------------------------------------------------------------------------- IP allow-lists

# IPv4-mapped IPv6 space: a dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d.
_MAPPED = ipaddress.ip_network("::ffff:0:0/96")


class IpAllowList:
    """An allowed_ips list parsed once: IPv4 and IPv6 networks, mapped IPv6 entries also kept as IPv4."""

    __slots__ = ("v4", "v6")

    def __init__(self, entries):
        v4, v6 = [], []
        for entry in entries:
            try:
                # ip_network would also read an int as an address; only validated strings are stored.
                if not isinstance(entry, str):
                    raise TypeError(entry)
                net = ipaddress.ip_network(entry, strict=False)
            except (TypeError, ValueError):
                continue  # a stored entry that does not parse grants nothing (fail closed)
            if net.version == 4:
                v4.append(net)
            else:
                v6.append(net)
                if net.subnet_of(_MAPPED):
                    v4.append(ipaddress.IPv4Network((int(net.network_address) & 0xFFFFFFFF, net.prefixlen - 96)))
        self.v4 = tuple(v4)
        self.v6 = tuple(v6)

    def allows(self, peer: str | None) -> bool:
        addr = _parse_peer(peer)
        if addr is None:
            return False
        if addr.version == 6:
            if any(addr in net for net in self.v6):
                return True
            addr = addr.ipv4_mapped
            if addr is None:
                return False
        return any(addr in net for net in self.v4)


@lru_cache(maxsize=4096)
def _parse_peer_str(peer: str):
    try:
        return ipaddress.ip_address(peer)
    except ValueError:
        return None


def _parse_peer(peer):
    # Peers repeat from call to call, so the parse is cached; anything but a string is unparseable.
    if not isinstance(peer, str) or not peer:
        return None
    return _parse_peer_str(peer)


def compile_ips(allowed_ips) -> IpAllowList | None:
    """None (no restriction) stays None; a list becomes an IpAllowList ([] allows nobody)."""
    if allowed_ips is None:
        return None
    if isinstance(allowed_ips, IpAllowList):
        return allowed_ips
    if not isinstance(allowed_ips, (list, tuple)):
        return IpAllowList(())  # a corrupt stored value must not open the key to everyone
    return IpAllowList(allowed_ips)


def ip_allowed(allowed_ips, peer: str | None) -> bool:
    """Whether peer passes allowed_ips (None, a stored list, or an IpAllowList): None → any; [] → none."""
    if allowed_ips is None:
        return True
    return compile_ips(allowed_ips).allows(peer)


# ---------------------------------------------------------------------------------------------- expiry

_DATE_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def expired(expires_at: str | None, today: date) -> bool:
    """expires_at < today (a key is valid through its expiry date); an unreadable stored date counts as expired."""
    if expires_at is None:
        return False
    if not isinstance(expires_at, str) or not _DATE_RE.fullmatch(expires_at):
        return True
    try:
        return date.fromisoformat(expires_at) < today
    except ValueError:
        return True


# ---------------------------------------------------------------------------------------------- compiled grants

def _names(value) -> frozenset:
    if not isinstance(value, (list, tuple)):
        return frozenset()
    return frozenset(v for v in value if isinstance(v, str))


def _lower_names(value, lower=str.lower) -> frozenset | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        return frozenset()  # corrupt → the narrowest reading
    return frozenset(lower(v) for v in value if isinstance(v, str))


class Grants:
    """One key's (or role's) stored grants compiled for cheap per-call checks; build once per key row."""

    __slots__ = (
        "stored", "all_connections", "connections", "all_queries", "queries", "write_queries", "collections",
        "allow_writes", "allowed_write_ops", "allowed_tables", "allowed_functions", "rate_limit", "ips", "mask",
        "max_concurrent", "query_timeout", "max_rows", "quota",
    )

    @classmethod
    def from_stored(cls, stored: Mapping) -> "Grants":
        """Compile a stored grants dict (GRANT_FIELDS); a missing or malformed field reads as the narrowest grant."""
        self = cls.__new__(cls)
        self.stored = stored
        connections = stored.get("connections")
        self.all_connections = connections == ALL
        self.connections = frozenset() if self.all_connections else _names(connections)

        queries = stored.get("queries")
        self.all_queries = queries == ALL
        readable, writable = set(), set()
        if isinstance(queries, (list, tuple)):
            for entry in queries:
                if isinstance(entry, str):
                    readable.add(entry)
                elif isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                    readable.add(entry["name"])
                    # "*" is a name like any other inside a list, and never carries write access.
                    if entry.get("allow_writes") is True and entry["name"] != ALL:
                        writable.add(entry["name"])
        self.queries = frozenset(readable)
        self.write_queries = frozenset(writable)
        self.collections = _names(stored.get("collections"))
        self.allow_writes = stored.get("allow_writes") is True
        self.allowed_write_ops = _lower_names(stored.get("allowed_write_ops"))
        # ASCII case alone: each engine folds the rest its own way (qag.policy.tables.qualified_grants).
        self.allowed_tables = _lower_names(stored.get("allowed_tables"), ascii_lower)
        # User-defined functions a table-restricted key may call (qag/policy/tables); None = none.
        self.allowed_functions = _lower_names(stored.get("allowed_functions"))
        try:
            self.rate_limit = None if stored.get("rate_limit") is None else parse_rate_limit(stored["rate_limit"])
        except ValueError:
            self.rate_limit = (1, 86400)  # an unreadable stored limit throttles rather than lifting the limit
        self.ips = compile_ips(stored.get("allowed_ips"))
        self.mask = _mask_rules(stored.get("mask"))
        self.max_concurrent = _limit(stored.get("max_concurrent"))
        self.query_timeout = _limit(stored.get("query_timeout"))
        self.max_rows = _limit(stored.get("max_rows"))
        quota = stored.get("quota")
        self.quota = quota if isinstance(quota, Mapping) else None
        return self

    def __repr__(self) -> str:
        return f"Grants({self.stored!r})"


# Stands in for a stored mask rule that does not read as one: a corrupt row hides data rather than showing it.
_CORRUPT_RULE = ("*.*", "drop")


def _mask_rules(mask):
    if mask is None:
        return None
    if not isinstance(mask, (list, tuple)):
        return (_CORRUPT_RULE,)
    rules = []
    for rule in mask:
        if isinstance(rule, Mapping) and isinstance(rule.get("column"), str) and isinstance(rule.get("action"), str):
            rules.append((rule["column"], rule["action"]))
        else:
            rules.append(_CORRUPT_RULE)
    return tuple(rules)


def _limit(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


@lru_cache(maxsize=4096)
def grants_from_json(text: str) -> Grants:
    """Grants compiled from their stored JSON text, cached by that text (Grants are immutable once built)."""
    stored = json.loads(text)
    return Grants.from_stored(stored if isinstance(stored, dict) else {})


# ---------------------------------------------------------------------------------------------- decisions
# Administrators and open mode are the caller's: these functions only ever see a scoped key's grants.

def connection_forbidden(connection_name) -> QagError:
    """The 403 for a connection the key may not use (also the refusal for an unreachable saved query)."""
    return QagError("connection_forbidden", f"This API key is not permitted to use the connection '{connection_name}'")


def may_use_connection(grants: Grants, connection_name: str | None) -> bool:
    """Ad-hoc SQL, schema browsing and any saved query on this connection: connections is "*" or lists it."""
    if connection_name is None:
        return False
    return grants.all_connections or connection_name in grants.connections


def check_connection(grants: Grants, connection_name: str | None) -> None:
    """Raise 403 connection_forbidden unless the key may use the connection (ad-hoc SQL, schema routes)."""
    if not may_use_connection(grants, connection_name):
        raise connection_forbidden(connection_name)


def listable(grants: Grants, query_name: str, collection: str | None, saved_connection: str | None) -> bool:
    """The one reachability rule (contract 6.1) shared by /q, /openapi.json and /catalog.

    Reachable when queries is "*" or names the query, collections holds its collection, or the key may use
    the query's saved connection.
    """
    return (
        grants.all_queries
        or query_name in grants.queries
        or (collection is not None and collection in grants.collections)
        or (saved_connection is not None and may_use_connection(grants, saved_connection))
    )


def may_run_query(grants: Grants, *, query_name: str, collection: str | None, saved_connection: str | None,
                  chosen_connection: str | None) -> bool:
    """Whether the key may run this saved query on the chosen connection (contract 3.4).

    On its own saved connection the query runs exactly when it is listable. Any other connection (and any
    connection for a query with no saved one) needs a grant for that connection itself: query and collection
    grants cover the query only where its author saved it.
    """
    if chosen_connection is not None and chosen_connection == saved_connection:
        return listable(grants, query_name, collection, saved_connection)
    return may_use_connection(grants, chosen_connection)


def check_run_query(grants: Grants, *, query_name: str, collection: str | None, saved_connection: str | None,
                    chosen_connection: str | None) -> None:
    """Raise 403 connection_forbidden naming the chosen connection unless may_run_query allows the run."""
    if not may_run_query(grants, query_name=query_name, collection=collection,
                         saved_connection=saved_connection, chosen_connection=chosen_connection):
        raise connection_forbidden(chosen_connection)


def may_write(grants: Grants, *, query_name: str | None) -> bool:
    """Key allow_writes, or a {"name": query_name, "allow_writes": true} entry for a saved query.

    query_name None means ad-hoc SQL, which only the key-wide flag can allow; "*" never grants writes. The
    server's QUERYAPIGATE_ALLOW_WRITES cap is the caller's.
    """
    if grants.allow_writes:
        return True
    return query_name is not None and query_name in grants.write_queries


def allowed_write_ops(grants: Grants) -> frozenset | None:
    """The lower-case write keywords the key is narrowed to, or None for no narrowing."""
    return grants.allowed_write_ops


def _min_known(key_value, server_value):
    # "No limit" on either side leaves the other; both set → the tighter one.
    if key_value is None:
        return server_value
    if server_value is None:
        return key_value
    return min(key_value, server_value)


def effective_limits(grants: Grants, *, server_timeout: float | None, max_page_size: int,
                     stream_max_rows: int | None, mcp_max_rows: int = 200) -> dict:
    """The ApiKey `effective_limits` object: each key limit narrowed by the server's (contract 5.4, 6.7).

    server_timeout 0 or None means the server has no time limit.
    """
    max_rows = grants.max_rows
    return {
        "max_concurrent": grants.max_concurrent,
        "query_timeout": _min_known(grants.query_timeout, server_timeout or None),
        "max_rows": {
            "page": _min_known(max_rows, max_page_size),
            "stream": _min_known(max_rows, stream_max_rows),
            "mcp": _min_known(max_rows, mcp_max_rows),
        },
    }
