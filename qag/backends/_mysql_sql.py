"""The SQL qag sends to MySQL 8 and MariaDB for one call: the time limit (and MariaDB's read-only mode) carried on
the statement itself.

Pure functions of the rendered statement (qag.sql.prepare.render, so already `...\\nLIMIT n OFFSET m` when
paged), kept apart from the driver so the exact text is unit-tested:

* MariaDB: `SET STATEMENT max_statement_time = <seconds> FOR <statement>` (any statement, reads and writes);
  a read-only call's statement also sets `tx_read_only = 1` (`transaction_read_only` from 11.1) in the same
  prefix, so it runs as a read-only transaction of its own (autocommit) whatever its session says.
* MySQL 8: the optimizer hint `/*+ MAX_EXECUTION_TIME(<ms>) */` right after the SELECT keyword of the top-level
  query block - the leading SELECT (after any leading comments), or for `WITH ...` the first SELECT outside
  parentheses after the common table expressions (the CTE bodies are subqueries, where MySQL ignores the
  hint). A statement already carrying a hint comment there gets ours first inside it. A query expression
  with no such SELECT (`(SELECT ...) UNION ...`, `TABLE t`, `VALUES ...`, or a WITH where the hint is not
  known to work) needs `SET SESSION max_execution_time = <ms>` before it - one more round trip, on every
  such call. Other statements (writes, SHOW, CALL) can't be limited on MySQL: its max_execution_time only
  governs SELECT.
* No time limit → the statement unchanged on MySQL (on MariaDB, a read-only call still gets its access mode).
* MariaDB, every statement: `optimizer_trace = 'enabled=off'` last in the prefix (NO_TRACE).
* MariaDB, a statement that calls RAND(): `rand_seed1`/`rand_seed2` from the caller's `seeds` in the same prefix,
  so its values come from a seed nobody saw, and SET STATEMENT restores the session's generator afterwards
  (what the statement drew is never left for the next caller's RAND() to continue from).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

from qag.sql import lexer

_WS = " \t\n\r\f\v"
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$")
# Statements MySQL's max_execution_time can govern when no hint can be placed: query expressions.
_SESSION_LIMITED = frozenset(("(", "with", "table", "values"))


_MAX_EXECUTION_MS = 4294967295   # MySQL's max_execution_time: a 32-bit unsigned count of milliseconds


class Timed(NamedTuple):
    """The statement to send, and the session max_execution_time (ms) to set before it (MySQL only), or None."""

    sql: str
    session_ms: int | None


def milliseconds(timeout: float) -> int:
    """A time limit in whole milliseconds, at least 1 (MAX_EXECUTION_TIME(0) would mean no limit) and at most
    what MySQL's max_execution_time takes (a caller's ?timeout=1e12 runs with the longest)."""
    return max(1, min(_MAX_EXECUTION_MS, int(round(min(timeout, 1e15) * 1000))))


def seconds_text(timeout: float) -> str:
    """A time limit in seconds as MariaDB's max_statement_time takes it: '2', '1.5', at least '0.000001'."""
    if float(timeout).is_integer():
        return str(int(timeout))
    text = f"{timeout:.6f}".rstrip("0").rstrip(".")
    return "0.000001" if text in ("0", "") else text


_MARIADB: dict = {}       # (statement, time limit, access-mode variable) -> the statement sent
_MARIADB_MAX = 1024
KEPT_TEXT_MAX = 16384     # longer statements (an ad-hoc one with its data inline) are never kept
# No statement of a caller is ever traced: a stored function or trigger can turn the session's optimizer trace on,
# and the trace then keeps the next statements as sent (with their values inline, masking's pads among them), for
# whoever reads information_schema.OPTIMIZER_TRACE on that session next, through a stored function if need be.
NO_TRACE = "optimizer_trace = 'enabled=off'"


def mariadb_statement(sql: str, timeout: float | None, read_only: str | None = None,
                      seeds: tuple[int, int] | None = None) -> str:
    """The statement with its time limit and, for a read-only call, its access mode: `read_only` names the
    server's variable (read_only_variable()). SET STATEMENT restores both when the statement ends, so nothing
    the statement does to them (a stored function's SET SESSION ...) outlives it. Made once per statement and
    limit: a saved query's rendered text is the same str call after call (sql.prepare.render), so the lookup
    costs a few hundred instructions where the text cost one per character. `seeds`: RAND()'s two seeds for this
    statement alone (new each call, so never kept)."""
    if seeds is not None:
        return _mariadb_text(sql, timeout, read_only, f"rand_seed1 = {seeds[0]}, rand_seed2 = {seeds[1]}")
    key = (sql, timeout, read_only)
    try:
        return _MARIADB[key]
    except KeyError:
        pass
    sent = _mariadb_text(sql, timeout, read_only)
    if len(sql) <= KEPT_TEXT_MAX:
        if len(_MARIADB) >= _MARIADB_MAX:
            _MARIADB.clear()
        _MARIADB[key] = sent
    return sent


def _mariadb_text(sql: str, timeout: float | None, read_only: str | None, seeded: str = "") -> str:
    settings = [f"max_statement_time = {seconds_text(timeout)}"] if timeout else []
    if read_only is not None:
        settings.append(f"{read_only} = 1")
    if seeded:
        settings.append(seeded)
    settings.append(NO_TRACE)
    return f"SET STATEMENT {', '.join(settings)} FOR {sql}"


