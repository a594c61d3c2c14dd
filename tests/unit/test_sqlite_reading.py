"""qag's reading of a SQLite statement against SQLite's own (its authorizer and its count of variables).

Hypothesis builds statements out of the boundaries SQLite's tokenizer draws (strings, quoted names, comments,
its own variables `$x`, `@x`, `#x`, `?`, `:x::y(...)`, whose `(...)` suffix swallows quotes) and pieces that
read or write tables. Whatever qag lets through as one plain read, SQLite must prepare with exactly qag's bound
values, with no write action and no table read that qag's reading does not name.
"""

from __future__ import annotations

import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag.sql.prepare import prepare, render

CHUNKS = ["'", '"', "`", "[", "]", "$x::t(", "@a(", "#b", "$y", ":p", ":p::q", ":p(", "?", "?1", "(", ")", ",",
          " ", "--", "\n", "/*", "*/", " FROM secret", " FROM t", "; DELETE FROM t", " UNION SELECT s FROM secret",
          ") DELETE FROM t --", "x", "1", "$", "::", ":", "'m1'", " AS ", "WITH w AS (SELECT 1) "]
_WRITES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}

statements = st.lists(st.sampled_from(CHUNKS), min_size=1, max_size=8).map(lambda parts: "SELECT 'm0'" + "".join(parts))


@pytest.fixture(scope="module")
def conn():
    c = sqlite3.connect(":memory:")
    c.executescript("CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT); CREATE TABLE secret(s TEXT);"
                    "INSERT INTO t VALUES (1, 'a'); INSERT INTO secret VALUES ('hidden');")
    yield c
    c.close()


def check(conn, sql: str) -> None:
    p = prepare(sql, "sqlite")
    if p.multiple or p.unreadable is not None or p.write_ops:
        return
    uses = p.uses("main")
    if uses.failure is not None:
        return      # qag can't name its tables: refused (table_check_failed) before SQLite is asked
    rendered = render(p, {name: "v" for name in p.bound_names}, "qmark")
    events: list = []
    conn.set_authorizer(lambda *event: events.append(event) or sqlite3.SQLITE_OK)
    try:
        conn.execute(rendered.sql, rendered.args).fetchall()
    except sqlite3.ProgrammingError as error:
        # The one thing a bound value can't cause: SQLite counting other variables than qag bound.
        assert "bindings" not in str(error), ("SQLite reads other variables than qag", sql, str(error))
        return
    except sqlite3.Error:
        return      # SQLite refuses the text: nothing ran
    finally:
        conn.set_authorizer(None)
    assert not [e for e in events if e[0] in _WRITES], ("a write qag did not see", sql, events)
    read = {e[1].lower() for e in events if e[0] == sqlite3.SQLITE_READ and e[1] and not e[1].startswith("sqlite_")}
    named = {table.rsplit(".", 1)[-1] for table in uses.tables}
    assert read <= named, ("a table qag did not see", sql, read - named)


@settings(max_examples=1500, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(statements)
def test_qag_reads_what_sqlite_runs(conn, sql):
    check(conn, sql)


KNOWN = [
    "WITH x AS (SELECT $x::t(:p,')) DELETE FROM t --')) SELECT 1",
    "SELECT id AS \"$x\" FROM t WHERE $x::int(:p,') = 1 UNION SELECT s FROM secret --') = 1",
    "SELECT $x::text(:p,') AS a, s FROM secret --') AS b FROM t",
    "SELECT @a(') FROM secret --') FROM t",
    "SELECT #b(') FROM secret --')",
    "SELECT :p(') FROM secret --')",
    "SELECT :p::q(') FROM secret --')",
]


@pytest.mark.parametrize("sql", KNOWN)
def test_known_variable_boundaries(conn, sql):
    check(conn, sql)


@pytest.mark.parametrize("sql", ["SELECT $x", "SELECT @x", "SELECT #x", "SELECT ?", "SELECT ?1", "SELECT :p::int",
                                 "SELECT :p(1)", KNOWN[0]])
def test_sqlites_own_variables_are_refused(sql):
    p = prepare(sql, "sqlite")
    assert p.unreadable is not None and "SQLite's own variables" in p.unreadable


@pytest.mark.parametrize("sql,bound", [("SELECT :p, ':q $x ?', \"@c\", [#d], `?`", ("p",)),
                                       ("SELECT a$b FROM t WHERE id = :id", ("id",)),
                                       ("SELECT 1 -- $x ?\n, :p", ("p",))])
def test_names_strings_and_comments_that_look_like_variables_are_kept(sql, bound):
    p = prepare(sql, "sqlite")
    assert p.unreadable is None and p.bound_names == bound
