"""Which operations a statement writes: the contract's keyword rule, joined with what sqlglot finds."""

from __future__ import annotations

import logging

import sqlglot
from sqlglot import exp

from qag.sql.lexer import COMMENT, NUMBER, PUNCT, QIDENT, STRING, TEXT, WORD, WS, XCOMMENT, Token

# First keywords of statements that only read (contract 4.3 rule 3).
READ_FIRST = frozenset(("select", "with", "show", "describe", "desc", "explain", "values", "table"))
EXECUTABLE_COMMENT = "an executable comment"

_READ_ONLY = ("Only read-only statements (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) are allowed - not one that writes "
              "({}). Set QUERYAPIGATE_ALLOW_WRITES=1 to lift this restriction.")


class _CommandFallbackFilter(logging.Filter):
    """Drops sqlglot's warning for statements it keeps as an opaque command (EXPLAIN, SHOW, CALL, ...):
    the guard reads those by keyword, so the warning would only repeat once per new statement in the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_CommandFallbackFilter())

_SQLGLOT_DIALECT = {"sqlite": "sqlite", "mysql": "mysql", "postgres": "postgres"}

# sqlglot nodes that change data, schema or session state, and the operation each one is reported as.
# exp.Lock is SELECT ... FOR UPDATE/SHARE: rows locked, not written, yet not read-only (issue 4: refused unless
# writes are allowed; QueryAPIGate let it through, docs/compatibility.md).
# Looked up by name so that a sqlglot upgrade that renames one fails at import rather than letting writes through.
_NODE_OPS: dict[type, str] = {getattr(exp, name): op for name, op in (
    ("Insert", "insert"), ("Update", "update"), ("Delete", "delete"), ("Merge", "merge"),
    ("Lock", "lock"), ("Create", "create"), ("Drop", "drop"), ("Alter", "alter"), ("TruncateTable", "truncate"),
    ("Copy", "copy"), ("Set", "set"), ("Pragma", "pragma"), ("Use", "use"), ("Attach", "attach"),
    ("Detach", "detach"), ("Analyze", "analyze"), ("Grant", "grant"), ("Revoke", "revoke"),
    ("Comment", "comment"), ("Transaction", "begin"), ("Commit", "commit"), ("Rollback", "rollback"),
    ("Into", "select into"), ("LoadData", "load"), ("Refresh", "refresh"), ("Kill", "kill"),
    ("Declare", "declare"), ("Cache", "cache"), ("Uncache", "uncache"), ("Install", "install"),
    ("Execute", "execute"),
)}

# Words that start a statement: after EXPLAIN they are a statement, never MySQL's "EXPLAIN table".
_STATEMENT_WORDS = READ_FIRST | frozenset((
    "insert", "update", "delete", "replace", "merge", "create", "drop", "alter", "truncate", "call", "do",
    "set", "execute", "declare", "prepare", "analyze", "analyse", "handler", "load", "lock", "unlock",
    "grant", "revoke", "for", "into", "format", "pragma", "vacuum", "attach", "detach", "reindex", "checkpoint",
    "cluster", "refresh", "listen", "notify", "unlisten", "discard", "reset", "import", "comment", "security",
    "savepoint", "release", "begin", "start", "commit", "rollback", "end", "abort", "move", "fetch", "close",
    "deallocate", "open", "kill", "flush", "optimize", "repair", "check", "checksum", "rename", "install",
    "uninstall", "shutdown", "restart", "help", "binlog", "purge", "change", "xa", "signal", "resignal", "get",
    "use", "cache", "backup", "reassign",
))
_EXPLAIN_FLAGS = frozenset(("analyze", "analyse", "verbose", "extended", "partitions"))


def write_ops_text(write_ops: frozenset[str]) -> str:
    """The parenthesis of the read_only message: "an executable comment", else the sorted operations."""
    if EXECUTABLE_COMMENT in write_ops:
        return EXECUTABLE_COMMENT
    return ", ".join(sorted(write_ops))


def read_only_message(write_ops: frozenset[str]) -> str:
    """The read_only refusal (contract 4.3) for a statement with these write operations."""
    return _READ_ONLY.format(write_ops_text(write_ops))


def write_op_not_allowed_message(allowed_write_ops: frozenset[str]) -> str:
    """The write_op_not_allowed refusal, naming the operations the key may perform (the guard's and SQLite's)."""
    if not allowed_write_ops:
        return "This API key may not perform write operations."
    return "This API key may only perform these write operations: " + ", ".join(sorted(allowed_write_ops)) + "."


def _skip_parens(sig: list[Token], k: int) -> int:
    """Index after the parenthesised group opening at sig[k] (len(sig) if it never closes)."""
    depth = 0
    for j in range(k, len(sig)):
        t = sig[j]
        if t.kind == PUNCT:
            if t.value == "(":
                depth += 1
            elif t.value == ")":
                depth -= 1
                if depth == 0:
                    return j + 1
    return len(sig)


def first_word_index(sig: list[Token], k: int = 0) -> int:
    """Index of the statement's first keyword, past leading parentheses; -1 if it doesn't start with a word."""
    n = len(sig)
    while k < n and sig[k].kind == PUNCT and sig[k].value == "(":
        k += 1
    return k if k < n and sig[k].kind == WORD else -1


def main_keyword(sig: list[Token], k: int) -> str:
    """The statement kind: the first keyword, or for WITH the statement after the CTEs ('' if none)."""
    first = sig[k].value
    if first != "with":
        return first
    depth = 0
    for t in sig[k + 1:]:
        if t.kind == PUNCT:
            if t.value == "(":
                depth += 1
            elif t.value == ")":
                depth -= 1
        elif depth == 0 and t.kind == WORD and t.value in (
                "select", "insert", "update", "delete", "merge", "replace", "values", "table"):
            return t.value
    return ""


def _keyword_ops(sig: list[Token], k: int) -> set[str]:
    """Contract 4.3 rule 3 for a statement whose first keyword reads: write keywords anywhere in it."""
    ops: set[str] = set()
    saw_into = False
    n = len(sig)
    j = k
    while j < n:
        t = sig[j]
        j += 1
        if t.kind != WORD:
            continue
        v = t.value
        if v == "for":
            # FOR UPDATE / SHARE / NO KEY UPDATE / KEY SHARE: a read that locks rows other callers may be waiting
            # on. Not a write of data, but not read-only either: it counts as the operation "lock".
            if word_at(sig, j) in ("update", "share"):
                ops.add("lock")
                j += 1
            elif word_at(sig, j) == "no" and word_at(sig, j + 1) == "key" and word_at(sig, j + 2) == "update":
                ops.add("lock")
                j += 3
            elif word_at(sig, j) == "key" and word_at(sig, j + 1) == "share":
                ops.add("lock")
                j += 2
        elif v == "lock" and word_at(sig, j) == "in" and word_at(sig, j + 2) == "mode":
            ops.add("lock")   # MySQL's LOCK IN SHARE MODE
        elif v in ("insert", "update", "delete"):
            ops.add(v)
        elif v in ("merge", "replace"):
            if word_at(sig, j) == "into":
                ops.add(v)
        elif v == "into":
            saw_into = True
    if not ops and saw_into:
        ops.add("select into")
    return ops


def word_at(sig: list[Token], j: int) -> str:
    return sig[j].value if j < len(sig) and sig[j].kind == WORD else ""


def _parse_text(sql: str, tokens: list[Token], start: int) -> str:
    """The statement from offset start as sqlglot should read it: comments dropped, {name} as :name."""
    parts: list[str] = []
    for t in tokens:
        if t.end <= start:
            continue
        if t.kind in (COMMENT, XCOMMENT, WS):
            parts.append(" ")
        elif t.kind == TEXT:
            parts.append(":" + t.value)
        elif t.kind == NUMBER:   # kept apart from a name written against it (MySQL's 1e1into is 1e1 INTO)
            parts.append(sql[max(t.start, start):t.end] + " ")
        else:
            parts.append(sql[max(t.start, start):t.end])
    return "".join(parts)


def _sqlglot_ops(text: str, dialect: str, skip_root: bool) -> set[str]:
    """Write operations of every node sqlglot finds; nothing when it can't parse (the keyword rule decides)."""
    try:
        trees = sqlglot.parse(text, read=_SQLGLOT_DIALECT[dialect])
    except Exception:  # ParseError, TokenError, RecursionError on deep nesting: all mean "no opinion"
        return set()
    ops: set[str] = set()
    for tree in trees:
        if tree is None:
            continue
        # A MERGE's WHEN ... THEN UPDATE/DELETE/INSERT actions are the merge itself, reported as "merge".
        for node in tree.walk(prune=lambda n: isinstance(n, exp.When)):
            if skip_root and node is tree:
                continue
            if isinstance(node, exp.Command):
                word = str(node.this or "").split(None, 1)[0].lower() if node.this else ""
                if word and word not in READ_FIRST:
                    ops.add(word)
                continue
            op = next((_NODE_OPS[c] for c in type(node).__mro__ if c in _NODE_OPS), None)
            if op is not None:
                if op == "insert" and isinstance(node, exp.Insert) and node.args.get("replace"):
                    op = "replace"
                ops.add(op)
        skip_root = False    # only the first statement's kind is already known from its keyword
    return ops


