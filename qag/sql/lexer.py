"""SQL tokenizer that reads a statement the way SQLite, MySQL/MariaDB or PostgreSQL does."""

from __future__ import annotations

import re
from typing import NamedTuple

# Token kinds. Plain strings so tokens print readably in test failures.
WS = "ws"
COMMENT = "comment"
XCOMMENT = "xcomment"      # MySQL /*! ... */ or MariaDB /*M! ... */: code the server executes
STRING = "string"          # value: the opening delimiter ("'", '"', "E'", "$tag$")
QIDENT = "qident"          # quoted identifier
WORD = "word"              # value: lower-cased text
NUMBER = "number"
PARAM = "param"            # bound :name; value: the name
TEXT = "text"              # legacy {name}; value: the name
SEMI = "semi"
PUNCT = "punct"            # value: the text ("::" is one token, everything else one character)
BAD = "bad"                # unterminated literal, identifier or comment; value says which; runs to the end
VARIABLE = "variable"      # SQLite's own variables ($x, @x, #x, ?, ?1, :x::y(...)) other than a plain :name; value: the text

DIALECTS = ("sqlite", "mysql", "postgres")

# Skippable tokens: they never change what a statement does (executable comments do, so they are not here).
TRIVIA = frozenset((WS, COMMENT))


class Token(NamedTuple):
    kind: str
    start: int
    end: int
    value: str


_WS_CHARS = " \t\n\r\f\v"
# Engines treat every non-ASCII character as an identifier character, so the tokenizer does too.
_WORD_RE = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]*")
_NUMBER_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[A-Za-z0-9_$\u0080-\U0010ffff]*")
# PostgreSQL ends a number before a `$` right after its digits (`1$1` is 1 then the parameter $1, `1$a$...` 1 then a
# dollar-quoted string); after a letter or `_` the rest is one run (`1a$1`: trailing junk the server refuses).
_PG_NUMBER_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
                           r"(?:(?!\$)[A-Za-z0-9_$\u0080-\U0010ffff]+)?")
