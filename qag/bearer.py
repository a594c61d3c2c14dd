"""Signed-in users: `Authorization: Bearer <JWT>` verified (shared secret or an OIDC issuer's keys) into claims."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import threading
import time
import urllib.request
from collections import OrderedDict
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from .errors import QagError

log = logging.getLogger("qag")

_MAX_TOKEN_LENGTH = 16_384      # larger than any real ID or access token; refused before any parsing
_KEYS_LIFESPAN = 3600.0         # seconds a fetched JWKS is trusted before it is fetched again anyway
_FETCH_TIMEOUT = 5.0
_MAX_DOCUMENT_BYTES = 1 << 20
REALM = "qag"

# PyJWT's refusals → (code, what the caller is told). Never the token's contents: only which check failed.
_REASONS = {
    "ExpiredSignatureError": ("token_expired", "The bearer token has expired"),
    "ImmatureSignatureError": ("token_not_yet_valid", "The bearer token is not valid yet"),
    "InvalidIssuerError": ("token_issuer", "The bearer token was not issued by the configured issuer"),
    "InvalidAudienceError": ("token_audience", "The bearer token was not issued for this API"),
    "MissingRequiredClaimError": ("token_claims", "The bearer token lacks a required claim"),
    "InvalidSignatureError": ("token_signature", "The bearer token's signature does not verify"),
    "InvalidAlgorithmError": ("token_algorithm", "The bearer token's algorithm is not accepted"),
    "DecodeError": ("token_malformed", "The bearer token is not a well-formed JWT"),
}


def challenge(error: str | None = None, description: str | None = None, scope: str | None = None) -> str:
    """A WWW-Authenticate value for the Bearer scheme (RFC 6750 3)."""
    value = f'Bearer realm="{REALM}"'
    if error:
        value += f', error="{error}"'
    if description:
        value += f', error_description="{description}"'
    if scope:
        value += f', scope="{scope}"'
    return value


class TokenTarget(NamedTuple):
    """What a token must have been issued for to be used at one endpoint (/mcp, as an OAuth resource server):
    `aud` names one of `audiences` (compared as audience_key() gives them), and the token holds every scope."""

    audiences: frozenset
    scopes: tuple = ()


def audience_key(value: str) -> str:
    """An `aud` value as compared: an http(s) URL with scheme and host lower-cased, a default port dropped and an
    empty path as "/" (RFC 3986 6.2.2-6.2.3: the same URL however a client spells it, as the MCP SDK lower-cases
    its RFC 8707 resource indicator); any other text as it is."""
    if not value[:8].lower().startswith(("http://", "https://")):
        return value
    try:
        parts = urlsplit(value)
    except ValueError:   # a malformed URL compares as its text
        return value
    scheme = parts.scheme.lower()
    netloc = parts.netloc.lower()
    default = ":443" if scheme == "https" else ":80"
    if netloc.endswith(default):
        netloc = netloc[:-len(default)]
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, parts.fragment))


def token_scopes(claims: dict) -> set[str]:
    """The scopes a token grants: `scope` (space-separated, RFC 8693/9068) and `scp` (a list or a string, as some
    issuers write it)."""
    found: set[str] = set()
    for name in ("scope", "scp"):
        value = claims.get(name)
        if isinstance(value, str):
            found.update(value.split())
        elif isinstance(value, list):
            found.update(v for v in value if isinstance(v, str))
    return found


def refusal(code: str, message: str, status_error: str = "invalid_token") -> QagError:
    """A 401 for a bad token, naming what failed in the Bearer challenge as well as in the code."""
    return QagError(code, message, headers=[("WWW-Authenticate", challenge(status_error, message))])


def bearer_token(authorization: str) -> str | None:
    """The token of an `Authorization: Bearer ...` value (scheme case-insensitive), or None for another scheme."""
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip()


def claim(claims: dict, name: str) -> Any:
    """A claim by name, or, for a dotted name, by path (`app_metadata.role`): namespaced claims
    (`https://example.com/role`) contain dots too, so either reading may be meant. A token holding both, with
    different values, has no such claim (None): an issuer that lets a user set a top-level claim must not let
    `"app_metadata.role": "admin"` stand in for the nested one it sets itself."""
    exact = claims[name] if name in claims else None
    if "." not in name:
        return exact
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return exact
        value = value[part]
    if name in claims and (type(exact) is not type(value) or exact != value):
        return None
    return value


def key_source_url(url: str) -> bool:
    """Whether signing keys or a discovery document may be read from `url`: https, or plain http to a loopback
    host only (tests, a sidecar), judged on the parsed host (`http://127.0.0.1.example.com` is not loopback), with
    no user information. Keys read over plain HTTP from elsewhere could be swapped on the way."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port   # raises for a port that is no number or out of range
    except ValueError:
        return False
    scheme = parts.scheme.lower()
    if not host or "@" in parts.netloc or scheme not in ("https", "http"):
        return False
    if scheme == "https":
        return True
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to where keys may be read from at all: never down to plain HTTP elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if not key_source_url(newurl):
            raise ValueError("redirected to a URL keys are not read from")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_opener = urllib.request.build_opener(_CheckedRedirects)


