"""Column masking (contract 6.3): the effective rules, a traced plan per statement, and the actions on values.

Rules come from the caller's key or role, the saved-query version (every caller, admin included) and the ad-hoc
`mask` of /execute_sql; they are unioned and, per result column, the strictest action among the rules matching any
source column it is computed from wins (drop > null > mask > hash > keep). The lineage is qag/sql/lineage.py;
what can't be traced is refused with 403 mask_unresolvable before the query runs.

`hash` is a keyed HMAC so that hashed values can't be dictionary-attacked; nothing a caller chooses may be hashed
with the administrators' key, or its hashes become that dictionary. So a caller's own `hash` rules (/execute_sql's
`mask`) are keyed with a key derived from the mask key (own_key, OWN_HASH), and a masked caller's write may not
name a table with a column its rules mask, nor a view (at_source).

Cost: a caller and version without rules pay one truth test. With rules, a warm call does a dict lookup for the
connection's schema and one for the plan; per row only the masked columns are touched.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from collections import OrderedDict
from fnmatch import fnmatchcase
from functools import lru_cache
from itertools import count

from ..backends.base import default_schema as server_default_schema
from ..backends.base import other_text_reading, text_read_by_default
from ..errors import QagError
from ..sql import lexer
from ..sql.access import ExactSchema, is_exact, sqlite_in_table
from ..sql.lineage import DIALECTS, Schema, Source, Unresolvable
from ._source_mask import (CHANGING, FUNCTIONS, IPAD, OPAD, OWN_HASH, OWN_IPAD, OWN_OPAD, PADS, SQLITE_HASH,
                           SQLITE_MASK, SQLITE_OWN_HASH, SourceMask, rewrite)
from .keyfields import MASK_ACTIONS

# Lower is stricter: drop > null > mask > hash > OWN_HASH (a caller's own hash rule) > keep. OWN_HASH ranks below
# `hash`, so where an administrator's rule and the caller's own both hash a column the administrators' key is used.
RANK = {action: i for i, action in enumerate(
    a for stored in MASK_ACTIONS for a in ((stored, OWN_HASH) if stored == "hash" else (stored,)))}
_STORED_RANK = {action: RANK[action] for action in MASK_ACTIONS}   # what a stored (dict) rule may say
# The message the own key is derived with (own_key): fixed, so every worker and instance on a store derive alike.
OWN_KEY_LABEL = b"qag mask key: the hash of a caller's own /execute_sql rules"
UNMASKED_KEYWORDS = frozenset(("show", "describe", "desc", "explain"))  # contract 6.3: not masked

SCHEMA_TTL = 60.0        # a connection's schema is used this long ...
SCHEMA_REFRESH = 45.0    # ... and read again in the background after this
SCHEMA_ENTRIES = 64      # connections (and database overrides) whose schema is kept
OTHER_DATABASES_MAX = 8  # MySQL: other databases a statement names, read with the connection's own
_MYSQL_CATALOGS = frozenset(("information_schema", "mysql", "performance_schema", "sys"))
PLAN_ENTRIES = 256       # traced statements kept (per SQL, connection and schema generation)
RULESETS_PER_PLAN = 8    # compiled rule sets kept per traced statement

_CORRUPT = ("*.*", "drop")     # a stored rule that doesn't read as one hides everything rather than nothing
_REFUSED = "This result can't be masked safely: "


# --- rules ------------------------------------------------------------------------------------------------
def _pairs(rules) -> list:
    out = []
    for rule in rules or ():
        ranks = RANK
        if isinstance(rule, dict):
            column, action = rule.get("column"), rule.get("action")
            ranks = _STORED_RANK    # a stored rule never says OWN_HASH: only own_rules() makes it
        elif isinstance(rule, (tuple, list)) and len(rule) == 2:
            column, action = rule
        else:
            column = action = None
        if isinstance(column, str) and action in ranks and 2 <= column.count(".") + 1 <= 3:
            out.append((column.lower(), action))
        else:
            out.append(_CORRUPT)
    return out


def effective(*sources) -> tuple:
    """The union of rule lists (stored dicts or (column, action) pairs) as a sorted tuple of pairs; () if none."""
    if not any(sources):
        return ()
    return tuple(sorted({pair for rules in sources for pair in _pairs(rules)}))


def own_rules(rules) -> list:
    """A caller's own rules (/execute_sql's `mask`, normalised) as (column, action) pairs for effective(), each
    `hash` made OWN_HASH: hashed with the own key (own_key), never comparable with an administrator's `hash`."""
    return [(rule["column"], OWN_HASH if rule["action"] == "hash" else rule["action"]) for rule in rules or ()]


