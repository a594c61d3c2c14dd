"""What OpenTelemetry tracing (QAG_OTEL) costs a saved-query call: python -m benchmarks.tracing_calls.

Side by side in interleaved rounds (the order of the modes rotates every round), median [min–max]:

  base  (with --base DIR) the same calls on another qag source tree, e.g. `git archive HEAD` unpacked: the code
        before tracing existed, to show what tracing off costs against no tracing code at all
  off   this tree, QAG_OTEL=off (the default while no OTLP endpoint is set)
  on    this tree, QAG_OTEL=on: every request sampled, a span per request and per stage, exported over OTLP/HTTP
        to a receiver in this process that answers 200 at once
  on N% (with --ratio R) the same with OTEL_TRACES_SAMPLER=parentbased_traceidratio and R: what an unsampled
        request costs, plus the sampled share

- in-process: CPU per call through `Gateway.__call__` (no HTTP server), the demo's `customer` and
  `orders_by_status` calls, each round and mode in a fresh child process (so nothing of one mode's imports or
  threads is in another's figures): the process's CPU (with every background thread: history writer, and the
  SDK's exporter, an `on` round ending with a flush of its spans inside the timed loop) and the request thread's
  own (time.thread_time).
- over HTTP (unless --skip-http): `qag serve` (--workers, default 1, x 8 threads) under wrk, one server per mode
  started side by side, rounds alternating between them: calls/s, and the server's CPU per call (its processes'
  user + system time over the run, /proc, divided by the calls wrk counted). One worker by default: with two,
  how wrk's connections happen to spread over them decides calls/s more than the code does.

QAG_SPEEDUPS is passed through to every child and server (use `off` when the compiled build is older than the
source, so every mode runs the same pure twins).
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading

from .cache_calls import _serve as cache_serve

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CALLS = {
    "customer (1 row, scoped key)": ("/q/customer", "id={n}", 5000, "scoped_key"),
    "orders_by_status (page of 100)": ("/q/orders_by_status", "status=paid&page_size=100&page={n}", 20, "admin_key"),
}
_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
_REQUESTS = re.compile(r"(\d+) requests in")
_TICK = os.sysconf("SC_CLK_TCK")

# The child of one round and mode: the calls through the WSGI app in-process, CPU per call (µs) as JSON. It uses
# nothing but qag's own API, so it runs against any qag tree on its PYTHONPATH.
_CHILD = r"""
import io, json, os, sys, time
from qag.app import create_app
from qag.settings import load
home, keys, calls, n = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
app = create_app(load({**os.environ, "QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}))
tracing = getattr(app, "tracing", None)

def get(path, query, key):
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "REMOTE_ADDR": "127.0.0.1",
               "RAW_URI": f"{path}?{query}", "wsgi.input": io.BytesIO(b""), "HTTP_X_API_KEY": key}
    status = []
    b"".join(app(environ, lambda s, h: status.append(s)))
    assert status[0].startswith("200"), status

out = {}
for label, (path, query, spread, key_name) in calls.items():
    for i in range(n // 5):   # warm-up: caches, pools, the exporter's connection
        get(path, query.format(n=i % spread + 1), keys[key_name])
    if tracing is not None:
        tracing.flush()
    start, thread = time.process_time(), time.thread_time()
    for i in range(n):
        get(path, query.format(n=i % spread + 1), keys[key_name])
    request_thread = time.thread_time() - thread
    if tracing is not None:
        tracing.flush()   # the spans of these calls are exported inside the timed loop
    out[label] = [(time.process_time() - start) / n * 1e6, request_thread / n * 1e6]
app.close()
print(json.dumps(out))
"""


class Sink:
    """An OTLP/HTTP receiver that reads each export and answers 200 with an empty ExportTraceServiceResponse."""

    def __init__(self):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, as a collector does

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _env(tree: str, extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_", "OTEL_"))}
    env["PYTHONPATH"] = tree
    if "QAG_SPEEDUPS" in os.environ:
        env["QAG_SPEEDUPS"] = os.environ["QAG_SPEEDUPS"]
    env.update(extra)
    return env


def _prepare(tree: str) -> tuple[str, dict]:
    """A demo home made by `tree`'s own qag (each tree migrates its store to its own schema)."""
    home = tempfile.mkdtemp(prefix="qag-bench-tracing-")
    code = ("import json, sys; from qag import demo; from qag.testing import Client; from qag.settings import load; "
            "h = sys.argv[1]; print(json.dumps(demo.prepare_home(h, False, Client(load({'QAG_HOME': h})).manage)))")
    done = subprocess.run([sys.executable, "-c", code, home], capture_output=True, text=True, check=True, cwd=home,
                          env=_env(tree, {}))
    return home, json.loads(done.stdout.strip().splitlines()[-1])


def _modes(base: str | None, sink: Sink, ratio: float | None) -> dict[str, tuple[str, dict]]:
    on = {"QAG_OTEL": "on", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_SERVICE_NAME": "qag-bench"}
    modes = {"off": (REPO, {"QAG_OTEL": "off"}), "on": (REPO, on)}
    if ratio is not None:
        modes[f"on {ratio * 100:g}%"] = (REPO, {**on, "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                                               "OTEL_TRACES_SAMPLER_ARG": str(ratio)})
    if base:
        modes = {"base": (os.path.abspath(base), {}), **modes}
    return modes


def in_process(modes: dict, rounds: int, calls: int) -> tuple[dict, dict]:
    homes = {}
    for tree in {tree for tree, _ in modes.values()}:
        homes[tree] = _prepare(tree)
    results = {label: {mode: [] for mode in modes} for label in CALLS}
    threads = {label: {mode: [] for mode in modes} for label in CALLS}
    names = list(modes)
    try:
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for mode in order:
                tree, extra = modes[mode]
                home, keys = homes[tree]
                done = subprocess.run([sys.executable, "-c", _CHILD, home, json.dumps(keys), json.dumps(CALLS),
                                       str(calls)], capture_output=True, text=True, cwd=home, env=_env(tree, extra))
                if done.returncode != 0:
                    raise RuntimeError(f"{mode} round failed:\n{done.stderr[-4000:]}")
                for label, (process, thread) in json.loads(done.stdout.strip().splitlines()[-1]).items():
                    results[label][mode].append(process)
                    threads[label][mode].append(thread)
    finally:
        for home, _ in homes.values():
            shutil.rmtree(home, ignore_errors=True)
    return results, threads


def _serve(tree: str, home: str, admin_key: str, extra: dict, workers: int) -> tuple[subprocess.Popen, str]:
    """`tree`'s qag serving `home` (cache_calls' server, with that tree first on the path)."""
    own = {"PYTHONPATH": tree, "QAG_THREADS": "8"}
    if "QAG_SPEEDUPS" in os.environ:
        own["QAG_SPEEDUPS"] = os.environ["QAG_SPEEDUPS"]
    return cache_serve(home, admin_key, sys.executable, workers, {**own, **extra})


def _server_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) of a gunicorn master and its workers so far."""
    total = 0
    for p in [str(pid)] + subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / _TICK


def _wrk(url: str, key: str, connections: int, seconds: int, pid: int | None = None) -> tuple[float, float]:
    """(calls/s, server CPU µs per call: measured when the server's pid is given)."""
    before = _server_cpu(pid) if pid else 0.0
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-H", f"X-API-Key: {key}", url],
                          capture_output=True, text=True, timeout=seconds + 60)
    cpu = _server_cpu(pid) - before if pid else 0.0
    if "Non-2xx" in done.stdout:
        raise RuntimeError("non-2xx replies:\n" + done.stdout)
    calls = int(_REQUESTS.search(done.stdout).group(1))
    return float(_RPS.search(done.stdout).group(1)), cpu / max(calls, 1) * 1e6


def over_http(modes: dict, rounds: int, seconds: int, connections: int, workers: int) -> tuple[dict, dict]:
    servers, homes = {}, []
    results = {label: {mode: [] for mode in modes} for label in CALLS}
    cpu = {label: {mode: [] for mode in modes} for label in CALLS}
    names = list(modes)
    try:
        for mode, (tree, extra) in modes.items():
            home, keys = _prepare(tree)
            homes.append(home)
            servers[mode] = (*_serve(tree, home, keys["admin_key"], extra, workers), keys)
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for label, (path, query, _, key_name) in CALLS.items():
                for mode in order:
                    proc, base, keys = servers[mode]
                    url = f"{base}{path}?{query.format(n=1)}"
                    _wrk(url, keys[key_name], connections, 1)   # warm-up
                    rps, us = _wrk(url, keys[key_name], connections, seconds, proc.pid)
                    results[label][mode].append(rps)
                    cpu[label][mode].append(us)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)
    return results, cpu


def _cells(results: dict[str, list[float]], fmt: str) -> str:
    return "   ".join(f"{mode}: {statistics.median(v):{fmt}} [{min(v):{fmt}}–{max(v):{fmt}}]"
                      for mode, v in results.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="another qag source tree to measure as 'base' (e.g. git archive HEAD)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="in-process calls per round, mode and call")
    parser.add_argument("--seconds", type=int, default=5, help="wrk seconds per round, mode and call")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--workers", type=int, default=1, help="qag serve workers (8 threads each)")
    parser.add_argument("--ratio", type=float, help="also measure tracing on with this sampling ratio (0-1)")
    parser.add_argument("--skip-http", action="store_true")
    parser.add_argument("--skip-in-process", action="store_true")
    args = parser.parse_args()
    sink = Sink()
    try:
        modes = _modes(args.base, sink, args.ratio)
        if not args.skip_in_process:
            process, thread = in_process(modes, args.rounds, args.calls)
            print(f"in-process CPU per call, µs: median [min–max] of {args.rounds} interleaved rounds x {args.calls} "
                  f"calls (QAG_SPEEDUPS={os.environ.get('QAG_SPEEDUPS', 'auto')})")
            for label, results in process.items():
                print(f"  process         {label:32} {_cells(results, '.1f')}")
            for label, results in thread.items():
                print(f"  request thread  {label:32} {_cells(results, '.1f')}")
        if not args.skip_http:
            rps, cpu = over_http(modes, args.rounds, args.seconds, args.connections, args.workers)
            print(f"over HTTP (qag serve {args.workers}x8, wrk -t1 -c{args.connections}): median [min–max] of "
                  f"{args.rounds} interleaved rounds x {args.seconds} s")
            for label, results in cpu.items():
                print(f"  server CPU µs/call  {label:32} {_cells(results, '.0f')}")
            for label, results in rps.items():
                print(f"  calls/s             {label:32} {_cells(results, '.0f')}")
    finally:
        sink.close()
    print(json.dumps({"python": sys.version.split()[0], "base": args.base}))


if __name__ == "__main__":
    main()
