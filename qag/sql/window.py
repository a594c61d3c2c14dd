"""A statement's own trailing LIMIT/OFFSET/FETCH window: recognising it, and combining it with a page."""

from __future__ import annotations

import math
from typing import NamedTuple

from qag.errors import QagError
from qag.sql.lexer import NUMBER, PARAM, PUNCT, TEXT, WORD, Token

# Largest value every engine takes as a row count or offset (SQLite's is signed 64-bit).
MAX_ROWS = 2**63 - 1
_SUFFIX_CACHE = 1024
_SUFFIXES: dict[tuple[int, int], str] = {}   # (rows, offset) -> a page's window text (page_suffix)

# How each engine spells "no limit" when only an offset is wanted.
_NO_LIMIT_OFFSET = {
    "sqlite": "\nLIMIT -1 OFFSET {}",
    "mysql": "\nLIMIT 18446744073709551615 OFFSET {}",
    "postgres": "\nLIMIT ALL OFFSET {}",
}

# An operand: ("lit", int) for a literal, ("param", name) for :name, ("text", name) for {name}.
Operand = tuple


class OwnWindow(NamedTuple):
    start: int                 # offset in the prepared statement where the window's first token starts
    end: int                   # offset just after its last token
    limit: Operand | None      # None: no limit (absent or LIMIT ALL)
    offset: Operand | None     # None: no offset
    has_params: bool           # an operand comes from the call's values
    native: bool = True        # the engine runs it as written (else it is always replaced: render)


def _operand(tok: Token | None) -> Operand | None:
    if tok is None:
        return None
    if tok.kind == NUMBER and tok.value.isascii() and tok.value.isdigit():
        return ("lit", int(tok.value))
    if tok.kind == PARAM:
        return ("param", tok.value)
    if tok.kind == TEXT:
        return ("text", tok.value)
    return None


def _word(tok: Token | None) -> str:
    return tok.value if tok is not None and tok.kind == WORD else ""


def _clauses(ts: list[Token], dialect: str) -> list[tuple] | None:
    """Read ts (significant tokens) as window clauses; None unless they are exactly that."""
    out: list[tuple] = []
    pos = 0
    n = len(ts)

    def at(k: int) -> Token | None:
        return ts[k] if k < n else None

    while pos < n:
        w = _word(ts[pos])
        if w == "limit":
            if _word(at(pos + 1)) == "all":
                out.append(("limit", None))
                pos += 2
                continue
            a = _operand(at(pos + 1))
            if a is None:
                return None
            nxt = at(pos + 2)
            if nxt is not None and nxt.kind == PUNCT and nxt.value == ",":
                if dialect == "postgres":
                    return None          # PostgreSQL refuses LIMIT m, n
                b = _operand(at(pos + 3))
                if b is None:
                    return None
                out.append(("comma", a, b))
                pos += 4
                continue
            out.append(("limit", a))
            pos += 2
        elif w == "offset":
            a = _operand(at(pos + 1))
            if a is None:
                return None
            rows = _word(at(pos + 2)) in ("row", "rows")
            out.append(("offset", a, rows))
            pos += 3 if rows else 2
        elif w == "fetch":
            if _word(at(pos + 1)) not in ("first", "next"):
                return None
            pos += 2
            a = _operand(at(pos))
            if a is None:
                a = ("lit", 1)           # FETCH FIRST ROW ONLY
            else:
                pos += 1
            if _word(at(pos)) not in ("row", "rows") or _word(at(pos + 1)) != "only":
                return None              # includes WITH TIES, whose row count we can't compute
            out.append(("fetch", a))
            pos += 2
        else:
            return None
    return out


def _standard(clauses: list[tuple]) -> bool:
    """One of the contract's standard forms (3.6: `OFFSET m [ROWS]`, `[OFFSET m ROWS] FETCH FIRST|NEXT [n] ROW|ROWS
    ONLY`, `LIMIT ALL [OFFSET m]`), which a statement of every engine may carry: where the engine has no such
    syntax (SQLite, MySQL) the window is replaced by its own LIMIT/OFFSET (page_suffix, own_suffix)."""
    kinds = [c[0] for c in clauses]
    if kinds in (["offset"], ["fetch"]) or (kinds == ["offset", "fetch"] and clauses[0][2]):
        return True
    return kinds[0] == "limit" and clauses[0][1] is None and kinds in (["limit"], ["limit", "offset"])


