"""qag's gunicorn hooks: what a worker sets up once its gateway is built."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CODE = """
import gc, json
import qag.gunicorn_conf as conf

class Worker:   # a worker without a gateway (post_worker_init must not need one)
    wsgi = None

before = gc.get_threshold()
conf.post_worker_init(Worker())
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "enabled": gc.isenabled()}))
"""


def test_a_worker_freezes_start_up_objects_and_collects_young_ones_less_often(tmp_path):
    # A fresh interpreter: the hook changes the collector of the whole process.
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env={"QAG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    seen = json.loads(out.stdout)
    assert seen["before"] == [700, 10, 10]
    assert seen["after"] == [10_000, 20, 20]
    assert seen["frozen"] > 1000 and seen["enabled"]


SCHED = """
import json, os, threading
import qag.gunicorn_conf as conf

conf.post_fork(None, None)
seen = {}
thread = threading.Thread(target=lambda: seen.update(policy=os.sched_getscheduler(threading.get_native_id())))
thread.start()
thread.join()
names = {os.SCHED_BATCH: "batch", os.SCHED_OTHER: "normal"}
print(json.dumps([names.get(os.sched_getscheduler(0)), names.get(seen["policy"])]))
"""


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
@pytest.mark.parametrize("value,policy", [(None, "batch"), ("batch", "batch"), ("normal", "normal")])
def test_a_forked_worker_and_the_threads_it_starts_run_under_qag_worker_sched(tmp_path, value, policy):
    env = {"QAG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    if value is not None:
        env["QAG_WORKER_SCHED"] = value
    out = subprocess.run([sys.executable, "-c", SCHED], capture_output=True, text=True, check=True, cwd=tmp_path,
                         env=env)
    assert json.loads(out.stdout) == [policy, policy]