def fingerprint(rules) -> str:
    """A stable digest of the effective rules ("" when there are none), for response-cache keys."""
    pairs = effective(rules)
    if not pairs:
        return ""
    text = json.dumps(pairs, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


@lru_cache(maxsize=1024)
def _compiled(rules: tuple) -> tuple:
    return tuple((tuple(column.split(".")), action) for column, action in rules)


def _matches(parts: tuple, schema: str, table: str, column: str) -> bool:
    if len(parts) == 3 and not fnmatchcase(schema, parts[0]):
        return False
    return fnmatchcase(table, parts[-2]) and fnmatchcase(column, parts[-1])


def source_action(source, rules: tuple) -> str | None:
    """The strictest action of the rules matching one source column (None: no rule). Raises Unresolvable for a
    view column named like a rule's column part that no rule names as a view column."""
    best = None
    for parts, action in _compiled(rules):
        if _matches(parts, source.schema, source.table, source.column):
            if best is None or RANK[action] < RANK[best]:
                best = action
    if best is None and source.view and any(fnmatchcase(source.column, parts[-1]) for parts, _ in _compiled(rules)):
        raise Unresolvable(f"the view column {source.table}.{source.column} is named like a masked column; "
                           f"a rule must name the view column")
    return best


# --- actions on values --------------------------------------------------------------------------------------
def text_of(value) -> str:
    """The text a value is hashed as: str() of the driver value, bytes decoded as UTF-8."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


class Hasher:
    """`hash`: the first 16 hex digits of HMAC-SHA256 of the value's text; NULL stays NULL.

    HMAC (RFC 2104) is computed from two SHA-256 states prepared once from the key: copying them per value costs
    less than half of what hmac.HMAC.copy() does."""

    __slots__ = ("_inner", "_outer", "pads")

    def __init__(self, key: bytes, names: tuple[str, str] = (IPAD, OPAD)):
        if len(key) > 64:   # SHA-256's block size: longer keys are hashed first (RFC 2104)
            key = hashlib.sha256(key).digest()
        key = key.ljust(64, b"\0")
        inner, outer = bytes(b ^ 0x36 for b in key), bytes(b ^ 0x5C for b in key)
        # The key XOR ipad and XOR opad, in hex: what an engine needs to compute the same HMAC (masking at the
        # source), bound as values under `names` (the own key's: OWN_IPAD, OWN_OPAD).
        self.pads = {names[0]: inner.hex(), names[1]: outer.hex()}
        self._inner = hashlib.sha256(inner)
        self._outer = hashlib.sha256(outer)

    def __call__(self, value):
        if value is None:
            return None
        inner = self._inner.copy()
        inner.update(text_of(value).encode("utf-8", "surrogatepass"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:8].hex()


def own_key(key: bytes) -> bytes:
    """The key of a caller's own `hash` rules: HMAC-SHA256(mask key, OWN_KEY_LABEL). Without the mask key it can't
    be told from random, and the mask key can't be recovered from it (its pads travel as bound values, as the mask
    key's do): hashes made with it say nothing about hashes made with the mask key.

    It is the same for every caller: a caller's own rule hashes only values the caller can read unmasked (where an
    administrator's rule also matches, the stricter one wins and `hash` is the administrators' key), so its own
    hashes hide nothing from it; what matters is that they never meet an administrator's. A per-caller key would
    add only that two callers' own pseudonyms could not be joined, at a key and two bound pads per caller."""
    return hmac.new(key, OWN_KEY_LABEL, hashlib.sha256).digest()


