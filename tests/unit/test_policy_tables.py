"""What a statement uses (Prepared.uses, qag/sql/access.py) and the verdict for a key (qag/policy/tables.py)."""

from __future__ import annotations

import importlib.util

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag.errors import QagError
from qag.policy.tables import CHECK_FAILED, check_tables, masked_verdict, narrowed_writes_verdict
from qag.sql.prepare import prepare

DEFAULT = {"mysql": "crm", "postgres": "public", "sqlite": "main"}
# PostgreSQL statements are read with pglast (PostgreSQL's own parser), the postgres extra.
needs_pglast = pytest.mark.skipif(importlib.util.find_spec("pglast") is None,
                                  reason="pglast reads PostgreSQL statements: the postgres extra")
DIALECTS = tuple(DEFAULT)


def code(sql, dialect="sqlite", allowed=("t",), functions=None):
    try:
        check_tables(sql, dialect, DEFAULT.get(dialect, "x"), list(allowed), functions)
    except QagError as error:
        return error.code
    return None


def tables(sql, dialect="postgres"):
    acc = prepare(sql, dialect).uses(DEFAULT[dialect])
    assert acc.failure is None, acc.failure
    return acc.tables


@pytest.mark.parametrize("sql, expected", [
    ("SELECT * FROM t", ("public.t",)),
    ("WITH secret AS (SELECT * FROM secret) SELECT * FROM secret", ("public.secret",)),
    ("WITH customer AS (SELECT 1) SELECT * FROM customer, billing.customer", ("billing.customer",)),
    ("WITH a AS (SELECT * FROM b), b AS (SELECT * FROM a) SELECT * FROM b", ("public.b",)),
    ("WITH RECURSIVE n AS (SELECT 1 UNION ALL SELECT * FROM n) SELECT * FROM n", ()),
    ("WITH n AS (SELECT * FROM n) SELECT * FROM n", ("public.n",)),
    ('WITH "Foo" AS (SELECT 1) SELECT * FROM foo, "Foo"', ("public.foo",)),
    ("WITH Foo AS (SELECT 1) SELECT * FROM FOO", ()),
    ("WITH t AS (SELECT 1) SELECT * FROM public.t", ("public.t",)),
    ("WITH t AS (SELECT 1) DELETE FROM t", ("public.t",)),
    ("SELECT * FROM (SELECT * FROM a) x JOIN b ON true WHERE EXISTS (SELECT 1 FROM c) AND d IN (SELECT d FROM e)",
     ("public.a", "public.b", "public.c", "public.e")),
    ("SELECT 1 UNION SELECT a FROM b INTERSECT SELECT c FROM d EXCEPT SELECT 1 FROM e",
     ("public.b", "public.d", "public.e")),
    ("SELECT * FROM t, LATERAL (SELECT * FROM u WHERE u.a = t.a) x", ("public.t", "public.u")),
    ("SELECT (SELECT max(a) FROM u), lower(b) FROM t", ("public.t", "public.u")),
    ("UPDATE t SET a = (SELECT max(b) FROM u) FROM w", ("public.t", "public.u", "public.w")),
    ("INSERT INTO t (a) SELECT a FROM u", ("public.t", "public.u")),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", ("public.t",)),
    ("SELECT * FROM Shop.Public.Orders", ("shop.public.orders",)),
    ("SELECT * FROM t WHERE a = :x AND b = {y} AND c = '{z}'", ("public.t",)),
    ("EXPLAIN ANALYZE SELECT * FROM secret", ("public.secret",)),
])
@needs_pglast
def test_postgres_tables(sql, expected):
    assert tables(sql) == expected


def test_dialects_and_default_schemas():
    assert tables("SELECT * FROM t JOIN crm.u ON 1 = 1 JOIN billing.v ON 1 = 1", "mysql") == \
        ("billing.v", "crm.t", "crm.u")
    assert tables("DELETE t1 FROM t1 JOIN t2 ON t1.a = t2.a", "mysql") == ("crm.t1", "crm.t2")
    assert tables("SELECT * FROM `Odd Name` JOIN [x] JOIN \"y\"", "sqlite") == ("main.odd name", "main.x", "main.y")
    assert prepare("SELECT * FROM t", "mysql").uses("CRM").tables == ("crm.t",)
    # MySQL "5--1" is 5 - -1, not a comment hiding the rest of the line.
    assert tables("SELECT 5--1 FROM secret", "mysql") == ("crm.secret",)
    # A reading without backslash escapes (NO_BACKSLASH_ESCAPES) counts too.
    assert tables("SELECT '\\' , (SELECT 1 FROM secret) -- '", "mysql") == ("crm.secret",)


def test_contract_behaviours():
    assert code("SELECT * FROM t") is None
    assert code("SELECT * FROM secret") == "table_not_allowed"
    assert code("DELETE FROM secret") == "table_not_allowed"
    assert code("SELECT * FROM t", allowed=("T",)) is None
    assert code("SELECT * FROM customer", "mysql", ("customer",)) is None
    assert code("SELECT * FROM crm.customer", "mysql", ("customer",)) is None
    assert code("SELECT * FROM billing.customer", "mysql", ("customer",)) == "table_not_allowed"
    assert code("SELECT * FROM billing.customer", "mysql", ("billing.customer",)) is None
    assert code("SELECT * FROM t", allowed=()) == "table_not_allowed"
    assert code("SELECT 1", allowed=()) is None
    for sql in ("SHOW CREATE TABLE secret", "PRAGMA table_info(x)", "SET search_path = billing", "VACUUM",
                "ATTACH 'x' AS y", "CALL p()", "EXPLAIN EXPLAIN SELECT 1", "DESCRIBE t", "SELECT * FROM",
                "CREATE TABLE x (a)", "SELECT 1; SELECT 2", "SELECT * FROM t /*! , secret */", "TABLE t"):
        assert code(sql, "postgres" if "search_path" in sql else "sqlite") == "table_check_failed", sql
    assert code("EXPLAIN t", "mysql") is None
    assert code("EXPLAIN SELECT * FROM secret") == "table_not_allowed"
    assert code("EXPLAIN QUERY PLAN SELECT * FROM t") is None
    assert code("SELECT 1", "h2") == "table_check_unsupported"
    check_tables("SELECT * FROM anything", "sqlite", "main", None)       # unrestricted


