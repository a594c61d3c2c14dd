"""observe/process: the instance's process figures read from /proc."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from qag.observe import process

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this platform")


def test_figures_of_this_process_match_what_the_kernel_says():
    before = process.figures([os.getpid()])
    spent = time.process_time()
    while time.process_time() - spent < 0.2:   # burn a little CPU so the counter must move
        pass
    after = process.figures([os.getpid()])
    assert after["cpu"] >= before["cpu"] + 0.1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert 10 * 2**20 < after["rss"] <= peak * 1.05
    assert after["fds"] == len(os.listdir("/proc/self/fd"))   # both counts include the listing's own descriptor
    assert time.time() - 24 * 3600 < after["start"] <= time.time()


def test_figures_sum_the_processes_and_skip_the_ones_gone():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        alone = process.figures([os.getpid()])
        both = process.figures([os.getpid(), child.pid, 999_999_999])
        assert both["rss"] > alone["rss"] and both["fds"] > alone["fds"]
        assert both["start"] == pytest.approx(alone["start"], abs=0.02)   # the first pid's start time
    finally:
        child.kill()
        child.wait()


def test_outside_gunicorn_the_instance_is_this_process():
    assert process.instance_pids(False) == [os.getpid()]
