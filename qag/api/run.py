"""The data plane: GET/POST /q/<name> and POST /execute_sql, in the contract's order of checks (3.10)."""

from __future__ import annotations

import json
import math
import re
# What a call uses of another module is bound here, at import: compiled, a module attribute read per call
# (time.perf_counter) goes through the module's getattr, ~240 instructions each (benchmarks.callgrind_lines).
from os import environ
from time import perf_counter, time as wall_time
from urllib.parse import quote
from collections import OrderedDict

from .. import encode
from ..encode import ATTACHED, CONTENT_TYPES, EMPTY_BODY, encode as encode_page
from ..backends.base import Call, default_schema, resolved
from ..cache.response import cache_key, source_of
from ..errors import QagError
from ..http.negotiate import format_for
from ..http.response import VARY_ACCEPT, Response
from ..observe.outages import OutageLog
from ..policy import grants as policy
from ..policy.grants import allowed_write_ops, check_run_query, may_write
from ..policy.guard import check as guard_check, check_copy, check_other_sessions
from ..policy.keyfields import normalise_mask
from ..policy.limits import Slot, Slots
from ..policy import masking
from ..policy import tables as table_policy
from ..bearer import claim
from ..sql import functions as sql_functions
from ..sql.params import compile_rules
from ..sql.prepare import check_text_values, prepare, render
from .. import shapes
from ._common import valid_query_name
from ._usage import Usage

RESERVED = frozenset({"format", "page", "page_size", "connection_name", "version", "timeout", "stream"})
_STREAM_WORDS = shapes.STREAM_WORDS
_STREAM_BATCH = 1000
_RESOLVER_CACHE = 2048
_MAX_OFFSET = shapes.MAX_OFFSET  # what every engine's OFFSET takes
_DATABASE_NAME_MAX = 64          # MySQL's longest database name (PostgreSQL's is 63)


class Plan:
    """Everything decided before the database is touched.

    A plain class with slots, not a dataclass: a dataclass's generated __init__ runs in the interpreter even in a
    compiled build, and a plan is made on every call."""

    __slots__ = ("connection", "prepared", "values", "read_only", "timeout", "fmt", "page", "size", "stream", "label",
                 "show_detail", "request_id", "key", "query", "version", "uuid", "sql", "database", "timing", "rules",
                 "mask", "masked", "transport")

    def __init__(self, connection: dict, prepared, values: dict, read_only: bool, timeout: float | None, fmt: str,
                 page: int, size: int, stream: bool, label: str, show_detail: bool, request_id: str, key: str,
                 query: str | None, version: int | None, uuid: str | None, sql: str, database: str | None = None,
                 timing=None, rules: tuple = (), mask=None, masked: list | None = None, transport: int | None = None):
        self.connection = connection
        self.prepared = prepared
        self.values = values
        self.read_only = read_only
        self.timeout = timeout
        self.fmt = fmt
        self.page = page
        self.size = size
        self.stream = stream
        self.label = label              # Content-Disposition name for streams
        self.show_detail = show_detail
        # What run history, metrics and logs record of the run (qag/observe):
        self.request_id = request_id
        self.key = key                  # the caller as history and metrics name it: key name, 'admin', '-'
        self.query = query              # saved-query name; None = ad-hoc
        self.version = version
        self.uuid = uuid
        self.sql = sql                  # the statement as written (saved or ad-hoc)
        self.database = database
        # The request's stage marks (observe/stages.py): QAG_SERVER_TIMING or QAG_OTEL on.
        self.timing = timing
        # Column masking (policy/masking): the effective rules, the traced plan, what history records.
        self.rules = rules
        self.mask = mask
        self.masked = masked
        self.transport = transport      # history's `tr`: None REST, 1 MCP (qag/api/mcp.py), 2 export


def _given(args: dict, body: dict, name: str):
    """A reserved argument's value: the query string's, else the body's. Empty text or JSON null is no value, as
    QueryAPIGate reads them: a form's empty field (`?page=`) or a client's unset optional field (`"format": null`)."""
    value = args.get(name)
    if value is None or value == "":
        value = body.get(name)
        if value == "":
            return None
    return value


def _database_name(value) -> bool:
    """Whether an /execute_sql `database` is a name one could be: text of 1 to _DATABASE_NAME_MAX characters, no NUL."""
    return isinstance(value, str) and 0 < len(value) <= _DATABASE_NAME_MAX and "\x00" not in value


def _positive_int(text: str, what: str) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise QagError("invalid_request", f"{what} must be an integer") from None
    return value


