"""PEP 3333 on qag's worker: the environ of a parsed request, start_response, and the response writer."""

from __future__ import annotations

import io
from io import BytesIO
import json
import os
import re
import select
import sys
import time
from email.utils import formatdate
from urllib.parse import unquote_to_bytes

from gunicorn.http.wsgi import FileWrapper, WSGIErrorsWrapper

from .. import _speedups
from ..http11 import Request

_STATUS = re.compile(r"[0-9]{3}(?: [ \t\x21-\x7e\x80-\xff]*)?")
_DATE = [0, b""]
# statuses already seen valid → (their status line and Server field, their code)
_STATUS_LINES: dict[str, tuple[bytes, int]] = {}
# request field names already seen → (their environ key, how it is set: one of the kinds below)
_ENV_KEYS: dict[str, tuple[str, int]] = {}
_LEFT_OUT, _LAST, _HOST, _JOINED = range(4)   # not in the environ; the last value; Host (joined, and read); joined
_KNOWN_LIMIT = 1024
_LENGTH_LINES: dict[int, bytes] = {}   # body lengths already answered → their Content-Length field (formatting an
                                       # int costs ~850 instructions, a lookup ~100; bodies repeat their sizes)
_time = time.time   # a module global, not a module attribute looked up per response


def _env_key(name: str) -> tuple[str, int]:
    """(CONTENT_TYPE, _LAST), (CONTENT_LENGTH, _LAST) or (HTTP_<NAME>, _JOINED or _HOST); ("", _LEFT_OUT) for a
    name holding "_": X_API_KEY and X-API-KEY would both be HTTP_X_API_KEY, so the ambiguous form is left out, as
    gunicorn does. Remembered."""
    if name == "CONTENT-TYPE" or name == "CONTENT-LENGTH":
        found = (name.replace("-", "_"), _LAST)
    elif "_" in name:
        found = ("", _LEFT_OUT)
    else:
        found = ("HTTP_" + name.replace("-", "_"), _HOST if name == "HOST" else _JOINED)
    if len(_ENV_KEYS) < _KNOWN_LIMIT:
        _ENV_KEYS[name] = found
    return found


def fields_sorter():
    """The selected twin's sort_fields (qag/_speedups/respond.py): the worker reads it once."""
    return _speedups.get("respond").sort_fields


def _status_line(status: str) -> bytes:
    return b"HTTP/1.1 " + status.encode("latin-1") + b"\r\nServer: qag\r\n"


def _date() -> bytes:
    now = int(_time())
    if _DATE[0] != now:
        _DATE[1] = ("Date: " + formatdate(now, usegmt=True) + "\r\n").encode()
        _DATE[0] = now
    return _DATE[1]


class TooLarge(io.RawIOBase):
    """wsgi.input of a request whose body exceeded the limit and was not (wholly) read: what was read, and an
    error for a read of more. qag's app answers 413 from Content-Length, or from reading limit + 1 bytes."""

    def __init__(self, head: bytes):
        self._head = BytesIO(head)
        self._size = len(head)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self._size:
            raise OSError("request body larger than the server's limit (QAG_MAX_BODY_BYTES)")
        return self._head.read(size)

    def readline(self, size: int = -1) -> bytes:
        return self._head.readline(size)


def base_environ(cfg, server) -> dict:
    """The per-listener part of every environ, built once."""
    env = {"wsgi.version": (1, 0), "wsgi.errors": WSGIErrorsWrapper(cfg), "wsgi.multithread": True,
           "wsgi.multiprocess": cfg.workers > 1, "wsgi.run_once": False, "wsgi.url_scheme": "http",
           "wsgi.file_wrapper": FileWrapper, "wsgi.input_terminated": True, "SERVER_SOFTWARE": "qag",
           "SCRIPT_NAME": ""}
    if isinstance(server, tuple):
        env["SERVER_NAME"], env["SERVER_PORT"] = str(server[0]), str(server[1])
    return env


# What every request sets (environ(), and the worker's gunicorn.socket): a connection's base holds them already,
# so that a request's copy replaces them rather than adds them.
_PER_REQUEST = dict.fromkeys(("REQUEST_METHOD", "RAW_URI", "PATH_INFO", "QUERY_STRING", "SERVER_PROTOCOL",
                              "wsgi.input", "gunicorn.socket"))


def connection_environ(base: dict, client) -> dict:
    """A listener's base environ with the client's address: built once per connection, copied per request."""
    env = base.copy()
    _client_environ(env, client)
    env.update(_PER_REQUEST)
    # A request's copy then adds its header fields. dict.copy() keeps the table's size (when few of its entries are
    # deleted ones), so a table with room for them saves a resize per request (~2,000 instructions): grow it now
    # with placeholder keys, dropped again.
    size, added = sys.getsizeof(env), 0
    while sys.getsizeof(env) == size and added < 64:
        env[added] = None
        added += 1
    for placeholder in range(added):
        del env[placeholder]
    return env