_NAME_RE = re.compile(r"[A-Za-z_]\w*")
# MySQL/MariaDB (sql_lex.cc): a number starting with a digit ends after its fraction or its exponent's digits, so
# "1e1from" and "1.from" are a number and then FROM; a run of digits going on into other identifier characters
# (no exponent) is one identifier ("1abc"), 0x and 0b too unless only hex or binary digits follow.
_IDENT_CHARS_RE = re.compile(r"[A-Za-z0-9_$\u0080-\U0010ffff]*")
_MYSQL_DIGITS_RE = re.compile(r"[0-9]*")
_MYSQL_EXPONENT_RE = re.compile(r"[eE][+-]?[0-9]+")
_USER_VARIABLE_RE = re.compile(r"[A-Za-z0-9._$\u0080-\U0010ffff]*")
_TEXT_RE = re.compile(r"\{([A-Za-z_]\w*)\}")
_DOLLAR_TAG_RE = re.compile(r"\$(?:[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
_WS_RUN_RE = re.compile(r"[ \t\n\r\f\v]+")


def _quoted(sql: str, pos: int, quote: str, backslash: bool) -> int:
    """End of the quoted run opening at pos (doubled quotes, and backslash escapes if asked); -1 if unterminated."""
    i = pos + 1
    n = len(sql)
    if not backslash:
        while True:
            j = sql.find(quote, i)
            if j < 0:
                return -1
            if j + 1 < n and sql[j + 1] == quote:
                i = j + 2
                continue
            return j + 1
    while i < n:
        c = sql[i]
        if c == "\\":
            i += 2
        elif c == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
            else:
                return i + 1
        else:
            i += 1
    return -1


def _mysql_number_end(sql: str, pos: int) -> tuple[int, bool]:
    """(end, whether it is an identifier) of the number or digit-led identifier MySQL/MariaDB reads at pos, a
    digit or a '.' before one, as its lexer does (MY_LEX_NUMBER_IDENT, MY_LEX_INT_OR_REAL, MY_LEX_REAL). End -1
    where it reads something no engine-exact reading can follow ("1.e" without exponent digits: MY_LEX_CHAR)."""
    i = _MYSQL_DIGITS_RE.match(sql, pos).end()
    n = len(sql)
    if sql[pos] != ".":
        run = _IDENT_CHARS_RE.match(sql, i).end()
        if run > i:                                      # identifier characters follow the digits
            exponent = _MYSQL_EXPONENT_RE.match(sql, i)
            if exponent is not None:
                return exponent.end(), False             # FLOAT_NUM: what follows is the next token
            if i == pos + 1 and sql.startswith(("0x", "0b"), pos):   # lower case only, as the server
                digits = sql[pos + 2:run]
                if digits and all(d in ("0123456789abcdefABCDEF" if sql[pos + 1] == "x" else "01") for d in digits):
                    return run, False                    # a hex or bit literal
            return run, True                             # digits into identifier characters: one name
        if not sql.startswith(".", i) or sql.startswith("..", i):
            return i, False                              # an integer
        i = _MYSQL_DIGITS_RE.match(sql, i + 1).end()     # the fraction
    else:
        i = _MYSQL_DIGITS_RE.match(sql, pos + 1).end()
    if i < n and sql[i] in "eE":
        exponent = _MYSQL_EXPONENT_RE.match(sql, i)
        return (-1 if exponent is None else exponent.end()), False
    return i, False


def _sqlite_variable_end(sql: str, pos: int) -> int:
    """End of the variable SQLite reads at pos ($, @, #, : or ?), as its tokenizer does (tokenize.c): `?` and its
    digits; else identifier characters, `::` between them, and after at least one of them a `(...)` suffix that
    runs to the next `)` (included) or whitespace - quotes, colons and all. Text SQLite reads as one variable
    must be one token here too: `$x::t(:p,')` holds no parameter and opens no string."""
    n = len(sql)
    i = pos + 1
    if sql[pos] == "?":
        while i < n and "0" <= sql[i] <= "9":
            i += 1
        return i
    named = False
    while i < n:
        c = sql[i]
        if c.isascii() and (c.isalnum() or c in "_$") or c >= "\u0080":
            named = True
            i += 1
        elif c == "(" and named:
            i += 1
            while i < n and sql[i] not in _WS_CHARS and sql[i] != ")":
                i += 1
            return i + 1 if i < n and sql[i] == ")" else i
        elif c == ":" and sql.startswith("::", i):
            i += 2
        else:
            break
    return i


def _block_comment_end(sql: str, pos: int, nested: bool) -> int:
    """End of the /* comment opening at pos; -1 if unterminated. PostgreSQL nests them, the others don't."""
    if not nested:
        j = sql.find("*/", pos + 2)
        return -1 if j < 0 else j + 2
    depth = 0
    i = pos
    n = len(sql)
    while i < n - 1:
        pair = sql[i:i + 2]
        if pair == "/*":
            depth += 1
            i += 2
        elif pair == "*/":
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    return -1


def tokenize(sql: str, dialect: str, *, backslash_single: bool | None = None,
             backslash_double: bool | None = None, text_placeholders: bool = True) -> list[Token]:
    """Split sql into tokens covering every character, in order.

    backslash_single / backslash_double override whether backslashes escape inside '...' and "..." strings
    (None: the dialect's default - MySQL yes, PostgreSQL and SQLite no). The guard uses the overrides to also
    read a statement as a server with NO_BACKSLASH_ESCAPES, ANSI_QUOTES or standard_conforming_strings=off would.
    """
    if dialect not in DIALECTS:
        raise ValueError(f"unsupported dialect {dialect!r}")
    mysql = dialect == "mysql"
    pg = dialect == "postgres"
    sqlite = dialect == "sqlite"
    bs_single = mysql if backslash_single is None else backslash_single
    bs_double = mysql if backslash_double is None else backslash_double

    tokens: list[Token] = []
    append = tokens.append
    n = len(sql)
    i = 0
    if sql.startswith("\ufeff"):
        append(Token(WS, 0, 1, "\ufeff"))
        i = 1

    def bad(start: int, what: str) -> None:
        append(Token(BAD, start, n, what))

    while i < n:
        c = sql[i]
        if c in _WS_CHARS:
            m = _WS_RUN_RE.match(sql, i)
            append(Token(WS, i, m.end(), ""))
            i = m.end()
        elif c == "'":
            end = _quoted(sql, i, "'", bs_single)
            if end < 0:
                bad(i, "string literal")
                break
            append(Token(STRING, i, end, "'"))
            i = end
        elif c == '"':
            if mysql:
                end = _quoted(sql, i, '"', bs_double)
                kind = STRING
            else:
                end = _quoted(sql, i, '"', False)
                kind = QIDENT
            if end < 0:
                bad(i, "string literal" if kind == STRING else "quoted identifier")
                break
            append(Token(kind, i, end, '"'))
            i = end
        elif c == "`" and (mysql or sqlite):
            end = _quoted(sql, i, "`", False)
            if end < 0:
                bad(i, "quoted identifier")
                break
            append(Token(QIDENT, i, end, "`"))
            i = end
        elif c == "[" and sqlite:
            j = sql.find("]", i + 1)
            if j < 0:
                bad(i, "quoted identifier")
                break
            append(Token(QIDENT, i, j + 1, "["))
            i = j + 1
        elif c == "-" and sql.startswith("--", i) and (
                not mysql or i + 2 >= n or ord(sql[i + 2]) <= 32 or sql[i + 2] == "\x7f"):
            # MySQL only starts a comment at "--" followed by whitespace/control or the end: "5--1" is 5 - -1.
            # PostgreSQL's scanner ends it at a carriage return too (scan.l: non_newline is [^\n\r]); MySQL and
            # SQLite at a line feed only.
            j = sql.find("\n", i)
            end = n if j < 0 else j
            if pg:
                r = sql.find("\r", i, end)
                if r >= 0:
                    end = r
            append(Token(COMMENT, i, end, "--"))
            i = end
        elif c == "#" and mysql:
            j = sql.find("\n", i)
            end = n if j < 0 else j
            append(Token(COMMENT, i, end, "#"))
            i = end
        elif c == "/" and sql.startswith("/*", i):
            end = _block_comment_end(sql, i, pg)
            if end < 0:
                bad(i, "comment")
                break
            executable = sql.startswith("/*!", i) or sql.startswith("/*M!", i)
            append(Token(XCOMMENT if executable else COMMENT, i, end, "/*"))
            i = end
        elif c == "$" and pg:
            m = _DOLLAR_TAG_RE.match(sql, i)
            if m is None:
                append(Token(PUNCT, i, i + 1, "$"))   # $1 positional parameters and the like
                i += 1
                continue
            tag = m.group()
            j = sql.find(tag, m.end())
            if j < 0:
                bad(i, "dollar-quoted string")
                break
            append(Token(STRING, i, j + len(tag), tag))
            i = j + len(tag)
        elif sqlite and c in "$@#:?":
            # SQLite's reading of its variables (qag's own :name included): a plain :name is a parameter, any other
            # variable is refused by prepare() - qag binds by name only.
            end = _sqlite_variable_end(sql, i)
            if c == ":" and _NAME_RE.fullmatch(sql, i + 1, end):
                append(Token(PARAM, i, end, sql[i + 1:end]))
            else:
                append(Token(VARIABLE, i, end, sql[i:end]))
            i = end
        elif c == ":":
            if sql.startswith("::", i):
                append(Token(PUNCT, i, i + 2, "::"))
                i += 2
                continue
            m = _NAME_RE.match(sql, i + 1)
            # Not after another colon: "a:::b" is not a parameter either.
            if m is not None and not (i > 0 and sql[i - 1] == ":"):
                append(Token(PARAM, i, m.end(), m.group()))
                i = m.end()
            else:
                append(Token(PUNCT, i, i + 1, ":"))
                i += 1
        elif c == "{" and text_placeholders:
            m = _TEXT_RE.match(sql, i)
            if m is not None:
                append(Token(TEXT, i, m.end(), m.group(1)))
                i = m.end()
            else:
                append(Token(PUNCT, i, i + 1, "{"))
                i += 1
        elif c == ";":
            append(Token(SEMI, i, i + 1, ";"))
            i += 1
        elif c == "@" and mysql:
            # MySQL/MariaDB: @@ begins a system variable (read by the usual name rules); @ and a quote a quoted user
            # variable; any other @ a user variable whose name runs over letters, digits, '.', '_', '$' and every
            # non-ASCII character (MY_LEX_HOSTNAME): `@x. from t` is the variable `x.`, then FROM.
            if sql.startswith("@@", i):
                append(Token(PUNCT, i, i + 1, "@"))
                append(Token(PUNCT, i + 1, i + 2, "@"))
                i += 2
                continue
            end = _USER_VARIABLE_RE.match(sql, i + 1).end()
            if end == i + 1 and not sql.startswith(("'", '"', "`"), i + 1):
                # `@ from t`: the server reads a variable with an empty name, other readers a name `from`
                bad(i, "user variable without a name")
                break
            append(Token(PUNCT, i, i + 1, "@"))
            if end > i + 1:
                append(Token(WORD, i + 1, end, sql[i + 1:end].lower()))
            i = end if end > i + 1 else i + 1
        elif (mysql and c == "." and i + 1 < n and tokens and tokens[-1].end == i
              and tokens[-1].kind in (WORD, QIDENT) and _IDENT_CHARS_RE.match(sql, i + 1).end() > i + 1):
            # Right after a name, a '.' and identifier characters are a qualified name's next part, whatever
            # they start with (MY_LEX_IDENT_SEP): t.1e1from is the column `1e1from` of t.
            end = _IDENT_CHARS_RE.match(sql, i + 1).end()
            append(Token(PUNCT, i, i + 1, "."))
            append(Token(WORD, i + 1, end, sql[i + 1:end].lower()))
            i = end
        elif "0" <= c <= "9" or (c == "." and i + 1 < n and "0" <= sql[i + 1] <= "9"):
            name = False
            if mysql:
                end, name = _mysql_number_end(sql, i)
                if end < 0:
                    bad(i, "number")
                    break
            else:
                end = (_PG_NUMBER_RE if pg else _NUMBER_RE).match(sql, i).end()
            append(Token(WORD, i, end, sql[i:end].lower()) if name else Token(NUMBER, i, end, sql[i:end]))
            i = end
        elif c.isalpha() or c == "_" or c >= "\u0080":
            end = _WORD_RE.match(sql, i + 1).end()
            if pg and end == i + 1 and c in "eE" and end < n and sql[end] == "'":
                # E'...': PostgreSQL's escape string, the one literal where backslashes always escape.
                close = _quoted(sql, end, "'", True)
                if close < 0:
                    bad(i, "string literal")
                    break
                append(Token(STRING, i, close, c + "'"))
                i = close
                continue
            append(Token(WORD, i, end, sql[i:end].lower()))
            i = end
        else:
            append(Token(PUNCT, i, i + 1, c))
            i += 1
    return tokens


def user_variable_at(tokens: list[Token], k: int) -> bool:
    """Whether tokens[k] is a MySQL user variable's name: a WORD right after a lone '@' (the lexer's reading)."""
    if k < 1 or tokens[k].kind != WORD:
        return False
    at = tokens[k - 1]
    return (at.kind == PUNCT and at.value == "@" and at.end == tokens[k].start
            and not (k >= 2 and tokens[k - 2].kind == PUNCT and tokens[k - 2].value == "@"
                     and tokens[k - 2].end == at.start))


def foreign_spaces(text: str) -> bool:
    """Whether a name holds characters other readers (sqlglot, Python) take for whitespace and the engines take
    for part of a name (U+00A0, U+2028, U+3000...)."""
    return not text.isascii() and any(c.isspace() for c in text)


def significant(tokens: list[Token]) -> list[Token]:
    """The tokens that are not whitespace or plain comments."""
    return [t for t in tokens if t.kind not in TRIVIA]
