"""`make demo`'s runner: the demo serves at once on the pure twins, the speedups compile meanwhile, then it restarts."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

from . import inplace, speedups

# Niceness of the background build: the demo, and whoever else shares the machine, go first.
BUILD_NICE = 10
# Where /proc can't tell whether the server has caught SIGTERM yet (not Linux): how long it gets to start
# before it is restarted. A restart during the first run's home preparation would leave a half-made home.
START_GRACE = 30.0
STOP_TIMEOUT = 60.0   # the server's graceful stop, then SIGKILL


def say(text: str) -> None:
    print(f"qag demo: {text}", file=sys.stderr, flush=True)


def catches_sigterm(pid: int, started_at: float) -> bool:
    """Whether the server is far enough along to be restarted: gunicorn's master installs its SIGTERM handler
    after `qag demo` has prepared the home (read from /proc/<pid>/status's SigCgt mask); without /proc, once it
    has run START_GRACE seconds."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            found = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", fh.read(), re.M)
    except OSError:
        found = None
    if found is None:
        return time.monotonic() - started_at >= START_GRACE
    return bool(int(found.group(1), 16) >> (signal.SIGTERM - 1) & 1)


def serve_while_building(command: list[str], build, compiled_now, *, ready=catches_sigterm, poll: float = 0.2,
                         stop_timeout: float = STOP_TIMEOUT) -> int:
    """Run `command` (the server) at once and `build` (start/poll/stop/report_failure) beside it; when the build
    has made modules current that were not (`compiled_now()`, a set), restart the server on them once it is
    ready for it. SIGINT and SIGTERM go to the server, end the build and give no restart. Returns the server's
    exit code."""
    before = compiled_now()
    # A restart must not wipe the home the first start made (`qag demo --reset`).
    again = [arg for arg in command if arg != "--reset"]
    server = subprocess.Popen(command)
    started_at = time.monotonic()
    build.start()
    stopping: list[int] = []

    def forward(signum, frame):
        stopping.append(signum)
        if server.poll() is None:
            server.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    building, restart = True, False
    try:
        while not stopping and server.poll() is None:
            if building and build.poll() is not None:
                building = False
                build_rc = build.poll()
                made = compiled_now() - before
                if build_rc:
                    build.report_failure(build_rc)
                if made:
                    restart = True
                else:
                    say("no compiled module was added; the demo goes on with the pure-Python twins")
            if restart and ready(server.pid, started_at):
                restart = False
                say(f"{len(made)} compiled modules ready; restarting the demo on them (about a second; "
                    f"the keys stay the same)")
                # A restart, not gunicorn's SIGHUP reload: workers forked from the old master would keep the pure
                # modules it imported (for `qag demo`, the whole request path, while it prepared the home).
                server.terminate()
                try:
                    server.wait(stop_timeout)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
                if stopping:
                    break
                server = subprocess.Popen(again)
                started_at = time.monotonic()
                continue
            time.sleep(poll)
    finally:
        build.stop()
        try:
            rc = server.wait()
        finally:   # forwarding stays on until the server is gone: a second Ctrl-C must reach it too
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    return rc


def main(command: list[str]) -> int:
    """Run the demo `command`; compile what is missing or stale, in the background unless QAG_SPEEDUPS=require."""
    if not command:
        raise SystemExit("python -m build_backend demo: give the command that serves the demo, e.g. .venv/bin/qag demo")
    build_mode = speedups.resolve_mode()
    serve_mode = os.environ.get("QAG_SPEEDUPS", "auto").strip().lower()
    wanted = set(speedups.module_sources(inplace.ROOT))
    stale = wanted - speedups.current_builds(inplace.ROOT)
    if build_mode == "off" or serve_mode == "off" or not stale:
        if stale and serve_mode != "off":
            say(f"{len(stale)} compiled modules are missing or stale and {speedups.ENV}=off: serving their "
                f"pure-Python twins")
        sys.stderr.flush()
        os.execvp(command[0], command)
    jobs = os.cpu_count() or 1
    log = os.path.relpath(os.path.join(inplace.ROOT, inplace.LOG))
    if serve_mode == "require":
        say(f"compiling {len(stale)} of {len(wanted)} modules first (QAG_SPEEDUPS=require), {jobs} at a time")
        rc = inplace.run(build_mode, jobs)
        if rc:
            return rc
        sys.stderr.flush()
        os.execvp(command[0], command)
    say(f"{len(stale)} of {len(wanted)} compiled modules are missing or stale: the demo starts now on their "
        f"pure-Python twins while they compile in the background ({jobs} at a time, at low priority; the tools' "
        f"output goes to {log}), then restarts on them")
    build = inplace.InplaceBuild(mode=build_mode, jobs=jobs, nice=BUILD_NICE)
    return serve_while_building(command, build, lambda: speedups.current_builds(inplace.ROOT))
