"""Driving a gateway without a server: an in-process client (CLI, tests, benchmarks) and a delaying TCP relay."""

from __future__ import annotations

import heapq
import io
import json
import socket
import struct
import threading
import time
from typing import NamedTuple
from urllib.parse import quote, unquote_to_bytes

from .settings import Settings, load


class Reply(NamedTuple):
    """One answer of Client.request: status, headers (lower-case names) and the body's bytes."""

    status: int
    headers: dict
    body: bytes

    @property
    def json(self):
        """The body read as JSON (None when empty)."""
        return json.loads(self.body) if self.body else None


class Client:
    """A Gateway built from settings (or a home folder and environment), called in this process.

    request(): over WSGI, as a server would call it - authentication, limits, logs and the route, all of it.
    manage(): a management request as the local operator `cli` (no key, no limits, no request log): the route's
    own handler with an administrator caller, what `qag init`, `qag demo` and the `qag` admin commands do."""

    def __init__(self, settings: Settings | None = None, *, home: str | None = None, env: dict | None = None,
                 gateway=None, peer: str = "127.0.0.1"):
        if gateway is None:
            if settings is None:
                settings = load({**({"QAG_HOME": home} if home is not None else {}), **(env or {})})
            from .app import Gateway  # noqa: PLC0415 - the CLI imports this module on its light paths too
            # Management calls never start a trace: no exporter thread (nor OpenTelemetry imported in `qag demo`'s
            # process, which goes on to be the gunicorn master that forks the workers).
            gateway = Gateway(settings.with_overrides(otel="off"))
        self.gateway = gateway
        self.peer = peer
        self._operator = None

    def request(self, method: str, path: str, body=None, *, query: str = "", key: str | None = None,
                headers: dict | None = None) -> Reply:
        """One request through the gateway's WSGI callable, the environ as gunicorn gives it. path: as sent
        (percent-encoded); body: JSON-encoded unless bytes, sent as application/json when given; key: X-API-Key;
        headers: more request headers by their HTTP names (Content-Type overrides the JSON one)."""
        data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else b"")
        environ = {"REQUEST_METHOD": method, "PATH_INFO": unquote_to_bytes(path).decode("latin-1"),
                   "QUERY_STRING": query, "RAW_URI": path + (f"?{query}" if query else ""),
                   "REMOTE_ADDR": self.peer, "wsgi.input": io.BytesIO(data), "wsgi.url_scheme": "http"}
        if body is not None:
            environ["CONTENT_TYPE"] = "application/json"
            environ["CONTENT_LENGTH"] = str(len(data))
        if key is not None:
            environ["HTTP_X_API_KEY"] = key
        for name, value in (headers or {}).items():
            name = name.upper().replace("-", "_")
            environ[name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + name] = value
        started = []
        chunks = self.gateway(environ, lambda status, response_headers, exc_info=None:
                              started.append((status, response_headers)))
        try:
            raw = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        status, response_headers = started[0]
        return Reply(int(status.split()[0]), {k.lower(): v for k, v in response_headers}, raw)

    def manage(self, method: str, path: str, body: dict | None = None, query: str = ""):
        """A management request as the local operator `cli`: the parsed JSON answer (None when empty); raises
        QagError as the route refuses."""
        from .auth import Caller  # noqa: PLC0415
        from .http.request import Request  # noqa: PLC0415
        if self._operator is None:
            self._operator = Caller("cli", True, "cli")
        data = json.dumps(body).encode() if body is not None else b""
        environ = {"REQUEST_METHOD": method, "RAW_URI": quote(path) + (f"?{query}" if query else ""),
                   "REMOTE_ADDR": self.peer, "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(data)),
                   "wsgi.input": io.BytesIO(data)}
        request = Request(environ, self.gateway.max_body)
        request.parse_target()
        route, params = self.gateway.router.match(request.segments, method)
        response = route.handler(request, self._operator, **params)
        return json.loads(response.body) if response.body else None