_DECIMAL = re.compile(r"\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


def _timeout_value(value) -> float | None:
    """A requested time limit: a positive finite number of seconds (text or JSON number). Text is a decimal number
    in ASCII digits (Python's float() also reads `1_0`, full-width digits and surrounding space)."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = None
    elif isinstance(value, str):
        value = float(value) if _DECIMAL.fullmatch(value) else None
    try:
        seconds = float(value) if isinstance(value, (int, float)) else math.nan
    except OverflowError:  # a JSON integer too large for a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise QagError("invalid_timeout", "timeout must be a positive number of seconds")
    return seconds


def _json_integers(given: dict, declared) -> dict:
    """JSON values of integer parameters as JSON Schema reads them: a whole float (`2.0`) is the integer 2, as
    /openapi.json's `type: integer` promises. Query-string text is left to the parameter rules (`3.0` there is
    not an integer, as the contract reads it)."""
    if not declared or not isinstance(declared, dict):
        return given
    out = None
    for name, value in given.items():
        if type(value) is float and value.is_integer():
            rule = declared.get(name)
            if isinstance(rule, dict) and rule.get("type") == "integer":
                if out is None:
                    out = dict(given)
                out[name] = int(value)
    return given if out is None else out


def bind_claims(bound: tuple, caller, values: dict) -> dict:
    """Fill each `from_claim` parameter from the caller's verified token claims; the request has no say in them,
    so `WHERE owner = :me` with `"me": {"from_claim": "sub"}` only ever returns the signed-in user's rows.

    A signed-in user gets each value from the token (sending one anyway: 400 param_from_claim; a token without
    the claim: 403 claim_missing). The admin key (and open mode) has no token and supplies them as ordinary
    parameters, for testing and server-side use. A scoped key can't run the query (403 sign_in_required): letting
    it choose the value would defeat the binding. A require_claim_binding role runs only queries that bind one."""
    if caller.claim_binding and not bound:
        raise QagError("claim_binding_required", "This role runs only saved queries that take a parameter from the "
                                                 "sign-in token, and this one doesn't (require_claim_binding)")
    if not bound:
        return values
    claims = caller.claims
    if claims is None:
        if caller.admin:
            return values
        raise QagError("sign_in_required", f"This query takes {', '.join(sorted(b[0] for b in bound))} from a "
                                           "signed-in user's token - call it with `Authorization: Bearer <token>`")
    sent = sorted(name for name, _, _ in bound if name in values)
    if sent:
        raise QagError("param_from_claim", f"{', '.join(sent)} {'comes' if len(sent) == 1 else 'come'} from the "
                                           "sign-in token and can't be set by the request", params=sent)
    values = dict(values)
    for name, claim_name, type_name in bound:
        value = claim(claims, claim_name)
        if value is None or isinstance(value, (dict, list)):
            # The claim's name is the saved query's (not secret); its value is never echoed.
            raise QagError("claim_missing", f"The sign-in token has no usable '{claim_name}' claim")
        if type_name in (None, "string") and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # a numeric user id bound to a text column
        values[name] = value
    return values


class RunHandlers:
    """Runs saved queries and ad-hoc SQL; compiled per saved-query version, so a warm call parses nothing."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.store = gateway.metadata  # the per-call reads come from the metadata cache (qag/cache)
        self.settings = gateway.settings
        self.observe = gateway.observe
        self.usage = Usage(self.observe.metrics)   # counted and published with the worker's metrics
        self._resolvers: OrderedDict[str, object] = OrderedDict()
        self.masking = masking.Masking(self.store, self.settings)
        self.outages = OutageLog()
        # Data streams open in this worker (QAG_MAX_STREAMS): each holds a request thread while its client reads.
        self.streams = Slots()

    def register(self, router) -> None:
        router.add("GET POST", "/q/<name>", self.run_named, "api.run_named_query")
        router.add("GET POST", "/q/saved_sql/<name>", self.run_named, "api.run_named_query")
        router.add("POST", "/execute_sql", self.execute_sql, "api.execute_sql_endpoint")

    def _resolver(self, version: dict):
        """Parameter rules compiled once per saved-query version (versions are immutable but for cache_ttl/mcp)."""
        key = version["uuid"]
        resolver = self._resolvers.get(key)
        if resolver is None:
            resolver = compile_rules(version.get("parameters"), version.get("placeholders", []))
            self._resolvers[key] = resolver
            if len(self._resolvers) > _RESOLVER_CACHE:
                self._resolvers.popitem(last=False)
        return resolver

    def listable_queries(self, caller) -> list[dict]:
        """Published saved queries the caller may run, for /openapi.json and /catalog (one rule with /q:
        policy.listable); `version` is the published version's row."""
        out = []
        for q in self.store.list_queries():
            version = next((v for v in q["versions"] if v["version"] == q["published"]), None)
            if version is None:
                continue
            if not caller.admin and not policy.listable(caller.grants, q["name"], q["collection"],
                                                        version.get("connection_name")):
                continue
            out.append({"name": q["name"], "description": version.get("description"),
                        "connection_name": version.get("connection_name"),
                        "parameters": version.get("parameters") or {}, "placeholders": version.get("placeholders", []),
                        "collection": q["collection"], "version": version})
        return out

    # --- GET/POST /q/<name> ------------------------------------------------------------------
    def run_named(self, request, caller, name):
        args = request.args
        referenced = name  # the response cache keys on the name as written in the URL (contract 7.1)
        # 1. name validity, then existence (before authorization: contract 3.2).
        if name.endswith(".json") and request.transport is None:
            name = name[:-5]   # a URL's alias (B3.18); an MCP tool's name is the query's own, dots and all
        if not valid_query_name(name):
            raise QagError("forbidden", "Only .json files inside the saved_sql folder can be accessed")
        # Body and version are read now but refused only after the existence check (contract 3.10).
        deferred: QagError | None = None
        body: dict = {}
        number = None
        try:
            body = (request.json_object(lenient_content_type=True) if request.method == "POST" else None) or {}
            asked = _given(args, body, "version")
            if asked is not None:
                if not isinstance(asked, str):
                    asked = shapes.whole(asked)   # a JSON integer, 2.0 included (JSON Schema's reading)
                    if asked is None:
                        raise QagError("invalid_request", "version must be an integer")
                number = _positive_int(asked, "version")
        except QagError as error:
            deferred = error
        # One read for the query and the version it runs, so a concurrent publish or delete can't split them.
        in_range = number is None or -_MAX_OFFSET <= number <= _MAX_OFFSET
        head, version = self.store.get_query_for_run(name, number if in_range else 0)
        if head is None:
            raise QagError("query_not_found", f"Saved query '{name}' not found")
        if deferred is not None:
            raise deferred
        # 2. version: the published one, or a draft for administrators only.
        if number is None:
            if head["published"] is None:
                raise QagError("not_published", "This query has no published version")
        elif (head["published"] is None or number > head["published"]) and not caller.admin:
            raise QagError("version_not_found", f"Version {number} not found")
        if version is None:
            raise QagError("version_not_found", f"Version {number} not found")
        # 3. connection choice and reachability.
        saved = version.get("connection_name")
        chosen = args.get("connection_name") or body.get("connection_name") or saved
        if not chosen:
            raise QagError("connection_required", "Connection name is missing")
        if not isinstance(chosen, str):
            raise QagError("invalid_body", "connection_name must be text")
        timing = request.environ.get("qag.timing")
        if timing is not None:
            mark = perf_counter()
        if not caller.admin:
            check_run_query(caller.grants, query_name=name, collection=head["collection"],
                            saved_connection=saved, chosen_connection=chosen)
        if timing is not None:
            timing["policy"] = perf_counter() - mark
        # 4. params/placeholders objects, format, timeout.
        values = {k: v for k, v in args.items() if k not in RESERVED}
        for field in ("params", "placeholders"):
            given = body.get(field)
            if given is None:
                continue
            if not isinstance(given, dict):
                raise QagError("invalid_body", f"{field} must be a JSON object")
            values.update(_json_integers(given, version.get("parameters")))
        fmt, timeout, negotiated = self._format_and_timeout(request, args, body, caller)
        # 5. declared parameter rules, 6. text placeholders.
        if timing is not None:
            mark = perf_counter()
        resolver = self._resolver(version)
        if resolver.claim_bound or caller.claim_binding:   # else bind_claims returns the values as they are
            values = bind_claims(resolver.claim_bound, caller, values)
        values = resolver.resolve(values)
        if timing is not None:
            timing["bind"] = perf_counter() - mark
        row = self.store.get_connection(chosen)
        prepared = prepare(version["sql"], row["db"] if row else "sqlite")
        check_text_values(prepared, values)
        # 7-8. streaming and paging; 10. the connection itself.
        stream, page, size = self._paging(args, caller, fmt, request.page_ceiling)
        try:
            connection = self._connection(chosen, row)
        except QagError as error:
            self._refused(Plan({"name": chosen}, prepared, values, True, timeout, fmt, page, size, stream, name, False,
                               request.request_id, caller.label, name, version["version"], version["uuid"],
                               version["sql"], timing=timing, transport=request.transport), error)
            raise
        # A tool call (qag/api/mcp.py) is read-only whatever the key may write: agent writes are outside the contract.
        # A query's own write grant holds where its author saved it (contract 3.4); on another connection the key
        # runs it through that connection's grant, and only a key-wide allow_writes writes there.
        writes = (self.writes_allowed(caller, name if chosen == saved else None, prepared) and not stream
                  and not request.read_only)
        # The version's mask applies to every caller, administrators included (contract 6.3).
        saved_mask, key_mask = version.get("mask"), None if caller.admin else caller.grants.mask
        rules = masking.effective(saved_mask, key_mask) if saved_mask or key_mask else ()   # () without rules
        # 9. the response cache (contract 7.1): every check above passed (and an API key's statement checks,
        # below), the database not yet touched. The key holds the fingerprint of the effective mask rules:
        # callers with different rules never share an entry.
        ttl, key = version.get("cache_ttl"), None
        # Only a stream's file name reads the label: a page skips working out the name as written in the URL.
        plan = Plan(connection, prepared, values, not writes, timeout, fmt, page, size, stream,
                    request_name(request) if stream else name, caller.admin and not rules, request.request_id,
                    caller.label, name, version["version"], version["uuid"], version["sql"], timing=timing,
                    rules=rules, transport=request.transport)
        # Row security decides per signed-in user inside the database: such a response is nobody else's.
        per_user = caller.claims is not None and row is not None and row["fields"].get("row_security") is True
        if ttl and not per_user and self._cacheable(prepared, stream, caller):
            # Only the values the statement binds: any other (?junk=1) changes nothing in the body, and would
            # otherwise make an entry of its own for each value, a way to flush everyone's entries.
            used = {name: values[name] for name in prepared.placeholders if name in values}
            fields = resolved(connection["fields"], environ)
            key = cache_key(referenced, version["version"], chosen, used, fmt, page, size,
                            mask_fingerprint=masking.fingerprint(rules),
                            source=source_of(version, row, fields),
                            read_only=not (writes and _may_write(prepared, fields)))
            if not caller.admin:
                # The statement checks an API key gets (other sessions' activity; a masked key's functions and
                # catalogs) come before the cache: an entry the admin's run filled must not answer a key the
                # same checks refuse. A refused key skips the cache, and _run refuses it as a run (recorded).
                try:
                    self._check_tables(plan, caller, fields)
                except QagError:
                    key = None
        if key is not None:
            if timing is not None:
                mark = perf_counter()
            hit = self.gateway.response_cache.lookup(key, ttl, request.header("If-None-Match"))
            if timing is not None:
                timing["cache"] = perf_counter() - mark
            if hit is not None:
                if negotiated:
                    hit.headers.append(VARY_ACCEPT)  # never stored with the entry: the key has the format
                return hit  # not a run: no history entry, no event, no database
        response = self._execute(plan, caller, writes, version)
        if key is not None:
            if timing is not None:
                mark = perf_counter()
            self.gateway.response_cache.store(key, response, ttl, {"name": name, "version": version["version"],
                                                                   "connection": chosen, "format": fmt, "page": page})
            if timing is not None:
                timing["cache"] = timing["cache"] + perf_counter() - mark
        if negotiated:
            response.headers.append(VARY_ACCEPT)
        return response

    # --- POST /execute_sql -------------------------------------------------------------------
    def execute_sql(self, request, caller):
        if caller.claim_binding:
            # Ad-hoc SQL binds nothing to the token (its role has no connection grant either: policy/keyfields.py).
            raise QagError("claim_binding_required", "This role runs only saved queries that take a parameter from "
                                                     "the sign-in token (require_claim_binding)")
        body = request.json_object(lenient_content_type=False, invalid_message="Request body must be a JSON object")
        if body is None:
            raise QagError("invalid_body", "Request body must be a JSON object")
        sql = body.get("sql")
        if not isinstance(sql, str) or not sql.strip():
            raise QagError("sql_required", "SQL query is missing")
        chosen = body.get("connection_name")
        if not chosen:
            raise QagError("connection_required", "Connection name is missing")
        if not isinstance(chosen, str):
            raise QagError("invalid_body", "connection_name must be text")
        if not caller.admin:
            policy.check_connection(caller.grants, chosen)
            if body.get("database") not in (None, ""):
                raise QagError("admin_only", "Only the admin key may run a query against a different database "
                                             "on this connection")
        params = body.get("params")
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise QagError("invalid_body", "params must be a JSON object")
        fmt, timeout, negotiated = self._format_and_timeout(request, request.args, body, caller)
        adhoc_mask = None
        if body.get("mask") is not None:
            # The caller's own rules only add masking: its `keep` would name a view column as an administrator
            # does (masking.source_action refuses a view column named like a masked one that no rule names).
            # Its `hash` is keyed apart from the administrators' (masking.own_rules): hashes of values it chose
            # must never be comparable with the hashes of values it may not read.
            adhoc_mask = masking.own_rules(rule for rule in normalise_mask(body["mask"]) if rule["action"] != "keep")
        rules = masking.effective(None if caller.admin else caller.grants.mask, adhoc_mask)
        stream, page, size = self._paging(request.args, caller, fmt, request.page_ceiling)
        database = body.get("database")
        try:
            connection = self._connection(chosen, self.store.get_connection(chosen))
        except QagError as error:
            # The entry names the database asked for, as a run's does (checked below, once the engine is known).
            self._refused(Plan({"name": chosen}, None, params, True, timeout, fmt, page, size, stream, chosen, False,
                               request.request_id, caller.label, None, None, None, sql,
                               database if _database_name(database) else None,
                               request.environ.get("qag.timing"), transport=request.transport), error)
            raise
        if database == "":
            database = None      # absent, as an empty reserved argument is (_given)
        if database is not None:
            if connection["db"] == "sqlite":
                raise QagError("unsupported_operation", "Switching databases isn't supported for 'sqlite' connections")
            if not _database_name(database):
                raise QagError("invalid_body", f"database must be a database name (text of 1 to "
                                               f"{_DATABASE_NAME_MAX} characters)")
        prepared = prepare(sql, connection["db"], text_placeholders=False)
        writes = self.writes_allowed(caller, None, prepared) and not stream and not request.read_only
        plan = Plan(connection, prepared, params, not writes, timeout, fmt, page, size, stream, chosen,
                    not rules, request.request_id, caller.label, None, None, None, sql,
                    database, request.environ.get("qag.timing"), rules=rules,
                    transport=request.transport)
        response = self._execute(plan, caller, writes, None)
        if negotiated:
            response.headers.append(VARY_ACCEPT)
        return response

    # --- shared steps --------------------------------------------------------------------------
    def _format_and_timeout(self, request, args: dict, body: dict, caller) -> tuple[str, float | None, bool]:
        """(format, time limit, whether the format depends on Accept). A `format` argument (query string, then
        body) always wins; without one the format is the one Accept asks for by media type, else json (contract
        3.7), and the response says `Vary: Accept`."""
        fmt = _given(args, body, "format")
        if fmt is not None:
            fmt, negotiated = encode.check_format(fmt), False
        else:
            accept = request.environ.get("HTTP_ACCEPT")
            # No Accept, or most clients' `*/*`: json without a call (the common case costs two comparisons).
            fmt = "json" if accept is None or accept == "*/*" else _negotiated_format(accept)
            negotiated = True
        requested = _given(args, body, "timeout")
        if requested is not None:   # most calls ask for none: no call to read it
            requested = _timeout_value(requested)
        # The smallest limit set, the first of equals (as min() of those set would pick), without a list.
        timeout = None
        for limit in (self.settings.query_timeout, requested, None if caller.admin else caller.grants.query_timeout):
            if limit and (timeout is None or limit < timeout):
                timeout = limit
        return fmt, timeout, negotiated

    def _paging(self, args: dict, caller, fmt: str, ceiling: int | None = None) -> tuple[bool, int, int]:
        """(stream, page, size); `ceiling` replaces QAG_MAX_PAGE_SIZE for an MCP call, capped by MCP_MAX_ROWS."""
        stream = "stream" in args and args["stream"].strip().lower() in _STREAM_WORDS
        if stream:
            if fmt not in encode.STREAM_FORMATS:
                raise QagError("invalid_stream", "stream=true only supports these formats: "
                                                 + ", ".join(sorted(encode.STREAM_FORMATS)))
            if args.get("page") or args.get("page_size"):
                raise QagError("invalid_stream", "stream=true exports the whole result and does not accept "
                                                 "page/page_size")
            return True, 1, 0
        page = args.get("page")          # empty is absent (_given), as a stream's check above reads them
        page = _positive_int(page, "page") if page else 1
        size = args.get("page_size")
        size = _positive_int(size, "page_size") if size else 10
        if page < 1 or size < 1:
            raise QagError("invalid_paging", "page and page_size must be positive")
        ceiling = ceiling or self.settings.max_page_size
        if size > ceiling:
            raise QagError("invalid_paging", f"page_size must not exceed {ceiling}")
        if not caller.admin and caller.grants.max_rows:
            size = min(size, int(caller.grants.max_rows))
        if (page - 1) * size > _MAX_OFFSET:
            raise QagError("invalid_paging", "page is too large")
        return False, page, size

    def writes_allowed(self, caller, query_name: str | None, prepared=None) -> bool:
        """Whether the call may write. With the statement: a key narrowed by allowed_write_ops runs one that writes
        nothing read-only, so the engine refuses what a function it calls would write (the guard reads the
        statement's text, not the functions')."""
        if not self.settings.allow_writes:
            return False
        if caller.admin:
            return True
        grants = caller.grants
        if not may_write(grants, query_name=query_name):
            return False
        return grants.allowed_write_ops is None or prepared is None or bool(prepared.write_ops)

    @staticmethod
    def _cacheable(prepared, stream: bool, caller) -> bool:
        """Contract 7.1: read-only SQL only (a write runs every call), never a stream. A table-restricted caller
        bypasses the cache: its table check runs with the query, and the cache key doesn't name the caller."""
        if stream or prepared.write_ops or prepared.multiple or prepared.unreadable is not None:
            return False
        return caller.admin or caller.grants.allowed_tables is None

    def _check_tables(self, plan: Plan, caller, fields: dict) -> tuple[str, frozenset] | None:
        """Contract 6.2 for a table-restricted key: raise its 403, or return (the default schema the
        statement was checked with, the key's qualified grants) for the backend to enforce as well. A caller
        with mask rules and no allowed_tables gets issue 18's checks (no catalogs, statistics, settings,
        diagnostics or activity; functions by what they resolve to) and None; any other API key, the refusal of
        other sessions' activity (guard.check_other_sessions) and None.

        What the statement uses is read once per prepared statement and default schema (Prepared.uses), so a
        warm call parses nothing."""
        grants = caller.grants
        if caller.admin:
            return None
        if grants.allowed_tables is None and not plan.rules:
            check_other_sessions(plan.prepared)   # the others' checks refuse activity views among the rest
            if grants.allowed_write_ops is not None and not plan.read_only:
                # What the guard judged from the text must be all the statement writes: no user-defined function.
                prepared = plan.prepared
                acc = prepared.uses(default_schema(prepared.dialect, fields))
                table_policy.narrowed_writes_verdict(acc, prepared.dialect, prepared.write_ops,
                                                     grants.allowed_functions,
                                                     self._function_catalog(plan, fields, None, acc))
            return None
        prepared = plan.prepared
        dialect = prepared.dialect
        schema = default_schema(dialect, fields)
        acc = prepared.uses(schema)
        restricted = grants.allowed_tables is not None
        catalog = self._function_catalog(plan, fields, schema if restricted else None, acc)
        if not restricted:
            table_policy.masked_verdict(acc, dialect, grants.allowed_functions, catalog)
            return None
        table_policy.verdict(acc, dialect, schema, grants.allowed_tables, grants.allowed_functions, catalog)
        return schema, table_policy.qualified_grants(grants.allowed_tables, schema, dialect)

    def _function_catalog(self, plan: Plan, fields: dict, schema: str | None, acc):
        """The engine's facts about function names for this call (functions.Catalog), from the backend's schema
        cache: PostgreSQL for the schema the call's search_path pins (a masked call's is masking's), MySQL for
        the connection's database, and for a table-restricted call the PostgreSQL types that are no relation's row
        type. None when the statement calls and names nothing to judge or the backend keeps none."""
        if acc.failure is not None or not (acc.calls or acc.fields or acc.operators or acc.grammar_calls
                                            or (acc.types and schema is not None)):
            return None
        read = getattr(self.gateway.backends.get(plan.connection["db"]), "functions", None)
        if read is None:
            return None
        if schema is None and plan.prepared.dialect == "postgres":
            schema = masking.default_schema("postgres", fields, plan.database)
        return read(fields, schema)

    def _statement(self, plan: Plan) -> tuple:
        """(prepared statement, values, qag's own functions) to render: the caller's, or for a masked call the
        statement whose masked tables the engine reads through masked values (policy/_source_mask), with the
        hash keys' pads bound as values (the administrators' key, and the own key of a caller's own rules)."""
        source = plan.mask.source if plan.mask is not None else None
        if source is None:
            return plan.prepared, plan.values, ()
        prepared = prepare(source.sql, plan.prepared.dialect, text_placeholders=plan.query is not None)
        values = plan.values
        functions = ()
        if prepared.dialect == "sqlite":
            functions = self.masking.source_functions()
        else:
            if source.hashes:
                values = {**values, **self.masking.hasher().pads}
            if source.own_hashes:
                values = {**values, **self.masking.own_hasher().pads}
        return prepared, values, functions

    @staticmethod
    def _connection(name: str, row: dict | None) -> dict:
        if row is None:
            raise QagError("connection_not_found", f"Connection '{name}' not found")
        if not row["active"]:
            raise QagError("connection_inactive", f"The connection '{name}' is currently not active. To use it, "
                                                  f"it must be set to active.")
        return row

    def _refused(self, plan: Plan, error: QagError) -> None:
        """A page refused for its inactive connection is a failed run: contract 10.1 runs the connection lookup as
        the database step's first, and QueryAPIGate records it in history and the event log. A stream refused there
        it does not record, so neither does qag. No slot was taken, nothing is counted against a quota (not a 200).
        A connection that doesn't exist is not recorded (QueryAPIGate records it): history interns connection names
        for good, and a name a caller makes up must not grow the store (docs/compatibility.md)."""
        if not plan.stream and error.code == "connection_inactive":
            self.observe.refused(plan, wall_time(), error)

    def _execute(self, plan: Plan, caller, writes: bool, version: dict | None) -> Response:
        """The database step: from here on every outcome is a run (history, event, metrics, log line).

        A key with max_concurrent first takes a slot (contract 6.7; a lease in Redis when configured, else in
        this worker), held until the page is encoded or, for a stream, until its body is drained or closed; a
        refused call is not a run. A stream first takes one of the worker's QAG_MAX_STREAMS: a client that reads
        slowly (or never) holds a request thread for as long as its writes wait, so streams may not take them all."""
        slot = stream_slot = None
        if plan.stream:
            stream_slot = self._stream_slot()
        if not caller.admin and caller.grants.max_concurrent:
            limit = int(caller.grants.max_concurrent)
            try:
                slot = self.gateway.slots.acquire(caller.name, limit, plan.timeout)
            except BaseException:
                if stream_slot is not None:
                    stream_slot.release()
                raise
            if slot is None:
                if stream_slot is not None:
                    stream_slot.release()
                raise QagError("too_many_concurrent", f"This API key may run at most {limit} "
                               f"quer{'y' if limit == 1 else 'ies'} at once - try again shortly",
                               retry_after=1, max_concurrent=limit)
        observe = self.observe
        observe.begin()
        at = wall_time()
        try:
            response = self._run(plan, caller, writes, version, at)
        except QagError as error:
            if slot is not None:
                slot.release()
            if stream_slot is not None:
                stream_slot.release()
            if not plan.show_detail:
                # Every step of the run decides here, not each where it reads the database (the function catalog,
                # the server's names, masking's schema, the statement): contract 0.3.
                error.extras.pop("detail", None)
            observe.failed(plan, at, error)
            raise
        except BaseException:
            if slot is not None:
                slot.release()
            if stream_slot is not None:
                stream_slot.release()
            observe.failed(plan, at, QagError("internal_error"))
            raise
        export = response.body if isinstance(response.body, _Export) else None
        if slot is not None:
            if export is not None:
                export.slot = slot  # the stream holds it until its last row is sent (or it is closed)
            else:
                slot.release()
        if stream_slot is not None:
            if export is not None:
                export.stream_slot = stream_slot
            else:
                stream_slot.release()
        return response

    def _stream_slot(self) -> Slot:
        """One of the worker's QAG_MAX_STREAMS stream slots, or 503 too_many_streams (Retry-After: 5)."""
        cap = self.settings.max_streams
        if not self.streams.acquire("streams", cap):
            raise QagError("too_many_streams", f"This worker already sends {cap} streams - try again in a few "
                           "seconds" if cap else "Streams (stream=true) are turned off on this server",
                           retry_after=5)
        return Slot(self.streams, "streams")

    def _run(self, plan: Plan, caller, writes: bool, version: dict | None, at: float) -> Response:
        connection = plan.connection
        timing = plan.timing
        backend = self.gateway.backends.get(connection["db"])
        fields = resolved(connection["fields"], environ)
        if plan.database is not None:   # the admin's override (contract 10.1): this call's database, its own pool
            fields = {**fields, "database": plan.database}
        if timing is not None:
            mark = perf_counter()
        allowed_ops = None if caller.admin else allowed_write_ops(caller.grants)
        guard_check(plan.prepared, writes_allowed=writes, allowed_write_ops=allowed_ops)
        restricted = self._check_tables(plan, caller, fields)   # contract 3.10: tables before masking
        check_copy(plan.prepared)
        if plan.rules:  # masking: trace the result columns, or refuse before anything runs (contract 6.3)
            plan.mask = self.masking.plan(plan.rules, plan.prepared, connection, backend, fields, plan.database)
        if timing is not None:
            timing["policy"] = timing.get("policy", 0.0) + perf_counter() - mark
        if plan.stream:
            return self._stream(plan, backend, fields, caller, at, restricted)
        offset = (plan.page - 1) * plan.size
        if timing is not None:
            mark = perf_counter()
        prepared, values, functions = self._statement(plan)
        rendered = render(prepared, values, backend.style, plan.size + 1, offset)
        if timing is not None:
            timing["bind"] = timing.get("bind", 0.0) + perf_counter() - mark
        # Windowed: LIMIT/OFFSET are in the SQL (clamped to the author's own limit); otherwise skip and slice.
        skip = 0 if rendered.windowed else offset
        call = Call(rendered.sql, rendered.args, plan.read_only, plan.timeout, plan.size + 1, skip,
                    functions=functions, connection=connection["name"],
                    json_rows=plan.size if plan.fmt == "json" and plan.mask is None else 0)
        if skip or not rendered.windowed:
            # A query whose window isn't in its SQL (a compound or parenthesised SELECT on PostgreSQL): the
            # engine pages it with a cursor when it can, so the driver never buffers more than the page.
            call.cursor = prepared.cursor_pageable
        _pin_names(call, plan, restricted, fields)
        call.identity = row_security(caller, fields, plan.query)
        # A writable caller's reads run read-write too: only a statement that may write has an outcome to doubt.
        call.writes = not plan.read_only and _may_write(plan.prepared, fields)
        call.write_ops = allowed_ops
        # Usage is counted to API keys only: an administrator's calls are no key's, and a signed-in user's name
        # (jwt:<subject>) is none either and would make the table the workers publish unbounded.
        usage_key = caller.name if caller.via == "key" else None
        if timing is not None:
            mark = perf_counter()
        try:
            result = backend.run(fields, call)
        except QagError as error:
            if timing is not None:
                timing.failed("query", mark, error)   # the trace's database span ends with the error
            self.outages.note(f"connection {connection['name']!r}", error)
            self.usage.record(connection["name"], usage_key, False, 0, 0.0)
            raise
        if timing is not None:
            timing["query"] = result.duration_ms / 1000.0   # marked as it ends: the trace's database span
        columns, rows = result.columns, result.rows
        has_more = result.count > plan.size
        if rows is None:             # the driver wrote the page's JSON itself (call.json_rows)
            n = min(result.count, plan.size)
        else:
            rows = rows[:plan.size]
            if plan.mask is not None:
                columns, rows = _apply_mask(plan, columns, rows)
            n = len(rows)
        self.usage.record(connection["name"], usage_key, True, n, result.duration_ms)
        headers = [("X-Page", _count_text(plan.page)), ("X-Page-Size", _count_text(plan.size)),
                   ("X-Row-Count", _count_text(n)),
                   ("X-Has-More", "true" if has_more else "false")]
        started = perf_counter()
        if not n:
            response = Response(200, EMPTY_BODY, headers, "application/json")
        else:
            if plan.fmt in ATTACHED:
                headers.append(("Content-Disposition", ATTACHED[plan.fmt]))
            body = result.json if rows is None else encode_page(plan.fmt, columns, rows)
            response = Response(200, body, headers, CONTENT_TYPES[plan.fmt])
        encoded = perf_counter() - started
        if timing is not None:
            timing["encode"] = encoded
        self.observe.done(plan, at, n, result.duration_ms, encoded)
        return response

    def _stream(self, plan: Plan, backend, fields: dict, caller, at: float,
                restricted: tuple[str, frozenset] | None = None) -> Response:
        cap = self.settings.stream_max_rows
        if not caller.admin and caller.grants.max_rows:
            cap = min(cap, int(caller.grants.max_rows)) if cap else int(caller.grants.max_rows)
        prepared, values, functions = self._statement(plan)
        rendered = render(prepared, values, backend.style, None, 0)
        call = Call(rendered.sql, rendered.args, True, plan.timeout, 0, functions=functions,
                    connection=plan.connection["name"])
        _pin_names(call, plan, restricted, fields)
        call.identity = row_security(caller, fields, plan.query)
        try:
            columns, batches = backend.stream(fields, call, _STREAM_BATCH, cap)
        except QagError as error:
            self.outages.note(f"connection {plan.connection['name']!r}", error)
            raise
        if plan.mask is not None:
            try:
                columns, _ = _apply_mask(plan, columns, [])
            except QagError:
                batches.close()
                raise
        headers = [("Content-Disposition", content_disposition(f"{plan.label}.{plan.fmt}"))]
        return Response(200, _Export(plan, columns, batches, self.observe, at, cap, self.settings.parquet_row_group),
                        headers,
                        encode.CONTENT_TYPES[plan.fmt])


