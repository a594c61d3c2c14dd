"""Live usage counters since process start, per connection and per key (shown by the management API)."""

from __future__ import annotations

import threading


class _Shard:
    __slots__ = ("connections", "keys")

    def __init__(self) -> None:
        self.connections: dict[str, list] = {}  # name → [queries, errors, rows, total_ms]
        self.keys: dict[str, list] = {}         # name → [queries, errors, rows]


class Usage:
    """Each request thread counts into its own shard, so recording takes no lock; reads sum the shards."""

    def __init__(self) -> None:
        self._shards: list[_Shard] = []
        shards = self._shards

        class _Local(threading.local):
            def __init__(self) -> None:
                self.shard = _Shard()
                shards.append(self.shard)  # list.append is atomic; the shard outlives its thread, and its counts

        self._local = _Local()

    def record(self, connection: str, key: str | None, ok: bool, rows: int, duration_ms: float) -> None:
        shard = self._local.shard
        c = shard.connections.get(connection)
        if c is None:
            c = shard.connections[connection] = [0, 0, 0, 0.0]
        c[0] += 1
        c[1] += 0 if ok else 1
        c[2] += rows
        c[3] += duration_ms
        if key is not None:
            k = shard.keys.get(key)
            if k is None:
                k = shard.keys[key] = [0, 0, 0]
            k[0] += 1
            k[1] += 0 if ok else 1
            k[2] += rows

    def _sum(self, attr: str, name: str, width: int) -> list:
        total = [0] * width
        for shard in list(self._shards):
            values = getattr(shard, attr).get(name)
            if values is not None:
                for i, v in enumerate(list(values)):
                    total[i] += v
        return total

    def connection(self, name: str) -> dict:
        queries, errors, rows, total = self._sum("connections", name, 4)
        return {"queries": queries, "errors": errors, "rows": rows,
                "avg_duration_ms": round(total / queries, 3) if queries else None}

    def key(self, name: str) -> dict:
        queries, errors, rows = self._sum("keys", name, 3)
        return {"queries": queries, "errors": errors, "rows": rows}
