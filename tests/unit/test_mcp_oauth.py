"""/mcp's OAuth resource-server settings, audience comparison and request-derived URLs, in-process."""

from __future__ import annotations

import io
import json
import time

import pytest

jwt = pytest.importorskip("jwt", reason="the jwt extra (PyJWT) is not installed")

from qag.bearer import audience_key
from qag.settings import SettingsError, load

SECRET = "s" * 40
ADMIN = "adm" * 8
JWT = {"QAG_JWT_SECRET": SECRET, "QAG_JWT_ROLE": "r", "QAG_API_KEY": ADMIN}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}


def settings(tmp_path, **env):
    return load({"QAG_HOME": str(tmp_path), **env})


class TestSettings:
    def test_the_resource_url_is_kept_canonical(self, tmp_path):
        s = settings(tmp_path, **JWT, QAG_MCP_RESOURCE_URL=" HTTPS://QAG.Example.COM:443/Tools/mcp ",
                     QAG_MCP_AUTH_SERVER="https://id.example/tenant, http://localhost:9000",
                     QAG_MCP_SCOPE="mcp:tools, read  read")
        assert s.mcp_resource_url == "https://qag.example.com/Tools/mcp"   # the path's case is the path's
        assert s.mcp_auth_server == ("https://id.example/tenant", "http://localhost:9000")   # issuers as written
        assert s.mcp_scope == ("mcp:tools", "read")

    def test_queryapigate_names(self, tmp_path):
        s = settings(tmp_path, **JWT, QUERYAPIGATE_MCP_RESOURCE_URL="https://q.example/mcp",
                     QUERYAPIGATE_MCP_AUTH_SERVER="https://id.example", QUERYAPIGATE_MCP_SCOPE="a")
        assert (s.mcp_resource_url, s.mcp_auth_server, s.mcp_scope) == ("https://q.example/mcp",
                                                                         ("https://id.example",), ("a",))

    @pytest.mark.parametrize("name, value", [
        ("QAG_MCP_RESOURCE_URL", "http://qag.example.com/mcp"),      # plain HTTP off loopback
        ("QAG_MCP_RESOURCE_URL", "https://qag.example.com/mcp?x=1"),
        ("QAG_MCP_RESOURCE_URL", "https://qag.example.com/mcp#f"),
        ("QAG_MCP_RESOURCE_URL", "https://user@qag.example.com/mcp"),
        ("QAG_MCP_RESOURCE_URL", 'https://qag.example.com/"mcp'),     # would break out of a quoted header value
        ("QAG_MCP_RESOURCE_URL", "https://qag.example.com/m%22cp"),
        ("QAG_MCP_RESOURCE_URL", "https://qag.example.com:99999/mcp"),
        ("QAG_MCP_RESOURCE_URL", "/mcp"),
        ("QAG_MCP_RESOURCE_URL", "ftp://qag.example.com/mcp"),
        ("QAG_MCP_AUTH_SERVER", "https://id.example, http://id.example"),
        ("QAG_MCP_SCOPE", 'a "b"'),
        ("QAG_MCP_SCOPE", "caf\u00e9"),
    ])
    def test_bad_values_stop_startup(self, tmp_path, name, value):
        with pytest.raises(SettingsError) as caught:
            settings(tmp_path, **JWT, **{name: value})
        assert str(caught.value).startswith(name) and "\n" not in str(caught.value)

    @pytest.mark.parametrize("name", ["QAG_MCP_RESOURCE_URL", "QAG_MCP_AUTH_SERVER", "QAG_MCP_SCOPE"])
    def test_without_bearer_tokens_they_would_do_nothing_so_startup_stops(self, tmp_path, name):
        value = "read" if name == "QAG_MCP_SCOPE" else "https://q.example/mcp"
        with pytest.raises(SettingsError, match=f"{name} set but bearer tokens are not configured"):
            settings(tmp_path, **{name: value})


