"""GET /events (contract 8.5): live run events over Server-Sent Events, from every worker of the host."""

from __future__ import annotations

import socket
import time

from ..errors import QagError
from ..http.response import Response
from ..observe.live import read_filters
STREAM_HEADERS = (("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no"))
# The kernel's send buffer of a stream's socket: a client that stops reading blocks its stream's thread (and so is
# found behind in the ring) after this much, instead of after the megabytes autotuning would let it hold.
SEND_BUFFER = 64 * 1024
KEEPALIVE = b": keepalive\n\n"


class EventStream:
    """A stream's body: headers at once, then `data:` frames as events arrive and a keepalive comment after
    `keepalive` seconds without one. Ends when the worker stops or the client fell a whole ring behind; the server
    closes it when the client goes away, which gives the stream back."""

    def __init__(self, live, stream, keepalive: float):
        self.live, self.stream, self.keepalive = live, stream, keepalive or 1.0

    def __iter__(self):
        live, stream = self.live, self.stream
        yield b""   # the head goes out now: a client sees 200 before the first event
        keepalive = self.keepalive
        quiet_until = time.monotonic() + keepalive
        try:
            while not stream.dropped and not live.stopping:
                stream.ready.wait(max(0.0, quiet_until - time.monotonic()))
                stream.ready.clear()
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


class EventsHandlers:
    """The main server's live stream: what the caller may see (an administrator every run, a key its own)."""

    def __init__(self, gateway):
        self.live = gateway.observe.live
        self.keepalive = gateway.settings.events_keepalive

    def register(self, router) -> None:
        router.add("GET", "/events", self.events, "api.stream_events")

    def events(self, request, caller):
        filters = read_filters(request.args)
        if self.live.max_streams == 0:
            raise QagError("not_found")
        stream = self.live.open(None if caller.admin else caller.name, filters)
        if stream is None:
            raise QagError("too_many_streams", f"This worker already holds {self.live.max_streams} open event "
                                               f"streams - try again in a few seconds", retry_after=5)
        sock = request.environ.get("gunicorn.socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            except OSError:
                pass   # a socket that refuses it keeps the kernel's default
        return Response(200, EventStream(self.live, stream, self.keepalive), list(STREAM_HEADERS),
                        "text/event-stream")
