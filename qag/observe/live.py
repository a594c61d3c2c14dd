"""Live run events for every worker of a host (contract 8.5): a shared ring that runs are published into while
anyone listens, and per-worker delivery to the `/events` streams held there.

A run is published by the thread that served it, and only while some worker of the host holds a stream (one
shared word says so): otherwise publishing costs one load. The event and its filter fields go into a ring of
records in anonymous shared memory (made by the gunicorn master before forking, like hostflush; private to the
process without one), under the segment's mutex. Each stream reads the ring from its own cursor (LiveEvents), so
a slow or stuck client never holds up a run or another client, and one that falls a whole ring behind is dropped.

Ring layout (8-byte little-endian words): +0 magic, +8 the mutex (qag/_speedups/shmsync), +16 the sequence number
of the next record, +24 where it goes, +32 the sequence number of the oldest record kept, +40 where it is, +48
streams open on the host, +56 the data size, +64 the pid of the worker relaying other instances' events from
Redis (live_redis.py; 0 = none), +72 this instance's random id, +80 SLOTS slots of 16 bytes (a worker's pid and its
open streams, so
a worker that dies does not leave the host publishing for nobody), then the data: records of a 16-byte head
(sequence number, length) and the bytes, 8-aligned; a head with sequence WRAP (or too little room for a head)
means "continue at the start". Writing evicts the oldest records it needs room for; a reader that was overtaken
skips to the oldest record kept and counts what it lost.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
import weakref

from .. import _speedups
from ..errors import QagError
from ..hostmem import map_anonymous
from ..shapes import HISTORY_KINDS, RUN_STATUSES

MAGIC = int.from_bytes(b"QAGLIVE1", "little")
LOCK, NEXT_SEQ, HEAD, TAIL_SEQ, TAIL, LISTENERS, DATA_SIZE, RELAY, INSTANCE, SLOTS = 8, 16, 24, 32, 40, 48, 56, 64, 72, 80
NSLOTS = 256
DATA = SLOTS + NSLOTS * 16
WRAP = (1 << 64) - 1
RECORD_HEAD = struct.Struct("<QQ")    # sequence number, length
POLL = 0.05                           # seconds between two looks of a worker's waker at the ring


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Ring:
    """The host's ring of live events."""

    def __init__(self, data_bytes: int, twin=None):
        data_bytes = max(4096, data_bytes - data_bytes % 8)
        self._mm, self.fd = map_anonymous(DATA + data_bytes, "qag-live")
        self.sync = (twin or _speedups.get("shmsync")).Sync(self._mm, self.fd)
        self._view = memoryview(self._mm)
        self.size = data_bytes
        store = self.sync.store
        store(NEXT_SEQ, 1)
        store(TAIL_SEQ, 1)
        store(DATA_SIZE, data_bytes)
        store(INSTANCE, int.from_bytes(os.urandom(8), "little") | 1)
        store(0, MAGIC)
        self._close_fd = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        if self._mm is None:
            return
        self._view.release()
        self.sync.release()
        self._mm.close()
        self._mm = None
        self._close_fd()

    # --- who listens ---------------------------------------------------------------------------------------
    def listening(self) -> bool:
        """Any stream open on the host (one lock-free load)."""
        return self.sync.load(LISTENERS) > 0

    def listen(self, pid: int, change: int) -> None:
        """This process opens (+1) or closes (-1) a stream; dead processes' streams are given back."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            mine = free = None
            total = 0
            for i in range(NSLOTS):
                at = SLOTS + 16 * i
                holder = sync.load(at)
                if holder == pid:
                    mine = at
                elif holder and not _alive(holder):
                    sync.store(at, 0)
                    sync.store(at + 8, 0)
                    holder = 0
                if not holder and free is None:
                    free = at
                if holder and holder != pid:
                    total += sync.load(at + 8)
            at = mine if mine is not None else free
            if at is not None:
                count = max(0, (sync.load(at + 8) if mine is not None else 0) + change)
                sync.store(at, pid if count else 0)
                sync.store(at + 8, count)
                total += count
            else:
                total += max(0, change)   # no slot: counted, never given back by a sweep (publishes for nobody)
            sync.store(LISTENERS, total)
        finally:
            sync.unlock(LOCK)

    @property
    def instance(self) -> int:
        """This instance's random id (one ring per instance): how its own events are told from others' in Redis."""
        return self.sync.load(INSTANCE)

    def claim_relay(self, pid: int) -> bool:
        """Become the host's relay of other instances' events (True), unless a live process already is."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            holder = sync.load(RELAY)
            if holder == pid or holder == 0 or not _alive(holder):
                sync.store(RELAY, pid)
                return True
            return False
        finally:
            sync.unlock(LOCK)

    def release_relay(self, pid: int) -> None:
        sync = self.sync
        sync.lock(LOCK)
        try:
            if sync.load(RELAY) == pid:
                sync.store(RELAY, 0)
        finally:
            sync.unlock(LOCK)

    # --- writing -------------------------------------------------------------------------------------------
    def publish(self, record: bytes) -> bool:
        """Append one record (False when it is larger than a quarter of the ring: not kept)."""
        size = 16 + (len(record) + 7) // 8 * 8
        if size > self.size // 4:
            return False
        sync, view = self.sync, self._view
        sync.lock(LOCK)
        try:
            seq = sync.load(NEXT_SEQ)
            p = sync.load(HEAD)
            if self.size - p < size:
                while sync.load(TAIL_SEQ) < seq and sync.load(TAIL) >= p:
                    self._evict()
                if self.size - p >= 16:
                    RECORD_HEAD.pack_into(view, DATA + p, WRAP, 0)
                p = 0
            while sync.load(TAIL_SEQ) < seq and p <= sync.load(TAIL) < p + size:
                self._evict()
            if sync.load(TAIL_SEQ) >= seq:   # nothing kept: the oldest is the one written now
                sync.store(TAIL, p)
                sync.store(TAIL_SEQ, seq)
            RECORD_HEAD.pack_into(view, DATA + p, seq, len(record))
            view[DATA + p + 16:DATA + p + 16 + len(record)] = record
            sync.store(HEAD, p + size)
            sync.store(NEXT_SEQ, seq + 1)
            return True
        finally:
            sync.unlock(LOCK)

    def _evict(self) -> None:
        sync = self.sync
        tail = sync.load(TAIL)
        if self.size - tail < 16 or RECORD_HEAD.unpack_from(self._view, DATA + tail)[0] == WRAP:
            sync.store(TAIL, 0)
            return
        length = RECORD_HEAD.unpack_from(self._view, DATA + tail)[1]
        tail += 16 + (length + 7) // 8 * 8
        sync.store(TAIL, 0 if tail >= self.size else tail)
        sync.store(TAIL_SEQ, sync.load(TAIL_SEQ) + 1)

    # --- reading -------------------------------------------------------------------------------------------
    def end(self) -> tuple[int, int]:
        """A cursor (sequence number, place) after everything written so far: a new reader reads live only."""
        sync = self.sync
        sync.lock(LOCK)
        try:
            return sync.load(NEXT_SEQ), sync.load(HEAD)
        finally:
            sync.unlock(LOCK)

    def read(self, cursor: tuple[int, int]) -> tuple[list[bytes], tuple[int, int], int]:
        """(records after the cursor, the new cursor, how many the cursor had been overtaken by)."""
        seq, pos = cursor
        sync, view = self.sync, self._view
        if sync.load(NEXT_SEQ) == seq:
            return [], cursor, 0          # nothing new: one lock-free look
        out: list[bytes] = []
        lost = 0
        sync.lock(LOCK)
        try:
            tail_seq, end = sync.load(TAIL_SEQ), sync.load(NEXT_SEQ)
            if seq < tail_seq:
                lost, seq, pos = tail_seq - seq, tail_seq, sync.load(TAIL)
            while seq < end:
                if self.size - pos < 16:
                    pos = 0
                    continue
                found, length = RECORD_HEAD.unpack_from(view, DATA + pos)
                if found == WRAP:
                    pos = 0
                    continue
                if found != seq:          # cannot happen with the lock held; never read a record twice
                    lost += end - seq
                    seq, pos = end, sync.load(HEAD)
                    break
                out.append(bytes(view[DATA + pos + 16:DATA + pos + 16 + length]))
                pos += 16 + (length + 7) // 8 * 8
                seq += 1
        finally:
            sync.unlock(LOCK)
        return out, (seq, pos), lost


