"""Tables from the harness's JSON lines: medians with min–max over rounds, and ratios that count only when the
ranges don't overlap.

    python -m benchmarks.report benchmarks/results/<run>.jsonl [--run ID]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict


def load(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


class Stat:
    """Median [min–max] of one figure over rounds."""

    def __init__(self, values):
        self.values = [v for v in values if v is not None]

    def __bool__(self) -> bool:
        return bool(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    def overlaps(self, other: "Stat") -> bool:
        return not (max(self.values) < min(other.values) or max(other.values) < min(self.values))

    def fmt(self, scale: float = 1.0, digits: int = 0) -> str:
        if not self.values:
            return "–"
        f = f"{{:.{digits}f}}"
        lo, mid, hi = (f.format(v * scale) for v in (min(self.values), self.median, max(self.values)))
        return f"{mid} [{lo}–{hi}]" if len(self.values) > 1 else mid


def _ratio(a: Stat, b: Stat) -> str:
    if not a or not b or not b.median:
        return "–"
    r = a.median / b.median
    return f"{r:.2f}×" + ("" if not a.overlaps(b) else " (ranges overlap)")


def _lat(blocks: list[dict], field: str, pct: str, digits: int) -> str:
    """Median [min–max] in ms of one latency percentile (stored in µs)."""
    return Stat((b.get(field) or {}).get(pct) for b in blocks).fmt(1e-3, digits)


def render(records: list[dict], run: str | None = None) -> str:
    if run is None:
        runs = [r["run"] for r in records if r.get("type") == "run"]
        run = runs[-1] if runs else None
    recs = [r for r in records if r.get("run") == run]
    head = next((r for r in recs if r.get("type") == "run"), {})
    m = head.get("machine", {})
    out = [f"# Benchmark run {run}", "",
           f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, kernel {m.get('kernel', '?')}, "
           f"Python {m.get('python', '?')}, {m.get('wrk', '')}, MySQL {m.get('mysql', '?')}, "
           f"PostgreSQL {m.get('postgres', '?')}.", "",
           f"Command: `python -m benchmarks.run {' '.join(head.get('argv', []))}`", ""]
    targets_meta = {(r["case"], r["target"]): r for r in recs if r.get("type") == "target"}
    blocks = [r for r in recs if r.get("type") == "block"]
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for b in blocks:
        groups[(b["case"], b["workload"], b["key"], b["distribution"], b["phase"], b.get("pct"))][b["target"]].append(b)
    order = {"plain": 0, "governed": 1}
    cases = sorted({(k[0], k[1], k[2], k[3]) for k in groups},
                   key=lambda c: (c[0], c[1], order.get(c[2], 2), c[2], c[3]))
    for case, wl, key, dist in cases:
        closed = groups.get((case, wl, key, dist, "closed", None), {})
        if not closed:
            continue
        names = list(closed)
        base = next((n for n in names if closed[n][0]["target_kind"] == "qag"), names[0])
        rounds = max(len(v) for v in closed.values())
        out += [f"## {case} / {wl} / {key} key / {dist} users", "",
                f"Closed loop, {closed[base][0]['callers']} callers, {rounds} interleaved rounds; median [min–max]. "
                f"Ratios are the row ÷ {base}; a ratio counts only when the ranges don't "
                "overlap.", "",
                "| target | calls/s | ratio | p50 ms | p99 ms | gateway CPU µs/call | ratio | DB CPU µs/call | "
                "load-gen µs/call | statements/call | non-2xx | bad/checked | load avg |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        base_rps = Stat(b["rps"] for b in closed[base])
        base_cpu = Stat(b["cpu_per_call"]["gateway_us"] for b in closed[base])
        for n in names:
            bs = closed[n]
            rps = Stat(b["rps"] for b in bs)
            cpu = Stat(b["cpu_per_call"]["gateway_us"] for b in bs)
            stm = bs[0].get("statements_per_call") or {}
            stm_key = "questions" if "questions" in stm else ("statements" if "statements" in stm else
                                                             ("xacts" if "xacts" in stm else None))
            stmts = Stat(b.get("statements_per_call", {}).get(stm_key) for b in bs) if stm_key else Stat([])
            ratio_cpu = _ratio(cpu, base_cpu) if n != base and cpu else ("1" if n == base else "–")
            checked = f"{sum(b.get('bad', 0) for b in bs)}/{sum(b.get('checked', 0) for b in bs)}"
            out.append(
                f"| {n} | {rps.fmt()} | {_ratio(rps, base_rps) if n != base else '1'} | "
                f"{_lat(bs, 'lat_us', 'p50', 2)} | {_lat(bs, 'lat_us', 'p99', 2)} | {cpu.fmt(1, 0)} | {ratio_cpu} | "
                f"{Stat(b['cpu_per_call']['db_us'] for b in bs).fmt(1, 0)} | "
                f"{Stat(b['cpu_per_call']['load_us'] for b in bs).fmt(1, 0)} | "
                f"{stmts.fmt(1, 2) + (' ' + stm_key if stm_key else '')} | "
                f"{sum(b.get('non2xx', 0) for b in bs)} | {checked} | {Stat(b.get('loadavg_1m') for b in bs).fmt(1, 1)} |")
        single = groups.get((case, wl, key, dist, "single", None), {})
        if single:
            out += ["", "Single caller (closed loop, 1 connection):", "",
                    "| target | calls/s | p50 ms | p99 ms | gateway CPU µs/call |", "|---|---|---|---|---|"]
            for n, bs in single.items():
                cpu = Stat((b.get("cpu_per_call") or {}).get("gateway_us") for b in bs)
                out.append(f"| {n} | {Stat(b['rps'] for b in bs).fmt()} | {_lat(bs, 'lat_us', 'p50', 3)} | "
                           f"{_lat(bs, 'lat_us', 'p99', 3)} | {cpu.fmt()} |")
        opens = sorted(k[5] for k in groups if k[:5] == (case, wl, key, dist, "open"))
        if opens:
            out += ["", "Open loop (offered rate = % of the capacity measured in the same block; latency from the "
                        "intended send time, corrected for coordinated omission):", "",
                    "| target | % | offered/s | achieved/s | p50 ms | p99 ms | p99.9 ms | non-2xx |",
                    "|---|---|---|---|---|---|---|---|"]
            for pct in opens:
                for n, bs in groups[(case, wl, key, dist, "open", pct)].items():
                    out.append(f"| {n} | {pct} | {Stat(b['rate'] for b in bs).fmt()} | "
                               f"{Stat(b['rps'] for b in bs).fmt()} | {_lat(bs, 'co_lat_us', 'p50', 2)} | "
                               f"{_lat(bs, 'co_lat_us', 'p99', 2)} | {_lat(bs, 'co_lat_us', 'p999', 2)} | "
                               f"{sum(b.get('non2xx', 0) for b in bs)} |")
        health = groups.get((case, wl, key, dist, "health", None), {})
        if health:
            cells = []
            for n, bs in health.items():
                before = Stat(b["health_us"]["before"] for b in bs)
                after = Stat(b["health_us"]["after"] for b in bs)
                if before:
                    cells.append(f"{n}: {before.fmt(1, 0)} → {after.fmt(1, 0)}")
            if cells:
                out += ["", "/health floor µs (before → after each block): " + "; ".join(cells)]
        out.append("")
    unsupported = [r for r in recs if r.get("type") == "unsupported"]
    if unsupported:
        out += ["## Not run", "", "| case | workload | key | target | why (the probe's answer) |",
                "|---|---|---|---|---|"]
        for r in unsupported:
            reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:160]
            out.append(f"| {r['case']} | {r['workload']} | {r['key']} | {r['target']} | not yet supported: {reason} |")
        out.append("")
    if targets_meta:
        out += ["## Targets", ""]
        for (case, name), r in targets_meta.items():
            out.append(f"- {case} / {name}: {r['kind']} {r.get('version') or ''} {json.dumps(r['settings'])}")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("path")
    p.add_argument("--run")
    a = p.parse_args(argv)
    print(render(load(a.path), a.run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
