"""Signed-in users (issue 23): bearer tokens from a local OIDC issuer made here, against real qag servers."""

from __future__ import annotations

import base64
import glob
import json
import os
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

from qag.observe import metrics
from tests.server import q, wait_for

pytestmark = pytest.mark.e2e

AUDIENCE = "qag-test-api"
DOCS = """
CREATE TABLE docs (id INTEGER PRIMARY KEY, owner TEXT NOT NULL, tenant INTEGER NOT NULL, title TEXT NOT NULL);
INSERT INTO docs VALUES (1, 'alice', 7, 'alice one'), (2, 'alice', 7, 'alice two'), (3, 'bob', 8, 'bob one');
"""


class Issuer:
    """A tiny OIDC issuer on a loopback port: discovery document and JWKS, keys swappable mid-test."""

    def __init__(self):
        self.keys: dict[str, tuple[str, object]] = {}   # kid → (alg, private key)
        self.published: list[str] = []                  # kids in the JWKS
        self.jwks_fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks.json"}
                elif self.path == "/jwks.json":
                    issuer.jwks_fetches += 1
                    body = {"keys": [issuer.jwk(kid) for kid in issuer.published]}
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def add(self, kid: str, alg: str = "RS256", publish: bool = True):
        if alg == "RS256":
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        elif alg == "ES256":
            key = ec.generate_private_key(ec.SECP256R1())
        else:
            key = ed25519.Ed25519PrivateKey.generate()
        self.keys[kid] = (alg, key)
        if publish:
            self.published.append(kid)
        return key

    def jwk(self, kid: str) -> dict:
        alg, key = self.keys[kid]
        tool = {"RS256": RSAAlgorithm, "ES256": ECAlgorithm, "EdDSA": OKPAlgorithm}[alg]
        out = tool.to_jwk(key.public_key(), as_dict=True)
        out.update(kid=kid, use="sig", alg=alg)
        return out

    def token(self, kid: str = "k1", *, alg: str | None = None, key=None, headers: dict | None = None,
              **claims) -> str:
        key_alg, private = self.keys[kid]
        body = {"iss": self.url, "aud": AUDIENCE, "sub": "alice", "role": "reader", "iat": int(time.time()),
                "exp": int(time.time()) + 300}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, key if key is not None else private, algorithm=alg or key_alg,
                          headers={"kid": kid, **(headers or {})})

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _b64(data: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@pytest.fixture(scope="module")
def issuer():
    i = Issuer()
    i.add("k1", "RS256")
    i.add("k-ec", "ES256")
    i.add("k-ed", "EdDSA")
    yield i
    i.close()


@pytest.fixture(scope="module")
def oidc(issuer, make_module_server):
    # One worker: the JWKS fetch counts below are then one process's.
    s = make_module_server(workers=1, env={"QAG_JWT_ISSUER": issuer.url, "QAG_JWT_AUDIENCE": AUDIENCE,
                                           "QAG_JWT_ROLE_CLAIM": "role", "QAG_JWT_JWKS_REFRESH_INTERVAL": "1"})
    s.sqlite_db("docs.db", DOCS)
    s.connection("docs", "docs.db")
    s.query("titles", "SELECT title FROM docs ORDER BY id", "docs")
    s.query("mine", "SELECT title FROM docs WHERE owner = :me ORDER BY id", "docs",
            parameters={"me": {"type": "str", "from_claim": "sub"}})
    s.query("tenant_docs", "SELECT title FROM docs WHERE tenant = :t ORDER BY id", "docs",
            parameters={"t": {"type": "int", "from_claim": "app.tenant"}})
    for body in ({"name": "reader", "connections": [], "queries": ["titles", "mine", "tenant_docs"]},
                 {"name": "limited", "connections": [], "queries": ["titles"], "rate_limit": "2/minute"},
                 {"name": "bound", "connections": [], "queries": ["titles", "mine"], "require_claim_binding": True},
                 {"name": "quota", "connections": [], "queries": ["titles"], "quota": {"calls": 1, "per": "day"}}):
        assert s.post("/api/v1/roles", body).status == 201
    return s


def call(s, token: str | None, path: str = q("titles"), **kw):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return s.get(path, key=None, headers=headers, **kw)


def challenges(reply) -> list[str]:
    return [v for k, v in reply.header_list if k.lower() == "www-authenticate"]


def test_rs_es_eddsa_tokens_from_the_issuers_keys(oidc, issuer):
    for kid in ("k1", "k-ec", "k-ed"):
        r = call(oidc, issuer.token(kid))
        assert r.status == 200, (kid, r)
        assert [row["title"] for row in r.json] == ["alice one", "alice two", "bob one"]


def test_no_credential_names_both_schemes(oidc):
    r = call(oidc, None)
    assert r.status == 401 and r.json["code"] == "unauthorized"
    assert challenges(r) == ['ApiKey realm="qag", name="X-API-Key", in="header"', 'Bearer realm="qag"']


@pytest.mark.parametrize("case, code", [
    ("malformed", "token_malformed"),
    ("garbage_segments", "token_malformed"),
    ("wrong_signature", "token_signature"),
    ("wrong_issuer", "token_issuer"),
    ("wrong_audience", "token_audience"),
    ("expired", "token_expired"),
    ("not_yet_valid", "token_not_yet_valid"),
    ("no_exp", "token_claims"),
    ("unknown_kid", "token_unknown_key"),
    ("no_kid", "token_unknown_key"),
    ("alg_none", "token_algorithm"),
    ("hs_with_public_key", "token_algorithm"),
    ("alg_not_the_keys", "token_algorithm"),
    ("no_subject", "token_claims"),
    ("subject_forging_a_log_line", "token_claims"),
    ("exp_past_any_float", "token_claims"),
])
def test_bad_tokens_are_401_with_a_code_and_a_bearer_challenge(oidc, issuer, case, code):
    now = int(time.time())
    public_pem = issuer.keys["k1"][1].public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = {
        "malformed": lambda: "not-a-jwt",
        "garbage_segments": lambda: "eyJ.eyJ.sig",
        "wrong_signature": lambda: issuer.token("k1", key=stranger),
        "wrong_issuer": lambda: issuer.token(iss="https://evil.example"),
        "wrong_audience": lambda: issuer.token(aud="another-app"),
        "expired": lambda: issuer.token(iat=now - 3600, exp=now - 600),
        "not_yet_valid": lambda: issuer.token(nbf=now + 600),
        "no_exp": lambda: issuer.token(exp=None),
        "unknown_kid": lambda: issuer.token(headers={"kid": "nobody"}),
        "no_kid": lambda: jwt.encode({"iss": issuer.url, "aud": AUDIENCE, "sub": "a", "exp": now + 60},
                                     issuer.keys["k1"][1], algorithm="RS256"),
        # alg none: header and claims only, empty signature.
        "alg_none": lambda: _b64({"alg": "none", "kid": "k1"}) + "." + _b64(
            {"iss": issuer.url, "aud": AUDIENCE, "sub": "alice", "role": "reader", "exp": now + 60}) + ".",
        # The confusion attack: the issuer's public key (known to anyone) used as an HMAC secret.
        "hs_with_public_key": lambda: _hs_with_secret(public_pem, {"iss": issuer.url, "aud": AUDIENCE,
                                                                   "sub": "alice", "role": "reader",
                                                                   "exp": now + 60}, "k1"),
        # An ES256 key's kid on an RS-signed token: the JWK's alg decides.
        "alg_not_the_keys": lambda: jwt.encode({"iss": issuer.url, "aud": AUDIENCE, "sub": "a", "exp": now + 60},
                                               issuer.keys["k1"][1], algorithm="RS256", headers={"kid": "k-ec"}),
        "no_subject": lambda: issuer.token(sub=None),
        "subject_forging_a_log_line": lambda: issuer.token(sub="alice\n127.0.0.1 - admin GET /api/v1/api-keys"),
        # validly signed, and once a 500: the verified-token cache turned it into a float
        "exp_past_any_float": lambda: issuer.token(exp=10 ** 400),
    }[case]()
    r = call(oidc, token)
    assert r.status == 401, (case, r)
    assert r.json["code"] == code, (case, r.json)
    found = challenges(r)
    assert found[0] == 'ApiKey realm="qag", name="X-API-Key", in="header"'
    assert found[1].startswith('Bearer realm="qag"')
    assert 'error="invalid_token"' in found[1]
    # Nothing of the token in the response or the server's log.
    signature = token.rsplit(".", 1)[-1] or token
    assert signature not in r.body.decode()
    assert not any(token in line or (len(signature) > 8 and signature in line) for line in oidc.log)


def test_a_numeric_subject_is_a_user(oidc, issuer):
    """The user claim may be a string or a number (docs/security.md); PyJWT's own `sub` check refused a number as
    a bad signature."""
    r = call(oidc, issuer.token(sub=12))
    assert r.status == 200, r
    r = call(oidc, issuer.token(sub={"id": 12}))
    assert r.status == 401 and r.json["code"] == "token_claims", r


def _hs_with_secret(secret: bytes, claims: dict, kid: str) -> str:
    import hashlib
    import hmac
    head = _b64({"alg": "HS256", "typ": "JWT", "kid": kid}) + "." + _b64(claims)
    mac = hmac.new(secret, head.encode(), hashlib.sha256).digest()
    return head + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def test_a_token_whose_role_does_not_exist_is_403(oidc, issuer):
    r = call(oidc, issuer.token(role="nosuchrole"))
    assert r.status == 403 and r.json["code"] == "token_role"
    assert 'error="insufficient_scope"' in challenges(r)[0]


def test_a_wrong_api_key_never_falls_back_to_the_token(oidc, issuer):
    r = oidc.get(q("titles"), key="sk_wrong", headers={"Authorization": f"Bearer {issuer.token()}"})
    assert r.status == 401 and r.json["code"] == "unauthorized"


def test_role_grants_apply(oidc, issuer):
    r = oidc.post("/execute_sql", {"sql": "SELECT 1", "connection_name": "docs"}, key=None,
                  headers={"Authorization": f"Bearer {issuer.token()}"})
    assert r.status == 403 and r.json["code"] == "connection_forbidden"
    assert call(oidc, issuer.token(), "/api/v1/connections").json["code"] == "admin_only"


def test_rate_limits_count_per_subject(oidc, issuer, uniq):
    alice, bob = uniq("alice"), uniq("bob")
    statuses = [call(oidc, issuer.token(sub=alice, role="limited")).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert call(oidc, issuer.token(sub=bob, role="limited")).status == 200


def test_quotas_count_per_subject(oidc, issuer, uniq):
    alice, bob = uniq("alice"), uniq("bob")
    first = call(oidc, issuer.token(sub=alice, role="quota"))
    assert first.status == 200 and first.headers["x-quota-remaining-calls"] == "0"
    r = call(oidc, issuer.token(sub=alice, role="quota"))
    assert r.status == 429 and r.json["code"] == "quota_exceeded"
    assert call(oidc, issuer.token(sub=bob, role="quota")).status == 200


def test_history_and_metrics_name_the_subject_not_the_token(oidc, issuer, uniq):
    who = uniq("carol")
    token = issuer.token(sub=who)
    r = call(oidc, token)
    assert r.status == 200
    rid = r.headers["x-request-id"]

    def entry():
        items = oidc.get("/api/v1/queries/titles/history", params={"limit": 200}).json["items"]
        return next((i for i in items if i["request_id"] == rid), None)
    found = wait_for(entry, "the history entry")
    assert found["key_name"] == f"jwt:{who}"
    assert token not in json.dumps(found)
    metrics = oidc.get("/metrics").body.decode()
    assert 'key="jwt"' in metrics and who not in metrics


def test_from_claim_parameters(oidc, issuer, uniq):
    r = call(oidc, issuer.token(sub="alice"), q("mine"))
    assert r.status == 200 and [x["title"] for x in r.json] == ["alice one", "alice two"]
    r = call(oidc, issuer.token(sub="bob"), q("mine"))
    assert [x["title"] for x in r.json] == ["bob one"]
    # The caller can't choose the value, in the query string or the body.
    r = call(oidc, issuer.token(sub="bob"), q("mine"), params={"me": "alice"})
    assert r.status == 400 and r.json["code"] == "param_from_claim"
    r = oidc.post(q("mine"), {"params": {"me": "alice"}}, key=None,
                  headers={"Authorization": f"Bearer {issuer.token(sub='bob')}"})
    assert r.status == 400 and r.json["code"] == "param_from_claim"
    # A nested claim, a number bound to an int parameter; missing → 403.
    r = call(oidc, issuer.token(app={"tenant": 8}), q("tenant_docs"))
    assert r.status == 200 and [x["title"] for x in r.json] == ["bob one"]
    r = call(oidc, issuer.token(), q("tenant_docs"))
    assert r.status == 403 and r.json["code"] == "claim_missing"
    # The admin key supplies the value itself; a scoped key can't run the query at all.
    r = oidc.get(q("mine"), params={"me": "bob"})
    assert r.status == 200 and [x["title"] for x in r.json] == ["bob one"]
    key = oidc.key(uniq("k"), queries=["mine"], connections=[])
    r = oidc.get(q("mine"), key=key, params={"me": "bob"})
    assert r.status == 403 and r.json["code"] == "sign_in_required"


def test_from_claim_shown_in_the_definition(oidc):
    version = oidc.get("/api/v1/queries/mine").json
    text = json.dumps(version)
    assert '"from_claim": "sub"' in text


def test_require_claim_binding_role(oidc, issuer):
    r = call(oidc, issuer.token(role="bound"), q("mine"))
    assert r.status == 200 and [x["title"] for x in r.json] == ["alice one", "alice two"]
    r = call(oidc, issuer.token(role="bound"), q("titles"))
    assert r.status == 403 and r.json["code"] == "claim_binding_required"


def test_key_rotation_and_bounded_refresh(oidc, issuer):
    assert call(oidc, issuer.token("k1")).status == 200
    time.sleep(1.1)   # past QAG_JWT_JWKS_REFRESH_INTERVAL since any earlier fetch
    # The issuer rotates: a new key is published and the old one withdrawn.
    issuer.add("k2", "RS256")
    fetches = issuer.jwks_fetches
    r = call(oidc, issuer.token("k2"))
    assert r.status == 200, r
    assert issuer.jwks_fetches == fetches + 1
    # Made-up key ids right after: at most one more fetch however many arrive within the interval.
    fetches = issuer.jwks_fetches
    for i in range(10):
        r = call(oidc, issuer.token("k2", headers={"kid": f"bogus{i}"}))
        assert r.json["code"] == "token_unknown_key"
    assert issuer.jwks_fetches - fetches <= 1
    # A withdrawn key's tokens are not refused by a refresh the withdrawal caused by itself: qag fetches on an
    # unknown kid only, and a kid it knows keeps its key until the JWKS is an hour old.
    issuer.published.remove("k1")
    assert call(oidc, issuer.token("k1", sub="erin")).status == 200
    assert call(oidc, issuer.token("k2", sub="dave")).status == 200


def test_shared_secret_server(make_server, tmp_path, issuer):
    secret = "s" * 40
    path = tmp_path / "jwt-secret"
    path.write_text(secret + "\n")
    s = make_server(workers=1, env={"QUERYAPIGATE_JWT_SECRET_FILE": str(path), "QUERYAPIGATE_JWT_ROLE": "reader"})
    assert s.post("/api/v1/roles", {"name": "reader", "connections": ["lite"]}).status == 201
    now = int(time.time())
    good = jwt.encode({"sub": "svc", "exp": now + 60}, secret, algorithm="HS256")
    r = s.post("/execute_sql", {"sql": "SELECT 1 AS one", "connection_name": "lite"}, key=None,
               headers={"Authorization": f"Bearer {good}"})
    assert r.status == 200 and r.json == [{"one": 1}]
    bad = jwt.encode({"sub": "svc", "exp": now + 60}, "t" * 40, algorithm="HS256")
    r = s.get("/api/v1/me", key=None, headers={"Authorization": f"Bearer {bad}"})
    assert r.status == 401 and r.json["code"] == "token_signature"
    # An RS256 token where only the secret is configured: refused before any key is looked at.
    rs = issuer.token("k-ec")
    r = s.get("/api/v1/me", key=None, headers={"Authorization": f"Bearer {rs}"})
    assert r.status == 401 and r.json["code"] == "token_algorithm"
    assert secret not in "\n".join(s.log)


def test_openapi_declares_the_bearer_scheme_and_lists_for_the_signed_in_user(oidc, issuer):
    anonymous = oidc.get("/openapi.json", key=None).json
    assert anonymous["components"]["securitySchemes"]["BearerAuth"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
        "description": "A signed-in user's token (QAG_JWT_*); its role claim picks the grants"}
    assert {"BearerAuth": []} in anonymous["security"]
    mine = call(oidc, issuer.token(), "/openapi.json").json
    assert "/q/mine" in mine["paths"] and '"me"' not in json.dumps(mine["paths"]["/q/mine"])


def test_public_routes_answer_a_bad_token_as_anyone(oidc, issuer):
    r = call(oidc, "not-a-jwt", "/openapi.json")
    assert r.status == 200 and "/q/mine" not in r.json["paths"]
    assert call(oidc, issuer.token(exp=int(time.time()) - 600), "/health").status == 200


def _published_snapshots(s) -> list[dict]:
    """Every snapshot the server's workers published, and retired.m (observe/metrics.py's folder, named after the
    gunicorn master's pid)."""
    folders = [f for base in ("/dev/shm", tempfile.gettempdir())
               for f in glob.glob(os.path.join(base, f"qag-metrics-{s.proc.pid}-*"))]
    return [snap for folder in folders for path in glob.glob(os.path.join(folder, "*.m"))
            if (snap := metrics._load(path)) is not None]


def test_a_signed_in_users_runs_count_to_the_connection_and_to_no_key(oidc, issuer):
    """Usage per key counts API keys only: a signed-in user's name (jwt:<subject>) in the usage table each worker
    publishes would grow it with every user, and no key could show it."""
    def queries():
        return oidc.get("/api/v1/connections/docs").json["usage"]["queries"]
    before = queries()
    assert call(oidc, issuer.token(sub="usage-counter")).status == 200
    wait_for(lambda: queries() == before + 1, "the signed-in user's run counted to its connection")
    published = _published_snapshots(oidc)
    assert any(snap["c"].get("usage_conn", {}).get("docs") for snap in published)   # the read published it
    assert [name for snap in published for name in snap["c"].get("usage_key", {}) if name.startswith("jwt:")] == []
