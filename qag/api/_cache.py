"""Administration of the response cache: /api/v1/cache/entries (contract 7.2), for administrators only."""

from __future__ import annotations

from ..cache.response import WORKSPACE
from ..errors import QagError
from ..http.response import Response, json_response
from ._common import no_content


class CacheHandlers:
    """List, read and evict the live entries of this server's workspace (never bodies in the listing)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def register(self, router) -> None:
        add = router.add
        add("GET", "/api/v1/cache/entries", self.list_entries, "v1.list_cache_entries", admin=True)
        add("DELETE", "/api/v1/cache/entries", self.clear, "v1.clear_cache", admin=True)
        add("GET", "/api/v1/cache/entries/<key>", self.get_entry, "v1.get_cache_entry", admin=True)
        add("DELETE", "/api/v1/cache/entries/<key>", self.evict, "v1.delete_cache_entry", admin=True)

    def list_entries(self, request, caller):
        return json_response({"items": self.gateway.response_cache.list(WORKSPACE)})

    def clear(self, request, caller):
        self.gateway.response_cache.clear(WORKSPACE)  # not audited (contract 7.2)
        return no_content()

    def get_entry(self, request, caller, key):
        entry = self.gateway.response_cache.get(key, WORKSPACE)
        if entry is None:
            raise QagError("cache_entry_not_found")
        return Response(200, entry.body, None, entry.content_type)

    def evict(self, request, caller, key):
        self.gateway.response_cache.evict(key)  # an unknown key is a no-op, still 204
        return no_content()
