"""QAG_WORKER_SCHED under a real `qag serve`: every thread of every worker runs under the policy, the master
under the system's default."""

from __future__ import annotations

import os

import pytest

from tests.server import Server

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")]

NAMES = {getattr(os, "SCHED_BATCH", -1): "batch", os.SCHED_OTHER: "normal"}


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def policies(pid: int) -> set[str]:
    return {NAMES.get(os.sched_getscheduler(int(tid)), "other") for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.parametrize("value,policy", [(None, "batch"), ("normal", "normal")])
def test_every_worker_thread_runs_under_the_policy(value, policy):
    server = Server(env={} if value is None else {"QAG_WORKER_SCHED": value}, workers=2)
    try:
        for _ in range(20):                           # threads started on demand (gthread's) are made by now
            assert server.get("/health").status == 200
        workers = children(server.proc.pid)
        assert len(workers) == 2
        threads = {worker: len(os.listdir(f"/proc/{worker}/task")) for worker in workers}
        assert max(threads.values()) > 1, threads
        assert all(policies(worker) == {policy} for worker in workers)
        assert policies(server.proc.pid) == {"normal"}
    finally:
        server.close()