@pytest.mark.parametrize("given, key", [
    ("https://Q.Example:443/mcp", "https://q.example/mcp"),
    ("HTTP://127.0.0.1:80/mcp", "http://127.0.0.1/mcp"),
    ("http://127.0.0.1:8080/MCP", "http://127.0.0.1:8080/MCP"),
    ("https://q.example", "https://q.example/"),
    ("https://q.example/mcp#f", "https://q.example/mcp#f"),   # a fragment is no resource (RFC 8707): never equal
    ("qag-api", "qag-api"),
    ("http://[::1/mcp", "http://[::1/mcp"),                    # unparseable: its text
])
def test_audience_key(given, key):
    assert audience_key(given) == key


class App:
    """A gateway in-process, called with WSGI environs."""

    def __init__(self, tmp_path, **env):
        from qag.app import create_app
        self.app = create_app(settings(tmp_path, **JWT, **env))
        assert self.call("/api/v1/roles", key=ADMIN, method="POST", body={"name": "r", "connections": []})[0] == 201

    def call(self, path, token=None, key=None, method="GET", body=None, **environ):
        data = json.dumps(body).encode() if body is not None else b""
        env = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": "127.0.0.1",
               "HTTP_HOST": "qag.example:8080", "wsgi.url_scheme": "http", "SERVER_NAME": "10.0.0.1",
               "SERVER_PORT": "5000", "wsgi.input": io.BytesIO(data), **environ}
        if data:
            env.update(CONTENT_TYPE="application/json", CONTENT_LENGTH=str(len(data)))
        if token:
            env["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        if key:
            env["HTTP_X_API_KEY"] = key
        seen = {}
        out = b"".join(self.app(env, lambda status, headers: seen.update(status=status, headers=headers)))
        return int(seen["status"].split()[0]), seen["headers"], out


def token(**claims):
    now = int(time.time())
    return jwt.encode({"sub": "u", "exp": now + 60, **claims}, SECRET, algorithm="HS256")


def bearer(headers) -> str:
    return next(v for k, v in headers if k == "WWW-Authenticate" and v.startswith("Bearer "))


def test_without_the_setting_the_url_is_the_requests_own(tmp_path):
    app = App(tmp_path, QAG_JWT_ISSUER="https://id.example", QAG_JWT_AUDIENCE="qag-api")
    status, headers, body = app.call("/.well-known/oauth-protected-resource")
    assert status == 200 and json.loads(body)["resource"] == "http://qag.example:8080/mcp"
    assert ("Vary", "Host") in headers and ("Cache-Control", "public, max-age=3600") in headers
    assert json.loads(app.call("/.well-known/oauth-protected-resource", HTTP_HOST="Q.Example:80",
                               **{"wsgi.url_scheme": "https"})[2])["resource"] == "https://q.example:80/mcp"
    # HTTP/1.0 without Host: the address the request came in on.
    env = {"HTTP_HOST": ""}
    assert json.loads(app.call("/.well-known/oauth-protected-resource/mcp", **env)[2])["resource"] == \
        "http://10.0.0.1:5000/mcp"
    # No proxy is trusted: X-Forwarded-* change nothing.
    spoof = {"HTTP_X_FORWARDED_HOST": "evil.example", "HTTP_X_FORWARDED_PROTO": "https"}
    assert json.loads(app.call("/.well-known/oauth-protected-resource", **spoof)[2])["resource"] == \
        "http://qag.example:8080/mcp"
    for host in ('a"b', "a b", "a,b", "a/b", "x" * 300, "[::1", "a:b:c"):
        status, _, body = app.call("/.well-known/oauth-protected-resource", HTTP_HOST=host)
        assert status == 400 and json.loads(body)["code"] == "invalid_request", host
        status, headers, _ = app.call("/mcp", method="POST", body=INIT, HTTP_HOST=host)
        assert status == 401 and "resource_metadata" not in bearer(headers)


def test_trusted_proxies_name_the_host_and_scheme(tmp_path):
    app = App(tmp_path, QAG_JWT_ISSUER="https://id.example", QAG_JWT_AUDIENCE="qag-api", QAG_TRUST_PROXY="1")
    env = {"HTTP_X_FORWARDED_HOST": "evil.example, qag.example.com", "HTTP_X_FORWARDED_PROTO": "https"}
    status, headers, body = app.call("/.well-known/oauth-protected-resource", **env)
    assert json.loads(body)["resource"] == "https://qag.example.com/mcp"
    assert ("Vary", "Host, X-Forwarded-Host, X-Forwarded-Proto") in headers
    status, headers, _ = app.call("/mcp", method="POST", body=INIT, **env)
    assert 'resource_metadata="https://qag.example.com/.well-known/oauth-protected-resource/mcp"' in bearer(headers)


def test_a_request_derived_url_is_never_an_accepted_audience(tmp_path):
    # Host is the caller's to choose: a token issued for another server's /mcp must not pass by naming its host.
    app = App(tmp_path, QAG_JWT_ISSUER="https://id.example", QAG_JWT_AUDIENCE="qag-api")
    iss = {"iss": "https://id.example"}
    status, _, body = app.call("/mcp", token(aud="http://evil.example/mcp", **iss), method="POST", body=INIT,
                               HTTP_HOST="evil.example")
    assert status == 401 and json.loads(body)["error"]["data"]["code"] == "token_audience"
    assert app.call("/mcp", token(aud="qag-api", **iss), method="POST", body=INIT)[0] == 200


def test_the_configured_url_and_its_own_well_known_path(tmp_path):
    app = App(tmp_path, QAG_JWT_ISSUER="https://id.example", QAG_JWT_AUDIENCE="qag-api",
              QAG_MCP_RESOURCE_URL="https://gw.example/qag/mcp")
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp",
                 "/.well-known/oauth-protected-resource/qag/mcp"):
        status, headers, body = app.call(path, HTTP_HOST="anything.example")
        assert status == 200 and json.loads(body)["resource"] == "https://gw.example/qag/mcp", path
        assert not any(k == "Vary" for k, _ in headers)
    status, headers, _ = app.call("/mcp", method="POST", body=INIT)
    assert 'resource_metadata="https://gw.example/.well-known/oauth-protected-resource/qag/mcp"' in bearer(headers)
    iss = {"iss": "https://id.example"}
    assert app.call("/mcp", token(aud="HTTPS://GW.EXAMPLE:443/qag/mcp", **iss), method="POST", body=INIT)[0] == 200
    assert app.call("/mcp", token(aud="https://gw.example/QAG/mcp", **iss), method="POST", body=INIT)[0] == 401


