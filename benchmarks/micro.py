"""Micro-benchmark of the hot-path twins, pure and compiled side by side (python -m benchmarks.micro).

rowjson: row encoding. tables: the table verdict (qag._speedups.tables.forbidden) of a statement's
qualified tables against a key's qualified grants, for statements naming 1 to 100 tables. mask: what building a
masked call's plan costs once per statement and rule set - the trace, and the rewrite that reads masked tables
through masked values (qag/policy/_source_mask.py) - on the pgbench lookup and page.

Each round times both twins on the same rows, in alternating order, and the table shows the median
time per call over the rounds with its min-max range. Rows are shaped like a driver's: tuples of
int/str/float/None ("typical"), or with datetime, Decimal and bytes columns too ("mixed").
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timedelta
from decimal import Decimal

from qag import _speedups

SIZES = (1, 10, 100, 1000)
FORMATS = {
    "json": lambda m, c, r: m.encode_json(c, r),
    "ndjson": lambda m, c, r: m.encode_ndjson(c, r),
    "csv": lambda m, c, r: m.encode_delimited(c, r, ","),
}


def typical(n: int) -> tuple[list[str], list[tuple]]:
    """A film-catalogue page: ids, titles (a few non-ASCII), ratings, prices with NULLs, counts."""
    columns = ["film_id", "title", "rating", "price", "description", "rentals"]
    rows = [(i, f"Film {i}", 1 + (i % 50) / 10, None if i % 4 == 0 else 0.99 + (i % 5),
             "Déjà vu, in the rain" if i % 7 == 0 else "A thoughtful drama of a boy and a dog",
             i * 37 % 1000)
            for i in range(n)]
    return columns, rows


def mixed(n: int) -> tuple[list[str], list[tuple]]:
    """The typical columns plus a datetime, a Decimal and a bytes column."""
    columns, rows = typical(n)
    start = datetime(2024, 1, 1, 8, 30)
    extra = [(start + timedelta(minutes=7 * i), Decimal(i) / 8, b"blob %d" % i) for i in range(n)]
    return columns + ["updated_at", "amount", "tag"], [row + more for row, more in zip(rows, extra)]


SHAPES = {"typical": typical, "mixed": mixed}


def time_call(call, number: int) -> float:
    """Microseconds per call over `number` calls."""
    start = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - start) / number * 1e6


def measure(twins: dict, columns: list[str], rows: list[tuple], encode, rounds: int) -> dict[str, list[float]]:
    """Per-call times for each twin over interleaved rounds (order alternates every round)."""
    return measure_calls({kind: (lambda m=module: encode(m, columns, rows)) for kind, module in twins.items()},
                         rounds)


def measure_calls(calls: dict, rounds: int, same_work: bool = True) -> dict[str, list[float]]:
    """Per-call times of each call (same work, one per twin, unless same_work is False) over interleaved rounds."""
    outputs = {kind: call() for kind, call in calls.items()}
    if same_work and len(set(outputs.values())) != 1:
        raise SystemExit("the twins disagree on these rows: this benchmark only compares equal work")
    # About 20 ms of the slowest twin per round keeps timer noise small without long runs.
    slowest = max(time_call(call, 3) for call in calls.values())
    number = max(1, int(20_000 / max(slowest, 0.01)))
    order = list(calls)
    for call in calls.values():
        time_call(call, number)  # warm-up round, not counted
    times: dict[str, list[float]] = {kind: [] for kind in calls}
    for r in range(rounds):
        for kind in (order if r % 2 == 0 else order[::-1]):
            times[kind].append(time_call(calls[kind], number))
    return times


TABLE_CASES = (1, 3, 10, 100)


def table_case(n: int) -> tuple[tuple, frozenset]:
    """A statement's n qualified tables (the last one forbidden when n > 1) and a key's 20 grants."""
    grants = frozenset(f"shop.table_{i}" for i in range(20))
    tables = tuple(sorted(f"shop.table_{i}" for i in range(n - 1))) + (("shop.secret",) if n > 1 else ())
    if n == 1:
        tables = ("shop.table_0",)
    return tables, grants


def tables_main(rounds: int) -> None:
    twins = {"pure": _speedups.twin("tables", "pure")}
    try:
        twins["compiled"] = _speedups.twin("tables", "compiled")
    except ImportError as exc:
        print(f"compiled tables twin not importable ({exc}): timing the pure twin only", file=sys.stderr)
    header = f"{'tables':7} {'n':>5}  " + "  ".join(f"{kind + ' us':>26}" for kind in twins)
    print(header + ("  speedup" if "compiled" in twins else ""))
    for n in TABLE_CASES:
        tables, grants = table_case(n)
        calls = {kind: (lambda m=module: m.forbidden(tables, grants)) for kind, module in twins.items()}
        times = measure_calls(calls, rounds)
        line = f"{'verdict':7} {n:>5}  " + "  ".join(f"{summary(times[kind]):>26}" for kind in twins)
        if "compiled" in times:
            line += f"  {statistics.median(times['pure']) / statistics.median(times['compiled']):6.1f}x"
        print(line, flush=True)


SHM_BYTES = 1 << 16
SHM_PAYLOAD = 256  # about a metadata-cache row


def shmsync_main(rounds: int) -> None:
    """The metadata segment's operations on each twin, each on a file-backed segment of its own (so the pure
    twin's lock is its real fcntl lock): a lock+unlock, a seqlock read and a seqlock write of a 256-byte row."""
    import mmap
    import tempfile
    twins = {"pure": _speedups.twin("shmsync", "pure")}
    try:
        twins["compiled"] = _speedups.twin("shmsync", "compiled")
    except ImportError as exc:
        print(f"compiled shmsync twin not importable ({exc}): timing the pure twin only", file=sys.stderr)
    syncs, files = {}, []
    for kind, module in twins.items():
        fh = tempfile.TemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        fh.truncate(SHM_BYTES)
        files.append(fh)
        syncs[kind] = module.Sync(mmap.mmap(fh.fileno(), SHM_BYTES), fh.fileno())
    row = bytes(range(256))[:SHM_PAYLOAD]

    def lock_unlock(sync):
        sync.lock(0)
        sync.unlock(0)

    operations = {"lock+unlock": lock_unlock,
                  "read": lambda sync: sync.read(64, 128, SHM_PAYLOAD),
                  "write": lambda sync: sync.write(64, 128, row) and None}
    for sync in syncs.values():
        sync.write(64, 128, row)
    print(f"{'shmsync':12}  " + "  ".join(f"{kind + ' us':>26}" for kind in twins)
          + ("  speedup" if "compiled" in twins else ""))
    for name, operation in operations.items():
        calls = {kind: (lambda s=sync, op=operation: op(s)) for kind, sync in syncs.items()}
        times = measure_calls(calls, rounds)
        line = f"{name:12}  " + "  ".join(f"{summary(times[kind]):>26}" for kind in twins)
        if "compiled" in times:
            line += f"  {statistics.median(times['pure']) / statistics.median(times['compiled']):6.1f}x"
        print(line, flush=True)
    for sync in syncs.values():
        sync.release()
    for fh in files:
        fh.close()


