# cython: language_level=3
"""Compiled twin of readiness.py: one poll() with a zero timeout, the interpreter lock kept (rules in its docstring)."""

from libc.errno cimport EINTR, errno


cdef extern from "<poll.h>":
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    enum:
        POLLIN


def readable(fd):
    """True when a read on `fd` would not block (bytes, end of stream or an error are waiting, or fd is not open)."""
    if type(fd) is not int:
        raise TypeError("fd must be an int")
    cdef pollfd p
    p.fd = fd
    p.events = POLLIN
    p.revents = 0
    cdef int n = poll(&p, 1, 0)
    while n < 0 and errno == EINTR:   # retried, as Python's own calls are (PEP 475)
        n = poll(&p, 1, 0)
    if n < 0:
        raise OSError(errno, "poll failed")
    return n > 0
