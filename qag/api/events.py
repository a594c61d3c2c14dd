"""GET /events (contract 8.5): live run events over Server-Sent Events, from every worker of the host."""

from __future__ import annotations

import select
import socket
import ssl
import time

from ..errors import QagError
from ..http.response import Response
from ..observe.live import read_filters
STREAM_HEADERS = (("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"))
# As QueryAPIGate's main server names it (its standalone server, and so `qag events`, says no charset).
CONTENT_TYPE = "text/event-stream; charset=utf-8"
# The kernel's send buffer of a stream's socket: a client that stops reading blocks its stream's thread (and so is
# found behind in the ring) after this much, instead of after the megabytes autotuning would let it hold.
SEND_BUFFER = 64 * 1024
KEEPALIVE = b": keepalive\n\n"
RECHECK = 1.0   # seconds: a stream's credential is checked again before it is sent events, at most this often


class EventStream:
    """A stream's body: headers at once, then `data:` frames as events arrive and a keepalive comment after
    `keepalive` seconds without one. Ends when the worker stops, the client fell a whole ring behind, or the
    credential it was opened with no longer names its caller (`still_allowed`: a key revoked, rotated away,
    expired or deactivated; checked before events are sent, at most every RECHECK s, and at each keepalive: a
    stream follows a key name, which a new key may take), or its client closed the connection (`sock`, looked
    at every RECHECK s: a write would notice it only at the second keepalive, holding the stream's slot and thread
    for twice QAG_EVENTS_KEEPALIVE); the server closes it when the client goes away, which gives the stream back."""

    def __init__(self, live, stream, keepalive: float, still_allowed=None, sock=None):
        self.live, self.stream, self.keepalive = live, stream, keepalive or 1.0
        self.still_allowed = still_allowed
        self.sock = sock

    def __iter__(self):
        live, stream, still_allowed, sock = self.live, self.stream, self.still_allowed, self.sock
        yield b""   # the head goes out now: a client sees 200 before the first event
        keepalive = self.keepalive
        quiet_until = time.monotonic() + keepalive
        checked = time.monotonic()
        try:
            while not stream.dropped and not live.stopping:
                wait = max(0.0, quiet_until - time.monotonic())
                stream.ready.wait(wait if sock is None else min(wait, RECHECK))
                stream.ready.clear()
                if sock is not None:
                    gone = client_gone(sock)
                    if gone == GONE:
                        return
                    if gone == SHUT:
                        # The client closed its sending side: gone, or a reader that half-closes (nc -N). A write
                        # now tells: the worker ends the stream when it fails, a reader gets a comment.
                        yield KEEPALIVE
                        quiet_until = time.monotonic() + keepalive
                        continue
                now = time.monotonic()
                if still_allowed is not None and now - checked >= RECHECK:
                    if not still_allowed():
                        return
                    checked = now
                events = live.take(stream)
                if events:
                    yield b"".join(b"data: " + event + b"\n\n" for event in events)
                elif time.monotonic() >= quiet_until:
                    yield KEEPALIVE     # also how a client that went away is noticed
                else:
                    continue
                quiet_until = time.monotonic() + keepalive
        finally:
            self.close()

    def close(self) -> None:
        self.live.close(self.stream)


GONE, SHUT = "gone", "shut"


def client_gone(sock) -> str | None:
    """GONE when the stream's connection is closed or reset both ways, SHUT when the client closed its sending side
    (readable with nothing to read), else None. A client that sends something instead (it shouldn't), and a TLS
    socket's readable data, are left to the writes."""
    try:
        poller = select.poll()        # not select(): a worker's descriptors may pass 1024
        poller.register(sock, select.POLLIN)
        ready = poller.poll(0)
        if not ready:
            return None
        if ready[0][1] & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            return GONE
        if isinstance(sock, ssl.SSLSocket):
            return None               # its recv takes no flags: a peek would read TLS records, not the stream
        return SHUT if sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"" else None
    except BlockingIOError:
        return None
    except (ConnectionError, ValueError):   # reset, or the socket already closed
        return GONE


class EventsHandlers:
    """The main server's live stream: what the caller may see (an administrator every run, a key its own)."""

    def __init__(self, gateway):
        self.live = gateway.observe.live
        self.keepalive = gateway.settings.events_keepalive
        self.auth = gateway.auth

    def register(self, router) -> None:
        router.add("GET", "/events", self.events, "api.stream_events")

    def events(self, request, caller):
        filters = read_filters(request.args)
        # A cap of 0 turns streams off: every one is refused as one over the cap (503, as QueryAPIGate answers).
        stream = self.live.open(None if caller.admin else caller.name, filters)
        if stream is None:
            cap = self.live.max_streams
            held = (f"This worker already holds {cap} open event streams - try again in a few seconds, or connect"
                    if cap else "Event streams are turned off on this server - connect")
            # QueryAPIGate's clients look for its command's name here (contract 8.5); qag's own is `qag events`.
            raise QagError("too_many_streams", held + " to the standalone events server instead (`qag events`; "
                                                      "QueryAPIGate's `queryapigate events`)", retry_after=5)
        sock = request.environ.get("gunicorn.socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            except OSError:
                pass   # a socket that refuses it keeps the kernel's default
        return Response(200, EventStream(self.live, stream, self.keepalive, self._still(request, caller), sock),
                        list(STREAM_HEADERS), CONTENT_TYPE)

    def _still(self, request, caller):
        """Whether the credential this stream was opened with still names the same caller."""
        environ, auth = request.environ, self.auth

        def still_allowed() -> bool:
            try:
                again = auth.authenticate(environ.get("HTTP_X_API_KEY"), request.peer,
                                          environ.get("HTTP_AUTHORIZATION"))
            except QagError:           # a bearer token that expired, or one no longer accepted
                return False
            except Exception:          # the store unreachable: a key can't be revoked meanwhile either
                return True
            return again is not None and again.admin == caller.admin and again.name == caller.name
        return still_allowed
