"""Host-wide state's cost over HTTP, two git refs side by side: python -m benchmarks.host_cache --before REF --after REF.

Each ref is installed in a virtual environment of its own, every module it compiles compiled (benchmarks.refs,
built once per commit), and served by that environment's `qag serve` with 1 and 2 workers: four servers, each on
its own demo home made by the ref's own code. --call picks
what every call is:

- `cached`: the `customer` call with its version at `cache_ttl` 600 (every call after the first is a hit);
- `governed`: the `customer` call (no cache) by a key with a rate limit, `max_concurrent` and a call quota, each
  far above what a run reaches, so every call passes through the bucket, a slot and a quota reservation and none
  is refused.

In interleaved rounds (the order of the servers reversed every other round) wrk drives each server for --seconds,
and the workers' CPU (the master's process tree, less the master) is read around it. Prints worker CPU µs per
call and calls/s, median [min-max] per server.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import urllib.request

from .cache_calls import CALLS, _patch, _prepare_elsewhere, _serve, _wrk
from .measure import _stat, loadavg, tree_cpu
from .refs import venv_python


def _governed_key(base: str, admin_key: str) -> str:
    """A key scoped as the demo's, with a bucket, slots and a quota that never refuse in a run."""
    request = urllib.request.Request(
        f"{base}/api/v1/api-keys", method="POST",
        data=json.dumps({"name": "governed", "rate_limit": "100000000/minute", "max_concurrent": 1000,
                         "quota": {"calls": 100_000_000, "per": "day"}}).encode(),
        headers={"X-API-Key": admin_key, "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())["secret"]


def _worker_cpu(master: int) -> float:
    own = _stat(master)
    return tree_cpu(master) - (own[1] / os.sysconf("SC_CLK_TCK") if own else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--call", choices=("cached", "governed"), default="cached")
    args = parser.parse_args()
    name, query, key_name = CALLS["customer (1 row, scoped key)"]
    pythons = {ref: venv_python(ref) for ref in (args.before, args.after)}
    servers, homes = {}, []
    try:
        for ref, python in pythons.items():
            for workers in (1, 2):
                home = tempfile.mkdtemp(prefix="qag-bench-host-")
                homes.append(home)
                keys = _prepare_elsewhere(home, python)
                proc, base = _serve(home, keys["admin_key"], python, workers)
                if args.call == "cached":
                    _patch(base, keys["admin_key"], name, 600)
                    key = keys[key_name]
                else:
                    key = _governed_key(base, keys["admin_key"])
                servers[(ref, workers)] = (proc, f"{base}/q/{name}?{query}", key)
        results = {label: {"cpu": [], "rps": []} for label in servers}
        for r in range(args.rounds):
            for label in (list(servers) if r % 2 == 0 else list(reversed(servers))):
                proc, url, key = servers[label]
                _wrk(url, key, args.connections, 1)              # warm-up, and the miss that fills the entry
                before = _worker_cpu(proc.pid)
                rps = _wrk(url, key, args.connections, args.seconds)
                cpu = _worker_cpu(proc.pid) - before
                results[label]["cpu"].append(cpu / (rps * args.seconds) * 1e6)
                results[label]["rps"].append(rps)
        print(f"{args.call} customer call, wrk -t1 -c{args.connections}: median [min–max] of {args.rounds} interleaved "
              f"rounds x {args.seconds} s (load average at the end {loadavg():.1f})")
        for (ref, workers), res in results.items():
            cpu, rps = res["cpu"], res["rps"]
            print(f"  {ref:>10} {workers} worker(s): worker CPU µs/call {statistics.median(cpu):.1f} "
                  f"[{min(cpu):.1f}–{max(cpu):.1f}]   calls/s {statistics.median(rps):.0f} [{min(rps):.0f}–{max(rps):.0f}]")
        print(json.dumps({"call": args.call, "python": sys.version.split()[0], "results": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}))
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