def test_names_are_folded_as_each_engine_folds_them():
    # SQLite folds ASCII letters alone: "Ärger" and the Kelvin sign's "\u212Aeys" are other tables than ärger and
    # keys (Python's lower() made them the same), and a CTE ärger is not the table Ärger.
    granted = ("ärger", "keys")
    for sql in ('SELECT * FROM "Ärger"', "SELECT * FROM Ärger", 'SELECT * FROM "\u212Aeys"', "SELECT * FROM main.\u212Aeys",
                "WITH ärger AS (SELECT 1) SELECT * FROM Ärger"):
        assert code(sql, "sqlite", granted) == "table_not_allowed", sql
    for sql in ('SELECT * FROM "ärger"', "SELECT * FROM KEYS", "SELECT * FROM Main.Keys"):
        assert code(sql, "sqlite", granted) is None, sql
    assert code("SELECT * FROM Ärger", "sqlite", ("Ärger",)) is None
    assert code("SELECT * FROM ärger", "sqlite", ("Ärger",)) == "table_not_allowed"
    # MySQL/MariaDB (lower_case_table_names 1 or 2) fold names in the server's character set, Ä to ä: unchanged.
    assert code("SELECT * FROM Ärger", "mysql", ("ärger",)) is None
    # ... by each character's simple lower case (a review: grants were folded by Python's lower() of the whole
    # name, statements by character): İ is i there, and a final Σ is σ, not ς.
    assert code("SELECT * FROM İstanbul", "mysql", ("İstanbul",)) is None
    assert code("SELECT * FROM istanbul", "mysql", ("İstanbul",)) is None
    assert code("SELECT * FROM ΑΣ", "mysql", ("ας",)) == "table_not_allowed"
    assert code("SELECT * FROM ΑΣ", "mysql", ("ασ",)) is None


@needs_pglast
def test_postgres_compares_quoted_names_exactly_and_folds_ascii_alone():
    granted = ("ärger", "keys")
    for sql in ('SELECT * FROM "Ärger"', "SELECT * FROM Ärger", 'SELECT * FROM "\u212Aeys"'):
        assert code(sql, "postgres", granted) == "table_not_allowed", sql
    assert code('SELECT * FROM "ärger", KEYS', "postgres", granted) is None
    # A grant of Ärger is the table Ärger (unquoted: PostgreSQL folds ASCII letters alone), not ärger.
    assert code('SELECT * FROM "Ärger", Ärger', "postgres", ("Ärger",)) is None
    assert code('SELECT * FROM "ärger"', "postgres", ("Ärger",)) == "table_not_allowed"

def test_messages():
    with pytest.raises(QagError) as caught:
        check_tables("SELECT * FROM secret JOIN t JOIN b.c", "sqlite", "main", ["t", "film"])
    assert caught.value.message == ("This API key may only query these tables: main.film, main.t. "
                                    "Forbidden: b.c, main.secret.")
    with pytest.raises(QagError) as caught:
        check_tables("SHOW TABLES", "mysql", "crm", ["t"])
    assert caught.value.message == CHECK_FAILED


@pytest.mark.parametrize("dialect, sql", [
    *(pytest.param("postgres", sql, marks=needs_pglast) for sql in (
        "SELECT * FROM pg_class", "SELECT * FROM pg_catalog.pg_roles", "SELECT * FROM information_schema.tables",
        "SELECT * FROM pg_toast.x")),
    ("mysql", "SELECT * FROM mysql.user"), ("mysql", "SELECT * FROM performance_schema.threads"),
    ("mysql", "SELECT * FROM sys.x"), ("mysql", "SELECT * FROM INFORMATION_SCHEMA.TABLES"),
    ("sqlite", "SELECT * FROM sqlite_master"), ("sqlite", "SELECT * FROM main.sqlite_schema"),
    ("sqlite", "SELECT * FROM sqlite_temp_master"), ("sqlite", "SELECT * FROM pragma_table_info('t')"),
    ("sqlite", "SELECT (SELECT count(*) FROM pragma_table_list)"),
])
def test_catalogs_are_refused_whatever_the_grants(dialect, sql):
    """Named as any table outside the grants (contract 6.2), even where a grant spells the catalog table."""
    granted = ["pg_class", "pg_catalog.pg_roles", "information_schema.tables", "mysql.user", "sqlite_master"]
    assert code(sql, dialect, granted) == "table_not_allowed"


def test_a_catalog_refusal_names_it_and_leaves_a_grant_of_it_out_of_the_allowed_list():
    with pytest.raises(QagError) as caught:
        check_tables("SELECT * FROM sqlite_master", "sqlite", "main", ["t", "sqlite_master"])
    assert caught.value.message == ("This API key may only query these tables: main.t. "
                                    "Forbidden: main.sqlite_master.")


