"""The host's flush requests (qag/observe/hostflush.py) on both shmsync twins: writers in forked processes
write for every request, a reader waits for exactly the live ones, a dead writer's slot is freed and reused, and
the history writer thread answers requests without its interval passing."""

from __future__ import annotations

import os
import time

import pytest

from qag import _speedups
from qag.observe.events import BatchWriter
from qag.observe.hostflush import HostFlush
from tests.speedups.conftest import compiled_or_skip


@pytest.fixture(params=["pure", "compiled"])
def twin(request):
    return _speedups.twin("shmsync", "pure") if request.param == "pure" else compiled_or_skip("shmsync")


@pytest.fixture
def host(twin):
    h = HostFlush(nslots=8, twin=twin)
    yield h
    h.close()


def _writer_process(host: HostFlush, answers: int, out: int) -> None:
    """A child: attach, then answer `answers` requests (each with a line on `out`), then exit."""
    slot = host.attach(os.getpid())
    done = 0
    while done < answers:
        number = host.wanted(slot)
        if number:
            os.write(out, f"{number}\n".encode())
            host.ack(slot, number)
            done += 1
        time.sleep(0.001)
    os._exit(0)


def _fork(target, *args) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            target(*args)
        finally:
            os._exit(1)
    return pid


def test_a_reader_waits_for_every_live_writer_and_each_writes_for_its_request(host):
    read, write = os.pipe()
    pids = [_fork(_writer_process, host, 2, write) for _ in range(3)]
    try:
        deadline = time.monotonic() + 10
        while len(host._behind(1 << 62)) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)   # until the three have attached
        for _ in range(2):
            number = host.request()
            assert host.wait(number, timeout=10)
            assert host._behind(number) == []
        os.close(write)
        lines = b""
        while chunk := os.read(read, 1024):
            lines += chunk
        assert sorted(lines.split()) == sorted([b"1", b"2"] * 3)
    finally:
        for pid in pids:
            os.waitpid(pid, 0)
        os.close(read)


def test_a_writer_that_does_not_answer_times_the_read_out_and_a_dead_one_is_skipped(host):
    me = host.attach(os.getpid())
    number = host.request()
    assert host.wait(number, timeout=0.05) is False        # this process's own slot never acked
    host.ack(me, number)
    assert host.wait(number, timeout=0.05) is True
    pid = _fork(lambda: (host.attach(os.getpid()), os._exit(0)))
    os.waitpid(pid, 0)                                      # attached, then gone without detaching
    number = host.request()
    host.ack(me, number)
    naps: list = []
    assert host.wait(number, timeout=5, sleep=naps.append) is True
    assert len(naps) == 1                                   # skipped at the first look: one pause, then done
    assert all(holder != pid for _, holder in host._behind(1 << 62))


def test_slots_are_reused_and_a_full_table_leaves_writers_out_not_broken(twin):
    one = HostFlush(nslots=1, twin=twin)
    try:
        dead = 2 ** 22 + 12_345                              # beyond Linux's pid_max: never a live process
        slot = one.attach(dead)
        assert slot is not None
        assert one.attach(os.getpid()) == slot               # a dead writer's slot goes to the next one
        assert one.attach(os.getpid()) == slot               # and a process keeps its own
        assert one.attach(os.getppid()) is None              # alive and not this process: the table is full
        number = one.request()
        assert one.wait(number, timeout=0.05) is False       # the slot's writer (this process) has not acked
        one.ack(slot, number)
        assert one.wait(number, timeout=0.05) is True
    finally:
        one.close()


def test_a_joining_writer_owes_nothing_for_requests_made_before_it(host):
    number = host.request()
    slot = host.attach(os.getpid())
    assert host.wanted(slot) == 0 and host.wait(number, timeout=0.05)
    assert host.wanted(slot) == 0
    later = host.request()
    assert host.wanted(slot) == later


def test_the_writer_thread_answers_a_request_long_before_its_interval(host):
    written: list = []
    writer = BatchWriter("test", lambda batch, batch_id: written.extend(batch), capacity=100, interval=60.0,
                         host=host)
    try:
        writer.put("a")
        deadline = time.monotonic() + 5
        while not host._behind(1 << 62) and time.monotonic() < deadline:
            time.sleep(0.005)   # the thread started and attached
        assert written == []
        assert host.wait(host.request(), timeout=5)        # answered: long before the 60 s interval
        assert written == ["a"]
    finally:
        writer.close()
    assert host._behind(1 << 62) == []                     # a closed writer left its slot
