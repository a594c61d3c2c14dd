"""The bounded buffer and its batch writer: batches, exact drop counts, retries, flush and close."""

from __future__ import annotations

import sqlite3
import threading

from qag.observe.events import BatchWriter


class Sink:
    def __init__(self):
        self.batches: list[list] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail_with: BaseException | None = None
        self.ids: list[str] = []   # the id of every write attempt

    def write(self, batch, batch_id):
        self.gate.wait(10)
        self.ids.append(batch_id)
        if self.fail_with is not None:
            raise self.fail_with
        self.batches.append(list(batch))

    @property
    def items(self):
        return [x for b in self.batches for x in b]


def test_records_are_written_in_batches_and_flush_writes_what_is_queued():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=1000, interval=3600)
    for i in range(10):
        w.put(i)
    w.flush()
    assert sink.batches == [list(range(10))] and w.written == 10 and w.pending == 0
    w.close()


def test_the_writer_wakes_when_enough_are_queued():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=1000, interval=3600, wake_at=5)
    done = threading.Event()
    original = sink.write

    def write(batch, batch_id):
        original(batch, batch_id)
        done.set()

    w._write = write
    for i in range(5):
        w.put(i)
    assert done.wait(10)
    assert sink.items == [0, 1, 2, 3, 4]
    w.close()


def test_a_full_buffer_drops_the_oldest_and_counts_exactly_across_threads():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=50, interval=3600)

    def produce(base):
        for i in range(1000):
            w.put((base, i))

    threads = [threading.Thread(target=produce, args=(b,)) for b in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.flush()
    assert w.dropped + len(sink.items) == 8000
    assert len(sink.items) <= 50 + 8  # at most one over per producer racing the bound
    # what is left is the newest of each producer, in order
    for b in range(8):
        mine = [i for (base, i) in sink.items if base == b]
        assert mine == sorted(mine) and (not mine or mine[-1] == 999)
    w.close()


def _store_writer(sink) -> BatchWriter:
    """A writer that holds a batch the store refuses as busy or down (sqlite3.OperationalError) for later."""
    return BatchWriter("t", sink.write, capacity=100, interval=3600,
                       retry=lambda exc: isinstance(exc, sqlite3.OperationalError))


def test_a_busy_store_holds_the_batch_and_writes_it_later():
    sink = Sink()
    w = _store_writer(sink)
    sink.fail_with = sqlite3.OperationalError("database is locked")
    w.put(1)
    w.flush()
    w.put(2)
    w.flush()
    assert sink.items == [] and w.pending == 2 and w.failed == 0
    sink.fail_with = None
    w.put(3)
    w.flush()
    assert sink.items == [1, 2, 3] and w.pending == 0 and w.written == 3
    # The held batch went again alone and under its first id (the store skips an id it has: a failed write may
    # have been applied); the records queued meanwhile are a batch of their own, with a new id.
    assert sink.batches == [[1], [2, 3]]
    assert sink.ids[0] == sink.ids[1] == sink.ids[2] != sink.ids[3] and len(sink.ids) == 4
    w.close()


def test_other_failures_are_counted_not_retried():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=100, interval=3600)
    sink.fail_with = ValueError("bad")
    w.put(1)
    w.flush()
    assert (w.failed, w.pending) == (1, 0)
    sink.fail_with = None
    w.put(2)
    w.flush()
    assert sink.items == [2]
    w.close()


def test_close_writes_everything_and_later_records_are_written_at_once():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=100, interval=3600)
    for i in range(3):
        w.put(i)
    w.close()
    assert sink.items == [0, 1, 2]
    w.put(3)
    assert sink.items == [0, 1, 2, 3]


def test_a_non_blocking_flush_skips_while_the_writer_is_busy():
    sink = Sink()
    w = BatchWriter("t", sink.write, capacity=100, interval=3600)
    w.put(1)
    sink.gate.clear()
    writer = threading.Thread(target=w.flush)
    writer.start()
    while not w._flush_lock.locked():
        pass
    w.put(2)
    w.flush(block=False)  # returns at once instead of waiting for the busy writer
    sink.gate.set()
    writer.join()
    w.flush()
    assert sink.items == [1, 2]
    w.close()


def test_pause_lets_another_thread_take_the_interpreter_lock():
    """With a 10 s switch interval, a thread woken while this one keeps the interpreter lock would wait 10 s; a
    writer's pause lets it run now."""
    import sys

    from qag.observe.events import pause
    go, ran = threading.Event(), threading.Event()

    def other():
        go.wait(10)
        ran.set()

    thread = threading.Thread(target=other)
    thread.start()
    before = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    try:
        go.set()
        for _ in range(2000):
            if ran.is_set():
                break
            pause()
        took_it = ran.is_set()
    finally:
        sys.setswitchinterval(before)
        thread.join(10)
    assert took_it


def test_a_held_batch_is_kept_by_time_not_by_how_often_readers_ask(monkeypatch):
    """Fault drill: every history read (GET /api/v1/queries, /history) has every worker's writer try once more, so
    an administrator polling a management view burnt the 30 attempts within a second of a store outage and its
    runs were lost. The batch is held for HOLD_SECONDS from its first failure, however many writes are asked."""
    from qag.observe import events
    sink = Sink()
    w = _store_writer(sink)
    sink.fail_with = sqlite3.OperationalError("the store is down")
    w.put(1)
    for _ in range(100):   # readers' flushes during the outage
        w.flush()
    assert (w.failed, w.pending) == (0, 1) and len(sink.ids) == 100
    sink.fail_with = None
    w.flush()
    assert sink.items == [1] and w.written == 1
    # Past its time the batch counts as failed (the next one's time starts at its own first failure).
    monkeypatch.setattr(events, "HOLD_SECONDS", 0.2)
    sink.fail_with = sqlite3.OperationalError("the store is down")
    w.put(2)
    w.flush()
    assert (w.failed, w.pending) == (0, 1)
    threading.Event().wait(0.3)
    w.flush()
    assert (w.failed, w.pending) == (1, 0)
    w.close()


def test_close_retries_a_refused_batch_for_a_few_seconds(monkeypatch):
    """Fault drill: a reload (SIGHUP) or a recycled worker during a store outage lost everything queued at the
    first refusal of the final write. close() now tries again for CLOSE_SECONDS: a short outage loses nothing."""
    from qag.observe import events
    sink = Sink()
    w = _store_writer(sink)
    sink.fail_with = sqlite3.OperationalError("the store is down")
    w.put(1)
    w.flush()
    w.put(2)
    back = threading.Timer(0.5, lambda: setattr(sink, "fail_with", None))   # the store is back half a second later
    back.start()
    w.close()
    back.join()
    assert sink.items == [1, 2] and w.failed == 0 and w.pending == 0
    # A store that stays down: the records are lost once the time is up, and counted.
    monkeypatch.setattr(events, "CLOSE_SECONDS", 0.3)
    w2 = _store_writer(sink)
    sink.fail_with = sqlite3.OperationalError("the store is down")
    w2.put(3)
    w2.close()
    assert (w2.failed, w2.pending) == (1, 0)
