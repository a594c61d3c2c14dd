"""Pure-Python twin of the httptools request parser (qag/worker/parser.py): same interface, same verdicts."""

from __future__ import annotations

import re
from collections import deque

from ..http11 import METHODS, HttpError, Limits, Request, add_header, bad, check_line, headers_done

_VERSION = re.compile(rb"HTTP/([0-9])\.([0-9])")
# origin-form or "*" (any visible ASCII), or absolute-form with a plain scheme, as llhttp accepts them
_URL = re.compile(rb"[/*][\x21-\x7e]*|[A-Za-z]+://[A-Za-z0-9._~%!$&'()*+,;=:@\[\]-]*(?:[/?][\x21-\x7e]*)?")
_TOKEN = rb"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+"
_HEADER = re.compile(rb"(" + _TOKEN + rb"):[ \t]*([\t\x20-\x7e\x80-\xff]*)")
_CHUNK = re.compile(rb"([0-9A-Fa-f]+)((?:;" + _TOKEN + rb"(?:=(?:" + _TOKEN + rb'|"[^"\r\n]*"))?)*)')

_FRAMING = (b"content-length", b"transfer-encoding")
_LINE, _HEAD, _BODY, _SIZE, _DATA, _DATA_END, _TRAILER, _DEAD = range(8)
# Every method llhttp reads (RTSP's too): an unterminated request line that can't begin one of them is refused at
# once, as llhttp refuses it, not when its LF arrives. qag answers only METHODS; the rest are refused whole.
_LLHTTP_METHODS = METHODS | frozenset("DESCRIBE ANNOUNCE SETUP PLAY PAUSE TEARDOWN GET_PARAMETER SET_PARAMETER "
                                      "REDIRECT RECORD FLUSH".split())
_METHOD_PREFIXES = frozenset(name[:i] for name in _LLHTTP_METHODS for i in range(1, len(name) + 1))


def _refuse_bare_cr(buf: bytearray) -> None:
    """An unterminated line holding a CR that something other than LF follows is refused at once, as llhttp
    refuses it, rather than when the line's LF arrives."""
    cr = buf.find(b"\r")
    if 0 <= cr < len(buf) - 1:
        raise bad("CR without LF")


