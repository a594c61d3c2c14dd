"""Statement preparation, paging windows, and per-call rendering (contract 3.5.1, 3.6, 4.3)."""

import json
import math
import sqlite3
from pathlib import Path

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

from qag.errors import QagError
from qag.sql import lexer
from qag.sql import prepare as prepare_module
from qag.sql.prepare import check_text_values, prepare, render
from qag.sql.writes import read_only_message

CASES = Path(__file__).resolve().parents[1] / "cases" / "paging"
DIALECTS = ("sqlite", "mysql", "postgres")


def rows_of(path):
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip() and not line.startswith("#"):
            yield n, line.split("\t")


def error(fn, *args, **kw):
    with pytest.raises(QagError) as info:
        fn(*args, **kw)
    return info.value


# ---------------------------------------------------------------- the prepared statement


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql,stripped,multiple,first", [
    ("SELECT 1;", "SELECT 1", False, "select"),
    ("SELECT 1 ; ;\n\t", "SELECT 1", False, "select"),
    ("  /* c */ Select 1", "  /* c */ Select 1", False, "select"),
    ("-- c\nWITH x AS (SELECT 1) SELECT * FROM x;", "-- c\nWITH x AS (SELECT 1) SELECT * FROM x", False, "with"),
    ("SELECT 1; SELECT 2;", "SELECT 1; SELECT 2", True, "select"),
    ("SELECT ';'", "SELECT ';'", False, "select"),
    ("SELECT 1 -- ;", "SELECT 1 -- ;", False, "select"),
    ("((SELECT 1))", "((SELECT 1))", False, "select"),
    ("", "", False, ""),
    (" ; ", "", False, ""),
    ("-- only", "-- only", False, ""),
])
def test_statement_fields(dialect, sql, stripped, multiple, first):
    p = prepare(sql, dialect)
    assert (p.sql, p.multiple, p.first_keyword, p.dialect) == (stripped, multiple, first, dialect)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_leading_bom_is_dropped(dialect):
    p = prepare("\ufeffSELECT :a;", dialect)
    assert (p.sql, p.first_keyword, p.write_ops, p.bound_names) == ("SELECT :a", "select", frozenset(), ("a",))
    assert render(p, {"a": 1}, "qmark").sql == "SELECT ?"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_unreadable_statements(dialect):
    for sql, reason in [("SELECT 'abc", "unterminated string literal"), ("SELECT 1 /* x", "unterminated comment"),
                        ("/* x */", "no statement"), ("42", "it does not start with a keyword")]:
        p = prepare(sql, dialect)
        assert p.unreadable == reason
        assert p.write_ops == frozenset({prepare_module.UNREADABLE_OP})
        assert not p.in_sql_window
        err = error(render, p, {}, "qmark", 11, 0)
        assert err.code == "invalid_request"


def test_aliases_and_unknown_dialect():
    assert prepare("SELECT 1", "mariadb").dialect == "mysql"
    assert prepare("SELECT 1", "postgresql").dialect == "postgres"
    with pytest.raises(ValueError):
        prepare("SELECT 1", "oracle")
    with pytest.raises(ValueError):
        render(prepare("SELECT 1", "sqlite"), {}, "pyformat")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_placeholder_names(dialect):
    cast = "x" if dialect == "sqlite" else "x::e"   # SQLite has no :: cast: it reads a variable of its own there
    sql = ("SELECT :b, {t2}, :a, :b, ':c', \"{t9}\", /* :d {t8} */ " + cast + ", '{t1}-{t2}', {t3}, :_z -- :f {t7}\n")
    p = prepare(sql, dialect)
    assert p.bound_names == ("b", "a", "_z")
    # In MySQL "..." is a string, so {t9} inside it is a placeholder there.
    if dialect == "mysql":
        assert p.text_names == ("t2", "t9", "t1", "t3")
    else:
        assert p.text_names == ("t2", "t1", "t3")
    assert p.placeholders == p.bound_names + p.text_names


