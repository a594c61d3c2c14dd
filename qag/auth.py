"""Who is calling: the admin key, a scoped key by SHA-256 lookup, or open mode; decided on every call."""

from __future__ import annotations

import datetime as _dt
from hashlib import sha256
from hmac import compare_digest
import ipaddress
import json
import logging
from time import monotonic, strftime

from .bearer import TokenTarget, TokenVerifier, bearer_token, challenge, claim, refusal, token_scopes
from .errors import QagError
from .http.request import forwarded_address
from .policy.grants import Grants, expired, grants_from_json, ip_allowed
from .policy.keyfields import reserved_key_name
from .store.base import Store

log = logging.getLogger("qag")

_TOUCH_INTERVAL = 60.0  # seconds between last_used_at writes per key and secret
# RFC 9110 11.6.1: a 401 names how to authenticate. No registered scheme carries a key in a header of its own, so
# this follows what API gateways send for one (Azure API Management: a scheme with the header's name and
# type="header"; Kong: `Key realm=...`), with the parameter names of the OpenAPI document's apiKey scheme.
API_KEY_CHALLENGE = 'ApiKey realm="qag", name="X-API-Key", in="header"'


class Caller:
    """An authenticated caller. name: 'admin', the key's name, `jwt:<subject>` for a signed-in user, or None in
    open mode; claims, role and claim_binding only for a signed-in user."""

    __slots__ = ("name", "admin", "via", "grants", "key", "claims", "role", "claim_binding")

    def __init__(self, name: str | None, admin: bool, via: str, grants: Grants | None = None, key: dict | None = None,
                 claims: dict | None = None, role: str | None = None, claim_binding: bool = False):
        self.name = name
        self.admin = admin
        self.via = via
        self.grants = grants
        self.key = key
        self.claims = claims
        self.role = role
        self.claim_binding = claim_binding

    @property
    def label(self) -> str:
        """The caller as logs, run history and metrics name it: key name, 'admin', or '-' when open."""
        return self.name if self.name is not None else "-"


OPEN = Caller(None, True, "open")


def secret_hash(secret: str) -> str:
    return sha256(secret.encode("utf-8")).hexdigest()


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


# The headers proxies and CDNs name their client in, as lists of addresses (the WSGI environ's names; `qag events`
# reads them as header names: relay_header_names), and RFC 7239's Forwarded, whose `for=` parameters name them.
RELAY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_X_REAL_IP", "HTTP_X_CLIENT_IP", "HTTP_TRUE_CLIENT_IP",
                 "HTTP_CF_CONNECTING_IP", "HTTP_X_ORIGINAL_FORWARDED_FOR", "HTTP_X_CLUSTER_CLIENT_IP",
                 "HTTP_FASTLY_CLIENT_IP", "HTTP_FORWARDED_FOR", "HTTP_X_ENVOY_EXTERNAL_ADDRESS", "HTTP_FLY_CLIENT_IP",
                 "HTTP_X_AZURE_CLIENTIP")
FORWARDED_HEADER = "HTTP_FORWARDED"


def relay_header_names() -> tuple[str, ...]:
    """RELAY_HEADERS as lower-case header names (x-forwarded-for, ...)."""
    return tuple(name[5:].lower().replace("_", "-") for name in RELAY_HEADERS)


def relayed_clients(forwarded: str | None, address_lists) -> list[str]:
    """Every client a request's forwarding headers name: each `for=` of RFC 7239's Forwarded, and the entries of
    the address-list headers (RELAY_HEADERS' values), as written but for quotes."""
    clients = [p.strip() for value in address_lists for p in (value or "").split(",")]
    for element in (forwarded or "").split(","):
        for pair in element.split(";"):
            name, _, value = pair.partition("=")
            if name.strip().lower() == "for":
                clients.append(value.strip().strip('"'))
    return [c for c in clients if c]


