"""CPU per PostgresBackend.run call, in-process, for whichever qag the running Python imports (a probe).

    python -m benchmarks.pg_backend --calls 3000 [--query account,accounts_page,deposit]

Run it with each build's own Python (e.g. the harness's venvs for `qag@<ref>` targets under $QAG_BENCH_VENVS),
from a copy of benchmarks/ outside the checkout so that each imports its own qag, to compare two builds' backend
layer: one JSON line per query with the request thread's CPU per call (thread_time:
the database and other threads are not in it), wall time and voluntary context switches per call (a second one
means the caller waited twice). Needs the pgbench case loaded (`python -m benchmarks.oltp`). Run it under
`valgrind --tool=callgrind` with --calls 1 and --calls 2001 for an instruction count that a noisy machine
doesn't move.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import sys
import time
import types

STATEMENTS = {   # as the gateway renders the pgbench case's queries (benchmarks/oltp.py), page window included
    "account": ("SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = {p} LIMIT 101", True),
    "accounts_page": ("SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid >= {p} ORDER BY aid "
                      "LIMIT 101", True),
    "deposit": ("UPDATE pgbench_accounts SET abalance = abalance + 0 WHERE aid = {p} RETURNING aid, abalance", False),
}


def main(argv: list[str] | None = None) -> int:
    import qag
    from qag.backends import postgres
    from qag.backends.base import Call

    from . import oltp

    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_backend", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--query", default="account,accounts_page,deposit")
    oltp.add_arguments(parser)
    args = parser.parse_args(argv)
    settings = types.SimpleNamespace(pool_size=8, pool_idle_timeout=300.0, pool_max=16, pool_wait=5.0,
                                     query_timeout=30.0)
    backend = postgres.PostgresBackend(settings)
    fields = {"host": args.pg_host, "port": args.pg_port, "user": oltp.RO_USER, "password": oltp.PASSWORD,
              "database": args.pg_database}
    marker = "$1" if backend.style == "numeric" else "%s"
    rng = random.Random(8)
    for name in args.query.split(","):
        template, read_only = STATEMENTS[name]
        sql = template.format(p=marker)
        for _ in range(args.warmup):
            backend.run(fields, Call(sql, (rng.randint(1, 999_000),), read_only, 30.0, 101))
        usage, cpu, wall = resource.getrusage(resource.RUSAGE_THREAD), time.thread_time(), time.perf_counter()
        for _ in range(args.calls):
            assert backend.run(fields, Call(sql, (rng.randint(1, 999_000),), read_only, 30.0, 101)).rows
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        switches = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - usage.ru_nvcsw
        print(json.dumps({"qag": qag.__file__, "query": name, "cpu_us": round(cpu / args.calls * 1e6, 1),
                          "wall_us": round(wall / args.calls * 1e6, 1),
                          "switches": round(switches / args.calls, 2)}), flush=True)
    backend.close_idle()
    return 0


if __name__ == "__main__":
    sys.exit(main())