def test_text_placeholders_off_for_adhoc_sql():
    p = prepare("SELECT {a}, '{b}', :c", "sqlite", text_placeholders=False)
    assert (p.bound_names, p.text_names) == (("c",), ())
    assert render(p, {"c": 1}, "qmark").sql == "SELECT {a}, '{b}', ?"
    assert prepare("SELECT {a}", "sqlite") is not p


def test_dollar_quoted_and_escape_strings_hide_placeholders():
    p = prepare("SELECT $$ :a {b} $$, E'\\' :c', $t$ {d} $t$", "postgres")
    assert (p.bound_names, p.text_names) == ((), ())


def test_mysql_comment_rules_decide_what_is_a_placeholder():
    assert prepare("SELECT 1 --x :a", "mysql").bound_names == ("a",)
    assert prepare("SELECT 1 -- :a", "mysql").bound_names == ()
    assert prepare("SELECT 1 # :a", "mysql").bound_names == ()
    assert prepare("SELECT 1 --x :a", "postgres").bound_names == ()
    assert prepare("SELECT 'x\\' :a '", "mysql").bound_names == ()
    assert prepare("SELECT 'x\\' :a '", "sqlite").bound_names == ("a",)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql,expected", [
    ("SELECT * FROM t", True),
    ("select * from t", True),
    ("WITH x AS (SELECT 1) SELECT * FROM x", True),
    ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) SELECT n FROM r", True),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", True),
    ("WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM x", False),
    ("(SELECT 1) UNION (SELECT 2)", "mysql"),   # MySQL/MariaDB limit a parenthesised query expression (issue 17)
    ("EXPLAIN SELECT 1", False),
    ("SHOW TABLES", False),
    ("VALUES (1)", False),
    ("INSERT INTO t VALUES (1)", False),
    ("SELECT * FROM t FOR UPDATE", False),
    ("SELECT * INTO x FROM t", False),
    ("SELECT 1 /*! , 2 */", False),
    ("SELECT 1; SELECT 2", False),
    ("SELECT (SELECT 1 FOR UPDATE)", True),
])
def test_in_sql_window(dialect, sql, expected):
    assert prepare(sql, dialect).in_sql_window is (expected is True or expected == dialect)


@pytest.mark.parametrize("dialect,sql,limit,offset", [
    ("sqlite", "SELECT 1 LIMIT 5", ("lit", 5), None),
    ("sqlite", "SELECT 1 LIMIT 5 OFFSET :o", ("lit", 5), ("param", "o")),
    ("sqlite", "SELECT 1 LIMIT :o, {n}", ("text", "n"), ("param", "o")),
    ("mysql", "SELECT 1 LIMIT 2, 3 -- c", ("lit", 3), ("lit", 2)),
    ("mysql", "SELECT 1 FETCH FIRST 3 ROWS ONLY", ("lit", 3), None),
    ("postgres", "SELECT 1 LIMIT ALL OFFSET 2", None, ("lit", 2)),
    ("postgres", "SELECT 1 OFFSET 2 ROW", None, ("lit", 2)),
    ("postgres", "SELECT 1 OFFSET 2 ROWS FETCH NEXT ROW ONLY", ("lit", 1), ("lit", 2)),
    ("postgres", "SELECT 1 FETCH FIRST 4 ROWS ONLY OFFSET 1", ("lit", 4), ("lit", 1)),
    # Contract 3.6's standard forms on every engine, though SQLite's grammar (and MySQL's) has none of them.
    ("sqlite", "SELECT 1 OFFSET 2", None, ("lit", 2)),
    ("sqlite", "SELECT 1 LIMIT ALL", None, None),
    ("sqlite", "SELECT 1 OFFSET 2 ROWS FETCH FIRST 3 ROWS ONLY", ("lit", 3), ("lit", 2)),
    ("mysql", "SELECT 1 LIMIT ALL OFFSET :o", None, ("param", "o")),
    ("mysql", "SELECT 1 OFFSET 2", None, ("lit", 2)),
])
def test_own_window(dialect, sql, limit, offset):
    w = prepare(sql, dialect).window
    assert (w.limit, w.offset) == (limit, offset)
    assert w.has_params == any(op is not None and op[0] != "lit" for op in (limit, offset))


