"""The request parser: httptools (llhttp, C) in a process that runs compiled (qag/_speedups), else the pure twin.

Between requests, complete heads of the plainest kind (a GET or HEAD without a body) are taken by the selected
httphead twin (qag/_speedups/httphead.py) without llhttp's Python callback per field; llhttp parses the rest."""

from __future__ import annotations

from collections import deque

from .. import _speedups
from ..http11 import HttpError, Limits, Request, add_header, bad, check_line, headers_done

try:
    import httptools
except ImportError:  # the pure twin serves
    httptools = None


class _Stop(Exception):
    """Raised from a callback to stop parsing: the request is handed over as it is, nothing more is read."""


class CParser:
    """httptools twin of qag/worker/_parser_pure.Parser: same attributes, same verdicts."""

    __slots__ = ("limits", "ready", "partial", "continue_due", "dead", "_p", "_req", "_url", "_body", "_in_head",
                 "_fed", "take_simple")

    def __init__(self, limits: Limits):
        self.limits = limits
        self.ready: deque[Request] = deque()
        self.partial = False
        self.continue_due: Request | None = None
        self.dead = False
        self._p = httptools.HttpRequestParser(self)
        self._req: Request | None = None
        self._url = b""
        self._body = bytearray()
        self._in_head = False
        self._fed = 0
        self.take_simple = _speedups.get("httphead").take   # None: llhttp parses everything (tests compare)

    def feed(self, data: bytes) -> None:
        if self.dead:
            return
        if not self.partial and self.take_simple is not None:   # llhttp is between requests
            used, dead = self.take_simple(data, self.limits, self.ready)
            if dead:
                self.dead = True
                return
            if used:
                if used == len(data):
                    return   # all taken (the usual case): no empty slice made
                data = data[used:]
        try:
            self._p.feed_data(data)
        except _Stop:
            return
        except httptools.HttpParserUpgrade:
            # llhttp stops after a request asking for a protocol switch; headers_done already marked it
            # upgrade (answered as plain HTTP, then the connection closes).
            self.dead = True
            return
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if isinstance(cause, _Stop):
                return
            if isinstance(cause, HttpError):
                raise cause from None
            raise bad(str(exc) or "malformed request") from None
        if self.partial:
            # llhttp keeps header names and values it has not finished in memory: bound a request's head
            # (and trailers) by what the limits allow, counted roughly per fed block.
            self._fed += len(data)
            if self._in_head and self._fed > self.limits.head:
                raise HttpError(431, "Request Header Fields Too Large", "request head too large")
            if self._fed > self.limits.head * 2 + 8 * self.limits.body + 65536:
                raise bad("request framing too large")

    # --- llhttp callbacks ----------------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.partial = True
        self._in_head = True
        self._url = b""
        self._req = None
        self._fed = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        check_line(self._p.get_method().decode("latin-1"), len(self._url), self.limits)

    def _request(self) -> Request:
        if self._req is None:
            self._req = Request(self._p.get_method().decode("latin-1"), self._url.decode("latin-1"))
        return self._req

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:
            add_header(self._request(), name, value, self.limits)
        elif len(name) + 2 + len(value) > self.limits.field_size:   # a trailer: checked, not kept
            raise HttpError(431, "Request Header Fields Too Large", "trailer field too large")

    def on_headers_complete(self) -> None:
        req = self._request()
        self._in_head = False
        major, _, minor = self._p.get_http_version().partition(".")
        headers_done(req, int(major), int(minor), self.limits)
        self._body = bytearray()
        if req.over_limit:
            self._finish_dead(req)
            raise _Stop
        if req.expect_continue and (req.chunked or req.content_length):
            self.continue_due = req

    def on_body(self, body: bytes) -> None:
        self._body += body
        if len(self._body) > self.limits.body:
            req = self._req
            req.over_limit = True
            req.keep_alive = False
            req.body = bytes(self._body[:self.limits.body + 1])
            self._finish_dead(req)
            raise _Stop

    def on_message_complete(self) -> None:
        req = self._req
        req.body = bytes(self._body)
        self.ready.append(req)
        self.partial = False
        self.continue_due = None
        self._req = None
        if not req.keep_alive:
            # the connection ends with this request (Connection: close, HTTP/1.0, upgrade): nothing after it is read
            self.dead = True
            raise _Stop

    def _finish_dead(self, req: Request) -> None:
        self.ready.append(req)
        self.partial = False
        self.continue_due = None
        self.dead = True


def parser_class():
    """The worker's parser, as qag/_speedups selected for this process: CParser (httptools' llhttp) when it runs
    compiled, else the pure twin."""
    if _speedups.kind() == "compiled" and httptools is not None:
        return CParser
    from ._parser_pure import Parser
    return Parser
