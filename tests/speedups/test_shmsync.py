"""Shared-memory synchronisation (qag._speedups shmsync twins): words, the cross-process lock, seqlock copies."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

SIZE = 4096


def _shared(size: int = SIZE):
    """(mmap, fd) of an anonymous shared file, as the metadata cache makes them."""
    fd = os.memfd_create("qag-test-shmsync")
    os.ftruncate(fd, size)
    return mmap.mmap(fd, size), fd


@pytest.fixture
def region():
    mm, fd = _shared()
    yield mm, fd
    mm.close()
    os.close(fd)


def test_words_round_trip(speedups, region):
    mm, fd = region
    sync = speedups.shmsync.Sync(mm, fd)
    assert sync.size == SIZE
    assert sync.load(0) == 0
    sync.store(8, 2**64 - 1)
    sync.store(16, 12345)
    assert (sync.load(8), sync.load(16)) == (2**64 - 1, 12345)
    assert mm[16:24] == (12345).to_bytes(8, "little")
    sync.release()


@pytest.mark.parametrize("off", [-8, SIZE, SIZE - 4, 3])
def test_word_outside_or_misaligned(speedups, region, off):
    sync = speedups.shmsync.Sync(*region)
    with pytest.raises(ValueError, match="outside the shared buffer or not 8-aligned"):
        sync.load(off)
    with pytest.raises(ValueError, match="outside the shared buffer or not 8-aligned"):
        sync.store(off, 1)
    sync.release()


def test_spans_are_checked(speedups, region):
    sync = speedups.shmsync.Sync(*region)
    with pytest.raises(ValueError, match="outside the shared buffer"):
        sync.write(0, SIZE - 4, b"12345")
    with pytest.raises(ValueError, match="outside the shared buffer"):
        sync.read(0, 8, SIZE)
    with pytest.raises(ValueError, match="outside the shared buffer"):
        sync.read(0, 8, -1)
    sync.release()


def test_read_only_buffer_refused(speedups):
    with pytest.raises(ValueError, match="writable"):
        speedups.shmsync.Sync(b"\0" * 64)


def test_seqlock_write_and_read(speedups, region):
    mm, fd = region
    sync = speedups.shmsync.Sync(mm, fd)
    assert sync.write(64, 72, b"hello") == 2
    assert sync.read(64, 72, 5) == (2, b"hello")
    assert sync.write(64, 72, b"world") == 4
    assert sync.read(64, 72, 5) == (4, b"world")
    # A writer in progress (odd sequence) is never read through.
    sync.store(64, 5)
    assert sync.read(64, 72, 5) is None
    # A sequence a dead writer left odd is moved on by the next write.
    assert sync.write(64, 72, b"again") == 8
    assert sync.read(64, 72, 5) == (8, b"again")
    sync.release()


def test_twins_agree(twin_pair):
    pure, compiled = twin_pair("shmsync")

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from(["store", "load", "write", "read"]),
                              st.integers(-16, 200), st.integers(0, 2**64 - 1), st.binary(max_size=40)),
                    max_size=30))
    def check(ops):
        results = []
        for twin in (pure, compiled):
            mm = mmap.mmap(-1, 256)
            sync = twin.Sync(mm, -1)
            out = []
            for op, off, value, data in ops:
                try:
                    if op == "store":
                        out.append(sync.store(off, value))
                    elif op == "load":
                        out.append(sync.load(off))
                    elif op == "write":
                        out.append(sync.write(off, off + 8, data))
                    else:
                        out.append(sync.read(off, off + 8, len(data)))
                except ValueError as error:
                    out.append(("ValueError", str(error)))
            out.append(bytes(mm))
            sync.release()
            mm.close()
            results.append(out)
        assert results[0] == results[1]

    check()


def _count_under_lock(sync, rounds: int) -> None:
    for _ in range(rounds):
        sync.lock(0)
        value = sync.load(8)
        if value % 7 == 0:
            time.sleep(0)  # invite another process in the middle of the read-modify-write
        sync.store(8, value + 1)
        sync.unlock(0)


def test_lock_serialises_processes_and_threads(speedups, region):
    """4 forked processes x 2 threads add 1 to a word under the lock, unlocked read-modify-write each: exact sum."""
    mm, fd = region
    sync = speedups.shmsync.Sync(mm, fd)
    rounds, procs = 1500, 4
    children = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            try:
                threads = [threading.Thread(target=_count_under_lock, args=(sync, rounds)) for _ in range(2)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            finally:
                os._exit(0)
        children.append(pid)
    for pid in children:
        assert os.waitpid(pid, 0)[1] == 0
    assert sync.load(8) == rounds * procs * 2
    assert sync.load(0) == 0  # free again
    sync.release()


def test_lock_of_a_killed_holder_is_taken_over(speedups, region):
    """A worker killed while holding the lock must not stop every other writer for good."""
    mm, fd = region
    sync = speedups.shmsync.Sync(mm, fd)
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        sync.lock(0)
        os.write(ready_w, b"x")
        time.sleep(60)
        os._exit(0)
    os.read(ready_r, 1)
    assert sync.load(0) == pid
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    got = threading.Event()

    def take():
        sync.lock(0)
        got.set()
        sync.unlock(0)

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert got.wait(10), "the lock of a dead process was never released"
    taker.join(10)  # its unlock done before the segment and its file are let go
    os.close(ready_r)
    os.close(ready_w)
    sync.release()


@pytest.mark.parametrize("seq", [2**64 - 1, 2**64 - 2, 2**64 - 3])
def test_twins_agree_on_a_sequence_about_to_wrap(twin_pair, seq):
    """A word stored near 2**64 and then written: both twins wrap round as a C uint64_t does (hypothesis found the
    pure twin's struct.error here)."""
    pure, compiled = twin_pair("shmsync")
    outcomes = []
    for twin in (pure, compiled):
        mm = mmap.mmap(-1, 64)
        sync = twin.Sync(mm, -1)
        sync.store(0, seq)
        outcomes.append((sync.write(0, 8, b"data"), sync.load(0), sync.read(0, 8, 4)))
        sync.release()
        mm.close()
    assert outcomes[0] == outcomes[1] and outcomes[0][0] in (0, 1, 2)
