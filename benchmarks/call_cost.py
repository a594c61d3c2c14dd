"""Where a MySQL call's CPU goes, in-process: the driver alone, qag's backend, the whole WSGI call.

    python -m benchmarks.call_cost --prefix qagw_ --warehouses 1 --no-load --calls 2000 --rounds 5

Runs the TPC-C case's six saved queries (users spread over the key space) three ways in interleaved rounds and
prints the request thread's CPU per call (time.thread_time: user + system of that thread only, so the gateway's
background writers and the database are not in it), median [min–max]:

  driver   mysqlclient alone: cursor.execute with the rendered SQL and arguments, fetchall
  backend  qag's MysqlBackend.run for the same statements (pool, renewal, time limit, page fetch)
  gateway  the whole call through Gateway.__call__ (routing, auth, metadata, parameters, policy, backend, JSON
           encoding, recording), as qag's worker calls it, with no HTTP server in front

The differences are the layers' own costs: backend − driver is the backend's, gateway − backend the pipeline's.
HTTP handling is not in these figures (benchmarks.run measures it on real sockets).

    python -m benchmarks.call_cost --prefix qagw_ --warehouses 1 --no-load --instructions [--layer driver]

counts instead instructions per call under valgrind's callgrind, instrumentation on only around the measured calls
and only the request thread counted: of the pipeline alone (the gateway layer with the backend answering from
results captured off the real database first), or of the driver or backend layer against the database. The count
repeats to within ~0.3% from run to run whatever else the machine does, so it can compare two builds where CPU
time on a shared machine cannot.
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from . import tpcc_mysql
from .workload import fill
from .wsgi_call import wsgi_get


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.call_cost", description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000, help="calls per round and layer (default 2000)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-load", action="store_true", help="do not (re)load the case's data")
    p.add_argument("--instructions", action="store_true",
                   help="count instructions per call under callgrind instead (needs valgrind)")
    p.add_argument("--layer", choices=("pipeline", "driver", "backend", "gateway"), default="pipeline",
                   help="with --instructions: the pipeline alone (default), or the driver, backend or whole "
                        "gateway layer against the real database")
    p.add_argument("--query", help="one of the case's saved queries instead of the mix of all six")
    p.add_argument("--keep", metavar="FILE",
                   help="with --instructions: keep the request thread's callgrind profile there (for "
                        "callgrind_annotate)")
    tpcc_mysql.add_arguments(p)
    return p


def _layers(args, home: str):
    """The three ways to run call i, as functions of i, and the gateway app they call."""
    import MySQLdb  # here, not at the top: the rest of benchmarks/ runs without the MySQL extra

    from qag.app import create_app
    from qag.backends.base import Call
    from qag.backends.mysql import MysqlBackend, connect_args
    from qag.settings import load
    from qag.sql.prepare import prepare, render

    case = tpcc_mysql.case(args)
    conn_body = case.connection
    admin_key = "bench-admin-" + secrets.token_hex(16)
    settings = load({"QAG_HOME": home, "QAG_API_KEY": admin_key})
    app = create_app(settings)
    admin = {"HTTP_X_API_KEY": admin_key}
    _post(app, "/api/v1/connections", conn_body, admin)
    for q in case.queries:
        _post(app, "/api/v1/queries", q.create_body(conn_body["name"]), admin)
    # The harness's "plain" key: scoped to the case's queries, as its callers are.
    key = _post(app, "/api/v1/api-keys", case.key_body("bench-plain", list(case.queries), False), admin)["secret"]

    fields = {k: conn_body[k] for k in ("host", "port", "user", "password", "database") if k in conn_body}
    users = [case.space.values(u * 7919 % case.space.size) for u in range(300)]
    chosen = [q for q in case.queries if q.name == args.query or (args.query is None and q.mixed)]
    if not chosen:
        raise SystemExit(f"--query: none of {[q.name for q in case.queries]}")
    calls, statements, urls = [], [], []
    for i, values in enumerate(users):
        q = chosen[i % len(chosen)]
        path, _, query = fill(q.path_template(case.space), values).partition("?")
        urls.append((path, query))
        page = q.extra.get("page_size", 10)
        rendered = render(prepare(q.sql, "mysql"), {**q.extra, **values}, "format", page + 1, 0)
        statements.append((rendered.sql, rendered.args))
        calls.append(Call(rendered.sql, rendered.args, True, settings.query_timeout, page + 1, 0))
    backend = MysqlBackend(settings)
    driver = MySQLdb.connect(**connect_args(fields, True))
    cursor = driver.cursor()

    def by_driver(i):
        sql, params = statements[i % 300]
        cursor.execute(sql, params or None)
        cursor.fetchall()

    def by_backend(i):
        backend.run(fields, calls[i % 300])

    def by_gateway(i):
        path, query = urls[i % 300]
        wsgi_get(app, path, query, key)

    return {"driver": by_driver, "backend": by_backend, "gateway": by_gateway}, app


def _post(app, path: str, body: dict, headers: dict) -> dict:
    data = json.dumps(body).encode()
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": "127.0.0.1",
               "RAW_URI": path, "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(data)),
               "wsgi.input": io.BytesIO(data), **headers}
    status = []
    reply = b"".join(app(environ, lambda s, h: status.append(s)))
    if not status[0].startswith("201"):
        raise RuntimeError(f"{path}: {status[0]} {reply[:300]!r}")
    return json.loads(reply)


def _measure(layers: dict, rounds: int, calls: int) -> dict[str, list[float]]:
    for fn in layers.values():          # warm every pool, cache and prepared statement first
        for i in range(300):
            fn(i)
    results: dict[str, list[float]] = {name: [] for name in layers}
    for r in range(rounds):
        order = list(layers.items()) if r % 2 == 0 else list(layers.items())[::-1]
        for name, fn in order:
            start = time.thread_time()
            for i in range(calls):
                fn(i)
            results[name].append((time.thread_time() - start) / calls * 1e6)
    return results


UNDER_CALLGRIND = "QAG_BENCH_CALLGRIND_OUT"


class _Replay:
    """The pipeline layer's MySQL backend: each statement's result is captured from the real backend first, then
    answered from the capture, so the count leaves the database and its driver out. The rest is the real one's.
    (A stand-in in the gateway's registry: the compiled MysqlBackend is an extension type, not patchable.)"""

    def __init__(self, real):
        self.real, self.captured, self.replaying = real, {}, False

    def run(self, fields, call):
        if self.replaying:
            return self.captured[call.sql, call.args]
        self.captured[call.sql, call.args] = result = self.real.run(fields, call)
        return result

    def __getattr__(self, name):
        return getattr(self.real, name)


def _counted(layers: dict, app, layer: str, calls: int) -> None:
    """Inside callgrind: switch instrumentation on for exactly the measured calls of one layer. For the pipeline,
    each statement's result is captured from the database first and the backend then answers from the capture."""
    if layer == "pipeline":
        replay = _Replay(app.backends.get("mysql"))
        app.backends._backends["mysql"] = replay
        for i in range(300):
            layers["gateway"](i)
        replay.replaying = True
    run = layers["gateway" if layer == "pipeline" else layer]
    for i in range(600):
        run(i)
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "-i", "on", pid], check=True, capture_output=True)
    for i in range(calls):
        run(i)
    subprocess.run(["callgrind_control", "-i", "off", pid], check=True, capture_output=True)


