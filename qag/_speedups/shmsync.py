"""Shared-memory synchronisation for the host's shared state (the metadata cache, the response cache, the host
table of limits): the pure-Python twin of the compiled _shmsync.

`Sync(buf, fd)` works on a writable buffer (an mmap of a shared segment) of 64-bit words, all offsets in bytes
and 8-aligned. Both twins give the same results and raise the same exceptions:

- `load(off)` / `store(off, value)`: one unsigned 64-bit little-endian word. A load never takes a lock; a store
  is for the holder of the lock at LOCK (or for words only one process writes).
- `lock(off)` / `unlock(off)`: a mutex for every thread of every process that maps the segment. Compiled: a
  compare-and-swap of the word at `off` from 0 to the caller's pid, spinning with the GIL released, and taken
  over when the pid in it is dead (a worker killed while holding it). Pure: a process-local thread lock plus an
  fcntl record lock on byte `off` of `fd` (released by the kernel when a process dies); with fd < 0 there is
  only one process (an anonymous segment) and the thread lock is enough.
- `write(seq_off, data_off, data)`: a seqlock write, under the lock: the sequence word goes odd, the bytes are
  copied, the sequence goes even again (a sequence left odd by a dead writer is moved on first). Returns the
  new, even sequence.
- `read(seq_off, data_off, length)`: a lock-free seqlock read: `(sequence, bytes)` when the sequence was even
  and unchanged across the copy, else None (a write was in progress or happened meanwhile: retry or give up).
- `Table(sync, entries, clock, wall)`: the host table of rate-limit buckets, max_concurrent slots and quota counts
  (qag/policy/hostlimits.py documents the layout and the rules) on the buffer of `sync`: every operation is one
  critical section under the mutex at TABLE_LOCK (take, admit, acquire, release, quota, ...). The compiled twin
  reads and writes the entries as C structs and never leaves C inside the lock (unless a test injects a clock);
  this one packs them with `struct`. Both leave the same bytes and give the same answers.

Any offset or length outside the buffer, or a misaligned word, raises ValueError; nothing reads or writes out
of bounds. The pure twin relies on CPython reading and writing an aligned 8-byte word in one instruction and on
the processor not reordering loads (x86); the callers also check a CRC of what they read, which covers weaker
memory orders.
"""

from __future__ import annotations

import fcntl
import math
import os
import struct
import threading
import time
import weakref

__all__ = ["Sync", "Table"]

_WORD = struct.Struct("<Q")
_WRAP = 2 ** 64 - 1


class Sync:
    """Word access, a cross-process mutex, and seqlock copies on one shared buffer."""

    def __init__(self, buf, fd: int = -1):
        view = memoryview(buf)
        if view.readonly:
            raise ValueError("the shared buffer must be writable")
        self._bytes = view.cast("B")
        self._size = len(self._bytes)
        self._fd = int(fd)
        self._thread_lock = threading.Lock()
        _all.add(self)

    @property
    def size(self) -> int:
        return self._size

    def _word(self, off: int) -> int:
        if off < 0 or off + 8 > self._size or off % 8:
            raise ValueError(f"word offset {off} is outside the shared buffer or not 8-aligned")
        return off

    def _span(self, off: int, length: int) -> None:
        if off < 0 or length < 0 or off + length > self._size:
            raise ValueError(f"span {off}+{length} is outside the shared buffer")

    def load(self, off: int) -> int:
        return _WORD.unpack_from(self._bytes, self._word(off))[0]

    def store(self, off: int, value: int) -> None:
        _WORD.pack_into(self._bytes, self._word(off), value)

    def lock(self, off: int) -> None:
        self._word(off)
        self._thread_lock.acquire()
        if self._fd >= 0:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, off, os.SEEK_SET)
            except BaseException:
                self._thread_lock.release()
                raise
        _WORD.pack_into(self._bytes, off, os.getpid())

    def unlock(self, off: int) -> None:
        self._word(off)
        _WORD.pack_into(self._bytes, off, 0)
        if self._fd >= 0:
            fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, off, os.SEEK_SET)
        self._thread_lock.release()

    def write(self, seq_off: int, data_off: int, data) -> int:
        self._word(seq_off)
        data = bytes(data)
        self._span(data_off, len(data))
        seq = _WORD.unpack_from(self._bytes, seq_off)[0]
        if seq & 1:
            seq = (seq + 1) & _WRAP
        # A 64-bit word wraps round as the compiled twin's does (a stored value near 2**64 is a sequence too).
        _WORD.pack_into(self._bytes, seq_off, (seq + 1) & _WRAP)
        self._bytes[data_off:data_off + len(data)] = data
        _WORD.pack_into(self._bytes, seq_off, (seq + 2) & _WRAP)
        return (seq + 2) & _WRAP

    def read(self, seq_off: int, data_off: int, length: int):
        self._word(seq_off)
        self._span(data_off, length)
        before = _WORD.unpack_from(self._bytes, seq_off)[0]
        if before & 1:
            return None
        data = self._bytes[data_off:data_off + length].tobytes()
        if _WORD.unpack_from(self._bytes, seq_off)[0] != before:
            return None
        return before, data

    def release(self) -> None:
        """Let go of the buffer (an mmap can only be closed once nothing holds it)."""
        self._bytes.release()


