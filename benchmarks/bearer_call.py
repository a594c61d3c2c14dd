"""What a bearer token costs a call, in-process: an API key, a warm token (seen before) and a cold one (new).

    python -m benchmarks.bearer_call --calls 1000 --rounds 5

Three gateways on one SQLite home (a one-row saved query, a role and a scoped key), one per way of signing:
HS256 with a shared secret, RS256 and ES256 from JWKS keys (served to the gateway from memory, no HTTP). Each
round, interleaved, measures the request thread's CPU per call (time.thread_time) through Gateway.__call__:

  api key   X-API-Key of a scoped key (the baseline)
  warm      one token again and again: found by its SHA-256 in the verified-token cache, role row cached
  cold      a new token every call (tokens made before the timed loop): parsed, signature and claims checked,
            then cached

Printed as median [min–max] µs per call over the rounds.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

from qag.app import create_app
from qag.settings import load

SECRET = "b" * 40
ISSUER = "https://issuer.bench"
AUDIENCE = "bench"
ADMIN = "bench-admin-key-0123456789"


def _call(app, path: str, headers: dict, method: str = "GET", body: dict | None = None) -> tuple[str, bytes]:
    data = json.dumps(body).encode() if body is not None else b""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": "", "REMOTE_ADDR": "127.0.0.1",
               "wsgi.input": io.BytesIO(data), "CONTENT_LENGTH": str(len(data)), "CONTENT_TYPE": "application/json"}
    environ.update({"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()})
    status = []
    out = b"".join(app(environ, lambda s, h: status.append(s)))
    return status[0], out


def _setup(home: str) -> str:
    """Store, data, saved query, role and a scoped key, made through an admin gateway; the key's secret."""
    import sqlite3
    conn = sqlite3.connect(f"{home}/data.db")
    conn.executescript("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO t VALUES (1, 'one');")
    conn.close()
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN}))
    admin = {"X-API-Key": ADMIN}
    for path, body in (("/api/v1/connections", {"name": "d", "db": "sqlite", "database": "data.db"}),
                       ("/api/v1/queries", {"name": "one", "description": "one row", "sql": "SELECT v FROM t WHERE id = 1",
                                            "connection_name": "d", "publish": True}),
                       ("/api/v1/roles", {"name": "reader", "connections": [], "queries": ["one"]})):
        status, out = _call(app, path, admin, "POST", body)
        assert status.startswith("201"), (status, out)
    status, out = _call(app, "/api/v1/api-keys", admin, "POST", {"name": "k", "queries": ["one"], "connections": []})
    assert status.startswith("201"), out
    app.close()
    return json.loads(out)["secret"]


def _gateways(home: str):
    """(name, gateway, sign(claims) -> token) for HS256, RS256 and ES256."""
    out = []
    app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN, "QAG_JWT_SECRET": SECRET,
                           "QAG_JWT_ROLE": "reader"}))
    out.append(("HS256", app, lambda c: jwt.encode(c, SECRET, algorithm="HS256")))
    for alg, private in (("RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
                         ("ES256", ec.generate_private_key(ec.SECP256R1()))):
        tool = RSAAlgorithm if alg == "RS256" else ECAlgorithm
        jwk = dict(tool.to_jwk(private.public_key(), as_dict=True), kid="k", use="sig", alg=alg)
        app = create_app(load({"QAG_HOME": home, "QAG_API_KEY": ADMIN, "QAG_JWT_JWKS_URL": ISSUER + "/jwks",
                               "QAG_JWT_ISSUER": ISSUER, "QAG_JWT_AUDIENCE": AUDIENCE, "QAG_JWT_ROLE": "reader",
                               "QAG_JWT_ALGORITHMS": alg}))
        app.auth.tokens.keys._fetch = lambda url, jwk=jwk: {"keys": [jwk]}
        out.append((alg, app, lambda c, p=private, a=alg: jwt.encode(c, p, algorithm=a, headers={"kid": "k"})))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bearer_call", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="qag-bench-bearer-")
    secret = _setup(home)
    results: dict[str, list[float]] = {}
    gateways = _gateways(home)

    def claims(i: int) -> dict:
        return {"sub": f"user{i}", "iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 3600}

    def timed(name: str, app, headers_of) -> None:
        for i in range(20):                                   # warm the caches, JIT-free but not cold
            _call(app, "/q/one", headers_of(-1 - i))
        start = time.thread_time()
        for i in range(args.calls):
            status, _ = _call(app, "/q/one", headers_of(i))
            assert status.startswith("200"), status
        results.setdefault(name, []).append((time.thread_time() - start) / args.calls * 1e6)

    for round_no in range(args.rounds):
        timed("api key", gateways[0][1], lambda i: {"X-API-Key": secret})
        for alg, app, sign in gateways:
            warm = sign(claims(0))
            timed(f"{alg} warm", app, lambda i, t=warm: {"Authorization": f"Bearer {t}"})
            tokens = [sign(claims(round_no * args.calls * 2 + i)) for i in range(args.calls)]
            extra = [sign(claims(-1000 - i)) for i in range(20)]
            timed(f"{alg} cold", app,
                  lambda i, t=tokens, e=extra: {"Authorization": f"Bearer {t[i] if i >= 0 else e[-1 - i]}"})
    print(f"{'call':<12} µs per call, median [min–max] of {args.rounds} rounds × {args.calls} calls")
    for name, values in results.items():
        print(f"{name:<12} {statistics.median(values):8.1f} [{min(values):.1f}–{max(values):.1f}]")
    for _, app, _ in gateways:
        app.close()


if __name__ == "__main__":
    main()
