"""The tokenizer reads SQL as each engine does: literals, identifiers, comments, placeholders."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qag.sql import lexer
from qag.sql.lexer import (BAD, COMMENT, NUMBER, PARAM, PUNCT, QIDENT, SEMI, STRING, TEXT, VARIABLE, WORD, WS,
                           XCOMMENT, tokenize)

DIALECTS = ("sqlite", "mysql", "postgres")


def kinds(sql, dialect, **kw):
    """(kind, text) of every token that isn't whitespace."""
    return [(t.kind, sql[t.start:t.end]) for t in tokenize(sql, dialect, **kw) if t.kind != WS]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_single_quoted_strings_with_doubled_quotes(dialect):
    sql = "SELECT 'it''s; here', ''"
    assert kinds(sql, dialect) == [(WORD, "SELECT"), (STRING, "'it''s; here'"), (PUNCT, ","), (STRING, "''")]


def test_backslash_escapes_only_in_mysql():
    sql = r"SELECT 'a\'b' x"
    assert kinds(sql, "mysql") == [(WORD, "SELECT"), (STRING, r"'a\'b'"), (WORD, "x")]
    # PostgreSQL (standard_conforming_strings) and SQLite end the literal at the quote after the backslash.
    for dialect in ("postgres", "sqlite"):
        assert kinds(sql, dialect) == [(WORD, "SELECT"), (STRING, r"'a\'"), (WORD, "b"), (BAD, "' x")]


def test_backslash_reading_can_be_overridden():
    sql = r"SELECT 'a\' ; x"
    assert [k for k, _ in kinds(sql, "mysql", backslash_single=False)] == [WORD, STRING, SEMI, WORD]
    assert [k for k, _ in kinds(sql, "postgres", backslash_single=True)] == [WORD, BAD]


def test_double_quotes_are_strings_in_mysql_identifiers_elsewhere():
    sql = 'SELECT "a\\"b" FROM t'
    assert kinds(sql, "mysql")[1] == (STRING, '"a\\"b"')
    assert kinds(sql, "mysql", backslash_double=False)[1] == (STRING, '"a\\"')
    assert kinds('SELECT "a""b" FROM t', "postgres")[1] == (QIDENT, '"a""b"')
    assert kinds('SELECT "a""b" FROM t', "sqlite")[1] == (QIDENT, '"a""b"')


def test_backticks_and_brackets():
    assert kinds("SELECT `a``b`", "mysql")[1] == (QIDENT, "`a``b`")
    assert kinds("SELECT `a`", "sqlite")[1] == (QIDENT, "`a`")
    assert kinds("SELECT [a;b]", "sqlite")[1] == (QIDENT, "[a;b]")
    # PostgreSQL arrays: brackets are punctuation there.
    assert kinds("SELECT a[1]", "postgres") == [(WORD, "SELECT"), (WORD, "a"), (PUNCT, "["), (NUMBER, "1"),
                                               (PUNCT, "]")]


def test_postgres_escape_and_dollar_strings():
    assert kinds(r"SELECT E'it\'s'", "postgres")[1] == (STRING, r"E'it\'s'")
    assert kinds(r"SELECT e'\\'", "postgres")[1] == (STRING, r"e'\\'")
    assert kinds("SELECT $$a;'b$$", "postgres")[1] == (STRING, "$$a;'b$$")
    assert kinds("SELECT $tag$ $$ ; $tag$", "postgres")[1] == (STRING, "$tag$ $$ ; $tag$")
    assert kinds("SELECT $1", "postgres")[1:] == [(PUNCT, "$"), (NUMBER, "1")]
    # A word containing $ is an identifier, not the start of a dollar quote.
    assert kinds("SELECT a$b$ FROM t", "postgres")[1] == (WORD, "a$b$")
    # E'' is PostgreSQL only; elsewhere E is a word.
    assert kinds("SELECT E'x'", "sqlite")[1:] == [(WORD, "E"), (STRING, "'x'")]


def test_a_postgres_number_ends_before_a_dollar_as_the_server_reads_it():
    """`1$1` is 1 then the parameter $1, `1$a$...$a$` 1 then a dollar-quoted string (as pglast's scanner reads
    them); after a letter the run is one token (`1a$1`, the server's trailing junk). MySQL: one name."""
    assert kinds("SELECT 1$1", "postgres")[1:] == [(NUMBER, "1"), (PUNCT, "$"), (NUMBER, "1")]
    assert kinds("SELECT 1.5$2, .5$3", "postgres")[1:] == [
        (NUMBER, "1.5"), (PUNCT, "$"), (NUMBER, "2"), (PUNCT, ","), (NUMBER, ".5"), (PUNCT, "$"), (NUMBER, "3")]
    assert kinds("SELECT 1$a$ :v $a$", "postgres")[1:] == [(NUMBER, "1"), (STRING, "$a$ :v $a$")]
    assert kinds("SELECT 1a$1", "postgres")[1:] == [(NUMBER, "1a$1")]
    assert kinds("SELECT 1$1", "mysql")[1:] == [(WORD, "1$1")]


