"""GET /catalog (contract 11): the saved queries a caller may run, with their parameters, and what the caller is."""

from __future__ import annotations

import os

from ..backends.base import resolve_fields
from ..errors import QagError
from ..http.response import json_response
from ..policy import masking
from ..sql.params import catalog_rules
from ..sql.prepare import prepare

_PERIODS = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}


def limit_text(limit: tuple[int, int] | None) -> str | None:
    """A parsed rate limit (count, seconds) in the contract's `N/period` form."""
    if limit is None:
        return None
    count, seconds = limit
    return f"{count}/{_PERIODS.get(seconds, f'{seconds} seconds')}"


class CatalogHandlers:
    """The catalog: the same reachability rule as /q/<name> and /openapi.json (RunHandlers.listable_queries)."""

    def __init__(self, gateway):
        self.gateway = gateway

    def register(self, router) -> None:
        router.add("GET", "/catalog", self.catalog, "api.catalog")

    def catalog(self, request, caller):
        run = self.gateway.run
        items = []
        for listed in run.listable_queries(caller):
            version = listed["version"]
            item = {"name": listed["name"], "version": version["version"], "description": version.get("description"),
                    "tags": version.get("tags", []), "collection": listed["collection"],
                    "connection_name": version.get("connection_name"),
                    "parameters": catalog_rules(version.get("parameters"), version.get("placeholders") or ()),
                    "cache_ttl": version.get("cache_ttl"),
                    "can_write": run.writes_allowed(caller, listed["name"])}
            if not caller.admin and caller.grants.mask:
                item["masking"] = self._masking(version, masking.effective(version.get("mask"), caller.grants.mask))
            items.append(item)
        return json_response({"queries": items, "caller": self._caller(caller)})

    def _masking(self, version: dict, rules: tuple) -> dict:
        """What the caller's rules do to the query's result columns, traced as a run traces them; `refused` says
        why a run would be refused (403 mask_unresolvable) instead."""
        name = version.get("connection_name")
        store = self.gateway.metadata
        row = store.get_connection(name) if name else None
        if row is None:
            return {"masked": [], "refused": "The query names no saved connection: its columns are traced when it "
                                             "runs on the one chosen"}
        backend = self.gateway.backends.get(row["db"])
        try:
            plan = self.gateway.run.masking.plan(rules, prepare(version["sql"], row["db"]), row, backend,
                                                 resolve_fields(row["fields"], os.environ))
        except QagError as error:
            return {"masked": [], "refused": error.message}
        if plan is None:
            return {"masked": [], "refused": None}
        return {"masked": [{"column": column, "action": action} for column, action in zip(plan.names, plan.actions)
                           if action in masking.CHANGING], "refused": None}

    def _caller(self, caller) -> dict:
        server = limit_text(self.gateway.settings.rate_limit)
        if caller.admin:
            return {"name": caller.name or "admin", "admin": True,
                    "allow_writes": bool(self.gateway.settings.allow_writes), "allowed_write_ops": None,
                    "allowed_tables": None, "mask": None, "rate_limit": None, "server_rate_limit": server}
        stored = caller.grants.stored
        return {"name": caller.name, "admin": False, "allow_writes": caller.grants.allow_writes,
                "allowed_write_ops": stored.get("allowed_write_ops"), "allowed_tables": stored.get("allowed_tables"),
                "mask": stored.get("mask") or None, "rate_limit": stored.get("rate_limit"), "server_rate_limit": server}
