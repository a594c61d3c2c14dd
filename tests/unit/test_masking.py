"""qag/policy/masking.py and qag/sql/lineage.py without a server: lineage per dialect, rules, value actions (contract 6.3)."""

from __future__ import annotations

import datetime
import decimal
import hashlib
import hmac
import sqlite3

import pytest
from hypothesis import given, settings, strategies as st

from qag.backends.base import Backend
from qag.errors import QagError
from qag.policy import masking
from qag.sql.lineage import Schema, Unresolvable, trace
from qag.sql.prepare import prepare, render

RAW = {"tables": [
    {"name": "customers", "schema": "S", "type": "table",
     "columns": [{"name": n} for n in ("id", "email", "phone", "secret", "name")]},
    {"name": "orders", "schema": "S", "type": "table", "columns": [{"name": n} for n in ("id", "customer_id", "total")]},
    {"name": "emails", "schema": "S", "type": "view", "columns": [{"name": "id"}, {"name": "email"}]},
]}
DIALECTS = ("sqlite", "mysql", "postgres")


def schema(dialect: str) -> Schema:
    return Schema({"tables": [dict(t, schema="main" if dialect == "sqlite" else "shop") for t in RAW["tables"]]},
                  dialect, "main" if dialect == "sqlite" else "shop")


def lineage(sql: str, dialect: str = "sqlite") -> list:
    return [(o.name, sorted(f"{s.table}.{s.column}" for s in o.sources)) for o in trace(sql, schema(dialect))]


TRACED = [
    ("SELECT id, email AS contact FROM customers", [("id", ["customers.id"]), ("contact", ["customers.email"])]),
    ("SELECT * FROM customers", [(n, [f"customers.{n}"]) for n in ("id", "email", "phone", "secret", "name")]),
    ("SELECT lower(email) AS e FROM customers", [("e", ["customers.email"])]),
    ("WITH x AS (SELECT email AS a FROM customers) SELECT a FROM x", [("a", ["customers.email"])]),
    ("WITH x AS (SELECT email AS a FROM customers), y AS (SELECT a AS b FROM x) SELECT b FROM y",
     [("b", ["customers.email"])]),
    ("SELECT name FROM customers UNION ALL SELECT email FROM customers", [("name", ["customers.email", "customers.name"])]),
    ("SELECT s.e FROM (SELECT email AS e FROM customers) s", [("e", ["customers.email"])]),
    ("SELECT c.email, o.total FROM orders o JOIN customers c ON c.id = o.customer_id",
     [("email", ["customers.email"]), ("total", ["orders.total"])]),
    ("SELECT (SELECT max(email) FROM customers) AS m", [("m", ["customers.email"])]),
    ("SELECT id FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.id)",
     [("id", ["customers.id"])]),
    ("SELECT 1 AS one, 'x' AS s, count(*) AS n, row_number() OVER () AS r FROM customers",
     [("one", []), ("s", []), ("n", []), ("r", [])]),
    ("SELECT CASE WHEN email LIKE 'a%' THEN 1 ELSE 0 END AS flag FROM customers", [("flag", ["customers.email"])]),
    ("SELECT COALESCE(email, phone) AS c FROM customers", [("c", ["customers.email", "customers.phone"])]),
    ("INSERT INTO orders (id) VALUES (1)", []),
    ("SELECT * FROM (VALUES (1, 'a')) AS v(x, y)", [("x", []), ("y", [])]),
]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql,expected", TRACED)
def test_tracing(dialect, sql, expected):
    assert lineage(sql, dialect) == expected


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_bare_values_are_constants(dialect):
    assert lineage("VALUES (1, 'a'), (2, 'b')", dialect) == [("column1", []), ("column2", [])]


def test_bare_values_unreadable_on_mysql_is_refused():
    # sqlglot's MySQL grammar has no bare VALUES statement: refused, never served untraced.
    with pytest.raises(Unresolvable):
        trace("VALUES (1, 'a')", schema("mysql"))


def test_recursive_cte_columns_read_every_source():
    sql = ("WITH RECURSIVE r(a, b) AS (SELECT email, 1 FROM customers UNION ALL SELECT b, a FROM r WHERE 0) "
           "SELECT b FROM r")
    assert lineage(sql) == [("b", ["customers.email"])]


