"""What every backend takes (a Call) and gives back (a Result), its driver errors, a connection's default schema."""

from __future__ import annotations

import re

from ..errors import QagError
from ._mysql_schema import server_names
from .pool import fix_key


class Call:
    """One statement to run: rendered SQL and args, access mode, time limit and the rows wanted.

    A plain class with slots, not a dataclass: a dataclass's generated __init__ runs in the interpreter even in
    the compiled build (~3,800 instructions a call, against about a quarter of that for this one)."""

    __slots__ = ("sql", "args", "read_only", "timeout", "fetch", "skip", "schema", "tables", "cursor", "functions",
                 "connection", "identity", "json_rows", "default_text", "writes", "write_ops", "masked")

    def __init__(self, sql: str, args: tuple, read_only: bool, timeout: float | None, fetch: int, skip: int = 0,
                 schema: str | None = None, tables: frozenset | None = None, cursor: bool = False,
                 functions: tuple = (), connection: str = "", identity: tuple | None = None, json_rows: int = 0):
        self.sql = sql
        self.args = args
        self.read_only = read_only
        self.timeout = timeout    # seconds; None = no limit
        self.fetch = fetch        # rows to fetch from the cursor (page size + 1, or up to the author's cap)
        self.skip = skip          # rows to discard first (statements whose window can't be applied in SQL)
        # A table-restricted call (qag/policy/tables): the default schema its tables were checked with, and the
        # key's qualified grants. The backend enforces them too: PostgreSQL pins search_path to the schema,
        # SQLite refuses other tables in an authorizer. None for everyone else.
        self.schema = schema
        self.tables = tables
        # The statement is a query the engine can page itself (PostgreSQL: a cursor moved `skip` and fetched
        # `fetch` rows), for a page whose window isn't in the SQL: the driver never buffers more than the page.
        self.cursor = cursor
        # qag's own one-argument functions the statement calls (SQLite: masking at the source registers them on
        # the call's connection, and its authorizer allows them): (name, function) pairs.
        self.functions = functions
        # The saved connection's name: what the pool's waiting gauge is labelled with ("" for calls of no name).
        self.connection = connection
        # Row security passthrough (PostgreSQL, a connection's `row_security` option): a signed-in caller's
        # verified claims as JSON bytes and the database role to act as (or None), for this call's transaction.
        self.identity = identity
        # A page answered as a JSON array of its rows, untouched (no masking): how many of the fetched rows that
        # page holds. A backend whose driver can write that JSON from its values may (Result.json); 0 = rows.
        self.json_rows = json_rows
        # A masked call on MySQL/MariaDB: traced and rewritten in the default reading of quotes and backslashes, so
        # the backend runs it only on a session whose own sql_mode reads them so (masking refused by the server's
        # facts as the last connection opened saw them; a pooled one may be older).
        self.default_text = False
        # The statement may change data: a lost reply or connection after it was sent leaves its outcome unknown
        # (sent_write_error). Any call that isn't read-only, unless its caller knows better (the run handlers: a
        # statement with write operations).
        self.writes = not read_only
        # The write operations the caller may perform (a key's allowed_write_ops, qag/sql/writes.py's names); None
        # = any. SQLite's authorizer refuses a write action outside them, whatever qag's guard read.
        self.write_ops = None
        # The call's result is masked (a caller or version with mask rules): SQLite's authorizer refuses reading
        # what holds a table's values outside the table masking wraps (a virtual table's shadow tables, an FTS
        # table over another table's content).
        self.masked = False

    def __repr__(self) -> str:
        return "Call(" + ", ".join([f"{name}={getattr(self, name)!r}" for name in Call.__slots__]) + ")"


class Result:
    """Column names as the driver gave them and the fetched rows (tuples); a plain class, as Call is.

    `json`, for a call with `json_rows`: the JSON array (rowjson's bytes) of the first `json_rows` fetched rows,
    written by the driver from its values; then `rows` is None and `count` says how many rows were fetched."""

    __slots__ = ("columns", "rows", "duration_ms", "json", "count")

    def __init__(self, columns: list[str], rows: list[tuple] | None, duration_ms: float, json: bytes | None = None,
                 count: int = 0):
        self.columns = columns
        self.rows = rows
        self.duration_ms = duration_ms
        self.json = json
        self.count = len(rows) if rows is not None else count

    def __repr__(self) -> str:
        return (f"Result(columns={self.columns!r}, rows={self.rows!r}, duration_ms={self.duration_ms!r}, "
                f"json={self.json!r}, count={self.count!r})")


