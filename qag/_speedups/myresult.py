"""A MySQL statement's stored reply read into (columns, rows) through mysqlclient: the pure twin of _myresult.

`Reader(conn, spin=0.0)` serves one mysqlclient connection (a `MySQLdb._mysql.connection`, opened with qag's
converter map, which must not change afterwards). `reader.query(statement, deadline=None)` sends a statement (bytes)
and waits for the first packet of its reply, as mysqlclient's `query` does; in the compiled twin, when no other
thread of the process waits for a MySQL reply, the wait first looks at the socket without sleeping for up to `spin`
seconds (never past `deadline`, a `time.monotonic()` value), by the rule of _lonewait.pxd (a halted core is slow to
wake; a lone call's reply finds it awake); the pure twin always sleeps. `reader.read(skip, count)`, called right
after, stores the whole reply and returns its column names and `count` rows after `skip`
(count 0: all) as tuples, each value converted by the connection's converter map as mysqlclient's
`fetch_row(count, 0)` converts it; skipped rows are never converted. It then reads any further result sets (a
CALL's) so the connection is ready again. Failures are mysqlclient's exceptions (MySQLdb.Error subclasses).
`reader.read_page(skip, count, json_rows)` reads the same way and returns (columns, rows, json, fetched): in the
compiled twin, when every column's values are ints, text (any well-formed UTF-8 on a UTF-8 connection, escaped as
rowjson escapes it; plain ASCII on another), decimals, dates or datetimes whose text is what rowjson writes for
their values, json is the bytes `rowjson.encode_json(columns, rows[:json_rows])` would make, written from the
reply's text without making the rows (rows is None, fetched counts the rows read); otherwise, and always in this
twin, json is None and rows are read()'s.

This twin is mysqlclient's own calls: `store_result()`, `describe()` (a 7-tuple per column, of which only the
name is used), `data_seek`, `fetch_row`. The compiled twin calls the same client library functions itself and
converts exactly as mysqlclient does, without the description tuples and the converter lookups per call.
"""

from __future__ import annotations

__all__ = ["Reader", "driver_error"]


class Reader:
    """Reads the replies of one mysqlclient connection (see the module's docstring)."""

    __slots__ = ("conn",)

    def __init__(self, conn, spin: float = 0.0):
        self.conn = conn

    def query(self, statement: bytes, deadline: float | None = None) -> None:
        self.conn.query(statement)

    def read(self, skip: int, count: int) -> tuple[list, list]:
        conn = self.conn
        result = conn.store_result()
        if result is None:
            columns, rows = [], []
        else:
            columns = [d[0] for d in result.describe()]
            if skip:
                result.data_seek(skip)
            rows = list(result.fetch_row(count, 0))
        while conn.next_result() == 0:
            conn.discard_result()
        return columns, rows

    def read_page(self, skip: int, count: int, json_rows: int) -> tuple[list, list | None, bytes | None, int]:
        columns, rows = self.read(skip, count)
        return columns, rows, None, len(rows)   # this twin leaves the JSON to rowjson


# mysqlclient's classes of a client library error code (its C _mysql_Exception, which is not exported), so that
# the compiled twin raises what mysqlclient raises for a reply that fails while it is read. By MySQLdb's
# constants (a name they lack is left out, as the C switch leaves out a code its headers don't define).
def _codes(*names: str) -> frozenset:
    from MySQLdb.constants import CR, ER
    return frozenset(getattr(ER, name[3:], None) if name.startswith("ER_") else getattr(CR, name[3:], None)
                     for name in names) - {None}


_CLASSES: list = []


def _classes() -> list:
    """[(codes, exception class)] in mysqlclient's order; built on first use (mysqlclient is then loaded)."""
    if not _CLASSES:
        import MySQLdb
        _CLASSES.extend((
            (_codes("CR_COMMANDS_OUT_OF_SYNC", "ER_DB_CREATE_EXISTS", "ER_SYNTAX_ERROR", "ER_PARSE_ERROR",
                    "ER_NO_SUCH_TABLE", "ER_WRONG_DB_NAME", "ER_WRONG_TABLE_NAME", "ER_FIELD_SPECIFIED_TWICE",
                    "ER_INVALID_GROUP_FUNC_USE", "ER_UNSUPPORTED_EXTENSION", "ER_TABLE_MUST_HAVE_COLUMNS",
                    "ER_CANT_DO_THIS_DURING_AN_TRANSACTION"), MySQLdb.ProgrammingError),
            # Not 1263 (WARN_NULL_TO_NOTNULL): MariaDB's headers name it ER_WARN_NULL_TO_NOTNULL, which the C
            # switch does not test for.
            (_codes("ER_WARN_DATA_TRUNCATED", "ER_WARN_DATA_OUT_OF_RANGE", "ER_NO_DEFAULT",
                    "ER_PRIMARY_CANT_HAVE_NULL", "ER_DATA_TOO_LONG", "ER_DATETIME_FUNCTION_OVERFLOW"),
             MySQLdb.DataError),
            (_codes("ER_DUP_ENTRY", "ER_DUP_UNIQUE", "ER_NO_REFERENCED_ROW", "ER_NO_REFERENCED_ROW_2",
                    "ER_ROW_IS_REFERENCED", "ER_ROW_IS_REFERENCED_2", "ER_CANNOT_ADD_FOREIGN",
                    "ER_NO_DEFAULT_FOR_FIELD", "ER_BAD_NULL_ERROR"), MySQLdb.IntegrityError),
            (_codes("ER_WARNING_NOT_COMPLETE_ROLLBACK", "ER_NOT_SUPPORTED_YET", "ER_FEATURE_DISABLED",
                    "ER_UNKNOWN_STORAGE_ENGINE"), MySQLdb.NotSupportedError),
        ))
    return _CLASSES


def driver_error(code: int, message: str) -> Exception:
    """The exception mysqlclient raises for client library error `code` with `message`."""
    import MySQLdb
    if code == 0:
        return MySQLdb.InterfaceError(code, message)
    for codes, cls in _classes():
        if code in codes:
            return cls(code, message)
    return (MySQLdb.InternalError if code < 1000 else MySQLdb.OperationalError)(code, message)
