"""Bearer tokens in-process: settings checks, the verified-token cache, and a warm call with no store read."""

from __future__ import annotations

import io
import json
import time

import pytest

jwt = pytest.importorskip("jwt", reason="the jwt extra (pip install 'qag[jwt]')")

from qag.settings import SettingsError, load

SECRET = "x" * 40


def settings(tmp_path, **env):
    return load({"QAG_HOME": str(tmp_path), **env})


class TestSettings:
    def test_secret_alone_means_hs256(self, tmp_path):
        s = settings(tmp_path, QAG_JWT_SECRET=SECRET, QAG_JWT_ROLE="r")
        assert s.jwt_mode == "secret" and s.jwt_algorithms == ("HS256",)

    def test_off_by_default(self, tmp_path):
        assert settings(tmp_path).jwt_mode is None

    @pytest.mark.parametrize("env, words", [
        ({"QAG_JWT_SECRET": "short", "QAG_JWT_ROLE": "r"}, "at least 32 bytes"),
        ({"QAG_JWT_SECRET": SECRET, "QAG_JWT_ROLE": "r", "QAG_JWT_ALGORITHMS": "RS256"}, "may only list HS256"),
        ({"QAG_JWT_SECRET": SECRET, "QAG_JWT_ROLE": "r", "QAG_JWT_ALGORITHMS": "none"}, "may only list"),
        ({"QAG_JWT_ISSUER": "https://id.example", "QAG_JWT_AUDIENCE": "a", "QAG_JWT_ROLE": "r",
          "QAG_JWT_ALGORITHMS": "HS256"}, "may only list RS256"),
        ({"QAG_JWT_ISSUER": "https://id.example", "QAG_JWT_ROLE": "r"}, "QAG_JWT_AUDIENCE"),
        ({"QAG_JWT_JWKS_URL": "http://id.example/jwks", "QAG_JWT_ISSUER": "x", "QAG_JWT_AUDIENCE": "a",
          "QAG_JWT_ROLE": "r"}, "https://"),
        ({"QAG_JWT_SECRET": SECRET}, "QAG_JWT_ROLE"),
        ({"QAG_JWT_AUDIENCE": "a"}, "none of QAG_JWT_SECRET"),
        ({"QAG_JWT_SECRET": SECRET, "QAG_JWT_JWKS_URL": "https://id.example/jwks", "QAG_JWT_ROLE": "r"}, "not both"),
    ])
    def test_unsafe_or_impossible_settings_stop_startup(self, tmp_path, env, words):
        with pytest.raises(SettingsError) as caught:
            settings(tmp_path, **env)
        assert words in str(caught.value)
        assert SECRET not in str(caught.value)

    def test_queryapigate_names_and_the_file_form(self, tmp_path):
        path = tmp_path / "secret"
        path.write_text(SECRET + "\n")
        s = settings(tmp_path, QUERYAPIGATE_JWT_SECRET_FILE=str(path), QUERYAPIGATE_JWT_ROLE="r",
                     QUERYAPIGATE_JWT_AUDIENCE="a, b")
        assert s.jwt_secret == SECRET and s.jwt_role == "r" and s.jwt_audience == ("a", "b")


