"""Per-statement preparation (cached per dialect and SQL) and the cheap per-call binding and rendering."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from qag.errors import QagError
from qag.sql import access, functions, lexer, pgread, window, writes
from qag.sql.lexer import BAD, PARAM, PUNCT, SEMI, STRING, TEXT, WORD, WS, XCOMMENT, Token
from qag.sql.window import OwnWindow

CACHE_SIZE = 4096
# A longer statement is not read at all (unreadable: refused by the guard and by render, a 4xx): classifying
# it with sqlglot costs about 80 us per token, so a 1 MB statement would hold a worker for many seconds.
MAX_STATEMENT_CHARS = 100_000

DIALECT_ALIASES = {"sqlite": "sqlite", "mysql": "mysql", "mariadb": "mysql", "postgres": "postgres",
                   "postgresql": "postgres"}

# Stands in the write operations of a statement the tokenizer couldn't finish, so nothing treats it as a read.
UNREADABLE_OP = "an unreadable statement"

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

# Slot kinds in a render template.
_BOUND = 0          # :name - the value is bound as given
_TEXT = 1           # {name} outside literals - bound like a literal the old text substitution would have made
_TEXT_IN_STR = 2    # {name} inside a string literal - bound as text, the literal split around it

_TEXT_VALUE_RE = re.compile(r"[\w\s.,:@%+/\-]*")
_INT_TEXT_RE = re.compile(r"[+-]?[0-9]+")
_DECIMAL_TEXT_RE = re.compile(r"[+-]?(?:[0-9]+\.[0-9]*|\.[0-9]+)")
_INT64_TEXT_MAX = 24   # characters: a sign and 64 bits' 19 digits, with leading zeros to spare
# numeric: $n, for drivers that send the values apart from the statement (psycopg 3's extended protocol).
_MARKERS = {"qmark": "?", "format": "%s", "numeric": None}


class Rendered(NamedTuple):
    """One call's statement, ready for cursor.execute.

    sql: the statement; args: the values for its placeholders, in order. When args is empty the statement has
    no placeholders and no doubled '%': execute it without parameters (format-style drivers format only when
    given some). windowed: the page window is in the SQL - every row the statement returns belongs to the page
    (plus the one extra row the caller asked for to learn X-Has-More); otherwise the caller skips `offset` rows
    and keeps `fetch`. limit: the LIMIT put in the SQL when windowed (None otherwise); it is below `fetch` when
    the statement's own LIMIT ends within this page, so len(rows) > page_size stays the test for X-Has-More.
    """

    sql: str
    args: tuple
    windowed: bool
    limit: int | None


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    """Everything about one statement that doesn't depend on the call. Build it with prepare()."""

    dialect: str
    sql: str                          # leading BOM, trailing whitespace and ';' removed
    multiple: bool                    # a ';' remains outside literals, identifiers and comments
    first_keyword: str                # lower-case; '' when the statement doesn't start with a word
    write_ops: frozenset[str]         # empty for a read
    bound_names: tuple[str, ...]      # :name, in order of first use
    text_names: tuple[str, ...]       # {name}, in order of first use
    in_sql_window: bool               # a page is taken with LIMIT/OFFSET in the SQL (else: fetch and slice)
    window: OwnWindow | None          # the statement's own trailing window (only when in_sql_window)
    unreadable: str | None            # why the statement can't be classified (unterminated literal, ...)
    _full: tuple = field(repr=False)  # render template: str pieces and (name, kind) slots
    _cut: tuple | None = field(repr=False)   # the same without the own window
    _plans: dict = field(default_factory=dict, repr=False)
    # PostgreSQL: what its own parser reads in the statement as sent (qag.sql.pgread.Reading); None elsewhere.
    reading: object = field(default=None, repr=False)
    text_placeholders: bool = True    # {name} is a placeholder (saved queries), else plain SQL (ad-hoc)
    _uses: dict = field(default_factory=dict, repr=False)   # default schema → access.Access
    _texts: dict = field(default_factory=dict, repr=False)  # (template text, page window) → the text sent

    @property
    def placeholders(self) -> tuple[str, ...]:
        """Names shown by the API: bound names first, then text placeholders."""
        return self.bound_names + tuple(n for n in self.text_names if n not in self.bound_names)

    @property
    def executable_comment(self) -> bool:
        return writes.EXECUTABLE_COMMENT in self.write_ops

    @property
    def cursor_pageable(self) -> bool:
        """PostgreSQL's own parser reads a query (SELECT, VALUES, a set operation): the engine can page it with a
        cursor, so the driver never buffers more than the page."""
        reading = self.reading
        return reading is not None and reading.query

    def uses(self, default_schema) -> access.Access:
        """What the statement uses - its tables qualified with default_schema, table functions and functions -
        for the table and function checks (contract 6.2, issue 18). Read once per default schema and kept here
        (the statement itself is cached per SQL), so a warm call parses nothing.

        PostgreSQL: from its own parser's reading; MySQL/MariaDB and SQLite: from qag's tokens, every way the
        server may read backslashes and quotes, each read again by sqlglot (qag.sql.access)."""
        found = self._uses.get(default_schema)
        if found is None:
            if self.dialect == "postgres":
                found = access.from_pgread(self.reading, self.unreadable, default_schema)
            elif len(self.sql) > access.MAX_SQL_CHARS:
                found = access.uncheckable("too long")
            else:
                text, readings = _token_readings(self.sql, self.dialect, self.text_placeholders)
                found = access.from_tokens(text, readings, self.dialect, default_schema)
            self._uses[default_schema] = found     # a race only reads twice
        return found

    def traceable_sql(self) -> str:
        """The statement for sqlglot's column lineage as qag's tokenizer reads it the engine's way: comments
        blanked (so sqlglot can't read them otherwise), each placeholder a constant (it binds a value, never a
        column). Executable comments (MySQL `/*! */`, MariaDB `/*M! */`) and unreadable text raise
        lineage.Unresolvable: what runs would differ from what is traced."""
        from qag.sql.lineage import Unresolvable  # noqa: PLC0415 - sqlglot's optimizer loads with masking, not with every statement
        if self.unreadable is not None:
            raise Unresolvable("the statement can't be read")
        out = []
        sql = self.sql
        # A window the engine lacks (SQLite's LIMIT ALL) is replaced before the statement runs (render), and no
        # window names a column: blanked, so sqlglot reads the statement in the dialect it has.
        w = self.window
        cut_from, cut_to = (w.start, w.end) if w is not None and not w.native else (-1, -1)
        # {name} is read as a placeholder here whatever text_placeholders says (masking always has).
        tokens = lexer.tokenize(sql, self.dialect)
        for k, token in enumerate(tokens):
            kind = token.kind
            if cut_from <= token.start < cut_to:
                out.append(" ")
            elif kind == lexer.COMMENT:
                out.append(" ")
            elif kind in (PARAM, TEXT):
                out.append("0")
            elif kind in (XCOMMENT, BAD):
                raise Unresolvable("an executable comment's columns can't be traced" if kind == XCOMMENT
                                   else "the statement can't be read")
            elif kind == lexer.NUMBER:   # kept apart from a name written against it (MySQL's 1e1from: 1e1 FROM)
                out.append(sql[token.start:token.end] + " ")
            elif kind == lexer.WORD and lexer.user_variable_at(tokens, k):
                out.append("v")    # a MySQL user variable's name (`@x. from t`): any plain name reads the same
            elif kind == lexer.WORD and ("0" <= token.value[:1] <= "9" or lexer.foreign_spaces(token.value)):
                # MySQL's digit-led names (0X41) and names holding what sqlglot reads as spaces (U+00A0): one name,
                # quoted as the engine reads it unquoted (PostgreSQL and SQLite fold ASCII letters only)
                name = sql[token.start:token.end]
                out.append("`" + name + "`" if self.dialect == "mysql" else
                           '"' + "".join(c.lower() if "A" <= c <= "Z" else c for c in name) + '"')
            else:
                out.append(sql[token.start:token.end])
        return "".join(out)

    def text_placeholders_written(self, write) -> str:
        """The statement's text with each {name} placeholder written as write(name), for another reader (sqlglot,
        in qag.sql.flow) to parse; everything else as written."""
        sql = self.sql
        return "".join(write(t.value) if t.kind == TEXT else sql[t.start:t.end]
                       for t in lexer.tokenize(sql, self.dialect, text_placeholders=self.text_placeholders))

    def table_references(self) -> list[tuple[int, int, str, str, bool, bool]]:
        """(start, end, schema as written or '', table, has an alias, named like a CTE of the statement) of every
        table reference in the text, as the engine reads it (qag.sql.references), for masking at the source.
        Raises lineage.Unresolvable where a reference can't be located for certain."""
        from qag.sql import references  # noqa: PLC0415 - loads with masking, not with every statement
        # {name} is read as a placeholder here whatever text_placeholders says (masking always has).
        return references.find(self.sql, lexer.tokenize(self.sql, self.dialect), self.dialect)

    def lineage(self, schema) -> tuple:
        """The result columns in order, each with the source columns it is computed from, against a connection's
        schema (lineage.Schema). Raises lineage.Unresolvable; a statement without a result has no columns."""
        from qag.sql.lineage import trace  # noqa: PLC0415 - sqlglot's optimizer loads with masking, not with every statement
        return trace(self.traceable_sql(), schema)

    def _plan(self, style: str, cut: bool) -> tuple:
        key = (style, cut)
        plan = self._plans.get(key)
        if plan is None:
            plan = _make_plan(self, style, cut)
            self._plans[key] = plan     # a race only computes the same plan twice
        return plan


