"""One shared-memory table per host for rate-limit buckets, max_concurrent slots and quota counts of every worker.

The gunicorn master creates the table before forking (`start_instance`, from gunicorn_conf.on_starting); every
worker inherits it (`shared()`); without a master (tests, the CLI, an in-process Gateway) `HostTable.create()`
makes a private one, used the same way. The memory is a memfd named nowhere (qag/hostmem.py).

Every operation is one short critical section under the table's mutex (qag/_speedups/shmsync: a compare-and-swap
on the lock word when compiled, an fcntl record lock in the pure twin; taken over from a dead holder). Inside it
the entries are read and written with struct on the mapping: the mutex orders those accesses. No store read or
other I/O ever happens under it (a quota seed or re-read is read first, then applied in a second section).

Layout (little-endian, 8-byte words):

    header   +0 magic b"QAGLIMT1"   +8 entries   +16 lock   +24 full (no room: counted per worker)
             +32 evictions   +40..+63 zero
    index    entries words at +64: h1 of the entry in that place (0 = free)
    entries  ENTRY bytes each, after the index: h2, kind, used_at, then by kind
             bucket  tokens (f64), refilled at (f64), count, period (f64)
             slots   held, then SLOT_PIDS holder pids (u32) and as many counts (u32)
             quota   calls, rows, base_calls, base_rows, other_calls, other_rows, read_at (f64), flushing,
                     flush_deadline (f64), reset_at (f64, Unix), then QUOTA_PIDS holder pids and counts (u32)

A holder is a pid and how many slots (or reserved, unsettled quota calls) that process holds, so the
holds of a process that died (SIGKILL) are given back: when a key is at its limit, dead holders are looked for
(a kill(pid, 0) each), and the master sweeps a dead worker's pid from every entry (`sweep`, from child_exit).

An identity (kind and name) hashes to 128 bits (blake2b): h1 in the index, h2 in the entry. It lives in one of
PROBE consecutive places from h1. A full window evicts, in this order, only what loses nothing: a bucket that
has refilled to its capacity, a slots entry that no one holds, a quota entry whose counts are all in the store
and that no one holds (or whose period ended). When nothing can go, the call is counted by its worker alone
(`None` is returned; the caller falls back to its per-worker limiter) and `full` is counted: a limited key is
never let through because the table is full.
"""

from __future__ import annotations

import hashlib
import math
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

BUCKET, SLOTS, QUOTA = 1, 2, 3
SLOT_PIDS = 20
QUOTA_PIDS = 11
FLUSH_GRACE = 30.0   # seconds after which a flush that never reported back (its worker died) stops counting

_HEAD = struct.Struct("<Qqd")                    # h2, kind, used_at
_BUCKET = struct.Struct("<Qqdddqd")              # + tokens, refilled at, count, period
_SLOTS = struct.Struct(f"<Qqdq{SLOT_PIDS}I{SLOT_PIDS}I")     # + held, holders' pids, their counts
_QUOTA = struct.Struct(f"<Qqdqqqqqqdqdd{QUOTA_PIDS}I{QUOTA_PIDS}I")
_Q_PIDS = 13                                     # index of the first holder pid in a quota entry
_S_PIDS = 4
_INDEX = struct.Struct(f"<{PROBE}Q")
_WORD = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_HOLDERS = struct.Struct(f"<{SLOT_PIDS}I")
_pid = [os.getpid()]   # this process's pid, kept current across forks (a call saves asking the kernel)
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))
_IDENTITIES: dict = {}      # (kind, name) -> (h1, h2): the hash is a third of a limiter step's cost
_IDENTITIES_MAX = 4096


def identity(kind: str, name: str) -> tuple[int, int]:
    """(h1, h2) of an entry: 128 bits of blake2b; h1 is never 0 (0 marks a free place)."""
    found = _IDENTITIES.get((kind, name))
    if found is None:
        digest = hashlib.blake2b(f"{kind}\x00{name}".encode("utf-8", "surrogatepass"), digest_size=16).digest()
        h1, h2 = struct.unpack("<QQ", digest)
        found = (h1 | 1, h2)
        if len(_IDENTITIES) >= _IDENTITIES_MAX:
            _IDENTITIES.clear()   # many client addresses: start over rather than track recency
        _IDENTITIES[(kind, name)] = found
    return found


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


def _reclaim(e: list, first: int, count: int, dead=None) -> int:
    """Clear the holders that died (or the one pid `dead`); how many holds they had."""
    freed = 0
    for i in range(first, first + count):
        pid = e[i]
        if pid and (pid == dead if dead is not None else not _alive(pid)):
            freed += e[i + count]
            e[i] = e[i + count] = 0
    return freed