def mask_value(value):
    """`mask`: e-mail → first character of the local part + ***@domain; other text → first character and at
    least three stars; non-text or empty → NULL."""
    if not isinstance(value, str) or not value:
        return None
    local, at, domain = value.partition("@")
    if at:
        return local[:1] + "***@" + domain
    return value[0] + "*" * max(3, len(value) - 1)


def null_value(_value):
    return None


# --- a plan for one traced statement and one rule set ----------------------------------------------------------
class MaskPlan:
    """What happens to each result column; rows() transforms a page or a stream batch.

    `source` (a SourceMask) is the statement rewritten so that the engine reads masked tables through masked
    derived tables: then the values arrive masked, and rows() only drops the columns `drop` removes."""

    __slots__ = ("width", "names", "actions", "sources", "changed", "source", "_keep", "_funcs", "_all_kept")

    def __init__(self, outputs, rules: tuple, hasher: Hasher, at_source: SourceMask | None = None,
                 own_hasher: Hasher | None = None):
        actions, sources = [], []
        for out in outputs:
            best, where = None, None
            for column in sorted(out.sources):
                action = source_action(column, rules)
                if action is not None and (best is None or RANK[action] < RANK[best]):
                    best, where = action, column
            actions.append(best)
            sources.append(None if where is None else f"{where.table}.{where.column}")
        self.width = len(outputs)
        self.names = tuple(out.name for out in outputs)   # as traced (lower-cased where the dialect folds them)
        self.actions = tuple(actions)
        self.sources = tuple(sources)
        self.changed = any(a in CHANGING for a in actions) or at_source is not None
        self.source = at_source
        # A caller's own hash rule is keyed with the own key (own_key); without its hasher, NULL (never comparable).
        funcs = {"hash": hasher, OWN_HASH: own_hasher or null_value, "mask": mask_value, "null": null_value}
        self._keep = tuple(i for i, a in enumerate(actions) if a != "drop")
        self._funcs = () if at_source is not None else \
            tuple((i, funcs[actions[i]]) for i in self._keep if actions[i] in funcs)
        self._all_kept = len(self._keep) == self.width

    def check(self, columns) -> None:
        if len(columns) != self.width:
            raise QagError("mask_unresolvable", _REFUSED + f"the query returned {len(columns)} columns where "
                                                           f"{self.width} were traced")

    def columns(self, columns: list) -> list:
        return list(columns) if self._all_kept else [columns[i] for i in self._keep]

    def rows(self, rows: list) -> list:
        if not self.changed or (self._all_kept and not self._funcs):
            return rows
        keep, funcs = self._keep, self._funcs
        out = []
        for row in rows:
            values = list(row)
            for i, func in funcs:
                values[i] = func(values[i])
            out.append(tuple(values) if self._all_kept else tuple([values[i] for i in keep]))
        return out

    def report(self, columns) -> list[dict]:
        """Run history's `masked`: the columns masking changed (names as the driver gave them); a caller's own
        hash rule is reported as the `hash` it asked for."""
        return [{"column": columns[i], "action": "hash" if a == OWN_HASH else a, "source": self.sources[i]}
                for i, a in enumerate(self.actions) if a in CHANGING]


class _Refusal:
    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