@needs_pglast
def test_a_postgres_catalog_refusal_names_its_schema():
    with pytest.raises(QagError) as caught:
        check_tables("SELECT * FROM pg_class JOIN information_schema.tables ON true", "postgres", "public", ["t"])
    assert caught.value.message == ("This API key may only query these tables: public.t. "
                                    "Forbidden: information_schema.tables, pg_catalog.pg_class.")


@needs_pglast
def test_table_functions():
    assert code("SELECT * FROM generate_series(1, 3) g", "postgres") is None
    assert code("SELECT * FROM unnest(ARRAY[1]) x", "postgres") is None
    assert code("SELECT value FROM json_each('[1]')") is None
    assert code("SELECT * FROM pg_read_file('/etc/passwd') f", "postgres") == "table_not_allowed"
    assert code("SELECT * FROM my_srf(1) f", "postgres") == "table_not_allowed"
    assert code("SELECT * FROM my_srf(1) f", "postgres", functions=["my_srf"]) is None
    assert code("SELECT * FROM t, LATERAL my_srf(t.a) f", "postgres") == "table_not_allowed"


@needs_pglast
def test_functions():
    for dialect, sql in (("postgres", "SELECT pg_sleep(1)"), ("postgres", "SELECT pg_catalog.pg_read_file('x')"),
                         ("postgres", "SELECT lo_import('/etc/passwd')"), ("postgres", "SELECT dblink('x', 'y')"),
                         ("postgres", "SELECT query_to_xml('select 1', true, true, '')"),
                         ("postgres", "SELECT set_config('a', 'b', false)"), ("postgres", "SELECT nextval('s')"),
                         ("postgres", "SELECT pg_advisory_lock(1)"), ("postgres", "SELECT pg_terminate_backend(1)"),
                         ("mysql", "SELECT SLEEP(1)"), ("mysql", "SELECT BENCHMARK(1, 1)"),
                         ("mysql", "SELECT LOAD_FILE('x')"), ("mysql", "SELECT GET_LOCK('a', 1)"),
                         ("sqlite", "SELECT load_extension('x')"), ("sqlite", "SELECT writefile('x', 'y')")):
        assert code(sql, dialect, functions=["pg_sleep", "sleep", "load_extension"]) == "function_not_allowed", sql
    assert code("SELECT my_udf(a) FROM t", "postgres") == "function_not_allowed"
    assert code("SELECT my_udf(a) FROM t", "postgres", functions=["MY_UDF"]) is None
    assert code("SELECT billing.f(a) FROM t", "postgres", functions=["f"]) == "function_not_allowed"
    assert code("SELECT billing.f(a) FROM t", "postgres", functions=["billing.f"]) is None
    assert code("SELECT lower(a), count(*), coalesce(a, 'x'), now(), to_char(now(), 'YYYY') FROM t GROUP BY 1",
                "postgres") is None
    assert code("SELECT date_format(now(), '%Y'), concat_ws(',', a) FROM t", "mysql") is None
    assert code("SELECT printf('%d', a), strftime('%Y', 'now') FROM t") is None


@needs_pglast
def test_names_postgresql_looks_up_in_its_catalog_are_refused_by_what_the_parser_reads():
    """A cast to a reg* type (or aclitem) tells whether a table exists: a side channel for restricted and masked
    keys, whatever the spelling, unless allowed_functions names the type. A type that is not the engine's own is
    judged as a table (a table's row type has its name). Plain keys are not judged."""
    from qag.policy.tables import masked_verdict, verdict

    def judged(sql: str, functions=None, masked=False):
        acc = prepare(sql, "postgres").uses("public")
        try:
            if masked:
                masked_verdict(acc, "postgres", functions)
            else:
                verdict(acc, "postgres", "public", ["customers"], functions)
        except QagError as error:
            return error.code
        return None

    for sql in ("SELECT 'vault'::regclass", "SELECT CAST('vault' AS regclass)", "SELECT 'vault'::pg_catalog.regclass",
                "SELECT 'vault'::\"regclass\"", "SELECT 'vault'::\"RegClass\"", "SELECT 'vault'::text::regclass",
                "SELECT regclass 'vault'", "SELECT 'vault'::regclass::oid", "SELECT '{vault}'::regclass[]",
                "SELECT '{vault}'::_regclass", "SELECT 'vault'::other.regclass", "EXPLAIN SELECT 'vault'::regclass",
                "SELECT id FROM customers WHERE 'vault'::regclass IS NOT NULL", "SELECT 'int4'::regtype",
                "SELECT 'f'::regproc", "SELECT 'f()'::regprocedure", "SELECT '+'::regoper",
                "SELECT '+(int4,int4)'::regoperator", "SELECT 'other'::regnamespace", "SELECT 'postgres'::regrole",
                "SELECT 'english'::regconfig", "SELECT 'simple'::regdictionary", "SELECT 'C'::regcollation",
                "SELECT 'a=r/b'::aclitem", "SELECT to_regclass('vault')", "SELECT pg_catalog.to_regtype('vault')",
                "SELECT to_regtypemod('varchar(3)')", "SELECT has_table_privilege('vault', 'SELECT')",
                "SELECT has_column_privilege('vault', 'v', 'SELECT')", "SELECT pg_has_role('postgres', 'USAGE')",
                "SELECT pg_table_is_visible(16384)", "SELECT pg_ts_config_is_visible(1)",
                "SELECT pg_index_has_property('vault', 'clusterable')", "SELECT format_type(16384, NULL)",
                "SELECT pg_typeof(1) IN ('int4', 'vault')", "SELECT regclass('vault')", "SELECT regclassin('vault')",
                "SELECT row_security_active('vault')", "SELECT makeaclitem(10, 10, 'SELECT', false)"):
        assert judged(sql) == "function_not_allowed", sql
        if not sql.startswith("EXPLAIN"):      # EXPLAIN is refused to a masked key before its functions
            assert judged(sql, masked=True) == "function_not_allowed", sql
    assert judged("SELECT 'vault'::regclass", ["regclass"]) is None
    assert judged("SELECT 'vault'::regclass", ["regclass"], masked=True) is None
    assert judged("SELECT '{vault}'::regclass[]", ["regclass"]) is None
    assert judged("SELECT 'vault'::regclass", ["to_regclass"]) == "function_not_allowed"
    assert judged("SELECT to_regclass('vault')", ["to_regclass"]) is None
    # row types and other types of the database's own are judged as its tables; the engine's own types are not
    for sql in ("SELECT NULL::vault", "SELECT (NULL::vault).*", "SELECT NULL::public.vault", "SELECT NULL::\"vault\"[]",
                "SELECT CAST(NULL AS \"Customers\")", "SELECT * FROM json_populate_record(NULL::vault, '{}')",
                "SELECT * FROM json_to_record('{}') AS t(x vault)", "EXPLAIN SELECT NULL::vault",
                "SELECT NULL::pg_temp.customers", "SELECT NULL::_vault"):
        assert judged(sql) == "table_not_allowed", sql
    with pytest.raises(QagError, match=r"Forbidden: public\.vault, named as types"):
        check_tables("SELECT NULL::vault", "postgres", "public", ["customers"])
    assert judged("SELECT (NULL::vault).*", masked=True) is None
    assert judged("SELECT NULL::customers, NULL::public.customers, NULL::CUSTOMERS[] FROM customers") is None
    assert judged("SELECT NULL::int, 'x'::text, NULL::varchar(3), now()::date, '{}'::jsonb, NULL::timestamptz, "
                  "1::\"char\", NULL::_int4, NULL::pg_catalog.numeric, NULL::double precision, NULL::record") is None
    assert judged("SELECT to_tsvector('english', name) FROM customers") is None


