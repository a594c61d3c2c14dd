"""Live usage counters since process start, per connection and per key (shown by the management API)."""

from __future__ import annotations

import threading


class Usage:
    """Counters updated once per executed call; a lock held for a few additions only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: dict[str, list] = {}  # name → [queries, errors, rows, total_ms]
        self._keys: dict[str, list] = {}         # name → [queries, errors, rows]

    def record(self, connection: str, key: str | None, ok: bool, rows: int, duration_ms: float) -> None:
        with self._lock:
            c = self._connections.setdefault(connection, [0, 0, 0, 0.0])
            c[0] += 1
            c[1] += 0 if ok else 1
            c[2] += rows
            c[3] += duration_ms
            if key is not None:
                k = self._keys.setdefault(key, [0, 0, 0])
                k[0] += 1
                k[1] += 0 if ok else 1
                k[2] += rows

    def connection(self, name: str) -> dict:
        queries, errors, rows, total = self._connections.get(name, (0, 0, 0, 0.0))
        return {"queries": queries, "errors": errors, "rows": rows,
                "avg_duration_ms": round(total / queries, 3) if queries else None}

    def key(self, name: str) -> dict:
        queries, errors, rows = self._keys.get(name, (0, 0, 0))
        return {"queries": queries, "errors": errors, "rows": rows}
