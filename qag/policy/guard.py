"""The SQL guard (contract 4.3): one statement, read-only, write ops; PostgreSQL $n and COPY; others' sessions."""

from __future__ import annotations

from qag.errors import QagError
from qag.sql import lexer
from qag.sql.names import mysql_lower
from qag.sql.prepare import Prepared
from qag.sql.writes import read_only_message, write_op_not_allowed_message

_UNREADABLE = ("Only read-only statements (SELECT, WITH, SHOW, DESCRIBE, EXPLAIN) are allowed - this statement "
               "can't be classified ({}), so it is refused.")
# value_invalid, as SQLite's own refusal of a NUL in the statement was answered (qag/backends/sqlite.py).
NUL_IN_STATEMENT = "The database can't use a value of this statement (a NUL character in the statement)"


def check(prepared: Prepared, *, writes_allowed: bool, allowed_write_ops: frozenset[str] | None) -> None:
    """Refuse the statement for this call, or return None.

    Order (contract 6.2): a NUL character in the statement (400 value_invalid) → several statements (400
    multiple_statements) → a PostgreSQL positional parameter (400
    invalid_request) → a write when writes aren't allowed (403 read_only) → a write operation outside
    allowed_write_ops (403 write_op_not_allowed; None = any). Then the tables (6.2), then check_copy.
    A statement that can't be classified (empty, unterminated literal or comment) never runs: 403 read_only
    when writes aren't allowed, else 400 invalid_request - the database would refuse it anyway, and a
    statement we can't read can't be checked against allowed_write_ops.
    """
    p = prepared
    if "\x00" in p.sql:
        # The engines don't read past a NUL as qag's tokenizer does: PostgreSQL (and pglast) end the statement
        # there, so `... = :v \0 AND ...` ran without the rest while :names after it were still bound; MariaDB
        # ends a -- comment there; SQLite refuses it. What qag checked would not be what runs.
        raise QagError("value_invalid", NUL_IN_STATEMENT)
    if p.multiple:
        raise QagError("multiple_statements", "Only a single SQL statement can be executed at a time")
    if p.dialect == "postgres" and _positional(p.sql):
        raise QagError("invalid_request", "PostgreSQL's positional parameters ($1) aren't placeholders here: the "
                                          "statement's values are bound by name (:name)")
    ops = p.write_ops
    if not ops:
        return
    if p.unreadable is not None:
        if not writes_allowed:
            raise QagError("read_only", _UNREADABLE.format(p.unreadable))
        raise QagError("invalid_request", f"The SQL statement can't be read: {p.unreadable}")
    if not writes_allowed:
        raise QagError("read_only", read_only_message(ops))
    if allowed_write_ops is not None:
        allowed = frozenset(op.lower() for op in allowed_write_ops)
        if not ops <= allowed:
            raise QagError("write_op_not_allowed", write_op_not_allowed_message(allowed))


def check_copy(prepared: Prepared) -> None:
    """PostgreSQL's COPY never runs (400 invalid_request): its rows go to or come from the client's own connection,
    the gateway's, which a call can't carry, and libpq would hand the call's pipeline a COPY state it never leaves
    (a worker spun, growing, until it was killed). A server-side file needs a superuser. After the table checks,
    so a restricted key still hears which table it may not use."""
    if prepared.dialect == "postgres" and "copy" in prepared.write_ops:
        raise QagError("invalid_request", "COPY can't run through the gateway: its rows would go to or come from "
                                          "the gateway's own database connection")


_POSITIONAL: dict = {}       # PostgreSQL statement -> whether the caller wrote a $n parameter
_POSITIONAL_MAX = 1024


def _positional(sql: str) -> bool:
    """Whether a PostgreSQL statement refers to a positional parameter ($1) outside its strings and comments. qag
    numbers the values it binds itself ($1, $2, ... for :names, masking's hash pads among them), so a caller's $n
    would read one of them; refused before anything runs, for every caller."""
    seen = _POSITIONAL.get(sql)
    if seen is None:
        seen = False
        if "$" in sql:
            for token in lexer.tokenize(sql, "postgres"):
                if token.kind == lexer.PUNCT and token.value == "$" and sql[token.end:token.end + 1].isdigit():
                    seen = True
                    break
        if len(_POSITIONAL) >= _POSITIONAL_MAX:
            _POSITIONAL.clear()
        _POSITIONAL[sql] = seen
    return seen