# --- the master's ring (gunicorn_conf hooks) -----------------------------------------------------------------
_shared: Ring | None = None


def start_instance(data_bytes: int) -> Ring:
    """Master, before forking: the host's ring, inherited by every worker forked from now on."""
    global _shared
    if _shared is None:
        _shared = Ring(data_bytes)
    return _shared


def stop_instance() -> None:
    global _shared
    if _shared is not None:
        _shared.close()
        _shared = None


def shared() -> Ring | None:
    return _shared


# --- one worker's streams ------------------------------------------------------------------------------------
class Stream:
    """One `/events` client: what it may see and asked for, and where in the ring it has read to."""

    __slots__ = ("key", "filters", "cursor", "ready", "dropped")

    def __init__(self, key: str | None, filters: dict, cursor: tuple[int, int]):
        self.key = key              # None: an administrator, who sees every run
        self.filters = filters      # field -> wanted value: type, kind, query, connection, status
        self.cursor = cursor
        self.ready = threading.Event()
        self.dropped = False

    def wants(self, meta: list) -> bool:
        return wanted(meta, self.key, self.filters)


FILTERS = ("type", "kind", "query", "connection", "status")   # what a stream may narrow by


def read_filters(args) -> dict:
    """The stream's filters; a kind or status that could never match is 400 invalid_filter (others just match
    nothing)."""
    filters = {name: args[name] for name in FILTERS if args.get(name) not in (None, "")}
    if "kind" in filters and filters["kind"] not in HISTORY_KINDS:
        raise QagError("invalid_filter", "kind must be saved or adhoc")
    if "status" in filters and filters["status"] not in RUN_STATUSES:
        raise QagError("invalid_filter", "status must be success or error")
    return filters


