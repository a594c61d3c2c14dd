"""A bounded in-memory buffer drained by one background thread that writes its records in batches.

Request threads only `put()`: one deque append, no lock, no I/O. When the buffer is full the oldest unwritten
record is dropped and counted (the drop path alone takes a small lock, so the count is exact). The writer wakes
every `interval` seconds (sooner once `wake_at` records are queued), hands everything queued to `write(batch)`
and retries a batch the store refused for being busy. `flush()` writes what is queued now and returns once it is
written (read-your-writes); `close()` flushes and stops the thread (graceful shutdown).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Callable

from . import hostflush

log = logging.getLogger("qag")

HOLD_SECONDS = 30.0     # how long a batch the store refused (busy, locked, down) is held and retried, counted from
                        # its first failure, before it counts as failed: a store outage of half a minute loses no
                        # record. Time, not attempts: every history read asks every writer for one more attempt
                        # (hostflush), so an administrator polling a management view made 30 attempts in a second.
CLOSE_SECONDS = 5.0     # at close (a reload, a stop, a recycle), how long a refused batch is still retried: a short
                        # outage then loses nothing, and the worker's exit waits for a down store only this long
_CLOSE_RETRY = 0.25     # seconds between those last attempts
_DROP_LOG_EVERY = 60.0  # seconds between "buffer full" log lines

_writers: "weakref.WeakSet[BatchWriter]" = weakref.WeakSet()

PAUSE_EVERY = 64        # records a writer thread prepares between two pauses (about 0.2-0.6 ms of its work)
_PAUSE_SECONDS = 0.00005


def pause() -> None:
    """Let the request threads in: a writer preparing a batch (hundreds of records formatted by compiled code that
    holds the interpreter lock throughout) sleeps a moment every PAUSE_EVERY records. Without it, a request thread
    woken meanwhile by its database's reply or its client's bytes waits for the whole batch (or for the 5 ms switch
    interval): 2.1 ms for 500 runs on a pinned core, 0.37 ms with the pauses (benchmarks/writer_wait.py). A sleep,
    not sched_yield: it lets the lock go long enough for a thread waiting on another core to take it, and gives
    this core to one waiting on it."""
    time.sleep(_PAUSE_SECONDS)


def _after_fork() -> None:
    # The writer thread does not come along into a child process (nor do its locks' states): start afresh there.
    for writer in list(_writers):
        writer._forked()


os.register_at_fork(after_in_child=_after_fork)


class BatchWriter:
    """One per worker and kind of record; the thread starts on the first put (never in a process that only
    administers), and again after a fork."""

    def __init__(self, name: str, write: Callable[[list, str], None], *, capacity: int, interval: float,
                 wake_at: int = 500, tick: Callable[[], None] | None = None, tick_every: float = 600.0,
                 retry: Callable[[BaseException], object] = lambda exc: False, host=None):
        self.name = name
        self._host = host                     # a hostflush.HostFlush: other workers' readers may ask for a write
        self.capacity = capacity
        self.interval = interval
        self.wake_at = max(1, wake_at) if interval > 0 else 1
        self._write = write
        self._tick = tick
        self._tick_every = tick_every
        self._retry = retry
        self._queue: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._flush_lock = threading.Lock()   # one batch write at a time: the thread's, or a reader's flush()
        self._drop_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._running = False
        self._closed = False
        self._held: list = []                 # a batch the store refused, retried first
        self._held_id = ""                    # ... under the id it was first written with
        self._held_since = 0.0                # when the held batch's first write failed (monotonic), 0: none held
        self.dropped = 0
        self.written = 0
        self.failed = 0
        self._dropped_logged = 0
        self._last_drop_log = 0.0
        _writers.add(self)

    # --- request threads ----------------------------------------------------------------------------------
    def put(self, record) -> None:
        queue = self._queue
        if len(queue) >= self.capacity:
            self._drop_oldest()
        queue.append(record)
        if not self._running:
            self._start()
        elif len(queue) == self.wake_at:
            self._wake.set()
        if self._closed:  # shut down already: the writer is gone, so a late record is written now
            self._drain(final=True)

    def _drop_oldest(self) -> None:
        try:
            self._queue.popleft()
        except IndexError:  # the writer took everything meanwhile
            return
        with self._drop_lock:
            self.dropped += 1

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._held)

    # --- the writer -------------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._drop_lock:
            if self._running or self._closed:
                return
            self._running = True
            self._thread = threading.Thread(target=self._loop, name=f"qag-{self.name}-writer", daemon=True)
            self._thread.start()

    def _forked(self) -> None:
        self._flush_lock = threading.Lock()
        self._drop_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = None
        self._running = False

    def _loop(self) -> None:
        host, pid = self._host, os.getpid()
        slot = host.attach(pid) if host is not None else None
        try:
            self._serve(host, slot)
        finally:
            if slot is not None:
                host.detach(slot, pid)

    def _serve(self, host, slot: int | None) -> None:
        interval = self.interval if self.interval > 0 else 0.05
        # With readers elsewhere on the host, the thread also looks at their request word between writes.
        pause = min(interval, hostflush.POLL) if slot is not None else interval
        next_tick = time.monotonic() + min(self._tick_every, 5.0)  # a first sweep soon after start
        next_write = time.monotonic() + interval
        while not self._closed:
            woke = self._wake.wait(pause)
            if self._closed:
                break
            asked = host.wanted(slot) if slot is not None else 0
            now = time.monotonic()
            if asked:
                with self._flush_lock:
                    self._drain_locked(final=False, until_empty=True)
                host.ack(slot, asked)
            elif woke or now >= next_write:
                self._wake.clear()
                next_write = now + interval
                self._drain(final=False)
            else:
                continue
            self._log_drops()
            if self._tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_every
                try:
                    self._tick()
                except Exception as exc:  # a failed sweep is retried at the next tick
                    log.warning("%s: background sweep failed: %s", self.name, exc)

    def _drain(self, final: bool, linger: float = 0.0) -> None:
        with self._flush_lock:
            self._drain_locked(final, False, linger)

    def _drain_locked(self, final: bool, until_empty: bool, linger: float = 0.0) -> None:
        """final: write everything now, nothing is held for later; a batch the store refuses is retried for
        `linger` seconds more (close), then lost."""
        queue = self._queue
        give_up = time.monotonic() + linger
        while True:
            if self._held:
                # Sent again alone, as it was and under its id: a write that failed may have been applied (its
                # commit's reply lost), and the store skips a batch whose id it has (Store.add_runs).
                batch, batch_id = self._held, self._held_id
                self._held = []
            else:
                batch, batch_id = [], os.urandom(12).hex()
                while queue:
                    try:
                        batch.append(queue.popleft())
                    except IndexError:
                        break
                if not batch:
                    return
            try:
                self._write(batch, batch_id)
            except Exception as exc:
                if not self._retry(exc):
                    self._lost(batch, exc)
                else:
                    now = time.monotonic()
                    if not self._held_since:   # once an outage, not once an attempt
                        self._held_since = now
                        log.warning("%s: store unavailable, %d records held for the next write (%s)",
                                    self.name, len(batch), exc)
                    self._held, self._held_id = batch, batch_id
                    if not final and now - self._held_since < HOLD_SECONDS:
                        return
                    if final and now < give_up:
                        time.sleep(_CLOSE_RETRY)
                        continue
                    self._held = []
                    self._lost(batch, exc)
            else:
                self._held_since = 0.0
                self.written += len(batch)
            if not final and not until_empty and len(queue) < self.wake_at:
                return

    def _lost(self, batch: list, exc: BaseException) -> None:
        self._held_since = 0.0
        self.failed += len(batch)
        log.error("%s: %d records could not be written and are lost: %s", self.name, len(batch), exc)

    def _log_drops(self) -> None:
        now = time.monotonic()
        if self.dropped != self._dropped_logged and now - self._last_drop_log >= _DROP_LOG_EVERY:
            log.warning("%s: buffer full (%d), dropped %d oldest unwritten records since the last report",
                        self.name, self.capacity, self.dropped - self._dropped_logged)
            self._dropped_logged = self.dropped
            self._last_drop_log = now

    # --- readers and shutdown ---------------------------------------------------------------------------
    def flush(self, block: bool = True) -> None:
        """Write everything queued by this process now (a reader's read-your-writes). block=False: unless the
        writer thread is writing right now (a caller inside a store transaction must not wait for it)."""
        if not (self._queue or self._held):
            return
        if self._flush_lock.acquire(blocking=block):
            try:
                self._drain_locked(final=False, until_empty=True)
            finally:
                self._flush_lock.release()

    def close(self) -> None:
        """Final flush; later records are written at once by the closing thread (nothing is left behind). What
        the store refuses is retried for CLOSE_SECONDS, then lost (logged with its count): nothing outlives the
        process to write it later."""
        self._closed = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and self._running:
            thread.join(5.0)
        self._drain(final=True, linger=CLOSE_SECONDS)
        self._log_drops_now()

    def _log_drops_now(self) -> None:
        if self.dropped != self._dropped_logged:
            self._last_drop_log = 0.0
            self._log_drops()
