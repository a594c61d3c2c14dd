"""Issue 18, items 2 and 3, through the real HTTP API against real SQLite, MariaDB and PostgreSQL.

Item 3: functions are allowed by what they resolve to. The fixtures define user functions with built-in names in
the connection's own schema (PostgreSQL `public.length(integer)`, `public.lower(anyelement)`,
`public.json_each(text)`, `public.leakrec(customers)` and `public.leakrecord(record)` (called as fields of a
row), and `other.peek()` in another schema; MariaDB stored `regexp_like`, `array_agg`,
`lower`), each returning the secret `S3CRET` from a table no key is granted. Item 2: the engine's statistics,
catalogs, diagnostics, settings and activity are refused to table-restricted and masked keys, and so are the
names PostgreSQL looks up in its catalog (casts to regclass and the other reg* types, to_regclass, has_*_privilege,
format_type, a table's row type), which tell whether a table exists (`plans`, whose column is `S3CRET_margin`;
`S3CRET_archive`); the database's own enums, domains and composite types that are no relation's row type stay
allowed (the connection's catalog lists them).

Every case of a kind the engine really answers with the secret has a `plain` premise case (an unrestricted,
unmasked key gets `S3CRET`), so a refusal can't pass because the fixture is harmless. Cases:
tests/cases/functions/<dialect>.tsv and tests/cases/side_channels/<dialect>.tsv (README.md beside them).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server import Server
from tests.services import make_mysql_database, make_pg_database, mysql_admin, pg_admin

pytestmark = [pytest.mark.e2e, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CASES = Path(__file__).resolve().parents[1] / "cases"
SECRET = "S3CRET"
MASK = [{"column": "customers.email", "action": "hash"}]
GRANTED = ["length", "other.peek", "current_setting", "pg_read_file", "regexp_like", "load_file", "@@version",
           "to_regclass", "regclass"]
DIALECTS = ("postgres", "mysql", "sqlite")
KINDS = ("functions", "side_channels")

_PG_SETUP = [
    "CREATE TABLE customers (id int PRIMARY KEY, email text, name text)",
    "INSERT INTO customers SELECT g, CASE WHEN g <= 40 THEN 'S3CRET@example.com' ELSE 'a' || g || '@x.org' END, "
    "'name' || g FROM generate_series(1, 100) g",
    "CREATE TABLE vault (v text)",
    "INSERT INTO vault VALUES ('S3CRET')",
    # Tables whose names are the secret: a name the engine looks up in its catalog (a cast to regclass, a table's
    # row type, format_type of an OID) shows whether they exist and what they hold
    'CREATE TABLE plans ("S3CRET_margin" numeric)',
    'CREATE TABLE "S3CRET_archive" (id int)',
    "CREATE FUNCTION public.length(integer) RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    "CREATE FUNCTION public.lower(anyelement) RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    "CREATE FUNCTION public.json_each(text) RETURNS SETOF text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    "CREATE FUNCTION public.reader() RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    # Called as a field of a row (c.leakrec is leakrec(c) when customers has no such column)
    "CREATE FUNCTION public.leakrec(customers) RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    "CREATE FUNCTION public.leakrecord(record) RETURNS text LANGUAGE plpgsql AS "
    "$$ BEGIN RETURN (SELECT v FROM vault); END $$",
    # Named like the SQL/JSON constructs of newer servers' grammar (pglast reads PostgreSQL 18's): PostgreSQL 15
    # calls these for json_value('x', 'y') and the rest, and for json_object('a', 'b') over pg_catalog's
    # json_object(text[]), a worse match for two text arguments
    *(f"CREATE FUNCTION public.{name}({args}) RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$"
      for name, args in (("json_value", "text, text"), ("json_query", "text, text"), ("json_exists", "text, text"),
                         ("json_scalar", "integer"), ("json_serialize", "text"), ("json", "text"),
                         ("json_array", "text, text"), ("json_arrayagg", "text"), ("json_object", "text, text"),
                         ("merge_action", ""))),
    "CREATE SCHEMA other",
    "CREATE FUNCTION other.peek() RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$",
    # The database's own types that are no relation's row type (a restricted key may name them), an enum named like
    # a table in a schema off the search_path, and one named like a catalog (whose row type pg_catalog, first on the
    # call's search_path, finds before it)
    "CREATE TYPE order_status AS ENUM ('placed', 'shipped')",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE TYPE pair AS (a int, b text)",
    "CREATE TYPE other.plans AS ENUM ('placed')",
    "CREATE TYPE public.pg_database AS ENUM ('placed')",
    # ... and types that show a relation's columns or run a function of the database's when cast to
    "CREATE VIEW plans_view AS SELECT * FROM plans",
    "CREATE MATERIALIZED VIEW plans_mv AS SELECT * FROM plans",
    "CREATE SEQUENCE plans_seq",
    "CREATE TYPE wrap AS (p plans)",
    "CREATE FUNCTION public.approves(text) RETURNS bool LANGUAGE sql AS $$ SELECT v IS NOT NULL FROM vault $$",
    "CREATE DOMAIN approved AS text CHECK (approves(VALUE))",
    # ... and types whose text is read as a catalog name: a domain over regclass, a composite type holding one
    "CREATE DOMAIN objname AS regclass",
    "CREATE TYPE holder AS (r regclass)",
    # an operator is a call of its function: a new name, an overload of a built-in's name, and a cast of the
    # database's own code
    "CREATE FUNCTION public.peek_op(int, int) RETURNS text LANGUAGE sql STABLE AS $$ SELECT v FROM vault $$",
    "CREATE OPERATOR public.##> (LEFTARG = int, RIGHTARG = int, FUNCTION = public.peek_op)",
    "CREATE FUNCTION public.peek_xor(int, text) RETURNS text LANGUAGE sql STABLE AS $$ SELECT v FROM vault $$",
    "CREATE OPERATOR public.# (LEFTARG = int, RIGHTARG = text, FUNCTION = public.peek_xor)",
    "CREATE TYPE wtyp AS (a int)",
    "CREATE FUNCTION public.wtyp_text(wtyp) RETURNS text LANGUAGE sql STABLE AS $$ SELECT v FROM vault $$",
    "CREATE CAST (wtyp AS text) WITH FUNCTION public.wtyp_text(wtyp)",
    "ANALYZE customers",
]
_MYSQL_SETUP = [
    "CREATE TABLE customers (id INT PRIMARY KEY, email VARCHAR(64), name VARCHAR(64), KEY by_email (email))",
    "INSERT INTO customers SELECT seq, IF(seq <= 40, 'S3CRET@example.com', CONCAT('a', seq, '@x.org')), "
    "CONCAT('name', seq) FROM seq_1_to_100",
    "CREATE TABLE vault (v TEXT)",
    "INSERT INTO vault VALUES ('S3CRET')",
    "CREATE FUNCTION regexp_like(a TEXT, b TEXT) RETURNS TEXT READS SQL DATA RETURN (SELECT v FROM vault)",
    "CREATE FUNCTION array_agg(a TEXT) RETURNS TEXT READS SQL DATA RETURN (SELECT v FROM vault)",
    "CREATE FUNCTION lower(a TEXT) RETURNS TEXT READS SQL DATA RETURN (SELECT v FROM vault)",
    "CREATE FUNCTION reader() RETURNS TEXT READS SQL DATA RETURN (SELECT v FROM vault)",
    "ANALYZE TABLE customers PERSISTENT FOR ALL",
]
_SQLITE_SETUP = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, email TEXT, name TEXT);
CREATE INDEX by_email ON customers (email);
WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 100)
INSERT INTO customers SELECT n, CASE WHEN n <= 40 THEN 'S3CRET@example.com' ELSE 'a' || n || '@x.org' END,
       'name' || n FROM g;
CREATE TABLE vault (v TEXT);
INSERT INTO vault VALUES ('S3CRET');
ANALYZE;
"""


