"""The benchmark harness works: `python -m benchmarks.run --smoke` against the SQLite demo (and the six-database
MySQL case once qag serves MySQL) produces results with every reply checked, no non-2xx, positive throughput;
`python -m benchmarks.call_cost` splits a MySQL call's CPU into its layers on the same data.

No timing is asserted: speed is measured by the harness, not by tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.services import mysql_admin

pytestmark = pytest.mark.e2e
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _need_wrk() -> None:
    if shutil.which("wrk") is None:
        message = "the benchmark harness needs wrk (apt-get install wrk)"
        if os.environ.get("QAG_TEST_REQUIRE_SERVICES") == "1":
            pytest.fail(message)
        pytest.skip(message)


def _smoke(tmp_path, *args: str) -> list[dict]:
    out = tmp_path / "smoke.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", "--smoke", "--out", str(out), *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert (tmp_path / "smoke.md").exists()
    return records


def _check_blocks(records: list[dict], targets: set[str]) -> None:
    blocks = [r for r in records if r["type"] == "block" and r["phase"] in ("closed", "single")]
    assert {b["target"] for b in blocks} == targets, records
    for b in blocks:
        assert b["rps"] > 0 and b["requests"] > 0, b
        assert b["non2xx"] == 0, b
        assert b.get("bad", 0) == 0, b
        if b["target_kind"] in ("qag", "direct"):
            # every reply was matched to its request and checked to be the row asked for
            assert b["checked"] == b["responses"] > 0, b
            assert b.get("unmatched", 0) == 0, b
    closed = [b for b in blocks if b["phase"] == "closed"]
    for b in closed:
        assert b["cpu_per_call"]["load_us"] > 0, b
        if b["target_kind"] != "direct":
            assert b["cpu_per_call"]["gateway_us"] > 0, b
    health = [r for r in records if r["type"] == "block" and r["phase"] == "health"]
    assert all(h["health_us"]["before"] and h["health_us"]["after"] for h in health if h["target_kind"] != "direct")


def test_smoke_sqlite_demo(tmp_path):
    _need_wrk()
    records = _smoke(tmp_path, "--case", "sqlite", "--target", "qag:workers=2,threads=4", "--target", "bare",
                     "--keys", "plain")
    assert records[0]["type"] == "run" and records[0]["machine"]["cores"]
    _check_blocks(records, {"qag workers=2 threads=4", "bare"})


@pytest.fixture
def smoke_databases():
    """A database-name prefix of this test process's own (so concurrent runs never load or drop each other's
    databases); afterwards drop what the smoke run loaded (its six databases, and the read-only user if it made it)."""
    prefix = f"qag_smoke_{os.getpid()}_"
    admin = mysql_admin()   # skips (or fails under QAG_TEST_REQUIRE_SERVICES=1) when MariaDB is unreachable
    cur = admin.cursor()
    cur.execute("SELECT count(*) FROM mysql.user WHERE user = 'qag_bench_ro'")
    had_user = cur.fetchone()[0] > 0
    yield prefix
    cur.execute("SHOW DATABASES LIKE %s", (prefix.replace("_", "\\_") + "%",))
    for (name,) in cur.fetchall():
        cur.execute(f"DROP DATABASE `{name}`")
    if not had_user:
        cur.execute("SELECT host FROM mysql.user WHERE user = 'qag_bench_ro'")
        for (host,) in cur.fetchall():
            cur.execute(f"DROP USER 'qag_bench_ro'@'{host}'")
    admin.close()


def test_smoke_mysql_six_databases(tmp_path, smoke_databases):
    _need_wrk()
    if importlib.util.find_spec("qag.backends.mysql") is None:
        pytest.skip("qag does not serve MySQL connections yet (qag/backends/mysql.py is missing)")
    records = _smoke(tmp_path, "--case", "tpcc", "--warehouses", "1", "--prefix", smoke_databases, "--target", "qag",
                     "--target", "direct", "--keys", "plain")
    _check_blocks(records, {"qag", "direct"})
    closed = [r for r in records if r["type"] == "block" and r["phase"] == "closed"]
    assert all(b["statements_per_call"].get("questions", 0) > 0 for b in closed), closed

    # The in-process cost split runs on the same data: three layers, each with a positive CPU per call.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    proc = subprocess.run([sys.executable, "-m", "benchmarks.call_cost", "--prefix", smoke_databases,
                           "--warehouses", "1", "--no-load", "--calls", "20", "--rounds", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines()
               if line.split() and line.split()[0] in ("driver", "backend", "gateway")}
    assert set(figures) == {"driver", "backend", "gateway"} and all(v > 0 for v in figures.values()), proc.stdout
    if shutil.which("valgrind"):   # the instruction count of the pipeline, under callgrind
        proc = subprocess.run([sys.executable, "-m", "benchmarks.call_cost", "--prefix", smoke_databases,
                               "--warehouses", "1", "--no-load", "--instructions", "--calls", "30"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        count = int(proc.stdout.rsplit(":", 1)[1])
        assert 10_000 < count < 10_000_000, proc.stdout
        # and a real worker's instructions per request, HTTP included, on both worker classes
        proc = subprocess.run([sys.executable, "-m", "benchmarks.server_instructions", "--prefix", smoke_databases,
                               "--warehouses", "1", "--no-load", "--requests", "40", "--warmup", "20"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-4000:]
        counts = [int(line.split()[1].replace(",", "")) for line in proc.stdout.splitlines()[1:]]
        assert len(counts) == 2 and all(100_000 < c < 50_000_000 for c in counts), proc.stdout


def _bench(*argv: str, timeout: int = 240) -> str:
    """Run `python -m benchmarks.<argv>` from the repository without the caller's QAG_* settings; its stdout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("QAG_", "QUERYAPIGATE_"))}
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_recording_benchmarks_run(tmp_path):
    """The recording benchmarks drive the writers as their threads do (a batch id per write) and swap the gateway's
    observer: each prints positive figures (they broke unseen when the writers' signature changed)."""
    out = _bench("benchmarks.recording", "--home", str(tmp_path / "home"), "--rounds", "1", "--calls", "30",
                 "--disk-calls", "50")
    parts = re.search(r"history write \(per run\) ([\d.]+).*log lines \(2 per call\) ([\d.]+)", out)
    assert parts and float(parts.group(1)) > 0 and float(parts.group(2)) > 0, out
    assert re.search(r"customer \(1 row, scoped key\)\s+off: [\d.]+ µs.*on: [\d.]+ µs", out), out
    out = _bench("benchmarks.writer_wait", "--rounds", "1", "--batches", "2", "--batch", "20", "--pin", "")
    write_ms = re.search(r"\| worktree \| ([\d.]+) ", out)
    assert write_ms and float(write_ms.group(1)) > 0, out
    if shutil.which("valgrind"):
        out = _bench("benchmarks.recording_instructions", "--calls", "40", "--batch", "10", "--batches", "1")
        counts = re.search(r"history writer (\d+) per run .* log writer (\d+) per line, request thread (\d+)", out)
        assert counts and all(1_000 < int(c) < 10_000_000 for c in counts.groups()), out


