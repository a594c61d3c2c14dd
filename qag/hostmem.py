"""Anonymous shared memory for host-wide state: mapped once (by the gunicorn master, before forking) and inherited
by every worker, named nowhere, freed by the kernel when the last process holding it ends."""

from __future__ import annotations

import mmap
import os
import tempfile

__all__ = ["anonymous_fd", "map_anonymous"]


def anonymous_fd(name: str) -> int:
    """A file in memory that no path names: memfd, else a /dev/shm (or temp) file unlinked at once. Nothing is
    left behind by a crash or a SIGKILL of the master."""
    if hasattr(os, "memfd_create"):
        try:
            return os.memfd_create(name, os.MFD_CLOEXEC)
        except OSError:
            pass
    where = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix=name + "-", dir=where)
    os.unlink(path)
    return fd


def map_anonymous(size: int, name: str) -> tuple[mmap.mmap, int]:
    """(a zeroed shared read-write mapping of `size` bytes, its descriptor); the caller closes both."""
    fd = anonymous_fd(name)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE), fd
    except BaseException:
        os.close(fd)
        raise
