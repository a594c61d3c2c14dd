"""How each engine folds the case of a table name: the allow-list compares names as the engine compares them."""

from __future__ import annotations

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(name: str) -> str:
    """The name with A-Z alone lower-cased: how SQLite compares names (any case of ASCII letters, nothing else)
    and PostgreSQL folds an unquoted one in a UTF-8 database. Python's lower() also folds Ä to ä and the Kelvin
    sign to k: on these engines "Ärger" and "\\u212Aeys" are other tables than ärger and keys."""
    return name.lower() if name.isascii() else name.translate(_ASCII_LOWER)


def fold(dialect: str):
    """The case folding of table names on a dialect's engine (when it compares them case-insensitively at all):
    MySQL/MariaDB with lower_case_table_names 1 or 2 lower-case names in the server's own character set, which
    folds Ä and the Kelvin sign as Python's lower() does; every other engine ASCII letters alone."""
    return str.lower if dialect == "mysql" else ascii_lower
