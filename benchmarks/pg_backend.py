"""CPU per PostgresBackend.run call, in-process, for whichever qag the running Python imports (a probe).

    python -m benchmarks.pg_backend --calls 3000 [--query account,accounts_page,deposit] [--threads 8]

Run it with each build's own Python (e.g. the harness's venvs for `qag@<ref>` targets under $QAG_BENCH_VENVS),
from a copy of benchmarks/ outside the checkout so that each imports its own qag, to compare two builds' backend
layer: one JSON line per query with the request thread's CPU per call (thread_time:
the database and other threads are not in it), wall time and voluntary context switches per call (a second one
means the caller waited twice). With --threads N, N threads share the calls (each its own pooled connection, as a
worker's threads do) and the line gives the process's CPU per call instead (user + system of every thread, so the
cost of threads handing the interpreter lock to each other is in it) and its voluntary switches per call. Needs
the pgbench case loaded (`python -m benchmarks.oltp`). Run it under
`valgrind --tool=callgrind` with --calls 1 and --calls 2001 for an instruction count that a noisy machine
doesn't move. After the warm-up the collector is set as a gunicorn worker sets it (qag/gunicorn_conf.py: what
start-up made frozen, young objects collected every 10,000 allocations), so the drivers' import-time objects
are not walked again and again as they are not in a worker; --default-gc keeps Python's default.

With --overlap K, one thread keeps K calls in flight instead, each on its own pooled connection: it takes a
connection and sends a call's pipeline as run() does (`_take`, `send_call`), and reads a call's results
(`Pipe.outcome`, the rows, `_give_back`) once epoll says its socket is readable, then sends the next call there.
The same steps and statements as --threads K without a thread per wait: the two lines' process CPU per call
differ by what a worker's thread-per-call waits cost (switches, the interpreter lock changing hands, each thread's
own wait) — a measure for the design where one thread serves several calls' database waits (docs/performance.md).
Compare them where the callers' core is the limit, as in a loaded worker: pinned to one core with the database on
the other, and --work-us (CPU spent after each call, holding the lock, as the rest of a request does) large enough
that the database keeps up; otherwise both modes wait on it and switch once a call alike. --overlap runs
read-only queries only (a write's reset is read when its connection is next taken, which it doesn't model) and
needs a qag whose PostgreSQL backend has the module function `send_call` (2026-12-06 on).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import select
import sys
import threading
import time

STATEMENTS = {   # as the gateway renders the pgbench case's queries (benchmarks/oltp.py), page window included
    "account": ("SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = {p} LIMIT 101", True),
    "accounts_page": ("SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid >= {p} ORDER BY aid "
                      "LIMIT 101", True),
    "deposit": ("UPDATE pgbench_accounts SET abalance = abalance + 0 WHERE aid = {p} RETURNING aid, abalance", False),
}


def busy(us: float) -> None:
    """--work-us: CPU the rest of a request would spend around its call (HTTP, the gateway), holding the lock."""
    if us:
        end = time.perf_counter() + us / 1e6
        while time.perf_counter() < end:
            pass


def threaded(backend, call, fields: dict, sql: str, read_only: bool, args) -> dict:
    """--threads: the calls split between that many threads started together; process CPU and switches per call
    (`call` is the Call class of the qag under test)."""
    each = max(1, args.calls // args.threads)
    start = threading.Barrier(args.threads + 1)

    def caller(seed: int) -> None:
        rng = random.Random(seed)
        start.wait()
        for _ in range(each):
            assert backend.run(fields, call(sql, (rng.randint(1, 999_000),), read_only, 30.0, 101)).rows
            busy(args.work_us)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    start.wait()    # measured from here: every caller is started and waiting at the barrier
    usage, cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for t in threads:
        t.join()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    calls = each * args.threads
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - usage.ru_nvcsw
    return {"process_cpu_us": round(cpu / calls * 1e6, 1), "wall_us": round(wall / calls * 1e6, 1),
            "switches": round(switches / calls, 2)}


def overlapped(backend, postgres, call, fields: dict, sql: str, read_only: bool, args) -> dict:
    """--overlap: one thread, `args.overlap` calls in flight on as many pooled connections, each call's reply read
    when its socket turns readable; process CPU and switches per call (`postgres`, `call`: the qag under test's
    backend module and Call class)."""
    key = postgres.pool_key(fields, read_only)
    reset = backend.pool.idle_limit > 0
    rng = random.Random(8)
    poller = select.epoll()
    watched: set[int] = set()
    flying: dict[int, tuple] = {}    # socket -> (connection, the call's place of its rows in the segment)
    total = args.calls
    started = finished = 0

    def send() -> None:
        nonlocal started
        made = call(sql, (rng.randint(1, 999_000),), read_only, 30.0, 101)
        link, _ = backend._take(key, fields, read_only, None, "")
        statements = [sql]
        inline = backend._inline_reset(link, made, statements, reset)
        want = postgres.send_call(link, made, statements, reset, None, inline)
        # The pipe sends what is queued when it next waits (run()'s one release of the lock); here nothing waits
        # on it, so readable() sends it now (and looks at the socket once more than an event loop would need).
        link.pipe.readable()
        fd = link.pg.socket
        if fd not in watched:
            poller.register(fd, select.EPOLLIN)
            watched.add(fd)
        flying[fd] = (link, want)
        started += 1

    usage, cpu, wall = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    for _ in range(min(args.overlap, total)):
        send()
    while finished < total:
        for fd, _ in poller.poll():
            if fd not in flying:
                continue
            link, want = flying.pop(fd)
            result, _names, error = link.pipe.outcome(None, want)
            assert error is None and result is not None and result.ntuples
            assert link.pipe.rows(result, link.tx, 0, result.ntuples)
            backend._give_back(key, link)
            busy(args.work_us)
            finished += 1
            if started < total:
                send()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - usage.ru_nvcsw
    poller.close()
    return {"process_cpu_us": round(cpu / total * 1e6, 1), "wall_us": round(wall / total * 1e6, 1),
            "switches": round(switches / total, 2)}


def main(argv: list[str] | None = None) -> int:
    import qag
    from qag import settings as qag_settings
    from qag.backends import postgres
    from qag.backends.base import Call

    from . import oltp

    parser = argparse.ArgumentParser(prog="python -m benchmarks.pg_backend", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--query", default="account,accounts_page,deposit")
    parser.add_argument("--threads", type=int, default=1, help="callers at once (default 1: the thread's own CPU)")
    parser.add_argument("--overlap", type=int, default=0,
                        help="one thread with this many calls in flight (read-only queries; see above)")
    parser.add_argument("--work-us", type=float, default=0.0,
                        help="with --threads or --overlap, CPU spent after each call as the rest of a request "
                             "would (so the caller's core, not the database, is the limit)")
    parser.add_argument("--default-gc", action="store_true",
                        help="keep Python's collector settings instead of a gunicorn worker's")
    oltp.add_arguments(parser)
    args = parser.parse_args(argv)
    # qag's own settings (its defaults, pool sized for the threads): a stand-in object fell behind the backend's
    # needs before (QAG_SPIN_US).
    settings = qag_settings.load({"QAG_POOL_SIZE": "16", "QAG_POOL_MAX": "32", "QAG_QUERY_TIMEOUT": "30"})
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
        if not args.default_gc:     # as qag/gunicorn_conf.py's post_worker_init does
            gc.collect()
            gc.freeze()
            gc.set_threshold(10_000, 20, 20)
        if args.overlap:
            if not read_only:
                continue        # a write's reset is read when its connection is next taken: not modelled here
            print(json.dumps({"qag": qag.__file__, "query": name, "overlap": args.overlap,
                              **overlapped(backend, postgres, Call, fields, sql, read_only, args)}), flush=True)
            continue
        if args.threads > 1:
            print(json.dumps({"qag": qag.__file__, "query": name, "threads": args.threads,
                              **threaded(backend, Call, fields, sql, read_only, args)}), flush=True)
            continue
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