def _make_plan(p: Prepared, style: str, cut: bool) -> tuple:
    try:
        marker = _MARKERS[style]
    except KeyError:
        raise ValueError(f"unknown parameter style {style!r}") from None
    items = p._cut if cut else p._full
    slots = tuple(item for item in items if type(item) is tuple)
    if marker is None:      # numbered: $1, $2, ... in order, each slot its own value (server-side parameters)
        text = _numbered(items)
    else:
        # Format-style drivers run "sql % args" only when given args, so '%' is doubled exactly then.
        double = style == "format" and bool(slots)
        text = "".join(marker if type(item) is tuple else (item.replace("%", "%%") if double else item)
                       for item in items)
    bound_required = _unique(name for name, kind in slots if kind == _BOUND)
    text_required = _unique(name for name, kind in slots if kind != _BOUND)
    w = p.window
    if cut and w is not None:
        # The own window's operands are resolved here, not bound, so their values are needed all the same.
        for op in (w.limit, w.offset):
            if op is not None and op[0] == "param" and op[1] not in bound_required:
                bound_required += (op[1],)
            elif op is not None and op[0] == "text" and op[1] not in text_required:
                text_required += (op[1],)
    return text, slots, bound_required, text_required


def _unique(names) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def prepare(sql: str, dialect: str, *, text_placeholders: bool = True) -> Prepared:
    """The prepared form of sql for dialect ('sqlite', 'mysql' (MariaDB too), 'postgres'); LRU-cached.

    text_placeholders=False reads {name} as plain SQL (ad-hoc /execute_sql, where they aren't expanded).
    Raises ValueError for an unknown dialect; never for bad SQL (that is recorded in the result).
    """
    try:
        canonical = DIALECT_ALIASES[dialect]
    except KeyError:
        raise ValueError(f"unsupported SQL dialect {dialect!r}") from None
    return _prepare(sql, canonical, text_placeholders)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _prepare(sql: str, dialect: str, text_placeholders: bool) -> Prepared:
    if len(sql) > MAX_STATEMENT_CHARS:
        return Prepared(dialect, sql, False, "", frozenset({UNREADABLE_OP}), (), (), False, None,
                        f"longer than {MAX_STATEMENT_CHARS} characters", (sql,), None,
                        text_placeholders=text_placeholders)
    tokens = lexer.tokenize(sql, dialect, text_placeholders=text_placeholders)
    tokens, text, multiple = _strip(tokens, sql)
    sig = lexer.significant(tokens)
    bad = next((t for t in tokens if t.kind == BAD), None)
    k = writes.first_word_index(sig)
    first = sig[k].value if k >= 0 else ""

    unreadable = None
    if bad is not None:
        unreadable = f"unterminated {bad.value}"
    elif not sig:
        unreadable = "no statement"
    elif k < 0:
        unreadable = "it does not start with a keyword"
    elif dialect == "sqlite" and any(t.kind == lexer.VARIABLE for t in tokens):
        unreadable = ("SQLite's own variables ($x, @x, #x, ?, or :x followed by :: or a parenthesis) aren't "
                      "placeholders here: values are bound by name (:name)")
    elif dialect == "mysql":
        unreadable = _mysql_unreadable(text, tokens, text_placeholders)

    if unreadable is not None:
        ops = {UNREADABLE_OP}
        if any(t.kind == XCOMMENT for t in tokens):
            ops.add(writes.EXECUTABLE_COMMENT)
    else:
        ops = _write_ops(text, tokens, sig, dialect)
        # A server may read backslashes differently (NO_BACKSLASH_ESCAPES, ANSI_QUOTES, PostgreSQL's
        # standard_conforming_strings=off): what any of those readings sees as a write or a second statement
        # counts. A reading that leaves a literal open is one the server would refuse, so it adds nothing.
        for alt_tokens, _, alt_multiple in _alternatives(tokens, text, dialect, text_placeholders):
            multiple = multiple or alt_multiple
            alt_sig = lexer.significant(alt_tokens)
            if writes.first_word_index(alt_sig) >= 0:
                ops |= _write_ops(text, alt_tokens, alt_sig, dialect)

    full, bound_names, text_names = _template(text, tokens, dialect, text_placeholders, None)
    reading = None
    if dialect == "postgres" and unreadable is None:
        # PostgreSQL's own parser reads the text exactly as it will be sent (placeholders as $n), so a statement
        # boundary or a write the tokenizer misread is seen as the server sees it. The contract's keyword rule
        # (the tokenizer's reading) stays: it can only refuse more, never let through what the parser reads as a
        # second statement or a write. Text the parser refuses, the server refuses as well.
        reading = pgread.read(_numbered(full))
        if reading.failure is None:
            multiple = multiple or reading.count > 1
            if reading.kind_op and not ops:
                ops.add(reading.kind_op)
            ops |= reading.write_ops

    in_sql_window = False
    own: OwnWindow | None = None
    if unreadable is None and not multiple and first in ("select", "with") and (k == 0 or dialect == "mysql"):
        # MySQL/MariaDB also window a query that starts with a parenthesis: `(SELECT ...) UNION (SELECT ...)
        # LIMIT n OFFSET m` limits the whole query expression, so the page is all the driver buffers.
        in_sql_window, own = _window(sig, tokens, dialect)

    cut = None
    if own is not None:
        cut, _, _ = _template(text, tokens, dialect, text_placeholders, own)
    return Prepared(dialect, text, multiple, first, frozenset(ops), bound_names, text_names, in_sql_window,
                    own, unreadable, full, cut, reading=reading, text_placeholders=text_placeholders)


