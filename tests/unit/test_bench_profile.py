"""benchmarks.profile's summary of py-spy's collapsed stacks: self and inclusive shares, summed over workers."""

from __future__ import annotations

from benchmarks.profile import summarise


def test_summary_counts_self_and_inclusive_samples_over_files(tmp_path):
    one = tmp_path / "worker-1.txt"
    two = tmp_path / "worker-2.txt"
    one.write_text("run (a.py:1);handle (a.py:5);query (db.py:9) 6\nrun (a.py:1);encode (e.py:3) 2\n")
    # A frame twice on one stack (recursion) counts once towards inclusive; a malformed line is skipped.
    two.write_text("run (a.py:1);handle (a.py:5);handle (a.py:5) 2\nnot a sample line\n")
    text = summarise([str(one), str(two)], top=10)
    assert text.startswith("10 samples over 2 worker(s)")
    own, inclusive = text.split("incl %")
    assert "60.00  query (db.py:9)" in own
    assert "20.00  encode (e.py:3)" in own
    assert "20.00  handle (a.py:5)" in own
    assert "100.00  run (a.py:1)" in inclusive
    assert "80.00  handle (a.py:5)" in inclusive


def test_perf_records_a_process_and_sums_it_by_shared_object(tmp_path):
    import shutil
    import subprocess
    import sys
    from types import SimpleNamespace

    import pytest

    from benchmarks.profile import perf_record, perf_summary

    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (the --perf option needs it)")
    busy = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 4\nwhile time.time() < end: pass"])
    try:
        path = str(tmp_path / "perf.data")
        recorder = perf_record([busy.pid], 2, SimpleNamespace(rate=199), path)
        _, err = recorder.communicate(timeout=30)
        if recorder.returncode != 0:
            pytest.skip(f"perf may not record here: {err.strip()[-200:]}")
    finally:
        busy.kill()
        busy.wait()
    text = perf_summary(path, top=20)
    by_dso, by_symbol = text.split("by symbol:")
    assert by_dso.startswith("by shared object:")
    assert "libpython" in by_dso or "python" in by_dso   # the busy loop is the interpreter's
    assert "%" in by_symbol