# --- per worker: schema cache, plan cache, key ------------------------------------------------------------------
class Masking:
    """One per worker: the masking key, connection schemas (60 s, background refresh after 45 s, forgotten when
    the connection row changes) and traced plans (LRU per SQL, connection and schema generation)."""

    def __init__(self, store, settings):
        self.store = store
        self._configured = settings.mask_key
        self._hasher: Hasher | None = None
        self._own_hasher: Hasher | None = None
        self._lock = threading.Lock()
        self._schemas: OrderedDict = OrderedDict()   # key → [Schema, raw, read at, refreshing]
        self._plans: OrderedDict = OrderedDict()     # (sql, connection key, generation) → [outputs|_Refusal, {}]
        self._generations = count(1)

    # the key
    def hasher(self) -> Hasher:
        if self._hasher is None:
            self._hasher = Hasher(self._key())
        return self._hasher

    def own_hasher(self) -> Hasher:
        """The hasher of a caller's own `hash` rules: keyed with own_key(), its pads bound as OWN_IPAD/OWN_OPAD."""
        if self._own_hasher is None:
            self._own_hasher = Hasher(own_key(self._key()), (OWN_IPAD, OWN_OPAD))
        return self._own_hasher

    def source_functions(self) -> tuple:
        """SQLite: the functions a statement masked at the source calls, registered on its connection."""
        return source_functions(self.hasher(), self.own_hasher())

    def _key(self) -> bytes:
        if self._configured:
            return self._configured.encode("utf-8")
        value = self.store.get_meta("mask_key")
        if value is None:
            with self.store.transaction():
                value = self.store.get_meta("mask_key")
                if value is None:
                    value = secrets.token_hex(32)
                    self.store.set_meta("mask_key", value)
        return value.encode("utf-8")

    # the plan
    def plan(self, rules: tuple, prepared, connection: dict, backend, fields: dict,
             database: str | None = None) -> MaskPlan | None:
        """The mask plan of one call, or None when the statement isn't masked (SHOW/DESCRIBE/EXPLAIN).
        Raises 403 mask_unresolvable before anything runs when the result can't be traced."""
        if prepared.first_keyword in UNMASKED_KEYWORDS:
            return None
        dialect = getattr(backend, "dialect", None)
        if dialect not in DIALECTS:
            raise QagError("mask_unresolvable", _REFUSED + f"columns can't be traced on '{connection['db']}' "
                                                           f"connections")
        if not text_read_by_default(dialect, fields):
            raise other_text_reading()
        others = other_databases(prepared, dialect, fields, database)
        conn_key = (connection["name"], connection.get("db"), connection.get("updated_at"),
                    json.dumps(fields, sort_keys=True, default=str), database, others)
        try:
            schema = self._schema(conn_key, backend, fields, database, others)
        except QagError as error:
            error.extras.pop("detail", None)  # a caller with rules never sees driver text (contract 0.3)
            raise
        key = (prepared.sql, conn_key, schema.generation)
        with self._lock:
            entry = self._plans.get(key)
            if entry is not None:
                self._plans.move_to_end(key)
                compiled = entry[1].get(rules)
                if compiled is not None:
                    return _answer(compiled)
        if entry is None:
            try:
                traced = prepared.lineage(schema)
            except Unresolvable as why:
                traced = _Refusal(str(why))
            entry = [traced, {}]
        traced = entry[0]
        if isinstance(traced, _Refusal):
            compiled = traced
        else:
            try:
                source = at_source(prepared, schema, rules)
                compiled = MaskPlan(traced, rules, self.hasher(), source, self.own_hasher())
                if source is None and any(a in CHANGING for a in compiled.actions):
                    # The trace says a result column comes from a masked column, the engine's reading of the
                    # statement finds no masked table it reads: the readers disagree (a CTE sqlglot takes for the
                    # table, say), and masking the values here, after the fact, would hash what the caller chose.
                    raise Unresolvable("the statement's readers disagree on where a masked column's values come "
                                       "from")
            except Unresolvable as why:
                compiled = _Refusal(str(why))
        with self._lock:
            if len(entry[1]) >= RULESETS_PER_PLAN:
                entry[1].clear()
            entry[1][rules] = compiled
            self._plans[key] = entry
            self._plans.move_to_end(key)
            while len(self._plans) > PLAN_ENTRIES:
                self._plans.popitem(last=False)
        return _answer(compiled)

    # the schema
    def _schema(self, key, backend, fields: dict, database: str | None, others: tuple = ()) -> Schema:
        now = time.monotonic()
        refresh = False
        with self._lock:
            item = self._schemas.get(key)
            if item is not None and now - item[2] < SCHEMA_TTL:
                self._schemas.move_to_end(key)
                if now - item[2] >= SCHEMA_REFRESH and not item[3]:
                    item[3] = refresh = True
                found = item[0]
            else:
                found = None
        if found is not None:
            if refresh:
                threading.Thread(target=self._refresh, args=(key, backend, fields, database, others),
                                 daemon=True, name="qag-mask-schema").start()
            return found
        raw = read_schema(backend, fields, database, others)
        return self._remember(key, raw, backend.dialect, fields, database, now)

    def _refresh(self, key, backend, fields: dict, database: str | None, others: tuple = ()) -> None:
        started = time.monotonic()
        try:
            raw = read_schema(backend, fields, database, others)
        except Exception:  # noqa: BLE001 - the entry stays until it expires; the next reader sees the error
            with self._lock:
                item = self._schemas.get(key)
                if item is not None:
                    item[3] = False
            return
        self._remember(key, raw, backend.dialect, fields, database, started)

    def _remember(self, key, raw: dict, dialect: str, fields: dict, database: str | None, read_at: float) -> Schema:
        with self._lock:
            item = self._schemas.get(key)
            if item is not None and item[1] == raw:
                item[2], item[3] = read_at, False   # unchanged: same generation, traced plans stay warm
                return item[0]
        schema = Schema(raw, dialect, default_schema(dialect, fields, database),
                        exact=dialect == "mysql" and is_exact(server_default_schema(dialect, fields)))
        schema.generation = next(self._generations)
        with self._lock:
            self._schemas[key] = [schema, raw, read_at, False]
            self._schemas.move_to_end(key)
            while len(self._schemas) > SCHEMA_ENTRIES:
                self._schemas.popitem(last=False)
        return schema