def _numbered(items: tuple) -> str:
    """A render template as the numeric style sends it ($1, $2, ... for its slots)."""
    out = []
    n = 0
    for item in items:
        if type(item) is tuple:
            n += 1
            out.append(f"${n}")
        else:
            out.append(item)
    return "".join(out)


def _strip(tokens: list[Token], sql: str) -> tuple[list[Token], str, bool]:
    """Drop a leading BOM and trailing whitespace/';' (contract 4.3 rule 1); report a ';' that remains."""
    end = len(tokens)
    while end and tokens[end - 1].kind in (WS, SEMI):
        end -= 1
    start = 1 if tokens and tokens[0].kind == WS and tokens[0].value == "\ufeff" else 0
    kept = tokens[start:end]
    if not kept:
        return [], "", False
    base = kept[0].start
    text = sql[base:kept[-1].end]
    if base:
        kept = [Token(t.kind, t.start - base, t.end - base, t.value) for t in kept]
    return kept, text, any(t.kind == SEMI for t in kept)


def _token_readings(sql: str, dialect: str, text_placeholders: bool) -> tuple[str, list[list[Token]]]:
    """The statement's text (stripped) and its token readings: the dialect's own, then each alternative
    reading; none when nothing is left after stripping."""
    tokens = lexer.tokenize(sql, dialect, text_placeholders=text_placeholders)
    tokens, text, _ = _strip(tokens, sql)
    if not tokens:
        return text, []
    return text, [tokens] + [alt for alt, _, _ in _alternatives(tokens, text, dialect, text_placeholders)]


