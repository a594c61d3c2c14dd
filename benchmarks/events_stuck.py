"""Calls while GET /events streams are open, one of them stuck: python -m benchmarks.events_stuck.

One `qag serve` of this checkout (its default 2 workers) on a demo home. In interleaved rounds (the order of the
modes rotated every round) wrk drives the demo's `customer` call for --seconds with --connections callers, under
three modes:

- `none`: no stream open (a run publishes nothing: one shared-memory load);
- `reading`: one administrator's stream whose client reads everything (every run goes into the host's ring and
  out to the stream);
- `stuck`: the same reading stream plus one whose client never reads (its stream's thread blocks once its bounded
  send buffer is full, and the stream is ended when the ring laps it; a new stuck client is opened every round).

Prints the calls' p50 and p99 latency (wrk's) and calls/s, median [min-max] per mode, and how many events the
reading client received against the calls made.
"""

from __future__ import annotations

import argparse
import http.client
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading

from .cache_calls import _prepare_elsewhere, _serve

_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_RPS = re.compile(r"Requests/sec:\s+([\d.]+)")
_UNIT = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk(url: str, key: str, connections: int, seconds: int) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, calls/s) of one wrk run."""
    done = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-H", f"X-API-Key: {key}",
                           url], capture_output=True, text=True, timeout=seconds + 60)
    if "Non-2xx" in done.stdout:
        raise RuntimeError("non-2xx replies:\n" + done.stdout)
    latency = {p: float(v) * _UNIT[u] for p, v, u in _LATENCY.findall(done.stdout)}
    return latency["50"], latency["99"], float(_RPS.search(done.stdout).group(1))


class _Reader:
    """An administrator's stream read to the end on a thread, counting `data:` frames."""

    def __init__(self, host: str, port: int, key: str):
        self.conn = http.client.HTTPConnection(host, port, timeout=120)
        self.conn.request("GET", "/events", headers={"X-API-Key": key})
        self.response = self.conn.getresponse()
        assert self.response.status == 200, self.response.status
        self.events = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for line in iter(self.response.readline, b""):
                if line.startswith(b"data: "):
                    self.events += 1
        except Exception:  # noqa: BLE001 - closed by close()
            pass

    def close(self) -> None:
        self.conn.close()


def _stuck(host: str, port: int, key: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, port))
    sock.sendall(f"GET /events HTTP/1.1\r\nHost: bench\r\nX-API-Key: {key}\r\n\r\n".encode())
    return sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--connections", type=int, default=8)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="qag-bench-events-")
    keys = _prepare_elsewhere(home)
    admin = keys["admin_key"]
    proc, base = _serve(home, admin, sys.executable, 2)
    host, port = base.split("//")[1].split(":")
    port = int(port)
    url = f"{base}/q/customer?id=42"
    modes = ["none", "reading", "stuck"]
    results = {m: {"p50": [], "p99": [], "rps": []} for m in modes}
    calls = received = 0
    try:
        for r in range(args.rounds):
            for mode in modes[r % 3:] + modes[:r % 3]:
                opened: list = []
                reader = None
                if mode != "none":
                    reader = _Reader(host, port, admin)
                if mode == "stuck":
                    opened.append(_stuck(host, port, admin))
                _wrk(url, keys["scoped_key"], args.connections, 1)   # warm-up
                p50, p99, rps = _wrk(url, keys["scoped_key"], args.connections, args.seconds)
                results[mode]["p50"].append(p50)
                results[mode]["p99"].append(p99)
                results[mode]["rps"].append(rps)
                if reader is not None:
                    calls += int(rps * args.seconds)
                    received += reader.events
                    reader.close()
                for sock in opened:
                    sock.close()
        print(f"customer call, wrk -t1 -c{args.connections} --latency, 2 workers: median [min-max] of "
              f"{args.rounds} interleaved rounds x {args.seconds} s")
        for mode, res in results.items():
            line = "  ".join(f"{name} {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
                             for name, v in res.items())
            print(f"  {mode:>8}: {line}   (p50/p99 in ms)")
        print(f"  the reading client received {received} events for about {calls} calls made while it read "
              f"(wrk's calls/s x seconds, the warm-up's calls not counted)")
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
