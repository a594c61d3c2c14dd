"""HTTP/1.1 request rules shared by the worker's parsers and the httphead twins: limits, framing (no smuggling), keep-alive."""

from __future__ import annotations

# The request methods llhttp (httptools) knows; the pure twin accepts exactly these so the twins agree.
METHODS = frozenset((
    "DELETE GET HEAD POST PUT CONNECT OPTIONS TRACE COPY LOCK MKCOL MOVE PROPFIND PROPPATCH SEARCH UNLOCK BIND "
    "REBIND UNBIND ACL REPORT MKACTIVITY CHECKOUT MERGE M-SEARCH NOTIFY SUBSCRIBE UNSUBSCRIBE PATCH PURGE "
    "MKCALENDAR LINK UNLINK SOURCE QUERY PRI").split())


class HttpError(Exception):
    """A request the server refuses before the application sees it; the connection is closed after the answer."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def bad(message: str) -> HttpError:
    return HttpError(400, "Bad Request", message)


class Limits:
    """gunicorn's request limits (limit_request_line, limit_request_fields, limit_request_field_size) plus the
    body limit (QAG_MAX_BODY_BYTES): a larger body is never buffered."""

    __slots__ = ("line", "fields", "field_size", "body", "head")

    def __init__(self, line: int = 4094, fields: int = 100, field_size: int = 8190, body: int = 1 << 20):
        # 0 means "no limit" in gunicorn for the line and field size; qag still bounds them, at gunicorn's maxima.
        self.line = line or 8190
        self.fields = fields or 32768
        self.field_size = field_size or 8190
        self.body = body
        # Bytes a request head may take before its end is seen: every line at its limit.
        self.head = self.line + 2 + self.fields * (self.field_size + 2) + 2


class Request:
    """One parsed request: what the WSGI layer needs, and how the connection goes on after it."""

    __slots__ = ("method", "uri", "version", "headers", "body", "chunked", "content_length", "keep_alive",
                 "expect_continue", "over_limit", "upgrade", "_te", "_cl", "_connection", "_upgrade_hdr",
                 "_expect")

    def __init__(self, method: str, uri: str):
        self.method = method
        self.uri = uri
        self.version = (1, 1)
        self.headers: list[tuple[str, str]] = []   # (UPPER-CASE NAME, value), as gunicorn's req.headers
        self.body = b""
        self.chunked = False
        self.content_length: int | None = None
        self.keep_alive = True
        self.expect_continue = False
        self.over_limit = False   # body larger than the limit: not read; the app answers 413, then the connection closes
        self.upgrade = False
        self._te = self._cl = self._connection = self._upgrade_hdr = self._expect = None

    def __repr__(self) -> str:
        return f"<Request {self.method} {self.uri} {self.version} {len(self.headers)} headers {len(self.body)} bytes>"


def check_line(method: str, url_len: int, limits: Limits) -> None:
    """The request line's length as gunicorn counts it (method, target, version, two spaces)."""
    if len(method) + 1 + url_len + 9 > limits.line:
        raise HttpError(414, "URI Too Long", "request line too long")


def add_header(req: Request, name: bytes, value: bytes, limits: Limits) -> None:
    """One header field, as both twins deliver it (name as sent, value with leading whitespace removed)."""
    if len(name) + 2 + len(value) > limits.field_size:
        raise HttpError(431, "Request Header Fields Too Large", "header field too large")
    if len(req.headers) >= limits.fields:
        raise HttpError(431, "Request Header Fields Too Large", "too many header fields")
    key = name.decode("latin-1").upper()
    text = value.decode("latin-1").strip(" \t")
    if key == "CONTENT-LENGTH":
        if req._cl is not None:
            raise bad("duplicate Content-Length")
        req._cl = text
    elif key == "TRANSFER-ENCODING":
        if req._te is not None:
            raise bad("duplicate Transfer-Encoding")
        req._te = text
    elif key == "CONNECTION":
        req._connection = text if req._connection is None else req._connection + "," + text
    elif key == "UPGRADE":
        req._upgrade_hdr = text
    elif key == "EXPECT":
        req._expect = text
    req.headers.append((key, text))


def headers_done(req: Request, major: int, minor: int, limits: Limits) -> None:
    """Everything decided once the head is complete; raises HttpError for a request that must be refused."""
    if (major, minor) not in ((1, 1), (1, 0)):
        raise HttpError(400, "Bad Request", "unsupported HTTP version")
    req.version = (major, minor)
    if req.method == "CONNECT":
        raise bad("CONNECT is not supported")
    te, cl = req._te, req._cl
    if te is not None and cl is not None:
        raise bad("both Content-Length and Transfer-Encoding")
    if te is not None:
        if te.lower() != "chunked":
            raise bad("unsupported Transfer-Encoding")
        req.chunked = True
    elif cl is not None:
        if not cl.isdigit() or not cl.isascii() or len(cl) > 18:
            raise bad("invalid Content-Length")
        req.content_length = int(cl)
        if req.content_length > limits.body:
            req.over_limit = True
    tokens = {t.strip().lower() for t in req._connection.split(",")} if req._connection else ()
    if req.version == (1, 1):
        req.keep_alive = "close" not in tokens
    else:
        req.keep_alive = "keep-alive" in tokens and "close" not in tokens
    if req._upgrade_hdr is not None and "upgrade" in tokens:
        # No protocol switch here: the request is answered as plain HTTP and the connection closed after it.
        req.upgrade = True
        req.keep_alive = False
    if req._expect is not None:
        if req._expect.lower() != "100-continue":
            raise HttpError(417, "Expectation Failed", "unsupported Expect")
        req.expect_continue = req.version == (1, 1)
    if req.over_limit:
        req.keep_alive = False
