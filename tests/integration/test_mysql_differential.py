"""Differential test of qag's MySQL/MariaDB reading against the real server (issue 17, DESIGN §5).

Hypothesis builds `SELECT` statements out of marker literals ('m1', 'm2', ...) and the boundaries the engine draws:
comments (`#`, `-- `, `--x`, `/* */`, nested-looking), strings ('..', "..", backslash escapes, doubled quotes,
_utf8mb4'..', N'..', X'..'), quoted identifiers (`..` with doubled backticks), executable comments (`/*! */`,
`/*!50000 */`, `/*M! */`) and control characters, in every position. Each statement is run on a sandbox
connection that *allows* several statements (so the server's own statement count is visible; the statements
hold literals only), under the server's default sql_mode and with NO_BACKSLASH_ESCAPES and ANSI_QUOTES set on
the session, and compared with qag's reading:

* statement count: whatever qag lets through as one read (prepare(): not .multiple, not .unreadable, no
  .write_ops) the server runs as one statement;
* which literal is which: when qag lets it through and the server answers, the server's columns are exactly the
  select items qag's tokens (read for that sql_mode) give, and each marker column is where qag reads that marker
  as a literal of its own - so no comment, string or identifier ends where qag thinks it doesn't.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qag.sql import lexer
from qag.sql.prepare import prepare
from qag.sql.writes import EXECUTABLE_COMMENT
from tests.services import MYSQL, mysql_admin

MySQLdb = pytest.importorskip("MySQLdb")
from MySQLdb.constants import CLIENT  # noqa: E402

MODES = {"default": None, "no_backslash_escapes": "NO_BACKSLASH_ESCAPES", "ansi_quotes": "ANSI_QUOTES",
         "both": "NO_BACKSLASH_ESCAPES,ANSI_QUOTES"}
EXAMPLES = 300          # per mode: the four modes run in a few seconds here
_MARKER = re.compile(r"m[0-9]+")

# Pieces whose meaning depends on where the engine draws a boundary.
CHUNKS = ["'", '"', "`", "\\", "\\\\", "\\'", '\\"', "''", '""', "``", "/*", "*/", "/*!", "/*!50000 ", "/*!99999 ",
          "/*M!", "/*M!100000 ", "/*m!", "/* !", "/**/", "/*+ ", "#", "-- ", "--", "--x", "--\t", "--\x01", "--\x7f",
          "\n", "\r", "\t", "\x0b", "\x0c", " ", ";", ",", "x", "1", "_utf8mb4'", "N'", "X'", "0x", "\x00",
          "é", "\\n", "\\%", "(", ")", "*", "-", "!", "M"]
MARKER = "§"            # replaced by the next marker literal's number


def _content():
    return st.lists(st.one_of(st.sampled_from(CHUNKS), st.just(f", '{MARKER}'"), st.just(f"'{MARKER}'"),
                              st.just(f"; SELECT '{MARKER}'"),
                              st.text(alphabet="ab '\"\\#-/*!;\n", max_size=4)), max_size=6).map("".join)


def _part():
    marker = st.just(f", '{MARKER}'")
    literal = st.tuples(st.sampled_from(["'", '"', "_utf8mb4'", "N'", "X'"]), _content()).map(
        lambda p: ", " + p[0] + p[1] + ("'" if p[0] not in ('"',) else '"'))
    ident = _content().map(lambda c: " AS `" + c + "`")
    comment = st.tuples(st.sampled_from([" /*", " /*!", " /*!50000", " /*M!", " #", " -- ", " --", "/*/*"]),
                        _content()).map(lambda p: p[0] + p[1] + ("*/ " if "/*" in p[0] else "\n"))
    raw = st.sampled_from(CHUNKS)
    second = st.just(f"; SELECT '{MARKER}'")
    return st.one_of(marker, marker, literal, ident, comment, raw, second)


statements = st.lists(_part(), min_size=1, max_size=7).map(lambda parts: "SELECT '" + MARKER + "'" + "".join(parts))


def _numbered(sql: str) -> str:
    out, n = [], 0
    for piece in sql.split(MARKER):
        out.append(piece)
        out.append(f"m{n}")
        n += 1
    return "".join(out[:-1])


def qag_columns(sql: str, mode: str | None):
    """qag's reading of the select list under the session's sql_mode: one entry per item, the marker name where
    the item is a marker literal on its own (optionally after a character set introducer), else None. None
    overall when qag would not run the statement as one plain read."""
    flags = set((mode or "").split(","))
    backslash = "NO_BACKSLASH_ESCAPES" not in flags
    tokens = lexer.tokenize(sql, "mysql", backslash_single=backslash,
                            backslash_double=backslash and "ANSI_QUOTES" not in flags, text_placeholders=False)
    while tokens and tokens[-1].kind in (lexer.WS, lexer.SEMI):
        tokens.pop()         # trailing ';' are dropped (contract 4.3 rule 1)
    if any(t.kind in (lexer.BAD, lexer.XCOMMENT, lexer.SEMI) for t in tokens):
        return None
    sig = lexer.significant(tokens)
    if not sig or sig[0].kind != lexer.WORD or sig[0].value != "select":
        return None
    while sig and sig[-1].kind == lexer.PUNCT and sig[-1].value == "\x00":
        sig.pop()    # a NUL byte in code ends the server's input (text after it is a syntax error there)
    items, current, depth = [], [], 0
    for t in sig[1:]:
        if t.kind == lexer.PUNCT and t.value == "(":
            depth += 1
        elif t.kind == lexer.PUNCT and t.value == ")":
            depth -= 1
        if depth == 0 and t.kind == lexer.PUNCT and t.value == ",":
            items.append(current)
            current = []
        else:
            current.append(t)
    items.append(current)
    columns = []
    for item in items:
        if len(item) >= 2 and item[0].kind == lexer.WORD and (item[0].value.startswith("_") or item[0].value == "n"):
            item = item[1:]         # a character set introducer
        marker = None
        if item and item[0].kind == lexer.STRING and (item[0].value == "'" or (
                item[0].value == '"' and "ANSI_QUOTES" not in flags)):
            body = sql[item[0].start + 1:item[0].end - 1]
            rest = item[1:]
            while rest and rest[0].kind == lexer.STRING and rest[0].end - rest[0].start == 2 and (
                    rest[0].value == "'" or "ANSI_QUOTES" not in flags):
                rest = rest[1:]     # 'm0' '' is 'm0': an empty literal right after is concatenated
            if rest and rest[0].kind == lexer.WORD and rest[0].value == "as":
                rest = rest[1:]
                alias_ok = len(rest) == 1 and rest[0].kind in (lexer.QIDENT, lexer.WORD, lexer.STRING, lexer.NUMBER)
            else:
                # A bare alias; a string right after a string is concatenated instead ('a' 'b' is 'ab'), except a
                # "..." identifier under ANSI_QUOTES. A name may start with a digit (`0x`): qag reads a NUMBER.
                alias_ok = not rest or (len(rest) == 1 and (rest[0].kind in (lexer.QIDENT, lexer.WORD, lexer.NUMBER) or (
                    rest[0].kind == lexer.STRING and rest[0].value == '"' and "ANSI_QUOTES" in flags)))
            if alias_ok and _MARKER.fullmatch(body):
                marker = body
        columns.append(marker)
    return columns


def server_reading(conn, sql: str):
    """(statements the server ran or started, the first result's row or None, error or None)."""
    count, row, error = 0, None, None
    try:
        conn.query(sql.encode("utf8", "surrogatepass"))
        count = 1
        result = conn.store_result()
        if result is not None:
            rows = result.fetch_row(0)
            row = rows[0] if rows else None
        while conn.next_result() == 0:
            count += 1
            conn.store_result()
    except MySQLdb.Error as exc:
        error = exc
        if count:
            count += 1       # the first statement ran and a second one was refused: the server saw two
        try:
            while conn.next_result() == 0:
                conn.store_result()
        except MySQLdb.Error:
            pass
    return count, row, error


@pytest.fixture(scope="module")
def oracle():
    mysql_admin().close()      # skips (or fails under QAG_TEST_REQUIRE_SERVICES) without a server
    conn = MySQLdb.connect(host=MYSQL["host"], port=MYSQL["port"], user=MYSQL["user"], passwd=MYSQL["password"],
                           charset="utf8mb4", client_flag=CLIENT.MULTI_STATEMENTS | CLIENT.MULTI_RESULTS)
    conn.query(b"SET SESSION TRANSACTION READ ONLY")
    yield conn
    conn.close()


FOUND: list = []


def check(conn, sql: str, mode: str | None) -> None:
    p = prepare(sql, "mysql")
    accepted = not p.multiple and p.unreadable is None and not p.write_ops
    count, row, error = server_reading(conn, sql)
    if accepted:
        # Rule 1: what qag lets through as one statement, the server runs as one statement.
        assert count <= 1, (f"qag reads one statement, the server ran {count}", sql, mode)
    if not accepted or error is not None or row is None:
        return
    columns = qag_columns(sql, mode)
    assert columns is not None, ("qag accepted a statement its own reading for this sql_mode refuses", sql, mode)
    got = [v if isinstance(v, str) and _MARKER.fullmatch(v) else None for v in row]
    # Rule 2: the server's columns are qag's select items, the marker literals where qag reads them.
    assert len(got) == len(columns) and all(c is None or c == g for c, g in zip(columns, got)), \
        ("qag and the server read different literals", sql, mode, columns, row)
    assert all(g is None or g in columns for g in got), ("the server returned a marker qag reads as hidden", sql,
                                                           mode, columns, row)


def _set_mode(conn, sql_mode: str | None) -> None:
    conn.query(b"SET SESSION sql_mode = DEFAULT" if sql_mode is None else f"SET SESSION sql_mode = '{sql_mode}'".encode())
    conn.store_result()


@pytest.mark.parametrize("mode", list(MODES), ids=list(MODES))
def test_qag_reads_statements_as_the_server_does(oracle, mode):
    sql_mode = MODES[mode]
    _set_mode(oracle, sql_mode)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(statements)
    def run(template):
        check(oracle, _numbered(template), sql_mode)

    run()


# Statements found by the generator or written after it, kept as plain regressions (every mode).
KNOWN = [
    "SELECT 'm0' --\x01, 'm1'",
    "SELECT 'm0' --\x7f, 'm1'",
    "SELECT 'm0' -- , 'm1'",
    "SELECT 'm0' --x, 'm1'",
    "SELECT 'm0' #, 'm1'\r, 'm2'",
    "SELECT 'm0', 'a\\', 'm1' -- '",
    "SELECT 'm0', \"a\\\", 'm1' -- \"",
    "SELECT 'm0' /* /* */, 'm1' /* */",
    "SELECT 'm0', `a``, 'm1'` AS x",
    "SELECT 'm0', _utf8mb4'a\\'', 'm1' -- '",
    "SELECT 'm0', N'it''s', 'm1'",
    "SELECT 'm0', X'41', 'm1'",
    "SELECT 'm0' /*!, 'm1' */",
    "SELECT 'm0' /*!50000 , 'm1' */",
    "SELECT 'm0' /*M!, 'm1' */",
    "SELECT 'm0' /*m!, 'm1' */",
    "SELECT 'm0' /*!99999 , 'm1' */",
    "SELECT 'm0', 'x'; SELECT 'm1'",
    "SELECT 'm0', '\\'; SELECT 1 -- '",
]


@pytest.mark.parametrize("mode", list(MODES), ids=list(MODES))
@pytest.mark.parametrize("sql", KNOWN)
def test_known_boundaries(oracle, mode, sql):
    _set_mode(oracle, MODES[mode])
    check(oracle, sql, MODES[mode])


# Bound values (the :name slots): mysqlclient splices each value into the text at the slots qag reads, escaped for
# the session's own sql_mode. Whatever qag lets through with a slot, a caller's value must stay one value in
# every mode: run once with a plain marker and once with a hostile value, the server reads the same statement,
# the hostile value where the marker was.
HOSTILE = ["m90' , 'x", "\\' , (SELECT 'm91') AS y -- ", "' #", "\\", "', (SELECT 'm92') #", '" , "m93',
           "m94\\' , 'x' -- ", "\\\\' #", "'' #",
           ", (SELECT 0x6d3936) AS y, ",          # no quote at all: SQL wherever a reading leaves the value bare
           "x], (SELECT 0x6d3935) AS y, [z"]      # closes a [quoted name] (MSSQL)
BENIGN = "m99"

statements_with_slots = st.lists(st.one_of(_part(), st.just(", :v"), st.just(" :v"), st.just(", 'a' :v"),
                                           st.sampled_from(["[", "]", " AS [", "/*! ", " */", "'*/'"])),
                                 min_size=1, max_size=7).map(lambda parts: "SELECT '" + MARKER + "'" + "".join(parts))
# The bound-value test runs in MariaDB's MSSQL mode too, where [...] is a quoted name (and ANSI_QUOTES is on).
SLOT_MODES = {**MODES, "mssql": "MSSQL"}


def _spliced(conn, sql: str, value: str) -> bytes:
    from qag.sql.prepare import render
    r = render(prepare(sql, "mysql"), {"v": value}, "format")
    return r.sql.encode("utf8", "surrogatepass") % tuple(conn.literal(a) for a in r.args)


def _text(v):
    return v.decode("utf8", "surrogatepass") if isinstance(v, bytes) else v


def check_bound(conn, sql: str, mode: str | None) -> None:
    p = prepare(sql, "mysql")
    # An executable comment is a write operation a writing key may be allowed: its statements count here too.
    if p.multiple or p.unreadable is not None or p.write_ops - {EXECUTABLE_COMMENT} or p.bound_names != ("v",):
        return
    count, row, error = server_reading(conn, _spliced(conn, sql, BENIGN).decode("utf8", "surrogatepass"))
    for value in HOSTILE:
        h_count, h_row, h_error = server_reading(conn, _spliced(conn, sql, value).decode("utf8", "surrogatepass"))
        assert h_count <= 1, ("a bound value made a second statement", sql, mode, value)
        # The generator's statements are select lists of literals: what the server refuses with a plain value is
        # its syntax, and no value that is data can repair it.
        assert error is None or h_error is not None, ("a bound value repaired the statement", sql, mode, value,
                                                      error, h_row)
        if error is None and row is not None:
            assert h_error is None and h_row is not None, ("a bound value changed the statement", sql, mode, value,
                                                             h_error)
            # (a value next to a literal is concatenated with it: 'm0' :v reads 'm0m99')
            expected = tuple(_text(v).replace(BENIGN, value) if isinstance(_text(v), str) else v for v in row)
            assert tuple(_text(v) for v in h_row) == expected, ("a bound value was read as SQL", sql, mode, value,
                                                                 row, h_row)


@pytest.mark.parametrize("mode", list(SLOT_MODES), ids=list(SLOT_MODES))
def test_bound_values_stay_values_in_every_sql_mode(oracle, mode):
    _set_mode(oracle, SLOT_MODES[mode])

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(statements_with_slots)
    def run(template):
        check_bound(oracle, _numbered(template), SLOT_MODES[mode])

    run()


KNOWN_WITH_SLOTS = [
    "SELECT 'm0', 'a\\'' AS p, :v AS q -- '",
    "SELECT 'm0', 'x\\'' , :v",
    "SELECT 'm0', \"a\\\"\" AS p, :v AS q -- \"",
    "SELECT 'm0', 'a\\\\', :v",
    "SELECT 'm0', :v -- '\\'",
    "SELECT 'm0', id[', ' , :v , ''] FROM (SELECT 1 AS id) t",       # MSSQL: [', ' , '] is a name
    "SELECT 'm0' /*! , '*/ , :v AS x -- ' */",                       # the server reads '*/' inside /*! */ as a literal
]


@pytest.mark.parametrize("mode", list(SLOT_MODES), ids=list(SLOT_MODES))
@pytest.mark.parametrize("sql", KNOWN_WITH_SLOTS)
def test_known_slots(oracle, mode, sql):
    _set_mode(oracle, SLOT_MODES[mode])
    check_bound(oracle, sql, SLOT_MODES[mode])


# ------------------------------------------------------------------ where a number ends and a name begins

def _server_names(conn, sql: str):
    """('columns', names of the result's columns), ('none', None) for a statement without a result, ('unknown',
    the name of error 1054) or ('error', code)."""
    try:
        conn.query(sql.encode())
        result = conn.store_result()
        return ("none", None) if result is None else ("columns", [d[0] for d in result.describe()])
    except MySQLdb.Error as exc:
        if exc.args[0] == 1054:
            return "unknown", re.match(r"Unknown column '(.*)' in", exc.args[1]).group(1)
        return "error", exc.args[0]


def _predicted_names(item: str):
    """What the server answers for `SELECT item` by qag's tokens: a number alone is a column named as written,
    a number and a name after it a column named by that alias, a digit-led name alone an unknown column;
    None where qag's reading makes no prediction of this kind."""
    tokens = lexer.significant(lexer.tokenize(item, "mysql"))
    if any(t.kind == lexer.BAD for t in tokens):
        return "error"
    kinds = [t.kind for t in tokens]
    if kinds == [lexer.NUMBER]:
        return "columns", [item[tokens[0].start:tokens[0].end]]
    if kinds == [lexer.NUMBER, lexer.WORD] and tokens[1].value[:1].isalpha():
        return "columns", [item[tokens[1].start:tokens[1].end]]
    if kinds == [lexer.NUMBER, lexer.WORD, lexer.WORD] and [t.value for t in tokens[1:]] == ["from", "dual"]:
        return "columns", [item[:tokens[0].end]]
    if kinds == [lexer.WORD] and item[:1].isdigit():
        return "unknown", item[:tokens[0].end]
    return None


NUMBER_ITEMS = ["1e1from dual", "1.from dual", ".5from dual", "1e-1from dual", "1.5e3x", "1e5abc", "0e5x", "1.e5", "1abc", "1e", "1ex",
                "1$1", "0x41", "0b101", "0x1g", "0X41", "0x41from", "0b12", "0x", "1.ex", "1e-2y", "12_3", "9e9e9"]


@pytest.mark.parametrize("item", NUMBER_ITEMS)
def test_a_number_ends_where_the_server_ends_it(oracle, item):
    """qag's tokens split a number from the name after it exactly where MariaDB's lexer does (a FROM or INTO
    written against a number, `1e1from t`, hid a table and an OUTFILE from qag's checks): the server's column
    names, or the unknown column it names, are what qag's tokens predict."""
    _set_mode(oracle, None)
    predicted = _predicted_names(item)
    assert predicted is not None, item
    answer = _server_names(oracle, f"SELECT {item}")
    assert answer[0] == predicted if predicted == "error" else answer == predicted, (item, answer, predicted)


def test_into_written_against_a_number_is_into(oracle):
    """`SELECT 1e+1into @v` stores 10 in @v on the server: qag reads INTO, a write (select into)."""
    _set_mode(oracle, None)
    assert prepare("SELECT 1e+1into @qag_probe", "mysql").write_ops == {"select into"}
    assert _server_names(oracle, "SELECT 1e+1into @qag_probe") == ("none", None)
    assert _server_names(oracle, "SELECT @qag_probe") == ("columns", ["@qag_probe"])
    oracle.query(b"SELECT @qag_probe")
    assert oracle.store_result().fetch_row()[0][0] in (10, 10.0, "10")


@settings(max_examples=400, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.tuples(st.sampled_from(["0", "1", "9", ".5", "0x", "0b", "12"]),
                 st.text(alphabet="0123456789.eExXbBaf+-$_", max_size=6)).map("".join))
def test_generated_numbers_end_where_the_server_ends_them(oracle, item):
    predicted = _predicted_names(item)
    if predicted is None:
        return
    answer = _server_names(oracle, f"SELECT {item}")
    if answer[0] == "error" and answer[1] != 1064:
        return             # read as qag reads it, and refused for its value (1367: a double out of range)
    assert answer[0] == predicted if predicted == "error" else answer == predicted, (item, answer, predicted)


@pytest.mark.parametrize("item", ["@x.", "@x.y", "@1.", "@$x.", "@x$", "@a_b.c", "@\u00e9.", "@\u00a0", "@\u2028"])
def test_a_user_variable_is_the_name_the_server_reads(oracle, item):
    """`SELECT @x. from dual`: the server's one column is the variable as written (its name runs over '.', '$' and
    non-ASCII), then FROM; qag's tokens read the same variable and no table."""
    _set_mode(oracle, None)
    sql = f"SELECT {item} from dual"
    assert _server_names(oracle, sql) == ("columns", [item]), item
    tokens = lexer.tokenize(sql, "mysql")
    names = [sql[t.start:t.end] for k, t in enumerate(tokens) if lexer.user_variable_at(tokens, k)]
    assert names == [item[1:]] and prepare(sql, "mysql").uses("crm").tables == ()