# The text of the small counts every page's headers carry (X-Page, X-Page-Size, X-Row-Count), made once: a
# tuple's item instead of a str() call each.
def _may_write(prepared, fields: dict) -> bool:
    """Whether a statement run read-write may change data: a write operation, or a call of anything but the
    engine's own built-ins (a user function can write: `SELECT log_visit(1)`), or a statement qag can't read."""
    if prepared.write_ops:
        return True
    acc = prepared.uses(default_schema(prepared.dialect, fields))
    if acc.failure is not None or acc.user_functions or acc.table_functions or acc.denied:
        return True
    dialect = prepared.dialect
    calls = (*acc.calls, *sql_functions.grammar_calls(acc.grammar_calls, None))
    return any(not sql_functions.allowed_builtin(schema, name, dialect, None) for schema, name in calls)


_COUNT_TEXTS = tuple(str(n) for n in range(1025))


def _count_text(n: int) -> str:
    return _COUNT_TEXTS[n] if type(n) is int and 0 <= n < 1025 else str(n)


def _negotiated_format(accept: str) -> str:
    """The format Accept asks for when no `format` is given, else json (negotiate.format_for). A format this server
    can't write (its package missing) is not offered: the next one liked more than JSON, or JSON, rather than a
    500 the caller never asked for by name."""
    return format_for(accept, encode.writable) or "json"


