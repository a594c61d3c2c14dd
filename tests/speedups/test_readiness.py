"""The zero-wait readiness twins: same answers on real sockets, same refusals."""

from __future__ import annotations

import os
import socket

import pytest


def test_a_quiet_socket_is_not_readable_and_data_makes_it_so(speedups):
    left, right = socket.socketpair()
    with left, right:
        assert speedups.readiness.readable(left.fileno()) is False
        right.sendall(b"x")
        assert speedups.readiness.readable(left.fileno()) is True
        left.recv(1)
        assert speedups.readiness.readable(left.fileno()) is False


def test_a_closed_peer_reads_as_readable(speedups):
    left, right = socket.socketpair()
    with left:
        right.close()
        assert speedups.readiness.readable(left.fileno()) is True   # end of stream waits to be read


def test_a_descriptor_that_is_not_open_reads_as_readable(speedups):
    r, w = os.pipe()
    os.close(r)
    os.close(w)
    assert speedups.readiness.readable(r) is True


@pytest.mark.parametrize("fd", ["3", 3.0, True, None])
def test_anything_but_an_int_is_refused(speedups, fd):
    with pytest.raises(TypeError):
        speedups.readiness.readable(fd)


def test_the_twins_agree_on_a_real_tcp_connection(twin_pair):
    pure, compiled = twin_pair("readiness")
    server = socket.create_server(("127.0.0.1", 0))
    with server:
        client = socket.create_connection(server.getsockname())
        peer, _ = server.accept()
        with client, peer:
            for step in (b"", b"hello"):
                if step:
                    peer.sendall(step)
                    while not pure.readable(client.fileno()):
                        pass
                assert pure.readable(client.fileno()) == compiled.readable(client.fileno()) == bool(step)
