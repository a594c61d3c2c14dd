"""qag.sql.pgread: PostgreSQL statements read by PostgreSQL's own parser (pglast); no server needed."""

from __future__ import annotations

import pytest

pytest.importorskip("pglast")

from qag.sql import pgread  # noqa: E402
from qag.sql.prepare import prepare  # noqa: E402


@pytest.mark.parametrize("sql, count", [
    ("SELECT 1", 1),
    ("SELECT 1; SELECT 2", 2),
    ("SELECT $$;$$", 1),
    ("SELECT $tag$ $$; DELETE FROM t; $$ $tag$", 1),
    ("SELECT 1 /* outer /* nested ; */ still comment ; */", 1),
    ("SELECT 'a\\'; DELETE FROM t; --'", 2),          # standard_conforming_strings: the backslash is a character
    ("SELECT E'a\\'; DELETE FROM t; --'", 1),          # an E'' string: the backslash escapes the quote
    ("SELECT U&'\\0061'; SELECT 2", 2),
    ('SELECT 1 AS "a;b"', 1),
    ("SELECT 1 -- ; DELETE FROM t", 1),
])
def test_statements_are_counted_where_postgresql_ends_them(sql, count):
    reading = pgread.read(sql)
    assert reading.failure is None and reading.count == count


@pytest.mark.parametrize("sql, ops, kind_op", [
    ("SELECT * FROM t", set(), ""),
    ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", {"delete"}, ""),
    ("SELECT * INTO copy_of_t FROM t", {"select into"}, ""),
    ("SELECT * FROM t FOR UPDATE", {"lock"}, ""),
    ("EXPLAIN DELETE FROM t", set(), ""),
    ("EXPLAIN (ANALYZE) DELETE FROM t", {"delete"}, ""),
    ("SELECT lo_import('/etc/passwd')", {"lo_import()"}, ""),
    ("SELECT pg_catalog.lo_export(1, '/tmp/x')", {"lo_export()"}, ""),
    ("SELECT * FROM t WHERE id = nextval('s')", {"nextval()"}, ""),
    ("SELECT pg_advisory_lock(1), pg_notify('c', 'm')", {"pg_advisory_lock()", "pg_notify()"}, ""),
    ("SELECT dblink_exec('dbname=x', 'DELETE FROM t')", {"dblink_exec()"}, ""),
    ("SELECT lo_get(1)", set(), ""),                  # reads a large object: not a write
    # functions that run SQL text of their own: what that text calls is unseen, so they count as writing
    ("SELECT query_to_xml($$SELECT pg_terminate_backend(pid) FROM pg_stat_activity$$, true, false, '')",
     {"query_to_xml()"}, ""),
    ("SELECT query_to_xml_and_xmlschema('SELECT 1', true, false, '')", {"query_to_xml_and_xmlschema()"}, ""),
    ("SELECT pg_catalog.query_to_xmlschema('SELECT 1', true, false, '')", {"query_to_xmlschema()"}, ""),
    ("SELECT * FROM ts_stat('SELECT to_tsvector(''a'')')", {"ts_stat()"}, ""),
    ("SELECT ts_rewrite('a'::tsquery, 'SELECT ''a''::tsquery, ''b''::tsquery')", {"ts_rewrite()"}, ""),
    # index maintenance a ROLLBACK doesn't undo, even in a read-only transaction
    ("SELECT brin_summarize_new_values('i'), gin_clean_pending_list('g')",
     {"brin_summarize_new_values()", "gin_clean_pending_list()"}, ""),
    ("SELECT pg_catalog.brin_desummarize_range('i', 5), brin_summarize_range('i', 5)",
     {"brin_desummarize_range()", "brin_summarize_range()"}, ""),
    ("SELECT public.pg_stat_statements_reset()", {"pg_stat_statements_reset()"}, ""),
    # each assigns the transaction an xid, which the read-only call's ROLLBACK doesn't give back
    ("SELECT txid_current(), pg_current_xact_id()", {"txid_current()", "pg_current_xact_id()"}, ""),
    ("SELECT pg_catalog.txid_current() AS a, pg_catalog.pg_current_xact_id() AS b",
     {"txid_current()", "pg_current_xact_id()"}, ""),
    ("SELECT txid_current_if_assigned(), pg_current_xact_id_if_assigned()", set(), ""),
    # written as a field of a value, a function is called all the same (attribute notation)
    ("SELECT (1).pg_cancel_backend AS x", {"pg_cancel_backend()"}, ""),
    ("SELECT ('i'::regclass).brin_summarize_new_values", {"brin_summarize_new_values()"}, ""),
    ("SELECT t.nextval FROM t", {"nextval()"}, ""),
    ("SET search_path = x", set(), "set"),
    ("BEGIN", set(), "transaction"),
    ("COPY t TO STDOUT", set(), "copy"),
])
def test_writes_are_what_the_parser_reads(sql, ops, kind_op):
    reading = pgread.read(sql)
    assert set(reading.write_ops) == ops and reading.kind_op == kind_op


