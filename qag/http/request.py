"""Parse a WSGI environ into a Request: strict path and query decoding, bounded body, JSON objects."""

from __future__ import annotations

import ipaddress
import json
import random
import re
from urllib.parse import unquote_to_bytes

from ..errors import QagError

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_JSON_TYPES = ("application/json",)


def _decode_component(raw: str, plus_is_space: bool) -> str:
    """Percent-decode one URL component strictly: bad escapes and non-UTF-8 are refused, not guessed."""
    if raw.isascii() and "%" not in raw and not (plus_is_space and "+" in raw):
        return raw  # the common case: nothing to decode
    if plus_is_space:
        raw = raw.replace("+", " ")
    if "%" in raw:
        # unquote_to_bytes leaves malformed escapes as text; refuse them instead so "%zz" can't mean two things.
        if re.search(r"%(?![0-9A-Fa-f]{2})", raw):
            raise QagError("invalid_request", "The URL has a malformed percent escape")
        data = unquote_to_bytes(raw.encode("latin-1", "replace"))
    else:
        data = raw.encode("latin-1", "replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise QagError("invalid_request", "The URL is not valid UTF-8") from None


_getrandbits = random.getrandbits   # the module's generator, reseeded in place in each forked worker


def _new_request_id() -> str:
    """12 hex digits. An id correlates lines, it guards nothing: Python's generator (reseeded from the OS in each
    forked worker) instead of os.urandom, whose system call hands the interpreter lock to another thread."""
    # A 49th bit set, then dropped with "0x1" (hex() pads no zeros): fewer instructions than "%012x" % n or
    # n.to_bytes(6, "big").hex() in the compiled build.
    return hex(_getrandbits(48) | 0x1000000000000)[3:]


_HEADER_KEYS: dict[str, str] = {}   # header names asked for → their environ key (the handlers ask a handful)
_KNOWN_LIMIT = 1024


def _header_key(name: str) -> str:
    key = "HTTP_" + name.upper().replace("-", "_")
    if len(_HEADER_KEYS) < _KNOWN_LIMIT and type(name) is str:
        _HEADER_KEYS[name] = key
    return key


def parse_query(query: str) -> dict[str, str]:
    """Query-string arguments; the first value of a repeated name wins."""
    args: dict[str, str] = {}
    if not query:
        return args
    for part in query.split("&"):
        if not part:
            continue
        name, _, value = part.partition("=")
        if part.isascii() and "%" not in part and "+" not in part:
            # Nothing to decode in either half (the common case): _decode_component's own first test, made
            # here once per argument instead of in two calls.
            if name not in args:
                args[name] = value
            continue
        name = _decode_component(name, True)
        if name not in args:
            args[name] = _decode_component(value, True)
    return args


class Request:
    """One HTTP request as the handlers see it; the body is read lazily and at most once."""

    __slots__ = ("environ", "method", "path", "segments", "args", "request_id", "peer", "max_body",
                 "_body", "_json", "https")
    # What the run handlers ask of every request; an MCP tool call (qag/api/mcp.py ToolCall) says otherwise.
    transport = None       # history's `tr`: REST
    read_only = False      # writes as the caller's grants allow
    page_ceiling = None    # page_size up to QAG_MAX_PAGE_SIZE

    def __init__(self, environ: dict, max_body: int, trust_proxy: int = 0):
        self.environ = environ
        env = self.environ   # in the compiled build a typed field (a dict): its lookups are C dict lookups
        self.method = env.get("REQUEST_METHOD", "GET").upper()
        supplied = env.get("HTTP_X_REQUEST_ID")
        self.request_id = supplied if supplied and _REQUEST_ID.fullmatch(supplied) else _new_request_id()
        self.max_body = max_body
        self._body: bytes | None = None
        self._json = None
        self.peer, self.https = client_of(env, trust_proxy)
        self.path = ""
        self.segments: list[str] = []
        self.args: dict[str, str] = {}

    def parse_target(self) -> None:
        """Decode the path and query; raises QagError (400) for a malformed target."""
        raw = self.environ.get("RAW_URI") or self.environ.get("REQUEST_URI")
        if raw:
            # A fragment is never part of a request's target (RFC 9112 3.2); the servers drop it from PATH_INFO
            # and QUERY_STRING, and so does this reading.
            raw = raw.partition("#")[0]
            if raw[:1] != "/" and raw[:8].lower().startswith(("http://", "https://")):   # a scheme in any case
                rest = raw.split("://", 1)[1]            # the authority ends at the path or the query
                ends = [i for i in (rest.find("/"), rest.find("?")) if i >= 0]
                raw = rest[min(ends):] if ends else ""
                if not raw.startswith("/"):
                    raw = "/" + raw
            path, _, query = raw.partition("?")
            path = _decode_component(path, False)
        else:
            try:
                path = self.environ.get("PATH_INFO", "/").encode("latin-1").decode("utf-8")
            except UnicodeError:
                raise QagError("invalid_request", "The URL is not valid UTF-8") from None
            query = self.environ.get("QUERY_STRING", "")
        self.path = path
        # Leading slashes go (//x is /x, as in QueryAPIGate); a trailing one stays as an empty last segment, which
        # no route matches: /api/v1/connections/ is a 404 as in QueryAPIGate, whose routes take no trailing slash.
        stripped = path.lstrip("/")
        self.segments = stripped.split("/") if stripped else []
        self.args = parse_query(query)

    def header(self, name: str) -> str | None:
        keys = _HEADER_KEYS
        key = keys.get(name)
        if key is None:
            key = _header_key(name)
        return self.environ.get(key)

    @property
    def content_type(self) -> str:
        return self.environ.get("CONTENT_TYPE", "").split(";", 1)[0].strip().lower()

    def body(self) -> bytes:
        """The request body, refused with 413 before reading when it is larger than allowed."""
        if self._body is not None:
            return self._body
        length = self.environ.get("CONTENT_LENGTH")
        stream = self.environ.get("wsgi.input")
        try:
            if length:
                try:
                    size = int(length)
                except ValueError:
                    raise QagError("invalid_request", "Content-Length is not a number") from None
                if size > self.max_body:
                    raise QagError("payload_too_large", f"Request body too large (limit {self.max_body} bytes)")
                data = stream.read(size) if stream is not None and size > 0 else b""
            elif stream is not None and self.environ.get("HTTP_TRANSFER_ENCODING", "").lower().find("chunked") >= 0:
                data = stream.read(self.max_body + 1)
                if len(data) > self.max_body:
                    raise QagError("payload_too_large", f"Request body too large (limit {self.max_body} bytes)")
            else:
                data = b""
        except QagError:
            raise
        except Exception:
            # The server's body reader failed (malformed chunk sizes, a client that went away).
            raise QagError("invalid_request", "The request body could not be read (malformed or incomplete)") from None
        self._body = data
        return data

    def json_object(self, *, lenient_content_type: bool, invalid_message: str = "Request body is not valid JSON",
                    not_object_message: str = "Request body must be a JSON object") -> dict | None:
        """The body as a JSON object; None when there is none.

        lenient_content_type (/q): a body without a JSON content type is ignored, as if absent. Otherwise a
        body must be declared JSON: a text/plain or form body is refused, so a browser page can't post one
        cross-origin without a CORS preflight.
        """
        if self._json is not None:
            return self._json
        data = self.body()
        is_json = self.content_type in _JSON_TYPES or self.content_type.endswith("+json")
        if not is_json:
            if lenient_content_type or not data.strip():
                return None
            raise QagError("invalid_body", not_object_message)
        if not data.strip():
            return None
        try:
            # UTF-8 only (RFC 8259), read strictly: json.loads of bytes would also take UTF-16/32 and let encoded
            # surrogates (CESU-8's ED A0 80) through, which no database or file can store.
            value = json.loads(data.decode("utf-8-sig" if data[:3] == b"\xef\xbb\xbf" else "utf-8"),
                               parse_constant=refuse_constant)
        except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
            raise QagError("invalid_body", invalid_message) from None
        if not isinstance(value, dict):
            raise QagError("invalid_body", not_object_message)
        if b"\\u" in data:
            refuse_lone_surrogates(value)
        self._json = value
        return value


def refuse_constant(name: str):
    """json.loads' parse_constant: NaN, Infinity and -Infinity are not JSON (RFC 8259 6); taken, they would be
    stored and sent back as bare words no strict client can read."""
    raise ValueError(f"{name} is not JSON")


def refuse_lone_surrogates(value) -> None:
    """JSON may escape half a UTF-16 pair ("\\ud800"); no database or file can store it, so refuse it here."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise QagError("invalid_body", "Request body holds an unpaired UTF-16 surrogate escape") from None


def forwarded_address(text: str) -> str:
    """A proxy's X-Forwarded-For entry as the address it names, spelt one way (a port, brackets, an IPv6 zone and
    the ::ffff: mapping of an IPv4 address dropped), so that one client is one rate-limit bucket and one allowed_ips
    match however its proxy writes it: some append the client's source port, which made each new connection a fresh
    budget for key guessing. Text that names no address is kept as written (it matches no allow-list entry)."""
    if ":" not in text and "%" not in text and not text.startswith("["):
        return text   # an IPv4 address as written, or text that names none: read as written either way
    host = text
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]          # an IPv4 address with a port
    host = host.partition("%")[0]              # an IPv6 zone
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return text
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped if mapped is not None else address)


def client_of(environ: dict, trust_proxy: int) -> tuple[str | None, bool]:
    """(client address, arrived over HTTPS): the socket peer unless proxies are trusted."""
    peer = environ.get("REMOTE_ADDR") or None
    https = environ.get("wsgi.url_scheme") == "https"
    if trust_proxy:
        forwarded = [p.strip() for p in environ.get("HTTP_X_FORWARDED_FOR", "").split(",") if p.strip()]
        if len(forwarded) >= trust_proxy:
            peer = forwarded_address(forwarded[-trust_proxy])
        proto = [p.strip().lower() for p in environ.get("HTTP_X_FORWARDED_PROTO", "").split(",") if p.strip()]
        if len(proto) >= trust_proxy:
            https = proto[-trust_proxy] == "https"
    return peer, https
