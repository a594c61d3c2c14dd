"""/metrics on a real two-worker server: one series per fact, process figures of the whole instance, build info."""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.server import q

pytestmark = pytest.mark.e2e


def _families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def _value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} (\S+)$", text, re.M)
    assert m, f"{series} missing"
    return float(m.group(1))


def test_no_fact_is_exported_twice(server):
    server.get(q("customers"))
    families = _families(server.get("/metrics").body.decode())
    # The contract's queryapigate_* names are the series; a qag_* family may add facts, never repeat one.
    repeated = [name for name in families if name.startswith("qag_")
                and "queryapigate_" + name[len("qag_"):] in families]
    assert repeated == []
    assert "queryapigate_pool_idle_connections" in families


def test_process_figures_cover_the_master_and_every_worker(server):
    text = server.get("/metrics").body.decode()
    families = _families(text)
    assert families["process_cpu_seconds_total"] == "counter"
    master = server.proc.pid
    with open(f"/proc/{master}/task/{master}/children") as fh:
        workers = [int(p) for p in fh.read().split()]
    assert len(workers) == 2
    fds = sum(len(os.listdir(f"/proc/{pid}/fd")) for pid in [master] + workers)
    assert abs(_value(text, "process_open_fds") - fds) <= 6   # descriptors come and go between the two counts
    rss = sum(int(open(f"/proc/{pid}/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
              for pid in [master] + workers)
    assert 0.8 * rss <= _value(text, "process_resident_memory_bytes") <= 1.2 * rss
    started = _value(text, "process_start_time_seconds")
    assert abs(started - os.stat(f"/proc/{master}").st_mtime) < 120 and started <= time.time()
    cpu = _value(text, "process_cpu_seconds_total")
    assert cpu > 0


def test_build_info_names_version_speedups_and_worker_class(server):
    from qag import __version__
    text = server.get("/metrics").body.decode()
    m = re.search(r"^qag_build_info\{(.*)\} 1$", text, re.M)
    assert m, "qag_build_info missing"
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    assert labels == {"speedups": os.environ.get("QAG_SPEEDUPS", "auto"), "version": __version__,
                      "worker_class": os.environ.get("QAG_WORKER_CLASS", "qag")}