def guard_open_mode(peer: str | None, host: str | None, origin: str | None, cors, relayed=(),
                    fetch_site: str | None = None) -> None:
    """Open mode serves this machine only (contract 1.4): a loopback peer (the socket's, never X-Forwarded-For), a
    loopback Host (no DNS rebinding), and no cross-origin browser request (a page the local user visits must not
    drive the server) but from an origin QAG_CORS_ORIGINS names (`*` lets every page read answers, never drive a
    server without keys); raises 403 open_access_remote. `cors`: the HeaderPolicy. The gateway's rule and
    `qag events`'.

    `relayed`: the clients the request's forwarding headers name (relayed_clients). A loopback peer that names
    another client is a proxy on this machine relaying for callers elsewhere (its requests come from 127.0.0.1,
    often with a Host of 127.0.0.1): refused too, whether QAG_TRUST_PROXY is set or not (a proxy that names no
    client can't be told from a local caller: docs/compatibility.md). The
    headers can only ever take access away: a remote peer naming 127.0.0.1 is still remote. A public route
    answers a caller refused here as it answers anyone (app.Gateway._open_to).

    `fetch_site`: the browser's Sec-Fetch-Site. A page's image, script or form GET (no-cors) carries no Origin,
    so a request another site's page made (`cross-site`, `same-site`: another port of localhost too) is refused
    unless its Origin is one QAG_CORS_ORIGINS names."""
    if not is_loopback(peer):
        raise QagError("open_access_remote", "This server has no API key configured, so it only answers "
                       "callers on this machine - set QAG_API_KEY to serve others")
    if not all(is_loopback(forwarded_address(client)) for client in relayed):
        raise QagError("open_access_remote", "This server has no API key configured, so it only answers "
                       "callers on this machine, and this request was relayed for another - set QAG_API_KEY to "
                       "serve others")
    host = (host or "").lower()
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.rsplit(":", 1)[0]
    if host and name != "localhost" and not is_loopback(name):
        raise QagError("open_access_remote", "This server has no API key configured and answers requests "
                       "addressed to localhost only")
    if origin is not None and not cors.listed(origin):
        raise QagError("open_access_remote", "This server has no API key configured and refuses "
                       "cross-origin browser requests")
    if origin is None and (fetch_site or "").strip().lower() in ("cross-site", "same-site"):
        raise QagError("open_access_remote", "This server has no API key configured and refuses "
                       "requests another site's page makes")


def now_text() -> str:
    return strftime("%Y-%m-%d %H:%M:%S")


