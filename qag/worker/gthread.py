"""gunicorn's gthread worker as `QAG_WORKER_CLASS=gthread` runs it: client sockets that wait at most the client
timeout, and refusals in qag's error envelope instead of gunicorn's HTML page."""

from __future__ import annotations

import socket
import time

from gunicorn.http import errors as http_errors
from gunicorn.workers.gthread import ThreadWorker

from . import wsgi

# What gunicorn refuses before the app, as the qag worker answers it (docs/errors.md): status, reason phrase.
_REFUSALS = (
    (http_errors.LimitRequestLine, 414, "URI Too Long"),
    (http_errors.LimitRequestHeaders, 431, "Request Header Fields Too Large"),
    (http_errors.ExpectationFailed, 417, "Expectation Failed"),
    (http_errors.ForbiddenProxyRequest, 403, "Forbidden"),
)
# The application's fault or the server's, not the client's: a 500.
_NOT_THE_CLIENTS = (http_errors.InvalidResponseHeader, http_errors.InvalidResponseHeaderName,
                    http_errors.ConfigurationProblem)


class _ClientSocket(socket.socket):
    """A client connection on which gunicorn's "blocking" means blocking for a bounded time: gthread reads a
    request's head and body in a pool thread with no limit of its own, so a few clients that send half a request
    and wait, or trickle it a byte at a time, would hold every thread. As the qag worker counts: a request (head
    and body, read by gthread or by the app) must arrive within `timeout_seconds` of the pool thread taking it
    (gthread makes the socket blocking then), or the client is gone (NoMoreData: a head is dropped quietly, a body
    the app reads is refused as incomplete); a write waits at most `timeout_seconds` for each part the client takes
    (any progress starts it again), then fails as a reset would."""

    __slots__ = ("_deadline",)
    timeout_seconds = 30.0

    def setblocking(self, flag: bool) -> None:
        if flag:
            self._deadline = time.monotonic() + self.timeout_seconds   # a request is to be read: its time starts
            self.settimeout(self.timeout_seconds)
        else:
            super().setblocking(False)

    def recv(self, size: int, flags: int = 0) -> bytes:
        current = self.gettimeout()
        if current == 0.0:
            return super().recv(size, flags)   # a non-blocking look (the poller's side): as asked
        left = getattr(self, "_deadline", 0.0) - time.monotonic()
        if left <= 0:
            # The time is up, but what already arrived is still read (an app slow to read a body sent at once
            # must not refuse it); only waiting for more is over.
            self.settimeout(0.0)
            try:
                return super().recv(size, flags)
            except BlockingIOError:
                raise http_errors.NoMoreData() from None
            finally:
                self.settimeout(current)
        # Never longer than a wait the caller set itself (gunicorn's lingering close gives a client 2 s, on the
        # worker's main thread).
        self.settimeout(min(left, current) if current is not None else left)
        try:
            return super().recv(size, flags)
        except TimeoutError:
            raise http_errors.NoMoreData() from None

    def send(self, data, flags: int = 0) -> int:
        self.settimeout(self.timeout_seconds)
        return super().send(data, flags)

    def sendall(self, data, flags: int = 0) -> None:
        # socket.sendall's timeout bounds the whole call (Python 3.5+): a large body to a slow but steady reader
        # would fail at the timeout. Each send() here waits at most the timeout for room.
        with memoryview(data) as view, view.cast("B") as octets:
            sent, total = 0, len(octets)
            while sent < total:
                sent += self.send(octets[sent:], flags)


class QagThreadWorker(ThreadWorker):
    """gunicorn's ThreadWorker; only its client sockets and its refusals are qag's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        from ..settings import load
        _ClientSocket.timeout_seconds = float(load().client_timeout)

    def enqueue_req(self, conn):
        if type(conn.sock) is socket.socket:   # a new connection: wrapped once, before anything reads or polls it
            sock = conn.sock
            conn.sock = _ClientSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
            conn.sock.setblocking(False)
        super().enqueue_req(conn)

    def _keepalive_after(self, conn, keepalive):
        # After the app has answered, gthread reads the body the app left unread; one that doesn't parse (a bad
        # chunk) ended in a second, unasked-for answer, which a client that pipelined would take for its next
        # request's. The connection is closed without one instead.
        try:
            return super()._keepalive_after(conn, keepalive)
        except (http_errors.ParseException, OSError):
            return False

    def handle_error(self, req, client, addr, exc):
        """The qag worker's answer to the same refusal: its envelope, X-Request-Id and security headers, and the
        connection closed after it (gthread closes it)."""
        if isinstance(exc, _NOT_THE_CLIENTS) or not isinstance(exc, http_errors.ParseException):
            if req is not None and hasattr(req, "uri"):
                self.log.exception("Error handling request %s %s", getattr(req, "method", ""), req.uri)
            else:
                self.log.exception("Error handling request (no URI read)")
            status, reason, message = 500, "Internal Server Error", ""
        else:
            status, reason = 400, "Bad Request"
            for kind, refused_status, refused_reason in _REFUSALS:
                if isinstance(exc, kind):
                    status, reason = refused_status, refused_reason
                    break
            message = f"{reason}: {exc}" if status == 400 else reason
            self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        try:
            client.sendall(wsgi.error_response(status, reason, message))
        except OSError:
            self.log.debug("Failed to send error message.")
