"""The benchmark harness: cases × targets in interleaved rounds, JSON lines out, a report at the end.

    python -m benchmarks.run --case tpcc --target qag --target queryapigate --target bare --target direct
    python -m benchmarks.run --case pgbench --keys plain,governed --open-loop
    python -m benchmarks.run --case sqlite --smoke                # every block for ~2 s: proves the harness
    python -m benchmarks.run --case tpcc --refs main,HEAD         # qag built from two git refs, side by side

Each round runs one block per target, in alternating order (A B C, then C B A, ...). A block: a /health floor,
a warm-up, the closed loop at --callers (32) with CPU and statement counters read around it, single-caller
latency, optionally the open loop at 25-110 % of the capacity just measured, and the /health floor again.
docs/benchmarks.md explains every field; benchmarks/report.py turns the JSON lines into tables.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

from . import dbdirect, load, measure, oltp, report, sqlite_demo, targets, tpcc_mysql
from .workload import Case, direct_config, fill, lua_config

OPEN_LOOP_PCTS = (25, 50, 75, 90, 100, 110)
DEFAULT_TARGETS = ("qag", "bare", "direct")
DEFAULT_WORKLOADS = {"tpcc": "mix", "pgbench": "account,accounts_page,deposit", "sqlite": "mix"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=targets.__doc__)
    p.add_argument("--case", action="append", choices=("tpcc", "pgbench", "sqlite"),
                   help="workload case (repeatable; default tpcc)")
    p.add_argument("--target", action="append", help=f"target spec (repeatable; default {' '.join(DEFAULT_TARGETS)})")
    p.add_argument("--workload", help="comma list: 'mix' (all the case's queries mixed), 'each', or query names")
    p.add_argument("--keys", default="plain", help="plain,governed (default plain)")
    p.add_argument("--distribution", default="uniform", help="uniform,zipf (default uniform)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=20, help="closed-loop seconds per block (default 20)")
    p.add_argument("--single-seconds", type=float, default=5, help="single-caller seconds per block (default 5)")
    p.add_argument("--warmup", type=float, default=2, help="warm-up seconds before each block (default 2)")
    p.add_argument("--callers", type=int, default=32)
    p.add_argument("--wrk-threads", type=int, default=1)
    p.add_argument("--open-loop", action="store_true", help="also run 25,50,75,90,100,110 %% of the capacity")
    p.add_argument("--open-seconds", type=float, default=10)
    p.add_argument("--refs", help="comma list of git refs: adds a qag@<ref> target per ref (own venvs)")
    p.add_argument("--pin", help="CPU pinning, e.g. gateway=0,db=1,load=1 (taskset lists)")
    p.add_argument("--out", help="JSON lines file (default benchmarks/results/<time>.jsonl)")
    p.add_argument("--smoke", action="store_true", help="every block for ~2 s, 1 round: proves the harness works")
    p.add_argument("--no-load", action="store_true", help="do not (re)load the case's data")
    tpcc_mysql.add_arguments(p)
    oltp.add_arguments(p)
    return p


def make_case(name: str, args) -> Case:
    if name == "tpcc":
        if not args.no_load:
            print(f"loading TPC-C data: {json.dumps(tpcc_mysql.load(args))[:300]}", file=sys.stderr)
        return tpcc_mysql.case(args)
    if name == "pgbench":
        if not args.no_load:
            print(f"loading pgbench data: {json.dumps(oltp.load(args))}", file=sys.stderr)
        return oltp.case(args)
    return sqlite_demo.case(args)


def counter_for(case: Case, args):
    try:
        if case.db == "mysql":
            return measure.MysqlCounter(args.host, args.port, args.user, args.password)
        if case.db == "postgres":
            return measure.PostgresCounter(args.pg_host, args.pg_port, args.pg_user, args.pg_password,
                                           args.pg_database)
    except Exception as exc:  # counters are a record, not a precondition
        print(f"statement counters unavailable: {exc}", file=sys.stderr)
    return None


def workloads(case: Case, text: str) -> list[tuple[str, list]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if item == "mix":
            out.append(("mix", [q for q in case.queries if q.mixed]))
        elif item == "each":
            out += [(q.name, [q]) for q in case.queries]
        elif item:
            out.append((item, [case.query(item)]))
    return out


def parse_pin(text: str | None) -> dict:
    return targets.parse_options(text) if text else {}


class Pinner:
    """taskset for the database's processes during the run; their previous affinity is restored at the end."""

    def __init__(self, cpus: str | None, db: str):
        self.saved: dict[int, str] = {}
        if not cpus:
            return
        names = measure.DB_PROCESSES.get(db, ())
        for root in measure.pids_named(*names):
            for pid in [root] + self._children(root):
                old = subprocess.run(["taskset", "-p", "-c", str(pid)], capture_output=True, text=True).stdout
                self.saved[pid] = old.rsplit(":", 1)[-1].strip()
                subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True)

    @staticmethod
    def _children(root: int) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(root)], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out]

    def restore(self) -> None:
        for pid, cpus in self.saved.items():
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True)