def mask_main(rounds: int) -> None:
    """Microseconds to trace a masked statement, and to rewrite it for masking at the source (both once per
    statement and rule set, then kept with the plan), per dialect, in alternating order."""
    from qag.policy import masking
    from qag.sql.lineage import Schema
    from qag.sql.prepare import prepare

    columns = [{"name": n, "type": t} for n, t in (("aid", "integer"), ("bid", "integer"), ("abalance", "integer"),
                                                    ("filler", "character(84)"))]
    rules = masking.effective([{"column": "pgbench_accounts.filler", "action": "mask"}])
    statements = {"lookup": "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid",
                  "page": "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid >= :aid ORDER BY aid "
                          "LIMIT 100"}
    print(f"{'dialect':9} {'statement':9} {'trace us':>26} {'rewrite us':>26}")
    for dialect, default in (("postgres", "public"), ("mysql", "bench"), ("sqlite", "main")):
        schema = Schema({"tables": [{"name": "pgbench_accounts", "schema": default, "type": "table",
                                     "columns": columns}]}, dialect, default)
        for label, sql in statements.items():
            prepared = prepare(sql, dialect)
            times = measure_calls({"trace": lambda: prepared.lineage(schema),
                                   "rewrite": lambda: masking.at_source(prepared, schema, rules)}, rounds,
                                  same_work=False)
            print(f"{dialect:9} {label:9} {summary(times['trace']):>26} {summary(times['rewrite']):>26}", flush=True)


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):9.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per case (default 15)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="typical", help="row shape (default typical)")
    parser.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: json,ndjson,csv")
    parser.add_argument("--module", choices=("rowjson", "tables", "shmsync", "mask", "all"), default="all",
                        help="which twins to time (default all)")
    args = parser.parse_args(argv)
    for module, run in (("tables", tables_main), ("mask", mask_main)):
        if args.module in (module, "all"):
            print(f"python -m benchmarks.micro --module {module} --rounds {args.rounds}")
            print(f"Python {platform.python_version()} on {platform.machine()}; "
                  f"microseconds per call, median [min-max] of {args.rounds} interleaved rounds")
            run(args.rounds)
            if args.module == module:
                return 0
            print()
    if args.module in ("shmsync", "all"):
        print(f"python -m benchmarks.micro --module shmsync --rounds {args.rounds}")
        shmsync_main(args.rounds)
        if args.module == "shmsync":
            return 0
        print()

    twins = {"pure": _speedups.twin("rowjson", "pure")}
    try:
        twins["compiled"] = _speedups.twin("rowjson", "compiled")
    except ImportError as exc:
        print(f"compiled twin not importable ({exc}): timing the pure twin only", file=sys.stderr)

    print(f"python -m benchmarks.micro --rounds {args.rounds} --shape {args.shape} --formats {args.formats}")
    print(f"Python {platform.python_version()} on {platform.machine()}; "
          f"microseconds per call, median [min-max] of {args.rounds} interleaved rounds")
    header = f"{'format':7} {'rows':>5}  " + "  ".join(f"{kind + ' us':>26}" for kind in twins)
    if "compiled" in twins:
        header += "  speedup"
    print(header)
    for fmt in args.formats.split(","):
        encode = FORMATS[fmt]
        for n in SIZES:
            columns, rows = SHAPES[args.shape](n)
            times = measure(twins, columns, rows, encode, args.rounds)
            line = f"{fmt:7} {n:>5}  " + "  ".join(f"{summary(times[kind]):>26}" for kind in twins)
            if "compiled" in times:
                line += f"  {statistics.median(times['pure']) / statistics.median(times['compiled']):6.1f}x"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
