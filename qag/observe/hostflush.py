"""Read-your-writes across the workers of a host: a history read has every worker write its queued runs first.

A run is queued by the worker that served it and written to the store by that worker's history writer thread,
in batches, so a call never waits for the store. A history read on another worker would miss the runs still
queued elsewhere. So a reader bumps a host-wide request number in a small shared segment; every worker's writer
thread looks at that word every POLL seconds (one load, no lock), writes what it holds and acknowledges the number
in its own slot; the reader waits until every live worker has (a worker that died is skipped, its slot freed),
for at most a bounded time, then reads the store. Calls pay nothing: the cost falls on the (administrative) read.

Layout (8-byte little-endian words): +0 magic, +8 the slot table's mutex (qag/_speedups/shmsync), +16 the last
request number, +24 the number of slots, then one 16-byte slot per writer: +0 its pid (0 = free), +8 the last
request number it has written for.

The gunicorn master creates the segment before forking (`start_instance`, gunicorn_conf.on_starting); without one
(an in-process Gateway) a segment is private to the process, which is then the only writer it knows.
"""

from __future__ import annotations

import os
import time
import weakref

from .. import _speedups
from ..hostmem import map_anonymous

MAGIC = int.from_bytes(b"QAGFLSH1", "little")
LOCK, REQUESTED, NSLOTS, SLOTS = 8, 16, 24, 32
SLOT_BYTES = 16
MAX_WRITERS = 256      # workers of one instance whose writers take part (beyond it a worker is read without)
POLL = 0.02            # seconds between two looks of a writer thread at the request word
WAIT = 2.0             # seconds a read waits at most for the other workers' writes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # alive, under another user (not a qag worker, but not ours to free either)
        return True
    return True


class HostFlush:
    """The shared request word and the writers' slots."""

    def __init__(self, nslots: int = MAX_WRITERS, twin=None):
        size = SLOTS + nslots * SLOT_BYTES
        self._mm, self.fd = map_anonymous(size, "qag-flush")
        self.nslots = nslots
        self.sync = (twin or _speedups.get("shmsync")).Sync(self._mm, self.fd)
        self._load = self.sync.load
        self.sync.store(NSLOTS, nslots)
        self.sync.store(0, MAGIC)
        self._close_fd = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        if self._mm is None:
            return
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    # --- writers (a worker's history writer thread) -----------------------------------------------------------
    def attach(self, pid: int) -> int | None:
        """A slot for the writer of process `pid` (its own again, a free one, or a dead process's); None if full.
        Joins as having written everything asked so far: what it holds was queued after those reads began."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            free = None
            for i in range(self.nslots):
                at = SLOTS + i * SLOT_BYTES
                holder = sync.load(at)
                if holder == pid:
                    free = at
                    break
                if free is None and (holder == 0 or not _alive(holder)):
                    free = at
            if free is None:
                return None
            sync.store(free + 8, sync.load(REQUESTED))
            sync.store(free, pid)
            return free
        finally:
            sync.unlock(LOCK)

    def detach(self, slot: int, pid: int) -> None:
        """The writer stopped (a graceful stop): readers no longer wait for it."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(slot) == pid:
                sync.store(slot, 0)
        finally:
            sync.unlock(LOCK)

    def wanted(self, slot: int) -> int:
        """The request number this writer has not written for yet, or 0 (a lock-free look)."""
        requested = self._load(REQUESTED)
        return requested if requested > self._load(slot + 8) else 0

    def ack(self, slot: int, number: int) -> None:
        """Everything this writer held when `number` was asked is written (only the slot's own writer stores it)."""
        if self._load(slot + 8) < number:
            self.sync.store(slot + 8, number)

    # --- readers ---------------------------------------------------------------------------------------------
    def request(self) -> int:
        """A new request number: every writer is to write what it holds now."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            number = sync.load(REQUESTED) + 1
            sync.store(REQUESTED, number)
            return number
        finally:
            sync.unlock(LOCK)

    def wait(self, number: int, timeout: float = WAIT, sleep=time.sleep) -> bool:
        """Until every live writer has written for `number` (True), or `timeout` passed (False)."""
        deadline = time.monotonic() + timeout
        pause = 0.001
        while True:
            behind = self._behind(number)
            if not behind:
                return True
            if time.monotonic() >= deadline:
                return False
            for slot, pid in behind:
                if not _alive(pid):
                    self.detach(slot, pid)
            sleep(pause)
            pause = min(pause * 2, POLL / 2)

    def _behind(self, number: int) -> list[tuple[int, int]]:
        load = self._load
        out = []
        for i in range(self.nslots):
            at = SLOTS + i * SLOT_BYTES
            pid = load(at)
            if pid and load(at + 8) < number:
                out.append((at, pid))
        return out


# --- the master's segment (gunicorn_conf hooks) --------------------------------------------------------------
_shared: HostFlush | None = None


def start_instance() -> HostFlush:
    """Master, before forking: the host's segment, inherited by every worker forked from now on."""
    global _shared
    if _shared is None:
        _shared = HostFlush()
    return _shared


def stop_instance() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


def shared() -> HostFlush | None:
    """The master's segment in a worker it forked (None in a process no qag master forked)."""
    return _shared
