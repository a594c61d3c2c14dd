"""Management of API keys and roles, the caller's identity and quota usage: /api/v1/api-keys, /roles, /me,
/usage/quotas (5.4–5.6)."""

from __future__ import annotations

import datetime as _dt
import secrets

from ..auth import now_text, secret_hash
from ..errors import QagError
from ..http.response import json_response
from ..policy.grants import GRANT_FIELDS, Grants, effective_limits, expired
from ..policy.keyfields import (normalise_key_create, normalise_key_patch, normalise_role_create,
                                normalise_role_patch)
from .. import shapes
from ._common import audit, body_object, check_if_match, no_content, refuse_unknown, with_etag
from ._usage import UsageFigures

_NO_STORE = [("Cache-Control", "no-store")]
_DEFAULT_GRACE_MINUTES = shapes.GRACE_MINUTES["default"]
_MAX_GRACE_MINUTES = shapes.GRACE_MINUTES["maximum"]
# QueryAPIGate 0.43's owner role, whole and in its order: clients decide what to offer from this list, and the
# admin key and an open server are that owner (capabilities of features qag doesn't serve included).
_OWNER_CAPABILITIES = ["access.read", "access.write", "admins.read", "admins.write", "cache.read", "cache.write",
                       "config.apply", "connections.read", "connections.write", "destinations.write", "examples.write",
                       "exports.read", "exports.run", "exports.write", "history.forget", "observe", "queries.read",
                       "queries.write", "secrets.rotate", "self", "settings.read", "workspaces.read",
                       "workspaces.write", "writes.approve"]


def new_secret() -> str:
    """`sk_` + 43 URL-safe base64 characters (32 random bytes); only its SHA-256 is ever stored."""
    return "sk_" + secrets.token_urlsafe(32)


def _previous_valid(row: dict) -> bool:
    until = row.get("previous_expires_at")
    return bool(row.get("previous_hash")) and bool(until) and now_text() < until


def _etag_state(row: dict) -> dict:
    # Using a key is not a change to it: last-used times stay out of the ETag.
    return {k: v for k, v in row.items() if k not in ("last_used_at", "previous_last_used_at")}