def at_source(prepared, schema: Schema, rules: tuple) -> SourceMask | None:
    """The statement with each table that has a masked column read through masked values (_source_mask), or
    None when it reads none. Raises Unresolvable where that can't be shown to cover the statement."""
    def columns(schema_name: str, table: str):
        return schema.columns.get((schema_name.lower(), table.lower())) if schema.lists(schema_name, table) else None

    def action(schema_name: str, table: str, column: str):
        return source_action(Source(schema_name, table, column, (schema_name, table) in schema.views), rules)

    # Bound or text ({name}): the pads are bound under these names and take the place of a caller's value.
    if any(name.lower() in PADS for name in prepared.placeholders):
        raise Unresolvable(f"the placeholder names {', '.join(PADS)} are the gateway's own")
    if prepared.dialect == "sqlite" and _sqlite_in_table(prepared.sql):
        raise Unresolvable("SQLite's `IN table` reads a table no reader of the statement sees as one")
    uses = _check_tables_listed(prepared, schema)
    # SQLite: masking's functions are registered on the call's connection; a caller's call of one would hash (with
    # the administrators' key) a value of its choosing.
    if any(name.rpartition(".")[2] in FUNCTIONS for name in (*uses.user_functions, *(n for _, n in uses.calls))):
        raise Unresolvable(f"the function names {', '.join(FUNCTIONS)} are the gateway's own")
    if prepared.write_ops and any(a in CHANGING for _, a in rules):
        _check_write(uses, schema, action)
    source = rewrite(prepared, columns, action, schema.default)
    if source is not None and prepared.write_ops:
        raise Unresolvable("a write can't read a table with masked columns")
    return source


def _check_write(uses, schema: Schema, action) -> None:
    """A masked caller's write names no table with a column its rules mask, and no view: every table it names
    (`Prepared.uses`: written and read alike, every clause; which of them it writes into is not asked). Values the
    caller chooses must never come back masked: hashed with the administrators' key, they are a dictionary of that
    key's hashes (insert candidates into a `*.ssn`-hashed `notes.ssn`, read them back hashed, compare with
    `customers.ssn`'s); nor may a masked value be copied where it is read unmasked. A view is refused whatever its
    columns: the rows written through it land in tables the statement doesn't name (`CREATE VIEW v AS SELECT id,
    ssn AS s FROM notes`, then `INSERT INTO v`)."""
    for table in uses.tables:
        database, _, name = table.rpartition(".")
        key = (database.lower(), name.lower())
        if key in schema.views:
            raise Unresolvable(f"a write can't name a view ({name}): what it writes lands in tables masking can't "
                               f"see")
        if any(action(key[0], key[1], column.lower()) in CHANGING for column, _ in schema.columns[key]):
            raise Unresolvable(f"a write can't write into or read a table with masked columns ({name})")