def cases():
    for kind in KINDS:
        for dialect in DIALECTS:
            path = CASES / kind / f"{dialect}.tsv"
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if not line.strip() or line.startswith("#"):
                    continue
                name, key, expect, statement = line.split("\t")
                assert key in ("admin", "plain", "restricted", "granted", "masked", "masked_granted"), (path, number)
                assert expect in ("ok", "leak") or expect.isidentifier(), (path, number)
                yield pytest.param(dialect, key, expect, statement, id=f"{kind}/{dialect}/{name}")


@pytest.fixture(scope="module")
def pg_db():
    fields, cleanup = make_pg_database()
    for statement in _PG_SETUP:
        _pg_owner(fields, statement)
    admin = pg_admin()
    admin.cursor().execute(f'ALTER DATABASE "{fields["database"]}" SET qag.secret = \'S3CRET\'')
    admin.close()
    yield fields
    cleanup()


@pytest.fixture(scope="module")
def mysql_db():
    fields, cleanup = make_mysql_database()
    admin = mysql_admin()
    cur = admin.cursor()
    cur.execute(f"USE `{fields['database']}`")
    for statement in _MYSQL_SETUP:
        cur.execute(statement)
        if cur.description:
            cur.fetchall()
    cur.execute(f"GRANT SELECT ON mysql.column_stats TO '{fields['user']}'@'%'")
    admin.close()
    yield fields
    cleanup()