def read_only_variable(server_info: str) -> str:
    """MariaDB's name for the access-mode variable: `transaction_read_only` from 11.1, `tx_read_only` before
    (11.1 keeps the old name only as a deprecated alias)."""
    head = server_info.split("-", 1)[0].split(".")
    try:
        major, minor = int(head[0]), int(head[1])
    except (IndexError, ValueError):
        return "tx_read_only"
    return "transaction_read_only" if (major, minor) >= (11, 1) else "tx_read_only"


def lead_end(sql: str) -> int:
    """Index of the first character after leading whitespace and plain comments (-1: unterminated comment).

    Executable comments (`/*! ... */`, `/*M! ... */`) are code, not comments: the scan stops at them.
    """
    i = 0
    n = len(sql)
    while i < n:
        c = sql[i]
        if c in _WS:
            i += 1
        elif c == "#" or (c == "-" and sql.startswith("--", i) and (i + 2 == n or _ends_dashes(sql[i + 2]))):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "/" and sql.startswith("/*", i):
            if sql.startswith("/*!", i) or sql.startswith("/*M!", i):
                return i
            j = sql.find("*/", i + 2)
            if j < 0:
                return -1
            i = j + 2
        else:
            return i
    return i


def _ends_dashes(c: str) -> bool:
    # The server starts a comment at "--" followed by a space or any control character (as qag's lexer reads it),
    # not only the whitespace _WS lists: "--\x01" too.
    return c <= " " or c == "\x7f"


def _word_at(sql: str, i: int) -> str:
    """The lower-case word starting at i ('' if none)."""
    j = i
    n = len(sql)
    while j < n and (sql[j] in _WORD_CHARS or sql[j] > "\x7f"):
        j += 1
    return sql[i:j].lower()


@functools.lru_cache(maxsize=1024)
def _with_main(sql: str) -> tuple[str, int]:
    """For a WITH statement: the keyword of its main statement after the CTEs ('' if it starts with a
    parenthesis or can't be read) and, for SELECT, the index just after that keyword (else -1)."""
    tokens = lexer.tokenize(sql, "mysql", text_placeholders=False)
    depth = 0
    for t in lexer.significant(tokens)[1:]:
        if t.kind in (lexer.BAD, lexer.XCOMMENT):
            return "", -1
        if t.kind == lexer.PUNCT:
            if t.value == "(":
                depth += 1
            elif t.value == ")":
                depth -= 1
        elif depth == 0 and t.kind == lexer.WORD and t.value in (
                "select", "insert", "update", "delete", "replace", "table", "values"):
            return t.value, (t.end if t.value == "select" else -1)
    return "", -1


def hint_position(sql: str, with_hint: bool = True) -> int:
    """Where MAX_EXECUTION_TIME goes: just after the top-level SELECT keyword; -1 when there is none."""
    i = lead_end(sql)
    if i < 0:
        return -1
    word = _word_at(sql, i)
    if word == "select":
        return i + 6
    if word == "with" and with_hint:
        return _with_main(sql)[1]
    return -1


def with_hint(sql: str, ms: int, at: int) -> str:
    """sql with MAX_EXECUTION_TIME(ms) as the first hint of the query block whose SELECT ends at `at`."""
    j = at
    n = len(sql)
    while j < n and sql[j] in _WS:
        j += 1
    if sql.startswith("/*+", j):
        # MySQL reads one hint comment per query block: join the statement's own.
        return f"{sql[:j + 3]} MAX_EXECUTION_TIME({ms}){sql[j + 3:]}"
    return f"{sql[:at]} /*+ MAX_EXECUTION_TIME({ms}) */{sql[at:]}"


def mysql_statement(sql: str, timeout: float | None, with_hint_ok: bool = True) -> Timed:
    """The MySQL 8 form of one call's statement (see the module docstring).

    with_hint_ok: whether this server honours the hint on the top-level SELECT of a WITH statement (checked
    once per server; False sends WITH statements through the session variable).
    """
    if not timeout:
        return Timed(sql, None)
    ms = milliseconds(timeout)
    at = hint_position(sql, with_hint_ok)
    if at >= 0:
        return Timed(with_hint(sql, ms, at), None)
    first = first_word(sql)
    if first == "with" and _with_main(sql)[0] not in ("select", "table", "values", ""):
        first = "a write"     # WITH ... UPDATE/DELETE: not a SELECT, so MySQL can't limit it
    if first in _SESSION_LIMITED:
        return Timed(sql, ms)
    return Timed(sql, None)


def first_word(sql: str) -> str:
    """The statement's first keyword after leading comments, lower-case ('(' for a parenthesised start)."""
    i = lead_end(sql)
    if i < 0:
        return ""
    return "(" if sql.startswith("(", i) else _word_at(sql, i)


# The MySQL 8 check that the hint works on a WITH statement's top-level SELECT: a server that ignores it
# says so with a warning (ER_WARN_UNSUPPORTED_MAX_EXECUTION_TIME).
WITH_HINT_PROBE = "WITH qag_probe AS (SELECT 1 AS x) SELECT /*+ MAX_EXECUTION_TIME(60000) */ x FROM qag_probe"
