"""PostgreSQL's own CPU per call for the statement shapes a call could take, measured with pgbench (a probe).

    python -m benchmarks.pg_statements [--rounds 3] [--seconds 4] [--clients 4] [--db-cpu 1] [--load-cpu 0]

Each shape is a pgbench script of the pgbench case's lookup (`python -m benchmarks.oltp` loads it), run in
pipeline mode over the extended protocol (one write and one Sync per call: qag's read-only call since 02a9c41;
before it, qag's call had a second Sync before its DISCARD ALL). The server's processes are pinned to --db-cpu and
pgbench to --load-cpu; the figure is that core's busy time (user, nice, system, irq, softirq from /proc/stat)
per transaction, so it holds the server's work and the kernel's on its side of the socket, and nothing of the
client's. Shapes run in interleaved rounds; median [min–max] µs. Each shape adds (or, where it says so, replaces)
one piece of the one above it, so the differences are the pieces' costs: this is where a call's statements cost the database, which a gateway
can only shrink by sending less.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import tempfile

LOOKUP = "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid;"
SEED = "pg_catalog.setseed(:seed::float8 / 4503599627370496)"
NUMERIC_SEED = "pg_catalog.setseed(:seed63::int8 / 9223372036854775808.0)"
TIMEOUT = "pg_catalog.set_config('statement_timeout', '30000', true)"
READ_ONLY = "pg_catalog.set_config('transaction_read_only', 'on', true)"

# (name, statements in the pipeline): each is the one above it with one piece added, or one replaced where its
# name says "the same".
SHAPES = (
    ("the lookup alone", [LOOKUP]),
    ("+ BEGIN READ ONLY … ROLLBACK", ["BEGIN READ ONLY;", LOOKUP, "ROLLBACK;"]),
    ("+ DISCARD ALL (the reset)", ["BEGIN READ ONLY;", LOOKUP, "ROLLBACK;", "DISCARD ALL;"]),
    ("+ SELECT setseed(...)", ["BEGIN READ ONLY;", f"SELECT {SEED};", LOOKUP, "ROLLBACK;", "DISCARD ALL;"]),
    ("+ set_config(statement_timeout): qag's call",
     ["BEGIN READ ONLY;", f"SELECT {TIMEOUT}, {SEED};", LOOKUP, "ROLLBACK;", "DISCARD ALL;"]),
    ("the same, its seed divided as numeric (4c4ec80)",
     ["BEGIN READ ONLY;", f"SELECT {TIMEOUT}, {NUMERIC_SEED};", LOOKUP, "ROLLBACK;", "DISCARD ALL;"]),
    ("+ set_config(transaction_read_only): qag's call at 4c4ec80",
     ["BEGIN READ ONLY;", f"SELECT {READ_ONLY}, {TIMEOUT}, {NUMERIC_SEED};", LOOKUP, "ROLLBACK;", "DISCARD ALL;"]),
)


def script(statements: list[str]) -> str:
    return ("\\set aid random(1, 1000000)\n\\set seed random(0, 4503599627370495)\n"
            "\\set seed63 random(0, 9000000000000000000)\n\\startpipeline\n"
            + "\n".join(statements) + "\n\\endpipeline\n")


def busy_ticks(cpu: int) -> int:
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith(f"cpu{cpu} "):
                user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in line.split()[1:8])
                return user + nice + system + irq + softirq
    raise RuntimeError(f"no cpu{cpu} in /proc/stat")


def pin(cpus: str) -> None:
    """Every server process (the postmaster's children too: the running ones don't take a new affinity)."""
    pids = subprocess.run(["pgrep", "-x", "postgres"], capture_output=True, text=True).stdout.split()
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True, check=False)


def run_one(a, path: str) -> float:
    """µs of the database core per transaction for one script."""
    before = busy_ticks(a.db_cpu)
    out = subprocess.run(["taskset", "-c", str(a.load_cpu), "pgbench", "-n", "-h", a.host, "-p", str(a.port),
                          "-U", a.user, "-M", "extended", "-c", str(a.clients), "-j", "1", "-T", str(a.seconds),
                          "-f", path, a.database], capture_output=True, text=True)
    after = busy_ticks(a.db_cpu)
    found = re.search(r"number of transactions actually processed: (\d+)", out.stdout)
    if out.returncode or not found:      # a statement that fails aborts pgbench's client: exit code 2
        raise RuntimeError(f"pgbench failed:\n{out.stdout}\n{out.stderr}")
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    return (after - before) / ticks_per_second * 1e6 / int(found.group(1))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=int, default=4)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--db-cpu", type=int, default=1)
    p.add_argument("--load-cpu", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5432)
    p.add_argument("--user", default="postgres")
    p.add_argument("--database", default="qag_bench")
    a = p.parse_args(argv)
    results: dict[str, list[float]] = {name: [] for name, _ in SHAPES}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for i, (name, statements) in enumerate(SHAPES):
            paths[name] = os.path.join(tmp, f"shape{i}.sql")
            with open(paths[name], "w") as fh:
                fh.write(script(statements))
        pin(str(a.db_cpu))
        try:
            for r in range(a.rounds):
                order = SHAPES if r % 2 == 0 else SHAPES[::-1]
                for name, _ in order:
                    results[name].append(run_one(a, paths[name]))
        finally:
            pin(",".join(str(c) for c in range(os.cpu_count() or 1)))
    print(f"PostgreSQL CPU per call (core {a.db_cpu}), {a.clients} pgbench clients on core {a.load_cpu}, "
          f"{a.rounds} interleaved rounds × {a.seconds} s; median [min–max] µs\n")
    print("| shape | µs per call |\n|---|---|")
    for name, _ in SHAPES:
        v = results[name]
        print(f"| {name} | {statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}] |")


if __name__ == "__main__":
    main()