def explain_target(sig: list[Token], k: int) -> int:
    """Index of the statement an EXPLAIN at sig[k] describes, past its options."""
    j = k + 1
    n = len(sig)
    while j < n:
        t = sig[j]
        if t.kind == PUNCT and t.value == "(":
            j = _skip_parens(sig, j)
        elif t.kind == WORD and t.value in _EXPLAIN_FLAGS:
            j += 1
        elif t.kind == WORD and t.value == "query" and word_at(sig, j + 1) == "plan":
            j += 2
        elif (t.kind == WORD and t.value == "format" and j + 2 < n and sig[j + 1].kind == PUNCT
              and sig[j + 1].value == "=" and sig[j + 2].kind in (WORD, STRING)):
            j += 3
        else:
            break
    return j


def is_table_description(sig: list[Token], j: int) -> bool:
    """MySQL's {EXPLAIN|DESCRIBE} tbl [col|'wild']: a table description, which reads."""
    rest = sig[j:]
    if not rest or rest[0].kind not in (WORD, QIDENT) or rest[0].value in _STATEMENT_WORDS:
        return False
    i = 1
    if len(rest) >= 3 and rest[1].kind == PUNCT and rest[1].value == "." and rest[2].kind in (WORD, QIDENT):
        i = 3
    if i < len(rest) and rest[i].kind in (WORD, QIDENT, STRING):
        i += 1
    return i == len(rest)


