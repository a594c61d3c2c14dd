"""Reading a MySQL/MariaDB database's tables and columns from information_schema, and the cache in front of it.

Names are always bound values, never interpolated. The cache serves a read for TTL seconds and has a background
thread read it again after REFRESH_AFTER, so a steady reader (masking, the schema routes) never waits for
information_schema once warm.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

MAX_TABLES = 1000
TTL = 60.0             # seconds a read is served from the cache
REFRESH_AFTER = 45.0   # ... and after this many a background thread reads it again
ENTRIES = 64           # (settings, database) pairs kept per backend


def read(cursor, database: str) -> dict:
    """{"tables": [...], "truncated": bool} as contract 5.2's schema route, on a buffered qag cursor."""
    cursor.execute("SELECT TABLE_NAME, TABLE_TYPE FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s "
                   "ORDER BY TABLE_NAME LIMIT %s", (database, MAX_TABLES + 1))
    objects = cursor.page(0, 0)
    cursor.finish()
    truncated = len(objects) > MAX_TABLES
    objects = objects[:MAX_TABLES]
    columns: dict[str, list] = {t[0]: [] for t in objects}
    if objects:
        cursor.execute("SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, ORDINAL_POSITION, COLUMN_KEY "
                       "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME <= %s "
                       "ORDER BY TABLE_NAME, ORDINAL_POSITION", (database, objects[-1][0]))
        column_rows = cursor.page(0, 0)
        cursor.finish()
        cursor.execute("SELECT TABLE_NAME, COLUMN_NAME, REFERENCED_TABLE_SCHEMA, REFERENCED_TABLE_NAME, "
                       "REFERENCED_COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE "
                       "WHERE TABLE_SCHEMA = %s AND REFERENCED_TABLE_NAME IS NOT NULL", (database,))
        foreign = {(t, c): {"table": rt if rs == database else f"{rs}.{rt}", "column": rc}
                   for t, c, rs, rt, rc in cursor.page(0, 0)}
        cursor.finish()
        for table, column, ctype, nullable, position, ckey in column_rows:
            if table in columns:
                columns[table].append({"name": column, "type": ctype, "nullable": nullable == "YES",
                                       "position": int(position), "primary_key": ckey == "PRI",
                                       "foreign_key": foreign.get((table, column))})
    tables = [{"name": name, "schema": database, "type": "view" if kind == "VIEW" else "table",
               "columns": columns[name]} for name, kind in objects]
    return {"tables": tables, "truncated": truncated}


class SchemaCache:
    """Schema reads by (settings, database): bounded, served for `ttl` seconds, read again in the background
    after `refresh_after`; clear() forgets everything (a connection changed)."""

    def __init__(self, ttl: float = TTL, refresh_after: float = REFRESH_AFTER, entries: int = ENTRIES):
        self.ttl = ttl
        self.refresh_after = refresh_after
        self.entries = entries
        self._lock = threading.Lock()
        self._items: OrderedDict = OrderedDict()   # key → [value, read at, refreshing]
        self._generation = 0

    def get(self, key, load):
        now = time.monotonic()
        refresh = False
        with self._lock:
            item = self._items.get(key)
            if item is not None and now - item[1] < self.ttl:
                self._items.move_to_end(key)
                if now - item[1] >= self.refresh_after and not item[2]:
                    item[2] = refresh = True
                value = item[0]
            else:
                value = None
            generation = self._generation
        if value is not None:
            if refresh:
                threading.Thread(target=self._refresh, args=(key, load, generation), daemon=True,
                                 name="qag-mysql-schema").start()
            return value
        value = load()
        self._put(key, value, generation)
        return value

    def _refresh(self, key, load, generation: int) -> None:
        try:
            value = load()
        except Exception:  # the entry expires and the next reader sees the error itself
            with self._lock:
                item = self._items.get(key)
                if item is not None:
                    item[2] = False
            return
        self._put(key, value, generation)

    def _put(self, key, value, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                return      # cleared meanwhile: this read may be of the old settings
            self._items[key] = [value, time.monotonic(), False]
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._generation += 1