class KeyHandlers:
    """Scoped keys (secrets shown once), roles as templates, and /api/v1/me."""

    def __init__(self, gateway):
        self.gateway = gateway
        self.store = gateway.store

    def register(self, router) -> None:
        add = router.add
        add("GET", "/api/v1/api-keys", self.list_keys, "v1.list_api_keys", admin=True)
        add("POST", "/api/v1/api-keys", self.create_key, "v1.create_api_key", admin=True)
        add("GET", "/api/v1/api-keys/<name>", self.get_key, "v1.get_api_key", admin=True)
        add("PATCH", "/api/v1/api-keys/<name>", self.patch_key, "v1.update_api_key", admin=True)
        add("DELETE", "/api/v1/api-keys/<name>", self.delete_key, "v1.delete_api_key", admin=True)
        add("POST", "/api/v1/api-keys/<name>/rotate", self.rotate_key, "v1.rotate_api_key", admin=True)
        add("DELETE", "/api/v1/api-keys/<name>/previous", self.end_previous, "v1.end_previous_secret", admin=True)
        add("GET", "/api/v1/roles", self.list_roles, "v1.list_roles", admin=True)
        add("POST", "/api/v1/roles", self.create_role, "v1.create_role", admin=True)
        add("GET", "/api/v1/roles/<name>", self.get_role, "v1.get_role", admin=True)
        add("PATCH", "/api/v1/roles/<name>", self.patch_role, "v1.update_role", admin=True)
        add("DELETE", "/api/v1/roles/<name>", self.delete_role, "v1.delete_role", admin=True)
        add("GET", "/api/v1/me", self.me, "v1.me", admin=True)
        add("GET", "/api/v1/usage/quotas", self.quota_usage, "v1.quota_usage", admin=True)

    # --- views -----------------------------------------------------------------------------
    def key_view(self, row: dict, usage: UsageFigures | None = None) -> dict:
        """A key as the API shows it; `usage`: one read of the instance's counters for a list of keys."""
        if usage is None:
            usage = self.gateway.run.usage.read()
        grants = row["grants"]
        s = self.gateway.settings
        out = {"name": row["name"]}
        out.update({field: grants.get(field) for field in GRANT_FIELDS})
        out.update({
            "active": row["active"], "expires_at": row["expires_at"],
            "expired": expired(row["expires_at"], _dt.date.today()) if row["expires_at"] else False,
            "created_at": row["created_at"], "created_from_role": row["created_from_role"],
            "last_used_at": row["last_used_at"],
            "previous_expires_at": row["previous_expires_at"] if _previous_valid(row) else None,
            "previous_last_used_at": row["previous_last_used_at"], "example": row["example"],
            "usage": usage.key(row["name"]),
            "effective_limits": effective_limits(Grants.from_stored(grants), server_timeout=s.query_timeout,
                                                 max_page_size=s.max_page_size, stream_max_rows=s.stream_max_rows,
                                                 mcp_max_rows=s.mcp_max_rows),
            "usage_this_period": self._period_usage(row["name"], grants.get("quota")),
        })
        return out

    def _period_usage(self, name: str, quota) -> dict | None:
        """The key's counts in its quota's current period (contract 5.4), as the data plane sees them."""
        if not isinstance(quota, dict):
            return None
        ticket = self.gateway.quotas.begin(name, quota, reserve=False)
        return ticket.usage() if ticket is not None else None

    @staticmethod
    def role_view(row: dict) -> dict:
        out = {"name": row["name"]}
        out.update({field: row["grants"].get(field) for field in GRANT_FIELDS})
        out.update({"created_at": row["created_at"], "example": row["example"], "keys_created": row["keys_created"],
                    "require_claim_binding": row["require_claim_binding"]})
        return out

    def _key(self, name: str) -> dict:
        row = self.store.get_key(name)
        if row is None:
            raise QagError("key_not_found", f"API key '{name}' not found")
        return row

    def _role(self, name: str) -> dict:
        row = self.store.get_role(name)
        if row is None:
            raise QagError("role_not_found", f"Role '{name}' not found")
        return row

    # --- keys ------------------------------------------------------------------------------
    def list_keys(self, request, caller):
        usage = self.gateway.run.usage.read()
        return json_response({"items": [self.key_view(r, usage) for r in self.store.list_keys()]})

    def get_key(self, request, caller, name):
        row = self._key(name)
        return with_etag(self.key_view(row), _etag_state(row))

    def create_key(self, request, caller):
        body = body_object(request)
        with self.store.transaction():
            roles = {r["name"] for r in self.store.list_roles()}
            fields = normalise_key_create(body, existing_collections=self.store.collections(), roles=roles)
            name = fields["name"]
            if self.store.get_key(name) is not None:
                raise QagError("key_exists", f"An API key named '{name}' already exists")
            grants = fields["grants"]
            if fields["role"] is not None:
                role = self._role(fields["role"])
                grants = dict(role["grants"])
                self.store.put_role(dict(role, keys_created=role["keys_created"] + 1), create=False)
            secret = new_secret()
            row = {"name": name, "secret_hash": secret_hash(secret), "previous_hash": None,
                   "previous_expires_at": None, "grants": grants, "active": True, "expires_at": fields["expires_at"],
                   "created_at": now_text(), "created_from_role": fields["role"], "last_used_at": None,
                   "previous_last_used_at": None, "example": False}
            self.store.put_key(row, create=True)
            audit(self.store, caller, "create_key", name, {"role": fields["role"], "grants": grants,
                                                          "expires_at": fields["expires_at"]})
        view = dict(self.key_view(row), secret=secret)
        return with_etag(view, _etag_state(row), 201, _NO_STORE)

    def patch_key(self, request, caller, name):
        # 404 and 412 before the body, as QueryAPIGate; again in the transaction, which the body is read outside of.
        check_if_match(request, _etag_state(self._key(name)), "API key")
        body = body_object(request)
        with self.store.transaction():
            row = self._key(name)
            check_if_match(request, _etag_state(row), "API key")
            changes = normalise_key_patch(body, current=row["grants"], existing_collections=self.store.collections())
            new = dict(row, grants={**row["grants"], **changes["grants"]})
            for field in ("active", "expires_at"):
                if field in changes:
                    new[field] = changes[field]
            self.store.put_key(new, create=False)
            audit(self.store, caller, "update_key", name, {k: v for k, v in changes.items() if v != {}})
        return with_etag(self.key_view(new), _etag_state(new))

    def delete_key(self, request, caller, name):
        with self.store.transaction():
            row = self._key(name)
            check_if_match(request, _etag_state(row), "API key")
            self.store.delete_key(name)
            audit(self.store, caller, "delete_key", name, {})
        return no_content()

    def rotate_key(self, request, caller, name):
        body = body_object(request, required=False)
        refuse_unknown(body, ("grace_minutes",))
        self._key(name)   # QueryAPIGate's order: a JSON object of known fields, then 404, then the grace's value
        grace = body.get("grace_minutes")
        if grace is None:   # null is the default too, as in QueryAPIGate
            grace = _DEFAULT_GRACE_MINUTES
        if not shapes.fits(shapes.GRACE_MINUTES, grace):
            raise QagError("invalid_body", f"grace_minutes must be a whole number from 0 to {_MAX_GRACE_MINUTES}")
        grace = shapes.whole(grace)
        with self.store.transaction():
            row = self._key(name)
            # A pending rotation answers before a stale If-Match, as in QueryAPIGate: the rotation is what changed the
            # key, and the 409 says what to do about it.
            if _previous_valid(row):
                raise QagError("key_rotation_pending", f"API key '{name}' was rotated and its old secret still works "
                                                       f"until {row['previous_expires_at']} - end it first",
                               previous_expires_at=row["previous_expires_at"])
            check_if_match(request, _etag_state(row), "API key")
            secret = new_secret()
            until = None
            if grace:
                until = (_dt.datetime.now() + _dt.timedelta(minutes=grace)).strftime("%Y-%m-%d %H:%M:%S")
            new = dict(row, secret_hash=secret_hash(secret), previous_hash=row["secret_hash"] if grace else None,
                       previous_expires_at=until, previous_last_used_at=None)
            self.store.put_key(new, create=False)
            audit(self.store, caller, "rotate_api_key", name, {"grace_minutes": grace})
        view = dict(self.key_view(new), secret=secret)
        return with_etag(view, _etag_state(new), 200, _NO_STORE)

    def end_previous(self, request, caller, name):
        with self.store.transaction():
            row = self._key(name)
            if not _previous_valid(row):
                raise QagError("previous_secret_not_found", f"API key '{name}' has no old secret still working")
            new = dict(row, previous_hash=None, previous_expires_at=None)
            self.store.put_key(new, create=False)
            audit(self.store, caller, "end_previous_secret", name, {})
        return with_etag(self.key_view(new), _etag_state(new))

    # --- roles -----------------------------------------------------------------------------
    def list_roles(self, request, caller):
        return json_response({"items": [self.role_view(r) for r in self.store.list_roles()]})

    def get_role(self, request, caller, name):
        row = self._role(name)
        return with_etag(self.role_view(row), row)

    def create_role(self, request, caller):
        body = body_object(request)
        with self.store.transaction():
            fields = normalise_role_create(body, existing_collections=self.store.collections())
            if self.store.get_role(fields["name"]) is not None:
                raise QagError("role_exists", f"A role named '{fields['name']}' already exists")
            row = {"name": fields["name"], "grants": fields["grants"],
                   "require_claim_binding": fields["require_claim_binding"], "keys_created": 0, "example": False,
                   "created_at": now_text()}
            self.store.put_role(row, create=True)
            audit(self.store, caller, "create_role", row["name"], {"grants": row["grants"]})
        return with_etag(self.role_view(row), row, 201)

    def patch_role(self, request, caller, name):
        # 404 and 412 before the body, as QueryAPIGate; again in the transaction, which the body is read outside of.
        check_if_match(request, self._role(name), "role")
        body = body_object(request)
        with self.store.transaction():
            row = self._role(name)
            check_if_match(request, row, "role")
            current = dict(row["grants"], require_claim_binding=row["require_claim_binding"])
            changes = normalise_role_patch(body, current=current, existing_collections=self.store.collections())
            new = dict(row, grants={**row["grants"], **changes["grants"]})
            if "require_claim_binding" in changes:
                new["require_claim_binding"] = changes["require_claim_binding"]
            self.store.put_role(new, create=False)
            audit(self.store, caller, "update_role", name, changes)
        return with_etag(self.role_view(new), new)

    def delete_role(self, request, caller, name):
        with self.store.transaction():
            row = self._role(name)
            check_if_match(request, row, "role")
            self.store.delete_role(name)
            audit(self.store, caller, "delete_role", name, {})
        return no_content()

    # --- identity --------------------------------------------------------------------------
    def me(self, request, caller):
        return json_response({"name": caller.name, "role": "owner", "via": caller.via,
                              "capabilities": _OWNER_CAPABILITIES, "data_access": True, "workspace": "default",
                              "server_wide": True, "workspaces": {}})

    def quota_usage(self, request, caller):
        """Every caller's quota counts for the current day and month (stored + this worker's unwritten counts, or
        the Redis counters when configured)."""
        return json_response({"items": self.gateway.quotas.usage()})