@needs_pglast
def test_a_field_named_like_a_function_is_judged_as_its_call():
    """PostgreSQL's attribute notation: c.f is f(c) when c has no column f. With the engine's catalog, a field
    named like a one-argument function is that call; without it, denied and side-channel names still are."""
    from qag.policy.tables import verdict
    from qag.sql.functions import Catalog
    catalog = Catalog(frozenset({"lower", "length", "current_setting", "currval", "name"}), frozenset({"leakrec"}),
                      frozenset({"lower", "leakrec", "current_setting", "currval", "name"}))

    def judged(sql: str, functions=None, with_catalog=True):
        acc = prepare(sql, "postgres").uses("public")
        try:
            verdict(acc, "postgres", "public", ["customers"], functions, catalog if with_catalog else None)
        except QagError as error:
            return error.code
        return None

    assert judged("SELECT c.leakrec FROM customers c") == "function_not_allowed"
    assert judged("SELECT (c).leakrec FROM customers c") == "function_not_allowed"
    assert judged("SELECT c.leakrec FROM customers c", ["leakrec"]) is None
    assert judged("SELECT c.currval FROM customers c", ["currval"]) == "function_not_allowed"   # always denied
    assert judged("SELECT c.current_setting FROM customers c") == "function_not_allowed"
    assert judged("SELECT c.current_setting FROM customers c", ["current_setting"]) is None
    # columns: a name no one-argument function has, or a plain built-in's
    assert judged("SELECT c.email, c.name, (c).lower, c.total FROM customers c") is None
    # without a catalog, unknown names are columns; denied and side-channel ones are still refused
    assert judged("SELECT c.leakrec FROM customers c", with_catalog=False) is None
    assert judged("SELECT c.currval FROM customers c", with_catalog=False) == "function_not_allowed"
    assert judged("SELECT (c).current_setting FROM customers c", with_catalog=False) == "function_not_allowed"


@needs_pglast
def test_sql_json_constructs_are_calls_on_servers_older_than_their_grammar():
    """pglast reads PostgreSQL 18's grammar: json_value(...), json_array(...), merge_action() and the rest are its
    SQL/JSON nodes, no calls; a server before 16 (json_array, json_object, their aggregates) or 17 (json_value,
    json_query, json_exists, json_scalar, json_serialize, json, merge_action) calls a function of that name along
    the search_path, so there each is judged as an unqualified call (a shadowed or unknown name is refused)."""
    from qag.policy.tables import verdict
    from qag.sql.functions import Catalog
    builtins = frozenset({"upper", "json_object", "json_build_object"})

    def judged(sql: str, major, functions=None):
        catalog = Catalog(builtins, frozenset({"json_object", "json_value", "json_array"}), server_major=major)
        acc = prepare(sql, "postgres").uses("public")
        try:
            verdict(acc, "postgres", "public", ["customers"], functions, catalog)
        except QagError as error:
            return error.code
        return None

    for major in (15, 16):
        assert judged("SELECT json_value('x', 'y') AS v", major) == "function_not_allowed"
        assert judged("SELECT id FROM customers WHERE json_query(name, 'y') = 'a'", major) == "function_not_allowed"
        assert judged("SELECT merge_action() AS v", major) == "function_not_allowed"
        assert judged("SELECT json_value('x', 'y') AS v", major, ["json_value"]) is None
    assert judged("SELECT json_value('x', 'y') AS v", 17) is None
    assert judged("SELECT json_value('x', 'y') AS v", 18) is None
    assert judged("SELECT json_array('a', 'b') AS v", 15) == "function_not_allowed"
    assert judged("SELECT json_array('a', 'b') AS v", 16) is None
    # json_object's legacy form: pg_catalog.json_object to 16's grammar, the bare (here shadowed) name to 15's
    assert judged("SELECT json_object('a', 'b') AS v", 15) == "function_not_allowed"
    assert judged("SELECT json_object('a', 'b') AS v", 16) is None
    assert judged("SELECT upper(name) AS v FROM customers", 15) is None
    # the server's version unknown: every construct is judged as a call
    assert judged("SELECT json_array('a', 'b') AS v", None) == "function_not_allowed"


