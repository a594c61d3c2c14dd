"""`qag size`: how many workers and threads a load needs, CPU-bound or waiting-bound, with the reasoning shown.

The model (docs/benchmarks.md has worked examples):

- A call holds one request thread for `cpu + waits`: `cpu` is the gateway's own CPU per call (measured by the
  benchmark harness as gateway CPU per call, or given), `waits = round_trips × rtt + query`.
- CPU: the load needs `rate × cpu` core-seconds per second. One worker process runs Python on at most one core
  at a time (the GIL), so it needs at least `ceil(rate × cpu / headroom)` workers, and no more workers than
  cores help a CPU-bound load.
- Waiting: by Little's law `rate × (cpu + waits)` calls are in flight on average; every one needs a thread, so
  the threads across all workers must cover that with headroom.
- The load is CPU-bound when a call spends more time on the CPU than waiting (`cpu >= waits`), otherwise
  waiting-bound: then threads, not workers, carry it, and one core is kept busy by `(cpu + waits) / cpu`
  threads per worker.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass, field

# What `qag size` assumes for a figure the user did not give: qag's own worker CPU per saved-query call, measured
# side by side on one pinned core (docs/performance.md: 184-246 µs a call with one worker on 2026-12-03, the highest
# rounded up), and a typical load of quick queries on a nearby database.
MEASURED_CPU_US = 250.0
DEFAULT_RATE = 1000.0
DEFAULT_QUERY_MS = 1.0
MAX_THREADS = 256   # QAG_THREADS' upper bound
MAX_WORKERS = 256   # QAG_WORKERS' upper bound


@dataclass
class Plan:
    rate: float
    cpu_us: float
    query_ms: float
    rtt_ms: float
    round_trips: float
    cores: int
    headroom: float
    bound: str = ""
    workers: int = 0
    threads: int = 0
    feasible: bool = True
    in_flight: float = 0.0
    cores_needed: float = 0.0
    max_rate: float = 0.0
    db_connections: int = 0
    reasoning: list[str] = field(default_factory=list)


def plan(rate: float, cpu_us: float, query_ms: float, rtt_ms: float, threads: int | None = None,
         cores: int | None = None, round_trips: float = 1.0, headroom: float = 0.7) -> Plan:
    """Workers and threads for `rate` calls/s; `threads` fixes the threads per worker when given."""
    if rate <= 0 or cpu_us <= 0:
        raise ValueError("calls/s and CPU per call must be positive")
    if query_ms < 0 or rtt_ms < 0 or round_trips < 0:
        raise ValueError("query time, round-trip time and round trips must not be negative")
    if not 0 < headroom <= 1:
        raise ValueError("headroom must be in (0, 1]")
    if threads is not None and not 1 <= threads <= MAX_THREADS:
        raise ValueError(f"threads must be from 1 to {MAX_THREADS}")
    cores = cores or os.cpu_count() or 1
    p = Plan(rate, cpu_us, query_ms, rtt_ms, round_trips, cores, headroom)
    say = p.reasoning.append
    cpu_s = cpu_us / 1e6
    wait_s = (round_trips * rtt_ms + query_ms) / 1e3
    hold_s = cpu_s + wait_s
    p.cores_needed = rate * cpu_s
    p.in_flight = rate * hold_s
    say(f"Each call holds a thread for {hold_s * 1e3:.3f} ms: {cpu_us:g} µs of gateway CPU + {round_trips:g} round "
        f"trip(s) × {rtt_ms:g} ms + {query_ms:g} ms in the database.")
    say(f"CPU: {rate:g} calls/s × {cpu_us:g} µs = {p.cores_needed:.2f} cores busy with gateway work.")
    say(f"Waiting: by Little's law {rate:g} calls/s × {hold_s * 1e3:.3f} ms = {p.in_flight:.1f} calls in flight.")
    p.bound = "CPU-bound" if cpu_s >= wait_s else "waiting-bound"
    share = cpu_s / hold_s
    say(f"{p.bound}: a call spends {share:.0%} of its time on the CPU and {1 - share:.0%} waiting.")

    # Workers: each runs Python on at most one core (the GIL); leave headroom.
    workers_cpu = max(1, math.ceil(p.cores_needed / headroom))
    say(f"Workers for the CPU: {p.cores_needed:.2f} cores ÷ {headroom:.0%} headroom → {workers_cpu} "
        f"(a worker uses at most one core at a time).")
    workers = workers_cpu
    if workers_cpu > cores:
        p.feasible = False
        say(f"NOT FEASIBLE on {cores} core(s): the gateway alone needs {p.cores_needed:.2f} cores; "
            f"at {headroom:.0%} of {cores} core(s) this machine carries about "
            f"{cores * headroom / cpu_s:,.0f} calls/s. Add cores or instances, or lower the CPU per call.")
        workers = cores
    elif cores >= 2 and workers < 2:
        workers = 2
        say("Two workers rather than one, so a worker restart or a slow call never stops the service "
            "(costs only memory).")

    # Threads: enough for the calls in flight, and enough per worker to keep its core busy while others wait.
    per_core = max(1, math.ceil(hold_s / cpu_s))
    needed_total = math.ceil(p.in_flight / headroom) if p.in_flight > 0 else 1
    if threads is None:
        t = max(2, math.ceil(needed_total / workers))
        say(f"Threads: {p.in_flight:.1f} in flight ÷ {headroom:.0%} headroom = {needed_total} across "
            f"{workers} worker(s) → {math.ceil(needed_total / workers)} per worker (at least 2, so a wait "
            f"never idles a worker); {per_core} thread(s) keep one core busy at this mix.")
        if p.bound == "CPU-bound" and t > per_core * 2:
            say("More threads than that only queue on the GIL; the extra are idle headroom for slow queries.")
        if t > MAX_THREADS:
            t = MAX_THREADS
            workers = min(MAX_WORKERS, math.ceil(needed_total / MAX_THREADS))
            say(f"Capped at {MAX_THREADS} threads per worker: {workers} workers instead.")
        p.threads = t
    else:
        p.threads = threads
        capacity = workers * threads
        if capacity < needed_total:
            more = math.ceil(needed_total / threads)
            say(f"Threads fixed at {threads} per worker: {capacity} threads < {needed_total} needed for the "
                f"calls in flight → {more} workers (waiting, not CPU, sets the count).")
            workers = more
        else:
            say(f"Threads fixed at {threads} per worker: {capacity} threads cover {needed_total} needed.")
    p.workers = workers
    # What the chosen shape can carry: the CPU limit and the thread limit, whichever is lower.
    cpu_limit = min(workers, cores) * headroom / cpu_s
    thread_limit = workers * p.threads / hold_s
    p.max_rate = min(cpu_limit, thread_limit)
    p.db_connections = workers * p.threads
    say(f"This shape carries about {p.max_rate:,.0f} calls/s (CPU limit {cpu_limit:,.0f}, thread limit "
        f"{thread_limit:,.0f}) and opens up to {p.db_connections} database connections (QAG_POOL_SIZE defaults "
        f"to the threads per worker).")
    if p.max_rate < rate:
        p.feasible = False
    return p


def cpu_from_results(path: str, target: str | None, case: str | None) -> tuple[float, str]:
    """Median gateway CPU per call (µs) of the harness's closed-loop blocks in a results file."""
    figures, names = [], set()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            if r.get("type") != "block" or r.get("phase") != "closed" or r.get("target_kind") != "qag":
                continue
            if target and r["target"] != target or case and r["case"] != case:
                continue
            value = (r.get("cpu_per_call") or {}).get("gateway_us")
            if value:
                figures.append(value)
                names.add(f"{r['case']}/{r['workload']}/{r['target']}")
    if not figures:
        raise ValueError(f"no qag closed-loop blocks with gateway CPU in {path}")
    return statistics.median(figures), ", ".join(sorted(names))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qag size", description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, help=f"calls per second wanted (default {DEFAULT_RATE:g})")
    p.add_argument("--query-ms", type=float, help=f"database time per call, ms (default {DEFAULT_QUERY_MS:g})")
    p.add_argument("--rtt-ms", type=float, default=0.1, help="network round trip gateway↔database, ms (default 0.1)")
    p.add_argument("--round-trips", type=float, default=1.0, help="waits on the database per call (default 1)")
    p.add_argument("--threads", type=int, help="fix the threads per worker (default: computed)")
    p.add_argument("--cores", type=int, help="cores for the gateway (default: this machine's)")
    p.add_argument("--headroom", type=float, default=0.7, help="fraction of capacity to plan for (default 0.7)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--cpu-us", type=float, help=f"gateway CPU per call, µs (default {MEASURED_CPU_US:g}, qag's "
                                                  f"measured figure in docs/performance.md)")
    src.add_argument("--results", help="a benchmark results file (JSON lines): use its median qag gateway CPU")
    p.add_argument("--target", help="with --results: only this target's blocks")
    p.add_argument("--case", help="with --results: only this case's blocks")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    source = "given"
    defaulted = [f"--{name.replace('_', '-')} {value:g}" for name, value in
                 (("rate", DEFAULT_RATE), ("query_ms", DEFAULT_QUERY_MS)) if getattr(args, name) is None]
    rate = DEFAULT_RATE if args.rate is None else args.rate
    query_ms = DEFAULT_QUERY_MS if args.query_ms is None else args.query_ms
    try:
        cpu = args.cpu_us
        if cpu is None and args.results is None:
            cpu, source = MEASURED_CPU_US, "qag's measured default, docs/performance.md"
        elif cpu is None:
            cpu, names = cpu_from_results(args.results, args.target, args.case)
            source = f"measured: median of {names} in {args.results}"
        result = plan(rate, cpu, query_ms, args.rtt_ms, args.threads, args.cores, args.round_trips,
                      args.headroom)
    except (OSError, ValueError) as exc:
        print(f"qag size: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(result), "cpu_source": source}, indent=1))
        return 0 if result.feasible else 1
    if defaulted:
        print(f"No figures of your own for {', '.join(d.split()[0] for d in defaulted)}: assuming "
              f"{', '.join(defaulted)} (give yours for a plan of your load).")
    print(f"Gateway CPU per call: {cpu:g} µs ({source}).")
    for line in result.reasoning:
        print(f"- {line}")
    verdict = "" if result.feasible else "  (short of the rate wanted: see above)"
    print(f"\n{result.bound}. Run QAG_WORKERS={result.workers} QAG_THREADS={result.threads}{verdict}")
    return 0 if result.feasible else 1


if __name__ == "__main__":
    sys.exit(main())