def test_in_process_probes_run():
    """benchmarks.binding times the pure twins against their own compile, benchmarks.governed_probe names the
    shmsync twin it ran, and benchmarks.threads_overlap drives the MySQL backend with a server's default
    settings: each prints its figures."""
    out = _bench("benchmarks.binding", "--rounds", "1", "--number", "50")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    assert {"resolve", "render", "both"} <= set(rows), out
    assert all(rows[step][-1].endswith("x") and float(rows[step][-1][:-1]) > 0 for step in ("resolve", "render")), out
    out = _bench("benchmarks.governed_probe", "--calls", "50", "--rounds", "1", "--warmup", "5")
    cost = re.search(r"admission: process CPU µs per call ([\d.]+) .*shmsync (compiled|pure)\)", out)
    assert cost and float(cost.group(1)) > 0, out
    mysql_admin().close()   # skips (or fails under QAG_TEST_REQUIRE_SERVICES=1) without a server
    out = _bench("benchmarks.threads_overlap", "--threads", "1", "--seconds", "1")
    row = re.search(r"^\s+1\s+(\d+)\s+\d+\s+\d+\s+\d+%\s+[\d.]+\s+(\d+)$", out, re.MULTILINE)
    assert row and int(row.group(1)) > 0 and row.group(2) == "0", out


def test_mysql_pages_benchmark_runs():
    """benchmarks.mysql_pages reads the same pages both ways (it checks they agree) and prints a row per text shape
    and size, each written by read_page itself."""
    mysql_admin().close()   # skips (or fails under QAG_TEST_REQUIRE_SERVICES=1) without a server
    out = _bench("benchmarks.mysql_pages", "--rows", "1,3", "--rounds", "1", "--number", "5")
    rows = re.findall(r"^\| (ascii|escaped) \| (\d+) \| ([\d.]+) \[.*\| (yes|no) \|$", out, re.MULTILINE)
    assert len(rows) == 4 and all(float(r[2]) > 0 and r[3] == "yes" for r in rows), out