# What shows other sessions' statements while they run: other callers' SQL and, on MySQL/MariaDB, where values are
# bound into the text client-side and plans fold them in, their values and masking's hash pads (so the mask key).
# qag's pooled sessions are all one database user, who sees its own sessions without any privilege.
# MySQL/MariaDB: names anywhere in the statement, by qag's tokens (identifiers unquoted; a string spelled like one
# counts too, as ANSI_QUOTES would read it as a name): stricter only.
# general_log and slow_log: the server's logs as tables (log_output=TABLE) hold other callers' statements, with the
# values the client library put into their text (masking's pads among them on MySQL).
_MYSQL_ACTIVITY_NAMES = frozenset(("processlist", "performance_schema", "innodb_trx", "innodb_locks",
                                   "innodb_lock_waits", "general_log", "slow_log"))
# PostgreSQL: every name the parser reads (U&"..." decoded; a function called as a field, `(x).f`, is a name there
# too), against the activity view and functions, and the functions that run SQL text or read a relation named at
# run time (ts_stat($$... pg_stat_activity$$), table_to_xml(('pg_stat_' || ...)::regclass)).
_PG_ACTIVITY = ("pg_stat_activity", "pg_stat_get_activity", "pg_stat_get_backend_", "table_to_xml", "schema_to_xml",
                "database_to_xml", "cursor_to_xml", "query_to_xml", "ts_stat", "ts_rewrite")
# (dialect, statement) -> (code, message) of its refusal, or (): saved queries repeat
_READS_OTHER_SESSIONS: dict = {}
_READS_OTHER_SESSIONS_MAX = 1024


_ACTIVITY_REFUSED = ("table_not_allowed", "API keys may not read other sessions' activity (the server's process list "
                                          "and activity views): it shows other callers' statements")
# MySQL/MariaDB statements built at run time (EXECUTE IMMEDIATE <expression>, PREPARE ... FROM <expression>, and
# EXECUTE of one): what they read is known only when they run, so none of an API key's checks could read it.
_RUNTIME_SQL_REFUSED = ("table_check_failed", "API keys may not run SQL built at run time (EXECUTE, EXECUTE "
                                              "IMMEDIATE, PREPARE ... FROM): what it would read can't be checked")
# CREATE / ALTER of a stored program (procedure, function, trigger, event, package): its body runs later, on a CALL
# or an event, past every check - SQL built at run time or SHOW GRANTS inside it (an attacker review read the process
# list, masking's pads and the password hash through `CREATE PROCEDURE p() EXECUTE IMMEDIATE ...` and `CALL p()`).
_STORED_PROGRAM_REFUSED = ("table_check_failed", "API keys may not create or change stored programs (procedures, "
                                                 "functions, triggers, events): what their bodies run later can't "
                                                 "be checked")
_STORED_PROGRAMS = frozenset(("procedure", "function", "trigger", "event", "package"))
# The objects a CREATE or ALTER names otherwise: the first of these or of _STORED_PROGRAMS after CREATE/ALTER (past
# OR REPLACE, DEFINER = ..., AGGREGATE, ALGORITHM = ..., SQL SECURITY ...) says what it makes, so a column named
# event in a CREATE TABLE is not a stored program.
_OTHER_OBJECTS = frozenset(("table", "view", "index", "database", "schema", "user", "role", "sequence", "server",
                            "tablespace", "temporary", "unique", "fulltext", "spatial", "logfile", "resource"))
# SHOW GRANTS / SHOW CREATE USER: the connection's own account, with its password's hash (mysql_native_password's
# is unsalted, so a guess can be checked offline).
_CREDENTIALS_REFUSED = ("table_not_allowed", "API keys may not read the connection's account (SHOW GRANTS, SHOW "
                                             "CREATE USER): it holds the password's hash")


