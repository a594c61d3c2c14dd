"""Profile a target's workers under a benchmark case's load: py-spy (or perf) on every worker while wrk drives it.

    python -m benchmarks.profile --case tpcc --prefix qagw_ --warehouses 1 --no-load --target qag --seconds 15
    python -m benchmarks.profile --case tpcc --no-load --target qag --gil      # only the thread holding the GIL
    python -m benchmarks.profile --case tpcc --no-load --target qag --perf --pin gateway=0,db=1,load=1

Writes each worker's collapsed stacks (py-spy --format raw) to --dir and prints, over all workers, the functions
with the most samples on top of the stack (self) and on it at all (inclusive), and the share of samples per
thread state (py-spy --idle keeps waiting threads in, so "waiting" shows where threads block). Needs py-spy
(pip install py-spy) and permission to read the workers' memory (root, or ptrace allowed).

`--perf` samples with Linux perf instead: CPU time per shared object and C symbol, kernel included, so compiled
modules, the drivers and system calls show where py-spy sees only Python frames. `--pin` places the gateway, the
database and wrk as the benchmark harness does, so the profile is taken in the shape the figures are measured in.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading

from . import load, run, targets
from .workload import lua_config


def _parser() -> argparse.ArgumentParser:
    p = run.build_parser()
    p.prog = "python -m benchmarks.profile"
    p.description = __doc__.splitlines()[0]
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default 250)")
    p.add_argument("--gil", action="store_true", help="sample only the thread holding the GIL")
    p.add_argument("--idle", action="store_true", help="keep samples of idle (waiting) threads")
    p.add_argument("--dir", help="where the collapsed stacks go (default a new temporary folder)")
    p.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    p.add_argument("--perf", action="store_true", help="sample with perf (C symbols and kernel) instead of py-spy")
    p.set_defaults(seconds=15, warmup=3)
    return p


def worker_pids(master: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(master)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def record(pid: int, seconds: float, args, path: str) -> subprocess.Popen:
    cmd = ["py-spy", "record", "--pid", str(pid), "--rate", str(args.rate), "--duration", str(int(seconds)),
           "--format", "raw", "--output", path, "--nonblocking"]
    if args.gil:
        cmd.append("--gil")
    if args.idle:
        cmd.append("--idle")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_record(pids: list[int], seconds: float, args, path: str) -> subprocess.Popen:
    cmd = ["perf", "record", "-q", "--call-graph", "dwarf,16384", "-F", str(args.rate), "-o", path, "-p", ",".join(map(str, pids)),
           "--", "sleep", str(int(seconds))]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def perf_summary(path: str, top: int) -> str:
    """Share of samples per shared object and per symbol (self time), from perf's own report."""
    report = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "--sort", "dso,sym",
                             "--percent-limit", "0.3"], capture_output=True, text=True).stdout
    rows = [line for line in report.splitlines() if line.strip() and not line.startswith("#")]
    by_dso = subprocess.run(["perf", "report", "-i", path, "--stdio", "--no-children", "--sort", "dso"],
                            capture_output=True, text=True).stdout
    dsos = [line for line in by_dso.splitlines() if line.strip() and not line.startswith("#")]
    return "\n".join(["by shared object:"] + dsos[:top] + ["", "by symbol:"] + rows[:top])


def summarise(paths: list[str], top: int) -> str:
    """Self and inclusive sample counts per function over the collapsed-stack files."""
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    total = 0
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if not stack or not count.isdigit():
                    continue
                n = int(count)
                total += n
                frames = stack.split(";")
                own[frames[-1]] += n
                for frame in set(frames):
                    inclusive[frame] += n
    lines = [f"{total} samples over {len(paths)} worker(s)", "", "self %  function (file:line)"]
    lines += [f"{100 * n / max(total, 1):6.2f}  {frame}" for frame, n in own.most_common(top)]
    lines += ["", "incl %  function (file:line)"]
    lines += [f"{100 * n / max(total, 1):6.2f}  {frame}" for frame, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    tool = "perf" if args.perf else "py-spy"
    if shutil.which(tool) is None:
        print(f"{tool} is not installed" + ("" if args.perf else ": pip install py-spy"), file=sys.stderr)
        return 2
    out_dir = args.dir or tempfile.mkdtemp(prefix="qag-profile-")
    os.makedirs(out_dir, exist_ok=True)
    case = run.make_case((args.case or ["tpcc"])[0], args)
    spec = (args.target or ["qag"])[0]
    pin = run.parse_pin(args.pin)
    pinner = run.Pinner(pin.get("db"), case.db)
    target = targets.start(spec, pin.get("gateway"))
    try:
        target.keys = target.provision(case)
        key = target.keys.get("plain")
        config = os.path.join(out_dir, "load.lua")
        with open(config, "w") as fh:
            fh.write(lua_config(case, [q for q in case.queries if q.mixed], "uniform", key,
                                check=target.kind != "bare"))
        url = f"http://127.0.0.1:{target.port}"
        result: dict = {}
        driver = threading.Thread(target=lambda: result.update(
            load.wrk(url, config, args.callers, args.warmup + args.seconds + 2, args.wrk_threads, 0,
                     pin.get("load"))))
        driver.start()
        threading.Event().wait(args.warmup)
        pids = worker_pids(target.pid)
        if args.perf:
            paths = [os.path.join(out_dir, "perf.data")]
            spies = [perf_record(pids, args.seconds, args, paths[0])]
        else:
            paths = [os.path.join(out_dir, f"worker-{pid}.txt") for pid in pids]
            spies = [record(pid, args.seconds, args, path) for pid, path in zip(pids, paths)]
        for spy in spies:
            _, err = spy.communicate()
            if spy.returncode != 0:
                print(f"{tool} failed: {err.strip()[-500:]}", file=sys.stderr)
        driver.join()
    finally:
        target.stop()
        pinner.restore()
    print(f"{spec}: {result.get('requests', 0) / max(result.get('duration_us', 1) / 1e6, 1e-9):.0f} calls/s "
          f"during the profile, non-2xx {result.get('non2xx')}, bad {result.get('bad')}")
    if args.perf:
        print(perf_summary(paths[0], args.top))
        print(f"\nperf data: {paths[0]}")
    else:
        print(summarise([p for p in paths if os.path.exists(p)], args.top))
        print(f"\ncollapsed stacks: {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
