"""Round trips per call: single calls timed at increasing added network delay between gateway and database.

    python -m benchmarks.rtt --case tpcc --target qag --target queryapigate
    python -m benchmarks.rtt --case pgbench --delays 0,2,5,10 --calls 40

A delaying relay (qag.testing.Relay, shared with the tests) sits between each gateway and the database: every chunk the database sends
is held `delay` ms. Each gateway gets a second connection through the relay, and one caller runs the case's
single-row query on it (admin key, `connection_name=`) at each delay. The slope of the median latency against
the delay is the number of waits on the database per call; the same measurement with the Python driver
issuing the statement once per call (one wait by construction) calibrates it. The relay's count of request
turns per call is shown too (a turn the client sends without waiting for the previous reply is not a wait).
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import time

from qag.testing import Relay

from . import run as harness
from . import targets
from .workload import fill


PROBE = {"tpcc": "customer", "pgbench": "account"}


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else float("nan")


def _time_http(t: targets.Target, path: str, calls: int, relay: Relay) -> list[float]:
    conn = http.client.HTTPConnection("127.0.0.1", t.port, timeout=30)
    out = []
    try:
        for i in range(calls + 20):
            if i == 20:
                relay.reset()
            t0 = time.perf_counter()
            conn.request("GET", path, headers={"X-API-Key": t.admin_key})
            r = conn.getresponse()
            body = r.read()
            if r.status != 200:
                raise RuntimeError(f"{t.name}: {r.status} {body[:300]!r}")
            if i >= 20:   # the first calls open pooled connections through the relay (not counted)
                out.append((time.perf_counter() - t0) * 1e3)
    finally:
        conn.close()
    return out


def _driver_caller(case, relay_port: int, sql: str):
    d = case.direct
    if d["kind"] == "mysql":
        import MySQLdb
        conn = MySQLdb.connect(host="127.0.0.1", port=relay_port, user=d["user"], passwd=d["password"],
                               db=d["database"])
        conn.autocommit(True)
    else:
        import psycopg2
        conn = psycopg2.connect(host="127.0.0.1", port=relay_port, user=d["user"], password=d["password"],
                                dbname=d["database"])
        conn.autocommit = True
    cur = conn.cursor()

    def call() -> None:
        cur.execute(sql)
        cur.fetchall()
    return call, conn


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=("tpcc", "pgbench"), default="tpcc")
    p.add_argument("--target", action="append", help="target specs as in run.py (default qag)")
    p.add_argument("--delays", default="0,2,5,10", help="added delays in ms (default 0,2,5,10)")
    p.add_argument("--calls", type=int, default=30, help="timed calls per delay and target (default 30)")
    p.add_argument("--out", help="append JSON lines here")
    p.add_argument("--no-load", action="store_true")
    from . import oltp, tpcc_mysql
    tpcc_mysql.add_arguments(p)
    oltp.add_arguments(p)
    a = p.parse_args(argv)
    case = harness.make_case(a.case, a)
    query = case.query(PROBE[a.case])
    values = case.space.values(0)
    delays = [float(x) for x in a.delays.split(",")]
    relay = Relay(case.direct["host"], int(case.direct["port"]))
    started = []
    results = {}
    try:
        for spec in a.target or ["qag"]:
            t = targets.start(spec)
            started.append(t)
            t.provision(case)
            conn = dict(case.connection, name=case.connection["name"] + "_relay", host="127.0.0.1", port=relay.port)
            status, body = t.request("POST", "/api/v1/connections", conn)
            if status != 201:
                raise RuntimeError(f"{t.name}: relay connection: {status} {body[:200]!r}")
        path = fill(query.path_template(case.space), values) + f"&connection_name={case.connection['name']}_relay"
        sql = fill(query.direct_sql()[0], values)
        call, driver_conn = _driver_caller(case, relay.port, sql)
        rows: dict[str, list] = {"driver (one statement per call)": []}
        for t in started:
            rows[t.name] = []
        for delay in delays:
            relay.delay = delay / 1e3
            call()
            relay.reset()
            times = []
            for _ in range(a.calls):
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
            rows["driver (one statement per call)"].append((delay, statistics.median(times), relay.turns / a.calls))
            for t in started:
                times = _time_http(t, path, a.calls, relay)
                rows[t.name].append((delay, statistics.median(times), relay.turns / a.calls))
        driver_conn.close()
        print(f"Round trips per call through a delaying relay ({a.case}, query {query.name}, {a.calls} calls per "
              f"point; median ms at each added delay):\n")
        print("| caller | " + " | ".join(f"+{d:g} ms" for d in delays) + " | slope (waits/call) | relay turns/call |")
        print("|---|" + "---|" * (len(delays) + 2))
        for name, pts in rows.items():
            slope = _slope([d for d, _, _ in pts], [m for _, m, _ in pts])
            turns = statistics.median(tr for _, _, tr in pts)
            results[name] = {"points": pts, "slope": slope, "turns": turns}
            print(f"| {name} | " + " | ".join(f"{m:.2f}" for _, m, _ in pts) + f" | {slope:.2f} | {turns:.2f} |")
        if a.out:
            with open(a.out, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"type": "rtt", "case": a.case, "query": query.name, "delays_ms": delays,
                                     "results": results}) + "\n")
    finally:
        for t in started:
            t.stop()
        relay.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