def row_security(caller, fields: dict, query: str | None) -> tuple | None:
    """A connection with `row_security` (PostgreSQL): a signed-in caller's (claims JSON, database role) for the
    backend to set in the call's transaction; None for API keys and the admin key (no claims are set).

    Only saved queries: an ad-hoc statement of the caller's own could call set_config itself and act as another
    user or role within the same transaction. With `db_roles`, a caller whose qag role has no database role is
    refused rather than run with the connection user's own rights (often the table owner's, which bypass RLS)."""
    if fields.get("row_security") is not True or caller.claims is None:
        return None
    if query is None:
        raise QagError("row_security_saved_only")
    roles = fields.get("db_roles")
    db_role = None
    if roles:
        db_role = roles.get(caller.role)
        if db_role is None:
            raise QagError("row_security_unmapped", f"Role '{caller.role}' has no database role on this connection "
                                                    "(db_roles)")
    claims = json.dumps(caller.claims, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return claims, (db_role.encode("utf-8") if db_role is not None else None)


def _pin_names(call: Call, plan: Plan, restricted: tuple[str, frozenset] | None, fields: dict) -> None:
    """Make the database resolve unqualified names where the checks did: a table-restricted call in its checked
    schema (and, on SQLite, only its tables); a masked call on PostgreSQL in the schema its columns were traced
    in, so a role's or the server's own search_path can't send a traced name to an unmasked table elsewhere."""
    if restricted is not None:
        call.schema, call.tables = restricted
    elif plan.mask is not None and plan.prepared.dialect == "postgres":
        call.schema = masking.default_schema("postgres", fields, plan.database)
    if plan.mask is not None and plan.prepared.dialect == "mysql":
        call.default_text = True     # traced in MySQL's default reading: run only on a session that reads so
    if plan.mask is not None and plan.prepared.dialect == "sqlite":
        call.masked = True           # no shadow table, nor an FTS table over another's content (the authorizer)


_GONE = "The client went away before the export finished"


def _apply_mask(plan: Plan, columns: list, rows: list) -> tuple[list, list]:
    """The masked page: 403 when the result's width isn't the traced one; history learns what changed."""
    mask = plan.mask
    mask.check(columns)
    if mask.changed:
        plan.masked = mask.report(columns)
    return mask.columns(columns), mask.rows(rows)


class _Export:
    """A stream's body. The server closes it when the client goes away (or when it never read it, HEAD): the
    cursor's batches are closed with it, so its connection is released now, and the run is recorded exactly
    once, however it ended.

    Made in the run, it reads and encodes rows until the body's first bytes are ready (or the rows end): a
    failure before then is raised from here, so the caller gets the normal error response (status, envelope,
    X-Request-Id, headers) and not a broken 200. csv, tsv and ndjson have bytes from their first batch; parquet
    only from its first row group (QAG_PARQUET_ROW_GROUP rows, several batches). Once they went out, a failure
    ends the chunked body without its terminator."""

    __slots__ = ("plan", "columns", "batches", "observe", "at", "cap", "sent", "recorded", "slot", "stream_slot",
                 "meter", "row_group", "encoder", "rows", "ready", "waiting", "ended")

    def __init__(self, plan: Plan, columns, batches, observe, at: float, cap: int | None, row_group: int):
        self.plan, self.columns, self.batches, self.observe, self.at, self.cap = plan, columns, batches, observe, at, cap
        self.row_group = row_group   # rows per parquet row group: what a parquet stream holds at most
        self.sent = 0
        self.recorded = False
        self.slot = None   # a max_concurrent slot, renewed while sending and released when the run ends
        self.stream_slot = None   # one of the worker's QAG_MAX_STREAMS, released when the run ends
        self.meter = None  # rows as they leave, for the caller's quota (set by the gateway, contract 6.8)
        self.ready = b""   # the body's first bytes, made before the status line goes out
        self.waiting = 0   # the rows in them: counted as sent (and metered) when they leave
        self.ended = False
        try:
            self.encoder = encode.StreamEncoder(plan.fmt, columns, row_group)
            self.rows = iter(batches)
            self._first_bytes()
        except BaseException:
            # The caller (RunHandlers.run) records the failed run and answers with the error.
            self.recorded = True
            batches.close()
            raise

    def _first_bytes(self) -> None:
        mask = self.plan.mask
        encoder = self.encoder
        for rows in self.rows:
            if mask is not None:
                rows = mask.rows(rows)
            self.waiting += len(rows)
            body = encoder.chunk(rows)
            if body:
                self.ready = body
                return
        self.ready = encoder.finish()
        self.ended = True

    def __iter__(self):
        mask = self.plan.mask
        try:
            encoder = self.encoder
            if self.waiting:
                self.sent += self.waiting
                if self.meter is not None:
                    self.meter(self.waiting)
            if self.slot is not None:
                self.slot.renew()
            body, self.ready = self.ready, b""
            if body:
                yield body
            if not self.ended:
                for rows in self.rows:
                    if mask is not None:
                        rows = mask.rows(rows)
                    self.sent += len(rows)
                    if self.meter is not None:
                        self.meter(len(rows))
                    if self.slot is not None:
                        self.slot.renew()
                    body = encoder.chunk(rows)
                    if body:
                        yield body
                body = encoder.finish()
                if body:
                    yield body
        except QagError as error:
            self._record(error)
            raise
        except GeneratorExit:
            self._record(QagError("internal_error", _GONE))
            raise
        except BaseException:
            self._record(QagError("internal_error"))
            raise
        finally:
            self.batches.close()
        self._record(None)

    def _record(self, error: QagError | None) -> None:
        if self.recorded:
            return
        self.recorded = True
        if self.slot is not None:
            self.slot.release()
        if self.stream_slot is not None:
            self.stream_slot.release()
        if error is None:
            self.observe.streamed(self.plan, self.at, self.sent, bool(self.cap) and self.sent >= self.cap)
        else:
            self.observe.failed(self.plan, self.at, error, self.sent)

    def close(self) -> None:
        try:
            self.batches.close()
        finally:
            self._record(QagError("internal_error", _GONE))


def content_disposition(filename: str) -> str:
    """RFC 6266: an ASCII fallback name plus the exact UTF-8 name, so any saved-query name is a valid header."""
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename)
    if fallback == filename:
        return f'attachment; filename="{filename}"'
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def request_name(request) -> str:
    """The saved-query name as written in the URL (for a stream's file name)."""
    name = request.segments[-1] if request.segments else "result"
    return name.replace('"', "").replace("\\", "")
