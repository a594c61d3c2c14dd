"""The test relay's faults (qag.testing.Relay) do to a waiting client what the drills say they do."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from qag.testing import Relay


@pytest.fixture
def silent_upstream():
    """A server that accepts and reads but never answers: a client through the relay waits for its reply."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()
    listener.close()
    for conn in accepted:
        conn.close()


def _waiting_client(relay: Relay) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", relay.port), timeout=5)
    client.sendall(b"a request that gets no reply")
    time.sleep(0.2)   # the relay's pump threads are now blocked in recv() on both of their sockets
    return client


def test_reset_sends_a_waiting_client_its_rst_at_once(silent_upstream):
    with Relay(*silent_upstream) as relay:
        client = _waiting_client(relay)
        started = time.monotonic()
        relay.reset_connections()
        with pytest.raises(ConnectionResetError):
            client.recv(1)
        assert time.monotonic() - started < 2.0
        client.close()


def test_cut_closes_a_waiting_clients_connection_at_once(silent_upstream):
    with Relay(*silent_upstream) as relay:
        client = _waiting_client(relay)
        relay.cut()
        assert client.recv(1) == b""
        client.close()
