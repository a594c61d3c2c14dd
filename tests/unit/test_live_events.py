"""The host's ring of live run events (qag/observe/live.py) on both shmsync twins: order, wrap-around, eviction,
an overtaken reader, forked writers, who listens; and a worker's streams: filters, a stream that falls behind is
dropped without holding up the others."""

from __future__ import annotations

import os
import random

import pytest

from qag import _speedups
from qag.observe.live import LiveEvents, Ring
from tests.speedups.conftest import compiled_or_skip


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


def payload(i: int, size: int = 0) -> bytes:
    return f"event {i} ".encode() + b"x" * size


def test_records_come_back_in_order_from_a_cursor_taken_before(twin):
    ring = Ring(65_536, twin=twin)
    cursor = ring.end()
    for i in range(10):
        assert ring.publish(payload(i))
    records, cursor, lost = ring.read(cursor)
    assert records == [payload(i) for i in range(10)] and lost == 0
    assert ring.read(cursor) == ([], cursor, 0)          # nothing new
    ring.publish(payload(10))
    assert ring.read(cursor)[0] == [payload(10)]
    ring.close()


def test_a_reader_keeping_up_sees_every_record_across_many_wraps(twin):
    ring = Ring(65_536, twin=twin)
    cursor = ring.end()
    rng = random.Random(7)
    seen, sent = [], []
    for i in range(3000):
        body = payload(i, rng.randrange(0, 3000))
        assert ring.publish(body)
        sent.append(body)
        if rng.random() < 0.2:
            records, cursor, lost = ring.read(cursor)
            assert lost == 0
            seen.extend(records)
    records, cursor, lost = ring.read(cursor)
    seen.extend(records)
    assert lost == 0 and seen == sent
    ring.close()


def test_an_overtaken_reader_skips_to_the_oldest_kept_and_counts_what_it_lost(twin):
    ring = Ring(65_536, twin=twin)
    cursor = ring.end()
    sent = [payload(i, 1000) for i in range(500)]      # ~500 KB through a 64 KiB ring
    for body in sent:
        ring.publish(body)
    records, cursor, lost = ring.read(cursor)
    assert records and lost + len(records) == 500
    assert records == sent[lost:]                         # the newest ones, in order, none twice
    ring.close()


def test_a_record_larger_than_a_quarter_of_the_ring_is_not_kept(twin):
    ring = Ring(65_536, twin=twin)
    cursor = ring.end()
    assert not ring.publish(b"x" * 20_000)
    assert ring.publish(b"small")
    assert ring.read(cursor)[0] == [b"small"]
    ring.close()


def test_records_written_by_forked_processes_all_arrive(twin):
    ring = Ring(1 << 20, twin=twin)
    cursor = ring.end()
    children = []
    for w in range(4):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(200):
                    ring.publish(f"{w}:{i}".encode())
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    records, _, lost = ring.read(cursor)
    assert lost == 0 and len(records) == 800
    for w in range(4):
        mine = [int(r.split(b":")[1]) for r in records if r.startswith(f"{w}:".encode())]
        assert mine == list(range(200))                  # each writer's records in its own order
    ring.close()


def test_listening_counts_streams_and_a_dead_process_gives_its_streams_back(twin):
    ring = Ring(65_536, twin=twin)
    assert not ring.listening()
    ring.listen(os.getpid(), +1)
    ring.listen(os.getpid(), +1)
    assert ring.listening()
    pid = os.fork()
    if pid == 0:
        ring.listen(os.getpid(), +1)
        os._exit(0)                                       # dies holding a stream
    os.waitpid(pid, 0)
    ring.listen(os.getpid(), -1)
    ring.listen(os.getpid(), -1)                          # the sweep on this change forgets the dead child's
    assert not ring.listening()
    ring.close()


def test_streams_get_what_they_may_see_in_order_and_an_overtaken_stream_is_dropped():
    events = LiveEvents(65_536, max_streams=3)
    admin = events.open(None, {})
    alice = events.open("alice", {"status": "success"})
    stuck = events.open(None, {})
    assert events.open(None, {}) is None                 # max_streams per worker
    metas = [["alice" if i % 2 else "bob", "success" if i % 3 else "error", "saved", "q", "c"] for i in range(300)]
    got_admin, got_alice = [], []
    for i, meta in enumerate(metas):
        events.publish(meta, payload(i, 500))
        if i % 10 == 9:                                  # these two clients keep up; `stuck` never reads
            got_admin += events.take(admin)
            got_alice += events.take(alice)
    assert got_admin == [payload(i, 500) for i in range(300)]
    assert got_alice == [payload(i, 500) for i in range(300) if i % 2 and i % 3]
    assert events.take(stuck) == [] and stuck.dropped and events.dropped_streams == 1
    assert not admin.dropped and not alice.dropped
    assert events.delivered == len(got_admin) + len(got_alice)
    for stream in (admin, alice, stuck):
        events.close(stream)
    assert events.open_streams == 0 and not events.ring.listening()


def test_the_waker_wakes_streams_when_the_ring_moves():
    events = LiveEvents(65_536, max_streams=2)
    stream = events.open(None, {"kind": "adhoc"})
    assert not stream.ready.wait(0.2)                    # nothing published: not woken
    events.publish(["k", "success", "adhoc", None, "c"], b"a")
    assert stream.ready.wait(5)
    assert events.take(stream) == [b"a"]
    events.close(stream)


def test_a_type_other_than_query_run_matches_nothing_and_stop_wakes_every_stream():
    events = LiveEvents(65_536, max_streams=2)
    other = events.open(None, {"type": "schema.change"})
    kind = events.open(None, {"kind": "adhoc", "connection": "c"})
    events.publish(["k", "success", "saved", "q", "c"], b"s")
    events.publish(["k", "success", "adhoc", None, "c"], b"a")
    assert events.take(other) == [] and events.take(kind) == [b"a"]
    events.stop()
    assert other.ready.is_set() and kind.ready.is_set() and events.stopping
    assert events.open(None, {}) is None                 # a stopping worker opens no stream
