"""Operations routes: /health, /openapi.json, /docs, / and /favicon.ico."""

from __future__ import annotations

import datetime as _dt
import os

from .. import __version__
from ..http.response import Response, json_response
from .openapi import build_openapi

_DOCS_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>qag API</title>
<link rel="stylesheet" href="https://unpkg.com/swagger-ui-dist@5/swagger-ui.css"></head>
<body><div id="ui"></div>
<script src="https://unpkg.com/swagger-ui-dist@5/swagger-ui-bundle.js"></script>
<script>
window.ui = SwaggerUIBundle({url: "/openapi.json", dom_id: "#ui", persistAuthorization: false,
  requestInterceptor: function (r) { var k = sessionStorage.getItem("qag-key"); if (k) r.headers["X-API-Key"] = k; return r; }});
</script>
<p style="font-family:sans-serif">API key for "Try it out" (kept in this tab only):
<input id="key" type="password" oninput="sessionStorage.setItem('qag-key', this.value)"></p>
</body></html>
"""
_DOCS_CSP = ("default-src 'none'; script-src 'unsafe-inline' https://unpkg.com; style-src https://unpkg.com; "
             "img-src data: https://unpkg.com; connect-src 'self'; frame-ancestors 'none'")


def local_zone() -> tuple[str | None, str]:
    """(IANA zone name when it agrees with the current offset, '+HH:MM') of the server-local clock."""
    offset = _dt.datetime.now().astimezone().utcoffset() or _dt.timedelta(0)
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    text = f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
    name = os.environ.get("TZ") or None
    if name is None:
        try:
            target = os.readlink("/etc/localtime")
            name = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else None
        except OSError:
            name = None
    if name:
        try:
            from zoneinfo import ZoneInfo
            if _dt.datetime.now(ZoneInfo(name)).utcoffset() != offset:
                name = None
        except Exception:  # an unknown or malformed zone name: report the offset only
            name = None
    return name, text


class OpsHandlers:
    """Public routes that never touch a data database."""

    def __init__(self, gateway):
        self.gateway = gateway

    def register(self, router) -> None:
        router.add("GET", "/health", self.health, "api.health", public=True)
        router.add("GET", "/openapi.json", self.openapi, "api.openapi_spec", public=True, wants_caller=True)
        router.add("GET", "/docs", self.docs, "api.docs", public=True)
        router.add("GET", "/", self.root, "api.index", public=True)
        router.add("GET", "/favicon.ico", self.favicon, "api.favicon", public=True)

    def health(self, request, caller):
        name, offset = local_zone()
        return json_response({"status": "ok", "version": __version__, "time_zone": name, "utc_offset": offset})

    def openapi(self, request, caller):
        # Anonymous callers and wrong keys see the generic routes only (contract 9.3).
        queries = self.gateway.run.listable_queries(caller) if caller is not None else []
        return json_response(build_openapi(__version__, queries))

    def docs(self, request, caller):
        return Response(200, _DOCS_HTML.encode("utf-8"),
                        [("Content-Security-Policy", _DOCS_CSP), ("Referrer-Policy", "same-origin")],
                        "text/html; charset=utf-8")

    def root(self, request, caller):
        return Response(302, b"", [("Location", "/docs")])

    def favicon(self, request, caller):
        return Response(204)

