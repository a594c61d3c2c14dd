"""Who is calling: the admin key, a scoped key by SHA-256 lookup, or open mode; decided on every call."""

from __future__ import annotations

import datetime as _dt
import hashlib
import hmac
import ipaddress
import logging
import time

from .policy.grants import Grants, expired, grants_from_json, ip_allowed
from .store.base import Store

log = logging.getLogger("qag")

_TOUCH_INTERVAL = 60.0  # seconds between last_used_at writes per key and secret
# RFC 9110 11.6.1: a 401 names how to authenticate. No registered scheme carries a key in a header of its own, so
# this follows what API gateways send for one (Azure API Management: a scheme with the header's name and
# type="header"; Kong: `Key realm=...`), with the parameter names of the OpenAPI document's apiKey scheme.
API_KEY_CHALLENGE = 'ApiKey realm="qag", name="X-API-Key", in="header"'


class Caller:
    """An authenticated caller. name: 'admin', the key's name, or None in open mode."""

    __slots__ = ("name", "admin", "via", "grants", "key")

    def __init__(self, name: str | None, admin: bool, via: str, grants: Grants | None = None, key: dict | None = None):
        self.name = name
        self.admin = admin
        self.via = via
        self.grants = grants
        self.key = key

    @property
    def label(self) -> str:
        """The caller as logs, run history and metrics name it: key name, 'admin', or '-' when open."""
        return self.name if self.name is not None else "-"


OPEN = Caller(None, True, "open")


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


def is_loopback(peer: str | None) -> bool:
    """Loopback judged on the real socket address; an unparseable or empty peer counts as remote."""
    if not peer:
        return False
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def now_text() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class Authenticator:
    """Turns the X-API-Key header into a Caller (or None); every failure looks the same to the caller."""

    def __init__(self, store: Store, admin_key: str | None):
        self.store = store
        self._admin = admin_key.encode("utf-8") if admin_key is not None else None
        self._admin_caller = Caller("admin", True, "break-glass")
        self._touched: dict[tuple[str, bool], float] = {}
        # The headers of a 401: one WWW-Authenticate per scheme this server accepts (a Bearer one joins with OIDC).
        self.challenges: tuple[tuple[str, str], ...] = (("WWW-Authenticate", API_KEY_CHALLENGE),)

    def auth_required(self) -> bool:
        """Open mode only while no admin key is configured and no scoped key is stored."""
        return self._admin is not None or self.store.count_keys() > 0

    def authenticate(self, header: str | None, peer: str | None) -> Caller | None:
        if header is None:
            return None if self.auth_required() else OPEN
        # WSGI gives header bytes as latin-1 text; a non-ASCII value never matches any key.
        if not header.isascii():
            return None
        presented = header.encode("ascii")
        if self._admin is not None and hmac.compare_digest(presented, self._admin):
            return self._admin_caller
        found = self.store.key_by_hash(hashlib.sha256(presented).hexdigest())
        if found is None:
            return None
        row, previous = found
        grants = grants_from_json(row["grants_json"])  # compiled once per distinct stored grants
        if not self._valid(row, previous, grants, peer):
            return None
        self._touch(row["name"], previous)
        return Caller(row["name"], False, "key", grants, row)

    @staticmethod
    def _valid(row: dict, previous: bool, grants: Grants, peer: str | None) -> bool:
        """Rows, never decisions, are stored: active, expiry, grace and IP are judged on every call."""
        if not row["active"]:
            return False
        expires_at = row["expires_at"]
        if expires_at is not None and expired(expires_at, _dt.date.today()):   # most keys never expire
            return False
        if previous:
            until = row["previous_expires_at"]
            if not until or now_text() >= until:
                return False
        return ip_allowed(grants.ips, peer)

    def _touch(self, name: str, previous: bool) -> None:
        """Record last_used_at at most once a minute per key and secret, so use doesn't mean a write per call."""
        now = time.monotonic()
        slot = (name, previous)
        # No lock: dict reads and writes are atomic, and two threads racing here cost one extra write at most.
        if now - self._touched.get(slot, -_TOUCH_INTERVAL) < _TOUCH_INTERVAL:
            return
        self._touched[slot] = now
        try:
            self.store.touch_key(name, previous, now_text())
        except Exception as exc:  # best effort: a busy store must not fail the call it only records
            log.warning("could not record last_used_at of key %s: %s", name, exc)
