"""Saved-query calls with the response cache off and on: python -m benchmarks.cache_calls.

Builds the SQLite demo home (in a temporary folder unless --home is given), then, in interleaved rounds (the
order of off/on alternates every round), measures the same call with its version's `cache_ttl` null (every call
runs the query) and 600 (every call after the first is a hit):

- in-process: process CPU per call through `Gateway.__call__` (no HTTP server), compiled twins when present;
- over HTTP: calls/s of `qag serve` (its default 2 workers x 8 threads) under wrk, closed loop.

Prints median [min-max] per mode. The TTL is switched through the management API between rounds, so both modes
run against the same server, store and data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from qag import _speedups, demo
from qag.app import create_app
from qag.testing import Client
from qag.settings import load

from .wsgi_call import wsgi_get

CALLS = {
    "customer (1 row, scoped key)": ("customer", "id=42", "scoped_key"),
    "orders_by_status (page of 100)": ("orders_by_status", "status=paid&page_size=100", "admin_key"),
}
_LISTENING = re.compile(r"Listening at: http://([\d.]+):(\d+)")
_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")


def set_ttl(call, name: str, ttl: int | None) -> None:
    call("PATCH", f"/api/v1/queries/{name}/versions/1", {"cache_ttl": ttl})


def in_process(home: str, keys: dict, rounds: int, calls: int) -> dict:
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"], "QAG_LOG_REQUESTS": "off"}))
    admin = Client(load({"QAG_HOME": home})).manage
    out = {}
    for label, (name, query, key_name) in CALLS.items():
        results: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(rounds):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                set_ttl(admin, name, 600 if mode == "on" else None)
                wsgi_get(app, f"/q/{name}", query, keys[key_name])   # the miss that fills the entry
                start = time.process_time()
                for _ in range(calls):
                    wsgi_get(app, f"/q/{name}", query, keys[key_name])
                results[mode].append((time.process_time() - start) / calls * 1e6)
        set_ttl(admin, name, None)
        out[label] = results
    return out


def _serve(home: str, admin_key: str, python: str = sys.executable, workers: int | None = None,
           extra: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`qag serve` of `python`'s qag on `home` (its default workers unless given; `extra` environment on top),
    and its base URL. Nothing of the caller's QAG_*, QUERYAPIGATE_* or OTEL_* environment reaches it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_", "OTEL_"))}
    env.update({"QAG_HOME": home, "QAG_API_KEY": admin_key, "QAG_BIND": "127.0.0.1:0", "QAG_ACCESS_LOG": "off",
                "QAG_LOG_REQUESTS": "off"})
    if workers is not None:
        env["QAG_WORKERS"] = str(workers)
    env.update(extra or {})
    proc = subprocess.Popen([python, "-m", "qag", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=home)
    found: list[str] = []
    ready = threading.Event()
    proc.log = []

    def pump():
        for line in proc.stdout:
            proc.log.append(line)
            m = _LISTENING.search(line)
            if m and not found:
                found.append(f"http://{m.group(1)}:{m.group(2)}")
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(60)
    if not found:
        proc.kill()
        raise RuntimeError("qag serve did not start:\n" + "".join(proc.log[-40:]))
    return proc, found[0]


def _patch(base: str, admin_key: str, name: str, ttl: int | None) -> None:
    request = urllib.request.Request(f"{base}/api/v1/queries/{name}/versions/1", method="PATCH",
                                     data=json.dumps({"cache_ttl": ttl}).encode(),
                                     headers={"X-API-Key": admin_key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert reply.status == 200


def _wrk(url: str, key: str, connections: int, seconds: int) -> float:
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-H", f"X-API-Key: {key}", url],
                          capture_output=True, text=True, timeout=seconds + 60)
    if "Non-2xx" in done.stdout:
        raise RuntimeError("non-2xx replies:\n" + done.stdout)
    return float(_RPS.search(done.stdout).group(1))


def _prepare_elsewhere(home: str, python: str = sys.executable) -> dict:
    """The demo home built by a child process: this process never opens a store the server uses (two stores of
    one file in one process, one opened while the other is live, lose SQLite's POSIX locks, and the server's
    processes then write over a WAL this process still maps - a malformed store)."""
    # A ref from before qag.testing (benchmarks.host_cache --before 9e99e28) manages through the CLI's _Admin.
    code = ("import json, sys\nfrom qag import demo\nfrom qag.settings import load\nh = sys.argv[1]\n"
            "try:\n    from qag.testing import Client\n    call = Client(load({'QAG_HOME': h})).manage\n"
            "except ImportError:\n    from qag.cli import _Admin\n    call = _Admin(load({'QAG_HOME': h})).call\n"
            "print(json.dumps(demo.prepare_home(h, False, call)))")
    done = subprocess.run([python, "-c", code, home], capture_output=True, text=True, check=True, cwd=home)
    return json.loads(done.stdout.strip().splitlines()[-1])


def over_http(rounds: int, seconds: int, connections: int) -> dict:
    home = tempfile.mkdtemp(prefix="qag-bench-http-")
    keys = _prepare_elsewhere(home)
    proc, base = _serve(home, keys["admin_key"])
    out = {}
    try:
        for label, (name, query, key_name) in CALLS.items():
            results: dict[str, list[float]] = {"off": [], "on": []}
            url = f"{base}/q/{name}?{query}"
            for r in range(rounds):
                for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                    _patch(base, keys["admin_key"], name, 600 if mode == "on" else None)
                    _wrk(url, keys[key_name], connections, 1)               # warm-up (and the filling miss)
                    results[mode].append(_wrk(url, keys[key_name], connections, seconds))
            _patch(base, keys["admin_key"], name, None)
            out[label] = results
    except Exception:
        sys.stderr.write("".join(proc.log[-40:]))
        raise
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(home, ignore_errors=True)
    return out


def _cells(results: dict[str, list[float]], fmt: str) -> str:
    return "   ".join(f"cache {mode}: {statistics.median(v):{fmt}} [{min(v):{fmt}}–{max(v):{fmt}}]"
                      for mode, v in results.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="demo home to use (default: a fresh temporary one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="in-process calls per round and mode")
    parser.add_argument("--seconds", type=int, default=5, help="wrk seconds per round and mode")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="qag-bench-")
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home})).manage)
    print(f"in-process CPU per call, µs: median [min–max] of {args.rounds} interleaved rounds x {args.calls} calls")
    for label, results in in_process(home, keys, args.rounds, args.calls).items():
        print(f"  {label:34} {_cells(results, '.1f')}")
    if not args.skip_http:
        print(f"over HTTP (qag serve, wrk -t1 -c{args.connections}), calls/s: median [min–max] of {args.rounds} "
              f"interleaved rounds x {args.seconds} s")
        for label, results in over_http(args.rounds, args.seconds, args.connections).items():
            print(f"  {label:34} {_cells(results, '.0f')}")
    print(json.dumps({"python": sys.version.split()[0], "loaded": _speedups.choices(), "home": home}))


if __name__ == "__main__":
    main()
