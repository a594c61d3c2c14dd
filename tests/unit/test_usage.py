"""Usage counters: lock-free per-thread shards that add up exactly."""

from __future__ import annotations

import threading

from qag.api._usage import Usage


def test_counts_from_many_threads_add_up_exactly():
    usage = Usage()

    def work():
        for i in range(1000):
            usage.record("lite", "k1", i % 10 != 0, 3, 2.0)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert usage.connection("lite") == {"queries": 8000, "errors": 800, "rows": 24000, "avg_duration_ms": 2.0}
    assert usage.key("k1") == {"queries": 8000, "errors": 800, "rows": 24000}


def test_unknown_names_and_admin_calls():
    usage = Usage()
    usage.record("lite", None, True, 1, 1.0)
    assert usage.key("nobody") == {"queries": 0, "errors": 0, "rows": 0}
    assert usage.connection("other") == {"queries": 0, "errors": 0, "rows": 0, "avg_duration_ms": None}
    assert usage.connection("lite")["queries"] == 1
