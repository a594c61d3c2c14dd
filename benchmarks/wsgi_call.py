"""CPU per call of the WSGI app in-process (no HTTP server): python -m benchmarks.wsgi_call.

Builds the demo home once (in a temporary folder unless --home is given), then times saved-query calls
through `Gateway.__call__` in a pure process (QAG_SPEEDUPS=off) and a compiled one (QAG_SPEEDUPS=require, when
every build is current) in interleaved rounds, each round a fresh child process (a process runs compiled or pure
as a whole: qag/_speedups), and prints the median process CPU per call with its min–max range. `--compare cache`
instead compares, in this process, the metadata cache on (the default TTL) and off (QAG_METADATA_CACHE_TTL=0).
It measures qag's own work per call — parsing, auth, store reads, checks, the SQLite call, encoding — not
gunicorn's HTTP handling.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from qag import _speedups, demo
from qag.app import create_app
from qag.testing import Client
from qag.settings import load

CALLS = {
    "customer (1 row, scoped key)": ("/q/customer", lambda i: f"id={i % 5000 + 1}", "scoped_key"),
    "orders_by_status (page of 100)": ("/q/orders_by_status", lambda i: f"status=paid&page_size=100&page={i % 20 + 1}",
                                       "admin_key"),
}


def wsgi_get(app, path: str, query: str, key: str) -> None:
    """One GET through the WSGI app in-process, as a server would call it; it must answer 200."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": query, "REMOTE_ADDR": "127.0.0.1",
               "RAW_URI": f"{path}?{query}", "wsgi.input": io.BytesIO(b""), "HTTP_X_API_KEY": key}
    status = []
    b"".join(app(environ, lambda s, h: status.append(s)))
    assert status[0].startswith("200"), status


def timed_calls(app, keys: dict, calls: int) -> dict[str, float]:
    """{call label: process CPU µs per call} over `calls` calls of each (after one call that warms it)."""
    out = {}
    for label, (path, make_query, key_name) in CALLS.items():
        wsgi_get(app, path, make_query(0), keys[key_name])
        start = time.process_time()
        for i in range(calls):
            wsgi_get(app, path, make_query(i), keys[key_name])
        out[label] = (time.process_time() - start) / calls * 1e6
    return out


def in_child(home: str, keys: dict, calls: int, mode: str) -> dict[str, float]:
    """timed_calls() in a fresh process under QAG_SPEEDUPS=mode."""
    out = subprocess.run([sys.executable, "-m", "benchmarks.wsgi_call", "--home", home, "--calls", str(calls),
                          "--child", json.dumps(keys)], env=dict(os.environ, QAG_SPEEDUPS=mode),
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="demo home to use (default: a fresh temporary one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and twin")
    parser.add_argument("--compare", choices=("twins", "cache"), default="twins")
    parser.add_argument("--child", help=argparse.SUPPRESS)   # the keys: time the calls in this process, print JSON
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="qag-bench-")
    if args.child:
        keys = json.loads(args.child)
        app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}))
        print(json.dumps(timed_calls(app, keys, args.calls)))
        return
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home})).manage)
    env = {"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}
    if args.compare == "cache":
        apps = {"cache on": create_app(load(env)),
                "cache off": create_app(load(dict(env, QAG_METADATA_CACHE_TTL="0")))}
        sides = list(apps)
    else:
        apps = {}
        sides = ["pure"] + (["compiled"] if not _speedups.builds() else [])
    print(f"qag in-process CPU per call, µs: median [min–max] of {args.rounds} interleaved rounds "
          f"x {args.calls} calls (home {home})")
    results: dict[str, dict[str, list[float]]] = {label: {side: [] for side in sides} for label in CALLS}
    for r in range(args.rounds):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            if apps:
                figures = timed_calls(apps[side], keys, args.calls)
            else:
                figures = in_child(home, keys, args.calls, "off" if side == "pure" else "require")
            for label, micros in figures.items():
                results[label][side].append(micros)
    for label, by_side in results.items():
        cells = [f"{t}: {statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]" for t, v in by_side.items()]
        print(f"  {label:34} " + "   ".join(cells))
    print(json.dumps({"python": sys.version.split()[0], "mode": _speedups.mode(), "loaded": _speedups.choices()}))


if __name__ == "__main__":
    main()
