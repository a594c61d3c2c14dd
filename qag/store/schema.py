"""The store's schema: DDL per version and the migrations that bring an older store up to date."""

from __future__ import annotations

# Each entry upgrades the store from version i to i + 1. Never edit a released step: add one.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
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
)

SCHEMA_VERSION = len(MIGRATIONS)

# The columns a run row is written with (qag/observe/history.py builds them), in this order.
RUN_COLUMNS = ("at", "h", "q", "v", "c", "k", "rid", "ok", "tr", "n", "ms", "ser", "code", "err", "sql", "x")
