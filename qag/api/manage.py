"""The management API (/api/v1): connections, saved queries, API keys, roles, identity and the response cache,
for administrators."""

from __future__ import annotations

from ._cache import CacheHandlers
from ._connections import ConnectionHandlers
from ._keys import KeyHandlers
from ._queries import QueryHandlers


class ManageHandlers:
    """Registers every /api/v1 route; each resource's handlers live in their own module."""

    def __init__(self, gateway):
        self.connections = ConnectionHandlers(gateway)
        self.queries = QueryHandlers(gateway)
        self.keys = KeyHandlers(gateway)
        self.cache = CacheHandlers(gateway)

    def register(self, router) -> None:
        for handlers in (self.connections, self.queries, self.keys, self.cache):
            handlers.register(router)
