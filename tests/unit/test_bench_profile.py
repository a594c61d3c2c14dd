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