@needs_pglast
def test_a_type_the_catalog_lists_as_no_relations_is_allowed_by_how_its_name_resolves():
    """With the engine's catalog, a type of the database's own that no relation's row type is (an enum, a domain,
    an extension's type, their arrays) is allowed without allowed_tables: qualified, that schema's; unqualified, if
    the call's search_path finds it first (pg_catalog comes first: public.pg_database is shadowed by the catalog's
    row type). Anything else is judged as a table, as it is without a catalog."""
    from qag.policy.tables import verdict
    from qag.sql.functions import Catalog
    catalog = Catalog(frozenset(), frozenset(), frozenset(),
                      frozenset({("public", "order_status"), ("public", "_order_status"), ("public", "citext"),
                                 ("public", "pg_database"), ("other", "vault"), ("other", "mood")}),
                      frozenset({"order_status", "_order_status", "citext"}))

    def judged(sql: str, with_catalog=True, allowed=("customers",)):
        acc = prepare(sql, "postgres").uses("public")
        try:
            verdict(acc, "postgres", "public", list(allowed), None, catalog if with_catalog else None)
        except QagError as error:
            return error.code
        return None

    for sql in ("SELECT id FROM customers WHERE name::text = 'shipped'::order_status::text",
                "SELECT '{a}'::order_status[], '{a}'::_order_status, 'a'::public.order_status, 'A'::citext",
                "SELECT 'a'::order_status, 'b'::public.order_status, NULL::other.mood, NULL::other.vault",
                "SELECT NULL::public.pg_database"):
        assert judged(sql) is None, sql
        assert judged(sql, with_catalog=False) == "table_not_allowed", sql     # no catalog: judged as tables
    for sql in ("SELECT NULL::vault", "SELECT (NULL::vault).*", "SELECT NULL::public.vault",     # other's, not public's
                "SELECT NULL::pg_database", "SELECT NULL::pg_database, NULL::public.pg_database",
                "SELECT NULL::mood",                                    # other.mood: not on the search_path
                "SELECT 'a'::order_status, NULL::vault", "SELECT NULL::{db}.public.order_status",
                "SELECT 'a'::\"Order_Status\"", "SELECT NULL::pg_temp.order_status"):
        assert judged(sql.replace("{db}", "qag")) == "table_not_allowed", sql
    assert judged("SELECT NULL::vault", allowed=("customers", "vault")) is None      # a granted table's row type
    with pytest.raises(QagError, match=r"Forbidden: public\.pg_database, named as types"):
        verdict(prepare("SELECT NULL::pg_database", "postgres").uses("public"), "postgres", "public",
                ["customers"], None, catalog)
    # a catalog that lists no types (MySQL's, or one read before types were) judges every type as a table
    assert Catalog(frozenset(), frozenset()).plain_type("", "order_status") is False

def test_limits_refuse_fast():
    for sql in ("SELECT " + "(" * 100 + "1" + ")" * 100, "SELECT 1" + " UNION SELECT 1" * 3000,
                "SELECT * FROM t WHERE " + " AND ".join(f"a <> {i}" for i in range(2000)), "SELECT 1" + " " * 200_000):
        assert code(sql) == "table_check_failed"


# ---------------------------------------------------------------------------------------------- properties

ALLOWED = ["t", "film", "Orders"]
FORBIDDEN = ["secret", "users", "billing.t"]


def _spell(name: str, draw) -> str:
    """A reference to `name` as some engine accepts it: case changed, quoted (exactly) or schema-qualified."""
    if "." in name:
        return name
    how = draw(st.sampled_from(["bare", "upper", "qualified", "quoted"]))
    if how == "upper":
        return name.upper()
    if how == "qualified":
        return "public." + name
    if how == "quoted":
        return '"' + name.lower() + '"'
    return name


@st.composite
def statements(draw):
    names = draw(st.lists(st.sampled_from(ALLOWED + FORBIDDEN), min_size=1, max_size=4))
    refs = [_spell(n, draw) for n in names]
    shape = draw(st.sampled_from(["join", "cte", "union", "subquery", "exists", "alias", "cte_shadow", "insert"]))
    a = refs[0]
    rest = refs[1:] or [a]
    if shape in ("subquery", "alias", "insert"):
        names, refs = names[:2], refs[:2]
        rest = refs[1:] or [a]
    elif shape in ("exists", "cte_shadow"):
        names, refs, rest = names[:1], refs[:1], [a]
    if shape == "join":
        sql = f"SELECT * FROM {a} x0 " + " ".join(f"JOIN {r} x{i + 1} ON true" for i, r in enumerate(rest))
    elif shape == "cte":
        sql = f"WITH c AS (SELECT * FROM {a}) SELECT * FROM c, " + ", ".join(rest)
    elif shape == "union":
        sql = " UNION ALL ".join(f"SELECT 1 FROM {r}" for r in refs)
    elif shape == "subquery":
        sql = f"SELECT * FROM (SELECT * FROM {a}) s WHERE 1 IN (SELECT 1 FROM {rest[0]})"
    elif shape == "exists":
        sql = f"SELECT 1 FROM {a} WHERE EXISTS (SELECT 1 FROM {a} z)"
    elif shape == "alias":
        sql = f"SELECT {a}.* FROM {a} AS t2, {rest[0]} AS film"
    elif shape == "cte_shadow":
        # The CTE is named like the real table it reads: the real table still counts.
        sql = f"WITH {names[0].split('.')[-1]} AS (SELECT * FROM {a}) SELECT * FROM {names[0].split('.')[-1]}"
    else:
        sql = f"INSERT INTO {a} SELECT * FROM {rest[0]}"
    return sql, names


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=statements())
def test_never_allows_a_forbidden_table(case):
    sql, names = case
    try:
        check_tables(sql, "postgres", "public", ALLOWED)
    except QagError as error:
        assert error.code in ("table_not_allowed", "table_check_failed", "function_not_allowed")
        return
    assert not set(names) & set(FORBIDDEN), sql