def wanted(meta: list, key: str | None, filters: dict) -> bool:
    """Whether a run's event reaches a stream: meta = [key name, status, kind, query, connection]; `key` None is
    an administrator (every run), else only that key's runs; filters narrow, never widen (contract 8.5)."""
    run_key, status, kind, query, connection = meta
    if key is not None and run_key != key:
        return False
    f = filters
    return (f.get("type", "query.run") == "query.run" and ("status" not in f or f["status"] == status)
            and ("kind" not in f or f["kind"] == kind) and ("query" not in f or f["query"] == query)
            and ("connection" not in f or f["connection"] == connection))


class LiveEvents:
    """Per worker: publishing runs into the host's ring, and this worker's streams reading it.

    Each stream reads the ring from its own cursor on its own request thread, so the ring is every stream's
    buffer: a burst of runs waits there, a client that does not keep up costs nothing but its own thread, and a
    stream the ring overtook (its client fell QAG_EVENTS_RING_BYTES behind) is dropped and counted. One waker
    thread per worker that holds streams looks at the ring every POLL seconds and wakes them when it moved."""

    def __init__(self, ring_bytes: int, max_streams: int, relay=None):
        self._ring = shared()          # the master's; a process without one makes its own on its first stream
        self._ring_bytes = ring_bytes
        self.max_streams = max_streams
        self.relay = relay             # live_redis.Relay with QAG_REDIS_URL: events to and from other instances
        self._streams: set[Stream] = set()
        self._lock = threading.Lock()
        self._waker: threading.Thread | None = None
        self._stopping = False
        self.delivered = 0
        self.dropped_streams = 0
        self.pid = os.getpid()

    @property
    def ring(self) -> Ring:
        if self._ring is None:
            with self._lock:
                if self._ring is None:
                    self._ring = Ring(self._ring_bytes)
        return self._ring

    # --- the request path ----------------------------------------------------------------------------------
    def listening(self) -> bool:
        """A stream is open on this host, or (with Redis) on another instance."""
        ring = self._ring
        relay = self.relay
        return (ring is not None and ring.listening()) or (relay is not None and relay.remote_listeners)

    def publish(self, meta: list, payload: bytes) -> None:
        """One run's event: meta = [key name, status, kind, query, connection]; payload = its JSON."""
        record = json.dumps(meta, separators=(",", ":")).encode("utf-8", "surrogatepass") + b"\n" + payload
        ring = self._ring
        if ring is not None and ring.listening():
            ring.publish(record)
        if self.relay is not None and self.relay.remote_listeners:
            self.relay.offer(self.ring.instance, record)

    # --- streams -------------------------------------------------------------------------------------------
    def open(self, key: str | None, filters: dict) -> Stream | None:
        """A new stream reading from now on, or None when this worker holds max_streams already."""
        ring = self.ring
        with self._lock:
            if self._stopping or len(self._streams) >= self.max_streams:
                return None
            stream = Stream(key, filters, ring.end())
            self._streams.add(stream)
            if self._waker is None or os.getpid() != self.pid:
                self.pid = os.getpid()
                self._waker = threading.Thread(target=self._wake, name="qag-live", daemon=True)
                self._waker.start()
        ring.listen(self.pid, +1)
        if self.relay is not None:
            self.relay.host_listens(ring)
        return stream

    def take(self, stream: Stream) -> list[bytes]:
        """The events the stream may see that arrived since it last looked; a stream that was overtaken is
        dropped instead."""
        records, stream.cursor, lost = self.ring.read(stream.cursor)
        if lost:
            stream.dropped = True
            with self._lock:
                self.dropped_streams += 1
            return []
        out = []
        for record in records:
            head, _, payload = record.partition(b"\n")
            if stream.wants(json.loads(head)):
                out.append(payload)
        if out:
            with self._lock:
                self.delivered += len(out)
        return out

    def close(self, stream: Stream) -> None:
        with self._lock:
            if stream not in self._streams:
                return
            self._streams.discard(stream)
        self.ring.listen(self.pid, -1)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def stop(self) -> None:
        """The worker is stopping: every stream ends now (a graceful stop does not wait for them)."""
        with self._lock:
            self._stopping = True
            streams = list(self._streams)
        for stream in streams:
            stream.ready.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def _wake(self) -> None:
        load = self.ring.sync.load
        seen = load(NEXT_SEQ)
        while True:
            with self._lock:
                if not self._streams:
                    self._waker = None
                    return
                streams = list(self._streams)
            now = load(NEXT_SEQ)
            if now != seen:
                seen = now
                for stream in streams:
                    stream.ready.set()
            time.sleep(POLL)