def _alternatives(tokens: list[Token], text: str, dialect: str, text_placeholders: bool):
    """(tokens, text, multiple) of each other way a server may read the statement's backslashes and quotes
    (NO_BACKSLASH_ESCAPES, ANSI_QUOTES, PostgreSQL's standard_conforming_strings=off), stripped. A reading that
    leaves a literal open is one the server would refuse, so it is skipped."""
    for alt in _alternative_readings(tokens, text, dialect):
        alt_tokens = lexer.tokenize(text, dialect, text_placeholders=text_placeholders, **alt)
        if any(t.kind == BAD for t in alt_tokens):
            continue
        yield _strip(alt_tokens, text)


def _alternative_readings(tokens: list[Token], text: str, dialect: str) -> list[dict]:
    if "\\" not in text:
        return []
    if dialect == "mysql":
        if any(t.kind in (STRING, lexer.QIDENT) and "\\" in text[t.start:t.end] for t in tokens):
            return [{"backslash_single": False, "backslash_double": False},
                    {"backslash_single": True, "backslash_double": False}]
    elif dialect == "postgres":
        if any(t.kind == STRING and t.value == "'" and "\\" in text[t.start:t.end] for t in tokens):
            return [{"backslash_single": True}]
    return []


# What starts a comment or a literal inside an executable comment's code (_mysql_unreadable).
_CODE_MARKS = ("--", "#", "/*", "'", '"', "`")