def test_names_arrive_folded_as_postgresql_folds_them():
    reading = pgread.read('SELECT * FROM public."Orders", "ORDERS", Orders, x.y.z')
    assert reading.tables == (("", "", "ORDERS"), ("", "", "orders"), ("", "public", "Orders"), ("x", "y", "z"))


def test_cte_scope_hides_only_what_postgresql_hides():
    assert pgread.read("WITH c AS (SELECT 1) SELECT * FROM c").tables == ()
    # A non-recursive CTE's own body, and a qualified name, read the table.
    assert pgread.read("WITH c AS (SELECT * FROM c) SELECT * FROM c").tables == (("", "", "c"),)
    assert pgread.read("WITH c AS (SELECT 1) SELECT * FROM public.c").tables == (("", "public", "c"),)
    assert pgread.read("WITH RECURSIVE c AS (SELECT 1 UNION SELECT * FROM c) SELECT * FROM c").tables == ()
    # A later CTE sees an earlier one; a quoted name is another name.
    assert pgread.read('WITH a AS (SELECT 1), b AS (SELECT * FROM a) SELECT * FROM b, "A"').tables == (("", "", "A"),)
    # A statement's target is always a table.
    assert pgread.read("WITH t AS (SELECT 1) DELETE FROM t USING t").tables == (("", "", "t"),)


def test_tables_in_fields_of_one_node_type_are_seen():
    assert pgread.read("COPY secret TO STDOUT").tables == (("", "", "secret"),)
    assert pgread.read("SELECT * INTO made FROM t").tables == (("", "", "made"), ("", "", "t"))
    assert pgread.read("SELECT * FROM s TABLESAMPLE SYSTEM (1)").tables == (("", "", "s"),)
    assert pgread.read("INSERT INTO a SELECT * FROM b ON CONFLICT (id) DO UPDATE SET v = f(excluded.v)").functions \
        == (("", "f"),)


def test_functions_table_functions_and_the_grammars_own():
    reading = pgread.read("SELECT billing.f(1), lower(x), EXTRACT(year FROM now()), TRIM(x) "
                          "FROM generate_series(1, 2) g, LATERAL my_srf(g) s")
    assert reading.table_functions == (("", "generate_series"), ("", "my_srf"))
    assert reading.functions == (("", "lower"), ("", "now"), ("billing", "f"))
    assert set(reading.syntax_functions) == {"extract", "btrim"}


def test_sql_json_constructs_are_kept_with_the_version_that_made_them_grammar():
    reading = pgread.read("SELECT json_value(a, '$'), json_query(a, '$'), json_exists(a, '$'), json_scalar(1), "
                          "json_serialize(a), json(a), json_array(1, 2), json_array(SELECT 1), json_arrayagg(a), "
                          "json_object('k': 1), json_objectagg(a: b), json_object('a', 'b'), merge_action() FROM t")
    assert set(reading.grammar_calls) == {
        ("json_value", 17), ("json_query", 17), ("json_exists", 17), ("json_scalar", 17), ("json_serialize", 17),
        ("json", 17), ("merge_action", 17), ("json_array", 16), ("json_arrayagg", 16), ("json_object", 16),
        ("json_objectagg", 16)}
    assert pgread.read("SELECT * FROM json_table('[1]', '$' COLUMNS (a int PATH '$')) j").grammar_calls == (
        ("json_table", 17),)
    assert pgread.read("SELECT json_build_object('a', 1), to_json(x) FROM t").grammar_calls == ()


