"""/mcp as an OAuth 2.1 resource server (issue 24): metadata, challenges, audience and the MCP SDK's OAuth client."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import re
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.auth.utils import (build_oauth_authorization_server_metadata_discovery_urls,
                                   build_protected_resource_metadata_discovery_urls)
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.auth import (AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthMetadata,
                             OAuthToken, ProtectedResourceMetadata)

from tests.server import q, wait_for

pytestmark = pytest.mark.e2e

REST_AUDIENCE = "qag-rest-api"     # QAG_JWT_AUDIENCE: tokens for qag's REST API are good at /mcp too
SCOPE = "mcp:tools"                # QAG_MCP_SCOPE
WELL_KNOWN = "/.well-known/oauth-protected-resource"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


class AuthServer:
    """A small OAuth 2.1 authorization server on a loopback port: RFC 8414 metadata, JWKS, dynamic registration,
    authorization code with PKCE (approved at once) and a token endpoint that puts the RFC 8707 `resource` in `aud`."""

    def __init__(self):
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.requests: list[str] = []           # "METHOD path" of every request, in order
        self.authorizations: list[dict] = []    # the /authorize parameters seen
        self.token_requests: list[dict] = []    # the /token form fields seen (PKCE: no client secret in them)
        self.codes: dict[str, dict] = {}
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status, body=None, headers=()):
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                path, _, query = self.path.partition("?")
                server.requests.append(f"GET {path}")
                if path in ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration"):
                    self._send(200, server.metadata())
                elif path == "/jwks.json":
                    jwk = RSAAlgorithm.to_jwk(server.key.public_key(), as_dict=True)
                    self._send(200, {"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]})
                elif path == "/authorize":
                    params = {k: v[0] for k, v in parse_qs(query).items()}
                    server.authorizations.append(params)
                    code = secrets.token_urlsafe(16)
                    server.codes[code] = params
                    target = params["redirect_uri"] + "?" + urlencode(
                        {"code": code, "state": params["state"], "iss": server.url})
                    self._send(302, None, [("Location", target)])
                else:
                    self._send(404, {"error": "not_found"})

            def do_POST(self):
                path = self.path.partition("?")[0]
                server.requests.append(f"POST {path}")
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if path == "/register":
                    meta = json.loads(body)
                    self._send(201, {**meta, "client_id": "client-" + secrets.token_hex(4),
                                     "token_endpoint_auth_method": "none"})
                elif path == "/token":
                    form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                    server.token_requests.append(form)
                    grant = server.codes.pop(form.get("code", ""), None)
                    verifier = form.get("code_verifier", "").encode()
                    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
                    if grant is None or challenge != grant["code_challenge"] or form.get("resource") != grant.get(
                            "resource"):
                        self._send(400, {"error": "invalid_grant"})
                        return
                    token = server.token(aud=form["resource"], scope=grant.get("scope"))
                    self._send(200, {"access_token": token, "token_type": "Bearer", "expires_in": 300,
                                     "scope": grant.get("scope")})
                else:
                    self._send(404, {"error": "not_found"})

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def metadata(self) -> dict:
        return {"issuer": self.url, "authorization_endpoint": self.url + "/authorize",
                "token_endpoint": self.url + "/token", "registration_endpoint": self.url + "/register",
                "jwks_uri": self.url + "/jwks.json", "response_types_supported": ["code"],
                "grant_types_supported": ["authorization_code"], "code_challenge_methods_supported": ["S256"],
                "token_endpoint_auth_methods_supported": ["none"], "scopes_supported": [SCOPE]}

    def token(self, **claims) -> str:
        now = int(time.time())
        body = {"iss": self.url, "sub": "alice", "role": "agent", "iat": now, "exp": now + 300}
        body.update(claims)
        body = {k: v for k, v in body.items() if v is not None}
        return jwt.encode(body, self.key, algorithm="RS256", headers={"kid": "k1"})

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def _free_port() -> int:
    # The resource URL names the port, so the server can't take any free one itself (QAG_BIND :0).
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def auth_server():
    a = AuthServer()
    yield a
    a.close()


@pytest.fixture(scope="module")
def srv(auth_server, make_module_server):
    port = _free_port()
    s = make_module_server(workers=1, env={
        "QAG_BIND": f"127.0.0.1:{port}", "QAG_JWT_ISSUER": auth_server.url, "QAG_JWT_AUDIENCE": REST_AUDIENCE,
        "QAG_JWT_ROLE_CLAIM": "role", "QAG_MCP_RESOURCE_URL": f"http://127.0.0.1:{port}/mcp", "QAG_MCP_SCOPE": SCOPE,
        "QAG_HISTORY_FLUSH_INTERVAL": "0"})
    s.resource = f"http://127.0.0.1:{port}/mcp"
    s.query("by_id", "SELECT id, name FROM t WHERE id = :id", "lite", parameters={"id": {"type": "integer"}})
    s.query("all_rows", "SELECT id FROM t ORDER BY id", "lite")
    assert s.post("/api/v1/roles", {"name": "agent", "connections": [], "queries": ["by_id"]}).status == 201
    return s


def mcp_post(srv, token=None, message=INIT, headers=None, key=None):
    all_headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   **(headers or {})}
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    return srv.request("POST", "/mcp", raw=json.dumps(message).encode(), key=key, headers=all_headers)


def bearer_challenge(reply) -> str:
    found = [v for k, v in reply.header_list if k.lower() == "www-authenticate" and v.startswith("Bearer ")]
    assert len(found) == 1, reply.header_list
    return found[0]


def param(challenge: str, name: str) -> str | None:
    m = re.search(rf'(?:^Bearer |, ){name}="([^"]*)"', challenge)
    return m.group(1) if m else None


async def _tools_and_call(url: str, http) -> tuple[list[str], object]:
    async with Client(streamable_http_client(url, http_client=http)) as client:
        names = sorted(t.name for t in (await client.list_tools()).tools)
        return names, await client.call_tool("by_id", {"id": 3})


# --- the metadata document --------------------------------------------------------------------------------------

def test_metadata_document_at_the_root_and_path_suffixed_well_known_uris(srv, auth_server):
    root, suffixed = srv.get(WELL_KNOWN, key=None), srv.get(WELL_KNOWN + "/mcp", key=None)
    assert root.status == suffixed.status == 200, (root, suffixed)
    assert root.json == suffixed.json == {
        "resource": srv.resource, "authorization_servers": [auth_server.url], "bearer_methods_supported": ["header"],
        "scopes_supported": [SCOPE], "resource_name": "qag"}
    assert root.headers["content-type"] == "application/json"
    assert root.headers["cache-control"] == "public, max-age=3600" and "vary" not in root.headers
    # What the SDK's client parses it into (RFC 9728 2), and HEAD answers like GET.
    assert str(ProtectedResourceMetadata.model_validate_json(root.body).resource) == srv.resource
    head = srv.request("HEAD", WELL_KNOWN + "/mcp", key=None)
    assert head.status == 200 and head.body == b""


def test_a_401_names_the_metadata_document_beside_the_api_key_scheme(srv):
    for reply in (mcp_post(srv), mcp_post(srv, key="sk_wrong")):
        assert reply.status == 401 and reply.json["error"]["code"] == -32003
        schemes = [v.split(" ", 1)[0] for k, v in reply.header_list if k.lower() == "www-authenticate"]
        assert schemes == ["ApiKey", "Bearer"]
        challenge = bearer_challenge(reply)
        assert param(challenge, "resource_metadata") == f"{srv.resource.rsplit('/mcp', 1)[0]}{WELL_KNOWN}/mcp"
        assert param(challenge, "scope") == SCOPE and param(challenge, "error") is None
    # The REST API's 401 stays as it was: the metadata is /mcp's.
    rest = srv.get(q("by_id"), key=None)
    assert rest.status == 401 and "resource_metadata" not in bearer_challenge(rest)


def test_the_discovery_chain_a_client_follows(srv, auth_server):
    """401 → resource_metadata → the metadata → its authorization server → that server's RFC 8414 metadata, each
    URL built by the MCP SDK's own discovery helpers."""
    challenge = bearer_challenge(mcp_post(srv))
    urls = build_protected_resource_metadata_discovery_urls(param(challenge, "resource_metadata"), srv.resource)
    # The challenge's URL first, then the path-suffixed and the root well-known URIs: qag answers all three.
    assert [urlsplit(u).path for u in urls] == [WELL_KNOWN + "/mcp", WELL_KNOWN + "/mcp", WELL_KNOWN]
    for url in urls:
        assert srv.get(urlsplit(url).path, key=None).json["resource"] == srv.resource
    prm = ProtectedResourceMetadata.model_validate_json(srv.get(urlsplit(urls[0]).path, key=None).body)
    issuer = str(prm.authorization_servers[0])
    assert issuer == auth_server.url
    first = build_oauth_authorization_server_metadata_discovery_urls(issuer, srv.resource)[0]
    conn = http.client.HTTPConnection(urlsplit(first).hostname, urlsplit(first).port, timeout=10)
    conn.request("GET", urlsplit(first).path)
    asm = OAuthMetadata.model_validate_json(conn.getresponse().read())
    conn.close()
    assert str(asm.issuer) == issuer and str(asm.token_endpoint) == auth_server.url + "/token"