@pytest.fixture(scope="module")
def srv(pg_db, mysql_db):
    s = Server(workers=1)
    s.sqlite_db("side.db", _SQLITE_SETUP)
    s.connection("sqlite", "side.db")
    for name, fields in (("mysql", mysql_db), ("postgres", pg_db)):
        reply = s.post("/api/v1/connections", {"name": name, "db": name, **fields})
        assert reply.status == 201, reply
    s.keys = {
        "admin": "admin",
        "plain": s.key("plain", connections="*"),
        "restricted": s.key("restricted", connections="*", allowed_tables=["customers"]),
        "granted": s.key("granted", connections="*", allowed_tables=["customers"], allowed_functions=GRANTED),
        "masked": s.key("masked", connections="*", mask=MASK),
        "masked_granted": s.key("masked_granted", connections="*", mask=MASK, allowed_functions=["reader"]),
    }
    s.databases = {"postgres": pg_db["database"], "mysql": mysql_db["database"], "sqlite": "main"}
    yield s
    s.close()


@pytest.mark.parametrize("dialect,key,expect,statement", list(cases()))
def test_case(srv, dialect, key, expect, statement):
    statement = statement.replace("{db}", srv.databases[dialect])
    r = srv.post("/execute_sql", {"sql": statement, "connection_name": dialect}, key=srv.keys[key])
    if expect == "leak":
        assert r.status == 200 and SECRET.encode() in r.body, r
    elif expect == "ok":
        assert r.status == 200 and SECRET.encode() not in r.body, r
    else:
        assert r.status == 403 and r.json["code"] == expect, r
        assert SECRET not in r.json["error"], r
    # Nothing is lost: the next good request by the same key succeeds.
    follow = srv.post("/execute_sql", {"sql": "SELECT id FROM customers WHERE id = 1", "connection_name": dialect},
                      key=srv.keys[key])
    assert follow.status == 200 and follow.json == [{"id": 1}], follow


def _pg_owner(fields: dict, statement: str) -> None:
    import psycopg2
    conn = psycopg2.connect(host=fields["host"], port=fields["port"], user=fields["user"],
                            password=fields["password"], dbname=fields["database"])
    conn.autocommit = True
    conn.cursor().execute(statement)
    conn.close()