REFUSED = [
    "SELECT version() AS v", "SELECT current_user AS u", "SELECT c FROM customers c", "SELECT * FROM nothere",
    "SELECT a FROM customers AS c(a)", "SELECT * FROM customers JOIN orders USING (id)",
    "SELECT * FROM customers NATURAL JOIN orders", "SELECT * FROM (SELECT 1 AS one) s, customers",
    "SELECT FROM WHERE", "SELECT 1; SELECT 2", "UPDATE customers SET name = 'x' RETURNING email",
    "SELECT name FROM customers UNION SELECT id, name FROM customers", "VALUES (version())",
]


@pytest.mark.parametrize("sql", REFUSED)
def test_refused(sql):
    with pytest.raises(Unresolvable):
        trace(sql, schema("postgres" if "RETURNING" in sql else "sqlite"))


UNLISTED = [
    "SELECT c.phone FROM contacts c",
    "SELECT id FROM customers WHERE EXISTS (SELECT 1 FROM contacts c WHERE c.phone LIKE '0%')",
    # A CTE's name is the real table outside the CTE's scope (sqlglot scopes it as the engine does):
    "SELECT c.id FROM contacts c, (WITH contacts AS (SELECT 1 AS one) SELECT one FROM contacts) d",
    "WITH x AS (SELECT c.phone AS m FROM contacts c), contacts AS (SELECT 1 AS one) SELECT x.m FROM x",
    "SELECT 1 AS one FROM `dual`", "SELECT 1 AS one FROM shop.dual", "SELECT o.phone FROM other.customers o",
]


@pytest.mark.parametrize("sql", UNLISTED)
def test_a_table_the_schema_does_not_list_is_refused_wherever_it_is_read(sql):
    """Its columns can't be masked at the source (nothing says what they are), so a rule on them would go unapplied:
    refused in every scope, qualified or not."""
    with pytest.raises(Unresolvable, match="not a table of the connection's schema"):
        trace(sql, schema("mysql"))


@pytest.mark.parametrize("sql", ["SELECT 1 AS one FROM DUAL", "SELECT 1 AS one FROM dual",
                                 "WITH contacts AS (SELECT 1 AS one) SELECT one FROM contacts",
                                 "WITH c AS (SELECT email FROM customers) SELECT email FROM c"])
def test_mysql_dual_and_a_cte_in_scope_need_no_table(sql):
    assert trace(sql, schema("mysql"))


DECOY_CTE = [
    # A set operation's ORDER BY, where sqlglot builds no scope, reads the real `secret`, not the CTE:
    "SELECT id FROM orders UNION SELECT d.one FROM (WITH secret AS (SELECT 1 AS one) SELECT one FROM secret) d "
    "ORDER BY (SELECT s.phone FROM secret s WHERE s.id = 1)",
    # A write is never traced; its SELECT reads the real `secret`:
    "INSERT INTO orders (id, total) SELECT s.phone, 1 FROM secret s "
    "WHERE EXISTS (WITH secret AS (SELECT 1 AS one) SELECT one FROM secret)",
]


@pytest.mark.parametrize("dialect", ["mysql", "sqlite"])
@pytest.mark.parametrize("sql", DECOY_CTE)
def test_an_unlisted_table_is_refused_where_the_trace_builds_no_scope(sql, dialect):
    """A CTE named like the unlisted table elsewhere in the statement must not make the rewrite skip it: the table
    check's reading (CTEs scoped as the engine scopes them) lists it, and it is refused before anything runs."""
    rules = masking.effective([{"column": "*.phone", "action": "mask"}])
    with pytest.raises(Unresolvable, match="not a table of the connection's schema"):
        masking.at_source(prepare(sql, dialect), schema(dialect), rules)


@pytest.mark.parametrize("dialect", ["mysql", "postgres", "sqlite"])
@pytest.mark.parametrize("sql", [
    "SELECT id, secret, :qag_mask_ipad AS p FROM customers",
    "SELECT id, secret FROM customers WHERE name = :qag_mask_opad",
    "SELECT id, secret, '{qag_mask_ipad}' AS p FROM customers",       # a saved query's text placeholder
    "SELECT id, secret, {qag_mask_opad} AS p FROM customers",
    "SELECT id, secret, '{QAG_MASK_IPAD}' AS p FROM customers",
])
def test_the_hash_pads_names_are_refused_as_placeholders(sql, dialect):
    """The hash key's pads are bound under these names, in place of any caller value of the same name: a
    placeholder of either name, bound or text, would return the pads (and so the key)."""
    if dialect == "postgres":
        pytest.importorskip("pglast", reason="PostgreSQL statements are read by its own parser")
    rules = masking.effective([{"column": "customers.secret", "action": "hash"}])
    with pytest.raises(Unresolvable, match="gateway's own"):
        masking.at_source(prepare(sql, dialect), schema(dialect), rules)
    fine = "SELECT id, secret, '{qag_mask}' AS p FROM customers"
    assert masking.at_source(prepare(fine, dialect), schema(dialect), rules) is not None


