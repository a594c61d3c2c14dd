"""qag's gunicorn hooks: what a worker sets up once its gateway is built."""

from __future__ import annotations

import json
import subprocess
import sys

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
