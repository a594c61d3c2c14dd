"""The store interface the handlers use; implemented by the SQLite store and the PostgreSQL store."""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, Iterator


PAUSE_ROWS = 64   # rows add_runs prepares between two calls of its `pause` (qag.observe.events.PAUSE_EVERY's cadence)


class StoreError(RuntimeError):
    """The store cannot be opened or used (newer schema, unreadable file, ...)."""


class StoreUnanswered(StoreError):
    """A change was sent to the store and its reply never came (its connection was cut at the deadline, or lost):
    it may have been applied, so its outcome is unknown (a 503 without Retry-After; a writer thread resends its
    batch under the same id, which the store skips if it has it)."""


class StoreTimeout(StoreUnanswered):
    """The store did not answer a round trip in time: its connection was cut, and a write's outcome is unknown."""


class Store(abc.ABC):
    """Rows in, rows out: dicts with JSON fields already decoded. No HTTP, no policy."""

    def unavailable(self, exc: BaseException) -> str | None:
        """Why the store can't be used now when `exc` says so (down, unreachable, locked past its wait: a 503
        with Retry-After, never a 500; a batch writer holds its batch and tries again), with no password in it;
        None for any other failure."""
        return str(exc) if isinstance(exc, StoreError) else None

    # --- lifecycle -------------------------------------------------------------------------
    @abc.abstractmethod
    def close(self) -> None: ...

    @abc.abstractmethod
    def describe(self) -> str:
        """Where the store is, for log lines: never a password."""

    @abc.abstractmethod
    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """A read-modify-write transaction (serialised against other writers, other processes too)."""

    @abc.abstractmethod
    def get_meta(self, key: str) -> str | None: ...

    @abc.abstractmethod
    def ping(self, timeout: float) -> None:
        """Raise unless the store answers a read within `timeout` seconds (a fresh connection: /readyz)."""

    @abc.abstractmethod
    def set_meta(self, key: str, value: str) -> None: ...

    # --- connections -----------------------------------------------------------------------
    @abc.abstractmethod
    def list_connections(self) -> list[dict]: ...

    @abc.abstractmethod
    def get_connection(self, name: str) -> dict | None: ...

    @abc.abstractmethod
    def put_connection(self, row: dict, *, create: bool) -> None: ...

    @abc.abstractmethod
    def delete_connection(self, name: str) -> bool: ...

    # --- saved queries ---------------------------------------------------------------------
    @abc.abstractmethod
    def list_queries(self) -> list[dict]:
        """Every query with its versions (ascending)."""

    @abc.abstractmethod
    def get_query(self, name: str) -> dict | None:
        """{name, collection, published, example, created_at, versions: [...]} or None."""

    @abc.abstractmethod
    def get_query_head(self, name: str) -> dict | None:
        """{name, collection, published, latest} without the versions: the hot path's read."""

    @abc.abstractmethod
    def get_version(self, name: str, version: int) -> dict | None: ...

    @abc.abstractmethod
    def get_query_for_run(self, name: str, version: int | None) -> tuple[dict | None, dict | None]:
        """(head, version row) in one consistent read; version None = the published one."""

    @abc.abstractmethod
    def create_query(self, name: str, collection: str | None, version: dict, publish: bool) -> None: ...

    @abc.abstractmethod
    def add_version(self, name: str, version: dict, publish: bool) -> int: ...

    @abc.abstractmethod
    def update_version(self, name: str, number: int, changes: dict) -> None: ...

    @abc.abstractmethod
    def delete_version(self, name: str, number: int) -> None: ...

    @abc.abstractmethod
    def set_published(self, name: str, version: int | None) -> None: ...

    @abc.abstractmethod
    def set_collection(self, name: str, collection: str | None) -> None: ...

    @abc.abstractmethod
    def delete_query(self, name: str) -> bool: ...

    @abc.abstractmethod
    def collections(self) -> set[str]: ...

    # --- API keys and roles ----------------------------------------------------------------
    @abc.abstractmethod
    def count_keys(self) -> int: ...

    @abc.abstractmethod
    def list_keys(self) -> list[dict]: ...

    @abc.abstractmethod
    def get_key(self, name: str) -> dict | None: ...

    @abc.abstractmethod
    def key_by_hash(self, secret_hash: str) -> tuple[dict, bool] | None:
        """(key row, True when the hash is the rotated-out previous secret) or None."""

    @abc.abstractmethod
    def put_key(self, row: dict, *, create: bool) -> None: ...

    @abc.abstractmethod
    def delete_key(self, name: str) -> bool: ...

    @abc.abstractmethod
    def touch_key(self, name: str, previous: bool, at: str) -> None: ...

    @abc.abstractmethod
    def list_roles(self) -> list[dict]: ...

    @abc.abstractmethod
    def get_role(self, name: str) -> dict | None: ...

    @abc.abstractmethod
    def put_role(self, row: dict, *, create: bool) -> None: ...

    @abc.abstractmethod
    def delete_role(self, name: str) -> bool: ...

    # --- audit -----------------------------------------------------------------------------
    @abc.abstractmethod
    def audit(self, at: str, actor: str, via: str, action: str, target: str, changes: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    def audit_entries(self, action: str | None = None) -> Iterator[dict]: ...

    # --- run history and the event log (one row per executed run; see schema.py) ----------
    @abc.abstractmethod
    def name_ids(self, names: set[str]) -> dict[str, int]:
        """Interned ids of the given texts (query, connection, key names, error codes), created as needed."""

    @abc.abstractmethod
    def version_uuids(self, pairs: set[tuple[str, int]]) -> dict[tuple[str, int], str]:
        """The uuid of each (query, version) that still exists."""

    @abc.abstractmethod
    def add_runs(self, rows: list[tuple], *, limit: int, adhoc_limit: int, by_count: bool, events_since: int,
                 pause: Callable[[], None] | None = None, batch_id: str | None = None) -> None:
        """Insert run rows (RUN_COLUMNS order) in one statement per chunk, then trim history to the newest
        `limit` per touched version and `adhoc_limit` ad-hoc (when by_count); all in one transaction. `pause`,
        when given, is called every PAUSE_ROWS rows while the statements' values are prepared, before the
        transaction (the history writer's qag.observe.events.pause: request threads get the interpreter lock).
        A batch whose `batch_id` was applied already (sent again after a lost commit reply) is skipped."""

    @abc.abstractmethod
    def prune_runs(self, *, events_since: int, history_since: int | None, batch: int) -> int:
        """One small sweep: events older than events_since that left history, and (retention by age) history
        older than history_since. Returns rows changed; call again while it returns `batch`."""

    @abc.abstractmethod
    def history(self, where: dict, before: tuple[int, int] | None, limit: int) -> list[dict]:
        """History rows in completion order, newest first (seq, id), with names resolved; `before` is a (seq, id)
        cursor; where: kind, query, version, ok, key, since, until (Unix seconds of `at`)."""

    @abc.abstractmethod
    def events_after(self, after_id: int, limit: int) -> list[dict]:
        """Event-log rows with an id above `after_id`, lowest id first (contract 8.6)."""

    @abc.abstractmethod
    def last_event_id(self) -> int:
        """The highest event id so far (0 for none)."""

    @abc.abstractmethod
    def run_stats(self, query: str | None = None) -> dict:
        """{query name: (last run at, {version: history entries})}, for one query or all."""

    @abc.abstractmethod
    def events(self, after: int, limit: int) -> list[dict]:
        """Event rows with id > after, oldest first, names resolved."""

    # --- quota counts (contract 6.8; see schema.py step 3) ----------------------------------
    @abc.abstractmethod
    def add_quota_usage(self, increments: list[tuple[str, str, str, str, int, int]], at: int,
                        write_id: str | None = None) -> None:
        """Add (workspace, caller, per, period, calls, rows) increments (may be negative: a refunded call) to the
        stored counts, creating rows as needed, setting updated_at = at; one transaction. Increments whose
        `write_id` was applied already (sent again after a lost commit reply) are skipped."""

    @abc.abstractmethod
    def prune_writes(self, before: int) -> int:
        """Forget the ids of batch writes applied before `before` (Unix seconds); returns how many went."""

    @abc.abstractmethod
    def quota_counts(self, keys: list[tuple[str, str, str, str]]) -> dict[tuple[str, str, str, str], tuple[int, int]]:
        """Stored (calls, rows) of each (workspace, caller, per, period) that has a row."""

    @abc.abstractmethod
    def quota_usage_in(self, periods: list[tuple[str, str]]) -> list[dict]:
        """Every row whose (per, period) is one of `periods`: {workspace, caller, per, period, calls, rows,
        updated_at (Unix seconds)}, ordered by workspace, caller, per."""

    @abc.abstractmethod
    def prune_quota_usage(self, before: int) -> int:
        """Delete counts last written before `before` (Unix seconds); returns how many went."""