# --- the MCP SDK's OAuth client, end to end ---------------------------------------------------------------------

class _Memory:
    """The SDK's TokenStorage, in memory."""

    def __init__(self):
        self.tokens = self.client = None

    async def get_tokens(self) -> OAuthToken | None:
        return self.tokens

    async def set_tokens(self, tokens: OAuthToken) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> OAuthClientInformationFull | None:
        return self.client

    async def set_client_info(self, client_info: OAuthClientInformationFull) -> None:
        self.client = client_info


def test_the_sdks_oauth_client_discovers_authorizes_and_calls_a_tool(srv, auth_server):
    redirect: dict = {}

    async def go_to(authorization_url: str) -> None:
        # The "browser": the authorization server approves at once and redirects back with the code.
        parts = urlsplit(authorization_url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
        conn.request("GET", f"{parts.path}?{parts.query}")
        response = conn.getresponse()
        response.read()
        conn.close()
        redirect.update((k, v[0]) for k, v in parse_qs(urlsplit(response.getheader("Location")).query).items())

    async def come_back() -> AuthorizationCodeResult:
        return AuthorizationCodeResult(code=redirect["code"], state=redirect["state"], iss=redirect["iss"])

    provider = OAuthClientProvider(
        srv.resource, OAuthClientMetadata(client_name="qag test agent", redirect_uris=["http://127.0.0.1:9/cb"],
                                          grant_types=["authorization_code"], response_types=["code"],
                                          token_endpoint_auth_method="none"),
        _Memory(), redirect_handler=go_to, callback_handler=come_back)
    before = len(auth_server.requests)
    names, result = asyncio.run(_tools_and_call(srv.resource, create_mcp_http_client(auth=provider)))
    assert names == ["by_id"]   # the role's saved query: the token's `role` claim chose it
    assert not result.is_error and result.structured_content == {"rows": [{"id": 3, "name": "row 3"}],
                                                                 "truncated": False}
    # The SDK found the authorization server through qag's metadata and asked for a token for qag's resource
    # (RFC 8707) with the scope qag's challenge named.
    assert auth_server.requests[before:before + 2] == ["GET /.well-known/oauth-authorization-server",
                                                       "POST /register"]
    assert auth_server.authorizations[-1]["resource"] == srv.resource
    assert auth_server.authorizations[-1]["scope"] == SCOPE
    assert auth_server.token_requests[-1]["resource"] == srv.resource
    # The same pipeline as a key's call: history names the signed-in user and the transport.
    def entry_of_alice():
        body = srv.get("/api/v1/queries/by_id/history").json
        items = body["items"] if isinstance(body, dict) else body
        return next((e for e in items if e["key_name"] == "jwt:alice" and e["transport"] == "mcp"), None)
    entry = wait_for(entry_of_alice, "the tool call's history entry")
    assert entry["status"] == "success" and entry["rows"] == 1


# --- audience, expiry, scope --------------------------------------------------------------------------------------

def test_a_token_for_this_resource_lists_and_calls_with_the_sdk_client(srv, auth_server):
    for aud in (srv.resource, ["https://other.example/mcp", srv.resource], REST_AUDIENCE):
        token = auth_server.token(aud=aud, scope=f"openid {SCOPE}")
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        names, result = asyncio.run(_tools_and_call(srv.resource, http))
        assert names == ["by_id"] and result.structured_content["rows"] == [{"id": 3, "name": "row 3"}], aud
    # `scp` (a list, as some issuers write it) holds scopes too; the API key still works beside OAuth.
    assert mcp_post(srv, auth_server.token(aud=srv.resource, scp=[SCOPE])).status == 200
    assert mcp_post(srv, key=srv.admin_key).status == 200


@pytest.mark.parametrize("aud", ["https://other.example/mcp", "http://127.0.0.1:1/mcp", "qag-other-api",
                                 ["https://other.example/mcp", "another"], None])
def test_a_token_for_another_audience_is_refused(srv, auth_server, aud):
    r = mcp_post(srv, auth_server.token(aud=aud, scope=SCOPE))
    assert r.status == 401, r
    assert r.json["error"]["data"]["code"] == ("token_claims" if aud is None else "token_audience")
    challenge = bearer_challenge(r)
    assert param(challenge, "error") == "invalid_token"
    assert param(challenge, "resource_metadata").endswith(WELL_KNOWN + "/mcp")


def test_the_resource_audience_is_good_at_mcp_only(srv, auth_server):
    # A token issued for the MCP resource is not one for the REST API (nor the other way round without
    # QAG_JWT_AUDIENCE naming it): RFC 8707 audiences name one resource.
    r = srv.get(q("by_id") + "?id=1", key=None,
                headers={"Authorization": f"Bearer {auth_server.token(aud=srv.resource, scope=SCOPE)}"})
    assert r.status == 401 and r.json["code"] == "token_audience"
    ok = srv.get(q("by_id") + "?id=1", key=None,
                 headers={"Authorization": f"Bearer {auth_server.token(aud=REST_AUDIENCE)}"})
    assert ok.status == 200, ok
    # The same token, cached after a REST call, is still judged by /mcp's audience rule (and the other way round).
    both = auth_server.token(aud=REST_AUDIENCE, scope=SCOPE)
    assert srv.get(q("by_id") + "?id=1", key=None, headers={"Authorization": f"Bearer {both}"}).status == 200
    assert mcp_post(srv, both).status == 200
    mcp_only = auth_server.token(aud=srv.resource, scope=SCOPE, sub="bob")
    assert mcp_post(srv, mcp_only).status == 200
    assert srv.get(q("by_id") + "?id=1", key=None, headers={"Authorization": f"Bearer {mcp_only}"}).status == 401


def test_an_expired_token_is_401_invalid_token(srv, auth_server):
    now = int(time.time())
    r = mcp_post(srv, auth_server.token(aud=srv.resource, scope=SCOPE, iat=now - 3600, exp=now - 600))
    assert r.status == 401 and r.json["error"]["data"]["code"] == "token_expired"
    challenge = bearer_challenge(r)
    assert param(challenge, "error") == "invalid_token" and param(challenge, "resource_metadata")


def test_a_token_without_the_scope_is_403_insufficient_scope(srv, auth_server):
    for claims in ({}, {"scope": "openid"}, {"scope": "mcp:tool"}, {"scp": "openid"}, {"scope": ["mcp", "tools"]}):
        r = mcp_post(srv, auth_server.token(aud=srv.resource, **claims))
        assert r.status == 403, (claims, r)
        assert r.json["error"]["code"] == -32003 and r.json["error"]["data"]["code"] == "token_scope"
        challenge = bearer_challenge(r)
        assert param(challenge, "error") == "insufficient_scope" and param(challenge, "scope") == SCOPE
        assert param(challenge, "resource_metadata").endswith(WELL_KNOWN + "/mcp")
    # Scopes are /mcp's: the REST API doesn't ask for them.
    assert srv.get(q("by_id") + "?id=1", key=None,
                   headers={"Authorization": f"Bearer {auth_server.token(aud=REST_AUDIENCE)}"}).status == 200


def test_a_good_token_naming_no_role_is_403_without_a_scope_to_ask_for(srv, auth_server):
    r = mcp_post(srv, auth_server.token(aud=srv.resource, scope=SCOPE, role="nosuchrole"))
    assert r.status == 403 and r.json["error"]["data"]["code"] == "token_role"
    challenge = bearer_challenge(r)
    assert param(challenge, "error") == "insufficient_scope" and param(challenge, "scope") is None


# --- off, and bad input ---------------------------------------------------------------------------------------------

def test_without_bearer_tokens_there_is_no_metadata_and_no_bearer_challenge(server):
    for path in (WELL_KNOWN, WELL_KNOWN + "/mcp"):
        r = server.get(path, key=None)
        assert r.status == 404 and r.json["code"] == "not_found", (path, r)
    r = mcp_post(server)
    assert r.status == 401
    assert [v for k, v in r.header_list if k.lower() == "www-authenticate"] == [
        'ApiKey realm="qag", name="X-API-Key", in="header"']


def _raw(srv, request_bytes: bytes) -> tuple[int, bytes]:
    with socket.create_connection((srv.host, srv.port), timeout=10) as sock:
        sock.sendall(request_bytes)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_bad_input_is_never_a_500(srv, auth_server):
    # The metadata route: a Host that is no host name, other methods, a query string, deeper paths.
    status, body = _raw(srv, b'GET /.well-known/oauth-protected-resource/mcp HTTP/1.1\r\nHost: a"b, c\r\n'
                             b"Connection: close\r\n\r\n")
    assert status in (200, 400)   # the worker may refuse such a Host itself; qag, configured, never reads it
    assert status == 400 or json.loads(body)["resource"] == srv.resource
    assert srv.post(WELL_KNOWN, {}, key=None).status in (401, 405)
    assert srv.get(WELL_KNOWN + "?resource=https://evil.example/mcp", key=None).json["resource"] == srv.resource
    assert srv.get(WELL_KNOWN + "?x=%ff", key=None).status == 400   # as on every route: not UTF-8
    assert srv.get(WELL_KNOWN + "/mcp/deeper", key=None).status in (401, 404)
    # Authorization values and token contents an attacker picks.
    now = int(time.time())
    odd = [auth_server.token(aud={"a": 1}, scope=SCOPE), auth_server.token(aud=7, scope=SCOPE),
           auth_server.token(aud=srv.resource, scope={"x": 1}), auth_server.token(aud=[srv.resource, 5], scope=SCOPE),
           auth_server.token(aud=srv.resource.upper().replace("/MCP", "/mcp"), scope=SCOPE),
           auth_server.token(aud=srv.resource + "#frag", scope=SCOPE), auth_server.token(aud="http://[::1/mcp"),
           jwt.encode({"iss": auth_server.url, "aud": srv.resource, "sub": "x", "exp": now + 60}, "k" * 40,
                      algorithm="HS256", headers={"kid": "k1"})]
    assert mcp_post(srv, "a" * 20_000).status == 431   # the worker refuses a header that large before qag
    for value in ["Bearer", "Bearer ", "Bearer a.b.c", "Bearer " + "a" * 8000, "Basic YTpi", "bearer  x",
                  *[f"Bearer {t}" for t in odd]]:
        r = mcp_post(srv, headers={"Authorization": value})
        assert r.status in (200, 401, 403), (value[:60], r)
        assert r.status == 200 or r.json["error"]["code"] == -32003
    status, _ = _raw(srv, b"POST /mcp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                          b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")
    assert status == 401
    assert not any("Traceback" in line or "unexpected error" in line for line in srv.log)
