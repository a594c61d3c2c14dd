"""Usage counters: lock-free per-thread shards that add up exactly, published with the metrics and summed over
every worker of the instance, a retired worker's included."""

from __future__ import annotations

import os
import threading

import pytest

from qag.api._usage import Usage
from qag.observe import metrics


def test_counts_from_many_threads_add_up_exactly():
    usage = Usage()

    def work():
        for i in range(1000):
            usage.record("lite", "k1", i % 10 != 0, 3, 2.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert usage.connection("lite") == {"queries": 8000, "errors": 800, "rows": 24000, "avg_duration_ms": 2.0}
    assert usage.key("k1") == {"queries": 8000, "errors": 800, "rows": 24000}


def test_unknown_names_and_admin_calls():
    usage = Usage()
    usage.record("lite", None, True, 1, 1.0)
    assert usage.key("nobody") == {"queries": 0, "errors": 0, "rows": 0}
    assert usage.connection("other") == {"queries": 0, "errors": 0, "rows": 0, "avg_duration_ms": None}
    assert usage.connection("lite")["queries"] == 1


@pytest.fixture
def shared(tmp_path, monkeypatch):
    """The gunicorn master's snapshot folder, as a worker sees it."""
    monkeypatch.setattr(metrics, "SHARED_DIR", str(tmp_path))
    return tmp_path


def _worker_file(shared, name: str, connections: dict, keys: dict) -> None:
    """Another worker's published snapshot: metrics counters besides the usage tables."""
    metrics._dump(str(shared / name), {"c": {"req": {}, "qry": {}, "usage_conn": connections, "usage_key": keys},
                                        "g": {"active": 0, "workers": 1}})


def test_a_read_sums_every_workers_published_usage_and_a_retired_workers_stays(shared):
    live = Usage()
    live.record("lite", "k1", True, 4, 10.0)
    _worker_file(shared, "w999999-1.m", {"lite": [2, 1, 6, 30.0]}, {"k1": [2, 1, 6]})
    _worker_file(shared, "w999998-1.m", {"lite": [3, 0, 9, 20.0], "pg": [1, 0, 1, 5.0]}, {"k1": [3, 0, 9]})
    before = live.read()
    metrics.retire_worker(999998)   # the master folds the exited worker's counters into retired.m
    assert not (shared / "w999998-1.m").exists()
    assert metrics._load(str(shared / "retired.m"))["c"]["usage_key"] == {"k1": [3, 0, 9]}
    after = live.read()
    for figures in (before, after):
        assert figures.key("k1") == {"queries": 6, "errors": 1, "rows": 19}
        assert figures.connection("lite") == {"queries": 6, "errors": 1, "rows": 19, "avg_duration_ms": 10.0}
        assert figures.connection("pg") == {"queries": 1, "errors": 0, "rows": 1, "avg_duration_ms": 5.0}
    live.metrics.close()


def test_a_recycled_workers_own_counts_survive_in_the_next_workers_reads(shared):
    """A worker publishes its counts, exits and is retired (same pid, as a reload's next worker may get): the next
    worker's reads still show them, added to its own."""
    first = Usage()
    first.record("lite", "k1", False, 0, 0.0)
    first.record("lite", "k1", True, 5, 8.0)
    first.metrics.close()                     # a graceful exit's last snapshot
    metrics.retire_worker(os.getpid())
    assert [n for n in os.listdir(shared) if n.startswith("w")] == []
    second = Usage()
    second.record("lite", None, True, 1, 1.0)   # an administrator's call: the connection's, no key's
    figures = second.read()
    assert figures.key("k1") == {"queries": 2, "errors": 1, "rows": 5}
    assert figures.connection("lite") == {"queries": 3, "errors": 1, "rows": 6, "avg_duration_ms": 3.0}
    second.metrics.close()


def test_usage_rides_in_the_metrics_snapshot_of_the_gateways_own_metrics():
    """One record place: the counts are in the metrics' snapshot (what a worker publishes), not beside it."""
    m = metrics.Metrics()
    usage = Usage(m)
    usage.record("lite", "k1", True, 2, 4.0)
    counters = m.snapshot()["c"]
    assert counters["usage_conn"] == {"lite": [1, 0, 2, 4.0]} and counters["usage_key"] == {"k1": [1, 0, 2]}
