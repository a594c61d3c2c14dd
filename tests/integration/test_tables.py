"""Table allow-lists over HTTP (contract 6.2, B6.6-B6.11) against real SQLite, MariaDB and PostgreSQL."""

from __future__ import annotations

import time

import pytest

from tests.server import q
from tests.services import mysql_admin, pg_admin

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def sql(server, key, statement, connection="lite", **body):
    return server.post("/execute_sql", {"sql": statement, "connection_name": connection, **body}, key=key)


# ---------------------------------------------------------------------------------------------- SQLite

def test_b6_6_sqlite_reads_and_writes(server, writes_server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    assert sql(server, key, "SELECT * FROM t").status == 200
    r = sql(server, key, "SELECT * FROM secret")
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
    assert r.json["error"] == "This API key may only query these tables: main.t. Forbidden: main.secret."
    upper = server.key(uniq("k"), connections=["lite"], allowed_tables=["T"])
    assert sql(server, upper, "SELECT * FROM t").status == 200
    assert sql(server, upper, "SELECT * FROM main.T").status == 200

    wkey = writes_server.key(uniq("k"), connections=["lite"], allowed_tables=["t"], allow_writes=True)
    r = sql(writes_server, wkey, "DELETE FROM secret")
    assert r.status == 403 and r.json["code"] == "table_not_allowed" and "main.secret" in r.json["error"]
    assert sql(writes_server, wkey, "DELETE FROM t WHERE id = 25").status == 200
    r = sql(writes_server, wkey, "INSERT INTO t (id, name) SELECT 100, email FROM secret")
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
    assert writes_server.post("/execute_sql", {"sql": "SELECT count(*) AS n FROM secret",
                                               "connection_name": "lite"}).json == [{"n": 1}]


def test_b6_7_malformed_allowed_tables(server, uniq):
    for bad in ("t", 123, [1, 2], [""], ["t", None]):
        r = server.post("/api/v1/api-keys", {"name": uniq("k"), "allowed_tables": bad})
        assert r.status == 400 and r.json["code"] == "invalid_body", bad
    for bad in ("f", [1], [""]):
        r = server.post("/api/v1/api-keys", {"name": uniq("k"), "allowed_functions": bad})
        assert r.status == 400 and r.json["code"] == "invalid_body", bad


def test_allowed_functions_is_a_grant_field(server, uniq):
    name = uniq("k")
    r = server.post("/api/v1/api-keys", {"name": name, "allowed_tables": ["t"], "allowed_functions": ["My_F", "g"]})
    assert r.status == 201 and r.json["allowed_functions"] == ["g", "my_f"]
    assert server.get(f"/api/v1/api-keys/{name}").json["allowed_functions"] == ["g", "my_f"]
    patched = server.request("PATCH", f"/api/v1/api-keys/{name}", body={"allowed_functions": None})
    assert patched.status == 200 and patched.json["allowed_functions"] is None
    role = uniq("r")
    assert server.post("/api/v1/roles", {"name": role, "allowed_functions": ["h"]}).json["allowed_functions"] == ["h"]
    assert server.post("/api/v1/api-keys", {"name": uniq("k")}).json["allowed_functions"] is None


def test_b6_9_cte_named_like_a_table(server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    r = sql(server, key, "WITH secret AS (SELECT * FROM secret) SELECT * FROM secret")
    assert r.status == 403 and r.json["error"].endswith("Forbidden: main.secret.")
    assert sql(server, key, "WITH secret AS (SELECT id FROM t) SELECT * FROM secret").status == 200
    r = sql(server, key, "WITH x AS (SELECT 1) SELECT * FROM x, main.secret")
    assert r.status == 403 and r.json["error"].endswith("Forbidden: main.secret.")
    assert sql(server, key, "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) "
                            "SELECT * FROM n").status == 200


def test_b6_10_statements_that_cant_be_checked(server, writes_server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    # Without write permission PRAGMA and SET are writes and fail earlier (the guard comes first).
    assert sql(server, key, "PRAGMA table_info(t)").json["code"] == "read_only"
    wkey = writes_server.key(uniq("k"), connections=["lite"], allowed_tables=["t"], allow_writes=True)
    message = ("This API key may only query its allowed tables - this kind of statement doesn't name the tables "
               "it reads in a way that can be checked, so it isn't allowed")
    for statement in ("SHOW CREATE TABLE secret", "PRAGMA table_info(x)", "SET search_path = billing",
                      "EXPLAIN EXPLAIN SELECT 1", "SELECT * FROM t WHERE", "VACUUM", "CREATE TABLE z (a)"):
        r = sql(writes_server, wkey, statement)
        assert r.status == 403 and r.json["code"] == "table_check_failed", (statement, r.json)
        assert r.json["error"] == message
    # The engine's catalog is a table outside the grants (contract 6.2): named like any other.
    for statement, name in (("SELECT * FROM sqlite_master", "main.sqlite_master"),
                            ("SELECT * FROM pragma_table_info('secret')", "main.pragma_table_info"),
                            ("SELECT name FROM (SELECT name FROM sqlite_schema)", "main.sqlite_schema")):
        r = sql(writes_server, wkey, statement)
        assert r.status == 403 and r.json["code"] == "table_not_allowed", (statement, r.json)
        assert r.json["error"] == f"This API key may only query these tables: main.t. Forbidden: {name}."


def test_b6_11_explain(server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    r = sql(server, key, "EXPLAIN SELECT * FROM secret")
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
    assert sql(server, key, "EXPLAIN QUERY PLAN SELECT * FROM t").status == 200


def test_functions_for_a_restricted_key(server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    for statement, name in (("SELECT load_extension('x')", "load_extension"), ("SELECT readfile('/etc/passwd')",
                                                                                 "readfile"),
                            ("SELECT my_udf(id) FROM t", "my_udf")):
        r = sql(server, key, statement)
        assert r.status == 403 and r.json["code"] == "function_not_allowed" and f"{name}()" in r.json["error"]
    assert sql(server, key, "SELECT lower(name), length(name), count(*) FROM t GROUP BY 1, 2").status == 200
    assert sql(server, key, "SELECT value FROM json_each('[1,2]')").status == 200
    assert sql(server, key, "SELECT * FROM generate_series(1, 3)").status in (200, 500)  # extension may be absent


def test_saved_query_order_and_cache(server, writes_server, uniq):
    name = uniq("tq")
    server.query(name, "SELECT id FROM t WHERE id = :id UNION SELECT id FROM secret", "lite")
    key = server.key(uniq("k"), queries=[name], allowed_tables=["t"])
    for _ in range(3):                       # warm calls answer the same
        r = server.get(q(name) + "?id=1", key=key)
        assert r.status == 403 and r.json["code"] == "table_not_allowed"
    # The guard comes first: a write by a key without write permission is read_only, not a table refusal.
    wname = uniq("tw")
    writes_server.query(wname, "DELETE FROM secret", "lite")
    wkey = writes_server.key(uniq("k"), queries=[wname], allowed_tables=["t"], allow_writes=True,
                             allowed_write_ops=["insert"])
    assert writes_server.get(q(wname), key=wkey).json["code"] == "write_op_not_allowed"
    rkey = writes_server.key(uniq("k"), queries=[wname], allowed_tables=["t"])
    assert writes_server.get(q(wname), key=rkey).json["code"] == "read_only"


def test_schema_route_lists_only_allowed_tables(make_server, uniq):
    s = make_server(seed=False)
    s.sqlite_db("fk.db", "CREATE TABLE parent (id INTEGER PRIMARY KEY); CREATE TABLE hidden (id INTEGER PRIMARY KEY);"
                         "CREATE TABLE child (id INTEGER, p INTEGER REFERENCES parent(id), h INTEGER REFERENCES "
                         "hidden(id));")
    s.connection("fk", "fk.db")
    key = s.key(uniq("k"), connections=["fk"], allowed_tables=["child", "PARENT"])
    body = s.get("/connections/fk/schema", key=key).json
    assert sorted(t["name"] for t in body["tables"]) == ["child", "parent"]
    child = next(t for t in body["tables"] if t["name"] == "child")
    fks = {c["name"]: c["foreign_key"] for c in child["columns"]}
    assert fks["p"] == {"table": "parent", "column": "id"} and fks["h"] is None
    admin = s.get("/connections/fk/schema").json
    assert len(admin["tables"]) == 3


def test_sqlite_names_are_compared_as_sqlite_compares_them(server, uniq):
    # SQLite folds ASCII letters alone: "Ärger" and "\u212Aeys" (the Kelvin sign) are other tables than ärger
    # and keys, on every route; a grant keeps its non-ASCII case (Ärger is Ärger).
    name = uniq("names")
    server.sqlite_db(f"{name}.db", 'CREATE TABLE "ärger"(v); CREATE TABLE "Ärger"(v); CREATE TABLE keys(v); '
                                   'CREATE TABLE "\u212Aeys"(v); INSERT INTO "Ärger" VALUES (\'other\'); '
                                   'INSERT INTO "\u212Aeys" VALUES (\'kelvin\');')
    server.connection(name, f"{name}.db")
    key = server.key(uniq("k"), connections=[name], allowed_tables=["ärger", "keys"])
    for statement in ('SELECT * FROM "Ärger"', 'SELECT * FROM "\u212Aeys"'):
        r = sql(server, key, statement, name)
        assert r.status == 403 and r.json["code"] == "table_not_allowed", (statement, r)
    assert sql(server, key, 'SELECT count(*) AS n FROM "ärger", KEYS', name).json == [{"n": 0}]
    body = server.get(f"/connections/{name}/schema", key=key).json
    assert sorted(t["name"] for t in body["tables"]) == ["keys", "ärger"]
    for table in ("Ärger", "\u212Aeys"):
        r = server.get(f"/connections/{name}/table_ddl", key=key, params={"table": table})
        assert r.status == 404 and r.json["code"] == "table_not_found", (table, r)
    upper = server.key(uniq("k"), connections=[name], allowed_tables=["Ärger"])
    assert sql(server, upper, 'SELECT v FROM "Ärger"', name).json == [{"v": "other"}]
    r = sql(server, upper, 'SELECT v FROM "ärger"', name)
    assert r.status == 403 and r.json["code"] == "table_not_allowed", r

def test_parser_stress_is_refused_fast(server, uniq):
    key = server.key(uniq("k"), connections=["lite"], allowed_tables=["t"])
    statements = [
        "SELECT id FROM t WHERE id IN (" + ",".join(["1"] * 250_000) + ")",               # about 1 MB
        " UNION ALL ".join(["SELECT id FROM t"] * 3000),
        "SELECT " + "(" * 3000 + "1" + ")" * 3000,
        "SELECT * FROM " + "(SELECT * FROM " * 500 + "t" + ") x" * 500,
        "SELECT * FROM t WHERE " + " AND ".join(f"id <> {i}" for i in range(4000)),
    ]
    for statement in statements:
        started = time.monotonic()
        r = sql(server, key, statement)
        # Over 100,000 characters the guard doesn't read a statement at all (read_only for a reader).
        expected = "read_only" if len(statement) > 100_000 else "table_check_failed"
        assert r.status == 403 and r.json["code"] == expected, (len(statement), r)
        assert time.monotonic() - started < 10
    assert sql(server, key, "SELECT count(*) AS n FROM t").json == [{"n": 25}]


# ---------------------------------------------------------------------------------------------- MariaDB

@pytest.fixture(scope="module")
def my(server, mysql_db):
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        db = mysql_db["database"]
        cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.customer (id INT PRIMARY KEY, name TEXT)")
        cur.execute(f"CREATE TABLE IF NOT EXISTS `{db}`.secret (id INT PRIMARY KEY)")
        cur.execute(f"REPLACE INTO `{db}`.customer VALUES (1, 'ann')")
        admin.commit()
    finally:
        admin.close()
    name = f"my_tables_{db}"
    r = server.post("/api/v1/connections", {"name": name, "db": "mysql", **mysql_db})
    assert r.status in (201, 409), r
    yield name, db
    # The database is the session's: other modules create their own `customer` in it.
    admin = mysql_admin()
    try:
        cur = admin.cursor()
        cur.execute("SET SESSION lock_wait_timeout = 60")
        cur.execute(f"DROP TABLE IF EXISTS `{db}`.customer, `{db}`.secret")
    finally:
        admin.close()


def test_b6_8_mysql_default_database(server, my, uniq):
    connection, db = my
    key = server.key(uniq("k"), connections=[connection], allowed_tables=["customer"])
    assert sql(server, key, "SELECT * FROM customer", connection).json == [{"id": 1, "name": "ann"}]
    assert sql(server, key, f"SELECT * FROM `{db}`.customer", connection).status == 200
    # This server compares names exactly (lower_case_table_names=0): the upper-case spelling is another
    # database and table, never the granted one.
    r = sql(server, key, f"SELECT * FROM {db.upper()}.CUSTOMER c", connection)
    assert r.status == 403 and r.json["code"] == "table_not_allowed" and f"{db.upper()}.CUSTOMER" in r.json["error"]
    r = sql(server, key, "SELECT * FROM billing.customer", connection)
    assert r.status == 403 and r.json["code"] == "table_not_allowed"
    assert r.json["error"] == (f"This API key may only query these tables: {db.lower()}.customer. "
                               "Forbidden: billing.customer.")
    for statement in ("SELECT * FROM information_schema.tables", "SELECT * FROM mysql.user"):
        r = sql(server, key, statement, connection)
        assert r.status == 403 and r.json["code"] == "table_not_allowed", (statement, r.json)
    r = sql(server, key, "SHOW TABLES", connection)
    assert r.status == 403 and r.json["code"] in ("table_check_failed", "read_only"), r.json
    # DESCRIBE (MySQL's EXPLAIN of a table too) is checked as a read of its table (6.2 lists it among the
    # statements whose tables can be checked): the granted table's shape, not another's.
    for statement in ("DESCRIBE customer", "EXPLAIN customer", f"DESC `{db}`.customer id"):
        r = sql(server, key, statement, connection)
        assert r.status == 200 and r.json and r.json[0]["Field"] == "id", (statement, r.json)
    for statement in ("DESCRIBE secret", "EXPLAIN secret", "DESC billing.customer"):
        r = sql(server, key, statement, connection)
        assert r.status == 403 and r.json["code"] == "table_not_allowed", (statement, r.json)
    for statement in ("SELECT SLEEP(1)", "SELECT LOAD_FILE('/etc/passwd')"):
        assert sql(server, key, statement, connection).json["code"] == "function_not_allowed", statement
    # A named lock is a write for every read-only caller: the guard refuses it before the tables.
    assert sql(server, key, "SELECT GET_LOCK('x', 1)", connection).json["code"] == "read_only"
    r = sql(server, key, "WITH customer AS (SELECT 1) SELECT * FROM customer, billing.customer", connection)
    assert r.status == 403 and r.json["error"].endswith("Forbidden: billing.customer.")
    assert sql(server, key, "SELECT * FROM customer WHERE name = '\\' , (SELECT 1 FROM secret) -- '",
               connection).json["code"] == "table_not_allowed"


# ---------------------------------------------------------------------------------------------- PostgreSQL

@pytest.fixture(scope="module")
def pg(server, pg_db):
    admin = pg_admin(pg_db["database"])
    try:
        cur = admin.cursor()
        user = pg_db["user"]
        cur.execute(f'CREATE SCHEMA IF NOT EXISTS billing AUTHORIZATION "{user}"')
        cur.execute("CREATE TABLE IF NOT EXISTS public.customer (id int PRIMARY KEY, name text)")
        cur.execute("CREATE TABLE IF NOT EXISTS billing.customer (id int PRIMARY KEY, name text)")
        cur.execute("CREATE TABLE IF NOT EXISTS public.secret (id int)")
        cur.execute("INSERT INTO public.customer VALUES (1, 'public') ON CONFLICT DO NOTHING")
        cur.execute("INSERT INTO billing.customer VALUES (2, 'billing') ON CONFLICT DO NOTHING")
        cur.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public, billing TO "{user}"')
        admin.commit()
    finally:
        admin.close()
    plain, billing = f"pg_tables_{pg_db['database']}", f"pg_billing_{pg_db['database']}"
    for name, options in ((plain, {}), (billing, {"options": {"schema": "billing"}})):
        r = server.post("/api/v1/connections", {"name": name, "db": "postgres", **pg_db, **options})
        assert r.status in (201, 409), r
    yield plain, billing
    # The database is the session's: other modules list its tables and expect `public` alone.
    admin = pg_admin(pg_db["database"])
    try:
        cur = admin.cursor()
        cur.execute("SET lock_timeout = '60s'")
        cur.execute("DROP SCHEMA billing CASCADE")
        cur.execute("DROP TABLE IF EXISTS public.customer, public.secret")
        admin.commit()
    finally:
        admin.close()


def test_postgres_index_maintenance_is_a_write(server, pg, pg_db, uniq):
    """BRIN and GIN maintenance functions change the index in a read-only transaction, and the ROLLBACK keeps
    it: a write for every caller, and denied to table-restricted keys whatever allowed_functions says."""
    plain, _ = pg
    table = uniq("brin")
    admin = pg_admin(pg_db["database"])
    try:
        cur = admin.cursor()
        cur.execute(f"CREATE TABLE {table} (id int, tags int[])")
        cur.execute(f"CREATE INDEX {table}_b ON {table} USING brin (id) WITH (pages_per_range = 1, autosummarize = off)")
        cur.execute(f"CREATE INDEX {table}_g ON {table} USING gin (tags) WITH (fastupdate = on)")
        cur.execute(f"INSERT INTO {table} SELECT g, ARRAY[g] FROM generate_series(1, 2000) g")
        cur.execute(f'GRANT SELECT ON {table} TO "{pg_db["user"]}"')
        admin.commit()
        anyone = server.key(uniq("k"), connections=[plain])
        restricted = server.key(uniq("k"), connections=[plain], allowed_tables=[table],
                                allowed_functions=["brin_summarize_new_values"])
        for call in (f"brin_summarize_new_values('{table}_b')", f"gin_clean_pending_list('{table}_g')",
                     f"brin_desummarize_range('{table}_b', 0)"):
            r = sql(server, anyone, f"SELECT {call} AS n", plain)
            assert r.status == 403 and r.json["code"] == "read_only", (call, r)
        # written as a field of a value (attribute notation), the same calls
        for call in (f"('{table}_b'::regclass).brin_summarize_new_values", "(1).pg_cancel_backend"):
            r = sql(server, anyone, f"SELECT {call} AS n", plain)
            assert r.status == 403 and r.json["code"] == "read_only", (call, r)
            r = sql(server, restricted, f"SELECT {call} AS n FROM {table} LIMIT 1", plain)
            assert r.status == 403 and r.json["code"] in ("read_only", "function_not_allowed"), (call, r)
        cur.execute(f"SELECT brin_summarize_new_values('{table}_b')")
        assert cur.fetchone()[0] > 0          # nothing was summarized by the callers above
        admin.rollback()
    finally:
        admin.cursor().execute(f"DROP TABLE IF EXISTS {table}")
        admin.commit()
        admin.close()


def test_postgres_tables_and_search_path(server, pg, uniq):
    plain, billing = pg
    key = server.key(uniq("k"), connections=[plain, billing], allowed_tables=["customer"])
    assert sql(server, key, "SELECT name FROM customer", plain).json == [{"name": "public"}]
    # The connection's schema option: the bare grant means billing.customer, and search_path is pinned to it.
    assert sql(server, key, "SELECT name FROM customer", billing).json == [{"name": "billing"}]
    r = sql(server, key, "SELECT name FROM public.customer", billing)
    assert r.status == 403 and r.json["error"] == ("This API key may only query these tables: billing.customer. "
                                                   "Forbidden: public.customer.")
    for statement in ("SELECT * FROM pg_class", "SELECT * FROM pg_catalog.pg_roles",
                      "SELECT * FROM information_schema.tables"):
        r = sql(server, key, statement, plain)
        assert r.status == 403 and r.json["code"] == "table_not_allowed", (statement, r.json)
    r = sql(server, key, "SET search_path = billing", plain)
    assert r.status == 403 and r.json["code"] in ("table_check_failed", "read_only"), r.json
    for statement in ("SELECT pg_sleep(1)", "SELECT pg_read_file('/etc/passwd')",
                      "SELECT set_config('search_path', 'billing', true)"):
        r = sql(server, key, statement, plain)
        assert r.json["code"] == "function_not_allowed", (statement, r.json)
    # A sequence advanced, or SQL text run by a function (whatever it calls), is a write for every read-only
    # caller: the guard refuses it before the tables.
    r = sql(server, key, "SELECT nextval('s')", plain)
    assert r.status == 403 and r.json["code"] == "read_only" and "nextval()" in r.json["error"]
    r = sql(server, key, "SELECT query_to_xml('select * from secret', true, true, '')", plain)
    assert r.status == 403 and r.json["code"] == "read_only" and "query_to_xml()" in r.json["error"]
    r = sql(server, key, "SELECT * FROM pg_read_file('/etc/passwd') f", plain)
    assert r.status == 403 and r.json["code"] == "table_not_allowed" and "pg_read_file()" in r.json["error"]
    assert sql(server, key, "SELECT g FROM generate_series(1, 2) g", plain).json == [{"g": 1}, {"g": 2}]
    r = sql(server, key, 'WITH "Customer" AS (SELECT 1 AS id) SELECT * FROM secret, "Customer"', plain)
    assert r.json["error"].endswith("Forbidden: public.secret.")
    streamed = server.post("/execute_sql?stream=true&format=ndjson",
                           {"sql": "SELECT name FROM customer", "connection_name": billing}, key=key)
    assert streamed.status == 200 and b"billing" in streamed.body
