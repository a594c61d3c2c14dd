"""How each engine folds the case of a table name: the allow-list compares names as the engine compares them."""

from __future__ import annotations

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def ascii_lower(name: str) -> str:
    """The name with A-Z alone lower-cased: how SQLite compares names (any case of ASCII letters, nothing else)
    and PostgreSQL folds an unquoted one in a UTF-8 database. Python's lower() also folds Ä to ä and the Kelvin
    sign to k: on these engines "Ärger" and "\\u212Aeys" are other tables than ärger and keys."""
    return name.lower() if name.isascii() else name.translate(_ASCII_LOWER)


def mysql_lower(name: str) -> str:
    """The name lower-cased as MySQL/MariaDB compare names case-insensitively (information_schema's table names
    always; others with lower_case_table_names 1 or 2): each character by its simple lower-case mapping, which
    folds Ä and the Kelvin sign as Python's lower() does. Python's lower() of a whole string maps U+0130 (İ) to two
    characters, "i" and a combining dot, where the server reads "i" (`information_schema.PROCESSLİST` is the
    process list), and a final capital sigma to ς where the server reads σ: so character by character."""
    if name.isascii():
        return name.lower()
    return "".join("i" if c == "\u0130" else c.lower() for c in name)


def fold(dialect: str):
    """The case folding of table names on a dialect's engine (when it compares them case-insensitively at all):
    MySQL/MariaDB's mysql_lower; every other engine ASCII letters alone."""
    return mysql_lower if dialect == "mysql" else ascii_lower