def check_other_sessions(prepared: Prepared) -> None:
    """An API key's statement never reads other sessions' activity (the process list, activity views, MariaDB's
    SHOW EXPLAIN / ANALYZE FOR a thread; 403 table_not_allowed), the connection's account (SHOW GRANTS), nor runs
    SQL built at run time or creates a stored program whose body would run later (MySQL/MariaDB: 403
    table_check_failed). The administrator's may."""
    key = (prepared.dialect, prepared.sql)
    refusal = _READS_OTHER_SESSIONS.get(key)
    if refusal is None:
        if prepared.dialect == "mysql":
            refusal = _mysql_refusal(prepared.sql)
        elif prepared.dialect == "postgres":
            refusal = _ACTIVITY_REFUSED if _postgres_reads_activity(prepared) else ()
        else:
            refusal = ()
        if len(_READS_OTHER_SESSIONS) >= _READS_OTHER_SESSIONS_MAX:
            _READS_OTHER_SESSIONS.clear()
        _READS_OTHER_SESSIONS[key] = refusal
    if refusal:
        raise QagError(*refusal)


def _mysql_refusal(sql: str) -> tuple:
    sig = lexer.significant(lexer.tokenize(sql, "mysql"))
    if any(token.kind == lexer.XCOMMENT for token in sig):
        # Code in /*! ... */ or /*M! ... */ runs: read the statement with it in place, as the server does.
        sql = "".join(_code_of(sql[t.start:t.end]) if t.kind == lexer.XCOMMENT else sql[t.start:t.end] + " "
                      for t in sig)
        sig = lexer.significant(lexer.tokenize(sql, "mysql"))
    names = [_name_of(sql, t) for t in sig]
    for i, name in enumerate(names):
        if i and sig[i - 1].kind == lexer.PUNCT and sig[i - 1].value == "@":
            continue                     # @@performance_schema, @@innodb_lock_wait_timeout: settings, not tables
        if name in _MYSQL_ACTIVITY_NAMES:
            return _ACTIVITY_REFUSED
        if name == "sys" and i + 1 < len(sig) and sig[i + 1].kind == lexer.PUNCT and sig[i + 1].value == ".":
            return _ACTIVITY_REFUSED     # the sys schema's views (sys.session, sys.x$processlist, ...)
    # Keywords: the server reads them in ASCII only (`SHOW WARNİNGS` is a syntax error), as the tokens do.
    words = [t.value.lower() for t in sig if t.kind == lexer.WORD]
    first = words[0] if words else ""
    if "execute" in words or "prepare" in words:
        return _RUNTIME_SQL_REFUSED   # anywhere: in a stored program's body as much as at the start
    if first in ("create", "alter"):
        made = next((word for word in words[1:] if word in _STORED_PROGRAMS or word in _OTHER_OBJECTS), "")
        if made in _STORED_PROGRAMS:
            return _STORED_PROGRAM_REFUSED
    if first == "show" and len(words) > 1 and words[1] in ("engine", "explain", "analyze", "binlog", "relaylog"):
        # SHOW ENGINE INNODB STATUS; SHOW EXPLAIN / ANALYZE FOR <thread>; SHOW BINLOG / RELAYLOG EVENTS (other
        # callers' writes, values and all)
        return _ACTIVITY_REFUSED
    if first == "show" and words[1:2] == ["grants"] or words[:3] == ["show", "create", "user"]:
        return _CREDENTIALS_REFUSED
    # EXPLAIN / ANALYZE ... FOR CONNECTION <thread> (MySQL 8, MariaDB 10.9+), whatever else they say
    if first in ("explain", "describe", "desc", "analyze", "show") and any(
            word == "for" and after == "connection" for word, after in zip(words, words[1:])):
        return _ACTIVITY_REFUSED
    return ()


def _code_of(comment: str) -> str:
    """The code inside a MySQL executable comment, spaced: `/*!80000 SHOW PROCESSLIST */` -> ` SHOW PROCESSLIST `."""
    body = comment[3:] if comment.startswith("/*!") else comment[4:]
    body = body[:-2] if body.endswith("*/") else body
    return " " + body.lstrip("0123456789") + " "


def _name_of(sql: str, token) -> str:
    # A word as written, a quoted name or a string without its quotes (a doubled quote inside stays: stricter),
    # folded as the server folds information_schema's table names.
    text = sql[token.start:token.end]
    if token.kind == lexer.WORD:
        return mysql_lower(text)
    if token.kind in (lexer.QIDENT, lexer.STRING):
        return mysql_lower(text[1:-1])
    return ""


def _postgres_reads_activity(prepared: Prepared) -> bool:
    reading = prepared.reading
    if reading is None or reading.failure is not None:
        return "pg_stat_" in prepared.sql.lower()      # unread (the server refuses what its parser can't read)
    return any(name.startswith(_PG_ACTIVITY) for name in reading.names)
