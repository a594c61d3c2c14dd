"""The host's response-cache entries in one shared-memory segment, for every worker of the instance.

The gunicorn master maps the segment before forking (`start_instance`, from gunicorn_conf.on_starting) and every
worker, a restarted one too, inherits it (`shared()`); without a master (an in-process Gateway, tests) a private
one is made (`Segment.create`). It is a memfd from qag/hostmem.py: named nowhere, freed by the kernel with the
last process holding it, and its pages are only used as entries arrive.

Layout (little-endian 8-byte words; `n` index slots, `nblocks` data blocks of BLOCK bytes):

    header   +0 magic b"QAGRESP1"  +8 n  +16 nblocks  +24 block bytes  +32 max entries
             +40 lock    the writers' mutex (qag/_speedups/shmsync; taken over from a dead holder)
             +48 dirty   pid of a writer between its first and last change; found set = that writer died: repair
             +56 entries  +64 blocks in use  +72 free list head (block + 1, 0 = empty)
             +80 fresh   blocks never used yet start here (so nothing is initialised up front)
             +88 tick    the recency clock  +96 evictions  +104 too big  +112 repairs  +120 gauge reporter pid
    hash[n]      the key hash of the entry in slot i, 0 = free (a lookup scans its window here)
    used[n]      the tick of the slot's last store or hit (LRU)
    expires[n]   the slot's deadline (CLOCK_MONOTONIC ns), for eviction scans
    record[n]    64 bytes: seq (seqlock), hash, expires, first block + 1, blocks, head length, body length,
                 crc32 of the head | crc32 of the body << 32
    next[nblocks]  each block's successor in its chain (an entry's or the free list's) + 1, 0 = the last
    data[nblocks * BLOCK]

An entry is msgpack [key, content type, etag, headers, meta] (the head) followed by the body, spread over a chain
of blocks: any free blocks hold any entry, so there is no fragmentation, and at most one block per entry is
slack. The byte bound is the number of blocks; the entry bound is the contract's 10,000 (a counter); a key lives
in one of WINDOW consecutive slots from its hash, and the index has at least 4 slots per entry allowed, so a
full window (the only eviction outside LRU order) practically never happens.

Readers take no lock. They copy the slot's record under its seqlock, then the blocks, then check that the
record's sequence has not moved (every change to a slot or its blocks moves it first) and the CRCs of head and
body, and that the key inside is theirs: a torn or reused entry is never returned, at worst a miss.

Writers serialise on the lock and never hold it across anything but memory copies. A store makes room first:
expired entries, then the least recently used, until both bounds hold. A writer killed mid-change (SIGKILL)
leaves `dirty` set: the next writer to take the lock over rebuilds the free list and the counts from the
records (an interrupted record, its sequence odd, is dropped), so nothing leaks and nothing wedges.

LRU is by a shared tick, not a lock per hit: a hit loads the tick, stores tick + 1 and stamps its slot with it
(plain word stores). Sequential use is exact LRU; hits that race in different processes may share or swap a
tick, so among hits made in the same microseconds the order is approximate. Taking the lock on every hit would
serialise every worker's hits for an ordering no client can see.
"""

from __future__ import annotations

import hashlib
import os
import struct
import time
import weakref
import zlib
from contextlib import contextmanager
from typing import Callable

import msgspec

from .. import _speedups
from ..hostmem import map_anonymous

MAGIC = int.from_bytes(b"QAGRESP1", "little")
HEADER = 128
BLOCK = 1024
WINDOW = 16
RECORD = 64
SLOTS_PER_ENTRY = 4
LOCAL_ENTRIES = 1024      # a worker's decoded copies of entries it read (see Segment.find)
LOCAL_BYTES = 8 << 20

LOCK, DIRTY, ENTRIES, USED_BLOCKS, FREE, FRESH, TICK, EVICTIONS, TOO_BIG, REPAIRS, REPORTER = (
    40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120)
