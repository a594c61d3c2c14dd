"""Run one load phase — wrk with benchmarks/lua/bench.lua, or the direct database client — and return its
numbers, with the load generator's own CPU (from wait4's rusage)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "lua", "bench.lua")


def _run(cmd: list[str], env: dict | None, timeout: float) -> tuple[str, str, float]:
    """stdout, stderr and the CPU seconds (user + system) the child used."""
    out = tempfile.TemporaryFile(mode="w+")
    err = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    return out.read(), err.read(), usage.ru_utime + usage.ru_stime


def _parse(stdout: str, stderr: str, what: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("QAGJSON "):
            return json.loads(line[len("QAGJSON "):])
    raise RuntimeError(f"{what} printed no result:\n{stdout[-2000:]}\n{stderr[-2000:]}")


def wrk(url: str, config_path: str, connections: int, seconds: float, threads: int = 1, rate: float = 0,
        pin: str | None = None) -> dict:
    """Closed loop (rate 0) or open loop at `rate` calls/s in total."""
    threads = max(1, min(threads, connections))
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{max(1, round(seconds))}s", "--timeout", "10s",
           "-s", SCRIPT, url, "--", config_path]
    env = dict(os.environ, QAG_BENCH_WRK_MODE="open" if rate else "closed")
    if rate:
        cmd.append(f"{rate / threads:.3f}")
    if pin:
        cmd = ["taskset", "-c", pin, *cmd]
    stdout, stderr, cpu = _run(cmd, env, seconds + 60)
    result = _parse(stdout, stderr, "wrk")
    result["load_cpu_s"] = cpu
    return result


def direct(command: list[str], pin: str | None = None) -> dict:
    if pin:
        command = ["taskset", "-c", pin, *command]
    stdout, stderr, cpu = _run(command, None, 600)
    result = _parse(stdout, stderr, "dbdirect")
    result["load_cpu_s"] = cpu
    return result
