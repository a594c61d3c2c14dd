"""What recording costs a call: python -m benchmarks.recording.

In-process (no HTTP server), like benchmarks.wsgi_call: builds the demo home, then times saved-query calls through
`Gateway.__call__` with recording on (metrics, run history + event log written by the background writer, request
and query log lines formatted by the log writer thread into /dev/null) and off (a no-op observer), in interleaved
rounds. Process CPU includes the background threads' work. Prints the median CPU per call and calls/s with
min–max. Then makes --disk-calls more calls with recording on and reports the store's growth per call (table and
indexes, after a WAL checkpoint). With --database-url the store is PostgreSQL (an empty database or schema) and the
growth is that of the run tables and their indexes (pg_relation_size, after VACUUM).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time

from benchmarks.wsgi_call import wsgi_get
from qag import _speedups, demo
from qag.app import create_app
from qag.observe.observer import Observer
from qag.testing import Client
from qag.settings import load

CALLS = {
    "customer (1 row, scoped key)": ("/q/customer", lambda i: f"id={i % 5000 + 1}", "scoped_key"),
    "orders_by_status (page of 100)": ("/q/orders_by_status", lambda i: f"status=paid&page_size=100&page={i % 20 + 1}",
                                       "admin_key"),
}


class _Off(Observer):
    """An observer that records nothing: the 'recording off' side. A subclass, as the gateway types its observer
    (a compiled Observer's methods dispatch to these overrides)."""

    def __init__(self) -> None:
        pass

    def request(self, *args) -> None:
        pass

    def begin(self) -> None:
        pass

    def done(self, *args) -> None:
        pass

    def failed(self, *args, **kw) -> None:
        pass

    def streamed(self, *args) -> None:
        pass


def parts_cost(app, call, spec, keys, rounds: int) -> None:
    """CPU of each part of recording on its own, per run or line (steadier than the difference of two loops)."""
    from qag.observe.events import BatchWriter
    on = app.observe
    path, make_query, key_name = spec
    # The run records the calls queue, kept from the writer thread by its flush lock (taken here, never waited
    # for by put) and taken off its queue before it can write them.
    writer = on.history.writer
    with writer._flush_lock:
        for i in range(2000):
            call(path, make_query(i), keys[key_name])
        captured = list(writer._queue)
        writer._queue.clear()
    lines = [("req", time.time(), "0123456789ab", "scoped", "GET", path, 200, 0.3, None) for _ in range(2000)]
    lines += [("exec", r[1], r[0], r[0].sql) for r in captured]
    sink = BatchWriter("bench", lambda batch, batch_id: None, capacity=10 ** 7, interval=3600)
    figures: dict[str, list[float]] = {"history write (per run)": [], "log lines (2 per call)": [],
                                       "metrics (per call)": [], "buffer puts (3 per call)": []}
    # The writer thread's batches are whatever arrived within its interval: sizes that vary from flush to flush
    # (a fixed size would keep reusing one prepared multi-row statement and hide the cost of a new one).
    sizes = random.Random(7).choices(range(1, 400), k=len(captured))
    batches, at = [], 0
    for size in sizes:
        if at >= len(captured):
            break
        batches.append(captured[at:at + size])
        at += size
    for _ in range(rounds):
        start = time.process_time()
        for batch in batches:
            on.history._write(batch, os.urandom(12).hex())
        figures["history write (per run)"].append((time.process_time() - start) / len(captured) * 1e6)
        start = time.process_time()
        on.logs._write(lines, os.urandom(12).hex())
        figures["log lines (2 per call)"].append((time.process_time() - start) / len(captured) * 1e6)
        start = time.process_time()
        for _ in range(20000):
            on.metrics.request("GET", "api.run_named_query", 200, "scoped", 0.0003)
            on.metrics.begin()
            on.metrics.run("shop", "sqlite", True, "scoped", 1, 0.0001, "json", 0.00001)
        figures["metrics (per call)"].append((time.process_time() - start) / 20000 * 1e6)
        start = time.process_time()
        for i in range(60000):
            sink.put(i)
        sink.flush()
        figures["buffer puts (3 per call)"].append((time.process_time() - start) / 20000 * 1e6)
    print("  parts, µs: " + "; ".join(f"{k} {statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]"
                                      for k, v in figures.items()))
    sink.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="demo home to use (default: a fresh temporary one)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and side")
    parser.add_argument("--disk-calls", type=int, default=100_000, help="calls for the bytes-per-call figure")
    parser.add_argument("--database-url", help="a PostgreSQL store (empty) instead of SQLite in the home")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="qag-bench-")
    store_env = {"QAG_DATABASE_URL": args.database_url} if args.database_url else {}
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home, **store_env})).manage)
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"], **store_env}))
    devnull = open(os.devnull, "w")
    app.observe.logs.install(devnull)
    on, off = app.observe, _Off()

    def use(observer) -> None:
        app.observe = observer
        app.run.observe = observer

    def call(path: str, query: str, key: str) -> None:
        wsgi_get(app, path, query, key)

    print(f"qag in-process cost of recording: median [min–max] of {args.rounds} interleaved rounds x {args.calls} "
          f"calls (home {home}; speedups {_speedups.choices()})")
    for label, (path, make_query, key_name) in CALLS.items():
        cpu: dict[str, list[float]] = {"off": [], "on": []}
        rate: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
                use(on if side == "on" else off)
                wall, start = time.perf_counter(), time.process_time()
                for i in range(args.calls):
                    call(path, make_query(i), keys[key_name])
                if side == "on":
                    on.history.writer.flush()  # the writer's work for this round counts in this round
                cpu[side].append((time.process_time() - start) / args.calls * 1e6)
                rate[side].append(args.calls / (time.perf_counter() - wall))
        cells = []
        for side in ("off", "on"):
            c, w = cpu[side], rate[side]
            cells.append(f"{side}: {statistics.median(c):.1f} µs [{min(c):.1f}–{max(c):.1f}], "
                         f"{statistics.median(w):.0f} calls/s [{min(w):.0f}–{max(w):.0f}]")
        extra = statistics.median(cpu["on"]) - statistics.median(cpu["off"])
        print(f"  {label:34} " + "   ".join(cells) + f"   (+{extra:.1f} µs per call)")

    parts_cost(app, call, CALLS["customer (1 row, scoped key)"], keys, args.rounds)
    use(on)
    store = os.path.join(home, "qag.db")
    path, make_query, key_name = CALLS["customer (1 row, scoped key)"]
    parts = ("runs", "runs_at", "runs_hist", "runs_hist_at", "names")

    if args.database_url:
        disk_pg(app, on, call, (path, make_query, key_name), keys, args.disk_calls, args.database_url)
        app.close()
        return

    def measure() -> tuple[int, int, dict[str, int]]:
        on.history.writer.flush()
        with sqlite3.connect(store, isolation_level=None) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            rows = db.execute("SELECT count(*) FROM runs").fetchone()[0]
            sizes = {n: db.execute("SELECT sum(pgsize) FROM dbstat WHERE name = ?", (n,)).fetchone()[0] or 0
                     for n in parts}
        return os.path.getsize(store), rows, sizes

    with sqlite3.connect(store, isolation_level=None) as db:
        db.execute("VACUUM")
    size0, rows0, parts0 = measure()
    for i in range(args.disk_calls):
        call(path, make_query(i), keys[key_name])
    size1, rows1, parts1 = measure()
    n = args.disk_calls
    print(f"store growth after {n} calls ({rows1 - rows0} runs stored): {(size1 - size0) / n:.1f} bytes per call "
          f"(file size); by part, bytes per call: "
          + ", ".join(f"{p} {(parts1[p] - parts0[p]) / n:.1f}" for p in parts))
    app.close()
    print(json.dumps({"python": os.sys.version.split()[0], "loaded": _speedups.choices()}))


