"""Contract 11 and 6.1: GET /catalog (the same reachability rule as /q/<name> and /openapi.json, for every key)
and GET /connections/<name>/table_ddl (a forbidden table is as missing as an unknown one; the name never reaches
the SQL text), on a real gunicorn with several workers, on SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.server import q
from tests.services import mysql_admin

pytestmark = pytest.mark.e2e

_RECORD = ("type", "required", "has_default", "default", "enum", "min", "max", "min_length", "max_length", "pattern",
           "description", "has_example", "example", "embed", "from_claim")


@pytest.fixture(scope="module")
def cat(make_module_server):
    """A server with a server-wide rate limit, a second connection and queries in two collections."""
    s = make_module_server(env={"QAG_RATE_LIMIT": "5000/minute"})
    s.sqlite_db("other.db", "CREATE TABLE o (id INTEGER PRIMARY KEY);")
    s.connection("other", "other.db")
    s.query("c_films", "SELECT id, name FROM t WHERE id > :n ORDER BY id", "lite", collection="films",
            tags=["x", "y"], cache_ttl=30, parameters={"n": {"type": "int", "default": 0, "min": 0,
                                                             "description": "lower bound", "example": 3}})
    s.query("c_secret", "SELECT id, email FROM secret", "lite", collection="private")
    s.query("c_other", "SELECT id FROM o", "other")
    s.query("c_free", "SELECT 1 AS one", None)
    s.query("c_draft", "SELECT 2 AS two", "lite", publish=False)
    return s


def _names(reply) -> set[str]:
    assert reply.status == 200, reply
    return {item["name"] for item in reply.json["queries"]}


def _openapi_names(server, key) -> set[str]:
    paths = server.get("/openapi.json", key=key).json["paths"]
    return {p[len("/q/"):] for p in paths if p.startswith("/q/") and p != "/q/{name}"}


def test_catalog_needs_a_key(cat):
    assert cat.get("/catalog", key=None).status == 401
    assert cat.get("/catalog", key="wrong").status == 401


def test_catalog_lists_published_queries_with_the_whole_parameter_record(cat):
    reply = cat.get("/catalog")
    names = _names(reply)
    assert {"c_films", "c_secret", "c_other", "c_free"} <= names and "c_draft" not in names
    films = next(i for i in reply.json["queries"] if i["name"] == "c_films")
    assert films == {"name": "c_films", "version": 1, "description": "test query c_films", "tags": ["x", "y"],
                     "collection": "films", "connection_name": "lite", "cache_ttl": 30, "can_write": False,
                     "parameters": {"n": {"type": "integer", "required": False, "has_default": True, "default": 0,
                                          "enum": None, "min": 0, "max": None, "min_length": None,
                                          "max_length": None, "pattern": None, "description": "lower bound",
                                          "has_example": True, "example": 3, "embed": False, "from_claim": None}}}
    assert tuple(films["parameters"]["n"]) == _RECORD
    assert reply.json["caller"] == {"name": "admin", "admin": True, "allow_writes": False, "allowed_write_ops": None,
                                    "allowed_tables": None, "mask": None, "rate_limit": None,
                                    "server_rate_limit": "5000/minute"}


def test_catalog_lists_every_placeholder_with_a_record_undeclared_ones_untyped_and_required(cat, uniq):
    # QueryAPIGate 0.43 (probed): one record per placeholder, in the version's `placeholders` order (`:name` by
    # first use, then `{name}`), a declared one's rule or else an untyped, required one; `parameters` was {}.
    name = uniq("c_undeclared")
    cat.query(name, "SELECT :a AS a, {z} AS z, :b AS b, :c AS c, :a AS a2", "lite",
              parameters={"c": "int", "b": {}}, tags="a, b")
    item = next(i for i in cat.get("/catalog").json["queries"] if i["name"] == name)
    assert item["tags"] == ["a", "b"]   # contract 5.3's list everywhere (QueryAPIGate: "a, b"; compatibility.md)
    untyped = {"type": None, "required": True, "has_default": False, "default": None, "enum": None, "min": None,
               "max": None, "min_length": None, "max_length": None, "pattern": None, "description": None,
               "has_example": False, "example": None, "embed": False, "from_claim": None}
    assert list(item["parameters"]) == ["a", "b", "c", "z"]
    assert item["parameters"] == {"a": untyped, "b": untyped, "c": dict(untyped, type="integer"), "z": untyped}
    assert all(tuple(record) == _RECORD for record in item["parameters"].values())


def test_catalog_agrees_with_q_and_openapi_for_every_kind_of_grant(cat, uniq):
    grants = [
        {"connections": [], "queries": ["c_films"]},
        {"connections": [], "collections": ["private"]},
        {"connections": ["other"]},
        {"connections": [], "queries": "*"},
        {"connections": "*"},
        {"connections": []},
        {"connections": ["lite"], "queries": ["c_other"]},
    ]
    saved = {"c_films", "c_secret", "c_other"}   # /q of c_free needs a connection chosen before any grant check
    for grant in grants:
        key = cat.key(uniq("cat"), **grant)
        listed = _names(cat.get("/catalog", key=key))
        assert listed == _openapi_names(cat, key), grant
        assert listed & saved == {name for name in saved if cat.get(q(name), key=key).status != 403}, grant
    # The one rule, spelled out for two of them: a query grant reaches that query only, a collection its queries.
    only = cat.key(uniq("cat"), connections=[], queries=["c_films"])
    assert _names(cat.get("/catalog", key=only)) == {"c_films"}
    private = cat.key(uniq("cat"), connections=[], collections=["private"])
    assert _names(cat.get("/catalog", key=private)) == {"c_secret"}
    assert _names(cat.get("/catalog", key=cat.key(uniq("cat"), connections=[]))) == set()


def test_catalog_caller_block_shows_the_keys_own_grants(cat, uniq):
    name = uniq("who")
    key = cat.key(name, connections=["lite"], allowed_tables=["t"], rate_limit="7/minute",
                  mask=[{"column": "secret.email", "action": "hash"}])
    caller = cat.get("/catalog", key=key).json["caller"]
    assert caller == {"name": name, "admin": False, "allow_writes": False, "allowed_write_ops": None,
                      "allowed_tables": ["t"], "mask": [{"column": "secret.email", "action": "hash"}],
                      "rate_limit": "7/minute", "server_rate_limit": "5000/minute"}


def test_catalog_masking_is_what_a_run_would_do(cat, uniq):
    key = cat.key(uniq("mask"), connections=["lite"], queries=["c_free"],
                  mask=[{"column": "secret.email", "action": "hash"}, {"column": "t.name", "action": "drop"}])
    items = {i["name"]: i for i in cat.get("/catalog", key=key).json["queries"]}
    assert items["c_secret"]["masking"] == {"masked": [{"column": "email", "action": "hash"}], "refused": None}
    assert items["c_films"]["masking"] == {"masked": [{"column": "name", "action": "drop"}], "refused": None}
    assert items["c_free"]["masking"]["masked"] == [] and items["c_free"]["masking"]["refused"]
    run = cat.get(q("c_secret"), key=key).json
    assert run[0]["email"] != "jane@example.com" and "name" not in cat.get(q("c_films"), key=key).json[0]
    # A caller without rules gets no masking field at all.
    plain = cat.key(uniq("plain"), connections=["lite"])
    assert all("masking" not in i for i in cat.get("/catalog", key=plain).json["queries"])


def test_catalog_can_write_follows_the_write_grant(make_server, uniq):
    s = make_server(env={"QAG_ALLOW_WRITES": "1"})
    s.query("w_insert", "INSERT INTO notes (body) VALUES ('x')", "lite")
    s.query("w_read", "SELECT 1 AS one", "lite")
    admin = {i["name"]: i["can_write"] for i in s.get("/catalog").json["queries"]}
    assert admin == {"w_insert": True, "w_read": True}
    key = s.key(uniq("w"), connections=[], queries=[{"name": "w_insert", "allow_writes": True}, "w_read"])
    assert {i["name"]: i["can_write"] for i in s.get("/catalog", key=key).json["queries"]} == \
        {"w_insert": True, "w_read": False}
    assert s.get("/catalog").json["caller"]["allow_writes"] is True


# --- table_ddl ------------------------------------------------------------------------------------------------

def _ddl(server, connection: str, table: str | None, key="admin"):
    params = {} if table is None else {"table": table}
    return server.get(f"/connections/{connection}/table_ddl", params=params, key=key)


def test_table_ddl_on_sqlite(server):
    reply = _ddl(server, "lite", "t")
    assert reply.status == 200 and reply.json == {
        "ddl": "CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT, action TEXT)"}
    assert _ddl(server, "lite", "secret").json["ddl"].startswith("CREATE TABLE secret")


@pytest.mark.parametrize("table", ["nope", "T", "main.t", "t'; DROP TABLE t; --", "t\x00", "sqlite_master",
                                   "x" * 3000])
def test_table_ddl_unknown_names_are_404_and_change_nothing(server, table):
    reply = _ddl(server, "lite", table)
    assert reply.status == 404 and reply.json["code"] == "table_not_found", reply
    assert _ddl(server, "lite", "t").status == 200
    assert server.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM t", "connection_name": "lite"}).json == \
        [{"n": 25}]


def test_table_ddl_refusals(server, uniq):
    assert _ddl(server, "lite", None).json["code"] == "table_required"
    assert _ddl(server, "lite", "").status == 400
    assert _ddl(server, "nope", "t").json["code"] == "connection_not_found"
    assert _ddl(server, "lite", "t", key=None).status == 401
    stranger = server.key(uniq("ddl"), connections=[], queries="*")
    reply = _ddl(server, "lite", "t", key=stranger)
    assert reply.status == 403 and reply.json["code"] == "connection_forbidden"


def test_table_ddl_a_forbidden_table_is_as_missing_as_an_unknown_one(server, uniq):
    key = server.key(uniq("ddl"), connections=["lite"], allowed_tables=["t"])
    assert _ddl(server, "lite", "t", key=key).status == 200
    assert _ddl(server, "lite", "T", key=key).status == 404   # the grant folds case; SQLite's catalog name is exact
    forbidden, unknown = _ddl(server, "lite", "secret", key=key), _ddl(server, "lite", "nosuch", key=key)
    assert forbidden.status == unknown.status == 404
    assert forbidden.json["code"] == unknown.json["code"] == "table_not_found"
    assert forbidden.json["error"] == "'secret' is not a table on 'lite'"
    assert "jane" not in forbidden.body.decode()


def _mysql_connection(server, mysql_db, prefix: str):
    """(connection name, admin connection, its cursor, database) for a MariaDB connection saved once per prefix."""
    name = f"{prefix}_{mysql_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "mysql", **mysql_db}).status == 201
    admin = mysql_admin()
    return name, admin, admin.cursor(), mysql_db["database"]


def test_table_ddl_on_mariadb_names_only_what_the_catalog_has(server, mysql_db, uniq):
    name, admin, cur, db = _mysql_connection(server, mysql_db, "myddl")
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.film (id INT PRIMARY KEY, title VARCHAR(20))")
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.`we``ird` (id INT)")
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.hidden (id INT)")
    try:
        film = _ddl(server, name, "film")
        assert film.status == 200 and film.json["ddl"].startswith("CREATE TABLE `film` (")
        assert "`title` varchar(20)" in film.json["ddl"]
        assert _ddl(server, name, "we`ird").json["ddl"].startswith("CREATE TABLE `we``ird`")
        for bad in ("nope", "film`; DROP TABLE film; --", "film' OR '1'='1", "mysql.user", f"{db}.film", "film ",
                    "\U0001F600", "film\U0001F600"):   # past U+FFFF: no utf8mb3 name (was a 500)
            reply = _ddl(server, name, bad)
            assert reply.status == 404 and reply.json["code"] == "table_not_found", (bad, reply)
        cur.execute("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = %s AND TABLE_NAME = 'film'",
                    (db,))
        assert cur.fetchone()[0] == 1
        key = server.key(uniq("myddl"), connections=[name], allowed_tables=["film"])
        assert _ddl(server, name, "film", key=key).status == 200
        assert _ddl(server, name, "hidden", key=key).json["code"] == "table_not_found"
    finally:
        cur.execute(f"DROP TABLE IF EXISTS `{db}`.film, `{db}`.`we``ird`, `{db}`.hidden")
        admin.close()


def test_table_ddl_of_a_view_shows_a_restricted_key_only_tables_it_may_read(server, mysql_db, uniq):
    """A view's DDL names the tables it reads, their columns and its filter's literals (and, on MySQL, its owner):
    a table-restricted key granted the view gets it only when every table the view reads is granted too, and
    never the DEFINER clause; the administrator gets it all."""
    name, admin, cur, db = _mysql_connection(server, mysql_db, "myview")
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.people (id INT PRIMARY KEY, email VARCHAR(40))")
    cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.salary (id INT PRIMARY KEY, amount INT)")
    cur.execute(f"CREATE OR REPLACE VIEW `{db}`.v_pub AS SELECT p.id FROM `{db}`.people p "
                f"JOIN `{db}`.salary s ON s.id = p.id WHERE s.amount > 100000 AND p.email <> 'ceo@corp.example'")
    cur.execute(f"CREATE OR REPLACE VIEW `{db}`.v_people AS SELECT id FROM `{db}`.people")
    try:
        view_only = server.key(uniq("vw"), connections=[name], allowed_tables=["v_pub", "v_people"])
        refused = _ddl(server, name, "v_pub", key=view_only)
        assert (refused.status, refused.json["code"]) == (403, "table_not_allowed"), refused
        assert "salary" not in refused.body.decode() and "ceo@" not in refused.body.decode()
        both = server.key(uniq("vw"), connections=[name], allowed_tables=["v_pub", "people", "salary"])
        shown = _ddl(server, name, "v_pub", key=both)
        assert shown.status == 200 and "salary" in shown.json["ddl"] and "DEFINER=" not in shown.json["ddl"]
        assert _ddl(server, name, "v_people", key=view_only).status == 403        # people isn't granted
        assert "DEFINER=" in _ddl(server, name, "v_pub").json["ddl"]             # the administrator's
    finally:
        cur.execute(f"DROP VIEW IF EXISTS `{db}`.v_pub, `{db}`.v_people")
        cur.execute(f"DROP TABLE IF EXISTS `{db}`.people, `{db}`.salary")
        admin.close()


def test_table_ddl_on_postgres_is_unsupported_naming_the_dialect(server, pg_db):
    name = f"pgddl_{pg_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db}).status == 201
    reply = _ddl(server, name, "t")
    assert reply.status == 400 and reply.json["code"] == "unsupported_operation"
    assert "'postgres'" in reply.json["error"]
    assert _ddl(server, name, None).json["code"] == "table_required"


def test_schema_of_another_database_refuses_a_nul_in_its_name(server, pg_db):
    # libpq's connection string ends at a NUL: `<db>%00x` read the schema of <db> (and `a%00b` of a database `a`).
    name = f"pgnul_{pg_db['database']}"
    if server.get(f"/api/v1/connections/{name}").status == 404:
        assert server.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db}).status == 201
    for path in (f"/api/v1/connections/{name}/schema", f"/connections/{name}/schema"):
        assert server.get(path, params={"database": pg_db["database"]}).status == 200
        for database in (pg_db["database"] + "\x00x", "\x00", "a\x00b"):
            r = server.get(path, params={"database": database})
            assert r.status == 400 and r.json["code"] == "invalid_text", (path, database, r)
