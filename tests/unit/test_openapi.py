"""/openapi.json: a well-formed OpenAPI 3.1 document with the generic routes and one path per listed saved query."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings, strategies as st

from qag.api.openapi import build_openapi
from qag.sql.params import validate_definitions

SECRET_SQL = "SELECT secret_column FROM hidden_table WHERE id = :id"
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


def saved(name, parameters=None, placeholders=(), description="", connection_name=None, **extra):
    stored = validate_definitions(parameters or {}, list(placeholders))
    return {"name": name, "description": description, "connection_name": connection_name, "parameters": stored,
            "placeholders": list(placeholders), **extra}


def operations(document):
    for path, item in document["paths"].items():
        for method in METHODS:
            if method in item:
                yield path, method, item[method]


def resolve_ref(document, node):
    while isinstance(node, dict) and "$ref" in node:
        target = document
        assert node["$ref"].startswith("#/"), node["$ref"]
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def walk(node, found_at=()):
    yield found_at, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, (*found_at, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, (*found_at, index))


def operation_parameters(document, path, method):
    item = document["paths"][path]
    merged = {}
    for entry in [*item.get("parameters", []), *item[method].get("parameters", [])]:
        parameter = resolve_ref(document, entry)
        merged[(parameter["name"], parameter["in"])] = parameter
    return merged


def assert_well_formed(document):
    """The structural rules of OpenAPI 3.1 that a document builder can get wrong."""
    assert document["openapi"] == "3.1.0"
    assert isinstance(document["info"]["title"], str) and isinstance(document["info"]["version"], str)
    json.dumps(document, allow_nan=False)  # plain JSON all the way down
    for found_at, node in walk(document):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            resolve_ref(document, node)  # raises KeyError when dangling
        if isinstance(node, dict) and found_at and found_at[-1] != "properties":
            assert "nullable" not in node, found_at  # 3.0 only; 3.1 uses type lists
            if "exclusiveMinimum" in node:
                assert not isinstance(node["exclusiveMinimum"], bool), found_at  # 3.0 style
    ids = [op["operationId"] for _, _, op in operations(document)]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    for path, method, op in operations(document):
        assert path.startswith("/")
        assert op["responses"], (path, method)
        for status, response in op["responses"].items():
            assert re.fullmatch(r"[1-5]\d\d", status), status
            assert "description" in resolve_ref(document, response)
        seen = []
        for entry in [*document["paths"][path].get("parameters", []), *op.get("parameters", [])]:
            parameter = resolve_ref(document, entry)
            assert parameter["in"] in ("query", "header", "path", "cookie")
            assert "schema" in parameter
            seen.append((parameter["name"], parameter["in"]))
        op_level = [(resolve_ref(document, e)["name"], resolve_ref(document, e)["in"])
                    for e in op.get("parameters", [])]
        assert len(op_level) == len(set(op_level)), (path, method, op_level)
        templated = set(re.findall(r"{([^}]+)}", path))
        in_path = {name for name, where in seen if where == "path"}
        assert templated == in_path, (path, method)
        for name in templated:
            assert operation_parameters(document, path, method)[(name, "path")]["required"] is True
        if "requestBody" in op:
            assert "application/json" in op["requestBody"]["content"]


# ------------------------------------------------------------------------------------------------------------
# The static part
# ------------------------------------------------------------------------------------------------------------

class TestGeneric:
    def test_header(self):
        document = build_openapi("1.2.3", [])
        assert document["openapi"] == "3.1.0"
        assert document["info"]["title"] == "qag"
        assert document["info"]["version"] == "1.2.3"
        assert document["components"]["securitySchemes"]["ApiKey"] == {
            "type": "apiKey", "in": "header", "name": "X-API-Key"}
        assert document["security"] == [{}, {"ApiKey": []}]

    def test_well_formed(self):
        assert_well_formed(build_openapi("0.1.0", []))

    @pytest.mark.parametrize("path, methods", [
        ("/q/{name}", {"get", "post"}), ("/execute_sql", {"post"}), ("/health", {"get"}), ("/openapi.json", {"get"}),
        ("/metrics", {"get"}),
        ("/api/v1/connections", {"get", "post"}), ("/api/v1/connections/{name}", {"get", "patch", "delete"}),
        ("/api/v1/connections/test", {"post"}), ("/api/v1/connections/databases", {"post"}),
        ("/api/v1/connections/deleted", {"get"}), ("/api/v1/connections/{name}/schema", {"get"}),
        ("/api/v1/queries", {"get", "post"}), ("/api/v1/queries/validate", {"post"}),
        ("/api/v1/queries/{name}", {"get", "patch", "delete"}), ("/api/v1/queries/{name}/versions", {"post"}),
        ("/api/v1/queries/{name}/versions/{n}", {"get", "patch", "delete"}),
        ("/api/v1/queries/{name}/versions/{n}/flow", {"get"}), ("/api/v1/queries/{name}/publish", {"post"}),
        ("/api/v1/queries/{name}/unpublish", {"post"}), ("/api/v1/queries/{name}/history", {"get"}),
        ("/api/v1/api-keys", {"get", "post"}), ("/api/v1/api-keys/{name}", {"get", "patch", "delete"}),
        ("/api/v1/api-keys/{name}/rotate", {"post"}), ("/api/v1/api-keys/{name}/previous", {"delete"}),
        ("/api/v1/roles", {"get", "post"}), ("/api/v1/roles/{name}", {"get", "patch", "delete"}),
        ("/api/v1/me", {"get"}), ("/catalog", {"get"}), ("/connections/{name}/schema", {"get"}),
        ("/connections/{name}/table_ddl", {"get"}),
    ])
    def test_routes_documented(self, path, methods):
        item = build_openapi("0.1.0", [])["paths"][path]
        assert methods <= {m for m in METHODS if m in item}

    def test_management_schemas(self):
        document = build_openapi("0.1.0", [])
        create = document["paths"]["/api/v1/queries"]["post"]
        body = resolve_ref(document, create["requestBody"]["content"]["application/json"]["schema"])
        assert {"description", "sql", "parameters", "publish", "connection_name"} <= set(body["properties"])
        assert "201" in create["responses"] and "409" in create["responses"]
        rule = document["components"]["schemas"]["ParameterRule"]
        assert rule["required"] == ["type", "required"]
        key = document["paths"]["/api/v1/api-keys"]["post"]["responses"]["201"]
        assert key["headers"]["Cache-Control"]["schema"] == {"const": "no-store"}
        error = document["components"]["schemas"]["Error"]
        assert error["required"] == ["error", "code", "request_id"]

    def test_static_part_is_not_changed_by_a_call(self):
        first = build_openapi("0.1.0", [saved("one")])
        first["paths"]["/bogus"] = {}
        first["info"] = {}
        again = build_openapi("0.1.0", [])
        assert "/q/one" not in again["paths"] and "/bogus" not in again["paths"]
        assert again["info"]["title"] == "qag"
        assert "/q/one" in build_openapi("0.1.0", [saved("one")])["paths"]


# ------------------------------------------------------------------------------------------------------------
# Saved-query paths
# ------------------------------------------------------------------------------------------------------------

FILMS = saved(
    "my query",
    {"rating": {"type": "str", "enum": ["G", "PG"], "default": "PG", "description": "MPAA rating"},
     "n": {"type": "int", "min": 1, "max": 60, "example": 5},
     "score": {"type": "float", "min": 0.5, "required": False},
     "title": {"type": "str", "min_length": 2, "max_length": 40, "pattern": "[A-Za-z ]+"},
     "flag": "bool", "free": {}},
    placeholders=["rating", "n", "score", "title", "flag", "free", "city"],
    description="Films by rating", sql=SECRET_SQL, sql_query=SECRET_SQL,
)


def query_parameters(document, path="/q/my%20query"):
    return {name: p for (name, where), p in operation_parameters(document, path, "get").items() if where == "query"}


def body_schema(document, path="/q/my%20query"):
    return document["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


class TestSavedQueries:
    def test_path_is_url_quoted_and_well_formed(self):
        document = build_openapi("0.1.0", [FILMS, saved("ünï.code-x")])
        assert "/q/my%20query" in document["paths"]
        assert "/q/%C3%BCn%C3%AF.code-x" in document["paths"]
        assert_well_formed(document)

    def test_summary_is_the_description(self):
        item = build_openapi("0.1.0", [FILMS])["paths"]["/q/my%20query"]
        assert item["get"]["summary"] == "Films by rating"
        assert item["post"]["summary"] == "Films by rating"
        assert build_openapi("0.1.0", [saved("x")])["paths"]["/q/x"]["get"]["summary"]  # never empty

    def test_declared_rules_become_json_schema(self):
        params = query_parameters(build_openapi("0.1.0", [FILMS]))
        assert params["rating"]["schema"] == {"type": "string", "enum": ["G", "PG"], "description": "MPAA rating",
                                              "default": "PG"}
        assert params["rating"]["required"] is False
        assert params["rating"]["description"] == "MPAA rating"
        assert params["n"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 60, "example": 5}
        assert params["n"]["required"] is True
        assert params["score"]["schema"] == {"type": "number", "minimum": 0.5}
        assert params["score"]["required"] is False
        title = params["title"]["schema"]
        assert (title["minLength"], title["maxLength"]) == (2, 40)
        # qag matches the whole value; the schema says so by anchoring (and Python's `$` would let a final newline
        # through, which qag's fullmatch refuses)
        assert title["pattern"] == "^(?:[A-Za-z ]+)$(?!\\n)"
        assert params["flag"]["schema"] == {"type": "boolean"}
        assert params["free"]["schema"] == {"type": "string"}

    def test_undeclared_placeholders_are_required_strings(self):
        document = build_openapi("0.1.0", [FILMS])
        assert query_parameters(document)["city"] == {"name": "city", "in": "query", "required": True,
                                                     "schema": {"type": "string"}}
        params = body_schema(document)["properties"]["params"]
        assert params["properties"]["city"] == {"type": "string"}
        assert params["required"] == ["n", "title", "flag", "free", "city"]

    def test_post_body_keeps_json_types(self):
        properties = body_schema(build_openapi("0.1.0", [FILMS]))["properties"]
        assert properties["params"]["properties"]["n"]["type"] == "integer"
        assert properties["params"]["properties"]["free"]["type"] == ["string", "number", "boolean"]
        assert {"connection_name", "version", "format", "timeout"} <= set(properties)

    def test_run_arguments(self):
        params = query_parameters(build_openapi("0.1.0", [FILMS]))
        assert params["format"]["schema"]["enum"] == ["json", "ndjson", "csv", "tsv", "xml", "yaml", "xlsx", "parquet"]
        assert params["page"]["schema"]["minimum"] == 1
        assert params["page_size"]["schema"]["default"] == 10
        assert params["timeout"]["schema"]["type"] == "number"
        assert params["version"]["schema"]["type"] == "integer"

    def test_connection_name_required_only_without_a_default(self):
        without = query_parameters(build_openapi("0.1.0", [FILMS]))["connection_name"]
        assert without["required"] is True and "default" not in without["schema"]
        document = build_openapi("0.1.0", [saved("lite q", connection_name="lite")])
        with_default = query_parameters(document, "/q/lite%20q")["connection_name"]
        assert with_default["required"] is False and with_default["schema"]["default"] == "lite"
        assert "required" not in body_schema(document, "/q/lite%20q")

    def test_reserved_placeholder_names_only_in_the_body(self):
        document = build_openapi("0.1.0", [saved("p", placeholders=["page", "id"])])
        page = [p for p in document["paths"]["/q/p"]["get"]["parameters"] if p.get("name") == "page"]
        assert page == []  # ?page= is paging, never the parameter
        assert body_schema(document, "/q/p")["properties"]["params"]["required"] == ["page", "id"]
        assert_well_formed(document)

    def test_declared_but_unused_are_not_documented(self):
        query = saved("q", placeholders=["a"])
        query["parameters"] = {"a": {"type": "integer", "required": True}, "gone": {"type": "integer",
                                                                                  "required": True}}
        assert set(query_parameters(build_openapi("0.1.0", [query]), "/q/q")) >= {"a"}
        assert "gone" not in query_parameters(build_openapi("0.1.0", [query]), "/q/q")

    def test_unusable_stored_rule_is_documented_leniently(self):
        query = saved("q", placeholders=["a"])
        query["parameters"] = {"a": {"type": "uuid"}}
        assert query_parameters(build_openapi("0.1.0", [query]), "/q/q")["a"]["schema"] == {"type": "string"}

    def test_operation_ids(self):
        document = build_openapi("0.1.0", [saved("my query"), saved("a.b-c")])
        assert document["paths"]["/q/my%20query"]["get"]["operationId"] == "run_my_query"
        assert document["paths"]["/q/my%20query"]["post"]["operationId"] == "run_my_query_post"
        assert document["paths"]["/q/a.b-c"]["get"]["operationId"] == "run_a_b_c"

    def test_operation_ids_deduplicated_with_trailing_underscore(self):
        document = build_openapi("0.1.0", [saved("a b"), saved("a-b"), saved("a.b")])
        ids = [document["paths"][p]["get"]["operationId"] for p in ("/q/a%20b", "/q/a-b", "/q/a.b")]
        assert ids == ["run_a_b", "run_a_b_", "run_a_b__"]
        assert document["paths"]["/q/a-b"]["post"]["operationId"] == "run_a_b__post"
        assert_well_formed(document)

    def test_post_suffix_cannot_collide(self):
        document = build_openapi("0.1.0", [saved("a_post"), saved("a")])
        assert document["paths"]["/q/a_post"]["get"]["operationId"] == "run_a_post"
        assert document["paths"]["/q/a"]["get"]["operationId"] == "run_a_"
        assert_well_formed(document)

    def test_never_includes_sql_text(self):
        text = json.dumps(build_openapi("0.1.0", [FILMS]))
        assert "secret_column" not in text and "hidden_table" not in text


names = st.text(alphabet=st.sampled_from("ab _.-é1"), min_size=1, max_size=6)


@settings(max_examples=100)
@given(st.lists(names, max_size=8, unique=True),
       st.lists(st.sampled_from(["id", "page", "x_1", "format"]), max_size=4))
def test_any_query_list_gives_a_well_formed_document(query_names, placeholders):
    queries = [saved(name, placeholders=placeholders, connection_name=None if i % 2 else "c")
               for i, name in enumerate(query_names)]
    document = build_openapi("9.9.9", queries)
    assert_well_formed(document)
    for name in query_names:
        assert document["paths"]["/q/" + re.sub(" ", "%20", name).replace("é", "%C3%A9")]["get"]["operationId"] \
            .startswith("run_")


class TestBearer:
    def test_bearer_scheme_only_when_configured(self):
        plain = build_openapi("1.0.0", [])
        assert "BearerAuth" not in plain["components"]["securitySchemes"]
        document = build_openapi("1.0.0", [], bearer=True)
        assert document["components"]["securitySchemes"]["BearerAuth"]["scheme"] == "bearer"
        assert document["components"]["securitySchemes"]["ApiKey"]["name"] == "X-API-Key"
        assert document["security"] == [{}, {"ApiKey": []}, {"BearerAuth": []}]
        assert_well_formed(document)
        # The cached static document is not changed by a bearer build.
        assert build_openapi("1.0.0", [])["security"] == [{}, {"ApiKey": []}]

    def test_claim_bound_parameters_are_not_inputs(self):
        query = {"name": "mine", "description": None, "connection_name": "c",
                 "parameters": {"me": {"type": "string", "required": True, "from_claim": "sub"},
                                "q": {"type": "string", "required": True}},
                 "placeholders": ["me", "q"]}
        text = json.dumps(build_openapi("1.0.0", [query], bearer=True)["paths"]["/q/mine"])
        assert '"q"' in text and '"me"' not in text