def test_unterminated_dollar_string():
    assert kinds("SELECT $$abc", "postgres")[-1] == (BAD, "$$abc")
    assert kinds("SELECT $a$ abc $b$", "postgres")[-1][0] == BAD


@pytest.mark.parametrize("dialect", DIALECTS)
def test_line_comments(dialect):
    assert kinds("SELECT 1 -- x;\nFROM", dialect) == [(WORD, "SELECT"), (NUMBER, "1"), (COMMENT, "-- x;"),
                                                       (WORD, "FROM")]
    assert kinds("SELECT 1 --", dialect)[-1] == (COMMENT, "--")


def test_mysql_double_dash_needs_whitespace():
    assert kinds("SELECT 5--1", "mysql") == [(WORD, "SELECT"), (NUMBER, "5"), (PUNCT, "-"), (PUNCT, "-"),
                                            (NUMBER, "1")]
    assert kinds("SELECT 1 --x;", "mysql")[-1] == (SEMI, ";")
    assert kinds("SELECT 1 --\tx;", "mysql")[-1] == (COMMENT, "--\tx;")
    assert kinds("SELECT 1 --\x01x", "mysql")[-1][0] == COMMENT
    for dialect in ("postgres", "sqlite"):
        assert kinds("SELECT 1 --x;", dialect)[-1] == (COMMENT, "--x;")


def test_hash_comments_mysql_only():
    assert kinds("SELECT 1 # x;\n", "mysql")[-1] == (COMMENT, "# x;")
    assert (PUNCT, "#") in kinds("SELECT 1 # x", "postgres")


def test_block_comments_nest_only_in_postgres():
    sql = "SELECT /* a /* b */ c */ 1"
    assert kinds(sql, "postgres") == [(WORD, "SELECT"), (COMMENT, "/* a /* b */ c */"), (NUMBER, "1")]
    assert kinds(sql, "mysql")[1:3] == [(COMMENT, "/* a /* b */"), (WORD, "c")]
    assert kinds("SELECT /* a /* b */", "postgres")[-1][0] == BAD


@pytest.mark.parametrize("dialect", DIALECTS)
def test_executable_comments_are_marked(dialect):
    assert kinds("SELECT 1 /*! DROP TABLE t */", dialect)[-1] == (XCOMMENT, "/*! DROP TABLE t */")
    assert kinds("SELECT /*M!100101 1 */ 1", dialect)[1] == (XCOMMENT, "/*M!100101 1 */")
    assert kinds("SELECT /*+ hint */ 1", dialect)[1] == (COMMENT, "/*+ hint */")


@pytest.mark.parametrize("dialect", DIALECTS)
def test_bound_placeholders(dialect):
    cast = "" if dialect == "sqlite" else " x::c,"    # SQLite has no :: cast (see the next test)
    toks = [t for t in tokenize(f"SELECT :a, :_b1,{cast} ':d', /* :e */ :f_g", dialect) if t.kind == PARAM]
    assert [t.value for t in toks] == ["a", "_b1", "f_g"]
    assert [t.value for t in tokenize("SELECT :1, :=, a:::b", dialect) if t.kind == PARAM] == []
    assert [t.value for t in tokenize("SELECT :née", dialect) if t.kind == PARAM] == ["née"]


@pytest.mark.parametrize("sql,variables,params", [
    ("SELECT $x, @y, #z, ?, ?12", ["$x", "@y", "#z", "?", "?12"], []),
    ("SELECT $x::t(:p,') AS a", ["$x::t(:p,')"], []),          # the suffix runs to ')' through quotes
    ("SELECT :p(a b)", [":p(a"], []),                            # ... or to whitespace (SQLite: illegal)
    ("SELECT :p::q, :r, a$b", [":p::q"], ["r"]),
    ("SELECT x::c", [":"], ["c"]),                               # SQLite: an illegal ':' then :c
    ("SELECT '$x ?', \"@y\", [#z], `?` -- $w", [], []),
])
def test_sqlite_variables_as_sqlite_reads_them(sql, variables, params):
    toks = tokenize(sql, "sqlite")
    assert [t.value for t in toks if t.kind == VARIABLE] == variables
    assert [t.value for t in toks if t.kind == PARAM] == params