# Seconds a client is told to wait (Retry-After) when the database or the path to it is unavailable.
RETRY_AFTER = 2


def timeout_error(limit: float) -> QagError:
    shown = int(limit) if float(limit).is_integer() else limit
    return QagError("query_timeout", f"The query exceeded the time limit of {shown} seconds and was cancelled",
                    timeout=shown)


def network_timeout(limit: float) -> QagError:
    """504 for a call whose reply never came by its deadline (the path to the database stopped answering, not a
    slow statement, which the server itself cancels): worth trying again shortly."""
    error = timeout_error(limit)
    error.extras["retry_after"] = RETRY_AFTER
    return error


def query_failed(detail: str) -> QagError:
    return QagError("query_failed", "An error occurred while executing the SQL query", detail=detail)


def write_refused(detail: str) -> QagError:
    """The engine's own refusal of a write in a read-only call (a function that writes, called by a read-only key;
    an attempt to leave the read-only mode): 403 read_only, as the guard's refusal of a write it reads."""
    return QagError("read_only", "Only read-only statements are allowed - the database refused a write in this "
                                 "read-only call", detail=detail)


# Seconds after its statement was sent within which a pooled connection's loss says it was dead before it could
# run it (the RST a path that died answers with comes back in a round trip): a read-only call is then run again
# once on another connection. Later, the statement may have been running (an administrator's KILL, a cut
# mid-query): running it again would undo the kill and double the server's load, so it is refused as lost. A
# quarter second: a round trip with room for a loaded machine's scheduling; no one kills a query that soon.
STALE_WINDOW = 0.25


def database_read_only(detail: str) -> QagError:
    """A write call the database itself refused because it takes no writes now (a standby after a failover, a server
    or database set read-only, a file that can't be written): nothing was written, and it is the database's state,
    not the caller's right: 503 unavailable with Retry-After, never the 403 read_only that tells a client not to
    try again."""
    return QagError("unavailable", "The database takes no writes now (a read-only server, standby or file): nothing "
                                   "was written; try again later", retry_after=5, detail=detail)


def refused_write_of(error: QagError, read_only: bool) -> QagError:
    """The engine's refusal of a write (write_refused) in a call that may write: the database is read-only
    (database_read_only). In a read-only call it stays the caller's 403."""
    if error.code == "read_only" and not read_only:
        return database_read_only(error.extras.get("detail", ""))
    return error


def connection_failed(detail: str) -> QagError:
    return QagError("connection_failed", "Could not connect to the database", detail=detail,
                    retry_after=RETRY_AFTER)


# Connection fields (and driver options) named like these hold credentials: the password, sslpassword, ...
SECRET_WORDS = ("password", "passwd", "secret", "token")
# An opening failure's detail when the client library's text still holds a credential (opening_detail).
OPENING_WITHHELD = ("The database client's message is not shown: it held a value of one of the connection's "
                    "credential fields")


def is_secret_field(name) -> bool:
    """Whether a connection field (or driver option) holds a credential."""
    lowered = str(name).lower()
    return any(word in lowered for word in SECRET_WORDS)


