"""`qag store copy`: every table of one store into another, empty, store (SQLite <-> PostgreSQL), in one transaction.

Rows are copied as stored: keys stay hashed, JSON stays text, ids (audit entries, interned names, event ids) are
kept and the target's id sequences are moved past them; meta comes along, server_secret and mask_key included, so
ETags, masking digests and keys work the same on the target. A target that holds any row is refused, never merged
or overwritten: a refusal and a failure change nothing, so the command can simply be run again.
"""

from __future__ import annotations

import os

from .base import Store, StoreError
from .schema import tables


def is_url(text: str) -> bool:
    return text.startswith(("postgresql://", "postgres://"))


def sqlite_home(text: str) -> str:
    """A SQLite store named by its folder (a QAG_HOME) or its qag.db file; it must exist already."""
    from .sqlite import STORE_FILE
    path = os.path.abspath(text)
    home = os.path.dirname(path) if os.path.basename(path) == STORE_FILE and os.path.isfile(path) else path
    if not os.path.isfile(os.path.join(home, STORE_FILE)):
        raise StoreError(f"no store at {home} (no {STORE_FILE} there)")
    return home


def copy_store(source: Store, target: Store) -> dict[str, int]:
    """{table: rows copied}. Raises StoreError (and changes nothing) when the target is not empty."""
    names = tables()
    with target.transaction():
        used = {}
        for table in names:
            _, rows = target.raw_rows(table)
            if rows:
                used[table] = len(rows)
        if used:
            listed = ", ".join(f"{t}: {n}" for t, n in used.items())
            raise StoreError(f"the target store {target.describe()} is not empty ({listed}); qag store copy only "
                             f"fills an empty store (never merges or overwrites) - point it at a new database, or "
                             f"empty this one first")
        counts, meta = {}, []
        for table in names:
            columns, rows = source.raw_rows(table)
            target.insert_raw(table, columns, rows)
            counts[table] = len(rows)
            if table == "meta":
                meta = [(row[columns.index("key")], row[columns.index("value")]) for row in rows]
        # A SQLite target's triggers move meta.config_generation as configuration rows arrive: set meta again
        # last, so the copy holds the source's values exactly.
        for key, value in meta:
            target.set_meta(key, value)
        target.after_copy(names)
    return counts