def rerun_under_callgrind(module: str, argv: list[str], out_dir: str) -> str:
    """Run `python -m module argv` again under callgrind, instrumentation off until the run turns it on (the run
    sees $QAG_BENCH_CALLGRIND_OUT set), one profile per thread; returns the profiles' path prefix in out_dir."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    out = os.path.join(out_dir, "cg")
    env = dict(os.environ, **{UNDER_CALLGRIND: out})
    done = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                           f"--callgrind-out-file={out}", sys.executable, "-m", module, *argv],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        # valgrind's own lines start with "==pid=="; what is left is the run's own error.
        said = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("=="))
        raise SystemExit(f"python -m {module} under callgrind failed (exit {done.returncode}):\n{said[-3000:]}")
    return out


def _count_instructions(argv: list[str], calls: int, keep: str | None = None) -> int:
    """Run this module again under callgrind; the request (main) thread's instructions per call (its profile
    copied to `keep` when given)."""
    out_dir = tempfile.mkdtemp(prefix="qag-callgrind-")
    try:
        out = rerun_under_callgrind("benchmarks.call_cost", argv, out_dir)
        profile = sorted(glob.glob(out + "*-01"))[0]   # thread 1: the one that ran the calls
        with open(profile) as fh:
            total = next(int(line.split()[1]) for line in fh if line.startswith("totals:"))
        if keep:
            shutil.copyfile(profile, keep)
        return total // calls
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser().parse_args(argv)
    if args.instructions:
        if os.environ.get(UNDER_CALLGRIND):
            home = tempfile.mkdtemp(prefix="qag-call-cost-")
            try:
                _counted(*_layers(args, home), args.layer, args.calls)
            finally:
                shutil.rmtree(home, ignore_errors=True)
            return 0
        if not args.no_load:
            print(f"loading TPC-C data: {tpcc_mysql.load(args)}", file=sys.stderr)
        inner = [a for a in argv if a != "--no-load"] + ["--no-load"]
        per_call = _count_instructions(inner, args.calls, args.keep)
        how = ("the backend answering from captured results" if args.layer == "pipeline"
               else "against the real database")
        print(f"{args.layer} instructions per call (request thread, {how}, {args.calls} calls, TPC-C {args.query or 'mix'}): "
              f"{per_call}")
        return 0
    if not args.no_load:
        print(f"loading TPC-C data: {tpcc_mysql.load(args)}", file=sys.stderr)
    home = tempfile.mkdtemp(prefix="qag-call-cost-")
    try:
        results = _measure(_layers(args, home)[0], args.rounds, args.calls)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    print(f"request-thread CPU per call, µs: median [min–max] of {args.rounds} interleaved rounds × {args.calls} "
          f"calls (TPC-C {args.query or 'mix'}, W={args.warehouses})")
    medians = {name: statistics.median(v) for name, v in results.items()}
    for name, v in results.items():
        print(f"  {name:8} {medians[name]:7.1f} [{min(v):.1f}–{max(v):.1f}]")
    print(f"  backend's own: {medians['backend'] - medians['driver']:.1f}   "
          f"pipeline's own: {medians['gateway'] - medians['backend']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
