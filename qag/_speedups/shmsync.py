"""Shared-memory synchronisation for the metadata cache: the pure-Python twin of the compiled _shmsync.

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

Any offset or length outside the buffer, or a misaligned word, raises ValueError; nothing reads or writes out
of bounds. The pure twin relies on CPython reading and writing an aligned 8-byte word in one instruction and on
the processor not reordering loads (x86); the callers also check a CRC of what they read, which covers weaker
memory orders.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import weakref

__all__ = ["Sync"]

_WORD = struct.Struct("<Q")


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
            seq += 1
        _WORD.pack_into(self._bytes, seq_off, seq + 1)
        self._bytes[data_off:data_off + len(data)] = data
        _WORD.pack_into(self._bytes, seq_off, seq + 2)
        return seq + 2

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