def _mysql_unreadable(text: str, tokens: list[Token], text_placeholders: bool) -> str | None:
    """Why a MySQL/MariaDB statement can't be read as every server reads it, or None.

    - A `[` outside literals and comments, in any backslash reading: MariaDB's sql_mode MSSQL reads `[...]` as a
      quoted name (where every other mode refuses the statement), so its literals, comments and slots would be
      elsewhere than qag reads them. Up to the first such bracket that server reads as one of these readings.
    - Slots in a statement with an executable comment (/*! */, /*M! */): the server reads the comment's inside as
      code, where a literal holding `*/` ends it elsewhere than qag's reading does.
    - An executable comment holding a comment or a literal mark (`--`, `#`, `/*`, a quote): the server reads its
      inside as code, where a line comment runs past the `*/` qag takes for its end (`/*! -- */` + a line feed
      goes on to the next `*/`) and a literal can hold one; so what runs is not what qag read (a second look got
      SHOW GRANTS and the process list past every check that way).
    - Slots another backslash reading puts elsewhere (_slots_move)."""
    readings = [tokens] + [alt for alt, _, _ in _alternatives(tokens, text, "mysql", text_placeholders)]
    if "[" in text and any(t.kind == PUNCT and t.value == "[" for reading in readings for t in reading):
        return ("a square bracket outside a literal, which a server whose sql_mode has MSSQL reads as a quoted name "
                "(and any other server refuses)")
    if "/*" in text and any(t.kind == XCOMMENT and any(mark in text[t.start + 3:t.end - 2] for mark in _CODE_MARKS)
                            for reading in readings for t in reading):
        return ("an executable comment (/*! */, /*M! */) holds a comment or a literal, so the server may end it "
                "elsewhere than it seems")
    slots = any(t.kind in (PARAM, TEXT) for t in tokens) or (
        text_placeholders and "{" in text and any(type(item) is tuple for item in _template(
            text, tokens, "mysql", text_placeholders, None)[0]))
    if not slots:
        return None   # nothing is spliced: the server reads the text as written
    if "/*" in text and any(t.kind == XCOMMENT for reading in readings for t in reading):
        return ("its placeholders share the statement with an executable comment (/*! */, /*M! */), whose inside "
                "the server reads as code")
    if _slots_move(text, tokens, text_placeholders):
        return ("its placeholders sit elsewhere for a server whose sql_mode reads backslashes or double quotes "
                "otherwise (NO_BACKSLASH_ESCAPES, ANSI_QUOTES); write a quote inside a literal as '' rather than "
                "\\'")
    return None