@pytest.mark.parametrize("sql", [
    "UPDATE orders SET total = (SELECT 1 WHERE (1, 'a', 'b', 'c', 'd') IN customers) WHERE id = 1",
    "INSERT INTO orders (id, total) SELECT 1, 1 WHERE (1, 'a', 'b', 'c', 'd') IN main.customers",
    "DELETE FROM orders WHERE (id, 'a', 'b', 'c', 'd') NOT IN customers",
])
def test_sqlite_in_table_is_refused(sql):
    """`expr IN table` reads the table's rows (a write key copies a masked value, or asks yes/no of it), while
    sqlglot and the table check read `customers` as a column: refused."""
    engine = sqlite3.connect(":memory:")
    engine.execute("CREATE TABLE customers (id, email, phone, secret, name)")
    engine.execute("INSERT INTO customers VALUES (1, 'a', 'b', 'c', 'd')")
    assert engine.execute("SELECT (1, 'a', 'b', 'c', 'd') IN customers").fetchone() == (1,)   # the engine reads it
    rules = masking.effective([{"column": "customers.phone", "action": "mask"}])
    with pytest.raises(Unresolvable, match="IN table"):
        masking.at_source(prepare(sql, "sqlite"), schema("sqlite"), rules)
    assert masking.at_source(prepare("SELECT id FROM orders WHERE id IN (1, 2)", "sqlite"), schema("sqlite"),
                             rules) is None


def test_tables_differing_only_in_case_are_dropped_even_when_they_leave_a_schema_empty():
    """`Contacts` and `contacts` (a server that compares names exactly) would share the trace's case-blind entry:
    neither is known; a schema left with no table is left out rather than refused by sqlglot."""
    columns = [{"name": "id"}, {"name": "phone"}]
    raw = {"tables": [{"name": "Contacts", "schema": "twins", "columns": columns},
                      {"name": "contacts", "schema": "twins", "columns": columns[:1]},
                      {"name": "customers", "schema": "shop", "columns": columns}]}
    twins = Schema(raw, "mysql", "shop")
    assert ("twins", "contacts") not in twins.columns and ("shop", "customers") in twins.columns
    for sql in ("SELECT * FROM twins.Contacts", "SELECT * FROM twins.contacts"):
        with pytest.raises(Unresolvable):
            trace(sql, twins)
    assert [o.name for o in trace("SELECT phone FROM customers", twins)] == ["phone"]


def test_table_function_refused_on_postgres():
    with pytest.raises(Unresolvable):
        trace("SELECT * FROM generate_series(1, 3) g", schema("postgres"))
    with pytest.raises(Unresolvable):
        trace("SELECT to_json(c) AS j FROM customers c", schema("postgres"))