_all: "weakref.WeakSet[Sync]" = weakref.WeakSet()


def _after_fork() -> None:
    # A thread of the parent may have held the thread lock at the fork; that thread does not exist in the child.
    for sync in list(_all):
        sync._thread_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


# --- the host table of rate-limit buckets, max_concurrent slots and quota counts (qag/policy/hostlimits.py) -----
#
# `Table(sync, entries, clock, wall)` does every operation of the host table on the mapping under `sync` (a
# Sync of this twin), each as one critical section under the mutex at TABLE_LOCK; entries are named by their
# identity (h1, h2), worked out by the caller. hostlimits.py documents the layout and the rules; both twins read
# and write the same bytes and give the same results. `clock` (monotonic) and `wall` (Unix) are read under the
# lock; `pid` is the calling process (a holder of slots and reservations).

TABLE_HEADER = 64
TABLE_LOCK, TABLE_FULL, TABLE_EVICTIONS = 16, 24, 32
TABLE_ENTRY = 192
TABLE_PROBE = 8
BUCKET, SLOTS, QUOTA, ADDRESS = 1, 2, 3, 4   # entry kinds: ADDRESS is a client address's bucket (a BUCKET's layout)
SLOT_PIDS = 20
QUOTA_PIDS = 11
FLUSH_GRACE = 30.0   # seconds after which a flush that never reported back (its worker died) stops counting
# The eviction rank of an address bucket that has not refilled: it may go only for a key's entry (a bucket, slots or
# quota counter of an API key), and only when nothing that loses nothing can; an address gets a fresh budget, which
# an attacker with many addresses has anyway, while a key's entry kept out would be counted per worker.
_SPENT_ADDRESS = 4