def _slots_move(text: str, tokens: list[Token], text_placeholders: bool) -> bool:
    """Whether a MySQL/MariaDB server that reads backslashes or double quotes otherwise would find a :name or
    {name} slot somewhere else: inside a literal or a comment, or where qag reads literal text. mysqlclient's values
    are spliced into the text at the slots qag reads, escaped for the session's own mode, so on such a server a
    caller's value would close a literal and run as SQL. A reading that leaves a literal open counts too: the
    values' own quotes can close it. Nothing is spliced into a statement without slots: the server reads it as
    written."""
    readings = _alternative_readings(tokens, text, "mysql")
    if not readings:
        return False
    full = _template(text, tokens, "mysql", text_placeholders, None)[0]
    if all(type(item) is str for item in full):
        return False
    for alt in readings:
        alt_tokens = lexer.tokenize(text, "mysql", text_placeholders=text_placeholders, **alt)
        if _template(text, alt_tokens, "mysql", text_placeholders, None)[0] != full:
            return True
    return False


def _write_ops(text: str, tokens: list[Token], sig: list[Token], dialect: str) -> set[str]:
    ops = writes.statement_ops(text, tokens, sig, 0, dialect)
    if dialect == "mysql":
        # GET_LOCK, sequences and their kin change state although the statement reads (docs/security.md).
        ops |= functions.writing_calls(text, sig, dialect)
    if any(t.kind == XCOMMENT for t in tokens):
        ops.add(writes.EXECUTABLE_COMMENT)
    return ops


def _depths(sig: list[Token]) -> list[int]:
    depths = []
    depth = 0
    for t in sig:
        if t.kind == PUNCT and t.value == ")":
            depth -= 1
        depths.append(depth)
        if t.kind == PUNCT and t.value == "(":
            depth += 1
    return depths


def _windowable(sig: list[Token], tokens: list[Token], dialect: str) -> tuple[bool, list[int]]:
    """Whether a LIMIT can be appended: a SELECT without executable comments or trailing clauses that
    must come after the window (FOR UPDATE/SHARE, LOCK IN SHARE MODE, INTO)."""
    if any(t.kind == XCOMMENT for t in tokens):
        return False, []
    k = writes.first_word_index(sig) if dialect == "mysql" else 0
    if k < 0 or writes.main_keyword(sig, k) != "select":
        return False, []
    depths = _depths(sig)
    for t, d in zip(sig, depths):
        if d == 0 and t.kind == WORD and t.value in ("for", "lock", "into", "procedure"):
            return False, depths
    return True, depths


def _window(sig: list[Token], tokens: list[Token], dialect: str) -> tuple[bool, OwnWindow | None]:
    ok, depths = _windowable(sig, tokens, dialect)
    if not ok:
        return False, None
    return window.find_window(sig, depths, dialect)


