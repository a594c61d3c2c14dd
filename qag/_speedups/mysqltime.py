"""Pure twin of the MySQL date/time text parsers: mysqlclient's own (MySQLdb.times), which the compiled twin matches.

mysqlclient turns a DATETIME or TIMESTAMP value's text into a datetime (None when it isn't a valid one, such as
the zero date) and a DATE's into a date, with these functions by default. Its parsers are Python, about 1.5 µs a
value; the compiled twin reads MySQL's canonical text in C and hands anything else back to them.
"""

from __future__ import annotations

__all__ = ["date_or_none", "datetime_or_none"]

try:
    from MySQLdb.times import Date_or_None as date_or_none
    from MySQLdb.times import DateTime_or_None as datetime_or_none
except ImportError:
    # mysqlclient is the `mysql` extra. Without it there is no MySQL connection to convert values for, but the
    # speedups still load (a SQLite- or PostgreSQL-only install, QAG_SPEEDUPS=require included).
    def _no_mysqlclient(text):
        raise RuntimeError("mysqlclient is not installed: MySQL values cannot be converted")

    date_or_none = datetime_or_none = _no_mysqlclient
