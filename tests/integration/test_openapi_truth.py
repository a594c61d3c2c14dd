"""Issue 22.4: /openapi.json tells the truth, per caller: schemathesis against a real `qag serve`, the document
valid OpenAPI for every kind of caller, and every path a scoped key is shown answers that key."""

from __future__ import annotations

import os

import pytest
from openapi_spec_validator import validate

from tests.conftest import SEED
from tests.openapi_fuzz import fuzz, q, statuses
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
    summaries = []
    for name in ("scoped", "adhoc"):
        document = _document(server, keys[name])
        outcome = fuzz(_url(server), _headers(keys[name]), document, max_examples=EXAMPLES)
        print(name, outcome.summary())
        if outcome.count:
            summaries.append(f"{name}: {outcome.summary()}")
    assert not summaries, "\n".join(summaries)


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
        print(statuses(outcome))
        assert outcome.count == 0, outcome.summary()
    finally:
        server.close()


# --- the document itself, per caller ---------------------------------------------------------------------------

@pytest.mark.parametrize("who", ["admin", "scoped", "adhoc", "everything", "anonymous", "wrong"])
def test_every_callers_document_is_valid_openapi(seeded, who):
    server, keys = seeded
    key = {"admin": server.admin_key, "anonymous": None, "wrong": "sk_wrong"}.get(who, keys.get(who))
    document = _document(server, key)
    validate(document)   # openapi-spec-validator: OpenAPI 3.1 and its JSON Schema dialect
    assert document["openapi"] == "3.1.0" and document["info"]["title"] == "qag"
    assert {"/health", "/livez", "/readyz", "/openapi.json"} <= set(document["paths"])


def test_anonymous_callers_see_the_public_routes_only(seeded):
    server, _ = seeded
    for key in (None, "sk_wrong"):
        paths = set(_document(server, key)["paths"])
        assert paths == {"/health", "/livez", "/readyz", "/openapi.json", "/metrics"}, paths


def test_a_scoped_key_sees_its_data_plane_and_no_admin_route(seeded):
    server, keys = seeded
    scoped = set(_document(server, keys["scoped"])["paths"])
    assert not [p for p in scoped if p.startswith("/api/")]
    assert {q("by_id"), q("typed"), q("all rows"), "/catalog", "/events"} <= scoped
    # Queries it may not run, ad-hoc SQL and the schema routes need what it lacks: a connection grant.
    assert not {q("floating"), q("draft only"), "/q/{name}", "/execute_sql", "/connections/{name}/schema",
                "/connections/{name}/table_ddl"} & scoped
    adhoc = _document(server, keys["adhoc"])
    assert {"/execute_sql", "/connections/{name}/schema"} <= set(adhoc["paths"])
    name = adhoc["paths"]["/connections/{name}/schema"]["get"]["parameters"][0]
    assert name["schema"]["enum"] == ["lite"]
    everything = _document(server, keys["everything"])
    name = everything["paths"]["/connections/{name}/schema"]["get"]["parameters"][0]
    assert name["schema"]["enum"] == ["lite", "other"]
    admin = _document(server, server.admin_key)
    assert "/api/v1/api-keys" in admin["paths"] and "/q/{name}" in admin["paths"]


def _concrete_calls(document: dict, path: str, item: dict):
    """One call per listed operation with the values the document itself offers (enums, defaults, examples)."""
    for method, operation in item.items():
        if method == "parameters":
            continue
        values, query = {}, {}
        for parameter in [*item.get("parameters", []), *operation.get("parameters", [])]:
            if "$ref" in parameter:
                parameter = document["components"]["parameters"][parameter["$ref"].rsplit("/", 1)[1]]
            schema = parameter["schema"]
            value = (schema.get("enum") or [None])[0] if "enum" in schema else schema.get("default")
            if parameter["in"] == "path":
                values[parameter["name"]] = value
            elif parameter.get("required") and parameter["in"] == "query":
                query[parameter["name"]] = value if value is not None else {"integer": 1}.get(schema.get("type"), "t")
        yield method.upper(), path.format(**values), query, operation


def test_nothing_listed_for_a_scoped_key_answers_404_or_403(seeded):
    server, keys = seeded
    for name in ("scoped", "adhoc", "everything"):
        document = _document(server, keys[name])
        for path, item in document["paths"].items():
            if path == "/events":
                continue   # a stream that never ends; tests/integration/test_events_server.py covers it
            for method, concrete, query, operation in _concrete_calls(document, path, item):
                body = None
                if "requestBody" in operation:
                    body = {"sql": "SELECT 1 AS one", "connection_name": "lite"} if path == "/execute_sql" else {}
                    if path.startswith("/q/") and path != "/q/{name}":
                        body = {"params": {"id": 3, "n": 1, "s": "a", "b": True, "plain": "x"}}
                if path.startswith("/q/") and method == "GET":
                    query.update({"id": 3, "n": 1, "s": "a", "b": "true", "plain": "x"})
                reply = server.request(method, concrete, key=keys[name], body=body, params=query or None)
                assert reply.status not in (403, 404), (name, method, concrete, reply)