def _template(text: str, tokens: list[Token], dialect: str, text_placeholders: bool,
              cut: OwnWindow | None) -> tuple[tuple, tuple[str, ...], tuple[str, ...]]:
    """Render template (str pieces and (name, kind) slots) plus bound and text names in order of first use."""
    if cut is not None:
        before = [t for t in tokens if t.end <= cut.start]
        while before and before[-1].kind == WS:
            before.pop()
        tokens = before + [t for t in tokens if t.start >= cut.end]
    items: list = []
    buf: list[str] = []
    bound: dict[str, None] = {}
    texts: dict[str, None] = {}
    prev: Token | None = None

    def slot(name: str, kind: int) -> None:
        if buf:
            items.append("".join(buf))
            buf.clear()
        items.append((name, kind))

    for t in tokens:
        if t.kind == PARAM:
            bound.setdefault(t.value)
            slot(t.value, _BOUND)
        elif t.kind == TEXT:
            texts.setdefault(t.value)
            slot(t.value, _TEXT)
        elif (t.kind == STRING and text_placeholders and t.value in ("'", '"') and "{" in text[t.start:t.end]
              and not (prev is not None and prev.end == t.start and prev.kind == WORD)):
            parts = _split_literal(text[t.start:t.end], dialect)
            if parts is None:
                buf.append(text[t.start:t.end])
            else:
                for part in parts:
                    if type(part) is tuple:
                        texts.setdefault(part[0])
                        slot(*part)
                    else:
                        buf.append(part)
        else:
            buf.append(text[t.start:t.end])
        prev = t
    if buf:
        items.append("".join(buf))
    return tuple(items), tuple(bound), tuple(texts)


def _split_literal(literal: str, dialect: str) -> list | None:
    """A string literal holding {name} as an expression that binds each name as text; None if there's none.

    '{x}' becomes the bare slot; 'a{x}b' becomes ('a' || ? || 'b') - CONCAT('a', %s, 'b') on MySQL, where
    || is OR. A {name} right after an escaping backslash is left as text.
    """
    quote = literal[0]
    body = literal[1:-1]
    backslash = dialect == "mysql"
    pieces: list = []
    pos = 0
    for m in lexer._TEXT_RE.finditer(body):
        before = body[pos:m.start()]
        if backslash and (len(before) - len(before.rstrip("\\"))) % 2:
            continue
        if before:
            pieces.append(quote + before + quote)
        pieces.append((m.group(1), _TEXT_IN_STR))
        pos = m.end()
    if not pieces:
        return None
    if pos < len(body):
        pieces.append(quote + body[pos:] + quote)
    if len(pieces) == 1:
        return pieces
    out: list = ["CONCAT(" if dialect == "mysql" else "("]
    sep = ", " if dialect == "mysql" else " || "
    for i, piece in enumerate(pieces):
        if i:
            out.append(sep)
        out.append(piece)
    out.append(")")
    return out


# ---------------------------------------------------------------- per call


def _bad_bound(name: str, value) -> QagError | None:
    t = type(value)
    if t is str or t is bool or value is None:
        return None
    if t is int:
        if _INT64_MIN <= value <= _INT64_MAX:
            return None
        return QagError("param_invalid", f"Parameter '{name}' is outside the signed 64-bit integer range")
    if t is float and math.isfinite(value):
        return None
    return QagError("param_invalid", f"Parameter '{name}' must be a string, finite number, boolean or null")


def _text_value_ok(value) -> bool:
    t = type(value)
    if t is bool:
        return True
    if t is int:
        return _INT64_MIN <= value <= _INT64_MAX
    if t is float:
        return math.isfinite(value)
    if t is str:
        return _TEXT_VALUE_RE.fullmatch(value) is not None and "--" not in value
    return False