class Parser:
    """Feed bytes as they arrive; complete requests collect in `ready`. Raises HttpError for a refused request."""

    __slots__ = ("limits", "ready", "partial", "continue_due", "dead", "_buf", "_state", "_req", "_need", "_body",
                 "_version")

    def __init__(self, limits: Limits):
        self.limits = limits
        self.ready: deque[Request] = deque()
        self.partial = False            # a request has begun and is not complete
        self.continue_due: Request | None = None   # head complete, Expect: 100-continue, body still to come
        self.dead = False               # no further request on this connection (body over the limit, upgrade)
        self._buf = bytearray()
        self._state = _LINE
        self._req: Request | None = None
        self._need = 0
        self._body = bytearray()
        self._version = (1, 1)

    def feed(self, data: bytes) -> None:
        if self.dead:
            return
        self._buf += data
        while self._step():
            pass

    # one state transition; False when more bytes are needed (or the connection is done)
    def _step(self) -> bool:
        buf, state, limits = self._buf, self._state, self.limits
        if state == _LINE:
            while buf[:2] == b"\r\n" or buf[:1] == b"\n":
                del buf[:2 if buf[:1] == b"\r" else 1]
            if not buf or buf == b"\r":      # a lone CR may be the start of one more empty line: still idle
                return False
            self.partial = True
            end = buf.find(b"\n")
            if end < 0:
                self._check_partial_line(buf)
                return False
            line = bytes(buf[:end])
            del buf[:end + 1]
            self._request_line(line)
            self._state = _HEAD
            return True
        if state in (_HEAD, _TRAILER):
            end = buf.find(b"\n")
            if end < 0:
                _refuse_bare_cr(buf)
                if len(buf) > limits.field_size + 2:
                    raise HttpError(431, "Request Header Fields Too Large", "header field too large")
                return False
            if end == 0 or buf[end - 1] != 13:
                raise bad("header line without CR")
            line = bytes(buf[:end - 1])
            del buf[:end + 1]
            if line:
                m = _HEADER.fullmatch(line)
                if m is None:
                    raise bad("invalid header field")
                if state == _HEAD:
                    add_header(self._req, m.group(1), m.group(2), limits)
                elif len(line) > limits.field_size:
                    raise HttpError(431, "Request Header Fields Too Large", "trailer field too large")
                elif m.group(1).lower() in _FRAMING:
                    # a trailer can't reframe the message (llhttp refuses it: a request smuggled after it is dropped)
                    raise bad("framing field in a trailer")
                return True
            if state == _TRAILER:
                self._complete()
                return not self.dead
            return self._head_complete()
        if state == _BODY:
            take = min(self._need, len(buf))
            self._body += buf[:take]
            del buf[:take]
            self._need -= take
            if self._need:
                return False
            self._complete()
            return not self.dead
        if state == _SIZE:
            end = buf.find(b"\n")
            if end < 0:
                _refuse_bare_cr(buf)
                if len(buf) > limits.field_size:
                    raise bad("chunk size line too long")
                return False
            if end == 0 or buf[end - 1] != 13:
                raise bad("chunk size line without CR")
            m = _CHUNK.fullmatch(bytes(buf[:end - 1]))
            if m is None or len(m.group(1).lstrip(b"0")) > 16:
                raise bad("invalid chunk size")
            del buf[:end + 1]
            self._need = int(m.group(1), 16)
            self._state = _DATA if self._need else _TRAILER
            return True
        if state == _DATA:
            take = min(self._need, len(buf), limits.body + 1 - len(self._body))
            self._body += buf[:take]
            del buf[:take]
            self._need -= take
            if len(self._body) > limits.body:
                self._over_limit()
                return False
            if self._need:
                return False
            self._state = _DATA_END
            return True
        if state == _DATA_END:
            if len(buf) < 2:
                if buf[:1] not in (b"", b"\r"):
                    raise bad("chunk data without CRLF")
                return False
            if buf[:2] != b"\r\n":
                raise bad("chunk data without CRLF")
            del buf[:2]
            self._state = _SIZE
            return True
        return False

    def _check_partial_line(self, buf: bytearray) -> None:
        # An unterminated request line: refuse it as soon as it is certainly too long or its method is unknown.
        space = buf.find(b" ")
        if space < 0:
            if bytes(buf).decode("latin-1") not in _METHOD_PREFIXES:
                raise bad("invalid method")
            return
        method = bytes(buf[:space]).decode("latin-1")
        if method not in METHODS:
            raise bad("invalid method")
        check_line(method, len(buf) - space - 1 - 9, self.limits)

    def _request_line(self, line: bytes) -> None:
        if not line.endswith(b"\r"):
            raise bad("request line without CR")
        line = line[:-1]
        method, sp, rest = line.partition(b" ")
        name = method.decode("latin-1")
        if not sp or name not in METHODS:
            raise bad("invalid method")
        rest = rest.lstrip(b" ")
        url, sp, version = rest.partition(b" ")
        if not _URL.fullmatch(url):
            raise bad("invalid request target")
        check_line(name, len(url), self.limits)
        m = _VERSION.fullmatch(version) if sp else None
        if m is None:
            raise bad("invalid HTTP version")
        self._version = (int(m.group(1)), int(m.group(2)))
        self._req = Request(name, url.decode("latin-1"))

    def _head_complete(self) -> bool:
        req = self._req
        headers_done(req, *self._version, self.limits)
        self._body = bytearray()
        if req.over_limit:
            self._finish_dead(req)
            return False
        if req.chunked:
            self._state = _SIZE
        elif req.content_length:
            self._state, self._need = _BODY, req.content_length
        else:
            self._complete()
            return not self.dead
        if req.expect_continue:
            self.continue_due = req
        return True

    def _over_limit(self) -> None:
        req = self._req
        req.over_limit = True
        req.keep_alive = False
        req.body = bytes(self._body)
        self._finish_dead(req)

    def _finish_dead(self, req: Request) -> None:
        self.ready.append(req)
        self.partial = False
        self.continue_due = None
        self.dead = True
        self._state = _DEAD
        self._buf.clear()

    def _complete(self) -> None:
        req = self._req
        req.body = bytes(self._body)
        self.ready.append(req)
        self.partial = False
        self.continue_due = None
        self._req = None
        self._state = _LINE
        if not req.keep_alive:
            # the connection ends with this request (Connection: close, HTTP/1.0, upgrade): nothing after it is read
            self.dead = True
            self._state = _DEAD
            self._buf.clear()