def test_the_catalog_is_kept_and_read_again_when_connections_change(srv, pg_db):
    """The PostgreSQL catalog of function names is kept with the backend's schema cache (so a function created
    after it was read is not seen until it is read again: 60 s at most, 45 s in the background); a change to the
    connections clears the cache, and the new overload is then seen and refused."""
    key = srv.keys["restricted"]
    body = {"sql": "SELECT initcap(name) AS v FROM customers WHERE id = 1", "connection_name": "postgres"}
    assert srv.post("/execute_sql", body, key=key).status == 200
    _pg_owner(pg_db, "CREATE FUNCTION public.initcap(integer) RETURNS text LANGUAGE sql AS $$ SELECT v FROM vault $$")
    try:
        premise = srv.post("/execute_sql", dict(body, sql="SELECT initcap(5) AS v"), key=srv.keys["plain"])
        assert premise.status == 200 and SECRET.encode() in premise.body, premise
        assert srv.post("/execute_sql", body, key=key).status == 200       # the cached catalog, still warm
        reply = srv.post("/api/v1/connections", {"name": "postgres2", "db": "postgres", **pg_db})
        assert reply.status == 201, reply
        for name in ("postgres", "postgres2"):
            refused = srv.post("/execute_sql", dict(body, connection_name=name), key=key)
            assert refused.status == 403 and refused.json["code"] == "function_not_allowed", refused
            assert "initcap" in refused.json["error"]
    finally:
        _pg_owner(pg_db, "DROP FUNCTION IF EXISTS public.initcap(integer)")
        srv.request("DELETE", "/api/v1/connections/postgres2", body={"reason": "the test is over"})


# Text search's functions read their configuration (regconfig) or dictionary (regdictionary) by name: no table,
# and the way full-text search is written (to_tsvector('english', body)), so they stay allowed.
_TEXT_SEARCH_TYPES = frozenset(("regconfig", "regdictionary"))


def test_the_servers_own_name_lookups_are_side_channels(pg_db):
    """By the server's catalog, not by the hand lists alone: every pg_catalog function with a parameter or a
    result of a name-resolving type (regclass, ..., aclitem; text search's configuration and dictionary aside)
    is denied or a side channel, and every type of pg_catalog but the catalogs' row types is one of the engine's
    own (PG_TYPES), so casting to it is never judged as a table."""
    from qag.sql import functions
    admin = pg_admin(pg_db["database"])
    try:
        cur = admin.cursor()
        cur.execute("""SELECT p.proname, array_agg(DISTINCT t.typname)
                       FROM pg_proc p CROSS JOIN LATERAL unnest(p.proargtypes::oid[] || p.prorettype) a(oid)
                       JOIN pg_type t ON t.oid = a.oid
                       WHERE p.pronamespace = 'pg_catalog'::regnamespace AND t.typname = ANY(%s)
                       GROUP BY 1""", (sorted(functions.RESOLVING_TYPES),))
        lookups = cur.fetchall()
        cur.execute("""SELECT t.typname FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem
                       WHERE t.typnamespace = 'pg_catalog'::regnamespace AND t.typrelid = 0
                       AND coalesce(e.typrelid, 0) = 0""")      # no row type, nor an array of one
        types = {name for (name,) in cur.fetchall()}
    finally:
        admin.close()
    assert len(lookups) > 50, lookups           # the reg* types' own functions, to_regclass, pg_relation_size, ...
    missed = sorted(name for name, used in lookups
                    if not (functions.denied(name, "postgres") or functions.side_channel(name, "postgres"))
                    and not set(used) <= _TEXT_SEARCH_TYPES)
    assert missed == [], missed
    assert all(functions.pg_builtin_type((name,)) for name in types), sorted(
        name for name in types if not functions.pg_builtin_type((name,)))