def _native(clauses: list[tuple], dialect: str) -> bool:
    """Whether the engine itself runs this sequence of clauses as written."""
    kinds = [c[0] for c in clauses]
    if not kinds or len(kinds) > 2:
        return False
    if kinds == ["comma"]:
        return dialect in ("sqlite", "mysql")
    if dialect in ("sqlite", "mysql"):
        if kinds == ["limit"]:
            return clauses[0][1] is not None   # LIMIT ALL is PostgreSQL's
        if kinds == ["limit", "offset"]:
            return clauses[0][1] is not None and not clauses[1][2]   # "LIMIT n OFFSET m ROWS" is PostgreSQL only
        # MariaDB 10.6 has [OFFSET m ROWS] FETCH FIRST n ROWS ONLY, MySQL 8 none: replaced on both.
        return False
    # PostgreSQL: at most one limit clause (LIMIT or FETCH) and one offset clause, in either order.
    limits = sum(k in ("limit", "fetch") for k in kinds)
    offsets = kinds.count("offset")
    return limits <= 1 and offsets <= 1


def find_window(sig: list[Token], depths: list[int], dialect: str) -> tuple[bool, OwnWindow | None]:
    """(windowable, own window) for a SELECT's significant tokens.

    A statement is not windowable when a LIMIT/OFFSET/FETCH at depth 0 is not a trailing window we can read
    (an expression operand, WITH TIES, a locking clause after it, ...): the caller then runs it as written and
    slices the page from the rows.
    """
    first = -1
    for k, tok in enumerate(sig):
        if depths[k] == 0 and tok.kind == WORD and tok.value in ("limit", "offset", "fetch"):
            first = k
            break
    if first < 0:
        return True, None
    tail = sig[first:]
    if any(d != 0 for d in depths[first:]):
        return False, None
    clauses = _clauses(tail, dialect)
    if clauses is None or not clauses or len(clauses) > 2:
        return False, None
    native = _native(clauses, dialect)
    if not (native or _standard(clauses)):
        return False, None
    limit: Operand | None = None
    offset: Operand | None = None
    for c in clauses:
        if c[0] == "comma":
            offset, limit = c[1], c[2]
        elif c[0] in ("limit", "fetch"):
            limit = c[1]
        else:
            offset = c[1]
    has_params = any(op is not None and op[0] != "lit" for op in (limit, offset))
    return True, OwnWindow(tail[0].start, tail[-1].end, limit, offset, has_params, native)


def operand_value(op: Operand | None, values: dict, word: str) -> int | None:
    """The integer an operand stands for in this call; a bad value is the caller's 400."""
    if op is None:
        return None
    kind, v = op
    if kind == "lit":
        return v
    value = values[v]
    if type(value) is int:
        n = value
    elif type(value) is str and value.isascii() and value.isdigit():
        # Past 20 digits the number is past any window an engine takes (and int() refuses past 4300 digits):
        # it is clamped like any huge one.
        digits = value.lstrip("0")
        n = int(digits or "0") if len(digits) <= 20 else 10 ** 20
    elif type(value) is float and math.isfinite(value) and value.is_integer():
        n = int(value)
    else:
        n = -1
    if n < 0:
        shown = f":{v}" if kind == "param" else "{" + v + "}"
        raise QagError("param_invalid", f"{word} {shown} must be a non-negative whole number")
    return n


def page_suffix(window: OwnWindow | None, values: dict, fetch: int, offset: int) -> tuple[str, int]:
    """The window appended to the statement for one page, and how many rows it can return.

    Within an own window the page is taken inside it: offset = own offset + page offset and
    rows = min(fetch, own limit - page offset), so paging stops at the author's limit.
    """
    rows = fetch
    start = offset
    if window is not None:
        own_limit = operand_value(window.limit, values, "LIMIT")
        own_offset = operand_value(window.offset, values, "OFFSET")
        if own_offset:
            start += own_offset
        if own_limit is not None:
            rows = min(fetch, max(0, own_limit - offset))
    rows = min(rows, MAX_ROWS)
    start = min(start, MAX_ROWS)
    # Most calls ask for the same few pages: their text is made once (a lookup is ~1k instructions less than the
    # f-string). Keyed by ints only, so an equal float or bool never returns an int's text.
    key = (rows, start) if type(rows) is int and type(start) is int else None
    try:
        return _SUFFIXES[key], rows   # a subscript, not .get(): no method call (None is never a key)
    except KeyError:
        pass
    suffix = f"\nLIMIT {rows} OFFSET {start}"
    if key is not None:
        if len(_SUFFIXES) >= _SUFFIX_CACHE:
            _SUFFIXES.clear()   # bounded: start over (a race only makes a text twice)
        _SUFFIXES[key] = suffix
    return suffix, rows


def own_suffix(window: OwnWindow, values: dict, dialect: str) -> str:
    """The statement's own window with its parameters resolved to literals (no page applied)."""
    own_limit = operand_value(window.limit, values, "LIMIT")
    own_offset = operand_value(window.offset, values, "OFFSET") or 0
    own_offset = min(own_offset, MAX_ROWS)
    if own_limit is not None:
        return f"\nLIMIT {min(own_limit, MAX_ROWS)} OFFSET {own_offset}"
    if own_offset:
        return _NO_LIMIT_OFFSET[dialect].format(own_offset)
    return ""