class Harness:
    def __init__(self, args):
        self.args = args
        self.run_id = datetime.datetime.now().strftime("%Y%m%dT%H%M%S")
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", f"{self.run_id}.jsonl")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        self.out_path = out
        self.out = open(out, "a", encoding="utf-8")
        self.pin = parse_pin(args.pin)
        self.tmp = tempfile.mkdtemp(prefix="qag-bench-run-")
        self.dbdirect_bin: str | None = None

    def emit(self, record: dict) -> None:
        record = {"run": self.run_id, "time": datetime.datetime.now().isoformat(timespec="seconds"), **record}
        self.out.write(json.dumps(record) + "\n")
        self.out.flush()

    # --- one block --------------------------------------------------------------------------------------
    def probe(self, t: targets.Target, case: Case, queries, key) -> str | None:
        """None when every query answers 200 with the right row for one user; else why not."""
        if t.kind == "direct" or t.kind == "bare":
            return None
        values = case.space.values(0)
        for q in queries:
            path = fill(q.path_template(case.space), values)
            status, body = t.request("GET", path, key=key)
            if status != 200:
                return f"{q.name}: {status} {body[:200].decode('utf-8', 'replace')}"
            expect = fill(q.check_template(), values)
            if expect.encode() not in body:
                return f"{q.name}: 200 but not the row asked for: {body[:200]!r}"
        return None

    def block(self, t: targets.Target, case: Case, wl: str, queries, key_label: str, key: str | None,
              distribution: str, rnd: int, db_cpu: measure.CpuMeter, counter) -> None:
        a = self.args
        base = {"type": "block", "case": case.name, "workload": wl, "key": key_label, "distribution": distribution,
                "target": t.name, "target_kind": t.kind, "settings": t.settings, "version": t.version,
                "round": rnd, "pin": self.pin or None}
        load_pin = self.pin.get("load")
        if t.kind == "direct":
            cfg = os.path.join(self.tmp, f"direct-{case.name}-{wl}.cfg")
            with open(cfg, "w") as fh:
                fh.write(direct_config(case, queries))
            run = lambda callers, seconds: load.direct(  # noqa: E731
                dbdirect.command(self.dbdirect_bin, cfg, case.direct, callers, seconds, distribution), load_pin)
        else:
            cfg = os.path.join(self.tmp, f"lua-{case.name}-{wl}-{key_label}-{distribution}-{t.kind}.lua")
            with open(cfg, "w") as fh:
                fh.write(lua_config(case, queries, distribution, key, check=t.kind != "bare"))
            url = f"http://127.0.0.1:{t.port}"
            run = lambda callers, seconds, rate=0: load.wrk(  # noqa: E731
                url, cfg, callers, seconds, a.wrk_threads, rate, load_pin)
        health_before = measure.health_floor("127.0.0.1", t.port, 50 if a.smoke else 200) if t.http else None
        if a.warmup > 0:
            run(a.callers, a.warmup)
        cpu0 = {"gateway": measure.tree_cpu(t.pid) if t.pid else None, "db": db_cpu.read()}
        stmts0 = counter.read() if counter else None
        load_avg = measure.loadavg()
        closed = run(a.callers, a.seconds)
        stmts1 = counter.read() if counter else None
        cpu1 = {"gateway": measure.tree_cpu(t.pid) if t.pid else None, "db": db_cpu.read()}
        n = max(1, closed["requests"])
        cpu = {"gateway_us": round((cpu1["gateway"] - cpu0["gateway"]) / n * 1e6, 1) if t.pid else None,
               "db_us": round((cpu1["db"] - cpu0["db"]) / n * 1e6, 1),
               "load_us": round(closed["load_cpu_s"] / n * 1e6, 1)}
        stmts = {k: round(v / n, 3) for k, v in measure.counter_delta(stmts0, stmts1).items()}
        rps = closed["requests"] / (closed["duration_us"] / 1e6)
        self.emit({**base, "phase": "closed", "callers": a.callers, "rps": round(rps, 1), **self._common(closed),
                   "cpu_per_call": cpu, "statements_per_call": stmts, "loadavg_1m": load_avg})
        gateway0 = measure.tree_cpu(t.pid) if t.pid else None
        single = run(1, a.single_seconds)
        # The gateway's CPU per call with one caller: what a lone request costs the worker (wake-ups included),
        # the part of the single-caller latency the gateway spends computing.
        single_cpu = (round((measure.tree_cpu(t.pid) - gateway0) / max(1, single["requests"]) * 1e6, 1)
                      if t.pid else None)
        self.emit({**base, "phase": "single", "callers": 1,
                   "rps": round(single["requests"] / (single["duration_us"] / 1e6), 1), **self._common(single),
                   "cpu_per_call": {"gateway_us": single_cpu}})
        if a.open_loop and t.kind != "direct":
            for pct in OPEN_LOOP_PCTS:
                rate = rps * pct / 100
                o = run(a.callers, a.open_seconds, rate)
                self.emit({**base, "phase": "open", "pct": pct, "rate": round(rate, 1), "callers": a.callers,
                           "rps": round(o["requests"] / (o["duration_us"] / 1e6), 1), **self._common(o),
                           "co_lat_us": o.get("co_lat_us")})
        health_after = measure.health_floor("127.0.0.1", t.port, 50 if a.smoke else 200) if t.http else None
        self.emit({**base, "phase": "health", "health_us": {"before": health_before, "after": health_after}})
        print(f"  round {rnd} {t.name:28} {wl}/{key_label}/{distribution}: {rps:8.0f} calls/s  "
              f"p50 {closed['lat_us']['p50'] / 1000:.2f} ms  p99 {closed['lat_us']['p99'] / 1000:.2f} ms  "
              f"gateway {cpu['gateway_us']} µs/call  non2xx {closed['non2xx']}  bad {closed['bad']}", file=sys.stderr)

    @staticmethod
    def _common(r: dict) -> dict:
        return {k: r.get(k) for k in ("requests", "duration_us", "responses", "non2xx", "checked", "bad", "unmatched",
                                      "errors", "lat_us", "bad_sample", "status_sample", "error_sample")
                if r.get(k) not in (None, "")}

    # --- the run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        a = self.args
        specs = list(a.target or DEFAULT_TARGETS)
        if a.refs:
            from . import refs
            first_qag = next((s for s in specs if s.startswith("qag")), "qag")
            opts = first_qag.partition(":")[2]
            for ref in a.refs.split(","):
                refs.venv_python(ref.strip())
                specs.append(f"qag@{ref.strip()}" + (f":{opts}" if opts else ""))
        git = subprocess.run(["git", "-C", targets.REPO, "describe", "--always", "--dirty"], capture_output=True,
                             text=True).stdout.strip()
        self.emit({"type": "run", "argv": sys.argv[1:], "machine": measure.machine(), "targets": specs, "qag_git": git,
                   "settings": {k: v for k, v in vars(a).items() if "password" not in k}})
        for case_name in a.case or ["tpcc"]:
            case = make_case(case_name, a)
            if any(s.startswith("direct") for s in specs) and case.direct:
                self.dbdirect_bin = dbdirect.build()
            specs_here = [s for s in specs if not (s.startswith("direct") and not case.direct)]
            pinner = Pinner(self.pin.get("db"), case.db)
            started: list[targets.Target] = []
            try:
                for spec in specs_here:
                    t = targets.start(spec, self.pin.get("gateway"))
                    started.append(t)
                    keys = t.provision(case) if t.http else {}
                    t.keys = keys
                    self.emit({"type": "target", "case": case.name, "target": t.name, "kind": t.kind,
                               "settings": t.settings, "version": t.version, "port": t.port,
                               "key_errors": {k: v for k, v in keys.items() if k.endswith("_error")}})
                self._run_case(case, started)
            finally:
                for t in started:
                    t.stop()
                pinner.restore()
        self.out.close()
        text = report.render(report.load(self.out_path), run=self.run_id)
        md = self.out_path.rsplit(".", 1)[0] + ".md"
        with open(md, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(text)
        print(f"results: {self.out_path}\nreport:  {md}", file=sys.stderr)
        return 0

    def _run_case(self, case: Case, started: list) -> None:
        a = self.args
        db_cpu = measure.db_meter(case.db)
        counter = counter_for(case, a)
        for wl, queries in workloads(case, a.workload or DEFAULT_WORKLOADS[case.name]):
            for key_label in a.keys.split(","):
                for distribution in a.distribution.split(","):
                    runnable = []
                    for t in started:
                        if t.kind in ("bare", "direct") and key_label != "plain":
                            continue
                        key = getattr(t, "keys", {}).get(key_label) if t.http else None
                        why = (getattr(t, "keys", {}).get(f"{key_label}_error") if t.http and t.kind != "bare"
                               and key is None else None) or self.probe(t, case, queries, key)
                        if why:
                            self.emit({"type": "unsupported", "case": case.name, "workload": wl, "key": key_label,
                                       "target": t.name, "reason": why})
                            print(f"  {t.name} {wl}/{key_label}: not run ({why[:160]})", file=sys.stderr)
                            continue
                        runnable.append((t, key))
                    for rnd in range(a.rounds):
                        order = runnable if rnd % 2 == 0 else runnable[::-1]
                        for t, key in order:
                            self.block(t, case, wl, queries, key_label, key, distribution, rnd, db_cpu, counter)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.rounds, args.seconds, args.single_seconds, args.warmup, args.open_seconds = 1, 2, 1, 0.5, 1
    return Harness(args).run()


if __name__ == "__main__":
    sys.exit(main())