@pytest.mark.parametrize("dialect", DIALECTS)
def test_text_placeholders(dialect):
    assert kinds("SELECT {a}, { b }, {1}", dialect) == [
        (WORD, "SELECT"), (TEXT, "{a}"), (PUNCT, ","), (PUNCT, "{"), (WORD, "b"), (PUNCT, "}"), (PUNCT, ","),
        (PUNCT, "{"), (NUMBER, "1"), (PUNCT, "}")]
    assert [k for k, _ in kinds("SELECT {a}", dialect, text_placeholders=False)] == [WORD, PUNCT, WORD, PUNCT]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_words_numbers_and_semicolons(dialect):
    # MySQL reads a run of digits going on into letters as a name; SQLite and PostgreSQL refuse the run.
    assert kinds("select 1.5e3, .5, 1abc; Über", dialect) == [
        (WORD, "select"), (NUMBER, "1.5e3"), (PUNCT, ","), (NUMBER, ".5"), (PUNCT, ","),
        (WORD if dialect == "mysql" else NUMBER, "1abc"), (SEMI, ";"), (WORD, "Über")]
    assert tokenize("SELECT", dialect)[0].value == "select"


@pytest.mark.parametrize("sql, expected", [
    # A number ends after its exponent's digits or its fraction: what follows is the next token (a keyword too).
    ("1e1from t", [(NUMBER, "1e1"), (WORD, "from"), (WORD, "t")]),
    ("1e+1into @x", [(NUMBER, "1e+1"), (WORD, "into"), (PUNCT, "@"), (WORD, "x")]),
    ("1.from t", [(NUMBER, "1."), (WORD, "from"), (WORD, "t")]),
    (".5from t", [(NUMBER, ".5"), (WORD, "from"), (WORD, "t")]),
    ("1.5e3x", [(NUMBER, "1.5e3"), (WORD, "x")]),
    ("1e5abc", [(NUMBER, "1e5"), (WORD, "abc")]),
    ("0e5x", [(NUMBER, "0e5"), (WORD, "x")]),
    ("1.e5", [(NUMBER, "1.e5")]),
    ("1..5", [(NUMBER, "1"), (PUNCT, "."), (NUMBER, ".5")]),
    # Digits going on into other name characters without an exponent: one name.
    ("1abc, 1e, 1ex, 1$1", [(WORD, "1abc"), (PUNCT, ","), (WORD, "1e"), (PUNCT, ","), (WORD, "1ex"), (PUNCT, ","),
                            (WORD, "1$1")]),
    ("1e+x", [(WORD, "1e"), (PUNCT, "+"), (WORD, "x")]),
    # 0x and 0b (lower case) literals hold only hex or binary digits; anything else is a name.
    ("0x41, 0b101", [(NUMBER, "0x41"), (PUNCT, ","), (NUMBER, "0b101")]),
    ("0x1g, 0X41, 0x41from, 0b12, 0x", [(WORD, "0x1g"), (PUNCT, ","), (WORD, "0X41"), (PUNCT, ","), (WORD, "0x41from"),
                                        (PUNCT, ","), (WORD, "0b12"), (PUNCT, ","), (WORD, "0x")]),
    # Right after a name, '.' and name characters are the next part of a qualified name, digits first or not.
    ("t.1e1from, `t`.5x, x1.5", [(WORD, "t"), (PUNCT, "."), (WORD, "1e1from"), (PUNCT, ","), (QIDENT, "`t`"),
                                 (PUNCT, "."), (WORD, "5x"), (PUNCT, ","), (WORD, "x1"), (PUNCT, "."), (WORD, "5")]),
    ("t .5", [(WORD, "t"), (NUMBER, ".5")]),
    # "1.e" without exponent digits: the server's lexer reads a stray character; refused as unreadable.
    ("1.ex", [(BAD, "1.ex")]),
])
def test_mysql_numbers_end_where_the_server_ends_them(sql, expected):
    """MariaDB's lexer (sql_lex.cc: MY_LEX_NUMBER_IDENT, MY_LEX_INT_OR_REAL, MY_LEX_REAL, MY_LEX_IDENT_SEP):
    qag's reading must split a number from the name or keyword after it exactly where the server does, or a
    FROM, INTO or table hides inside what qag takes for one token (tests/integration/test_mysql_differential.py
    checks each against the server)."""
    assert kinds(sql, "mysql") == expected