@settings(max_examples=300, deadline=None)
@given(sql=st.text(max_size=120) | st.builds(lambda a, b: a + b, st.sampled_from(
    ["SELECT * FROM ", "WITH x AS (", "EXPLAIN ", "INSERT INTO t ", "SELECT (", "/*! ", "SELECT '"]),
    st.text(alphabet="abt(),;'\"`[]:{}.* \\-/#$\nSELECTFROMWITHUNION", max_size=60)),
    dialect=st.sampled_from(DIALECTS))
def test_only_qag_errors(sql, dialect):
    try:
        check_tables(sql, dialect, DEFAULT[dialect], ["t"], ["f"])
    except QagError as error:
        assert error.code in ("table_not_allowed", "table_check_failed", "function_not_allowed")


@pytest.mark.parametrize("dialect, sql", [
    ("sqlite", "VALUES (1), (2)"),
    ("sqlite", "values (1), (2) union all select 3"),
    pytest.param("postgres", "WITH c AS (SELECT 1) VALUES (1), (2)", marks=needs_pglast),
    ("mysql", "VALUES ROW(1), ROW(2)"),
    pytest.param("postgres", "VALUES (1, 'a')", marks=needs_pglast),
])
def test_a_values_statement_reading_no_table_is_allowed_to_restricted_and_masked_keys(dialect, sql):
    # Contract 6.2 lists VALUES among the statements whose tables can be read off (the refused ones are those that
    # are none of them); QueryAPIGate 0.43 allows `VALUES (1), (2)` to a table-restricted key. 6.3: constants,
    # VALUES literals among them, need no mask rule.
    assert code(sql, dialect) is None
    masked_verdict(prepare(sql, dialect).uses(DEFAULT[dialect]), dialect)
    assert code(f"SELECT * FROM ({sql.split(' union')[0]}) AS v", dialect) is None


@pytest.mark.parametrize("dialect, sql", [
    ("sqlite", "VALUES ((SELECT max(note) FROM secret))"),
    ("sqlite", "VALUES (1) UNION SELECT note FROM secret"),
    pytest.param("postgres", "VALUES ((SELECT max(note) FROM secret))", marks=needs_pglast),
    pytest.param("postgres", "WITH c AS (SELECT note FROM secret) VALUES ((SELECT note FROM c))", marks=needs_pglast),
    pytest.param("postgres", "EXPLAIN VALUES ((SELECT max(note) FROM secret))", marks=needs_pglast),
    ("mysql", "VALUES ROW((SELECT max(note) FROM secret))"),
])
def test_a_values_statement_reading_a_table_outside_the_allow_list_is_refused(dialect, sql):
    assert code(sql, dialect) in ("table_not_allowed", "table_check_failed")


def test_mysql_row_constructor_is_no_function_call():
    # ROW(...) is MySQL's row constructor, no stored function: a restricted key may compare rows with it.
    assert code("SELECT * FROM t WHERE (a, b) = ROW(1, 'a')", "mysql") is None
    assert code("SELECT * FROM (VALUES ROW(1), ROW(2)) AS v", "mysql") is None


@pytest.mark.parametrize("sql", [
    "INSERT INTO t (id, n) VALUES (1, 2) ON DUPLICATE KEY UPDATE n = VALUES(n)",
    "INSERT INTO t (id, n) VALUES (1, 2) ON DUPLICATE KEY UPDATE n = VALUE(n) + 1",
    "SELECT * FROM t WHERE id IN (VALUES (1), (2))",
    "WITH x AS (VALUES (1)) SELECT * FROM x",
    "VALUES (1) UNION VALUES (2)",
])
def test_mysql_values_rows_and_an_upserts_values_are_no_function_calls(sql):
    # A VALUES list's rows (read by sqlglot as calls of `values`) and an upsert's VALUES(col) / MariaDB's VALUE(col)
    # are MySQL's grammar: a restricted key writing its granted table, or an insert-only key's upsert, may use them.
    assert code(sql, "mysql") is None
    acc = prepare(sql, "mysql").uses(DEFAULT["mysql"])
    narrowed_writes_verdict(acc, "mysql", frozenset(("insert", "update")))



def test_mysql_a_stored_function_beside_values_is_still_judged():
    assert code("INSERT INTO t (id) VALUES (1) ON DUPLICATE KEY UPDATE n = peek()", "mysql") == "function_not_allowed"
    assert code("INSERT INTO t (id, n) VALUES (1, 2) ON DUPLICATE KEY UPDATE n = VALUES(n) + peek()",
                "mysql") == "function_not_allowed"
    assert code("SELECT * FROM t WHERE id IN (VALUES (1), (peek()))", "mysql") == "function_not_allowed"
    assert code("VALUES (1) UNION VALUES (peek())", "mysql") == "function_not_allowed"


