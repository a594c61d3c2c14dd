"""The metadata store: connections, saved queries and versions, API keys, roles, audit log, history and events.

`open_store(settings)` picks the store: PostgreSQL when QAG_DATABASE_URL is set, else SQLite in QAG_HOME.
"""

from __future__ import annotations

from .base import Store, StoreError


def open_store(settings, *, url: str | None = None, home: str | None = None) -> Store:
    """The configured store (migrated on open). url/home override the settings (qag store copy)."""
    url = url if url is not None else (settings.database_url if home is None else None)
    if url:
        from .postgres import PostgresStore
        # One connection per request thread at most, plus the history writer, usage and key-touch threads.
        return PostgresStore(url, settings.audit_log_limit, pool_size=settings.threads + 4)
    from .sqlite import SqliteStore
    return SqliteStore(home if home is not None else settings.home, settings.audit_log_limit)


__all__ = ["Store", "StoreError", "open_store"]