def _fetch_json(url: str) -> dict:
    if not key_source_url(url):
        raise ValueError("not a URL keys are read from")
    request = urllib.request.Request(url, headers={"Accept": "application/json", "User-Agent": "qag"})
    with _opener.open(request, timeout=_FETCH_TIMEOUT) as response:  # noqa: S310 - checked above
        body = response.read(_MAX_DOCUMENT_BYTES + 1)
    if len(body) > _MAX_DOCUMENT_BYTES:
        raise ValueError("document too large")
    document = json.loads(body)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    return document


class KeySet:
    """An issuer's signing keys by `kid`: fetched on first use, again after an hour, and again for an unknown
    `kid` (a rotation) but at most once per `refresh_interval`, so tokens with made-up key ids cost nothing."""

    def __init__(self, jwks_url: str | None, issuer: str | None, refresh_interval: float, fetch=_fetch_json):
        self.jwks_url = jwks_url
        self.issuer = issuer
        self.refresh_interval = refresh_interval
        self._fetch = fetch
        self._keys: dict[str, Any] = {}
        self._published: dict[str, tuple[dict, Any]] = {}   # kid -> (its JWK as published, its entry in _keys)
        self._fetched_at = -float("inf")
        self._tried_at = -float("inf")
        self._lock = threading.Lock()
        self.fetches = 0

    def _jwks_location(self) -> str:
        if self.jwks_url is not None:
            return self.jwks_url
        # OIDC discovery (OpenID Connect Discovery 1.0 4): the document lives under the issuer's own URL.
        document = self._fetch(self.issuer.rstrip("/") + "/.well-known/openid-configuration")
        uri = document.get("jwks_uri")
        if not isinstance(uri, str) or not key_source_url(uri):
            raise ValueError("the discovery document has no usable jwks_uri")
        if document.get("issuer") != self.issuer:
            # Discovery 4.3: the document must name the issuer it was fetched for.
            raise ValueError("the discovery document names another issuer")
        return uri

    def _refresh(self) -> None:
        from jwt import PyJWK
        document = self._fetch(self._jwks_location())
        keys, published = {}, {}
        for entry in document.get("keys") or ():
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or not isinstance(entry.get("kid"), str):
                continue
            kid = entry["kid"]
            before = self._published.get(kid)
            if before is not None and before[0] == entry:
                key = before[1]         # the key as it was: the same entry (TokenVerifier's cache compares it)
            else:
                try:
                    # The JWK's own `alg`, when it names one, is the only algorithm that key may verify.
                    key = (PyJWK(entry), entry.get("alg"))
                except Exception:  # noqa: BLE001 - a key type this PyJWT can't use is skipped, not fatal
                    continue
            keys[kid], published[kid] = key, (entry, key)
        self._keys, self._published = keys, published
        self._fetched_at = time.monotonic()
        self.fetches += 1

    def held(self, kid: str):
        """The entry for `kid` among the keys held now (None: not held), without fetching."""
        return self._keys.get(kid)

    def get(self, kid: str):
        """(PyJWK, its alg or None) for `kid`; raises QagError token_unknown_key, or jwks_unavailable when the issuer can't be read
        and no key is known."""
        now = time.monotonic()
        key = self._keys.get(kid)
        if key is not None and now - self._fetched_at < _KEYS_LIFESPAN:
            return key
        with self._lock:
            key = self._keys.get(kid)
            stale = now - self._fetched_at >= _KEYS_LIFESPAN
            if (key is None or stale) and now - self._tried_at >= self.refresh_interval:
                self._tried_at = now
                try:
                    self._refresh()
                except Exception as exc:  # noqa: BLE001 - network, JSON, discovery: one line, keep the old keys
                    log.warning("could not read the bearer-token signing keys: %s", type(exc).__name__)
                    if not self._keys:
                        raise QagError("jwks_unavailable", retry_after=5) from None
                key = self._keys.get(kid)
        if key is None:
            raise refusal("token_unknown_key", "The bearer token was signed with a key this API does not know")
        return key


