"""Readiness polling for qag's worker: epoll one-shot (a pool thread re-arms its connection itself, no hand-back
through the selector thread), or the selectors module where epoll is missing (hand-back through a wakeup pipe)."""

from __future__ import annotations

import os
import select
import selectors
import threading
from time import monotonic

STOP = object()
_ONE_READ = select.EPOLLIN | select.EPOLLONESHOT if hasattr(select, "epoll") else 0   # read once per arming
_ONE_WRITE = select.EPOLLOUT | select.EPOLLONESHOT if hasattr(select, "epoll") else 0  # room to write, once


class EpollPoller:
    """Two epoll sets. The selector thread waits on the listeners (and the wakeup pipe); the pool threads all wait
    on the connections, each armed for one read event at a time (EPOLLONESHOT), so exactly one thread takes a
    connection that has bytes, reads and parses them, answers a complete request itself, and re-arms it: no
    hand-off between threads per request."""

    followers = True

    def __init__(self, spin: float = 0.0):
        self._spin = spin               # seconds a thread looks for bytes without sleeping when no other is busy
        self._missed = False            # the last spin ended before bytes came, and no sleep since was shorter
        self._busy = 0                  # pool threads answering a connection now (taken by wait, not yet idle)
        self._busy_lock = threading.Lock()
        self._ep = select.epoll()
        self._conn_ep = select.epoll()
        self._data: dict[int, object] = {}
        self._conns: dict[int, object] = {}
        self._stop_r, self._stop_w = os.pipe()
        self._conn_ep.register(self._stop_r, select.EPOLLIN)   # level-triggered: wakes every pool thread

    def listen(self, fileobj, data) -> None:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        self._data[fd] = data
        self._ep.register(fd, select.EPOLLIN)

    def unlisten(self, fileobj) -> None:
        fd = fileobj.fileno()
        self._ep.unregister(fd)
        self._data.pop(fd, None)

    def add(self, conn) -> None:
        self._conns[conn.fd] = conn
        self._conn_ep.register(conn.fd, _ONE_READ)

    def rearm(self, conn) -> None:
        """Wait for the connection's next bytes (fires at once if some are already there)."""
        self._conn_ep.modify(conn.fd, _ONE_READ)

    wants_more = rearm

    def wants_room(self, conn) -> None:
        """Wait until the connection's socket takes more of a response (a pool thread then sends the rest)."""
        self._conn_ep.modify(conn.fd, _ONE_WRITE)

    def dispatched(self, conn) -> None:
        pass   # one-shot: already disarmed

    def remove(self, conn) -> None:
        try:
            self._conn_ep.unregister(conn.fd)
        except OSError:
            pass
        if self._conns.get(conn.fd) is conn:
            del self._conns[conn.fd]

    def select(self, timeout: float) -> list:
        try:
            events = self._ep.poll(timeout, 64)
        except InterruptedError:
            return []
        data = self._data
        return [data.get(fd) for fd, _ in events]

    def wait(self, timeout: float, answered: bool = False):
        """A pool thread: the next connection with bytes (the thread is busy with it until `idle()`), STOP at
        shutdown, or None. A thread that has just `answered` a request while no other thread is busy first looks
        without sleeping for up to the spin (giving the core to any runnable thread between looks): an idle core
        halts, and waking it for a lone caller's next request costs more than the request takes to come
        (QAG_SPIN_US). A thread back from a wait that timed out sleeps at once: an idle worker does not spin; and
        after a spin that ended before the bytes came, threads sleep at once until a sleep ends sooner than the
        spin would have: a caller that pauses between requests is not spun for."""
        ep = self._conn_ep
        lone = answered and self._spin and not self._busy
        began = monotonic()
        try:
            events = ()
            if lone and not self._missed:
                until = began + self._spin
                events = ep.poll(0, 1)
                while not events and monotonic() < until:
                    os.sched_yield()
                    events = ep.poll(0, 1)
                self._missed = not events
            if not events:
                events = ep.poll(timeout, 1)
                if lone and self._missed and events and monotonic() - began < self._spin:
                    self._missed = False     # these bytes came within a spin's time: spin for the next again
        except InterruptedError:
            return None
        for fd, _ in events:
            if fd == self._stop_r:
                return STOP
            conn = self._conns.get(fd)
            if conn is not None:
                with self._busy_lock:
                    self._busy += 1
            return conn
        return None

    def idle(self) -> None:
        """The thread `wait` gave a connection to is done with it."""
        with self._busy_lock:
            self._busy -= 1

    def stop(self) -> None:
        os.write(self._stop_w, b"x")

    def close(self) -> None:
        self._ep.close()
        self._conn_ep.close()


class SelectorPoller:
    """selectors fallback: the selector thread reads every request and queues complete ones to the pool threads;
    a connection is registered while waiting for bytes, unregistered while a pool thread answers it."""

    followers = False

    def __init__(self, spin: float = 0.0):
        # Pool threads here wait on a queue the selector thread fills, not on sockets: `spin` is accepted, unused.
        self._sel = selectors.DefaultSelector()

    def listen(self, fileobj, data) -> None:
        self._sel.register(fileobj, selectors.EVENT_READ, data)

    def unlisten(self, fileobj) -> None:
        self._sel.unregister(fileobj)

    def add(self, conn) -> None:
        self._sel.register(conn.sock, selectors.EVENT_READ, conn)

    rearm = add

    def wants_more(self, conn) -> None:
        pass   # still registered

    def wants_room(self, conn) -> None:
        """Selector thread: wait until the socket takes more of a response (dispatched to the pool like bytes)."""
        self._sel.register(conn.sock, selectors.EVENT_WRITE, conn)

    def dispatched(self, conn) -> None:
        self._sel.unregister(conn.sock)

    def remove(self, conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def select(self, timeout: float) -> list:
        try:
            return [key.data for key, _ in self._sel.select(timeout)]
        except InterruptedError:
            return []

    def stop(self) -> None:
        pass

    def close(self) -> None:
        self._sel.close()


def make_poller(spin: float = 0.0):
    return EpollPoller(spin) if hasattr(select, "epoll") else SelectorPoller()