_REC = struct.Struct("<QQQQQQQ")  # hash, expires, first + 1, blocks, head length, body length, crcs
_READ_TRIES = 3
_WINDOW = struct.Struct(f"<{WINDOW}Q")

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def key_hash(key: str) -> int:
    """A 64-bit hash of the key, never 0 (0 marks a free slot)."""
    return int.from_bytes(hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little") | 1


class Found:
    """One entry as read from the segment (with the fields of response.Entry, so a hit replays it as it is)."""

    __slots__ = ("key", "content_type", "etag", "headers", "meta", "body", "expires_ns", "body_len", "seq")

    def __init__(self, head: list, body: bytes | None, expires_ns: int, body_len: int, seq: int):
        self.key, self.content_type, self.etag, headers, self.meta = head
        self.headers = tuple(tuple(pair) for pair in headers)
        self.body = body
        self.expires_ns = expires_ns
        self.body_len = body_len
        self.seq = seq          # the record's sequence it was read under: unchanged = still this very entry


class Segment:
    """The mapped segment and every operation on it; `clock` gives CLOCK_MONOTONIC nanoseconds (the same clock
    in every process of the host)."""

    def __init__(self, mm, fd: int, twin=None, clock: Callable[[], int] = time.monotonic_ns):
        self._mm = mm
        self.fd = fd
        self.clock = clock
        self.sync = (twin or _speedups.get("shmsync")).Sync(mm, fd)
        load = self.sync.load
        self.n, self.nblocks, self.block, self.max_entries = load(8), load(16), load(24), load(32)
        n = self.n
        self._hash = HEADER
        self._used = self._hash + 8 * n
        self._expires = self._used + 8 * n
        self._records = self._expires + 8 * n
        self._next = self._records + RECORD * n
        self._data = self._next + 8 * self.nblocks
        self._view = memoryview(mm)
        self._array = struct.Struct(f"<{n}Q")  # one word array (hash, used, expires) read at once
        self._local: dict[str, tuple[int, int, Found]] = {}  # key -> (slot, its record's offset, entry)
        self._local_bytes = 0
        self._close_fd = weakref.finalize(self, os.close, fd)

    # --- creation and end ------------------------------------------------------------------------------------
    @classmethod
    def create(cls, max_bytes: int, max_entries: int = 10_000, twin=None, block: int = BLOCK,
               clock: Callable[[], int] = time.monotonic_ns) -> "Segment":
        """A new zeroed segment holding up to `max_bytes` of entries (whole blocks) and `max_entries` entries."""
        nblocks = max(0, int(max_bytes) // block)
        n = WINDOW
        while n < SLOTS_PER_ENTRY * max_entries:
            n *= 2
        total = HEADER + n * (24 + RECORD) + nblocks * (8 + block)
        mm, fd = map_anonymous(total, "qag-responses")
        struct.pack_into("<5Q", mm, 0, MAGIC, n, nblocks, block, max_entries)
        return cls(mm, fd, twin, clock)

    def close(self) -> None:
        if self._mm is None:
            return
        self._view.release()
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    # --- reading (no lock) -----------------------------------------------------------------------------------
    def _window(self, h: int) -> int:
        return h % (self.n - WINDOW + 1)  # WINDOW slots from here, never wrapping

    def find(self, key: str, body: bool = True, recent: bool = True) -> Found | None:
        """The live entry of `key` (with its body unless `body` is False), or None; a hit stamps the slot as
        recently used unless `recent` is False. Never torn.

        A worker keeps what it read (bounded; started over when full): while the slot's sequence has not moved
        the entry is the same, so a repeated hit is a word load and a clock read, no copy and no decoding."""
        now = self.clock()
        mine = self._local.get(key)
        if mine is not None:
            i, record, found = mine
            if self.sync.load(record) == found.seq and found.expires_ns > now:
                if recent:
                    self._touch(i)
                return found
        h = key_hash(key)
        start = self._window(h)
        hashes = _WINDOW.unpack_from(self._mm, self._hash + 8 * start)
        at = -1
        while h in hashes[at + 1:]:
            at = hashes.index(h, at + 1)
            found = self._read(start + at, h, now, body)
            if found is not None and found.key == key:
                if recent:
                    self._touch(start + at)
                if body:
                    self._remember(key, start + at, found)
                return found
        return None

    def _remember(self, key: str, i: int, found: Found) -> None:
        local = self._local
        if len(local) >= LOCAL_ENTRIES or self._local_bytes + found.body_len > LOCAL_BYTES:
            local.clear()  # bounded: start over (every entry is one shared-memory read away)
            self._local_bytes = 0
        local[key] = (i, self._records + RECORD * i, found)
        self._local_bytes += found.body_len

    def _touch(self, i: int) -> None:
        sync = self.sync
        tick = sync.load(TICK)
        used = self._used + 8 * i
        if sync.load(used) != tick:  # already the most recent: nothing to move (a repeated hit)
            sync.store(TICK, tick + 1)
            sync.store(used, tick + 1)

    def _read(self, i: int, h: int, now: int, body: bool) -> Found | None:
        base = self._records + RECORD * i
        read, load = self.sync.read, self.sync.load
        for _ in range(_READ_TRIES):
            got = read(base, base + 8, RECORD - 8)
            if got is None:
                continue  # a writer is in this slot
            seq, raw = got
            slot_hash, expires, first, nblocks, head_len, body_len, crcs = _REC.unpack(raw)
            if slot_hash != h or expires <= now:
                return None
            wanted = head_len + body_len if body else head_len
            data = self._copy(first, nblocks, wanted)
            if load(base) != seq:
                continue  # changed while copying (its blocks may have gone to another entry)
            if data is None or zlib.crc32(data[:head_len]) != crcs & 0xFFFFFFFF:
                return None
            if body and zlib.crc32(data[head_len:]) != crcs >> 32:
                return None
            try:
                head = _decode(data[:head_len])
                return Found(head, data[head_len:] if body else None, expires, body_len, seq)
            except (msgspec.DecodeError, TypeError, ValueError):
                return None
        return None

    def _copy(self, first: int, nblocks: int, length: int) -> bytes | None:
        """The first `length` bytes of the chain from block `first` - 1, runs of consecutive blocks copied at once;
        None when the chain is not what the record says (it was reused meanwhile)."""
        block, view, load, limit = self.block, self._view, self.sync.load, self.nblocks
        if nblocks * block < length or not 0 < first <= limit:
            return None
        nxt_off, data = self._next, self._data
        parts, b, left, seen = [], first - 1, length, 0
        while True:
            run = 1
            while run * block < left and b + run < limit and load(nxt_off + 8 * (b + run - 1)) == b + run + 1:
                run += 1
            take = min(left, run * block)
            parts.append(view[data + b * block:data + b * block + take].tobytes())
            left -= take
            seen += run
            if left <= 0:
                return b"".join(parts)
            nxt = load(nxt_off + 8 * (b + run - 1))
            if seen >= nblocks or not 0 < nxt <= limit:
                return None
            b = nxt - 1

    def live(self) -> list[tuple[str, dict, str, int, float]]:
        """(key, meta, content type, body bytes, seconds left) of every live entry; bodies are not read."""
        now = self.clock()
        hashes = self._array.unpack_from(self._mm, self._hash)
        out = []
        for i, h in enumerate(hashes):
            if h:
                found = self._read(i, h, now, False)
                if found is not None:
                    out.append((found.key, found.meta, found.content_type, found.body_len,
                                (found.expires_ns - now) / 1e9))
        return out

    def counts(self) -> dict:
        load = self.sync.load
        return {"entries": load(ENTRIES), "blocks": load(USED_BLOCKS), "bytes": load(USED_BLOCKS) * self.block,
                "evictions": load(EVICTIONS), "too_big": load(TOO_BIG), "repairs": load(REPAIRS)}

    # --- writing (under the lock) ----------------------------------------------------------------------------
    @contextmanager
    def _writing(self):
        """The writers' lock, with `dirty` set while held; an exception mid-change repairs before letting go."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(DIRTY):
                self._repair()  # the last holder died mid-change (the lock was taken over from it)
            sync.store(DIRTY, os.getpid())
            try:
                yield sync
            except BaseException:
                self._repair()
                raise
            finally:
                sync.store(DIRTY, 0)
        finally:
            sync.unlock(LOCK)

    def put(self, key: str, head: bytes, body: bytes, ttl_ns: int) -> bool:
        """Store an entry (replacing the key's); False, and counted, when it is larger than the whole area."""
        need = max(1, -(-(len(head) + len(body)) // self.block))
        if need > self.nblocks or self.max_entries < 1:
            with self._writing() as sync:
                sync.store(TOO_BIG, sync.load(TOO_BIG) + 1)
            return False
        h = key_hash(key)
        start = self._window(h)
        crcs = zlib.crc32(head) | zlib.crc32(body) << 32
        with self._writing() as sync:
            now = self.clock()
            self._drop_key(key, h, start)  # the key's own entry goes first: it is being replaced
            self._make_room(need, now)
            hashes = _WINDOW.unpack_from(self._mm, self._hash + 8 * start)
            if 0 in hashes:
                slot = start + hashes.index(0)
            else:  # a full window: its least recently used makes way (rare, see the docstring)
                slot = min(range(start, start + WINDOW), key=lambda i: sync.load(self._used + 8 * i))
                self._drop(slot)
                sync.store(EVICTIONS, sync.load(EVICTIONS) + 1)
            first = self._alloc(need)
            self._fill(first, head + body)
            tick = sync.load(TICK) + 1
            sync.store(TICK, tick)
            expires = now + ttl_ns
            base = self._records + RECORD * slot
            sync.write(base, base + 8, _REC.pack(h, expires, first + 1, need, len(head), len(body), crcs))
            sync.store(self._used + 8 * slot, tick)
            sync.store(self._expires + 8 * slot, expires)
            sync.store(self._hash + 8 * slot, h)
            sync.store(ENTRIES, sync.load(ENTRIES) + 1)
        return True

    def _drop_key(self, key: str, h: int, start: int) -> None:
        """Under the lock: drop the entry of `key` (and any unreadable one sharing its hash)."""
        hashes = _WINDOW.unpack_from(self._mm, self._hash + 8 * start)
        for at, value in enumerate(hashes):
            if value == h:
                found = self._read(start + at, h, 0, False)  # writers are serialised: nothing tears it now
                if found is None or found.key == key:
                    self._drop(start + at)

    def _make_room(self, need: int, now: int) -> None:
        """Evict until one more entry of `need` blocks fits: expired entries first, then least recently used."""
        sync = self.sync
        if sync.load(ENTRIES) < self.max_entries and self._free_blocks() >= need:
            return
        n, mm, array = self.n, self._mm, self._array
        hashes = array.unpack_from(mm, self._hash)
        used = array.unpack_from(mm, self._used)
        expires = array.unpack_from(mm, self._expires)
        order = sorted((i for i in range(n) if hashes[i]), key=lambda i: (expires[i] > now, used[i]))
        for i in order:
            if sync.load(ENTRIES) < self.max_entries and self._free_blocks() >= need:
                return
            if expires[i] > now:
                sync.store(EVICTIONS, sync.load(EVICTIONS) + 1)
            self._drop(i)

    def _free_blocks(self) -> int:
        return self.nblocks - self.sync.load(USED_BLOCKS)

    def _drop(self, i: int) -> None:
        """Free slot i and its blocks; the record's sequence moves first, so a reader mid-copy sees the change."""
        sync = self.sync
        base = self._records + RECORD * i
        _, _, first, nblocks, _, _, _ = _REC.unpack(self._view[base + 8:base + RECORD].tobytes())
        sync.write(base, base + 8, bytes(RECORD - 8))
        sync.store(self._hash + 8 * i, 0)
        sync.store(ENTRIES, sync.load(ENTRIES) - 1)
        if first:
            last = first - 1
            for _ in range(nblocks - 1):
                last = sync.load(self._next + 8 * last) - 1
            sync.store(self._next + 8 * last, sync.load(FREE))
            sync.store(FREE, first)
            sync.store(USED_BLOCKS, sync.load(USED_BLOCKS) - nblocks)

    def _alloc(self, need: int) -> int:
        """A chain of `need` blocks (the caller made room): from the free list, then never-used blocks."""
        sync = self.sync
        nxt = self._next
        first = prev = -1
        for _ in range(need):
            head = sync.load(FREE)
            if head:
                b = head - 1
                sync.store(FREE, sync.load(nxt + 8 * b))
            else:
                b = sync.load(FRESH)
                sync.store(FRESH, b + 1)
            sync.store(nxt + 8 * b, 0)
            if prev < 0:
                first = b
            else:
                sync.store(nxt + 8 * prev, b + 1)
            prev = b
        sync.store(USED_BLOCKS, sync.load(USED_BLOCKS) + need)
        return first

    def _fill(self, first: int, data: bytes) -> None:
        block, view, base = self.block, self._view, self._data
        b = first
        for start in range(0, len(data), block):
            chunk = data[start:start + block]
            view[base + b * block:base + b * block + len(chunk)] = chunk
            b = self.sync.load(self._next + 8 * b) - 1

    def remove(self, key: str) -> None:
        h = key_hash(key)
        with self._writing():
            self._drop_key(key, h, self._window(h))

    def clear(self, keep: Callable[[dict], bool]) -> None:
        """Drop every entry whose meta `keep` refuses (and every unreadable one)."""
        with self._writing():
            hashes = self._array.unpack_from(self._mm, self._hash)
            for i, h in enumerate(hashes):
                if h:
                    found = self._read(i, h, 0, False)
                    if found is None or not keep(found.meta):
                        self._drop(i)

    def _repair(self) -> None:
        """After a writer died holding the lock: keep every whole record, rebuild the free list and the counts."""
        sync = self.sync
        nblocks, nxt = self.nblocks, self._next
        fresh = min(sync.load(FRESH), nblocks)
        owner = [False] * fresh
        entries = used = 0
        for i in range(self.n):
            base = self._records + RECORD * i
            seq = sync.load(base)
            slot_hash, _, first, count, head_len, body_len, _ = _REC.unpack(
                self._view[base + 8:base + RECORD].tobytes())
            chain, b, ok = [], first - 1, not seq & 1 and slot_hash != 0 and 0 < first and count > 0
            while ok and len(chain) < count:
                if not 0 <= b < fresh or owner[b]:
                    ok = False
                    break
                chain.append(b)
                b = sync.load(nxt + 8 * b) - 1
            ok = ok and len(chain) == count and (head_len + body_len) <= count * self.block
            if ok and sync.load(self._hash + 8 * i) in (0, slot_hash):
                for b in chain:
                    owner[b] = True
                sync.store(self._hash + 8 * i, slot_hash)
                entries += 1
                used += count
            else:
                if seq or slot_hash:
                    sync.write(base, base + 8, bytes(RECORD - 8))
                sync.store(self._hash + 8 * i, 0)
        free = 0
        for b in range(fresh - 1, -1, -1):
            if not owner[b]:
                sync.store(nxt + 8 * b, free)
                free = b + 1
        sync.store(FREE, free)
        sync.store(FRESH, fresh)
        sync.store(ENTRIES, entries)
        sync.store(USED_BLOCKS, used)
        sync.store(REPAIRS, sync.load(REPAIRS) + 1)

    # --- the entries gauge -----------------------------------------------------------------------------------
    def reported_entries(self) -> int:
        """The host's entry count for one worker's metrics snapshot, 0 for every other (the gauges of workers are
        summed): the first live worker to ask reports, until it ends."""
        sync, me = self.sync, os.getpid()
        reporter = sync.load(REPORTER)
        if reporter != me:
            if reporter and _alive(reporter):
                return 0
            with self._writing():
                reporter = sync.load(REPORTER)
                if reporter and reporter != me and _alive(reporter):
                    return 0
                sync.store(REPORTER, me)
        return sync.load(ENTRIES)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the master's segment (gunicorn_conf hooks) ----------------------------------------------------------------
_shared: Segment | None = None


def start_instance(max_bytes: int) -> Segment:
    """Master, before forking: the host's segment, inherited by every worker forked from now on."""
    global _shared
    if _shared is None:
        _shared = Segment.create(max_bytes)
    return _shared


def stop_instance() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


def shared() -> Segment | None:
    """The master's segment in a worker it forked (None in a process no qag master forked)."""
    return _shared