def _client_environ(env: dict, client) -> None:
    if isinstance(client, tuple):
        env["REMOTE_ADDR"], env["REMOTE_PORT"] = client[0], str(client[1])
    else:
        env["REMOTE_ADDR"] = client.decode() if isinstance(client, bytes) else (client or "")


def environ(req: Request, base: dict, client, server) -> dict:
    """The environ of one request; `base` is a listener's base environ, or a connection's (connection_environ),
    which already holds the client's address."""
    env = base.copy()
    uri = req.uri
    if uri.startswith(("http://", "https://")):
        # absolute-form: the path is what follows the authority
        rest = uri.split("://", 1)[1]
        path_q = "/" + rest.partition("/")[2]
    else:
        path_q = uri
    path_q = path_q.partition("#")[0]
    path, _, query = path_q.partition("?")
    env["REQUEST_METHOD"] = req.method
    env["RAW_URI"] = uri
    env["PATH_INFO"] = unquote_to_bytes(path).decode("latin-1") if "%" in path else path
    env["QUERY_STRING"] = query
    env["SERVER_PROTOCOL"] = "HTTP/1.1" if req.version == (1, 1) else "HTTP/1.0"
    env["wsgi.input"] = TooLarge(req.body) if req.over_limit else BytesIO(req.body)
    if "REMOTE_ADDR" not in env:
        _client_environ(env, client)
    host = None
    keys = _ENV_KEYS
    for name, value in req.headers:
        found = keys.get(name)
        if found is None:
            found = _env_key(name)
        key, kind = found
        if kind == _JOINED or kind == _HOST:
            if kind == _HOST:
                host = value
            env[key] = env[key] + "," + value if key in env else value
        elif kind == _LAST:
            env[key] = value
    if "SERVER_NAME" not in env:
        # A unix socket: the server's name comes from Host, as gunicorn does.
        name, _, port = (host or "").partition(":")
        env["SERVER_NAME"], env["SERVER_PORT"] = name, port or "80"
    return env


class ClientGone(Exception):
    """The client stopped reading (closed, reset, or no progress within the send timeout)."""


def send_now(sock, data):
    """Send what the non-blocking socket takes without waiting: None when it took everything (one call, nothing
    made), else the rest as a view, which the worker sends as the client reads (never waiting in a pool thread)."""
    try:
        sent = sock.send(data)
    except (BlockingIOError, InterruptedError):
        sent = 0
    except OSError as exc:
        raise ClientGone(str(exc)) from None
    if sent == len(data):
        return None
    return memoryview(data)[sent:]


def send_all(sock, data, timeout: float) -> None:
    """Write everything on a non-blocking socket, waiting for room at most `timeout` seconds at a time (a stream's
    writes: its thread holds the app's iterator, and a database cursor, until the last one)."""
    try:
        sent = sock.send(data)   # most responses fit the socket's buffer: one call, no view
    except BlockingIOError:
        sent = 0
    except OSError as exc:
        raise ClientGone(str(exc)) from None
    if sent == len(data):
        return
    view = memoryview(data)[sent:]
    while view:
        try:
            n = sock.send(view)
        except BlockingIOError:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            if not poller.poll(timeout * 1000):
                raise ClientGone("send timed out") from None
            continue
        except OSError as exc:
            raise ClientGone(str(exc)) from None
        view = view[n:]