def test_mysql_a_stored_function_named_values_is_judged_through_the_catalog():
    # Quoted, `values`(x) and `value`(x) call a stored function of that name (unquoted they are the grammar's):
    # the connection's catalog lists such a function as shadowing the name, so the call is refused.
    from qag.policy.tables import verdict
    from qag.sql.functions import Catalog
    catalog = Catalog(None, frozenset({"values", "value"}))
    for sql in ("SELECT `values`(a) FROM t", "SELECT `value`(a) FROM t",
                "INSERT INTO t (a) VALUES (1) ON DUPLICATE KEY UPDATE a = `values`(a)"):
        with pytest.raises(QagError) as refused:
            verdict(prepare(sql, "mysql").uses(DEFAULT["mysql"]), "mysql", DEFAULT["mysql"], ["t"], None, catalog)
        assert refused.value.code == "function_not_allowed", sql


@pytest.mark.parametrize("sql, expected", [
    ("DESCRIBE customer", None), ("DESC crm.customer", None), ("DESCRIBE `customer`", None),
    ("EXPLAIN customer", None), ("DESC customer name", None), ("DESCRIBE customer 'na%'", None),
    ("DESCRIBE SELECT * FROM customer", None), ("DESC FORMAT=JSON SELECT id FROM orders", None),
    ("DESCRIBE secret", "table_not_allowed"), ("DESC crm.secret", "table_not_allowed"),
    ("EXPLAIN secret", "table_not_allowed"), ("DESC billing.customer", "table_not_allowed"),
    ("DESCRIBE information_schema.tables", "table_not_allowed"), ("DESCRIBE mysql.user", "table_not_allowed"),
    ("DESCRIBE SELECT * FROM secret", "table_not_allowed"),
    ("DESC SELECT * FROM customer, secret", "table_not_allowed"),
    ("DESCRIBE EXPLAIN SELECT 1", "table_check_failed"), ("DESCRIBE", "table_check_failed"),
])
def test_mysql_describe_is_checked_as_a_read_of_its_table(sql, expected):
    # Contract 6.2 lists DESCRIBE (MySQL's `EXPLAIN table` too) among the statements whose tables can be checked:
    # a table-restricted key describes a granted table, as it may read it (was table_check_failed whatever the grant).
    assert code(sql, "mysql", ("customer", "orders")) == expected


def test_describe_reads_names_as_the_server_compares_them():
    from qag.sql.access import ExactSchema
    acc = prepare("DESCRIBE Customer", "mysql").uses(ExactSchema("crm"))
    assert acc.failure is None and acc.tables == ("crm.Customer",)
    assert prepare("DESC `Billing`.`T`", "mysql").uses("crm").tables == ("billing.t",)
    # Elsewhere there is no DESCRIBE statement: never read as one.
    assert code("DESCRIBE t", "postgres") == "table_check_failed"
    assert code("DESCRIBE t", "sqlite") == "table_check_failed"


@pytest.mark.parametrize("sql, expected", [
    ("SELECT * FROM t WHERE id IN secret", "table_not_allowed"),
    ("SELECT * FROM t WHERE id NOT IN main.secret", "table_not_allowed"),
    ("SELECT * FROM t WHERE id IN /* c */ [secret]", "table_not_allowed"),
    ("VALUES ('jewels' IN secret)", "table_not_allowed"),
    ("SELECT (1, 'x') IN secret2 FROM t", "table_not_allowed"),
    ("SELECT * FROM t WHERE id IN t AND id IN secret", "table_not_allowed"),
    ("DELETE FROM t WHERE id IN secret", "table_not_allowed"),
    ("SELECT * FROM t WHERE id IN pragma_table_info('t')", "table_not_allowed"),
    ("SELECT * FROM t WHERE id IN 5", "table_check_failed"),
    ("SELECT * FROM t WHERE id IN", "table_check_failed"),
    ("SELECT * FROM t WHERE id IN t", None), ("SELECT * FROM t WHERE id NOT IN main.\"t\"", None),
    ("SELECT * FROM t WHERE id IN generate_series(1, 3)", None),
])
def test_sqlite_in_table_is_checked_as_a_read_of_that_table(sql, expected):
    # `expr IN table` reads the table's rows, where sqlglot reads a column: the table check reads the name after IN
    # as a table the statement reads (before, only SQLite's authorizer refused `'x' IN secret`).
    assert code(sql, "sqlite") == expected


def test_sqlite_in_table_leaves_keys_without_an_allow_list_alone():
    # A key narrowed to some writes (no allowed_tables) may write with `IN table`: its calls are all read.
    for sql in ("DELETE FROM t WHERE a IN s2", "UPDATE t SET a = 1 WHERE a NOT IN main.s2",
                "INSERT INTO t (a) SELECT a FROM s WHERE a IN s2"):
        acc = prepare(sql, "sqlite").uses(DEFAULT["sqlite"])
        assert acc.failure is None and "main.s2" in acc.tables, (sql, acc)
        narrowed_writes_verdict(acc, "sqlite", frozenset(("delete", "update", "insert")))


def test_sqlite_in_a_list_or_subquery_stays_checkable():
    assert code("SELECT * FROM t WHERE id IN (1, 2)", "sqlite") is None
    assert code("SELECT * FROM t WHERE id IN (SELECT id FROM t)", "sqlite") is None
    assert code("SELECT * FROM t WHERE id IN (SELECT id FROM secret)", "sqlite") == "table_not_allowed"


