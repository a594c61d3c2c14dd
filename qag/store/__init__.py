"""The metadata store: connections, saved queries and versions, API keys, roles, audit log, history and events.

`open_store(settings)` picks the store: PostgreSQL when QAG_DATABASE_URL is set, else SQLite in QAG_HOME.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3

from .base import Store, StoreError, StoreTimeout


class StoreOpenError(StoreError):
    """The store cannot be opened: one line naming the setting, what went wrong and what to do (exit status 2).
    transient: the server couldn't be reached or didn't answer (an outage a restarted worker may wait out), not a
    store that is wrong (a newer schema, a missing database or role)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


# libpq's words for why a connection failed (its own and the server's; a localised server falls through to the
# driver's text), and what the operator should do about each.
_PG_FAILURES = (
    (re.compile(r'database ".*" does not exist', re.I), "create the database or fix its name in the URL"),
    (re.compile(r'role ".*" does not exist|authentication failed|no password supplied|pg_hba\.conf', re.I),
     "check the user and password (and the server's pg_hba.conf)"),
    (re.compile(r"connection refused|could not translate host name|timeout expired|no route to host|"
                r"network is unreachable|could not connect", re.I),
     "start the server or fix host/port in the URL"),
)


def open_store(settings, *, url: str | None = None, home: str | None = None, setting: str | None = None,
               create: bool = True) -> Store:
    """The configured store (migrated on open). url/home override the settings (qag store copy), `setting` names
    where they came from in the message of a store that cannot be opened (StoreOpenError); `create=False` refuses
    a SQLite store file that does not exist rather than starting an empty one."""
    url = url if url is not None else (settings.database_url if home is None else None)
    if url:
        from .postgres import PostgresStore
        try:
            # One connection per request thread at most, plus the history writer, usage and key-touch threads.
            return PostgresStore(url, settings.audit_log_limit, pool_size=settings.threads + 4,
                                 timeout=settings.store_timeout)
        except StoreError as exc:
            cause = exc.__context__
            transient = isinstance(exc, StoreTimeout) or (
                cause is not None and type(cause).__module__.startswith("psycopg2")
                and type(cause).__name__ in ("OperationalError", "InterfaceError")
                and not _lasting(str(cause)))
            raise StoreOpenError(_postgres_failure(setting or "QAG_DATABASE_URL", url, exc), transient) from None
    from .sqlite import SqliteStore
    folder = home if home is not None else settings.home
    try:
        return SqliteStore(folder, settings.audit_log_limit, create)
    except (OSError, sqlite3.Error, StoreError) as exc:
        raise StoreOpenError(_sqlite_failure(setting or "QAG_HOME", folder, exc)) from None


def server_secret(store: Store) -> bytes:
    """A random key kept in the store, for digests of secrets (ETags) and the deployment's Redis names; shared by
    every worker and instance (and `qag events`), made by the first to ask."""
    value = store.get_meta("server_secret")
    if value is None:
        with store.transaction():
            value = store.get_meta("server_secret")
            if value is None:
                value = secrets.token_hex(32)
                store.set_meta("server_secret", value)
    return value.encode("ascii")


def _lasting(text: str) -> bool:
    """A libpq failure no wait mends: a database or role that doesn't exist, refused credentials."""
    return any(pattern.search(text) for pattern, _ in _PG_FAILURES[:2])


def _postgres_failure(setting: str, url: str, exc: StoreError) -> str:
    from .postgres import driver_text, redact
    cause = exc.__context__  # the driver's error the store's message wraps, when it is one
    if cause is None or not type(cause).__module__.startswith("psycopg2"):
        return f"{setting}: {exc}"  # the store's own words (a newer schema): they say what to do
    text = driver_text(cause, url)  # libpq can quote the password: scrubbed
    # "connection to server at ..., port ... failed: FATAL:  ...": the host and port are in the URL shown.
    reason = re.sub(r"^.*? failed:\s*(FATAL:\s*)?", "", (text.splitlines() or [type(cause).__name__])[0])
    todo = next((todo for pattern, todo in _PG_FAILURES if pattern.search(text)), "check the URL and the server")
    return f"{setting} {redact(url)}: {reason}; {todo}"


def _sqlite_failure(setting: str, folder: str, exc: BaseException) -> str:
    from .sqlite import STORE_FILE
    if isinstance(exc, OSError):
        reason = exc.strerror or str(exc)
        if os.path.basename(str(exc.filename)) == STORE_FILE:
            return (f"{setting} {folder}: cannot create the store qag.db there ({reason}); make the folder writable "
                    f"for this user, or set {setting} to another folder")
        if os.path.exists(folder) and not os.path.isdir(folder):
            return f"{setting} {folder} is a file, not a folder; set {setting} to a folder"
        return (f"{setting} {folder}: cannot create the folder ({reason}); create it, or set {setting} to a folder "
                f"this user can write")
    cause = exc if isinstance(exc, sqlite3.Error) else exc.__context__
    if isinstance(cause, sqlite3.Error):
        return (f"{setting} {folder}: cannot open the store qag.db there ({cause}); restore the file, or set "
                f"{setting} to another folder")
    return f"{setting}: {exc}"  # the store's own words (a newer schema): they say what to do


__all__ = ["Store", "StoreError", "StoreOpenError", "open_store"]