class Relay:
    """A TCP relay for tests and benchmarks: `with Relay(host, port, delay=0.01) as relay:`, then connect to
    127.0.0.1:relay.port. It adds a delay to the server's replies, counts the client's request turns, and makes the
    faults of a network path on demand: cut (close both ways), reset (RST to the client), black-hole (hold every
    byte, both ways, connections stay open: what a dropped route looks like to both ends), hold the replies only
    (requests still reach the server: a command done whose reply is lost), hold the connections open at that moment
    while new ones pass (a request delivered late, after its client gave up on it), let the connections open at that
    moment die silently (stale: each is reset when its client next sends, never before, as after a NAT, firewall
    or VIP change) and refuse new connections.

    A "turn" is a burst of client bytes that follows server bytes (or starts the conversation): one round trip the
    client waited for. Each chunk from the server is forwarded `delay` seconds after it arrived, so a reply split
    into several chunks still costs one delay, like a network hop."""

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
        self._replying = threading.Event()  # cleared by hold_replies(): the server's bytes wait until restore()
        self._replying.set()
        self._sockets: list[socket.socket] = []
        # Per connection: (gate, ended). hold_old() clears the gates of the connections open then (bytes both ways
        # wait until restore()); ended is set once the server closed its side.
        self._conns: list[tuple[threading.Event, threading.Event]] = []
        self._held: list[tuple[threading.Event, threading.Event]] = []
        self._clients: list[socket.socket] = []
        self._stale: set[socket.socket] = set()   # stale(): reset on their client's next bytes
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
        self._replying.set()
        for gate, _ in self._held:
            gate.set()
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
                # A socket a pump thread is blocked in recv() on outlives close(): nothing would be sent until the
                # peer spoke again, and a client waiting for its reply would wait out its deadline. SHUT_RD wakes
                # that thread and sends nothing, so the close() below is the last reference and sends the RST.
                s.shutdown(socket.SHUT_RD)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def stale(self) -> None:
        """The connections open now die silently: nothing tells their client until it sends, and then it gets a
        TCP RST (the server side is closed); new connections pass."""
        with self._lock:
            self._stale.update(self._clients)

    def blackhole(self) -> None:
        """Hold every byte in both directions (open connections and new ones) until restore()."""
        self._flowing.clear()

    def hold_replies(self) -> None:
        """Forward the client's bytes but hold the server's (open connections and new ones) until restore()."""
        self._replying.clear()

    def hold_old(self) -> None:
        """Hold every byte, both ways, of the connections open now (what their clients send is read and kept) while
        new connections pass; restore() delivers what was held, late: a request its client gave up on (it timed
        out, closed, and went on over a new connection) still reaches the server."""
        with self._lock:
            self._conns = [c for c in self._conns if not c[1].is_set()]
            self._held += self._conns
        for gate, _ in self._conns:
            gate.clear()

    def held_open(self) -> int:
        """The connections hold_old() held that the server has not closed yet: after restore(), 0 once the server
        read what was held and closed them (it did what they asked before it saw their end)."""
        return sum(1 for _, ended in self._held if not ended.is_set())

    def restore(self) -> None:
        self._flowing.set()
        self._replying.set()
        for gate, _ in self._held:
            gate.set()

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
                self._clients = [c for c in self._clients if c.fileno() != -1] + [client]
            conn = (threading.Event(), threading.Event())
            conn[0].set()
            with self._lock:
                self.connections += 1
                self._conns = [c for c in self._conns if not c[1].is_set()]   # the ended ones go
                self._conns.append(conn)
            state = {"last": "server"}
            threading.Thread(target=self._client_to_server, args=(client, server, state, conn[0]), daemon=True).start()
            threading.Thread(target=self._server_to_client, args=(server, client, state, conn), daemon=True).start()

    def _client_to_server(self, client: socket.socket, server: socket.socket, state: dict,
                          gate: threading.Event) -> None:
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                if client in self._stale:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.close()      # the RST the client's bytes meet on a path that died
                    break
                self._flowing.wait()
                gate.wait()
                with self._lock:
                    if state["last"] == "server":
                        self.turns += 1
                    state["last"] = "client"
                server.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(server)

    def _server_to_client(self, server: socket.socket, client: socket.socket, state: dict,
                          conn: tuple[threading.Event, threading.Event]) -> None:
        gate, ended = conn
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
                    self._replying.wait()
                    gate.wait()
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
            ended.set()
            done.set()
            with cond:
                cond.notify()


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