@pytest.mark.parametrize("dialect,sql", [
    ("sqlite", "SELECT 1 OFFSET 2 LIMIT 3"),                 # neither the engine's form nor the standard's
    ("sqlite", "SELECT 1 OFFSET 2 FETCH FIRST 3 ROWS ONLY"),  # the standard's needs ROWS after the offset
    ("mysql", "SELECT 1 LIMIT 5 OFFSET 2 ROWS"),
    ("postgres", "SELECT 1 LIMIT 2, 3"),
    ("postgres", "SELECT 1 LIMIT 2 LIMIT 3"),
    ("postgres", "SELECT 1 LIMIT :n::int"),
    ("postgres", "SELECT 1 LIMIT 1.5"),
    ("postgres", "SELECT 1 LIMIT (5)"),
    ("mysql", "SELECT 1 LIMIT 5 PROCEDURE ANALYSE()"),
])
def test_unreadable_windows_leave_the_statement_alone(dialect, sql):
    p = prepare(sql, dialect)
    assert p.window is None and not p.in_sql_window
    r = render(p, {"n": 1}, "format", 11, 10)
    assert (r.sql, r.windowed) == (p.sql.replace(":n", "%s"), False)


def test_write_ops_message():
    assert read_only_message(frozenset({"update", "delete"})) == (
        "Only read-only statements (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) are allowed - not one that writes "
        "(delete, update). Set QUERYAPIGATE_ALLOW_WRITES=1 to lift this restriction.")


def test_sqlglot_finds_writes_the_keyword_rule_misses():
    # No INSERT/UPDATE/DELETE word, but the statement creates a table: both readers' writes count.
    p = prepare("WITH x AS (SELECT 1) SELECT * FROM x", "postgres")
    assert p.write_ops == frozenset()
    p = prepare("CREATE TABLE x AS WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "postgres")
    assert p.write_ops == frozenset({"create", "delete"})


def test_sqlglot_failure_alone_is_not_a_write():
    p = prepare("SELECT * FROM t WHERE a = ANY(ARRAY[1,2]) AND b ~ 'x' AND c ~* to_tsquery('q')", "sqlite")
    assert p.write_ops == frozenset() and p.unreadable is None


# ---------------------------------------------------------------- rendering


def render_cases():
    for n, cols in rows_of(CASES / "render.tsv"):
        yield pytest.param(*cols, id=f"render:{n}")


@pytest.mark.parametrize("dialect,style,sql,values,fetch,offset,expected_sql,expected_args,windowed",
                         list(render_cases()))
def test_render_corpus(dialect, style, sql, values, fetch, offset, expected_sql, expected_args, windowed):
    p = prepare(sql.replace("↵", "\n"), dialect)
    r = render(p, json.loads(values), style, None if fetch == "-" else int(fetch), int(offset))
    assert r.sql == expected_sql.replace("↵", "\n")
    assert list(r.args) == json.loads(expected_args)
    assert r.windowed is (windowed == "true")
    # Made without NamedTuple's __new__: still exactly a Rendered of four fields, in their order.
    assert type(r) is prepare_module.Rendered and len(r) == 4 and (r.sql, r.args, r.windowed, r.limit) == tuple(r)
    assert (r.limit is None) is not r.windowed
    if r.args and style == "format":
        # What a format-style driver does with it: every doubled % comes back single, every %s takes a value.
        assert (r.sql % tuple("<v>" for _ in r.args)).count("<v>") == len(r.args)


@pytest.fixture(scope="module")
def db():
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"name {i:02d}") for i in range(1, 26)])
    yield conn
    conn.close()


