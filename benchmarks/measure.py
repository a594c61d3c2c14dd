"""What a block records beside throughput: CPU of process trees from /proc, the databases' statement counters,
a /health latency floor, and the machine and versions the run was on."""

from __future__ import annotations

import http.client
import os
import platform
import statistics
import subprocess
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, int, float] | None:
    """(ppid, comm-less fields...) → (ppid, own ticks, reaped children's ticks) of one process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    rest = data[data.rindex(")") + 2:].split()
    # fields after comm: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    return int(rest[1]), int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14])


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def tree_cpu(root: int) -> float:
    """CPU seconds of a process, its live descendants, and every descendant already reaped (cutime)."""
    parents: dict[int, int] = {}
    stats: dict[int, tuple[int, int, float]] = {}
    for pid in _all_pids():
        st = _stat(pid)
        if st:
            parents[pid] = st[0]
            stats[pid] = st
    members = {root}
    changed = True
    while changed:
        changed = False
        for pid, ppid in parents.items():
            if ppid in members and pid not in members:
                members.add(pid)
                changed = True
    ticks = sum(stats[p][1] + stats[p][2] for p in members if p in stats)
    return ticks / _TICK


def pids_named(*names: str) -> list[int]:
    """Top-level processes whose comm is one of `names` (their children are counted by tree_cpu)."""
    found = [p for p in _all_pids() if _comm(p) in names]
    parents = {p: (_stat(p) or (0,))[0] for p in found}
    return [p for p in found if parents[p] not in found]


class CpuMeter:
    """Sums tree_cpu over a set of roots, found again at every read (a restarted database keeps counting)."""

    def __init__(self, roots):
        self.roots = roots   # callable returning pids

    def read(self) -> float:
        return sum(tree_cpu(p) for p in self.roots())


DB_PROCESSES = {"mysql": ("mariadbd", "mysqld"), "postgres": ("postgres",), "sqlite": ()}


def db_meter(db: str) -> CpuMeter:
    names = DB_PROCESSES.get(db, ())
    return CpuMeter(lambda: pids_named(*names) if names else [])


# --- statements per call -----------------------------------------------------------------------------------
class MysqlCounter:
    """The server's `Questions` (statements sent by clients), read over a root connection."""

    def __init__(self, host: str, port: int, user: str, password: str):
        import MySQLdb
        self.conn = MySQLdb.connect(host=host, port=port, user=user, passwd=password)
        self.conn.autocommit(True)

    def read(self) -> dict:
        cur = self.conn.cursor()
        cur.execute("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Com_select', 'Com_rollback', "
                    "'Com_set_option', 'Com_commit', 'Com_begin', 'Connections')")
        values = {k.lower(): int(v) for k, v in cur.fetchall()}
        values["questions"] -= 1   # this SHOW itself
        return values


class PostgresCounter:
    """pg_stat_database transactions of the benchmark database, and pg_stat_statements calls when installed."""

    def __init__(self, host: str, port: int, user: str, password: str, database: str):
        import psycopg2
        self.database = database
        self.conn = psycopg2.connect(host=host, port=port, user=user, password=password or None, dbname=database)
        self.conn.autocommit = True
        cur = self.conn.cursor()
        try:
            cur.execute("SELECT 1 FROM pg_stat_statements LIMIT 1")
            self.statements = True
        except Exception:
            self.statements = False

    def read(self) -> dict:
        cur = self.conn.cursor()
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute("SELECT xact_commit + xact_rollback, xact_commit, xact_rollback FROM pg_stat_database "
                    "WHERE datname = %s", (self.database,))
        xacts, commits, rollbacks = cur.fetchone()
        out = {"xacts": int(xacts) - 2, "xact_commit": int(commits), "xact_rollback": int(rollbacks)}
        if self.statements:
            cur.execute("SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d "
                        "ON d.oid = s.dbid WHERE d.datname = %s", (self.database,))
            out["statements"] = int(cur.fetchone()[0])
        return out


def counter_delta(before: dict | None, after: dict | None) -> dict:
    if not before or not after:
        return {}
    return {k: after[k] - before[k] for k in after if k in before}


# --- /health floor -----------------------------------------------------------------------------------------
def health_floor(host: str, port: int, calls: int = 200) -> float | None:
    """Median µs of sequential GET /health on one keep-alive connection: the machine's speed, not the query's."""
    if not port:
        return None
    conn = http.client.HTTPConnection(host, port, timeout=10)
    times = []
    try:
        for _ in range(calls):
            t0 = time.perf_counter()
            conn.request("GET", "/health")
            r = conn.getresponse()
            r.read()
            times.append((time.perf_counter() - t0) * 1e6)
            if r.status != 200:
                return None
    except OSError:
        return None
    finally:
        conn.close()
    return round(statistics.median(times), 1)


# --- the machine -------------------------------------------------------------------------------------------
def _cmd(args: list[str]) -> str:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def machine() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    governor = ""
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as fh:
            governor = fh.read().strip()
    except OSError:
        pass
    return {"host": platform.node(), "kernel": platform.release(), "cpu": cpu, "cores": os.cpu_count(),
            "governor": governor, "python": platform.python_version(),
            "wrk": _cmd(["wrk", "--version"]).splitlines()[0] if _cmd(["wrk", "--version"]) else "",
            "mysql": _cmd(["mysql", "-h127.0.0.1", "-uroot", "-NBe", "SELECT version()"]),
            "postgres": _cmd(["psql", "-h", "127.0.0.1", "-U", "postgres", "-XAtc", "SHOW server_version"])}


def loadavg() -> float:
    return os.getloadavg()[0]