class Response:
    """start_response and write() for one request; decides framing (Content-Length, chunked, close)."""

    __slots__ = ("sock", "req", "timeout", "status", "code", "headers", "length", "chunked", "close",
                 "headers_sent", "sent", "no_body", "_head", "_lines", "_sort_fields")

    def __init__(self, sock, req: Request, timeout: float, keep_alive: bool, sort_fields=None):
        self.sock, self.req, self.timeout = sock, req, timeout
        self._sort_fields = sort_fields or fields_sorter()
        self.status: str | None = None
        self.code = 0
        self.headers: list[tuple[str, str]] = []
        self.length: int | None = None
        self.chunked = False
        self.close = not keep_alive
        self.headers_sent = False
        self.sent = 0
        self.no_body = False
        self._head = b""    # the status line (and Server field), set by start_response
        self._lines = b""

    def start_response(self, status, headers, exc_info=None):
        if exc_info:
            try:
                if self.headers_sent:
                    raise exc_info[1].with_traceback(exc_info[2])
            finally:
                exc_info = None
        elif self.status is not None:
            raise AssertionError("start_response called twice without exc_info")
        lines = _STATUS_LINES
        known = lines.get(status) if type(status) is str else None
        if known is None:
            if not isinstance(status, str) or not _STATUS.fullmatch(status):
                raise ValueError(f"invalid status {status!r}")
            known = (_status_line(status), int(status[:3]))
            if len(lines) < _KNOWN_LIMIT:
                lines[status] = known
        # Each field checked (the first bad one named, and nothing of this call kept), then written, taken as
        # the length or dropped (qag/_speedups/respond.py).
        kept, self._lines, length, close = self._sort_fields(headers)
        if close:
            self.close = True
        self.status = status
        self._head = known[0]
        self.code = code = known[1]
        self.no_body = self.req.method == "HEAD" or code in (204, 304) or code < 200
        if code == 204 or code < 200:
            length = None
        self.headers = kept
        self.length = length
        return self.write

    def _build_head(self, body_len: int | None, body: bytes = b"") -> bytes:
        """Status line and headers; body_len is the whole body's length when it is already known."""
        length = self.length
        framing = b""
        if length is None and not self.no_body:
            if body_len is not None:
                length = self.length = body_len
            elif self.req.version == (1, 1):
                self.chunked = True
                framing = b"Transfer-Encoding: chunked\r\n"
            else:
                self.close = True   # HTTP/1.0 without a length: the body ends when the connection does
        if length is not None:
            known_lengths = _LENGTH_LINES
            framing = known_lengths.get(length)
            if framing is None:
                framing = b"Content-Length: %d\r\n" % length
                if len(known_lengths) < _KNOWN_LIMIT:
                    known_lengths[length] = framing
        if self.close:
            connection = b"Connection: close\r\n"
        elif self.req.version == (1, 0):
            connection = b"Connection: keep-alive\r\n"
        else:
            connection = b""
        return b"".join((self._head, _date(), self._lines, framing, connection, b"\r\n", body))

    def write(self, data: bytes) -> None:
        """WSGI's write() callable, and each item of the response iterable."""
        if self.status is None:
            raise AssertionError("write() before start_response")
        if not self.headers_sent:
            head = self._build_head(None)
            self.headers_sent = True
        else:
            head = b""
        if self.no_body or not data:
            if head:
                send_all(self.sock, head, self.timeout)
            return
        if self.length is not None:
            # never more than declared: the rest would be read as the next response
            room = self.length - self.sent
            if len(data) > room:
                data = data[:room]
                self.close = True
        self.sent += len(data)
        if self.chunked:
            send_all(self.sock, head + b"%x\r\n" % len(data) + data + b"\r\n", self.timeout)
        else:
            send_all(self.sock, head + data if head else data, self.timeout)

    def write_whole(self, body: bytes):
        """A body known in full (a list of one or more items): one send, Content-Length when the app gave none.
        None when the socket took it all, else the rest (send_now), for the worker to send without waiting."""
        self.headers_sent = True
        if self.no_body:
            return send_now(self.sock, self._build_head(len(body)))
        length = self.length if self.length is not None else len(body)
        short = False
        if len(body) != length:
            body = body[:length]
            short = len(body) < length
        data = self._build_head(length, body)   # head and body in one buffer, one send
        if short:
            self.close = True   # less than announced: the client can't frame a next response
        self.sent = len(body)
        return send_now(self.sock, data)

    def finish(self) -> None:
        if not self.headers_sent:
            self.write(b"")
        if self.chunked:
            send_all(self.sock, b"0\r\n\r\n", self.timeout)
        elif self.length is not None and self.sent < self.length and not self.no_body:
            self.close = True   # the app sent less than it announced: the client can't frame the next response


_CODES = {400: "malformed_http", 414: "request_line_too_long", 417: "expectation_failed", 431: "header_fields_too_large",
          500: "internal_error"}


# What the app adds to every response (contract 0.4-0.5), here for the answers the worker gives itself: a request
# it can't read, or an app that failed before its status line.
_SECURITY_HEADERS = (b"X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'none'; "
                     b"frame-ancestors 'none'\r\nReferrer-Policy: no-referrer\r\nCache-Control: no-store\r\n")


def error_response(status: int, reason: str, message: str) -> bytes:
    """A refusal in qag's error envelope (docs/errors.md) with its X-Request-Id, and the connection closed after it.
    A 500 says only "An error occurred" (contract 0.3: no internal text)."""
    request_id = os.urandom(6).hex()
    error = "An error occurred" if status >= 500 else (message or reason)
    body = json.dumps({"error": error, "code": _CODES.get(status, "malformed_http"),
                       "request_id": request_id}).encode() + b"\n"
    return (b"HTTP/1.1 %d %s\r\nServer: qag\r\n" % (status, reason.encode()) + _date()
            + b"Connection: close\r\nContent-Type: application/json\r\nContent-Length: %d\r\n" % len(body)
            + b"X-Request-Id: %s\r\n" % request_id.encode() + _SECURITY_HEADERS + b"\r\n" + body)


def log_error(log, message: str) -> None:
    try:
        log.exception(message)
    except Exception:  # a broken log handler must not take the request thread down
        print(message, file=sys.stderr)