def _check_tables_listed(prepared, schema: Schema):
    """Every table the statement reads is one the schema lists, by the table check's reading (`Prepared.uses`:
    the engine's own parser on PostgreSQL, every way the server may read quotes and backslashes elsewhere, CTEs
    scoped as the engine scopes them), writes and every clause included; that reading is returned. The rewrite can
    wrap only a listed table; the trace checks its own scopes too, but sqlglot builds none for some clauses (a set
    operation's ORDER BY). On a server that compares names exactly, they are read and compared as written."""
    uses = prepared.uses(ExactSchema(schema.default or "") if schema.exact else schema.default or "")
    if uses.failure is not None:
        raise Unresolvable("the tables it reads can't be read for certain")
    for table in uses.tables:
        database, _, name = table.rpartition(".")
        if not schema.lists(database, name):
            raise Unresolvable(f"{name} is not a table of the connection's schema: its columns can't be masked")
    return uses


def _sqlite_in_table(sql: str) -> bool:
    """SQLite's `expr IN table` (access.sqlite_in_table): the rewrite would never wrap the table it reads."""
    return sqlite_in_table(lexer.significant(lexer.tokenize(sql, "sqlite")))


def source_functions(hasher: Hasher, own_hasher: Hasher | None = None) -> tuple:
    """SQLite: the functions a statement masked at the source calls, registered on its connection (a caller's own
    hash rules call SQLITE_OWN_HASH, keyed with own_key: registered only with its hasher)."""
    own = () if own_hasher is None else ((SQLITE_OWN_HASH, own_hasher),)
    return ((SQLITE_HASH, hasher), *own, (SQLITE_MASK, mask_value))


def _answer(compiled):
    if isinstance(compiled, _Refusal):
        raise QagError("mask_unresolvable", _REFUSED + compiled.message)
    return compiled


def default_schema(dialect: str, fields: dict, database: str | None) -> str | None:
    """Where an unqualified table name resolves: SQLite main, MySQL the database, PostgreSQL the connection's
    `schema` option or public."""
    if dialect == "sqlite":
        return "main"
    if dialect == "mysql":
        name = database if database is not None else fields.get("database")
        return str(name) if name else None
    return str(fields.get("schema") or "public")


def other_databases(prepared, dialect: str, fields: dict, database: str | None) -> tuple[str, ...]:
    """MySQL: the other databases of the server whose tables the statement names (`billing.history` from a
    connection to `crm`), as written (the server compares names exactly where `lower_case_table_names` is 0), sorted,
    at most OTHER_DATABASES_MAX; the engine's catalogs are left out (refused to a masked caller anyway). Their
    columns are read with the connection's own, so a column of such a table traces and is masked as one of the
    connection's database is; a table of a database not read is refused (_source_mask.rewrite). Elsewhere ():
    a PostgreSQL read covers every schema of the database."""
    if dialect != "mysql":
        return ()
    own = default_schema(dialect, fields, database)
    names = [name for name in _databases_named(prepared) if name != own and name.lower() not in _MYSQL_CATALOGS]
    return tuple(names[:OTHER_DATABASES_MAX])


@lru_cache(maxsize=PLAN_ENTRIES)
def _databases_named(prepared) -> tuple[str, ...]:
    """The databases a statement's table references name, as written, sorted: read once per statement (prepare()
    keeps one Prepared per SQL text; its references are read by tokenizing the whole text)."""
    try:
        references = prepared.table_references()
    except Unresolvable:
        return ()       # refused by the rewrite anyway
    return tuple(sorted({schema for _, _, schema, _, _, cte_named in references if schema and not cte_named}))


def read_schema(backend, fields: dict, database: str | None, others: tuple[str, ...] = ()) -> dict:
    """A fresh read of the connection's tables and columns, with those of `others` (other_databases) (this module
    caches; the backends' own caches for the schema routes would add their age to ours)."""
    raw = backend.fresh_schema(fields, database)
    if not others:
        return raw
    tables, truncated = list(raw.get("tables", ())), bool(raw.get("truncated"))
    for name in others:
        other = backend.fresh_schema(fields, name)
        tables += [{**table, "schema": name} for table in other.get("tables", ())]
        truncated = truncated or bool(other.get("truncated"))
    return {**raw, "tables": tables, "truncated": truncated}