def test_deep_nesting_is_refused_not_crashed():
    sql = "SELECT " + "(" * 3000 + "1" + ")" * 3000
    with pytest.raises(Unresolvable):
        trace(sql, schema("sqlite"))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_rewrite_past_the_statement_limit_is_refused_as_masking_s_own(dialect):
    """Each reference to a wide masked table grows by a masked expression per column: a short statement can pass
    the statement limit once rewritten. That is masking's refusal (403 mask_unresolvable), not an unreadable
    statement that the caller would be told is theirs (400 invalid_request)."""
    from qag.sql.prepare import MAX_STATEMENT_CHARS
    if dialect == "postgres":
        pytest.importorskip("pglast")      # where a PostgreSQL table reference is comes from its own parser
    db = "main" if dialect == "sqlite" else "shop"
    columns = [{"name": f"col_{i:02d}_of_a_wide_table", "type": "varchar(40)"} for i in range(40)]
    wide = Schema({"tables": [{"name": "wide", "schema": db, "type": "table", "columns": columns}]}, dialect, db)
    rules = masking.effective([{"column": "wide.*", "action": "mask"}])
    read = "SELECT col_00_of_a_wide_table FROM wide"
    one = len(masking.at_source(prepare(read, dialect), wide, rules).sql)
    fits = prepare(" UNION ALL ".join([read] * (MAX_STATEMENT_CHARS // one - 1)), dialect)
    assert len(masking.at_source(fits, wide, rules).sql) <= MAX_STATEMENT_CHARS
    many = prepare(" UNION ALL ".join([read] * (MAX_STATEMENT_CHARS // one + 1)), dialect)
    assert len(many.sql) < MAX_STATEMENT_CHARS // 20 and many.unreadable is None
    with pytest.raises(Unresolvable, match="longer than"):
        masking.at_source(many, wide, rules)


# --- rules ----------------------------------------------------------------------------------------------------
def _plan(sql: str, rules: list, dialect: str = "sqlite") -> masking.MaskPlan:
    return masking.MaskPlan(trace(sql, schema(dialect)), masking.effective(rules), masking.Hasher(b"k"))


def test_strictest_action_wins_per_column():
    rules = [{"column": "customers.email", "action": "hash"}, {"column": "*.email", "action": "null"},
             {"column": "customers.phone", "action": "keep"}, {"column": "main.customers.secret", "action": "drop"}]
    p = _plan("SELECT email, phone, secret, name, email || phone AS both FROM customers", rules)
    assert p.actions == ("null", "keep", "drop", None, "null")
    assert p.columns(["email", "phone", "secret", "name", "both"]) == ["email", "phone", "name", "both"]
    assert p.rows([("a@b.c", "123", "s", "n", "x")]) == [(None, "123", "n", None)]
    assert p.report(["email", "phone", "secret", "name", "both"]) == [
        {"column": "email", "action": "null", "source": "customers.email"},
        {"column": "secret", "action": "drop", "source": "customers.secret"},
        {"column": "both", "action": "null", "source": "customers.email"}]


def test_schema_part_must_match_when_given():
    assert _plan("SELECT secret FROM customers", [{"column": "other.customers.secret", "action": "drop"}]).actions \
        == (None,)


def test_view_column_named_like_a_rule():
    with pytest.raises(Unresolvable):
        _plan("SELECT email FROM emails", [{"column": "customers.email", "action": "hash"}])
    assert _plan("SELECT email FROM emails", [{"column": "customers.email", "action": "hash"},
                                              {"column": "emails.email", "action": "mask"}]).actions == ("mask",)
    assert _plan("SELECT id FROM emails", [{"column": "customers.email", "action": "hash"}]).actions == (None,)


def test_effective_and_fingerprint():
    a = [{"column": "t.c", "action": "hash"}]
    b = [("t.d", "drop")]
    assert masking.effective(None, [], ()) == ()
    assert masking.fingerprint(None) == "" and masking.fingerprint([]) == ""
    assert masking.effective(a, b) == masking.effective(b, a) == (("t.c", "hash"), ("t.d", "drop"))
    assert masking.fingerprint(masking.effective(a, b)) == masking.fingerprint(masking.effective(b, a, a))
    assert masking.fingerprint(a) != masking.fingerprint(b) != ""
    # A stored rule that doesn't read as one hides everything.
    assert masking.effective([{"column": 5, "action": "hash"}]) == (("*.*", "drop"),)


def test_width_check():
    p = _plan("SELECT id, email FROM customers", [{"column": "customers.email", "action": "hash"}])
    with pytest.raises(QagError) as info:
        p.check(["id", "email", "extra"])
    assert info.value.code == "mask_unresolvable"


# --- the per-worker planner -------------------------------------------------------------------------------------
class _Settings:
    mask_key = "k"


class _Backend(Backend):
    dialect = "sqlite"

    def __init__(self):
        self.reads = 0

    def schema(self, fields, database=None):
        self.reads += 1
        return {"tables": [dict(t, schema="main") for t in RAW["tables"]]}


def test_planner_caches_schema_and_plans_and_refuses_before_running():
    m = masking.Masking(None, _Settings())
    backend = _Backend()
    conn = {"name": "c", "db": "sqlite", "updated_at": "x"}
    rules = masking.effective([{"column": "customers.email", "action": "hash"}])
    p1 = m.plan(rules, prepare("SELECT email FROM customers WHERE id = :id", "sqlite"), conn, backend, {})
    p2 = m.plan(rules, prepare("SELECT email FROM customers WHERE id = :id", "sqlite"), conn, backend, {})
    assert p1 is p2 and backend.reads == 1 and p1.actions == ("hash",)
    # The engine reads customers through masked values: the values arrive hashed, rows() leaves them be.
    assert p1.source is not None and p1.source.tables == ("main.customers",)
    engine = sqlite3.connect(":memory:")
    engine.execute("CREATE TABLE customers (id, email, phone, secret, name)")
    engine.execute("INSERT INTO customers VALUES (1, 'jane@example.com', '1', 's', 'Jane')")
    for name, function in masking.source_functions(m.hasher()):
        engine.create_function(name, 1, function, deterministic=True)
    rendered = render(prepare(p1.source.sql, "sqlite"), {"id": 1}, "qmark")
    rows = engine.execute(rendered.sql, rendered.args).fetchall()
    assert p1.rows(rows) == rows == [(hmac.new(b"k", b"jane@example.com", hashlib.sha256).hexdigest()[:16],)]
    assert m.plan(rules, prepare("SHOW TABLES", "mysql"), conn, backend, {}) is None
    with pytest.raises(QagError) as info:
        m.plan(rules, prepare("SELECT version()", "sqlite"), conn, backend, {})
    assert info.value.code == "mask_unresolvable"
    # A changed connection row is another schema entry: read again.
    m.plan(rules, prepare("SELECT email FROM customers", "sqlite"), dict(conn, updated_at="y"), backend, {})
    assert backend.reads == 2


@pytest.mark.parametrize("sql", ["SELECT /*! email AS */ id FROM customers", "SELECT /*M! email AS */ id FROM customers"])
def test_executable_comments_are_refused(sql):
    # MySQL runs the comment's text: the engine would return email under the name id.
    with pytest.raises(Unresolvable):
        prepare(sql, "mysql").traceable_sql()


def test_comments_are_read_the_engine_way():
    # MySQL: "--x" is not a comment (no space after --); "# ..." is one. Whatever sqlglot thinks.
    text = prepare("SELECT id # , email\nFROM customers WHERE id = :id", "mysql").traceable_sql()
    assert "email" not in text and ":id" not in text
    assert lineage(prepare("SELECT id -- , email\nFROM customers", "postgres").traceable_sql(),
                   "postgres") == [("id", ["customers.id"])]


def test_unsupported_dialect_refused():
    class Other(_Backend):
        dialect = "h2"
    with pytest.raises(QagError) as info:
        masking.Masking(None, _Settings()).plan((("t.c", "hash"),), prepare("SELECT 1", "sqlite"),
                                                {"name": "c", "db": "h2"}, Other(), {})
    assert info.value.code == "mask_unresolvable"


# --- actions on values ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value,expected", [
    ("jane@example.com", "j***@example.com"), ("@x.org", "***@x.org"), ("Bo", "B***"),
    ("+44 7700 900123", "+**************"), ("", None), (None, None), (42, None), (b"abc", None), ("x", "x***"),
])
def test_mask_value(value, expected):
    assert masking.mask_value(value) == expected


def test_hash_value():
    h = masking.Hasher(b"key")
    expected = hmac.new(b"key", b"42", hashlib.sha256).hexdigest()[:16]
    assert h(42) == h("42") == h(b"42") == expected
    assert h(None) is None
    for key in (b"", b"k" * 64, b"long" * 40, "clé".encode()):   # block-size edge cases of RFC 2104
        assert masking.Hasher(key)("jane@example.com") == hmac.new(key, b"jane@example.com",
                                                                   hashlib.sha256).hexdigest()[:16]
    assert h("a") == h("a") != h("b")


VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=True), st.decimals(allow_nan=True),
                   st.binary(), st.text(), st.datetimes(), st.dates(), st.booleans(),
                   st.text().map(lambda t: t + "\ud800"),   # a lone surrogate, as a broken driver may hand over
                   st.binary().map(bytearray), st.times(), st.timedeltas())


@settings(max_examples=300, deadline=None)
@given(VALUES)
def test_actions_never_raise(value):
    h = masking.Hasher(b"k")
    out = h(value)
    assert out is None if value is None else len(out) == 16
    masked = masking.mask_value(value)
    assert masked is None or isinstance(masked, str)
    assert masking.null_value(value) is None


def test_driver_types():
    h = masking.Hasher(b"k")
    assert h(decimal.Decimal("1.50")) == h("1.50")
    assert h(datetime.datetime(2024, 1, 2, 3, 4, 5)) == h("2024-01-02 03:04:05")


# --- no hash oracle ---------------------------------------------------------------------------------------------
OWN_LABEL = b"qag mask key: the hash of a caller's own /execute_sql rules"
ORACLE = {"tables": [
    {"name": "people", "type": "table", "columns": [{"name": "id", "type": "int"}, {"name": "ssn", "type": "text"}]},
    {"name": "notes", "type": "table", "columns": [{"name": n, "type": "text"} for n in ("id", "body", "ssn")]},
    {"name": "log", "type": "table", "columns": [{"name": n, "type": "text"} for n in ("id", "body")]},
    {"name": "nv", "type": "view", "columns": [{"name": "id", "type": "text"}, {"name": "s", "type": "text"}]},
]}


def oracle_schema(dialect: str) -> Schema:
    db = "main" if dialect == "sqlite" else "shop"
    return Schema({"tables": [dict(t, schema=db) for t in ORACLE["tables"]]}, dialect, db)


def test_the_own_key_is_derived_from_the_mask_key():
    assert masking.own_key(b"k") == hmac.new(b"k", OWN_LABEL, hashlib.sha256).digest()
    assert masking.own_key(b"k") != masking.own_key(b"l") and masking.own_key(b"k") != b"k"
    m = masking.Masking(None, _Settings())
    own = m.own_hasher()
    assert own("x") == hmac.new(masking.own_key(b"k"), b"x", hashlib.sha256).hexdigest()[:16] != m.hasher()("x")
    assert set(own.pads) == {"qag_mask_own_ipad", "qag_mask_own_opad"}
    assert set(m.hasher().pads) == {"qag_mask_ipad", "qag_mask_opad"}
    assert set(own.pads.values()).isdisjoint(m.hasher().pads.values())


def test_a_callers_own_hash_ranks_below_the_administrators():
    """own_rules marks a caller's own `hash`: where an administrator's rule hashes the column too, the
    administrators' `hash` (and key) wins; any stricter action of either wins over both; `keep` loses to it."""
    admin = [{"column": "people.ssn", "action": "hash"}, {"column": "notes.id", "action": "keep"},
             {"column": "notes.ssn", "action": "hash"}]
    own = masking.own_rules([{"column": "people.ssn", "action": "hash"}, {"column": "notes.body", "action": "hash"},
                             {"column": "notes.id", "action": "hash"}, {"column": "notes.ssn", "action": "mask"}])
    rules = masking.effective(admin, own)
    p = masking.MaskPlan(trace("SELECT p.ssn, n.body, n.id, n.ssn FROM people p, notes n", oracle_schema("sqlite")),
                         rules, masking.Hasher(b"k"), None, masking.Hasher(masking.own_key(b"k")))
    assert p.actions == ("hash", masking.OWN_HASH, masking.OWN_HASH, "mask")
    # The value path (no rewrite) hashes with each rule's own key; history says `hash` for both.
    [row] = p.rows([("1", "1", "1", "Bo")])
    assert row == (masking.Hasher(b"k")("1"), masking.Hasher(masking.own_key(b"k"))("1"),
                   masking.Hasher(masking.own_key(b"k"))("1"), "B***")
    assert [r["action"] for r in p.report(["a", "b", "c", "d"])] == ["hash", "hash", "hash", "mask"]
    assert masking.fingerprint(masking.effective(own)) != masking.fingerprint(masking.effective(
        [{"column": c, "action": "hash" if a == masking.OWN_HASH else a} for c, a in own]))
    # A stored rule can't say OWN_HASH (only own_rules makes it): read as a corrupt rule, it hides everything.
    assert masking.effective([{"column": "t.c", "action": masking.OWN_HASH}]) == (("*.*", "drop"),)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_engine_hashes_a_callers_own_rule_with_the_own_keys_pads(dialect):
    if dialect == "postgres":
        pytest.importorskip("pglast")
    sql = "SELECT n.body, p.ssn FROM notes n JOIN people p ON p.ssn = n.body"
    rules = masking.effective([{"column": "people.ssn", "action": "hash"}],
                              masking.own_rules([{"column": "notes.body", "action": "hash"}]))
    source = masking.at_source(prepare(sql, dialect), oracle_schema(dialect), rules)
    assert source.hashes and source.own_hashes
    if dialect == "sqlite":
        assert "qag_mask_own_hash(\"body\")" in source.sql and "qag_mask_hash(\"ssn\")" in source.sql
    else:
        assert source.sql.count(":qag_mask_own_ipad") == 1 and source.sql.count(":qag_mask_ipad") == 1
    # Only the caller's own rule: only the own key's pads are needed.
    own = masking.at_source(prepare(sql, dialect), oracle_schema(dialect),
                            masking.effective(masking.own_rules([{"column": "*.ssn", "action": "hash"}])))
    assert own.own_hashes and not own.hashes and "qag_mask_ipad" not in own.sql


def test_attack_one_a_join_of_own_hashes_with_the_administrators_matches_nothing():
    """Candidates a writer put into notes.body, hashed by its own rule, against people.ssn hashed by its key's rule:
    on the engine, through the functions the gateway registers, no candidate matches (with one key, one did)."""
    m = masking.Masking(None, _Settings())
    engine = sqlite3.connect(":memory:")
    engine.execute("CREATE TABLE people (id int, ssn text)")
    engine.execute("CREATE TABLE notes (id text, body text, ssn text)")
    engine.execute("INSERT INTO people VALUES (1, '123-45-6789')")
    engine.executemany("INSERT INTO notes (id, body) VALUES (?, ?)", [("1", "000"), ("2", "123-45-6789")])
    for name, function in m.source_functions():
        engine.create_function(name, 1, function, deterministic=True)
    sql = "SELECT n.id, p.id AS person FROM notes n JOIN people p ON p.ssn = n.body"
    key_rules = [{"column": "people.ssn", "action": "hash"}]
    own = [{"column": "notes.body", "action": "hash"}]
    with_own = masking.effective(key_rules, masking.own_rules(own))
    source = masking.at_source(prepare(sql, "sqlite"), oracle_schema("sqlite"), with_own)
    assert engine.execute(source.sql).fetchall() == []
    # What the fix stops: the caller's rule hashed with the administrators' key matched the real SSN.
    same_key = masking.at_source(prepare(sql, "sqlite"), oracle_schema("sqlite"), masking.effective(key_rules, own))
    assert engine.execute(same_key.sql).fetchall() == [("2", 1)]


WRITES = {
    "all": ["INSERT INTO notes (id, ssn) VALUES (1, 'x')", "INSERT INTO notes (id, body) VALUES (1, 'x')",
            "INSERT INTO notes VALUES (1, 'a', 'x')", "INSERT INTO notes (id, ssn) SELECT 1, 'x'",
            "UPDATE notes SET ssn = 'x' WHERE id = 1", "DELETE FROM notes WHERE id = 1",
            "WITH v AS (SELECT 1 AS a) INSERT INTO notes (id, ssn) SELECT a, 'x' FROM v",
            "INSERT INTO nv (id, s) VALUES (1, 'x')", "UPDATE nv SET s = 'x'",
            "INSERT INTO log (id, body) SELECT id, s FROM nv",
            "INSERT INTO log (id, body) SELECT id, ssn FROM people"],
    "sqlite": ["INSERT OR REPLACE INTO notes (id, ssn) VALUES (1, 'x')",
               "INSERT INTO notes (id, ssn) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET ssn = excluded.ssn",
               "UPDATE log SET body = 'x' FROM notes WHERE notes.id = log.id"],
    "mysql": ["INSERT INTO notes SET id = 1, ssn = 'x'", "INSERT notes (id, ssn) VALUES (1, 'x')",
              "INSERT INTO notes (id, ssn) VALUES (1, 'x') ON DUPLICATE KEY UPDATE ssn = 'y'",
              "INSERT IGNORE INTO notes (id, ssn) VALUES (1, 'x')", "UPDATE log, notes SET notes.ssn = log.body",
              "UPDATE notes n JOIN log l ON l.id = n.id SET n.ssn = l.body"],
    "postgres": ["INSERT INTO notes AS n (id, ssn) VALUES (1, 'x') ON CONFLICT (id) DO UPDATE SET ssn = 'y'",
                 "MERGE INTO notes n USING log l ON l.id = n.id WHEN MATCHED THEN UPDATE SET ssn = l.body "
                 "WHEN NOT MATCHED THEN INSERT (id, ssn) VALUES (l.id, l.body)",
                 "MERGE INTO log l USING notes n ON l.id = n.id WHEN MATCHED THEN UPDATE SET body = 'x'",
                 "WITH w AS (INSERT INTO notes (id, ssn) VALUES (1, 'x')) SELECT 1 AS one",
                 "UPDATE notes n SET ssn = 'x'", "INSERT INTO shop.notes (id, ssn) VALUES (1, 'x')"],
}


def _assert_refused(dialect: str, sql: str, rules: list, match: str) -> None:
    """masking.at_source refuses `sql` under `rules` (against the oracle schema), with a reason matching `match`."""
    if dialect == "postgres":
        pytest.importorskip("pglast")
    with pytest.raises(Unresolvable, match=match):
        masking.at_source(prepare(sql, dialect), oracle_schema(dialect), masking.effective(rules))


@pytest.mark.parametrize("dialect,sql", [(d, sql) for d in DIALECTS for sql in WRITES["all"] + WRITES[d]])
def test_attack_two_a_masked_write_naming_a_table_with_masked_columns_or_a_view_is_refused(dialect, sql):
    """`*.ssn → hash` covers notes.ssn: a write into it would let the caller read its own candidates back hashed
    with the administrators' key. Refused before the rewrite, by every table the statement names (written or read),
    and every view (its rows land in tables it doesn't name: nv renames notes.ssn)."""
    _assert_refused(dialect, sql, [{"column": "*.ssn", "action": "hash"}], "a write can't")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_masked_write_into_tables_without_masked_columns_runs(dialect):
    if dialect == "postgres":
        pytest.importorskip("pglast")
    for rules in ([{"column": "*.ssn", "action": "hash"}], masking.own_rules([{"column": "*.ssn", "action": "hash"}])):
        effective = masking.effective(rules)
        for sql in ("INSERT INTO log (id, body) VALUES (1, 'x')", "UPDATE log SET body = 'y' WHERE id = 1",
                    "DELETE FROM log WHERE id = 1"):
            assert masking.at_source(prepare(sql, dialect), oracle_schema(dialect), effective) is None
    # Only `keep` rules mask nothing: a view may be written.
    keep = masking.effective([{"column": "*.ssn", "action": "keep"}])
    assert masking.at_source(prepare("INSERT INTO nv (id, s) VALUES (1, 'x')", dialect), oracle_schema(dialect),
                             keep) is None


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql", [
    "SELECT id FROM people WHERE ssn = qag_mask_hash('123-45-6789')",
    "SELECT id FROM people WHERE ssn = QAG_MASK_OWN_HASH('123-45-6789')",
    "SELECT qag_mask_text(body) AS b FROM log",
])
def test_the_gateways_own_function_names_are_refused(sql, dialect):
    """SQLite registers them on a masked call's connection: a caller's own call would hash a value of its choosing
    with the administrators' key (allowed_functions naming one would otherwise let it through)."""
    _assert_refused(dialect, sql, [{"column": "people.ssn", "action": "hash"}], "gateway's own")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_own_keys_pads_names_are_refused_as_placeholders(dialect):
    for name in ("qag_mask_own_ipad", "qag_mask_own_opad"):
        _assert_refused(dialect, f"SELECT ssn, :{name} AS p FROM people", [{"column": "people.ssn", "action": "hash"}],
                        "gateway's own")


