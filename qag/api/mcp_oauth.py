"""/mcp as an OAuth 2.1 resource server: the RFC 9728 metadata document, its challenge, and what tokens must carry."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from ..bearer import TokenTarget, audience_key
from ..errors import QagError
from ..http.response import json_response

WELL_KNOWN = "/.well-known/oauth-protected-resource"
MCP_PATH = "/mcp"
# A Host (or X-Forwarded-Host) value that is a host name or IP literal with an optional port: anything else
# (a quote, a comma of two joined headers, a path) never reaches a URL qag publishes.
_HOST = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?")
# The metadata changes only with the settings; an hour is what the MCP SDK's own resource servers send.
_CACHE = ("Cache-Control", "public, max-age=3600")


class ProtectedResource:
    """The settings of /mcp as a resource server (QAG_MCP_RESOURCE_URL, QAG_MCP_AUTH_SERVER, QAG_MCP_SCOPE on top
    of QAG_JWT_*): the TokenTarget authentication checks at /mcp, the metadata route, and the Bearer challenges."""

    def __init__(self, settings):
        self.enabled = settings.jwt_mode is not None
        self.configured_url = settings.mcp_resource_url   # canonical (audience_key), or None: per request
        issuer = settings.jwt_issuer
        servers = settings.mcp_auth_server or (
            (issuer,) if issuer and issuer[:8].lower().startswith(("https://", "http://")) else ())
        self.authorization_servers = list(servers)
        self.scopes = tuple(settings.mcp_scope)
        self.trust_proxy = settings.trust_proxy
        # RFC 9728 2 (and MCP) want at least one authorization server: without one there is no document to serve.
        self.published = self.enabled and bool(self.authorization_servers)
        self.target = None
        if self.enabled:
            # The token must be for this server: QAG_JWT_AUDIENCE (qag's own API) or this resource's URL. A URL
            # derived from the request is never an accepted audience: Host is the caller's to choose, so a token
            # issued for any other server could name it.
            audiences = {audience_key(a) for a in settings.jwt_audience}
            if self.configured_url is not None:
                audiences.add(self.configured_url)
            self.target = TokenTarget(frozenset(audiences), self.scopes)
        vary = "Host, X-Forwarded-Host, X-Forwarded-Proto" if self.trust_proxy else "Host"
        self._headers = [_CACHE] if self.configured_url is not None else [_CACHE, ("Vary", vary)]

    def register(self, router) -> None:
        """The metadata at the root well-known URI and at the one of /mcp's path (RFC 9728 3.1, MCP's discovery
        order), and at the one of QAG_MCP_RESOURCE_URL's path when a proxy serves /mcp under another path."""
        paths = {WELL_KNOWN, WELL_KNOWN + MCP_PATH}
        if self.configured_url is not None:
            path = urlsplit(self.configured_url).path.rstrip("/")
            if path:
                paths.add(WELL_KNOWN + path)
        for path in sorted(paths):
            router.add("GET", path, self.metadata, "api.mcp_resource_metadata", public=True)   # public, cacheable

    # --- the resource's URL -------------------------------------------------------------------------------------
    def resource_url(self, request) -> str | None:
        """The canonical URL of /mcp: QAG_MCP_RESOURCE_URL, else this request's scheme and Host (X-Forwarded-Proto
        and -Host as QAG_TRUST_PROXY trusts them, the same hop as X-Forwarded-For); None for a Host that is no host."""
        if self.configured_url is not None:
            return self.configured_url
        environ = request.environ
        host = None
        if self.trust_proxy:
            forwarded = [p.strip() for p in environ.get("HTTP_X_FORWARDED_HOST", "").split(",") if p.strip()]
            if len(forwarded) >= self.trust_proxy:
                host = forwarded[-self.trust_proxy]
        if host is None:
            host = environ.get("HTTP_HOST") or ""
        if not host:   # HTTP/1.0 without Host: the address the request arrived at
            name, port = environ.get("SERVER_NAME", ""), environ.get("SERVER_PORT", "")
            host = f"{name}:{port}" if port else name
        if not _HOST.fullmatch(host):
            return None
        return audience_key(f"{'https' if request.https else 'http'}://{host}{MCP_PATH}")

    @staticmethod
    def metadata_url(resource: str) -> str:
        """RFC 9728 3.1: the well-known path inserted between the resource's host and its path."""
        parts = urlsplit(resource)
        path = parts.path.rstrip("/")
        return f"{parts.scheme}://{parts.netloc}{WELL_KNOWN}{path}"

    # --- the metadata document ----------------------------------------------------------------------------------
    def metadata(self, request, caller):
        """GET /.well-known/oauth-protected-resource[/mcp]: public, cacheable; 404 while no token can be had."""
        if not self.published:
            raise QagError("not_found")
        resource = self.resource_url(request)
        if resource is None:
            raise QagError("invalid_request", "The Host header is not a host name")
        document = {"resource": resource, "authorization_servers": self.authorization_servers,
                    "bearer_methods_supported": ["header"]}
        if self.scopes:
            document["scopes_supported"] = list(self.scopes)
        document["resource_name"] = "qag"
        return json_response(document, 200, list(self._headers))

    # --- challenges ---------------------------------------------------------------------------------------------
    def challenges(self, headers: list, request) -> list:
        """`headers` with each Bearer challenge naming the metadata document (RFC 9728 5.1) and the scopes /mcp
        needs (RFC 6750 3), so an MCP client learns from any 401 or 403 where to get a token and what for."""
        if not self.enabled:
            return headers
        extra = ""
        if self.published:
            resource = self.resource_url(request)
            if resource is not None:
                extra = f', resource_metadata="{self.metadata_url(resource)}"'
        scope = f', scope="{" ".join(self.scopes)}"' if self.scopes else ""
        out = []
        for name, value in headers:
            if name.lower() == "www-authenticate" and value.startswith("Bearer "):
                # A 403 insufficient_scope names its own scopes (token_scope), or is about the role, not scopes
                # (token_role): a scope there would send a client re-authorizing for what it already holds.
                value += extra + ("" if "insufficient_scope" in value else scope)
            out.append((name, value))
        return out
