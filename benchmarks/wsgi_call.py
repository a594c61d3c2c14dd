"""CPU per call of the WSGI app in-process (no HTTP server): python -m benchmarks.wsgi_call.

Builds the demo home once (in a temporary folder unless --home is given), then times saved-query calls
through `Gateway.__call__` with the pure and the compiled twins in interleaved rounds, and prints the median
process CPU per call with its min–max range. `--compare cache` instead compares the metadata cache on (the
default TTL) and off (QAG_METADATA_CACHE_TTL=0), both with the twins QAG_SPEEDUPS selects. It measures qag's own work per call — parsing, auth, store
reads, checks, the SQLite call, encoding — not gunicorn's HTTP handling.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", help="demo home to use (default: a fresh temporary one)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000, help="calls per round and twin")
    parser.add_argument("--compare", choices=("twins", "cache"), default="twins")
    args = parser.parse_args()
    home = args.home or tempfile.mkdtemp(prefix="qag-bench-")
    keys = demo.prepare_home(home, False, Client(load({"QAG_HOME": home})).manage)
    env = {"QAG_HOME": home, "QAG_API_KEY": keys["admin_key"]}
    app = create_app(load(env))
    if args.compare == "cache":
        apps = {"cache on": app, "cache off": create_app(load(dict(env, QAG_METADATA_CACHE_TTL="0")))}
        twins = list(apps)
    else:
        apps = {}
        twins = ["pure"] + (["compiled"] if "rowjson" not in _speedups.fallbacks() else [])
    selected = _speedups.mode()

    print(f"qag in-process CPU per call, µs: median [min–max] of {args.rounds} interleaved rounds "
          f"x {args.calls} calls (home {home})")
    for label, (path, make_query, key_name) in CALLS.items():
        results: dict[str, list[float]] = {t: [] for t in twins}
        for r in range(args.rounds):
            for twin in (twins if r % 2 == 0 else twins[::-1]):
                target = apps.get(twin, app)
                _speedups.load(selected if apps else "off" if twin == "pure" else "require")
                start = time.process_time()
                for i in range(args.calls):
                    wsgi_get(target, path, make_query(i), keys[key_name])
                results[twin].append((time.process_time() - start) / args.calls * 1e6)
        cells = [f"{t}: {statistics.median(v):.1f} [{min(v):.1f}–{max(v):.1f}]" for t, v in results.items()]
        print(f"  {label:34} " + "   ".join(cells))
    print(json.dumps({"python": os.sys.version.split()[0], "loaded": _speedups.loaded()}))


if __name__ == "__main__":
    main()