def opening_detail(text: str, fields: dict) -> str:
    """The detail of a failure to open a connection (the only driver text qag cleans: a client library may
    describe its options there, while a server's errors about a statement never hold the password unless the
    caller wrote it, so those are shown as the server wrote them).

    Every value of the connection's non-credential fields (user, host, port, database, file paths: the ones a
    library or server quotes) is shown as `<field>`, wherever it stands as a whole word, whatever it is: a user
    name equal to the password reads as any other user name. Text that then still holds a credential's value is
    withheld whole, for a fixed message. Neither step looks at where a credential is in the text, so the detail
    never tells where, nor (but for a credential that is a part of the client's own wording) whether, the
    password equals a part of it; and the caller of a saved connection can change none of it."""
    names: dict = {}
    for name in sorted(fields):
        value = fields[name]
        if is_secret_field(name) or isinstance(value, bool) or not isinstance(value, (str, int)):
            continue
        value = str(value)
        if value and value not in names:
            names[value] = name
    if names:
        words = sorted(names, key=len, reverse=True)   # the longest first: "bobdb" is never "<user>db"
        pattern = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(w) for w in words) + r")(?!\w)")
        text = pattern.sub(lambda m: f"<{names[m.group(0)]}>", text)
    for name, value in fields.items():
        if is_secret_field(name) and isinstance(value, str) and value and value in text:
            return OPENING_WITHHELD
    return text


def opening_failed(text: str, fields: dict) -> QagError:
    """502 connection_failed for a connection that could not be opened (its detail: opening_detail)."""
    return connection_failed(opening_detail(text, fields))


def sent_write_error(error: QagError) -> QagError:
    """The error for a call that may write, once its statement was sent: a reply that never came by the deadline
    (504 with retry_after) or a connection lost (502) says the outcome is unknown, since the server may have
    committed before the path failed. Same status and code, but no Retry-After (a client that follows it would
    apply the write twice) and `outcome: "unknown"`. The server's own refusals and time limit (the statement
    rolled back) stay as they are."""
    if error.code == "query_timeout" and "retry_after" in error.extras:
        shown = error.extras["timeout"]
        return QagError("query_timeout", f"No reply came from the database within the time limit of {shown} "
                                         f"seconds: the write may have been applied - check before retrying it",
                        timeout=shown, outcome="unknown")
    if error.code == "connection_failed":
        return QagError("connection_failed", "The connection to the database was lost after the write was sent: "
                                             "it may have been applied - check before retrying it",
                        detail=error.extras.get("detail", ""), outcome="unknown")
    return error


class Backend:
    """One database type. Instances live per worker (created after fork) and are shared by its threads.

    `fields` is a connection's stored fields (host, port, database, user, password and driver options) with
    `${VAR}` references already resolved. Every method maps driver failures to QagError (see the helpers above)
    and never lets a password reach an error message.
    """

    dialect = ""     # "sqlite" | "mysql" | "postgres": the SQL dialect of qag.sql
    style = ""       # "qmark" | "format": the driver's placeholder style for qag.sql.prepare.render

    def run(self, fields: dict, call: Call) -> Result:
        """Run one statement and fetch `call.fetch` rows after skipping `call.skip`."""
        raise NotImplementedError

    def stream(self, fields: dict, call: Call, batch: int, cap: int | None):
        """(columns, iterator of row batches) for a whole-result export; the first batch is read eagerly."""
        raise NotImplementedError

    def test(self, fields: dict) -> float:
        """Open a connection and run SELECT 1 read-only; elapsed milliseconds."""
        raise NotImplementedError

    def databases(self, fields: dict) -> list[str]:
        raise QagError("unsupported_operation", f"Listing databases isn't supported for '{self.dialect}' connections")

    def schema(self, fields: dict, database: str | None = None) -> dict:
        """{"tables": [...], "truncated": bool} as contract 5.2's schema route."""
        raise NotImplementedError

    def fresh_schema(self, fields: dict, database: str | None = None) -> dict:
        """schema(), read now rather than from this backend's cache: for a reader that keeps its own (masking),
        whose age would otherwise add to the backend cache's."""
        return self.schema(fields, database)

    has_table_ddl = False   # table_ddl() is there (contract 11: MySQL and SQLite)

    def table_ddl(self, fields: dict, table: str) -> str | None:
        """The CREATE statement of one table of the connection's database (contract 11), None when there is no
        such table. `table` never reaches the SQL text."""
        raise NotImplementedError

    def close_idle(self) -> None:
        """Close pooled idle connections (a connection was changed through the API)."""


_REFUSED_PREFIXES = ("QAG_", "QUERYAPIGATE_", "OTEL_", "AWS_", "GOOGLE_", "AZURE_")