def test_no_authorization_server_means_no_metadata(tmp_path):
    # A shared secret and no URL to send agents to: there is no document to serve, and no challenge points at one;
    # /mcp still binds tokens to QAG_JWT_AUDIENCE and asks for the scopes.
    app = App(tmp_path, QAG_JWT_AUDIENCE="qag-api", QAG_MCP_SCOPE="mcp")
    status, _, body = app.call("/.well-known/oauth-protected-resource/mcp")
    assert status == 404 and json.loads(body)["code"] == "not_found"
    status, headers, _ = app.call("/mcp", method="POST", body=INIT)
    assert status == 401 and bearer(headers) == 'Bearer realm="qag", scope="mcp"'
    assert app.call("/mcp", token(aud="qag-api", scope="mcp"), method="POST", body=INIT)[0] == 200
    # An explicit list names the authorization servers.
    (tmp_path / "b").mkdir()
    other = App(tmp_path / "b", QAG_JWT_AUDIENCE="qag-api", QAG_MCP_AUTH_SERVER="https://a.example,https://b.example")
    assert json.loads(other.call("/.well-known/oauth-protected-resource")[2])["authorization_servers"] == [
        "https://a.example", "https://b.example"]


def test_a_secret_without_audience_takes_no_token_at_mcp(tmp_path):
    # MCP forbids accepting tokens not issued for the server: with no audience to check, /mcp takes none, while
    # the REST API keeps QAG_JWT_SECRET's rule (no audience check unless QAG_JWT_AUDIENCE is set).
    app = App(tmp_path)
    status, _, body = app.call("/mcp", token(aud="anything"), method="POST", body=INIT)
    assert status == 401 and json.loads(body)["error"]["data"]["code"] == "token_audience"
    assert app.call("/catalog", token())[0] == 200
