"""The store's schema: DDL per version and the migrations that bring an older store up to date.

One list of migrations serves both stores. Each step is written once, in SQLite's dialect, and `statements(step,
dialect)` translates it for PostgreSQL in one place. Rules for a portable migration:

- Types: INTEGER (a 64-bit integer on both: BIGINT on PostgreSQL), TEXT, REAL, BLOB (BYTEA). A column declared
  without a type takes any value on SQLite and is TEXT on PostgreSQL (the store writes text there).
- Keys: `INTEGER PRIMARY KEY` (an id assigned when omitted) and `INTEGER PRIMARY KEY AUTOINCREMENT` (never
  reused) both become a BIGSERIAL primary key. Name the column `id`: `qag store copy` resets its sequence.
- Write plain DDL/DML with literal values: no placeholders, no `INSERT OR ...` (use `ON CONFLICT ... DO NOTHING`),
  no PRAGMA, no `LIMIT -1`, no SQLite-only functions. Partial indexes (`WHERE`), `REFERENCES ... ON DELETE CASCADE`,
  `CREATE ... IF NOT EXISTS` and `ALTER TABLE ... ADD COLUMN` work on both.
- When a statement cannot be portable, give it as {"sqlite": "...", "postgresql": "..."} instead of a string.
- Each step runs in one transaction; PostgreSQL runs concurrent migrations of several instances one at a time.
- Never edit a released step: add one. tests/unit/test_store.py runs every step on both stores.
"""

from __future__ import annotations

import re

