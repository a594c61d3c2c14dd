"""Issue 22.4: /openapi.json tells the truth, per caller: schemathesis against a real `qag serve`, the document
valid OpenAPI for every kind of caller, and every path a scoped key is shown answers that key."""

from __future__ import annotations

import os

import pytest
from openapi_spec_validator import validate

from tests.conftest import SEED
from tests.openapi_fuzz import fuzz, q
from tests.server import Server

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("QAG_FUZZ_EXAMPLES", "25"))


def _seed(server: Server) -> dict:
    """Connections, saved queries of every parameter kind, a collection, a role and keys of every grant kind."""
    server.sqlite_db("lite.db", SEED)
    server.connection("lite", "lite.db")
    server.sqlite_db("other.db", "CREATE TABLE o (id INTEGER PRIMARY KEY, v TEXT); INSERT INTO o VALUES (1, 'x');")
    server.connection("other", "other.db")
    server.query("by_id", "SELECT id, name FROM t WHERE id = :id", "lite",
                 parameters={"id": {"type": "int", "min": 1, "max": 25}})
    server.query("typed", "SELECT :n AS n, :f AS f, :s AS s, :b AS b, :free AS free, :plain AS plain", "lite",
                 parameters={"n": "int", "f": {"type": "float", "required": False, "default": 1.5},
                             "s": {"type": "str", "enum": ["a", "b"]}, "b": "bool",
                             "free": {"required": False}}, collection="reports")
    server.query("all rows", "SELECT * FROM t ORDER BY id", "lite", cache_ttl=30)
    server.query("floating", "SELECT 1 AS one", None)
    server.query("draft only", "SELECT 2 AS two", "lite", publish=False)
    server.post("/api/v1/roles", {"name": "readers", "connections": [], "queries": ["by_id"]})
    keys = {
        "scoped": server.key("scoped", connections=[], queries=["by_id", "typed", "all rows"]),
        "adhoc": server.key("adhoc", connections=["lite"], queries=[]),
        "everything": server.key("everything", connections="*"),
    }
    return keys


@pytest.fixture(scope="module")
def seeded():
    server = Server()
    keys = _seed(server)
    yield server, keys
    server.close()


def _url(server: Server) -> str:
    return f"http://{server.host}:{server.port}"


def _document(server: Server, key: str | None) -> dict:
    reply = server.get("/openapi.json", key=key)
    assert reply.status == 200, reply
    return reply.json


def _headers(key: str | None) -> dict:
    return {"X-API-Key": key} if key else {}


def test_scoped_key_document_holds_under_fuzzing(seeded):
    server, keys = seeded
    for name in ("scoped", "adhoc"):
        document = _document(server, keys[name])
        outcome = fuzz(_url(server), _headers(keys[name]), document, max_examples=EXAMPLES)
        print(name, outcome.summary())
        assert outcome.count == 0, outcome.summary()


def test_anonymous_document_holds_under_fuzzing(seeded):
    server, _ = seeded
    document = _document(server, None)
    outcome = fuzz(_url(server), {}, document, max_examples=EXAMPLES)
    print("anonymous", outcome.summary())
    assert outcome.count == 0, outcome.summary()


def test_admin_document_holds_under_fuzzing():
    # Its own server: the run deletes and changes what it finds, which must not disturb the other tests.
    server = Server()
    try:
        _seed(server)
        document = _document(server, server.admin_key)
        outcome = fuzz(_url(server), _headers(server.admin_key), document, max_examples=EXAMPLES)
        print("admin", outcome.summary())
        assert outcome.count == 0, outcome.summary()
    finally:
        server.close()