class TokenVerifier:
    """Checks bearer tokens against the settings; a token verified before is taken from a bounded cache by its
    SHA-256 until its `exp` (no signature check) while the keys last fetched still hold the one that verified it
    (a dict read, never a fetch), so a key withdrawn from the JWKS (a leaked one) stops the tokens it signed at the
    next fetch, cached or not."""

    def __init__(self, settings, fetch=_fetch_json):
        self.secret = settings.jwt_secret
        self.algorithms = list(settings.jwt_algorithms)
        self.issuer = settings.jwt_issuer
        # Checked by qag, not PyJWT, so an endpoint can name audiences of its own (TokenTarget); None = no check.
        self.audience = frozenset(audience_key(a) for a in settings.jwt_audience) or None
        self.leeway = settings.jwt_leeway
        self.keys = None
        if settings.jwt_mode == "keys":
            self.keys = KeySet(settings.jwt_jwks_url, settings.jwt_issuer, settings.jwt_jwks_refresh_interval, fetch)
        self.max_entries = settings.jwt_cache_entries
        # SHA-256 of the token -> (exp, claims, (kid, the KeySet's entry for it) or None with a shared secret)
        self._seen: OrderedDict[bytes, tuple[float, dict, tuple | None]] = OrderedDict()
        self._lock = threading.Lock()

    def verify(self, token: str, audiences: frozenset | None = None) -> dict:
        """The verified claims of `token`, its `aud` naming one of `audiences` (default QAG_JWT_AUDIENCE, when set);
        raises QagError (401 token_*) naming the failed check."""
        if not token or len(token) > _MAX_TOKEN_LENGTH or not token.isascii():
            raise refusal("token_malformed", "The bearer token is not a well-formed JWT")
        digest = hashlib.sha256(token.encode("ascii")).digest()
        now = time.time()
        found = self._seen.get(digest)
        claims = None
        if found is not None:
            exp, known, signer = found
            if now <= exp + self.leeway and (signer is None or self._still_published(signer)):
                claims = known
            else:
                with self._lock:
                    self._seen.pop(digest, None)
        if claims is None:
            claims, signer = self._decode(token)
            if self.max_entries:
                with self._lock:
                    self._seen[digest] = (claims["exp"], claims, signer)
                    while len(self._seen) > self.max_entries:
                        self._seen.popitem(last=False)   # oldest first: a bounded table, whatever callers send
        # The audience is checked on every call, cached or not: one token may be good at one endpoint only.
        accepted = self.audience if audiences is None else audiences
        if accepted is not None:
            _check_audience(claims, accepted)
        return claims

    def _still_published(self, signer: tuple) -> bool:
        """Whether the key that verified a cached token is still the issuer's key of its kid, as last fetched (a
        withdrawn or replaced key: the token is verified again, and refused). Never fetches: a cached call doesn't
        wait on the issuer; the keys are fetched again for an unknown kid or an hour-old set, by uncached tokens."""
        kid, entry = signer
        return self.keys.held(kid) is entry

    def _decode(self, token: str) -> tuple[dict, tuple | None]:
        """The verified claims, and (kid, the KeySet's entry) of the key that verified them (None: the secret)."""
        import jwt
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise refusal("token_malformed", "The bearer token is not a well-formed JWT") from None
        alg = header.get("alg")
        # Checked before any key is chosen: `none`, and an HS token where keys are public (or the reverse), never
        # reach a verifier.
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise refusal("token_algorithm", "The bearer token's algorithm is not accepted")
        if self.keys is not None:
            kid = header.get("kid")
            if not isinstance(kid, str):
                raise refusal("token_unknown_key", "The bearer token names no signing key (kid)")
            entry = self.keys.get(kid)
            signer = (kid, entry)
            jwk, key_alg = entry
            if key_alg is not None and key_alg != alg:
                raise refusal("token_algorithm", "The bearer token's algorithm is not the one of its key")
            key = jwk.key
        else:
            key, signer = self.secret, None
        try:
            # `sub` and `jti` are not PyJWT's to judge: the user claim may be a number (qag/auth.py checks it).
            claims = jwt.decode(token, key, algorithms=[alg], issuer=self.issuer, leeway=self.leeway,
                                options={"require": ["exp"], "verify_aud": False, "verify_sub": False,
                                         "verify_jti": False})
        except jwt.PyJWTError as exc:  # InvalidKeyError too: an ES token for an RSA key is a bad signature
            code, message = next((_REASONS[c.__name__] for c in type(exc).__mro__ if c.__name__ in _REASONS),
                                 ("token_signature", "The bearer token's signature does not verify"))
            raise refusal(code, message) from None
        exp = claims.get("exp")
        if not isinstance(exp, (int, float)) or isinstance(exp, bool):
            raise refusal("token_claims", "The bearer token lacks a required claim")
        try:
            claims["exp"] = float(exp)   # as the verified-token cache compares it
        except OverflowError:            # an integer past any float: no time at all, so no expiry to check
            raise refusal("token_claims", "The bearer token's exp is not a time") from None
        return claims, signer


def _check_audience(claims: dict, accepted: frozenset) -> None:
    """PyJWT's audience rule, with audience_key() comparison: `aud` present (else token_claims), a string or a list
    of strings naming one accepted audience (else token_audience)."""
    aud = claims.get("aud")
    if aud is None:
        raise refusal("token_claims", "The bearer token lacks a required claim")
    values = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else ()
    if not any(isinstance(v, str) and audience_key(v) in accepted for v in values):
        raise refusal("token_audience", "The bearer token was not issued for this API")
