"""Bounded waits on a database's network path: a watchdog that cuts a call's socket past its deadline, and TCP
keepalive for sockets with no call on them.

A driver blocked in a read (mysqlclient's C client) waits as long as the socket does: on a network path that
black-holes packets, that is until the kernel gives up, minutes later. The server's own time limit cannot help
when its answer never arrives. So a call arms the watchdog with its deadline (time limit + NETWORK_MARGIN); one
thread per process looks at the armed calls every TICK seconds and shuts down the socket of any call past its
deadline, which wakes the blocked read at once with an error. The caller sees that it fired (`disarm` returns
True), answers 504 and closes the connection; a `cancel` given when arming (MySQL: KILL QUERY from a fresh
connection) then runs on a thread of its own, bounded by its own connect timeout, so the server stops the
statement too where it can be reached.

Cost on the call's path: a lock taken twice and a dict entry added and removed; no thread is woken.

A connection with no call in flight (or a call without a time limit) relies on TCP: keepalive probes after
KEEPALIVE_IDLE s of silence, and TCP_USER_TIMEOUT where the platform has it, so a peer that vanished is noticed
within about a minute instead of the kernel's default of hours.
"""

from __future__ import annotations

import os
import socket
import threading
from time import monotonic, sleep
from typing import Callable

# How long past its time limit a call may wait for a network that stopped answering (documented in
# docs/deployment.md). The server cancels at the limit; this only covers the reply that never comes.
NETWORK_MARGIN = 1.0
TICK = 0.1   # the watchdog's resolution: a cut comes at most this late
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3
USER_TIMEOUT_MS = 60_000   # unacknowledged data older than this ends the connection


class Watchdog:
    """`token = arm(fd, deadline[, cancel])` before the blocking call, `fired = disarm(token)` after it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: dict[int, tuple] = {}   # token → (deadline, fd, cancel, its arguments)
        self._last = 0   # the last token given (under the lock)
        self._thread: threading.Thread | None = None
        self.fired = 0   # calls cut so far (a metric)

    def arm(self, fd: int, deadline: float, cancel: Callable[..., None] | None = None, args: tuple = ()) -> int:
        with self._lock:
            self._last += 1
            token = self._last
            self._armed[token] = (deadline, fd, cancel, args)
            if self._thread is None:
                self._start()
        return token

    def disarm(self, token: int) -> bool:
        """Forget the call; True when its socket was cut (the connection must be closed, never pooled)."""
        with self._lock:
            return self._armed.pop(token, None) is None

    def _start(self) -> None:
        # Started on first use, so a process that forks after importing this (gunicorn's preload) gets its own.
        self._thread = threading.Thread(target=self._watch, name="qag-db-watchdog", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while True:
            sleep(TICK)
            now = monotonic()
            cancels = []
            with self._lock:
                for token in [t for t, entry in self._armed.items() if entry[0] <= now]:
                    _, fd, cancel, args = self._armed.pop(token)
                    # Under the lock: the caller closes its connection (and so its descriptor, which could then
                    # be reused by another socket) only after disarm, which waits for this.
                    _cut(fd)
                    self.fired += 1
                    if cancel is not None:
                        cancels.append((cancel, args))
            for cancel, args in cancels:
                threading.Thread(target=_quietly, args=(cancel, args), name="qag-db-cancel", daemon=True).start()

    def after_fork(self) -> None:
        """A forked child has none of its parent's threads: start afresh."""
        self._lock = threading.Lock()
        self._armed = {}
        self._thread = None


def _cut(fd: int) -> None:
    """Shut the socket down both ways: a read blocked on it returns at once. The descriptor stays open (its
    owner closes it)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


def tcp_keepalive(fd: int) -> None:
    """Turn on keepalive probes and the user timeout on a connected socket (options the platform lacks are
    skipped)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT), ("TCP_USER_TIMEOUT", USER_TIMEOUT_MS)):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
    except OSError:
        pass   # a Unix socket has no TCP options
    finally:
        sock.detach()


def deadline_of(timeout: float | None) -> float | None:
    """The monotonic time a call with this time limit must be answered by (None: no limit)."""
    return monotonic() + timeout + NETWORK_MARGIN if timeout else None


def _quietly(cancel: Callable[..., None], args: tuple) -> None:
    try:
        cancel(*args)
    except Exception:  # best effort: the server may be as unreachable as the call was
        pass


WATCHDOG = Watchdog()
os.register_at_fork(after_in_child=WATCHDOG.after_fork)