def statement_ops(sql: str, tokens: list[Token], sig: list[Token], k: int, dialect: str) -> set[str]:
    """Write operations of the statement whose significant tokens start at sig[k]."""
    j = first_word_index(sig, k)
    if j < 0:
        return {"explain"}           # only reached for EXPLAIN followed by something that isn't a statement
    first = sig[j].value
    if first in ("explain", "describe", "desc"):
        # MySQL reads DESCRIBE and DESC as synonyms of EXPLAIN, and EXPLAIN ANALYZE runs its statement.
        target = explain_target(sig, j)
        if target >= len(sig):
            return {"explain"} if first == "explain" else set()
        if word_at(sig, target) in ("explain", "describe", "desc"):
            return {"explain"}
        if (dialect == "mysql" or first != "explain") and is_table_description(sig, target):
            return set()
        if first_word_index(sig, target) < 0:
            return {"explain"}
        return statement_ops(sql, tokens, sig, target, dialect)
    if first == "show":
        ops: set[str] = set()
    elif first in READ_FIRST:
        ops = _keyword_ops(sig, j)
    else:
        ops = {first}
    ops |= _sqlglot_ops(_parse_text(sql, tokens, sig[k].start), dialect, skip_root=first not in READ_FIRST)
    if "insert" in ops or "update" in ops:
        ops |= _upsert_ops(sig, j)
    return ops


def _upsert_ops(sig: list[Token], k: int) -> set[str]:
    """What an INSERT or UPDATE does to rows already there: ON CONFLICT ... DO UPDATE (PostgreSQL, SQLite) and ON
    DUPLICATE KEY UPDATE (MySQL) update them, SQLite's INSERT OR REPLACE and UPDATE OR REPLACE replace them
    (delete the rows they conflict with), so a key allowed to insert or update only may do neither."""
    words = [t.value.lower() for t in sig[k:] if t.kind == WORD]
    ops: set[str] = set()
    conflict = False
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        after = words[i + 1] if i + 1 < len(words) else ""
        conflict = conflict or (word == "conflict" and before == "on")
        if (word == "duplicate" and before == "on" and after == "key") or (
                word == "do" and after == "update" and conflict):
            ops.add("update")
        elif word == "or" and after == "replace" and before in ("insert", "update"):
            ops.add("replace")
    return ops