def test_a_list_of_oids_is_named_only_for_keys_that_may_see_the_catalog(srv, pg_db):
    """oidvectortypes names the types of a list of OIDs, and every table has a row type of its name: the OIDs
    around a table's show it (as format_type's do)."""
    import psycopg2
    conn = psycopg2.connect(host=pg_db["host"], port=pg_db["port"], user=pg_db["user"], password=pg_db["password"],
                            dbname=pg_db["database"])
    cur = conn.cursor()
    cur.execute("""SELECT '"S3CRET_archive"'::regtype::oid::int""")
    oid = cur.fetchone()[0]
    conn.close()
    statement = f"SELECT oidvectortypes('{oid - 2} {oid - 1} {oid} {oid + 1}'::oidvector) AS v"
    premise = srv.post("/execute_sql", {"sql": statement, "connection_name": "postgres"}, key=srv.keys["plain"])
    assert premise.status == 200 and SECRET.encode() in premise.body, premise
    for key in ("restricted", "masked"):
        r = srv.post("/execute_sql", {"sql": statement, "connection_name": "postgres"}, key=srv.keys[key])
        assert r.status == 403 and r.json["code"] == "function_not_allowed", r


def _read_catalogs_again(srv, pg_db) -> None:
    """A change to the connections clears every backend's schema cache, the catalog of function and type names
    with it."""
    reply = srv.post("/api/v1/connections", {"name": "postgres_again", "db": "postgres", **pg_db})
    assert reply.status == 201, reply
    gone = srv.request("DELETE", "/api/v1/connections/postgres_again", body={"reason": "read the catalogs again"})
    assert gone.status in (200, 204), gone


def test_an_extensions_type_is_the_databases_own(srv, pg_db):
    """citext (a trusted extension: the database's owner may create it), once the catalog lists it: a restricted
    key may cast to it and its array without allowed_tables."""
    import psycopg2
    try:
        _pg_owner(pg_db, "CREATE EXTENSION IF NOT EXISTS citext")
    except psycopg2.Error as error:
        pytest.skip(f"the citext extension is not available on this server: {error}")
    _read_catalogs_again(srv, pg_db)
    body = {"sql": "SELECT 'A'::citext = 'a' AS v, '{A}'::citext[] AS w, 'B'::public.citext AS x",
            "connection_name": "postgres"}
    reply = srv.post("/execute_sql", body, key=srv.keys["restricted"])
    assert reply.status == 200 and reply.json == [{"v": True, "w": "{A}", "x": "B"}], reply


def test_a_type_is_judged_by_the_catalog_as_it_was_read(srv, pg_db):
    """The catalog of types is as fresh as the schema cache: an enum made after it was read is judged as a table
    (refused: fail closed) until it is read again; and a type dropped and replaced by a table of its name while the
    old catalog is kept is still judged as the type, so the table's columns show (the documented limit,
    docs/security.md: a change of the connection, which whoever changes the schema can make, closes it)."""
    key = srv.keys["restricted"]
    body = {"sql": "SELECT 'placed'::order_status AS v", "connection_name": "postgres"}
    assert srv.post("/execute_sql", body, key=key).status == 200               # the catalog, read and kept
    late = dict(body, sql="SELECT (NULL::late_status)::text AS v")
    _pg_owner(pg_db, "CREATE TYPE late_status AS ENUM ('placed')")
    try:
        refused = srv.post("/execute_sql", late, key=key)
        assert refused.status == 403 and refused.json["code"] == "table_not_allowed", refused
        assert "public.late_status, named as types" in refused.json["error"]
        _read_catalogs_again(srv, pg_db)
        assert srv.post("/execute_sql", late, key=key).status == 200
        # replaced within the cache's life: PostgreSQL resolves the name when the call runs, to the table's row type
        _pg_owner(pg_db, 'DROP TYPE late_status')
        _pg_owner(pg_db, 'CREATE TABLE late_status ("S3CRET_column" int)')
        columns = dict(body, sql="SELECT (NULL::late_status).*")
        stale = srv.post("/execute_sql", columns, key=key)
        assert stale.status == 200 and SECRET.encode() in stale.body, stale
        _read_catalogs_again(srv, pg_db)
        refused = srv.post("/execute_sql", columns, key=key)
        assert refused.status == 403 and refused.json["code"] == "table_not_allowed", refused
    finally:
        _pg_owner(pg_db, "DROP TABLE IF EXISTS late_status")
        _pg_owner(pg_db, "DROP TYPE IF EXISTS late_status")