# Each entry upgrades the store from version i to i + 1. Never edit a released step: add one.
MIGRATIONS: tuple[tuple[str | dict[str, str], ...], ...] = (
    (
        """CREATE TABLE meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        """CREATE TABLE connections (
            name TEXT PRIMARY KEY,
            db TEXT NOT NULL,
            active INTEGER NOT NULL DEFAULT 1,
            fields TEXT NOT NULL,          -- JSON: host, port, database, user, password, driver options
            example INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        )""",
        """CREATE TABLE queries (
            name TEXT PRIMARY KEY,
            collection TEXT,
            published INTEGER,             -- the served version number, or NULL
            example INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        )""",
        "CREATE INDEX queries_collection ON queries (collection)",
        """CREATE TABLE query_versions (
            query_name TEXT NOT NULL REFERENCES queries (name) ON DELETE CASCADE,
            version INTEGER NOT NULL,
            uuid TEXT NOT NULL,
            body TEXT NOT NULL,            -- JSON: description, author, tags, sql, parameters, ...
            created_at TEXT NOT NULL,
            last_modified_at TEXT NOT NULL,
            PRIMARY KEY (query_name, version)
        )""",
        """CREATE TABLE api_keys (
            name TEXT PRIMARY KEY,
            secret_hash TEXT NOT NULL UNIQUE,
            previous_hash TEXT UNIQUE,
            previous_expires_at TEXT,
            grants TEXT NOT NULL,          -- JSON, the grant fields of policy/grants
            active INTEGER NOT NULL DEFAULT 1,
            expires_at TEXT,
            created_at TEXT NOT NULL,
            created_from_role TEXT,
            last_used_at TEXT,
            previous_last_used_at TEXT,
            example INTEGER NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE roles (
            name TEXT PRIMARY KEY,
            grants TEXT NOT NULL,
            require_claim_binding INTEGER NOT NULL DEFAULT 0,
            keys_created INTEGER NOT NULL DEFAULT 0,
            example INTEGER NOT NULL DEFAULT 0,
            created_at TEXT NOT NULL
        )""",
        """CREATE TABLE audit_log (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            at TEXT NOT NULL,
            actor TEXT NOT NULL,
            via TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT NOT NULL,
            changes TEXT NOT NULL          -- JSON; never holds a secret
        )""",
    ),
    (
        # Run history and the event log in one compact table: a row per executed run, written in batches by
        # each worker's history writer (qag/observe). h = 1 while the run is in history (newest per version,
        # ad-hoc cap, sampling); every row is an event until QAG_EVENTS_RETENTION_HOURS sweeps it. Repeated
        # text (query, connection, key names, error codes) is interned in `names`.
        """CREATE TABLE names (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL UNIQUE
        )""",
        """CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,  -- the event id: never reused, even after sweeping
            at INTEGER NOT NULL,           -- when the run started, Unix seconds (shown server-local)
            h INTEGER NOT NULL,            -- 1 = in run history, 0 = event only
            q INTEGER,                     -- names.id of the saved query; NULL = ad-hoc
            v INTEGER,                     -- version number
            c INTEGER NOT NULL,            -- names.id of connection_name
            k INTEGER NOT NULL,            -- names.id of key_name
            rid,                           -- request id: 6 bytes when 12 lower-case hex digits, else text
            ok INTEGER NOT NULL,           -- 1 success, 0 error
            tr INTEGER,                    -- transport: NULL rest, 1 mcp, 2 export
            n INTEGER,                     -- rows
            ms INTEGER,                    -- duration_ms
            ser INTEGER,                   -- serialization_ms in tenths
            code INTEGER,                  -- names.id of the error code
            err TEXT,                      -- error message
            sql TEXT,                      -- ad-hoc statement (or its SHA-256, see x)
            x TEXT                         -- JSON of rare fields: params, truncation, database
        )""",
        "CREATE INDEX runs_at ON runs (at)",
        "CREATE INDEX runs_hist ON runs (q, v, at) WHERE h = 1",
        "CREATE INDEX runs_hist_at ON runs (at) WHERE h = 1",
    ),
    (
        # Quota counts per caller and calendar period (contract 6.8), added to by each worker's quota writer in
        # batches (qag/policy/quotas.py) and kept 400 days. Portable DDL: the same step runs on SQLite and on
        # PostgreSQL (BIGINT is a 64-bit integer on both; no AUTOINCREMENT, no SQLite-only types).
        """CREATE TABLE quota_usage (
            workspace TEXT NOT NULL,       -- 'default' until workspaces exist
            caller TEXT NOT NULL,          -- the API key's name
            per TEXT NOT NULL,             -- 'day' or 'month'
            period TEXT NOT NULL,          -- 'YYYY-MM-DD' or 'YYYY-MM', server-local calendar
            calls BIGINT NOT NULL DEFAULT 0,
            row_count BIGINT NOT NULL DEFAULT 0,
            updated_at BIGINT NOT NULL,    -- Unix seconds of the last write
            PRIMARY KEY (workspace, caller, per, period)
        )""",
        "CREATE INDEX quota_usage_updated ON quota_usage (updated_at)",
    ),
    (
        # History in completion order across workers and instances: `seq` is when the run completed, Unix
        # nanoseconds of the host's clock (qag/observe/observer.py). Runs written before it get their start
        # second, so they sort as they did; `id` still breaks ties.
        "ALTER TABLE runs ADD COLUMN seq INTEGER",
        "UPDATE runs SET seq = at * 1000000000",
        "DROP INDEX runs_hist",
        "DROP INDEX runs_hist_at",
        "CREATE INDEX runs_hist ON runs (q, v, seq) WHERE h = 1",
        "CREATE INDEX runs_hist_seq ON runs (seq) WHERE h = 1",
    ),
    (
        # The run's trace id (contract 8.1 `trace_id`, QAG_OTEL): as `rid`, compact bytes on SQLite (16, from 32
        # hex digits; a TEXT column keeps a BLOB as it is given) and the hex text on PostgreSQL (COPY writes bytes
        # as hex). NULL while tracing is off, so a row without it costs nothing more.
        "ALTER TABLE runs ADD COLUMN trace TEXT",
    ),
    (
        # Batch writes already applied, by the id their writer gave them (a history batch, a quota flush), written
        # in the batch's own transaction: a batch sent again because its commit's reply was lost (the connection
        # broke after the COMMIT left) is skipped instead of applied twice. Kept an hour (Store.prune_writes),
        # far longer than a writer retries a batch.
        """CREATE TABLE applied_writes (
            id TEXT PRIMARY KEY,
            at INTEGER NOT NULL            -- Unix seconds
        )""",
        "CREATE INDEX applied_writes_at ON applied_writes (at)",
    ),
)

SCHEMA_VERSION = len(MIGRATIONS)

# The columns a run row is written with (qag/observe/history.py builds them), in this order.
RUN_COLUMNS = ("at", "h", "q", "v", "c", "k", "rid", "ok", "tr", "n", "ms", "ser", "code", "err", "sql", "x", "seq",
               "trace")

DIALECTS = ("sqlite", "postgresql")

# SQLite DDL -> PostgreSQL DDL, applied in order to each portable statement.
_PG_RULES: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"\bINTEGER\s+PRIMARY\s+KEY(\s+AUTOINCREMENT)?\b", re.I), "BIGSERIAL PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b", re.I), "BIGINT"),
    (re.compile(r"\bBLOB\b", re.I), "BYTEA"),
)
# In CREATE TABLE, a column without a type (a line holding just "name,") is TEXT.
_TYPELESS = re.compile(r"^(\s*)([a-z_][a-z0-9_]*)\s*,", re.I | re.M)


def translate(statement: str | dict[str, str], dialect: str) -> str:
    """One migration statement in the given dialect ("sqlite" or "postgresql")."""
    if isinstance(statement, dict):
        return statement[dialect]
    if dialect == "sqlite":
        return statement
    if dialect != "postgresql":
        raise ValueError(f"unknown dialect {dialect!r}")
    for pattern, replacement in _PG_RULES:
        statement = pattern.sub(replacement, statement)
    if re.match(r"\s*CREATE\s+TABLE\b", statement, re.I):
        statement = _TYPELESS.sub(r"\1\2 TEXT,", statement)
    return statement


def statements(step: tuple, dialect: str) -> list[str]:
    """The statements of one migration step, translated."""
    return [translate(s, dialect) for s in step]


def tables() -> list[str]:
    """Every table the migrations create, in creation order (referenced tables first)."""
    out: list[str] = []
    for step in MIGRATIONS:
        for statement in step:
            text = translate(statement, "sqlite")
            for name in re.findall(r"CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", text, re.I):
                if name not in out:
                    out.append(name)
            for name in re.findall(r"DROP\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)", text, re.I):
                if name in out:
                    out.remove(name)
    return out
