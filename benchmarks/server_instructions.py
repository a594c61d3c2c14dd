"""Instructions a server worker spends per request, HTTP included: a real gunicorn worker under callgrind.

    python -m benchmarks.server_instructions --prefix qagw_ --warehouses 1 --no-load --query customer \\
        --target qag:QAG_WORKER_CLASS=gthread --target qag --requests 2000
    python -m benchmarks.server_instructions --case pgbench --no-load --query account --target qag

Each target (benchmarks.targets spec; one worker by default) is started under valgrind's callgrind with
instrumentation off. After a warm-up, instrumentation is switched on in the worker process, `--requests` GETs
of a saved query of the TPC-C case (MySQL) or the pgbench case (PostgreSQL; users spread over the key space, `--connections` keep-alive connections, every reply
checked for 200) are sent over real sockets, instrumentation goes off and the worker's instructions — all its
threads: the HTTP handling, the gateway, the driver and the background writers — are divided by the requests.

Unlike CPU time on a shared virtual machine, which moved by up to 2× within the hour here, the count repeats
to within about 1% from run to run, so it compares two worker classes or two builds of qag directly; the ratio
of two targets' counts is the ratio of their calls/s where the gateway's CPU is the bottleneck. System calls are
counted on the user side only (the kernel's work is not in it), and a worker under valgrind runs one thread at a
time, so lock hand-offs between threads cost less here than on real cores.
"""

from __future__ import annotations

import argparse
import glob
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from . import oltp, targets, tpcc_mysql
from .workload import fill


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.server_instructions",
                                description=__doc__.splitlines()[0])
    p.add_argument("--target", action="append", help="target spec (repeatable; default qag on gthread, then qag)")
    p.add_argument("--case", choices=("tpcc", "pgbench"), default="tpcc",
                   help="tpcc: the TPC-C case on MySQL (default); pgbench: the pgbench case on PostgreSQL")
    p.add_argument("--query", help="the case's saved query to call (default customer, or account for pgbench)")
    p.add_argument("--requests", type=int, default=2000, help="counted requests per target (default 2000)")
    p.add_argument("--warmup", type=int, default=300, help="requests before counting (default 300)")
    p.add_argument("--connections", type=int, default=4, help="keep-alive client connections (default 4)")
    p.add_argument("--no-load", action="store_true", help="do not (re)load the case's data")
    p.add_argument("--keep", metavar="DIR", help="keep each target's callgrind profile there (for callgrind_annotate)")
    tpcc_mysql.add_arguments(p)
    oltp.add_arguments(p)
    return p


def _paths(case, query: str, count: int) -> list[str]:
    chosen = [q for q in case.queries if q.name == query]
    if not chosen:
        raise SystemExit(f"--query: one of {[q.name for q in case.queries]}")
    template = chosen[0].path_template(case.space)
    return [fill(template, case.space.values(u * 7919 % case.space.size)) for u in range(count)]


def _drive(port: int, paths: list[str], key: str, connections: int) -> None:
    """GET every path once over `connections` keep-alive connections; each reply must be a 200."""
    failures: list[str] = []

    def caller(mine: list[str]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        try:
            for path in mine:
                conn.request("GET", path, headers={"X-API-Key": key} if key else {})
                reply = conn.getresponse()
                reply.read()
                if reply.status != 200:
                    failures.append(f"{path}: {reply.status}")
        except OSError as exc:
            failures.append(str(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=caller, args=(paths[i::connections],)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise RuntimeError(f"{len(failures)} failed requests, first: {failures[0]}")


def _worker_pid(master: int) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
        if found:
            return int(found[0])
        time.sleep(0.2)
    raise RuntimeError("the target's worker process did not start")


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


def count(spec: str, case, paths: list[str], warmup: int, connections: int, keep: str | None = None) -> int:
    """Instructions per request of `spec`'s one worker process (all its threads); its profile copied into the
    folder `keep` when given."""
    if ":" not in spec:
        spec += ":workers=1"
    elif "workers=" not in spec:
        spec += ",workers=1"
    out_dir = tempfile.mkdtemp(prefix="qag-server-cg-")
    wrap = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--trace-children=yes",
            f"--callgrind-out-file={out_dir}/cg.%p"]
    target = targets.start(spec, wrap=wrap, boot_seconds=600)
    try:
        key = target.provision(case).get("plain") or ""
        worker = _worker_pid(target.pid)
        _drive(target.port, paths[:warmup], key, connections)
        _control("-z", str(worker))
        _control("-i", "on", str(worker))
        _drive(target.port, paths[warmup:], key, connections)
        _control("-i", "off", str(worker))
        _control("-d", str(worker))
        dumps = sorted(glob.glob(f"{out_dir}/cg.{worker}.*"), key=lambda path: int(path.rsplit(".", 1)[1]))
        with open(dumps[-1]) as fh:   # the dump just asked for: cg.<pid>.<n>
            total = next(int(line.split()[1]) for line in fh if line.startswith("totals:"))
        if keep:
            os.makedirs(keep, exist_ok=True)
            shutil.copyfile(dumps[-1], os.path.join(keep, "callgrind." + "".join(c if c.isalnum() else "_" for c in spec)))
        return total // (len(paths) - warmup)
    finally:
        target.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    module = oltp if args.case == "pgbench" else tpcc_mysql
    args.query = args.query or ("account" if args.case == "pgbench" else "customer")
    if not args.no_load:
        print(f"loading {args.case} data: {module.load(args)}", file=sys.stderr)
    case = module.case(args)
    paths = _paths(case, args.query, args.warmup + args.requests)
    specs = args.target or ["qag:QAG_WORKER_CLASS=gthread", "qag"]
    counts = {spec: count(spec, case, paths, args.warmup, args.connections, args.keep) for spec in specs}
    first = counts[specs[0]]
    print(f"worker instructions per request (one worker, all its threads; {args.requests} GETs of "
          f"/q/{args.query} over {args.connections} keep-alive connections):")
    for spec, n in counts.items():
        print(f"  {spec:40} {n:9,d}   {first / n:.2f}× fewer than {specs[0]}" if spec != specs[0]
              else f"  {spec:40} {n:9,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
