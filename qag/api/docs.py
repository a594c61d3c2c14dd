"""The /docs page: Swagger UI shipped inside the package and served by qag, so the page loads from no other origin."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from ..http.response import Response

STATIC = Path(__file__).with_name("static")
PREFIX = "/docs/static/"
# URL name → (file under static/, content type): only what the page loads. swagger_ui/ holds the unmodified
# swagger-ui-dist release files (SOURCE.txt says which release); docs.js and docs.css are qag's own.
FILES = {
    "swagger-ui.css": ("swagger_ui/swagger-ui.css", "text/css; charset=utf-8"),
    "swagger-ui-bundle.js": ("swagger_ui/swagger-ui-bundle.js", "text/javascript; charset=utf-8"),
    "favicon-32x32.png": ("swagger_ui/favicon-32x32.png", "image/png"),
    "docs.css": ("docs.css", "text/css; charset=utf-8"),
    "docs.js": ("docs.js", "text/javascript; charset=utf-8"),
}
# The page is where an administrator types the admin key: nothing but this origin may run or load there.
# data: images are Swagger UI's stylesheet's own icons, written inline in it.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# An asset's URL carries its digest (?v=), so a new release is a new URL: a cached copy is never stale.
_IMMUTABLE = ("Cache-Control", "public, max-age=31536000, immutable")

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>qag API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" type="image/png" href="{favicon-32x32.png}">
<link rel="stylesheet" href="{swagger-ui.css}">
<link rel="stylesheet" href="{docs.css}">
</head><body>
<div id="ui"></div>
<p class="qag-key"><label>API key for "Try it out" (kept in this tab only):
<input id="key" type="password" autocomplete="off"></label></p>
<script src="{swagger-ui-bundle.js}"></script>
<script src="{docs.js}"></script>
</body></html>
"""


class _Asset:
    __slots__ = ("body", "content_type", "etag", "url")

    def __init__(self, name: str, relative: str, content_type: str):
        self.body = (STATIC / relative).read_bytes()
        digest = hashlib.sha256(self.body).hexdigest()
        self.content_type = content_type
        self.etag = f'"{digest[:32]}"'
        self.url = f"{PREFIX}{name}?v={digest[:12]}"


class DocsPage:
    """The page and its assets, read from the package on first use and kept for the life of the worker."""

    def __init__(self):
        self._lock = threading.Lock()
        self._assets: dict[str, _Asset] | None = None
        self._page: bytes | None = None

    def register(self, router) -> None:
        router.add("GET", "/docs", self.page, "api.docs", public=True, wants_caller=True)   # a key's headers too
        # One literal route per file: any other path under /docs/static/ is an unknown route like any other.
        for name in FILES:
            # Cached publicly for a year: no caller's headers (X-Quota-*) may ride on them.
            router.add("GET", PREFIX + name, self._server(name), "api.docs_static", public=True)

    def _load(self) -> dict[str, _Asset]:
        with self._lock:
            if self._assets is None:
                assets = {name: _Asset(name, relative, kind) for name, (relative, kind) in FILES.items()}
                page = _PAGE
                for name, asset in assets.items():
                    page = page.replace("{" + name + "}", asset.url)
                self._page = page.encode("utf-8")
                self._assets = assets
            return self._assets

    def page(self, request, caller):
        self._load()
        # No Cache-Control here: the response policy's no-store keeps the page, and so its asset URLs, current.
        return Response(200, self._page, [("Content-Security-Policy", CSP), ("Referrer-Policy", "same-origin")],
                        "text/html; charset=utf-8")

    def _server(self, name: str):
        def serve(request, caller):
            asset = self._load()[name]
            if request.header("If-None-Match") == asset.etag:
                return Response(304, b"", [("ETag", asset.etag), _IMMUTABLE])
            return Response(200, asset.body, [("ETag", asset.etag), _IMMUTABLE], asset.content_type)
        return serve