def fetch_page(db, sql, values, page, size):
    """What the runner does for one page: render, execute, slice when the window isn't in the SQL."""
    offset = (page - 1) * size
    r = render(prepare(sql, "sqlite"), values, "qmark", size + 1, offset)
    rows = db.execute(r.sql, r.args).fetchall()
    if not r.windowed:
        rows = rows[offset:offset + size + 1]
    else:
        assert len(rows) <= r.limit
    return [row[0] for row in rows[:size]], len(rows) > size


def page_cases():
    for n, cols in rows_of(CASES / "sqlite_pages.tsv"):
        yield pytest.param(*cols, id=f"pages:{n}")


@pytest.mark.parametrize("sql,values,page,size,expected,has_more", list(page_cases()))
def test_pages_on_sqlite(db, sql, values, page, size, expected, has_more):
    ids, more = fetch_page(db, sql, json.loads(values), int(page), int(size))
    assert ids == json.loads(expected)
    assert more is (has_more == "true")


def test_walking_every_page_of_an_own_window(db):
    # LIMIT 17 OFFSET 3 in pages of 5: rows 4..20, then nothing, and has_more false exactly on the last page.
    seen, page = [], 1
    while True:
        ids, more = fetch_page(db, "SELECT id FROM t ORDER BY id LIMIT 17 OFFSET 3", {}, page, 5)
        seen += ids
        if not more:
            break
        page += 1
    assert seen == list(range(4, 21)) and page == 4


def test_text_placeholder_inside_a_literal_runs_on_sqlite(db):
    p = prepare("SELECT id FROM t WHERE name LIKE '%{q}%' AND name <> '{q}' ORDER BY id", "sqlite")
    assert p.text_names == ("q",)
    r = render(p, {"q": "1"}, "qmark")
    assert [row[0] for row in db.execute(r.sql, r.args)] == [1, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 21]


def test_bound_values_are_data_not_sql(db):
    # B3.6: injection text bound as a parameter comes back verbatim; the table is intact.
    evil = "x'; DROP TABLE t; --"
    r = render(prepare("SELECT :v AS v", "sqlite"), {"v": evil}, "qmark")
    assert db.execute(r.sql, r.args).fetchall() == [(evil,)]
    assert db.execute("SELECT count(*) FROM t").fetchone() == (25,)


# ---------------------------------------------------------------- values


def test_missing_bound_parameters_are_listed_in_order():
    p = prepare("SELECT :b, :a, :b, :c", "sqlite")
    err = error(render, p, {"c": 1}, "qmark")
    assert (err.code, err.status, err.message) == ("param_required", 400,
                                                   "No value provided for parameter(s): b, a")


def test_null_binds_sql_null():
    assert render(prepare("SELECT :a", "postgres"), {"a": None}, "format").args == (None,)


@pytest.mark.parametrize("value", [[1], {"a": 1}, float("nan"), float("inf"), -math.inf, b"x", (1,), object()])
def test_unusable_bound_values(value):
    err = error(render, prepare("SELECT :a", "sqlite"), {"a": value}, "qmark")
    assert (err.code, err.message) == ("param_invalid",
                                       "Parameter 'a' must be a string, finite number, boolean or null")


@pytest.mark.parametrize("value,ok", [(2**63 - 1, True), (-(2**63), True), (2**63, False), (-(2**63) - 1, False)])
def test_bound_integers_must_fit_64_bits(value, ok):
    p = prepare("SELECT :a", "sqlite")
    if ok:
        assert render(p, {"a": value}, "qmark").args == (value,)
    else:
        err = error(render, p, {"a": value}, "qmark")
        assert err.code == "param_invalid" and "'a'" in err.message