def test_fields_of_rows_are_names_a_call_may_hide_behind():
    """x.f and (x).f call f(x) when x has no column f: every part after the first is kept, never the first."""
    reading = pgread.read("SELECT p.leakrec, (p).other, (ROW(1)).rec, s.t.c, (p.c).f, p.*, bare, (arr)[1] "
                          "FROM pub p WHERE p.w > 0 AND EXISTS (SELECT 1 FROM q WHERE q.inner_f = 1)")
    assert reading.fields == frozenset({"leakrec", "other", "rec", "t", "c", "f", "w", "inner_f"})
    assert pgread.read("EXPLAIN SELECT x.hidden FROM t x").fields == frozenset({"hidden"})


def test_every_type_named_is_read_as_folded():
    """Casts (every spelling), typed literals, column definition lists, XMLTABLE's and JSON's RETURNING types:
    the server looks each up in its catalog; EXPLAIN without ANALYZE still plans, so still looks them up."""
    reading = pgread.read("SELECT 'a'::regclass, CAST('b' AS pg_catalog.RegType), regproc 'c', 'd'::\"Vault\"[], "
                          "x::text::regnamespace, NULL::int, JSON_VALUE('1', '$' RETURNING plans) "
                          "FROM json_to_record('{}') AS t(x rowtype), "
                          "XMLTABLE('/a' PASSING '<a/>' COLUMNS y xmltype PATH 'y')")
    assert set(reading.types) == {("regclass",), ("pg_catalog", "regtype"), ("regproc",), ("Vault",), ("text",),
                                  ("regnamespace",), ("pg_catalog", "int4"), ("plans",), ("rowtype",), ("xmltype",)}
    assert pgread.read("EXPLAIN SELECT NULL::vault").types == (("vault",),)
    assert pgread.read("SELECT 1").types == ()


def test_a_query_a_cursor_can_page():
    assert pgread.read("SELECT 1 UNION SELECT 2").query
    assert pgread.read("VALUES (1), (2)").query
    assert pgread.read("(SELECT 1) ORDER BY 1").query
    for sql in ("SELECT * FROM t FOR SHARE", "SELECT * INTO x FROM t", "WITH d AS (DELETE FROM t RETURNING *) "
                "SELECT * FROM d", "SHOW search_path", "EXPLAIN SELECT 1", "DELETE FROM t RETURNING *"):
        assert not pgread.read(sql).query, sql


def test_what_the_parser_refuses_is_a_failure_not_an_exception():
    reading = pgread.read("SELECT FROM WHERE")
    assert reading.failure and reading.count == 0
    deep = "SELECT " + "(SELECT " * 1500 + "1" + ")" * 1500
    reading = pgread.read(deep)
    assert reading.failure and reading.count <= 1


def test_prepare_counts_what_the_parser_reads_and_keeps_the_keyword_rule():
    p = prepare("SELECT 'x'; DELETE FROM t", "postgres")
    assert p.multiple and p.reading.count == 2
    # ... and a writing function; the contract's keyword rule still refuses a column named update.
    assert prepare("SELECT setval('s', 1)", "postgres").write_ops == {"setval()"}
    assert prepare("SELECT update FROM t", "postgres").write_ops == {"update"}
    # What is read is the text as sent: placeholders as $n.
    assert prepare("SELECT * FROM t WHERE a = :a AND b = '{b}'", "postgres").reading.failure is None


def test_every_operator_a_statement_names_is_read():
    # An operator is a call of its function: each spelling the server resolves along the search_path.
    read = pgread.read("SELECT 1 ##> 2, a = ANY (SELECT b FROM u), x IN (1, 2), y LIKE 'a%', z BETWEEN 1 AND 2, "
                       "1 OPERATOR(public.+) 1, CASE q WHEN 1 THEN 2 END FROM t JOIN s USING (id) ORDER BY x USING <")
    assert set(read.operators) == {("", "##>"), ("", "="), ("", "~~"), ("", "<"), ("", "<="), ("", ">"),
                                   ("", ">="), ("public", "+")}
    assert pgread.read("WITH c AS (SELECT 1 #@# 1) SELECT * FROM c").operators == (("", "#@#"),)