def resolve_fields(fields: dict, environ: dict) -> dict:
    """Expand a `${VAR}` password (or other text field) from the environment; the server's own settings and
    cloud credentials are never readable this way."""
    out = dict(fields)
    for key, value in fields.items():
        if isinstance(value, str) and value.startswith("${") and value.endswith("}"):
            name = value[2:-1]
            if not name or name.startswith(_REFUSED_PREFIXES):
                raise QagError("connection_misconfigured", f"The connection may not read the server's own "
                                                           f"environment variable '{name}'", status=500)
            if name not in environ:
                raise QagError("connection_misconfigured",
                               f"Environment variable '{name}' referenced by the connection is not set", status=500)
            out[key] = environ[name]
    return out


_RESOLVED: dict = {}      # id(stored fields) -> (stored fields, ((field, variable, value), ...), resolved fields)
_RESOLVED_MAX = 1024


def resolved(fields: dict, environ) -> dict:
    """resolve_fields for a stored connection's fields, which the metadata cache hands out unchanged call after
    call: the same resolved dict while every `${VAR}` it read still has its value (a new dict per call cost ~9,000
    instructions with its pool key), numbered once for the pools. Callers must not change it."""
    entry = _RESOLVED.get(id(fields))
    if entry is not None and entry[0] is fields:   # held in the entry, so its id can't be another dict's
        for _, name, value in entry[1]:
            if environ.get(name) != value:
                break
        else:
            return entry[2]
    out = resolve_fields(fields, environ)
    fix_key(out)
    if len(_RESOLVED) >= _RESOLVED_MAX:
        _RESOLVED.clear()
    _RESOLVED[id(fields)] = (fields, _variables_read(fields, out), out)
    return out


def _variables_read(fields: dict, out: dict) -> tuple:
    # Apart from resolved(): a generator there would make a closure on every call, hit or miss.
    return tuple((key, value[2:-1], out[key]) for key, value in fields.items()
                 if isinstance(value, str) and value.startswith("${") and value.endswith("}"))


def text_read_by_default(dialect: str, fields: dict) -> bool:
    """Whether the server reads a statement's quotes and backslashes the way sqlglot's MySQL reading does (the one
    masking traces and rewrites), by the last connection opened with these fields: not when its sql_mode has
    ANSI_QUOTES or NO_BACKSLASH_ESCAPES, where a string to sqlglot can be a subquery to the server, nor when the
    mode can't be learned. Other dialects: True. (A masked call's connection is checked again: Call.default_text.)"""
    if dialect != "mysql":
        return True
    names = server_names(fields)
    return names is not None and names.text_read_by_default


def other_text_reading() -> QagError:
    """The refusal of a masked call on a server that reads quotes and backslashes otherwise (text_read_by_default)."""
    return QagError("mask_unresolvable", "This result can't be masked safely: the server's sql_mode (ANSI_QUOTES, "
                                         "NO_BACKSLASH_ESCAPES or ORACLE) reads quotes, backslashes or statements "
                                         "otherwise than the trace can")


def default_schema(dialect: str, fields: dict) -> str:
    """The schema an unqualified name resolves to on a connection (contract 6.2), lower-case.

    MySQL/MariaDB: the connection's database, read the way its server reads names: lower_case_table_names 1
    or 2 compare names case-insensitively (lower-case, as the contract says); 0 (Linux's default) compares
    them exactly, so the schema is an ExactSchema, as written, and a grant for `orders` covers `orders` only,
    never a distinct table `ORDERS`. The server's setting is read when a connection is opened (cached per
    connection settings, so no round trip per call); before any is open, one is opened through the backend,
    and without a backend names are compared exactly (the stricter reading)."""
    if dialect == "mysql":
        from ..sql.access import ExactSchema  # noqa: PLC0415 - sqlglot loads with the table checks, not the backends
        database = str(fields.get("database") or "")
        names = server_names(fields)
        if names is None or names.names_exact:
            return ExactSchema(database)
        return database.lower()
    if dialect == "postgres":
        return str(fields.get("schema") or "public").lower()
    return "main"