@pytest.mark.parametrize("value", [-1, "-1", "1.5", 1.5, "", " 3", None, True, "3a", float("inf"), [3]])
def test_window_operands_must_be_whole_numbers(value):
    for sql, word in (("SELECT id FROM t LIMIT :n", "LIMIT :n"), ("SELECT id FROM t LIMIT 5 OFFSET :n", "OFFSET :n")):
        for fetch in (11, None):
            err = error(render, prepare(sql, "mysql"), {"n": value}, "format", fetch, 0)
            assert (err.code, err.message) == ("param_invalid", f"{word} must be a non-negative whole number")


def test_missing_window_operand_is_required():
    err = error(render, prepare("SELECT id FROM t LIMIT :n", "sqlite"), {}, "qmark", 11, 0)
    assert (err.code, err.message) == ("param_required", "No value provided for parameter(s): n")


@pytest.mark.parametrize("huge", [str(10**30), "1" * 5000, "0" * 5000 + "7"])
def test_huge_windows_are_clamped_to_what_engines_take(huge):
    r = render(prepare("SELECT id FROM t LIMIT :n OFFSET :o", "sqlite"), {"n": 10**30, "o": huge},
               "qmark", 11, 10)
    assert r.sql.endswith(f"\nLIMIT 11 OFFSET {7 + 10 if huge.endswith('7') else 2**63 - 1}")
    r = render(prepare("SELECT id FROM t LIMIT {n}", "sqlite"), {"n": huge}, "qmark")
    assert r.sql.endswith(f"LIMIT {7 if huge.endswith('7') else 2**63 - 1} OFFSET 0")


# A MySQL server whose sql_mode has NO_BACKSLASH_ESCAPES or ANSI_QUOTES ends a literal at a backslash-quote. Values
# are spliced into MySQL's text at the slots qag reads, so a slot that such a server reads elsewhere (inside a
# literal or comment, or after a literal the values' own quotes would close) would run a caller's value as SQL.
@pytest.mark.parametrize("sql", [
    "SELECT 'a\\'' AS p, :v AS q -- '",        # NBE: the slot is inside the literal that starts after 'a\'
    "SELECT 'x\\'' , :v",                       # NBE leaves a literal open: a value's quotes would close it
    "SELECT 'a\\'b', :v",
    "SELECT \"a\\\"\" AS p, :v AS q -- \"",     # ANSI_QUOTES: "a\" is an identifier
    "SELECT 'a\\'' , {v} -- '",                   # a text placeholder the same way
    "SELECT ':v\\'', :w -- '",
    "SELECT id[', ' , :v , ''] FROM items",        # MSSQL mode: [', ' , '] is a quoted name
    "SELECT name /*! , '*/ , :v AS x -- ' */ FROM items",   # the server reads '*/' inside /*! */ as a literal
])
def test_mysql_slots_another_sql_mode_reads_elsewhere_are_refused(sql):
    p = prepare(sql, "mysql")
    assert p.unreadable is not None
    assert prepare_module.UNREADABLE_OP in p.write_ops    # (with the executable comment's own op, where there is one)
    assert error(render, p, {"v": "x", "w": "y"}, "format").code == "invalid_request"


@pytest.mark.parametrize("sql,bound", [
    ("SELECT 'a\\\\b', :v", ("v",)),              # 'a\\b': the same literal in every reading
    ("SELECT 'it''s', :v", ("v",)),
    ("SELECT 'a\\'' AS p -- '", ()),               # no slot: nothing is spliced, the server reads it as written
    ("SELECT :v, 'a\\nb'", ("v",)),
    ("SELECT JSON_EXTRACT(j, '$[0]'), :v FROM t", ("v",)),   # brackets inside a literal
])
def test_mysql_slots_every_sql_mode_reads_alike_are_kept(sql, bound):
    p = prepare(sql, "mysql")
    assert p.unreadable is None and p.bound_names == bound