@pytest.mark.parametrize("sql, expected", [
    ("SELECT secret, 1e1from vault", ("crm.vault",)),
    ("SELECT secret, 1.from vault", ("crm.vault",)),
    ("SELECT secret, .5from vault", ("crm.vault",)),
    ("SELECT v2.secret, 1e1from customers, other.vault2 v2", ("crm.customers", "other.vault2")),
    ("SELECT c.id FROM customers c WHERE EXISTS (SELECT 1e1from vault WHERE vault.id = c.id)",
     ("crm.customers", "crm.vault")),
    ("SELECT t.1e1from, 1abc, 0x1g FROM t", ("crm.t",)),
])
def test_mysql_a_from_written_against_a_number_still_reads_its_tables(sql, expected):
    """MySQL reads `1e1from vault` as 1e1 FROM vault (sqlglot alone read one name, `1e1from`, and no table): the
    tables qag finds are the server's."""
    assert tables(sql, "mysql") == expected


def test_mysql_a_number_against_from_is_refused_for_a_restricted_key():
    assert code("SELECT secret, 1e1from vault", "mysql", ("customers",)) == "table_not_allowed"
    assert code("SELECT u.user, 1e1from customers, mysql.user u", "mysql", ("customers",)) == "table_not_allowed"
    assert code("SELECT t.table_name, 1e1from customers, information_schema.tables t", "mysql",
                ("customers",)) == "table_not_allowed"


@pytest.mark.parametrize("sql", ["SELECT id, secret, 1e1into outfile '/tmp/x' FROM vault", "SELECT 1e1into @x",
                                 "SELECT 1.into @x", "SELECT .5into dumpfile '/tmp/y'", "SELECT 1e-1into @x"])
def test_mysql_into_written_against_a_number_is_a_write(sql):
    assert prepare(sql, "mysql").write_ops == {"select into"}


def test_mysql_a_lock_written_against_a_number_is_a_lock():
    assert prepare("SELECT 1e1lock IN SHARE MODE", "mysql").write_ops == {"lock"}


@pytest.mark.parametrize("sql, expected", [
    ("SELECT note, @x. from secret", ("crm.secret",)),
    ("SELECT v, @x. from customer, other.vault", ("crm.customer", "other.vault")),
    ("SELECT note, @x./**/from secret", ("crm.secret",)),
    ("SELECT note, @\u00a0 from secret", ("crm.secret",)),
    ("SELECT v, @\u2028 from customer, other.vault", ("crm.customer", "other.vault")),
    ("SELECT c.id FROM customer c WHERE EXISTS (SELECT @x. from secret WHERE secret.id = c.id)",
     ("crm.customer", "crm.secret")),
    ("SELECT a\u00a0b FROM t\u3000x", ("crm.t\u3000x",)),
])
def test_mysql_a_from_behind_a_user_variable_or_a_foreign_space_still_reads_its_tables(sql, expected):
    """A user variable's name runs over '.' and non-ASCII, and names hold characters sqlglot takes for spaces
    (U+00A0, U+2028, U+3000): the tables qag finds are the server's."""
    assert tables(sql, "mysql") == expected
    assert code(sql, "mysql", ("customer",)) == "table_not_allowed"


@pytest.mark.parametrize("dialect, ddl, allowed, expected", [
    ("sqlite", "CREATE VIEW v (a) AS SELECT p.id FROM people p JOIN salary s ON s.id = p.id", ["v", "people"], False),
    ("sqlite", "CREATE VIEW v (a) AS SELECT p.id FROM people p JOIN salary s ON s.id = p.id",
     ["v", "people", "salary"], True),
    ("sqlite", "CREATE TEMP VIEW IF NOT EXISTS v AS SELECT 1", ["v"], True),
    ("sqlite", "CREATE TABLE t (view INT, x INT)", ["t"], True),
    ("mysql", "CREATE ALGORITHM=UNDEFINED DEFINER=`root`@`%` SQL SECURITY DEFINER VIEW `v` AS select `a`.`id` "
              "AS `id` from `crm`.`a` where `a`.`id` in (select `b`.`id` from `other`.`b`)", ["v", "a"], False),
    ("mysql", "CREATE ALGORITHM=UNDEFINED DEFINER=`root`@`%` SQL SECURITY DEFINER VIEW `v` AS select `a`.`id` "
              "AS `id` from `crm`.`a`", ["v", "a"], True),
    ("mysql", "CREATE VIEW `v` AS select no such thing from", ["v"], False),
])
def test_a_views_ddl_is_shown_to_a_restricted_key_only_when_it_reads_granted_tables(dialect, ddl, allowed, expected):
    from qag.api._connections import view_reads_granted
    assert view_reads_granted(ddl, dialect, DEFAULT[dialect], allowed) is expected


@pytest.mark.parametrize("suffix", ["", " WITH CHECK OPTION", " WITH CASCADED CHECK OPTION", " WITH LOCAL CHECK OPTION"])
def test_a_views_check_option_is_not_part_of_its_query(suffix):
    from qag.api._connections import view_reads_granted
    ddl = ("CREATE ALGORITHM=UNDEFINED DEFINER=`root`@`%` SQL SECURITY DEFINER VIEW `v` AS select `t`.`a` AS `a` "
           "from `t` where (`t`.`a` > 1.5)" + suffix)
    assert view_reads_granted(ddl, "mysql", "crm", ["t", "v"]) is True
    assert view_reads_granted(ddl, "mysql", "crm", ["v"]) is False


def test_the_definer_clause_goes_from_the_head_only():
    from qag.api._connections import without_definer
    ddl = "CREATE DEFINER=`root`@`%` VIEW `v` AS select 'DEFINER=`a`@`b` ' AS `x`"
    assert without_definer(ddl, "mysql") == "CREATE VIEW `v` AS select 'DEFINER=`a`@`b` ' AS `x`"
    table = "CREATE TABLE `t` (`a` int COMMENT 'DEFINER=me@host')"
    assert without_definer(table, "mysql") == table
