"""`make demo`'s runner: the server starts at once, the build runs beside it, a restart moves it onto the build."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.request

import pytest

demo = pytest.importorskip("build_backend.demo", reason="the build helpers live in the source tree only")
from build_backend import inplace, speedups  # noqa: E402

# A stand-in server: records its starts, is killable by SIGTERM's default action for `delay` seconds (as a
# server still preparing is), then catches SIGTERM/SIGINT. The first start runs `life` seconds, later ones 0.5 s.
FAKE_SERVER = r"""
import os, signal, sys, time
log, delay, life = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
def note(what):
    with open(log, "a") as fh:
        fh.write(f"{what} {os.getpid()} {time.monotonic()} {' '.join(sys.argv[4:])}\n")
first = not os.path.exists(log)
note("start")
time.sleep(delay)
def stop(signum, frame):
    note(f"caught-{signum}")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
note("ready")
time.sleep(life if first else 0.5)
note("exit")
"""


class FakeBuild:
    """A build that ends `seconds` after it starts with `rc`, having made `adds` current."""

    def __init__(self, compiled: set, seconds: float, rc: int = 0, adds: tuple = ()):
        self.compiled, self.seconds, self.rc, self.adds = compiled, seconds, rc, adds
        self.started_at = self.ended_at = None
        self.stopped = self.reported = None

    def start(self):
        self.started_at = time.monotonic()

    def poll(self):
        if time.monotonic() - self.started_at < self.seconds:
            return None
        if self.ended_at is None:
            self.ended_at = time.monotonic()
            self.compiled.update(self.adds)
        return self.rc

    def stop(self):
        self.stopped = time.monotonic()

    def report_failure(self, rc):
        self.reported = rc


def _events(log):
    """[(what, pid, monotonic time, arguments)] from the stand-in server's log."""
    events = []
    with open(log) as fh:
        for line in fh.read().splitlines():
            what, pid, at, args = (line.split(" ", 3) + [""])[:4]
            events.append((what, int(pid), float(at), args.strip()))
    return events


def _run(tmp_path, build, compiled, delay=0.0, life=1.0, extra=()):
    log = str(tmp_path / "server.log")
    script = tmp_path / "server.py"
    script.write_text(FAKE_SERVER)
    command = [sys.executable, str(script), log, str(delay), str(life), *extra]
    rc = demo.serve_while_building(command, build, lambda: set(compiled), poll=0.05, stop_timeout=10)
    return rc, _events(log)


def test_the_server_starts_at_once_and_restarts_on_the_build_once_it_can_take_sigterm(tmp_path):
    compiled: set = set()
    build = FakeBuild(compiled, seconds=0.2, adds=("qag.app",))
    rc, events = _run(tmp_path, build, compiled, delay=1.5, life=30, extra=("demo", "--reset"))
    kinds = [what for what, *_ in events]
    assert kinds == ["start", "ready", f"caught-{int(signal.SIGTERM)}", "start", "ready", "exit"], events
    first_start, first_ready, caught = events[0][2], events[1][2], events[2][2]
    assert first_start < build.ended_at < first_ready   # served before the build was done
    assert caught >= first_ready                        # not killed mid-start: it caught the SIGTERM
    assert events[0][3] == "demo --reset" and events[3][3] == "demo"   # the restart keeps the home
    assert rc == 0


def test_a_build_that_adds_nothing_leaves_the_server_alone(tmp_path, capfd):
    compiled: set = {"qag.app"}
    build = FakeBuild(compiled, seconds=0.2, adds=("qag.app",))   # already current before: nothing new
    rc, events = _run(tmp_path, build, compiled)
    assert [what for what, *_ in events if what == "start"] == ["start"]
    assert "goes on with the pure-Python twins" in capfd.readouterr().err


def test_a_failed_build_is_reported_and_the_server_kept(tmp_path):
    compiled: set = set()
    build = FakeBuild(compiled, seconds=0.2, rc=1)
    rc, events = _run(tmp_path, build, compiled)
    assert build.reported == 1
    assert [what for what, *_ in events].count("start") == 1


def test_a_server_that_stops_stops_the_build(tmp_path, monkeypatch):
    compiled: set = set()
    build = FakeBuild(compiled, seconds=60, adds=("qag.app",))
    log = tmp_path / "server.log"
    log.write_text("")   # not a first start: the stand-in runs 0.5 s and ends by itself
    started = time.monotonic()
    rc, events = _run(tmp_path, build, compiled)
    assert rc == 0 and build.stopped is not None and build.stopped - started < 10
    assert [what for what, *_ in events] == ["start", "ready", "exit"]


