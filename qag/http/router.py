"""Match a decoded path and method to a route: templates of literal and <name>/<int:name> segments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import QagError


@dataclass(frozen=True, slots=True)
class Route:
    """One route: its methods, handler, endpoint name (for logs and metrics) and whether it is public."""

    template: tuple[str, ...]
    methods: frozenset[str]
    handler: Callable[..., Any]
    endpoint: str
    public: bool = False
    admin: bool = False
    wants_caller: bool = False  # a public route that still looks at who calls (e.g. /openapi.json)


# A template segment's kind, read once when the route is added (_pattern) instead of from its text on every match.
_LITERAL, _TEXT, _INT = range(3)
_INT_DIGITS = 100           # the longest <int:> segment that binds


def _pattern(template: tuple[str, ...]) -> tuple[tuple[int, str], ...]:
    """(kind, literal or variable name) per segment: "<int:v>" → (_INT, "v"), "<v>" → (_TEXT, "v")."""
    return tuple((_INT, seg[5:-1]) if seg.startswith("<int:") else (_TEXT, seg[1:-1]) if seg.startswith("<")
                 else (_LITERAL, seg) for seg in template)


class Router:
    """Routes indexed by segment count; a literal segment wins over a variable one."""

    def __init__(self) -> None:
        self._by_length: dict[int, list[tuple[Route, tuple]]] = {}   # (route, its _pattern)

    def add(self, methods: str, path: str, handler: Callable[..., Any], endpoint: str, *,
            public: bool = False, admin: bool = False, wants_caller: bool = False) -> None:
        template = tuple(s for s in path.strip("/").split("/") if s)
        route = Route(template, frozenset(methods.split()), handler, endpoint, public, admin, wants_caller)
        routes = self._by_length.setdefault(len(template), [])
        routes.append((route, _pattern(template)))
        # Literal segments first, so /api/v1/connections/test is not taken as a connection named "test".
        routes.sort(key=lambda entry: tuple(kind != _LITERAL for kind, _ in entry[1]))

    def match(self, segments: list[str], method: str) -> tuple[Route, dict[str, Any]]:
        """The route and its path variables; QagError 404, or 405 with the Allow header (RFC 9110 15.5.6) naming
        every method some route of this path takes."""
        allowed: set[str] | None = None
        for route, pattern in self._by_length.get(len(segments), ()):
            params = _bind(pattern, segments)
            if params is None:
                continue
            if method in route.methods or (method == "HEAD" and "GET" in route.methods):
                return route, params
            allowed = set(route.methods) if allowed is None else allowed | route.methods
        if allowed is not None:
            raise QagError("method_not_allowed", headers=[("Allow", allow_header(allowed))])
        raise QagError("not_found")

    def lookup_public(self, segments: list[str]) -> Route | None:
        """The route a path would reach, whatever the method (for the public-endpoint check)."""
        for route, pattern in self._by_length.get(len(segments), ()):
            if _bind(pattern, segments) is not None:
                return route
        return None


_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allow_header(methods: set[str] | frozenset[str]) -> str:
    """The Allow value for a route's methods: HEAD wherever GET is (match() answers it), in a fixed order. No
    OPTIONS: only a CORS preflight is answered (when CORS is on), a plain OPTIONS is a 405 like any other."""
    names = set(methods)
    if "GET" in names:
        names.add("HEAD")
    ordered = [m for m in _METHOD_ORDER if m in names]
    return ", ".join(ordered + sorted(names.difference(_METHOD_ORDER)))


def _bind(pattern: tuple[tuple[int, str], ...], segments: list[str]) -> dict[str, Any] | None:
    """The path variables when the segments (as many as the pattern's) match it, else None."""
    params: dict[str, Any] = {}
    i = 0
    for kind, text in pattern:
        segment = segments[i]
        i += 1
        if kind == _LITERAL:
            if text != segment:
                return None
        elif kind == _TEXT:
            if not segment:   # no name is empty: /api/v1/connections/ (a trailing slash) is no connection's URL
                return None
            params[text] = segment
        else:
            # Any whole number binds (a version that can't exist is the handler's 404 version_not_found, as the
            # contract says of one that doesn't), up to _INT_DIGITS digits: int() of a longer text costs more.
            if not segment.isdigit() or not segment.isascii() or len(segment) > _INT_DIGITS:
                return None
            params[text] = int(segment)
    return params