_HEAD = struct.Struct("<Qqd")                    # h2, kind, used_at
_BUCKET = struct.Struct("<Qqdddqd")              # + tokens, refilled at, count, period
_SLOTS = struct.Struct(f"<Qqdq{SLOT_PIDS}I{SLOT_PIDS}I")     # + held, holders' pids, their counts
_QUOTA = struct.Struct(f"<Qqdqqqqqqdqdd{QUOTA_PIDS}I{QUOTA_PIDS}I")
_Q_PIDS = 13                                     # index of the first holder pid in a quota entry
_S_PIDS = 4
_INDEX = struct.Struct(f"<{TABLE_PROBE}Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_HOLDERS = struct.Struct(f"<{SLOT_PIDS}I")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _take_hold(e: list, first: int, count: int, pid: int) -> bool:
    """Add one hold of `pid` to the holders e[first:first + count] (counts after them); False when all are taken."""
    pids = e[first:first + count]
    try:
        i = pids.index(pid)
    except ValueError:
        try:
            i = pids.index(0)
        except ValueError:
            return False
        e[first + i] = pid
    e[first + count + i] += 1
    return True


def _drop_hold(e: list, first: int, count: int, pid: int) -> bool:
    try:
        i = e[first:first + count].index(pid)
    except ValueError:
        return False
    n = e[first + count + i] - 1
    e[first + count + i] = n
    if n <= 0:
        e[first + i] = e[first + count + i] = 0
    return True


def _reclaim(e: list, first: int, count: int, dead: int = 0) -> int:
    """Clear the holders that died (or the one pid `dead`); how many holds they had."""
    freed = 0
    for i in range(first, first + count):
        pid = e[i]
        if pid and (pid == dead if dead else not _alive(pid)):
            freed += e[i + count]
            e[i] = e[i + count] = 0
    return freed


class Table:
    """The host table's operations on a mapping (qag/policy/hostlimits.py), under `sync`'s mutex."""

    def __init__(self, sync: Sync, entries: int, clock=time.monotonic, wall=time.time):
        if entries < TABLE_PROBE or TABLE_HEADER + entries * (8 + TABLE_ENTRY) > sync.size:
            raise ValueError(f"a table of {entries} entries does not fit the shared buffer")
        self._sync = sync
        self._buf = sync._bytes
        self.entries = entries
        self._data = TABLE_HEADER + entries * 8
        self._clock = clock
        self._wall = wall

    # --- places (under the lock) ----------------------------------------------------------------------------
    def _find(self, h1: int, h2: int, now: float, insert: bool = True, address: bool = False):
        """(place of the entry, True) when present, else (a place to put it in, False) - a free one, or one whose
        entry may go (for a key's entry, `address` False, the least recently used spent address bucket last) - or
        (None, False) when none may."""
        start = h1 % (self.entries - TABLE_PROBE + 1)
        buf = self._buf
        words = _INDEX.unpack_from(buf, TABLE_HEADER + start * 8)
        data = self._data
        j = -1
        while True:
            try:
                j = words.index(h1, j + 1)
            except ValueError:
                break
            if _WORD.unpack_from(buf, data + (start + j) * TABLE_ENTRY)[0] == h2:
                return start + j, True
        if not insert:
            return None, False
        if 0 in words:
            return start + words.index(0), False
        wall = self._wall()
        victim, rank, oldest = None, 9, 0.0
        for j in range(TABLE_PROBE):
            off = data + (start + j) * TABLE_ENTRY
            r = self._evictable(off, now, wall, address)
            if r == _SPENT_ADDRESS:
                used = _HEAD.unpack_from(buf, off)[2]
                if rank > r or (rank == r and used < oldest):
                    victim, rank, oldest = start + j, r, used
            elif r < rank:
                victim, rank = start + j, r
        return victim, False

    def _evictable(self, off: int, now: float, wall: float, address: bool) -> int:
        """1 (a full bucket), 2 (unheld slots), 3 (a written, unheld quota entry or a past period), 4 (a spent
        address bucket, when the entry to place is a key's: `address` False), 9 (keep)."""
        buf = self._buf
        kind = _HEAD.unpack_from(buf, off)[1]
        if kind == BUCKET or kind == ADDRESS:
            _h2, _k, _u, tokens, at, count, per = _BUCKET.unpack_from(buf, off)
            if per <= 0 or tokens + (now - at) * count / per >= count:   # per 0: never written
                return 1
            return _SPENT_ADDRESS if kind == ADDRESS and not address else 9
        if kind == SLOTS:
            return 2 if _SLOTS.unpack_from(buf, off)[3] <= 0 else 9
        if kind == QUOTA:
            e = _QUOTA.unpack_from(buf, off)
            if wall > e[12] + 60:
                return 3
            held = any(e[_Q_PIDS:_Q_PIDS + QUOTA_PIDS])
            return 3 if not held and e[3] == e[5] and e[4] == e[6] and e[10] <= 0 else 9
        return 1

    def _claim(self, place: int, h1: int) -> None:
        """Name the place's new entry in the index (after the entry is written, so no one matches it half-made)."""
        index = TABLE_HEADER + place * 8
        if _WORD.unpack_from(self._buf, index)[0]:
            self._add_word(TABLE_EVICTIONS)
        _WORD.pack_into(self._buf, index, h1)

    def _add_word(self, off: int) -> None:
        _WORD.pack_into(self._buf, off, _WORD.unpack_from(self._buf, off)[0] + 1)

    def _entry(self, h1: int, h2: int) -> int:
        """Offset of an existing entry, or -1."""
        place, found = self._find(h1, h2, 0.0, insert=False)
        return self._data + place * TABLE_ENTRY if found else -1

    # --- token buckets --------------------------------------------------------------------------------------
    def _take(self, h1: int, h2: int, count: int, period: float, now: float, address: bool):
        place, found = self._find(h1, h2, now, True, address)
        if place is None:
            self._add_word(TABLE_FULL)
            return None
        buf = self._buf
        off = self._data + place * TABLE_ENTRY
        if found:
            _h2, _k, _u, tokens, at, _c, _p = _BUCKET.unpack_from(buf, off)
            # A changed limit (a PATCHed key) keeps what was used, within the new capacity.
            tokens = min(float(count), tokens + (now - at) * (count / period))
        else:
            tokens = float(count)
        if tokens >= 1.0:
            tokens -= 1.0
            result = (int(tokens), 0)
        else:
            result = (0, max(1, math.ceil((1.0 - tokens) * period / count)))
        _BUCKET.pack_into(buf, off, h2, ADDRESS if address else BUCKET, now, tokens, now, count, float(period))
        if not found:
            self._claim(place, h1)
        return result

    def take(self, h1: int, h2: int, count: int, period: float, address: bool = False):
        """Spend one token of the bucket: (whole tokens left, 0) or (0, retry_after); None when there is no room.
        `address`: the bucket is a client address's (an ADDRESS entry, which never keeps a key's entry out)."""
        sync = self._sync
        sync.lock(TABLE_LOCK)
        try:
            return self._take(h1, h2, count, period, self._clock(), address)
        finally:
            sync.unlock(TABLE_LOCK)

    # --- max_concurrent slots -------------------------------------------------------------------------------
    def acquire(self, h1: int, h2: int, limit: int, pid: int):
        """Take one of the entry's `limit` slots for `pid`: the entry's offset (for release), False when all are
        held by live processes, None when the table (or the entry's holders) has no room."""
        sync, buf = self._sync, self._buf
        sync.lock(TABLE_LOCK)
        try:
            now = self._clock()
            place, found = self._find(h1, h2, now)
            if place is None:
                self._add_word(TABLE_FULL)
                return None
            off = self._data + place * TABLE_ENTRY
            if found:
                e = list(_SLOTS.unpack_from(buf, off))
            else:
                e = [h2, SLOTS, now, 0] + [0] * (2 * SLOT_PIDS)
            if e[3] >= limit:
                e[3] -= _reclaim(e, _S_PIDS, SLOT_PIDS)   # holders that died
                if e[3] >= limit:
                    _SLOTS.pack_into(buf, off, *e)
                    return False
            if not _take_hold(e, _S_PIDS, SLOT_PIDS, pid):
                e[3] -= _reclaim(e, _S_PIDS, SLOT_PIDS)
                if not _take_hold(e, _S_PIDS, SLOT_PIDS, pid):
                    self._add_word(TABLE_FULL)
                    return None
            e[3] += 1
            e[2] = now
            _SLOTS.pack_into(buf, off, *e)
            if not found:
                self._claim(place, h1)
            return off
        finally:
            sync.unlock(TABLE_LOCK)

    def release(self, h1: int, h2: int, pid: int, at: int = -1) -> None:
        """Give back one slot held by `pid`; `at` (from acquire) saves looking for the entry, which stays where it
        is while a slot of it is held. Writes only the words that change."""
        sync, buf = self._sync, self._buf
        sync.lock(TABLE_LOCK)
        try:
            if (at >= self._data and (at - self._data) % TABLE_ENTRY == 0 and at + TABLE_ENTRY <= len(buf)
                    and _WORD.unpack_from(buf, at)[0] == h2):
                off = at
            else:
                off = self._entry(h1, h2)
                if off < 0:
                    return
            try:
                i = _HOLDERS.unpack_from(buf, off + 32).index(pid)
            except ValueError:
                return
            count_at = off + 32 + 4 * SLOT_PIDS + 4 * i
            n = _U32.unpack_from(buf, count_at)[0] - 1
            if n <= 0:
                _U32.pack_into(buf, off + 32 + 4 * i, 0)
                n = 0
            _U32.pack_into(buf, count_at, n)
            _I64.pack_into(buf, off + 24, _I64.unpack_from(buf, off + 24)[0] - 1)
        finally:
            sync.unlock(TABLE_LOCK)

    def held(self, h1: int, h2: int) -> int:
        self._sync.lock(TABLE_LOCK)
        try:
            off = self._entry(h1, h2)
            return _SLOTS.unpack_from(self._buf, off)[3] if off >= 0 else 0
        finally:
            self._sync.unlock(TABLE_LOCK)

    # --- quotas ---------------------------------------------------------------------------------------------
    def _quota(self, h1: int, h2: int, calls_limit: int, rows_limit: int, reserve: bool, reread_every: float,
               pid: int, now: float):
        place, found = self._find(h1, h2, now)
        if not found:
            return None if place is not None else False
        buf = self._buf
        off = self._data + place * TABLE_ENTRY
        e = list(_QUOTA.unpack_from(buf, off))
        reread = None
        if now - e[9] >= reread_every and (e[10] <= 0 or now > e[11]):
            e[9], e[10] = now, 0
            reread = (e[5], e[6])
        calls, rows = e[3] + e[7], e[4] + e[8]
        allowed = 1
        if reserve:
            if calls_limit and calls >= calls_limit and any(e[_Q_PIDS:_Q_PIDS + QUOTA_PIDS]):
                freed = _reclaim(e, _Q_PIDS, QUOTA_PIDS)   # reservations of processes that died: give back
                e[3] -= freed
                calls -= freed
            if (calls_limit and calls >= calls_limit) or (rows_limit and rows >= rows_limit):
                allowed = 0
            else:
                # A reservation without a free holder place is counted all the same; only its give-back on a
                # SIGKILL of its worker would be lost.
                _take_hold(e, _Q_PIDS, QUOTA_PIDS, pid)
                e[3] += 1
                calls += 1
        e[2] = now
        _QUOTA.pack_into(buf, off, *e)
        return allowed, calls, rows, reread

    def quota(self, h1: int, h2: int, calls_limit: int, rows_limit: int, reserve: bool, reread_every: float,
              pid: int):
        """Check (and with `reserve`, reserve one call of) a quota counter: (allowed, calls, rows, reread) with
        calls and rows after the reservation, reread = the entry's base (calls, rows) when this caller should
        re-read the store, else None; None when the entry does not exist (seed it); False when there is no room
        for it. Limits: 0 = none."""
        sync = self._sync
        sync.lock(TABLE_LOCK)
        try:
            return self._quota(h1, h2, calls_limit, rows_limit, reserve, reread_every, pid, self._clock())
        finally:
            sync.unlock(TABLE_LOCK)

    def admit(self, bh1: int, bh2: int, count: int, period: float, qh1: int, qh2: int, calls_limit: int,
              rows_limit: int, reserve: bool, reread_every: float, pid: int, address: bool = False):
        """A call's token and its quota in one critical section: take() of the bucket (`address` as take()'s),
        then quota() of the counter, which reserves only when `reserve` and the bucket let the call through.
        (left, retry_after, quota()'s result), or None when the bucket has no room (then nothing else was done)."""
        sync = self._sync
        sync.lock(TABLE_LOCK)
        try:
            now = self._clock()
            taken = self._take(bh1, bh2, count, period, now, address)
            if taken is None:
                return None
            left, retry = taken
            return left, retry, self._quota(qh1, qh2, calls_limit, rows_limit, reserve and not retry,
                                            reread_every, pid, now)
        finally:
            sync.unlock(TABLE_LOCK)

    def quota_seed(self, h1: int, h2: int, calls: int, rows: int, reset_at: float) -> bool:
        """Create a counter from the store's counts; kept if another process created it meanwhile. False when
        there is no room."""
        sync = self._sync
        sync.lock(TABLE_LOCK)
        try:
            now = self._clock()
            place, found = self._find(h1, h2, now)
            if found:
                return True
            if place is None:
                self._add_word(TABLE_FULL)
                return False
            _QUOTA.pack_into(self._buf, self._data + place * TABLE_ENTRY, h2, QUOTA, now, calls, rows, calls, rows,
                             0, 0, now, 0, 0.0, reset_at, *([0] * (2 * QUOTA_PIDS)))
            self._claim(place, h1)
            return True
        finally:
            sync.unlock(TABLE_LOCK)

    def quota_reread(self, h1: int, h2: int, base_calls: int, base_rows: int, calls: int, rows: int) -> None:
        """The store's counts read after quota() asked for it: what they hold beyond base is other instances'. Not
        applied when a worker's write reached the store meanwhile (base moved, or a write is in flight)."""
        sync, buf = self._sync, self._buf
        sync.lock(TABLE_LOCK)
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return
            e = list(_QUOTA.unpack_from(buf, off))
            if e[5] != base_calls or e[6] != base_rows or e[10] > 0:
                return
            e[7], e[8] = max(0, calls - e[5]), max(0, rows - e[6])
            _QUOTA.pack_into(buf, off, *e)
        finally:
            sync.unlock(TABLE_LOCK)

    def quota_add(self, h1: int, h2: int, calls: int, rows: int, settle: bool, pid: int):
        """Add to a counter (a given-back call is -1); settle=True also ends one reservation of `pid`. (calls,
        rows) as a check would see them, or None when the counter is gone."""
        sync, buf = self._sync, self._buf
        sync.lock(TABLE_LOCK)
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return None
            e = list(_QUOTA.unpack_from(buf, off))
            if settle:
                _drop_hold(e, _Q_PIDS, QUOTA_PIDS, pid)
            e[3] += calls
            e[4] += rows
            _QUOTA.pack_into(buf, off, *e)
            return e[3] + e[7], e[4] + e[8]
        finally:
            sync.unlock(TABLE_LOCK)

    def quota_peek(self, h1: int, h2: int):
        """(calls, rows) as a check would see them, or None when the table counts nothing for the entry."""
        self._sync.lock(TABLE_LOCK)
        try:
            off = self._entry(h1, h2)
            if off < 0:
                return None
            e = _QUOTA.unpack_from(self._buf, off)
            return e[3] + e[7], e[4] + e[8]
        finally:
            self._sync.unlock(TABLE_LOCK)

    def quota_writing(self, idents: list, written: list | None = None) -> None:
        """A worker's write of counted calls and rows to the store: before it (written None) mark the counters
        (idents: (h1, h2) each) as being written; after it, written[i] is what reached the store of idents[i]:
        (calls, rows), or None."""
        sync, buf = self._sync, self._buf
        sync.lock(TABLE_LOCK)
        try:
            now = self._clock()
            for i, (h1, h2) in enumerate(idents):
                off = self._entry(h1, h2)
                if off < 0:
                    continue
                e = list(_QUOTA.unpack_from(buf, off))
                if written is None:
                    e[10] += 1
                    e[11] = now + FLUSH_GRACE
                else:
                    e[10] = max(0, e[10] - 1)
                    done = written[i]
                    if done is not None:
                        e[5] += done[0]
                        e[6] += done[1]
                _QUOTA.pack_into(buf, off, *e)
        finally:
            sync.unlock(TABLE_LOCK)

    # --- a process gone -------------------------------------------------------------------------------------
    def sweep(self, pid: int, chunk: int = 512) -> int:
        """Give back every slot and reservation `pid` held; the lock is taken per chunk of places. Returns the
        holds freed."""
        if pid <= 0:
            return 0
        chunk = max(1, chunk)
        buf, sync, data = self._buf, self._sync, self._data
        freed = 0
        for first in range(0, self.entries, chunk):
            sync.lock(TABLE_LOCK)
            try:
                index = struct.unpack_from(f"<{min(chunk, self.entries - first)}Q", buf, TABLE_HEADER + first * 8)
                for j, w in enumerate(index):
                    if not w:
                        continue
                    off = data + (first + j) * TABLE_ENTRY
                    kind = _HEAD.unpack_from(buf, off)[1]
                    if kind == SLOTS:
                        e = list(_SLOTS.unpack_from(buf, off))
                        n = _reclaim(e, _S_PIDS, SLOT_PIDS, dead=pid)
                        if n:
                            e[3] -= n
                            _SLOTS.pack_into(buf, off, *e)
                    elif kind == QUOTA:
                        e = list(_QUOTA.unpack_from(buf, off))
                        n = _reclaim(e, _Q_PIDS, QUOTA_PIDS, dead=pid)
                        if n:
                            e[3] -= n
                            _QUOTA.pack_into(buf, off, *e)
                    else:
                        n = 0
                    freed += n
            finally:
                sync.unlock(TABLE_LOCK)
        return freed

    def used(self) -> int:
        """Places in use (no lock: a count for statistics)."""
        return sum(1 for (w,) in struct.iter_unpack("<Q", self._buf[TABLE_HEADER:self._data]) if w)