def test_sigterm_to_the_runner_goes_to_the_server_and_cancels_the_restart(tmp_path):
    compiled: set = set()
    build = FakeBuild(compiled, seconds=0.2, adds=("qag.app",))
    before = signal.getsignal(signal.SIGTERM)
    # The build is done at 0.2 s, so a restart is due, but the server can't take one before 5 s; the runner's
    # SIGTERM comes at 1 s and is the server's end (still starting: SIGTERM's default action).
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        rc, events = _run(tmp_path, build, compiled, delay=5.0, life=30)
    finally:
        timer.cancel()
    assert [what for what, *_ in events] == ["start"]
    assert rc == -signal.SIGTERM and build.stopped is not None
    assert signal.getsignal(signal.SIGTERM) is before   # the runner gave the handlers back


# --- the real thing: `qag demo` served from a copy of the tree, some compiled modules missing at first ------------
# Request-path modules: the import hook decides between the copy's build and source. (A _speedups module whose
# build is missing would be found by the source tree's editable-install finder instead.)
HIDDEN = ("qag.api.run", "qag.sql.prepare", "qag.worker.wsgi")


def _children(pid: int) -> list[int]:
    found = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.split("/")[2]))
    return found


def _mapped(pid: int, root: str) -> set[str]:
    """The modules under `root` whose compiled build process `pid` has loaded."""
    suffix = sysconfig_suffix()
    with open(f"/proc/{pid}/maps") as fh:
        files = {line.split()[-1] for line in fh if line.rstrip().endswith(suffix)}
    return {os.path.relpath(f, root)[:-len(suffix)].replace(os.sep, ".") for f in files if f.startswith(root + os.sep)}


def sysconfig_suffix() -> str:
    import sysconfig
    return sysconfig.get_config_var("EXT_SUFFIX")


@pytest.mark.e2e
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads which builds a process loaded from /proc")
def test_qag_demo_restarted_by_the_runner_runs_the_compiled_modules(tmp_path, monkeypatch):
    if not set(HIDDEN) <= speedups.current_builds(inplace.ROOT):
        pytest.skip("this tree's compiled modules are not built (python -m build_backend inplace)")
    src = tmp_path / "src"
    shutil.copytree(os.path.join(inplace.ROOT, "qag"), src / "qag", ignore=shutil.ignore_patterns("__pycache__"))
    root = str(src)
    aside = tmp_path / "aside"
    aside.mkdir()
    for name in HIDDEN:   # as on a fresh clone: these builds do not exist yet
        built = os.path.join(root, *name.split(".")) + sysconfig_suffix()
        shutil.move(built, aside / os.path.basename(built))
    assert not set(HIDDEN) & speedups.current_builds(root)

    for name in [n for n in os.environ if n.startswith(("QAG_", "QUERYAPIGATE_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PYTHONPATH", root)
    monkeypatch.chdir(tmp_path)   # `python -m` puts the current directory first: not the source tree
    monkeypatch.setenv("QAG_WORKERS", "1")
    monkeypatch.setenv("QAG_ACCESS_LOG", "off")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/livez"
    served_pure = threading.Event()
    seen: dict = {}

    class Build:
        """Done once the demo has answered on the pure twins: then the hidden builds come back."""
        def start(self):
            pass

        def poll(self):
            if not served_pure.is_set():
                return None
            for name in HIDDEN:
                built = os.path.join(root, *name.split(".")) + sysconfig_suffix()
                if not os.path.exists(built):
                    shutil.move(aside / os.path.basename(built), built)
            return 0

        def stop(self):
            pass

        def report_failure(self, rc):
            seen["failure"] = rc

    def masters() -> list[int]:
        found = []
        for pid in _children(os.getpid()):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    if b"qag\x00demo" in fh.read():
                        found.append(pid)
            except OSError:   # gone meanwhile
                pass
        return found

    def answers() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def watch():
        try:
            deadline = time.monotonic() + 120
            while not answers() and time.monotonic() < deadline:
                time.sleep(0.2)
            first = masters()
            seen["first"] = {pid: _mapped(pid, root) for m in first for pid in _children(m)}
            served_pure.set()
            while time.monotonic() < deadline:
                now = masters()
                if now and now != first and answers():
                    workers = _children(now[0])
                    if workers:
                        time.sleep(1.0)   # the worker's gateway is built (its imports done) once it answers
                        seen["after"] = {pid: _mapped(pid, root) for pid in _children(now[0])}
                        break
                time.sleep(0.2)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)   # the runner forwards it: the demo stops

    watcher = threading.Thread(target=watch)
    watcher.start()
    command = [sys.executable, "-m", "qag", "demo", "--home", str(tmp_path / "home"), "--bind", f"127.0.0.1:{port}"]
    rc = demo.serve_while_building(command, Build(), lambda: speedups.current_builds(root), poll=0.1)
    watcher.join()
    assert "failure" not in seen and rc == 0
    assert seen.get("first") and all(not set(HIDDEN) & mods for mods in seen["first"].values()), seen
    assert seen.get("after"), "the demo was not restarted"
    for pid, mods in seen["after"].items():
        assert set(HIDDEN) <= mods, (pid, sorted(mods))