class Counting:
    """A store whose reads are counted by method name."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: dict[str, int] = {}

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] = self.calls.get(name, 0) + 1
            return attr(*args, **kwargs)
        return counted


def test_a_warm_bearer_call_reads_nothing_from_the_store_and_verifies_once(tmp_path, monkeypatch):
    from qag import bearer
    from qag.app import create_app

    app = create_app(settings(tmp_path, QAG_JWT_SECRET=SECRET, QAG_JWT_ROLE_CLAIM="role", QAG_API_KEY="adm" * 8))

    def call(path, token=None, key=None, method="GET", body=None):
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": "127.0.0.1",
                   "wsgi.input": io.BytesIO(json.dumps(body).encode() if body else b"")}
        if body:
            environ.update(CONTENT_TYPE="application/json", CONTENT_LENGTH=str(len(environ["wsgi.input"].getvalue())))
        if token:
            environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        if key:
            environ["HTTP_X_API_KEY"] = key
        seen = {}
        out = b"".join(app(environ, lambda status, headers: seen.update(status=status)))
        return int(seen["status"].split()[0]), out

    status, _ = call("/api/v1/roles", key="adm" * 8, method="POST", body={"name": "r", "connections": []})
    assert status == 201
    decoded = []
    real = bearer.TokenVerifier._decode
    monkeypatch.setattr(bearer.TokenVerifier, "_decode", lambda self, t: decoded.append(1) or real(self, t))
    token = jwt.encode({"sub": "u1", "role": "r", "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    counting = Counting(app.metadata.inner)
    app.metadata.inner = counting
    # /catalog needs a caller and reads no saved query for an empty grant: only authentication's reads remain.
    assert call("/catalog", token)[0] == 200       # cold: verified, role read once
    assert decoded == [1] and counting.calls.get("get_role") == 1
    counting.calls.clear()
    assert call("/catalog", token)[0] == 200       # warm
    assert decoded == [1]
    assert "get_role" not in counting.calls and "count_keys" not in counting.calls
    # An expired token in the cache is verified again (and refused), not served from it.
    old = jwt.encode({"sub": "u1", "role": "r", "exp": int(time.time()) - 120}, SECRET, algorithm="HS256")
    status, body = call("/catalog", old)
    assert status == 401 and json.loads(body)["code"] == "token_expired"


def test_the_cache_is_bounded_and_respects_exp():
    from qag.bearer import TokenVerifier

    class S:
        jwt_secret, jwt_algorithms, jwt_issuer, jwt_audience = SECRET, ("HS256",), None, ()
        jwt_leeway, jwt_mode, jwt_cache_entries, jwt_jwks_url, jwt_jwks_refresh_interval = 0, "secret", 3, None, 1

    v = TokenVerifier(S())
    now = int(time.time())
    tokens = [jwt.encode({"sub": str(i), "exp": now + 60}, SECRET, algorithm="HS256") for i in range(5)]
    for t in tokens:
        assert v.verify(t)["exp"] == now + 60
    assert len(v._seen) == 3
    short = jwt.encode({"sub": "s", "exp": now + 1}, SECRET, algorithm="HS256")
    v.verify(short)
    time.sleep(2.1)
    with pytest.raises(Exception) as caught:
        v.verify(short)
    assert caught.value.code == "token_expired"


def test_a_cached_token_stops_when_its_key_is_withdrawn():
    """The verified-token cache keeps a token until its exp only while the issuer still publishes the key that
    verified it: once a fetch of the JWKS no longer holds that key (a leaked key withdrawn), the cached token is
    verified again and refused, as a new token of that key is; a key published again under its kid is a new
    entry, so its tokens are verified once more and then kept."""
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    from qag.bearer import TokenVerifier
    from qag.errors import QagError

    def jwk(private, kid):
        entry = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
        entry.update(kid=kid, use="sig", alg="RS256")
        return entry

    k1, k2 = (rsa.generate_private_key(public_exponent=65537, key_size=2048) for _ in range(2))
    published = {"keys": [jwk(k1, "k1")]}
    fetches = []

    def fetch(url):
        fetches.append(url)
        return json.loads(json.dumps(published))

    class S:
        jwt_secret, jwt_algorithms, jwt_issuer, jwt_audience = None, ("RS256",), "https://id.example", ()
        jwt_leeway, jwt_mode, jwt_cache_entries = 0, "keys", 100
        jwt_jwks_url, jwt_jwks_refresh_interval = "https://id.example/jwks", 0

    v = TokenVerifier(S(), fetch=fetch)
    claims = {"sub": "u", "iss": "https://id.example", "exp": int(time.time()) + 3600}
    old = jwt.encode(claims, k1, algorithm="RS256", headers={"kid": "k1"})
    assert v.verify(old)["sub"] == "u" and v.verify(old)["sub"] == "u"
    assert len(fetches) == 1                     # the second call was the cache's
    v.keys._fetched_at -= 7200                   # an hour-old set: a cached call still doesn't wait on the issuer
    assert v.verify(old)["sub"] == "u" and len(fetches) == 1
    decoded = []
    decode = v._decode
    v._decode = lambda token: decoded.append(token) or decode(token)
    k3 = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    published = {"keys": [jwk(k1, "k1"), jwk(k3, "k3")]}     # a key added: k1's tokens stay cached
    third = jwt.encode(claims, k3, algorithm="RS256", headers={"kid": "k3"})
    assert v.verify(third)["sub"] == "u" and len(fetches) == 2
    assert v.verify(old)["sub"] == "u" and decoded == [third]
    published = {"keys": [jwk(k2, "k2")]}        # k1 withdrawn, k2 published
    new = jwt.encode(claims, k2, algorithm="RS256", headers={"kid": "k2"})
    assert v.verify(new)["sub"] == "u"           # an unknown kid: the keys are fetched again
    assert len(fetches) == 3
    with pytest.raises(QagError) as caught:
        v.verify(old)
    assert caught.value.code == "token_unknown_key"
    assert v.verify(new)["sub"] == "u"


def test_unreachable_issuer_is_503_then_known_keys_survive_an_outage():
    from qag.bearer import KeySet
    from qag.errors import QagError

    calls = []

    def down(url):
        calls.append(url)
        raise OSError("connection refused")

    keys = KeySet(None, "https://id.example", 0.0, fetch=down)
    with pytest.raises(QagError) as caught:
        keys.get("k1")
    assert caught.value.code == "jwks_unavailable" and caught.value.status == 503
    assert calls == ["https://id.example/.well-known/openid-configuration"]

    # Discovery must name the issuer it was fetched for.
    documents = {"https://id.example/.well-known/openid-configuration": {"issuer": "https://other.example",
                                                                         "jwks_uri": "https://id.example/k"}}
    keys = KeySet(None, "https://id.example", 0.0, fetch=lambda url: documents[url])
    with pytest.raises(QagError) as caught:
        keys.get("k1")
    assert caught.value.code == "jwks_unavailable"


class TestWhereKeysComeFrom:
    """Signing keys and discovery documents are read over https, or plain http to a loopback host only, judged on
    the parsed host, and a redirect is followed only where the same rule holds."""

    @pytest.mark.parametrize("url, ok", [
        ("https://id.example/jwks", True), ("HTTPS://id.example", True),
        ("http://127.0.0.1:8080/jwks", True), ("http://127.5.6.7/jwks", True), ("http://localhost/jwks", True),
        ("http://[::1]:9/jwks", True),
        ("http://id.example/jwks", False), ("http://127.0.0.1.evil.example/jwks", False),
        ("http://localhost.evil.example:7150/jwks", False), ("http://user:pw@127.0.0.1/jwks", False),
        ("http://127.0.0.1:99999/jwks", False), ("ftp://127.0.0.1/jwks", False), ("file:///etc/passwd", False),
        ("https:///jwks", False), ("http://10.0.0.1/jwks", False),
    ])
    def test_key_source_url(self, url, ok):
        from qag.bearer import key_source_url
        assert key_source_url(url) is ok

    @pytest.mark.parametrize("env, words", [
        ({"QAG_JWT_JWKS_URL": "http://127.0.0.1.evil.example/jwks"}, "QAG_JWT_JWKS_URL"),
        ({"QAG_JWT_JWKS_URL": "http://localhost.evil.example/jwks"}, "QAG_JWT_JWKS_URL"),
        ({}, "QAG_JWT_ISSUER is where the signing keys are discovered"),
    ])
    def test_plain_http_elsewhere_stops_startup(self, tmp_path, env, words):
        with pytest.raises(SettingsError) as caught:
            settings(tmp_path, QAG_JWT_ISSUER="http://192.0.2.2:7150", QAG_JWT_AUDIENCE="a", QAG_JWT_ROLE="r", **env)
        assert words in str(caught.value)

    def test_an_http_issuer_is_fine_where_the_keys_come_from_elsewhere(self, tmp_path):
        s = settings(tmp_path, QAG_JWT_ISSUER="http://issuer.example", QAG_JWT_AUDIENCE="a", QAG_JWT_ROLE="r",
                     QAG_JWT_JWKS_URL="https://keys.example/jwks")
        assert s.jwt_mode == "keys"

    def test_a_redirect_is_followed_only_where_keys_may_come_from(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from qag.bearer import _fetch_json

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                targets = {"/away": "http://192.0.2.2:7150/jwks", "/near": "/jwks", "/down": "http://192.0.2.2/x"}
                if self.path in targets:
                    self.send_response(302)
                    self.send_header("Location", targets[self.path])
                    self.end_headers()
                    return
                body = b'{"keys": []}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        try:
            assert _fetch_json(base + "/near") == {"keys": []}
            for path in ("/away", "/down"):
                with pytest.raises(ValueError, match="redirected"):
                    _fetch_json(base + path)
            with pytest.raises(ValueError):
                _fetch_json("http://192.0.2.2:7150/jwks")   # refused before any connection is tried
        finally:
            httpd.shutdown()
            httpd.server_close()


@pytest.mark.parametrize("claims, name, expected", [
    ({"role": "a"}, "role", "a"),
    ({"app": {"role": "a"}}, "app.role", "a"),
    ({"https://example.com/role": "a"}, "https://example.com/role", "a"),     # a namespaced claim, dots and all
    ({"app.role": "a"}, "app.role", "a"),                                      # only the literal reading exists
    ({"app.role": "a", "app": {"role": "a"}}, "app.role", "a"),                # both readings agree
    ({"app.role": "admin", "app": {"role": "viewer"}}, "app.role", None),     # they differ: no such claim
    ({"app.role": 1, "app": {"role": True}}, "app.role", None),               # 1 == True, yet not the same claim
    ({"app": {"role": "a"}}, "app.missing", None),
    ({"app": "flat"}, "app.role", None),
])
def test_a_dotted_claim_name_read_two_ways_must_agree(claims, name, expected):
    """A dotted name may be a namespaced claim or a path; a token where the two readings disagree has neither, so a
    user who can set a top-level claim can't shadow the nested one the issuer sets (role, claim-bound values)."""
    from qag.bearer import claim
    assert claim(claims, name) == expected
