"""The PostgreSQL case: pgbench's tables and four saved queries: a primary-key lookup, a 100-row page, the same rows
as a stream, a write.

    python -m benchmarks.oltp --scale 10          # `pgbench -i -s 10` into database qag_bench (skipped when loaded)
    python -m benchmarks.oltp --scale 10 --reload # reinitialise

Each query is run with a plain key (grants only) and with a governed key (a table allow-list and a masking
rule on `pgbench_accounts.filler`), so the cost of governance shows on its own. The write is a single-row
`UPDATE ... RETURNING` through a key that may write to that one query; the gateway needs writes allowed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from .workload import Case, KeySpace, Query

ACCOUNTS_PER_SCALE = 100_000
RO_USER = "qag_bench_pg"
PASSWORD = os.environ.get("QAG_BENCH_PG_PASSWORD", "qag-bench-pg")


PAGE_SQL = "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid >= :aid ORDER BY aid LIMIT 100"


def queries(scale: int) -> tuple[Query, ...]:
    aid = {"aid": {"type": "int", "required": True, "min": 1, "max": scale * ACCOUNTS_PER_SCALE,
                   "description": "account id"}}
    return (
        Query("account", "One account by primary key",
              "SELECT aid, bid, abalance, filler FROM pgbench_accounts WHERE aid = :aid", aid, (("aid", "aid"),)),
        Query("accounts_page", "A page of 100 accounts from an id on",
              PAGE_SQL, aid, (("aid", "aid"),), {"page_size": 100}),
        Query("accounts_stream", "The same 100 accounts as a stream (stream=true, NDJSON)",
              PAGE_SQL, aid, (("aid", "aid"),), {"stream": "true", "format": "ndjson"}, mixed=False),
        Query("deposit", "Add to one account's balance and return it (a single-row write)",
              "UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid RETURNING aid, abalance",
              {**aid, "delta": {"type": "int", "default": 1, "min": -1000, "max": 1000}},
              (("aid", "aid"),), {"delta": 1}, write=True),
    )


def _psql(args, sql: str, database: str = "postgres") -> str:
    env = dict(os.environ, PGPASSWORD=args.pg_password)
    out = subprocess.run(["psql", "-h", args.pg_host, "-p", str(args.pg_port), "-U", args.pg_user, "-d", database,
                          "-XAtqc", sql], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def load(args) -> dict:
    """Create the database and its owner role, then `pgbench -i -s N` unless already at that scale."""
    db = args.pg_database
    exists = _psql(args, f"SELECT 1 FROM pg_database WHERE datname = '{db}'") == "1"
    if exists and not args.force:
        try:
            n = int(_psql(args, "SELECT count(*) FROM pgbench_branches", db))
        except RuntimeError:
            n = -1
        if n == args.scale:
            return {"skipped": True, "scale": n}
    role = _psql(args, f"SELECT 1 FROM pg_roles WHERE rolname = '{RO_USER}'")
    if role != "1":
        _psql(args, f"CREATE ROLE {RO_USER} LOGIN PASSWORD '{PASSWORD}'")
    if exists:
        _psql(args, f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'")
        _psql(args, f'DROP DATABASE "{db}"')
    _psql(args, f'CREATE DATABASE "{db}" OWNER {RO_USER}')
    started = time.perf_counter()
    env = dict(os.environ, PGPASSWORD=PASSWORD)
    subprocess.run(["pgbench", "-i", "-q", "-s", str(args.scale), "-h", args.pg_host, "-p", str(args.pg_port),
                    "-U", RO_USER, db], env=env, check=True, capture_output=True)
    _psql(args, "VACUUM ANALYZE", db)
    return {"skipped": False, "scale": args.scale, "seconds": round(time.perf_counter() - started, 1)}


def case(args) -> Case:
    space = KeySpace((("aid", args.scale * ACCOUNTS_PER_SCALE),))
    space.check()
    conn = {"name": "pgbench", "db": "postgres", "host": args.pg_host, "port": args.pg_port,
            "database": args.pg_database, "user": RO_USER, "password": PASSWORD}
    direct = {"kind": "postgres", "host": args.pg_host, "port": args.pg_port, "user": RO_USER, "password": PASSWORD,
              "database": args.pg_database}
    governed = {"allowed_tables": ["pgbench_accounts", "pgbench_branches"],
                "mask": [{"column": "pgbench_accounts.filler", "action": "mask"}]}
    return Case("pgbench", "postgres", space, queries(args.scale), conn, direct, governed=governed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("PostgreSQL (pgbench case)")
    g.add_argument("--scale", type=int, default=10, help="pgbench scale factor (default 10: 1,000,000 accounts)")
    g.add_argument("--pg-database", default="qag_bench")
    g.add_argument("--pg-host", default=os.environ.get("QAG_BENCH_PG_HOST", "127.0.0.1"))
    g.add_argument("--pg-port", type=int, default=int(os.environ.get("QAG_BENCH_PG_PORT", "5432")))
    g.add_argument("--pg-user", default=os.environ.get("QAG_BENCH_PG_USER", "postgres"),
                   help="a superuser (only for creating the database and role)")
    g.add_argument("--pg-password", default=os.environ.get("QAG_BENCH_PG_PASSWORD_ADMIN", ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--reload", dest="force", action="store_true", help="reinitialise even when loaded")
    print(json.dumps(load(parser.parse_args(argv))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