def disk_pg(app, on, call, spec, keys, n: int, url: str) -> None:
    """Bytes per call of the run tables on PostgreSQL: heap and every index, after VACUUM, by relation."""
    import psycopg2
    path, make_query, key_name = spec
    parts = ("runs", "runs_pkey", "runs_at", "runs_hist", "runs_hist_at", "names", "names_pkey", "names_name_key")
    conn = psycopg2.connect(url)
    conn.autocommit = True

    def measure() -> tuple[int, dict[str, int]]:
        on.history.writer.flush()
        with conn.cursor() as cur:
            cur.execute("VACUUM runs")
            cur.execute("VACUUM names")
            cur.execute("SELECT count(*) FROM runs")
            rows = cur.fetchone()[0]
            sizes = {}
            for p in parts:
                cur.execute("SELECT pg_relation_size(to_regclass(%s))", (p,))
                sizes[p] = cur.fetchone()[0] or 0
        return rows, sizes

    rows0, parts0 = measure()
    for i in range(n):
        call(path, make_query(i), keys[key_name])
    rows1, parts1 = measure()
    total = sum(parts1.values()) - sum(parts0.values())
    print(f"PostgreSQL store growth after {n} calls ({rows1 - rows0} runs stored): {total / n:.1f} bytes per call "
          f"(run tables and indexes); by part: " + ", ".join(f"{p} {(parts1[p] - parts0[p]) / n:.1f}" for p in parts))
    conn.close()


if __name__ == "__main__":
    main()
