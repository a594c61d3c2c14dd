"""Threads overlapping database waits: T threads calling a backend's run() through a relay that delays replies.

    python -m benchmarks.threads_overlap --db mysql --user root --database mysql
    python -m benchmarks.threads_overlap --db mysql --delay-ms 10 --threads 1,2,4,8,16 --seconds 3

Every caller makes back-to-back paged reads (--sql) through the backend's run(), the way a gateway worker
thread does, so each call waits about one relay delay on the database. If the interpreter lock were held during
those waits, calls/s would stay flat as T grows; released, it grows with T until the CPU or the server limits
it. First, a single-caller calibration: the median latency of a read, a write (--write-sql) and a direct driver
call at delay 0 and at --delay-ms, the waits per call that the difference shows, and the relay's request turns
per call. Everything is printed, nothing asserted. The relay runs in a child process, so its own threads do not
compete with the callers for the interpreter lock.

Adding a database: write a `_<db>(args, host, port, pool_size)` setup like `_mysql` below and list it in SETUPS.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import threading
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from qag.backends.base import Call  # noqa: E402
from qag.sql.prepare import prepare, render  # noqa: E402


class Setup(SimpleNamespace):
    """What the benchmark needs of one database type.

    backend: a Backend; fields: its connection fields (pointing at the relay); direct(): (call(sql), close) for
    a plain driver connection through the relay, autocommit, one statement per call.
    """


def _settings(pool_size: int):
    """A backend's settings as a server would have them by default, with this pool size."""
    from qag.settings import load
    return load({"QAG_POOL_SIZE": str(pool_size)})


def _mysql(args, host: str, port: int, pool_size: int) -> Setup:
    import MySQLdb

    from qag.backends.mysql import MysqlBackend

    fields = {"host": host, "port": port, "user": args.user, "password": args.password, "database": args.database}

    def direct():
        conn = MySQLdb.connect(host=host, port=port, user=args.user, password=args.password,
                               database=args.database or "", autocommit=True)
        cursor = conn.cursor()

        def call(sql: str) -> None:
            cursor.execute(sql)
            cursor.fetchall()

        return call, conn.close

    return Setup(backend=MysqlBackend(_settings(pool_size)), fields=fields, direct=direct,
                 read_sql="SELECT 1", write_sql="DO 0")


SETUPS = {"mysql": _mysql}
DEFAULTS = {"mysql": {"port": 3306, "user": "root"}}


# ------------------------------------------------------------------------------------------- the relay


def _relay_child(host: str, port: int, delay: float, pipe) -> None:
    from qag.testing import Relay
    relay = Relay(host, port, delay=delay)
    pipe.send(relay.port)
    while True:
        command = pipe.recv()
        if command == "reset":
            relay.reset()
            pipe.send(None)
        elif command == "count":
            pipe.send((relay.turns, relay.connections))
        else:
            relay.close()
            pipe.send(None)
            return


class RelayProcess:
    """qag.testing.Relay in a child process: port, reset(), count() → (turns, connections), close()."""

    def __init__(self, host: str, port: int, delay: float):
        self._pipe, child = multiprocessing.Pipe()
        self._process = multiprocessing.Process(target=_relay_child, args=(host, port, delay, child), daemon=True)
        self._process.start()
        self.port = self._pipe.recv()

    def _ask(self, command: str):
        self._pipe.send(command)
        return self._pipe.recv()

    def reset(self) -> None:
        self._ask("reset")

    def count(self) -> tuple[int, int]:
        return self._ask("count")

    def close(self) -> None:
        self._ask("close")
        self._process.join(5)


# ------------------------------------------------------------------------------------------- measurements


def _paged(backend, sql: str, read_only: bool, timeout: float) -> Call:
    rendered = render(prepare(sql, backend.dialect), {}, backend.style, 11 if read_only else None, 0)
    return Call(rendered.sql, rendered.args, read_only, timeout, 11)


def _settle(relay: RelayProcess) -> None:
    """Let fire-and-forget sends (MySQL's renewals) reach the relay before it is counted or reset."""
    last = None
    while True:
        time.sleep(0.05)
        now = relay.count()
        if now == last:
            return
        last = now


def _single(relay: RelayProcess, fn, calls: int, pooled: bool) -> tuple[float, float, int]:
    """(median ms, relay turns per call, connections opened) over back-to-back calls after a warm-up.

    The warm-up starts with three concurrent calls: a MySQL caller calling back to back needs two or three
    pooled connections (one renewal reply still on its way), which the pool would otherwise open during the
    measurement. (Not for the direct driver call: one connection, one thread.)
    """
    primers = [threading.Thread(target=fn) for _ in range(3 if pooled else 0)]
    for t in primers:
        t.start()
    for t in primers:
        t.join()
    for _ in range(10):
        fn()
    _settle(relay)
    relay.reset()
    _, opened = relay.count()
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000.0)
    _settle(relay)
    turns, connections = relay.count()
    return statistics.median(times), turns / calls, connections - opened