def _text_error(name: str) -> QagError:
    return QagError("param_invalid", f"Placeholder '{name}' must be a number, true/false, or text made only of "
                                     "letters, digits, spaces and . , : @ % + / - (and no '--')")


def check_text_values(prepared: Prepared, values: dict) -> None:
    """Contract 3.5.1 for {name}: every one has a value, and each value is one the old text substitution took."""
    names = prepared.text_names
    if not names:
        return
    missing = [n for n in names if n not in values]
    if missing:
        raise QagError("param_required", "No value provided for placeholder(s): " + ", ".join(missing))
    for n in names:
        if not _text_value_ok(values[n]):
            raise _text_error(n)


def _text_arg(name: str, value, kind: int):
    if not _text_value_ok(value):
        raise _text_error(name)
    if kind == _TEXT_IN_STR:
        if type(value) is bool:
            return "TRUE" if value else "FALSE"
        return value if type(value) is str else str(value)
    if type(value) is str:
        # The old substitution made '5' the number 5: bind it as one so results and comparisons match.
        # Longer texts are past 64 bits (and int() refuses past 4300 digits): they stay text.
        if len(value) <= _INT64_TEXT_MAX and _INT_TEXT_RE.fullmatch(value):
            n = int(value)
            if _INT64_MIN <= n <= _INT64_MAX:
                return n
        elif _DECIMAL_TEXT_RE.fullmatch(value):
            number = float(value)
            if math.isfinite(number):   # past a double's range the number stays text (MySQL can't bind inf)
                return number
    return value


# A Rendered made without NamedTuple's own __new__, which runs in the interpreter even in a compiled build.
_rendered = functools.partial(tuple.__new__, Rendered)
_TEXTS_MAX = 64     # pages' texts kept per statement (most calls ask for the first page or a few)


def render(prepared: Prepared, values: dict, style: str, fetch: int | None = None, offset: int = 0) -> Rendered:
    """The statement and arguments for one call.

    style: 'qmark' (?, sqlite3), 'format' (%s, mysqlclient) or 'numeric' ($1, $2, ...: psycopg 3). fetch: rows wanted for the page
    (page size + 1), None for the whole result; offset: the page offset. The page window goes into the SQL
    only for statements with in_sql_window (see Rendered). Raises QagError param_required / param_invalid for
    missing or unusable values (including LIMIT/OFFSET operands), invalid_request for an unreadable statement.
    """
    p = prepared
    if p.unreadable is not None:
        raise QagError("invalid_request", f"The SQL statement can't be read: {p.unreadable}")
    w = p.window
    windowed = fetch is not None and p.in_sql_window
    cut = w is not None and (windowed or w.has_params or not w.native)   # a form the engine lacks: replaced
    plan = p._plans.get((style, cut)) or p._plan(style, cut)
    text, slots, bound_required, text_required = plan

    for names, what in ((bound_required, "parameter(s)"), (text_required, "placeholder(s)")):
        if names:
            missing = [n for n in names if n not in values]
            if missing:
                raise QagError("param_required", f"No value provided for {what}: " + ", ".join(missing))

    if slots:
        args = []
        for name, kind in slots:
            value = values[name]
            if kind == _BOUND:
                err = _bad_bound(name, value)
                if err is not None:
                    raise err
            else:
                value = _text_arg(name, value, kind)
            args.append(value)
        args = tuple(args)
    else:
        args = ()

    if windowed:
        suffix, rows = window.page_suffix(w, values, fetch, offset)
        # The same str for the same page of a statement, call after call: what keys a dict by the text sent (the
        # MySQL backend's session-state judgement and statement prefix, the drivers' encodings) hashes it once.
        key = (text, suffix)
        texts = p._texts
        full = texts.get(key)
        if full is None:
            full = text + suffix
            if len(texts) < _TEXTS_MAX:
                texts[key] = full
        return _rendered((full, args, True, rows))
    if cut:
        text += window.own_suffix(w, values, p.dialect)
    return _rendered((text, args, False, None))
