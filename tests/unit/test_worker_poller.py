"""The epoll poller's pool-thread wait (qag/worker/poller.py) on real sockets: a connection's bytes reach exactly
one waiting thread, with and without the lone-thread spin (QAG_SPIN_US), and the spin never outlasts its bound."""

from __future__ import annotations

import select
import socket
import threading
import time

import pytest

from qag.worker.poller import STOP, EpollPoller

pytestmark = pytest.mark.skipif(not hasattr(select, "epoll"), reason="epoll only")


class _Conn:
    def __init__(self, sock):
        self.sock = sock
        self.fd = sock.fileno()


@pytest.fixture
def pair():
    made = []

    def make(poller):
        a, b = socket.socketpair()
        made.extend((a, b))
        conn = _Conn(a)
        poller.add(conn)
        return conn, b

    yield make
    for s in made:
        s.close()


@pytest.mark.parametrize("spin", [0.0, 0.0005, 0.05])
def test_bytes_that_come_during_or_after_the_spin_reach_the_waiting_thread(pair, spin):
    poller = EpollPoller(spin)
    conn, peer = pair(poller)
    for delay in (0.0, 0.01, 0.1):           # before the wait, within a long spin, after any spin
        threading.Timer(delay, peer.send, (b"x",)).start()
        assert poller.wait(5.0, True) is conn
        assert conn.sock.recv(10) == b"x"
        poller.idle()
        poller.rearm(conn)
    assert poller.wait(0.05, True) is None   # nothing more came: the wait ends at its timeout
    poller.close()


def test_a_busy_thread_elsewhere_means_no_spin(pair):
    poller = EpollPoller(5.0)                # a spin this long would show in the time a wait takes
    first, peer = pair(poller)
    peer.send(b"x")
    assert poller.wait(1.0) is first         # this thread is now busy with it
    started = time.monotonic()
    assert poller.wait(0.05, True) is None   # another thread's wait: no spin while one is busy
    assert time.monotonic() - started < 1.0
    poller.idle()
    poller.close()


def test_a_lone_spin_ends_at_its_bound_and_stop_ends_it(pair):
    poller = EpollPoller(0.2)
    pair(poller)
    started = time.monotonic()
    assert poller.wait(0.05, True) is None   # spun 0.2 s, then slept 0.05 s
    assert 0.2 <= time.monotonic() - started < 2.0
    started = time.monotonic()
    assert poller.wait(0.05) is None         # not just after an answer (a timed-out wait): no spin
    assert time.monotonic() - started < 0.2
    poller.stop()
    assert poller.wait(5.0, True) is STOP
    poller.close()


def test_one_connection_goes_to_one_of_many_spinning_threads(pair):
    poller = EpollPoller(0.05)
    conn, peer = pair(poller)
    got = []

    def take():
        c = poller.wait(0.3, True)
        if c is not None:
            got.append(c)
            poller.idle()

    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    peer.send(b"x")
    for t in threads:
        t.join()
    assert got == [conn]                     # one-shot: exactly one thread took it
    poller.close()


def test_after_a_spin_that_missed_threads_sleep_until_a_sleep_is_shorter_than_the_spin(pair):
    poller = EpollPoller(0.5)
    conn, peer = pair(poller)
    started = time.monotonic()
    assert poller.wait(0.05, True) is None   # nothing came: spun 0.5 s, then slept
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    assert poller.wait(0.05, True) is None   # the last spin missed: slept at once
    assert time.monotonic() - started < 0.4
    threading.Timer(0.01, peer.send, (b"x",)).start()
    assert poller.wait(5.0, True) is conn    # a sleep that ended sooner than the spin would have...
    conn.sock.recv(10)
    poller.idle()
    poller.rearm(conn)
    started = time.monotonic()
    assert poller.wait(0.05, True) is None   # ...so the next lone wait spins again
    assert time.monotonic() - started >= 0.5
    poller.close()
