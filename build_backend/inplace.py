"""An in-place build of the speedups in a child process: its own lines on the terminal, the tools' output in a log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from . import speedups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOG = os.path.join("build", "speedups.log")
TAIL_LINES = 30


class InplaceBuild:
    """`setup.py build_ext --inplace` under `root`: the build's progress lines (speedups.say) go to this process's
    stderr, everything Cython, setuptools and the compiler print goes to `root`/build/speedups.log, which a
    failure shows the end of. The child leads a process group of its own, so stop() ends the compilers too."""

    def __init__(self, root: str = ROOT, mode: str = "auto", jobs: int | None = None, nice: int = 0):
        self.root, self.mode, self.jobs, self.nice = root, mode, jobs, nice
        self.log_path = os.path.join(root, LOG)
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        os.makedirs(os.path.dirname(self.log_path), exist_ok=True)
        command = [sys.executable, "setup.py", "build_ext", "--inplace"]
        if self.jobs:
            command += ["-j", str(self.jobs)]
        messages = os.dup(sys.stderr.fileno())
        env = dict(os.environ, **{speedups.ENV: self.mode, speedups.MESSAGES_FD: str(messages)})
        nice = self.nice
        try:
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(
                    command, cwd=self.root, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(messages,), start_new_session=True,
                    preexec_fn=(lambda: os.nice(nice)) if nice else None)
        finally:
            os.close(messages)

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self) -> int:
        return self.proc.wait()

    def stop(self) -> None:
        """End the build and its compilers (SIGTERM to its group, SIGKILL 10 s later)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(grace)
                return
            except subprocess.TimeoutExpired:
                continue

    def tail(self) -> str:
        """The end of the log: what a failed build said last."""
        try:
            with open(self.log_path, encoding="utf-8", errors="replace") as fh:
                lines = fh.readlines()
        except OSError:
            return ""
        return "".join(lines[-TAIL_LINES:])

    def report_failure(self, rc: int) -> None:
        speedups.say(f"{self.tail()}qag build: failed (exit {rc}); above, the end of its output; all of it in "
                     f"{os.path.relpath(self.log_path)}")


def run(mode: str, jobs: int | None = None) -> int:
    """Build in the foreground; the build's exit code (130 when interrupted)."""
    build = InplaceBuild(mode=mode, jobs=jobs)

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    build.start()
    try:
        rc = build.wait()
    except KeyboardInterrupt:   # the build has a process group of its own: the terminal's Ctrl-C missed it
        build.stop()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if rc:
        build.report_failure(rc)
    else:
        speedups.say(f"qag build: done; the tools' output is in {os.path.relpath(build.log_path)}")
    return rc
