"""Metrics: exact counts from many threads without a lock, sums across worker snapshots and retired workers,
and the Prometheus text (names, HELP/TYPE, cumulative buckets, sorted series)."""

from __future__ import annotations

import os
import re
import threading

import pytest

from qag.observe import metrics
from qag.observe.metrics import Metrics, render


@pytest.fixture
def shared(tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "SHARED_DIR", str(tmp_path))
    return tmp_path


def _value(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in\n{text}")


def test_counts_from_many_threads_are_exact():
    m = Metrics()
    per_thread = 5000

    def work():
        for i in range(per_thread):
            m.request("GET", "api.run_named_query", 200, "admin", 0.003)
            m.begin()
            m.run("lite", "sqlite", i % 10 != 0, "admin", 2, 0.001, "json", 0.0001)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    text = render(m.instance(), {}).decode()
    total = 8 * per_thread
    assert _value(text, 'queryapigate_requests_total{method="GET",endpoint="api.run_named_query",status="200",'
                        'key="admin"}') == total
    assert _value(text, 'queryapigate_queries_total{connection="lite",dialect="sqlite",status="error",key="admin"}') \
        == total // 10
    assert _value(text, 'queryapigate_rows_returned_total{connection="lite",dialect="sqlite",key="admin"}') == 2 * total
    assert _value(text, 'queryapigate_request_duration_seconds_bucket{method="GET",endpoint="api.run_named_query",'
                        'le="0.005"}') == total
    assert _value(text, "queryapigate_active_queries") == 0


def test_histogram_buckets_are_cumulative_and_le_inclusive():
    m = Metrics()
    for seconds in (0.005, 0.007, 0.2, 100.0):
        m.request("POST", "api.execute_sql_endpoint", 200, "-", seconds)
    text = render(m.instance(), {}).decode()
    base = 'queryapigate_request_duration_seconds_bucket{method="POST",endpoint="api.execute_sql_endpoint",le='
    assert _value(text, base + '"0.005"}') == 1
    assert _value(text, base + '"0.01"}') == 2
    assert _value(text, base + '"0.25"}') == 3
    assert _value(text, base + '"60.0"}') == 3
    assert _value(text, base + '"+Inf"}') == 4
    assert _value(text, 'queryapigate_request_duration_seconds_count{method="POST",'
                        'endpoint="api.execute_sql_endpoint"}') == 4


def test_every_family_has_help_and_type_and_series_are_sorted():
    m = Metrics()
    for key in ("zed", "alice", "-"):
        m.request("GET", "api.health", 200, key, 0.001)
    m.request("BREW", "unmatched", 405, "-", 0.001)
    text = render(m.instance(), {"rowjson": "compiled"}).decode()
    names = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert {"queryapigate_requests_total", "queryapigate_history_runs_total", "queryapigate_pool_idle_connections",
            "qag_speedups_loaded", "queryapigate_active_queries"} <= names
    for name in names:
        assert f"# HELP {name} " in text
    keys = re.findall(r'endpoint="api.health",status="200",key="([^"]*)"', text)
    assert keys == sorted(keys) == ["-", "alice", "zed"]
    assert 'method="OTHER",endpoint="unmatched",status="405"' in text  # an unknown verb is no new label value
    assert 'qag_speedups_loaded{module="rowjson",twin="compiled"} 1' in text


def test_label_values_are_escaped():
    m = Metrics()
    m.begin()
    m.run('we"ird\\name\n', "sqlite", True, "k", 1, 0.01)
    text = render(m.instance(), {}).decode()
    assert 'connection="we\\"ird\\\\name\\n"' in text


def test_workers_are_summed_and_retired_counters_survive(shared):
    a = Metrics()
    a.request("GET", "api.run_named_query", 200, "admin", 0.01)  # this process, live
    other = {"c": {"req": {("GET", "api.run_named_query", 200, "admin"): [2, 0.02] + [0, 2] + [0] * 12},
                   "qry": {}, "ser": {}, "exp": {}},
             "g": {"active": 1, "workers": 1}}
    metrics._dump(str(shared / "w999999-1.m"), other)
    gone = {"c": {"req": {("GET", "api.run_named_query", 200, "admin"): [3, 0.03] + [0, 3] + [0] * 12},
                  "qry": {}, "ser": {}, "exp": {}},
            "g": {"active": 5, "workers": 1}}
    metrics._dump(str(shared / "w999998-1.m"), gone)
    metrics.retire_worker(999998)
    assert not (shared / "w999998-1.m").exists() and (shared / "retired.m").exists()
    text = render(a.instance(), {}).decode()
    line = 'queryapigate_requests_total{method="GET",endpoint="api.run_named_query",status="200",key="admin"}'
    assert _value(text, line) == 6
    assert _value(text, "queryapigate_active_queries") == 1  # a retired worker's gauges died with it
    assert _value(text, "qag_workers") == 2
    a.close()


def test_snapshot_is_written_atomically_to_the_shared_folder(shared):
    m = Metrics()
    m.request("GET", "api.health", 200, "-", 0.001)
    m.write_snapshot()
    names = os.listdir(shared)
    assert len(names) == 1 and names[0].startswith(f"w{os.getpid()}-") and names[0].endswith(".m")
    snap = metrics._load(str(shared / names[0]))
    assert snap["c"]["req"][("GET", "api.health", 200, "-")][0] == 1
    m.close()


def test_start_instance_removes_only_folders_of_masters_that_are_gone(tmp_path, monkeypatch):
    """A SIGKILLed master never runs on_exit: the next master on the host removes its folder, and nothing else."""
    import subprocess
    import sys
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"qag-metrics-{gone.pid}-abc"
    alive = tmp_path / f"qag-metrics-{os.getpid()}-def"
    unnamed = tmp_path / "qag-metrics-xyz"
    other = tmp_path / "not-ours-1"
    for folder in (dead, alive, unnamed, other):
        folder.mkdir()
        (folder / "w1.m").write_bytes(b"x")
    monkeypatch.setattr(metrics, "SHARED_DIR", None)
    made = metrics.start_instance(str(tmp_path))
    try:
        assert not dead.exists()
        assert alive.exists() and unnamed.exists() and other.exists()
        assert os.path.basename(made).startswith(f"qag-metrics-{os.getpid()}-")
    finally:
        metrics.stop_instance()
    assert not os.path.exists(made)


_LINE = 'queryapigate_requests_total{method="GET",endpoint="api.run_named_query",status="200",key="admin"}'


def _count(m: Metrics) -> float:
    return _value(render(m.instance(), {}).decode(), _LINE)


def test_scrapes_answered_by_different_workers_never_go_back(shared):
    """Two workers of one instance (two Metrics with their own files) answering scrapes in turn while both
    count: each answer is at least the one before, since each reads only what was published."""
    a, b = Metrics(), Metrics()
    seen = []
    for i in range(20):
        counting = a if i % 3 else b
        for _ in range(i + 1):
            counting.request("GET", "api.run_named_query", 200, "admin", 0.001)
        seen.append(_count(a if i % 2 else b))
    assert seen == sorted(seen) and seen[-1] == sum(range(1, 21))
    a.close()
    b.close()


def test_a_worker_retired_while_a_scrape_reads_is_counted_once(shared, monkeypatch):
    """The master folds a gone worker's file into retired.m and removes it between the scrape's reading of that
    file and of retired.m: the worker's counts are in the answer exactly once, before and after."""
    gone = {"c": {"req": {("GET", "api.run_named_query", 200, "admin"): [7, 0.07] + [0, 7] + [0] * 12}}, "g": {}}
    metrics._dump(str(shared / "w999997-5.m"), gone)
    reader = Metrics()
    reader.request("GET", "api.run_named_query", 200, "admin", 0.001)
    assert _count(reader) == 8
    real_load = metrics._load
    retiring = []

    def load_then_retire(path):
        value = real_load(path)
        if path.endswith("w999997-5.m") and not retiring:
            retiring.append(path)
            metrics.retire_worker(999997)   # after this file was read, before retired.m is
        return value
    monkeypatch.setattr(metrics, "_load", load_then_retire)
    assert _count(reader) == 8
    monkeypatch.setattr(metrics, "_load", real_load)
    assert not (shared / "w999997-5.m").exists() and _count(reader) == 8
    reader.close()


def test_a_later_worker_with_the_same_pid_keeps_its_own_counts(shared):
    """Pids are reused: a worker retired under pid P, then a new one under P, are two files, both counted."""
    old = {"c": {"req": {("GET", "api.run_named_query", 200, "admin"): [4, 0.04] + [0, 4] + [0] * 12}}, "g": {}}
    metrics._dump(str(shared / f"w{os.getpid()}-1.m"), old)
    metrics.retire_worker(os.getpid())
    m = Metrics()
    m.request("GET", "api.run_named_query", 200, "admin", 0.001)
    assert _count(m) == 5
    m.close()
