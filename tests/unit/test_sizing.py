"""`qag size` (qag/sizing.py): the verdict, the counts and the reasoning for known loads."""

from __future__ import annotations

import json

import pytest

from qag import sizing


def test_fast_queries_with_heavy_gateway_work_are_cpu_bound():
    p = sizing.plan(rate=3000, cpu_us=400, query_ms=0.1, rtt_ms=0.05, cores=4)
    assert p.bound == "CPU-bound"
    assert p.cores_needed == pytest.approx(1.2)
    assert p.workers == 2          # ceil(1.2 / 0.7)
    assert p.feasible and p.max_rate >= 3000
    assert any("GIL" in line or "one core" in line for line in p.reasoning)


def test_slow_queries_are_waiting_bound_and_need_threads_not_workers():
    p = sizing.plan(rate=500, cpu_us=250, query_ms=20, rtt_ms=1, cores=2)
    assert p.bound == "waiting-bound"
    assert p.in_flight == pytest.approx(500 * 0.02125)
    assert p.workers == 2
    assert p.workers * p.threads >= p.in_flight / 0.7
    assert p.feasible


def test_more_cpu_than_the_machine_has_is_reported_not_feasible():
    p = sizing.plan(rate=10_000, cpu_us=250, query_ms=0.3, rtt_ms=0.1, cores=2)
    assert not p.feasible
    assert p.workers == 2
    assert p.max_rate == pytest.approx(2 * 0.7 / 250e-6)
    assert any("NOT FEASIBLE" in line for line in p.reasoning)


def test_fixed_threads_raise_the_worker_count_when_waits_need_it():
    p = sizing.plan(rate=1000, cpu_us=100, query_ms=50, rtt_ms=0, threads=4, cores=64)
    # 1000/s × 50.1 ms = 50.1 in flight → 72 threads with headroom → 18 workers of 4
    assert p.threads == 4 and p.workers == 18
    assert p.db_connections == 72


def test_round_trips_multiply_the_network_wait():
    one = sizing.plan(rate=100, cpu_us=200, query_ms=0.2, rtt_ms=2, round_trips=1, cores=2)
    three = sizing.plan(rate=100, cpu_us=200, query_ms=0.2, rtt_ms=2, round_trips=3, cores=2)
    assert three.in_flight - one.in_flight == pytest.approx(100 * 0.004)


@pytest.mark.parametrize("kw", [{"rate": 0}, {"cpu_us": -1}, {"query_ms": -1}, {"headroom": 0}, {"threads": 0},
                                {"threads": 257}])
def test_bad_inputs_are_refused(kw):
    args = {"rate": 100, "cpu_us": 100, "query_ms": 1, "rtt_ms": 0.1, **kw}
    with pytest.raises(ValueError):
        sizing.plan(**args)


def test_main_prints_reasoning_and_the_settings(capsys):
    assert sizing.main(["--rate", "2000", "--cpu-us", "250", "--query-ms", "0.3", "--cores", "2"]) == 0
    out = capsys.readouterr().out
    assert "Little's law" in out and "waiting-bound" in out
    assert "QAG_WORKERS=2 QAG_THREADS=2" in out


def test_main_exit_code_says_not_feasible(capsys):
    assert sizing.main(["--rate", "99999", "--cpu-us", "250", "--query-ms", "0.3", "--cores", "2"]) == 1
    assert "NOT FEASIBLE" in capsys.readouterr().out


def test_main_reads_the_measured_figure_from_results(tmp_path, capsys):
    lines = [{"type": "block", "phase": "closed", "target_kind": "qag", "target": "qag", "case": "tpcc",
              "workload": "mix", "cpu_per_call": {"gateway_us": v}} for v in (300, 310, 500)]
    lines.append({"type": "block", "phase": "closed", "target_kind": "peer", "target": "other", "case": "tpcc",
                  "workload": "mix", "cpu_per_call": {"gateway_us": 1500}})
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines))
    assert sizing.main(["--rate", "100", "--results", str(path), "--query-ms", "1", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["cpu_us"] == 310 and "measured" in plan["cpu_source"]


def test_main_refuses_results_without_qag_blocks(tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"type": "run"}) + "\n")
    assert sizing.main(["--rate", "100", "--results", str(path), "--query-ms", "1"]) == 2
    assert "no qag closed-loop blocks" in capsys.readouterr().err