def test_mysql_brackets_outside_literals_are_refused_with_or_without_slots():
    # MSSQL mode reads [...] as a quoted name: id['] ... [b'] hides a subquery from a reading that sees a string.
    p = prepare("SELECT id['], (SELECT s FROM secret) AS leaked, id AS [b'] FROM items", "mysql")
    assert p.unreadable is not None and "MSSQL" in p.unreadable
    assert prepare("SELECT name /*! STRAIGHT_JOIN */ FROM items", "mysql").unreadable is None   # no slot: a write op


def test_other_dialects_bind_values_so_backslash_readings_dont_refuse():
    # PostgreSQL and SQLite bind values apart from the text: a backslash-quote can't turn a value into SQL there.
    for dialect in ("postgres", "sqlite"):
        assert prepare("SELECT 'C:\\' AS p, :v AS q", dialect).unreadable is None


# B3.7 and contract 3.5.1: text placeholder values.
@pytest.mark.parametrize("value", ["1 OR 1=1; --", "x' OR '1'='1", "3 -- ", [1], None, {"a": 1}, "a\"b", "a;b",
                                   "a(b)", "a*b", "a=b", "a\\b", float("nan"), float("inf"), 2**64])
def test_text_values_refused(value):
    p = prepare("SELECT * FROM t WHERE id = {id}", "sqlite")
    err = error(check_text_values, p, {"id": value})
    assert (err.code, err.status) == ("param_invalid", 400)
    assert err.message.startswith("Placeholder 'id' ")
    assert error(render, p, {"id": value}, "qmark").code == "param_invalid"


@pytest.mark.parametrize("value,bound", [("5", 5), ("-7", -7), ("2.5", 2.5), (3, 3), (1.5, 1.5), (True, True),
                                         ("abc", "abc"), ("a b.c,d:e@f%g+h/i-j", "a b.c,d:e@f%g+h/i-j"),
                                         ("", ""), ("Zürich", "Zürich"), ("99999999999999999999", "99999999999999999999"),
                                         # past int()'s 4300 digits, past a double's range: text, not a 500
                                         ("1" * 5000, "1" * 5000), ("1" * 400 + ".5", "1" * 400 + ".5")])
def test_text_values_accepted(value, bound):
    p = prepare("SELECT {v}, '{v}'", "sqlite")
    check_text_values(p, {"v": value})
    r = render(p, {"v": value}, "qmark")
    assert r.sql == "SELECT ?, ?"
    assert r.args[0] == bound and type(r.args[0]) is type(bound)
    assert r.args[1] == ("TRUE" if value is True else str(value))


def test_missing_text_placeholders():
    p = prepare("SELECT {b}, '{a}', {b}, :c", "sqlite")
    err = error(check_text_values, p, {})
    assert (err.code, err.message) == ("param_required", "No value provided for placeholder(s): b, a")
    check_text_values(p, {"a": 1, "b": 2})
    err = error(render, p, {"a": 1, "b": 2}, "qmark")
    assert err.message == "No value provided for parameter(s): c"
    err = error(render, p, {"c": 1}, "qmark")
    assert err.message == "No value provided for placeholder(s): b, a"


def test_no_text_placeholders_nothing_to_check():
    check_text_values(prepare("SELECT :a", "sqlite"), {})


_values = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({"a": _values, "b": _values, "n": st.integers(0, 50)}),
       st.fixed_dictionaries({"a": _values, "b": _values, "n": st.integers(0, 50)}),
       st.sampled_from(DIALECTS), st.sampled_from(("qmark", "format")))
def test_values_never_enter_the_sql_text(v1, v2, dialect, style):
    cast = "x" if dialect == "sqlite" else "x::int"   # SQLite reads :int as a variable of its own (refused)
    sql = f"SELECT :a, {cast}, ':a', '%' FROM t WHERE b = :b OR c = :a -- :b\nORDER BY 1"
    p = prepare(sql, dialect)
    r1 = render(p, v1, style)
    r2 = render(p, v2, style)
    assert r1.sql == r2.sql
    assert r1.args == (v1["a"], v1["b"], v1["a"])
    # With a page, only the window numbers differ, and they come from the page, not from the values.
    assert render(p, v1, style, 6, 5).sql == render(p, v2, style, 6, 5).sql == r1.sql + "\nLIMIT 6 OFFSET 5"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=20), st.sampled_from(DIALECTS))