class HostTable:
    """The mapped table: token buckets, slots and quota counts by identity, under one cross-process mutex."""

    def __init__(self, mm, fd: int, entries: int, twin=None, clock=time.monotonic, wall=time.time):
        self._mm = mm
        self.fd = fd
        self.entries = entries
        self.sync = (twin or _speedups.get("shmsync")).Sync(mm, fd)
        self._buf = memoryview(mm)
        self._data = HEADER + entries * 8
        self._clock = clock
        self._wall = wall
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
        self._buf.release()
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    def stats(self) -> dict:
        load = self.sync.load
        used = sum(1 for (w,) in struct.iter_unpack("<Q", self._buf[HEADER:self._data]) if w)
        return {"entries": self.entries, "used": used, "full": load(FULL), "evictions": load(EVICTIONS)}

    # --- places ------------------------------------------------------------------------------------------
    def _find(self, h1: int, h2: int, now: float, wall: float, insert: bool = True):
        """Under the lock: (place of the entry, True) when present, else (a place to put it in, False) - a free
        one, or one whose entry may go (see the module's docstring) - or (None, False) when none may."""
        start = h1 % (self.entries - PROBE + 1)
        buf = self._buf
        words = _INDEX.unpack_from(buf, HEADER + start * 8)
        data = self._data
        j = -1
        while True:
            try:
                j = words.index(h1, j + 1)
            except ValueError:
                break
            if _WORD.unpack_from(buf, data + (start + j) * ENTRY)[0] == h2:
                return start + j, True
        if not insert:
            return None, False
        if 0 in words:
            return start + words.index(0), False
        victim, rank = None, 9
        for j in range(PROBE):
            r = self._evictable(data + (start + j) * ENTRY, now, wall)
            if r < rank:
                victim, rank = start + j, r
        return victim, False

    def _evictable(self, off: int, now: float, wall: float) -> int:
        """1 (a full bucket), 2 (unheld slots), 3 (a written, unheld quota entry or a past period), 9 (keep)."""
        buf = self._buf
        kind = _HEAD.unpack_from(buf, off)[1]
        if kind == BUCKET:
            _h2, _k, _u, tokens, at, count, per = _BUCKET.unpack_from(buf, off)
            return 1 if per <= 0 or tokens + (now - at) * count / per >= count else 9   # per 0: never written
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
        index = HEADER + place * 8
        if _WORD.unpack_from(self._buf, index)[0]:
            self.sync.store(EVICTIONS, self.sync.load(EVICTIONS) + 1)
        _WORD.pack_into(self._buf, index, h1)

    def _no_room(self) -> None:
        self.sync.store(FULL, self.sync.load(FULL) + 1)

    # --- token buckets (contract 6.6) --------------------------------------------------------------------
    def take(self, kind: str, ident, count: int, period: float):
        """Spend one token of the bucket: as limits.Buckets.take, (left, 0) or (0, retry_after); None when the
        table has no room for it."""
        h1, h2 = identity("b" + kind, str(ident))
        rate = count / period
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            now = self._clock()
            place, found = self._find(h1, h2, now, self._wall())
            if place is None:
                self._no_room()
                return None
            off = self._data + place * ENTRY
            if found:
                _h2, _k, _u, tokens, at, _c, _p = _BUCKET.unpack_from(buf, off)
                # A changed limit (a PATCHed key) keeps what was used, within the new capacity.
                tokens = min(float(count), tokens + (now - at) * rate)
            else:
                tokens = float(count)
            if tokens >= 1.0:
                tokens -= 1.0
                result = (int(tokens), 0)
            else:
                result = (0, max(1, math.ceil((1.0 - tokens) * period / count)))
            _BUCKET.pack_into(buf, off, h2, BUCKET, now, tokens, now, count, float(period))
            if not found:
                self._claim(place, h1)
        finally:
            sync.unlock(LOCK)
        return result

    # --- max_concurrent slots (contract 6.7) -------------------------------------------------------------
    def acquire(self, name: str, limit: int):
        """Take one of name's `limit` slots for this process: True, False when all are held (by live processes),
        None when the table (or the entry's holders) has no room."""
        took = self.acquire_at(name, limit)
        return took if took is None or took is False else True

    def acquire_at(self, name: str, limit: int):
        """As acquire(), but a taken slot is answered by where its entry is, for release(name, at)."""
        h1, h2 = identity("s", name)
        pid = _pid[0]
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            now = self._clock()
            place, found = self._find(h1, h2, now, self._wall())
            if place is None:
                self._no_room()
                return None
            off = self._data + place * ENTRY
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
                    self._no_room()
                    return None
            e[3] += 1
            e[2] = now
            _SLOTS.pack_into(buf, off, *e)
            if not found:
                self._claim(place, h1)
            return off, h2
        finally:
            sync.unlock(LOCK)

    def release(self, name: str, at: tuple | None = None) -> None:
        """Give back one slot of name held by this process; `at` (from acquire_at) saves looking for its entry,
        which stays where it is while a slot of it is held. Writes only the words that change."""
        pid = _pid[0]
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            if at is not None and _WORD.unpack_from(buf, at[0])[0] == at[1]:
                off = at[0]
            else:
                h1, h2 = identity("s", name)
                place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
                if not found:
                    return
                off = self._data + place * ENTRY
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
            sync.unlock(LOCK)

    def held(self, name: str) -> int:
        h1, h2 = identity("s", name)
        self.sync.lock(LOCK)
        try:
            place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
            return _SLOTS.unpack_from(self._buf, self._data + place * ENTRY)[3] if found else 0
        finally:
            self.sync.unlock(LOCK)

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
        pid = _pid[0]
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            now, wall = self._clock(), self._wall()
            place, found = self._find(h1, h2, now, wall)
            if not found:
                return None if place is not None else False
            off = self._data + place * ENTRY
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
        finally:
            sync.unlock(LOCK)

    def quota_seed(self, key: str, calls: int, rows: int, reset_at: float) -> bool:
        """Create a counter from the store's counts (read without the lock); kept if another process created it
        meanwhile. False when there is no room."""
        h1, h2 = identity("q", key)
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            now, wall = self._clock(), self._wall()
            place, found = self._find(h1, h2, now, wall)
            if found:
                return True
            if place is None:
                self._no_room()
                return False
            _QUOTA.pack_into(buf, self._data + place * ENTRY, h2, QUOTA, now, calls, rows, calls, rows, 0, 0, now,
                             0, 0.0, reset_at, *([0] * (2 * QUOTA_PIDS)))
            self._claim(place, h1)
            return True
        finally:
            sync.unlock(LOCK)

    def quota_reread(self, key: str, base: tuple[int, int], calls: int, rows: int) -> None:
        """The store's counts read after `quota` asked for it: what they hold beyond base is other instances'. Not
        applied when a worker's write reached the store meanwhile (base moved, or a write is in flight)."""
        h1, h2 = identity("q", key)
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
            if not found:
                return
            off = self._data + place * ENTRY
            e = list(_QUOTA.unpack_from(buf, off))
            if (e[5], e[6]) != base or e[10] > 0:
                return
            e[7], e[8] = max(0, calls - e[5]), max(0, rows - e[6])
            _QUOTA.pack_into(buf, off, *e)
        finally:
            sync.unlock(LOCK)

    def quota_add(self, key: str, calls: int, rows: int, settle: bool) -> tuple[int, int] | None:
        """Add to a counter (a given-back call is -1); settle=True also ends this process's reservation.
        Returns (calls, rows) as a check would see them, or None when the counter is gone."""
        h1, h2 = identity("q", key)
        pid = _pid[0]
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
            if not found:
                return None
            off = self._data + place * ENTRY
            e = list(_QUOTA.unpack_from(buf, off))
            if settle:
                _drop_hold(e, _Q_PIDS, QUOTA_PIDS, pid)
            e[3] += calls
            e[4] += rows
            _QUOTA.pack_into(buf, off, *e)
            return e[3] + e[7], e[4] + e[8]
        finally:
            sync.unlock(LOCK)

    def quota_peek(self, key: str) -> tuple[int, int] | None:
        """(calls, rows) as a check would see them, or None when the host counts nothing for key."""
        h1, h2 = identity("q", key)
        self.sync.lock(LOCK)
        try:
            place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
            if not found:
                return None
            e = _QUOTA.unpack_from(self._buf, self._data + place * ENTRY)
            return e[3] + e[7], e[4] + e[8]
        finally:
            self.sync.unlock(LOCK)

    def quota_writing(self, keys: list[str], done: dict | None = None) -> None:
        """A worker's write of counted calls and rows to the store: before it (done=None) mark the counters as
        being written; after it, `done` maps key -> (calls, rows) that reached the store (empty on failure)."""
        sync, buf = self.sync, self._buf
        sync.lock(LOCK)
        try:
            now = self._clock()
            for key in keys:
                h1, h2 = identity("q", key)
                place, found = self._find(h1, h2, 0.0, 0.0, insert=False)
                if not found:
                    continue
                off = self._data + place * ENTRY
                e = list(_QUOTA.unpack_from(buf, off))
                if done is None:
                    e[10] += 1
                    e[11] = now + FLUSH_GRACE
                else:
                    e[10] = max(0, e[10] - 1)
                    written = done.get(key)
                    if written is not None:
                        e[5] += written[0]
                        e[6] += written[1]
                _QUOTA.pack_into(buf, off, *e)
        finally:
            sync.unlock(LOCK)

    # --- a worker gone -----------------------------------------------------------------------------------
    def sweep(self, pid: int, chunk: int = 512) -> int:
        """Give back every slot and reservation `pid` held (the master, when a worker exits); the lock is taken
        per chunk of places so callers are not held up. Returns the holds freed."""
        buf, sync, data = self._buf, self.sync, self._data
        freed = 0
        for first in range(0, self.entries, chunk):
            sync.lock(LOCK)
            try:
                index = struct.unpack_from(f"<{min(chunk, self.entries - first)}Q", buf, HEADER + first * 8)
                for j, w in enumerate(index):
                    if not w:
                        continue
                    off = data + (first + j) * ENTRY
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
                sync.unlock(LOCK)
        return freed


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