@pytest.mark.parametrize("dialect", DIALECTS)
def test_leading_bom_is_whitespace(dialect):
    toks = tokenize("\ufeffSELECT 1", dialect)
    assert toks[0] == lexer.Token(WS, 0, 1, "\ufeff")
    assert toks[1].value == "select"


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql,what", [
    ("SELECT 'abc", "string literal"),
    ("SELECT 1 /* abc", "comment"),
    ('SELECT "abc', None),
])
def test_unterminated_runs_to_the_end(dialect, sql, what):
    toks = tokenize(sql, dialect)
    assert toks[-1].kind == BAD and toks[-1].end == len(sql)
    if what:
        assert toks[-1].value == what


def test_unknown_dialect():
    with pytest.raises(ValueError):
        tokenize("SELECT 1", "oracle")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab :;'\"`[]$-#/*!{}\\\n(),.0é\ufeffEM")), max_size=40),
       st.sampled_from(DIALECTS))
def test_tokens_cover_the_input(sql, dialect):
    toks = tokenize(sql, dialect)
    pos = 0
    for t in toks:
        assert t.start == pos and t.end > t.start
        pos = t.end
    assert pos == len(sql)
    assert all(t.kind != BAD for t in toks[:-1])


def test_a_dash_comment_ends_where_each_engine_ends_it():
    """PostgreSQL's scanner ends `--` at a carriage return as well as a line feed (scan.l's non_newline); MySQL and
    SQLite at a line feed only. qag read a PostgreSQL comment on to the line feed, so `$2` and `:v` after a
    carriage return ran unseen (a masked caller read the hash pads through `$2`)."""
    sql = "SELECT 1 -- c\r, $2 AS b\n FROM t"
    pg = [t for t in lexer.tokenize(sql, "postgres") if t.kind == lexer.COMMENT]
    assert [sql[t.start:t.end] for t in pg] == ["-- c"]
    for dialect in ("mysql", "sqlite"):
        comments = [t for t in lexer.tokenize(sql, dialect) if t.kind == lexer.COMMENT]
        assert [sql[t.start:t.end] for t in comments] == ["-- c\r, $2 AS b"]


@pytest.mark.parametrize("sql, expected", [
    ("@x. from t", [(PUNCT, "@"), (WORD, "x."), (WORD, "from"), (WORD, "t")]),
    ("@x.y, @1., @$x., @a$b", [(PUNCT, "@"), (WORD, "x.y"), (PUNCT, ","), (PUNCT, "@"), (WORD, "1."), (PUNCT, ","),
                              (PUNCT, "@"), (WORD, "$x."), (PUNCT, ","), (PUNCT, "@"), (WORD, "a$b")]),
    ("@\u00a0 from t", [(PUNCT, "@"), (WORD, "\u00a0"), (WORD, "from"), (WORD, "t")]),
    ("@`q`, @'s', @\"d\"", [(PUNCT, "@"), (QIDENT, "`q`"), (PUNCT, ","), (PUNCT, "@"), (STRING, "'s'"), (PUNCT, ","),
                            (PUNCT, "@"), (STRING, '"d"')]),
    ("@@session.sql_mode", [(PUNCT, "@"), (PUNCT, "@"), (WORD, "session"), (PUNCT, "."), (WORD, "sql_mode")]),
])
def test_mysql_user_variables_are_read_as_the_server_reads_them(sql, expected):
    """MariaDB reads a user variable's name over letters, digits, '.', '_', '$' and non-ASCII (MY_LEX_HOSTNAME):
    `@x. from t` is the variable `x.` and then FROM (qag read `x`, '.', and sqlglot a name `.from`)."""
    tokens = tokenize(sql, "mysql")
    assert kinds(sql, "mysql") == expected
    names = [sql[t.start:t.end] for k, t in enumerate(tokens) if lexer.user_variable_at(tokens, k)]
    assert names == [text for kind, text in expected if kind == WORD and text not in ("from", "t", "session",
                                                                                      "sql_mode")]


@pytest.mark.parametrize("sql", ["SELECT @ FROM t", "SELECT @", "SELECT 1, @ /* */ FROM t"])
def test_mysql_a_user_variable_without_a_name_is_unreadable(sql):
    """The server reads `@ from t` as a variable with an empty name and then FROM; sqlglot as a variable `from`: no
    reading of qag's would follow it, so the statement can't be checked (BAD)."""
    assert [k for k, _ in kinds(sql, "mysql")][-1] == BAD