def test_text_values_are_bound_not_spliced(value, dialect):
    p = prepare("SELECT {v} AS a, 'x{v}y' AS b", dialect)
    try:
        r = render(p, {"v": value}, "qmark")
    except QagError as e:
        assert e.code == "param_invalid"
        return
    assert r.sql == render(p, {"v": "0"}, "qmark").sql
    assert r.sql.count("?") == 2


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("SELCTabc :;'\"`$-#/*!{}\\\n(),.0LIMTOFS")), max_size=50),
       st.sampled_from(DIALECTS))
def test_prepare_and_render_never_crash(sql, dialect):
    p = prepare(sql, dialect)
    try:
        render(p, {"a": 1, "b": "2", "c": 3}, "format", 11, 10)
    except QagError as e:
        assert e.code in ("param_required", "param_invalid", "invalid_request")


# ---------------------------------------------------------------- caching


def test_prepare_is_cached_and_bounded():
    assert prepare("SELECT :a FROM cached", "mysql") is prepare("SELECT :a FROM cached", "mysql")
    assert prepare("SELECT :a FROM cached", "mysql") is not prepare("SELECT :a FROM cached", "postgres")
    assert prepare_module._prepare.cache_info().maxsize == prepare_module.CACHE_SIZE == 4096


def test_warm_calls_neither_tokenize_nor_parse(monkeypatch):
    sql = "SELECT * FROM warm WHERE a = :a AND b LIKE '%{b}%' ORDER BY a LIMIT :n OFFSET 1"
    for style in ("qmark", "format"):
        render(prepare(sql, "postgres"), {"a": 1, "b": "x", "n": 3}, style, 11, 0)

    def boom(*args, **kw):
        raise AssertionError("tokenized or parsed on a warm call")

    monkeypatch.setattr(lexer, "tokenize", boom)
    monkeypatch.setattr(sqlglot, "parse", boom)
    monkeypatch.setattr(sqlglot, "parse_one", boom)
    p = prepare(sql, "postgres")
    r = render(p, {"a": 2, "b": "y", "n": 5}, "format", 11, 10)
    assert r == ("SELECT * FROM warm WHERE a = %s AND b LIKE ('%%' || %s || '%%') ORDER BY a\nLIMIT 0 OFFSET 11",
                 (2, "y"), True, 0)
    r = render(p, {"a": 2, "b": "y", "n": 5}, "qmark", None, 0)
    assert r.sql == "SELECT * FROM warm WHERE a = ? AND b LIKE ('%' || ? || '%') ORDER BY a\nLIMIT 5 OFFSET 1"


def test_a_page_of_a_statement_is_the_same_text_call_after_call():
    """render keeps the text sent per page of a statement: the same str object for the same page (what keys a
    dict by it hashes it once), another for another page, and the text is the template's with the window."""
    from qag.sql.prepare import prepare, render
    prepared = prepare("SELECT id FROM t WHERE id > :id ORDER BY id", "mysql")
    first = render(prepared, {"id": 1}, "format", 11, 0)
    again = render(prepared, {"id": 2}, "format", 11, 0)
    other = render(prepared, {"id": 1}, "format", 11, 10)
    assert first.sql is again.sql and first.args == (1,) and again.args == (2,)
    assert other.sql != first.sql and other.sql.endswith("LIMIT 11 OFFSET 10")
    assert first.sql.startswith("SELECT id FROM t WHERE id > %s ORDER BY id") and first.sql.endswith("LIMIT 11 OFFSET 0")
