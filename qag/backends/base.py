"""What every backend takes (a Call) and gives back (a Result), and the errors it maps driver failures to."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import QagError


@dataclass(slots=True)
class Call:
    """One statement to run: rendered SQL and args, access mode, time limit and the rows wanted."""

    sql: str
    args: tuple
    read_only: bool
    timeout: float | None     # seconds; None = no limit
    fetch: int                # rows to fetch from the cursor (page size + 1, or up to the author's cap)
    skip: int = 0             # rows to discard first (statements whose window can't be applied in SQL)


@dataclass(slots=True)
class Result:
    """Column names as the driver gave them and the fetched rows (tuples)."""

    columns: list[str]
    rows: list[tuple]
    duration_ms: float


def timeout_error(limit: float) -> QagError:
    shown = int(limit) if float(limit).is_integer() else limit
    return QagError("query_timeout", f"The query exceeded the time limit of {shown} seconds and was cancelled",
                    timeout=shown)


def query_failed(detail: str) -> QagError:
    return QagError("query_failed", "An error occurred while executing the SQL query", detail=detail)


def connection_failed(detail: str) -> QagError:
    return QagError("connection_failed", "Could not connect to the database", detail=detail)