def test_mysql_a_table_behind_a_number_is_traced_and_located():
    """MySQL reads `1e1from customers` as 1e1 FROM customers: the trace reads the table's columns and the rewrite
    finds the reference to wrap (sqlglot alone read `1e1from` as one name and left the table unmasked)."""
    sql = "SELECT email, 1e1from customers"
    assert lineage(prepare(sql, "mysql").traceable_sql(), "mysql") == [("email", ["customers.email"]),
                                                                      ("1e1", [])]
    nested = ("SELECT c.id FROM customers c, (SELECT 1 AS `1e1from`) t "
              "WHERE EXISTS (SELECT 1e1from customers WHERE email LIKE 'a%' AND id = c.id)")
    found = [(sql_start, table) for sql_start, _end, _schema, table, _alias, _cte in prepare(nested, "mysql")
             .table_references()]
    assert [table for _, table in found] == ["customers", "customers"]
    assert found[1][0] == nested.index("customers WHERE")


def test_mysql_a_table_behind_a_user_variable_is_located_and_a_foreign_space_is_refused():
    """`@x. from customers` is a variable and then FROM (the rewrite must find and wrap that table); a name holding
    what sqlglot reads as a space can't be located as one name: refused, never read as two words."""
    nested = "SELECT c.id FROM customers c WHERE EXISTS (SELECT @x. from customers WHERE email LIKE 'a%' AND id = c.id)"
    found = [r[3] for r in prepare(nested, "mysql").table_references()]
    assert found == ["customers", "customers"]
    assert prepare("SELECT email, @x. from customers", "mysql").traceable_sql() == "SELECT email, @v from customers"
    with pytest.raises(Unresolvable):
        prepare("SELECT email AS e\u00a0f FROM customers", "mysql").table_references()
    assert [r[3] for r in prepare("SELECT @\u00a0 from customers", "mysql").table_references()] == ["customers"]
