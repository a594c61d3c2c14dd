"""One shared-memory table per host for rate-limit buckets, max_concurrent slots and quota counts of every worker.

The gunicorn master creates the table before forking (`start_instance`, from gunicorn_conf.on_starting); every
worker inherits it (`shared()`); without a master (tests, the CLI, an in-process Gateway) `HostTable.create()`
makes a private one, used the same way. The memory is a memfd named nowhere (qag/hostmem.py).

Every operation is one short critical section under the table's mutex, done by the shmsync twin's `Table`
(qag/_speedups: compiled, a compare-and-swap on the lock word and the entries read and written as C structs;
pure, an fcntl record lock and `struct` on the mapping; either is taken over from a dead holder). A call's key
bucket and quota reservation are one section (`admit`). No store read or other I/O ever happens under the lock (a
quota seed or re-read is read first, then applied in a second section). This module names the entries (an
identity hashed once per name) and keeps the API the limiters use.

Layout (little-endian, 8-byte words):

    header   +0 magic b"QAGLIMT1"   +8 entries   +16 lock   +24 full (no room: counted per worker)
             +32 evictions   +40..+63 zero
    index    entries words at +64: h1 of the entry in that place (0 = free)
    entries  ENTRY bytes each, after the index: h2, kind, used_at (f64), then by kind
             bucket  (kind 1, a key's; kind 4, a client address's) tokens (f64), refilled at (f64), count,
                     period (f64)
             slots   (kind 2) held, then SLOT_PIDS holder pids (u32) and as many counts (u32)
             quota   (kind 3) calls, rows, base_calls, base_rows, other_calls, other_rows, read_at (f64), flushing,
                     flush_deadline (f64), reset_at (f64, Unix), then QUOTA_PIDS holder pids and counts (u32)

A holder is a pid and how many slots (or reserved, unsettled quota calls) that process holds, so the
holds of a process that died (SIGKILL) are given back: when a key is at its limit, dead holders are looked for
(a kill(pid, 0) each), and the master sweeps a dead worker's pid from every entry (`sweep`, from child_exit).

An identity (kind and name) hashes to 128 bits (blake2b): h1 in the index, h2 in the entry. It lives in one of
PROBE consecutive places from h1. A full window evicts, in this order, only what loses nothing: a bucket that
has refilled to its capacity, a slots entry that no one holds, a quota entry whose counts are all in the store
and that no one holds (or whose period ended). A key's entry (its bucket, slots or quota counter) then evicts
the least recently used client-address bucket of the window: anyone can make address buckets (one request from
each of many addresses, cheap with IPv6), so they must never keep a key's limits out of the table, and an
address bucket dropped only gives that address a fresh budget, which an attacker with many addresses has anyway.
An address bucket never evicts anything that has not refilled. When nothing can go, the call is counted by its
worker alone (`None` is returned; the caller falls back to its per-worker limiter) and `full` is counted: a
limited key is never let through because the table is full.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import time
import weakref

from .. import _speedups
from ..hostmem import map_anonymous

MAGIC = int.from_bytes(b"QAGLIMT1", "little")
HEADER = 64
LOCK, FULL, EVICTIONS = 16, 24, 32
ENTRY = 192
PROBE = 8
MIN_ENTRIES = 64
DEFAULT_ENTRIES = 16384

BUCKET, SLOTS, QUOTA, ADDRESS = 1, 2, 3, 4   # entry kinds; ADDRESS: a client address's bucket
CLIENT = "client"   # the bucket kind (RateLimiter.kind) of client addresses: made ADDRESS entries
SLOT_PIDS = 20
QUOTA_PIDS = 11
FLUSH_GRACE = 30.0   # seconds after which a flush that never reported back (its worker died) stops counting

_pid = [os.getpid()]   # this process's pid, kept current across forks (a call saves asking the kernel)
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
# kind -> {name: (h1, h2)}: the hash is a third of a limiter step's cost. Kinds: "b" + a bucket's kind, "s", "q".
_IDENTITIES: dict[str, dict] = {}
_IDENTITIES_MAX = 4096


def identity(kind: str, name: str) -> tuple[int, int]:
    """(h1, h2) of an entry: 128 bits of blake2b; h1 is never 0 (0 marks a free place)."""
    names = _IDENTITIES.get(kind)
    if names is None:
        names = _IDENTITIES[kind] = {}
    found = names.get(name)
    if found is None:
        digest = hashlib.blake2b(f"{kind}\x00{name}".encode("utf-8", "surrogatepass"), digest_size=16).digest()
        h1, h2 = struct.unpack("<QQ", digest)
        found = (h1 | 1, h2)
        if len(names) >= _IDENTITIES_MAX:
            names.clear()   # many client addresses: start over rather than track recency
        names[name] = found
    return found


class HostTable:
    """The mapped table: token buckets, slots and quota counts by identity, under one cross-process mutex."""

    def __init__(self, mm, fd: int, entries: int, twin=None, clock=time.monotonic, wall=time.time):
        self._mm = mm
        self.fd = fd
        self.entries = entries
        twin = twin or _speedups.get("shmsync")
        self.sync = twin.Sync(mm, fd)
        self.ops = twin.Table(self.sync, entries, clock, wall)   # every operation, each under the lock
        self._close_fd = weakref.finalize(self, os.close, fd)

    @classmethod
    def create(cls, entries: int = DEFAULT_ENTRIES, twin=None, clock=time.monotonic, wall=time.time) -> "HostTable":
        """A new zeroed table of `entries` places (at least MIN_ENTRIES), named nowhere."""
        entries = max(MIN_ENTRIES, int(entries))
        mm, fd = map_anonymous(HEADER + entries * (8 + ENTRY), "qag-limits")
        table = cls(mm, fd, entries, twin, clock, wall)
        table.sync.store(8, entries)
        table.sync.store(0, MAGIC)
        return table

    def close(self) -> None:
        if self._mm is None:
            return
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    def stats(self) -> dict:
        load = self.sync.load
        return {"entries": self.entries, "used": self.ops.used(), "full": load(FULL), "evictions": load(EVICTIONS)}

    # --- token buckets (contract 6.6) --------------------------------------------------------------------
    def take(self, kind: str, ident, count: int, period: float):
        """Spend one token of the bucket: as limits.Buckets.take, (left, 0) or (0, retry_after); None when the
        table has no room for it."""
        h1, h2 = identity("b" + kind, str(ident))
        return self.ops.take(h1, h2, count, period, kind == CLIENT)

    def admit(self, kind: str, ident, count: int, period: float, key: str, calls_limit: int, rows_limit: int,
              reserve: bool, reread_every: float):
        """take() of the bucket, then quota() of the counter `key`, in one critical section; the quota reserves
        only when `reserve` and the bucket let the call through. (left, retry_after, quota()'s result), or None
        when the table has no room for the bucket (then nothing else was done)."""
        bh1, bh2 = identity("b" + kind, str(ident))
        qh1, qh2 = identity("q", key)
        return self.ops.admit(bh1, bh2, count, period, qh1, qh2, calls_limit, rows_limit, reserve, reread_every,
                              _pid[0], kind == CLIENT)

    # --- max_concurrent slots (contract 6.7) -------------------------------------------------------------
    def acquire(self, name: str, limit: int):
        """Take one of name's `limit` slots for this process: True, False when all are held (by live processes),
        None when the table (or the entry's holders) has no room."""
        took = self.acquire_at(name, limit)
        return took if took is None or took is False else True

    def acquire_at(self, name: str, limit: int):
        """As acquire(), but a taken slot is answered by where its entry is, for release(name, at)."""
        h1, h2 = identity("s", name)
        off = self.ops.acquire(h1, h2, limit, _pid[0])
        return off if off is None or off is False else (off, h1, h2)

    def release(self, name: str, at: tuple | None = None) -> None:
        """Give back one slot of name held by this process; `at` (from acquire_at) saves looking for its entry,
        which stays where it is while a slot of it is held."""
        if at is None:
            h1, h2 = identity("s", name)
            self.ops.release(h1, h2, _pid[0])
        else:
            self.ops.release(at[1], at[2], _pid[0], at[0])

    def held(self, name: str) -> int:
        return self.ops.held(*identity("s", name))

    # --- quotas (contract 6.8) ---------------------------------------------------------------------------
    # calls/rows: this host's count of the period (seeded from the store, plus every call and row counted here,
    # reservations included); base: the part of it the store holds (the seed plus what workers wrote since);
    # other: what the store held beyond base at the last re-read (other instances' counts). A check sees
    # calls + other_calls and rows + other_rows.

    def quota(self, key: str, calls_limit: int, rows_limit: int, reserve: bool, reread_every: float):
        """Check (and with `reserve`, reserve one call of) a quota counter. Returns (allowed, calls, rows, reread)
        with calls and rows after the reservation, and reread = the entry's base when this caller should re-read
        the store's counts (then `quota_reread`); None when the entry does not exist yet (read the store, then
        `quota_seed`); False when there is no room for it. Limits: 0 = none."""
        h1, h2 = identity("q", key)
        return self.ops.quota(h1, h2, calls_limit, rows_limit, reserve, reread_every, _pid[0])

    def quota_seed(self, key: str, calls: int, rows: int, reset_at: float) -> bool:
        """Create a counter from the store's counts (read without the lock); kept if another process created it
        meanwhile. False when there is no room."""
        h1, h2 = identity("q", key)
        return self.ops.quota_seed(h1, h2, calls, rows, reset_at)

    def quota_reread(self, key: str, base: tuple[int, int], calls: int, rows: int) -> None:
        """The store's counts read after `quota` asked for it: what they hold beyond base is other instances'. Not
        applied when a worker's write reached the store meanwhile (base moved, or a write is in flight)."""
        h1, h2 = identity("q", key)
        self.ops.quota_reread(h1, h2, base[0], base[1], calls, rows)

    def quota_add(self, key: str, calls: int, rows: int, settle: bool) -> tuple[int, int] | None:
        """Add to a counter (a given-back call is -1); settle=True also ends this process's reservation.
        Returns (calls, rows) as a check would see them, or None when the counter is gone."""
        h1, h2 = identity("q", key)
        return self.ops.quota_add(h1, h2, calls, rows, settle, _pid[0])

    def quota_peek(self, key: str) -> tuple[int, int] | None:
        """(calls, rows) as a check would see them, or None when the host counts nothing for key."""
        return self.ops.quota_peek(*identity("q", key))

    def quota_writing(self, keys: list[str], done: dict | None = None) -> None:
        """A worker's write of counted calls and rows to the store: before it (done=None) mark the counters as
        being written; after it, `done` maps key -> (calls, rows) that reached the store (empty on failure)."""
        idents = [identity("q", key) for key in keys]
        self.ops.quota_writing(idents, None if done is None else [done.get(key) for key in keys])

    # --- a worker gone -----------------------------------------------------------------------------------
    def sweep(self, pid: int, chunk: int = 512) -> int:
        """Give back every slot and reservation `pid` held (the master, when a worker exits); the lock is taken
        per chunk of places so callers are not held up. Returns the holds freed."""
        return self.ops.sweep(pid, chunk)


# --- the instance's table -------------------------------------------------------------------------------------
_instance: HostTable | None = None
_instance_lock = threading.Lock()


def start_instance(entries: int = DEFAULT_ENTRIES) -> HostTable:
    """Master, before forking: the table every worker inherits."""
    global _instance
    with _instance_lock:
        if _instance is None:
            _instance = HostTable.create(entries)
        return _instance


def stop_instance() -> None:
    global _instance
    with _instance_lock:
        table, _instance = _instance, None
    if table is not None:
        table.close()


def shared(entries: int = DEFAULT_ENTRIES) -> HostTable:
    """The master's table when there is one, else a private table for this caller (an in-process Gateway)."""
    table = _instance
    return table if table is not None else HostTable.create(entries)


def sweep(pid: int) -> None:
    """Master: a worker exited; give back what it held."""
    table = _instance
    if table is not None:
        table.sweep(pid)
