"""Live usage counters per connection and per API key since the instance started (shown by the management API)."""

from __future__ import annotations

from qag.observe.metrics import Metrics


class Usage:
    """Counts into the worker's metrics shards (observe/metrics.py): each request thread its own, so recording takes
    no lock and no I/O, and the counts ride on the metrics' snapshots, retired.m included. A read sums every worker
    of the instance from published figures only, so two reads never go back whichever worker answers; without the
    gunicorn master's folder (in-process use) the figures are this process's own."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self._local = self.metrics._local   # the same thread-local shards: one record place, one snapshot

    def record(self, connection: str, key: str | None, ok: bool, rows: int, duration_ms: float) -> None:
        shard = self._local.shard
        c = shard.usage_conn.get(connection)
        if c is None:
            c = shard.usage_conn[connection] = [0, 0, 0, 0.0]   # queries, errors, rows, total_ms
        c[0] += 1
        c[1] += 0 if ok else 1
        c[2] += rows
        c[3] += duration_ms
        if key is not None:
            k = shard.usage_key.get(key)
            if k is None:
                k = shard.usage_key[key] = [0, 0, 0]            # queries, errors, rows
            k[0] += 1
            k[1] += 0 if ok else 1
            k[2] += rows

    def read(self) -> UsageFigures:
        """The instance's counts now: one read serves every connection or key a management answer lists."""
        counters = self.metrics.instance()["c"]
        return UsageFigures(counters.get("usage_conn", {}), counters.get("usage_key", {}))

    def connection(self, name: str) -> dict:
        return self.read().connection(name)

    def key(self, name: str) -> dict:
        return self.read().key(name)


class UsageFigures:
    """One read of the instance's usage counters, as the management API shows them."""

    def __init__(self, connections: dict, keys: dict) -> None:
        self.connections = connections
        self.keys = keys

    def connection(self, name: str) -> dict:
        queries, errors, rows, total = self.connections.get(name) or (0, 0, 0, 0.0)
        return {"queries": queries, "errors": errors, "rows": rows,
                "avg_duration_ms": round(total / queries, 3) if queries else None}

    def key(self, name: str) -> dict:
        queries, errors, rows = self.keys.get(name) or (0, 0, 0)
        return {"queries": queries, "errors": errors, "rows": rows}
