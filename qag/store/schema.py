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
)

SCHEMA_VERSION = len(MIGRATIONS)
