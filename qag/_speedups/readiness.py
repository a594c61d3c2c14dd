"""Pure twin of the zero-wait readiness check: whether a socket has something to read (data, EOF or an error) now.

`readable(fd)` polls one file descriptor for input without waiting. The compiled twin (_readiness.pyx) makes the
same poll() call while keeping the interpreter lock: a call that cannot block has nothing to gain from releasing
it, and each release can hand the lock to another thread and back. This twin goes through `select.poll`, which
always releases it. A descriptor that is not open reads as readable (poll reports it invalid): whatever held it is
gone. TypeError for a non-integer, in both.
"""

from __future__ import annotations

import select


def readable(fd: int) -> bool:
    """True when a read on `fd` would not block (bytes, end of stream or an error are waiting, or fd is not open)."""
    if type(fd) is not int:
        raise TypeError("fd must be an int")
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
