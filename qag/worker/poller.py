"""Readiness polling for qag's worker: epoll one-shot (a pool thread re-arms its connection itself, no hand-back
through the selector thread), or the selectors module where epoll is missing (hand-back through a wakeup pipe)."""

from __future__ import annotations

import select
import selectors


class EpollPoller:
    """Connections are armed for one read event at a time (EPOLLONESHOT): once it fires the selector thread
    owns the connection until it re-arms it or hands it to a pool thread, which re-arms it when done."""

    threadsafe = True

    def __init__(self):
        self._ep = select.epoll()
        self._data: dict[int, object] = {}

    def listen(self, fileobj, data) -> None:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        self._data[fd] = data
        self._ep.register(fd, select.EPOLLIN)

    def unlisten(self, fileobj) -> None:
        fd = fileobj.fileno()
        self._ep.unregister(fd)
        self._data.pop(fd, None)

    def add(self, conn) -> None:
        self._data[conn.fd] = conn
        self._ep.register(conn.fd, select.EPOLLIN | select.EPOLLONESHOT)

    def rearm(self, conn) -> None:
        """Any thread: wait for the connection's next bytes (fires at once if some are already there)."""
        self._ep.modify(conn.fd, select.EPOLLIN | select.EPOLLONESHOT)

    wants_more = rearm

    def dispatched(self, conn) -> None:
        pass   # one-shot: already disarmed

    def remove(self, conn) -> None:
        try:
            self._ep.unregister(conn.fd)
        except OSError:
            pass
        if self._data.get(conn.fd) is conn:
            del self._data[conn.fd]

    def forget(self, conn) -> None:
        """A connection a pool thread closed (the kernel dropped it from epoll): its fd may be reused already."""
        if self._data.get(conn.fd) is conn:
            del self._data[conn.fd]

    def select(self, timeout: float) -> list:
        try:
            events = self._ep.poll(timeout, 256)
        except InterruptedError:
            return []
        data = self._data
        return [data.get(fd) for fd, _ in events]

    def close(self) -> None:
        self._ep.close()


class SelectorPoller:
    """selectors fallback: registered while waiting for bytes, unregistered while a pool thread answers."""

    threadsafe = False

    def __init__(self):
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

    def dispatched(self, conn) -> None:
        self._sel.unregister(conn.sock)

    def remove(self, conn) -> None:
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def forget(self, conn) -> None:
        pass   # never registered while a pool thread had it

    def select(self, timeout: float) -> list:
        try:
            return [key.data for key, _ in self._sel.select(timeout)]
        except InterruptedError:
            return []

    def close(self) -> None:
        self._sel.close()


def make_poller():
    return EpollPoller() if hasattr(select, "epoll") else SelectorPoller()
