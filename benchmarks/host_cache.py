"""A cached saved query over HTTP, two git refs side by side: python -m benchmarks.host_cache --before REF --after REF.

Each ref is checked out in a temporary git worktree and served by `qag serve` from it (PYTHONPATH; the compiled
twins of this checkout are copied in), with 1 and 2 workers: four servers, each on its own demo home with the
`customer` call's version at `cache_ttl` 600 (so every call after the first is a hit). In interleaved rounds (the
order of the servers reversed every other round) wrk drives each server for --seconds, and the workers' CPU (the
master's process tree, less the master) is read around it. Prints worker CPU µs per call and calls/s, median
[min-max] per server.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import re
import statistics
import subprocess
import sys
import tempfile
import threading

from .cache_calls import CALLS, _patch, _prepare_elsewhere, _wrk
from .measure import _stat, loadavg, tree_cpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _worktree(ref: str) -> str:
    path = tempfile.mkdtemp(prefix="qag-bench-ref-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", path, ref], check=True)
    for built in glob.glob(os.path.join(ROOT, "qag", "_speedups", "*.so")):
        shutil.copy(built, os.path.join(path, "qag", "_speedups"))
    return path


def _serve(home: str, admin_key: str, tree: str, workers: int) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    env.update({"QAG_HOME": home, "QAG_API_KEY": admin_key, "QAG_BIND": "127.0.0.1:0", "QAG_ACCESS_LOG": "off",
                "QAG_LOG_REQUESTS": "off", "QAG_WORKERS": str(workers), "PYTHONPATH": tree})
    proc = subprocess.Popen([sys.executable, "-m", "qag", "serve"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=home)
    found: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            m = re.search(r"Listening at: (http://[\d.]+:\d+)", line)
            if m and not found:
                found.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(60)
    if not found:
        proc.kill()
        raise RuntimeError("qag serve did not start")
    return proc, found[0]


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
    args = parser.parse_args()
    name, query, key_name = CALLS["customer (1 row, scoped key)"]
    trees = {ref: _worktree(ref) for ref in (args.before, args.after)}
    servers, homes = {}, []
    try:
        for ref, tree in trees.items():
            for workers in (1, 2):
                home = tempfile.mkdtemp(prefix="qag-bench-host-")
                homes.append(home)
                os.environ["PYTHONPATH"] = tree  # the demo home built by the ref's own code (its store schema)
                keys = _prepare_elsewhere(home)
                proc, base = _serve(home, keys["admin_key"], tree, workers)
                _patch(base, keys["admin_key"], name, 600)
                servers[(ref, workers)] = (proc, f"{base}/q/{name}?{query}", keys[key_name])
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
        print(f"cached customer call, wrk -t1 -c{args.connections}: median [min–max] of {args.rounds} interleaved "
              f"rounds x {args.seconds} s (load average at the end {loadavg():.1f})")
        for (ref, workers), res in results.items():
            cpu, rps = res["cpu"], res["rps"]
            print(f"  {ref:>10} {workers} worker(s): worker CPU µs/call {statistics.median(cpu):.1f} "
                  f"[{min(cpu):.1f}–{max(cpu):.1f}]   calls/s {statistics.median(rps):.0f} [{min(rps):.0f}–{max(rps):.0f}]")
        print(json.dumps({"python": sys.version.split()[0], "results": {f"{k[0]}/{k[1]}": v for k, v in results.items()}}))
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        for tree in trees.values():
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False)
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