class Authenticator:
    """Turns the X-API-Key header into a Caller (or None), every failure looking the same to the caller; or, when
    configured and no key is sent, a bearer token into a signed-in user's Caller (a bad token says why)."""

    def __init__(self, store: Store, admin_key: str | None, settings=None):
        self.store = store
        self._admin = admin_key.encode("utf-8") if admin_key is not None else None
        self._admin_caller = Caller("admin", True, "break-glass")
        self._touched: dict[tuple[str, bool], float] = {}
        # Signed-in users (QAG_JWT_*): None unless configured.
        self.tokens = None
        if settings is not None and getattr(settings, "jwt_mode", None):
            self.tokens = TokenVerifier(settings)
            self._role_claim = settings.jwt_role_claim
            self._fixed_role = settings.jwt_role
            self._user_claim = settings.jwt_user_claim
        self._role_grants: dict[str, Grants] = {}
        self._reserved_said: set[str] = set()
        self._reserved: dict[str, bool] = {}   # stored key name -> named like a caller that is no key
        # The headers of a 401: one WWW-Authenticate per scheme this server accepts.
        self.challenges: tuple[tuple[str, str], ...] = (("WWW-Authenticate", API_KEY_CHALLENGE),)
        if self.tokens is not None:
            self.challenges += (("WWW-Authenticate", challenge()),)

    def auth_required(self) -> bool:
        """Open mode only while no admin key is configured, no bearer tokens are and no scoped key is stored."""
        return self._admin is not None or self.tokens is not None or self.store.count_keys() > 0

    def authenticate(self, header: str | None, peer: str | None, authorization: str | None = None,
                     target: TokenTarget | None = None) -> Caller | None:
        """The caller, or None; `target`: what a bearer token must have been issued for at this endpoint (/mcp's
        audiences and scopes), instead of QAG_JWT_AUDIENCE."""
        if header is None:
            # X-API-Key, when present, decides alone: a wrong key never falls back to a token (contract 1.1).
            if authorization is not None and self.tokens is not None:
                token = bearer_token(authorization)
                if token is not None:
                    return self._signed_in(token, peer, target)
            return None if self.auth_required() else OPEN
        # WSGI gives header bytes as latin-1 text; a non-ASCII value never matches any key.
        if not header.isascii():
            return None
        presented = header.encode("ascii")
        if self._admin is not None and compare_digest(presented, self._admin):
            return self._admin_caller
        found = self.store.key_by_hash(sha256(presented).hexdigest())
        if found is None:
            return None
        row, previous = found
        grants = grants_from_json(row["grants_json"])  # compiled once per distinct stored grants
        if not self._valid(row, previous, grants, peer):
            return None
        name = row["name"]
        reserved = self._reserved.get(name)
        if reserved is None:   # judged once per stored name (an NFKC normalisation), not on every call
            reserved = self._reserved[name] = reserved_key_name(name)
        if reserved:
            self._refuse_reserved(name)
            return None
        self._touch(row["name"], previous)
        return Caller(row["name"], False, "key", grants, row)

    def _signed_in(self, token: str, peer: str | None, target: TokenTarget | None = None) -> Caller | None:
        """The Caller of a bearer token: verified claims (cached by the token's hash), then the role they name
        (a cached row). Raises QagError 401 token_* with both challenges for a bad token, 403 token_scope for one
        without the target's scopes, 403 token_role for a good token naming no role."""
        try:
            claims = self.tokens.verify(token, None if target is None else target.audiences)
        except QagError as error:
            error.headers = [("WWW-Authenticate", API_KEY_CHALLENGE)] + error.headers
            raise
        if target is not None and target.scopes and not token_scopes(claims).issuperset(target.scopes):
            # RFC 6750 3.1: the scopes the request needs, so a client can ask for them (MCP's step-up authorization).
            raise QagError("token_scope", headers=[("WWW-Authenticate", challenge(
                "insufficient_scope", "The bearer token lacks a scope this endpoint requires",
                " ".join(target.scopes)))])
        user = claim(claims, self._user_claim)
        # The subject names the caller in logs, history, metrics and limit keys: printable and bounded, so a
        # token can't forge a log line or grow a key without end.
        if (isinstance(user, bool) or not isinstance(user, (str, int)) or str(user) == "" or len(str(user)) > 255
                or not str(user).isprintable()):
            refused = refusal("token_claims", "The bearer token lacks a required claim")
            refused.headers = [("WWW-Authenticate", API_KEY_CHALLENGE)] + refused.headers
            raise refused
        names: list[str] = []
        if self._role_claim:
            value = claim(claims, self._role_claim)
            if isinstance(value, str):
                names.append(value)
            elif isinstance(value, list):
                names += [v for v in value if isinstance(v, str)]
        if self._fixed_role:
            names.append(self._fixed_role)
        for name in names:
            row = self.store.get_role(name)
            if row is not None:
                break
        else:
            raise QagError("token_role", headers=[("WWW-Authenticate", challenge("insufficient_scope"))])
        grants = self._grants_of(row)
        if not ip_allowed(grants.ips, peer):
            return None
        return Caller(f"jwt:{user}", False, "jwt", grants, None, claims, row["name"],
                      bool(row.get("require_claim_binding")))

    def _grants_of(self, row: dict) -> Grants:
        """A role's Grants, compiled once per distinct stored grants (a role edit gives new text, so a new entry)."""
        text = json.dumps(row["grants"], sort_keys=True)
        grants = self._role_grants.get(text)
        if grants is None:
            if len(self._role_grants) > 256:
                self._role_grants.clear()
            grants = self._role_grants[text] = Grants.from_stored(row["grants"])
        return grants

    def _refuse_reserved(self, name: str) -> None:
        """A stored key named like a caller that is no key (made before such names were refused, or copied from
        another store) would share that caller's runs and events: it authenticates nothing, said once."""
        if name not in self._reserved_said:
            self._reserved_said.add(name)
            log.warning("API key %r is refused: its name is the one logs and run history give the administrator, "
                        "the command line or open mode; create a key under another name and remove this one", name)

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
        now = monotonic()
        slot = (name, previous)
        # No lock: dict reads and writes are atomic, and two threads racing here cost one extra write at most.
        if now - self._touched.get(slot, -_TOUCH_INTERVAL) < _TOUCH_INTERVAL:
            return
        self._touched[slot] = now
        try:
            self.store.touch_key(name, previous, now_text())
        except Exception as exc:  # best effort: a busy store must not fail the call it only records
            log.warning("could not record last_used_at of key %s: %s", name, exc)
