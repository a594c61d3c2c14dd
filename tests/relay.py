"""A TCP relay for tests: adds a delay to the server's replies, counts the client's request turns, and makes the
faults of a network path on demand: cut (close both ways), reset (RST to the client), black-hole (hold every byte,
both ways, connections stay open: what a dropped route looks like to both ends) and refuse new connections.

A "turn" is a burst of client bytes that follows server bytes (or starts the conversation): one round trip the
client waited for. Each chunk from the server is forwarded `delay` seconds after it arrived, so a reply split
into several chunks still costs one delay, like a network hop.
"""

from __future__ import annotations

import heapq
import socket
import struct
import threading
import time


class Relay:
    """`with Relay(host, port, delay=0.01) as relay:` then connect to 127.0.0.1:relay.port."""

    def __init__(self, upstream_host: str, upstream_port: int, delay: float = 0.0):
        self.upstream = (upstream_host, upstream_port)
        self.delay = delay
        self.turns = 0
        self.connections = 0
        self._lock = threading.Lock()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        self.refusing = False  # down(): new connections are closed at once, as if the server had stopped
        self._flowing = threading.Event()   # cleared by blackhole(): nothing is forwarded until restore()
        self._flowing.set()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def reset(self) -> None:
        with self._lock:
            self.turns = 0

    def close(self) -> None:
        """Stop accepting (new connections are refused) and break the open ones."""
        self._closed = True
        self._flowing.set()   # let held pumps run into the closed sockets and end
        # shutdown() first: close() alone leaves a socket that a thread is blocked in accept() on still listening.
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self.cut()

    def cut(self) -> None:
        """Break every open connection, as a database restart or a network failure would; keep listening."""
        sockets, self._sockets = list(self._sockets), []
        for s in sockets:
            # shutdown() first: it wakes the pump threads blocked in recv(), so both ends really close.
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def reset_connections(self) -> None:
        """Reset every open connection: the client side gets a TCP RST (SO_LINGER 0), the server side a close."""
        sockets, self._sockets = list(self._sockets), []
        for s in sockets:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            except OSError:
                pass

    def blackhole(self) -> None:
        """Hold every byte in both directions (open connections and new ones) until restore()."""
        self._flowing.clear()

    def restore(self) -> None:
        self._flowing.set()

    def down(self) -> None:
        """Stop the upstream as seen through the relay: break open connections and refuse new ones until up()."""
        self.refusing = True
        self.cut()

    def up(self) -> None:
        self.refusing = False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)
            self._sockets += [client, server]
            with self._lock:
                self.connections += 1
            state = {"last": "server"}
            threading.Thread(target=self._client_to_server, args=(client, server, state), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(server, client, state), daemon=True).start()

    def _client_to_server(self, client: socket.socket, server: socket.socket, state: dict) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                with self._lock:
                    if state["last"] == "server":
                        self.turns += 1
                    state["last"] = "client"
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(server)

    def _server_to_client(self, server: socket.socket, client: socket.socket, state: dict) -> None:
        pending: list[tuple[float, int, bytes]] = []
        cond = threading.Condition()
        done = threading.Event()
        sequence = 0

        def sender():
            try:
                while True:
                    with cond:
                        while not pending and not done.is_set():
                            cond.wait()
                        if not pending and done.is_set():
                            return
                        due, _, data = pending[0]
                        wait = due - time.monotonic()
                        if wait > 0:
                            cond.wait(wait)
                            continue
                        heapq.heappop(pending)
                    self._flowing.wait()
                    client.sendall(data)
            except OSError:
                pass
            finally:
                _shutdown(client)

        threading.Thread(target=sender, daemon=True).start()
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                with self._lock:
                    state["last"] = "server"
                with cond:
                    sequence += 1
                    heapq.heappush(pending, (time.monotonic() + self.delay, sequence, data))
                    cond.notify()
        except OSError:
            pass
        finally:
            done.set()
            with cond:
                cond.notify()


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
