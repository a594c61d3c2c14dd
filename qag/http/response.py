"""Build responses: JSON bodies, error envelopes, and the headers every response carries."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Iterable

from ..errors import QagError
from .negotiate import PROBLEM_JSON, wants_problem

_STATUS_LINES = {s.value: f"{s.value} {s.phrase}" for s in HTTPStatus}
_API_CSP = ("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
_NOSNIFF = ("X-Content-Type-Options", "nosniff")
_NO_REFERRER = ("Referrer-Policy", "no-referrer")
_NO_STORE = ("Cache-Control", "no-store")
VARY_ACCEPT = ("Vary", "Accept")
_CORS_EXPOSE = ("X-Page, X-Page-Size, X-Has-More, X-Row-Count, X-RateLimit-Limit, X-RateLimit-Remaining, "
                "X-RateLimit-Key-Limit, X-RateLimit-Key-Remaining, Retry-After, X-Request-Id, X-Cache, ETag, "
                "Deprecation, Link")


# What finish() looks for in a handler's headers, by the name's lower case; names seen are remembered (a bounded
# dict: a handful of names in practice), so a call's headers cost a lookup each, not a lower() and compares.
_OTHER, _CONTENT_TYPE, _CACHE_CONTROL, _CSP, _REFERRER = range(5)
_LOOKED_FOR = {"content-type": _CONTENT_TYPE, "cache-control": _CACHE_CONTROL, "content-security-policy": _CSP,
               "referrer-policy": _REFERRER}
_ROLES: dict[str, int] = {}
_KNOWN_LIMIT = 1024


def _role(name: str) -> int:
    found = _LOOKED_FOR.get(name.lower(), _OTHER)
    if len(_ROLES) < _KNOWN_LIMIT and type(name) is str:
        _ROLES[name] = found
    return found


def json_bytes(value) -> bytes:
    """Compact JSON, keys in insertion order, non-ASCII escaped, one trailing newline (contract 0.2)."""
    return json.dumps(value, separators=(",", ":")).encode("ascii") + b"\n"


class Response:
    """Status, headers and a body (bytes, or an iterable of bytes for a stream)."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int = 200, body: bytes | Iterable[bytes] = b"",
                 headers: list[tuple[str, str]] | None = None, content_type: str | None = None):
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else []
        if content_type:
            self.headers.append(("Content-Type", content_type))

    def has_header(self, name: str) -> bool:
        lower = name.lower()
        return any(h.lower() == lower for h, _ in self.headers)

    @property
    def status_line(self) -> str:
        return _STATUS_LINES.get(self.status) or f"{self.status} Unknown"


def json_response(value, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, json_bytes(value), headers, "application/json")


def error_response(error: QagError, request_id: str, accept: str | None = None) -> Response:
    """The contract's envelope, or RFC 9457 problem details when Accept asks for them by name (Accept is read only
    here, on the way out of a refusal: a call that succeeds never parses it for this)."""
    if accept is not None and wants_problem(accept):
        response = Response(error.status, json_bytes(error.problem(request_id)), list(error.headers), PROBLEM_JSON)
    else:
        response = json_response(error.envelope(request_id), error.status, list(error.headers))
    response.headers.append(VARY_ACCEPT)  # the body's shape depends on Accept
    if "retry_after" in error.extras and not response.has_header("Retry-After"):
        response.headers.append(("Retry-After", str(error.extras["retry_after"])))
    return response


class HeaderPolicy:
    """The headers added to every response: request id, security headers, CORS (contract 0.4–0.6)."""

    def __init__(self, cors_origins: tuple[str, ...], hsts_max_age: int | None):
        self.cors_any = "*" in cors_origins
        self.cors_origins = frozenset(cors_origins)
        self.hsts = f"max-age={hsts_max_age}" if hsts_max_age else None

    def cors_enabled(self) -> bool:
        return bool(self.cors_origins)

    def listed(self, origin: str) -> bool:
        """Whether the origin is named in QAG_CORS_ORIGINS itself (not only let in by `*`)."""
        name = origin.rstrip("/").lower()
        return name != "*" and name in self.cors_origins

    def allowed_origin(self, origin: str | None) -> str | None:
        if not origin or not self.cors_origins:
            return None
        if self.cors_any:
            return "*"
        return origin if origin.rstrip("/").lower() in self.cors_origins else None

    def preflight(self, origin: str | None) -> Response:
        response = Response(204)
        allowed = self.allowed_origin(origin)
        if allowed:
            response.headers += [
                ("Access-Control-Allow-Methods", "GET, POST, PATCH, DELETE, OPTIONS"),
                ("Access-Control-Allow-Headers", "Content-Type, X-API-Key, Authorization, X-Request-Id"),
                ("Access-Control-Max-Age", "600"),
            ]
        return response

    def finish(self, response: Response, request_id: str, origin: str | None, https: bool) -> list[tuple[str, str]]:
        headers = response.headers
        # One pass over what the handler set (every call goes through here): the first Content-Type decides
        # HTML or not, and a header the handler set itself is never added twice.
        content_type = None
        has_csp = has_referrer = has_cache = False
        roles = _ROLES
        for name, value in headers:
            role = roles.get(name)
            if role is None:
                role = _role(name)
            if role == _OTHER:
                continue
            if role == _CONTENT_TYPE:
                if content_type is None:
                    content_type = value
            elif role == _CACHE_CONTROL:
                has_cache = True
            elif role == _CSP:
                has_csp = True
            else:
                has_referrer = True
        headers.append(("X-Request-Id", request_id))
        headers.append(_NOSNIFF)
        if content_type is None or not content_type.startswith("text/html"):
            if not has_csp:
                headers.append(_API_CSP)
            if not has_referrer:
                headers.append(_NO_REFERRER)
        if not has_cache:
            headers.append(_NO_STORE)
        if self.hsts and https:
            headers.append(("Strict-Transport-Security", self.hsts))
        if origin and self.cors_origins:
            headers += self.cors_headers(origin)
        return headers

    def cors_headers(self, origin: str | None) -> list[tuple[str, str]]:
        """The CORS headers of a response to `origin` (none for an origin not allowed); also `qag events`'."""
        allowed = self.allowed_origin(origin)
        if not allowed:
            return []
        if allowed == "*":
            return [("Access-Control-Allow-Origin", allowed), ("Access-Control-Expose-Headers", _CORS_EXPOSE)]
        return [("Access-Control-Allow-Origin", allowed), ("Vary", "Origin"),
                ("Access-Control-Expose-Headers", _CORS_EXPOSE)]