def calibrate(args, make) -> None:
    rows: dict[str, dict] = {}
    for delay in (0.0, args.delay_ms / 1000.0):
        relay = RelayProcess(args.host, args.port, delay)
        try:
            setup = make(args, "127.0.0.1", relay.port, 8)
            backend, fields = setup.backend, setup.fields
            read = _paged(backend, args.sql or setup.read_sql, True, args.timeout)
            write = _paged(backend, args.write_sql or setup.write_sql, False, args.timeout)
            direct_call, close = setup.direct()
            cases = {"backend read (paged)": (lambda: backend.run(fields, read), True),
                     "backend write": (lambda: backend.run(fields, write), True),
                     "direct driver call": (lambda: direct_call(args.sql or setup.read_sql), False)}
            try:
                for label, (fn, pooled) in cases.items():
                    rows.setdefault(label, {})[delay] = _single(relay, fn, args.calls, pooled)
            finally:
                close()
                backend.close_idle()
        finally:
            relay.close()
    high = args.delay_ms / 1000.0
    print(f"single caller, median of {args.calls} back-to-back calls; waits = (latency at {args.delay_ms:g} ms "
          f"- latency at 0) / {args.delay_ms:g} ms")
    print(f"  {'call':24} {'at 0 ms':>9} {f'at {args.delay_ms:g} ms':>10} {'waits':>6} {'turns/call':>11} "
          f"{'new conns':>9}")
    for label, by_delay in rows.items():
        low_ms, _, _ = by_delay[0.0]
        high_ms, turns, opened = by_delay[high]
        waits = (high_ms - low_ms) / args.delay_ms
        print(f"  {label:24} {low_ms:9.2f} {high_ms:10.2f} {waits:6.2f} {turns:11.2f} {opened:9d}")


def overlap(args, make) -> None:
    relay = RelayProcess(args.host, args.port, args.delay_ms / 1000.0)
    try:
        print(f"\nT threads calling run() back to back for {args.seconds:g} s each, relay delay {args.delay_ms:g} ms "
              f"(one wait per call: the ceiling is T / delay)")
        print(f"  {'T':>3} {'calls/s':>9} {'per thread':>11} {'ceiling':>8} {'of ceiling':>11} {'median ms':>10} "
              f"{'errors':>7}")
        for threads in args.threads:
            # Twice as many pooled connections as callers: a renewal reply never makes a MySQL caller wait.
            setup = make(args, "127.0.0.1", relay.port, 2 * threads)
            backend, fields = setup.backend, setup.fields
            call = _paged(backend, args.sql or setup.read_sql, True, args.timeout)
            counts = [0] * threads
            errors = [0] * threads
            latencies: list[list[float]] = [[] for _ in range(threads)]
            start = threading.Barrier(threads + 1)
            stop = threading.Event()

            def caller(i: int) -> None:
                for _ in range(3):
                    backend.run(fields, call)
                start.wait()
                while not stop.is_set():
                    began = time.perf_counter()
                    try:
                        backend.run(fields, call)
                    except Exception:  # counted, shown; a benchmark keeps going
                        errors[i] += 1
                        continue
                    latencies[i].append((time.perf_counter() - began) * 1000.0)
                    counts[i] += 1

            workers = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
            for w in workers:
                w.start()
            start.wait()
            began = time.perf_counter()
            time.sleep(args.seconds)
            stop.set()
            for w in workers:
                w.join()
            elapsed = time.perf_counter() - began
            rate = sum(counts) / elapsed
            ceiling = threads / (args.delay_ms / 1000.0) if args.delay_ms else float("inf")
            median = statistics.median([x for per in latencies for x in per]) if any(latencies) else float("nan")
            print(f"  {threads:3d} {rate:9.0f} {rate / threads:11.0f} {ceiling:8.0f} {rate / ceiling:11.0%} "
                  f"{median:10.2f} {sum(errors):7d}")
            backend.close_idle()
    finally:
        relay.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=sorted(SETUPS), default="mysql")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, help="the database's port (default: the db's usual one)")
    parser.add_argument("--user", help="(default: root for mysql)")
    parser.add_argument("--password", default=os.environ.get("QAG_BENCH_DB_PASSWORD", ""),
                        help="(default: $QAG_BENCH_DB_PASSWORD or empty)")
    parser.add_argument("--database", default="", help="the connection's database")
    parser.add_argument("--sql", help="the read each call runs, paged as qag pages it (default: SELECT 1)")
    parser.add_argument("--write-sql", help="the statement of the write calibration (default: DO 0 on mysql)")
    parser.add_argument("--timeout", type=float, default=30.0, help="each call's time limit, seconds")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="delay the relay adds to every reply")
    parser.add_argument("--threads", default="1,2,4,8,16", help="comma-separated thread counts")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per thread count")
    parser.add_argument("--calls", type=int, default=40, help="calls per calibration case")
    parser.add_argument("--no-calibration", action="store_true")
    args = parser.parse_args()
    defaults = DEFAULTS[args.db]
    args.port = args.port or defaults["port"]
    args.user = args.user or defaults["user"]
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    make = SETUPS[args.db]
    print(f"qag {args.db} backend through a delaying relay to {args.host}:{args.port}")
    if not args.no_calibration:
        calibrate(args, make)
    overlap(args, make)


if __name__ == "__main__":
    main()
