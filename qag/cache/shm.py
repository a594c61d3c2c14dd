"""One shared-memory segment per host holding metadata rows for every worker, read without locks.

The gunicorn master creates the segment before forking (`start_instance`, from gunicorn_conf.on_starting); every
worker it forks, including one it starts again after a crash, inherits the mapping and its file descriptor and
attaches to it (`shared()`). The segment is a memfd (or a /dev/shm file unlinked at once when memfd is missing),
so no name exists anywhere: when the last process holding it ends - a clean shutdown, a crash, a SIGKILL of the
master - the kernel frees it, and nothing is left in /dev/shm. Without a master (tests, the CLI, any in-process
Gateway) `Segment.create()` makes a private one the same way.

Layout (little-endian; 8-byte words; HEADER bytes, then `nslots` slots of `slot_bytes` each):

    header  +0   magic        b"QAGMETA1"
            +8   nslots
            +16  slot_bytes
            +24  generation   bumped by every invalidation; an entry is live only while its gen equals it
            +32  lock         the writers' mutex: 0 = free, else the holder's pid (qag/_speedups/shmsync)
            +40  poll_at      CLOCK_MONOTONIC ns when the next poll of the store's config generation is due
            +48  poll_by      identity (pid) of the worker that won the last poll
            +56  config_seen  the store's config_generation last seen (by a poll or a local change), plus one
            +64  message      the last Redis invalidation token applied on this host
            +72  evictions    live entries overwritten because their probe window was full
            +80..+127         reserved, zero
    slot i at HEADER + i * slot_bytes:
            +0   seq          seqlock sequence: odd while a writer copies, moves on every write
            +8   gen          the generation the entry was read from the store under
            +16  stored_ns    CLOCK_MONOTONIC ns of that read (the TTL runs from it)
            +24  hash         crc32 of the key | 1 << 32 (never 0; 0 = empty slot)
            +32  length       u32, payload bytes, at most slot_bytes - SLOT_HEAD
            +36  crc          u32, crc32 of the payload
            +40  payload      msgspec msgpack of [key, value]

A key lives in one of PROBE consecutive slots from crc32(key) % nslots. Readers take no lock: they copy a slot
under its sequence (odd or changed = a write overlapped: retry, then give up and read the store), check the
length against the slot, the crc of the payload and the key inside it, so a torn entry is never returned.
Writers serialise on the lock (compiled: a compare-and-swap on the lock word; pure: an fcntl lock on the fd) and
store an entry only if the generation is still the one they read the store under, so a read that overlaps an
invalidation is never stored. A full probe window overwrites its oldest entry: the table evicts, never fails.
An entry too big for a slot is kept by its worker only (still checked against the generation and the TTL).

Each worker keeps what it decoded (`Cache`): a hit is one dict lookup, one load of the generation and a clock
read - no copy, no decoding.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
import time
import weakref
import zlib
from typing import Any, Callable

import msgspec

from .. import _speedups
from ..hostmem import map_anonymous

MAGIC = int.from_bytes(b"QAGMETA1", "little")
HEADER = 128
SLOT_BYTES = 4096
SLOT_HEAD = 40
PROBE = 4
MIN_SLOTS = 16
TTL_NS_MAX = (1 << 62) - 1   # a TTL of about 146 years: what Segment.find and put compare as int64 nanoseconds

GENERATION, LOCK, POLL_AT, POLL_BY, CONFIG_SEEN, MESSAGE, EVICTIONS = 24, 32, 40, 48, 56, 64, 72
_ENTRY = struct.Struct("<QQQII")  # gen, stored_ns, hash, length, crc (the 32 bytes after seq)
_READ_TRIES = 3

MISS = object()

_encode = msgspec.msgpack.Encoder().encode
_decode = msgspec.msgpack.Decoder().decode


def key_hash(key: bytes) -> int:
    return zlib.crc32(key) | 1 << 32


class Segment:
    """The mapped segment: header words, slots, and the writers' lock."""

    def __init__(self, mm: mmap.mmap, fd: int, nslots: int, slot_bytes: int, twin=None):
        self._mm = mm
        self.fd = fd
        self.nslots = nslots
        self.slot_bytes = slot_bytes
        self.capacity = slot_bytes - SLOT_HEAD
        # Every process using the segment inherits this one object, so they all lock the same way.
        self.sync = (twin or _speedups.get("shmsync")).Sync(mm, fd)
        self._load = self.sync.load
        # The descriptor is closed exactly once: by close(), or when a private segment is garbage.
        self._close_fd = weakref.finalize(self, os.close, fd)

    # --- creation and end ----------------------------------------------------------------------------
    @classmethod
    def create(cls, size: int, slot_bytes: int = SLOT_BYTES, twin=None) -> "Segment":
        """A new zeroed segment of about `size` bytes (at least MIN_SLOTS slots), named nowhere; `twin`: the
        shmsync module to use (default: the one QAG_SPEEDUPS selects)."""
        nslots = max(MIN_SLOTS, (int(size) - HEADER) // slot_bytes)
        total = HEADER + nslots * slot_bytes
        mm, fd = map_anonymous(total, "qag-metadata")
        segment = cls(mm, fd, nslots, slot_bytes, twin)
        sync = segment.sync
        sync.store(8, nslots)
        sync.store(16, slot_bytes)
        sync.store(GENERATION, 1)
        sync.store(0, MAGIC)
        return segment

    def close(self) -> None:
        """Unmap and close (the memory goes when the last process holding it closes it too)."""
        if self._mm is None:
            return
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    # --- header ----------------------------------------------------------------------------------------
    def generation(self) -> int:
        return self._load(GENERATION)

    def header(self) -> dict:
        load = self._load
        return {"magic": load(0), "nslots": load(8), "slot_bytes": load(16), "generation": load(GENERATION),
                "lock": load(LOCK), "poll_at": load(POLL_AT), "poll_by": load(POLL_BY),
                "config_seen": load(CONFIG_SEEN), "message": load(MESSAGE), "evictions": load(EVICTIONS)}

    def invalidate(self, config: int | None = None, message: int | None = None) -> int:
        """Drop every entry (bump the generation); also record the store's config generation and the Redis token
        the change goes by, so this host's poller and subscriber don't drop everything a second time for it."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            if config is not None:
                sync.store(CONFIG_SEEN, config + 1)
            if message is not None:
                sync.store(MESSAGE, message)
            generation = sync.load(GENERATION) + 1
            sync.store(GENERATION, generation)
        finally:
            sync.unlock(LOCK)
        return generation

    def note_config(self, config: int) -> bool:
        """A poll saw the store's config generation: drop every entry when it moved. True when it did."""
        if self._load(CONFIG_SEEN) == config + 1:
            return False
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(CONFIG_SEEN) == config + 1:
                return False
            sync.store(CONFIG_SEEN, config + 1)
            sync.store(GENERATION, sync.load(GENERATION) + 1)
            return True
        finally:
            sync.unlock(LOCK)

    def note_message(self, message: int) -> bool:
        """A Redis invalidation arrived: drop every entry unless this host already applied it. True when dropped."""
        if self._load(MESSAGE) == message:
            return False
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(MESSAGE) == message:
                return False
            sync.store(MESSAGE, message)
            sync.store(GENERATION, sync.load(GENERATION) + 1)
            return True
        finally:
            sync.unlock(LOCK)

    def claim_poll(self, now_ns: int, interval_ns: int, who: int) -> bool:
        """The poll election: True for exactly one caller per interval, host-wide (it then polls the store)."""
        if now_ns < self._load(POLL_AT):
            return False
        sync = self.sync
        sync.lock(LOCK)
        try:
            if now_ns < sync.load(POLL_AT):
                return False
            sync.store(POLL_AT, now_ns + interval_ns)
            sync.store(POLL_BY, who)
            return True
        finally:
            sync.unlock(LOCK)

    # --- entries ---------------------------------------------------------------------------------------
    def _slot(self, i: int) -> int:
        return HEADER + i * self.slot_bytes

    def find(self, key: str, generation: int, now_ns: int, ttl_ns: int):
        """(stored_ns, decoded [key, value]) of a live entry for `key`, or None. Lock-free; never torn."""
        h = key_hash(key.encode("utf-8"))
        start = h % self.nslots
        read = self.sync.read
        for step in range(PROBE):
            base = self._slot((start + step) % self.nslots)
            for _ in range(_READ_TRIES):
                head = read(base, base + 8, 32)
                if head is None:
                    continue  # a writer is in this slot: look again
                seq, raw = head
                gen, stored_ns, slot_hash, length, crc = _ENTRY.unpack(raw)
                if slot_hash != h or gen != generation or now_ns - stored_ns >= ttl_ns or length > self.capacity:
                    break  # not this key, or dead: the next slot of the window
                full = read(base, base + 8, 32 + length)
                if full is None or full[0] != seq:
                    continue  # overwritten between the two copies
                payload = full[1][32:]
                if zlib.crc32(payload) != crc:
                    break
                try:
                    decoded = _decode(payload)
                except msgspec.DecodeError:
                    break
                if type(decoded) is not list or len(decoded) != 2 or decoded[0] != key:
                    break
                return stored_ns, decoded
        return None

    def put(self, key: bytes, payload: bytes, generation: int, stored_ns: int, ttl_ns: int) -> bool:
        """Store an encoded [key, value] read under `generation`; False (nothing stored) when the generation
        moved meanwhile or the payload does not fit a slot."""
        if len(payload) > self.capacity:
            return False
        h = key_hash(key)
        start = h % self.nslots
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(GENERATION) != generation:
                return False  # an invalidation overlapped the store read: what was read may be stale
            target = oldest = None
            oldest_at = None
            for step in range(PROBE):
                base = self._slot((start + step) % self.nslots)
                gen, at, slot_hash = sync.load(base + 8), sync.load(base + 16), sync.load(base + 24)
                if slot_hash == h or slot_hash == 0 or gen != generation or stored_ns - at >= ttl_ns:
                    target = base
                    break
                if oldest_at is None or at < oldest_at:
                    oldest, oldest_at = base, at
            if target is None:
                target = oldest
                sync.store(EVICTIONS, sync.load(EVICTIONS) + 1)
            sync.write(target, target + 8,
                       _ENTRY.pack(generation, stored_ns, h, len(payload), zlib.crc32(payload)) + payload)
            return True
        finally:
            sync.unlock(LOCK)


# --- the master's segment (gunicorn_conf hooks) ------------------------------------------------------------
_shared: Segment | None = None


def start_instance(size: int) -> Segment:
    """Master, before forking: the host's segment, inherited by every worker forked from now on."""
    global _shared
    if _shared is None:
        _shared = Segment.create(size)
    return _shared


def stop_instance() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


def shared() -> Segment | None:
    """The master's segment in a worker it forked (None in a process no qag master forked)."""
    return _shared


class _Counts(threading.local):
    def __init__(self, shards: list):
        self.shard = [0, 0]  # hits, misses
        shards.append(self.shard)


class Cache:
    """A worker's view of a segment: its decoded entries, the TTL, per-thread hit and miss counts.

    `worker` is the process identity used in the poll election (injectable so tests can run several
    "workers" in one process); `clock` returns CLOCK_MONOTONIC nanoseconds (the same clock in every process)."""

    def __init__(self, segment: Segment, ttl: float, *, worker: int | None = None,
                 clock: Callable[[], int] = time.monotonic_ns, local_max: int | None = None):
        self.segment = segment
        # Nanoseconds as the segment keeps them (int64): a larger TTL (QAG_METADATA_CACHE_TTL is bounded, a caller
        # of this class may not be) is the longest one there is, never an OverflowError in every worker.
        ns = ttl * 1e9
        self.ttl_ns = int(ns) if ns < TTL_NS_MAX else TTL_NS_MAX
        self.worker = os.getpid() if worker is None else worker
        self.clock = clock
        # The header word read straight through the segment's Sync (no Segment.generation frame): three reads a call.
        self._generation = functools.partial(segment._load, GENERATION)
        self._local: dict[str, tuple[int, int, Any]] = {}
        self._local_max = local_max if local_max is not None else max(1024, 2 * segment.nslots)
        self._shards: list[list[int]] = []
        self._counts = _Counts(self._shards)
        self.too_big = 0

    def generation(self) -> int:
        return self._generation()

    def get(self, key: str, convert: Callable[[Any], Any] | None = None):
        """The cached value of `key`, or MISS. `convert` turns a decoded value into what callers get."""
        generation = self._generation()
        now = self.clock()
        entry = self._local.get(key)
        if entry is not None and entry[0] == generation and now - entry[1] < self.ttl_ns:
            self._counts.shard[0] += 1
            return entry[2]
        found = self.segment.find(key, generation, now, self.ttl_ns)
        if found is None:
            self._counts.shard[1] += 1
            return MISS
        stored_ns, (_, value) = found
        if convert is not None:
            value = convert(value)
        self._remember(key, generation, stored_ns, value)
        self._counts.shard[0] += 1
        return value

    def put(self, key: str, value: Any, generation: int, stored_ns: int | None = None) -> bool:
        """Keep `value`, read from the store under `generation` (taken before the read). Not kept when an
        invalidation happened since. True when it went into the segment."""
        if stored_ns is None:
            stored_ns = self.clock()
        raw = key.encode("utf-8")
        payload = _encode([key, value])
        shared = self.segment.put(raw, payload, generation, stored_ns, self.ttl_ns)
        if not shared and len(payload) > self.segment.capacity:
            self.too_big += 1
        if self._generation() == generation:
            self._remember(key, generation, stored_ns, value)
        return shared

    def _remember(self, key: str, generation: int, stored_ns: int, value: Any) -> None:
        local = self._local
        if len(local) >= self._local_max and key not in local:
            local.clear()  # bounded: start over (entries are one shared-memory read away)
        local[key] = (generation, stored_ns, value)

    def counts(self) -> tuple[int, int]:
        """(hits, misses) of this worker so far."""
        shards = list(self._shards)
        return sum(s[0] for s in shards), sum(s[1] for s in shards)
