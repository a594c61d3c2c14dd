"""Process figures for /metrics: CPU time, resident memory, open descriptors and start time of this instance's
processes (the gunicorn master and its workers), read from /proc at scrape time; nothing on the request path."""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def instance_pids(under_gunicorn: bool) -> list[int]:
    """The master and every worker when this process is a gunicorn worker; else this process alone."""
    if not under_gunicorn:
        return [os.getpid()]
    master = os.getppid()
    try:
        with open(f"/proc/{master}/task/{master}/children") as fh:
            return [master] + [int(p) for p in fh.read().split()]
    except OSError:
        return [os.getpid()]


def _boot_time() -> float:
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


def figures(pids: list[int]) -> dict | None:
    """{"cpu": seconds, "rss": bytes, "fds": count, "start": unix time of the first pid} summed over `pids`
    (a process that exited meanwhile is skipped); None where there is no /proc."""
    if not os.path.isdir("/proc/self"):
        return None
    cpu = 0.0
    rss = fds = 0
    start = None
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                # The command name (field 2) may hold spaces: count fields after its closing parenthesis.
                rest = fh.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/statm") as fh:
                pages = int(fh.read().split()[1])
            opened = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, IndexError, ValueError):
            continue
        cpu += (int(rest[11]) + int(rest[12])) / _TICKS       # utime + stime (fields 14 and 15)
        rss += pages * _PAGE
        fds += opened
        if start is None:
            start = _boot_time() + int(rest[19]) / _TICKS      # starttime (field 22), ticks after boot
    return {"cpu": cpu, "rss": rss, "fds": fds, "start": start or 0.0}
